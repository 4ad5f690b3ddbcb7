"""OutputDrain and LineCount without a cluster: what the launcher waits for, and for how long."""

from __future__ import annotations

import io
import threading
import time

from rlcore_launcher_ray.output import LineCount, OutputDrain


class FakeDispatcher:
    def __init__(self, printing: bool = True):
        self.handlers = [("ray_print_logs", print)] if printing else []

    def add_handler(self, name, handler):
        self.handlers.append((name, handler))

    def remove_handler(self, name):
        self.handlers = [h for h in self.handlers if h[0] != name]

    def emit(self, data):
        for name, handler in self.handlers:
            if name != "ray_print_logs":
                handler(data)


def test_line_count_passes_text_through_and_counts_complete_lines():
    stream = io.StringIO()
    counted = LineCount(stream)
    counted.write("a\nb\n")
    counted.write("partial")
    counted.flush()
    assert counted.lines == 2 and stream.getvalue() == "a\nb\npartial"


def test_drain_waits_for_lines_still_in_flight():
    dispatcher = FakeDispatcher()
    with OutputDrain(dispatcher) as drain:
        dispatcher.emit({"pid": 7, "is_err": False, "lines": ["one"]})
        later = threading.Timer(0.5, dispatcher.emit, [{"pid": 7, "is_err": False, "lines": ["two", "three"]}])
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
