"""The GSM8K reward: the final number of the response against the dataset's answer.

``strict`` and ``flexible`` are verl's two scorers (``verl.utils.reward_score.gsm8k``), exactly:
both look at the response's last 300 characters only and compare the extracted text with the
ground truth as it is (``answer == ground_truth``: no stripping, and a ground truth that is not
text never matches).

- ``strict``: the last ``#### N`` (one space, then digits, dots and commas), commas removed.
- ``flexible``: the last run of digits, dots and commas (``-`` allowed first) that is not a lone
  ``.``, taken as written: ``18.`` is not ``18``, ``1,000`` is not ``1000``.
- ``numeric`` (rlcore's own): the last number anywhere in the response, compared by value
  (``72.00`` is ``72``, ``1,000`` is ``1000``, an integer ground truth is fine).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from loguru import logger

from rlcore.interfaces import Prompt, RewardInput, RewardResult
from rlcore_reward_rule.numbers import numbers_in, same_number
from rlcore_reward_rule.options import GSM8KOptions, graded_score
from rlcore_reward_rule.truths import refuse_uncomparable

_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")
_WINDOW = 300  # verl looks at the response's last 300 characters only (strict and flexible)
VERL_METHODS = ("strict", "flexible")


def extract_answer(response: str, method: str = "strict") -> str | None:
    """The answer ``method`` reads from ``response`` (see the module docstring); None when there is none."""
    if method == "numeric":
        found = numbers_in(response)
        return found[-1] if found else None
    tail = response[-_WINDOW:]
    if method == "strict":
        found = _STRICT.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    found = _FLEXIBLE.findall(tail)
    if not found:
        return None
    # The last match that is not a lone "."; when every match is one, verl's loop ends on the first.
    return next((m for m in reversed(found) if m != "."), found[0])


def is_correct(answer: str | None, truth: object, method: str) -> bool:
    if answer is None:
        return False
    if method in VERL_METHODS:  # as verl: the text itself, against the ground truth as it is
        return answer == truth
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

    def check_data(self, prompts: Sequence[Prompt], source_name: str) -> None:
        """Warn when verl's text comparison can never match a row's ground truth (not text, or with
        spaces around it): verl scores such rows as wrong, and so does rlcore, but says so. A list
        or a dict can never be one number, whatever the method: refused."""
        refuse_uncomparable(prompts, source_name, "gsm8k")
        if self.options.method not in VERL_METHODS:
            return
        odd = [
            p
            for p in prompts
            if not isinstance(p.ground_truth, str) or p.ground_truth != p.ground_truth.strip()
        ]
        if odd:
            first = odd[0]
            logger.warning(
                "data {!r}: {} row(s) (the first: row {}, ground_truth {!r}) have a ground truth that gsm8k's {!r} "
                "method (verl's) compares as text and can never match, so they score as wrong; write the ground "
                'truth as bare text, or use method = "numeric" (compares numbers)',
                source_name,
                len(odd),
                first.index,
                first.ground_truth,
                self.options.method,
            )


def build(options: GSM8KOptions, context: object = None) -> GSM8KReward:
    return GSM8KReward(options)
