"""vLLM in this process: generate from token ids, sleep while the trainer runs, load new weights.

Weights travel through vLLM's public ``LLM.apply_model`` (a function run on each worker's
model, which calls the model's own ``load_weights`` with Hugging Face names), bucket by bucket;
LoRA adapters through ``LoRARequest`` (a PEFT directory written by rlcore). With one GPU the
engine core runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so buckets are handed over
by reference, without copies.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Sequence
from typing import Any

from loguru import logger

from rlcore.engine_kit.device_memory import waking
from rlcore.engine_kit.options import unknown_name_message
from rlcore.engine_kit.samples import replicate
from rlcore.engine_kit.weights import AdapterFolder, buckets
from rlcore.errors import RlcoreError, UsageError
from rlcore.interfaces import BuildContext, Completion, SamplingParams
from rlcore_rollout_vllm import compat
from rlcore_rollout_vllm.names import live_engine_args
from rlcore_rollout_vllm.options import VLLMOptions
from rlcore_rollout_vllm.translate import engine_kwargs, sampling_kwargs
from rlcore_rollout_vllm.weights import LoraSpec


def _worker_device(model):
    """The device a worker's model computes on. During an FP8 model's layerwise reload vLLM has
    put every parameter on the meta device (each layer is rebuilt once all of its weights have
    arrived), so the parameters cannot say; the worker's current CUDA device can."""
    import torch

    for tensor in model.parameters():
        if tensor.device.type != "meta":
            return tensor.device
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )


def _load_bucket(bucket, model) -> int:
    """Run inside each vLLM worker (via apply_model): load one bucket of HF-named tensors."""
    import torch

    from rlcore_rollout_vllm.weights import with_base_layer

    device = _worker_device(model)
    names = [n for n, _ in model.named_parameters()]
    if any(".base_layer." in n for n in names):  # LoRA enabled: base weights sit one level down
        wrapped = {n.split(".base_layer.")[0].split(".")[-1] for n in names if ".base_layer." in n}
        packed = getattr(model, "packed_modules_mapping", None) or {}
        wrapped |= {sub for key in list(wrapped) for sub in packed.get(key, [])}
        bucket = list(with_base_layer(bucket, wrapped))
    with torch.no_grad():
        loaded = model.load_weights((name, t.to(device, non_blocking=True)) for name, t in bucket)
    return len(loaded) if loaded is not None else len(bucket)


def _begin_quantized_reload(model) -> None:
    """Run inside each worker before a weight update of an online-quantized (FP8) model: vLLM's
    layerwise reload takes high-precision weights and re-quantizes each layer once all of its
    weights have arrived (vllm.model_executor.model_loader.reload)."""
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

    initialize_layerwise_reload(model)


def _finish_quantized_reload(model, model_config) -> None:
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    finalize_layerwise_reload(model, model_config)


