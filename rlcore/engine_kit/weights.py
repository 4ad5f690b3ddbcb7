"""Trainer weights on their way to an inference engine: size-bounded buckets in memory, and on
disk (for servers that load from a path) safetensors shards and PEFT adapter directories.

torch and safetensors are imported only by the functions that write tensors, so the module
itself stays light.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlcore.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    import torch

NamedTensors = Iterable[tuple[str, "torch.Tensor"]] | Mapping[str, "torch.Tensor"]


def pairs(named_tensors: NamedTensors) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs from a mapping or an iterable of pairs."""
    return iter(named_tensors.items()) if isinstance(named_tensors, Mapping) else iter(named_tensors)


def buckets(named_tensors: NamedTensors, max_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of at most ``max_bytes`` (a larger tensor travels alone), so a full
    update never holds more than one bucket of extra copies."""
    bucket: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in pairs(named_tensors):
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor.detach()))
        size += nbytes
    if bucket:
        yield bucket


def fresh_dir(directory: str | Path) -> Path:
    """``directory``, emptied (a previous version there is removed)."""
    out = Path(directory)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    return out


def write_shards(
    named_tensors: NamedTensors, directory: str | Path, max_bytes: int, *, index: bool = True
) -> list[Path]:
    """A Hugging Face style checkpoint in a fresh ``directory``: one safetensors shard per bucket
    and, with ``index``, ``model.safetensors.index.json`` (which some loaders read)."""
    from safetensors.torch import save_file

    out = fresh_dir(directory)
    shards: list[Path] = []
    weight_map: dict[str, str] = {}
    total = 0
    for i, bucket in enumerate(buckets(named_tensors, max_bytes)):
        path = out / f"model-{i + 1:05d}.safetensors"
        tensors = {name: t.contiguous().cpu() for name, t in bucket}
        save_file(tensors, str(path), metadata={"format": "pt"})
        shards.append(path)
        for name, t in tensors.items():
            weight_map[name] = path.name
            total += t.numel() * t.element_size()
    if not shards:
        raise UsageError("update_weights received no tensors")
    if index:
        body = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(body, indent=1), encoding="utf-8")
    return shards


def adapter_config(lora: Any) -> dict[str, Any]:
    """PEFT's adapter_config.json for ``lora``: a dict (taken as adapter_config.json when it has
    ``peft_type``, its ``peft_config`` entry when it has one, else rank/alpha/target_modules/dropout), or any object with ``rank`` and
    ``alpha`` (rlcore's ``[model.lora]`` table, the vllm plugin's LoraSpec), or with ``peft_config``."""
    if isinstance(lora, Mapping):
        if "peft_type" in lora:
            return dict(lora)
        if lora.get("peft_config"):
            return dict(lora["peft_config"])
        get = lora.get
    else:
        if getattr(lora, "peft_config", None):
            return dict(lora.peft_config)
        get = lambda key, default=None: getattr(lora, key, default)  # noqa: E731
    rank, alpha = get("rank", get("r")), get("alpha", get("lora_alpha"))
    if rank is None or alpha is None:
        raise UsageError(f"update_weights(lora=...) needs the adapter's rank and alpha, got {lora!r}")
    targets = get("target_modules", "all-linear")
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": int(rank),
        "lora_alpha": float(alpha),
        "lora_dropout": float(get("dropout", 0.0) or 0.0),
        "target_modules": targets if isinstance(targets, str) else list(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }


def adapter_name(lora: Any) -> str:
    """The adapter's ``name`` (engines add a version to it), ``rlcore`` when it has none."""
    name = lora.get("name") if isinstance(lora, Mapping) else getattr(lora, "name", None)
    return str(name or "rlcore")


def write_adapter(named_tensors: NamedTensors, lora: Any, directory: str | Path) -> Path:
    """A PEFT adapter directory (adapter_config.json + adapter_model.safetensors); ``lora`` is
    anything :func:`adapter_config` takes."""
    from safetensors.torch import save_file

    tensors = {name: t.detach().contiguous().cpu() for name, t in pairs(named_tensors)}
    if not tensors:
        raise UsageError("update_weights(lora=...) received no adapter tensors")
    stray = [name for name in tensors if "lora_" not in name]
    if stray:
        raise UsageError(
            f"update_weights(lora=...) expects only LoRA adapter tensors (PEFT names), got e.g. {stray[0]!r}"
        )
    config = adapter_config(lora)
    out = fresh_dir(directory)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return out


class AdapterFolder:
    """A private temporary folder for the adapters an in-process engine loads from disk, one PEFT
    directory per sync. Why: every sync writes a new adapter, and a long LoRA run would otherwise
    leave one copy per step behind. The folder is made at the first adapter (a run without LoRA, or
    an engine never closed, leaves none); :meth:`discard` removes an adapter the engine has dropped;
    :meth:`close` removes the folder."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.root: Path | None = None

    def write(self, named_tensors: NamedTensors, lora: Any, name: str) -> Path:
        if self.root is None:
            import tempfile

            self.root = Path(tempfile.mkdtemp(prefix=self.prefix))
        return write_adapter(named_tensors, lora, self.root / name)

    def discard(self, name: str) -> None:
        if self.root is not None:
            shutil.rmtree(self.root / name, ignore_errors=True)

    def close(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
