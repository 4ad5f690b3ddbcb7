"""The plugin as rlcore sees it: discovered through its entry point, options validated from a
manifest, each component passing rlcore's reward conformance kit, and run under the RewardRunner."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import rlcore_reward_rule.plugin as plugin

import rlcore
from rlcore.components import Component
from rlcore.errors import ManifestError
from rlcore.interfaces import RewardInput
from rlcore.manifest.loader import load_manifest
from rlcore.registry import Registry
from rlcore.reward_pool import RewardRunner
from rlcore.testing.rewards import check_reward_function


class _Stand_ins:
    """An engine and an estimator, so a manifest resolves without other plugins installed."""

    @rlcore.hookimpl
    def rlcore_rollout_engines(self):
        return [Component("stand_in", factory=lambda options, context: None)]

    @rlcore.hookimpl
    def rlcore_advantage_estimators(self):
        return [Component("stand_in", factory=lambda options, context: None)]


@pytest.fixture(scope="module")
def registry():
    registry = Registry.discover(external=False, disabled=())
    registry.register(plugin, name="reward_rule", distribution="rlcore-reward-rule")
    registry.register(_Stand_ins(), name="stand_ins", distribution="stand-ins")
    return registry


def test_entry_point_is_declared_and_installed():
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="rlcore") if ep.name == "reward_rule"]
    assert eps and eps[0].value == "rlcore_reward_rule.plugin"
    found = Registry.discover().components("reward_function")
    assert {"gsm8k", "math", "math_dapo", "verl", "exact_match", "format"} <= set(found)
    assert found["gsm8k"].distribution == "rlcore-reward-rule"


def test_registering_imports_nothing_heavy():
    code = (
        "import sys; from rlcore.registry import Registry; "
        "Registry.discover().components('reward_function'); "
        "print(sorted(m for m in ('torch', 'math_verify', 'sympy', 'datasets') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def G(response, truth):
    return RewardInput(response=response, ground_truth=truth, data_source="openai/gsm8k")


def test_gsm8k_conforms(registry):
    c = registry.get("reward_function", "gsm8k")
    check_reward_function(
        c, cases=[(G("... #### 42", "42"), 1.0), (G("... #### 41", "42"), 0.0), (G("42", "42"), 0.0)]
    )
    check_reward_function(
        c, options={"method": "numeric"}, cases=[(G("so 42.", "42"), 1.0), (G("41", "42"), 0.0)]
    )
    check_reward_function(
        c, options={"method": "flexible"}, cases=[(G("so 42.", "42"), 0.0), (G("so 42", "42"), 1.0)]
    )


def test_math_conforms(registry):
    c = registry.get("reward_function", "math")
    cases = [(G("\\boxed{\\frac{1}{2}}", "0.5"), 1.0), (G("\\boxed{2}", "0.5"), 0.0), (G("0.5", "0.5"), 0.0)]
    check_reward_function(c, cases=cases)
    check_reward_function(c, options={"backend": "builtin"}, cases=cases)


def test_math_dapo_conforms(registry):
    c = registry.get("reward_function", "math_dapo")
    check_reward_function(
        c, cases=[(G("Answer: 42", "42"), 1.0), (G("Answer: 41", "42"), -1.0), (G("42", "42"), -1.0)]
    )
    check_reward_function(c, options={"strict_box_verify": True}, cases=[(G("\\boxed{42}", "42"), 1.0)])


def test_verl_conforms(registry):
    c = registry.get("reward_function", "verl")
    check_reward_function(c, cases=[(G("... #### 42", "42"), 1.0), (G("the answer is 42", "42"), 0.0)])


def test_exact_match_conforms(registry):
    c = registry.get("reward_function", "exact_match")
    check_reward_function(c, cases=[(G(" Paris ", "paris"), 1.0), (G("Lyon", "Paris"), 0.0)])


def test_format_conforms(registry):
    c = registry.get("reward_function", "format")
    check_reward_function(
        c, cases=[(G("<think>a</think><answer>1</answer>", None), 1.0), (G("<answer>1</answer>", None), 0.0)]
    )


MANIFEST = """
[model]
path = "org/model"
[data]
train = "synthetic:addition?size=8"
[rollout]
engine = "stand_in"
[algorithm]
advantage = "stand_in"
[reward]
function = "{function}"
{extra}
[trainer]
steps = 1
"""


def _manifest(tmp_path, function, extra=""):
    path = tmp_path / "m.toml"
    path.write_text(MANIFEST.format(function=function, extra=textwrap.dedent(extra)))
    return path


def test_manifest_options_reach_the_component(tmp_path, registry):
    resolved = load_manifest(
        _manifest(tmp_path, "gsm8k", 'method = "flexible"\nformat_score = 0.1'), registry=registry
    )
    selected = resolved.component("reward.function")
    assert selected.options.method == "flexible" and selected.options.format_score == 0.1
    fn = selected.component.build(selected.options)
    assert fn(G("the answer is 7", "7")).score == 1.0


@pytest.mark.parametrize(
    ("function", "extra", "key", "phrase"),
    [
        ("gsm8k", 'method = "loose"', "reward.method", "strict"),
        ("gsm8k", "correct_score = 1000", "reward.correct_score", "less than or equal"),
        ("format", 'pattern = "(unclosed"', "reward.pattern", "not a valid regular expression"),
        ("math", 'backend = "sympy"', "reward.backend", "math_verify"),
        ("exact_match", "case_sensitiv = true", "reward.case_sensitiv", "case_sensitive"),
    ],
)
def test_bad_options_are_located(tmp_path, registry, function, extra, key, phrase):
    with pytest.raises(ManifestError) as info:
        load_manifest(_manifest(tmp_path, function, extra), registry=registry)
    text = str(info.value)
    assert key in text and phrase in text, text


def test_rule_rewards_run_under_the_runner(registry):
    fn = registry.get("reward_function", "gsm8k").build({"method": "strict"})
    items = [G(f"#### {i}", str(i if i % 2 else i + 1)) for i in range(10)]
    with RewardRunner(fn, timeout_s=5.0, workers=2) as runner:
        batch = runner.score(items)
    assert batch.scores == [float(i % 2) for i in range(10)]
    assert batch.metrics["reward/correct"] == pytest.approx(0.5)
    assert batch.metrics["reward/answer_found"] == 1.0
    assert batch.metrics["reward/errors"] == 0.0
