"""A run killed with SIGKILL at a random point, then resumed, logs what an uninterrupted run logs."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from trainer_support import train_rows, write_manifest

VOLATILE = ("timing_s/", "perf/")


def _comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}


def _rlcore(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlcore", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path, tiny_model):
    manifest = write_manifest(
        tmp_path, tiny_model,
        rollout={"samples_per_prompt": 2, "temperature": 1.0},
        trainer={"steps": 4, "save_every": 1, "lr": 1e-3},
        data={"val": None},
    )
    reference = tmp_path / "reference"
    proc = _rlcore("run", str(manifest), "--run-dir", str(reference))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    started = time.monotonic()

    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    killed = tmp_path / "killed"
    proc = _rlcore("run", str(manifest), "--run-dir", str(killed))
    # Wait for the first checkpoint, then kill at a random moment of the remaining steps.
    deadline = time.monotonic() + 600
    while not (killed / "checkpoints" / "latest").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 3.0))
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    print(f"killed after {time.monotonic() - started:.1f} s (seed {seed}); checkpoints:",
          sorted(p.name for p in (killed / "checkpoints").glob("*")))

    proc = _rlcore("run", str(manifest), "--run-dir", str(killed), "--resume")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out

    expected = [_comparable(r) for r in train_rows(reference)]
    got = [_comparable(r) for r in train_rows(killed)]
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    for a, b in zip(expected, got):
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), (a["step"], key, a[key], b[key])
