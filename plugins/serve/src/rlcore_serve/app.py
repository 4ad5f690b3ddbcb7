"""An OpenAI-compatible server over any :class:`rlcore.interfaces.RolloutEngine`.

Endpoints: ``POST /v1/chat/completions`` (tools rendered by the chat template, tool calls parsed
from the output into OpenAI's shape, ``logprobs`` and ``top_logprobs``), ``POST /v1/completions``
(token ids in, token ids out: ``prompt`` may be a list of ids), ``GET /v1/models`` and
``GET /health`` (answers without touching the engine or its weights). Field names follow vLLM's
server, including its extensions ``return_token_ids`` (answers carry ``prompt_token_ids`` and
``token_ids``), ``top_k`` and ``stop_token_ids``. Streaming is not supported (``stream: true`` is
refused with a 400).

Errors: every request is checked before it reaches the engine (bounds on every number, finite
floats, prompt token ids in the vocabulary, prompt + ``max_tokens`` within the model's context,
``max_tokens`` within the server's limit), and a bad one is answered with a 400 in OpenAI's shape,
``{"error": {"message", "type": "invalid_request_error", "param", "code"}}``; an unknown ``model``
with a 404. Anything unexpected is a 500 in the same shape (type ``server_error``), and the
connection stays usable: no exception leaves the app, so uvicorn never drops a keep-alive
connection after an error.

Concurrent requests are batched into shared engine calls (:mod:`rlcore_serve.batching`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlcore.errors import UsageError
from rlcore.interfaces import Completion, RolloutEngine, SamplingParams
from rlcore.tool_calls import parse_tool_calls
from rlcore_serve.batching import Batcher, Result, reports_top_logprobs

logger = logging.getLogger("rlcore.serve")

# OpenAI's largest top_logprobs.
MAX_TOP_LOGPROBS = 20
# Seeds are 64-bit signed integers (vLLM's and most clients' range; the hf engine's generator
# takes no larger ones).
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
# Temperatures below this sample greedily, as in vLLM: dividing the logits by a tiny temperature
# overflows them to infinity.
GREEDY_BELOW = 1e-5
# A log-prob that is -inf (a token of probability 0) is reported as this: JSON has no infinity.
LOGPROB_FLOOR = -9999.0


def _float(default: float | None = None, **bounds: float) -> Any:
    return Field(default, allow_inf_nan=False, **bounds)


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown OpenAI fields are accepted and ignored

    model: str | None = None
    temperature: float | None = _float(ge=0.0, le=2.0)
    top_p: float | None = _float(gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    n: int = Field(1, ge=1, le=128)
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stream: bool = False
    return_token_ids: bool = False


class ChatRequest(_Request):
    messages: list[dict[str, Any]] = Field(..., min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(None, ge=1)  # OpenAI's default is 16
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False


class ApiError(Exception):
    """A request the server refuses: answered as ``{"error": {...}}`` with ``status``."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.kind, self.param, self.code = status, kind, param, code


def _error(
    message: str, status: int, kind: str, param: str | None = None, code: str | None = None
) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(status_code=status, content=body)


def _lone_surrogate(value: Any, path: str) -> str | None:
    """The dotted path of the first string under ``value`` holding a lone UTF-16 surrogate, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _lone_surrogate(item, f"{path}.{key}" if path else str(key))
        if found is None and isinstance(key, str):  # a key is text too
            found = _lone_surrogate(key, f"{path}.{key}" if path else key)
        if found is not None:
            return found
    return None


def _refuse_lone_surrogates(body: dict[str, Any]) -> None:
    """JSON may spell a lone surrogate (``"\\ud800"``); Python keeps it in a str that no tokenizer
    (and no UTF-8 encoder) accepts. Refused as the client's error, naming the field."""
    where = _lone_surrogate(body, "")
    if where is not None:
        raise ApiError(
            f"{where} holds a lone UTF-16 surrogate (a \\uD800-\\uDFFF escape without its pair), "
            "which is not valid Unicode text",
            param=where,
        )


