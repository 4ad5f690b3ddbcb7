"""The ``tool`` agent loop: generate, run the tools the model called, append their results, repeat.

All active trajectories generate together each turn (one engine call), and all the tool calls of
a turn run concurrently on one asyncio event loop. Token ids accumulate turn by turn: the model's
tokens are kept as sampled (mask 1, with their log-probabilities) and only the glue between turns
is tokenised (mask 0, log-probability 0.0); see :mod:`rlcore.chat`.

A trajectory ends when the model calls no tool (``stop``), when ``max_turns`` assistant turns are
done (``max_turns``), or when the response would exceed the run's ``max_new_tokens`` (``length``).
A malformed call, an unknown tool, a tool that raises, hangs or returns the wrong type becomes an
error message for the model and a count in the metrics; it never ends the rollout.

Per-trajectory tool state follows verl's lifecycle: ``create(trajectory_id, **create_kwargs)`` ->
``execute(trajectory_id, arguments, **execute_kwargs)`` -> ``calc_reward(trajectory_id,
**calc_reward_kwargs)`` -> ``release(trajectory_id, **release_kwargs)``. The keyword arguments come
from the data row's ``extra_info.tools_kwargs`` (``{"TOOL": {"create_kwargs": {...}, ...}}``); a
tool the row names is created when the trajectory starts, any other on its first call. Every
created tool with a ``calc_reward`` is asked for its reward when the trajectory ends; the value
adds to ``Trajectory.step_reward`` (the trainer adds that to the reward function's score).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import numbers
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from loguru import logger

from rlcore.chat import ChatGlue, truncate_middle
from rlcore.errors import RlcoreError, UsageError
from rlcore.interfaces import Prompt, RolloutEngine, SamplingParams, Tool, ToolResult, Trajectory
from rlcore.tool_calls import ParsedTurn, ToolCall, parse_tool_calls
from rlcore_agent.options import ToolLoopOptions

T = TypeVar("T")


class EventLoopThread:
    """One long-lived event loop in a daemon thread, so tools that keep loop-bound resources
    (HTTP clients) work across calls to the synchronous ``run``, even from inside another loop."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="rlcore-agent-loop", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()


