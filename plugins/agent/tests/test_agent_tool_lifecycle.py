"""Per-sample tool arguments and tool rewards (verl's lifecycle): create(id, **create_kwargs) from the
data row's extra_info.tools_kwargs -> execute -> calc_reward (added to the trajectory's score) -> release."""

from __future__ import annotations

import json
import re

import pytest

from rlcore.errors import UsageError
from rlcore.interfaces import BuildContext, Prompt, SamplingParams, ToolResult
from rlcore.registry import Registry
from rlcore.testing.tools import ScriptedEngine, make_chat_tokenizer


@pytest.fixture(scope="module")
def tok():
    return make_chat_tokenizer()


def row(tok, question: str, index: int, tools_kwargs=None) -> Prompt:
    messages = [{"role": "user", "content": question}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    extra = {} if tools_kwargs is None else {"tools_kwargs": tools_kwargs}
    return Prompt(
        token_ids=tok.encode(text, add_special_tokens=False),
        messages=messages,
        index=index,
        data_source="gsm8k",
        extra_info=extra,
    )


def build_loop(tok, tools, **options):
    return (
        Registry.discover().get("agent_loop", "tool").build(options, BuildContext(tokenizer=tok, tools=tools))
    )


def submit(answer: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'submit_answer', 'arguments': {'answer': answer}})}</tool_call>"


class SubmitAnswer:
    """verl's gsm8k tutorial tool: the ground truth comes per sample through create_kwargs; the
    reward is whether the last submitted answer matches it."""

    name = "submit_answer"

    def __init__(self):
        self.state: dict[str, dict] = {}
        self.log: list[tuple] = []

    def schema(self):
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": "submit the final answer",
                "parameters": {
                    "type": "object",
                    "properties": {"answer": {"type": "string"}},
                    "required": ["answer"],
                },
            },
        }

    async def create(self, trajectory_id, ground_truth, **kwargs):
        self.log.append(("create", trajectory_id, ground_truth))
        self.state[trajectory_id] = {"ground_truth": ground_truth, "answer": None}

    async def execute(self, trajectory_id, arguments, **kwargs):
        self.state[trajectory_id]["answer"] = str(arguments.get("answer"))
        return ToolResult(text=f"recorded {arguments.get('answer')}")

    async def calc_reward(self, trajectory_id, scale: float = 1.0):
        st = self.state[trajectory_id]
        self.log.append(("calc_reward", trajectory_id, st["answer"]))
        return scale * float(st["answer"] == st["ground_truth"])

    async def release(self, trajectory_id):
        self.log.append(("release", trajectory_id))
        del self.state[trajectory_id]


