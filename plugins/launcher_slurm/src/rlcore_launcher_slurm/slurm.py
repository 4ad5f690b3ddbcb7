"""Thin wrappers around SLURM's commands (sbatch, scontrol, sacct, squeue, scancel, sinfo).

Each turns a command's failure into an :class:`RlcoreError` that shows SLURM's own message.
Job state comes from ``scontrol show job`` while the controller still knows the job (MinJobAge),
then from ``sacct`` when accounting is configured.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from rlcore.errors import RlcoreError, UsageError

# Final states and what they mean for the exit code (FAILED uses the job's own exit code).
FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "REVOKED",
    "SPECIAL_EXIT",
}
EXPLAIN = {
    "CANCELLED": "the job was cancelled (scancel, or an administrator)",
    "TIMEOUT": "the job reached its time limit ([launcher] time)",
    "NODE_FAIL": "a node of the job failed",
    "OUT_OF_MEMORY": "the job ran out of memory ([launcher] mem)",
    "PREEMPTED": "the job was preempted by a higher-priority job",
    "BOOT_FAIL": "a node of the job failed to boot",
    "DEADLINE": "the job reached its deadline",
    "REVOKED": "the job was revoked",
}

# Pending reasons that do not resolve by waiting (the request exceeds a limit or names something wrong).
HOPELESS_REASONS = {
    "PartitionConfig",
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "PartitionDown",
    "PartitionInactive",
    "BadConstraints",
    "InvalidAccount",
    "InvalidQOS",
    "ReqNodeNotAvail",
    "AssocMaxJobsLimit",
    "AssocMaxNodesPerJobLimit",
    "AssocMaxWallDurationPerJobLimit",
    "QOSMaxNodePerJobLimit",
    "QOSMaxWallDurationPerJobLimit",
}


class SlurmMissing(UsageError):
    pass


def require(command: str = "sbatch") -> str:
    """The path of a SLURM command, or a clear error when SLURM is not installed here."""
    path = shutil.which(command)
    if path is None:
        raise SlurmMissing(
            f"{command!r} was not found on PATH: the slurm launcher needs SLURM's client commands. "
            'Install SLURM (or load its module), or use another launcher, e.g. [launcher] name = "local"'
        )
    return path


def _run(argv: list[str], *, timeout: float = 60) -> subprocess.CompletedProcess:
    require(argv[0])
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RlcoreError(
            f"{' '.join(argv)} did not answer within {timeout:.0f} s; is slurmctld reachable?"
        ) from exc


def partitions() -> list[str]:
    """The cluster's partition names."""
    proc = _run(["sinfo", "--noheader", "--format=%R"])
    if proc.returncode != 0:
        raise RlcoreError(
            f"sinfo failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}"
        )
    return sorted({line.strip() for line in proc.stdout.splitlines() if line.strip()})


def check_partition(name: str) -> None:
    existing = partitions()
    if name not in existing:
        raise UsageError(
            f"[launcher] partition {name!r} does not exist on this cluster; partitions: {', '.join(existing) or '(none)'}"
        )


def submit(script: str) -> str:
    """Submit a script file with ``sbatch --parsable``; returns the job id."""
    proc = _run(["sbatch", "--parsable", script])
    if proc.returncode != 0:
        message = proc.stderr.strip() or proc.stdout.strip() or "(no message)"
        raise RlcoreError(f"sbatch rejected the job (exit {proc.returncode}): {message}\n(script: {script})")
    job_id = proc.stdout.strip().splitlines()[-1].split(";")[0].strip() if proc.stdout.strip() else ""
    if not job_id.isdigit():
        raise RlcoreError(f"sbatch printed no job id: {proc.stdout.strip()!r} {proc.stderr.strip()!r}")
    return job_id


def cancel(job_id: str) -> None:
    proc = _run(["scancel", job_id])
    if proc.returncode != 0:
        raise RlcoreError(f"scancel {job_id} failed (exit {proc.returncode}): {proc.stderr.strip()}")


