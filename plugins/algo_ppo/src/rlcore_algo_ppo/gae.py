"""Generalized advantage estimation (Schulman et al., 2016) over the model tokens of each row.

Walking backwards over model tokens only (tool output and padding are skipped, so their values
never enter), with ``V_next`` and ``A_next`` those of the next model token (0 after the last)::

    delta_t = r_t + gamma * V_next - V_t
    A_t     = delta_t + gamma * lam * A_next
    R_t     = A_t + V_t                      (the critic's regression target)

Rewards on masked positions are first credited to the model token before them
(:func:`rlcore.algorithms.returns.credit_masked_rewards`). With ``whiten`` the advantages are
whitened over every model token of the batch; the returns never are.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlcore.algorithms.masked import as_bool_mask, masked_fill_zero, masked_whiten
from rlcore.algorithms.returns import check_advantage_input, credit_masked_rewards
from rlcore.interfaces import AdvantageInput


def gae_advantages(
    batch: AdvantageInput, gamma: float = 1.0, lam: float = 1.0, whiten: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` [B, T], 0 outside the response mask."""
    check_advantage_input(batch, needs_values=True)
    mask = as_bool_mask(batch.response_mask)
    rewards = batch.token_rewards.detach()
    dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    rewards = credit_masked_rewards(rewards.to(dtype), mask)
    values = masked_fill_zero(batch.values.detach().to(dtype), mask)
    advantages = torch.zeros_like(rewards)
    if rewards.shape[-1]:
        next_value = torch.zeros_like(rewards[:, 0])
        next_adv = torch.zeros_like(next_value)
        for t in reversed(range(rewards.shape[-1])):
            valid = mask[:, t]
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            adv_t = delta + gamma * lam * next_adv
            next_value = torch.where(valid, values[:, t], next_value)
            next_adv = torch.where(valid, adv_t, next_adv)
            advantages[:, t] = torch.where(valid, adv_t, torch.zeros_like(adv_t))
    returns = masked_fill_zero(advantages + values, mask)
    if whiten:
        advantages = masked_whiten(advantages, mask)
    return advantages, returns


def build_gae(options, context=None) -> Callable[[AdvantageInput], tuple[torch.Tensor, torch.Tensor]]:
    gamma, lam, whiten = options.gamma, options.lam, options.whiten

    def gae(batch: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
        return gae_advantages(batch, gamma=gamma, lam=lam, whiten=whiten)

    return gae
