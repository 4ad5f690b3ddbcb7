"""Runs a validated manifest in this process: the run directory, logs, the trainer, exit codes."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import tomli_w
from loguru import logger

from rlcore.checkpoint import Checkpointer, write_atomic_text
from rlcore.errors import RlcoreError, UsageError
from rlcore.manifest.loader import ResolvedManifest
from rlcore.rundir import RunDirLock, holds_checkpoints_message
from rlcore.trainer import stopping
from rlcore.trainer.stopping import Stopped


def prepare_run_dir(manifest: ResolvedManifest, run_dir: Path, resume: bool) -> RunDirLock:
    """Create the run directory and lock it for this run (refused while another live run holds it);
    refuse to overwrite an earlier run's checkpoints unless resuming. Returns the lock, which the
    caller releases when the run ends (the kernel releases it if the process dies)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunDirLock(run_dir).acquire()
    try:
        if not resume and Checkpointer(run_dir).complete():
            raise UsageError(holds_checkpoints_message(run_dir))
        write_atomic_text(run_dir / "manifest.resolved.toml", tomli_w.dumps(manifest.resolved_dict()))
    except BaseException:
        lock.release()
        raise
    return lock


def resume_hint(run_dir: Path) -> str:
    """What ``rlcore run --resume`` would continue from, checked (so "intact" is said only when true)."""
    try:
        checkpointer = Checkpointer(run_dir)
        latest = checkpointer.latest_intact()
        complete = bool(checkpointer.complete())
    except Exception as exc:  # noqa: BLE001 - the hint must never hide the failure it follows
        return f"the checkpoints in {run_dir} could not be checked ({exc})"
    if latest is not None:
        return f"the last intact checkpoint is {latest}: rlcore run --resume continues from it"
    if complete:
        return f"no checkpoint in {run_dir} is intact (see the warnings above): rlcore run --resume cannot continue"
    return f"no checkpoint was written in {run_dir} yet: rerun to start again"


_PEER_GONE = (
    "Connection closed by peer",
    "Connection reset by peer",
    "remote worker crashing",
    "Broken pipe",
    "NCCL communicator was aborted",
    "ProcessGroupNCCL's watchdog",
    "Socket Timeout",
)


def peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective failing because another rank died (gloo or NCCL say so
    in their message), in a run of several ranks."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) < 2 or not isinstance(exc, RuntimeError):
        return False
    text = str(exc)
    return any(phrase in text for phrase in _PEER_GONE)


def _first_line(exc: BaseException) -> str:
    """The message's first line without the C++ source location gloo puts first."""
    import re

    line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    line = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", line)
    return line if len(line) <= 200 else line[:197] + "..."


def where_this_rank_runs(rank: int) -> str:
    """The first line of each rank's log: which rank, on which host (and SLURM node), as which
    process, so that logs gathered from many machines can be told apart."""
    import os
    import socket

    parts = [
        f"rank {rank} of {os.environ.get('WORLD_SIZE', '1')}",
        f"host {socket.gethostname()}",
        f"pid {os.getpid()}",
    ]
    if os.environ.get("SLURMD_NODENAME") or os.environ.get("SLURM_NODEID"):
        parts.append(
            f"SLURM node {os.environ.get('SLURMD_NODENAME', '?')} "
            f"(node id {os.environ.get('SLURM_NODEID', '?')}, job {os.environ.get('SLURM_JOB_ID', '?')})"
        )
    if os.environ.get("LOCAL_RANK"):
        parts.append(f"local rank {os.environ['LOCAL_RANK']}")
    return "this process: " + ", ".join(parts)


def run_driver(manifest: ResolvedManifest, run_dir: str | Path, resume: bool = False) -> int:
    """Train in this process. Under torchrun-style variables (WORLD_SIZE > 1) this is one rank:
    rank 0 prepares the run directory and writes logs, metrics and checkpoints."""
    import os

    # Reward workers fork; the tokenizers library's thread pool must not be running then.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run_dir = Path(run_dir)
    rank = int(os.environ.get("RANK", "0"))
    lock = prepare_run_dir(manifest, run_dir, resume) if rank == 0 else None
    log_file = run_dir / ("run.log" if rank == 0 else f"run.rank{rank}.log")
    run_dir.mkdir(parents=True, exist_ok=True)
    sink_id = logger.add(log_file, level="DEBUG", enqueue=False)
    logger.bind(file_only=True).info("{}", where_this_rank_runs(rank))
    try:
        logger.info("run directory {}; starting (importing torch and the trainer)", run_dir)
        from rlcore.trainer.rl import RLTrainer

        trainer = RLTrainer(manifest, run_dir, resume=resume)
        trainer.setup()
        trainer.fit()
        logger.info("run finished: {} steps; outputs in {}", trainer.step, run_dir)
        return 0
    except RlcoreError as exc:
        # The console shows it once (rlcore.cli prints it); the log must keep it too.
        logger.bind(file_only=True).error("the run failed: {}", exc)
        raise
    except Stopped as stop:
        if stop.checkpoint is not None:
            logger.warning(
                "stopped by {} after step {}; checkpoint written: {} (rlcore run --resume continues)",
                stop.name,
                trainer.step,
                stop.checkpoint,
            )
        else:
            logger.warning(
                "stopped at once by a second {}; rlcore run --resume continues from the last checkpoint in {}",
                stop.name,
                run_dir,
            )
        return 128 + stop.signum
    except KeyboardInterrupt:
        logger.warning("interrupted; {}", resume_hint(run_dir))
        return 130
    except Exception as exc:
        if peer_failure(exc):  # another rank died: its own log has the cause; this one only waited
            logger.bind(file_only=True).error("the run failed:\n{}", traceback.format_exc())
            said = f"rank {rank}: another rank of this run died, so a collective failed ({_first_line(exc)})"
            if stopping.requested():
                said += f"; the {stopping.requested()} received was not followed by a checkpoint"
            logger.error("{}; see the failed rank's run.rankN.log (or run.log for rank 0) for why", said)
            hint = resume_hint(run_dir)
            print(f"the run failed; see {log_file}. {hint[0].upper()}{hint[1:]}.", file=sys.stderr)
            return 1
        logger.error("the run failed:\n{}", traceback.format_exc())
        hint = resume_hint(run_dir)
        print(f"the run failed; see {log_file}. {hint[0].upper()}{hint[1:]}.", file=sys.stderr)
        return 1
    finally:
        logger.remove(sink_id)
        if lock is not None:
            lock.release()
