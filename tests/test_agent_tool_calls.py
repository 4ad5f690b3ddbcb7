"""Tool-call parsing: Hermes tags, OpenAI JSON, and malformed calls turned into errors."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from rlcore.tool_calls import parse_tool_calls


def test_hermes_calls_and_content():
    text = (
        'Let me compute.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>'
        '<tool_call>{"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}</tool_call>'
    )
    turn = parse_tool_calls(text)
    assert [c.name for c in turn.calls] == ["python", "search"]
    assert turn.calls[0].arguments == {"code": "print(1)"} and turn.calls[1].arguments == {"q": "x"}
    assert turn.content == "Let me compute." and not turn.errors
    assert turn.calls[0].id != turn.calls[1].id


def test_openai_json_styles():
    wrapped = {
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": json.dumps({"a": 1})}}
        ]
    }
    turn = parse_tool_calls(json.dumps(wrapped))
    assert [(c.id, c.name, c.arguments) for c in turn.calls] == [("call_1", "f", {"a": 1})]
    bare = parse_tool_calls('```json\n{"name": "g", "arguments": {"b": [1, 2]}}\n```')
    assert [(c.name, c.arguments) for c in bare.calls] == [("g", {"b": [1, 2]})]
    assert parse_tool_calls("just an answer: 42").calls == []
    assert not parse_tool_calls('{"answer": 42}').wants_tools  # JSON that is not a call


def test_malformed_calls_become_errors():
    cases = {
        "<tool_call>{not json}</tool_call>": "invalid JSON",
        '<tool_call>{"arguments": {}}</tool_call>': '"name"',
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>': "must be a JSON object",
        '<tool_call>{"name": "f", "arguments": "{bad"}</tool_call>': "not valid JSON",
        'ok <tool_call>{"name": "f", "arguments": {}}': "unterminated",
        '{"tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}': "not valid JSON",
        '{"name": "f", "arguments": {"x": 1}': "invalid JSON",
    }
    for text, expected in cases.items():
        turn = parse_tool_calls(text)
        assert not turn.calls and len(turn.errors) == 1 and expected in turn.errors[0], (text, turn)
        assert turn.wants_tools


@given(st.text(max_size=200))
def test_parser_never_raises(text):
    turn = parse_tool_calls(text)
    assert isinstance(turn.content, str)
    for call in turn.calls:
        assert isinstance(call.arguments, dict)
