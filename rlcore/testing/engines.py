"""Conformance kit for rollout engines (:class:`rlcore.interfaces.RolloutEngine`).

Any engine plugin's tests call one function::

    from rlcore.testing.engines import check_rollout_engine

    results = check_rollout_engine(engine, vocab_size=len(tokenizer), tokenizer=tokenizer,
                                   reference_model=hf_model_with_the_same_weights)
    assert all(r == "passed" for r in results.values()), results

It drives the engine only through the contract, so the embedded ``hf`` engine, vLLM and SGLang
run the same checks. Each check raises ``AssertionError`` naming the check and what differed;
checks that need something not given (a tokenizer, a reference model) are reported as skipped.

Semantics checked (the contract every engine implements):

- ``params.n`` completions per prompt, in prompt order; token ids in ``[0, vocab_size)``;
  ``logprobs`` as long as ``token_ids``, finite, <= 0; at most ``max_new_tokens`` tokens, exactly
  that many when ``finish_reason == "length"``.
- temperature 0 is greedy and deterministic; ``top_k = 1`` samples the greedy tokens; the same
  ``seed`` gives the same samples.
- ``logprobs[i] = log_softmax(logits / T)[token_ids[i]]`` with ``T = 1`` when greedy, taken
  BEFORE top-k / top-p truncation (the trainer recomputes it that way). Compared with a
  teacher-forced forward pass of ``reference_model`` within ``logprob_atol`` nats (default 2e-3,
  right for float32 engines; pass a larger value for bfloat16 engines).
- greedy tokens equal the reference model's greedy continuation: each chosen token's reference
  log-probability is within ``greedy_margin`` nats of the best token's (near-ties may go either way).
- ``stop_token_ids`` end a sample with that token included and ``finish_reason == "stop"``; a stop
  string ends it right after the token that completes the string in the response text (the
  response tokens decoded alone, special tokens skipped).
- ``sleep()`` then ``wake_up()`` leaves outputs unchanged; ``update_weights`` with the reference
  model's own state dict leaves greedy outputs unchanged.

Nothing here imports torch at module import; the reference-model checks import it when run.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from rlcore.interfaces import Completion, RolloutEngine, SamplingParams

DEFAULT_TEXTS = ("The capital of France is", "Count: one, two, three,", "def add(a, b):\n    return")


def default_prompts(vocab_size: int, tokenizer: Any = None) -> list[list[int]]:
    """Three prompts of different lengths (so engines exercise padding): encoded texts with a
    tokenizer, else fixed pseudo-random ids."""
    if tokenizer is not None:
        return [list(tokenizer.encode(text, add_special_tokens=False)) for text in DEFAULT_TEXTS]
    rng = random.Random(1234)
    return [[rng.randrange(vocab_size) for _ in range(length)] for length in (5, 11, 2)]


def _fail(check: str, message: str) -> None:
    raise AssertionError(f"rollout engine conformance [{check}]: {message}")


def _generate(
    engine: RolloutEngine, prompts: Sequence[Sequence[int]], **params: Any
) -> list[list[Completion]]:
    return engine.generate(prompts, SamplingParams(**params))


def _tokens(out: list[list[Completion]]) -> list[list[list[int]]]:
    return [[c.token_ids for c in group] for group in out]


# ----------------------------------------------------------------------------- engine-only checks


def check_structure(
    engine, prompts, *, vocab_size: int, max_new_tokens: int, n: int = 3
) -> list[list[Completion]]:
    """n completions per prompt with well-formed ids, log-probs and finish reasons."""
    name = "structure"
    out = _generate(engine, prompts, n=n, temperature=1.0, max_new_tokens=max_new_tokens, seed=7)
    if not isinstance(out, list) or len(out) != len(prompts):
        _fail(
            name,
            f"expected a list of {len(prompts)} groups (one per prompt), got {type(out).__name__} of {len(out)}",
        )
    for i, group in enumerate(out):
        if len(group) != n:
            _fail(name, f"prompt {i}: expected n={n} completions, got {len(group)}")
        for j, c in enumerate(group):
            where = f"prompt {i} sample {j}"
            if not isinstance(c, Completion):
                _fail(name, f"{where}: expected a Completion, got {type(c).__name__}")
            if not 1 <= len(c.token_ids) <= max_new_tokens:
                _fail(
                    name, f"{where}: {len(c.token_ids)} tokens, expected 1..max_new_tokens={max_new_tokens}"
                )
            if len(c.logprobs) != len(c.token_ids):
                _fail(name, f"{where}: {len(c.logprobs)} logprobs for {len(c.token_ids)} tokens")
            bad = [t for t in c.token_ids if not (isinstance(t, int) and 0 <= t < vocab_size)]
            if bad:
                _fail(name, f"{where}: token ids outside [0, {vocab_size}) or not int: {bad[:5]}")
            if not all(isinstance(lp, float) and math.isfinite(lp) and lp <= 1e-5 for lp in c.logprobs):
                _fail(name, f"{where}: logprobs must be finite floats <= 0, got {c.logprobs[:5]}")
            if c.finish_reason not in ("stop", "length"):
                _fail(name, f"{where}: finish_reason {c.finish_reason!r}, expected 'stop' or 'length'")
            if c.finish_reason == "length" and len(c.token_ids) != max_new_tokens:
                _fail(
                    name,
                    f"{where}: finish_reason 'length' after {len(c.token_ids)} of {max_new_tokens} tokens",
                )
    return out


def check_max_new_tokens(engine, prompts) -> None:
    for limit in (1, 3):
        out = _generate(engine, prompts, n=2, temperature=1.0, max_new_tokens=limit, seed=3)
        for i, group in enumerate(out):
            for c in group:
                if not 1 <= len(c.token_ids) <= limit:
                    _fail(
                        "max_new_tokens", f"prompt {i}: {len(c.token_ids)} tokens with max_new_tokens={limit}"
                    )
        if limit == 1 and any(len(c.token_ids) != 1 for g in out for c in g):
            _fail("max_new_tokens", "max_new_tokens=1 must give exactly one token")


def greedy(engine, prompts, max_new_tokens: int, **extra: Any) -> list[list[int]]:
    return [
        g[0].token_ids
        for g in _generate(engine, prompts, temperature=0.0, max_new_tokens=max_new_tokens, **extra)
    ]


def check_greedy_deterministic(engine, prompts, max_new_tokens: int) -> list[list[int]]:
    name = "greedy_deterministic"
    first = _generate(engine, prompts, n=2, temperature=0.0, max_new_tokens=max_new_tokens)
    second = _generate(engine, prompts, n=2, temperature=0.0, max_new_tokens=max_new_tokens)
    for i, (a, b) in enumerate(zip(first, second)):
        if a[0].token_ids != a[1].token_ids:
            _fail(name, f"prompt {i}: two greedy samples differ: {a[0].token_ids} vs {a[1].token_ids}")
        if a[0].token_ids != b[0].token_ids:
            _fail(
                name, f"prompt {i}: greedy output changed between calls: {a[0].token_ids} vs {b[0].token_ids}"
            )
    return [g[0].token_ids for g in first]


def check_prompt_order(engine, prompts, reference: list[list[int]], max_new_tokens: int) -> None:
    """Each group belongs to its prompt: the first greedy token of prompt i alone equals that of
    group i in the batch (only the first token, so engines whose numerics vary with batch
    composition still pass)."""
    for i, prompt in enumerate(prompts):
        alone = greedy(engine, [prompt], 1)[0]
        if alone[:1] != reference[i][:1]:
            _fail(
                "prompt_order",
                f"group {i} does not continue prompt {i}: alone it starts with {alone[:1]}, in the batch with {reference[i][:1]}",
            )


def check_seed(engine, prompts, max_new_tokens: int, expect_diverse: bool) -> None:
    name = "seed"
    params = dict(n=3, temperature=1.0, max_new_tokens=max_new_tokens, seed=1234)
    a, b = _generate(engine, prompts, **params), _generate(engine, prompts, **params)
    if _tokens(a) != _tokens(b):
        _fail(name, "the same seed gave different samples")
    if expect_diverse and all(len({tuple(t) for t in group}) == 1 for group in _tokens(a)):
        _fail(name, "all n samples of every prompt are identical at temperature 1 (is the noise shared?)")


def check_top_k_one(engine, prompts, reference: list[list[int]], max_new_tokens: int) -> None:
    got = [
        g[0].token_ids
        for g in _generate(engine, prompts, temperature=1.0, top_k=1, max_new_tokens=max_new_tokens, seed=5)
    ]
    if got != reference:
        _fail("top_k_one", f"top_k=1 sampling differs from greedy: {got} vs {reference}")


def check_stop_token_ids(engine, prompts, reference: list[list[int]], max_new_tokens: int) -> str:
    name = "stop_token_ids"
    candidates = [(len(g) - 1 - k, g[k]) for g in reference for k in range(1, len(g)) if g[k] not in g[:k]]
    if not candidates:
        return "skipped: greedy outputs too short to pick a stop token"
    _, stop = max(candidates)  # the latest first-occurrence, so something is generated before it
    got = _generate(engine, prompts, temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=[stop])
    for i, (group, ref) in enumerate(zip(got, reference)):
        c = group[0]
        if stop in ref:
            want = ref[: ref.index(stop) + 1]
            if c.token_ids != want or c.finish_reason != "stop":
                _fail(
                    name,
                    f"prompt {i}: stop id {stop}: expected {want} with 'stop', got {c.token_ids} {c.finish_reason!r}",
                )
        elif c.token_ids != ref:
            _fail(name, f"prompt {i}: output changed although stop id {stop} never occurs")
    return "passed"


def _stop_string_case(tokenizer: Any, tokens: list[int]) -> tuple[int, str] | None:
    """A (k, s) such that s first appears in the decoded response once token k is added."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    for k in range(len(tokens) - 1, 0, -1):
        if special & set(tokens[: k + 1]):
            continue
        before, after = decode(tokens[:k]), decode(tokens[: k + 1])
        if len(after) <= len(before) or not after.startswith(before) or "\ufffd" in after:
            continue
        for length in (4, 3, 2, 1):
            s = after[-length:]
            if s and s not in before:
                return k, s
    return None


