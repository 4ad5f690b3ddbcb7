"""Conformance kit for agent loops (``rlcore_agent_loops``, :class:`rlcore.interfaces.AgentLoop`).

The loop runs against :class:`KitEngine`, a seeded rollout engine whose log-probability of a token
is a function of the token and everything before it. So the kit can recompute, for every token a
trajectory marks as the model's (mask 1), the log-prob the engine gave it at that place: a
log-prob shifted by one token, a tool-output token marked as the model's or a response that is not
what the engine generated after ``prompt + response[:i]`` shows, whatever the loop does between
turns. ::

    from rlcore.testing.agents import check_agent_loop

    def test_my_loop(rlcore_registry):
        check_agent_loop(rlcore_registry.get("agent_loop", "my_loop"), {"max_turns": 3})

A failing check raises :class:`AssertionError` saying which trajectory and token broke which rule.
Needs transformers and tokenizers (the kit's chat tokenizer, :func:`rlcore.testing.tools.make_chat_tokenizer`).
"""

from __future__ import annotations

import copy
import math
import random
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from rlcore.components import Component
from rlcore.interfaces import BuildContext, Completion, Prompt, SamplingParams, Trajectory
from rlcore.testing import build_subject

QUESTIONS = ("What is 12 + 30?", "Compute 7 * 6 with the python tool.", "Say the answer is 42.")

# (context token ids, sample index) -> the text the model replies, or None for seeded random tokens.
Script = Callable[[list[int], int], "str | None"]


class KitEngine:
    """A deterministic rollout engine for the kit.

    Sample ``k`` of a prompt draws its tokens from ``random.Random`` seeded by the engine's seed
    (or ``params.seed``), the prompt's ids and ``k``; ``script(context_ids, k)`` may instead give the
    reply as text (tokenised, then EOS), to make a loop call its tools. A reply ends with EOS
    (finish ``stop``) or fills ``max_new_tokens`` (finish ``length``). Every token's log-prob is
    :meth:`logprob` of the context before it, so a reader can check any token's. ``calls`` records
    each ``generate`` call's prompts.
    """

    shares_actor = False

    def __init__(self, tokenizer: Any, seed: int = 0, script: Script | None = None) -> None:
        self.tokenizer = tokenizer
        self.seed = seed
        self.script = script
        self.eos = tokenizer.eos_token_id
        specials = set(getattr(tokenizer, "all_special_ids", []) or [])
        self.ordinary = [i for i in range(len(tokenizer)) if i not in specials]
        self.calls: list[list[list[int]]] = []

    @staticmethod
    def logprob(context: Sequence[int], token: int) -> float:
        """The engine's log-prob of ``token`` after ``context``: in [-8, -0.01], different for
        nearly every (context, token)."""
        digest = zlib.crc32(",".join(map(str, [*context, -1, token])).encode())
        return -0.01 - (digest % 7990) / 1000.0

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        max_new_tokens: Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        self.calls.append([list(p) for p in prompts])
        out = []
        for index, prompt in enumerate(prompts):
            budget = max_new_tokens[index] if max_new_tokens is not None else params.max_new_tokens
            out.append([self._sample(list(prompt), k, budget, params) for k in range(params.n)])
        return out

    def _sample(self, prompt: list[int], k: int, budget: int, params: SamplingParams) -> Completion:
        seed = self.seed if params.seed is None else params.seed
        rng = random.Random(f"{seed}/{zlib.crc32(str(prompt).encode())}/{k}")
        text = self.script(prompt, k) if self.script is not None else None
        if text is not None:
            ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + [self.eos]
        else:
            length = rng.randint(1, budget)
            ids = [rng.choice(self.ordinary) for _ in range(length)]
            if length < budget or rng.random() < 0.5:
                ids[-1] = self.eos
        ids = ids[:budget]
        finish = "stop" if ids and ids[-1] == self.eos else "length"
        logprobs = [self.logprob(prompt + ids[:i], token) for i, token in enumerate(ids)]
        return Completion(token_ids=ids, logprobs=logprobs, finish_reason=finish)

    def update_weights(self, named_tensors) -> None:
        raise AssertionError("an agent loop must not update the engine's weights")

    def sleep(self) -> None:
        raise AssertionError("an agent loop must not put the engine to sleep (the trainer does)")

    def wake_up(self) -> None:
        raise AssertionError("an agent loop must not wake the engine up (the trainer does)")


