"""torch.compile for the trainer's own forward and backward passes: ``[model] compile``.

Why: at 0.5B on an H200, half of an eager actor update's GPU time was element-wise kernels (the
norms' float32 round trips, rotary embedding, the activation, the log-softmax over the
vocabulary), not matrix products (docs/performance.md). Compiling fuses them.

Two things are compiled:

- each decoder layer's forward, but only while the trainer runs a packed forward
  (:func:`packed_forward`); the rollout engine's plain ``generate`` loop, which calls the same
  layers with a KV cache, keeps running them eagerly. All layers share one compiled graph: the
  layer is an argument of the compiled function, its parameters are graph inputs;
- the element-wise work of the log-prob head (:func:`kernel`), one fused reduction forward and
  one fused element-wise kernel backward per chunk.

A compiler failure on a forward falls back to eager code with a warning: the two compute the same
thing.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
from loguru import logger

_state = {"packed": False, "layers_failed": False, "kernels": False}


def wanted(setting: bool | str, device: str, world: int, sharded: bool = False) -> bool:
    """Resolve ``[model] compile``: ``"auto"`` compiles on CUDA for a single-rank run without FSDP
    (FSDP's hooks around compiled layers are not measured here), ``true``/``false`` as said."""
    if setting == "auto":
        return device.startswith("cuda") and world == 1 and not sharded
    return bool(setting)


@contextlib.contextmanager
def packed_forward():
    """Compiled decoder layers are used inside this block (the trainer's packed forward passes)."""
    previous = _state["packed"]
    _state["packed"] = True
    try:
        yield
    finally:
        _state["packed"] = previous


def _layer_forward(layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    return type(layer).forward(layer, *args, **kwargs)


_compiled_layer_forward = None


def _dispatch(layer: torch.nn.Module, eager: Callable, *args: Any, **kwargs: Any) -> Any:
    global _compiled_layer_forward
    if not _state["packed"] or _state["layers_failed"]:
        return eager(*args, **kwargs)
    if _compiled_layer_forward is None:
        _compiled_layer_forward = torch.compile(_layer_forward)
    try:
        return _compiled_layer_forward(layer, *args, **kwargs)
    except Exception as error:  # noqa: BLE001 -- any compiler failure; the eager layer is equivalent
        _state["layers_failed"] = True
        logger.warning(
            "torch.compile of the decoder layers failed, running them uncompiled "
            "(set [model] compile = false to skip trying): {}",
            str(error).splitlines()[0] if str(error) else error,
        )
        return eager(*args, **kwargs)


def compile_decoder_layers(lm: torch.nn.Module) -> int:
    """Route every decoder layer's forward through the shared compiled function during packed
    forwards; return how many layers were wrapped (0 when the model has no ``layers`` list).

    Not under gradient checkpointing: a checkpointed layer is recomputed during the backward
    pass, outside the packed forward, so it would run compiled once and eagerly the second time,
    and torch refuses the differing saved tensors (a CheckpointError on an H200)."""
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    if getattr(base, "is_gradient_checkpointing", False):
        logger.info("torch.compile: decoder layers left uncompiled under gradient checkpointing")
        return 0
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if layers is None:
        return 0
    for layer in layers:
        if getattr(layer, "_rlcore_compiled", False):
            continue
        layer.forward = functools.partial(_dispatch, layer, layer.forward)
        layer._rlcore_compiled = True
    return len(layers)


class _Kernel:
    """A function run compiled (dynamic shapes) once :func:`enable_kernels` was called, eagerly
    before that and after a compiler failure."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.compiled: Callable | None = None
        self.failed = False
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any) -> Any:
        if not _state["kernels"] or self.failed:
            return self.fn(*args)
        if self.compiled is None:
            self.compiled = torch.compile(self.fn, dynamic=True)
        try:
            return self.compiled(*args)
        except Exception as error:  # noqa: BLE001 -- any compiler failure; eager is equivalent
            self.failed = True
            logger.warning(
                "torch.compile of {} failed, running it uncompiled: {}",
                self.fn.__name__,
                str(error).splitlines()[0] if str(error) else error,
            )
            return self.fn(*args)


def kernel(fn: Callable) -> _Kernel:
    """Decorator: see :class:`_Kernel`."""
    return _Kernel(fn)


def enable_kernels(enabled: bool = True) -> None:
    """Run every :func:`kernel` compiled from now on (or eagerly again)."""
    _state["kernels"] = enabled
