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

from rlcore.trainer.attention import NAME as VARLEN_ATTENTION
from rlcore.trainer.attention import attach_shared
from rlcore.trainer.batch import MicroBatch
from rlcore.trainer.compiling import kernel, packed_forward

CHUNK_TOKENS = 1024


def _head_chunk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
):
    return _from_logits(torch.nn.functional.linear(hidden, weight, bias), targets, temperature, with_entropy)


def _from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool):
    """Through autograd (the entropy can carry a gradient)."""
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


@kernel
def _logit_stats(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool):
    """(log-prob of the target, entropy, log-sum-exp), float32 [N] each, from logits [N, V].
    Compiled, this is one fused pass over the chunk's logits in their own dtype."""
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    lse = torch.logsumexp(x, dim=-1)
    logp = x.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if with_entropy:
        entropy = lse - (torch.exp(x - lse.unsqueeze(-1)) * x).sum(-1)
    else:
        entropy = torch.zeros_like(logp)
    return logp, entropy, lse


@kernel
def _logits_grad(
    logits: torch.Tensor,
    lse: torch.Tensor,
    targets: torch.Tensor,
    grad_logp: torch.Tensor,
    temperature: float,
):
    """d loss / d logits = (onehot(target) - softmax(logits / T)) * grad / T, in the logits' dtype.
    Compiled, this is one element-wise kernel: the logits read once, the gradient written once."""
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    probs = torch.exp(x - lse.unsqueeze(-1))
    hit = torch.arange(x.shape[-1], device=x.device) == targets.unsqueeze(-1)
    scale = grad_logp.unsqueeze(-1) / temperature
    return ((hit.to(x.dtype) - probs) * scale).to(logits.dtype)


class _HeadLogprobs(torch.autograd.Function):
    """lm_head, log-softmax and target gather for one chunk, with a hand-written backward.

    Why: through autograd (checkpointed), a chunk's float32 [tokens x vocab] logits are written
    and read a dozen times between the recomputed forward and the backward of log_softmax and
    gather. Here the forward keeps only the log-sum-exp per token, and the backward rebuilds the
    logits once and turns them into ``(onehot - softmax) * grad`` (:func:`_logits_grad`). The
    entropy returned is a metric (no gradient); a loss with an entropy term takes the autograd
    path."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature: float, with_entropy: bool):
        logits = torch.nn.functional.linear(hidden, weight, bias)
        logp, entropy, lse = _logit_stats(logits, targets, temperature, with_entropy)
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        logits = torch.nn.functional.linear(hidden, weight, bias)
        grad = _logits_grad(logits, lse, targets, grad_logp, ctx.temperature)
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

    def forward(
        self,
        input_ids,
        position_ids,
        select,
        targets,
        temperature: float = 1.0,
        with_entropy: bool = False,
        chunk_tokens: int = CHUNK_TOKENS,
        entropy_grad: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return _logprobs(
            self.lm,
            input_ids,
            position_ids,
            select,
            targets,
            temperature,
            with_entropy,
            chunk_tokens,
            entropy_grad,
        )


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
    position_ids = micro.position_ids
    if micro.shared is not None:
        _require_varlen_attention(model)
        position_ids = attach_shared(position_ids, micro.shared)
    args = (
        micro.input_ids,
        position_ids,
        micro.select,
        micro.targets,
        temperature,
        with_entropy,
        chunk_tokens,
        entropy_grad,
    )
    if isinstance(model, TokenLogprobs):
        return model(*args)
    return _logprobs(model, *args)


def _require_varlen_attention(model) -> None:
    """A prompt-sharing micro-batch is only right under rlcore's varlen attention: any other
    attention would read the packed row as one long sequence."""
    lm = model.lm if isinstance(model, TokenLogprobs) else model
    attention = getattr(getattr(lm, "config", None), "_attn_implementation", None)
    if attention != VARLEN_ATTENTION:
        raise RuntimeError(
            f"a prompt-sharing micro-batch needs the {VARLEN_ATTENTION!r} attention, the model runs "
            f"{attention!r} ([model] share_prompts)"
        )


def _logprobs(
    model,
    input_ids,
    position_ids,
    select,
    targets,
    temperature,
    with_entropy,
    chunk_tokens,
    entropy_grad=True,
):
    decoder, head = _split_model(model)
    if decoder is None:
        logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits[0]
        return _from_logits(logits[select], targets, temperature, with_entropy)
    with packed_forward():
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
            lp, ent = checkpoint(
                _head_chunk, h, head.weight, head.bias, t, temperature, with_entropy, use_reentrant=False
            )
        else:
            lp, ent, _ = _logit_stats(
                torch.nn.functional.linear(h, head.weight, head.bias), t, temperature, with_entropy
            )
        outs_lp.append(lp)
        outs_ent.append(ent)
    if not outs_lp:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(outs_lp), torch.cat(outs_ent)
