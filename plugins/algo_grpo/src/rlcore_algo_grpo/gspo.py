"""GSPO (Zheng et al., 2025): clip a sequence-level importance ratio instead of per-token ratios.

For sequence i with model tokens M_i: ``s_i = exp(mean_{t in M_i} (logp_t - old_t))``. The
loss is written per token with ``s_it = sg(s_i) * exp(logp_t - sg(logp_t))``: its value equals
``s_i`` and ``d s_it / d theta = s_i * d logp_t / d theta``, so averaging the token terms of a
sequence (``seq-mean-token-mean``) reproduces the gradient of the sequence-level objective
exactly, while still allowing per-token advantages::

    loss_it = max(-A_it * s_it, -A_it * clip(s_it, 1 - clip_ratio_low, 1 + clip_ratio_high))

Two choices follow GSPO's definition, as verl implements it: the loss aggregates by
``seq-mean-token-mean`` whatever ``[algorithm] loss_agg_mode`` says (the loss carries that as its
``loss_agg_mode``; ``gspo_follow_loss_agg_mode = true`` gives the table's back), and the token
log-ratio ``log s_it`` is clamped at ``gspo_log_ratio_cap`` (10) *with* its gradient term, so a
sequence whose ratio went beyond ``e^10`` contributes no gradient rather than one scaled by
``e^10`` or more.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlcore.algorithms.masked import as_bool_mask, masked_fill_zero, masked_mean
from rlcore.interfaces import PolicyLossInput


def sequence_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``mean_{t in M_i} (logp_t - old_t)`` per sequence, [B]; 0 for a sequence without model tokens."""
    return masked_mean(logprobs - old_logprobs.detach(), mask, dim=-1)


# GSPO's own aggregation: the token terms of a sequence averaged, then the sequences.
AGGREGATION = "seq-mean-token-mean"
LOG_RATIO_CAP = 10.0


def gspo_loss(
    batch: PolicyLossInput,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
    log_ratio_cap: float = LOG_RATIO_CAP,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token GSPO loss [B, T], 0 outside the mask; metrics ``pg_clipfrac``,
    ``pg_clipfrac_lower`` (always 0: there is no dual clip), ``ppo_kl``, ``gspo/seq_ratio_mean``."""
    mask = as_bool_mask(batch.response_mask)
    logprobs = masked_fill_zero(batch.logprobs, mask)
    old = masked_fill_zero(batch.old_logprobs.detach(), mask)
    adv = masked_fill_zero(batch.advantages.detach(), mask)
    seq_log_ratio = sequence_log_ratio(logprobs, old, mask)
    # Clamped with the gradient term: above the cap the term is constant, so its gradient is 0.
    token_log_ratio = (seq_log_ratio.detach().unsqueeze(-1) + logprobs - logprobs.detach()).clamp(
        max=log_ratio_cap
    )
    ratio = token_log_ratio.exp()
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss = masked_fill_zero(torch.maximum(unclipped, clipped), mask)
    with torch.no_grad():
        has_tokens = mask.any(-1)
        seq_ratio = seq_log_ratio.clamp(max=log_ratio_cap).exp()
        metrics = {
            "pg_clipfrac": masked_mean((clipped > unclipped).float(), mask),
            "pg_clipfrac_lower": torch.zeros((), device=loss.device),
            "ppo_kl": masked_mean((old - logprobs).float(), mask),
            "gspo/seq_ratio_mean": masked_mean(seq_ratio.float(), has_tokens),
        }
    return loss, metrics


def build_gspo(
    options, context=None
) -> Callable[[PolicyLossInput], tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """The loss, carrying its aggregation as ``loss_agg_mode`` (None: the manifest's)."""
    low, high, cap = options.clip_ratio_low, options.clip_ratio_high, options.gspo_log_ratio_cap

    def gspo(batch: PolicyLossInput) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return gspo_loss(batch, low, high, cap)

    gspo.loss_agg_mode = None if options.gspo_follow_loss_agg_mode else AGGREGATION
    return gspo
