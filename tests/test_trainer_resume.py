"""A run killed with SIGKILL at a random point, then resumed, logs what an uninterrupted run logs."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from rlcore.testing.runs import train_rows, write_run_manifest

VOLATILE = ("timing_s/", "perf/", "reward/time_s")


def _comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}


def _rlcore(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rlcore", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _wait_for_checkpoint(proc: subprocess.Popen, run_dir) -> float:
    deadline = time.monotonic() + 600
    while (
        not (run_dir / "checkpoints" / "latest").exists()
        and proc.poll() is None
        and time.monotonic() < deadline
    ):
        time.sleep(0.02)
    return time.monotonic()


@pytest.mark.slow
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path, tiny_model):
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        rollout={"samples_per_prompt": 2, "temperature": 1.0},
        trainer={"steps": 6, "save_every": 1, "lr": 1e-3},
        data={"val": None},
    )
    reference = tmp_path / "reference"
    proc = _rlcore("run", str(manifest), "--run-dir", str(reference))
    first_checkpoint = _wait_for_checkpoint(proc, reference)
    assert proc.wait(timeout=600) == 0
    window = time.monotonic() - first_checkpoint  # from the first checkpoint to the end of the run

    seed = random.randrange(1 << 30)
    delay = random.Random(seed).uniform(0.0, 0.8 * window)
    killed = tmp_path / "killed"
    proc = _rlcore("run", str(manifest), "--run-dir", str(killed))
    _wait_for_checkpoint(proc, killed)
    time.sleep(delay)
    assert proc.poll() is None, "the run ended before the kill"
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    print(
        f"killed {delay:.2f} s after the first checkpoint (seed {seed}); left:",
        sorted(p.name for p in (killed / "checkpoints").glob("*")),
    )

    proc = _rlcore("run", str(manifest), "--run-dir", str(killed), "--resume")
    assert proc.wait(timeout=600) == 0

    expected = [_comparable(r) for r in train_rows(reference)]
    got = [_comparable(r) for r in train_rows(killed)]
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(expected, got):
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), (a["step"], key, a[key], b[key])
