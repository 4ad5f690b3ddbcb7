"""Conformance kit for reward functions: call it from a plugin's own tests.

    from rlcore.testing.rewards import check_reward_function
    from rlcore.interfaces import RewardInput

    def test_my_reward_conforms():
        check_reward_function(
            my_component,  # the Component record the plugin registers
            options={"method": "numeric"},
            cases=[(RewardInput(response="#### 42", ground_truth="42"), 1.0),
                   (RewardInput(response="#### 41", ground_truth="42"), 0.0)],
        )

It builds the component as a run does (``component.build(options, context)``) and checks that
the result is callable (or a batched reward: ``batched = True`` and ``score_batch``, called here
one item at a time and once with every case together, each its own group, which must give the
same scores in order);
that each case returns a finite float, or a RewardResult with a finite
score and numeric metrics, equal to the expected score; that scores stay within a sane range;
that calling twice gives the same answer; that empty and garbage responses are scored without
raising; and that ``required_fields``, when declared, names fields a prompt has.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from rlcore.components import Component
from rlcore.interfaces import BuildContext, RewardInput, RewardResult

KNOWN_FIELDS = {"ground_truth", "data_source"}

# Responses a reward must survive: empty, whitespace, truncated markup, huge, odd characters.
GARBAGE_RESPONSES: tuple[str, ...] = (
    "",
    " ",
    "\n\n\t",
    "####",
    "#### ",
    "\\boxed{",
    "\\boxed{}",
    "}}}{{{",
    "<think>",
    "</answer><answer>",
    "1" * 5000,
    "9" * 400 + "." + "9" * 400,
    "-" * 100,
    "NaN inf -inf 1e999",
    "\x00\x01\x02\ufffd",
    "😀 ∑ ∫ √ π ≠ −5",
    "(" * 200 + ")" * 10,
    "The answer is " + "very " * 2000 + "long.",
)


def score_of(result: Any) -> float:
    """The score of a float-or-RewardResult, checking its type (an AssertionError otherwise)."""
    if isinstance(result, RewardResult):
        assert isinstance(result.score, numbers.Real), (
            f"RewardResult.score must be a number, got {type(result.score).__name__}"
        )
        assert isinstance(result.metrics, dict), (
            f"RewardResult.metrics must be a dict, got {type(result.metrics).__name__}"
        )
        for key, value in result.metrics.items():
            assert isinstance(key, str), f"metric names must be strings, got {key!r}"
            assert isinstance(value, numbers.Real), f"metric {key!r} must be a number, got {value!r}"
            assert math.isfinite(float(value)), f"metric {key!r} is not finite: {value!r}"
        score = float(result.score)
    else:
        assert isinstance(result, numbers.Real), (
            f"a reward must return a float or RewardResult, got {type(result).__name__}: {result!r}"
        )
        score = float(result)
    assert math.isfinite(score), f"score is not finite: {score!r}"
    return score


def check_reward_function(
    component: Component,
    *,
    cases: Sequence[tuple[RewardInput, float]],
    options: Any = None,
    context: BuildContext | None = None,
    score_range: tuple[float, float] = (-10.0, 10.0),
    garbage: Iterable[str] = GARBAGE_RESPONSES,
    tolerance: float = 1e-6,
) -> Any:
    """Check a reward component against the reward contract; return the built reward (function or
    batched reward)."""
    assert isinstance(component, Component), f"expected a Component record, got {type(component).__name__}"
    assert cases, "give at least one (RewardInput, expected_score) case"
    built = component.build(options, context or BuildContext())
    batched = bool(getattr(built, "batched", False))
    if batched:
        assert callable(getattr(built, "score_batch", None)), (
            f"reward {component.name!r}: batched = True but it has no score_batch(items) method"
        )
        fn = _one_at_a_time(built)
    else:
        fn = built
    assert callable(fn), f"reward {component.name!r}: the factory returned a non-callable {type(fn).__name__}"

    required = getattr(fn, "required_fields", frozenset())
    assert isinstance(required, (set, frozenset, list, tuple)), "required_fields must be a set of field names"
    for name in required:
        assert name in KNOWN_FIELDS or str(name).startswith("extra_info."), (
            f"required field {name!r} is unknown; use {sorted(KNOWN_FIELDS)} or 'extra_info.KEY'"
        )

    low, high = score_range
    for i, (item, expected) in enumerate(cases):
        assert isinstance(item, RewardInput), f"case {i}: expected a RewardInput, got {type(item).__name__}"
        first = score_of(fn(item))
        again = score_of(fn(item))
        assert first == again, f"case {i}: not deterministic ({first} then {again}) for {item.response!r}"
        assert low <= first <= high, f"case {i}: score {first} outside {score_range}"
        assert abs(first - float(expected)) <= tolerance, (
            f"case {i}: expected {expected}, got {first} for response {item.response[:80]!r} "
            f"and ground truth {item.ground_truth!r}"
        )

    if batched:
        # Each case a group of its own (as one prompt each), so a group-wise reward scores it as alone.
        together = [
            score_of(r)
            for r in _scored_batch(built, [replace(item, group=i) for i, (item, _) in enumerate(cases)])
        ]
        alone = [score_of(fn(item)) for item, _ in cases]
        assert together == alone, (
            f"reward {component.name!r}: a batch of the cases scored {together}, one by one {alone}"
        )

    templates = [item for item, _ in cases]
    for text in garbage:
        for template in templates[:3]:
            item = RewardInput(
                response=text,
                prompt=template.prompt,
                ground_truth=template.ground_truth,
                data_source=template.data_source,
                extra_info=dict(template.extra_info),
            )
            try:
                score = score_of(fn(item))
            except AssertionError:
                raise
            except Exception as exc:  # noqa: BLE001 - the point of the check
                raise AssertionError(
                    f"reward {component.name!r} raised {type(exc).__name__}: {exc} on the response {text[:40]!r}"
                ) from exc
            assert low <= score <= high, f"score {score} outside {score_range} on the response {text[:40]!r}"
    return built


def _scored_batch(reward: Any, items: list[RewardInput]) -> list[Any]:
    for name in ("wake_up",):
        if callable(getattr(reward, name, None)):
            getattr(reward, name)()
    try:
        results = list(reward.score_batch(items))
    finally:
        if callable(getattr(reward, "sleep", None)):
            reward.sleep()
    assert len(results) == len(items), f"score_batch returned {len(results)} results for {len(items)} items"
    return results


def _one_at_a_time(reward: Any) -> Callable[[RewardInput], Any]:
    return lambda item: _scored_batch(reward, [item])[0]
