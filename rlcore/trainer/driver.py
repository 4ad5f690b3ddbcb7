"""Runs a validated manifest in this process: the run directory, logs, the trainer, exit codes."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import tomli_w
from loguru import logger

from rlcore.errors import RlcoreError, UsageError
from rlcore.manifest.loader import ResolvedManifest
from rlcore.trainer.checkpoint import Checkpointer, write_atomic_text
from rlcore.trainer.stopping import Stopped


def prepare_run_dir(manifest: ResolvedManifest, run_dir: Path, resume: bool) -> None:
    """Create the run directory; refuse to overwrite an earlier run's checkpoints unless resuming."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume and Checkpointer(run_dir).latest() is not None:
        raise UsageError(
            f"the run directory {run_dir} already holds checkpoints; pass --resume to continue that run, "
            "or change [run] name (or --run-dir) to start a new one"
        )
    write_atomic_text(run_dir / "manifest.resolved.toml", tomli_w.dumps(manifest.resolved_dict()))


def run_driver(manifest: ResolvedManifest, run_dir: str | Path, resume: bool = False) -> int:
    """Train in this process. Under torchrun-style variables (WORLD_SIZE > 1) this is one rank:
    rank 0 prepares the run directory and writes logs, metrics and checkpoints."""
    import os

    # Reward workers fork; the tokenizers library's thread pool must not be running then.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run_dir = Path(run_dir)
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        prepare_run_dir(manifest, run_dir, resume)
    log_file = run_dir / ("run.log" if rank == 0 else f"run.rank{rank}.log")
    run_dir.mkdir(parents=True, exist_ok=True)
    sink_id = logger.add(log_file, level="DEBUG", enqueue=False)
    try:
        from rlcore.trainer.rl import RLTrainer

        trainer = RLTrainer(manifest, run_dir, resume=resume)
        trainer.setup()
        trainer.fit()
        logger.info("run finished: {} steps; outputs in {}", trainer.step, run_dir)
        return 0
    except RlcoreError:
        raise
    except Stopped as stop:
        if stop.checkpoint is not None:
            logger.warning("stopped by {} after step {}; checkpoint written: {} (rlcore run --resume continues)",
                           stop.name, trainer.step, stop.checkpoint)
        else:
            logger.warning("stopped at once by a second {}; rlcore run --resume continues from the last checkpoint in {}",
                           stop.name, run_dir)
        return 128 + stop.signum
    except KeyboardInterrupt:
        logger.warning("interrupted; the last checkpoint in {} is intact (rlcore run --resume continues)", run_dir)
        return 130
    except Exception:
        logger.error("the run failed:\n{}", traceback.format_exc())
        print(f"the run failed; see {run_dir / 'run.log'}. The last checkpoint is intact: rlcore run --resume continues.", file=sys.stderr)
        return 1
    finally:
        logger.remove(sink_id)
