"""An OpenAI-compatible server over any :class:`rlcore.interfaces.RolloutEngine`.

Endpoints: ``POST /v1/chat/completions`` (tools rendered by the chat template, tool calls parsed
from the output into OpenAI's shape, ``logprobs``), ``POST /v1/completions`` (token ids in, token
ids out: ``prompt`` may be a list of ids), ``GET /v1/models`` and ``GET /health`` (answers without
touching the engine or its weights). Field names follow vLLM's server, including its extensions
``return_token_ids`` (answers carry ``prompt_token_ids`` and ``token_ids``), ``top_k`` and
``stop_token_ids``. Streaming is not supported (``stream: true`` is refused with a 400).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from rlcore.tool_calls import parse_tool_calls
from rlcore.interfaces import Completion, RolloutEngine, SamplingParams


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown OpenAI fields are accepted and ignored

    model: str | None = None
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    n: int = Field(1, ge=1, le=128)
    seed: int | None = None
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
    top_logprobs: int | None = Field(None, ge=0, le=20)
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False


class ApiError(Exception):
    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.kind = status, kind


def _error(message: str, status: int, kind: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "param": None, "code": status}})


def create_app(
    engine: RolloutEngine,
    tokenizer: Any,
    model_name: str = "rlcore",
    max_tokens: int = 256,
    stop: list[str] | None = None,
) -> FastAPI:
    """Serve ``engine``. ``max_tokens`` is the default response budget; ``stop`` strings always apply."""
    app = FastAPI(title="rlcore serve", version="1")
    lock = threading.Lock()  # engines are not required to be thread-safe
    created = int(time.time())
    eos = [tokenizer.eos_token_id] if getattr(tokenizer, "eos_token_id", None) is not None else []

    def generate(prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        with lock:
            return engine.generate(prompts, params)

    def sampling(req: _Request, limit: int | None) -> SamplingParams:
        if req.stream:
            raise ApiError("streaming is not supported by rlcore serve; send stream=false")
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        try:
            return SamplingParams(
                n=req.n,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=-1 if req.top_k in (None, 0) else req.top_k,
                max_new_tokens=limit or max_tokens,
                stop_token_ids=sorted(set(eos) | set(req.stop_token_ids or [])),
                stop=[*(stop or []), *stops],
                seed=req.seed,
            )
        except ValueError as exc:
            raise ApiError(str(exc)) from None

    def token_text(token_id: int) -> str:
        return tokenizer.decode([token_id], skip_special_tokens=False)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error(str(exc), exc.status, exc.kind)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in exc.errors())
        return _error(problems, 400, "invalid_request_error")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created, "owned_by": "rlcore"}]}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest) -> dict[str, Any]:
        params = sampling(req, req.max_completion_tokens or req.max_tokens)
        tools = req.tools if req.tools and req.tool_choice != "none" else None
        kwargs: dict[str, Any] = dict(req.chat_template_kwargs or {})
        if tools:
            kwargs["tools"] = tools
        try:
            text = tokenizer.apply_chat_template(req.messages, tokenize=False, add_generation_prompt=True, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a template error is the request's fault
            raise ApiError(f"the chat template could not render these messages: {exc}") from None
        prompt_ids = list(tokenizer.encode(text, add_special_tokens=False))
        [group] = await asyncio.to_thread(generate, [prompt_ids], params)
        choices = []
        for index, c in enumerate(group):
            content = tokenizer.decode(c.token_ids, skip_special_tokens=True)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            finish = c.finish_reason
            if tools:
                parsed = parse_tool_calls(content)
                if parsed.calls:
                    message["content"] = parsed.content or None
                    message["tool_calls"] = [call.openai() for call in parsed.calls]
                    finish = "tool_calls"
            choice: dict[str, Any] = {"index": index, "message": message, "logprobs": None, "finish_reason": finish}
            if req.logprobs:
                entries = []
                for token_id, lp in zip(c.token_ids, c.logprobs):
                    tok = token_text(token_id)
                    item = {"token": tok, "logprob": float(lp), "bytes": list(tok.encode("utf-8"))}
                    entries.append({**item, "top_logprobs": [item] if req.top_logprobs else []})
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
        params = sampling(req, req.max_tokens)
        prompts = _prompt_ids(req.prompt, tokenizer)
        groups = await asyncio.to_thread(generate, prompts, params)
        choices = []
        for p_index, (prompt_ids, group) in enumerate(zip(prompts, groups)):
            for s_index, c in enumerate(group):
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
                        "token_logprobs": [float(x) for x in c.logprobs],
                        "top_logprobs": [{t: float(x)} for t, x in zip(tokens, c.logprobs)] if req.logprobs else None,
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
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens},
        }

    return app


def _usage(prompt_tokens: int, group: list[Completion]) -> dict[str, int]:
    completion_tokens = sum(len(c.token_ids) for c in group)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


def _prompt_ids(prompt: Any, tokenizer: Any) -> list[list[int]]:
    """A completion prompt as token-id lists: a string, a list of ids, or a batch of either."""
    if isinstance(prompt, str):
        return [list(tokenizer.encode(prompt, add_special_tokens=False))]
    if not prompt:
        raise ApiError("prompt is empty")
    if all(isinstance(x, int) for x in prompt):
        ids = [list(prompt)]
    elif all(isinstance(x, str) for x in prompt):
        ids = [list(tokenizer.encode(x, add_special_tokens=False)) for x in prompt]
    else:
        ids = [list(x) for x in prompt]
    vocab = len(tokenizer)
    for row in ids:
        if not row:
            raise ApiError("a prompt has no tokens")
        bad = [t for t in row if not 0 <= t < vocab]
        if bad:
            raise ApiError(f"prompt token ids out of range [0, {vocab}): {bad[:5]}")
    return ids



