"""Outcome-reward advantage estimators that need no critic.

Each returns ``(advantages, returns)`` [B, T], 0 outside the response mask. The outcome
estimators (grpo, dr_grpo, rloo) compute one advantage per sample from ``scores`` and copy it
onto every model token; their ``returns`` are the scores copied the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlcore.algorithms.masked import masked_whiten
from rlcore.algorithms.returns import (
    broadcast_over_tokens,
    check_advantage_input,
    discounted_returns,
    group_stats,
)
from rlcore.interfaces import AdvantageInput

Estimator = Callable[[AdvantageInput], tuple[torch.Tensor, torch.Tensor]]


def _outcome(batch: AdvantageInput, per_sample: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = batch.token_rewards.dtype if batch.token_rewards.is_floating_point() else torch.float32
    advantages = broadcast_over_tokens(per_sample, batch.response_mask, dtype)
    returns = broadcast_over_tokens(batch.scores.detach(), batch.response_mask, dtype)
    return advantages, returns


def grpo_advantages(
    batch: AdvantageInput, norm_by_std: bool = True, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s - mean_g) / (std_g + epsilon)``, or ``s - mean_g`` without ``norm_by_std``.

    ``std_g`` is the unbiased standard deviation of the group; a single-sample group, or a group
    of equal scores, gets advantage 0 (it carries no learning signal).
    """
    check_advantage_input(batch)
    mean, std, _ = group_stats(batch.scores, batch.group_ids)
    centred = batch.scores.detach().to(torch.float64) - mean
    per_sample = centred / (std + epsilon) if norm_by_std else centred
    return _outcome(batch, per_sample)


def rloo_advantages(batch: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
    """``s_i - mean_{j != i} s_j = n / (n - 1) * (s_i - mean_g)``; 0 for a single-sample group."""
    check_advantage_input(batch)
    mean, _, n = group_stats(batch.scores, batch.group_ids)
    centred = batch.scores.detach().to(torch.float64) - mean
    per_sample = torch.where(n > 1, centred * n / (n - 1).clamp(min=1), torch.zeros_like(centred))
    return _outcome(batch, per_sample)


def reinforce_pp_advantages(batch: AdvantageInput, gamma: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token discounted returns of ``token_rewards`` (which carry any per-token KL penalty),
    whitened over every model token of the batch: advantages = whiten(G), returns = G."""
    check_advantage_input(batch)
    rewards = batch.token_rewards.detach()
    if not rewards.is_floating_point():
        rewards = rewards.float()
    returns = discounted_returns(rewards, batch.response_mask, gamma)
    advantages = masked_whiten(returns, batch.response_mask)
    return advantages, returns


def build_grpo(options, context=None) -> Estimator:
    norm, eps = options.norm_by_std, options.epsilon

    def grpo(batch: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
        return grpo_advantages(batch, norm_by_std=norm, epsilon=eps)

    return grpo


def build_dr_grpo(options=None, context=None) -> Estimator:
    def dr_grpo(batch: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
        return grpo_advantages(batch, norm_by_std=False)

    return dr_grpo


def build_rloo(options=None, context=None) -> Estimator:
    return rloo_advantages


def build_reinforce_pp(options, context=None) -> Estimator:
    gamma = options.gamma

    def reinforce_pp(batch: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
        return reinforce_pp_advantages(batch, gamma=gamma)

    return reinforce_pp
