"""DAPO's batch filters: dynamic sampling (informative groups, more rounds) and truncated
responses out of the loss."""

from __future__ import annotations

from collections.abc import Sequence

from rlcore.errors import UsageError
from rlcore.interfaces import BuildContext, Trajectory
from rlcore_algo_dapo.shaping import accuracies_of, filter_values, informative_groups


class DynamicSampling:
    """Keeps the groups whose samples differ in ``metric`` (``acc``: correctness before the
    overlong penalty; ``score``: the penalised score); the trainer generates up to ``max_rounds``
    rounds (0: unlimited) until the step holds ``[data] prompts_per_step`` groups, then pads with
    uniform groups out of the loss (``on_exhausted = "pad"``) or stops (``"raise"``, as verl)."""

    reward_items = True  # select() wants each sample's reward as given (its acc, its unshaped score)

    def __init__(self, metric: str = "acc", max_rounds: int = 3, on_exhausted: str = "pad"):
        self.metric, self.max_rounds, self.on_exhausted = metric, max_rounds, on_exhausted

    def select(
        self,
        trajectories: Sequence[Trajectory],
        scores: Sequence[float],
        group_size: int,
        reward_items: Sequence[dict[str, float]] | None = None,
    ) -> list[int]:
        items = reward_items if reward_items is not None else [{"score": s} for s in scores]
        return informative_groups(filter_values(self.metric, scores, accuracies_of(items)), group_size)


class MaskTruncated:
    """Responses cut at the length limit (``finish_reason == "length"``) count for nothing in the loss."""

    def loss_mask(self, trajectories: Sequence[Trajectory]) -> tuple[list[bool], dict[str, float]]:
        truncated = [t.finish_reason == "length" for t in trajectories]
        fraction = sum(truncated) / max(len(truncated), 1)
        return [not t for t in truncated], {"response_length/masked_truncated": float(fraction)}


def build_dynamic_sampling(options, context: BuildContext | None = None) -> DynamicSampling:
    """Refuses rounds that cannot fill a step even if every group were informative."""
    data = (context.manifest.get("data") if context is not None else None) or {}
    per_step, drawn, rounds = (
        data.get("prompts_per_step"),
        data.get("gen_batch_size") or data.get("prompts_per_step"),
        options.max_generation_rounds,
    )
    if isinstance(per_step, int) and isinstance(drawn, int) and rounds and drawn * rounds < per_step:
        raise UsageError(
            f"[filters.dynamic_sampling] max_generation_rounds = {rounds} rounds of [data] gen_batch_size = {drawn} "
            f"prompts cannot fill a step of data.prompts_per_step = {per_step} groups even if every group is "
            "informative; raise either (max_generation_rounds = 0 is unlimited)"
        )
    return DynamicSampling(options.metric, rounds, options.on_exhausted)


def build_mask_truncated(options, context: BuildContext | None = None) -> MaskTruncated:
    return MaskTruncated()
