"""OutputDrain, the line filter and LineCount without a cluster: every line once, and what the
launcher waits for, and for how long."""

from __future__ import annotations

import io
import threading
import time

import pytest
from rlcore_launcher_ray.output import END, MARK, LineCount, OutputDrain


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
    return [MARK.format(token=token, seq=i) + line + END for i, line in enumerate(lines)]


def as_ray_reads(text):
    """The lines a log monitor publishes from a file holding ``text``, read whole."""
    return [line.rstrip("\r\n") for line in text.splitlines(keepends=True) if line.endswith("\n")]


def test_line_count_marks_each_line_start_and_end_and_counts_complete_lines():
    stream = io.StringIO()
    counted = LineCount(stream, token="ab12")
    counted.write("a\nb\r\n")
    counted.write("part")
    counted.write("ial\n")
    counted.flush()
    assert counted.lines == 3
    # The end mark goes before the line ending, which a log monitor strips ("\r\n" too).
    mark = [MARK.format(token="ab12", seq=i) for i in range(3)]
    assert stream.getvalue() == f"{mark[0]}a{END}\n{mark[1]}b{END}\r\n{mark[2]}partial{END}\n"
    assert as_ray_reads(stream.getvalue()) == marked(["a", "b", "partial"])


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


def published(dispatcher, pieces, pid=7, is_err=False):
    for batch in pieces:
        dispatcher.emit({"pid": pid, "is_err": is_err, "lines": batch})


def written(texts, token):
    """What a log monitor reading whole lines publishes of ``texts`` printed through LineCount."""
    stream = io.StringIO()
    counted = LineCount(stream, token=token)
    for text in texts:
        print(text, file=counted)
    return as_ray_reads(stream.getvalue())


def test_filter_joins_a_line_a_monitor_published_in_two_pieces_wherever_it_was_cut():
    """A log monitor that reads a file mid-write publishes the half-written line, then its rest,
    as two lines (Ray's log_monitor.py: readline at the end of the file); one print of 40 bytes
    lands in two steps when it crosses a page. Every cut, inside the marks too, is joined."""
    text = "line 1234 of rank 0"
    before, line, after = written(["before", text, "after"], token="ab12")
    for cut in range(1, len(line)):
        dispatcher = FakeDispatcher()
        drain = OutputDrain(dispatcher)
        # The two pieces in one message, or in two.
        published(dispatcher, [[before, line[:cut]], [line[cut:], after]])
        assert dispatcher.lines() == ["before", text, "after"], cut
        (other,) = written([text], token="cd34")
        published(dispatcher, [[other[:cut], other[cut:]]], pid=8)
        assert dispatcher.lines(8) == [text], cut
        assert drain.received[("7", False)] == 3 and drain.received[("8", False)] == 1
        # Cut twice (each piece holds something: a monitor publishes no empty rest).
        (third,) = written([text], token="ef56")
        if cut + 2 < len(third):
            published(dispatcher, [[third[:cut]], [third[cut : cut + 2]], [third[cut + 2 :]]], pid=9)
            assert dispatcher.lines(9) == [text], cut


def test_filter_prints_once_a_line_one_monitor_cut_and_another_read_whole():
    dispatcher = FakeDispatcher()
    drain = OutputDrain(dispatcher)
    one, two = marked(["one", "two"])
    # Monitor A reads "one" mid-write; monitor B publishes both lines whole; then A the rest.
    published(dispatcher, [[one[:6]], [one, two], [one[6:], two]])
    assert dispatcher.lines() == ["one", "two"]
    assert drain.received[("7", False)] == 2
    # B's copy of "three" comes first this time; A's two pieces add nothing.
    three = marked(["one", "two", "three"])[2]
    published(dispatcher, [[three], [three[:9]], [three[9:]]])
    assert dispatcher.lines() == ["one", "two", "three"]


def test_filter_passes_unmarked_output_as_ray_delivers_it():
    dispatcher = FakeDispatcher()
    OutputDrain(dispatcher)
    published(dispatcher, [["from C", "", "\x1b[31mred\x1b[0m"], marked(["mine"]), ["after"]])
    assert dispatcher.lines() == ["from C", "", "\x1b[31mred\x1b[0m", "mine", "after"]


def test_a_line_left_unfinished_is_printed_by_the_drain_as_far_as_it_got():
    dispatcher = FakeDispatcher()
    with OutputDrain(dispatcher) as drain:
        stream = io.StringIO()
        counted = LineCount(stream, token="ab12")
        print("done", file=counted)
        counted.write("Traceback (most recent call last): cut off")  # the rank died here
        published(dispatcher, [stream.getvalue().rstrip("\n").split("\n")])
        assert dispatcher.lines() == ["done"]
        assert drain.wait({("7", False): counted.lines}, timeout=5, quiet=0.05)
    assert dispatcher.lines() == ["done", "Traceback (most recent call last): cut off"]


def test_a_line_held_open_is_printed_after_the_hold_and_its_rest_as_it_comes(monkeypatch):
    """A progress bar redrawn with carriage returns keeps its line open for long: its first
    piece waits at most the hold, then goes out; the pieces after it go out as they come."""
    dispatcher = FakeDispatcher()
    drain = OutputDrain(dispatcher)
    flt = dispatcher.handlers[0][1]
    monkeypatch.setattr(flt, "hold", 0.05)
    stream = io.StringIO()
    bar = LineCount(stream, token="ab12")
    bar.write("\r 10%")
    published(dispatcher, [[stream.getvalue()]], is_err=True)
    assert dispatcher.lines(7, True) == []
    time.sleep(0.1)
    published(dispatcher, [marked(["other rank"], token="cd34")], pid=8)  # any message releases it
    assert dispatcher.lines(7, True) == ["\r 10%"]
    published(dispatcher, [["\r 50%"]], is_err=True)
    bar.write("\r 50%\r100%\n")
    published(dispatcher, [[stream.getvalue().rstrip("\n").split("\r 50%")[-1]]], is_err=True)
    assert dispatcher.lines(7, True) == ["\r 10%", "\r 50%", "\r100%"]
    assert drain.received[("7", True)] == 3


@pytest.mark.parametrize("cut", [1, 3, 5, 8, 12])
def test_a_cut_inside_the_start_mark_is_still_joined(cut):
    dispatcher = FakeDispatcher()
    OutputDrain(dispatcher)
    line = marked(["x"] * 11, token="ab12")[10]
    published(dispatcher, [[line[:cut]], [line[cut:]]])
    assert dispatcher.lines() == ["x"]
