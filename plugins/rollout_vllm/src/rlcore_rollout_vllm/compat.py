"""Differences between the supported vLLM releases (0.26 to 0.33), handled in one place.

What was checked in the released wheels of 0.26.0 and 0.33.0:
- ``LLM.generate(prompts, sampling_params, use_tqdm=, lora_request=)``, ``LLM.sleep(level=)``,
  ``LLM.wake_up(tags=)``, ``LLM.apply_model(fn)``, ``LLM.reset_prefix_cache()`` and
  ``LLMEngine.add_lora/remove_lora`` exist with the same signatures in both.
- ``LLM.wake_up`` returns None in 0.26 and a bool ("fully awake") in 0.33; we ignore it.
- The native weight-transfer API (``init_weight_transfer_engine``/``update_weights``) moved
  into ``RLOfflineMixin`` in 0.33, and its IPC backend imports ``ray`` in 0.26: rlcore uses
  ``apply_model`` + the model's ``load_weights`` instead, which both releases share.
- ``SamplingParams.top_k`` must be 0 (off) or >= 1; ``logprobs=0`` returns the sampled
  token's log-prob; ``flat_logprobs`` (off by default) changes the container type.
- Servers: ``/sleep``, ``/wake_up``, ``/collective_rpc`` and ``/reset_prefix_cache`` need
  ``VLLM_SERVER_DEV_MODE=1``; ``/v1/load_lora_adapter`` needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loguru import logger

from rlcore.errors import RlcoreError
from rlcore.interfaces import Completion
from rlcore_rollout_vllm import SUPPORTED_VLLM


def _minor(version: str) -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def check_version(version: str | None = None) -> str:
    """The installed vLLM's version; a warning outside the supported range."""
    if version is None:
        try:
            import vllm
        except ImportError as exc:
            raise RlcoreError(
                "the vllm engine in colocated mode needs vLLM installed (pip install 'vllm>=0.26,<0.34'); "
                f"importing it failed: {exc}. Or use mode = 'server' with running vLLM servers."
            ) from None
        version = vllm.__version__
    low, high = (_minor(v) for v in SUPPORTED_VLLM)
    if not (low <= _minor(version) <= high):
        logger.warning(
            "vLLM {} is outside the range rlcore-rollout-vllm supports ({} to {})", version, *SUPPORTED_VLLM
        )
    return version


def _logprob_of(entry: Any, token_id: int) -> float:
    if isinstance(entry, Mapping):
        value = entry.get(token_id)
        if value is None:
            raise KeyError(token_id)
        return float(getattr(value, "logprob", value))
    return float(getattr(entry, "logprob", entry))


def completions_of(request_output: Any, n: int) -> list[Completion]:
    """rlcore completions of one ``vllm.RequestOutput``, in sample order."""
    outs = sorted(request_output.outputs, key=lambda o: o.index)
    if len(outs) != n:
        raise RlcoreError(f"vLLM returned {len(outs)} samples for a prompt, expected {n}")
    result = []
    for o in outs:
        ids = [int(t) for t in o.token_ids]
        if o.logprobs is None:
            raise RlcoreError("vLLM returned no log-probs (SamplingParams.logprobs was not honoured)")
        lps = [_logprob_of(entry, tok) for entry, tok in zip(o.logprobs, ids)]
        if len(lps) != len(ids):
            raise RlcoreError(f"vLLM returned {len(lps)} log-probs for {len(ids)} tokens")
        result.append(
            Completion(
                token_ids=ids, logprobs=lps, finish_reason="stop" if o.finish_reason == "stop" else "length"
            )
        )
    return result
