"""The math reward: the last ``\\boxed{...}`` of the response against the ground truth.

The builtin normaliser (:mod:`rlcore_reward_rule.mathnorm`) decides first, as it is fast and
exact; when it says no and ``math-verify`` is installed, math-verify's symbolic comparison gets
the last word (it knows ``\\sqrt{8}`` equals ``2\\sqrt{2}``). math-verify's own signal-based time
limits are switched off: they fail outside the main thread, and rlcore's reward runner already
bounds every call.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from rlcore.errors import RlcoreError
from rlcore.interfaces import Prompt, RewardInput, RewardResult
from rlcore_reward_rule.mathnorm import equivalent, last_boxed
from rlcore_reward_rule.options import MathOptions, graded_score
from rlcore_reward_rule.truths import refuse_uncomparable


def _math_verify() -> Any:
    try:
        import math_verify
    except ImportError:
        return None
    return math_verify


@lru_cache(maxsize=4096)
def _parse_gold(mv: Any, truth: str) -> Any:
    return mv.parse(f"\\boxed{{{truth}}}", parsing_timeout=None)


def _symbolic_equal(mv: Any, answer: str, truth: str) -> bool:
    try:
        gold = _parse_gold(mv, truth)
        pred = mv.parse(f"\\boxed{{{answer}}}", parsing_timeout=None)
        return bool(gold) and bool(pred) and bool(mv.verify(gold, pred, timeout_seconds=None))
    except Exception:  # noqa: BLE001 - a parser failure means "not shown equal"
        return False


class MathReward:
    required_fields = frozenset({"ground_truth"})

    def __init__(self, options: MathOptions) -> None:
        self.options = options
        self.math_verify = None
        if options.backend != "builtin":
            self.math_verify = _math_verify()
            if self.math_verify is None and options.backend == "math_verify":
                raise RlcoreError(
                    "reward option backend = 'math_verify' needs the math-verify package: "
                    "pip install 'rlcore-reward-rule[math]' (or use backend = 'auto')"
                )

    def is_correct(self, answer: str, truth: Any) -> bool:
        truth_text = str(truth)
        if truth_text.strip() == "":
            return False
        # A ground truth written with its own box ("\boxed{5}") compares by its content.
        truth_text = last_boxed(truth_text) or truth_text
        if equivalent(answer, truth_text):
            return True
        return self.math_verify is not None and _symbolic_equal(self.math_verify, answer, truth_text)

    def __call__(self, item: RewardInput) -> RewardResult:
        answer = last_boxed(item.response or "")
        truths = item.ground_truth if isinstance(item.ground_truth, (list, tuple)) else [item.ground_truth]
        correct = answer is not None and any(self.is_correct(answer, t) for t in truths if t is not None)
        score = graded_score(self.options, correct, answer is not None)
        return RewardResult(score, {"boxed": float(answer is not None), "correct": float(correct)})

    def check_data(self, prompts: Sequence[Prompt], source_name: str) -> None:
        """Refuse ground truths this reward can never compare (see :mod:`rlcore_reward_rule.truths`)."""
        refuse_uncomparable(prompts, source_name, "math", lists=True)


def build(options: MathOptions, context: object = None) -> MathReward:
    return MathReward(options)
