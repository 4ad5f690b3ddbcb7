"""Translation between rlcore's options and contracts and SGLang's names and answers (no SGLang import).

Kept apart from the engines so tests can check every produced name against SGLang 0.5.23's real
argument lists (``data/``) and parse answers shaped like SGLang's, without SGLang installed.

The shapes, as read in SGLang 0.5.23's source (``entrypoints/engine.py``, ``http_server.py``,
``managers/tokenizer_manager.py``, ``sampling/sampling_params.py``, ``layers/sampler.py``):

- ``Engine.generate(input_ids=[[...], ...], sampling_params={...}, return_logprob=True,
  lora_path=[...])`` and ``POST /generate`` with the same JSON fields. With ``n`` samples per
  prompt the answer is one flat list, prompt-major (prompt 0's n samples first); a single
  prompt with ``n == 1`` answers one dict instead of a list.
- Each answer: ``{"output_ids": [...], "meta_info": {"finish_reason": {"type": "stop", "matched":
  ID or "str"} | {"type": "length", "length": N} | {"type": "abort", "message": ...},
  "output_token_logprobs": [(logprob, token_id, text_or_None), ...], ...}}`` (``"text"`` too
  unless the engine skips its tokenizer). JSON turns the tuples into lists.
- Log-probs are ``log(softmax(logits / T))`` of the sampled token before top-k/top-p truncation,
  and ``log_softmax(logits)`` for greedy requests: what rlcore's contract asks for (unless the
  server sets ``SGLANG_RETURN_ORIGINAL_LOGPROB``, which drops the temperature).
- ``temperature = 0`` becomes ``top_k = 1``; ``top_k`` must be -1 (off) or >= 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlcore.engine_kit.options import colocated_model
from rlcore.engine_kit.samples import samples_to_request
from rlcore.errors import RlcoreError
from rlcore.interfaces import BuildContext, Completion, SamplingParams
from rlcore_rollout_sglang.options import SGLangOptions

# The GenerateReqInput fields rlcore sends (Engine.generate's keyword arguments, /generate's JSON).
GENERATE_FIELDS = frozenset({"input_ids", "sampling_params", "return_logprob", "lora_path", "stream"})


class AbortedError(RlcoreError):
    """SGLang aborted a request (server shutting down, memory released, request too long...)."""


def engine_kwargs(options: SGLangOptions, context: BuildContext | None) -> dict[str, Any]:
    """Keyword arguments of ``sglang.Engine`` (ServerArgs names) for colocated mode."""
    context = context or BuildContext()
    model = colocated_model(options.model, context, "sglang")
    kwargs: dict[str, Any] = {
        "model_path": model,
        "skip_tokenizer_init": True,  # token ids in, token ids out: the trainer owns the tokenizer
        "tp_size": options.tensor_parallel_size,
        "mem_fraction_static": options.mem_fraction_static,
        "disable_radix_cache": not options.enable_prefix_caching,
        "dtype": options.dtype or context.dtype or "auto",
        "random_seed": options.random_seed if options.random_seed is not None else context.seed,
        "disable_cuda_graph": options.disable_cuda_graph,
        "enable_memory_saver": options.sleep_level > 0,
    }
    if options.sleep_level == 1:
        kwargs["enable_weights_cpu_backup"] = True
    if options.max_running_requests is not None:
        kwargs["max_running_requests"] = options.max_running_requests
    if options.context_length is not None:
        kwargs["context_length"] = options.context_length
    if options.lora_rank:
        kwargs["enable_lora"] = True
        kwargs["max_lora_rank"] = options.lora_rank
        kwargs["lora_target_modules"] = list(options.lora_target_modules or ["all"])
    kwargs.update(options.engine_args)
    return kwargs


def sampling_params(params: SamplingParams, *, with_stop_strings: bool = True) -> dict[str, Any]:
    """SGLang's ``sampling_params`` dict for rlcore's SamplingParams."""
    sp: dict[str, Any] = {
        "n": samples_to_request(params),
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,  # SGLang: -1 disables, 0 is refused
        "max_new_tokens": params.max_new_tokens,
        "stop_token_ids": list(params.stop_token_ids),
    }
    if params.stop and with_stop_strings:
        sp["stop"] = list(params.stop)
        sp["no_stop_trim"] = True  # keep the stop string in the text, as rlcore keeps its tokens
    if params.seed is not None:
        sp["sampling_seed"] = params.seed
    return sp


def generate_body(
    prompt: Sequence[int], params: SamplingParams, lora_name: str | None = None
) -> dict[str, Any]:
    """The ``POST /generate`` JSON for one prompt: token ids in, token ids and log-probs out."""
    body: dict[str, Any] = {
        "input_ids": [[int(t) for t in prompt]],  # a batch of one: the answer is always a list
        "sampling_params": sampling_params(params),
        "return_logprob": True,
        "stream": False,
    }
    if lora_name is not None:
        body["lora_path"] = [lora_name]
    return body


def _finish(meta: Mapping[str, Any]) -> str:
    reason = meta.get("finish_reason")
    kind = reason.get("type") if isinstance(reason, Mapping) else reason
    if kind == "abort":
        message = reason.get("message", "") if isinstance(reason, Mapping) else ""
        raise AbortedError(f"SGLang aborted the request: {message or reason}")
    if kind not in ("stop", "length"):
        raise ValueError(f"unknown finish_reason {reason!r}")
    return kind


def completion_of(output: Mapping[str, Any]) -> Completion:
    """One SGLang answer (a dict of ``output_ids`` and ``meta_info``) as an rlcore Completion."""
    meta = output["meta_info"]
    ids = [int(t) for t in output["output_ids"]]
    entries = meta.get("output_token_logprobs")
    if entries is None:
        raise ValueError("meta_info has no output_token_logprobs (return_logprob was not honoured)")
    if len(entries) != len(ids):
        raise ValueError(f"{len(ids)} output ids but {len(entries)} log-probs")
    logprobs = []
    for k, (entry, token) in enumerate(zip(entries, ids)):
        logprob, entry_token = entry[0], entry[1]
        if int(entry_token) != token:
            raise ValueError(f"log-prob {k} is for token {entry_token}, the output has {token}")
        if logprob is None:
            raise ValueError(f"log-prob {k} is missing")
        logprobs.append(float(logprob))
    return Completion(token_ids=ids, logprobs=logprobs, finish_reason=_finish(meta))


def group_outputs(outputs: Any, prompts: int, n: int, where: str) -> list[list[Completion]]:
    """Split SGLang's flat, prompt-major answer into ``prompts`` groups of ``n`` completions."""
    items = [outputs] if isinstance(outputs, Mapping) else outputs
    try:
        if not isinstance(items, list) or len(items) != prompts * n:
            got = len(items) if isinstance(items, list) else type(items).__name__
            raise ValueError(f"expected {prompts} x {n} answers, got {got}")
        done = [completion_of(item) for item in items]
    except AbortedError as exc:
        raise AbortedError(f"{where}: {exc}") from None
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise RlcoreError(f"{where}: unexpected SGLang answer ({type(exc).__name__}: {exc})") from None
    return [done[i * n : (i + 1) * n] for i in range(prompts)]
