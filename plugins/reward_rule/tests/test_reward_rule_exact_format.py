"""The exact_match and format rewards."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from rlcore_reward_rule.exact import ExactMatchReward
from rlcore_reward_rule.format import FormatReward
from rlcore_reward_rule.options import ExactMatchOptions, FormatOptions

from rlcore.interfaces import RewardInput


def exact(response, truth, **options) -> float:
    return ExactMatchReward(ExactMatchOptions(**options))(
        RewardInput(response=response, ground_truth=truth)
    ).score


@pytest.mark.parametrize(
    ("response", "truth", "options", "expected"),
    [
        ("Paris", "Paris", {}, 1.0),
        ("  Paris\n", "Paris", {}, 1.0),
        ("paris", "Paris", {}, 1.0),
        ("paris", "Paris", {"case_sensitive": True}, 0.0),
        ("  Paris", "Paris", {"strip": False}, 0.0),
        ("New   York", "new york", {}, 1.0),
        ("New   York", "New York", {"collapse_whitespace": False}, 0.0),
        ("Paris.", "Paris", {}, 0.0),
        ("Paris.", "Paris", {"ignore_punctuation": True}, 1.0),
        ("8", "8", {}, 1.0),
        ("8", 8, {}, 1.0),
        ("8 ", ["7", "8"], {}, 1.0),
        ("9", ["7", "8"], {}, 0.0),
        ("", "Paris", {}, 0.0),
        ("", "", {}, 1.0),
        ("Paris", None, {}, 0.0),
        ("STRASSE", "straße", {}, 1.0),  # casefold, not lower
    ],
)
def test_exact_match(response, truth, options, expected):
    assert exact(response, truth, **options) == expected


def test_exact_match_correct_score_and_metric():
    fn = ExactMatchReward(ExactMatchOptions(correct_score=3.0))
    result = fn(RewardInput(response="a", ground_truth="A"))
    assert result.score == 3.0 and result.metrics == {"correct": 1.0}


def fmt(response, **options) -> float:
    return FormatReward(FormatOptions(**options))(RewardInput(response=response)).score


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("<think>add them</think><answer>8</answer>", 1.0),
        ("<think>line one\nline two</think>\n<answer>8</answer>\n", 1.0),
        ("  <think>x</think> <answer>8</answer>  ", 1.0),
        ("<answer>8</answer>", 0.0),
        ("<think>x</think>", 0.0),
        ("<think>x</think><answer>8</answer> trailing words", 0.0),
        ("prefix <think>x</think><answer>8</answer>", 0.0),
        ("", 0.0),
    ],
)
def test_format_default_pattern_fullmatch(response, expected):
    assert fmt(response) == expected


def test_format_search_mode_and_flags():
    assert fmt("prefix <answer>8</answer> suffix", pattern=r"<answer>\d+</answer>", mode="search") == 1.0
    assert fmt("<ANSWER>8</ANSWER>", pattern=r"<answer>\d+</answer>") == 0.0
    assert fmt("<ANSWER>8</ANSWER>", pattern=r"<answer>\d+</answer>", ignore_case=True) == 1.0
    assert fmt("<a>1\n2</a>", pattern=r"<a>.*</a>", dotall=False) == 0.0
    assert fmt("<a>1\n2</a>", pattern=r"<a>.*</a>") == 1.0


def test_format_scores_and_metric():
    fn = FormatReward(FormatOptions(pattern="yes", match_score=0.5, miss_score=-0.5))
    assert fn(RewardInput(response="yes")).score == 0.5
    miss = fn(RewardInput(response="no"))
    assert miss.score == -0.5 and miss.metrics == {"format_ok": 0.0}
    assert fn.required_fields == frozenset()


def test_bad_regex_is_rejected_when_validating_options():
    with pytest.raises(ValidationError, match="not a valid regular expression"):
        FormatOptions(pattern="<think>(unclosed")
