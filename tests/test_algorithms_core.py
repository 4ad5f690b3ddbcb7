"""rlcore.algorithms: masked reductions, aggregation, KL, entropy, TIS, ppo_clip, returns, value loss."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from rlcore.algorithms import (  # noqa: E402
    aggregate,
    correction_weights,
    credit_masked_rewards,
    discounted_returns,
    entropy_from_logits,
    group_stats,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    masked_var,
    masked_whiten,
)
from rlcore.algorithms.losses import build_ppo_clip, ppo_clip_loss  # noqa: E402
from rlcore.algorithms.value import clipped_value_loss  # noqa: E402
from rlcore.builtin.options import PPOClipOptions  # noqa: E402
from rlcore.interfaces import PolicyLossInput  # noqa: E402
from rlcore.testing import isolated_registry  # noqa: E402
from rlcore.testing.algorithms import check_policy_loss  # noqa: E402

NAN = float("nan")


def close(actual, expected, tol=1e-5):
    return torch.allclose(
        torch.as_tensor(actual, dtype=torch.float32),
        torch.as_tensor(expected, dtype=torch.float32),
        atol=tol,
        rtol=tol,
    )


# ----------------------------------------------------------------------------- masked helpers


def test_masked_mean_var_whiten_ignore_masked_positions():
    x = torch.tensor([[1.0, 2.0, NAN], [3.0, float("inf"), 6.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 1]])
    # valid: 1, 2, 3, 6 -> mean 3; deviations -2 -1 0 3 -> squares 4 1 0 9 = 14; unbiased var 14/3
    assert close(masked_mean(x, m), 3.0)
    assert close(masked_mean(x, m, dim=-1), [1.5, 4.5])
    assert close(masked_var(x, m), 14 / 3)
    w = masked_whiten(x, m)
    std = math.sqrt(14 / 3)
    assert close(w, [[-2 / std, -1 / std, 0.0], [0.0, 0.0, 3 / std]])


def test_masked_helpers_on_empty_masks_are_zero():
    x = torch.tensor([[1.0, NAN]])
    m = torch.zeros(1, 2)
    assert masked_mean(x, m).item() == 0.0
    assert masked_var(x, m).item() == 0.0
    assert torch.equal(masked_whiten(x, m), torch.zeros(1, 2))
    # a single valid value has no spread: var 0, whitened 0
    one = torch.tensor([[1, 0]])
    assert masked_var(x, one).item() == 0.0
    assert torch.equal(masked_whiten(x, one), torch.zeros(1, 2))


LOSS = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]
MASK = [[1, 1, 0], [1, 0, 0], [0, 0, 0]]  # the last row has no token and must not count


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", 3.5),  # ((1 + 2) + 4) / 2 sequences
        ("seq-mean-token-mean", 2.75),  # ((1 + 2) / 2 + 4 / 1) / 2 sequences
    ],
)
def test_aggregate_modes(mode, expected):
    loss = torch.tensor(LOSS, requires_grad=True)
    mask = torch.tensor(MASK)
    out = aggregate(loss, mask, mode)
    assert close(out, expected)
    out.backward()
    assert loss.grad[mask == 0].abs().sum() == 0  # masked tokens get no gradient
    if mode == "token-mean":
        assert close(loss.grad[mask == 1], [1 / 3] * 3)
    if mode == "seq-mean-token-mean":
        assert close(loss.grad[mask == 1], [0.25, 0.25, 0.5])  # 1/2 * 1/2, 1/2 * 1/2, 1/2 * 1


def test_aggregate_normalizer_replaces_the_local_divisor():
    loss, mask = torch.tensor(LOSS), torch.tensor(MASK)
    assert close(aggregate(loss, mask, "token-mean", normalizer=10), 0.7)  # 7 / 10
    assert close(aggregate(loss, mask, "seq-mean-token-sum", normalizer=4), 1.75)  # 7 / 4


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_aggregate_all_zero_mask_gives_zero_with_grad(mode):
    loss = torch.tensor([[NAN, 1.0], [float("inf"), 2.0]], requires_grad=True)
    out = aggregate(loss, torch.zeros(2, 2), mode)
    assert out.item() == 0.0 and out.requires_grad
    out.backward()
    assert torch.equal(loss.grad, torch.zeros(2, 2))


def test_aggregate_rejects_unknown_mode():
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(torch.ones(1, 1), torch.ones(1, 1), "token-sum")


# ----------------------------------------------------------------------------- KL


@pytest.mark.parametrize(
    "logp, ref, k1, k2, k3",
    [
        # log_ratio = logp - ref = 1: k1 = 1, k2 = 1/2, k3 = e^-1 + 1 - 1 = 0.367879
        (-1.0, -2.0, 1.0, 0.5, math.exp(-1)),
        # log_ratio = -1: k1 = -1, k2 = 1/2, k3 = e^1 - 1 - 1 = 0.718282
        (-2.0, -1.0, -1.0, 0.5, math.e - 2),
        # equal log-probs: every estimator is 0
        (-0.7, -0.7, 0.0, 0.0, 0.0),
    ],
)
def test_kl_estimators_by_hand(logp, ref, k1, k2, k3):
    lp, rf = torch.tensor([logp]), torch.tensor([ref])
    assert close(kl_penalty(lp, rf, "k1"), [k1])
    assert close(kl_penalty(lp, rf, "k2"), [k2])
    assert close(kl_penalty(lp, rf, "k3"), [k3])


def test_kl_k3_is_clamped_and_differentiable():
    lp = torch.tensor([-40.0, -1.0], requires_grad=True)
    ref = torch.tensor([-1.0, -1.0])
    k3 = kl_penalty(lp, ref, "k3")
    assert k3[0].item() == 10.0  # exp(clamp(39, 20)) - ... is huge, clamped to 10
    assert k3[1].item() == 0.0
    k3.sum().backward()
    assert torch.isfinite(lp.grad).all()


def test_kl_gradient_k3():
    # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = 1 - exp(ref - logp) = 1 - e^-1 at log_ratio 1
    lp = torch.tensor([-1.0], requires_grad=True)
    kl_penalty(lp, torch.tensor([-2.0]), "k3").sum().backward()
    assert close(lp.grad, [1 - math.exp(-1)])


def test_kl_unknown_estimator():
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


# ----------------------------------------------------------------------------- logits


def test_entropy_by_hand_and_stable():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1000.0, 1000.0, -1000.0, -1000.0]])
    # uniform over 4: ln 4; two equal huge logits (others vanish): ln 2, no overflow
    assert close(entropy_from_logits(logits), [math.log(4), math.log(2)])


def test_entropy_matches_torch_and_handles_minus_inf():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g)
    expected = torch.distributions.Categorical(logits=logits).entropy()
    assert close(entropy_from_logits(logits), expected)
    banned = torch.tensor([[2.0, float("-inf"), 0.5]], requires_grad=True)
    ent = entropy_from_logits(banned)
    p = torch.softmax(torch.tensor([2.0, 0.5]), -1)
    assert close(ent, [-(p * p.log()).sum().item()])
    ent.sum().backward()
    assert torch.isfinite(banned.grad).all() and banned.grad[0, 1] == 0


def test_logprobs_from_logits():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 4, 7, generator=g)
    labels = torch.randint(0, 7, (2, 4), generator=g)
    expected = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert close(logprobs_from_logits(logits, labels), expected)


# ----------------------------------------------------------------------------- TIS


def test_token_truncate_weights_by_hand():
    # TIS is rollout_correction = "token_truncate" (tis_cap was its second code path, now removed).
    old = torch.tensor([[-1.0, -1.0, -3.0, 0.0]], requires_grad=True)
    rollout = torch.tensor([[-1.5, -0.5, -0.1, -100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    w, stats = correction_weights(old, rollout, mask, "token_truncate", upper=1.5, lower=1 / 1.5)
    # exp(0.5) = 1.6487 -> capped 1.5; exp(-0.5) = 0.60653; exp(-2.9) = 0.055023; masked (exp(100)) -> 0
    assert close(w, [[1.5, math.exp(-0.5), math.exp(-2.9), 0.0]])
    assert not w.requires_grad
    assert close(stats["rollout_corr/truncated_fraction"], 1 / 3)
    with pytest.raises(ValueError, match="band"):
        correction_weights(old, rollout, mask, "token_truncate", upper=0.5, lower=0.25)


# ----------------------------------------------------------------------------- ppo_clip

# log ratios of five valid tokens and one padded token (garbage there must not leak)
RATIOS = [1.5, 0.5, 0.5, 4.0, 1.1]
ADV = [1.0, 1.0, -1.0, -1.0, -1.0]


def _ppo_batch(ratios=RATIOS, adv=ADV):
    old = torch.tensor([[-1.0] * len(ratios) + [0.0]])
    log_r = torch.tensor([[math.log(r) for r in ratios] + [50.0]])
    logprobs = (old + log_r).requires_grad_(True)
    return PolicyLossInput(
        logprobs=logprobs,
        old_logprobs=old,
        advantages=torch.tensor([adv + [NAN]]),
        response_mask=torch.tensor([[1] * len(ratios) + [0]]),
    )


def test_ppo_clip_by_hand_with_dual_clip():
    batch = _ppo_batch()
    loss, metrics = ppo_clip_loss(batch, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    # t1 A=+1 r=1.5: max(-1.5, -1.28) = -1.28 (clipped high)
    # t2 A=+1 r=0.5: max(-0.5, -0.8)  = -0.5
    # t3 A=-1 r=0.5: max(0.5, 0.8) = 0.8 (clipped low); dual: min(0.8, 3) = 0.8
    # t4 A=-1 r=4:   max(4, 1.28) = 4; dual: min(4, 3) = 3 (dual-clipped)
    # t5 A=-1 r=1.1: max(1.1, 1.1) = 1.1
    # padded: 0
    assert close(loss, [[-1.28, -0.5, 0.8, 3.0, 1.1, 0.0]])
    assert close(metrics["pg_clipfrac"], 2 / 5)  # t1, t3
    assert close(metrics["pg_clipfrac_lower"], 1 / 5)  # t4
    # ppo_kl = mean(old - new) = -mean(log r) = -(ln1.5 + ln.5 + ln.5 + ln4 + ln1.1) / 5
    assert close(metrics["ppo_kl"], -sum(math.log(r) for r in RATIOS) / 5)
    loss.sum().backward()
    # d(-A r)/dlogp = -A r where unclipped; 0 where a clip is active (t1, t3, t4) and on padding
    assert close(batch.logprobs.grad, [[0.0, -0.5, 0.0, 0.0, 1.1, 0.0]])


def test_ppo_clip_without_dual_clip():
    loss, metrics = ppo_clip_loss(_ppo_batch(), 0.2, 0.28, None)
    assert close(loss[0, 3], 4.0)  # -A r = 4, no floor
    assert metrics["pg_clipfrac_lower"].item() == 0.0


def test_ppo_clip_higher():
    # A=+1, r=1.25: symmetric 0.2 clips at 1.2 -> max(-1.25, -1.2) = -1.2 (clipped);
    # clip-higher 0.28 leaves it: -1.25
    batch = _ppo_batch([1.25], [1.0])
    sym, m_sym = ppo_clip_loss(batch, 0.2, 0.2, 3.0)
    high, m_high = ppo_clip_loss(batch, 0.2, 0.28, 3.0)
    assert close(sym[0, 0], -1.2) and m_sym["pg_clipfrac"].item() == 1.0
    assert close(high[0, 0], -1.25) and m_high["pg_clipfrac"].item() == 0.0


def test_ppo_clip_registered_builtin_and_options():
    component = isolated_registry().get("policy_loss", "ppo_clip")
    fn = component.build({"clip_ratio_low": 0.2, "clip_ratio_high": 0.28})
    loss, _ = fn(_ppo_batch())
    assert close(loss[0, 0], -1.28)
    with pytest.raises(Exception, match="clip_ratio_c"):
        PPOClipOptions(clip_ratio_c=0.5)
    with pytest.raises(Exception, match="clip_ratio_low"):
        PPOClipOptions(clip_ratio_low=1.0)


@pytest.mark.parametrize("options", [{}, {"clip_ratio_high": 0.28, "clip_ratio_c": None}])
def test_ppo_clip_conformance(options):
    check_policy_loss(isolated_registry().get("policy_loss", "ppo_clip"), options)


def test_ppo_clip_deterministic_and_all_zero_mask():
    batch = _ppo_batch()
    fn = build_ppo_clip(PPOClipOptions())
    a, _ = fn(batch)
    b, _ = fn(batch)
    assert torch.equal(a, b)
    empty = PolicyLossInput(
        batch.logprobs, batch.old_logprobs, batch.advantages, torch.zeros_like(batch.response_mask)
    )
    loss, metrics = fn(empty)
    assert torch.equal(loss, torch.zeros_like(loss))
    assert all(v.item() == 0.0 for v in metrics.values())
    aggregate(loss, empty.response_mask).backward()
    assert torch.isfinite(batch.logprobs.grad).all()


# ----------------------------------------------------------------------------- returns helpers


def test_group_stats_by_hand():
    mean, std, n = group_stats(torch.tensor([1.0, 2.0, 3.0, 5.0]), torch.tensor([4, 4, 4, 9]))
    # group 4: mean 2, unbiased std sqrt((1 + 0 + 1) / 2) = 1; group 9: a single sample, std 0
    assert close(mean, [2, 2, 2, 5]) and close(std, [1, 1, 1, 0]) and close(n, [3, 3, 3, 1])


def test_credit_masked_rewards_and_discounted_returns():
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [5.0, 1.0, 0.0, 2.0]])
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 0, 1]])
    # row 0: the reward on masked position 3 moves to the last model token (1)
    # row 1: the reward before the first model token has no action to credit: dropped
    assert close(credit_masked_rewards(rewards, mask), [[0, 1, 0, 0], [0, 1, 0, 2]])
    # gamma 0.5, row 1 (model tokens 1 and 3): G3 = 2; G1 = 1 + 0.5 * 2 = 2; masked -> 0
    assert close(discounted_returns(rewards, mask, 0.5), [[0.5, 1.0, 0, 0], [0, 2.0, 0, 2.0]])


def test_discounted_returns_skip_masked_gaps():
    # model tokens 0, 1, 3: G3 = 2, G1 = 0 + 0.5 * 2 = 1, G0 = 1 + 0.5 * 1 = 1.5
    rewards = torch.tensor([[1.0, 0.0, 0.0, 2.0]])
    assert close(discounted_returns(rewards, torch.tensor([[1, 1, 0, 1]]), 0.5), [[1.5, 1.0, 0.0, 2.0]])


# ----------------------------------------------------------------------------- value loss


def test_clipped_value_loss_by_hand():
    values = torch.tensor([[1.0, 2.0, 0.0, NAN]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.0, NAN]])
    returns = torch.tensor([[2.0, 0.0, 1.0, NAN]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, metrics = clipped_value_loss(values, old, returns, mask, clip=0.2, agg_mode="token-mean")
    # t1: v_clip = 0.5 + 0.2 = 0.7; max((1-2)^2, (0.7-2)^2) = 1.69 (clipped) -> 0.845
    # t2: v_clip = 0.7; max((2-0)^2, 0.49) = 4 -> 2.0
    # t3: v_clip = 0; max(1, 1) = 1 -> 0.5
    # token-mean: (0.845 + 2 + 0.5) / 3 = 1.115
    assert close(loss, 1.115)
    assert close(metrics["critic/vf_clipfrac"], 1 / 3)
    loss.backward()
    # t1 clipped: no gradient; t2: (2 - 0) / 3; t3: (0 - 1) / 3; masked NaN position: 0
    assert close(values.grad, [[0.0, 2 / 3, -1 / 3, 0.0]])


def test_clipped_value_loss_all_zero_mask():
    values = torch.ones(2, 3, requires_grad=True)
    loss, metrics = clipped_value_loss(
        values, values.detach(), torch.zeros(2, 3), torch.zeros(2, 3), 0.5, "seq-mean-token-mean"
    )
    assert loss.item() == 0.0 and metrics["critic/vf_clipfrac"].item() == 0.0
    loss.backward()
    assert torch.equal(values.grad, torch.zeros(2, 3))


# ----------------------------------------------------------------------------- packaging


def test_algorithms_package_imports_no_torch():
    code = "import sys, rlcore.algorithms; assert 'torch' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
