"""The actor's weights with LoRA adapters merged in, for engines that hold plain weights.

Why not peft's ``merge_adapter`` / ``unmerge_adapter``: they add the adapters' product into the
frozen base weights and subtract it again, in the base weights' dtype. Under mixed precision the
frozen base is bfloat16, where ``(w + d) - d`` is not ``w``: the base would drift a little at
every weight sync. Here each merged tensor is a new one, ``base + delta`` computed in float32,
and the module is never touched.
"""

from __future__ import annotations

from typing import Iterator

import torch


def merged_state(actor: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(Hugging Face name, tensor)`` of ``actor``; a peft model yields its base weights with
    every active LoRA adapter merged in (adapter tensors themselves are not yielded)."""
    if not (hasattr(actor, "get_base_model") and hasattr(actor, "peft_config")):
        yield from actor.state_dict().items()
        return
    from peft.tuners.lora import LoraLayer

    base = actor.get_base_model()
    lora_layers = {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}
    with torch.no_grad():
        for name, tensor in base.state_dict().items():
            if "lora_" in name:
                continue
            owner, _, leaf = name.rpartition(".")
            layer = lora_layers.get(owner.removesuffix(".base_layer"))
            if layer is not None and owner.endswith(".base_layer") and leaf == "weight":
                deltas = [layer.get_delta_weight(a) for a in layer.active_adapters if a in layer.lora_A]
                if deltas and not layer.merged:
                    tensor = (tensor.float() + sum(d.float() for d in deltas)).to(tensor.dtype)
            yield name.replace(".base_layer", ""), tensor
