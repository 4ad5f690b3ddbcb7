"""rlcore-algo-dapo: DAPO's pieces against hand computations, the conformance kits, and the plugin API."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlcore_algo_dapo import plugin
from rlcore_algo_dapo.shaping import informative_groups, overlong_penalty

from rlcore.errors import UsageError
from rlcore.interfaces import BuildContext, Prompt, Trajectory
from rlcore.testing import isolated_registry, register
from rlcore.testing.api import check_plugin_imports, describe_violations
from rlcore.testing.shaping import check_batch_filter, check_score_shaper

SRC = Path(__file__).resolve().parents[1] / "src"


def registry():
    reg = isolated_registry()
    register(reg, plugin, name="algo_dapo", distribution="rlcore-algo-dapo")
    return reg


def test_overlong_penalty_by_hand():
    # max 20, buffer 4: 0 up to 16, then -1/4 per token, -1 at 20 and beyond
    assert [overlong_penalty(n, 20, 4) for n in (1, 16, 17, 18, 19, 20, 25)] == [
        0,
        0,
        -0.25,
        -0.5,
        -0.75,
        -1,
        -1,
    ]
    assert overlong_penalty(18, 20, 4, factor=0.5) == -0.25
    assert overlong_penalty(20, 20, 0) == 0  # off


def test_informative_groups_by_hand():
    scores = [1, 1, 0, 1, 0, 0, 0.5, 0.5000001]
    assert informative_groups(scores, 2) == [1, 3]
    assert informative_groups(scores, 4) == [0, 1]
    assert informative_groups([1, 1, 1], 1) == []
    with pytest.raises(ValueError, match="do not split into groups of 3"):
        informative_groups(scores, 3)


def _trajectory(length: int, finish: str) -> Trajectory:
    return Trajectory(
        prompt=Prompt(token_ids=[1], messages=[]),
        response_ids=[2] * length,
        response_mask=[1] * length,
        rollout_logprobs=[0.0] * length,
        finish_reason=finish,
    )


def test_components_by_hand():
    reg = registry()
    context = BuildContext(manifest={"data": {"max_response_tokens": 4}})
    overlong = reg.get("score_shaper", "overlong").build({"buffer": 2}, context)
    scores, metrics = overlong.shape(
        [_trajectory(2, "stop"), _trajectory(3, "stop"), _trajectory(4, "length")], [1.0] * 3
    )
    assert scores == [1.0, 0.5, 0.0] and metrics == {"reward/overlong_penalty/mean": -0.5}
    sampling = reg.get("batch_filter", "dynamic_sampling").build({"max_generation_rounds": 5}, context)
    assert sampling.max_rounds == 5 and sampling.select([], [1.0, 1.0, 0.0, 1.0], 2) == [1]
    masked = reg.get("batch_filter", "mask_truncated").build({}, context)
    keep, metrics = masked.loss_mask(
        [_trajectory(2, "stop"), _trajectory(4, "length"), _trajectory(4, "stop")]
    )
    assert keep == [True, False, True] and metrics == {"response_length/masked_truncated": 1 / 3}


def test_dynamic_sampling_filters_on_acc_or_on_the_penalised_score():
    """Two samples a prompt: group 0 both correct but penalised differently for their lengths
    (scores 0.5, 0.0), group 1 correct and wrong, group 2 both wrong. acc (the reward's, before
    the penalty) keeps group 1 alone; score keeps 0 and 1. A reward reporting no acc: its score."""
    component = registry().get("batch_filter", "dynamic_sampling")
    shaped = [0.5, 0.0, 1.0, 0.0, 0.0, 0.0]
    items = [
        {"acc": 1.0, "score": 1.0},
        {"acc": 1.0, "score": 1.0},
        {"acc": 1.0, "score": 1.0},
        {"acc": 0.0, "score": -1.0},
        {"acc": 0.0, "score": -1.0},
        {"acc": 0.0, "score": -1.0},
    ]
    by_acc, by_score = component.build({}), component.build({"metric": "score"})
    assert by_acc.reward_items and by_acc.metric == "acc"
    assert by_acc.select([], shaped, 2, reward_items=items) == [1]
    assert by_score.select([], shaped, 2, reward_items=items) == [0, 1]
    plain = [{"score": s} for s in (1.0, 1.0, 1.0, 0.0, 0.0, 0.0)]
    assert by_acc.select([], shaped, 2, reward_items=plain) == [1]
    with pytest.raises(
        UsageError,
        match=r"max_generation_rounds = 2 rounds of \[data\] gen_batch_size = 3 prompts "
        r"cannot fill a step of data.prompts_per_step = 8",
    ):
        component.build(
            {"max_generation_rounds": 2},
            BuildContext(manifest={"data": {"prompts_per_step": 8, "gen_batch_size": 3}}),
        )
    unlimited = component.build(
        {"max_generation_rounds": 0},
        BuildContext(manifest={"data": {"prompts_per_step": 8, "gen_batch_size": 3}}),
    )
    assert unlimited.max_rounds == 0 and unlimited.on_exhausted == "pad"


def test_the_overlong_buffer_must_fit_the_length():
    component = registry().get("score_shaper", "overlong")
    with pytest.raises(UsageError, match=r"buffer = 8 is longer than \[data\] max_response_tokens = 4"):
        component.build({"buffer": 8}, BuildContext(manifest={"data": {"max_response_tokens": 4}}))


@pytest.mark.parametrize(
    "name, options",
    [
        ("dynamic_sampling", {}),
        ("dynamic_sampling", {"max_generation_rounds": 1}),
        ("dynamic_sampling", {"max_generation_rounds": 0, "on_exhausted": "raise", "metric": "score"}),
        ("mask_truncated", {}),
    ],
)
def test_batch_filters_pass_their_kit(name, options):
    check_batch_filter(registry().get("batch_filter", name), options)


@pytest.mark.parametrize("options", [{"buffer": 1}, {"buffer": 4, "penalty": 0.5}])
def test_the_overlong_shaper_passes_its_kit(options):
    check_score_shaper(registry().get("score_shaper", "overlong"), options)


def test_the_plugin_uses_only_the_plugin_api():
    violations = check_plugin_imports(sorted(SRC.rglob("*.py")), own={"rlcore_algo_dapo"})
    assert not violations, describe_violations(violations)
