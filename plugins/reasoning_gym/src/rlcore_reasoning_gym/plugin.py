"""Registers the ``reasoning_gym`` data source and reward. Imports neither reasoning_gym nor torch:
the options models load reasoning_gym's task table only when a manifest is validated."""

from __future__ import annotations

import rlcore
from rlcore.components import Component
from rlcore_reasoning_gym.options import ReasoningGymRewardOptions, ReasoningGymSourceOptions


@rlcore.hookimpl
def rlcore_data_sources():
    return [
        Component(
            name="reasoning_gym",
            factory="rlcore_reasoning_gym.source:build",
            options=ReasoningGymSourceOptions,
            target_option="task",
            description="reasoning-gym's procedural tasks (reasoning_gym:TASK?size=N&seed=S), one or a weighted mixture",
        )
    ]


@rlcore.hookimpl
def rlcore_reward_functions():
    return [
        Component(
            name="reasoning_gym",
            factory="rlcore_reasoning_gym.reward:build",
            options=ReasoningGymRewardOptions,
            description="scores a reasoning_gym row with its own task's score_answer (works on mixtures)",
        )
    ]
