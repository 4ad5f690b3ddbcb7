"""Choosing the next token from a batch of logits, on the logits' device, without host syncs.

The log-probability returned for a chosen token is ``log_softmax(logits / T)`` at that token,
taken BEFORE top-k / top-p truncation (``T`` = temperature; ``T = 1`` when greedy). That is the
distribution the trainer can recompute from a plain forward pass, so engine and trainer
log-probs agree up to numerics; truncation is a sampling heuristic the trainer does not model.

Sampling is by inverse CDF: one uniform number per row from a ``torch.Generator`` located in the
cumulative sum of the (truncated, unnormalised) probabilities. That draws B numbers per step
rather than B x V noise values (an exponential or Gumbel race over a 49k vocabulary cost more
than a 135M model's forward pass on CPU), is reproducible with a seed, and, unlike
``torch.multinomial``, never synchronises with the host.
"""

from __future__ import annotations

import torch

# The inverse CDF is found in two levels: first the block of this many tokens, then the token in
# it. A cumulative sum over a whole 152k vocabulary is a slow scan on a GPU (0.3 ms of a 3 ms
# decode step at batch 256 on an H200); block sums are one reduction, and the scan runs over
# [B, blocks] and one [B, block] slice.
CDF_BLOCK = 1024

# Without top-k, a nucleus on CPU is first looked for among this many most likely tokens: a full
# sort of a 49k vocabulary costs far more than a forward pass there.
CPU_NUCLEUS_CANDIDATES = 1024


def _candidates(weights: torch.Tensor, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The truncated distribution as ``(values, token_ids)`` [B, K], most likely first; values are
    unnormalised probabilities, zero for tokens top-p removes.

    top-k keeps exactly k tokens; top-p then keeps the smallest prefix whose mass (relative to what
    top-k kept) reaches ``top_p``, always at least the most likely token.
    """
    vocab = weights.shape[-1]
    if 0 < top_k < vocab:
        values, ids = torch.topk(weights, top_k, dim=-1)
        denominator = values.sum(dim=-1, keepdim=True)
    else:
        values = ids = None
        denominator = weights.sum(dim=-1, keepdim=True)
        if weights.device.type == "cpu" and vocab > CPU_NUCLEUS_CANDIDATES:
            values, ids = torch.topk(weights, CPU_NUCLEUS_CANDIDATES, dim=-1)
            if not bool((values.sum(dim=-1, keepdim=True) >= top_p * denominator).all()):
                values = ids = None  # some row's nucleus is wider: sort everything
        if values is None:
            values, ids = torch.sort(weights, dim=-1, descending=True)
    if top_p < 1.0:
        mass_before = values.cumsum(dim=-1) - values
        values = values.masked_fill(mass_before >= top_p * denominator, 0.0)
    return values, ids


def sample_next(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of ``logits`` [B, V]; return ``(tokens [B], logprobs [B])``.

    ``temperature == 0`` is greedy (argmax; log-probs at T = 1).
    """
    uniform = None
    if temperature != 0.0:
        uniform = torch.rand(
            (logits.shape[0],), generator=generator, device=logits.device, dtype=torch.float32
        )
    return sample_with_uniform(logits, temperature, top_k, top_p, uniform)


def sample_with_uniform(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    uniform: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample_next` with the uniform draws [B] given: on CUDA the fast path draws them
    outside its captured graph, so the graph itself holds no random-number state."""
    scaled = logits.float()
    if temperature not in (0.0, 1.0):
        scaled = scaled / temperature
    top = scaled.max(dim=-1, keepdim=True).values
    weights = torch.exp(scaled - top)  # unnormalised probabilities, the largest is 1
    log_norm = top + weights.sum(dim=-1, keepdim=True).log()  # logsumexp, before truncation
    if temperature == 0.0:
        tokens = scaled.argmax(dim=-1)
    else:
        assert uniform is not None, "sampling at temperature > 0 needs uniform draws"
        ids = None
        if 0 < top_k < scaled.shape[-1] or top_p < 1.0:
            weights, ids = _candidates(weights, top_k, top_p)
        tokens = _inverse_cdf(weights, uniform)
        tokens = (tokens if ids is None else ids.gather(-1, tokens)).squeeze(-1)
    logprobs = (scaled.gather(-1, tokens[:, None]) - log_norm).squeeze(-1)
    return tokens, logprobs


def _inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """For each row of unnormalised probabilities ``weights`` [B, N], the first index whose
    cumulative weight exceeds ``uniform * total`` -> [B, 1] (the same choice as a search in
    ``weights.cumsum(-1)``, up to float rounding)."""
    rows, size = weights.shape
    block = min(CDF_BLOCK, size)
    full = size // block
    sums = weights[:, : full * block].reshape(rows, full, block).sum(-1)
    if full * block < size:
        sums = torch.cat([sums, weights[:, full * block :].sum(-1, keepdim=True)], dim=-1)
    cdf = sums.cumsum(-1)
    target = uniform.to(cdf.dtype)[:, None] * cdf[:, -1:]
    chosen = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[-1] - 1)  # [B, 1]
    before = torch.where(chosen > 0, cdf.gather(-1, (chosen - 1).clamp_(min=0)), torch.zeros_like(target))
    index = chosen * block + torch.arange(block, device=weights.device)[None, :]  # [B, block]
    inside = index < size
    values = weights.gather(-1, index.clamp(max=size - 1)) * inside
    offset = torch.searchsorted(values.cumsum(-1) + before, target, right=True)
    last = inside.sum(-1, keepdim=True) - 1  # u * total rounding up to the block's end
    return chosen * block + torch.minimum(offset, last)