@dataclass(frozen=True)
class JobStatus:
    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, ... ("CANCELLED by 0" is reduced to CANCELLED)
    exit_code: int = 0
    signal: int = 0
    reason: str = ""
    name: str = ""
    nodes: str = ""

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES

    def exit_status(self) -> int:
        """The exit code ``rlcore run`` returns for this final state."""
        if self.state == "COMPLETED":
            return 0
        if self.state == "FAILED":
            return self.exit_code or 1
        return 1

    def describe(self) -> str:
        text = f"job {self.job_id} {self.state}"
        if self.state == "FAILED":
            text += f" with exit code {self.exit_code}" + (f" (signal {self.signal})" if self.signal else "")
        elif self.state in EXPLAIN:
            text += f": {EXPLAIN[self.state]}"
        if self.reason and self.reason not in ("None", "NonZeroExitCode"):
            text += f" [reason: {self.reason}]"
        return text


def _exit_pair(value: str) -> tuple[int, int]:
    code, _, sig = value.partition(":")
    try:
        return int(code or 0), int(sig or 0)
    except ValueError:
        return 0, 0


def parse_scontrol(text: str) -> dict[str, str]:
    """``scontrol show job -o`` prints one line of KEY=VALUE pairs (values may hold spaces only in a
    few free-text fields, which come last or are not used here)."""
    fields: dict[str, str] = {}
    key = None
    for token in text.strip().split(" "):
        if "=" in token and token.split("=", 1)[0].replace("/", "").replace(":", "").isalnum():
            key, value = token.split("=", 1)
            fields[key] = value
        elif key is not None and token:
            fields[key] += " " + token
    return fields


def _from_scontrol(job_id: str) -> JobStatus | None:
    proc = _run(["scontrol", "show", "job", "-o", job_id])
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return None
        raise RlcoreError(f"scontrol show job {job_id} failed: {proc.stderr.strip()}")
    fields = parse_scontrol(proc.stdout.splitlines()[0] if proc.stdout.strip() else "")
    if "JobState" not in fields:
        return None
    code, sig = _exit_pair(fields.get("ExitCode", "0:0"))
    return JobStatus(
        job_id=job_id,
        state=fields["JobState"],
        exit_code=code,
        signal=sig,
        reason=fields.get("Reason", ""),
        name=fields.get("JobName", ""),
        nodes=fields.get("NodeList", ""),
    )


def _from_sacct(job_id: str) -> JobStatus | None:
    if shutil.which("sacct") is None:
        return None
    proc = _run(
        ["sacct", "-j", job_id, "-X", "--noheader", "--parsable2", "--format=State,ExitCode,JobName,NodeList"]
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        return None  # accounting disabled, or the job is unknown to it
    state, exit_code, name, nodes = (proc.stdout.strip().splitlines()[0].split("|") + ["", "", "", ""])[:4]
    code, sig = _exit_pair(exit_code)
    return JobStatus(
        job_id=job_id, state=state.split()[0], exit_code=code, signal=sig, name=name, nodes=nodes
    )


def job_status(job_id: str) -> JobStatus:
    """The job's state now: scontrol while the controller knows the job, then sacct."""
    status = _from_scontrol(job_id) or _from_sacct(job_id)
    if status is None:
        raise RlcoreError(
            f"SLURM no longer knows job {job_id} (scontrol forgot it after MinJobAge and sacct has no record); "
            "its final state is unknown"
        )
    return status


@dataclass(frozen=True)
class JobRow:
    job_id: str
    name: str
    state: str
    elapsed: str
    nodes: str
    where: str  # node list, or the reason it is pending
    workdir: str
    comment: str


_SQUEUE_FIELDS = ["%i", "%j", "%T", "%M", "%D", "%R", "%Z", "%k"]


def list_jobs(all_states: bool = False, user: str | None = None) -> list[JobRow]:
    """Jobs the controller knows, from squeue (``all_states`` includes finished ones it still remembers)."""
    argv = ["squeue", "--noheader", "--format=" + "\x1f".join(_SQUEUE_FIELDS)]
    if all_states:
        argv.append("--states=all")
    if user:
        argv.append(f"--user={user}")
    proc = _run(argv)
    if proc.returncode != 0:
        raise RlcoreError(f"squeue failed (exit {proc.returncode}): {proc.stderr.strip()}")
    rows = []
    for line in proc.stdout.splitlines():
        parts = line.split("\x1f")
        if len(parts) == len(_SQUEUE_FIELDS):
            rows.append(JobRow(*(p.strip() for p in parts)))
    return rows
