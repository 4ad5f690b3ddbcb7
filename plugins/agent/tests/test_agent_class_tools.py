"""Tool classes without a plugin: [tools.NAME] class = "python:file.py:Class" (other keys to the
constructor) and [agent] tool_config = "tools.yaml" (verl's file); bad input is a located error at
`rlcore validate` (exit 2, no traceback, no torch) or when the run builds its tools."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from rlcore.cli import main
from rlcore.errors import UsageError
from rlcore.interfaces import BuildContext, Prompt, SamplingParams
from rlcore.manifest.loader import load_manifest
from rlcore.registry import Registry
from rlcore.testing import require_plugins
from rlcore.testing.tools import ScriptedEngine, make_chat_tokenizer

MY_TOOLS = '''
from rlcore.interfaces import ToolResult


class Calculator:
    """Adds two numbers, rounding to `digits`."""

    name = "calculator"

    def __init__(self, digits: int = 0, offset: float = 0.0):
        self.digits, self.offset = digits, offset

    def schema(self):
        return {"type": "function", "function": {"name": self.name, "description": "add two numbers",
                "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}

    async def execute(self, trajectory_id, arguments):
        return ToolResult(text=str(round(arguments["a"] + arguments["b"] + self.offset, self.digits)))


class SubmitAnswer:
    """verl's gsm8k tool; its schema comes from the tool config file."""

    def __init__(self, penalty: float = 0.0):
        self.penalty, self.state = penalty, {}

    async def create(self, trajectory_id, ground_truth=None):
        self.state[trajectory_id] = {"ground_truth": ground_truth, "answer": None}

    async def execute(self, trajectory_id, arguments):
        self.state[trajectory_id]["answer"] = str(arguments.get("answer"))
        return ToolResult(text="recorded", reward=-self.penalty)

    async def calc_reward(self, trajectory_id):
        st = self.state[trajectory_id]
        return float(st["answer"] == st["ground_truth"])

    async def release(self, trajectory_id):
        self.state.pop(trajectory_id)


class NotATool:
    def run(self):
        pass


def helper():
    pass
