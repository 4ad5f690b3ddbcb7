"""Per-token estimators of KL(policy || reference), from the two log-probabilities of the sampled token.

With ``log_ratio = logprobs - ref_logprobs`` (samples drawn from the policy):

- ``k1``: ``log_ratio``; unbiased, high variance, can be negative.
- ``k2``: ``0.5 * log_ratio**2``; biased, low variance, never negative.
- ``k3``: ``exp(-log_ratio) + log_ratio - 1``; unbiased and never negative (Schulman's
  low-variance estimator). The log-ratio is clamped to [-20, 20] before ``exp`` and the
  result to at most 10, as is common, so one wild token cannot dominate a step.
"""

from __future__ import annotations

import torch

KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")
K3_LOG_RATIO_CLAMP = 20.0
K3_MAX = 10.0


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """The per-token KL estimate, same shape as ``logprobs`` (the caller masks and aggregates)."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        neg = (-log_ratio).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
        return (neg.exp() - neg - 1.0).clamp(max=K3_MAX)
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {', '.join(KL_ESTIMATORS)}")