@dataclass
class _State:
    prompt: Prompt
    id: str
    messages: list[dict[str, Any]]
    response_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    done: bool = False
    finish_reason: str = "length"
    turns: int = 0
    created: set[str] = field(default_factory=set)
    broken: dict[str, str] = field(default_factory=dict)  # tool -> why its create failed
    tools_kwargs: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # from the data row
    step_reward: float = 0.0
    counts: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def extend(self, ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        self.response_ids.extend(int(t) for t in ids)
        if logprobs is None:
            self.mask.extend([0] * len(ids))
            self.logprobs.extend([0.0] * len(ids))
        else:
            self.mask.extend([1] * len(ids))
            self.logprobs.extend(float(x) for x in logprobs)

    def trajectory(self) -> Trajectory:
        c = self.counts
        metrics = {f"agent/{k}": float(v) for k, v in c.items()}
        metrics["agent/num_turns"] = float(self.turns)
        metrics.setdefault("agent/tool_calls", 0.0)
        metrics.setdefault("agent/tool_errors", 0.0)
        metrics.setdefault("agent/tool_parse_errors", 0.0)
        return Trajectory(
            prompt=self.prompt,
            response_ids=self.response_ids,
            response_mask=self.mask,
            rollout_logprobs=self.logprobs,
            finish_reason=self.finish_reason,
            num_turns=self.turns,
            tool_calls=int(c["tool_calls"]),
            tool_errors=int(c["tool_errors"]),
            step_reward=self.step_reward,
            metrics=metrics,
        )


# The keys of one tool's entry in a data row's extra_info.tools_kwargs (verl's format), by method.
TOOL_KWARGS_STAGES = {
    "create_kwargs": "create",
    "execute_kwargs": "execute",
    "calc_reward_kwargs": "calc_reward",
    "release_kwargs": "release",
}


class ToolLoop:
    def __init__(self, options: ToolLoopOptions, tokenizer: Any, tools: dict[str, Tool]):
        if tokenizer is None:
            raise UsageError("the `tool` agent loop needs the run's tokenizer (BuildContext.tokenizer)")
        self.options = options
        self.tokenizer = tokenizer
        self.tools = tools
        self.glue = ChatGlue(tokenizer, [t.schema() for t in tools.values()])
        self._events = EventLoopThread()
        self._semaphore: asyncio.Semaphore | None = None
        self._gates: dict[
            str, asyncio.Semaphore
        ] = {}  # per tool with a max_concurrency, on self._events' loop
        self._accepted: set[tuple[str, str, tuple[str, ...]]] = (
            set()
        )  # (tool, stage, keys) checked against signatures
        self._warned_unknown: set[str] = set()
        self.last_messages: list[
            list[dict[str, Any]]
        ] = []  # the conversations of the last run (debugging, tests)

    # ------------------------------------------------------------------ public

    def run(
        self, prompts: Sequence[Prompt], engine: RolloutEngine, params: SamplingParams
    ) -> list[Trajectory]:
        if not prompts:
            return []
        return self._events.run(self._run(list(prompts), engine, params))

    # ------------------------------------------------------------------ turns

    def _prepare(self, prompt: Prompt) -> tuple[Prompt, list[dict[str, Any]]]:
        messages = [dict(m) for m in prompt.messages]
        if not (self.options.tools_in_prompt and self.tools and messages):
            return prompt, messages
        messages = self.glue.with_tools(messages)
        return dataclasses.replace(prompt, token_ids=self.glue.prompt_ids(messages)), messages

    async def _run(
        self, prompts: list[Prompt], engine: RolloutEngine, params: SamplingParams
    ) -> list[Trajectory]:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.options.max_concurrent_calls)
        budget = params.max_new_tokens
        per_turn = self.options.max_tokens_per_turn or budget
        states: list[_State] = []
        kwargs_of = [self.row_tools_kwargs(p) for p in prompts]  # refuses bad rows before any generation
        for prompt, tools_kwargs in zip(prompts, kwargs_of):
            prepared, messages = self._prepare(prompt)
            for _ in range(params.n):
                states.append(
                    _State(
                        prompt=prepared,
                        id=uuid.uuid4().hex,
                        messages=[dict(m) for m in messages],
                        tools_kwargs=tools_kwargs,
                    )
                )
        try:
            # The tools a row gives arguments for are part of its sample's environment: create them now.
            await asyncio.gather(*(self._create(s, name) for s in states for name in s.tools_kwargs))
            turn = 0
            while True:
                active = [s for s in states if not s.done]
                if not active:
                    break
                limits = {s.id: min(budget - len(s.response_ids), per_turn) for s in active}
                update: dict[str, Any] = {"max_new_tokens": max(limits.values())}
                if params.seed is not None:
                    update["seed"] = params.seed + turn
                if turn == 0:  # one request per prompt, n samples each
                    inputs = [
                        list(p.token_ids) for p in [states[i * params.n].prompt for i in range(len(prompts))]
                    ]
                    outputs = await asyncio.to_thread(
                        engine.generate, inputs, params.model_copy(update=update)
                    )
                    completions = [c for group in self._check(outputs, len(inputs), params.n) for c in group]
                else:
                    update["n"] = 1
                    inputs = [list(s.prompt.token_ids) + s.response_ids for s in active]
                    outputs = await asyncio.to_thread(
                        engine.generate, inputs, params.model_copy(update=update)
                    )
                    completions = [g[0] for g in self._check(outputs, len(inputs), 1)]
                pending: list[tuple[_State, str, ParsedTurn]] = []
                for s, comp in zip(active, completions):
                    taken = self._take_turn(s, comp, limits[s.id])
                    if taken is not None:
                        pending.append((s, *taken))
                tool_messages = await asyncio.gather(
                    *(self._run_calls(s, parsed) for s, _, parsed in pending)
                )
                for (s, text, _), messages in zip(pending, tool_messages):
                    glue = self.glue.turn_glue(s.messages, text, messages)
                    if glue.mismatch:
                        s.counts["template_mismatch"] += 1
                    if len(s.response_ids) + len(glue.ids) >= budget:
                        self._finish(s, text, "length")
                        continue
                    s.messages.extend([glue.assistant, *messages])
                    s.extend(glue.ids, None)
                turn += 1
            await asyncio.gather(*(self._calc_rewards(s) for s in states))
        finally:
            await asyncio.gather(*(self._release(s) for s in states))
        self.last_messages = [s.messages for s in states]
        return [s.trajectory() for s in states]

    # ------------------------------------------------------------------ per-sample tool arguments

    def row_tools_kwargs(self, prompt: Prompt) -> dict[str, dict[str, dict[str, Any]]]:
        """The row's ``extra_info.tools_kwargs`` for this loop's tools: ``{tool: {stage: kwargs}}``.

        A malformed entry, or keyword arguments the tool's method does not take, is a UsageError
        naming the row; an entry for a tool this run does not offer is skipped with a warning (once
        per tool). ``None`` entries are absent ones (Parquet fills missing struct fields so).
        """
        raw = (prompt.extra_info or {}).get("tools_kwargs")
        if raw is None:
            return {}
        where = f"data row {prompt.index}" + (
            f" (data_source {prompt.data_source!r})" if prompt.data_source else ""
        )
        if isinstance(raw, str):  # some pipelines store it as JSON text
            try:
                raw = json.loads(raw)
            except ValueError as exc:
                raise UsageError(
                    f"{where}: extra_info.tools_kwargs is a string but not JSON: {exc}"
                ) from None
        if not isinstance(raw, dict):
            raise UsageError(
                f'{where}: extra_info.tools_kwargs must map tool names to {{"create_kwargs": {{...}}, ...}}, '
                f"got {type(raw).__name__}"
            )
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for name, entry in raw.items():
            if entry is None:
                continue
            key = f"extra_info.tools_kwargs.{name}"
            if not isinstance(entry, dict):
                raise UsageError(
                    f"{where}: {key} must be a mapping of {', '.join(TOOL_KWARGS_STAGES)}, got {type(entry).__name__}"
                )
            if name not in self.tools:
                if name not in self._warned_unknown:
                    self._warned_unknown.add(name)
                    logger.warning(
                        "{}: {} names a tool this run does not offer (offered: {}); its arguments are not used",
                        where,
                        key,
                        ", ".join(sorted(self.tools)) or "none",
                    )
                continue
            stages: dict[str, dict[str, Any]] = {}
            for stage, kwargs in entry.items():
                if kwargs is None:
                    continue
                if stage not in TOOL_KWARGS_STAGES:
                    raise UsageError(f"{where}: {key}.{stage} is not one of {', '.join(TOOL_KWARGS_STAGES)}")
                if not isinstance(kwargs, dict):
                    raise UsageError(
                        f"{where}: {key}.{stage} must be a mapping of keyword arguments, got {type(kwargs).__name__}"
                    )
                if kwargs:
                    self._check_accepts(name, stage, kwargs, f"{where}: {key}.{stage}")
                    stages[stage] = dict(kwargs)
            out[name] = stages
        return out

    def _check_accepts(self, name: str, stage: str, kwargs: dict[str, Any], where: str) -> None:
        cached = (name, stage, tuple(sorted(kwargs)))
        if cached in self._accepted:
            return
        tool = self.tools[name]
        method_name = TOOL_KWARGS_STAGES[stage]
        method = getattr(tool, method_name, None)
        if not callable(method):
            raise UsageError(
                f"{where} is given, but tool {name!r} ({type(tool).__name__}) has no {method_name}() method"
            )
        try:
            signature = inspect.signature(method)
        except (TypeError, ValueError):  # a builtin or C callable: trust it
            self._accepted.add(cached)
            return
        positional: tuple[Any, ...] = (
            ("trajectory-id", {}) if method_name == "execute" else ("trajectory-id",)
        )
        try:
            signature.bind(*positional, **kwargs)
        except TypeError as exc:
            raise UsageError(
                f"{where} gives {', '.join(sorted(kwargs))}, which {type(tool).__name__}.{method_name}{signature} "
                f"does not take ({exc})"
            ) from None
        self._accepted.add(cached)

    @staticmethod
    def _check(outputs: Any, prompts: int, n: int) -> list[list[Any]]:
        if len(outputs) != prompts or any(len(g) != n for g in outputs):
            raise RlcoreError(
                f"the rollout engine returned a wrong number of completions (expected {prompts} x {n})"
            )
        return outputs

    def _plain(self, text: str) -> str:
        content, _ = self.glue.split_generated(text)
        eos = self.tokenizer.eos_token
        return content.replace(eos, "") if eos else content

    def _take_turn(self, s: _State, comp: Any, limit: int) -> tuple[str, ParsedTurn] | None:
        """Append one completion; return its text when the turn asks for tools and may continue."""
        ids, lps = list(comp.token_ids)[:limit], list(comp.logprobs)[:limit]
        if len(lps) != len(ids):
            raise RlcoreError(
                f"the rollout engine returned {len(lps)} log-probabilities for {len(ids)} tokens"
            )
        truncated = len(ids) < len(comp.token_ids)
        s.extend(ids, lps)
        s.turns += 1
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        if truncated or comp.finish_reason == "length":
            return self._finish(s, text, "length")
        parsed = parse_tool_calls(self._plain(text), self.options.parser)
        if not parsed.wants_tools:
            return self._finish(s, text, "stop")
        if s.turns >= self.options.max_turns:
            s.counts["tool_parse_errors"] += len(parsed.errors)
            return self._finish(s, text, "max_turns")
        return text, parsed

    def _finish(self, s: _State, text: str, reason: str) -> None:
        s.done, s.finish_reason = True, reason
        s.messages.append({"role": "assistant", "content": self.glue.split_generated(text)[0]})

    # ------------------------------------------------------------------ tools

    async def _run_calls(self, s: _State, parsed: ParsedTurn) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        for err in parsed.errors:
            s.counts["tool_parse_errors"] += 1
            s.counts["tool_errors"] += 1
            messages.append({"role": "tool", "name": "error", "content": f"Error: {err}"})
        calls = parsed.calls[: self.options.max_calls_per_turn]
        results = await asyncio.gather(*(self._call(s, c) for c in calls))
        for call, text in zip(calls, results):
            messages.append({"role": "tool", "name": call.name, "tool_call_id": call.id, "content": text})
        for call in parsed.calls[self.options.max_calls_per_turn :]:
            s.counts["tool_errors"] += 1
            messages.append(
                {
                    "role": "tool",
                    "name": call.name,
                    "tool_call_id": call.id,
                    "content": f"Error: at most {self.options.max_calls_per_turn} tool calls per turn; this one was not run",
                }
            )
        return messages

    async def _call(self, s: _State, call: ToolCall) -> str:
        s.counts["tool_calls"] += 1
        tool = self.tools.get(call.name)
        if tool is None:
            s.counts["tool_errors"] += 1
            s.counts["tool_unknown"] += 1
            return f"Error: there is no tool named {call.name!r}; available: {', '.join(sorted(self.tools)) or 'none'}"
        assert self._semaphore is not None
        timeout = self.options.tool_timeout_s
        started = time.perf_counter()
        try:
            # Wait for the tool's own slot first, outside the timeout: a call queued behind others on a
            # busy machine is not a call that hangs (the tool limits each run's time itself).
            if call.name not in s.created:
                await self._create(s, call.name)
            if call.name in s.broken:
                s.counts["tool_errors"] += 1
                return (
                    f"Error: {call.name!r} could not be set up for this conversation: {s.broken[call.name]}"
                )
            execute_kwargs = s.tools_kwargs.get(call.name, {}).get("execute_kwargs", {})
            async with self._tool_gate(call.name, tool), self._semaphore:
                result = await asyncio.wait_for(tool.execute(s.id, call.arguments, **execute_kwargs), timeout)
        except TimeoutError:
            s.counts["tool_errors"] += 1
            s.counts["tool_timeouts"] += 1
            return f"Error: the call to {call.name!r} timed out after {timeout:g} s"
        except Exception as exc:  # noqa: BLE001 - a failing tool must never end the rollout
            s.counts["tool_errors"] += 1
            logger.debug("tool {} raised: {!r}", call.name, exc)
            return f"Error: {call.name!r} failed: {type(exc).__name__}: {exc}"
        finally:
            s.counts["tool_time_s"] += time.perf_counter() - started
        if not isinstance(result, ToolResult):
            s.counts["tool_errors"] += 1
            return f"Error: {call.name!r} returned {type(result).__name__}, not a ToolResult"
        if result.error:
            s.counts["tool_errors"] += 1
        if result.reward is not None:
            s.step_reward += float(result.reward)
        for key, value in (result.metrics or {}).items():
            try:
                s.counts[f"{call.name}/{key}"] += float(value)
            except (TypeError, ValueError):
                pass
        return truncate_middle(str(result.text), self.options.max_tool_response_chars)

    def _tool_gate(self, name: str, tool: Tool) -> Any:
        """A semaphore of the tool's ``max_concurrency`` (an optional attribute: the python tool runs
        that many programs at once and queues the rest), or a no-op for tools without one."""
        limit = getattr(tool, "max_concurrency", None)
        if not isinstance(limit, int) or limit < 1:
            return contextlib.nullcontext()
        gate = self._gates.get(name)
        if gate is None:
            gate = self._gates[name] = asyncio.Semaphore(limit)
        return gate

    async def _create(self, s: _State, name: str) -> None:
        """Create the tool's state for the trajectory (once; a tool without ``create`` needs none).
        A failure is remembered: the tool's calls in this trajectory get it as their error."""
        if name in s.created:
            return
        s.created.add(name)
        tool = self.tools[name]
        create = getattr(tool, "create", None)
        if create is None:
            return
        kwargs = s.tools_kwargs.get(name, {}).get("create_kwargs", {})
        assert self._semaphore is not None
        try:
            async with self._tool_gate(name, tool), self._semaphore:
                await asyncio.wait_for(create(s.id, **kwargs), self.options.tool_timeout_s)
        except Exception as exc:  # noqa: BLE001 - a failing tool must never end the rollout
            why = "timed out" if isinstance(exc, asyncio.TimeoutError) else f"{type(exc).__name__}: {exc}"
            s.broken[name] = why
            s.counts["tool_errors"] += 1
            s.counts["tool_create_errors"] += 1
            logger.warning("creating tool {} for trajectory {} failed: {}", name, s.id, why)

    async def _calc_rewards(self, s: _State) -> None:
        """Ask every tool the trajectory created (and that has ``calc_reward``) for its reward; the
        value adds to the trajectory's step reward and shows as ``agent/<tool>/reward``."""
        for name in sorted(s.created):
            tool = self.tools[name]
            calc = getattr(tool, "calc_reward", None)
            if calc is None or name in s.broken:
                continue
            kwargs = s.tools_kwargs.get(name, {}).get("calc_reward_kwargs", {})
            try:
                value = await asyncio.wait_for(calc(s.id, **kwargs), self.options.tool_timeout_s)
                if value is None:
                    continue
                if not isinstance(value, numbers.Real):
                    raise TypeError(f"calc_reward returned {type(value).__name__}, not a number")
                value = float(value)
            except Exception as exc:  # noqa: BLE001 - a failing tool must never end the rollout
                why = "timed out" if isinstance(exc, asyncio.TimeoutError) else f"{type(exc).__name__}: {exc}"
                s.counts["tool_errors"] += 1
                s.counts["tool_reward_errors"] += 1
                logger.warning(
                    "tool {}'s calc_reward for trajectory {} failed (no reward added): {}", name, s.id, why
                )
                continue
            s.step_reward += value
            s.counts[f"{name}/reward"] += value

    async def _release(self, s: _State) -> None:
        for name in s.created:
            release = getattr(self.tools[name], "release", None)
            if release is None or name in s.broken:  # a failed create left nothing to release
                continue
            kwargs = s.tools_kwargs.get(name, {}).get("release_kwargs", {})
            try:
                await asyncio.wait_for(release(s.id, **kwargs), self.options.tool_timeout_s)
            except Exception as exc:  # noqa: BLE001
                logger.warning("releasing tool {} for trajectory {} failed: {!r}", name, s.id, exc)


