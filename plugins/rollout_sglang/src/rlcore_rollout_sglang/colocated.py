"""``sglang.Engine`` in this process: generate from token ids, release GPU memory while the
trainer runs, load new weights from tensors.

- The engine starts with ``skip_tokenizer_init=True`` (token ids in and out); stop strings are
  therefore matched here, on the finished samples, with the run's tokenizer.
- Sleep is ``release_memory_occupation`` / ``resume_memory_occupation`` (needs
  ``enable_memory_saver``, set from ``sleep_level``).
- Full weights go through ``update_weights_from_tensor`` bucket by bucket (Hugging Face names; the
  model's own ``load_weights`` maps them), the prefix cache flushed after the last bucket.
- LoRA adapters are written as PEFT directories and loaded with ``load_lora_adapter``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from loguru import logger

from rlcore.engine_kit.device_memory import waking
from rlcore.engine_kit.samples import apply_stop_strings, replicate
from rlcore.engine_kit.weights import AdapterFolder, adapter_config, adapter_name, buckets
from rlcore.errors import RlcoreError, UsageError
from rlcore.interfaces import BuildContext, Completion, SamplingParams
from rlcore_rollout_sglang import SGLANG_VERSION
from rlcore_rollout_sglang.options import SGLangOptions
from rlcore_rollout_sglang.results import check
from rlcore_rollout_sglang.translate import engine_kwargs, group_outputs, sampling_params

OTHER_TAGS = ["kv_cache", "cuda_graph"]


def import_sglang() -> Any:
    """The sglang module, or a clear error saying how to get it (or what to use instead)."""
    try:
        import sglang
    except ImportError as exc:
        raise RlcoreError(
            f"the sglang engine in colocated mode needs SGLang installed (pip install 'sglang=={SGLANG_VERSION}'); "
            f"importing it failed: {exc}. Or use mode = 'server' with running SGLang servers."
        ) from None
    version = getattr(sglang, "__version__", "unknown")
    if version != SGLANG_VERSION:
        logger.warning(
            "SGLang {} is installed; rlcore-rollout-sglang is written against {}", version, SGLANG_VERSION
        )
    return sglang


class SGLangColocatedEngine:
    """A :class:`rlcore.interfaces.RolloutEngine` around ``sglang.Engine``.

    ``engine_factory`` replaces ``sglang.Engine`` (tests pass a fake shaped like it)."""

    shares_actor = False  # it holds its own weights: the trainer sends them (update_weights)

    def __init__(
        self, options: SGLangOptions, context: BuildContext | None = None, *, engine_factory: Any = None
    ):
        self.options = options
        self.tokenizer = (context or BuildContext()).tokenizer
        kwargs = engine_kwargs(options, context)
        if engine_factory is None:
            engine_factory = import_sglang().Engine
        logger.info("starting SGLang with {}", {k: v for k, v in kwargs.items() if k != "model_path"})
        try:
            self.engine = engine_factory(**kwargs)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"SGLang rejected the engine arguments: {exc}") from exc
        self.asleep = False
        self._weights_asleep = False
        self.weight_version = 0
        self.lora_name: str | None = None
        self._lora_version = 0
        self._adapters = AdapterFolder("rlcore-sglang-lora-")

    # ------------------------------------------------------------------ generation

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        if self.asleep:
            raise RlcoreError("sglang engine: generate() called while asleep; call wake_up() first")
        if params.stop and self.tokenizer is None:
            raise UsageError(
                "stop strings need the run's tokenizer (SGLang runs without one here); none was given to the engine"
            )
        if not prompts:
            return []
        sp = sampling_params(params, with_stop_strings=False)
        kwargs: dict[str, Any] = {}
        if self.lora_name is not None:
            kwargs["lora_path"] = [self.lora_name] * len(prompts)
        out = self.engine.generate(
            input_ids=[[int(t) for t in p] for p in prompts],
            sampling_params=sp,
            return_logprob=True,
            **kwargs,
        )
        groups = group_outputs(out, len(prompts), sp["n"], "SGLang engine")
        groups = [replicate(g, params.n) for g in groups]
        if params.stop:
            groups = [apply_stop_strings(g, params.stop, self.tokenizer) for g in groups]
        return groups

    # ------------------------------------------------------------------ sleep

    def sleep(self) -> None:
        """Release the KV cache, CUDA graphs and weights (kept on CPU at ``sleep_level = 1``)."""
        if self.options.sleep_level == 0 or self.asleep:
            return
        check(self.engine.release_memory_occupation(), "SGLang release_memory_occupation")
        self.asleep = self._weights_asleep = True

    def wake_up(self) -> None:
        if not self.asleep:
            return
        tags = None if self._weights_asleep else OTHER_TAGS  # update_weights may have woken the weights
        with waking("SGLang resuming its memory"):
            check(self.engine.resume_memory_occupation(tags=tags), "SGLang resume_memory_occupation")
        self.asleep = self._weights_asleep = False

    # ------------------------------------------------------------------ weights

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]], *, lora: Any = None) -> None:
        """Load the trainer's weights (Hugging Face names), in buckets of ``weight_bucket_mb``.
        With ``lora``, the tensors are a PEFT adapter that every later generate() uses."""
        if lora is not None:
            self._update_lora(named_tensors, lora)
            return
        if self.asleep and self._weights_asleep:
            # Only the weights come back; the KV cache stays released until wake_up().
            with waking("SGLang resuming its weights"):
                check(
                    self.engine.resume_memory_occupation(tags=["weights"]),
                    "SGLang resume_memory_occupation (weights)",
                )
            self._weights_asleep = False
        sent = 0
        pending: list | None = None
        for bucket in buckets(named_tensors, self.options.weight_bucket_mb << 20):
            if pending is not None:
                sent += self._send(pending, flush_cache=False)
            pending = bucket
        if pending is None:
            raise RlcoreError("sglang engine: update_weights received no tensors")
        sent += self._send(pending, flush_cache=True)  # cached KV was computed with the old weights
        self.weight_version += 1
        logger.debug("SGLang: loaded {} tensors (weight version {})", sent, self.weight_version)

    def _send(self, bucket: list, flush_cache: bool) -> int:
        names = ", ".join(n for n, _ in bucket[:3])
        try:
            result = self.engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=flush_cache)
        except (KeyError, ValueError, AssertionError, RuntimeError) as exc:
            raise RlcoreError(
                f"SGLang rejected a weight update (bucket with {names}, ...): {type(exc).__name__}: {exc}"
            ) from exc
        check(result, f"SGLang weight update (bucket with {names}, ...)")
        return len(bucket)

    def _update_lora(self, named_tensors, lora: Any) -> None:
        if not self.options.lora_rank:
            raise UsageError(
                "update_weights(lora=...) needs rollout.lora_rank set so that SGLang starts with LoRA enabled"
            )
        rank = int(adapter_config(lora)["r"])
        if rank > self.options.lora_rank:
            raise UsageError(
                f"the adapter's rank {rank} is above rollout.lora_rank = {self.options.lora_rank}"
            )
        self._lora_version += 1
        name = f"{adapter_name(lora)}-lora-v{self._lora_version}"
        path = self._adapters.write(named_tensors, lora, name)
        check(
            self.engine.load_lora_adapter(lora_name=name, lora_path=str(path)), f"SGLang LoRA load of {name}"
        )
        old, self.lora_name = self.lora_name, name
        if old is not None:
            try:
                check(self.engine.unload_lora_adapter(lora_name=old), f"SGLang LoRA unload of {old}")
            except RlcoreError as exc:
                logger.warning("{}", exc)
            self._adapters.discard(old)

    def close(self) -> None:
        if getattr(self, "_adapters", None) is not None:
            self._adapters.close()
        engine = getattr(self, "engine", None)
        if engine is not None and hasattr(engine, "shutdown"):
            engine.shutdown()
        self.engine = None
