"""The launcher submits no job on a run directory that another live run holds (its lock), nor,
without --resume, on one that already holds checkpoints; `rlcore run --dry-run` reports both."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w
from rlcore_launcher_slurm import slurm

from rlcore.errors import UsageError
from rlcore.testing import require_plugins
from rlcore.testing.runs import TINY_RUN, TINY_RUN_PLUGINS, deep_update

HOLDER = """
import os, sys, time
from rlcore.launching import RunDirLock
RunDirLock(sys.argv[1]).acquire()
print(os.getpid(), flush=True)
time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path):
    """``holder(run_dir)`` -> a live process (Popen) holding ``run_dir``'s lock; killed at the end."""
    procs: list[subprocess.Popen] = []

    def start(run_dir: Path) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True
        )
        procs.append(proc)
        assert int(proc.stdout.readline()) == proc.pid
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _complete_checkpoint(run_dir: Path) -> None:
    step = run_dir / "checkpoints" / "step_000001"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text(json.dumps({"step": 1}))


def _refuse_submitting(monkeypatch):
    def submit(*args, **kwargs):
        raise AssertionError("a job was submitted")

    monkeypatch.setattr(slurm, "submit", submit)


def test_a_run_directory_held_by_a_live_run_is_not_submitted(
    slurm_launcher, launch_request, holder, tmp_path, monkeypatch
):
    _refuse_submitting(monkeypatch)
    run_dir = tmp_path / "run"
    proc = holder(run_dir)
    with pytest.raises(UsageError) as info:
        slurm_launcher().launch(launch_request(run_dir=run_dir))
    message = str(info.value)
    assert message.startswith("not submitting the job:")
    assert f"the run directory {run_dir} is in use by another run: pid {proc.pid} on host" in message
    assert not (run_dir / "launch").exists()  # nothing written for a job


def test_checkpoints_without_resume_are_not_submitted(slurm_launcher, launch_request, tmp_path, monkeypatch):
    _refuse_submitting(monkeypatch)
    run_dir = tmp_path / "run"
    _complete_checkpoint(run_dir)
    with pytest.raises(UsageError, match="already holds checkpoints; pass --resume"):
        slurm_launcher().launch(launch_request(run_dir=run_dir))
    # With --resume the checks pass and the launcher goes on to submit (here: refused by the stub).
    request = launch_request(run_dir=run_dir)
    request.resume = True
    with pytest.raises(AssertionError, match="a job was submitted"):
        slurm_launcher().launch(request)


def test_cli_dry_run_reports_both_refusals(tmp_path, holder):
    require_plugins(*TINY_RUN_PLUGINS)  # the manifest must validate: TINY_RUN names their components
    (tmp_path / "model").mkdir()  # validation only checks that it exists; a dry run loads nothing
    doc = deep_update(TINY_RUN, {"model": {"path": str(tmp_path / "model")}, "launcher": {"name": "slurm"}})
    manifest = tmp_path / "manifest.toml"
    manifest.write_text(tomli_w.dumps(doc), encoding="utf-8")
    run_dir = tmp_path / "out"
    _complete_checkpoint(run_dir)
    proc = holder(run_dir)
    dry = subprocess.run(
        [sys.executable, "-m", "rlcore", "run", str(manifest), "--run-dir", str(run_dir), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = " ".join(dry.stdout.split())
    assert dry.returncode == 2, dry.stdout + dry.stderr
    assert "#SBATCH" in dry.stdout and "dry run: nothing was submitted" in said
    assert "error: the run would be refused:" in said
    assert f"is in use by another run: pid {proc.pid}" in said and "already holds checkpoints" in said


@pytest.mark.slurm
def test_submission_waits_for_nothing_once_the_holder_is_killed(
    slurm_cluster, slurm_launcher, launch_request, holder, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    proc = holder(run_dir)
    before = {j.job_id for j in slurm.list_jobs()}
    with pytest.raises(UsageError, match="in use by another run"):
        slurm_launcher(nodes=1).launch(launch_request(manifest={"run": {"name": "broken"}}, run_dir=run_dir))
    assert {j.job_id for j in slurm.list_jobs()} <= before  # nothing was submitted
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # The lock file stays behind; the kernel released the lock. The job is submitted and its
    # driver runs (and rejects the deliberately broken manifest, exit 2).
    assert (run_dir / ".lock").exists()
    code = slurm_launcher(nodes=1).launch(
        launch_request(manifest={"run": {"name": "broken"}}, run_dir=run_dir)
    )
    out = capsys.readouterr().out
    assert code == 2 and "submitted job" in out and "[rlcore] ranks exited with status 2" in out