def build(options: ToolLoopOptions, context: Any) -> ToolLoop:
    """Build the loop with ``context.tokenizer`` and the run's tools (``context.tools``, and those
    of ``tool_config``)."""
    available: dict[str, Tool] = dict(getattr(context, "tools", None) or {})
    tools: dict[str, Tool] = {}
    origin: dict[str, str] = {}
    for key, tool in available.items():
        if getattr(tool, "takes_table_name", False):  # a function tool without an explicit name
            tool.name = key
        name = getattr(tool, "name", None) or key
        if name in tools:
            raise UsageError(
                f"[tools.{key}] and {origin[name]} both offer a tool named {name!r}; tool names must differ"
            )
        tools[name], origin[name] = tool, f"[tools.{key}]"
    if options.tool_config is not None:
        from rlcore_agent.class_tool import build_config_tools

        for name, tool in build_config_tools(
            options.tool_config, getattr(context, "manifest_dir", None)
        ).items():
            if name in tools:
                raise UsageError(
                    f"{options.tool_config} offers a tool named {name!r}, as {origin[name]} does; tool names must differ"
                )
            tools[name], origin[name] = tool, options.tool_config
    if options.tools is not None:
        missing = [n for n in options.tools if n not in tools]
        if missing:
            raise UsageError(
                f"[agent] tools names {missing}, which are not configured; configured [tools.*]: {sorted(tools) or 'none'}"
            )
        tools = {n: tools[n] for n in options.tools}
    if not tools:
        logger.warning("the `tool` agent loop has no tools: add a [tools.<name>] table (e.g. [tools.python])")
    return ToolLoop(options, getattr(context, "tokenizer", None), tools)
