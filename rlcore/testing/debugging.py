"""Driving ``rlcore.debug`` sessions from tests, as a user would from a second terminal: a
``python:`` reward that stops once in rank 1, a reader of a process's output with deadlines, and
the attach-inspect-continue sequence. Used by the core's torchrun test and the Ray launcher's."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time

# A ``python:`` reward that stops in rlcore's loopback pdb once per rank (the reward runs in
# several worker processes), only on rank 1; ``secret`` is what the debugger is asked to print.
# The run's environment gives MARKERS, a directory for the once-per-rank markers.
BREAKPOINT_REWARD = """
import os

from rlcore.debug import breakpoint


def score(data_source, solution_str, ground_truth, extra_info=None):
    secret = f"rank{os.environ['RANK']}-answer{ground_truth}"
    marker = os.path.join(os.environ["MARKERS"], "stopped-rank" + os.environ["RANK"])
    try:  # stop once per rank (the reward runs in several worker processes)
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        first = True
    except FileExistsError:
        first = False
    if first:
        breakpoint(rank=1)
    return float(len(solution_str) % 3)
"""


class Output:
    """A process's output, read in a thread, so a test can wait for text with a deadline."""

    def __init__(self, stream) -> None:
        self.chunks: queue.Queue[str] = queue.Queue()
        self.text = ""

        def pump() -> None:
            while chunk := stream.read(1):
                self.chunks.put(chunk)

        threading.Thread(target=pump, daemon=True).start()

    def until(self, pattern: str, timeout: float, start: int = 0) -> re.Match:
        """The first match of the regular expression ``pattern`` at or after ``start``."""
        deadline = time.monotonic() + timeout
        while not (found := re.compile(pattern).search(self.text, start)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{pattern!r} not seen within {timeout:g} s; got:\n{self.text[-4000:]}")
            try:
                self.text += self.chunks.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
        return found


def kill_group(proc: subprocess.Popen) -> None:
    """End a process started with ``start_new_session=True`` and everything it started."""
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
        proc.wait(10)


class DebugClient:
    """``python -m rlcore.debug --wait S``: attaches to the first waiting breakpoint."""

    PROMPT = r"\(Pdb\) "

    def __init__(self, env: dict, wait_s: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlcore.debug", "--wait", str(int(wait_s))],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self.out = Output(self.proc.stdout)
        self.at = 0

    def prompt(self, timeout: float) -> str:
        """The text up to the next pdb prompt."""
        found = self.out.until(self.PROMPT, timeout, self.at)
        text, self.at = self.out.text[self.at : found.end()], found.end()
        return text

    def ask(self, line: str, timeout: float = 30) -> str:
        """Send ``line``; what pdb printed before its next prompt."""
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.prompt(timeout)

    def go_on(self, timeout: float = 30) -> int:
        """``c``: the session ends and the client exits; its exit status."""
        self.proc.stdin.write("c\n")
        self.proc.stdin.flush()
        return self.proc.wait(timeout)

    def kill(self) -> None:
        kill_group(self.proc)


def continue_from_rank_1(
    client: DebugClient,
    run: subprocess.Popen,
    run_out: Output,
    *,
    attach_s: float,
    also: tuple[tuple[str, str], ...] = (),
) -> None:
    """The session :data:`BREAKPOINT_REWARD` opens, checked: stopped in rank 1's ``reward.py``,
    ``secret`` holds rank 1's value (and each ``(command, expected text)`` of ``also`` answers
    so), a wait past the reward's 2 s time limit does not kill the stopped worker, ``c`` ends the
    session (the client exits on its own) and the run completes."""
    where = client.prompt(attach_s)
    assert "rank 1" in where and "reward.py" in where, where
    assert "'rank1-answer" in client.ask("p secret"), client.out.text[-2000:]
    for command, expected in also:
        assert expected in client.ask(command), client.out.text[-2000:]
    time.sleep(3)
    assert client.go_on() == 0, client.out.text[-2000:]
    assert run.wait(120) == 0, run_out.text[-3000:]
