"""What vLLM needs beside the shared weight helpers (:mod:`rlcore.engine_kit.weights`): the adapter
description it is given, and the renaming its LoRA-wrapped layers need."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rlcore.engine_kit.weights import pairs


@dataclass
class LoraSpec:
    """What an engine needs beside the adapter tensors (PEFT names, as from
    ``peft.get_peft_model_state_dict``). ``peft_config`` (an adapter_config.json dict) wins
    over the other fields when given."""

    rank: int
    alpha: float
    target_modules: list[str] | str = "all-linear"
    dropout: float = 0.0
    peft_config: dict[str, Any] | None = None
    name: str = "rlcore"
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def coerce(cls, value: Any) -> LoraSpec:
        """Accept a LoraSpec, a dict, or any object with rank/alpha/target_modules (rlcore's LoraTable)."""
        if isinstance(value, LoraSpec):
            return value
        if isinstance(value, Mapping):
            return cls(**value)
        return cls(
            rank=int(value.rank),
            alpha=float(value.alpha),
            target_modules=getattr(value, "target_modules", "all-linear"),
            dropout=float(getattr(value, "dropout", 0.0)),
            peft_config=getattr(value, "peft_config", None),
        )


def with_base_layer(named_tensors, wrapped: set[str]):
    """Rename ``...<module>.weight`` to ``...<module>.base_layer.weight`` for modules that vLLM
    wrapped for LoRA (with ``enable_lora`` its layers hold the base weights one level down, and
    the model's ``load_weights`` does not map plain Hugging Face names onto them)."""
    for name, tensor in named_tensors:
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in wrapped and parts[-1] in ("weight", "bias"):
            name = ".".join([*parts[:-1], "base_layer", parts[-1]])
        yield name, tensor


def proj_modules(named_tensors) -> tuple[list, set[str]]:
    """For servers started with LoRA: the modules named ``*_proj`` (the linear layers vLLM wraps)."""
    named = list(pairs(named_tensors))
    return named, {
        n.split(".")[-2] for n, _ in named if len(n.split(".")) >= 2 and n.split(".")[-2].endswith("proj")
    }
