"""The gap between the rollout engine and the trainer: measured, and corrected.

The engine samples with its own kernels (and often lower precision, or stale weights after a
missed sync), so its log-probs differ from the trainer's recomputed ``old_logprobs``. Every step
records that gap (:func:`mismatch_sums`, :func:`mismatch_metrics`); ``[algorithm]
rollout_correction`` weighs each token's policy loss by an importance ratio that corrects it
(:func:`correction_weights`: truncated or masked, per token or per sequence).
"""

from __future__ import annotations

import math

import torch

from rlcore.algorithms.masked import as_bool_mask, masked_fill_zero

# The corrections ``[algorithm] rollout_correction`` offers beside "none".
CORRECTIONS: tuple[str, ...] = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def correction_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    upper: float,
    lower: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Detached per-token weights for the policy loss that correct the rollout/trainer gap, and
    their statistics (0-dim tensors, left on the device).

    The ratio is ``pi_trainer / pi_rollout``, per token (``token_*``) or per sequence, the
    product over its response tokens (``sequence_*``). ``*_truncate`` weighs by
    ``min(ratio, upper)`` (TIS); ``*_mask`` weighs by the ratio inside ``[lower, upper]`` and by 0
    outside it, rejecting those tokens or whole sequences (MIS). All in log space, so a large
    gap never overflows.
    """
    if mode not in CORRECTIONS:
        raise ValueError(f"rollout correction {mode!r} is not one of {', '.join(CORRECTIONS)}")
    if not 0 < lower <= 1 <= upper:
        raise ValueError(f"the importance-ratio band must hold 1: got [{lower}, {upper}]")
    m = as_bool_mask(mask)
    log_ratio = masked_fill_zero((old_logprobs.detach() - rollout_logprobs.detach()).float(), m)
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
    log_upper, log_lower = math.log(upper), math.log(lower)
    if mode.endswith("truncate"):
        weights = log_ratio.clamp(max=log_upper).exp()
        cut = log_ratio > log_upper
    else:
        cut = (log_ratio > log_upper) | (log_ratio < log_lower)
        weights = torch.where(cut, torch.zeros_like(log_ratio), log_ratio.clamp(max=log_upper).exp())
    weights = masked_fill_zero(weights, m)
    count = m.sum().clamp(min=1)
    kind = "truncated" if mode.endswith("truncate") else "rejected"
    stats = {
        "rollout_corr/weight/mean": weights.sum() / count,
        f"rollout_corr/{kind}_fraction": (cut & m).sum() / count,
    }
    return weights.to(old_logprobs.dtype), stats


def mismatch_sums(
    trainer_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Sums, maxima and minima (0-dim tensors on the inputs' device) that :func:`mismatch_metrics`
    turns into the gap between the engine's and the trainer's log-probs of the sampled tokens.
    Sums of several micro-batches add up with :func:`merge_mismatch`."""
    m = as_bool_mask(mask)
    diff = (trainer_logprobs.detach() - rollout_logprobs.detach()).float()[m]
    if diff.numel() == 0:
        zero = torch.zeros((), device=diff.device)
        return {
            "count": zero,
            "abs_sum": zero,
            "abs_max": zero,
            "ratio_sum": zero,
            "ratio_min": zero + math.inf,
            "ratio_max": zero - math.inf,
            "kl_sum": zero,
        }
    ratio = diff.clamp(max=20.0).exp()
    return {
        "count": torch.tensor(float(diff.numel()), device=diff.device),
        "abs_sum": diff.abs().sum(),
        "abs_max": diff.abs().max(),
        "ratio_sum": ratio.sum(),
        "ratio_min": ratio.min(),
        "ratio_max": ratio.max(),
        # k3 estimate of KL(rollout || trainer): the samples come from the rollout policy.
        "kl_sum": (ratio - 1 - diff.clamp(max=20.0)).sum(),
    }


def merge_mismatch(a: dict[str, torch.Tensor] | None, b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if a is None:
        return dict(b)
    out = {}
    for key in a:
        if key.endswith("_max"):
            out[key] = torch.maximum(a[key], b[key])
        elif key.endswith("_min"):
            out[key] = torch.minimum(a[key], b[key])
        else:
            out[key] = a[key] + b[key]
    return out


def mismatch_metrics(sums: dict[str, torch.Tensor]) -> dict[str, float]:
    """``rollout_corr/*`` metrics: mean and max absolute log-prob difference, the importance
    ratio's min/mean/max and a KL estimate. Stale engine weights and kernel drift show here first."""
    count = float(sums["count"])
    if count == 0:
        return {}
    return {
        "rollout_corr/logprob_diff/mean": float(sums["abs_sum"]) / count,
        "rollout_corr/logprob_diff/max": float(sums["abs_max"]),
        "rollout_corr/ratio/mean": float(sums["ratio_sum"]) / count,
        "rollout_corr/ratio/min": float(sums["ratio_min"]),
        "rollout_corr/ratio/max": float(sums["ratio_max"]),
        "rollout_corr/kl": float(sums["kl_sum"]) / count,
    }
