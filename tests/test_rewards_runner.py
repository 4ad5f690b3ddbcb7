"""RewardRunner: failures score 0 and are counted, time limits hold even for infinite loops."""

from __future__ import annotations

import os
import time

import pytest
from loguru import logger

from rlcore.errors import RlcoreError
from rlcore.interfaces import RewardInput, RewardResult
from rlcore.reward_pool import RewardRunner


def behaving(item: RewardInput):
    """Scores by what the response asks for."""
    r = item.response
    if r == "loop":
        while True:
            pass
    if r == "sleep":
        time.sleep(60)
    if r == "raise":
        raise ValueError("bad row")
    if r == "text":
        return "1.0"
    if r == "none":
        return None
    if r == "nan":
        return float("nan")
    if r == "exit":
        os._exit(3)
    if r == "sysexit":
        raise SystemExit(1)
    if r == "dict":
        return {"score": 0.25, "acc": 1.0}
    if r.startswith("metric"):
        return RewardResult(1.0, {"length": float(len(r)), "bad": "x"})
    return float(len(r))


def items(*responses: str) -> list[RewardInput]:
    return [RewardInput(response=r, ground_truth="g") for r in responses]


@pytest.fixture
def captured():
    messages: list[str] = []
    sink = logger.add(lambda m: messages.append(str(m)), level="WARNING")
    yield messages
    logger.remove(sink)


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_good_and_bad_items(isolation, captured):
    with RewardRunner(behaving, timeout_s=5, workers=3, isolation=isolation) as runner:
        batch = runner.score(items("ab", "raise", "text", "none", "nan", "abc", "dict", "raise", "sysexit"))
    assert batch.scores == [2.0, 0.0, 0.0, 0.0, 0.0, 3.0, 0.25, 0.0, 0.0]
    assert batch.statuses == ["ok", "error", "invalid", "invalid", "invalid", "ok", "ok", "error", "error"]
    assert batch.metrics["reward/errors"] == 3.0
    assert batch.metrics["reward/invalid"] == 3.0
    assert batch.metrics["reward/timeouts"] == 0.0
    assert batch.metrics["reward/acc"] == 1.0  # verl's dict form: other keys are metrics
    # The first error of each kind is logged, once.
    assert sum("raised an exception" in m for m in captured) == 1
    assert sum("not a finite number" in m for m in captured) == 1
    # Which error comes first depends on the workers' timing: either exception, with its detail.
    (error,) = [m for m in captured if "raised an exception" in m]
    assert "ValueError: bad row" in error or "SystemExit" in error, error


def test_per_item_metrics_are_averaged_over_the_items_reporting_them():
    with RewardRunner(behaving, timeout_s=5, workers=2) as runner:
        batch = runner.score(items("metric", "metric12", "xy"))
    assert batch.scores == [1.0, 1.0, 2.0]
    assert batch.metrics["reward/length"] == pytest.approx(7.0)  # (6 + 8) / 2; "bad" is not a number
    assert "reward/bad" not in batch.metrics


def test_infinite_loop_is_killed_at_the_limit(captured):
    with RewardRunner(behaving, timeout_s=1.0, workers=2, isolation="process") as runner:
        start = time.monotonic()
        batch = runner.score(items("a", "loop", "bb", "loop", "ccc", "sleep"))
        elapsed = time.monotonic() - start
        assert batch.scores == [1.0, 0.0, 2.0, 0.0, 3.0, 0.0]
        assert batch.statuses.count("timeout") == 3
        assert batch.metrics["reward/timeouts"] == 3.0
        # Two workers, three stuck items: two rounds of the 1 s limit, not 60 s.
        assert elapsed < 5.0, elapsed
        assert sum("ran past its time limit" in m for m in captured) == 1
        # The killed workers were replaced: the runner keeps working.
        again = runner.score(items("abcd", "e"))
        assert again.scores == [4.0, 1.0] and again.metrics["reward/timeouts"] == 0.0
        stuck = [p for p in runner._pool.procs if p is not None]
        assert all(p.is_alive() for p in stuck)


def test_timeouts_in_threads_are_abandoned_not_waited_for():
    def slow(item):
        time.sleep(3 if item.response == "slow" else 0)
        return 1.0

    with RewardRunner(slow, timeout_s=0.5, workers=2, isolation="thread") as runner:
        start = time.monotonic()
        batch = runner.score(items("slow", "x", "y"))
        assert time.monotonic() - start < 2.5
    assert batch.scores == [0.0, 1.0, 1.0] and batch.statuses[0] == "timeout"


def test_a_worker_that_dies_is_counted_and_replaced():
    with RewardRunner(behaving, timeout_s=5, workers=1, isolation="process") as runner:
        batch = runner.score(items("a", "exit", "bb"))
    assert batch.scores == [1.0, 0.0, 2.0]
    assert batch.statuses == ["ok", "error", "ok"]


