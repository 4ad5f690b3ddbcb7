"""SPMD training across processes, set up from torchrun's environment variables.

Every rank runs the same trainer on its share of each step's prompts. The actor (and critic) are
sharded with FSDP2; whatever must be global -- advantages (group and batch statistics), the loss
normaliser, metrics -- is gathered, so N ranks compute what one process would. Launchers (Ray,
SLURM, torchrun) only have to start the ranks with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT set.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rlcore.errors import RlcoreError

# How metrics of the ranks combine into one value (default: the mean).
# perf/throughput is per GPU, as verl defines it (each rank's tokens per second, averaged).


class Distributed:
    """This process's place among the ranks; a single process is rank 0 of 1."""

    def __init__(self, rank: int = 0, world: int = 1, local_rank: int = 0, sharded: bool | None = None):
        self.rank, self.world, self.local_rank = rank, world, local_rank
        # Whether the trained modules are FSDP2-sharded: always with several ranks; with one rank
        # only when asked (``[trainer] fsdp_offload`` needs FSDP's CPU offload policy).
        self.sharded = world > 1 if sharded is None else sharded
        self._owns_group = False  # a one-rank group made here, destroyed by close()

    @classmethod
    def from_env(cls, device: str, shard_one: bool = False) -> Distributed:
        """``shard_one``: a single process still shards with FSDP2, over a process group of one
        (made here when none exists: gloo on CPU, NCCL for CUDA tensors, an in-memory store)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        backend = "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo"  # small CPU collectives too
        timeout = timedelta(seconds=float(os.environ.get("RLCORE_DIST_TIMEOUT_S", "900")))
        if world <= 1:
            if not shard_one:
                return cls()
            one = cls(sharded=True)
            if not dist.is_initialized():
                if device == "cuda":
                    torch.cuda.set_device(0)
                dist.init_process_group(
                    backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
                )
                one._owns_group = True
            return one
        rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
        if not dist.is_initialized():
            missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
            if missing:
                raise RlcoreError(
                    f"WORLD_SIZE={world} but {', '.join(missing)} is not set; start ranks with torchrun or a launcher"
                )
            if device == "cuda":
                torch.cuda.set_device(local_rank)
            dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
        return cls(rank, world, local_rank)

    @property
    def enabled(self) -> bool:
        """Several ranks: collectives gather and sum across them (one rank needs none, sharded or not)."""
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, items: Sequence[Any]) -> list[Any]:
        return list(items[self.rank :: self.world]) if self.enabled else list(items)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (picklable objects; tensors travel on the CPU)."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def sum(self, value: float) -> float:
        if not self.enabled:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())

    def max(self, value: int) -> int:
        if not self.enabled:
            return value
        t = torch.tensor([int(value)], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def close(self) -> None:
        if (self.enabled or self._owns_group) and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False


def fsdp_wrap(model: torch.nn.Module, init_forward, mp_policy=None, offload: bool = False) -> torch.nn.Module:
    """Shard ``model`` with FSDP2 (each decoder layer, then the root) and initialise it.

    ``mp_policy`` (a ``MixedPrecisionPolicy``) keeps the shards in their stored dtype and gathers
    them in the compute dtype for the passes (and for a colocated engine's generation). ``offload``
    keeps the shards, gradients and optimizer state in (pinned) CPU memory: each layer is copied to
    the device for its passes, and the optimizer steps on the CPU.

    FSDP initialises lazily on the root's first forward, so ``init_forward(model)`` runs one (a
    generation calling inner modules first would otherwise make a layer its own root). A root
    stays unsharded after a forward without backward, with plain tensors in place of its sharded
    parameters; resharding here leaves ``model.parameters()`` the sharded ones an optimizer needs.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, fully_shard

    kwargs = {"mp_policy": mp_policy} if mp_policy is not None else {}
    if offload:  # shards, their gradients and the optimizer's state live in CPU memory; the step runs there
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    layers = _decoder_layers(model)
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    with torch.no_grad():
        init_forward(model)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    return model


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise RlcoreError(f"cannot find the decoder layers of {type(model).__name__} to shard with FSDP")
    return layers


@contextlib.contextmanager
def unsharded(model: torch.nn.Module) -> Iterator[None]:
    """Keep a sharded model's parameters gathered (for generation: a different number of forward
    passes on each rank must not trigger collectives)."""
    from torch.distributed.fsdp import FSDPModule

    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not modules:
        yield
        return
    for m in modules:
        m.unshard()
        m.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for m in modules:
            m.reshard()
            m.set_reshard_after_forward(True, recurse=False)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state on rank 0 (CPU), empty elsewhere; a collective call."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def clip_grad_norm(params: Sequence[torch.nn.Parameter], max_norm: float, ranks: Distributed) -> float:
    """Clip gradients to a global L2 norm and return that norm (before clipping).

    Sharded gradients contribute their local shards' squares, summed over the ranks. (torch's
    ``clip_grad_norm_`` reported a wrong norm for FSDP2 gradients on gloo here: 0.275 for 0.352.)
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
    # One fused kernel per device and dtype (float32 accumulation) rather than three per tensor.
    norms = torch._foreach_norm([g.detach() for g in local], 2, dtype=torch.float32)
    squares = torch.stack([n.to(norms[0].device) for n in norms]).pow(2).sum()
    if ranks.enabled and any(hasattr(g, "to_local") for g in grads):
        dist.all_reduce(squares)
    norm = squares.sqrt()
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for device_dtype in {(g.device, g.dtype) for g in local}:
        group = [g for g in local if (g.device, g.dtype) == device_dtype]
        torch._foreach_mul_(group, scale.to(*device_dtype))
    return float(norm)
