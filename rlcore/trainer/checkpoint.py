"""Atomic checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint is written into a temporary directory beside its final place, flushed, then renamed
into place; the ``latest`` pointer is replaced atomically afterwards. A run killed at any moment
therefore leaves either the previous checkpoint or the new one, never a half-written one.
The actor is saved with ``save_pretrained`` (adapters only with LoRA), so a checkpoint's ``model``
directory is also a plain Hugging Face directory.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from loguru import logger

from rlcore.errors import RlcoreError

STATE_FILE = "trainer_state.json"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    def __init__(self, run_dir: str | Path, keep: int = 2):
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep

    def save(self, step: int, *, actor, tokenizer, optimizers: dict[str, Any], schedulers: dict[str, Any],
             modules: dict[str, torch.nn.Module], state: dict[str, Any], dist=None) -> Path:
        """Write a checkpoint. With several ranks every rank calls this: rank 0 writes the full
        model, each rank its own optimizer shard and RNG state."""
        from rlcore.trainer.distributed import Distributed, full_state_dict

        dist = dist or Distributed()
        final = self.root / f"step_{step:06d}"
        tmp = self.root / f".tmp-step_{step:06d}"
        if dist.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        dist.barrier()
        model_state = full_state_dict(actor) if dist.enabled else None
        module_states = {n: full_state_dict(m) if dist.enabled else m.state_dict() for n, m in modules.items()}
        if dist.is_main:
            actor.save_pretrained(tmp / "model", safe_serialization=True, **({"state_dict": model_state} if dist.enabled else {}))
            tokenizer.save_pretrained(tmp / "model")
            for name, module_state in module_states.items():
                torch.save(module_state, tmp / f"{name}.pt")
            torch.save({k: s.state_dict() for k, s in schedulers.items()}, tmp / "schedulers.pt")
        torch.save({k: o.state_dict() for k, o in optimizers.items()}, tmp / f"optimizers-rank{dist.rank}.pt")
        torch.save(rng_state(), tmp / f"rng-rank{dist.rank}.pt")
        dist.barrier()
        if dist.is_main:
            # The state file is written last: its presence marks a complete checkpoint.
            write_atomic_text(tmp / STATE_FILE, json.dumps({**state, "step": step}, indent=2))
            _fsync_dir(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            _fsync_dir(self.root)
            write_atomic_text(self.root / "latest", final.name)
            self._prune()
            logger.info("checkpoint saved: {}", final)
        dist.barrier()
        return final

    def _prune(self) -> None:
        done = sorted(p for p in self.root.glob("step_*") if (p / STATE_FILE).exists())
        for old in done[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.root.glob(".tmp-step_*"):
            shutil.rmtree(stale, ignore_errors=True)

    def latest(self) -> Path | None:
        pointer = self.root / "latest"
        if pointer.exists():
            candidate = self.root / pointer.read_text(encoding="utf-8").strip()
            if (candidate / STATE_FILE).exists():
                return candidate
        done = sorted(p for p in self.root.glob("step_*") if (p / STATE_FILE).exists())
        return done[-1] if done else None

    @staticmethod
    def read_state(path: Path) -> dict[str, Any]:
        try:
            return json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise RlcoreError(f"checkpoint {path} is unreadable: {exc}") from None

    @staticmethod
    def restore(path: Path, *, optimizers: dict[str, Any], schedulers: dict[str, Any], modules: dict[str, torch.nn.Module],
                dist=None) -> None:
        from rlcore.trainer.distributed import Distributed

        dist = dist or Distributed()
        for name, module in modules.items():
            module_state = torch.load(path / f"{name}.pt", map_location="cpu", weights_only=True)
            if dist.enabled:
                from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

                set_model_state_dict(module, module_state, options=StateDictOptions(full_state_dict=True))
            else:
                module.load_state_dict(module_state)
        opt_states = torch.load(path / f"optimizers-rank{dist.rank}.pt", map_location="cpu", weights_only=False)
        for k, o in optimizers.items():
            o.load_state_dict(opt_states[k])
        sched_states = torch.load(path / "schedulers.pt", map_location="cpu", weights_only=False)
        for k, s in schedulers.items():
            s.load_state_dict(sched_states[k])
        set_rng_state(torch.load(path / f"rng-rank{dist.rank}.pt", map_location="cpu", weights_only=False))


def load_actor_weights(actor, checkpoint: Path) -> None:
    """Load the checkpoint's actor weights (full model or LoRA adapters) into ``actor``."""
    model_dir = checkpoint / "model"
    if (model_dir / "adapter_model.safetensors").exists():
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(actor, load_file(model_dir / "adapter_model.safetensors"))
        return
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(shard))
    if not state:
        raise RlcoreError(f"checkpoint {checkpoint} has no model weights")
    missing, unexpected = actor.load_state_dict(state, strict=False)
    tied = {k for k in missing if "lm_head" in k or "embed" in k}
    if unexpected or set(missing) - tied:
        raise RlcoreError(
            f"checkpoint {checkpoint} does not match the model: missing {sorted(set(missing) - tied)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    if hasattr(actor, "tie_weights"):
        actor.tie_weights()
