"""Registers this plugin's components; imports nothing heavy (torch loads when a run builds one)."""

from __future__ import annotations

import rlcore
from rlcore.components import Component, NoOptions
from rlcore_algo_grpo.options import GRPOOptions, GSPOOptions, ReinforcePPOptions


@rlcore.hookimpl
def rlcore_advantage_estimators():
    return [
        Component(
            "grpo",
            "rlcore_algo_grpo.estimators:build_grpo",
            GRPOOptions,
            "group-normalised outcome advantage: (score - group mean) / (group std + eps)",
            needs={"groups"},
            default=True,
        ),  # [algorithm] advantage left out
        Component(
            "dr_grpo",
            "rlcore_algo_grpo.estimators:build_dr_grpo",
            NoOptions,
            "Dr. GRPO: score - group mean, no std normalisation",
            needs={"groups"},
        ),
        Component(
            "rloo",
            "rlcore_algo_grpo.estimators:build_rloo",
            NoOptions,
            "leave-one-out baseline: score - mean of the other samples of the group",
            needs={"groups"},
        ),
        Component(
            "reinforce_pp",
            "rlcore_algo_grpo.estimators:build_reinforce_pp",
            ReinforcePPOptions,
            "REINFORCE++: per-token discounted returns, whitened over the batch",
        ),
    ]


@rlcore.hookimpl
def rlcore_policy_losses():
    return [
        Component(
            "gspo",
            "rlcore_algo_grpo.gspo:build_gspo",
            GSPOOptions,
            "GSPO: clipped sequence-level importance ratio (token-level form)",
        ),
    ]
