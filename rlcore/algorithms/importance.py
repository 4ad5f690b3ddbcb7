"""Truncated importance sampling (TIS) between the rollout engine and the trainer.

The engine samples with its own kernels (and sometimes lower precision), so its log-probs
differ from the trainer's recomputed ``old_logprobs``. Weighting each token's policy loss by
``min(pi_old / pi_rollout, cap)`` corrects that off-policy gap; the cap bounds the variance.
"""

from __future__ import annotations

import math

import torch

from rlcore.algorithms.masked import as_bool_mask, masked_fill_zero


def tis_weights(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, cap: float, mask: torch.Tensor
) -> torch.Tensor:
    """Detached per-token weights ``min(exp(old - rollout), cap)``, 0 outside the mask.

    Computed as ``exp(min(old - rollout, log cap))`` so a large gap never overflows.
    Multiply them into the per-token policy loss before aggregation.
    """
    if not cap > 0:
        raise ValueError(f"the TIS cap must be > 0, got {cap!r}")
    log_ratio = (old_logprobs.detach() - rollout_logprobs.detach()).float()
    m = as_bool_mask(mask)
    log_ratio = masked_fill_zero(log_ratio, m).clamp(max=math.log(cap))
    return masked_fill_zero(log_ratio.exp(), m).to(old_logprobs.dtype)
