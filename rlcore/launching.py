"""What every launcher shares: the manifest a remote driver runs, the command that runs it, the
driver itself (for a launcher that starts ranks in its own workers), the run's checkpoints, and
whether a run on a run directory would be refused (:func:`run_dir_problems`: another live run holds
it, or it holds checkpoints without ``--resume``). A launcher plugin needs nothing else of rlcore's
internals (docs/architecture.md, "The plugin API").

A launcher that starts the driver elsewhere (a Ray job, a SLURM allocation) writes the manifest
with every override applied and paths made absolute, switched to the ``local`` launcher so the
driver does not launch again, and runs ``python -m rlcore run <that file>`` there.
"""

from __future__ import annotations

import sys
from pathlib import Path

import tomli_w

from rlcore.interfaces import LaunchRequest
from rlcore.rundir import RunDirLock, lock_holder, run_dir_problems

__all__ = [
    "RunDirLock",
    "driver_command",
    "driver_manifest_path",
    "latest_checkpoint",
    "lock_holder",
    "run_dir_problems",
    "run_driver_here",
    "run_driver_manifest",
    "write_driver_manifest",
]


def driver_manifest_path(request: LaunchRequest, directory: str | Path | None = None) -> Path:
    """Where :func:`write_driver_manifest` writes (so a dry run can name the file without writing it)."""
    return Path(directory or Path(request.run_dir) / "launch") / "manifest.toml"


def write_driver_manifest(request: LaunchRequest, directory: str | Path | None = None) -> Path:
    """Write the driver's manifest into ``directory`` (default: ``<run_dir>/launch``), atomically."""
    target = driver_manifest_path(request, directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".toml.tmp")
    tmp.write_text(tomli_w.dumps(request.resolved_manifest), encoding="utf-8")
    tmp.replace(target)
    return target


def driver_command(request: LaunchRequest, manifest_file: str | Path, python: str | None = None) -> list[str]:
    """The argv that runs the driver for ``request`` on the machine that reads ``manifest_file``."""
    argv = [python or sys.executable, "-m", "rlcore", "run", str(manifest_file)]
    if request.run_dir:
        # The same run directory as here, even when `rlcore run --run-dir` chose it.
        argv += ["--run-dir", str(request.run_dir)]
    if request.resume:
        argv.append("--resume")
    return argv


def run_driver_manifest(manifest_file: str | Path, run_dir: str | Path, resume: bool = False) -> int:
    """Run the driver (one rank of it, under torchrun-style variables) on a driver manifest, in
    this process; return its exit code. Imports the trainer's stack."""
    from rlcore.manifest.loader import load_manifest
    from rlcore.trainer.driver import run_driver

    return run_driver(load_manifest(manifest_file), run_dir, resume=resume)


def run_driver_here(request: LaunchRequest) -> int:
    """Run the driver for ``request`` in this process (the ``local`` launcher): on the manifest
    ``rlcore run`` validated when it is at hand, else on the request's driver manifest."""
    if request.validated is not None:
        from rlcore.trainer.driver import run_driver

        return run_driver(request.validated, request.run_dir, resume=request.resume)
    return run_driver_manifest(write_driver_manifest(request), request.run_dir, resume=request.resume)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The run's latest intact checkpoint (complete, and its files' checksums verified), or None.
    Needs no torch."""
    from rlcore.checkpoint import Checkpointer

    return Checkpointer(run_dir).latest_intact()
