"""The ``tool`` agent loop passes rlcore's agent-loop kit (rlcore.testing.agents): with tools that
the scripted model calls (mask-0 tool output between its turns, every model token's log-prob the
engine's own in context) and with replies that call no tool."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from rlcore.interfaces import BuildContext, ToolResult  # noqa: E402
from rlcore.testing.agents import check_agent_loop  # noqa: E402
from rlcore.testing.runs import discover_registry  # noqa: E402
from rlcore.testing.tools import make_chat_tokenizer  # noqa: E402


class AddTool:
    """Adds two numbers; counts its lifecycle calls."""

    name = "add"

    def __init__(self):
        self.executed = 0

    def schema(self):
        return {
            "type": "function",
            "function": {
                "name": "add",
                "description": "a + b",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                    "required": ["a", "b"],
                },
            },
        }

    async def create(self, trajectory_id):
        pass

    async def execute(self, trajectory_id, arguments):
        self.executed += 1
        return ToolResult(text=str(arguments["a"] + arguments["b"]))

    async def release(self, trajectory_id):
        pass


def test_the_tool_loop_passes_the_kit_calling_tools():
    tokenizer = make_chat_tokenizer()
    tool = AddTool()

    def script(context_ids, k):
        text = tokenizer.decode(context_ids, skip_special_tokens=False)
        # first turn: call the tool (sample 1 of each prompt answers at once)
        if "<|im_start|>tool" not in text:
            return (
                None
                if k == 1
                else "Let me add. <tool_call>"
                + json.dumps({"name": "add", "arguments": {"a": 12, "b": 30}})
                + "</tool_call>"
            )
        return "The answer is 42."

    context = BuildContext(tokenizer=tokenizer, tools={"add": tool})
    result = check_agent_loop(
        discover_registry().get("agent_loop", "tool"),
        {"max_turns": 3},
        context=context,
        tokenizer=tokenizer,
        script=script,
        max_new_tokens=200,
    )
    trajectories = result["trajectories"]
    assert tool.executed > 0
    called = [t for t in trajectories if t.tool_calls]
    assert called and all(0 in t.response_mask and t.num_turns == 2 for t in called)
    assert result["engine_calls"] == 2  # every active trajectory generates together, each turn


def test_the_tool_loop_passes_the_kit_without_tools():
    check_agent_loop(discover_registry().get("agent_loop", "tool"))
