"""The format reward: the response matches a regular expression (e.g. <think>...</think><answer>...</answer>)."""

from __future__ import annotations

import re

from rlcore.interfaces import RewardInput, RewardResult
from rlcore_reward_rule.options import FormatOptions


class FormatReward:
    required_fields: frozenset[str] = frozenset()

    def __init__(self, options: FormatOptions) -> None:
        self.options = options
        flags = (re.DOTALL if options.dotall else 0) | (re.IGNORECASE if options.ignore_case else 0)
        self.regex = re.compile(options.pattern, flags)

    def __call__(self, item: RewardInput) -> RewardResult:
        text = item.response or ""
        if self.options.mode == "fullmatch":
            matched = self.regex.fullmatch(text.strip()) is not None
        else:
            matched = self.regex.search(text) is not None
        score = self.options.match_score if matched else self.options.miss_score
        return RewardResult(score, {"format_ok": float(matched)})


def build(options: FormatOptions, context: object = None) -> FormatReward:
    return FormatReward(options)
