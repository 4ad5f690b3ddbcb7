"""Variable-length attention for packed training rows: ``[model] attn_implementation = "rlcore_varlen"``.

With ``sdpa``, transformers turns a packed row (positions restarting at 0) into a dense
[N x N] block-diagonal mask, and SDPA then computes every query against every key of the row,
masked or not, in a kernel that accepts arbitrary masks. Here the row's sequences are attended
separately: on CUDA in half precision by torch's flash-attention varlen kernel (only the causal
blocks of each sequence are computed, no mask is built), on CUDA in float32 by one causal SDPA
call over the sequences right-padded to the longest, elsewhere by one causal SDPA call per
sequence. Anything that is not a packed row without padding or cache (generation with a KV
cache, padded batches) goes to transformers' own SDPA path unchanged.

A row whose samples share their prompt (``rlcore.trainer.batch.SharedPrompts``, attached to its
position tensor by :func:`attach_shared`) is cut into query segments that each attend to their own
list of keys, causally aligned at the end: the varlen kernel takes separate query and key bounds
and aligns a shorter query segment with the end of its keys, so a response sees its prompt and its
own earlier tokens. Elsewhere, one SDPA call per segment with that mask.
"""

from __future__ import annotations

import inspect
import math

import torch

NAME = "rlcore_varlen"

_boundaries: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None = (
    None  # (position_ids, cu, cu_cpu, max_len)
)


def _sequence_bounds(
    position_ids: torch.Tensor, rows: int, length: int
) -> tuple[torch.Tensor, list[int], int]:
    """(cu_seqlens int32 on the device, the same as a list, longest length) of a flattened
    [B, L] position tensor: a sequence starts at each row start and wherever the position is 0.
    Every layer sees the same position tensor, so the one host sync is paid once per forward."""
    global _boundaries
    if _boundaries is not None and _boundaries[0] is position_ids:
        return _boundaries[1], _boundaries[2], _boundaries[3]
    flat = position_ids.expand(rows, length).reshape(-1)
    starts = flat == 0
    starts[::length] = True
    cu = torch.cat([starts.nonzero().flatten(), flat.new_tensor([rows * length])]).to(torch.int32)
    cu_list = cu.tolist()
    longest = max(b - a for a, b in zip(cu_list, cu_list[1:]))
    _boundaries = (position_ids, cu, cu_list, longest)
    return cu, cu_list, longest


def _varlen_kernel():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, set()
    return varlen_attn, set(inspect.signature(varlen_attn).parameters)


def flash_kernel_available() -> bool:
    """Whether this torch has the flash varlen kernel (half precision on CUDA)."""
    return _varlen_kernel()[0] is not None


def _flash(query, key, value, cu, longest, scaling, cu_k=None, longest_k=None):
    """query [T, Hq, D], key/value [T, Hkv, D] -> [T, Hq, D], causal within each sequence (with
    ``cu_k``, query segment i attends to key segment i, causally aligned at the segment's end)."""
    varlen_attn, params = _varlen_kernel()
    groups = query.shape[1] // key.shape[1]
    kwargs = {}
    if groups > 1:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    if "is_causal" in params:  # torch 2.10
        kwargs["is_causal"] = True
    else:  # later releases: causal is a window reaching back without limit and forward not at all
        kwargs["window_size"] = (-1, 0)
    default = 1.0 / math.sqrt(query.shape[-1])
    if scaling is not None and not math.isclose(scaling, default):
        if "scale" in params:
            kwargs["scale"] = scaling
        else:
            query = query * (scaling / default)
    if cu_k is None:
        cu_k, longest_k = cu, longest
    return varlen_attn(query, key, value, cu, cu_k, longest, longest_k, **kwargs)


def _padded(query, key, value, cu, cu_list, longest, scaling):
    """The same in one causal SDPA call over the sequences right-padded to the longest (float32
    on CUDA, where the flash kernel does not run): a real query never reaches a padded key, which
    comes after it, so the causal mask alone is exact. One call per layer instead of one per
    sequence (a packed row holds hundreds)."""
    count, total = len(cu_list) - 1, query.shape[0]
    lengths = cu[1:] - cu[:-1]
    sequence = torch.repeat_interleave(
        torch.arange(count, device=query.device), lengths.long(), output_size=total
    )
    slot = sequence * longest + torch.arange(total, device=query.device) - cu[:-1].long()[sequence]

    def pad(t):
        grid = t.new_zeros(count * longest, *t.shape[1:]).index_copy(0, slot, t)
        return grid.view(count, longest, *t.shape[1:]).transpose(1, 2)

    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # not every SDPA kernel takes grouped heads in float32
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(
        pad(query), pad(key), pad(value), is_causal=True, scale=scaling
    )
    return out.transpose(1, 2).reshape(count * longest, *query.shape[1:])[slot]