def kit_prompts(tokenizer: Any, questions: Sequence[str] = QUESTIONS) -> list[Prompt]:
    """Prompts as the trainer makes them from data rows: chat messages and their templated ids."""
    prompts = []
    for index, question in enumerate(questions):
        messages = [{"role": "user", "content": question}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # newer transformers return a BatchEncoding
            ids = ids["input_ids"]
        prompts.append(
            Prompt(
                token_ids=list(ids),
                messages=messages,
                data_source="kit",
                ground_truth="42",
                extra_info={"index": index},
                index=index,
            )
        )
    return prompts


def _signature(trajectories: list[Trajectory]) -> list[tuple]:
    return [
        (list(t.response_ids), list(t.response_mask), list(t.rollout_logprobs), t.finish_reason)
        for t in trajectories
    ]


def check_trajectories(
    trajectories: Any, prompts: Sequence[Prompt], params: SamplingParams, engine: KitEngine
) -> None:
    """The rules one run's output must follow: ``params.n`` trajectories per prompt, grouped, in
    prompt order; ids, mask and log-probs of one length; masks of 0 and 1 with at least one model
    token; log-probs finite, 0.0 under mask 0, and under mask 1 the engine's own for that token
    after ``prompt + response[:i]``; at most ``params.max_new_tokens`` response tokens."""
    assert isinstance(trajectories, list), (
        f"run must return a list of Trajectory, got {type(trajectories).__name__}"
    )
    expected = len(prompts) * params.n
    assert len(trajectories) == expected, (
        f"run returned {len(trajectories)} trajectories for {len(prompts)} prompts x n={params.n}: expected {expected}"
    )
    for t, trajectory in enumerate(trajectories):
        where = f"trajectory {t}"
        assert isinstance(trajectory, Trajectory), (
            f"{where} is a {type(trajectory).__name__}, not a Trajectory"
        )
        prompt = prompts[t // params.n]
        got = trajectory.prompt
        assert isinstance(got, Prompt) and (got.index, got.data_source, got.messages[:1]) == (
            prompt.index,
            prompt.data_source,
            prompt.messages[:1],
        ), (
            f"{where} belongs to prompt {t // params.n} (trajectories are grouped by prompt, n={params.n} each, "
            f"in prompt order) but carries prompt index {getattr(got, 'index', None)}"
        )
        ids, mask, logprobs = trajectory.response_ids, trajectory.response_mask, trajectory.rollout_logprobs
        assert len(ids) == len(mask) == len(logprobs), (
            f"{where}: response_ids ({len(ids)}), response_mask ({len(mask)}) and rollout_logprobs "
            f"({len(logprobs)}) must have one entry per response token"
        )
        assert all(isinstance(i, int) and not isinstance(i, bool) for i in ids), (
            f"{where}: response_ids must be ints"
        )
        assert set(mask) <= {0, 1}, (
            f"{where}: response_mask holds {sorted(set(mask) - {0, 1})}; only 0 and 1 are allowed"
        )
        assert 1 in mask, f"{where}: no token is marked as the model's (response_mask is all 0)"
        assert len(ids) <= params.max_new_tokens, (
            f"{where}: {len(ids)} response tokens, more than max_new_tokens={params.max_new_tokens}"
        )
        context = list(got.token_ids)
        for i, (token, m, lp) in enumerate(zip(ids, mask, logprobs)):
            assert isinstance(lp, (int, float)) and math.isfinite(lp), (
                f"{where}, token {i}: log-prob {lp!r} is not finite"
            )
            if m == 0:
                assert lp == 0.0, (
                    f"{where}, token {i}: mask 0 (not the model's) but log-prob {lp} (must be 0.0)"
                )
            else:
                want = engine.logprob(context + list(ids[:i]), token)
                assert abs(lp - want) < 1e-6, (
                    f"{where}, token {i} (id {token}, mask 1): log-prob {lp:.4f}, but the engine gave {want:.4f} to "
                    "that token after the prompt and response before it: log-probs misaligned with tokens, "
                    "a token the engine did not generate there marked as the model's, or the response is not "
                    "what the model saw"
                )
        assert isinstance(trajectory.finish_reason, str) and trajectory.finish_reason, (
            f"{where}: finish_reason must be a non-empty string"
        )
        for key, value in (trajectory.metrics or {}).items():
            assert isinstance(key, str) and isinstance(value, (int, float)) and math.isfinite(value), (
                f"{where}: metric {key!r} = {value!r} (metrics are names to finite numbers)"
            )


def check_agent_loop(
    component: Component | Any,
    options: Any = None,
    *,
    context: BuildContext | None = None,
    tokenizer: Any = None,
    script: Script | None = None,
    n: int = 2,
    max_new_tokens: int = 24,
    seed: int = 7,
    prompts: Sequence[Prompt] | None = None,
) -> dict[str, Any]:
    """Run the agent loop ``component`` (a registered :class:`~rlcore.components.Component`,
    built with ``options`` and ``context``, or a built loop) on three chat prompts against a
    :class:`KitEngine` and check its trajectories (:func:`check_trajectories`). A loop that plays
    its own data source's rows (an environment's tasks) gets them as ``prompts`` instead, made
    as the trainer makes them from those rows (with ``tokenizer``).

    Also: an empty batch gives no trajectories; the prompts are left as they were; the engine is
    called, and only to generate; two runs on engines of the same seed give the same
    trajectories, and ``params.seed`` is honoured the same way. ``tokenizer`` defaults to the
    kit's chat tokenizer; ``context`` defaults to one holding it (give ``tools=`` in your own
    context for a loop that calls tools, and a ``script`` that makes the model call them).
    Returns what was run: ``{"trajectories": [...], "engine_calls": N}``.
    """
    if tokenizer is None:
        from rlcore.testing.tools import make_chat_tokenizer

        tokenizer = make_chat_tokenizer()
    if context is None:
        context = BuildContext(
            tokenizer=tokenizer, seed=seed, manifest={"data": {"max_response_tokens": max_new_tokens}}
        )
    elif context.tokenizer is None:
        context.tokenizer = tokenizer
    loop = build_subject(component, options, context)
    assert callable(getattr(loop, "run", None)), (
        f"an agent loop needs run(prompts, engine, params); {type(loop).__name__} has none"
    )
    prompts = list(prompts) if prompts is not None else kit_prompts(tokenizer)
    assert prompts, "check_agent_loop needs at least one prompt"
    before = copy.deepcopy(prompts)
    params = SamplingParams(
        n=n, max_new_tokens=max_new_tokens, temperature=1.0, stop_token_ids=[tokenizer.eos_token_id]
    )

    engine = KitEngine(tokenizer, seed=seed, script=script)
    empty = loop.run([], engine, params)
    assert list(empty) == [], f"run on no prompts must return [], got {empty!r}"
    first = loop.run(prompts, engine, params)
    check_trajectories(first, prompts, params, engine)
    assert engine.calls, "run returned trajectories without calling the engine"
    assert [(p.token_ids, p.messages, p.index) for p in prompts] == [
        (p.token_ids, p.messages, p.index) for p in before
    ], "run changed the prompts it was given"

    again_engine = KitEngine(tokenizer, seed=seed, script=script)
    again = loop.run(copy.deepcopy(prompts), again_engine, params)
    assert _signature(again) == _signature(first), (
        "two runs against engines of the same seed gave different trajectories (the loop must be deterministic "
        "given the engine: no global random state, no order that depends on timing)"
    )

    seeded = params.model_copy(update={"seed": seed + 1})
    one = loop.run(copy.deepcopy(prompts), KitEngine(tokenizer, seed=0, script=script), seeded)
    check_trajectories(one, prompts, seeded, engine)
    two = loop.run(copy.deepcopy(prompts), KitEngine(tokenizer, seed=1, script=script), seeded)
    assert _signature(one) == _signature(two), (
        "with params.seed set, engines of different seeds gave different trajectories: the loop must pass "
        "params.seed on to the engine"
    )
    return {"trajectories": first, "engine_calls": len(engine.calls)}
