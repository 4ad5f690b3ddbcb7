"""Registers the ``skypilot`` launcher. Imports nothing heavy (no sky): ``rlcore validate`` uses it."""

from __future__ import annotations

import rlcore
from rlcore.components import Component
from rlcore_launcher_skypilot.options import SkyPilotOptions


@rlcore.hookimpl
def rlcore_launchers():
    return [
        Component(
            name="skypilot",
            factory="rlcore_launcher_skypilot.launcher:build",
            options=SkyPilotOptions,
            description="runs the manifest as a SkyPilot task (a rank per GPU on every node) on any cloud, and follows it",
        )
    ]
