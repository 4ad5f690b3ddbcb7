"""Registers the ``verifiers`` data source, reward and agent loop. Imports neither verifiers nor
torch: the options models load an environment only when a manifest is validated."""

from __future__ import annotations

import rlcore
from rlcore.components import Component
from rlcore_verifiers.options import VerifiersLoopOptions, VerifiersRewardOptions, VerifiersSourceOptions


@rlcore.hookimpl
def rlcore_data_sources():
    return [
        Component(
            name="verifiers",
            factory="rlcore_verifiers.source:build",
            options=VerifiersSourceOptions,
            target_option="env",
            description="a verifiers environment's tasks (verifiers:PACKAGE, PACKAGE:NAME or python:FILE.py[:NAME])",
        )
    ]


@rlcore.hookimpl
def rlcore_reward_functions():
    return [
        Component(
            name="verifiers",
            factory="rlcore_verifiers.reward:build",
            options=VerifiersRewardOptions,
            description="scores a verifiers row with its task's own @vf.reward functions (weighted sum)",
        )
    ]


@rlcore.hookimpl
def rlcore_agent_loops():
    return [
        Component(
            name="verifiers",
            factory="rlcore_verifiers.loop:build",
            options=VerifiersLoopOptions,
            description="plays a verifiers environment's episodes (its turns, its MCP toolsets, its @vf.stop) token in, token out",
            needs={"tokenizer"},
        )
    ]
