"""The actor's weights for an engine that holds its own copy: the adapters alone for engines
that load LoRA adapters (:func:`takes_adapters`), else the weights with the adapters merged in.

For the merged weights, why not peft's ``merge_adapter`` / ``unmerge_adapter``: they add the adapters' product into the
frozen base weights and subtract it again, in the base weights' dtype. Under mixed precision the
frozen base is bfloat16, where ``(w + d) - d`` is not ``w``: the base would drift a little at
every weight sync. Here each merged tensor is a new one, ``base + delta`` computed in float32,
and the module is never touched.
"""

from __future__ import annotations

from collections.abc import Iterator

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


def takes_adapters(engine) -> bool:
    """Whether ``engine`` loads LoRA adapters itself: its ``update_weights`` has a ``lora``
    parameter (the interface's optional keyword) and it does not say ``accepts_lora = False``
    (vLLM started without LoRA support, say). A ``**kwargs`` forwarder (the split engine process)
    does not count: what is behind it is not known here."""
    import inspect

    try:
        parameters = inspect.signature(engine.update_weights).parameters
    except (TypeError, ValueError):
        return False
    return "lora" in parameters and bool(getattr(engine, "accepts_lora", True))


def adapter_state(actor: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The active adapter's tensors under the names PEFT saves them with
    (``peft.get_peft_model_state_dict``): what ``update_weights(..., lora=...)`` receives."""
    from peft import get_peft_model_state_dict

    yield from get_peft_model_state_dict(actor).items()


def adapter_spec(actor: torch.nn.Module) -> dict:
    """What an engine needs beside the tensors: rank, alpha, target modules and dropout, and the
    whole adapter_config.json as ``peft_config`` (the resolved target modules, bias, ...)."""
    config = actor.peft_config[actor.active_adapter]
    saved = {
        key: sorted(value) if isinstance(value, set) else value for key, value in config.to_dict().items()
    }
    return {
        "rank": config.r,
        "alpha": config.lora_alpha,
        "target_modules": saved["target_modules"],
        "dropout": config.lora_dropout,
        "peft_config": saved,
    }
