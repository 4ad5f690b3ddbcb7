"""The gsm8k reward: strict and flexible extraction, scores, and many hand-written responses."""

from __future__ import annotations

import pytest

from rlcore.interfaces import RewardInput, RewardResult
from rlcore_reward_rule.gsm8k import GSM8KReward, extract_answer
from rlcore_reward_rule.options import GSM8KOptions


def score(response: str, truth, **options) -> float:
    result = GSM8KReward(GSM8KOptions(**options))(RewardInput(response=response, ground_truth=truth))
    assert isinstance(result, RewardResult)
    return result.score


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7"),
        ("#### 1,234", "1234"),
        ("#### -5", "-5"),
        ("####42", None),  # verl's format: one space after "####"
        ("#### $18", None),
        ("#### 3.50", "3.50"),
        ("first #### 1 then #### 2", "2"),
        ("The answer is 7.", None),
        ("####", None),
        ("#### seven", None),
        ("", None),
        ("#### \u22123", None),
        ("#### 7" + " padding" * 50, None),  # beyond the last 300 characters
        ("#### 18.", "18."),
    ],
)
def test_strict_extraction(response, expected):
    assert extract_answer(response, "strict") == expected


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("The answer is 7.", "7"),
        ("3 + 4 = 7, so 7 apples", "7"),
        ("It costs $1,200 in total.", "1200"),
        ("1,2,3", "3"),
        ("-4 degrees", "-4"),
        ("0.5 of it", "0.5"),
        ("no digits here", None),
        ("#### 12", "12"),
        ("12 then 13.", "13"),
    ],
)
def test_flexible_extraction(response, expected):
    assert extract_answer(response, "flexible") == expected


@pytest.mark.parametrize(
    ("response", "truth", "method", "expected"),
    [
        ("... #### 72", "72", "strict", 1.0),
        ("... #### 72", 72, "strict", 1.0),
        ("... #### 72.00", "72", "strict", 0.0),  # verl compares the text
        ("... #### 72.00", "72", "flexible", 1.0),  # flexible compares numbers
        ("... #### 1,000", "1000", "strict", 1.0),
        ("... #### 1000", "1,000", "strict", 0.0),
        ("... #### 1000", "1,000", "flexible", 1.0),
        ("... #### 71", "72", "strict", 0.0),
        ("The answer is 72", "72", "strict", 0.0),  # no "####": strict gives nothing
        ("The answer is 72", "72", "flexible", 1.0),
        ("72 apples, minus 2 is 70", "72", "flexible", 0.0),  # the last number counts
        ("", "72", "flexible", 0.0),
        ("#### -3", "-3", "strict", 1.0),
        ("#### 3", "-3", "strict", 0.0),
    ],
)
def test_scores(response, truth, method, expected):
    assert score(response, truth, method=method) == expected


def test_format_and_correct_scores_follow_options():
    opts = {"correct_score": 2.0, "format_score": 0.1}
    assert score("#### 5", "5", **opts) == 2.0
    assert score("#### 6", "5", **opts) == 0.1  # an answer was given, but it is wrong
    assert score("five", "5", **opts) == 0.0  # no answer at all


def test_metrics_report_answer_found_and_correct():
    fn = GSM8KReward(GSM8KOptions())
    assert fn(RewardInput(response="#### 5", ground_truth="5")).metrics == {"answer_found": 1.0, "correct": 1.0}
    assert fn(RewardInput(response="#### 4", ground_truth="5")).metrics == {"answer_found": 1.0, "correct": 0.0}
    assert fn(RewardInput(response="nothing", ground_truth="5")).metrics == {"answer_found": 0.0, "correct": 0.0}


def test_needs_a_ground_truth():
    assert GSM8KReward(GSM8KOptions()).required_fields == {"ground_truth"}


def test_bad_method_is_rejected_by_options():
    with pytest.raises(Exception, match="strict"):
        GSM8KOptions(method="loose")
