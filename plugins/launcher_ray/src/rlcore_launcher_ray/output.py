"""Make sure the ranks' last output lines reach the driver's terminal before it disconnects.

Ray forwards each actor's stdout/stderr to the driver a moment after it is written (a log monitor
tails the workers' files and publishes the lines); whatever is still in flight when the driver
shuts down is dropped. A rank's last lines are often the ones that matter (the final metrics, the
traceback), so each rank counts the lines it writes (:class:`LineCount`) and the driver counts
what it received (:class:`OutputDrain`) and waits for the difference before closing the group.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, TextIO


class LineCount:
    """A text stream that passes everything through and counts the complete lines written."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self.lines = 0

    def write(self, text: str) -> int:
        self.lines += text.count("\n")
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _dispatcher():
    """Ray's in-driver fan-out of forwarded worker output, or None when this Ray has none we know."""
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:  # pragma: no cover - a Ray that moved it: the drain is then skipped
        return None
    return dispatcher if hasattr(dispatcher, "add_handler") and hasattr(dispatcher, "remove_handler") else None


class OutputDrain:
    """Counts, per process and stream, the output lines Ray forwarded to this driver."""

    NAME = "rlcore_output_drain"

    def __init__(self, dispatcher: Any = None) -> None:
        self.received: Counter[tuple[str, bool]] = Counter()
        self._changed = threading.Condition()
        self._last = time.monotonic()
        self._dispatcher = dispatcher if dispatcher is not None else _dispatcher()
        # Without Ray's own printing handler the lines go nowhere to wait for (log_to_driver off).
        handlers = [name for name, _ in getattr(self._dispatcher, "handlers", [])]
        self.active = self._dispatcher is not None and "ray_print_logs" in handlers

    def __enter__(self) -> "OutputDrain":
        if self.active:
            self._dispatcher.add_handler(self.NAME, self._on_lines)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active:
            self._dispatcher.remove_handler(self.NAME)

    def _on_lines(self, data: dict) -> None:
        with self._changed:
            self.received[(str(data.get("pid")), bool(data.get("is_err")))] += len(data.get("lines") or ())
            self._last = time.monotonic()
            self._changed.notify_all()

    def wait(self, written: dict[tuple[str, bool], int], *, timeout: float = 30.0, quiet: float = 0.5) -> bool:
        """Wait until every count in ``written`` arrived, then until ``quiet`` seconds pass with
        nothing new (for what was not counted: a rank that died, output of C code or subprocesses).
        True when everything counted arrived within ``timeout``."""
        if not self.active:
            return False
        deadline = time.monotonic() + timeout
        with self._changed:
            while any(self.received[key] < n for key, n in written.items()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.2))
            quiet_until = min(deadline, time.monotonic() + 5 * quiet)
            while time.monotonic() < quiet_until and time.monotonic() - self._last < quiet:
                self._changed.wait(quiet)
        return True