def test_create_kwargs_from_the_row_and_calc_reward_feed_the_score(tok):
    tool = SubmitAnswer()
    loop = build_loop(tok, {"submit_answer": tool})

    def script(text: str, i: int) -> str:
        if "<|im_start|>tool" in text:
            return "done"
        if "never" in text:
            return "I will not use tools."
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)", text)[-1])
        return submit(str(a + b if i == 0 else a + b + 1))  # sample 0 right, sample 1 wrong

    prompts = [
        row(tok, "What is 40 + 2?", 0, {"submit_answer": {"create_kwargs": {"ground_truth": "42"}}}),
        row(
            tok,
            "What is 7 + 8?",
            1,
            {
                "submit_answer": {
                    "create_kwargs": {"ground_truth": "15"},
                    "calc_reward_kwargs": {"scale": 2.0},
                    "release_kwargs": None,
                }
            },
        ),
        row(tok, "What is 1 + 1? never", 2, {"submit_answer": {"create_kwargs": {"ground_truth": "2"}}}),
        row(tok, "What is 3 + 3?", 3),  # no tools_kwargs: create(trajectory_id) lacks its ground truth
    ]
    out = loop.run(
        prompts,
        ScriptedEngine(tok, script),
        SamplingParams(n=2, max_new_tokens=300, stop_token_ids=[tok.eos_token_id]),
    )

    assert [t.step_reward for t in out[:6]] == [1.0, 0.0, 2.0, 0.0, 0.0, 0.0]
    assert out[2].metrics["agent/submit_answer/reward"] == 2.0 and out[0].metrics["agent/tool_errors"] == 0
    creates = [e for e in tool.log if e[0] == "create"]
    # rows naming the tool create it when the trajectory starts (row 2 never calls it); row 3 on its call
    assert sorted(gt for _, _, gt in creates) == ["15", "15", "2", "2", "42", "42"]
    rewarded = {e[1]: e[2] for e in tool.log if e[0] == "calc_reward"}
    assert len(rewarded) == 6 and sorted(a for a in rewarded.values() if a) == ["15", "16", "42", "43"]
    assert sorted(e[1] for e in tool.log if e[0] == "release") == sorted(e[1] for e in creates)
    assert tool.state == {}  # every instance released
    # row 3 gave no ground truth: create(trajectory_id) raises TypeError; the call reports it, no reward
    for t, conv in zip(out[6:], loop.last_messages[6:]):
        assert t.step_reward == 0.0 and t.metrics["agent/tool_create_errors"] == 1
        [result] = [m["content"] for m in conv if m["role"] == "tool"]
        assert "could not be set up" in result and "ground_truth" in result

    # the trainer's Scorer adds the step reward to the reward function's score
    from rlcore.trainer.scoring import Scorer

    class Zero:
        batched = True

        def score_batch(self, items):
            return [0.5 for _ in items]

    scores, _ = Scorer(Zero(), timeout_s=10, workers=1).score(out[:4], tok)
    assert scores == [1.5, 0.5, 2.5, 0.5]


class Plain:
    """A tool of the original protocol: create(trajectory_id) only, no calc_reward."""

    name = "plain"

    def schema(self):
        return {
            "type": "function",
            "function": {
                "name": "plain",
                "description": "",
                "parameters": {"type": "object", "properties": {}},
            },
        }

    async def create(self, trajectory_id):
        pass

    async def execute(self, trajectory_id, arguments):
        return ToolResult(text="ok")

    async def release(self, trajectory_id):
        pass


def test_bad_tools_kwargs_are_refused_naming_the_row(tok):
    loop = build_loop(tok, {"plain": Plain(), "submit_answer": SubmitAnswer()})
    engine = ScriptedEngine(tok, lambda text, i: "done")
    params = SamplingParams(max_new_tokens=50)
    cases = [
        (
            {"plain": {"create_kwargs": {"ground_truth": "1"}}},
            r"data row 5 \(data_source 'gsm8k'\): extra_info\.tools_kwargs\.plain\.create_kwargs gives ground_truth, which Plain\.create\(trajectory_id\) does not take",
        ),
        (
            {"submit_answer": {"create_kwarg": {"ground_truth": "1"}}},
            r"tools_kwargs\.submit_answer\.create_kwarg is not one of create_kwargs, execute_kwargs, calc_reward_kwargs, release_kwargs",
        ),
        ({"submit_answer": ["ground_truth"]}, r"tools_kwargs\.submit_answer must be a mapping"),
        (
            {"submit_answer": {"calc_reward_kwargs": {"weight": 2}}},
            r"SubmitAnswer\.calc_reward\(trajectory_id, scale: 'float' = 1\.0\) does not take",
        ),
        ('{"plain": ', r"not JSON"),
    ]
    for tools_kwargs, message in cases:
        with pytest.raises(UsageError, match=message):
            loop.run([row(tok, "q", 5, tools_kwargs)], engine, params)
    assert engine.calls == []  # refused before any generation

    # JSON text is read as the mapping; a tool this run does not offer is skipped (with a warning)
    [t] = loop.run(
        [row(tok, "q", 6, json.dumps({"other_tool": {"create_kwargs": {"x": 1}}}))], engine, params
    )
    assert t.finish_reason == "stop" and t.step_reward == 0.0
