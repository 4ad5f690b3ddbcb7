"""The ``verifiers`` agent loop: a verifiers environment's episodes, played token in, token out.

Each sample is one episode: the environment's own ``Env.setup`` and ``Env.run(task, agents)``
(``SingleAgentEnv`` for a plain taskset) run as verifiers would run them, but the seat they drive
is played here, by rlcore's rollout engine, instead of by a harness program behind an
interception server. ``agents.<seat>.run(task)`` plays one segment; ``agents.<seat>.interaction(task)``
gives the env the turn-by-turn handle (``turn(message)`` returns a ``vf.Segment``), so an env that
answers the model (a game, a scripted user, a checker) plays multi-turn.

A segment is model turns until the model answers without a tool call. Tool calls (Hermes
``<tool_call>`` tags or OpenAI JSON) go to the task's toolsets (``Task.toolsets`` per episode,
``Taskset.toolsets`` shared), served in process by an MCP server each, with verifiers' tool names
(``<server>_<tool>``) and argument validation. Token ids accumulate as in rlcore's ``tool`` loop:
the model's tokens as sampled (mask 1), and only the chat template's glue around tool results
and user turns tokenised (mask 0, log-probability 0); see :mod:`rlcore.chat`.

Stop conditions are verifiers': the seat's ``max_turns`` (or this loop's), the task's ``@vf.stop``
functions on the trace before each model call, on the request before it is sent, and on the
response after it; plus the run's token budget (``data.max_response_tokens``, stop
``max_output_tokens``, finish reason ``length``). All live episodes' model calls of a round go to
the engine together.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import json
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from loguru import logger

from rlcore.chat import ChatGlue, truncate_middle
from rlcore.errors import RlcoreError, UsageError
from rlcore.interfaces import Prompt, RolloutEngine, SamplingParams, Trajectory
from rlcore.tool_calls import parse_tool_calls
from rlcore_verifiers import envs, traces
from rlcore_verifiers.options import VerifiersLoopOptions
from rlcore_verifiers.reward import RECORD
from rlcore_verifiers.source import prompt_messages
from rlcore_verifiers.traces import KEY

DEFAULT_MAX_TURNS = 8

# The task state of the episode whose tool call is running (toolsets read and write it).
_EPISODE_STATE: contextvars.ContextVar[Any] = contextvars.ContextVar("rlcore_verifiers_state", default=None)


class EpisodeError(RuntimeError):
    """The env's code used the seat in a way rlcore does not play (raised into its ``run``)."""


# ----------------------------------------------------------------------------- the engine


class _Batcher:
    """Gathers the model calls of all live episodes into one ``engine.generate`` call: a round is
    sent when every live episode waits for the model (or has ended)."""

    def __init__(self, engine: RolloutEngine, params: SamplingParams, live: int) -> None:
        self.engine, self.params, self.live = engine, params, live
        self.pending: list[tuple[list[int], int, asyncio.Future]] = []
        self.busy = False
        self.rounds = 0

    async def generate(self, ids: list[int], limit: int) -> Any:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((ids, limit, future))
        self._kick()
        return await future

    def finished(self) -> None:
        self.live -= 1
        self._kick()

    def _kick(self) -> None:
        if not self.busy and self.pending and len(self.pending) >= self.live:
            self.busy = True
            asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        batch, self.pending = [b for b in self.pending if not b[2].done()], []
        try:
            if not batch:
                return
            update: dict[str, Any] = {"max_new_tokens": max(limit for _, limit, _ in batch), "n": 1}
            if self.params.seed is not None:
                update["seed"] = self.params.seed + self.rounds
            self.rounds += 1
            # Samples of one prompt asking together (every episode's first turn) go as one request of n.
            keys: dict[tuple[int, ...], list[int]] = {}
            for i, (ids, _, _) in enumerate(batch):
                keys.setdefault(tuple(ids), []).append(i)
            sizes = {len(v) for v in keys.values()}
            if len(sizes) == 1 and (k := sizes.pop()) > 1:
                update["n"] = k
                inputs = [list(key) for key in keys]
                order = [i for members in keys.values() for i in members]
            else:
                inputs = [ids for ids, _, _ in batch]
                order = list(range(len(batch)))
            outputs = await asyncio.to_thread(
                self.engine.generate, inputs, self.params.model_copy(update=update)
            )
            if len(outputs) != len(inputs) or any(len(g) != update["n"] for g in outputs):
                raise RlcoreError(
                    f"the rollout engine returned a wrong number of completions "
                    f"(expected {len(inputs)} x {update['n']})"
                )
            for i, completion in zip(order, [c for group in outputs for c in group]):
                if not batch[i][2].done():  # an episode cancelled (timed out) while it waited
                    batch[i][2].set_result(completion)
        except BaseException as exc:  # noqa: BLE001 - every waiting episode learns of it
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        finally:
            self.busy = False
            self._kick()


