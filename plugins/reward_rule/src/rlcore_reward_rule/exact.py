"""The exact-match reward: the whole response, normalised, against the ground truth."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from typing import Any

from rlcore.interfaces import Prompt, RewardInput, RewardResult
from rlcore_reward_rule.options import ExactMatchOptions
from rlcore_reward_rule.truths import refuse_uncomparable

_PUNCTUATION = str.maketrans("", "", string.punctuation)


class ExactMatchReward:
    """Matches any of the ground truths when ``ground_truth`` is a list."""

    required_fields = frozenset({"ground_truth"})

    def __init__(self, options: ExactMatchOptions) -> None:
        self.options = options

    def normalise(self, text: Any) -> str:
        text = "" if text is None else str(text)
        o = self.options
        if o.ignore_punctuation:
            text = text.translate(_PUNCTUATION)
        if o.collapse_whitespace:
            text = re.sub(r"\s+", " ", text)
        if o.strip:
            text = text.strip()
        if not o.case_sensitive:
            text = text.casefold()
        return text

    def __call__(self, item: RewardInput) -> RewardResult:
        truths = item.ground_truth if isinstance(item.ground_truth, (list, tuple)) else [item.ground_truth]
        response = self.normalise(item.response)
        correct = any(response == self.normalise(t) for t in truths if t is not None)
        return RewardResult(self.options.correct_score if correct else 0.0, {"correct": float(correct)})

    def check_data(self, prompts: Sequence[Prompt], source_name: str) -> None:
        """Refuse ground truths this reward can never compare (see :mod:`rlcore_reward_rule.truths`)."""
        refuse_uncomparable(prompts, source_name, "exact_match", lists=True)


def build(options: ExactMatchOptions, context: object = None) -> ExactMatchReward:
    return ExactMatchReward(options)
