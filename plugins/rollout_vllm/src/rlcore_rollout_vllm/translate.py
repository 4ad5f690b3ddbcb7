"""Translation between rlcore's options and contracts and vLLM's names (no vLLM import here).

Kept apart from the engines so tests can check every produced name against vLLM's real
argument lists (``data/``) without vLLM installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlcore.engine_kit.options import colocated_model
from rlcore.engine_kit.samples import samples_to_request  # vLLM refuses n > 1 with greedy sampling
from rlcore.errors import RlcoreError, UsageError
from rlcore.interfaces import BuildContext, Completion, SamplingParams
from rlcore_rollout_vllm.options import VLLMOptions

# vLLM's max_lora_rank accepts only these (vllm/config/lora.py, MaxLoRARanks, 0.26 to 0.33).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank(options: VLLMOptions) -> int | None:
    """vLLM's max_lora_rank for rollout.lora_rank: the smallest allowed value that fits."""
    if options.lora_rank is None:
        return None
    return next(r for r in LORA_RANKS if r >= options.lora_rank)


def check_correction(options: VLLMOptions, context: BuildContext | None) -> None:
    """An FP8 rollout needs the trainer to correct for the engine/trainer gap it widens."""
    if not options.quantization or context is None or not context.manifest:
        return
    algorithm = context.manifest.get("algorithm") or {}
    if algorithm.get("rollout_correction", "none") == "none":
        raise UsageError(
            f'[rollout] quantization = "{options.quantization}" samples from FP8 weights while the trainer computes '
            'log-probs in its own precision; set [algorithm] rollout_correction (e.g. "token_truncate", as verl\'s '
            "FP8 rollouts do), so that the loss is weighted by the trainer/engine ratio"
        )


def engine_kwargs(options: VLLMOptions, context: BuildContext | None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` for colocated mode."""
    check_correction(options, context)
    context = context or BuildContext()
    model = colocated_model(options.model, context, "vllm")
    kwargs: dict[str, Any] = {
        "model": model,
        "tensor_parallel_size": options.tensor_parallel_size,
        "gpu_memory_utilization": options.gpu_memory_utilization,
        "enable_prefix_caching": options.enable_prefix_caching,
        "dtype": options.dtype or context.dtype or "auto",
        "seed": options.seed if options.seed is not None else context.seed,
        "enforce_eager": options.enforce_eager,
        "enable_sleep_mode": options.sleep_level > 0,
        "logprobs_mode": options.logprobs_mode,
    }
    if options.max_num_seqs is not None:
        kwargs["max_num_seqs"] = options.max_num_seqs
    if options.max_model_len is not None:
        kwargs["max_model_len"] = options.max_model_len
    if options.quantization:
        kwargs["quantization"] = options.quantization
    rank = lora_rank(options)
    if rank:
        kwargs["enable_lora"] = True
        kwargs["max_lora_rank"] = rank
    tokenizer = ((context.manifest or {}).get("model") or {}).get("tokenizer")
    if tokenizer and "tokenizer" not in options.engine_args:
        kwargs["tokenizer"] = tokenizer
    kwargs.update(options.engine_args)
    return kwargs


def sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams``: the sampled token's log-prob is always returned."""
    kw: dict[str, Any] = {
        "n": samples_to_request(params),
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else 0,  # vLLM: 0 disables (-1 is rejected since 0.2x)
        "max_tokens": params.max_new_tokens,
        "stop_token_ids": list(params.stop_token_ids),
        "logprobs": 0,
        "include_stop_str_in_output": True,
    }
    if params.stop:
        kw["stop"] = list(params.stop)
    if params.seed is not None:
        kw["seed"] = params.seed
    return kw


def completion_body(model: str, prompt: Sequence[int], params: SamplingParams) -> dict[str, Any]:
    """The ``/v1/completions`` request for one prompt: token ids in, token ids and log-probs out."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": [int(t) for t in prompt],
        "n": samples_to_request(params),
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "logprobs": 1,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "include_stop_str_in_output": True,
        "stream": False,
    }
    if params.top_k > 0:
        body["top_k"] = params.top_k
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    if params.stop:
        body["stop"] = list(params.stop)
    if params.seed is not None:
        body["seed"] = params.seed
    return body


def _token_id(token: str) -> int:
    if not token.startswith("token_id:"):
        raise ValueError(f"expected 'token_id:N' tokens (return_tokens_as_token_ids), got {token!r}")
    return int(token.removeprefix("token_id:"))


def parse_completion(body: dict[str, Any], n: int, where: str) -> list[Completion]:
    """The ``n`` completions of one ``/v1/completions`` answer, in sample order."""
    try:
        choices = sorted(body["choices"], key=lambda c: c["index"])
        if len(choices) != n:
            raise ValueError(f"expected {n} choices, got {len(choices)}")
        out = []
        for choice in choices:
            lp = choice.get("logprobs") or {}
            logprobs = [float(x) if x is not None else 0.0 for x in lp.get("token_logprobs") or []]
            ids = choice.get("token_ids")
            if ids is None:
                ids = [_token_id(t) for t in lp.get("tokens") or []]
            ids = [int(t) for t in ids]
            if len(ids) != len(logprobs):
                raise ValueError(f"{len(ids)} token ids but {len(logprobs)} log-probs")
            finish = "stop" if choice.get("finish_reason") == "stop" else "length"
            out.append(Completion(token_ids=ids, logprobs=logprobs, finish_reason=finish))
        return out
    except (KeyError, TypeError, ValueError) as exc:
        raise RlcoreError(
            f"{where}: unexpected /v1/completions answer ({type(exc).__name__}: {exc})"
        ) from None
