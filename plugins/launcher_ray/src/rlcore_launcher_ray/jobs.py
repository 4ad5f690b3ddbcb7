"""Job mode: submit the run to a Ray cluster through the Jobs API, stream its logs, and return
its outcome as the exit code. The job's driver runs ``rlcore run`` on the cluster with the ray
launcher again, so it starts the same ranks there (Ray sets RAY_ADDRESS for a job)."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import shlex
import sys
import time
import uuid

from rlcore.errors import RlcoreError
from rlcore.interfaces import LaunchRequest
from rlcore.launching import driver_command, driver_manifest_path, write_driver_manifest
from rlcore_launcher_ray.connect import check_reachable, import_ray, resolve_address
from rlcore_launcher_ray.options import RayOptions

JOB_DIR = "job"  # <run_dir>/launch/job: the job's working directory, uploaded to the cluster
STOP_WAIT_S = 30.0


def _say(message: str) -> None:
    print(f"[rlcore ray] {message}", flush=True)


def job_request(options: RayOptions, request: LaunchRequest) -> LaunchRequest:
    """The request whose manifest the job runs: the ray launcher with these ranks, no job."""
    doc = dict(request.resolved_manifest)
    doc["launcher"] = options.driver_options()
    return dataclasses.replace(request, resolved_manifest=doc)


def job_entrypoint(options: RayOptions, request: LaunchRequest) -> str:
    # The job starts in its uploaded working directory, which holds manifest.toml.
    return shlex.join(driver_command(request, "manifest.toml", python=options.python))


def submission_id(request: LaunchRequest) -> str:
    name = str(request.resolved_manifest.get("run", {}).get("name", "run"))
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")[:40] or "run"
    return f"rlcore-{name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def exit_code(status: str, driver_exit_code: int | None) -> int:
    """SUCCEEDED 0; FAILED the driver's exit code when Ray knows it, else 1; STOPPED 130."""
    if status == "SUCCEEDED":
        return 0
    if status == "STOPPED":
        return 130
    if isinstance(driver_exit_code, int) and driver_exit_code > 0:
        return driver_exit_code
    return 1


def submit_and_follow(options: RayOptions, request: LaunchRequest) -> int:
    address = resolve_address(options.address)
    if not address:
        raise RlcoreError(
            'job = true needs the cluster\'s Jobs API address: set [launcher] address = "http://HEAD:8265" '
            "or RAY_ADDRESS (or drop job = true to start the ranks from this process)"
        )
    if not address.startswith(("http://", "https://")):
        raise RlcoreError(
            f'job = true submits through the Jobs API: expected an address like "http://HEAD:8265", got {address!r}'
        )
    inner = job_request(options, request)
    job_dir = driver_manifest_path(request).parent / JOB_DIR
    entrypoint = job_entrypoint(options, inner)
    if request.dry_run:
        _say(f"would submit a Ray job to {address}: {entrypoint} (working directory {job_dir})")
        return 0
    import_ray(jobs=True)
    from ray.job_submission import JobSubmissionClient

    check_reachable(address, options.connect_timeout, what="Ray Jobs API")
    write_driver_manifest(inner, job_dir)
    try:
        client = JobSubmissionClient(address)
    except (ConnectionError, RuntimeError) as exc:
        raise RlcoreError(f"cannot use the Ray Jobs API at {address}: {exc}") from None
    runtime_env = options.runtime_env.as_ray()
    runtime_env["working_dir"] = str(job_dir)
    runtime_env.setdefault("env_vars", {})["PYTHONUNBUFFERED"] = "1"
    job_id = client.submit_job(
        entrypoint=entrypoint,
        runtime_env=runtime_env,
        submission_id=submission_id(request),
        metadata={"rlcore_run_dir": str(request.run_dir)},
    )
    _say(f"submitted Ray job {job_id} to {address}: {entrypoint}")
    return follow(client, job_id)


def follow(client, job_id: str) -> int:
    """Stream the job's logs until it ends; Ctrl-C stops the job."""
    try:
        asyncio.run(_tail(client, job_id))
        status, info = _wait_terminal(client, job_id, timeout=60.0)
    except KeyboardInterrupt:
        _say(f"interrupted: stopping Ray job {job_id}")
        client.stop_job(job_id)
        status, _ = _wait_terminal(client, job_id, timeout=STOP_WAIT_S)
        _say(f"Ray job {job_id} is {status}")
        return 130
    code = exit_code(status, getattr(info, "driver_exit_code", None))
    if code == 0:
        _say(f"Ray job {job_id} SUCCEEDED")
    else:
        # Ray's message repeats the last log lines (already shown above): keep its first line.
        message = ((getattr(info, "message", "") or "").strip().splitlines() or [""])[0]
        _say(f"Ray job {job_id} {status}" + (f": {message}" if message else "") + f" (exit code {code})")
    return code


async def _tail(client, job_id: str) -> None:
    async for chunk in client.tail_job_logs(job_id):
        sys.stdout.write(chunk)
        sys.stdout.flush()


def _wait_terminal(client, job_id: str, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        info = client.get_job_info(job_id)
        status = str(getattr(info.status, "value", info.status))
        if status in ("SUCCEEDED", "FAILED", "STOPPED") or time.monotonic() > deadline:
            return status, info
        time.sleep(0.5)
