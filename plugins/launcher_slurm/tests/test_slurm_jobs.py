"""The launcher against a real SLURM cluster (.ci/slurm/setup.sh): submission, log streaming, final
states and exit codes, cancellation (rlcore jobs cancel, Ctrl-C), time limits, and clear errors."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from rlcore_launcher_slurm import slurm

from rlcore.errors import RlcoreError, UsageError
from rlcore.testing import runs

pytestmark = pytest.mark.slurm


def wait_for(predicate, timeout: float, what: str):
    return runs.wait_for(predicate, timeout, what, interval=0.3)


def rlcore_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlcore", *args], capture_output=True, text=True, timeout=60)


def job_id_in(text: str) -> str:
    return re.search(r"submitted job (\d+)", text).group(1)


def test_failing_driver_reports_its_exit_code(
    slurm_cluster, slurm_launcher, launch_request, capsys, tmp_path
):
    """The job runs the real `python -m rlcore run` on a manifest the driver rejects (exit 2)."""
    code = slurm_launcher(nodes=1).launch(launch_request(manifest={"run": {"name": "broken"}}))
    out = capsys.readouterr().out
    assert code == 2
    job = job_id_in(out)
    # The job's log was streamed: the job header, the driver's own error, its exit status.
    assert f"[rlcore] job {job} on rlcore" in out
    assert "problems in the manifest" in out and "[model] required table is missing" in out
    assert "[rlcore] ranks exited with status 2" in out
    assert f"job {job} FAILED with exit code 2" in out
    log = tmp_path / "run" / "launch" / f"slurm-{job}.log"
    assert "[rlcore] ranks exited with status 2" in log.read_text()
    # What was submitted is kept beside the driver's manifest.
    assert (tmp_path / "run" / "launch" / "slurm.sbatch").read_text().startswith("#!/bin/bash")
    assert 'name = "broken"' in (tmp_path / "run" / "launch" / "manifest.toml").read_text()
    assert slurm.job_status(job).state == "FAILED"


def test_jobs_command_lists_and_cancels(slurm_cluster, slurm_launcher, launch_request, slow_python, capsys):
    launcher = slurm_launcher(python=str(slow_python), job_name="to-cancel")
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(code=launcher.launch(launch_request())))
    thread.start()
    try:
        job = wait_for(
            lambda: next(
                (
                    j.job_id
                    for j in slurm.list_jobs()
                    if j.name == "rlcore-to-cancel" and j.state == "RUNNING"
                ),
                None,
            ),
            60,
            "the job to run",
        )
        # The CLI runs as its own process: this one's stdout belongs to the launcher following the job.
        listed = json.loads(rlcore_cli("jobs", "--json").stdout)
        row = next(r for r in listed if r["job_id"] == job)
        assert row["name"] == "rlcore-to-cancel" and row["state"] == "RUNNING"

        cancelled = rlcore_cli("jobs", "cancel", job)
        assert cancelled.returncode == 0, cancelled.stderr
        assert f"cancelled job {job} (rlcore-to-cancel)" in cancelled.stdout
        thread.join(60)
        assert not thread.is_alive()
    finally:
        if thread.is_alive():
            subprocess.run(["scancel", job], check=False)
            thread.join(30)
    out = capsys.readouterr().out
    assert result["code"] == 1
    assert f"job {job} CANCELLED: the job was cancelled" in out
    assert "slow interpreter: waiting before the driver" in out  # the log was streamed while it ran
    # A finished job can't be cancelled again, and a job that isn't rlcore's is refused.
    again = rlcore_cli("jobs", "cancel", job)
    assert again.returncode == 2 and "has already ended: CANCELLED" in again.stdout + again.stderr
    unknown = rlcore_cli("jobs", "cancel", "999999")
    assert unknown.returncode == 2 and "is not one of rlcore's jobs" in unknown.stdout + unknown.stderr
    listed = json.loads(rlcore_cli("jobs", "--json", "--all").stdout)
    assert any(r["job_id"] == job and r["state"] == "CANCELLED" for r in listed)


def _follow_in_subprocess(tmp_path, slow_python, job_name: str):
    """`launch()` following a slow job in a process of its own: (process, its output lines, the
    thread reading them), once the job's log streams."""
    script = tmp_path / "follow.py"
    script.write_text(
        textwrap.dedent(f"""
        from rlcore.interfaces import LaunchRequest
        from rlcore_launcher_slurm.launcher import build
        from rlcore_launcher_slurm.options import SlurmOptions
        launcher = build(SlurmOptions(python={str(slow_python)!r}, poll_interval=0.5, job_name={job_name!r}))
        request = LaunchRequest(manifest_path="m.toml", resolved_manifest={{"run": {{"name": "x"}}}}, run_dir={str(tmp_path / "run")!r})
        raise SystemExit(launcher.launch(request))
    """)
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("slow interpreter" in line for line in lines), 60, "the job's log to stream")
    except BaseException:
        proc.kill()
        raise
    return proc, lines, reader


