"""vLLM servers over HTTP: token-in/token-out ``/v1/completions``, load-balanced and retried.

Weight updates use vLLM's own endpoints: full weights are written as safetensors shards into
``weight_sync_dir`` and reloaded with ``POST /collective_rpc {"method": "reload_weights",
"kwargs": {"weights_path": ...}}`` (the worker method exists in 0.26 to 0.33; the endpoint needs
``VLLM_SERVER_DEV_MODE=1``); LoRA adapters are written as PEFT directories and loaded with
``POST /v1/load_lora_adapter`` (needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``). The directory
must be readable by every server (the same machine, or a shared file system).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from typing import Any

from loguru import logger

from rlcore.engine_kit.remote import ServerError, ServerPool
from rlcore.engine_kit.samples import replicate, samples_to_request
from rlcore.engine_kit.weights import write_adapter, write_shards
from rlcore.errors import RlcoreError, UsageError
from rlcore.interfaces import BuildContext, Completion, SamplingParams
from rlcore_rollout_vllm.options import VLLMOptions
from rlcore_rollout_vllm.translate import completion_body, parse_completion
from rlcore_rollout_vllm.weights import LoraSpec, proj_modules, with_base_layer


class VLLMServerEngine:
    """A :class:`rlcore.interfaces.RolloutEngine` over one or more running vLLM servers."""

    shares_actor = False  # it holds its own weights: the trainer sends them (update_weights)

    @property
    def accepts_lora(self) -> bool:
        """Whether update_weights(..., lora=...) can load an adapter: the servers run with --enable-lora (lora_rank set)."""
        return bool(self.options.lora_rank)

    def __init__(self, options: VLLMOptions, context: BuildContext | None = None):
        self.options = options
        self.pool = ServerPool.from_options(options, engine="vLLM", rejoin=False)
        self.pool.check_health()
        self.model = options.model or self._served_model()
        self.base_model = self.model
        self.weight_version = 0
        self._lora_name: str | None = None
        self._lora_version = 0
        self.asleep = False

    def _served_model(self) -> str:
        url = self.pool.urls[0]
        body = self.pool.request(url, "GET", "/v1/models").json()
        try:
            return body["data"][0]["id"]
        except (KeyError, IndexError, TypeError):
            raise RlcoreError(f"vLLM server {url}: /v1/models lists no model; set rollout.model") from None

    # ------------------------------------------------------------------ generation

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        model = self.model

        def one(url: str, prompt: Sequence[int]) -> list[Completion]:
            body = self.pool.request(
                url, "POST", "/v1/completions", json=completion_body(model, prompt, params)
            ).json()
            return replicate(
                parse_completion(body, samples_to_request(params), f"vLLM server {url}"), params.n
            )

        return self.pool.map(one, list(prompts), "vLLM generate")

    # ------------------------------------------------------------------ sleep

    def sleep(self) -> None:
        if not self.options.server_sleep or self.options.sleep_level == 0 or self.asleep:
            return
        self.pool.broadcast("POST", "/sleep", "vLLM sleep", params={"level": self.options.sleep_level})
        self.asleep = True

    def wake_up(self) -> None:
        if not self.asleep:
            return
        self.pool.broadcast("POST", "/wake_up", "vLLM wake_up")
        self.asleep = False

    # ------------------------------------------------------------------ weights

    def _sync_dir(self) -> str:
        if not self.options.weight_sync_dir:
            raise UsageError(
                "update_weights with mode = 'server' needs rollout.weight_sync_dir: a directory every vLLM server can read"
            )
        os.makedirs(self.options.weight_sync_dir, exist_ok=True)
        return self.options.weight_sync_dir

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]], *, lora: Any = None) -> None:
        if lora is not None:
            self._update_lora(named_tensors, LoraSpec.coerce(lora))
            return
        root = self._sync_dir()
        version = self.weight_version + 1
        path = os.path.join(root, f"weights-v{version}")
        if self.options.lora_rank:  # servers started with --enable-lora keep base weights under base_layer
            pairs, wrapped = proj_modules(named_tensors)
            named_tensors = with_base_layer(pairs, wrapped)
        write_shards(named_tensors, path, self.options.weight_bucket_mb << 20, index=False)
        try:
            responses = self.pool.broadcast(
                "POST",
                "/collective_rpc",
                "vLLM weight update (reload_weights)",
                json={"method": "reload_weights", "kwargs": {"weights_path": os.path.abspath(path)}},
            )
        except ServerError as exc:
            if "404" in str(exc):
                raise ServerError(
                    f"{exc}\n  start the servers with VLLM_SERVER_DEV_MODE=1 to enable /collective_rpc"
                ) from None
            raise
        for response in responses:
            _check_rpc(response)
        self.pool.broadcast("POST", "/reset_prefix_cache", "vLLM reset_prefix_cache")
        old = os.path.join(root, f"weights-v{version - 1}")
        shutil.rmtree(old, ignore_errors=True)
        self.weight_version = version
        logger.debug("vLLM servers reloaded weights version {}", version)

    def _update_lora(self, named_tensors, spec: LoraSpec) -> None:
        root = self._sync_dir()
        version = self._lora_version + 1
        name = f"{spec.name}-lora-v{version}"
        path = write_adapter(named_tensors, spec, os.path.join(root, name))
        try:
            self.pool.broadcast(
                "POST",
                "/v1/load_lora_adapter",
                "vLLM LoRA update",
                json={"lora_name": name, "lora_path": os.path.abspath(path)},
            )
        except ServerError as exc:
            if "404" in str(exc):
                raise ServerError(
                    f"{exc}\n  start the servers with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 and --enable-lora"
                ) from None
            raise
        old = self._lora_name
        self.model, self._lora_name, self._lora_version = name, name, version
        if old is not None:
            try:
                self.pool.broadcast(
                    "POST", "/v1/unload_lora_adapter", "vLLM LoRA unload", json={"lora_name": old}
                )
            except ServerError as exc:
                logger.warning("could not unload the previous adapter: {}", exc)
            shutil.rmtree(os.path.join(root, old), ignore_errors=True)

    def close(self) -> None:
        self.pool.close()


def _check_rpc(response) -> None:
    """/collective_rpc answers 200 with the workers' results; an error string is a failure."""
    if not response.content:
        return
    try:
        body = response.json()
    except ValueError:
        return
    for result in body.get("results", []) if isinstance(body, dict) else []:
        if isinstance(result, str) and ("Error" in result or "Exception" in result):
            raise ServerError(
                f"vLLM server {response.request.url.host}:{response.request.url.port} rejected the weight update: {result}"
            )
