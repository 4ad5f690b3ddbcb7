"""The math reward: boxed-answer extraction, the builtin normaliser, and math_verify when installed."""

from __future__ import annotations

import pytest
from rlcore_reward_rule import math_answer
from rlcore_reward_rule.math_answer import MathReward
from rlcore_reward_rule.mathnorm import equivalent, last_boxed, normalise
from rlcore_reward_rule.options import MathOptions

from rlcore.errors import RlcoreError
from rlcore.interfaces import RewardInput


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is \\boxed{5}.", "5"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{1} and finally \\boxed{2}", "2"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed{x^{2}+1}", "x^{2}+1"),
        ("\\boxed{ 7 }", "7"),
        ("$\\boxed 9$", "9"),
        ("\\fbox{3}", "3"),
        ("no box here", None),
        ("\\boxed{unclosed", None),
        ("\\boxed{1} then \\boxed{2", None),  # the final answer is truncated
        ("", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


EQUIVALENT = [
    ("5", "5"),
    ("5.0", "5"),
    ("5.00", "5"),
    ("\\frac{1}{2}", "0.5"),
    ("\\dfrac{1}{2}", "\\frac{1}{2}"),
    ("\\tfrac{3}{4}", "0.75"),
    ("\\frac12", "\\frac{1}{2}"),
    ("\\frac1{2}", "1/2"),
    (".5", "0.5"),
    ("-\\frac{3}{4}", "-0.75"),
    ("\\frac{-3}{4}", "-0.75"),
    ("\\frac{6}{8}", "\\frac{3}{4}"),
    ("\\left( 1, 2 \\right)", "(1,2)"),
    ("5\\text{ cm}", "5"),
    ("5 \\mbox{ meters}", "5"),
    ("12 \\text{ dollars}", "12"),
    ("90^\\circ", "90"),
    ("90^{\\circ}", "90"),
    ("50\\%", "50"),
    ("\\$1,000", "1000"),
    ("1{,}000".replace("{,}", ","), "1000"),
    ("x = 3", "3"),
    ("\\sqrt2", "\\sqrt{2}"),
    ("2\\sqrt{2}", "2 \\sqrt{2}"),
    ("x^{2}+1", "x^2 + 1"),
    ("\\text{(B)}", "B"),
    ("(B)", "B"),
    ("\\displaystyle\\frac{1}{3}", "\\frac{1}{3}"),
    ("7.", "7"),
    ("\u22122", "-2"),
    ("-0", "0"),
]


@pytest.mark.parametrize(("a", "b"), EQUIVALENT)
def test_equivalent_forms_match(a, b):
    assert equivalent(a, b), (normalise(a), normalise(b))
    assert equivalent(b, a)


NOT_EQUIVALENT = [
    ("5", "6"),
    ("0.33", "\\frac{1}{3}"),  # no rounding: close is not equal
    ("\\frac{1}{2}", "\\frac{1}{3}"),
    ("x^2", "x^3"),
    ("5x", "5"),  # a variable is not a unit
    ("(1,2)", "(2,1)"),
    ("-5", "5"),
    ("", ""),
    ("B", "C"),
    ("\\sqrt{2}", "\\sqrt{3}"),
]


@pytest.mark.parametrize(("a", "b"), NOT_EQUIVALENT)
def test_different_answers_do_not_match(a, b):
    assert not equivalent(a, b)


def _reward(backend="builtin", **options) -> MathReward:
    return MathReward(MathOptions(backend=backend, **options))


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("Thus \\boxed{\\dfrac{1}{2}}.", "0.5", 1.0),
        ("Thus \\boxed{\\dfrac{1}{2}}.", "\\frac{1}{2}", 1.0),
        ("Thus \\boxed{3}.", "\\boxed{3}", 1.0),  # a ground truth with its own box
        ("\\boxed{4}", "5", 0.0),
        ("The answer is 5", "5", 0.0),  # no box: no answer
        ("\\boxed{5}", ["4", "5"], 1.0),  # any of several ground truths
        ("\\boxed{5}", 5, 1.0),
        ("\\boxed{}", "5", 0.0),
    ],
)
def test_scores_with_the_builtin_normaliser(response, truth, expected):
    assert _reward()(RewardInput(response=response, ground_truth=truth)).score == expected


def test_format_score_and_metrics():
    fn = _reward(correct_score=1.0, format_score=0.2)
    wrong = fn(RewardInput(response="\\boxed{4}", ground_truth="5"))
    assert wrong.score == 0.2 and wrong.metrics == {"boxed": 1.0, "correct": 0.0}
    none = fn(RewardInput(response="4", ground_truth="5"))
    assert none.score == 0.0 and none.metrics == {"boxed": 0.0, "correct": 0.0}
    right = fn(RewardInput(response="\\boxed{5}", ground_truth="5"))
    assert right.score == 1.0 and right.metrics == {"boxed": 1.0, "correct": 1.0}


def test_builtin_backend_never_uses_math_verify():
    assert _reward("builtin").math_verify is None
    # Symbolically equal, textually different: the builtin normaliser alone says no.
    assert (
        _reward("builtin")(RewardInput(response="\\boxed{\\sqrt{8}}", ground_truth="2\\sqrt{2}")).score == 0.0
    )


def test_math_verify_backend_without_the_package_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(math_answer, "_math_verify", lambda: None)
    with pytest.raises(RlcoreError, match="math-verify"):
        _reward("math_verify")
    assert _reward("auto").math_verify is None  # auto falls back to the normaliser


class TestWithMathVerify:
    @pytest.fixture(autouse=True)
    def _needs_math_verify(self):
        pytest.importorskip("math_verify")

    @pytest.mark.parametrize(
        ("response", "truth"),
        [
            ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}"),
            ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}"),
            ("\\boxed{(x+1)^2}", "x^2+2x+1"),
            ("\\boxed{\\pi/2}", "\\frac{\\pi}{2}"),
        ],
    )
    def test_symbolic_equivalence(self, response, truth):
        assert _reward("auto")(RewardInput(response=response, ground_truth=truth)).score == 1.0
        assert _reward("math_verify")(RewardInput(response=response, ground_truth=truth)).score == 1.0

    @pytest.mark.parametrize(
        ("response", "truth"),
        [("\\boxed{\\sqrt{8}}", "3"), ("\\boxed{x+1}", "x-1"), ("\\boxed{\\frac{1}{3}}", "0.33")],
    )
    def test_symbolic_difference(self, response, truth):
        assert _reward("auto")(RewardInput(response=response, ground_truth=truth)).score == 0.0