# ----------------------------------------------------------------------------- tools


class _Toolsets:
    """The toolsets of one episode (and the shared ones), each behind an in-process MCP server."""

    def __init__(self) -> None:
        self.servers: dict[str, tuple[Any, Any]] = {}  # full tool name -> (MCP server, tool name on it)
        self.schemas: list[dict[str, Any]] = []
        self.owned: list[Any] = []

    async def add(self, toolset: Any, *, own: bool, task: Any = None) -> None:
        from mcp.server.mcpserver import MCPServer
        from verifiers.v1.utils.decorators import discover_decorated

        if own:
            self.owned.append(toolset)
            await toolset.setup()
            if task is not None:
                await toolset.setup_task(task)
        server = MCPServer(toolset.server_name or type(toolset).__name__)
        for fn in discover_decorated(toolset, "tool"):
            server.add_tool(
                _with_episode_state(toolset, fn),
                name=getattr(fn, "tool_name", None) or fn.__name__,
                description=(fn.__doc__ or "").strip() or None,
            )
        prefix = toolset.server_name
        for tool in await server.list_tools():
            full = f"{prefix}_{tool.name}" if prefix else tool.name
            if full in self.servers:
                raise EpisodeError(f"two toolsets offer a tool named {full!r}")
            self.servers[full] = (server, tool.name)
            self.schemas.append(
                {
                    "type": "function",
                    "function": {
                        "name": full,
                        "description": tool.description or "",
                        "parameters": tool.input_schema,
                    },
                }
            )

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        from verifiers.v1.harnesses.utils.mcp import mcp_content_to_chat_content

        if name not in self.servers:
            return (
                f"Error: there is no tool named {name!r}; available: {', '.join(sorted(self.servers)) or 'none'}",
                True,
            )
        server, raw = self.servers[name]
        try:
            result = await server.call_tool(raw, arguments)
        except Exception as exc:  # noqa: BLE001 - a failing tool is a message to the model
            return f"Error: {exc}", True
        content = mcp_content_to_chat_content(result.content)
        text = content if isinstance(content, str) else "\n".join(p.get("text", "") for p in content)
        return text, bool(getattr(result, "is_error", False))

    async def close(self) -> None:
        for toolset in self.owned:
            with contextlib.suppress(Exception):
                await toolset._exit_stack.aclose()


def _with_episode_state(toolset: Any, fn: Any) -> Any:
    """``fn`` with ``toolset.state`` bound to the calling episode's task state, as verifiers' state
    channel would bind it (one state object per rollout, shared by the task and its toolsets)."""
    import functools
    import inspect

    from verifiers.v1.mcp import server as mcp_server

    @functools.wraps(fn)
    async def call(*args: Any, **kwargs: Any) -> Any:
        holder = _EPISODE_STATE.get()
        state = holder[0] if holder is not None else None
        own = toolset._state_cls
        if state is not None and not isinstance(state, own):
            state = own.model_validate(state.model_dump())
        token = mcp_server._call_state.set(state)
        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        finally:
            mcp_server._call_state.reset(token)
        if holder is not None and state is not None and state is not holder[0]:
            holder[0] = type(holder[0]).model_validate(state.model_dump())
        return result

    call.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return call


# ----------------------------------------------------------------------------- one episode