'''

TOOLS_YAML = """
tools:
  - class_name: "python:my_tools.py:SubmitAnswer"
    config:
      type: native
      penalty: 0.25
    tool_schema:
      type: function
      function:
        name: submit_answer
        description: submit the final answer
        parameters:
          type: object
          properties:
            answer: {type: string}
          required: [answer]
"""

MANIFEST = """
[model]
path = "x"
[data]
train = "synthetic:arithmetic"
[reward]
function = "math"
[rollout]
samples_per_prompt = 2
[trainer]
steps = 1
[agent]
loop = "tool"
{agent}
{tools}
"""


def write(
    tmp_path,
    agent='tool_config = "tools.yaml"',
    tools='[tools.calc]\nclass = "python:my_tools.py:Calculator"\ndigits = 2\noffset = 0.5\n',
    tools_yaml=TOOLS_YAML,
    my_tools=MY_TOOLS,
    name="m.toml",
):
    (tmp_path / "my_tools.py").write_text(my_tools)
    if tools_yaml is not None:
        (tmp_path / "tools.yaml").write_text(tools_yaml)
    manifest = tmp_path / name
    manifest.write_text(MANIFEST.format(agent=agent, tools=tools))
    return manifest


@pytest.fixture(autouse=True)
def _plugins():
    require_plugins("rlcore_rollout_hf", "rlcore_reward_rule", "rlcore_algo_grpo")


def test_class_tool_and_tool_config_file_run_in_the_tool_loop(tmp_path):
    resolved = load_manifest(write(tmp_path))
    [calc] = resolved.roles("tools")
    assert calc.component.name == "class"
    assert (
        getattr(calc.options, "class") == f"{tmp_path / 'my_tools.py'}:Calculator"
    )  # absolute for the driver
    assert calc.options.model_extra == {"digits": 2, "offset": 0.5}
    loop_options = resolved.component("agent.loop").options
    assert loop_options.tool_config == str(tmp_path / "tools.yaml")

    context = BuildContext(manifest_dir=str(tmp_path), tokenizer=make_chat_tokenizer())
    context.tools = {"calc": calc.component.build(calc.options, context)}
    loop = resolved.component("agent.loop").component.build(loop_options, context)
    assert sorted(loop.tools) == ["calculator", "submit_answer"]
    assert loop.tools["submit_answer"].schema()["function"]["description"] == "submit the final answer"

    def script(text, i):
        if "recorded" in text:
            return "done"
        if "<|im_start|>tool" in text:
            total = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", text)[-1]
            return f"<tool_call>{json.dumps({'name': 'submit_answer', 'arguments': {'answer': total}})}</tool_call>"
        return '<tool_call>{"name": "calculator", "arguments": {"a": 40, "b": 1.25}}</tool_call>'

    tok = context.tokenizer
    messages = [{"role": "user", "content": "add"}]
    ids = tok.encode(
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )
    prompts = [
        Prompt(
            token_ids=ids,
            messages=messages,
            index=k,
            extra_info={"tools_kwargs": {"submit_answer": {"create_kwargs": {"ground_truth": gt}}}},
        )
        for k, gt in enumerate(["41.75", "7"])
    ]
    out = loop.run(
        prompts,
        ScriptedEngine(tok, script),
        SamplingParams(max_new_tokens=400, stop_token_ids=[tok.eos_token_id]),
    )
    assert [t.tool_calls for t in out] == [2, 2] and [t.tool_errors for t in out] == [0, 0]
    # 41.25 + offset 0.5, rounded to 2 digits; calc_reward 1 or 0, minus the 0.25 penalty per submission
    assert [t.step_reward for t in out] == [0.75, -0.25]


def run_validate(manifest):
    code = (
        f"import sys, json; from rlcore.cli import main; rc = main(['validate', {str(manifest)!r}]); "
        "print(json.dumps({'rc': rc, 'torch': 'torch' in sys.modules}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result, " ".join(proc.stdout.split()), proc.stdout + proc.stderr


def test_validate_accepts_good_tools_without_importing_torch(tmp_path):
    result, out, _ = run_validate(write(tmp_path))
    assert result == {"rc": 0, "torch": False}, out
    assert "tools.calc=class (rlcore-agent" in out


BAD = [
    # [tools.NAME] class = ...
    (
        dict(tools='[tools.calc]\nclass = "python:nope.py:Calculator"\n'),
        "[tools.calc.class]",
        "tool file",
        "nope.py' does not exist",
    ),
    (
        dict(tools='[tools.calc]\nclass = "python:my_tools.py:Calculater"\n'),
        "[tools.calc.class]",
        "has no class 'Calculater' (did you mean 'Calculator'?)",
        "",
    ),
    (
        dict(tools='[tools.calc]\nclass = "python:my_tools.py:NotATool"\n'),
        "[tools.calc.class]",
        "class 'NotATool' is not a tool: it has no execute",
        "",
    ),
    (
        dict(tools='[tools.calc]\nclass = "python:my_tools.py:helper"\n'),
        "[tools.calc.class]",
        "'helper' is a function, not a class",
        "",
    ),
    (
        dict(tools='[tools.calc]\nclass = "no_such_pkg_xyz.tools:Calc"\n'),
        "[tools.calc.class]",
        "tool module 'no_such_pkg_xyz.tools' cannot be imported",
        "",
    ),
    (
        dict(tools='[tools.calc]\nclass = "python:my_tools.py:Calculator"\ndigitz = 3\n'),
        "[tools.calc]",
        "Calculator(digits: int = 0, offset: float = 0.0) cannot be built with ['digitz']",
        "unexpected keyword argument 'digitz'",
    ),
    (
        dict(tools='[tools.calc]\nclass = "python:my_tools.py:SubmitAnswer"\n'),
        "[tools.calc]",
        "SubmitAnswer has no schema() method",
        "",
    ),
    # [agent] tool_config = ...
    (
        dict(agent='tool_config = "missing.yaml"'),
        "[agent.tool_config]",
        "tool config file",
        "missing.yaml' does not exist",
    ),
    (
        dict(tools_yaml="tools:\n  - class_name: [unclosed\n"),
        "[agent.tool_config]",
        "tools.yaml: invalid YAML (line",
        "",
    ),
    (
        dict(tools_yaml="tools:\n  - config: {}\n"),
        "[agent.tool_config]",
        "tools.yaml: tools[0].class_name: required",
        "",
    ),
    (
        dict(tools_yaml="tools:\n  - class_name: python:my_tools.py:SubmitAnswer\n    confg: {}\n"),
        "[agent.tool_config]",
        "tools[0]: unknown keys ['confg']; expected class_name, config, tool_schema",
        "",
    ),
    (
        dict(
            tools_yaml="tools:\n  - class_name: python:my_tools.py:SubmitAnswer\n    config: {penalti: 1}\n"
        ),
        "[agent.tool_config]",
        "tools.yaml: tools[0]: SubmitAnswer(penalty: float = 0.0) cannot be built with ['penalti']",
        "",
    ),
    (
        dict(tools_yaml="tools:\n  - class_name: python:my_tools.py:SubmitAnswer\n    config: {type: mcp}\n"),
        "[agent.tool_config]",
        "tools[0].config.type: 'mcp' tools (verl's MCP tools) are not supported",
        "",
    ),
    (
        dict(tools_yaml="tools:\n  - class_name: python:my_tools.py:SubmitAnswer\n"),
        "[agent.tool_config]",
        "SubmitAnswer has no schema() method; give tool_schema",
        "",
    ),
]


@pytest.mark.parametrize("files, key, phrase, more", BAD[:3] + BAD[5:6] + BAD[7:8] + BAD[10:12])
def test_validate_locates_bad_tool_classes_and_config_files(tmp_path, files, key, phrase, more):
    """In a fresh process: exit 2, the manifest's file, line and key, no traceback, no torch."""
    manifest = write(tmp_path, **files)
    result, out, everything = run_validate(manifest)
    assert result == {"rc": 2, "torch": False}, out
    line = next(
        i
        for i, row in enumerate(manifest.read_text().splitlines(), 1)
        if row.startswith(key.strip("[]").split(".")[-1]) or row == f"[{key.strip('[]')}]"
    )
    assert f"{manifest}:{line}: {key}" in out and phrase in out and more in out, out
    assert "Traceback" not in everything


@pytest.mark.parametrize("files, key, phrase, more", BAD)
def test_every_bad_input_is_a_located_error(tmp_path, files, key, phrase, more, capsys):
    assert main(["validate", str(write(tmp_path, **files))]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert key in out and phrase in out and more in out, out


def test_json_and_toml_tool_configs_and_errors_at_build_time(tmp_path):
    write(tmp_path, tools_yaml=None)
    entry = {"class_name": "python:my_tools.py:Calculator", "config": {"digits": 1}}
    (tmp_path / "tools.json").write_text(json.dumps({"tools": [entry]}))
    (tmp_path / "tools.toml").write_text(
        '[[tools]]\nclass_name = "python:my_tools.py:Calculator"\nconfig = {digits = 1}\n'
    )
    from rlcore_agent.class_tool import build_config_tools

    for name in ("tools.json", "tools.toml"):
        tools = build_config_tools(name, tmp_path)
        assert list(tools) == ["calculator"] and tools["calculator"].digits == 1
    # a run built without the manifest's validation still gets a clear error
    (tmp_path / "bad.json").write_text(
        '{"tools": [{"class_name": "python:my_tools.py:Calculator", "config": {"digits": 1, "x": 2}}]}'
    )
    with pytest.raises(
        UsageError, match=r"bad\.json: tools\[0\]: Calculator\(.*\) cannot be built with \['digits', 'x'\]"
    ):
        build_config_tools("bad.json", tmp_path)
    (tmp_path / "dup.json").write_text(json.dumps({"tools": [entry, entry]}))
    with pytest.raises(UsageError, match=r"dup\.json: tools\[1\]: a second tool named 'calculator'"):
        build_config_tools("dup.json", tmp_path)
    # a file tool and a [tools.*] tool of the same name
    calc = (
        Registry.discover()
        .get("tool", "class")
        .build({"class": f"python:{tmp_path}/my_tools.py:Calculator"}, BuildContext())
    )
    with pytest.raises(UsageError, match=r"offers a tool named 'calculator', as \[tools.calc\] does"):
        Registry.discover().get("agent_loop", "tool").build(
            {"tool_config": str(tmp_path / "tools.json")},
            BuildContext(tokenizer=make_chat_tokenizer(), tools={"calc": calc}, manifest_dir=str(tmp_path)),
        )
