"""Copying a trainer's named tensors into the engine's own model copy.

Trainers name parameters in several wrappings of the same Hugging Face model: plain
(``model.layers.0.mlp.up_proj.weight``), peft (``base_model.model.`` prefix, ``.base_layer``
for a LoRA-wrapped linear, ``modules_to_save.<adapter>``), torch.compile (``_orig_mod.``),
DDP (``module.``) and activation-checkpoint / FSDP wrappers. All reduce to one canonical name.
Unmerged LoRA factors cannot be copied into plain weights, so they are refused with a hint;
they arrive through :func:`load_adapter` instead (``update_weights(..., lora=...)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rlcore.errors import UsageError

_WRAPPER_PARTS = frozenset({"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module", "base_layer"})
_LORA_MARKERS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector")


def canonical_name(name: str) -> str | None:
    """The Hugging Face name behind a wrapped parameter name; None for names to skip
    (peft's frozen ``original_module`` copy of a ``modules_to_save`` layer)."""
    parts = [p for p in name.split(".") if p not in _WRAPPER_PARTS]
    if "original_module" in parts:
        return None
    if "modules_to_save" in parts:
        i = parts.index("modules_to_save")
        del parts[i : i + 2]  # "modules_to_save.<adapter name>"
    while parts and parts[0] == "module":
        parts = parts[1:]
    if parts[:2] == ["base_model", "model"]:
        parts = parts[2:]
    return ".".join(parts)


def tensor_table(model: Any) -> dict[str, Any]:
    """Canonical name -> parameter or buffer of ``model`` (tied weights appear under every name)."""
    table: dict[str, Any] = {}
    for name, tensor in model.named_parameters(remove_duplicate=False):
        key = canonical_name(name)
        if key is not None:
            table[key] = tensor
    for name, tensor in model.named_buffers(remove_duplicate=False):
        key = canonical_name(name)
        if key is not None:
            table.setdefault(key, tensor)
    return table


def copy_named_tensors(model: Any, named_tensors: Iterable[tuple[str, Any]] | Mapping[str, Any]) -> int:
    """Copy each ``(name, tensor)`` into ``model`` in place; return how many were copied.

    Raises UsageError for an unmerged LoRA factor, an unknown name or a shape mismatch.
    """
    import torch

    if isinstance(named_tensors, Mapping):
        named_tensors = named_tensors.items()
    table = tensor_table(model)
    copied = 0
    with torch.no_grad():
        for name, value in named_tensors:
            if any(marker in name for marker in _LORA_MARKERS):
                raise UsageError(
                    f"update_weights got the unmerged LoRA tensor {name!r}; send merged weights "
                    "(peft's merge_adapter / merge_and_unload) or let the engine share the actor (share_actor = true)"
                )
            key = canonical_name(name)
            if key is None:
                continue
            target = table.get(key)
            if target is None:
                known = ", ".join(sorted(table)[:5])
                raise UsageError(
                    f"update_weights got {name!r} (read as {key!r}), which the engine's model does not have; "
                    f"expected Hugging Face names such as {known}, ..."
                )
            if tuple(target.shape) != tuple(value.shape):
                raise UsageError(
                    f"update_weights: {name!r} has shape {tuple(value.shape)}, the engine's {key!r} has {tuple(target.shape)}"
                )
            target.copy_(value)
            copied += 1
    return copied


def load_adapter(model: Any, named_tensors: Iterable[tuple[str, Any]] | Mapping[str, Any], lora: Any) -> Any:
    """Load LoRA adapter tensors (PEFT names) into the engine's own ``model``; return the model
    that now generates, a peft model (LoRA layers are injected, from ``lora``'s adapter config,
    the first time; the base weights stay as they are).

    Raises UsageError for tensors that are not the adapter's, or an adapter that does not fit."""
    import dataclasses

    import peft

    from rlcore.engine_kit.weights import adapter_config, pairs

    tensors = dict(pairs(named_tensors))
    if not tensors:
        raise UsageError("update_weights(lora=...) received no adapter tensors")
    stray = [name for name in tensors if not any(marker in name for marker in _LORA_MARKERS)]
    if stray:
        raise UsageError(
            f"update_weights(lora=...) expects only LoRA adapter tensors (PEFT names), got e.g. {stray[0]!r}"
        )
    if not isinstance(model, peft.PeftModel):
        config = adapter_config(lora)
        known = {f.name for f in dataclasses.fields(peft.LoraConfig)}
        settings = {
            k: v
            for k, v in config.items()
            if k in known and k not in ("peft_type", "base_model_name_or_path", "revision")
        }
        # The adapters in the base weights' dtype (peft would make them float32 under a bfloat16
        # base): the trainer computes them in that dtype too, and the fast path then runs them as
        # direct products (projections.py).
        model = peft.get_peft_model(
            model, peft.LoraConfig(**{**settings, "inference_mode": True}), autocast_adapter_dtype=False
        )
        model.eval()
    result = peft.set_peft_model_state_dict(model, tensors)
    unexpected = list(getattr(result, "unexpected_keys", None) or [])
    if unexpected:
        raise UsageError(
            f"update_weights(lora=...): the engine's adapter has no tensor {unexpected[0]!r} "
            f"({len(unexpected)} unexpected); was the spec's target_modules the trainer's?"
        )
    return model