@dataclasses.dataclass
class _Episode:
    """One sample: the seat's conversation, its tokens and its trace."""

    loop: VerifiersLoop
    prompt: Prompt
    loaded: envs.Loaded
    batcher: _Batcher
    budget: int
    shared: list[Any]
    response_ids: list[int] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # what the template renders
    pending_text: str | None = None  # the last model turn, its glue not yet added
    trace: Any = None
    tools: _Toolsets | None = None
    glue: ChatGlue | None = None
    started: bool = False
    ended: bool = False
    counts: dict[str, float] = dataclasses.field(default_factory=dict)
    error: str | None = None
    task: Any = None  # the task the env handed the seat
    state_holder: list[Any] = dataclasses.field(
        default_factory=list
    )  # [the task state], rebound by toolsets of another state type

    def count(self, key: str, value: float = 1.0) -> None:
        self.counts[key] = self.counts.get(key, 0.0) + value

    # ------------------------------------------------------------------ opening

    async def open(self, task: Any) -> None:
        if self.started:
            raise EpisodeError("rlcore plays one run of one seat per episode; this env starts a second one")
        self.started = True
        loaded = self.loaded
        self.trace = traces.new_trace(task, loaded.seat, loaded.seat_config)
        self.state_holder[:] = [self.trace.state]
        self.tools = _Toolsets()
        for toolset in type(task).toolsets(task.config):
            await self.tools.add(toolset, own=True, task=task)
        for toolset in self.shared:
            await self.tools.add(toolset, own=False)
        self.glue = self.loop.glue_for(self.tools.schemas)
        messages = prompt_messages(task.data)
        if not messages or task.data.prompt is None:
            raise EpisodeError("the seat's task has no prompt; rlcore starts an episode from a prompt")
        for m in messages:
            traces.append(self.trace, traces.message(m), False)
        if self.tools.schemas:
            messages = self.glue.with_tools(messages)
        if messages != list(self.prompt.messages) or self.tools.schemas:
            self.prompt = dataclasses.replace(
                self.prompt, token_ids=self.glue.prompt_ids(messages), messages=messages
            )
        self.messages = [dict(m) for m in messages]

    # ------------------------------------------------------------------ turns

    def _stopped(self, condition: str) -> None:
        self.trace.stop(condition)
        self.ended = True

    async def _refused(self) -> bool:
        """verifiers' checks before a model call: the turn limit, then @stop on the trace and on the request."""
        import verifiers.v1 as vf
        from verifiers.v1.session import call_hook

        if self.ended:
            return True
        if self.trace.num_turns >= self.loop.max_turns(self.loaded):
            self._stopped("max_turns")
            return True
        for fn in self.loop.stops(self.task, "trace"):
            if await call_hook(fn, {vf.Trace: self.trace}) is True:
                self._stopped(fn.__name__)
                return True
        request = None
        for fn in self.loop.stops(self.task, "request"):
            request = request or vf.Request(
                messages=self.trace.messages,
                tools=[
                    vf.Tool(
                        name=s["function"]["name"],
                        description=s["function"]["description"],
                        parameters=s["function"]["parameters"],
                    )
                    for s in self.tools.schemas
                ]
                or None,
            )
            if await call_hook(fn, {vf.Request: request.model_copy(deep=True), vf.Trace: self.trace}) is True:
                self._stopped(fn.__name__)
                return True
        return False

    async def segment(self) -> list[Any] | None:
        """Model turns until the model answers without a tool call; the segment's messages, or
        None when the episode was over before the first model call."""
        import verifiers.v1 as vf
        from verifiers.v1.session import call_hook

        produced: list[Any] = []
        while True:
            if await self._refused():
                return produced or None
            limit = min(
                self.budget - len(self.response_ids), self.loop.options.max_tokens_per_turn or self.budget
            )
            if limit <= 0:
                self._stopped("max_output_tokens")
                return produced or None
            completion = await self.batcher.generate(list(self.prompt.token_ids) + self.response_ids, limit)
            ids, lps = list(completion.token_ids)[:limit], list(completion.logprobs)[:limit]
            if len(lps) != len(ids):
                raise RlcoreError(
                    f"the rollout engine returned {len(lps)} log-probabilities for {len(ids)} tokens"
                )
            truncated = len(ids) < len(completion.token_ids) or completion.finish_reason == "length"
            self.response_ids += [int(t) for t in ids]
            self.mask += [1] * len(ids)
            self.logprobs += [float(x) for x in lps]
            text = self.loop.tokenizer.decode(ids, skip_special_tokens=False)
            plain = self.loop.plain(self.glue, text)
            parsed = parse_tool_calls(plain, self.loop.options.parser)
            calls = [
                vf.ToolCall(id=c.id, name=c.name, arguments=json.dumps(c.arguments, ensure_ascii=False))
                for c in parsed.calls
            ]
            # As an OpenAI-style reply: the text, and the calls beside it (not inside it)
            assistant = vf.AssistantMessage(
                content=parsed.content if parsed.wants_tools else plain, tool_calls=calls or None
            )
            traces.append(self.trace, assistant, True)
            produced.append(assistant)
            self.pending_text = text
            response = vf.Response(
                id=uuid.uuid4().hex,
                created=int(time.time()),
                model="rlcore",
                message=assistant,
                finish_reason="length" if truncated else ("tool_calls" if calls else "stop"),
            )
            for fn in self.loop.stops(self.task, "response"):
                if (
                    await call_hook(fn, {vf.Response: response.model_copy(deep=True), vf.Trace: self.trace})
                    is True
                ):
                    self._stopped(fn.__name__)
                    return produced
            if truncated:
                self._stopped("max_output_tokens")
                return produced
            if not parsed.wants_tools:
                return produced
            tool_messages = await self._run_calls(parsed)
            for m in tool_messages:
                vm = vf.ToolMessage(
                    tool_call_id=m.get("tool_call_id") or "error", content=m["content"], name=m.get("name")
                )
                traces.append(self.trace, vm, False)
                produced.append(vm)
            if not self._add_glue(tool_messages):
                return produced

    def _add_glue(self, new_messages: list[dict[str, Any]]) -> bool:
        """The template's tokens after the last model turn and ``new_messages`` (mask 0); False
        when they do not fit the budget (the episode stops)."""
        glue = self.glue.turn_glue(self.messages, self.pending_text or "", new_messages)
        if glue.mismatch:
            self.count("template_mismatch")
        if len(self.response_ids) + len(glue.ids) >= self.budget:
            self.messages.append(glue.assistant)
            self._stopped("max_output_tokens")
            return False
        self.messages.extend([glue.assistant, *new_messages])
        self.pending_text = None
        self.response_ids += glue.ids
        self.mask += [0] * len(glue.ids)
        self.logprobs += [0.0] * len(glue.ids)
        return True

    async def _run_calls(self, parsed: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for err in parsed.errors:
            self.count("tool_errors")
            self.count("tool_parse_errors")
            out.append({"role": "tool", "name": "error", "content": f"Error: {err}"})
        limit = self.loop.options.max_calls_per_turn
        token = _EPISODE_STATE.set(self.state_holder)
        try:
            for call in parsed.calls[:limit]:
                self.count("tool_calls")
                try:
                    text, failed = await asyncio.wait_for(
                        self.tools.call(call.name, call.arguments), self.loop.options.tool_timeout_s
                    )
                except TimeoutError:
                    text, failed = (
                        f"Error: the call to {call.name!r} timed out after {self.loop.options.tool_timeout_s:g} s",
                        True,
                    )
                if failed:
                    self.count("tool_errors")
                out.append(
                    {
                        "role": "tool",
                        "name": call.name,
                        "tool_call_id": call.id,
                        "content": truncate_middle(text, self.loop.options.max_tool_response_chars),
                    }
                )
        finally:
            _EPISODE_STATE.reset(token)
            self.trace.state = self.state_holder[0]
        for call in parsed.calls[limit:]:
            self.count("tool_errors")
            out.append(
                {
                    "role": "tool",
                    "name": call.name,
                    "tool_call_id": call.id,
                    "content": f"Error: at most {limit} tool calls per turn; this one was not run",
                }
            )
        return out

    async def user_turn(self, message: Any) -> bool:
        """The env speaks (a user turn); False when its tokens do not fit the budget."""
        new = (
            [{"role": "user", "content": message}]
            if isinstance(message, str)
            else [m if isinstance(m, dict) else m.model_dump(mode="json", exclude_none=True) for m in message]
        )
        for m in new:
            traces.append(self.trace, traces.message(m), False)
        if self.ended:
            return False
        return self._add_glue(new)

    # ------------------------------------------------------------------ the result

    def trajectory(self) -> Trajectory:
        trace = self.trace
        stop = trace.stop_condition if trace is not None else None
        if self.pending_text is not None:
            self.messages.append(
                {"role": "assistant", "content": self.glue.split_generated(self.pending_text)[0]}
            )
        metrics = {f"verifiers/{k}": float(v) for k, v in self.counts.items()}
        metrics["verifiers/num_turns"] = float(trace.num_turns if trace is not None else 0)
        metrics.setdefault("verifiers/tool_calls", 0.0)
        metrics.setdefault("verifiers/tool_errors", 0.0)
        metrics["verifiers/episode_errors"] = float(self.error is not None)
        if stop:
            metrics[f"verifiers/stop/{stop}"] = 1.0
        rec = traces.record(trace) if trace is not None else {"nodes": [], "stop": None, "state": {}}
        if self.error is not None:
            rec["error"] = self.error
        info = dict((self.prompt.extra_info or {}).get(KEY) or {})
        info[RECORD] = rec
        prompt = dataclasses.replace(self.prompt, extra_info={**(self.prompt.extra_info or {}), KEY: info})
        return Trajectory(
            prompt=prompt,
            response_ids=self.response_ids,
            response_mask=self.mask,
            rollout_logprobs=self.logprobs,
            finish_reason="length" if stop == "max_output_tokens" else "stop",
            num_turns=int(trace.num_turns if trace is not None else 0),
            tool_calls=int(self.counts.get("tool_calls", 0)),
            tool_errors=int(self.counts.get("tool_errors", 0)),
            metrics=metrics,
        )


# ----------------------------------------------------------------------------- what env.run sees


class _Interaction:
    """``agents.<seat>.interaction(task)``'s handle: verifiers' ``Interaction.turn`` contract."""

    def __init__(self, episode: _Episode) -> None:
        self._episode = episode
        self._over = False
        self._turned = False

    @property
    def trace(self) -> Any:
        return self._episode.trace

    async def turn(self, message: Any = None) -> Any:
        import verifiers.v1 as vf

        e = self._episode
        if self._over:
            raise RuntimeError("the exchange is over (the run ended); read interaction.trace")
        prompted = not self._turned
        if prompted and message is not None:
            raise ValueError(
                "the task's prompt opens this exchange: take its first reply with a bare turn() before answering"
            )
        if not prompted and message is None:
            raise ValueError("nothing to run a turn on: this exchange takes its next user message")
        self._turned = True
        if message is not None and not await e.user_turn(message):
            self._over = True
            return vf.Segment(messages=[], terminated=True)
        produced = await e.segment()
        if produced is None:
            self._over = True
            return vf.Segment(messages=[], terminated=True)
        return vf.Segment(messages=produced)

    async def close(self) -> Any:
        if self._episode.trace is not None:
            self._episode.trace.stop("user_closed")
        return self._episode.trace

    async def send(self, *args: Any, **kwargs: Any) -> Any:
        raise EpisodeError(
            "Interaction.send/steer (messages during a running turn) are not played by rlcore; use turn()"
        )

    steer = send


class _Seat:
    """``agents.<seat>``: played by rlcore's policy."""

    def __init__(self, episode: _Episode, name: str) -> None:
        self._episode = episode
        self.name = name
        self.trainable = True

    async def run(self, task: Any, **_: Any) -> Any:
        e = self._episode
        e.task = task
        await e.open(task)
        await e.segment()
        if not e.ended:
            e.trace.stop("agent_completed")
        return e.trace

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any, **_: Any):
        e = self._episode
        e.task = task
        await e.open(task)
        handle = _Interaction(e)
        try:
            yield handle
        finally:
            await handle.close()


