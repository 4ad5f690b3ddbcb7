"""Registers the model-based rewards. Imports nothing heavy: torch, transformers and httpx load
only when a run builds one of them."""

from __future__ import annotations

import rlcore
from rlcore.components import Component
from rlcore_reward_model.options import JudgeOptions, RewardModelOptions


@rlcore.hookimpl
def rlcore_reward_functions():
    return [
        Component(
            name="reward_model",
            factory="rlcore_reward_model.model:build",
            options=RewardModelOptions,
            description="a sequence-classification reward model (a local Hugging Face directory), batched, "
            "optionally plus a rule reward",
        ),
        Component(
            name="judge",
            factory="rlcore_reward_model.judge:build",
            options=JudgeOptions,
            description="an LLM judge behind an OpenAI-compatible endpoint; its number, normalised to [0, 1]",
        ),
    ]
