"""The actor's objective as one pure function (rlcore.algorithms.objective), and the one
aggregation (per-token weights), checked against hand computations."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from rlcore.algorithms import (  # noqa: E402
    ObjectiveInput,
    ObjectiveOptions,
    aggregate,
    build_ppo_clip,
    policy_objective,
    token_weights,
)
from rlcore.builtin.options import PPOClipOptions  # noqa: E402


def close(actual, expected, tol=1e-6):
    return torch.allclose(
        torch.as_tensor(actual).float(), torch.as_tensor(expected, dtype=torch.float32), atol=tol, rtol=tol
    )


MASK = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])  # lengths 2, 4, 0


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", [[1 / 6] * 2 + [0] * 2, [1 / 6] * 4]),  # 6 tokens
        ("seq-mean-token-sum", [[1 / 2] * 2 + [0] * 2, [1 / 2] * 4]),  # 2 sequences with tokens
        ("seq-mean-token-mean", [[1 / 4] * 2 + [0] * 2, [1 / 8] * 4]),  # 1 / (2 * length)
        (
            "seq-mean-token-sum-norm",
            [[1 / 20] * 2 + [0] * 2, [1 / 20] * 4],
        ),  # 1 / (2 * 10), 10 = the constant length
    ],
)
def test_token_weights_by_hand(mode, expected):
    weights = token_weights(MASK, mode, norm_length=10)
    assert close(weights[:2], expected) and torch.equal(weights[2], torch.zeros(4))


def test_sum_norm_without_a_length_divides_by_the_width_and_totals_span_the_mini_batch():
    assert close(token_weights(MASK, "seq-mean-token-sum-norm")[1], [1 / 8] * 4)  # 2 sequences x width 4
    # Half of a mini-batch of 5 sequences: the divisor is the whole mini-batch's.
    assert close(
        token_weights(MASK[1:2], "seq-mean-token-sum-norm", totals=(20.0, 5.0), norm_length=10),
        [[1 / 50] * 4],
    )


def test_aggregate_uses_the_same_weights():
    loss = torch.tensor([[1.0, 3.0, float("nan"), 0.0], [2.0, 2.0, 2.0, 2.0], [5.0, 5.0, 5.0, 5.0]])
    # Dr. GRPO: token sums 4 and 8, over 2 sequences x length 10.
    assert close(aggregate(loss, MASK, "seq-mean-token-sum-norm", norm_length=10), 12 / 20)
    assert close(aggregate(loss, MASK, "token-mean"), 12 / 6)
    assert close(aggregate(loss, MASK, "seq-mean-token-mean"), (2 + 2) / 2)


def _inputs(**changes):
    """Two sequences of two tokens, the current policy equal to the old one (ratio 1)."""
    old = torch.tensor([[-1.0, -2.0], [-0.5, -1.0]])
    base = dict(
        logprobs=old.clone().requires_grad_(True),
        old_logprobs=old,
        advantages=torch.tensor([[1.0, 1.0], [-2.0, -2.0]]),
        response_mask=torch.ones(2, 2),
        token_weights=torch.full((2, 2), 0.25),  # token-mean over these 4 tokens
        rollout_logprobs=old.clone(),
        ref_logprobs=old - 0.5,  # the policy is 0.5 above the reference on every token
        entropy=torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
    )
    base.update(changes)
    return ObjectiveInput(**base)


PPO = build_ppo_clip(PPOClipOptions())


def test_objective_by_hand_policy_entropy_and_kl():
    batch = _inputs()
    options = ObjectiveOptions(entropy_coef=0.1, kl_coef=0.2, kl_estimator="k1")
    loss, metrics = policy_objective(PPO, batch, options)
    # pg per token = -A (ratio 1): mean = (-1 - 1 + 2 + 2) / 4 = 0.5; entropy mean 2.5; k1 KL = 0.5
    assert close(metrics["actor/pg_loss"], 0.5)
    assert close(metrics["actor/entropy"], 2.5)
    assert close(metrics["actor/kl_loss"], 0.5)
    assert close(loss, 0.5 - 0.1 * 2.5 + 0.2 * 0.5)
    assert close(metrics["actor/pg_clipfrac"], 0.0) and close(metrics["actor/ppo_kl"], 0.0)
    loss.backward()
    # d/dlogp: -A * ratio * w + kl_coef * w (k1 = logp - ref); entropy is a constant here
    assert close(batch.logprobs.grad, [[(-1 + 0.2) / 4] * 2, [(2 + 0.2) / 4] * 2])


def test_kl_in_the_reward_leaves_the_kl_term_out():
    algo = SimpleNamespace(
        loss_agg_mode="token-mean",
        entropy_coef=0.0,
        kl_coef=0.2,
        kl_in_reward=True,
        kl_estimator="k1",
        rollout_correction="none",
        rollout_is_threshold=2.0,
        rollout_is_threshold_lower=None,
    )
    options = ObjectiveOptions.from_algorithm(algo, PPO)
    loss, metrics = policy_objective(PPO, _inputs(ref_logprobs=None), options)
    assert "actor/kl_loss" not in metrics and close(loss, 0.5)


def test_rollout_correction_weighs_the_policy_loss():
    # The engine's log-probs sit log(3) below the trainer's on sequence 0: ratio 3, truncated at 2.
    old = torch.tensor([[-1.0, -2.0], [-0.5, -1.0]])
    rollout = old - torch.tensor([[math.log(3.0)] * 2, [0.0, 0.0]])
    batch = _inputs(rollout_logprobs=rollout, ref_logprobs=None, entropy=None)
    options = ObjectiveOptions(rollout_correction="token_truncate", rollout_is_threshold=2.0)
    loss, metrics = policy_objective(PPO, batch, options)
    # pg: -1 * 2 (truncated) twice, +2 * 1 twice, each weighted 1/4
    assert close(loss, (-2 - 2 + 2 + 2) / 4)
    assert close(metrics["rollout_corr/truncated_fraction"], 0.5)  # times the share, 1
    assert close(metrics["rollout_corr/weight/mean"], (2 + 2 + 1 + 1) / 4)


def test_metrics_of_micro_batches_add_up_to_the_mini_batch():
    whole = _inputs(entropy=None, ref_logprobs=None)
    _, full = policy_objective(PPO, whole, ObjectiveOptions())
    parts = [
        policy_objective(
            PPO,
            ObjectiveInput(
                logprobs=whole.logprobs[i : i + 1],
                old_logprobs=whole.old_logprobs[i : i + 1],
                advantages=whole.advantages[i : i + 1],
                response_mask=whole.response_mask[i : i + 1],
                token_weights=whole.token_weights[i : i + 1],
                rollout_logprobs=whole.rollout_logprobs[i : i + 1],
            ),
            ObjectiveOptions(),
        )[1]
        for i in range(2)
    ]
    for key in full:
        assert close(parts[0][key] + parts[1][key], full[key]), key


def test_options_refuse_an_unknown_aggregation_and_a_missing_input():
    with pytest.raises(ValueError, match="token-sum"):
        ObjectiveOptions(loss_agg_mode="token-sum")
    with pytest.raises(ValueError, match="reference"):
        policy_objective(PPO, _inputs(ref_logprobs=None), ObjectiveOptions(kl_coef=0.1))
