"""The PPO clipped surrogate: the builtin ``ppo_clip`` policy loss.

Per valid token, with ``r = exp(logprobs - old_logprobs)`` and advantage ``A``::

    clipped = max(-A * r, -A * clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))
    loss    = min(clipped, -A * clip_ratio_c)   if A < 0 and clip_ratio_c is set (dual clip)
              clipped                           otherwise

Separate low/high ranges give clip-higher (DAPO); the dual clip bounds the loss of a negative
advantage token whose ratio has grown large (Ye et al., 2020). The loss is 0 outside the mask.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlcore.algorithms.masked import as_bool_mask, masked_fill_zero, masked_mean
from rlcore.interfaces import PolicyLossInput

# exp() of a log-ratio beyond this is clamped: one stale token must not produce inf.
LOG_RATIO_CLAMP = 20.0


def importance_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``exp(logprobs - old_logprobs)`` on valid tokens, 1 elsewhere; log-ratio clamped to +-20."""
    log_ratio = masked_fill_zero(logprobs - old_logprobs.detach(), mask)
    return log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()


def ppo_clip_loss(
    batch: PolicyLossInput,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO loss [B, T] and metrics ``pg_clipfrac``, ``pg_clipfrac_lower``, ``ppo_kl``."""
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (or None to disable the dual clip), got {clip_ratio_c}")
    mask = as_bool_mask(batch.response_mask)
    adv = masked_fill_zero(batch.advantages.detach(), mask)
    ratio = importance_ratio(batch.logprobs, batch.old_logprobs, mask)
    unclipped = -adv * ratio
    clipped_ratio = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped = -adv * clipped_ratio
    loss = torch.maximum(unclipped, clipped)
    clip_hit = clipped > unclipped
    lower_hit = torch.zeros_like(clip_hit)
    if clip_ratio_c is not None:
        floor = -adv * clip_ratio_c
        negative = adv < 0
        lower_hit = negative & (loss > floor)
        loss = torch.where(negative, torch.minimum(loss, floor), loss)
    loss = masked_fill_zero(loss, mask)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean(clip_hit.float(), mask),
            "pg_clipfrac_lower": masked_mean(lower_hit.float(), mask),
            "ppo_kl": masked_mean((batch.old_logprobs - batch.logprobs).float(), mask),
        }
    return loss, metrics


def build_ppo_clip(
    options, context=None
) -> Callable[[PolicyLossInput], tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """Factory of the builtin ``ppo_clip`` (options: :class:`rlcore.builtin.options.PPOClipOptions`)."""
    low, high, c = options.clip_ratio_low, options.clip_ratio_high, options.clip_ratio_c

    def ppo_clip(batch: PolicyLossInput) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return ppo_clip_loss(batch, low, high, c)

    return ppo_clip
