"""Conformance kits for score shapers and batch filters (``rlcore_score_shapers``,
``rlcore_batch_filters``). Plain Python: neither kind sees a tensor.

    from rlcore.testing.shaping import check_batch_filter, check_score_shaper

    def test_my_filter():
        check_batch_filter(registry.get("batch_filter", "my_filter"), {"threshold": 0.5})
"""

from __future__ import annotations

import math
from typing import Any

from rlcore.components import Component
from rlcore.interfaces import BuildContext, Prompt, Trajectory
from rlcore.testing import build_subject

GROUP_SIZE = 4
MAX_RESPONSE_TOKENS = 8


def _context() -> BuildContext:
    """A run's context as far as these kinds need it: the manifest's data and rollout keys."""
    return BuildContext(
        manifest={
            "data": {
                "max_response_tokens": MAX_RESPONSE_TOKENS,
                "max_prompt_tokens": 8,
                "prompts_per_step": 3,
                "gen_batch_size": 0,
            },
            "rollout": {"samples_per_prompt": GROUP_SIZE},
        }
    )


def sample_round(groups: int = 3, group_size: int = GROUP_SIZE) -> tuple[list[Trajectory], list[float]]:
    """A round of ``groups`` prompts: group 0 all correct, group 1 mixed, group 2 all wrong; lengths
    from 1 to the limit (the longest cut at it, ``finish_reason = "length"``)."""
    trajectories, scores = [], []
    for g in range(groups):
        prompt = Prompt(token_ids=[1, 2, g], messages=[], index=g)
        for k in range(group_size):
            length = 1 + (g * group_size + k) % MAX_RESPONSE_TOKENS
            finish = "length" if length == MAX_RESPONSE_TOKENS else "stop"
            trajectories.append(
                Trajectory(
                    prompt=prompt,
                    response_ids=[5] * length,
                    response_mask=[1] * length,
                    rollout_logprobs=[-0.5] * length,
                    finish_reason=finish,
                )
            )
            scores.append(1.0 if g == 0 else (float(k % 2) if g == 1 else 0.0))
    return trajectories, scores


def _metrics(metrics: Any, what: str) -> None:
    assert isinstance(metrics, dict), f"{what}: metrics must be a dict, got {type(metrics).__name__}"
    for key, value in metrics.items():
        assert isinstance(key, str) and "/" in key, f"{what}: metric names are 'group/name', got {key!r}"
        assert isinstance(value, (int, float)) and math.isfinite(value), f"{what}: metric {key} = {value!r}"


def check_score_shaper(
    component: Component | Any, options: Any = None, context: BuildContext | None = None
) -> None:
    """One finite score per trajectory, in order; finite metrics; deterministic; an empty round
    stays empty; the trajectories are left as they were."""
    shaper = build_subject(component, options, context or _context())
    trajectories, scores = sample_round()
    before = [(t.response_ids[:], t.finish_reason) for t in trajectories]
    shaped, metrics = shaper.shape(trajectories, list(scores))
    shaped = list(shaped)
    assert len(shaped) == len(scores), f"{len(shaped)} scores for {len(scores)} trajectories"
    assert all(isinstance(s, (int, float)) and math.isfinite(s) for s in shaped), (
        f"non-finite scores {shaped}"
    )
    _metrics(metrics, "shape")
    again, _ = shaper.shape(trajectories, list(scores))
    assert list(again) == shaped, "two identical calls gave different scores"
    assert [(t.response_ids, t.finish_reason) for t in trajectories] == before, (
        "shape changed the trajectories"
    )
    empty, _ = shaper.shape([], [])
    assert list(empty) == [], "an empty round must give no scores"


def check_batch_filter(
    component: Component | Any, options: Any = None, context: BuildContext | None = None
) -> None:
    """It implements ``select`` or ``loss_mask`` (or both). ``select``: sorted, distinct group
    indices within range; deterministic (given ``reward_items`` when it asks for them);
    ``max_rounds`` an int of 0 (unlimited) or more; ``on_exhausted`` pad or raise. ``loss_mask``: one
    bool per trajectory and finite metrics; deterministic."""
    selector = build_subject(component, options, context or _context())
    assert hasattr(selector, "select") or hasattr(selector, "loss_mask"), (
        "a batch filter needs select or loss_mask"
    )
    trajectories, scores = sample_round()
    groups = len(scores) // GROUP_SIZE
    if hasattr(selector, "select"):
        rounds = getattr(selector, "max_rounds", 1)
        assert isinstance(rounds, int) and rounds >= 0, (
            f"max_rounds must be an int of 0 (unlimited) or more, got {rounds!r}"
        )
        exhausted = getattr(selector, "on_exhausted", "pad")
        assert exhausted in ("pad", "raise"), f"on_exhausted must be 'pad' or 'raise', got {exhausted!r}"
        extra = {}
        # as the trainer gives them: the reward's acc, its raw score
        if getattr(selector, "reward_items", False):
            extra["reward_items"] = [{"acc": s, "score": s} for s in scores]
        kept = list(selector.select(trajectories, list(scores), GROUP_SIZE, **extra))
        assert all(isinstance(g, int) and 0 <= g < groups for g in kept), (
            f"group indices out of range: {kept}"
        )
        assert kept == sorted(set(kept)), f"select must return sorted, distinct group indices, got {kept}"
        assert list(selector.select(trajectories, list(scores), GROUP_SIZE, **extra)) == kept, (
            "select is not deterministic"
        )
    if hasattr(selector, "loss_mask"):
        keep, metrics = selector.loss_mask(trajectories)
        keep = list(keep)
        assert len(keep) == len(trajectories) and all(isinstance(k, bool) for k in keep), (
            f"loss_mask must give one bool per trajectory, got {keep}"
        )
        _metrics(metrics, "loss_mask")
        assert list(selector.loss_mask(trajectories)[0]) == keep, "loss_mask is not deterministic"