class _AnswerEveryError:
    """ASGI middleware: an exception that escapes the app becomes a 500 in OpenAI's shape, and is
    not re-raised. (Starlette's own error middleware re-raises it after its plain-text 500, and
    uvicorn then closes the connection: a client's next request on it was reset.)"""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:  # noqa: BLE001 - the point: answer it, keep the connection
            logger.exception("rlcore serve: %s %s failed", scope.get("method"), scope.get("path"))
            if started:  # too late for a response of our own; uvicorn ends the connection
                raise
            response = _error(f"internal server error: {type(exc).__name__}: {exc}", 500, "server_error")
            await response(scope, receive, send)


def create_app(
    engine: RolloutEngine,
    tokenizer: Any,
    model_name: str = "rlcore",
    max_tokens: int = 256,
    stop: list[str] | None = None,
    max_tokens_limit: int | None = None,
    max_batch_size: int = 64,
    max_positions: int | None = None,
) -> FastAPI:
    """Serve ``engine``.

    ``max_tokens`` is the default response budget (cut to what the context leaves); ``stop``
    strings always apply. ``max_tokens_limit`` is the largest ``max_tokens`` a request may ask
    for (None: only the model's context bounds it). ``max_batch_size`` is the most sequences
    (prompts x n) of queued requests generated in one engine call. ``max_positions`` is the
    model's context length (default: the engine's ``max_positions`` attribute, which the ``hf``
    engine has; None: not checked here).
    """
    if max_tokens_limit is not None and max_tokens_limit < 1:
        raise UsageError(f"max_tokens_limit must be at least 1, got {max_tokens_limit}")
    app = FastAPI(title="rlcore serve", version="1")
    batcher = Batcher(engine, max_batch_size)
    app.state.batcher = batcher
    created = int(time.time())
    eos = [tokenizer.eos_token_id] if getattr(tokenizer, "eos_token_id", None) is not None else []
    positions = max_positions if max_positions is not None else getattr(engine, "max_positions", None)
    vocab = len(tokenizer)
    engine_vocab = getattr(engine, "vocab_size", None)
    if isinstance(engine_vocab, int) and engine_vocab > 0:
        vocab = min(vocab, engine_vocab)
    top_supported = reports_top_logprobs(engine)

    def check_model(req: _Request) -> None:
        _refuse_lone_surrogates(req.model_dump())
        if req.model is not None and req.model != model_name:
            raise ApiError(
                f"the model {req.model!r} does not exist; this server serves {model_name!r}",
                status=404,
                param="model",
                code="model_not_found",
            )

    def budget(
        requested: int | None, param: str, default: int, prompts: list[list[int]], prompt_param: str
    ) -> int:
        """The request's max_tokens, checked against the server's limit and the model's context."""
        if requested is not None and max_tokens_limit is not None and requested > max_tokens_limit:
            raise ApiError(
                f"{param} is {requested}; this server allows at most {max_tokens_limit} "
                "(rlcore serve --max-tokens-limit)",
                param=param,
            )
        room = None
        if positions:
            longest = max(len(p) for p in prompts)
            room = positions - longest
            if requested is not None and requested > room:
                advice = f"ask for at most {room}" if room >= 1 else "shorten the prompt"
                raise ApiError(
                    f"the prompt has {longest} tokens and {param} is {requested}: {longest + requested} tokens, "
                    f"more than the model's context of {positions} tokens; {advice}",
                    param=param if room >= 1 else prompt_param,
                    code="context_length_exceeded",
                )
            if room < 1:
                raise ApiError(
                    f"the prompt has {longest} tokens; the model's context is {positions} tokens, "
                    "which leaves no room for a completion",
                    param=prompt_param,
                    code="context_length_exceeded",
                )
        if requested is not None:
            return requested
        out = default if max_tokens_limit is None else min(default, max_tokens_limit)
        return out if room is None else min(out, room)

    def sampling(req: _Request, new_tokens: int) -> SamplingParams:
        if req.stream:
            raise ApiError("streaming is not supported by rlcore serve; send stream=false", param="stream")
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if any(s == "" for s in stops):
            raise ApiError("stop strings must not be empty", param="stop")
        bad = [t for t in req.stop_token_ids or [] if not 0 <= t < vocab]
        if bad:
            raise ApiError(f"stop_token_ids out of range [0, {vocab}): {bad[:5]}", param="stop_token_ids")
        temperature = 1.0 if req.temperature is None else req.temperature
        try:
            return SamplingParams(
                n=req.n,
                temperature=0.0 if temperature < GREEDY_BELOW else temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=-1 if req.top_k in (None, 0) else req.top_k,
                max_new_tokens=new_tokens,
                stop_token_ids=sorted(set(eos) | set(req.stop_token_ids or [])),
                stop=[*(stop or []), *stops],
                seed=req.seed,
            )
        except ValueError as exc:
            raise ApiError(str(exc)) from None

    def top_count(requested: int, param: str) -> int:
        if requested and not top_supported:
            raise ApiError(
                f"this engine ({type(engine).__name__}) reports only the sampled token's log-prob: "
                f"{param} must be 0 (the hf engine reports up to {MAX_TOP_LOGPROBS} top tokens)",
                param=param,
            )
        return requested

    async def run(prompts: list[list[int]], params: SamplingParams, top: int) -> Result:
        try:
            return await asyncio.wrap_future(batcher.submit(prompts, params, top))
        except UsageError as exc:  # the engine refused this input: the request's fault
            raise ApiError(str(exc)) from None

    def token_text(token_id: int) -> str:
        return tokenizer.decode([token_id], skip_special_tokens=False)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error(str(exc), exc.status, exc.kind, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        undecodable = next((e for e in errors if e.get("type") == "json_invalid"), None)
        if undecodable is not None:  # its loc is ("body", character offset): not a parameter
            offset = undecodable["loc"][-1] if len(undecodable["loc"]) > 1 else None
            reason = (undecodable.get("ctx") or {}).get("error")
            return _error(
                "the request body is not valid JSON"
                + (f" (at character {offset})" if offset is not None else "")
                + (f": {reason}" if reason else ""),
                400,
                "invalid_request_error",
                param=None,
            )
        fields = [".".join(str(p) for p in e["loc"][1:]) for e in errors]
        problems = "; ".join(f"{where or 'body'}: {e['msg']}" for where, e in zip(fields, errors))
        return _error(
            problems, 400, "invalid_request_error", param=fields[0] if fields and fields[0] else None
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return _error(str(exc.detail), exc.status_code, kind)

    app.add_middleware(_AnswerEveryError)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "created": created, "owned_by": "rlcore"}],
        }

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest) -> dict[str, Any]:
        check_model(req)
        if req.top_logprobs and not req.logprobs:
            raise ApiError("top_logprobs needs logprobs=true", param="top_logprobs")
        top = top_count(req.top_logprobs or 0, "top_logprobs") if req.logprobs else 0
        tools = req.tools if req.tools and req.tool_choice != "none" else None
        kwargs: dict[str, Any] = dict(req.chat_template_kwargs or {})
        if tools:
            kwargs["tools"] = tools
        try:
            text = tokenizer.apply_chat_template(
                req.messages, tokenize=False, add_generation_prompt=True, **kwargs
            )
        except Exception as exc:  # noqa: BLE001 - a template error is the request's fault
            raise ApiError(
                f"the chat template could not render these messages: {exc}", param="messages"
            ) from None
        if not isinstance(text, str):
            raise ApiError(
                "the chat template did not render text (check chat_template_kwargs)",
                param="chat_template_kwargs",
            )
        prompt_ids = list(tokenizer.encode(text, add_special_tokens=False))
        if not prompt_ids:
            raise ApiError("the rendered chat prompt has no tokens", param="messages")
        requested = req.max_completion_tokens or req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        params = sampling(req, budget(requested, param, max_tokens, [prompt_ids], "messages"))
        result = await run([prompt_ids], params, top)
        [group], [tops] = result.groups, result.top
        choices = []
        for index, (c, c_top) in enumerate(zip(group, tops)):
            content = tokenizer.decode(c.token_ids, skip_special_tokens=True)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            finish = c.finish_reason
            if tools:
                parsed = parse_tool_calls(content)
                if parsed.calls:
                    message["content"] = parsed.content or None
                    message["tool_calls"] = [call.openai() for call in parsed.calls]
                    finish = "tool_calls"
            choice: dict[str, Any] = {
                "index": index,
                "message": message,
                "logprobs": None,
                "finish_reason": finish,
            }
            if req.logprobs:
                entries = []
                for position, (token_id, lp) in enumerate(zip(c.token_ids, c.logprobs)):
                    alternatives = [_chat_item(token_text(t), x) for t, x in c_top[position]] if top else []
                    entries.append({**_chat_item(token_text(token_id), lp), "top_logprobs": alternatives})
                choice["logprobs"] = {"content": entries}
            if req.return_token_ids:
                choice["token_ids"] = list(c.token_ids)
            choices.append(choice)
        out: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "usage": _usage(len(prompt_ids), group),
        }
        if req.return_token_ids:
            out["prompt_token_ids"] = prompt_ids
        return out

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> dict[str, Any]:
        check_model(req)
        if req.echo:
            raise ApiError("echo is not supported by rlcore serve", param="echo")
        top = top_count(req.logprobs or 0, "logprobs")
        prompts = _prompt_ids(req.prompt, tokenizer, vocab)
        params = sampling(req, budget(req.max_tokens, "max_tokens", 16, prompts, "prompt"))
        result = await run(prompts, params, top)
        groups = result.groups
        choices = []
        for p_index, (prompt_ids, group, tops) in enumerate(zip(prompts, groups, result.top)):
            for s_index, (c, c_top) in enumerate(zip(group, tops)):
                text = tokenizer.decode(c.token_ids, skip_special_tokens=True)
                choice: dict[str, Any] = {
                    "index": p_index * req.n + s_index,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                }
                if req.logprobs is not None:
                    tokens = [token_text(t) for t in c.token_ids]
                    offsets, at = [], 0
                    for tok in tokens:
                        offsets.append(at)
                        at += len(tok)
                    choice["logprobs"] = {
                        "tokens": tokens,
                        "token_logprobs": [_logprob(x) for x in c.logprobs],
                        "top_logprobs": [
                            _completion_top(tok, lp, [(token_text(t), x) for t, x in alternatives])
                            for tok, lp, alternatives in zip(tokens, c.logprobs, c_top)
                        ]
                        if top
                        else None,
                        "text_offset": offsets,
                    }
                if req.return_token_ids:
                    choice["prompt_token_ids"] = list(prompt_ids)
                    choice["token_ids"] = list(c.token_ids)
                choices.append(choice)
        prompt_tokens = sum(len(p) for p in prompts)
        completion_tokens = sum(len(c.token_ids) for g in groups for c in g)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    return app