def _per_sequence(query, key, value, cu_list, scaling):
    """The same with one causal SDPA call per sequence (CPU, float32)."""
    groups = query.shape[1] // key.shape[1]
    out = []
    for a, b in zip(cu_list, cu_list[1:]):
        q, k, v = (t[a:b].transpose(0, 1).unsqueeze(0) for t in (query, key, value))
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scaling, enable_gqa=groups > 1
        )
        out.append(o[0].transpose(0, 1))
    return torch.cat(out)


def _per_segment(query, key, value, shared, scaling):
    """Prompt-sharing segments with one SDPA call each, causally aligned at the end of the keys
    (CPU, and float32 on CUDA)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key[shared.kv_index], value[shared.kv_index]
    q_bounds, k_bounds = shared.q_bounds, shared.k_bounds
    out = []
    for i in range(len(q_bounds) - 1):
        (qa, qb), (ka, kb) = (q_bounds[i], q_bounds[i + 1]), (k_bounds[i], k_bounds[i + 1])
        q, k, v = (
            t[a:b].transpose(0, 1).unsqueeze(0)
            for t, a, b in ((query, qa, qb), (key, ka, kb), (value, ka, kb))
        )
        offset = (kb - ka) - (qb - qa)
        mask = (
            torch.arange(kb - ka, device=q.device)
            <= torch.arange(qb - qa, device=q.device).unsqueeze(1) + offset
        )
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scaling, enable_gqa=groups > 1
        )
        out.append(o[0].transpose(0, 1))
    return torch.cat(out)


def attach_shared(position_ids: torch.Tensor, shared) -> torch.Tensor:
    """Mark a packed row's position tensor with its :class:`SharedPrompts` layout: the attention
    receives the same tensor object in every layer (and again when a checkpointed layer is
    recomputed in the backward), so the layout travels with it through the model."""
    position_ids.rlcore_shared_prompts = shared
    return position_ids


@torch.compiler.disable  # it reads the sequence bounds back to the host: compiled layers break the graph here
def varlen_attention_forward(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, position_ids=None, **kwargs
):
    """transformers attention interface: query [B, Hq, L, D], key/value [B, Hkv, L, D] -> ([B, L, Hq, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    packed = (
        attention_mask is None
        and position_ids is not None
        and query.shape[2] == key.shape[2]
        and getattr(module, "is_causal", True)
        and not (module.training and dropout)
        and kwargs.get("sliding_window") is None
    )
    shared = getattr(position_ids, "rlcore_shared_prompts", None)
    batch, heads, length, dim = query.shape
    if shared is not None and (not packed or batch != 1 or shared.q_bounds[-1] != length):
        raise RuntimeError(
            f"a prompt-sharing layout of {shared.q_bounds[-1]} tokens reached an attention call it "
            f"does not fit ({batch} x {length} tokens, mask {attention_mask is not None}, dropout "
            f"{dropout if module.training else 0}, sliding window {kwargs.get('sliding_window')}): "
            "set [model] share_prompts = false for this model"
        )
    if not packed:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    flat = lambda t: t.transpose(1, 2).reshape(batch * length, t.shape[1], dim)  # noqa: E731
    q, k, v = flat(query), flat(key), flat(value)
    if shared is not None:
        if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and _varlen_kernel()[0] is not None:
            out = _flash(
                q,
                k[shared.kv_index],
                v[shared.kv_index],
                shared.cu_q,
                shared.max_q,
                scaling,
                cu_k=shared.cu_k,
                longest_k=shared.max_k,
            )
        else:
            out = _per_segment(q, k, v, shared, scaling)
        return out.reshape(batch, length, heads, dim), None
    cu, cu_list, longest = _sequence_bounds(position_ids, batch, length)
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and _varlen_kernel()[0] is not None:
        out = _flash(q, k, v, cu, longest, scaling)
    elif q.is_cuda:
        out = _padded(q, k, v, cu, cu_list, longest, scaling)
    else:
        out = _per_sequence(q, k, v, cu_list, scaling)
    return out.reshape(batch, length, heads, dim), None


def varlen_mask(*, batch_size, q_length, kv_length, q_offset=0, kv_offset=0, attention_mask=None, **kwargs):
    """No mask at all for a row without padding or cache (the attention finds the sequences from
    the positions); transformers' SDPA mask otherwise."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None and q_length == kv_length and q_offset == 0 and kv_offset == 0:
        return None
    return sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        attention_mask=attention_mask,
        **kwargs,
    )


def register() -> None:
    """Make ``rlcore_varlen`` a valid ``attn_implementation`` for transformers models (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, varlen_attention_forward)
    AttentionMaskInterface.register(NAME, varlen_mask)
