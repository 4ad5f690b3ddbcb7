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

from rlcore.interfaces import RewardInput
from rlcore import reward_pool
from rlcore.reward_pool import RewardRunner

OUTPUT_TAIL = getattr(reward_pool, "OUTPUT_TAIL", 4096)  # the bytes of each call's output kept

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork-based workers")


@pytest.fixture
def logged():
    seen: list[str] = []
    sink = logger.add(lambda m: seen.append(m.record["level"].name + " " + m.record["message"]), level="DEBUG")
    yield seen
    logger.remove(sink)


def _items(n: int) -> list[RewardInput]:
    return [RewardInput(prompt=f"q{i}", response=str(i), ground_truth=str(i), data_source="t") for i in range(n)]


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
        assert all(p is not None and p.is_alive() for p in runner._pool.procs), "the dead worker was not replaced"
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
    assert "x" * (OUTPUT_TAIL + 1) not in out + err and len(out + err) < 64 * 1024, "reward output reached the console"
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