def test_closures_and_lambdas_work_in_worker_processes():
    offset = 10.0
    with RewardRunner(lambda item: offset + len(item.response), timeout_s=5, workers=2) as runner:
        assert runner.isolation == "fork"
        assert runner.score(items("a", "bb")).scores == [11.0, 12.0]


def test_items_are_scored_in_parallel():
    def wait(item):
        time.sleep(0.5)
        return 1.0

    with RewardRunner(wait, timeout_s=5, workers=4) as runner:
        runner.score(items("warm-up"))
        start = time.monotonic()
        assert runner.score(items(*"abcd")).scores == [1.0] * 4
        assert time.monotonic() - start < 1.5


def test_empty_batch_and_reuse():
    with RewardRunner(behaving, timeout_s=1, workers=2) as runner:
        empty = runner.score([])
        assert empty.scores == [] and empty.metrics["reward/errors"] == 0.0
        for _ in range(3):
            assert runner.score(items("a", "bb")).scores == [1.0, 2.0]


def test_order_is_kept_with_many_items():
    responses = ["x" * (i % 17) for i in range(300)]
    with RewardRunner(behaving, timeout_s=5, workers=3) as runner:
        assert runner.score(items(*responses)).scores == [float(len(r)) for r in responses]


def test_close_stops_the_workers():
    runner = RewardRunner(behaving, timeout_s=1, workers=2)
    runner.score(items("a", "b"))
    procs = [p for p in runner._pool.procs if p is not None]
    assert procs
    runner.close()
    assert not any(p.is_alive() for p in procs)


@pytest.mark.parametrize(
    ("kwargs", "phrase"),
    [({"timeout_s": 0}, "timeout_s"), ({"workers": 0}, "workers"), ({"fn": 3}, "callable")],
)
def test_bad_arguments(kwargs, phrase):
    args = {"fn": behaving, "timeout_s": 1.0, "workers": 1, **kwargs}
    with pytest.raises(RlcoreError, match=phrase):
        RewardRunner(**args)


class _UnpicklableInAWorker:
    """Pickles in the trainer, but unpickling it in a fresh worker fails."""

    def __call__(self, item):
        return 1.0

    def __reduce__(self):
        return (eval, ("1/0",))


def test_forkserver_workers_run_a_python_reward_from_a_file(tmp_path):
    from rlcore.builtin.options import PythonRewardOptions
    from rlcore.builtin.python_reward import build_python_reward

    path = tmp_path / "my_reward.py"
    path.write_text("def score(item):\n    return float(len(item.response))\n")
    fn = build_python_reward(PythonRewardOptions(target=f"{path}:score"), None)
    with RewardRunner(fn, timeout_s=5, workers=2, isolation="forkserver") as runner:
        runner.start()
        assert runner._pool.state == ["ready", "ready"]
        assert runner.score(items("ab", "c", "")).scores == [2.0, 1.0, 0.0]
        assert runner.isolation == "forkserver"


def test_workers_that_cannot_start_fall_back_to_fork(captured):
    with RewardRunner(_UnpicklableInAWorker(), timeout_s=5, workers=2, isolation="forkserver") as runner:
        first = runner.score(items("a", "b", "c"))
        assert first.scores == [0.0, 0.0, 0.0] and first.metrics["reward/errors"] == 3.0
        assert any("failed to start" in m for m in captured)
        assert runner.isolation == "fork"
        assert runner.score(items("a", "b", "c")).scores == [1.0, 1.0, 1.0]


def test_start_readies_every_worker():
    with RewardRunner(behaving, timeout_s=5, workers=3) as runner:
        runner.start()
        assert runner._pool.state == ["ready"] * 3
        pids = [p.pid for p in runner._pool.procs]
        assert runner.score(items("a", "bb", "ccc", "d")).scores == [1.0, 2.0, 3.0, 1.0]
        assert [p.pid for p in runner._pool.procs] == pids  # reused, not restarted


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line for line in f)
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_workers_exit_when_the_trainer_dies(tmp_path):
    """Even a worker stuck in an infinite loop goes away once its parent is gone."""
    import subprocess
    import sys

    script = tmp_path / "trainer.py"
    script.write_text(
        "import os, sys, threading, time\n"
        "from rlcore.interfaces import RewardInput\n"
        "from rlcore.reward_pool import RewardRunner\n"
        "def spin(item):\n"
        "    while True:\n"
        "        pass\n"
        "runner = RewardRunner(spin, timeout_s=600, workers=2).start()\n"
        "threading.Thread(target=runner.score, args=([RewardInput(response='x')],), daemon=True).start()\n"
        "time.sleep(0.5)\n"
        "open(sys.argv[1], 'w').write(' '.join(str(p.pid) for p in runner._pool.procs))\n"
        "os._exit(0)\n"
    )
    pid_file = tmp_path / "pids"
    subprocess.run(
        [sys.executable, str(script), str(pid_file)], stdout=subprocess.DEVNULL, timeout=60, check=True
    )
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 2
    try:
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in pids)
    finally:
        for pid in pids:  # never leave a spinning worker behind, even when the check fails
            if _alive(pid):
                os.kill(pid, 9)
