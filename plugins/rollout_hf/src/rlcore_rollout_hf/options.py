"""The ``hf`` engine's manifest options (keys of ``[rollout]`` beside the core's own).

Kept apart from the engine so that ``rlcore validate`` checks them without importing torch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlcore.components import Options


class HFEngineOptions(Options):
    memory_options = ("max_batch_size",)  # named when generation runs out of memory
    max_batch_size: int = Field(
        128,
        ge=1,
        le=65536,
        description="most sequences (prompts x samples) decoded together in one forward pass",
    )
    share_prefill: bool = Field(
        True, description="prefill each prompt once and copy its KV cache to its n samples"
    )
    share_actor: bool = Field(
        True,
        description="generate with the trainer's actor module itself (no copy) when it lives on the engine's device",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = Field(
        None,
        description="dtype of the engine's own model copy; default: [model] dtype (ignored when sharing the actor)",
    )
    compact_fraction: float = Field(
        0.25,
        ge=0.0,
        le=1.0,
        description="drop finished sequences from the batch once at least this fraction of it has finished "
        "(0: at every finish; 1: never)",
    )
    offload_weights: bool = Field(
        False, description="on sleep(), move the engine's own weights (not a shared actor's) to CPU memory"
    )
    fast_path: Literal["auto", "on", "off"] = Field(
        "auto",
        description="decode over a slot KV cache with continuous batching (llama, qwen2, qwen3, mistral): "
        "auto = on CUDA for those architectures, on = everywhere (an error for other architectures), "
        "off = the model's own forward with a DynamicCache",
    )
    cuda_graphs: bool = Field(
        True, description="capture the fast path's decode step as CUDA graphs (CUDA only)"
    )
    compile: bool | Literal["auto"] = Field(
        "auto",
        description="fast path: torch.compile the per-layer decode step (one compilation per batch bucket) and "
        "prefill (one for any shape) (auto = on CUDA; falls back to uncompiled layers if the compiler fails)",
    )
    fuse_projections: bool | Literal["auto"] = Field(
        "auto",
        description="fast path: multiply q/k/v as one product (a stacked copy of their weights) and gate/up as "
        "one (their weights moved back to back in memory: the same parameters, also a shared actor's); "
        "auto = on CUDA, where the wider products fill the GPU at small batches",
    )
    release_cache_on_sleep: Literal["auto", "always", "never"] = Field(
        "auto",
        description="fast path: free the slot KV cache and its CUDA graphs on sleep(); auto = only when the "
        "cache takes more than 5% of the GPU's memory (keeping it saves re-capturing graphs at every step)",
    )
    decode_attention: Literal["auto", "triton", "sdpa"] = Field(
        "auto",
        description="fast path: attention of a decode step over the slot cache; triton = a split-KV kernel that "
        "reads each sequence's live keys only, sdpa = one masked SDPA call over the cache's whole capacity; "
        "auto = triton on CUDA where Triton is installed",
    )
    sync_every: int = Field(
        16, ge=1, le=1024, description="fast path: decode steps between looks at which sequences finished"
    )
