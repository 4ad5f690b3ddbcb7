"""A decode-shaped forward pass over a slot KV cache, for Llama-family transformers models.

Why not the model's own forward with a transformers cache: a decode step must touch only the new
token's cache entry and attend with one query per sequence, each sequence at its own position,
with fixed tensor shapes so that the step can be captured in a CUDA graph. transformers' static
cache rewrites the whole cache tensor every step (measured on an H200: about 64% of a decode
step's GPU time) and its mask logic runs on the host. So this module re-runs the decoder layer
recipe -- pre-norm attention and MLP with residuals -- by calling the model's OWN submodules
(projections, norms, MLP, rotary embedding and its ``apply_rotary_pos_emb``): peft adapters,
rotary scaling variants and the actor's current parameters all apply as they are, and nothing is
copied. Only the attention over the cache is written here (``decode_attention.py``: on CUDA a
Triton kernel that reads each row's live keys only).

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

    def move_rows(self, source: torch.Tensor, count: int) -> None:
        """Rows ``source`` [count] become rows 0..count-1 (the others keep stale contents)."""
        for tensor in (*self.keys, *self.values):
            tensor[:count] = tensor[source]

    def copy_rows(self, source: torch.Tensor, target: torch.Tensor, length: int) -> None:
        """Positions [0, length) of rows ``source`` are copied into rows ``target``."""
        for tensor in (*self.keys, *self.values):
            tensor[target, :, :length] = tensor[source, :, :length]


class FusedQKV:
    """The q, k and v projections of every layer as one matrix product each.

    Why: at batch 256 cuBLAS takes as long for the 512-row k or v projection of a 7B model as for
    most of the 3584-row q projection (11-12 us each on an H200, against 21 us for the three in
    one product): about 0.6 ms of a 9 ms decode step. The fused weights are a copy, so they are
    refreshed from the model's own projections before each generation (an in-place copy: captured
    graphs stay valid). Only plain ``nn.Linear`` projections are fused; a layer whose projections
    carry LoRA adapters (or any other wrapper) keeps calling them, so the adapters still apply.
    """

    def __init__(self, layers: list):
        self.layers = layers
        self.weights: list[tuple[torch.Tensor, torch.Tensor | None] | None] | None = None

    @staticmethod
    def fusable(attn: Any) -> bool:
        projections = [attn.q_proj, attn.k_proj, attn.v_proj]
        if not all(type(p) is torch.nn.Linear for p in projections):
            return False
        return (
            len({p.bias is None for p in projections}) == 1
            and len({(p.weight.dtype, p.weight.device) for p in projections}) == 1
        )

    def refresh(self) -> None:
        """Copy the projections' current weights in (allocating the copies on first use, and anew
        when a layer's projections changed kind: LoRA layers injected into an engine's copy)."""
        with torch.inference_mode():
            plan = [self.fusable(layer.self_attn) for layer in self.layers]
            if self.weights is not None and plan != [f is not None for f in self.weights]:
                self.weights = None
            if self.weights is None:
                self.weights = []
                for layer in self.layers:
                    attn = layer.self_attn
                    if not self.fusable(attn):
                        self.weights.append(None)
                        continue
                    parts = (attn.q_proj, attn.k_proj, attn.v_proj)
                    weight = torch.cat([p.weight for p in parts])
                    bias = torch.cat([p.bias for p in parts]) if parts[0].bias is not None else None
                    self.weights.append((weight, bias))
                return
            for layer, fused in zip(self.layers, self.weights):
                if fused is None:
                    continue
                attn = layer.self_attn
                torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], out=fused[0])
                if fused[1] is not None:
                    torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias], out=fused[1])

    def release(self) -> None:
        self.weights = None

    def get(self, index: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        return self.weights[index] if self.weights is not None else None

    def pointers(self) -> tuple[int, ...]:
        return tuple(f[0].data_ptr() for f in self.weights or () if f is not None)


class SlotDecoder:
    """Prefill and decode for one supported model over a :class:`SlotCache`."""

    def __init__(self, model: Any, attention: str = "auto", fuse_qkv: bool | None = None):
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
        # Default: fused on CUDA, where the product's shape matters (see FusedQKV).
        self.fused = (
            FusedQKV(self.layers) if (device.type == "cuda" if fuse_qkv is None else fuse_qkv) else None
        )

    def refresh(self) -> None:
        """Bring weight copies (the fused projections) up to date with the model: before generating."""
        if self.fused is not None:
            self.fused.refresh()

    def release(self) -> None:
        if self.fused is not None:
            self.fused.release()

    def _fused(self, index: int):
        return self.fused.get(index) if self.fused is not None else None

    def parameters_signature(self) -> tuple[int, ...]:
        """Storage addresses of every parameter (and of the fused copies): a captured graph is valid
        while these stay put (an optimizer updates in place; an FSDP gather allocates anew)."""
        return tuple(p.data_ptr() for p in self.lm.parameters()) + (
            self.fused.pointers() if self.fused else ()
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

    def _qkv(
        self, attn: Any, x: torch.Tensor, cos, sin, fused=None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[B, T, hidden] -> q [B, heads, T, D], k and v [B, kv_heads, T, D], rotary applied;
        ``fused``: (weight, bias) of the three projections as one (:class:`FusedQKV`)."""
        batch, length = x.shape[:2]
        if fused is not None:
            q, k, v = F.linear(x, *fused).split(
                [self.heads * self.head_dim, *[self.kv_heads * self.head_dim] * 2], dim=-1
            )
        else:
            q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
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
        for index, layer in enumerate(self.layers):
            attn = layer.self_attn
            residual = hidden
            q, k, v = self._qkv(attn, self._norm(layer.input_layernorm, hidden), cos, sin, self._fused(index))
            cache.keys[index][rows, :, :width] = k
            cache.values[index][rows, :, :width] = v
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=self.scaling, enable_gqa=self.groups > 1
            )
            hidden = residual + attn.o_proj(out.transpose(1, 2).reshape(count, width, -1))
            hidden = hidden + layer.mlp(self._norm(layer.post_attention_layernorm, hidden))
        last = hidden[torch.arange(count, device=hidden.device), lengths - 1]
        return self._logits(last)

    def decode(self, cache: SlotCache, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One token for each of the first B rows (``tokens``, ``positions`` [B]) -> logits [B, vocab].

        Shapes depend only on B and the cache capacity, and nothing reads back to the host, so the
        call can be captured in a CUDA graph."""
        batch = tokens.shape[0]
        rows = torch.arange(batch, device=tokens.device)
        hidden = self.embed(tokens[:, None])
        cos, sin = self.inner.rotary_emb(hidden, positions[:, None])
        for index, layer in enumerate(self.layers):
            hidden = self.layer_step(
                layer,
                hidden,
                cos,
                sin,
                cache.keys[index],
                cache.values[index],
                rows,
                positions,
                self._fused(index),
            )
        return self._logits(hidden[:, 0])

    def _layer_step(self, layer, hidden, cos, sin, keys, values, rows, positions, fused=None) -> torch.Tensor:
        """One decoder layer for one new token per row; writes that token's key and value."""
        batch = hidden.shape[0]
        attn = layer.self_attn
        residual = hidden
        q, k, v = self._qkv(attn, self._norm(layer.input_layernorm, hidden), cos, sin, fused)
        keys[rows, :, positions] = k[:, :, 0]
        values[rows, :, positions] = v[:, :, 0]
        # The query heads of one kv head (head h uses kv head h // groups) go in as that kv
        # head's "query positions": one attention call, no repeated keys. A row sees the keys up
        # to its own position; those after it are stale or empty.
        q = q.reshape(batch, self.kv_heads, self.groups, self.head_dim)
        out = decode_attention(q, keys, values, positions, self.scaling, self.attention)
        hidden = residual + attn.o_proj(out.reshape(batch, 1, -1))
        return hidden + layer.mlp(self._norm(layer.post_attention_layernorm, hidden))

    def compile_layers(self, enabled: bool) -> None:
        """torch.compile the per-layer decode step: it fuses the norms, rotary embedding and
        activation into a few kernels. Every layer shares one compiled graph per batch size (the
        layers' parameters are graph inputs, not constants), so compiling costs one layer's worth."""
        self.layer_step = torch.compile(self._layer_step, dynamic=False) if enabled else self._layer_step

    @property
    def compiled(self) -> bool:
        return (
            self.layer_step != self._layer_step
        )  # bound methods: a new object at each access, equal when the same
