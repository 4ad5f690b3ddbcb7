"""What the trainer stores and what it computes in: ``[model] dtype`` and ``[model] compute_dtype``.

Why float32 master weights: an Adam step moves a weight by about the learning rate, and RL
learning rates (1e-6 to 1e-5) are far below half a bfloat16 ulp of a typical weight (about 2e-3
relative). Parameters kept in bfloat16 and updated in place therefore round most updates away
and stop learning (measured: docs/performance.md, "Mixed precision"). So the default on CUDA is
*mixed* precision: float32 weights and optimizer state, bfloat16 forward and backward passes,
gradients accumulated in float32.

One process does it with :class:`MasterWeights`: the module's own parameters are cast to the
compute dtype (so the decoder, its compiled layers, the varlen attention and the colocated ``hf``
engine all run on them unchanged, with no second copy), while float32 masters beside them are
what the optimizer steps and what checkpoints hold; each step's half-precision gradients are
added into the masters' float32 gradients as soon as they are produced, and the updated masters
are copied back into the module after every optimizer step. With several ranks, FSDP2's
``MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=float32)`` does the same over float32
shards. The two compute the same thing: half-precision parameters and activations in the passes,
float32 everywhere an update accumulates.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from rlcore.manifest.schema import ModelTable

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


@dataclass(frozen=True)
class Precision:
    """``storage``: the dtype of the trainable weights and optimizer state; ``compute``: the dtype
    of the forward and backward passes (and of the rollout engine's weights)."""

    storage: str
    compute: str

    @property
    def mixed(self) -> bool:
        return self.storage != self.compute

    def describe(self) -> str:
        if self.mixed:
            return f"{self.storage} master weights and optimizer state, {self.compute} compute"
        return f"{self.storage} weights, optimizer state and compute"


def resolve(model: ModelTable, device: str) -> Precision:
    """``compute_dtype = "auto"`` is bfloat16 on CUDA and the storage dtype elsewhere (a CPU
    without bfloat16 matrix units computes bfloat16 slower than float32)."""
    compute = model.compute_dtype
    if compute == "auto":
        compute = "bfloat16" if device.startswith("cuda") and model.dtype == "float32" else model.dtype
    return Precision(storage=model.dtype, compute=compute)


def cast_parameters(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast parameters only: buffers such as rotary frequencies keep their float32 values, as in a
    model loaded directly in ``dtype``."""
    for param in module.parameters():
        if param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)


class MasterWeights:
    """float32 masters of a module's trainable parameters, the module itself in ``compute``.

    ``params`` are what an optimizer steps. After each optimizer step call :meth:`publish`;
    around anything that reads or writes the weights as stored (checkpoints, export) use
    :meth:`full_precision`.
    """

    def __init__(self, module: torch.nn.Module, compute: torch.dtype):
        self.module = module
        self.pairs: list[tuple[torch.nn.Parameter, torch.nn.Parameter]] = []
        for param in module.parameters():  # tied parameters appear once
            if param.requires_grad and param.is_floating_point():
                master = torch.nn.Parameter(param.data, requires_grad=True)  # takes over the float32 storage
                self.pairs.append((param, master))
                param.register_post_accumulate_grad_hook(_accumulate_into(master))
        cast_parameters(module, compute)

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [master for _, master in self.pairs]

    @torch.no_grad()
    def publish(self) -> None:
        """Copy the masters into the module's compute-dtype parameters, in place (an engine that
        captured their addresses in CUDA graphs stays valid)."""
        if not self.pairs:
            return
        torch._foreach_copy_([p.data for p, _ in self.pairs], [m.data for _, m in self.pairs])

    @contextlib.contextmanager
    def full_precision(self) -> Iterator[None]:
        """The module's parameters *are* the masters inside this block: a checkpoint saves them, a
        restore loads into them. On leaving, the module gets its compute-dtype tensors back,
        refreshed from the masters."""
        halves = [p.data for p, _ in self.pairs]
        for param, master in self.pairs:
            param.data = master.data
        try:
            yield
        finally:
            for (param, master), half in zip(self.pairs, halves):
                master.data = param.data  # a restore may have replaced the tensor
                param.data = half
            self.publish()


class TrainedRole:
    """What a trained role (the actor, the critic) does around its optimizer: step the float32
    masters and publish them into the module, and hold the weights as stored for checkpoints."""

    masters: MasterWeights | None
    optimizer: torch.optim.Optimizer

    def optimizer_step(self) -> None:
        self.optimizer.step()
        if self.masters is not None:
            self.masters.publish()

    def stored_weights(self):
        """Inside: the module holds its weights as stored (the float32 masters), for checkpoints."""
        return self.masters.full_precision() if self.masters is not None else contextlib.nullcontext()


def _accumulate_into(master: torch.nn.Parameter):
    def hook(param: torch.Tensor) -> None:
        grad = param.grad
        if master.grad is None:
            master.grad = grad.to(master.dtype)
        else:
            master.grad.add_(grad)
        param.grad = None  # the half-precision gradient is not kept

    return hook


def fsdp_policy(precision: Precision):
    """FSDP2's mixed-precision policy for ``precision`` (None when storage and compute agree)."""
    if not precision.mixed:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch_dtype(precision.compute), reduce_dtype=torch.float32)
