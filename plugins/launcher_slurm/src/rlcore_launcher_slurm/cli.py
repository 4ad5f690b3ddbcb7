"""``rlcore jobs``: list rlcore's SLURM jobs; ``rlcore jobs cancel JOBID`` cancels one.

rlcore's jobs are recognised by their name prefix (``rlcore-``) and their comment (``rlcore``).
"""

from __future__ import annotations

import argparse
import json

from rlcore.errors import UsageError
from rlcore_launcher_slurm import slurm
from rlcore_launcher_slurm.script import COMMENT, JOB_PREFIX


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--all", action="store_true", help="include finished jobs the controller still remembers"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--user", help="only this user's jobs (default: every user's)")
    sub = parser.add_subparsers(dest="jobs_action", metavar="ACTION")
    cancel = sub.add_parser("cancel", help="cancel one of rlcore's jobs")
    cancel.add_argument("job_id", metavar="JOBID")


def is_rlcore_job(row: slurm.JobRow) -> bool:
    return row.name.startswith(JOB_PREFIX) or row.comment == COMMENT


def rlcore_jobs(all_states: bool = False, user: str | None = None) -> list[slurm.JobRow]:
    return [row for row in slurm.list_jobs(all_states=all_states, user=user) if is_rlcore_job(row)]


def cancel(job_id: str) -> int:
    if not job_id.isdigit():
        raise UsageError(f"expected a numeric SLURM job id, got {job_id!r}")
    known = {row.job_id: row for row in rlcore_jobs(all_states=True)}
    row = known.get(job_id)
    if row is None:
        listed = ", ".join(sorted(known)) or "(none)"
        raise UsageError(f"job {job_id} is not one of rlcore's jobs known to SLURM; rlcore's jobs: {listed}")
    if row.state not in ("PENDING", "RUNNING", "SUSPENDED", "CONFIGURING", "REQUEUED", "RESIZING"):
        raise UsageError(f"job {job_id} ({row.name}) has already ended: {row.state}")
    slurm.cancel(job_id)
    print(f"cancelled job {job_id} ({row.name})")
    return 0


def run(args: argparse.Namespace) -> int:
    if getattr(args, "jobs_action", None) == "cancel":
        return cancel(args.job_id)
    rows = rlcore_jobs(all_states=args.all, user=args.user)
    if args.json:
        print(json.dumps([row.__dict__ for row in rows], indent=2))
        return 0
    if not rows:
        print("no rlcore jobs" + ("" if args.all else " pending or running (--all includes finished ones)"))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="rlcore SLURM jobs")
    for column in ("job", "name", "state", "elapsed", "nodes", "nodelist (reason)", "run directory"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(row.job_id, row.name, row.state, row.elapsed, row.nodes, row.where, row.workdir)
    Console(soft_wrap=True).print(table)
    return 0
