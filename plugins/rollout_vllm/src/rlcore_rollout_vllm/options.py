"""Manifest options of the ``vllm`` rollout engine: the other keys of ``[rollout]``.

Known fields carry their ranges; anything else vLLM accepts goes into ``engine_args``, which
is checked against vLLM's real ``EngineArgs`` names (see :mod:`rlcore_rollout_vllm.names`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rlcore.components import Options
from rlcore.engine_kit.options import check_engine_args, check_mode, check_server_urls
from rlcore_rollout_vllm.names import VERSIONS, engine_arg_versions

# engine_args keys that have their own option, so they are set in one place only.
OWN_FIELDS = {
    "tensor_parallel_size": "tensor_parallel_size",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "max_num_seqs": "max_num_seqs",
    "max_model_len": "max_model_len",
    "enable_prefix_caching": "enable_prefix_caching",
    "dtype": "dtype",
    "seed": "seed",
    "enforce_eager": "enforce_eager",
    "enable_sleep_mode": "sleep_level",
    "enable_lora": "lora_rank",
    "max_lora_rank": "lora_rank",
    "model": "[model] path or rollout.model",
    "quantization": "quantization",
}


class VLLMOptions(Options):
    memory_options = ("gpu_memory_utilization",)  # named when generation runs out of memory
    mode: Literal["colocated", "server"] = Field(
        "colocated",
        description="colocated: vLLM runs in this process; server: talk HTTP to running `vllm serve`s",
    )
    # ---------------------------------------------------------------- engine (colocated)
    model: str | None = Field(
        None,
        description="model directory for vLLM (colocated) or served model name (server); default: [model] path",
    )
    tensor_parallel_size: int = Field(1, ge=1, le=512)
    gpu_memory_utilization: float = Field(
        0.5, gt=0.0, le=1.0, description="fraction of GPU memory vLLM may take"
    )
    max_num_seqs: int | None = Field(
        None, ge=1, description="sequences per engine step (vLLM's default when unset)"
    )
    max_model_len: int | None = Field(None, ge=1, description="context length (default: the model's)")
    enable_prefix_caching: bool = True
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = Field(
        None, description="default: [model] dtype"
    )
    seed: int | None = Field(None, ge=0, description="engine seed (default: [run] seed)")
    enforce_eager: bool = Field(False, description="no CUDA graphs: faster start, slower decoding")
    sleep_level: Literal[0, 1, 2] = Field(
        1,
        description="sleep(): 0 never sleeps; 1 frees the KV cache and offloads weights to CPU; "
        "2 frees both (the next update_weights must send every weight)",
    )
    lora_rank: int | None = Field(
        None,
        ge=1,
        le=512,
        description="enable LoRA adapters up to this rank; a [model.lora] run then sends the adapters alone at each "
        "weight sync (without it: the merged weights)",
    )
    quantization: Literal["fp8"] | None = Field(
        None,
        description="fp8: vLLM quantizes the weights to FP8 (per tensor, dynamic activation scales) as it loads them and "
        "at each weight update; its log-probs then differ more from the trainer's, so [algorithm] rollout_correction "
        "must be set",
    )
    weight_bucket_mb: int = Field(
        512, ge=1, description="full weight updates are sent in buckets of about this size"
    )
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = Field(
        "processed_logprobs",
        description="processed = after temperature/top-k/top-p, as the trainer's ratio needs",
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="further vllm.LLM / EngineArgs keyword arguments, checked against vLLM's names",
    )
    # ---------------------------------------------------------------- servers
    servers: list[str] = Field(
        default_factory=list, description="base URLs of running vLLM servers (mode = server)"
    )
    api_key: str | None = Field(None, description="bearer token for the servers")
    request_timeout_s: float = Field(600.0, gt=0)
    connect_timeout_s: float = Field(10.0, gt=0)
    max_retries: int = Field(
        2, ge=0, description="a failed request is retried this many times on other servers"
    )
    max_concurrency: int = Field(64, ge=1, description="requests in flight across all servers")
    weight_sync_dir: str | None = Field(
        None,
        description="directory the servers can read: weights and LoRA adapters are written there for them to load",
    )
    server_sleep: bool = Field(
        False, description="forward sleep()/wake_up() to the servers (needs VLLM_SERVER_DEV_MODE=1)"
    )

    @field_validator("engine_args")
    @classmethod
    def _known_engine_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        where = f"vLLM {' or '.join(VERSIONS)} (EngineArgs)"
        check_engine_args(value, known=set(engine_arg_versions()), own_fields=OWN_FIELDS, where=where)
        return value

    @field_validator("servers")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        return check_server_urls(value, "http://127.0.0.1:8000")

    @model_validator(mode="after")
    def _mode(self) -> VLLMOptions:
        check_mode(self.mode, self.servers)
        return self
