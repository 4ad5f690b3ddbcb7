"""GSPO: the sequence-level ratio, its clipping, and that the token-level form has the
sequence-level objective's gradient."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from rlcore_algo_grpo import plugin  # noqa: E402
from rlcore_algo_grpo.gspo import gspo_loss, sequence_log_ratio  # noqa: E402

from rlcore.algorithms import aggregate  # noqa: E402
from rlcore.interfaces import PolicyLossInput  # noqa: E402
from rlcore.testing import isolated_registry, register  # noqa: E402
from rlcore.testing.algorithms import check_policy_loss  # noqa: E402

NAN = float("nan")


def close(actual, expected, tol=1e-5):
    return torch.allclose(actual.float(), torch.as_tensor(expected, dtype=torch.float32), atol=tol, rtol=tol)


def gspo_component():
    registry = isolated_registry()
    register(registry, plugin, name="algo_grpo", distribution="rlcore-algo-grpo")
    return registry.get("policy_loss", "gspo")


def hand_batch() -> PolicyLossInput:
    # Row 0: token log-ratios 0.1, 0.3 -> mean 0.2 -> s = e^0.2 = 1.22140
    # Row 1: log-ratios 0.1, -0.1 and a padded token (garbage) -> mean 0 -> s = 1
    old = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, -1.5, 0.0]])
    log_r = torch.tensor([[0.1, 0.3, 0.0], [0.1, -0.1, 9.0]])
    return PolicyLossInput(
        logprobs=(old + log_r).requires_grad_(True),
        old_logprobs=old,
        advantages=torch.tensor([[1.0, 1.0, 0.0], [2.0, 2.0, NAN]]),
        response_mask=torch.tensor([[1, 1, 0], [1, 1, 0]]),
    )


def test_sequence_ratio_by_hand():
    b = hand_batch()
    assert close(sequence_log_ratio(b.logprobs, b.old_logprobs, b.response_mask), [0.2, 0.0])


def test_gspo_by_hand_clipped_and_unclipped():
    b = hand_batch()
    loss, metrics = gspo_loss(b, clip_ratio_low=0.2, clip_ratio_high=0.2)
    # row 0: A=1, s=1.2214 > 1.2 -> max(-1.2214, -1.2) = -1.2 on both tokens (clipped)
    # row 1: A=2, s=1 -> -2 on both tokens; padded token 0
    assert close(loss, [[-1.2, -1.2, 0.0], [-2.0, -2.0, 0.0]])
    assert close(metrics["pg_clipfrac"], 0.5)  # 2 of 4 tokens
    assert close(metrics["gspo/seq_ratio_mean"], (math.exp(0.2) + 1) / 2)
    # ppo_kl = mean(old - new) over 4 tokens = -(0.1 + 0.3 + 0.1 - 0.1) / 4 = -0.1
    assert close(metrics["ppo_kl"], -0.1)
    loss.sum().backward()
    # clipped row: no gradient; row 1: d(-A * s_it)/dlogp_t = -A * s = -2 per token
    assert close(b.logprobs.grad, [[0.0, 0.0, 0.0], [-2.0, -2.0, 0.0]])


def test_gspo_default_ranges_are_tiny():
    b = hand_batch()
    loss, metrics = gspo_component().build({})(b)
    # defaults: 1 - 3e-4 .. 1 + 4e-4. Row 0 (s = 1.2214) is clipped at 1.0004; row 1 (s = 1) is not
    assert close(loss[0, :2], [-1.0004, -1.0004]) and close(loss[1, :2], [-2.0, -2.0])
    assert close(metrics["pg_clipfrac"], 0.5)


def _sequence_objective(logprobs, old, adv_per_seq, mask, low, high):
    """GSPO written directly at the sequence level: mean_i max(-A_i s_i, -A_i clip(s_i))."""
    s = torch.exp(((logprobs - old) * mask).sum(-1) / mask.sum(-1))
    return torch.maximum(-adv_per_seq * s, -adv_per_seq * s.clamp(1 - low, 1 + high)).mean()


@pytest.mark.parametrize("low, high", [(0.5, 0.5), (0.05, 0.08)])
def test_token_form_gradient_matches_the_sequence_objective(low, high):
    g = torch.Generator().manual_seed(3)
    mask = torch.tensor(
        [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [1, 0, 1, 1, 0]], dtype=torch.float32
    )
    old = -torch.rand(mask.shape, generator=g) * 2
    new = old + 0.2 * torch.randn(mask.shape, generator=g)
    adv_seq = torch.tensor([1.0, -1.5, 0.5, -0.3])

    token_lp = new.clone().requires_grad_(True)
    loss, _ = gspo_loss(PolicyLossInput(token_lp, old, adv_seq[:, None] * mask, mask), low, high)
    aggregate(loss, mask, "seq-mean-token-mean").backward()

    seq_lp = new.clone().requires_grad_(True)
    _sequence_objective(seq_lp, old, adv_seq, mask, low, high).backward()
    assert torch.allclose(token_lp.grad, seq_lp.grad, atol=1e-6)
    if (low, high) == (0.05, 0.08):  # some sequences are clipped: their gradient is 0 in both
        s = torch.exp(sequence_log_ratio(new, old, mask))
        assert ((s < 0.95) | (s > 1.08)).any()


def test_gspo_all_zero_mask_and_determinism():
    b = hand_batch()
    empty = PolicyLossInput(b.logprobs, b.old_logprobs, b.advantages, torch.zeros(2, 3))
    loss, metrics = gspo_loss(empty)
    assert torch.equal(loss, torch.zeros(2, 3)) and all(torch.isfinite(v) for v in metrics.values())
    aggregate(loss, empty.response_mask, "seq-mean-token-mean").backward()
    assert torch.equal(b.logprobs.grad, torch.zeros(2, 3))
    first, _ = gspo_loss(hand_batch())
    second, _ = gspo_loss(hand_batch())
    assert torch.equal(first, second)


@pytest.mark.parametrize("options", [{}, {"clip_ratio_low": 0.2, "clip_ratio_high": 0.3}])
def test_gspo_conformance(options):
    check_policy_loss(gspo_component(), options)


def test_gspo_options_rejected():
    with pytest.raises(Exception, match="clip_ratio_low"):
        gspo_component().options.model_validate({"clip_ratio_low": -1})
    with pytest.raises(Exception, match="extra"):
        gspo_component().options.model_validate({"clip_ratio": 0.2})


# ----------------------------------------------------------------------------- as verl defines it


def test_gspo_clamps_the_log_ratio_at_10_with_its_gradient():
    # A sequence whose log-ratio is 12, negative advantage: verl's clamp at 10 takes the gradient
    # term along, so the loss is A-scaled e^10 and the gradient 0 (before: e^12, and a gradient of e^12).
    old = torch.tensor([[-20.0, -20.0]])
    batch = PolicyLossInput(
        logprobs=(old + 12.0).requires_grad_(True),
        old_logprobs=old,
        advantages=torch.tensor([[-1.0, -1.0]]),
        response_mask=torch.ones(1, 2),
    )
    loss, metrics = gspo_loss(batch, clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert close(loss, [[math.exp(10.0)] * 2], tol=1e-4)
    assert close(metrics["gspo/seq_ratio_mean"], math.exp(10.0), tol=1e-4)
    loss.sum().backward()
    assert torch.equal(batch.logprobs.grad, torch.zeros(1, 2))
    # Below the cap the gradient is there: log-ratio 9.
    below = PolicyLossInput(
        logprobs=(old + 9.0).requires_grad_(True),
        old_logprobs=old,
        advantages=torch.tensor([[-1.0, -1.0]]),
        response_mask=torch.ones(1, 2),
    )
    gspo_loss(below, 0.2, 0.2)[0].sum().backward()
    assert close(below.logprobs.grad, [[math.exp(9.0)] * 2], tol=1e-4)


def test_gspo_aggregates_by_seq_mean_token_mean_whatever_loss_agg_mode_says():
    from types import SimpleNamespace

    from rlcore.algorithms import ObjectiveInput, ObjectiveOptions, policy_objective, token_weights

    loss_fn = gspo_component().build({"clip_ratio_low": 0.5, "clip_ratio_high": 0.5})
    algo = SimpleNamespace(
        loss_agg_mode="token-mean",
        entropy_coef=0.0,
        kl_coef=0.0,
        kl_in_reward=False,
        kl_estimator="k3",
        rollout_correction="none",
        rollout_is_threshold=2.0,
        rollout_is_threshold_lower=None,
    )
    options = ObjectiveOptions.from_algorithm(algo, loss_fn)
    assert options.loss_agg_mode == "seq-mean-token-mean"
    # Sequence 0 has one token, sequence 1 three; ratios 1, advantage 1 on every token.
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    old = torch.full((2, 3), -1.0)
    logprobs = old.clone().requires_grad_(True)
    loss, _ = policy_objective(
        loss_fn,
        ObjectiveInput(
            logprobs=logprobs,
            old_logprobs=old,
            advantages=mask.clone(),
            response_mask=mask,
            token_weights=token_weights(mask, options.loss_agg_mode),
            rollout_logprobs=old,
        ),
        options,
    )
    loss.backward()
    # The sequence objective: -mean_i s_i, d/dlogp_t = -s_i / (2 * len_i): -1/2 for sequence 0's
    # token, -1/6 for each of sequence 1's (token-mean would give -1/4 each).
    assert close(logprobs.grad, [[-0.5, 0.0, 0.0], [-1 / 6] * 3])
    follows = gspo_component().build({"gspo_follow_loss_agg_mode": True})
    assert ObjectiveOptions.from_algorithm(algo, follows).loss_agg_mode == "token-mean"
