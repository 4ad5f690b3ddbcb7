"""The ``verl`` reward: verl's default_compute_score table (verl/utils/reward_score/__init__.py at
b178a3cd) over this plugin's scorers, and the refusal of sources it has no scorer for."""

from __future__ import annotations

import pytest
from rlcore_reward_rule.verl_default import VerlDefaultReward, verl_route

from rlcore.errors import RlcoreError
from rlcore.interfaces import Prompt, RewardInput


@pytest.mark.parametrize(
    ("source", "scorer"),
    [
        ("openai/gsm8k", "gsm8k"),
        ("lighteval/MATH", "math"),
        ("DigitalLearningGmbH/MATH-lighteval", "math"),
        ("HuggingFaceH4/MATH-500", "math"),
        ("math", "math_dapo"),  # verl sends "math" to math_dapo, not to its math_reward
        ("math_dapo", "math_dapo"),
        ("math_dapo_reasoning", "math_dapo"),
        ("aime2024", "math_dapo"),  # any source starting with "aime"
        ("aime_2025_ii", "math_dapo"),
        ("AIME2024", None),  # the prefix is case-sensitive: verl raises
        ("numina_amc_aime", None),  # PRIME math: no scorer in rlcore
        ("codecontests", None),
        ("hiyouga/geometry3k", None),
        ("searchR1_nq", None),
        ("openai/gsm8k ", None),
        ("", None),
    ],
)
def test_each_source_goes_where_verl_sends_it(source, scorer):
    route = verl_route(source)
    assert (route.scorer if route else None) == scorer


def item(source, response, truth):
    return RewardInput(response=response, ground_truth=truth, data_source=source)


@pytest.mark.parametrize(
    ("source", "response", "truth", "expected"),
    [
        ("openai/gsm8k", "so #### 72", "72", 1.0),
        ("openai/gsm8k", "The answer is 72", "72", 0.0),  # verl's default gsm8k method is strict
        ("lighteval/MATH", "\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
        ("lighteval/MATH", "\\boxed{3}", "\\frac{1}{2}", 0.0),
        ("math", "Answer: 5", "5", 1.0),
        ("math", "\\boxed{5}", "5", -1.0),  # math_dapo wants "Answer:", and scores a miss -1
        ("aime2024", "Answer: 204", "204", 1.0),
        ("aime2024", "Answer: 203", "204", -1.0),
    ],
)
def test_scores_follow_the_routed_scorer(source, response, truth, expected):
    assert VerlDefaultReward()(item(source, response, truth)).score == expected


def test_math_dapo_rows_report_acc():
    assert VerlDefaultReward()(item("math_dapo", "Answer: 5", "5")).metrics["acc"] == 1.0


def rows(*sources):
    return [
        Prompt(token_ids=[1], messages=[], data_source=s, ground_truth="1", index=i)
        for i, s in enumerate(sources)
    ]


def test_scorable_data_passes_the_check():
    VerlDefaultReward().check_data(
        rows("openai/gsm8k", "math", "aime2024", "lighteval/MATH"), "train.parquet"
    )


@pytest.mark.parametrize(
    ("source", "phrases"),
    [
        (
            "codecontests",
            ["verl.utils.reward_score.sandbox_fusion or prime_code", "which rlcore has no scorer for"],
        ),
        ("numina_cn_k12", ["verl.utils.reward_score.prime_math"]),
        ("openai/gsm8K", ["not in verl's default scorer's table", "did you mean 'openai/gsm8k'?"]),
        ("my_source", ["not in verl's default scorer's table, where verl raises NotImplementedError"]),
    ],
)
def test_a_source_without_a_scorer_is_refused_naming_the_row_and_what_exists(source, phrases):
    with pytest.raises(RlcoreError) as info:
        VerlDefaultReward().check_data(rows("openai/gsm8k", "openai/gsm8k", source), "train.parquet")
    text = str(info.value)
    assert text.startswith("data 'train.parquet': row 2: ")
    for phrase in [
        *phrases,
        'openai/gsm8k (gsm8k, method "strict")',
        "aime* (math_dapo)",
        "HuggingFaceH4/MATH-500",
        f'[reward.routes."{source}"]',
    ]:
        assert phrase in text, (phrase, text)


def test_an_unscorable_row_made_elsewhere_raises_when_scored():
    with pytest.raises(ValueError, match="'codecontests'"):
        VerlDefaultReward()(item("codecontests", "x", "1"))


def test_the_trainers_data_check_refuses_an_unscorable_source_unless_a_route_scores_it():
    """What the trainer runs on every data set before training (rlcore.trainer.scoring): the
    ``verl`` reward alone, and as the default of ``[reward.routes]``."""
    from rlcore.trainer.scoring import RoutedReward, check_reward_data

    data = rows("openai/gsm8k", "codecontests")
    with pytest.raises(RlcoreError, match="row 1: data_source 'codecontests'"):
        check_reward_data(VerlDefaultReward(), data, "train.parquet")
    routed = RoutedReward({"codecontests": lambda item: 0.0}, default=VerlDefaultReward())
    routed.check_data(data, "train.parquet")
    with pytest.raises(RlcoreError, match="row 2: data_source 'taco'"):
        routed.check_data(data + rows("x", "y", "taco")[2:], "train.parquet")
