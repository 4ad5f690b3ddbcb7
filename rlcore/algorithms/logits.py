"""Per-token quantities computed from a model's logits [..., V]."""

from __future__ import annotations

import torch


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` over the last dimension, shape ``logits.shape[:-1]``.

    Computed as ``-sum(p * log p)`` from ``log_softmax`` (no overflow for large logits);
    logits of ``-inf`` (tokens banned by a filter) contribute exactly 0, to the value and to the
    gradient, instead of ``0 * -inf = NaN``.
    """
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    return -(p * logp.nan_to_num(neginf=0.0)).sum(-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[label]`` for each position, shape ``labels.shape``.

    Gathers one logit and subtracts the log-partition, so the full [..., V] log-softmax is
    never materialised a second time.
    """
    picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)