def test_ctrl_c_cancels_the_job(slurm_cluster, tmp_path, slow_python):
    """Ctrl-C while `rlcore run` follows the job cancels it (a real SIGINT to a real process)."""
    proc, lines, reader = _follow_in_subprocess(tmp_path, slow_python, "ctrl-c")
    try:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(5)
    out = "".join(lines)
    job = job_id_in(out)
    assert f"interrupted: cancelling job {job} (scancel {job})" in out
    assert wait_for(lambda: slurm.job_status(job).state == "CANCELLED", 30, "the job to be cancelled")


def test_sigterm_stops_following_and_says_the_job_keeps_running(slurm_cluster, tmp_path, slow_python):
    """SIGTERM to `rlcore run` while it follows a job stops only the following, and says so."""
    proc, lines, reader = _follow_in_subprocess(tmp_path, slow_python, "sigterm")
    job = None
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 128 + signal.SIGTERM
        reader.join(5)
        out = "".join(lines)
        job = job_id_in(out)
        assert f"job {job} keeps running" in out and f"rlcore jobs cancel {job}" in out
        assert slurm.job_status(job).state == "RUNNING"
    finally:
        if proc.poll() is None:
            proc.kill()
        if job is not None:
            slurm.cancel(job)


@pytest.mark.slow
def test_time_limit_is_reported_as_timeout(
    slurm_cluster, slurm_launcher, launch_request, slow_python, capsys
):
    """SLURM counts time limits in whole minutes and checks them periodically: this takes 1-2 minutes."""
    started = time.monotonic()
    code = slurm_launcher(python=str(slow_python), time="1", poll_interval=1).launch(launch_request())
    out = capsys.readouterr().out
    assert code == 1
    job = job_id_in(out)
    assert f"job {job} TIMEOUT: the job reached its time limit ([launcher] time)" in out
    assert 55 < time.monotonic() - started < 200


def test_missing_sbatch_says_what_to_do(slurm_launcher, launch_request, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    with pytest.raises(RlcoreError) as info:
        slurm_launcher().launch(launch_request())
    message = str(info.value)
    assert "'sbatch' was not found on PATH" in message
    assert "Install SLURM" in message and 'name = "local"' in message
    assert not (tmp_path / "run").exists()  # nothing was written before the check


def test_unknown_partition_lists_the_existing_ones(slurm_cluster, slurm_launcher, launch_request, tmp_path):
    with pytest.raises(UsageError) as info:
        slurm_launcher(partition="gpu-nope").launch(launch_request())
    assert "partition 'gpu-nope' does not exist on this cluster; partitions: debug" in str(info.value)
    assert not (tmp_path / "run").exists()


def test_rejected_submission_shows_sbatch_stderr(slurm_cluster, slurm_launcher, launch_request, capsys):
    """More nodes than the cluster has: sbatch refuses (EnforcePartLimits), and its own message reaches the user."""
    errors: list[BaseException] = []

    def submit():
        try:
            slurm_launcher(nodes=slurm_cluster + 5, partition="debug").launch(launch_request())
        except BaseException as exc:  # noqa: BLE001 - examined below
            errors.append(exc)

    thread = threading.Thread(target=submit, daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():  # accepted after all: don't leave it queued
        subprocess.run(["scancel", job_id_in(capsys.readouterr().out)], check=False)
        pytest.fail("sbatch accepted a job that asks for more nodes than the cluster has")
    assert len(errors) == 1 and isinstance(errors[0], RlcoreError), errors
    message = str(errors[0])
    assert message.startswith("sbatch rejected the job (exit 1): sbatch: error: Batch job submission failed:")
    assert "slurm.sbatch" in message


def test_scontrol_parsing_and_exit_codes():
    line = (
        "JobId=7 JobName=rlcore-x UserId=root(0) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) "
        "ExitCode=3:0 NodeList=rlcore[1-2] Command=/tmp/a b/slurm.sbatch WorkDir=/tmp/a b"
    )
    fields = slurm.parse_scontrol(line)
    assert (
        fields["JobState"] == "FAILED" and fields["ExitCode"] == "3:0" and fields["NodeList"] == "rlcore[1-2]"
    )
    assert fields["WorkDir"] == "/tmp/a b"
    assert slurm.JobStatus("7", "COMPLETED").exit_status() == 0
    assert slurm.JobStatus("7", "FAILED", exit_code=3).exit_status() == 3
    assert slurm.JobStatus("7", "FAILED", exit_code=0, signal=9).exit_status() == 1
    for state in ("CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"):
        status = slurm.JobStatus("7", state)
        assert status.finished and status.exit_status() == 1
        assert status.describe().startswith(f"job 7 {state}: ")
    assert not slurm.JobStatus("7", "RUNNING").finished


def test_an_interface_without_an_address_fails_the_job_naming_it(
    slurm_cluster, slurm_launcher, launch_request, capsys
):
    """The rendezvous needs the first node's address on [launcher] network_interface: a wrong name
    fails the job before any rank starts, saying which interface of which node."""
    code = slurm_launcher(network_interface="nosuch0").launch(launch_request())
    out = capsys.readouterr().out
    job = job_id_in(out)
    assert code == 1, out
    assert "[rlcore] error: no IPv4 address on interface 'nosuch0' ([launcher] network_interface) of" in out
    assert "rank(s)" not in out  # no rank was started
    assert f"job {job} FAILED with exit code 1" in out
