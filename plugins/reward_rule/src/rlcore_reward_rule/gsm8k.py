"""The GSM8K reward: the final number of the response against the dataset's answer.

``strict`` is verl's strict scorer, format check included: the last ``#### N`` (one space, then
digits, dots and commas) within the response's last 300 characters, commas removed, must equal
the ground truth as written. ``flexible`` is the lenient one: the last number anywhere, compared
as a number (``72.00`` is ``72``, ``1,000`` is ``1000``).
"""

from __future__ import annotations

import re

from rlcore.interfaces import RewardInput, RewardResult

from rlcore_reward_rule.numbers import numbers_in, same_number
from rlcore_reward_rule.options import GSM8KOptions, graded_score

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_STRICT_WINDOW = 300  # verl looks at the response's last 300 characters only


def extract_answer(response: str, method: str = "strict") -> str | None:
    """strict: the number of the last "#### N" in the last 300 characters (verl's format check);
    flexible: the last number anywhere."""
    if method == "strict":
        found = _STRICT.findall(response[-_STRICT_WINDOW:])
        return found[-1].replace(",", "").replace("$", "") if found else None
    found = numbers_in(response)
    return found[-1] if found else None


def is_correct(answer: str | None, truth: object, method: str) -> bool:
    if answer is None:
        return False
    if method == "strict":  # as verl: the text itself
        return answer == str(truth).strip()
    return same_number(answer, truth)


class GSM8KReward:
    required_fields = frozenset({"ground_truth"})

    def __init__(self, options: GSM8KOptions) -> None:
        self.options = options

    def __call__(self, item: RewardInput) -> RewardResult:
        answer = extract_answer(item.response or "", self.options.method)
        correct = is_correct(answer, item.ground_truth, self.options.method)
        score = graded_score(self.options, correct, answer is not None)
        return RewardResult(score, {"answer_found": float(answer is not None), "correct": float(correct)})


def build(options: GSM8KOptions, context: object = None) -> GSM8KReward:
    return GSM8KReward(options)
