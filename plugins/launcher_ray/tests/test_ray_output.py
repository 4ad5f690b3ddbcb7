"""OutputDrain, the line filter and LineCount without a cluster: every line once, and what the
launcher waits for, and for how long."""

from __future__ import annotations

import io
import threading
import time

from rlcore_launcher_ray.output import MARK, LineCount, OutputDrain


class FakeDispatcher:
    """Ray's dispatcher of forwarded lines, with its printing handler recording what it prints."""

    def __init__(self, printing: bool = True):
        self.printed: list[dict] = []
        self.handlers = [("ray_print_logs", self.printed.append)] if printing else []

    def add_handler(self, name, handler):
        self.handlers.append((name, handler))

    def remove_handler(self, name):
        self.handlers = [h for h in self.handlers if h[0] != name]

    def emit(self, data):
        for _, handler in self.handlers:
            handler(data)

    def lines(self, pid=7, is_err=False):
        return [
            line for d in self.printed if d["pid"] == pid and d["is_err"] == is_err for line in d["lines"]
        ]


def marked(lines, token="ab12"):
    return [MARK.format(token=token, seq=i) + line for i, line in enumerate(lines)]


def test_line_count_marks_each_line_start_and_counts_complete_lines():
    stream = io.StringIO()
    counted = LineCount(stream, token="ab12")
    counted.write("a\nb\n")
    counted.write("part")
    counted.write("ial\n")
    counted.flush()
    assert counted.lines == 3
    assert stream.getvalue() == "".join(m + "\n" for m in marked(["a", "b", "part"])).replace(
        "part\n", "partial\n"
    )


def test_filter_lets_each_line_through_once_however_many_monitors_publish_it():
    dispatcher = FakeDispatcher()
    drain = OutputDrain(dispatcher)
    lines = marked(["one", "same", "same", "two"])
    # Two log monitors read the same file, in their own batches, interleaved; C output has no mark.
    for batch in (lines[:1], lines[:3], lines[1:2], ["from C"], lines[2:], lines[3:], ["from C"]):
        dispatcher.emit({"pid": 7, "is_err": False, "lines": batch})
    assert dispatcher.lines() == ["one", "same", "same", "from C", "two", "from C"]
    # Another worker's (or stream's) numbers are its own.
    dispatcher.emit({"pid": 8, "is_err": True, "lines": marked(["other"], token="cd34")})
    assert dispatcher.lines(8, True) == ["other"]
    assert drain.received[("7", False)] == 6 and drain.received[("8", True)] == 1
    # Installed once: a second drain keeps the same filter in front of the printer.
    OutputDrain(dispatcher)
    dispatcher.emit({"pid": 7, "is_err": False, "lines": lines})
    assert dispatcher.lines() == ["one", "same", "same", "from C", "two", "from C"]
    assert [name for name, _ in dispatcher.handlers] == ["ray_print_logs"]


def test_drain_waits_for_lines_still_in_flight():
    dispatcher = FakeDispatcher()
    with OutputDrain(dispatcher) as drain:
        dispatcher.emit({"pid": 7, "is_err": False, "lines": ["one"]})
        later = threading.Timer(
            0.5, dispatcher.emit, [{"pid": 7, "is_err": False, "lines": ["two", "three"]}]
        )
        later.start()
        started = time.monotonic()
        assert drain.wait({("7", False): 3, ("7", True): 0}, timeout=10, quiet=0.1)
        assert 0.4 < time.monotonic() - started < 5
    assert [h[0] for h in dispatcher.handlers] == ["ray_print_logs"]


def test_drain_gives_up_after_its_timeout():
    dispatcher = FakeDispatcher()
    with OutputDrain(dispatcher) as drain:
        started = time.monotonic()
        assert not drain.wait({("7", True): 1}, timeout=0.3, quiet=0.1)
        assert time.monotonic() - started < 2


def test_drain_is_off_when_ray_prints_nothing_to_this_driver():
    drain = OutputDrain(FakeDispatcher(printing=False))
    assert not drain.active
    started = time.monotonic()
    assert not drain.wait({("7", False): 5}, timeout=10)
    assert time.monotonic() - started < 0.1


def test_drain_returns_only_after_the_last_lines_are_printed():
    """A drain that returned while Ray's handler was still printing would let the driver shut
    down under it: lines are counted once printed, not before."""
    dispatcher = FakeDispatcher()
    printing = threading.Event()
    done_printing = []

    def slow_printer(data):
        printing.set()
        time.sleep(0.5)  # a terminal that takes its time
        dispatcher.printed.append(data)
        done_printing.append(time.monotonic())

    dispatcher.handlers = [("ray_print_logs", slow_printer)]
    with OutputDrain(dispatcher) as drain:
        threading.Thread(
            target=dispatcher.emit, args=[{"pid": 7, "is_err": False, "lines": ["last"]}]
        ).start()
        assert printing.wait(5)
        assert drain.wait({("7", False): 1}, timeout=10, quiet=0.1)
        returned = time.monotonic()
    assert dispatcher.lines() == ["last"] and done_printing and done_printing[0] <= returned
