"""DAPO's batch filters: dynamic sampling (informative groups, more rounds) and truncated
responses out of the loss."""

from __future__ import annotations

from typing import Sequence

from rlcore.interfaces import BuildContext, Trajectory
from rlcore_algo_dapo.shaping import informative_groups


class DynamicSampling:
    """Keeps the groups whose samples scored differently; the trainer generates up to
    ``max_rounds`` rounds until the step holds as many groups as one round's prompts, then pads
    with uniform groups (which teach nothing but keep the batch's size)."""

    def __init__(self, max_rounds: int):
        self.max_rounds = max_rounds

    def select(self, trajectories: Sequence[Trajectory], scores: Sequence[float], group_size: int) -> list[int]:
        return informative_groups(scores, group_size)


class MaskTruncated:
    """Responses cut at the length limit (``finish_reason == "length"``) count for nothing in the loss."""

    def loss_mask(self, trajectories: Sequence[Trajectory]) -> tuple[list[bool], dict[str, float]]:
        truncated = [t.finish_reason == "length" for t in trajectories]
        fraction = sum(truncated) / max(len(truncated), 1)
        return [not t for t in truncated], {"response_length/masked_truncated": float(fraction)}


def build_dynamic_sampling(options, context: BuildContext | None = None) -> DynamicSampling:
    return DynamicSampling(options.max_generation_rounds)


def build_mask_truncated(options, context: BuildContext | None = None) -> MaskTruncated:
    return MaskTruncated()
