"""The light parts: registration (nothing heavy imported), the plugin API, reading a prompt's
messages back from its rendered template, and combining a model's score with a rule."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from rlcore_reward_model.conversation import conversation_text, parse_rendered, prompt_messages
from rlcore_reward_model.options import JudgeOptions, RewardModelOptions, fill_template
from rlcore_reward_model.rule import combine, load_rule

from rlcore.errors import UsageError
from rlcore.interfaces import RewardInput, RewardResult
from rlcore.testing.api import check_plugin_imports, describe_violations

SRC = Path(__file__).resolve().parents[1] / "src"


def test_the_plugin_uses_only_the_plugin_api():
    violations = check_plugin_imports(sorted(SRC.rglob("*.py")), own={"rlcore_reward_model"})
    assert not violations, describe_violations(violations)


def test_registration_imports_neither_torch_transformers_nor_httpx(rlcore_registry, rlcore_register):
    import rlcore_reward_model.plugin as plugin

    rlcore_register(plugin, name="reward_model", distribution="rlcore-reward-model")
    found = rlcore_registry.components("reward_function")
    assert found["reward_model"].options is RewardModelOptions and found["judge"].options is JudgeOptions
    assert found["reward_model"].factory == "rlcore_reward_model.model:build"
    code = (
        "import sys, rlcore_reward_model.plugin, rlcore_reward_model.options, rlcore_reward_model.conversation;"
        "print([m for m in ('torch', 'transformers', 'httpx') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


CHATML = (
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n"
    "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
)
LLAMA3 = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
)
GEMMA = "<bos><start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n"


@pytest.mark.parametrize(
    ("text", "form", "messages"),
    [
        (
            CHATML,
            "chatml",
            [("system", "Be brief."), ("user", "Hi\nthere"), ("assistant", "Hello"), ("user", "2+2?")],
        ),
        (LLAMA3, "llama3", [("system", "Be brief."), ("user", "2+2?")]),
        (GEMMA, "gemma", [("user", "2+2?")]),
        ("Question: 2+2?\nAnswer:", "text", [("user", "Question: 2+2?\nAnswer:")]),
        (
            "junk <|im_start|>user\n2+2?<|im_end|>\n",
            "text",
            [("user", "junk <|im_start|>user\n2+2?<|im_end|>\n")],
        ),
    ],
)
def test_messages_are_read_back_from_the_rendered_prompt(text, form, messages):
    found, how = parse_rendered(text)
    assert how == form and [(m["role"], m["content"]) for m in found] == messages


def test_given_messages_win_and_the_judge_sees_plain_text():
    given = [{"role": "user", "content": "from the data"}]
    assert prompt_messages(RewardInput(response="", prompt=CHATML, extra_info={"messages": given})) == (
        given,
        "given",
    )
    assert conversation_text(parse_rendered(LLAMA3)[0]) == "2+2?"
    assert conversation_text(parse_rendered(CHATML)[0]) == "User: Hi\nthere\n\nAssistant: Hello\n\nUser: 2+2?"


def test_fill_template():
    assert fill_template("{{a}} {response} {unknown} }}", {"response": "R"}) == "{a} R {unknown} }"


def write_rules(tmp_path):
    (tmp_path / "rules.py").write_text(
        "from rlcore.interfaces import RewardResult\n"
        "def has_42(item):\n"
        "    return RewardResult(1.0 if '42' in item.response else 0.0, {'found': 1.0})\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': float(solution_str.strip() == ground_truth), 'exact': 1.0}\n"
        "def broken(item):\n"
        "    return 1 / 0 if item.response == 'x' else 'nan'\n"
        "has_42.required_fields = frozenset({'ground_truth'})\n"
    )


def test_a_rule_is_added_by_weight_with_both_parts_as_metrics(tmp_path):
    write_rules(tmp_path)
    rule = load_rule("rules.py:has_42", 2.0, str(tmp_path), "reward_model")
    items = [RewardInput(response="it is 42"), RewardInput(response="it is 41")]
    results = combine([0.5, -1.0], [{"rm_score": 0.5}, {"rm_score": -1.0}], items, rule, model_weight=0.5)
    assert [r.score for r in results] == [0.25 + 2.0, -0.5]
    assert results[0].metrics == {"rm_score": 0.5, "rule_score": 1.0, "rule_found": 1.0, "rule_failed": 0.0}
    assert rule.required_fields == {"ground_truth"}
    verl = load_rule("rules.py:compute_score", 1.0, str(tmp_path), "judge")
    result = combine([0.0], [{}], [RewardInput(response=" 7", ground_truth="7")], verl, 1.0)[0]
    assert result.score == 1.0 and result.metrics["rule_exact"] == 1.0


def test_a_failing_rule_costs_its_part_only_counted(tmp_path):
    write_rules(tmp_path)
    rule = load_rule("rules.py:broken", 1.0, str(tmp_path), "reward_model")
    results = combine([0.3, 0.4], [{}, {}], [RewardInput(response="x"), RewardInput(response="y")], rule, 1.0)
    assert [r.score for r in results] == [0.3, 0.4]
    assert [r.metrics["rule_failed"] for r in results] == [1.0, 1.0]
    assert all(isinstance(r, RewardResult) for r in results)


def test_a_missing_rule_is_refused_naming_it(tmp_path):
    write_rules(tmp_path)
    with pytest.raises(
        UsageError,
        match=r"rule of the 'reward_model' reward: .*has no function 'has42' \(did you mean 'has_42'",
    ):
        load_rule("rules.py:has42", 1.0, str(tmp_path), "reward_model")
    with pytest.raises(
        UsageError, match=r"rule of the 'judge' reward: reward rule file .*nope.py' does not exist"
    ):
        load_rule("nope.py:f", 1.0, str(tmp_path), "judge")
