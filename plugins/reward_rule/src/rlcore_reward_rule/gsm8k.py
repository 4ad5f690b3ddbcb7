"""The GSM8K reward: the final number of the response against the dataset's answer."""

from __future__ import annotations

import re

from rlcore.interfaces import RewardInput, RewardResult

from rlcore_reward_rule.numbers import NUMBER, clean_number, numbers_in, same_number
from rlcore_reward_rule.options import GSM8KOptions, graded_score

_STRICT = re.compile(r"####\s*\$?\s*(" + NUMBER + ")")


def extract_answer(response: str, method: str = "strict") -> str | None:
    """strict: the number right after the last "####"; flexible: the last number anywhere."""
    if method == "strict":
        found = _STRICT.findall(response.replace("\u2212", "-"))
        return clean_number(found[-1]) if found else None
    found = numbers_in(response)
    return found[-1] if found else None


class GSM8KReward:
    required_fields = frozenset({"ground_truth"})

    def __init__(self, options: GSM8KOptions) -> None:
        self.options = options

    def __call__(self, item: RewardInput) -> RewardResult:
        answer = extract_answer(item.response or "", self.options.method)
        correct = same_number(answer, item.ground_truth)
        score = graded_score(self.options, correct, answer is not None)
        return RewardResult(score, {"answer_found": float(answer is not None), "correct": float(correct)})


def build(options: GSM8KOptions, context: object = None) -> GSM8KReward:
    return GSM8KReward(options)
