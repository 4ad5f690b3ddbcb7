"""How the decoder runs a layer's linear projections: as direct matrix products, LoRA unmerged.

Why not call the modules: through peft, a LoRA projection is five kernels (the base product, the
two small adapter products, a scale and an add), and the q, k and v projections cannot be fused
into one product. In a decode step at batch 256 those are a few microseconds each, and a 7B
model with adapters on every linear layer runs 980 of them a step, uncompiled (28 layers x 7
projections x 5). Here a projection is ``x @ W.T + b`` plus, when it carries an adapter,
``scale * (x @ A.T) @ B.T`` added by the second small product itself (``addmm``), and the q/k/v
projections with their adapters are three products in all (:class:`QKVCopies`): 15 kernels a
layer, 420 a step (140 without adapters).

Why unmerged, not ``W + scale * B @ A`` folded into a copy of ``W``: the base weights are bfloat16,
and an RL step moves the product ``B @ A`` by far less than half a bfloat16 ulp of a weight, so a
merged copy would round most of the update away and generate with another policy than the trainer
scores. Kept apart, the engine computes what peft computes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

# MLP classes whose forward is exactly down_proj(act_fn(gate_proj(x)) * up_proj(x)).
_GATED_MLPS = frozenset({"LlamaMLP", "Qwen2MLP", "Qwen3MLP", "MistralMLP"})


class Linear(NamedTuple):
    """``x @ weight.T + bias``, plus ``scale * (x @ a.T) @ b.T`` when ``a`` (LoRA's A, [rank, in])
    and ``b`` (its B, [out, rank]) are set."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    a: torch.Tensor | None = None
    b: torch.Tensor | None = None
    scale: float = 1.0


def apply(linear: Linear, x: torch.Tensor) -> torch.Tensor:
    return _plus_adapter(linear, x, F.linear(x, linear.weight, linear.bias))


def _plus_adapter(linear: Linear, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out`` (``x``'s base product) plus ``linear``'s adapter product, if it has one."""
    if linear.a is None:
        return out
    rows = out.reshape(-1, out.shape[-1])
    low = F.linear(x, linear.a).reshape(rows.shape[0], -1)
    return torch.addmm(rows, low, linear.b.t(), alpha=linear.scale).view(out.shape)


def stackable(tensors: list[torch.Tensor]) -> bool:
    """Whether ``tensors`` could lie back to back in one storage: plain (no DTensor shard or other
    subclass), materialised (not meta), contiguous, with one dtype, device and trailing shape."""
    first = tensors[0]
    return all(
        type(tensor.data) is torch.Tensor
        and tensor.device.type != "meta"
        and tensor.is_contiguous()
        and (tensor.dtype, tensor.device, tensor.shape[1:]) == (first.dtype, first.device, first.shape[1:])
        for tensor in tensors
    )


def stacked(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """``tensors`` concatenated along their first dimension, as a view (no copy), when they lie
    back to back in one storage (and are :func:`stackable`); else None."""
    if not stackable(tensors):
        return None
    first = tensors[0]
    offset = first.storage_offset()
    for tensor in tensors:
        if (
            tensor.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
            or tensor.storage_offset() != offset
        ):
            return None
        offset += tensor.numel()
    rows = sum(tensor.shape[0] for tensor in tensors)
    return first.detach().as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())


def _peft_lora_linear() -> type | None:
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:  # peft is optional: without it no module is a LoRA layer
        return None
    return LoraLinear


def as_linear(module: Any) -> Linear | None:
    """``module`` as a :class:`Linear` when that computes exactly what its forward does: a plain
    ``nn.Linear``, or a peft LoRA ``Linear`` over one, with at most one active adapter of plain
    LoRA (no DoRA or other variant, no adapter bias), unmerged or disabled, its dropout not at
    work, its factors in the base weight's dtype. None otherwise: the decoder then calls the module."""
    if type(module) is torch.nn.Linear:
        return Linear(module.weight, module.bias)
    lora_linear = _peft_lora_linear()
    if (
        lora_linear is None
        or type(module) is not lora_linear
        or type(module.base_layer) is not torch.nn.Linear
    ):
        return None
    base = module.base_layer
    plain = Linear(base.weight, base.bias)
    if module.merged:  # the base holds the adapters; disabling would unmerge them first
        return None if module.disable_adapters else plain
    if module.disable_adapters:
        return plain
    active = [name for name in module.active_adapters if name in module.lora_A]
    if not active:
        return plain
    if len(active) > 1:
        return None
    name = active[0]
    dropout = module.lora_dropout[name]
    if (
        name in getattr(module, "lora_variant", {})
        or getattr(module, "use_dora", {}).get(name)
        or getattr(module, "lora_bias", {}).get(name)
        or (isinstance(dropout, torch.nn.Dropout) and dropout.training and dropout.p > 0)
    ):
        return None
    a, b = module.lora_A[name].weight, module.lora_B[name].weight
    if a.dtype != base.weight.dtype or b.dtype != base.weight.dtype:
        return None
    return Linear(base.weight, base.bias, a, b, float(module.scaling[name]))


class GatedMLP(NamedTuple):
    """The products of a gated MLP, ``down(act(gate(x)) * up(x))``. ``gate_up``: the gate and up
    base weights (and biases) as one product, where they lie back to back in memory (see
    ``layout.py``); their adapters, if any, are still added apart."""

    gate: Linear
    up: Linear
    down: Linear
    gate_up: Linear | None = None


class LayerPlan(NamedTuple):
    """How one decoder layer's projections run: each a :class:`Linear` or None (call the module).
    ``qkv``: the three as one (a :class:`QKVCopies` copy), else ``q``/``k``/``v`` apart; ``mlp``:
    a :class:`GatedMLP` when the MLP is the gated recipe, else None."""

    qkv: Linear | None
    q: Linear | None
    k: Linear | None
    v: Linear | None
    o: Linear | None
    mlp: GatedMLP | None


def structure(plan: LayerPlan) -> tuple:
    """Which products ``plan`` runs (not on which tensors): module calls, adapters, their scales."""
    mlp = plan.mlp or GatedMLP(None, None, None)
    linears = (plan.qkv, plan.q, plan.k, plan.v, plan.o, mlp.gate, mlp.up, mlp.down)
    return tuple(None if p is None else (p.a is not None, p.scale) for p in linears) + (
        mlp.gate_up is not None,
    )


def mlp_linears(mlp: Any, fuse: bool = False) -> GatedMLP | None:
    """The gate, up and down projections of a gated MLP (its ``act_fn`` applied between); with
    ``fuse``, gate and up as one product where their weights lie back to back in one storage."""
    if type(mlp).__name__ not in _GATED_MLPS or not hasattr(mlp, "act_fn"):
        return None
    parts = tuple(as_linear(getattr(mlp, name, None)) for name in ("gate_proj", "up_proj", "down_proj"))
    if any(part is None for part in parts):
        return None
    gate, up, down = parts
    weight = stacked([gate.weight, up.weight]) if fuse else None
    if weight is None:
        return GatedMLP(gate, up, down)
    if gate.bias is None and up.bias is None:
        return GatedMLP(gate, up, down, Linear(weight, None))
    bias = None if gate.bias is None or up.bias is None else stacked([gate.bias, up.bias])
    return GatedMLP(gate, up, down, None if bias is None else Linear(weight, bias))


def run_mlp(mlp: GatedMLP, act: Any, x: torch.Tensor) -> torch.Tensor:
    if mlp.gate_up is None:
        gate, up = apply(mlp.gate, x), apply(mlp.up, x)
    else:
        gate, up = apply(mlp.gate_up, x).split([mlp.gate.weight.shape[0], mlp.up.weight.shape[0]], dim=-1)
        gate, up = _plus_adapter(mlp.gate, x, gate), _plus_adapter(mlp.up, x, up)
    return apply(mlp.down, act(gate) * up)


class QKVCopies:
    """The q, k and v projections of each layer as one product: a copy of the three weights (and
    biases) stacked, and with adapters a copy of their A factors stacked ([r_q + r_k + r_v, in]) and
    of their B factors as one block-diagonal matrix ([out_q + out_k + out_v, r_q + r_k + r_v]), so
    the adapters add three products' work in two.

    Why: at batch 256 cuBLAS takes as long for the 512-row k or v projection of a 7B model as for
    most of the 3584-row q projection (11-12 us each on an H200, against 21 us for the three in
    one product): about 0.6 ms of a 9 ms decode step. The copies are refreshed from the model's own
    tensors before each generation, in place (captured graphs stay valid). A layer is fused when its
    three projections are :class:`Linear` alike (dtype, device, bias or none; the ones with adapters
    at one scale); a projection without an adapter takes a zero block.
    """

    def __init__(self):
        self.copies: list[Linear | None] = []
        self.layout: list[tuple | None] = []

    @staticmethod
    def fusable(parts: list[Linear | None]) -> bool:
        if any(p is None for p in parts):
            return False
        if len({p.bias is None for p in parts}) != 1:
            return False
        tensors = [t for p in parts for t in (p.weight, p.a, p.b) if t is not None]
        if len({(t.dtype, t.device) for t in tensors}) != 1:
            return False
        return len({p.scale for p in parts if p.a is not None}) <= 1

    @staticmethod
    def _layout(parts: list[Linear]) -> tuple:
        """What the copy depends on beyond the values: each part's weight shape, adapter rank and scale."""
        return tuple((tuple(p.weight.shape), None if p.a is None else (p.a.shape[0], p.scale)) for p in parts)

    def refresh(self, layers: list[list[Linear | None]]) -> list[Linear | None]:
        """The fused projection of each layer (None where not fusable), copied from ``layers``'s
        current q/k/v :class:`Linear` parts: in place where the layout is unchanged."""
        layout = [self._layout(parts) if self.fusable(parts) else None for parts in layers]
        with torch.inference_mode():
            if layout != self.layout:
                self.copies = [
                    self._allocate(parts) if shape else None for parts, shape in zip(layers, layout)
                ]
                self.layout = layout
            for parts, copy in zip(layers, self.copies):
                if copy is not None:
                    self._fill(parts, copy)
        return self.copies

    @staticmethod
    def _allocate(parts: list[Linear]) -> Linear:
        first = parts[0].weight
        weight = torch.empty(
            (sum(p.weight.shape[0] for p in parts), first.shape[1]), dtype=first.dtype, device=first.device
        )
        bias = None if parts[0].bias is None else weight.new_empty(weight.shape[0])
        adapted = [p for p in parts if p.a is not None]
        if not adapted:
            return Linear(weight, bias)
        rank = sum(p.a.shape[0] for p in adapted)
        a = weight.new_empty((rank, first.shape[1]))
        b = weight.new_zeros((weight.shape[0], rank))  # off-block zeros are never written again
        return Linear(weight, bias, a, b, adapted[0].scale)

    @staticmethod
    def _fill(parts: list[Linear], copy: Linear) -> None:
        torch.cat([p.weight for p in parts], out=copy.weight)
        if copy.bias is not None:
            torch.cat([p.bias for p in parts], out=copy.bias)
        if copy.a is None:
            return
        torch.cat([p.a for p in parts if p.a is not None], out=copy.a)
        row = column = 0
        for p in parts:
            out = p.weight.shape[0]
            if p.a is not None:
                rank = p.a.shape[0]
                copy.b[row : row + out, column : column + rank].copy_(p.b)
                column += rank
            row += out

    def pointers(self) -> tuple[int, ...]:
        return tuple(t.data_ptr() for c in self.copies if c is not None for t in c[:4] if t is not None)

    def release(self) -> None:
        self.copies, self.layout = [], []
