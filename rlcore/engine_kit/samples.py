"""Engine-independent fixes to an engine's samples so they meet rlcore's contract.

- Greedy sampling with ``n > 1``: every sample is the same, and some engines refuse the request
  (vLLM) or waste the work, so ask for one (:func:`samples_to_request`) and copy it
  (:func:`replicate`).
- Stop strings where the engine cannot match them (it runs without a tokenizer): cut each
  finished sample after the token that completes one (:func:`apply_stop_strings`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlcore.interfaces import Completion, SamplingParams


def samples_to_request(params: SamplingParams) -> int:
    """How many samples to ask the engine for: one when greedy (see :func:`replicate`)."""
    return 1 if params.temperature == 0 else params.n


def replicate(completions: list[Completion], n: int) -> list[Completion]:
    """Expand one greedy completion to the n the caller asked for (independent copies)."""
    if len(completions) == n:
        return completions
    one = completions[0]
    return [Completion(list(one.token_ids), list(one.logprobs), one.finish_reason) for _ in range(n)]


def first_stop(token_ids: Sequence[int], stops: Sequence[str], tokenizer: Any) -> int | None:
    """The index of the token that completes one of ``stops`` in the decoded response, or None.

    Sampling is token by token, so cutting a finished sample right after that token gives exactly
    the sample an engine that stopped there would have produced.
    """

    def decode(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    if not stops or not any(s in decode(token_ids) for s in stops):
        return None
    for k in range(len(token_ids)):
        if any(s in decode(token_ids[: k + 1]) for s in stops):
            return k
    return None  # pragma: no cover - the full text matched, so some prefix does


def apply_stop_strings(group: list[Completion], stops: Sequence[str], tokenizer: Any) -> list[Completion]:
    """Each completion cut after its first stop string (finish reason ``stop``), or as it was."""
    out = []
    for c in group:
        k = first_stop(c.token_ids, stops, tokenizer)
        if k is None:
            out.append(c)
        else:
            out.append(Completion(c.token_ids[: k + 1], c.logprobs[: k + 1], "stop"))
    return out
