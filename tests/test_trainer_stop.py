"""SIGTERM (a SLURM time limit, a preemption, an eviction) keeps what was learnt: the step under
way finishes, a checkpoint is written, the run exits 128 + 15, and --resume continues."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from rlcore.testing.runs import train_rows, write_run_manifest


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rlcore", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def _wait_for_rows(proc: subprocess.Popen, run_dir, count: int) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if (run_dir / "metrics.jsonl").exists() and len(train_rows(run_dir)) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"the run logged fewer than {count} steps (exit {proc.poll()})")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_a_signal_checkpoints_the_step_and_resume_continues(tmp_path, tiny_model, signum):
    # save_every = 0: without the signal there would be no checkpoint before the last step.
    manifest = write_run_manifest(
        tmp_path, tiny_model, trainer={"steps": 200, "save_every": 0}, data={"val": None}
    )
    run_dir = tmp_path / "run"
    proc = _start("run", str(manifest), "--run-dir", str(run_dir))
    _wait_for_rows(proc, run_dir, 1)
    os.kill(proc.pid, signum)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signum, stderr[-2000:]
    steps = [r["step"] for r in train_rows(run_dir)]
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert saved == [f"step_{steps[-1]:06d}"], (saved, steps)  # the step under way finished and was saved
    log = (run_dir / "run.log").read_text()
    assert f"stopped by {signal.Signals(signum).name} after step {steps[-1]}" in log
    manifest.write_text(manifest.read_text().replace("steps = 200", f"steps = {steps[-1] + 1}"))
    proc = _start("run", str(manifest), "--run-dir", str(run_dir), "--resume")
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-2000:]
    assert [r["step"] for r in train_rows(run_dir)] == list(range(1, steps[-1] + 2))


def test_a_second_signal_stops_at_once():
    from rlcore.trainer.stopping import Stopped, StopRequest

    class OneRank:
        def max(self, value):
            return value

    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.agreed(OneRank()) == signal.SIGTERM  # the first one only asks
        with pytest.raises(Stopped) as info:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
        assert info.value.checkpoint is None and info.value.name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored
