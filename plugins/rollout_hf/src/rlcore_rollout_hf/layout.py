"""Laying a gated MLP's gate and up weights back to back in memory, so that the decoder multiplies
them as one product without a copy.

Why: one product of twice the width reads the weights faster than two (a 7B layer on an H100:
111 against 127 us at 16 rows, 122 against 143 us at 256; a decode step 2% faster), and vLLM
multiplies the two as one too (``gate_up_proj``). A stacked copy of both would cost 7.6 GB beside
a shared 7B actor; moving the existing weights into one allocation costs nothing after the move.
The parameters stay the same objects with the same values, dtype and device (only their ``.data``
now points into the shared allocation), so the trainer, its optimizer and checkpoints see no
difference: ``save_pretrained`` clones tensors that share a storage without overlapping.

Not touched: parameters that FSDP manages (it frees and refills their storage itself), DTensors,
meta tensors, and pairs that differ in dtype, device or width.
"""

from __future__ import annotations

from typing import Any

import torch

from rlcore_rollout_hf.projections import as_linear, stackable, stacked


def _fsdp_managed(modules: list[Any]) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return any(isinstance(m, FSDPModule) for m in modules)


def place_back_to_back(params: list[torch.nn.Parameter]) -> bool:
    """Move ``params``' values into one new allocation, in order, each parameter's ``.data`` a
    view of its part; True when they moved (False: already so, or not movable)."""
    movable = all(isinstance(p, torch.nn.Parameter) for p in params) and stackable(params)
    if not movable or stacked(params) is not None:
        return False
    first = params[0]
    # Outside inference mode: the new storage becomes the trainer's parameters' data.
    with torch.inference_mode(False), torch.no_grad():
        block = torch.empty(
            (sum(p.shape[0] for p in params), *first.shape[1:]), dtype=first.dtype, device=first.device
        )
        start = 0
        for param in params:
            part = block[start : start + param.shape[0]]
            part.copy_(param.data)
            param.data = part
            start += param.shape[0]
    return True


def lay_out_gate_up(model_root: Any, layers: list[Any]) -> int:
    """Lay each layer's gate and up weights (and biases, when both have them) back to back; return
    how many layers' weights moved. Nothing moves under FSDP."""
    if _fsdp_managed([model_root, *layers]):
        return 0
    moved = 0
    for layer in layers:
        mlp = getattr(layer, "mlp", None)
        gate, up = (as_linear(getattr(mlp, name, None)) for name in ("gate_proj", "up_proj"))
        if gate is None or up is None:
            continue
        moved += place_back_to_back([gate.weight, up.weight])
        if gate.bias is not None and up.bias is not None:
            place_back_to_back([gate.bias, up.bias])
    return moved
