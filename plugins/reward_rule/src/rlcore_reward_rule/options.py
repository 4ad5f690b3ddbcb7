"""Manifest options of the rule rewards (kept apart from the scorers so listing them is cheap)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from rlcore.components import Options


class GSM8KOptions(Options):
    method: Literal["strict", "flexible", "numeric"] = Field(
        "strict",
        description='strict: verl\'s strict scorer (the last "#### N" in the last 300 characters, equal to the '
        "ground truth as text); flexible: verl's flexible scorer (the last number-like text in the last 300 "
        "characters, equal as text: 18. is not 18); numeric: the last number anywhere in the response, compared "
        "by value (72.00 is 72, 1,000 is 1000)",
    )
    correct_score: float = Field(1.0, ge=-100.0, le=100.0, description="score of a correct answer")
    format_score: float = Field(
        0.0, ge=-100.0, le=100.0, description="score of an answer that was found but is wrong"
    )


class MathOptions(Options):
    backend: Literal["auto", "builtin", "math_verify"] = Field(
        "auto",
        description="auto: the builtin normaliser, then math_verify when installed; "
        "builtin: the normaliser only; math_verify: require math-verify",
    )
    correct_score: float = Field(1.0, ge=-100.0, le=100.0, description="score of a correct boxed answer")
    format_score: float = Field(0.0, ge=-100.0, le=100.0, description="score of a boxed answer that is wrong")


class MathDapoOptions(Options):
    strict_box_verify: bool = Field(
        False,
        description="verl's strict mode: the last \\boxed{...} of the last 100 characters, equal to the ground truth "
        'as written; default: the text after the last "Answer:", normalised as Minerva does',
    )
    correct_score: float = Field(1.0, ge=-100.0, le=100.0, description="score of a correct answer (verl: 1)")
    incorrect_score: float = Field(
        -1.0, ge=-100.0, le=100.0, description="score of a wrong or missing answer (verl: -1)"
    )


class ExactMatchOptions(Options):
    case_sensitive: bool = Field(False, description="compare letter case too")
    strip: bool = Field(True, description="ignore leading and trailing whitespace")
    collapse_whitespace: bool = Field(True, description="treat any run of whitespace as one space")
    ignore_punctuation: bool = Field(False, description="drop punctuation before comparing")
    correct_score: float = Field(1.0, ge=-100.0, le=100.0)


class FormatOptions(Options):
    pattern: str = Field(
        r"<think>.*?</think>\s*<answer>.*?</answer>",
        min_length=1,
        description="a Python regular expression the response must match",
    )
    mode: Literal["fullmatch", "search"] = Field(
        "fullmatch", description="fullmatch: the whole (stripped) response; search: anywhere in it"
    )
    dotall: bool = Field(True, description="'.' also matches newlines")
    ignore_case: bool = False
    match_score: float = Field(1.0, ge=-100.0, le=100.0, description="score when the response matches")
    miss_score: float = Field(0.0, ge=-100.0, le=100.0, description="score when it does not")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return value


def graded_score(options: GSM8KOptions | MathOptions, correct: bool, found: bool) -> float:
    """The score of an answer-checking reward: correct, found but wrong, or no answer at all."""
    if correct:
        return options.correct_score
    return options.format_score if found else 0.0