def check_stop_strings(
    engine, prompts, reference: list[list[int]], tokenizer: Any, max_new_tokens: int
) -> str:
    name = "stop_strings"
    for i, ref in enumerate(reference):
        case = _stop_string_case(tokenizer, ref)
        if case is None:
            continue
        k, stop = case
        got = _generate(engine, prompts, temperature=0.0, max_new_tokens=max_new_tokens, stop=[stop])
        c = got[i][0]
        if c.token_ids != ref[: k + 1] or c.finish_reason != "stop":
            _fail(
                name,
                f"prompt {i}: stop string {stop!r} completes at token {k}; expected {ref[: k + 1]} with 'stop', "
                f"got {c.token_ids} {c.finish_reason!r}",
            )
        for j, (group, other) in enumerate(zip(got, reference)):
            if group[0].token_ids != other[: len(group[0].token_ids)]:
                _fail(name, f"prompt {j}: a stop string changed the tokens generated before it")
        return "passed"
    return "skipped: no greedy output decodes to text usable as a stop string"


def check_sleep_wake(engine, prompts, reference: list[list[int]], max_new_tokens: int) -> None:
    engine.sleep()
    engine.wake_up()
    if greedy(engine, prompts, max_new_tokens) != reference:
        _fail("sleep_wake", "greedy output changed after sleep() and wake_up()")


