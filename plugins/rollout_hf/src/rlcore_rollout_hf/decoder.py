"""A decode-shaped forward pass over a slot KV cache, for Llama-family transformers models.

Why not the model's own forward with a transformers cache: a decode step must touch only the new
token's cache entry and attend with one query per sequence, each sequence at its own position,
with fixed tensor shapes so that the step can be captured in a CUDA graph. transformers' static
cache rewrites the whole cache tensor every step (measured on an H200: about 64% of a decode
step's GPU time) and its mask logic runs on the host. So this module re-runs the decoder layer
recipe -- pre-norm attention and MLP with residuals -- over the model's OWN submodules and
tensors (norms, rotary embedding and its ``apply_rotary_pos_emb``, and the projections' weights and
LoRA factors, run as direct products by ``projections.py``; a projection or MLP of another kind is
called as a module): peft adapters, rotary scaling variants and the actor's current parameters all
apply as they are. The attention over the cache is written here (``decode_attention.py``: on CUDA
a Triton kernel that reads each row's live keys only).

Architectures whose layers follow that recipe are listed in :data:`SUPPORTED_MODEL_TYPES`;
:func:`unsupported_reason` says why any other model must use the plain path.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from rlcore_rollout_hf.decode_attention import decode_attention, usable
from rlcore_rollout_hf.layout import lay_out_gate_up
from rlcore_rollout_hf.projections import (
    LayerPlan,
    Linear,
    QKVCopies,
    apply,
    as_linear,
    mlp_linears,
    run_mlp,
    structure,
)

# Norm classes that are exactly ``weight * rms_normalise(x)``: run as one fused F.rms_norm call
# instead of the module's seven element-wise kernels.
_PLAIN_RMS_NORMS = frozenset({"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm"})

# model_type -> the layer recipe is: h += attn(input_layernorm(h)); h += mlp(post_attention_layernorm(h)),
# with q/k/v/o projections, optional per-head q_norm/k_norm (qwen3), rotary embeddings, no softcapping.
SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})


def causal_lm(model: Any) -> Any:
    """The transformers ``*ForCausalLM`` under a peft wrapper (whose adapters stay injected)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def unsupported_reason(model: Any) -> str | None:
    """None when :class:`SlotDecoder` can run ``model``; else a sentence saying why not."""
    lm = causal_lm(model)
    config = getattr(lm, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {', '.join(sorted(SUPPORTED_MODEL_TYPES))}"
    inner = getattr(lm, "model", None)
    if (
        inner is None
        or not hasattr(inner, "layers")
        or not hasattr(inner, "rotary_emb")
        or not hasattr(lm, "lm_head")
    ):
        return "the model lacks the usual .model.layers / .model.rotary_emb / .lm_head layout"
    for layer in inner.layers:
        attn = getattr(layer, "self_attn", None)
        needed = ("q_proj", "k_proj", "v_proj", "o_proj")
        if attn is None or not all(hasattr(attn, name) for name in needed):
            return "a decoder layer lacks self_attn.q_proj/k_proj/v_proj/o_proj"
        if not all(hasattr(layer, name) for name in ("input_layernorm", "post_attention_layernorm", "mlp")):
            return "a decoder layer lacks input_layernorm / post_attention_layernorm / mlp"
        if getattr(attn, "sliding_window", None):
            return "sliding-window attention layers are not supported"
    window = getattr(config, "sliding_window", None)
    windowed = model_type == "mistral" or getattr(config, "use_sliding_window", False)
    if window and (windowed or "sliding_attention" in (getattr(config, "layer_types", None) or ())):
        return f"sliding-window attention (sliding_window = {window}) is not supported"
    if getattr(config, "attn_logit_softcapping", None) or getattr(config, "final_logit_softcapping", None):
        return "logit softcapping is not supported"
    return None


class SlotCache:
    """Per-layer key and value tensors [rows, kv_heads, capacity, head_dim]: one row per sequence
    being decoded. A row is written at its own position; rows are moved (compacted) as a whole."""

    def __init__(self, layers: int, rows: int, kv_heads: int, capacity: int, head_dim: int, dtype, device):
        shape = (rows, kv_heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.rows = rows
        self.capacity = capacity

    def move_rows(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """Rows ``source`` are copied into rows ``target`` (the two sets disjoint)."""
        for tensor in (*self.keys, *self.values):
            tensor[target] = tensor[source]

    def copy_rows(self, source: torch.Tensor, target: torch.Tensor, length: int) -> None:
        """Positions [0, length) of rows ``source`` are copied into rows ``target``."""
        for tensor in (*self.keys, *self.values):
            tensor[target, :, :length] = tensor[source, :, :length]


# Before the first refresh: every projection is called as a module.
_MODULE_CALLS = LayerPlan(None, None, None, None, None, None)


class SlotDecoder:
    """Prefill and decode for one supported model over a :class:`SlotCache`."""

    def __init__(
        self, model: Any, attention: str = "auto", fuse_qkv: bool | None = None, fuse_mlp: bool | None = None
    ):
        reason = unsupported_reason(model)
        if reason:
            raise ValueError(reason)
        self.lm = causal_lm(model)
        self.inner = self.lm.model
        self.layers = list(self.inner.layers)
        config = self.lm.config
        attn = self.layers[0].self_attn
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(attn, "head_dim", None) or config.hidden_size // self.heads
        self.groups = self.heads // self.kv_heads
        self.scaling = float(getattr(attn, "scaling", self.head_dim**-0.5))
        self.apply_rope: Callable = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        self.embed = self.lm.get_input_embeddings()
        self.layer_step = self._layer_step
        self.prefill_layer = self._prefill_layer
        device = self.embed.weight.device
        if attention == "triton" and not usable(device, self.head_dim):
            raise ValueError(
                f"the Triton decode attention needs CUDA, Triton and a power-of-two head size (here {device}, "
                f"head size {self.head_dim})"
            )
        # "triton": the live-keys kernel; "sdpa": one masked SDPA call over the whole capacity.
        self.attention = (
            "triton"
            if attention == "triton" or (attention == "auto" and usable(device, self.head_dim))
            else "sdpa"
        )
        # Default: q/k/v fused on CUDA, where the product's shape matters (see QKVCopies).
        self.fused = QKVCopies() if (device.type == "cuda" if fuse_qkv is None else fuse_qkv) else None
        # Default: gate and up as one product on CUDA, their weights moved back to back (layout.py).
        self.fuse_mlp = device.type == "cuda" if fuse_mlp is None else fuse_mlp
        # False: every projection and MLP is called as a module (what peft's own layers cost; for
        # benchmarks to compare against).
        self.direct = True
        self.plans: list[LayerPlan] | None = None

    def refresh(self) -> None:
        """Read each layer's projections anew and bring the fused copies up to date with the model:
        before generating (adapters may have been injected, merged or disabled since)."""
        if not self.direct:
            self.plans = None
            return
        if self.fuse_mlp:  # again after every move of the weights (an offload, a trainer's .to())
            lay_out_gate_up(self.lm, self.layers)
        separate = [
            [
                as_linear(layer.self_attn.q_proj),
                as_linear(layer.self_attn.k_proj),
                as_linear(layer.self_attn.v_proj),
            ]
            for layer in self.layers
        ]
        fused = self.fused.refresh(separate) if self.fused is not None else [None] * len(self.layers)
        self.plans = [
            LayerPlan(
                qkv, *qkv_parts, as_linear(layer.self_attn.o_proj), mlp_linears(layer.mlp, fuse=self.fuse_mlp)
            )
            for layer, qkv_parts, qkv in zip(self.layers, separate, fused)
        ]

    def release(self) -> None:
        self.plans = None
        if self.fused is not None:
            self.fused.release()

    def _plan(self, index: int) -> LayerPlan:
        return self.plans[index] if self.plans is not None else _MODULE_CALLS

    def parameters_signature(self) -> tuple:
        """Storage addresses of every parameter (and of the fused copies), and which products each
        layer runs: a captured graph is valid while these stay put (an optimizer updates in place;
        an FSDP gather allocates anew; disabling adapters changes the products, not the tensors)."""
        return (
            tuple(p.data_ptr() for p in self.lm.parameters())
            + (self.fused.pointers() if self.fused is not None else ())
            + tuple(map(structure, self.plans or ()))
        )

    def new_cache(self, rows: int, capacity: int) -> SlotCache:
        weight = self.embed.weight
        return SlotCache(
            len(self.layers), rows, self.kv_heads, capacity, self.head_dim, weight.dtype, weight.device
        )

    @staticmethod
    def _norm(module: Any, x: torch.Tensor) -> torch.Tensor:
        if type(module).__name__ in _PLAIN_RMS_NORMS:
            return F.rms_norm(x, (x.shape[-1],), module.weight, module.variance_epsilon)
        return module(x)

    @staticmethod
    def _project(linear: Linear | None, module: Any, x: torch.Tensor) -> torch.Tensor:
        return apply(linear, x) if linear is not None else module(x)

    def _qkv(
        self, attn: Any, x: torch.Tensor, cos, sin, plan: LayerPlan
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[B, T, hidden] -> q [B, heads, T, D], k and v [B, kv_heads, T, D], rotary applied."""
        batch, length = x.shape[:2]
        if plan.qkv is not None:
            q, k, v = apply(plan.qkv, x).split(
                [self.heads * self.head_dim, *[self.kv_heads * self.head_dim] * 2], dim=-1
            )
        else:
            q = self._project(plan.q, attn.q_proj, x)
            k = self._project(plan.k, attn.k_proj, x)
            v = self._project(plan.v, attn.v_proj, x)
        q = q.view(batch, length, self.heads, self.head_dim)
        k = k.view(batch, length, self.kv_heads, self.head_dim)
        v = v.view(batch, length, self.kv_heads, self.head_dim)
        if hasattr(attn, "q_norm"):
            q, k = self._norm(attn.q_norm, q), self._norm(attn.k_norm, k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = self.apply_rope(q, k, cos, sin)
        return q, k, v

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm.lm_head(self._norm(self.inner.norm, hidden))

    def prefill(
        self, cache: SlotCache, input_ids: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor
    ) -> torch.Tensor:
        """Run right-padded prompts ``input_ids`` [n, T] (true ``lengths`` [n]) into cache ``rows``
        [n]; return each prompt's next-token logits [n, vocab]. Causal attention makes the padding
        after a prompt invisible to it; the cache entries written for padding are overwritten by
        decoding before any query can see them."""
        count, width = input_ids.shape
        positions = torch.arange(width, device=input_ids.device).expand(count, width)
        hidden = self.embed(input_ids)
        cos, sin = self.inner.rotary_emb(hidden, positions)
        hidden, mlp_out = self._through_layers(self.prefill_layer, hidden, cos, sin, cache, rows)
        last = torch.arange(count, device=hidden.device), lengths - 1
        return self._logits(hidden[last] + mlp_out[last])

    def _prefill_layer(
        self, layer, hidden, mlp_out, cos, sin, keys, values, rows, plan
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoder layer over whole prompts [n, T]; writes their keys and values into ``rows``.
        Like :meth:`_layer_step`, it takes the previous layer's MLP output to add at its input norm."""
        count, width = hidden.shape[:2]
        attn = layer.self_attn
        hidden = hidden + mlp_out
        residual = hidden
        q, k, v = self._qkv(attn, self._norm(layer.input_layernorm, hidden), cos, sin, plan)
        keys[rows, :, :width] = k
        values[rows, :, :width] = v
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.scaling, enable_gqa=self.groups > 1
        )
        hidden = residual + self._project(plan.o, attn.o_proj, out.transpose(1, 2).reshape(count, width, -1))
        return hidden, self._mlp(layer, plan, self._norm(layer.post_attention_layernorm, hidden))

    def decode(self, cache: SlotCache, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One token for each of the first B rows (``tokens``, ``positions`` [B]) -> logits [B, vocab].

        Shapes depend only on B and the cache capacity, and nothing reads back to the host, so the
        call can be captured in a CUDA graph."""
        batch = tokens.shape[0]
        rows = torch.arange(batch, device=tokens.device)
        hidden = self.embed(tokens[:, None])
        cos, sin = self.inner.rotary_emb(hidden, positions[:, None])
        hidden, mlp_out = self._through_layers(self.layer_step, hidden, cos, sin, cache, rows, positions)
        return self._logits((hidden + mlp_out)[:, 0])

    def _through_layers(self, step, hidden, cos, sin, cache: SlotCache, *inputs):
        """``step`` (a layer function: decode or prefill) over every layer with that layer's cache
        and projections -> the last layer's residual stream and its MLP output, not yet added."""
        mlp_out = torch.zeros_like(hidden)
        for index, layer in enumerate(self.layers):
            hidden, mlp_out = step(
                layer,
                hidden,
                mlp_out,
                cos,
                sin,
                cache.keys[index],
                cache.values[index],
                *inputs,
                self._plan(index),
            )
        return hidden, mlp_out

    def _layer_step(
        self, layer, hidden, mlp_out, cos, sin, keys, values, rows, positions, plan
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoder layer for one new token per row; writes that token's key and value.

        The previous layer's MLP output ``mlp_out`` joins the residual stream here rather than at
        the end of that layer: compiled, the add then fuses with this layer's input norm (one
        kernel a layer fewer, as vLLM's fused add + RMS norm). The residual stream is the same sums
        in the same order; compiled, the norm may read the sum before its rounding to the cache's
        dtype, as the post-attention norm inside the layer already did. Returns (the residual
        stream after attention, this layer's MLP output)."""
        batch = hidden.shape[0]
        attn = layer.self_attn
        hidden = hidden + mlp_out
        residual = hidden
        q, k, v = self._qkv(attn, self._norm(layer.input_layernorm, hidden), cos, sin, plan)
        keys[rows, :, positions] = k[:, :, 0]
        values[rows, :, positions] = v[:, :, 0]
        # The query heads of one kv head (head h uses kv head h // groups) go in as that kv
        # head's "query positions": one attention call, no repeated keys. A row sees the keys up
        # to its own position; those after it are stale or empty.
        q = q.reshape(batch, self.kv_heads, self.groups, self.head_dim)
        out = decode_attention(q, keys, values, positions, self.scaling, self.attention)
        hidden = residual + self._project(plan.o, attn.o_proj, out.reshape(batch, 1, -1))
        return hidden, self._mlp(layer, plan, self._norm(layer.post_attention_layernorm, hidden))

    @staticmethod
    def _mlp(layer: Any, plan: LayerPlan, x: torch.Tensor) -> torch.Tensor:
        # The activation comes from the layer, not the plan: compiled, every layer then shares one graph.
        return run_mlp(plan.mlp, layer.mlp.act_fn, x) if plan.mlp is not None else layer.mlp(x)

    def compile_layers(self, enabled: bool) -> None:
        """torch.compile the per-layer decode step and prefill: it fuses the norms, rotary embedding
        and activation into a few kernels. Every layer shares one compiled graph (the layers'
        parameters are graph inputs, not constants), so compiling costs one layer's worth: the
        decode step once per batch size (its shapes are fixed for CUDA graphs), the prefill once
        for any shape (eager, its element-wise and copy kernels were 20% of a 7B prefill on an H100)."""
        self.layer_step = torch.compile(self._layer_step, dynamic=False) if enabled else self._layer_step
        self.prefill_layer = (
            torch.compile(self._prefill_layer, dynamic=True) if enabled else self._prefill_layer
        )

    @property
    def compiled(self) -> bool:
        return (
            self.layer_step != self._layer_step
        )  # bound methods: a new object at each access, equal when the same
