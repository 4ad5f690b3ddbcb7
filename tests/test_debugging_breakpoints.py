"""Stopping in one rank of a several-rank run (docs/debugging.md): ``rlcore.debug.breakpoint(rank=1)``
in a ``python:`` reward, two CPU ranks started by torchrun, the debugger driven through
``python -m rlcore.debug`` as a user would from a second terminal."""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import threading
import time

import pytest

from rlcore.testing.runs import train_rows, write_run_manifest

REWARD = '''
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
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lines:
    """A process's output, read in a thread, so the test can wait for text with a deadline."""

    def __init__(self, stream) -> None:
        self.chunks: queue.Queue[str] = queue.Queue()
        self.text = ""

        def pump() -> None:
            while chunk := stream.read(1):
                self.chunks.put(chunk)

        threading.Thread(target=pump, daemon=True).start()

    def until(self, needle: str, timeout: float, start: int = 0) -> int:
        deadline = time.monotonic() + timeout
        while needle not in self.text[start:]:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{needle!r} not seen within {timeout:g} s; got:\n{self.text[-3000:]}")
            try:
                self.text += self.chunks.get(timeout=remaining)
            except queue.Empty:
                continue
        return self.text.index(needle, start) + len(needle)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
        proc.wait(10)


@pytest.mark.slow
def test_breakpoint_on_rank_1_of_two_torchrun_ranks(tmp_path, tiny_model):
    (tmp_path / "reward.py").write_text(REWARD)
    markers = tmp_path / "markers"
    markers.mkdir()
    manifest = write_run_manifest(
        tmp_path, tiny_model,
        reward={"function": "python:reward.py:score", "method": None, "timeout_s": 2},
        data={"val": None},
        trainer={"steps": 2},
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MARKERS": str(markers), "RLCORE_DEBUG_DIR": str(tmp_path / "debug")}
    env.pop("RLCORE_DEBUG_RANK", None)
    run = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2", "--master-addr=127.0.0.1",
         f"--master-port={_free_port()}", "-m", "rlcore", "run", str(manifest), "--run-dir", str(tmp_path / "run")],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=tmp_path, start_new_session=True,
    )
    client = subprocess.Popen(
        [sys.executable, "-m", "rlcore.debug", "--wait", "90"], env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True,
    )
    try:
        run_out, debug_out = Lines(run.stdout), Lines(client.stdout)
        # The rank says where it stopped, and how to attach.
        run_out.until("rlcore.debug: rank 1 (pid", 90)
        assert "rlcore.debug: rank 0" not in run_out.text
        at = debug_out.until("(Pdb) ", 30)
        assert "rank 1" in debug_out.text and "reward.py" in debug_out.text
        client.stdin.write("p secret\n")
        client.stdin.flush()
        at = debug_out.until("(Pdb) ", 30, at)
        assert "'rank1-answer" in debug_out.text[:at], debug_out.text
        client.stdin.write("p os.environ['RANK']\n")
        client.stdin.flush()
        at = debug_out.until("(Pdb) ", 30, at)
        assert "'1'" in debug_out.text[:at]
        time.sleep(3)  # past the reward's 2 s time limit: a stopped worker is not killed
        client.stdin.write("c\n")
        client.stdin.flush()
        assert client.wait(30) == 0, debug_out.text  # the session ended: the client exits on its own
        assert run.wait(120) == 0, run_out.text[-3000:]
    finally:
        _kill(run)
        _kill(client)
    rows = train_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["reward/timeouts"] == 0 and r["reward/errors"] == 0 for r in rows), rows
    assert not list((tmp_path / "debug").glob("*.json"))  # the session's record is gone
