"""Manifest options of the ``sglang`` rollout engine: the other keys of ``[rollout]``.

Known fields carry ranges. Several are also accepted under the name the ``vllm`` engine uses
(``gpu_memory_utilization`` for ``mem_fraction_static``, ...; see :data:`ALIASES`): those are
fields of their own, folded into the canonical one after validation. Anything else SGLang accepts goes into ``engine_args``,
checked against SGLang 0.5.23's real ``ServerArgs`` names.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rlcore.components import Options
from rlcore.engine_kit.options import check_engine_args, check_mode, check_server_urls
from rlcore_rollout_sglang import SGLANG_VERSION
from rlcore_rollout_sglang.names import names

# ServerArgs names that have their own option here, so each is set in one place only.
OWN_FIELDS = {
    "tp_size": "tensor_parallel_size",
    "mem_fraction_static": "mem_fraction_static",
    "max_running_requests": "max_running_requests",
    "context_length": "context_length",
    "disable_radix_cache": "enable_prefix_caching",
    "dtype": "dtype",
    "random_seed": "random_seed",
    "disable_cuda_graph": "disable_cuda_graph",
    "enable_memory_saver": "sleep_level",
    "enable_weights_cpu_backup": "sleep_level",
    "enable_lora": "lora_rank",
    "max_lora_rank": "lora_rank",
    "lora_target_modules": "lora_target_modules",
    "skip_tokenizer_init": "(always true: rlcore sends token ids)",
    "model_path": "[model] path or rollout.model",
}


# Other name -> this plugin's option: the vLLM engine's names (and SGLang's tp_size) are accepted
# too, so a manifest can switch engines by changing ``engine`` alone.
ALIASES = {
    "tp_size": "tensor_parallel_size",
    "gpu_memory_utilization": "mem_fraction_static",
    "max_num_seqs": "max_running_requests",
    "max_model_len": "context_length",
    "seed": "random_seed",
    "enforce_eager": "disable_cuda_graph",
}


class SGLangOptions(Options):
    memory_options = ("mem_fraction_static",)  # named when generation runs out of memory
    mode: Literal["colocated", "server"] = Field(
        "colocated",
        description="colocated: sglang.Engine in this process; server: HTTP to running SGLang servers",
    )
    model: str | None = Field(
        None, description="model directory for SGLang (colocated); default: [model] path"
    )
    # ---------------------------------------------------------------- engine (colocated)
    tensor_parallel_size: int = Field(1, ge=1, le=512, description="SGLang's tp_size")
    mem_fraction_static: float = Field(
        0.5,
        gt=0.0,
        lt=1.0,
        description="fraction of GPU memory for weights and KV cache (vLLM: gpu_memory_utilization)",
    )
    max_running_requests: int | None = Field(None, ge=1, description="default: SGLang's")
    context_length: int | None = Field(None, ge=1, description="default: the model's")
    enable_prefix_caching: bool = Field(
        True, description="the radix cache (SGLang's disable_radix_cache, inverted)"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = Field(
        None, description="default: [model] dtype"
    )
    random_seed: int | None = Field(None, ge=0, description="engine seed (default: [run] seed)")
    disable_cuda_graph: bool = Field(False, description="no CUDA graphs (vLLM: enforce_eager)")
    # ---------------------------------------------------------------- the same options under their other names
    tp_size: int | None = Field(None, ge=1, le=512, description="same as tensor_parallel_size")
    gpu_memory_utilization: float | None = Field(
        None, gt=0.0, lt=1.0, description="same as mem_fraction_static"
    )
    max_num_seqs: int | None = Field(None, ge=1, description="same as max_running_requests")
    max_model_len: int | None = Field(None, ge=1, description="same as context_length")
    seed: int | None = Field(None, ge=0, description="same as random_seed")
    enforce_eager: bool | None = Field(None, description="same as disable_cuda_graph")
    sleep_level: Literal[0, 1, 2] = Field(
        1,
        description="sleep(): 0 never sleeps; 1 releases KV cache and weights, keeping a CPU copy of the weights; "
        "2 releases both without a copy (the next update_weights must send every weight)",
    )
    lora_rank: int | None = Field(None, ge=1, le=1024, description="enable LoRA adapters up to this rank")
    lora_target_modules: list[str] | None = Field(
        None, description="modules LoRA may target (default: all SGLang supports)"
    )
    weight_bucket_mb: int = Field(
        512, ge=1, description="full weight updates are sent in buckets of about this size"
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description=f"further sglang.Engine / ServerArgs keyword arguments ({SGLANG_VERSION} names)",
    )
    # ---------------------------------------------------------------- servers
    servers: list[str] = Field(
        default_factory=list, description="base URLs of running SGLang servers (mode = server)"
    )
    api_key: str | None = Field(
        None, description="bearer token for the servers (their --api-key / --admin-api-key)"
    )
    request_timeout_s: float = Field(600.0, gt=0)
    connect_timeout_s: float = Field(10.0, gt=0)
    max_retries: int = Field(
        2, ge=0, description="a failed request is sent again, whole, to another server this many times"
    )
    max_concurrency: int = Field(64, ge=1, description="requests in flight across all servers")
    weight_sync_dir: str | None = Field(
        None,
        description="directory every server can read: weights and LoRA adapters are written there for them to load",
    )
    server_sleep: bool = Field(
        False,
        description="forward sleep()/wake_up() to the servers (they must run with --enable-memory-saver)",
    )

    @field_validator("engine_args")
    @classmethod
    def _known_engine_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_engine_args(
            value,
            known=names("server-args"),
            own_fields=OWN_FIELDS,
            where=f"SGLang {SGLANG_VERSION} (ServerArgs)",
        )
        return value

    @field_validator("servers")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        return check_server_urls(value, "http://127.0.0.1:30000")

    @model_validator(mode="after")
    def _mode(self) -> SGLangOptions:
        for other, own in ALIASES.items():
            value = getattr(self, other)
            if value is None:
                continue
            if own in self.model_fields_set:
                raise ValueError(f"{other} and {own} are two names for the same option: set one")
            setattr(self, own, value)
        check_mode(self.mode, self.servers)
        return self
