"""The ``function`` tool: a plain typed Python function offered to the model.

``[tools.calculator] function = "python:tools.py:calculate"`` (a file, relative to the manifest)
or ``"package.module:calculate"``. The OpenAI schema comes from the signature (through a pydantic
model, so the argument types are JSON Schema) and the docstring (its first paragraph is the
description; a Google-style ``Args:`` section describes the parameters). Arguments are validated
against the same model, so a wrong call gets a clear error. Sync functions run in a worker thread.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from rlcore.errors import RlcoreError, UsageError
from rlcore.interfaces import ToolResult
from rlcore.targets import load_target
from rlcore_agent.options import FunctionToolOptions


def load_function(target: str, base_dir: str | Path | None = None) -> Callable[..., Any]:
    """Import ``python:file.py:func`` / ``file.py:func`` (relative to ``base_dir``) / ``package.module:func``."""
    try:
        func, origin = load_target(target.removeprefix("python:"), what="function", base_dir=base_dir or ".")
    except RlcoreError as exc:
        raise UsageError(f"function tool {target!r}: {exc}") from None
    if not callable(func):
        raise UsageError(f"function tool {target!r}: {origin} holds a {type(func).__name__}, not a function")
    return func


def _docstring_parts(func: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    doc = inspect.getdoc(func) or ""
    summary = doc.split("\n\n")[0].strip()
    params: dict[str, str] = {}
    match = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?)+)", doc, re.M)
    if match:
        current = None
        for line in match.group(1).splitlines():
            item = re.match(r"\s+(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)", line)
            if item and (current is None or len(line) - len(line.lstrip()) <= 8):
                current = item.group(1)
                params[current] = item.group(2).strip()
            elif current and line.strip():
                params[current] += " " + line.strip()
    return summary, params


def arguments_model(func: Callable[..., Any]) -> type[BaseModel]:
    """A pydantic model of the function's parameters (types, defaults, descriptions)."""
    from pydantic import Field

    _, described = _docstring_parts(func)
    hints = getattr(func, "__annotations__", {})
    try:
        import typing

        hints = typing.get_type_hints(func)
    except Exception:  # noqa: BLE001 - fall back to raw annotations
        pass
    fields: dict[str, Any] = {}
    for name, param in inspect.signature(func).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = hints.get(name, Any)
        default = ... if param.default is param.empty else param.default
        fields[name] = (annotation, Field(default, description=described.get(name)))
    return create_model(f"{func.__name__}_arguments", __config__=ConfigDict(extra="forbid"), **fields)


class FunctionTool:
    def __init__(self, func: Callable[..., Any], name: str | None = None, description: str | None = None):
        self.func = func
        self.name = name or func.__name__
        self.takes_table_name = name is None  # the loop names it after its [tools.NAME] table
        summary, _ = _docstring_parts(func)
        self.description = description or summary or f"the function {func.__name__}"
        self.model = arguments_model(func)

    def schema(self) -> dict[str, Any]:
        params = self.model.model_json_schema()
        params.pop("title", None)
        for prop in params.get("properties", {}).values():
            prop.pop("title", None)
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": params},
        }

    async def create(self, trajectory_id: str) -> None:
        return None

    async def release(self, trajectory_id: str) -> None:
        return None

    async def execute(self, trajectory_id: str, arguments: dict[str, Any]) -> ToolResult:
        try:
            validated = self.model.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
            )
            return ToolResult(text=f"Error: invalid arguments for {self.name}: {problems}", error=True)
        kwargs = {k: getattr(validated, k) for k in self.model.model_fields}
        if inspect.iscoroutinefunction(self.func):
            value = await self.func(**kwargs)
        else:
            value = await asyncio.to_thread(self.func, **kwargs)
        if isinstance(value, ToolResult):
            return value
        if isinstance(value, str):
            return ToolResult(text=value)
        try:
            return ToolResult(text=json.dumps(value, ensure_ascii=False, default=str))
        except (TypeError, ValueError):
            return ToolResult(text=str(value))


def build(options: FunctionToolOptions, context: Any) -> FunctionTool:
    func = load_function(options.function, getattr(context, "manifest_dir", None))
    return FunctionTool(func, name=options.name, description=options.description)