class _Agents:
    def __init__(self, seat: _Seat) -> None:
        self._seat = seat

    def __getattr__(self, name: str) -> _Seat:
        seat = self.__dict__.get("_seat")
        if seat is None or name != seat.name:
            raise AttributeError(f"no agent {name!r}; this config declares {[seat.name] if seat else []}")
        return seat


# ----------------------------------------------------------------------------- the loop


class VerifiersLoop:
    def __init__(self, options: VerifiersLoopOptions, tokenizer: Any) -> None:
        if tokenizer is None:
            raise UsageError("the `verifiers` agent loop needs the run's tokenizer (BuildContext.tokenizer)")
        self.options = options
        self.tokenizer = tokenizer
        self._glues: dict[str, ChatGlue] = {}
        self._stops: dict[tuple[type, str], list[Any]] = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rlcore-verifiers")
        self.last_messages: list[
            list[dict[str, Any]]
        ] = []  # the conversations of the last run (debugging, tests)
        self.last_traces: list[Any] = []

    def glue_for(self, schemas: list[dict[str, Any]]) -> ChatGlue:
        key = json.dumps(schemas, sort_keys=True)
        if key not in self._glues:
            self._glues[key] = ChatGlue(self.tokenizer, schemas)
        return self._glues[key]

    def plain(self, glue: ChatGlue, text: str) -> str:
        content, _ = glue.split_generated(text)
        eos = self.tokenizer.eos_token
        return content.replace(eos, "") if eos else content

    def max_turns(self, loaded: envs.Loaded) -> int:
        return self.options.max_turns or loaded.seat_config.max_turns or DEFAULT_MAX_TURNS

    def stops(self, task: Any, boundary: str) -> list[Any]:
        """The task's ``@vf.stop`` functions for one boundary (trace, request or response)."""
        import verifiers.v1 as vf
        from verifiers.v1.session import hook_boundary

        key = (type(task), boundary)
        if key not in self._stops:
            kinds = {"trace": vf.Trace, "request": vf.Request, "response": vf.Response}
            self._stops[key] = [
                fn for fn in task.hooks("stop") if hook_boundary(fn, allow_trace=True) is kinds[boundary]
            ]
        return self._stops[key]

    def run(
        self, prompts: Sequence[Prompt], engine: RolloutEngine, params: SamplingParams
    ) -> list[Trajectory]:
        if not prompts:
            return []
        return self._pool.submit(asyncio.run, self._run(list(prompts), engine, params)).result()

    async def _run(
        self, prompts: list[Prompt], engine: RolloutEngine, params: SamplingParams
    ) -> list[Trajectory]:
        loaded = []
        for prompt in prompts:
            info = (prompt.extra_info or {}).get(KEY)
            if not isinstance(info, dict) or "task" not in info:
                raise UsageError(
                    f"data row {prompt.index} ({prompt.data_source!r}) is not a verifiers row: the verifiers "
                    'agent loop plays rows of the verifiers data source (data.train = "verifiers:ENV")'
                )
            loaded.append(envs.load_from_row(info))
        shared: dict[int, list[Any]] = {}
        for item in {id(x): x for x in loaded}.values():
            shared[id(item)] = list(item.classes.taskset.toolsets(item.taskset_config))
            for toolset in shared[id(item)]:
                await toolset.setup()
        batcher = _Batcher(engine, params, len(prompts) * params.n)
        episodes = [
            _Episode(self, prompt, item, batcher, params.max_new_tokens, shared[id(item)])
            for prompt, item in zip(prompts, loaded)
            for _ in range(params.n)
        ]
        try:
            await asyncio.gather(*(self._play(e, batcher) for e in episodes))
        finally:
            for toolsets in shared.values():
                for toolset in toolsets:
                    with contextlib.suppress(Exception):
                        await toolset._exit_stack.aclose()
        self.last_messages = [e.messages for e in episodes]
        self.last_traces = [e.trace for e in episodes]
        return [e.trajectory() for e in episodes]

    async def _play(self, e: _Episode, batcher: _Batcher) -> None:
        loaded = e.loaded
        try:
            env = loaded.env()
            task = loaded.task(e.prompt.extra_info[KEY]["task"])
            seat = _Seat(e, loaded.seat)
            agents = _Agents(seat)
            await asyncio.wait_for(self._episode(env, task, agents, seat), self.options.episode_timeout_s)
            if not e.started:
                raise EpisodeError(f"{type(env).__name__}.run() ran no agent")
        except RlcoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - the env's code failing is this episode's outcome
            e.error = "timeout" if isinstance(exc, asyncio.TimeoutError) else f"{type(exc).__name__}: {exc}"
            logger.warning("verifiers episode of row {} failed: {}", e.prompt.index, e.error)
        finally:
            e.ended = True
            if e.tools is not None:
                await e.tools.close()
            batcher.finished()

    @staticmethod
    async def _episode(env: Any, task: Any, agents: _Agents, seat: _Seat) -> None:
        await env.setup(agents)
        if not seat.trainable:
            raise EpisodeError(
                f"{type(env).__name__}.setup() makes seat {seat.name!r} untrainable; rlcore trains the seat it plays"
            )
        await env.run(task, agents)


def build(options: VerifiersLoopOptions, context: Any) -> VerifiersLoop:
    return VerifiersLoop(options, getattr(context, "tokenizer", None))
