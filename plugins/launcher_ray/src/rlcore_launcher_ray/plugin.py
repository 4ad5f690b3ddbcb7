"""Registers the ``ray`` launcher. Imports nothing heavy (no ray): ``rlcore validate`` uses it."""

from __future__ import annotations

import rlcore
from rlcore.components import Component
from rlcore_launcher_ray.options import RayOptions


@rlcore.hookimpl
def rlcore_launchers():
    return [
        Component(
            name="ray",
            factory="rlcore_launcher_ray.launcher:build",
            options=RayOptions,
            description="runs the training ranks as Ray actors on a placement group, or submits the run as a Ray job",
        )
    ]