def _logprob(x: float) -> float:
    """A log-prob JSON can carry: -inf (and NaN) become ``LOGPROB_FLOOR``, as in vLLM."""
    x = float(x)
    return x if math.isfinite(x) else LOGPROB_FLOOR


def _chat_item(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": _logprob(logprob), "bytes": list(token.encode("utf-8"))}


def _completion_top(token: str, logprob: float, alternatives: list[tuple[str, float]]) -> dict[str, float]:
    """One position of a completion's ``top_logprobs``: the top tokens by text, plus the sampled
    token (so up to k + 1 entries, as OpenAI's legacy completions answer)."""
    out: dict[str, float] = {}
    for text, x in alternatives:
        out.setdefault(text, _logprob(x))
    out.setdefault(token, _logprob(logprob))
    return out


def _usage(prompt_tokens: int, group: list[Completion]) -> dict[str, int]:
    completion_tokens = sum(len(c.token_ids) for c in group)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _prompt_ids(prompt: Any, tokenizer: Any, vocab: int) -> list[list[int]]:
    """A completion prompt as token-id lists: a string, a list of ids, or a batch of either; each
    one non-empty, with ids in ``[0, vocab)``."""
    if isinstance(prompt, str):
        ids = [list(tokenizer.encode(prompt, add_special_tokens=False))]
    elif not prompt:
        raise ApiError("prompt is empty", param="prompt")
    elif all(isinstance(x, int) for x in prompt):
        ids = [list(prompt)]
    elif all(isinstance(x, str) for x in prompt):
        ids = [list(tokenizer.encode(x, add_special_tokens=False)) for x in prompt]
    else:
        ids = [list(x) for x in prompt]
    for index, row in enumerate(ids):
        if not row:
            which = "prompt" if len(ids) == 1 else f"prompt {index}"
            raise ApiError(f"{which} has no tokens (an empty prompt cannot be continued)", param="prompt")
        bad = [t for t in row if not 0 <= t < vocab]
        if bad:
            raise ApiError(f"prompt token ids out of range [0, {vocab}): {bad[:5]}", param="prompt")
    return ids
