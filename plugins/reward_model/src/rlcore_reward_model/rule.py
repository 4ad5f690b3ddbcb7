"""A rule reward added to a model's score: ``model_weight * model + rule_weight * rule``.

The rule is a per-item function named like a ``python:`` reward's target (``FILE.py:FUNCTION``,
relative to the manifest, or ``package.module:FUNCTION``) taking a RewardInput, or with verl's
``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` signature. It runs in
the trainer's process with the model's batch (within ``[reward] timeout_s``). A rule that raises
or returns no finite number gives 0 for its part of that item, counted as ``rule_failed``.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

from loguru import logger

from rlcore.errors import RlcoreError, UsageError
from rlcore.interfaces import RewardInput, RewardResult
from rlcore.targets import load_target


class Rule:
    """The rule of a ``reward_model`` or ``judge`` reward, and its weight."""

    def __init__(self, fn: Callable[..., Any], origin: str, weight: float) -> None:
        self.fn, self.origin, self.weight = fn, origin, weight
        self.verl = _verl_style(fn)
        self.required_fields = frozenset(getattr(fn, "required_fields", ()) or ())
        self._logged = False

    def score(self, item: RewardInput) -> tuple[float, dict[str, float]]:
        """The rule's score of ``item`` (0 when it fails) and its metrics, prefixed ``rule_``."""
        try:
            if self.verl == "kw":
                result = self.fn(
                    item.data_source, item.response, item.ground_truth, extra_info=item.extra_info
                )
            elif self.verl == "3":
                result = self.fn(item.data_source, item.response, item.ground_truth)
            else:
                result = self.fn(item)
            score, metrics = _read(result)
        except Exception as exc:  # noqa: BLE001 - user code: its part of this item scores 0, counted
            if not self._logged:
                self._logged = True
                logger.warning(
                    "reward rule {} failed ({}: {}); its part scores 0, counted in reward/rule_failed "
                    "(only the first is logged)",
                    self.origin,
                    type(exc).__name__,
                    exc,
                )
            return 0.0, {"rule_failed": 1.0}
        out = {f"rule_{k}": v for k, v in metrics.items()}
        out.update(rule_score=score, rule_failed=0.0)
        return score, out


def load_rule(target: str | None, weight: float, manifest_dir: str | None, owner: str) -> Rule | None:
    """The rule named by ``target`` (the ``rule`` option of the ``owner`` reward), or None."""
    if target is None:
        return None
    try:
        fn, origin = load_target(target, what="function", source="reward rule", base_dir=manifest_dir)
    except RlcoreError as exc:
        raise UsageError(f"[reward] rule of the {owner!r} reward: {exc}") from None
    if not callable(fn):
        raise UsageError(
            f"[reward] rule of the {owner!r} reward: {origin}: {target.rpartition(':')[2]!r} is not a "
            f"function but a {type(fn).__name__} value"
        )
    if getattr(fn, "batched", False):
        raise UsageError(
            f"[reward] rule of the {owner!r} reward: {origin} is a batched reward; the rule must score "
            "one item at a time (write a python: batched reward to combine batched ones)"
        )
    return Rule(fn, origin, weight)


def combine(
    model_scores: Sequence[float],
    model_metrics: Sequence[dict[str, float]],
    items: Sequence[RewardInput],
    rule: Rule | None,
    model_weight: float,
) -> list[RewardResult]:
    """``model_weight * model + rule_weight * rule`` for each item, with both parts as metrics."""
    results = []
    for score, metrics, item in zip(model_scores, model_metrics, items):
        metrics = dict(metrics)
        total = model_weight * score
        if rule is not None:
            rule_score, rule_metrics = rule.score(item)
            metrics.update(rule_metrics)
            total += rule.weight * rule_score
        results.append(RewardResult(total, metrics))
    return results


def _read(result: Any) -> tuple[float, dict[str, float]]:
    if isinstance(result, RewardResult):
        score, metrics = result.score, result.metrics or {}
    elif isinstance(result, dict) and "score" in result:  # verl's dict form
        score, metrics = result["score"], {k: v for k, v in result.items() if k != "score"}
    else:
        score, metrics = result, {}
    if isinstance(score, bool) or not isinstance(score, numbers.Real) or not math.isfinite(float(score)):
        raise ValueError(f"returned {type(result).__name__} {result!r:.80}, not a finite number")
    return float(score), {
        str(k): float(v)
        for k, v in metrics.items()
        if isinstance(v, numbers.Real) and math.isfinite(float(v))
    }


def _verl_style(fn: Callable[..., Any]) -> str:
    """ "item" for fn(item); "kw" or "3" for verl's compute_score (with or without extra_info)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return "item"
    positional = [
        p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is p.empty]
    if len(required) >= 3 or [p.name for p in positional[:3]] == [
        "data_source",
        "solution_str",
        "ground_truth",
    ]:
        takes_extra = "extra_info" in sig.parameters or any(
            p.kind == p.VAR_KEYWORD for p in sig.parameters.values()
        )
        return "kw" if takes_extra else "3"
    return "item"
