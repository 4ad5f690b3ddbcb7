"""Finding tool calls in model text.

Two formats are understood:

* Hermes style (Qwen and many others): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  any number of them in one turn;
* OpenAI JSON style: the whole reply is ``{"tool_calls": [{"type": "function", "function":
  {"name": ..., "arguments": "<json string>"}}]}`` or a bare ``{"name": ..., "arguments": ...}``.

A call that is recognisably meant as one but cannot be read (bad JSON, no name, arguments that
are not an object, an unterminated tag) becomes an error string for the model; the caller counts
it. Lives in the core because both the ``tool`` agent loop and ``rlcore serve`` need it.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

ParserName = Literal["auto", "hermes", "json"]

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=new_call_id)

    def openai(self) -> dict[str, Any]:
        """The OpenAI response shape (arguments as a JSON string)."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }


@dataclass
class ParsedTurn:
    """What a model turn contained: its text without the calls, the calls, and unreadable calls."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def wants_tools(self) -> bool:
        return bool(self.calls or self.errors)


def _call_from_object(obj: Any) -> ToolCall:
    """Read one ``{"name", "arguments"}`` (or ``{"function": {...}}``) object, or raise ValueError."""
    if not isinstance(obj, dict):
        raise ValueError(f"a tool call must be a JSON object, got {type(obj).__name__}")
    if isinstance(obj.get("function"), dict):
        call_id = obj.get("id")
        obj = obj["function"]
    else:
        call_id = obj.get("id")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError('a tool call needs a "name" string')
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f'the "arguments" of {name!r} are not valid JSON: {exc}') from None
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ValueError(f'the "arguments" of {name!r} must be a JSON object, got {type(args).__name__}')
    return ToolCall(
        name=name, arguments=args, id=call_id if isinstance(call_id, str) and call_id else new_call_id()
    )


def parse_hermes(text: str) -> ParsedTurn:
    calls: list[ToolCall] = []
    errors: list[str] = []
    for match in _HERMES.finditer(text):
        body = match.group(1).strip()
        try:
            calls.append(_call_from_object(json.loads(body)))
        except json.JSONDecodeError as exc:
            errors.append(f"could not parse the tool call {body[:200]!r}: invalid JSON ({exc})")
        except ValueError as exc:
            errors.append(f"could not parse the tool call {body[:200]!r}: {exc}")
    rest = _HERMES.sub("", text)
    if "<tool_call>" in rest:
        tail = rest[rest.index("<tool_call>") :]
        errors.append(f"unterminated tool call (no </tool_call>): {tail[:200]!r}")
        rest = rest[: rest.index("<tool_call>")]
    return ParsedTurn(content=rest.strip(), calls=calls, errors=errors)


def parse_json(text: str) -> ParsedTurn:
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1).strip()
    if not stripped.startswith("{"):
        return ParsedTurn(content=text.strip())
    try:
        obj = json.loads(stripped)
    except json.JSONDecodeError as exc:
        if '"tool_calls"' in stripped or ('"name"' in stripped and '"arguments"' in stripped):
            return ParsedTurn(content="", errors=[f"could not parse the tool call: invalid JSON ({exc})"])
        return ParsedTurn(content=text.strip())
    if not isinstance(obj, dict):
        return ParsedTurn(content=text.strip())
    if "tool_calls" in obj:
        items = obj["tool_calls"]
        if not isinstance(items, list):
            return ParsedTurn(content="", errors=['"tool_calls" must be a list'])
        content = obj.get("content")
        turn = ParsedTurn(content=content.strip() if isinstance(content, str) else "")
        for item in items:
            try:
                turn.calls.append(_call_from_object(item))
            except ValueError as exc:
                turn.errors.append(f"could not parse the tool call {json.dumps(item)[:200]!r}: {exc}")
        return turn
    if "name" in obj and ("arguments" in obj or "parameters" in obj):
        try:
            return ParsedTurn(content="", calls=[_call_from_object(obj)])
        except ValueError as exc:
            return ParsedTurn(content="", errors=[f"could not parse the tool call: {exc}"])
    return ParsedTurn(content=text.strip())


def parse_tool_calls(text: str, parser: ParserName = "auto") -> ParsedTurn:
    """Find the tool calls in ``text``. ``auto`` tries Hermes tags, then the JSON styles."""
    if parser == "hermes":
        return parse_hermes(text)
    if parser == "json":
        return parse_json(text)
    if parser != "auto":
        raise ValueError(f"unknown tool-call parser {parser!r}; known: auto, hermes, json")
    if "<tool_call>" in text:
        return parse_hermes(text)
    return parse_json(text)
