"""``[reward.routes]``: one manifest trains on a mixture, each row scored by its data source's function."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlcore.cli import main
from rlcore.errors import ManifestError, UsageError
from rlcore.interfaces import Prompt, RewardInput
from rlcore.manifest.loader import load_manifest
from rlcore.testing.runs import read_metrics, write_run_manifest
from rlcore.trainer.scoring import RoutedReward


def _rows(path: Path) -> Path:
    """Two gsm8k rows and two math rows, verl's format; the right answers differ in form."""
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": "2+2?"}],
            "reward_model": {"ground_truth": "4"},
        },
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": "3+3?"}],
            "reward_model": {"ground_truth": "6"},
        },
        {
            "data_source": "lighteval/MATH",
            "prompt": [{"role": "user", "content": "x?"}],
            "reward_model": {"ground_truth": "\\frac{1}{2}"},
        },
        {
            "data_source": "lighteval/MATH",
            "prompt": [{"role": "user", "content": "y?"}],
            "reward_model": {"ground_truth": "3"},
        },
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def _routed(tmp_path, tiny_model, **reward):
    data = _rows(tmp_path / "mix.jsonl")
    return write_run_manifest(
        tmp_path,
        tiny_model,
        data={"train": str(data), "val": str(data), "prompts_per_step": 4},
        reward={"function": None, "method": None, **reward},
    )


GSM8K_AND_MATH = {
    "routes": {
        "openai/gsm8k": {"function": "gsm8k", "method": "numeric"},
        "lighteval/MATH": {"function": "math"},
    }
}


def test_each_row_is_scored_by_its_sources_function():
    calls = []

    def fn(name, score):
        def score_item(item):
            calls.append((name, item.data_source))
            return score

        return score_item

    router = RoutedReward({"a": fn("fa", 1.0), "b": fn("fb", 0.5)}, default=fn("default", 0.25))
    assert [router(RewardInput(response="r", data_source=s)) for s in ("a", "b", "c")] == [1.0, 0.5, 0.25]
    assert calls == [("fa", "a"), ("fb", "b"), ("default", "c")]
    without_default = RoutedReward({"a": fn("fa", 1.0)}, default=None)
    with pytest.raises(ValueError, match="no reward function for data_source 'c'"):
        without_default(RewardInput(response="r", data_source="c"))
    with pytest.raises(
        UsageError,
        match=r"row 7 has data_source 'c', which no \[reward.routes\] table scores \(routed: 'a'\)",
    ):
        without_default.check_data([Prompt(token_ids=[1], messages=[], data_source="c", index=7)], "x.jsonl")


def test_routes_are_validated_with_each_functions_own_options(tmp_path, tiny_model):
    manifest = load_manifest(_routed(tmp_path, tiny_model, **GSM8K_AND_MATH))
    assert manifest.component("reward.routes.openai/gsm8k").options.method == "numeric"
    assert manifest.component("reward.routes.lighteval/MATH").component.name == "math"
    resolved = manifest.resolved_dict()["reward"]["routes"]
    assert resolved["openai/gsm8k"]["function"] == "gsm8k" and resolved["openai/gsm8k"]["method"] == "numeric"
    bad = _routed(
        tmp_path,
        tiny_model,
        routes={
            "openai/gsm8k": {"function": "gsm8k", "methd": "strict"},
            "lighteval/MATH": {"function": "nosuch"},
        },
    )
    with pytest.raises(ManifestError) as err:
        load_manifest(bad)
    text = str(err.value)
    assert (
        "reward.routes.openai/gsm8k.methd" in text
        and "reward.routes.lighteval/MATH.function" in text
        and "nosuch" in text
    )
    with pytest.raises(ManifestError, match="required key is missing"):
        load_manifest(_routed(tmp_path, tiny_model))


@pytest.mark.slow
def test_a_mixed_gsm8k_and_math_run_scores_each_source_with_its_own_function(tmp_path, tiny_model):
    manifest = _routed(tmp_path, tiny_model, **GSM8K_AND_MATH)
    assert main(["run", str(manifest), "--run-dir", str(tmp_path / "run")]) == 0
    rows = read_metrics(tmp_path / "run")
    train = [r for r in rows if "actor/pg_loss" in r]
    assert all(
        "critic/score/openai/gsm8k/mean" in r and "critic/score/lighteval/MATH/mean" in r for r in train
    )
    val = rows[-1]
    assert "val/openai/gsm8k/pass@1" in val and "val/lighteval/MATH/pass@1" in val


@pytest.mark.slow
def test_a_source_without_a_route_is_refused_before_training(tmp_path, tiny_model, capsys):
    manifest = _routed(tmp_path, tiny_model, routes={"openai/gsm8k": {"function": "gsm8k"}})
    assert main(["run", str(manifest), "--run-dir", str(tmp_path / "run")]) == 2
    shown = "".join(capsys.readouterr())
    assert "mix.jsonl" in shown and "'lighteval/MATH'" in shown and "routed: 'openai/gsm8k'" in shown