class VLLMColocatedEngine:
    """A :class:`rlcore.interfaces.RolloutEngine` around ``vllm.LLM``."""

    shares_actor = False  # it holds its own weights: the trainer sends them (update_weights)

    @property
    def accepts_lora(self) -> bool:
        """Whether update_weights(..., lora=...) can load an adapter: vLLM started with LoRA enabled."""
        return bool(self.options.lora_rank)

    def __init__(self, options: VLLMOptions, context: BuildContext | None = None):
        self.options = options
        self.version = compat.check_version()
        kwargs = engine_kwargs(options, context)
        live = live_engine_args()
        if live is not None:
            unknown = [k for k in kwargs if k not in live]
            if unknown:
                raise UsageError(
                    "rollout.engine_args: "
                    + "; ".join(
                        unknown_name_message(k, live, f"the installed vLLM {self.version}") for k in unknown
                    )
                )
        self.multiprocess = (
            options.tensor_parallel_size > 1 or os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "1"
        )
        if not self.multiprocess:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        else:  # apply_model's function travels to worker processes pickled
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        from vllm import LLM

        logger.info(
            "starting vLLM {} with {}", self.version, {k: v for k, v in kwargs.items() if k != "model"}
        )
        try:
            self.llm = LLM(**kwargs)
        except (ValueError, TypeError) as exc:
            raise UsageError(f"vLLM {self.version} rejected the engine arguments: {exc}") from exc
        self.asleep = False
        self._weights_asleep = False
        self._lora_request = None
        self._lora_version = 0
        self._adapters = AdapterFolder("rlcore-vllm-lora-")
        self.weight_version = 0

    # ------------------------------------------------------------------ generation

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        if self.asleep:
            raise RlcoreError("vllm engine: generate() called while asleep; call wake_up() first")
        from vllm import SamplingParams as VSamplingParams

        kwargs = sampling_kwargs(params)
        n = kwargs["n"]
        sp = VSamplingParams(**kwargs)
        inputs = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        outputs = self.llm.generate(inputs, sp, use_tqdm=False, lora_request=self._lora_request)
        return [replicate(compat.completions_of(out, n), params.n) for out in outputs]

    # ------------------------------------------------------------------ sleep

    def sleep(self) -> None:
        """Free the KV cache (and, at level 1, offload weights to CPU; at level 2, drop them)."""
        if self.options.sleep_level == 0 or self.asleep:
            return
        self.llm.reset_prefix_cache()
        self.llm.sleep(level=self.options.sleep_level)
        self.asleep = self._weights_asleep = True

    def wake_up(self) -> None:
        if not self.asleep:
            return
        tags = None if self._weights_asleep else ["kv_cache"]  # update_weights may have woken the weights
        with waking(f"vLLM {self.version} waking its {'KV cache' if tags else 'weights and KV cache'}"):
            self.llm.wake_up(tags=tags)
        self.asleep = self._weights_asleep = False

    # ------------------------------------------------------------------ weights

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]], *, lora: Any = None) -> None:
        """Load the trainer's weights (HF names). With ``lora``, the tensors are only the LoRA
        adapter (PEFT names) and become the adapter every later generate() uses."""
        if lora is not None:
            self._update_lora(named_tensors, LoraSpec.coerce(lora))
            return
        if self.asleep and self._weights_asleep:
            # Wake the weights alone: the KV cache stays free until wake_up().
            with waking(f"vLLM {self.version} waking its weights"):
                self.llm.wake_up(tags=["weights"])
            self._weights_asleep = False
        max_bytes = self.options.weight_bucket_mb << 20
        total = 0
        if self.options.quantization:  # every weight must arrive, in high precision, between these two
            self.llm.apply_model(_begin_quantized_reload)
        for bucket in buckets(named_tensors, max_bytes):
            if self.multiprocess:
                bucket = [(n, t.cpu()) for n, t in bucket]
            try:
                self.llm.apply_model(functools.partial(_load_bucket, bucket))
            except (KeyError, ValueError, AssertionError, RuntimeError) as exc:
                names = ", ".join(n for n, _ in bucket[:3])
                raise RlcoreError(
                    f"vLLM {self.version} rejected a weight update (bucket with {names}, ...): {type(exc).__name__}: {exc}"
                ) from exc
            total += len(bucket)
        if total == 0:
            raise RlcoreError("vllm engine: update_weights received no tensors")
        if self.options.quantization:
            self.llm.apply_model(
                functools.partial(_finish_quantized_reload, model_config=self.llm.llm_engine.model_config)
            )
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights
        self.weight_version += 1
        logger.debug("vLLM: loaded {} tensors (weight version {})", total, self.weight_version)

    def _update_lora(self, named_tensors, spec: LoraSpec) -> None:
        if not self.options.lora_rank:
            raise UsageError(
                "update_weights(lora=...) needs rollout.lora_rank set so that vLLM starts with LoRA enabled"
            )
        if spec.rank > self.options.lora_rank:
            raise UsageError(
                f"the adapter's rank {spec.rank} is above rollout.lora_rank = {self.options.lora_rank}"
            )
        from vllm.lora.request import LoRARequest

        self._lora_version += 1
        path = self._adapters.write(named_tensors, spec, f"v{self._lora_version}")
        old = self._lora_request
        self._lora_request = LoRARequest(f"{spec.name}-{self._lora_version}", self._lora_version, str(path))
        try:
            self.llm.llm_engine.add_lora(self._lora_request)
        except Exception as exc:  # noqa: BLE001 - vLLM raises several kinds for a bad adapter
            self._lora_request = old
            raise RlcoreError(
                f"vLLM {self.version} rejected the LoRA adapter: {type(exc).__name__}: {exc}"
            ) from exc
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            self._adapters.discard(f"v{old.lora_int_id}")
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        if getattr(self, "_adapters", None) is not None:
            self._adapters.close()
        llm = getattr(self, "llm", None)
        if llm is not None:
            del self.llm
