"""The `tool` agent loop with a scripted engine: real tool execution, token accounting against
the chat template, batching, stop conditions, and tools that fail in every way."""

from __future__ import annotations

import asyncio
import re

import pytest
from rlcore_agent.options import PythonToolOptions
from rlcore_agent.python_tool import PythonTool

from rlcore.interfaces import BuildContext, Prompt, SamplingParams, ToolResult
from rlcore.registry import Registry
from rlcore.testing.tools import ScriptedEngine, make_chat_tokenizer

TOOL_OUT = re.compile(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", re.S)


@pytest.fixture(scope="module")
def tok():
    return make_chat_tokenizer()


def prompt_for(tok, question: str, index: int = 0) -> Prompt:
    messages = [{"role": "user", "content": question}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return Prompt(token_ids=tok.encode(text, add_special_tokens=False), messages=messages, index=index)


def build_loop(tok, available, **options):
    component = Registry.discover().get("agent_loop", "tool")
    return component.build(options, BuildContext(tokenizer=tok, tools=available))


def call(code: str, name: str = "python") -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': {'code': code}})}</tool_call>"


def arithmetic_script(text: str, i: int) -> str:
    """Ask the python tool for the sum in the question, then answer with what it printed."""
    outputs = TOOL_OUT.findall(text)
    if not outputs:
        a, b = re.findall(r"What is (\d+) \+ (\d+)", text)[-1]
        return "I will compute it. " + call(f"print({a} + {b})")
    return f"The answer is \\boxed{{{outputs[-1].strip()}}}."


def test_multi_turn_rollout_with_real_python_execution(tok):
    loop = build_loop(tok, {"python": PythonTool(PythonToolOptions())})
    engine = ScriptedEngine(tok, arithmetic_script)
    prompts = [
        prompt_for(tok, f"What is {a} + {b}?", index=k)
        for k, (a, b) in enumerate([(12, 30), (7, 8), (100, 23)])
    ]
    params = SamplingParams(n=2, max_new_tokens=300, stop_token_ids=[tok.eos_token_id])
    out = loop.run(prompts, engine, params)

    assert engine.calls == [6, 6]  # every active trajectory generates together, each turn
    assert [t.prompt.index for t in out] == [0, 0, 1, 1, 2, 2]
    for t, expected in zip(out, [42, 42, 15, 15, 123, 123]):
        final = tok.decode(t.response_ids, skip_special_tokens=True)
        assert final.endswith(f"\\boxed{{{expected}}}.")
        assert (t.finish_reason, t.num_turns, t.tool_calls, t.tool_errors) == ("stop", 2, 1, 0)
        assert t.metrics["agent/tool_parse_errors"] == 0 and t.metrics["agent/num_turns"] == 2
        assert len(t.response_ids) == len(t.response_mask) == len(t.rollout_logprobs)
        # mask 1 only on model tokens (their log-probs kept), 0.0 log-prob on tool output and glue
        assert all((lp == -0.5) if m else (lp == 0.0) for m, lp in zip(t.response_mask, t.rollout_logprobs))
        masked_text = tok.decode(
            [i for i, m in zip(t.response_ids, t.response_mask) if m == 0], skip_special_tokens=False
        )
        assert masked_text == f"\n<|im_start|>tool\n{expected}<|im_end|>\n<|im_start|>assistant\n"
        assert "I will compute it" not in masked_text
    # the tools were offered in the prompt through the chat template
    assert "<tools>" in tok.decode(out[0].prompt.token_ids, skip_special_tokens=False)


def test_accumulated_ids_equal_the_chat_template_rendering(tok):
    """Tokens accumulated turn by turn equal the template's rendering of the same conversation,
    up to the newline the template writes after the final end-of-turn token."""
    tool = PythonTool(PythonToolOptions())
    loop = build_loop(tok, {"python": tool}, max_turns=3)
    engine = ScriptedEngine(tok, arithmetic_script)
    [t] = loop.run(
        [prompt_for(tok, "What is 2 + 3?")],
        engine,
        SamplingParams(max_new_tokens=300, stop_token_ids=[tok.eos_token_id]),
    )
    conversation = loop.last_messages[0]
    assert [m["role"] for m in conversation] == ["user", "assistant", "tool", "assistant"]
    rendered = tok.apply_chat_template(conversation, tools=[tool.schema()], tokenize=False)
    expected = tok.encode(rendered, add_special_tokens=False)
    accumulated = t.prompt.token_ids + t.response_ids
    assert expected[: len(accumulated)] == accumulated
    assert tok.decode(expected[len(accumulated) :]) == "\n"


def test_stop_conditions_max_turns_and_budget(tok):
    tool = PythonTool(PythonToolOptions())
    always_call = ScriptedEngine(tok, lambda text, i: call("print(1)"))
    loop = build_loop(tok, {"python": tool}, max_turns=3)
    [t] = loop.run(
        [prompt_for(tok, "loop")],
        always_call,
        SamplingParams(max_new_tokens=1000, stop_token_ids=[tok.eos_token_id]),
    )
    assert (t.finish_reason, t.num_turns, t.tool_calls) == ("max_turns", 3, 2)
    assert always_call.calls == [1, 1, 1]

    loop = build_loop(tok, {"python": tool}, max_turns=50)
    budget = 120
    [t] = loop.run(
        [prompt_for(tok, "loop")],
        ScriptedEngine(tok, lambda text, i: call("print(1)")),
        SamplingParams(max_new_tokens=budget),
    )
    assert t.finish_reason == "length" and len(t.response_ids) <= budget and t.num_turns < 50

    loop = build_loop(tok, {"python": tool}, max_turns=5, max_tokens_per_turn=5)
    [t] = loop.run(
        [prompt_for(tok, "x")],
        ScriptedEngine(tok, lambda text, i: call("print(1)")),
        SamplingParams(max_new_tokens=100),
    )
    assert t.finish_reason == "length" and len(t.response_ids) == 5 and t.tool_calls == 0


class Misbehaving:
    """One tool per failure mode."""

    def __init__(self, name: str, mode: str):
        self.name, self.mode = name, mode
        self.created: list[str] = []
        self.released: list[str] = []

    def schema(self):
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.mode,
                "parameters": {"type": "object", "properties": {}},
            },
        }

    async def create(self, trajectory_id):
        self.created.append(trajectory_id)

    async def release(self, trajectory_id):
        self.released.append(trajectory_id)

    async def execute(self, trajectory_id, arguments):
        if self.mode == "raise":
            raise RuntimeError("boom")
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if self.mode == "wrong_type":
            return {"not": "a ToolResult"}
        return ToolResult(text="fine", reward=0.25)


