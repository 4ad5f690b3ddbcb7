"""Registers the ``slurm`` launcher and the ``rlcore jobs`` command. Imports nothing heavy."""

from __future__ import annotations

import rlcore
from rlcore.components import Command, Component
from rlcore_launcher_slurm.options import SlurmOptions


@rlcore.hookimpl
def rlcore_launchers():
    return [
        Component(
            name="slurm",
            factory="rlcore_launcher_slurm.launcher:build",
            options=SlurmOptions,
            description="submits the run as a SLURM batch job (srun starts a rank per GPU on every node) and follows it",
        )
    ]


@rlcore.hookimpl
def rlcore_commands():
    from rlcore_launcher_slurm.cli import configure

    return [
        Command(
            name="jobs",
            help="list rlcore's SLURM jobs, or cancel one (rlcore jobs cancel JOBID)",
            configure=configure,
            run="rlcore_launcher_slurm.cli:run",
        )
    ]
