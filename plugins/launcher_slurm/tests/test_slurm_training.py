"""`rlcore run` with `[launcher] name = "slurm"`, end to end: the CLI submits a real batch job whose
ranks are real `python -m rlcore run` CPU training runs of a tiny random model, and follows it.
The several-node runs are in test_slurm_ranks.py."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w
from rlcore_launcher_slurm import slurm

from rlcore.testing import require_plugins
from rlcore.testing.runs import TINY_RUN, TINY_RUN_PLUGINS, deep_update

# Every test here runs TINY_RUN, whose components come from plugins this one does not depend on.
require_plugins(*TINY_RUN_PLUGINS)


def tiny_manifest(directory: Path, model: Path, steps: int = 2, **launcher) -> Path:
    """The shared tiny training manifest (rlcore.testing.runs.TINY_RUN), launched through SLURM."""
    doc = deep_update(
        TINY_RUN,
        {
            "run": {"name": "slurm-e2e"},
            "model": {"path": str(model)},
            "trainer": {"steps": steps, "loggers": ["console", "jsonl"]},
            "launcher": {"name": "slurm", "poll_interval": 0.5, **launcher},
        },
    )
    path = directory / "manifest.toml"
    path.write_text(tomli_w.dumps(doc), encoding="utf-8")
    return path


def rlcore(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlcore", *args], capture_output=True, text=True, timeout=timeout
    )


def test_cli_dry_run_prints_the_script(tmp_path):
    (tmp_path / "model").mkdir()  # validation only checks that it exists; a dry run loads nothing
    manifest = tiny_manifest(tmp_path, tmp_path / "model", nodes=1)
    run_dir = tmp_path / "out"
    proc = rlcore(
        "run",
        str(manifest),
        "--run-dir",
        str(run_dir),
        "--dry-run",
        "--set",
        "launcher.nodes=3",
        "--set",
        'launcher.partition="gpu"',
        "--set",
        "trainer.steps=7",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "#SBATCH --nodes=3" in proc.stdout and "#SBATCH --partition=gpu" in proc.stdout
    driver = re.search(r"^RLCORE_DRIVER=\((.*)\)$", proc.stdout, re.M).group(1)
    assert shlex.split(driver)[1:] == [
        "-m",
        "rlcore",
        "run",
        f"{run_dir}/launch/manifest.toml",
        "--run-dir",
        str(run_dir),
    ]
    assert not run_dir.exists()


@pytest.mark.slurm
@pytest.mark.slow
def test_training_run_as_a_slurm_job(slurm_cluster, tmp_path, tiny_model):
    manifest = tiny_manifest(tmp_path, tiny_model, steps=2, nodes=1, cpus_per_task=1, time="10")
    run_dir = tmp_path / "out"
    proc = rlcore("run", str(manifest), "--run-dir", str(run_dir), "--set", "trainer.steps=3")
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    job = re.search(r"submitted job (\d+)", out).group(1)
    # The job's log was streamed while it ran: the driver trained for the overridden 3 steps.
    for step in (1, 2, 3):
        assert re.search(rf"^step {step}/3 \|", out, re.M), out
    assert "[rlcore] ranks exited with status 0" in out
    assert f"[rlcore slurm] job {job} COMPLETED" in out
    log = (run_dir / "launch" / f"slurm-{job}.log").read_text()
    assert "step 3/3" in log
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "actor/pg_loss" in r] == [1, 2, 3]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000003"
    # The driver ran the local launcher on the manifest the launcher wrote (overrides applied).
    driver_manifest = (run_dir / "launch" / "manifest.toml").read_text()
    assert 'name = "local"' in driver_manifest and "steps = 3" in driver_manifest
    assert slurm.job_status(job).state == "COMPLETED"


@pytest.mark.slurm
@pytest.mark.slow
def test_signal_ahead_of_the_time_limit_checkpoints_the_step(slurm_cluster, tmp_path, tiny_model):
    """What `#SBATCH --signal=B:USR1@N` delivers ahead of the time limit, sent now with scancel:
    the batch shell hands it to the driver, which finishes its step, checkpoints and stops."""
    import time

    manifest = tiny_manifest(tmp_path, tiny_model, steps=200, nodes=1, cpus_per_task=1, time="10")
    run_dir = tmp_path / "out"
    follower = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlcore",
            "run",
            str(manifest),
            "--run-dir",
            str(run_dir),
            "--set",
            "trainer.save_every=0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and follower.poll() is None:
        if metrics.exists() and '"actor/pg_loss"' in metrics.read_text():
            break
        time.sleep(0.2)
    assert follower.poll() is None, follower.communicate()[0]
    job = next(j.job_id for j in slurm.list_jobs() if j.name == "rlcore-slurm-e2e")
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)
    out, _ = follower.communicate(timeout=300)
    assert "#SBATCH --signal=B:USR1@120" in (run_dir / "launch" / "slurm.sbatch").read_text()
    assert "[rlcore] USR1 received" in out, out
    assert "[rlcore] ranks exited with status 138" in out, out
    steps = [
        json.loads(line)["step"] for line in metrics.read_text().splitlines() if '"actor/pg_loss"' in line
    ]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{steps[-1]:06d}"
    assert follower.returncode != 0
