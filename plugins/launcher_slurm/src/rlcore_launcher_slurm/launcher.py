"""The ``slurm`` launcher: submit the run as a batch job, follow its log, return its exit code."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

from rlcore.errors import RlcoreError, UsageError
from rlcore.interfaces import LaunchRequest
from rlcore.launching import driver_command, driver_manifest_path, run_dir_problems, write_driver_manifest
from rlcore_launcher_slurm import slurm
from rlcore_launcher_slurm.follow import LogFollower
from rlcore_launcher_slurm.options import SlurmOptions
from rlcore_launcher_slurm.script import log_file, render

SCRIPT_NAME = "slurm.sbatch"
STATUS_GRACE_S = 60.0  # how long SLURM may fail to answer about a job before following stops


def _say(message: str) -> None:
    print(f"[rlcore slurm] {message}", flush=True)


class SlurmLauncher:
    def __init__(self, options: SlurmOptions):
        self.options = options

    def script_for(self, request: LaunchRequest, manifest_file: str | Path) -> str:
        python = self.options.python or sys.executable
        return render(
            self.options,
            manifest=request.resolved_manifest,
            run_dir=request.run_dir,
            driver=driver_command(request, manifest_file, python=python),
            python=python,
        )

    def launch(self, request: LaunchRequest) -> int:
        if request.dry_run:
            print(self.script_for(request, driver_manifest_path(request)), end="", flush=True)
            _say("dry run: nothing was submitted")
            return 0
        # A job on a run directory another live run holds (or, without --resume, one holding
        # checkpoints) would only fail once it starts: refuse before anything is submitted.
        problems = run_dir_problems(request.run_dir, request.resume)
        if problems:
            raise UsageError("\n  ".join(["not submitting the job:", *problems]))
        slurm.require("sbatch")
        if self.options.partition:
            slurm.check_partition(self.options.partition)
        manifest_file = write_driver_manifest(request)
        script = manifest_file.parent / SCRIPT_NAME
        script.write_text(self.script_for(request, manifest_file), encoding="utf-8")
        job_id = slurm.submit(str(script))
        log = log_file(request.run_dir, job_id)
        _say(f"submitted job {job_id}; log: {log}")
        return self.follow(job_id, log)

    def follow(self, job_id: str, log: str | Path) -> int:
        """Stream the job's log until the job ends; Ctrl-C cancels the job; SIGTERM stops only the
        following (the job is SLURM's: it keeps running, and this says so)."""
        follower = LogFollower(log)
        last_state = last_reason = ""
        previous = _on_sigterm(job_id, log)
        try:
            failing_since: float | None = None
            while True:
                try:
                    status = slurm.job_status(job_id)
                    failing_since = None
                except RlcoreError as exc:
                    # The controller may be restarting: keep trying for a while before giving up.
                    failing_since = failing_since or time.monotonic()
                    if time.monotonic() - failing_since > STATUS_GRACE_S:
                        raise RlcoreError(
                            f"lost track of job {job_id} ({exc}); it may still be running: "
                            f"see `rlcore jobs` and {log}"
                        ) from exc
                    time.sleep(self.options.poll_interval)
                    continue
                if (status.state, status.reason) != (last_state, last_reason):
                    if status.state == "PENDING":
                        why = f" (reason: {status.reason})" if status.reason not in ("", "None") else ""
                        _say(f"job {job_id} is pending{why}")
                    if status.state == "PENDING" and status.reason.split(",")[0] in slurm.HOPELESS_REASONS:
                        _say(
                            f"warning: job {job_id} may never start: SLURM says {status.reason} (the request exceeds "
                            f"a limit or names something unavailable; see `scontrol show job {job_id}`). "
                            f"Ctrl-C cancels it."
                        )
                    elif status.state == "RUNNING":
                        _say(f"job {job_id} is running on {status.nodes}")
                    last_state, last_reason = status.state, status.reason
                follower.poll()
                if status.finished:
                    break
                time.sleep(self.options.poll_interval)
        except KeyboardInterrupt:
            _say(f"interrupted: cancelling job {job_id} (scancel {job_id})")
            slurm.cancel(job_id)
            _say(f"job {job_id} cancelled")
            return 130
        except _FollowerStopped:
            return 128 + signal.SIGTERM
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        # The log may be written a moment after the state changes (a shared filesystem's delay).
        time.sleep(min(1.0, self.options.poll_interval))
        follower.poll(final=True)
        code = status.exit_status()
        if code == 0:
            _say(f"job {job_id} COMPLETED")
        else:
            _say(f"error: {status.describe()}; log: {log}")
        return code


class _FollowerStopped(Exception):
    pass


def _on_sigterm(job_id: str, log: str | Path):
    """Say what a SIGTERM to the follower means before it stops following; returns the previous
    handler (None outside the main thread, where signals cannot be caught)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, frame):
        _say(
            f"the follower got SIGTERM and stops following; job {job_id} keeps running (log: {log}). "
            f"`rlcore jobs` lists it, `rlcore jobs cancel {job_id}` stops it."
        )
        raise _FollowerStopped()

    return signal.signal(signal.SIGTERM, stop)


def build(options: SlurmOptions, context=None) -> SlurmLauncher:
    return SlurmLauncher(options)
