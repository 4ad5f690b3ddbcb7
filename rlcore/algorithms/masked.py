"""Reductions over the response mask, in one place so every estimator and loss agrees on them.

Masked positions (padding, tool output) never influence a result, even when they hold NaN or
inf: values there are replaced with zeros before any arithmetic (``torch.where``), never
multiplied by the mask. Empty masks give 0, not NaN.
"""

from __future__ import annotations

from typing import Literal

import torch

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


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


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the masked positions, 0 outside the mask.

    With ``shift_mean=False`` the mean is added back (only the scale changes).
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return masked_fill_zero(whitened, mask)


def mask_totals(mask: torch.Tensor) -> tuple[float, float]:
    """(masked tokens, sequences with at least one masked token) of a [B, T] mask."""
    m = as_bool_mask(mask)
    return float(m.sum()), float(m.any(-1).sum())


def token_weights(
    mask: torch.Tensor,
    mode: str = "token-mean",
    totals: tuple[float, float] | None = None,
    norm_length: float | None = None,
) -> torch.Tensor:
    """Per-token weights ``w`` with ``loss = sum(w * per_token_loss)`` for an aggregation mode: the
    one aggregation of rlcore (the trainer's and :func:`aggregate`'s).

    - ``token-mean``: ``1/M``, M the masked tokens;
    - ``seq-mean-token-sum``: ``1/S``, S the sequences with at least one masked token;
    - ``seq-mean-token-mean``: ``1/(S * len_s)``, each sequence's token mean averaged;
    - ``seq-mean-token-sum-norm``: ``1/(S * L)``, each sequence's token sum over a constant length
      ``L`` (``norm_length``: the longest response allowed, Dr. GRPO's normaliser), averaged over
      sequences; verl divides by its padded response width, which is that length.

    ``totals`` gives (M, S) of the whole mini-batch when ``mask`` holds only part of it (a
    micro-batch, a rank's rows), so a mini-batch's loss does not depend on how it is split.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; expected one of {', '.join(AGG_MODES)}")
    mask = as_bool_mask(mask).float()
    tokens, sequences = totals if totals is not None else mask_totals(mask)
    tokens, sequences = max(tokens, 1.0), max(sequences, 1.0)
    if mode == "token-mean":
        return mask / tokens
    if mode == "seq-mean-token-sum":
        return mask / sequences
    if mode == "seq-mean-token-mean":
        return mask / mask.sum(-1).clamp(min=1).unsqueeze(-1) / sequences
    length = float(norm_length) if norm_length is not None else float(mask.shape[-1])
    return mask / max(length, 1.0) / sequences


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    normalizer: float | torch.Tensor | None = None,
    norm_length: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss [B, T] to a scalar, with the weights of :func:`token_weights`.

    ``normalizer`` replaces the divisor counted here (valid tokens for ``token-mean``, valid
    sequences otherwise) so that micro-batches of one mini-batch can share the mini-batch's.
    Masked positions never count, even holding NaN. An all-zero mask gives 0 that still has a
    gradient (so ``backward()`` works) and is never NaN.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; expected one of {', '.join(AGG_MODES)}")
    m = as_bool_mask(mask)
    totals = None
    if normalizer is not None:
        tokens, sequences = mask_totals(m)
        value = float(normalizer)
        totals = (value, sequences) if mode == "token-mean" else (tokens, value)
    weights = token_weights(m, mode, totals, norm_length).to(loss.dtype)
    return (masked_fill_zero(loss, m) * weights).sum()
