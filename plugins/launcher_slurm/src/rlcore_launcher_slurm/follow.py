"""Streams a job's log file as it grows, whole lines at a time."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO


class LogFollower:
    """Prints the lines appended to ``path`` since the last call (the file may not exist yet)."""

    def __init__(self, path: str | Path, out: TextIO | None = None):
        self.path = Path(path)
        self.out = out
        self.offset = 0
        self._partial = b""

    def poll(self, final: bool = False) -> int:
        """Print new complete lines (and, when ``final``, a last unterminated one); returns lines printed."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return 0
        self.offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if final and self._partial:
            lines.append(self._partial)
            self._partial = b""
        out = self.out or sys.stdout
        for line in lines:
            out.write(line.decode("utf-8", errors="replace") + "\n")
        if lines:
            out.flush()
        return len(lines)
