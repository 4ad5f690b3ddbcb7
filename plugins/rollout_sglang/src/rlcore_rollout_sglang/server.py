"""Running SGLang servers over HTTP: token-in/token-out ``/generate``, load-balanced and retried.

SGLang's native endpoints (0.5.23):
- ``POST /generate`` with ``input_ids``, ``sampling_params``, ``return_logprob`` (and ``lora_path``);
- ``GET /health``;
- full weights: written as safetensors shards into ``weight_sync_dir`` and loaded with
  ``POST /update_weights_from_disk {"model_path": DIR}`` (answers ``{"success", "message"}``,
  400 on failure);
- LoRA: a PEFT directory in ``weight_sync_dir``, ``POST /load_lora_adapter {"lora_name",
  "lora_path"}`` then ``/unload_lora_adapter`` for the previous one (servers started with
  ``--enable-lora``);
- sleep: ``POST /release_memory_occupation`` and ``/resume_memory_occupation`` (``{"tags": [...]}``,
  servers started with ``--enable-memory-saver``).
``weight_sync_dir`` must be readable by every server under the same path (same machine or a
shared file system).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from typing import Any

from loguru import logger

from rlcore.engine_kit.remote import RejectedError, ServerError, ServerPool
from rlcore.engine_kit.samples import replicate, samples_to_request
from rlcore.engine_kit.weights import adapter_name, write_adapter, write_shards
from rlcore.errors import UsageError
from rlcore.interfaces import BuildContext, Completion, SamplingParams
from rlcore_rollout_sglang.options import SGLangOptions
from rlcore_rollout_sglang.results import check
from rlcore_rollout_sglang.translate import AbortedError, generate_body, group_outputs

WEIGHT_TAGS = ["weights"]
OTHER_TAGS = ["kv_cache", "cuda_graph"]


class SGLangServerEngine:
    """A :class:`rlcore.interfaces.RolloutEngine` over one or more running SGLang servers."""

    shares_actor = False  # it holds its own weights: the trainer sends them (update_weights)

    def __init__(self, options: SGLangOptions, context: BuildContext | None = None):
        self.options = options
        self.pool = ServerPool.from_options(options, engine="SGLang", retry_on=(AbortedError,))
        self.pool.check_health()
        self.weight_version = 0
        self.lora_name: str | None = None
        self._lora_version = 0
        self.asleep = False
        self._weights_asleep = False

    # ------------------------------------------------------------------ generation

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        lora = self.lora_name
        n = samples_to_request(params)

        def one(url: str, prompt: Sequence[int]) -> list[Completion]:
            answer = self.pool.request(
                url, "POST", "/generate", json=generate_body(prompt, params, lora)
            ).json()
            return replicate(group_outputs(answer, 1, n, f"SGLang server {url}")[0], params.n)

        return self.pool.map(one, list(prompts), "SGLang generate")

    # ------------------------------------------------------------------ sleep

    def sleep(self) -> None:
        """Release the servers' KV cache and weights (only with ``server_sleep = true``)."""
        if not self.options.server_sleep or self.options.sleep_level == 0 or self.asleep:
            return
        self.pool.broadcast(
            "POST", "/release_memory_occupation", "SGLang release_memory_occupation", json={"tags": None}
        )
        self.asleep = self._weights_asleep = True

    def wake_up(self) -> None:
        if not self.asleep:
            return
        tags = None if self._weights_asleep else OTHER_TAGS  # update_weights may have woken the weights
        self.pool.broadcast(
            "POST", "/resume_memory_occupation", "SGLang resume_memory_occupation", json={"tags": tags}
        )
        self.asleep = self._weights_asleep = False

    def _wake_weights(self) -> None:
        if self.asleep and self._weights_asleep:
            self.pool.broadcast(
                "POST", "/resume_memory_occupation", "SGLang resume (weights)", json={"tags": WEIGHT_TAGS}
            )
            self._weights_asleep = False

    # ------------------------------------------------------------------ weights

    def _sync_dir(self) -> str:
        if not self.options.weight_sync_dir:
            raise UsageError(
                "update_weights with mode = 'server' needs rollout.weight_sync_dir: a directory every SGLang server can read"
            )
        os.makedirs(self.options.weight_sync_dir, exist_ok=True)
        return self.options.weight_sync_dir

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]], *, lora: Any = None) -> None:
        """Full weights (Hugging Face names) through the disk; with ``lora``, the tensors are a
        PEFT adapter that every later generate() uses."""
        if lora is not None:
            self._update_lora(named_tensors, lora)
            return
        root = self._sync_dir()
        version = self.weight_version + 1
        path = os.path.abspath(os.path.join(root, f"weights-v{version}"))
        write_shards(named_tensors, path, self.options.weight_bucket_mb << 20)
        self._wake_weights()
        body = {"model_path": path, "weight_version": str(version)}
        try:
            responses = self.pool.broadcast(
                "POST", "/update_weights_from_disk", "SGLang weight update", json=body
            )
        except RejectedError as exc:
            raise RejectedError(
                f"{exc}\n  the weights written to {path} were refused; check their names and shapes"
            ) from None
        for response in responses:
            check(
                response.json(),
                f"SGLang server {response.url.scheme}://{response.url.host}:{response.url.port} weight update",
            )
        shutil.rmtree(os.path.join(root, f"weights-v{version - 1}"), ignore_errors=True)
        self.weight_version = version
        logger.debug("SGLang servers loaded weights version {}", version)

    def _update_lora(self, named_tensors, lora: Any) -> None:
        root = self._sync_dir()
        version = self._lora_version + 1
        name = f"{adapter_name(lora)}-lora-v{version}"
        path = os.path.abspath(str(write_adapter(named_tensors, lora, os.path.join(root, name))))
        try:
            responses = self.pool.broadcast(
                "POST", "/load_lora_adapter", "SGLang LoRA load", json={"lora_name": name, "lora_path": path}
            )
        except ServerError as exc:
            if "404" in str(exc):
                raise ServerError(
                    f"{exc}\n  start the servers with --enable-lora (and --max-lora-rank)"
                ) from None
            raise
        for response in responses:
            check(response.json(), "SGLang LoRA load")
        old, self.lora_name, self._lora_version = self.lora_name, name, version
        if old is not None:
            try:
                self.pool.broadcast(
                    "POST", "/unload_lora_adapter", "SGLang LoRA unload", json={"lora_name": old}
                )
            except ServerError as exc:
                logger.warning("could not unload the previous adapter {}: {}", old, exc)
            shutil.rmtree(os.path.join(root, old), ignore_errors=True)

    def close(self) -> None:
        self.pool.close()
