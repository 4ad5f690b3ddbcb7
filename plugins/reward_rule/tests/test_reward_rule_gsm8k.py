"""The gsm8k reward: verl's strict and flexible scorers (verl/utils/reward_score/gsm8k.py at
b178a3cd), rlcore's numeric one, and many hand-written responses with their hand-computed answers."""

from __future__ import annotations

import pytest
from rlcore_reward_rule.gsm8k import GSM8KReward, extract_answer
from rlcore_reward_rule.options import GSM8KOptions

from rlcore.interfaces import Prompt, RewardInput, RewardResult


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


FILLER = " and that is all" * 20  # 320 characters without a digit


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        # verl's flexible: the last run of [-]digits/dots/commas in the last 300 characters, as written
        ("The answer is 7.", "7."),  # the full stop belongs to the number
        ("3 + 4 = 7, so 7 apples", "7"),
        ("It costs $1,200 in total.", "1,200"),  # commas kept; the lone final "." is skipped
        ("1,2,3", "1,2,3"),
        ("-4 degrees", "-4"),
        ("0.5 of it", "0.5"),
        ("no digits here", None),
        ("#### 12", "12"),
        ("12 then 13.", "13."),
        ("5 then .", "5"),  # a lone "." is not an answer
        ("a. b. c.", "."),  # only lone dots: verl's loop ends on the first one
        ("1.2.3", "1.2.3"),
        ("--5", "-5"),
        ("\u22125", "5"),  # a Unicode minus is not "-"
        ("The answer is 42" + FILLER, None),  # beyond the last 300 characters
        ("Answer: 72.00", "72.00"),
    ],
)
def test_flexible_extraction_is_verls(response, expected):
    assert extract_answer(response, "flexible") == expected


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
        ("\u22125", "-5"),
        ("The answer is 42" + FILLER, "42"),  # the whole response
    ],
)
def test_numeric_extraction(response, expected):
    assert extract_answer(response, "numeric") == expected


@pytest.mark.parametrize(
    ("response", "truth", "method", "expected"),
    [
        ("... #### 72", "72", "strict", 1.0),
        (
            "... #### 72",
            72,
            "strict",
            0.0,
        ),  # verl: "72" == 72 is false, a ground truth that is not text never matches
        ("... #### 72", " 72", "strict", 0.0),  # verl does not strip the ground truth
        ("... #### 72.00", "72", "strict", 0.0),  # verl compares the text
        ("... #### 1,000", "1000", "strict", 1.0),
        ("... #### 1000", "1,000", "strict", 0.0),
        ("... #### 71", "72", "strict", 0.0),
        ("The answer is 72", "72", "strict", 0.0),  # no "####": strict gives nothing
        ("#### -3", "-3", "strict", 1.0),
        ("#### 3", "-3", "strict", 0.0),
        # verl's flexible: text equality of the last number-like token of the last 300 characters
        ("The answer is 18.", "18", "flexible", 0.0),
        ("... #### 72.00", "72", "flexible", 0.0),
        ("It is 1,000", "1000", "flexible", 0.0),
        ("It is 1,000", "1,000", "flexible", 1.0),
        ("The answer is 42" + FILLER, "42", "flexible", 0.0),
        ("The answer is 72", 72, "flexible", 0.0),
        ("The answer is 72", "72", "flexible", 1.0),
        ("72 apples, minus 2 is 70", "72", "flexible", 0.0),  # the last number counts
        ("", "72", "flexible", 0.0),
        # numeric: the last number anywhere, by value
        ("The answer is 18.", "18", "numeric", 1.0),
        ("... #### 72.00", "72", "numeric", 1.0),
        ("It is 1,000", "1000", "numeric", 1.0),
        ("... #### 1000", "1,000", "numeric", 1.0),
        ("The answer is 42" + FILLER, "42", "numeric", 1.0),
        ("The answer is 72", 72, "numeric", 1.0),
        ("The answer is 72", "72", "numeric", 1.0),
        ("72 apples, minus 2 is 70", "72", "numeric", 0.0),
        ("", "72", "numeric", 0.0),
    ],
)
def test_scores(response, truth, method, expected):
    assert score(response, truth, method=method) == expected


@pytest.mark.parametrize(
    ("response", "method", "expected"),
    [
        (".", "flexible", 0.1),  # verl finds "." (an answer, wrong): format_score
        (".", "numeric", 0.0),  # no number at all
        ("#### 71", "strict", 0.1),
        ("71", "flexible", 0.1),
        ("no digits", "flexible", 0.0),
    ],
)
def test_format_score_goes_to_a_wrong_answer_that_was_found(response, method, expected):
    assert score(response, "72", method=method, format_score=0.1) == expected


def test_non_text_ground_truths_are_named_once_before_training(logged_warnings):
    rows = [
        Prompt(token_ids=[1], messages=[], ground_truth=t, index=i)
        for i, t in enumerate(["5", 72, " 9", "4"])
    ]
    GSM8KReward(GSM8KOptions(method="strict")).check_data(rows, "train.parquet")
    assert len(logged_warnings) == 1
    message = logged_warnings[0]
    assert (
        "'train.parquet'" in message and "2 row(s)" in message and "row 1" in message and "numeric" in message
    )
    logged_warnings.clear()
    GSM8KReward(GSM8KOptions(method="numeric")).check_data(rows, "train.parquet")  # compares numbers: fine
    GSM8KReward(GSM8KOptions(method="flexible")).check_data(rows[:1] + rows[3:], "train.parquet")
    assert logged_warnings == []


def test_format_and_correct_scores_follow_options():
    opts = {"correct_score": 2.0, "format_score": 0.1}
    assert score("#### 5", "5", **opts) == 2.0
    assert score("#### 6", "5", **opts) == 0.1  # an answer was given, but it is wrong
    assert score("five", "5", **opts) == 0.0  # no answer at all


def test_metrics_report_answer_found_and_correct():
    fn = GSM8KReward(GSM8KOptions())
    assert fn(RewardInput(response="#### 5", ground_truth="5")).metrics == {
        "answer_found": 1.0,
        "correct": 1.0,
    }
    assert fn(RewardInput(response="#### 4", ground_truth="5")).metrics == {
        "answer_found": 1.0,
        "correct": 0.0,
    }
    assert fn(RewardInput(response="nothing", ground_truth="5")).metrics == {
        "answer_found": 0.0,
        "correct": 0.0,
    }


def test_needs_a_ground_truth():
    assert GSM8KReward(GSM8KOptions()).required_fields == {"ground_truth"}


@pytest.fixture
def logged_warnings():
    from loguru import logger

    messages: list[str] = []
    handler = logger.add(lambda m: messages.append(m.record["message"]), level="WARNING")
    yield messages
    logger.remove(handler)


def test_bad_method_is_rejected_by_options():
    with pytest.raises(Exception, match="strict"):
        GSM8KOptions(method="loose")