def test_failing_tools_and_bad_calls_become_error_messages(tok):
    tools = {m: Misbehaving(m, m) for m in ("raise", "hang", "wrong_type", "ok")}
    first = (
        '<tool_call>{"name": "raise", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "hang", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "wrong_type", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "ok", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
        "<tool_call>{broken json</tool_call>"
    )
    engine = ScriptedEngine(tok, lambda text, i: first if "<|im_start|>tool" not in text else "done")
    loop = build_loop(tok, tools, tool_timeout_s=0.5)
    [t] = loop.run(
        [prompt_for(tok, "go")],
        engine,
        SamplingParams(max_new_tokens=2000, stop_token_ids=[tok.eos_token_id]),
    )
    assert t.finish_reason == "stop" and t.num_turns == 2
    assert t.tool_calls == 5  # parsed calls, the unknown one included
    assert t.tool_errors == 5  # raise, hang, wrong type, unknown name, unparseable
    assert t.metrics["agent/tool_parse_errors"] == 1 and t.metrics["agent/tool_timeouts"] == 1
    assert t.metrics["agent/tool_unknown"] == 1
    assert t.step_reward == pytest.approx(0.25)
    results = [m["content"] for m in loop.last_messages[0] if m["role"] == "tool"]
    joined = "\n".join(results)
    for needle in (
        "RuntimeError: boom",
        "timed out after 0.5 s",
        "returned dict, not a ToolResult",
        "fine",
        "no tool named 'nope'",
        "invalid JSON",
    ):
        assert needle in joined, needle
    for tool in tools.values():  # every tool used by the trajectory was created and released once
        assert tool.created == tool.released and len(tool.created) == 1


def test_tools_option_selects_and_validates(tok):
    tools = {"a": Misbehaving("a", "ok"), "b": Misbehaving("b", "ok")}
    loop = build_loop(tok, tools, tools=["b"])
    assert list(loop.tools) == ["b"]
    from rlcore.errors import UsageError

    with pytest.raises(UsageError, match="not configured"):
        build_loop(tok, tools, tools=["c"])


def test_template_without_tool_support_gets_a_system_message(tok):
    """SmolLM2-style templates ignore `tools`: the loop describes them in a system message."""
    from transformers import PreTrainedTokenizerFast

    plain = PreTrainedTokenizerFast(
        tokenizer_object=tok.backend_tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=(
            "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
        ),
    )
    loop = build_loop(plain, {"python": PythonTool(PythonToolOptions())})
    [t] = loop.run(
        [prompt_for(plain, "What is 4 + 5?")],
        ScriptedEngine(plain, arithmetic_script),
        SamplingParams(max_new_tokens=300),
    )
    prompt_text = plain.decode(t.prompt.token_ids, skip_special_tokens=False)
    assert (
        prompt_text.startswith("<|im_start|>system\nYou can call tools.")
        and '"name": "python"' in prompt_text
    )
    assert plain.decode(t.response_ids, skip_special_tokens=True).endswith("\\boxed{9}.")
    rendered = plain.apply_chat_template(loop.last_messages[0], tokenize=False)
    expected = plain.encode(rendered, add_special_tokens=False)
    assert expected[: len(t.prompt.token_ids + t.response_ids)] == t.prompt.token_ids + t.response_ids


def test_waiting_for_the_tools_slot_is_not_a_timeout(tok):
    """Twelve calls, two sandbox slots: the last calls wait about 3 s for a slot, longer than the
    loop's per-call timeout, and still run (the loop queues for the tool before its timeout starts);
    an infinite loop is still stopped by the sandbox's own limit."""
    tool = PythonTool(PythonToolOptions(timeout_s=2.0, cpu_time_s=1, max_concurrency=2))
    loop = build_loop(tok, {"python": tool}, tool_timeout_s=2.5, max_turns=2)
    benign = "import time\ntime.sleep(0.5)\nprint('done')"

    def script(text: str, i: int) -> str:
        if TOOL_OUT.search(text):
            return "finished"
        return "Let me run it. " + call("while True:\n    pass" if "spin" in text else benign)

    prompts = [prompt_for(tok, "spin" if k == 11 else "sleep", index=k) for k in range(12)]
    loop.run(
        prompts,
        ScriptedEngine(tok, script),
        SamplingParams(n=1, max_new_tokens=400, stop_token_ids=[tok.eos_token_id]),
    )
    outputs = [[m["content"] for m in conv if m["role"] == "tool"][0] for conv in loop.last_messages]
    assert outputs[:11] == ["done"] * 11
    assert re.search(r"CPU time|wall-clock", outputs[11]) and "timed out after" not in outputs[11]
