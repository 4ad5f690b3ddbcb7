"""Registers the ``rlcore from-verl`` command. Imports nothing heavy (not even the converter)."""

from __future__ import annotations

import rlcore
from rlcore.components import Command


@rlcore.hookimpl
def rlcore_commands():
    return [
        Command(
            name="from-verl",
            help="write a manifest from a verl command line, script or YAML config (each line naming its verl key)",
            configure="rlcore_verl.cli:configure",
            run="rlcore_verl.cli:run",
        )
    ]
