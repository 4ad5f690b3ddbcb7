"""Per-token log-probabilities and entropy on packed sequences, without the full logits.

The decoder runs once over the packed row; the lm_head and the float32 log-softmax run only at
positions that predict response tokens, a chunk at a time. Under autograd at most one chunk's
[tokens x vocab] logits are alive, forward or backward: a hand-written backward rebuilds them
(when the entropy is only a metric), or the chunk is checkpointed (when the loss has an entropy
term).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from rlcore.trainer.batch import MicroBatch

CHUNK_TOKENS = 1024


def _head_chunk(hidden: torch.Tensor, weight: torch.Tensor, bias, targets: torch.Tensor, temperature: float, with_entropy: bool):
    return _from_logits(torch.nn.functional.linear(hidden, weight, bias), targets, temperature, with_entropy)


def _from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool):
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if with_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    else:
        entropy = torch.zeros_like(logp)
    return logp, entropy


class _HeadLogprobs(torch.autograd.Function):
    """lm_head, log-softmax and target gather for one chunk, with a hand-written backward.

    Why: through autograd (checkpointed), a chunk's float32 [tokens x vocab] logits are written
    and read a dozen times between the recomputed forward and the backward of log_softmax and
    gather. Here the forward keeps only the log-sum-exp per token, and the backward rebuilds the
    logits once and turns them in place into ``(onehot - softmax) * grad``. The entropy returned
    is a metric (no gradient); a loss with an entropy term takes the autograd path."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature: float, with_entropy: bool):
        logits = torch.nn.functional.linear(hidden, weight, bias).float()
        if temperature != 1.0:
            logits = logits / temperature
        lse = torch.logsumexp(logits, dim=-1)
        logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
        if with_entropy:
            probs = torch.exp(logits - lse.unsqueeze(-1))
            entropy = lse - torch.linalg.vecdot(probs, logits)
        else:
            entropy = torch.zeros_like(logp)
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        temperature = ctx.temperature
        grad = torch.nn.functional.linear(hidden, weight, bias).float()
        if temperature != 1.0:
            grad.div_(temperature)
        # d logp / d logits = onehot(target) - softmax(logits), times the incoming gradient.
        grad.sub_(lse.unsqueeze(-1)).exp_().mul_(-grad_logp.unsqueeze(-1))
        grad.scatter_add_(-1, targets.unsqueeze(-1), grad_logp.unsqueeze(-1))
        if temperature != 1.0:
            grad.div_(temperature)
        grad = grad.to(hidden.dtype)
        grad_hidden = grad @ weight if ctx.needs_input_grad[0] else None
        grad_weight = grad.t() @ hidden if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(0) if bias is not None and ctx.needs_input_grad[2] else None
        return grad_hidden, grad_weight, grad_bias, None, None, None


def _split_model(model):
    """(decoder, lm_head) when the model exposes them, else (None, None)."""
    get_decoder = getattr(model, "get_decoder", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    decoder = get_decoder() if callable(get_decoder) else None
    if decoder is None or head is None or not isinstance(head, torch.nn.Linear):
        return None, None
    return decoder, head


class TokenLogprobs(torch.nn.Module):
    """A causal LM seen as "per-token log-probs of given targets".

    A module of its own so that FSDP can shard it as the root: its forward then gathers the
    embedding and LM head like any other sharded forward, although they are used piecewise.
    """

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, position_ids, select, targets, temperature: float = 1.0, with_entropy: bool = False,
                chunk_tokens: int = CHUNK_TOKENS, entropy_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        return _logprobs(self.lm, input_ids, position_ids, select, targets, temperature, with_entropy, chunk_tokens,
                         entropy_grad)


def token_logprobs(
    model,
    micro: MicroBatch,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int = CHUNK_TOKENS,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(logprobs [M], entropy [M])`` of ``micro.targets`` (entropy zeros when not asked).

    ``model`` is a causal LM or a :class:`TokenLogprobs` around one. With ``entropy_grad=False``
    the entropy is a metric only, and the faster hand-written backward of the head is used."""
    args = (micro.input_ids, micro.position_ids, micro.select, micro.targets, temperature, with_entropy, chunk_tokens,
            entropy_grad)
    if isinstance(model, TokenLogprobs):
        return model(*args)
    return _logprobs(model, *args)


def _logprobs(model, input_ids, position_ids, select, targets, temperature, with_entropy, chunk_tokens, entropy_grad=True):
    decoder, head = _split_model(model)
    if decoder is None:
        logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits[0]
        return _from_logits(logits[select], targets, temperature, with_entropy)
    hidden = decoder(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state[0]
    hidden = hidden[select]
    grad = torch.is_grad_enabled()
    outs_lp, outs_ent = [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        h = hidden[start : start + chunk_tokens]
        t = targets[start : start + chunk_tokens]
        if grad and not (with_entropy and entropy_grad):
            lp, ent = _HeadLogprobs.apply(h, head.weight, head.bias, t, temperature, with_entropy)
        elif grad:
            lp, ent = checkpoint(_head_chunk, h, head.weight, head.bias, t, temperature, with_entropy, use_reentrant=False)
        else:
            lp, ent = _head_chunk(h, head.weight, head.bias, t, temperature, with_entropy)
        outs_lp.append(lp)
        outs_ent.append(ent)
    if not outs_lp:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(outs_lp), torch.cat(outs_ent)
