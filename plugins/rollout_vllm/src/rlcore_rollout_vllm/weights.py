"""Moving trainer weights to an engine: buckets in memory, safetensors shards and PEFT adapter
directories on disk (for servers that load from a path)."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping

from rlcore.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    import torch


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
    def coerce(cls, value: Any) -> "LoraSpec":
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

    def adapter_config(self) -> dict[str, Any]:
        if self.peft_config is not None:
            return dict(self.peft_config)
        targets = self.target_modules
        return {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": self.rank,
            "lora_alpha": self.alpha,
            "lora_dropout": self.dropout,
            "target_modules": targets if isinstance(targets, str) else list(targets),
            "bias": "none",
            "fan_in_fan_out": False,
            "inference_mode": True,
        }


def as_pairs(named_tensors: Iterable[tuple[str, "torch.Tensor"]] | Mapping[str, "torch.Tensor"]) -> Iterator[tuple[str, "torch.Tensor"]]:
    if isinstance(named_tensors, Mapping):
        return iter(named_tensors.items())
    return iter(named_tensors)


def buckets(
    named_tensors: Iterable[tuple[str, "torch.Tensor"]] | Mapping[str, "torch.Tensor"], max_bytes: int
) -> Iterator[list[tuple[str, "torch.Tensor"]]]:
    """Group tensors into lists of at most ``max_bytes`` (a larger tensor travels alone)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in as_pairs(named_tensors):
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor.detach()))
        size += nbytes
    if bucket:
        yield bucket


def write_safetensors(named_tensors, directory: str | os.PathLike[str], max_bytes: int) -> list[str]:
    """Write the tensors as safetensors shards (one per bucket) into a fresh ``directory``."""
    from safetensors.torch import save_file

    out = Path(directory)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    written = []
    for i, bucket in enumerate(buckets(named_tensors, max_bytes)):
        path = out / f"model-{i + 1:05d}.safetensors"
        save_file({n: t.contiguous().cpu() for n, t in bucket}, str(path), metadata={"format": "pt"})
        written.append(str(path))
    if not written:
        raise UsageError("update_weights received no tensors")
    return written


def write_adapter(named_tensors, spec: LoraSpec, directory: str | os.PathLike[str]) -> str:
    """Write a PEFT adapter directory (adapter_config.json + adapter_model.safetensors)."""
    from safetensors.torch import save_file

    out = Path(directory)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tensors = {n: t.detach().contiguous().cpu() for n, t in as_pairs(named_tensors)}
    if not tensors:
        raise UsageError("update_weights(lora=...) received no adapter tensors")
    not_lora = [n for n in tensors if "lora_" not in n]
    if not_lora:
        raise UsageError(f"update_weights(lora=...) expects only LoRA adapter tensors, got e.g. {not_lora[0]!r}")
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(json.dumps(spec.adapter_config(), indent=2), encoding="utf-8")
    return str(out)


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
    pairs = list(as_pairs(named_tensors))
    return pairs, {n.split(".")[-2] for n, _ in pairs if len(n.split(".")) >= 2 and n.split(".")[-2].endswith("proj")}
