"""The math_dapo reward against verl's definition (verl/utils/reward_score/math_dapo.py at
b178a3cd): each case's score worked out by hand from that file's steps."""

from __future__ import annotations

import pytest
from rlcore_reward_rule.math_dapo import MathDapoReward, extract_answer, normalise
from rlcore_reward_rule.options import MathDapoOptions

from rlcore.interfaces import RewardInput


def judged(response: str, truth, **options) -> tuple[float, dict]:
    result = MathDapoReward(MathDapoOptions(**options))(RewardInput(response=response, ground_truth=truth))
    return result.score, result.metrics


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("42", "42"),
        (" 1,000 ", "1000"),  # a comma-grouped integer loses its commas
        ("1,2", "12"),  # ... any digits-and-commas text does
        ("1,000.5", "1,000.5"),  # not a digit string without its commas: kept
        ("x = 5", "5"),  # the part after the last "="
        ("5 dollars", "5"),  # spaces go first, then the unit words
        ("12 cm", "12"),
        ("10^\\circ", "10"),
        ("$\\frac12$", "\\frac{1}{2}"),  # the first $...$ span, then \frac shorthand
        ("\\sqrt2", "\\sqrt{2}"),
        ("\\text{(A)}", "(A)"),
        ("\\boxed{7}", "7"),
        ("a cat", "cat"),  # "a " is an article
        ("\\$12", "12"),
        ("5.", "5."),  # a trailing full stop stays (only ".$" loses its dot)
        ("0.5", "0.5"),  # no numeric equivalence: 0.5 is not \frac{1}{2}
        ("2\\;3", "23"),
    ],
)
def test_normalise_is_minervas(answer, expected):
    assert normalise(answer) == expected


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("Answer: 42", "42"),
        ("answer : 42", "42"),  # any case, spaces around the colon
        ("ANSWER:42", "42"),
        ("Answer:\n42", "42"),  # the spaces after the colon may hold a line break
        ("Answer: 4\nAnswer: 5", "5"),  # the last one
        ("Answer: 7 is my answer.\nDone", "7 is my answer."),  # up to the end of the line
        ("The answer is 42", None),
        ("x" * 400 + "Answer: 3", "3"),
        ("Answer: 3" + "y" * 300, None),  # beyond the last 300 characters
    ],
)
def test_the_answer_follows_the_last_answer_colon(response, expected):
    assert extract_answer(response) == expected


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("Answer: 42", "42", 1.0),
        ("Answer: 41", "42", -1.0),
        ("The answer is 42", "42", -1.0),  # no "Answer:": -1, like a wrong one
        ("Answer: 1,000", "1000", 1.0),
        ("Answer: $\\frac12$", "\\frac{1}{2}", 1.0),
        ("Answer: 0.5", "\\frac{1}{2}", -1.0),
        ("Answer: 5.", "5", -1.0),
        ("Answer: 5 dollars", "5", 1.0),
        ("Answer: 4\nAnswer: 5", "4", -1.0),
        ("\\boxed{42}", "42", -1.0),  # a box is not an "Answer:"
        ("Answer: 3" + "y" * 300, "3", -1.0),
        ("Answer: 17", 17, 1.0),  # an integer ground truth compares by its text (verl's scorer fails on it)
        ("", "[INVALID]", 1.0),  # verl's placeholder for "no answer" normalises like any text
    ],
)
def test_scores_are_plus_or_minus_one(response, truth, expected):
    score, metrics = judged(response, truth)
    assert score == expected
    assert metrics["acc"] == (1.0 if expected == 1.0 else 0.0)


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("so \\boxed{42}", "42", 1.0),
        ("\\boxed{4} and \\boxed{42}", "42", 1.0),  # the last box
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),  # nested braces
        ("\\boxed{ 42}", "42", -1.0),  # not normalised: " 42" is not "42"
        ("\\boxed{42", "42", -1.0),  # never closes
        ("\\boxed{42}" + "z" * 120, "42", -1.0),  # outside the last 100 characters
        ("Answer: 42", "42", -1.0),  # no box
    ],
)
def test_strict_box_verify(response, truth, expected):
    score, metrics = judged(response, truth, strict_box_verify=True)
    assert score == expected and metrics["acc"] == float(expected == 1.0)


def test_metrics_and_scores_follow_options():
    assert judged("Answer: 3", "3") == (1.0, {"acc": 1.0, "answer_found": 1.0})
    assert judged("Answer: 2", "3") == (-1.0, {"acc": 0.0, "answer_found": 1.0})
    assert judged("three", "3") == (-1.0, {"acc": 0.0, "answer_found": 0.0})
    assert judged("Answer: 2", "3", correct_score=1.0, incorrect_score=0.0)[0] == 0.0