# ----------------------------------------------------------------------------- reference-model checks


def teacher_forced_logprobs(model: Any, prompt: Sequence[int], response: Sequence[int], temperature: float):
    """``(chosen, best)``: per response token, ``log_softmax(logits / T)`` at the token and its
    maximum, from one forward pass of ``model`` over prompt + response (T = 1 when greedy)."""
    import torch

    scale = temperature if temperature > 0 else 1.0
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt) + list(response)], device=device)
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
    finally:
        for module, training in flags:
            module.training = training
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1] / scale, dim=-1)
    chosen = logp.gather(-1, torch.tensor(list(response), device=device)[:, None]).squeeze(-1)
    return chosen.tolist(), logp.max(dim=-1).values.tolist()


def check_reference_greedy(
    engine, prompts, reference: list[list[int]], model: Any, greedy_margin: float
) -> None:
    for i, (prompt, tokens) in enumerate(zip(prompts, reference)):
        chosen, best = teacher_forced_logprobs(model, prompt, tokens, 0.0)
        for k, (c, b) in enumerate(zip(chosen, best)):
            if c < b - greedy_margin:
                _fail(
                    "reference_greedy",
                    f"prompt {i} token {k}: the engine chose {tokens[k]} (reference log-prob {c:.5f}) "
                    f"but the reference model's best has {b:.5f}",
                )


