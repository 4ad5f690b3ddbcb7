"""Registers the rule rewards. Imports nothing heavy: the scorers load when a run builds them."""

from __future__ import annotations

import rlcore
from rlcore.components import Component, NoOptions
from rlcore_reward_rule.options import (
    ExactMatchOptions,
    FormatOptions,
    GSM8KOptions,
    MathDapoOptions,
    MathOptions,
)


@rlcore.hookimpl
def rlcore_reward_functions():
    return [
        Component(
            name="gsm8k",
            factory="rlcore_reward_rule.gsm8k:build",
            options=GSM8KOptions,
            description='GSM8K: the number after "####" (strict) or the last number (flexible, numeric) equals the answer',
        ),
        Component(
            name="math",
            factory="rlcore_reward_rule.math_answer:build",
            options=MathOptions,
            description="the last \\boxed{...} answer is equivalent to the ground truth",
        ),
        Component(
            name="math_dapo",
            factory="rlcore_reward_rule.math_dapo:build",
            options=MathDapoOptions,
            description='verl\'s DAPO scorer: the text after the last "Answer:", Minerva-normalised, scores +1 or -1',
        ),
        Component(
            name="verl",
            factory="rlcore_reward_rule.verl_default:build",
            options=NoOptions,
            description="verl's default scorer: each row by the scorer verl picks for its data_source (gsm8k, math, math_dapo)",
        ),
        Component(
            name="exact_match",
            factory="rlcore_reward_rule.exact:build",
            options=ExactMatchOptions,
            description="the normalised response equals the ground truth (or one of a list)",
            default=True,  # the reward `rlcore init` writes
        ),
        Component(
            name="format",
            factory="rlcore_reward_rule.format:build",
            options=FormatOptions,
            description="the response matches a regular expression (e.g. think/answer tags)",
        ),
    ]
