"""DAPO's per-sample numbers, in plain Python (they act before any tensor exists)."""

from __future__ import annotations

from collections.abc import Sequence


def overlong_penalty(length: int, max_length: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO's soft overlong punishment of one response of ``length`` tokens: 0 up to
    ``max_length - buffer``, then falling linearly to ``-factor`` at ``max_length`` (and below it
    beyond). ``buffer = 0`` turns it off."""
    if buffer <= 0:
        return 0.0
    start = max_length - buffer
    if length <= start:
        return 0.0
    return -factor * min(length - start, buffer) / buffer


def informative_groups(scores: Sequence[float], group_size: int, tolerance: float = 1e-9) -> list[int]:
    """Indices of the groups (consecutive runs of ``group_size`` samples of one prompt) whose scores
    are not all equal: the only ones a group-relative advantage learns from."""
    if group_size < 1 or len(scores) % group_size:
        raise ValueError(f"{len(scores)} scores do not split into groups of {group_size}")
    kept = []
    for group in range(len(scores) // group_size):
        values = scores[group * group_size : (group + 1) * group_size]
        if max(values) - min(values) > tolerance:
            kept.append(group)
    return kept


FILTER_METRICS = ("acc", "score")  # [filters.dynamic_sampling] metric


def accuracies_of(reward_items: Sequence[dict[str, float]]) -> list[float]:
    """Each sample's correctness: the ``acc`` its reward reported (verl's field of that name), else
    its score before any score shaper (as verl's DAPO reward manager)."""
    return [float(m.get("acc", m["score"])) for m in reward_items]


def filter_values(metric: str, scores: Sequence[float], accuracies: Sequence[float]) -> Sequence[float]:
    """Per sample, what dynamic sampling compares within a group. ``acc``: correctness, before the
    overlong penalty, as the DAPO paper and verl's ``metric = acc``; ``score``: the score trained
    on, the overlong penalty included (verl's ``seq_reward``), which also keeps an all-correct
    group whose samples were penalised differently for their lengths."""
    if metric == "acc":
        values = accuracies
    elif metric == "score":
        values = scores
    else:
        raise ValueError(
            f"unknown dynamic sampling metric {metric!r}; expected one of {', '.join(FILTER_METRICS)}"
        )
    if len(values) != len(scores):
        raise ValueError(f"{len(values)} {metric} values for {len(scores)} samples")
    return values