def check_reference_logprobs(engine, prompts, model: Any, max_new_tokens: int, atol: float) -> None:
    cases = [
        dict(temperature=0.0),
        dict(temperature=1.0, n=2, seed=11),
        dict(temperature=0.7, n=2, top_k=20, top_p=0.9, seed=12),  # log-probs are taken before truncation
    ]
    for case in cases:
        out = _generate(engine, prompts, max_new_tokens=max_new_tokens, **case)
        for i, (prompt, group) in enumerate(zip(prompts, out)):
            for c in group:
                want, _ = teacher_forced_logprobs(model, prompt, c.token_ids, case["temperature"])
                worst = max(abs(a - b) for a, b in zip(c.logprobs, want))
                if worst > atol:
                    _fail(
                        "reference_logprobs",
                        f"prompt {i} with {case}: engine log-probs differ from log_softmax(logits / T) of a "
                        f"teacher-forced forward by {worst:.2e} > {atol:.1e}: {c.logprobs[:4]} vs {want[:4]}",
                    )


def check_update_weights_identity(
    engine, prompts, reference: list[list[int]], model: Any, max_new_tokens: int
) -> None:
    engine.update_weights(list(model.state_dict().items()))
    if greedy(engine, prompts, max_new_tokens) != reference:
        _fail(
            "update_weights_identity",
            "greedy output changed after update_weights with the model's own weights",
        )


# ----------------------------------------------------------------------------- the kit


def check_rollout_engine(
    engine: Any,
    *,
    vocab_size: int,
    prompts: Sequence[Sequence[int]] | None = None,
    tokenizer: Any = None,
    reference_model: Any = None,
    max_new_tokens: int = 8,
    logprob_atol: float = 2e-3,
    greedy_margin: float = 1e-4,
    expect_diverse: bool = True,
    check_update_weights: bool = True,
) -> dict[str, str]:
    """Run every check that the given arguments allow; return ``{check: "passed" | "skipped: why"}``.

    engine: the object under test. vocab_size: the model's vocabulary size (ids must lie below).
    prompts: token-id lists (default: :func:`default_prompts`). tokenizer: enables the stop-string
    check. reference_model: a transformers causal LM holding the engine's weights; enables the
    reference greedy / log-prob checks and ``update_weights`` with its state dict.
    expect_diverse: require that n samples at temperature 1 are not all identical (turn off for a
    model so peaked that this may legitimately happen).
    """
    results: dict[str, str] = {}
    prompts = [list(p) for p in (prompts if prompts is not None else default_prompts(vocab_size, tokenizer))]

    def run(name: str, fn: Callable[[], Any]) -> Any:
        value = fn()
        results[name] = value if isinstance(value, str) else "passed"
        return value

    if not isinstance(engine, RolloutEngine):
        _fail(
            "protocol",
            f"{type(engine).__name__} lacks generate/update_weights/sleep/wake_up or the shares_actor flag",
        )
    results["protocol"] = "passed"
    run(
        "structure",
        lambda: check_structure(engine, prompts, vocab_size=vocab_size, max_new_tokens=max_new_tokens),
    )
    run("max_new_tokens", lambda: check_max_new_tokens(engine, prompts))
    reference = run(
        "greedy_deterministic", lambda: check_greedy_deterministic(engine, prompts, max_new_tokens)
    )
    run("prompt_order", lambda: check_prompt_order(engine, prompts, reference, max_new_tokens))
    run("seed", lambda: check_seed(engine, prompts, max_new_tokens, expect_diverse))
    run("top_k_one", lambda: check_top_k_one(engine, prompts, reference, max_new_tokens))
    run("stop_token_ids", lambda: check_stop_token_ids(engine, prompts, reference, max_new_tokens))
    if tokenizer is not None:
        run("stop_strings", lambda: check_stop_strings(engine, prompts, reference, tokenizer, max_new_tokens))
    else:
        results["stop_strings"] = "skipped: no tokenizer given"
    run("sleep_wake", lambda: check_sleep_wake(engine, prompts, reference, max_new_tokens))
    if reference_model is None:
        for name in ("reference_greedy", "reference_logprobs", "update_weights_identity"):
            results[name] = "skipped: no reference model given"
        return results
    run(
        "reference_greedy",
        lambda: check_reference_greedy(engine, prompts, reference, reference_model, greedy_margin),
    )
    run(
        "reference_logprobs",
        lambda: check_reference_logprobs(engine, prompts, reference_model, max_new_tokens, logprob_atol),
    )
    if check_update_weights:
        run(
            "update_weights_identity",
            lambda: check_update_weights_identity(
                engine, prompts, reference, reference_model, max_new_tokens
            ),
        )
    else:
        results["update_weights_identity"] = "skipped: turned off"
    return results
