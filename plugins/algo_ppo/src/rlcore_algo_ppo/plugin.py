"""Registers ``gae``; imports nothing heavy (torch loads when a run builds it)."""

from __future__ import annotations

import rlcore
from rlcore.components import Component
from rlcore_algo_ppo.options import GAEOptions


@rlcore.hookimpl
def rlcore_advantage_estimators():
    return [
        Component(
            "gae",
            "rlcore_algo_ppo.gae:build_gae",
            GAEOptions,
            "generalized advantage estimation from token rewards and critic values",
            needs={"critic"},
        ),
    ]
