"""Manifest options of this plugin's components (keys of the ``[algorithm]`` table)."""

from __future__ import annotations

from pydantic import Field

from rlcore.components import Options


class GRPOOptions(Options):
    norm_by_std: bool = Field(True, description="divide by the group's standard deviation (false: Dr. GRPO)")
    epsilon: float = Field(1e-6, gt=0.0, description="added to the group standard deviation before dividing")


class ReinforcePPOptions(Options):
    gamma: float = Field(1.0, gt=0.0, le=1.0, description="discount per model token")


class GSPOOptions(Options):
    clip_ratio_low: float = Field(
        3e-4, ge=0.0, lt=1.0, description="sequence ratio floor is 1 - clip_ratio_low"
    )
    clip_ratio_high: float = Field(4e-4, ge=0.0, description="sequence ratio ceiling is 1 + clip_ratio_high")
    gspo_log_ratio_cap: float = Field(
        10.0,
        gt=0.0,
        description="the token log-ratio is clamped here with its gradient (above it: no gradient), as verl",
    )
    gspo_follow_loss_agg_mode: bool = Field(
        False,
        description="aggregate by [algorithm] loss_agg_mode; by default GSPO aggregates by seq-mean-token-mean, its "
        "definition (as verl does whatever loss_agg_mode says)",
    )
