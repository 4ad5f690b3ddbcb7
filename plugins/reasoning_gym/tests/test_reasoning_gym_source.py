"""The reasoning_gym data source and reward, as rlcore sees them: specs validated against
reasoning-gym's own task table, disjoint splits, mixtures by weight, each row scored by its task."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import rlcore_reasoning_gym.plugin as plugin
from rlcore_reasoning_gym.options import ReasoningGymRewardOptions, ReasoningGymSourceOptions
from rlcore_reasoning_gym.reward import ReasoningGymReward
from rlcore_reasoning_gym.source import ReasoningGymSource, shares

from rlcore.errors import RlcoreError
from rlcore.interfaces import Prompt, RewardInput
from rlcore.testing.api import check_plugin_imports, describe_violations
from rlcore.testing.runs import check_data_spec, read_data_spec, registry_with

SUM = {"max_terms": 2, "max_digits": 1}


def rows(role="train", **options):
    return ReasoningGymSource(ReasoningGymSourceOptions.model_validate(options)).rows(role)


def questions(batch):
    return {r["prompt"][-1]["content"] for r in batch}


@pytest.fixture(scope="module")
def registry():
    return registry_with(plugin, "reasoning_gym", "rlcore-reasoning-gym")


def test_the_plugin_uses_only_the_plugin_api():
    src = Path(__file__).resolve().parents[1] / "src"
    violations = check_plugin_imports(sorted(src.rglob("*.py")), own={"rlcore_reasoning_gym"})
    assert not violations, describe_violations(violations)


def test_a_spec_string_gives_verl_rows_of_the_task(registry):
    batch, name = read_data_spec(
        "reasoning_gym:chain_sum?size=12&seed=3&max_terms=2&max_digits=1", registry=registry
    )
    assert name.startswith("reasoning_gym:chain_sum") and len(batch) == 12
    row = batch[0]
    assert row["data_source"] == "reasoning_gym/chain_sum"
    assert row["prompt"][-1]["role"] == "user" and "arithmetic problem" in row["prompt"][-1]["content"]
    assert row["reward_model"]["ground_truth"] == row["extra_info"]["reasoning_gym"]["entry"]["answer"]
    again, _ = read_data_spec(
        "reasoning_gym:chain_sum?size=12&seed=3&max_terms=2&max_digits=1", registry=registry
    )
    assert again == batch  # a seed gives the same rows


def test_train_and_validation_never_share_an_item():
    options = {"task": "leg_counting", "size": 150, "seed": 1, "max_animals": 3}
    train, val = rows("train", **options), rows("val", **options)
    assert {r["extra_info"]["split"] for r in val} == {"test"}
    assert len(questions(val)) > 20 and not questions(train) & questions(val)
    # A different seed draws other items, still on its own side of the split.
    other_val = rows("val", **{**options, "seed": 7})
    assert not questions(train) & questions(other_val)
    assert rows("val", split="train", **options)[0]["extra_info"]["split"] == "train"  # explicit split wins


def test_a_mixture_shares_rows_by_weight_and_names_each_task():
    batch = rows(size=20, seed=0, tasks={"chain_sum": {"weight": 3, **SUM}, "products": {"max_digits": 1}})
    assert Counter(r["data_source"] for r in batch) == {
        "reasoning_gym/chain_sum": 15,
        "reasoning_gym/products": 5,
    }
    assert shares(10, {"a": 1, "b": 1, "c": 1}) == {"a": 4, "b": 3, "c": 3}
    # Adding a task does not change the items another task draws.
    alone = rows(size=15, seed=0, tasks={"chain_sum": SUM})
    assert questions(alone) == questions([r for r in batch if r["data_source"].endswith("chain_sum")])


def test_prompts_take_a_system_prompt_and_an_instruction():
    row = rows(
        task="products", size=1, max_digits=1, system_prompt="Be brief.", instruction="Only the number."
    )[0]
    assert row["prompt"][0] == {"role": "system", "content": "Be brief."}
    assert row["prompt"][1]["content"].endswith("\nOnly the number.")


@pytest.mark.parametrize(
    ("spec", "phrases"),
    [
        (
            "reasoning_gym:chan_sum",
            ["unknown reasoning_gym task 'chan_sum'", "did you mean 'chain_sum'", "leg_counting"],
        ),
        (
            "reasoning_gym:chain_sum?max_term=2",
            ["no option 'max_term'", "did you mean 'max_terms'", "min_digits"],
        ),
        ("reasoning_gym:chain_sum?max_terms=two", ["max_terms", "integer"]),
        (
            "reasoning_gym:chain_sum?min_terms=5&max_terms=2",
            ["refused by reasoning_gym", "max_terms must be >= min_terms"],
        ),
        ("reasoning_gym:chain_sum?size=0", ["size", "greater than or equal to 1"]),
        ("reasoning_gym:chain_sum?seed=1&size=3&split=val", ["split", "'train' or 'test'"]),
        ("reasoning_gym:", ["name a task"]),
        ({"source": "reasoning_gym", "tasks": {"chain_sum": {"weight": 0}}}, ["weight must be above 0"]),
        ({"source": "reasoning_gym", "tasks": {"chain_sum": {}}, "max_terms": 2}, ["its own table"]),
    ],
)
def test_bad_specs_name_what_is_wrong(registry, spec, phrases):
    message = check_data_spec(spec, registry=registry)
    assert message is not None
    for phrase in phrases:
        assert phrase in message, message


def test_validation_imports_no_torch(tmp_path):
    code = (
        "import sys; from rlcore.data.prompts import check_data_spec; "
        "assert check_data_spec('reasoning_gym:chain_sum?size=3&max_terms=2') is None; "
        "print(sorted(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def score(reward, row, response):
    return reward(
        RewardInput(response=response, data_source=row["data_source"], extra_info=row["extra_info"])
    ).score


def test_the_reward_scores_each_row_with_its_own_task():
    batch = rows(size=6, seed=2, tasks={"chain_sum": SUM, "spell_backward": {}})
    tagged = ReasoningGymReward(ReasoningGymRewardOptions())
    full = ReasoningGymReward(ReasoningGymRewardOptions(answer="full"))
    last = ReasoningGymReward(ReasoningGymRewardOptions(answer="last_line"))
    for row in batch:
        answer = row["reward_model"]["ground_truth"]
        assert score(tagged, row, f"thinking...\n<answer>{answer}</answer>") == 1.0
        assert score(tagged, row, answer) == 0.0  # no tag: no answer
        assert score(full, row, f"  {answer}\n") == 1.0
        assert score(last, row, f"Let me see.\n{answer}\n") == 1.0
        assert score(full, row, "I do not know") == 0.0
    # spell_backward's own scorer gives partial credit; a plain string compare would not.
    spell = next(r for r in batch if r["data_source"] == "reasoning_gym/spell_backward")
    close = spell["reward_model"]["ground_truth"][:-1]
    assert 0.0 <= score(full, spell, close) < 1.0


def test_the_reward_refuses_rows_it_cannot_score():
    reward = ReasoningGymReward(ReasoningGymRewardOptions())
    good = rows(task="products", size=1, max_digits=1)[0]
    prompt = lambda info, index: Prompt(
        token_ids=[1], messages=[], data_source="x", extra_info=info, index=index
    )  # noqa: E731
    reward.check_data([prompt(good["extra_info"], 0)], "ok")
    with pytest.raises(RlcoreError, match=r"data 'f.jsonl', row 4: .*no extra_info.reasoning_gym"):
        reward.check_data([prompt(good["extra_info"], 0), prompt({}, 4)], "f.jsonl")


def test_rlcore_validate_checks_a_source_with_a_located_error_and_no_torch(tmp_path):
    manifest = tmp_path / "m.toml"
    manifest.write_text(
        '[model]\npath = "org/model"\n[data]\ntrain = "reasoning_gym:chain_sum?max_term=2"\n'
        '[data.val]\nsource = "reasoning_gym"\ntasks.chan_sum = {weight = 1}\n'
        '[reward]\nfunction = "reasoning_gym"\n[trainer]\nsteps = 1\n'
    )
    code = (
        "import sys; from rlcore.cli import main; code = main(['validate', sys.argv[1]]); "
        "print('torch' in sys.modules, code)"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(manifest)], capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert "m.toml:4: [data.train]" in out and "did you mean 'max_terms'" in out, out
    assert "[data.val]" in out and "unknown reasoning_gym task 'chan_sum'" in out, out
    assert proc.stdout.strip().splitlines()[-1] == "False 2", out


def test_a_dependency_of_reasoning_gym_missing_is_one_located_line(tmp_path):
    """Installed without its dependencies (pip --no-deps, as on a machine without an index),
    reasoning-gym fails on import; validation names the missing module and the fix."""
    manifest = tmp_path / "m.toml"
    manifest.write_text(
        '[model]\npath = "org/model"\n[data]\ntrain = "reasoning_gym:chain_sum"\n'
        '[reward]\nfunction = "reasoning_gym"\n[trainer]\nsteps = 1\n'
    )
    code = (
        "import sys; sys.modules['pytz'] = None; "  # None in sys.modules: importing it raises ImportError
        "from rlcore.cli import main; print(main(['validate', sys.argv[1]]))"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(manifest)], capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert "m.toml:4: [data.train]" in out and "reasoning-gym cannot be imported" in out, out
    assert "pytz" in out and "pip install rlcore-reasoning-gym" in out, out
    assert "Traceback" not in out and proc.stdout.strip().splitlines()[-1] == "2", out
