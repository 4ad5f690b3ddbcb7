"""Reward workers under fault injection (issue 28, items 2c and 6): a worker killed from outside
is logged, counted and replaced; what a reward prints is captured in the worker, kept as a
bounded tail for the error message and the log, and counted, never sent to the console."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
from loguru import logger

from rlcore import reward_pool
from rlcore.interfaces import RewardInput
from rlcore.reward_pool import RewardRunner

OUTPUT_TAIL = getattr(reward_pool, "OUTPUT_TAIL", 4096)  # the bytes of each call's output kept

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork-based workers")


@pytest.fixture
def logged():
    seen: list[str] = []
    sink = logger.add(
        lambda m: seen.append(m.record["level"].name + " " + m.record["message"]), level="DEBUG"
    )
    yield seen
    logger.remove(sink)


def _items(n: int) -> list[RewardInput]:
    return [
        RewardInput(prompt=f"q{i}", response=str(i), ground_truth=str(i), data_source="t") for i in range(n)
    ]


def test_a_worker_killed_between_batches_is_logged_counted_and_replaced(logged):
    with RewardRunner(lambda item: 1.0, workers=3, isolation="fork").start() as runner:
        first = runner.score(_items(6))
        assert first.metrics["reward/worker_deaths"] == 0.0
        victim = runner._pool.procs[1]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(5)
        second = runner.score(_items(6))
        assert second.scores == [1.0] * 6 and set(second.statuses) == {"ok"}
        assert second.metrics["reward/worker_deaths"] == 1.0
        assert all(p is not None and p.is_alive() for p in runner._pool.procs), (
            "the dead worker was not replaced"
        )
        assert runner._pool.procs[1].pid != victim.pid
    said = "\n".join(logged)
    assert "reward worker 1 died (killed by SIGKILL) between batches; it is replaced" in said, said


def _dies_on_first(item: RewardInput) -> float:
    if item.response == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    return 1.0


def test_a_worker_killed_while_scoring_is_logged_counted_and_replaced(logged):
    with RewardRunner(_dies_on_first, workers=2, isolation="fork") as runner:
        batch = runner.score(_items(4))
    assert batch.statuses[0] == "error" and batch.statuses[1:] == ["ok"] * 3
    assert batch.metrics["reward/worker_deaths"] == 1.0 and batch.metrics["reward/errors"] == 1.0
    assert any("died while scoring item 0" in line and "killed by SIGKILL" in line for line in logged), logged


MEGABYTE = 1 << 20


def _chatty(item: RewardInput) -> float:
    print("x" * MEGABYTE)  # Python's stdout
    os.write(2, b"E" * 1000 + b"tail-of-" + item.response.encode())  # fd 2 directly, as C code would
    if item.response == "3":
        print("diagnostic: the grader found no answer", flush=True)
        raise ValueError("cannot grade")
    return 0.5


def test_what_a_reward_prints_is_captured_bounded_and_counted(capfd, logged):
    with RewardRunner(_chatty, workers=2, isolation="fork") as runner:
        started = time.perf_counter()
        batch = runner.score(_items(4))
        elapsed = time.perf_counter() - started
    out, err = capfd.readouterr()
    # Only the log's bounded tails (loguru's default sink writes debug lines to stderr in tests).
    assert "x" * (OUTPUT_TAIL + 1) not in out + err and len(out + err) < 64 * 1024, (
        "reward output reached the console"
    )
    printed = 4 * (MEGABYTE + 1 + 1000 + len("tail-of-0")) + len("diagnostic: the grader found no answer\n")
    assert batch.metrics["reward/output_bytes"] == printed
    assert batch.metrics["reward/output_dropped_bytes"] == printed - 4 * OUTPUT_TAIL
    assert batch.statuses == ["ok", "ok", "ok", "error"] and batch.scores[:3] == [0.5] * 3
    said = "\n".join(logged)
    assert "its output ended with" in said and "diagnostic: the grader found no answer" in said, said
    debug = [line for line in logged if line.startswith("DEBUG reward output of item")]
    assert len(debug) == 4 and all(len(line) < OUTPUT_TAIL + 200 for line in debug)
    assert "tail-of-2" in debug[2]
    assert elapsed < 30


@pytest.mark.slow
def test_a_run_whose_reward_prints_keeps_the_console_and_its_log_small(tmp_path, tiny_model):
    """The issue's case at a smaller size: a python: reward printing 1 MB per call sent all of
    it through rlcore's stdout and none of it into run.log."""
    from rlcore.testing.runs import run_cli, train_rows, write_run_manifest

    (tmp_path / "chatty.py").write_text(
        "def score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    print('y' * (1 << 20))\n"
        "    print('graded:', repr(solution_str[:5]))\n"
        "    return 0.5\n"
    )
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        data={"val": None},
        trainer={"steps": 1},
        reward={"function": "python:chatty.py:score", "method": None},
    )
    proc = run_cli("run", str(manifest), "--run-dir", str(tmp_path / "run"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stdout) + len(proc.stderr) < 64 * 1024 and "yyyy" not in proc.stdout + proc.stderr
    log = (tmp_path / "run" / "run.log").read_text()
    assert "reward output of item" in log and "graded:" in log and len(log) < 200 * 1024
    [row] = train_rows(tmp_path / "run")
    assert row["reward/output_bytes"] > 8 * (1 << 20)  # 4 prompts x 2 samples, 1 MB and a line each
    assert row["reward/output_dropped_bytes"] > 8 * ((1 << 20) - OUTPUT_TAIL)
