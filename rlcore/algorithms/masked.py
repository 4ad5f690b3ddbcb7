"""Reductions over the response mask, in one place so every estimator and loss agrees on them.

Masked positions (padding, tool output) never influence a result, even when they hold NaN or
inf: values there are replaced with zeros before any arithmetic (``torch.where``), never
multiplied by the mask. Empty masks give 0, not NaN.
"""

from __future__ import annotations

from typing import Literal

import torch

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


def as_bool_mask(mask: torch.Tensor) -> torch.Tensor:
    """The mask as booleans (float 0/1 masks are common; anything non-zero counts)."""
    return mask if mask.dtype == torch.bool else mask != 0


def masked_fill_zero(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` where the mask is set, exactly 0 elsewhere (NaN there cannot leak)."""
    return torch.where(as_bool_mask(mask), values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    clean = masked_fill_zero(values, mask)
    return clean.sum() if dim is None else clean.sum(dim)


def masked_count(mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    m = as_bool_mask(mask)
    return m.sum() if dim is None else m.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over the masked positions; 0 where nothing is masked in."""
    count = masked_count(mask, dim).clamp(min=1).to(values.dtype)
    return masked_sum(values, mask, dim) / count


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over all masked positions (Bessel-corrected by default); 0 with fewer than two."""
    mean = masked_mean(values, mask)
    count = masked_count(mask).to(values.dtype)
    sq = masked_sum((values - mean) ** 2, mask)
    denom = count - 1 if unbiased else count
    return torch.where(denom > 0, sq / denom.clamp(min=1), torch.zeros_like(sq))


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the masked positions, 0 outside the mask.

    With ``shift_mean=False`` the mean is added back (only the scale changes).
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return masked_fill_zero(whitened, mask)


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    normalizer: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss [B, T] to a scalar.

    - ``token-mean``: sum over every valid token / number of valid tokens.
    - ``seq-mean-token-sum``: each sequence's token sum, averaged over sequences.
    - ``seq-mean-token-mean``: each sequence's token mean, averaged over sequences.

    Sequences with no valid token do not count in the sequence average. ``normalizer``
    replaces the local divisor (valid tokens, or valid sequences) so that micro-batches of one
    mini-batch can share the mini-batch's divisor. An all-zero mask gives 0 that still has a
    gradient (so ``backward()`` works) and is never NaN.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; expected one of {', '.join(AGG_MODES)}")
    m = as_bool_mask(mask)
    clean = masked_fill_zero(loss, m)
    if mode == "token-mean":
        total = clean.sum()
        divisor = m.sum() if normalizer is None else normalizer
    else:
        per_seq = clean.sum(-1)
        if mode == "seq-mean-token-mean":
            per_seq = per_seq / m.sum(-1).clamp(min=1).to(per_seq.dtype)
        total = per_seq.sum()
        divisor = m.any(-1).sum() if normalizer is None else normalizer
    divisor = torch.as_tensor(divisor, dtype=total.dtype, device=total.device).clamp(min=1)
    return total / divisor
