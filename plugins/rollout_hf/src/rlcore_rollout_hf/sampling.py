"""Choosing the next token from a batch of logits, on the logits' device, without host syncs.

The log-probability returned for a chosen token is ``log_softmax(logits / T)`` at that token,
taken BEFORE top-k / top-p truncation (``T`` = temperature; ``T = 1`` when greedy). That is the
distribution the trainer can recompute from a plain forward pass, so engine and trainer
log-probs agree up to numerics; truncation is a sampling heuristic the trainer does not model.

Sampling uses the exponential race (``argmax(log p - log E)``, ``E ~ Exp(1)``), which draws
one noise tensor per step from a ``torch.Generator``: reproducible with a seed, free of
``multinomial``'s host synchronisation, and unchanged by renormalisation after truncation.
"""

from __future__ import annotations

import torch


def filter_top_k_top_p(logp: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Return ``logp`` with tokens outside the top-k / nucleus set to ``-inf`` (a new tensor).

    top-k keeps ties with the k-th value; top-p keeps the smallest prefix of the sorted
    distribution whose mass reaches ``top_p`` (always at least the most likely token).
    """
    vocab = logp.shape[-1]
    out = logp
    if 0 < top_k < vocab:
        kth = torch.topk(out, top_k, dim=-1).values[:, -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logp, order = torch.sort(out, dim=-1, descending=True)
        probs = sorted_logp.softmax(dim=-1)  # renormalised over what top-k kept
        mass_before = probs.cumsum(dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


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
    logits = logits.float()
    if temperature == 0.0:
        logp = torch.log_softmax(logits, dim=-1)
        tokens = logp.argmax(dim=-1)
    else:
        logp = torch.log_softmax(logits / temperature, dim=-1)
        candidates = filter_top_k_top_p(logp, top_k, top_p)
        noise = torch.empty_like(candidates).exponential_(generator=generator)
        tokens = (candidates - noise.log_()).argmax(dim=-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
