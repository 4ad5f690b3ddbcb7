"""The workers' output on the driver's terminal: every line once, and the last lines too.

Ray forwards each actor's stdout/stderr to the driver: a log monitor on each node tails the
workers' files in that node's session directory and publishes the lines. Two things go wrong:

- **Lines twice.** Every log monitor that watches a file publishes all of it. On a real cluster
  each node has a session directory of its own, but raylets that share one (several ``ray start``
  on one host with the same ``--temp-dir``, the default ``/tmp/ray`` included, or a temp dir on a
  shared filesystem) each publish every worker's lines, and the messages do not say which monitor
  sent them. Dropping repeated text instead would also drop a line a worker really printed twice.
  So each worker marks the start of every line it writes through Python with its own token and a
  sequence number (:class:`LineCount`); the driver strips the mark and lets a line through only
  when its number is new for that worker (:func:`install_filter`). That is exact however many
  monitors publish a file, and costs nothing where only one does. Output written past Python (C
  libraries, subprocesses, a crash dump) carries no mark and is passed on as Ray delivers it.
  Ray itself stays the transport: its files survive a worker's death, so a dead rank's last
  lines still arrive, and ``ray logs`` keeps everything (marks included: ``MARK``, an OSC escape
  sequence that terminals do not show).
- **Lines cut in two.** A log monitor reads a file while the worker writes it, and a line it
  finds half written (no newline yet: even one ``write`` of 40 bytes lands in two steps when it
  crosses a page) it publishes as a line, then the rest as the next one. So each worker also
  ends every line with ``END`` before its newline; the driver holds a marked piece without it
  and joins the next piece of that worker's stream to it, which in the file is its rest.
- **Last lines lost.** Whatever is still in flight when the driver shuts down is dropped. A
  rank's last lines are often the ones that matter (the final metrics, the traceback), so each
  worker counts the lines it writes and the driver waits for them (:class:`OutputDrain`) before
  closing the group.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TextIO

# "\x1b]rl;<token>;<seq>\x07" at the start of a line and "\x1b]rl;end\x07" before its newline:
# OSC sequences, invisible on a terminal.
MARK = "\x1b]rl;{token};{seq}\x07"
END = "\x1b]rl;end\x07"
_MARKED = re.compile(r"\x1b\]rl;([0-9a-f]+);([0-9]+)\x07")
HOLD_SECONDS = 2.0  # the longest a line's first piece waits for its rest before it is printed alone
_MARK_CUT = re.compile(r"\x1b(?:\](?:r(?:l(?:;[0-9a-f]*(?:;[0-9]*)?)?)?)?)?")  # a piece cut inside MARK
PRINT_HANDLER = "ray_print_logs"  # Ray's handler that prints forwarded lines (with log_to_driver)


class LineCount:
    """A text stream that passes everything through, marks the start of each line (``MARK``, with
    this stream's ``token``) and its end (``END``, before the newline), and counts the complete
    lines written."""

    def __init__(self, stream: TextIO, token: str | None = None):
        self._stream = stream
        self.token = token if token is not None else os.urandom(6).hex()
        self.lines = 0
        self._at_start = True
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        if not text:
            return self._stream.write(text)
        with self._lock:
            pieces = []
            for part in text.splitlines(keepends=True):
                if self._at_start:
                    pieces.append(MARK.format(token=self.token, seq=self.lines))
                self._at_start = part.endswith("\n")
                if self._at_start:
                    body = part.rstrip("\r\n")
                    part = body + END + part[len(body) :]
                pieces.append(part)
                self.lines += self._at_start
            # One write: the mark and its line reach the file together.
            self._stream.write("".join(pieces))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _Filter:
    """Wraps Ray's print handler: joins lines a log monitor cut in two, strips the marks, drops
    lines already let through, and counts what it let through per (pid, stream) for the drains."""

    def __init__(self, print_logs: Callable[[dict], None], hold: float = HOLD_SECONDS):
        self.print_logs = print_logs
        self.hold = hold
        self.next_seq: dict[str, int] = {}
        self.received: Counter[tuple[str, bool]] = Counter()
        self.changed = threading.Condition()
        self.last = time.monotonic()
        # Per (pid, stream): the first piece of a line whose rest has not come yet (with the
        # message it came in and when); the stream's next piece is that rest. And first pieces
        # that another piece followed before their rest came (two monitors publishing one file):
        # each waits for a rest (a piece with END and no mark of its own), oldest first.
        self.cut: dict[tuple[str, bool], tuple[str, dict, float]] = {}
        self.orphans: dict[tuple[str, bool], list[tuple[str, dict]]] = {}

    def __call__(self, data: dict) -> None:
        key = (str(data.get("pid")), bool(data.get("is_err")))
        kept: list = []
        with self.changed:
            out = self._release(time.monotonic() - self.hold, besides=key)
            for line in data.get("lines") or ():
                if not isinstance(line, str):
                    kept.append(line)
                    continue
                if key in self.cut:
                    head, head_data, _ = self.cut.pop(key)
                    if _starts_line(line):  # not its rest: another monitor's next line
                        self.orphans.setdefault(key, []).append((head, head_data))
                    else:
                        line = head + line
                if _starts_line(line) and not line.endswith(END):
                    self.cut[key] = (line, data, time.monotonic())
                    continue
                if line.endswith(END) and not _MARKED.match(line) and self.orphans.get(key):
                    line = self.orphans[key].pop(0)[0] + line
                self._settle(line, kept)
        out.append((data, kept))
        self._print(out)

    def flush(self) -> None:
        """Let through every first piece whose rest has not come (a writer that stopped mid-line)."""
        with self.changed:
            out = self._release(float("inf"))
            for pieces in self.orphans.values():
                for head, data in pieces:
                    kept: list = []
                    self._settle(head, kept)
                    out.append((data, kept))
            self.orphans = {}
        self._print(out)

    def _release(self, before: float, besides: tuple | None = None) -> list[tuple[dict, list]]:
        """Let through the first pieces held since before ``before`` (a progress bar redrawn with
        carriage returns holds its line open): their rest then goes out as it comes."""
        out = []
        for key, (head, data, since) in list(self.cut.items()):
            if since < before and key != besides:
                del self.cut[key]
                kept: list = []
                self._settle(head, kept)
                out.append((data, kept))
        return out

    def _settle(self, line: str, kept: list) -> None:
        """Let a line (or what there is of one) through, marks stripped, unless its number was seen."""
        match = _MARKED.match(line)
        if match is None:
            if not _MARK_CUT.fullmatch(line):  # a piece of a mark alone has nothing to show
                kept.append(line.removesuffix(END))
            return
        token, seq = match.group(1), int(match.group(2))
        if seq < self.next_seq.get(token, 0):
            return  # a second log monitor publishing the same file
        self.next_seq[token] = seq + 1
        kept.append(line[match.end() :].removesuffix(END))

    def _print(self, out: list[tuple[dict, list]]) -> None:
        # Counted once printed: a drain that sees its last lines counted may let the driver shut
        # down, and lines still being printed then would be cut off. (Counted even if printing
        # fails: the drain must not wait out its timeout for lines that will never come.)
        for data, kept in out:
            try:
                if kept:
                    self.print_logs({**data, "lines": kept})
            finally:
                with self.changed:
                    self.received[(str(data.get("pid")), bool(data.get("is_err")))] += len(kept)
                    self.last = time.monotonic()
                    self.changed.notify_all()


def _starts_line(piece: str) -> bool:
    """Whether a forwarded piece begins with a worker's line mark (or is cut inside one)."""
    return bool(_MARKED.match(piece) or _MARK_CUT.fullmatch(piece))


def _dispatcher():
    """Ray's in-driver fan-out of forwarded worker output, or None when this Ray has none we know."""
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:  # pragma: no cover - a Ray that moved it: no filter, no drain
        return None
    ok = (
        hasattr(dispatcher, "handlers")
        and hasattr(dispatcher, "add_handler")
        and hasattr(dispatcher, "remove_handler")
    )
    return dispatcher if ok else None


def install_filter(dispatcher: Any) -> _Filter | None:
    """Put the filter in front of Ray's print handler (once per ``ray.init``: a new connection
    brings a new handler). None when Ray prints nothing here (``log_to_driver=False``)."""
    lock = getattr(dispatcher, "_lock", None) or threading.Lock()
    with lock:
        handlers = list(dispatcher.handlers)
        for index, (name, handler) in enumerate(handlers):
            if name != PRINT_HANDLER:
                continue
            if not isinstance(handler, _Filter):
                handler = _Filter(handler)
                handlers[index] = (name, handler)
                dispatcher.handlers = handlers
            return handler
    return None


class OutputDrain:
    """Filters the workers' forwarded lines (see the module docstring) and waits for the last of them."""

    def __init__(self, dispatcher: Any = None) -> None:
        self._dispatcher = dispatcher if dispatcher is not None else _dispatcher()
        self._filter = install_filter(self._dispatcher) if self._dispatcher is not None else None
        # Without Ray's own printing handler the lines go nowhere to wait for (log_to_driver off).
        self.active = self._filter is not None

    @property
    def received(self) -> Counter[tuple[str, bool]]:
        return self._filter.received if self._filter is not None else Counter()

    def __enter__(self) -> OutputDrain:
        return self

    def __exit__(self, *exc: object) -> None:
        pass  # the filter stays: it passes unmarked lines as they are, and goes with Ray's handler

    def wait(
        self, written: dict[tuple[str, bool], int], *, timeout: float = 30.0, quiet: float = 0.5
    ) -> bool:
        """Wait until every count in ``written`` arrived, then until ``quiet`` seconds pass with
        nothing new (for what was not counted: a rank that died, output of C code or subprocesses).
        True when everything counted arrived within ``timeout``."""
        if self._filter is None:
            return False
        flt = self._filter
        deadline = time.monotonic() + timeout
        arrived = True
        with flt.changed:
            while any(flt.received[key] < n for key, n in written.items()):
                left = deadline - time.monotonic()
                if left <= 0:
                    arrived = False
                    break
                flt.changed.wait(min(left, 0.2))
            quiet_until = min(deadline, time.monotonic() + 5 * quiet) if arrived else 0.0
            while time.monotonic() < quiet_until and time.monotonic() - flt.last < quiet:
                flt.changed.wait(quiet)
        flt.flush()  # a line a rank left unfinished: what there is of it
        return arrived
