"""Registers the ``rlcore serve`` command. Imports nothing heavy: the command's module is named by
string and imported only when ``rlcore serve`` runs or shows its help."""

from __future__ import annotations

import rlcore
from rlcore.components import Command


@rlcore.hookimpl
def rlcore_commands():
    return [
        Command(
            name="serve",
            help="serve a manifest's rollout engine as an OpenAI-compatible endpoint",
            configure="rlcore_serve.cli:configure",
            run="rlcore_serve.cli:run",
        )
    ]
