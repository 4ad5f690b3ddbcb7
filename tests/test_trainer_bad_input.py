"""Bad input to a run gives a located, readable error (exit 2 for a bad manifest), never a traceback."""

from __future__ import annotations

import json

import pytest

from rlcore.testing.runs import run_cli, write_run_manifest


def _assert_clean(proc, code: int, *phrases: str) -> None:
    text = proc.stdout + proc.stderr
    assert proc.returncode == code, text
    assert "Traceback" not in text, text
    for phrase in phrases:
        assert phrase in text, (phrase, text)


@pytest.mark.slow
def test_rows_without_the_fields_the_reward_needs(tmp_path, tiny_model):
    data = tmp_path / "rows.jsonl"
    data.write_text(
        "\n".join(
            json.dumps({"prompt": [{"role": "user", "content": f"q{i}"}], "data_source": "x"})
            for i in range(4)
        )
    )
    manifest = write_run_manifest(tmp_path, tiny_model, data={"train": str(data), "val": None})
    proc = run_cli("run", str(manifest), "--run-dir", str(tmp_path / "run"))
    _assert_clean(proc, 2, "rows.jsonl", "ground_truth")


@pytest.mark.slow
def test_an_empty_dataset(tmp_path, tiny_model):
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    manifest = write_run_manifest(tmp_path, tiny_model, data={"train": str(data), "val": None})
    proc = run_cli("run", str(manifest), "--run-dir", str(tmp_path / "run"))
    _assert_clean(proc, 2, "empty.jsonl")


def test_a_model_path_that_does_not_exist(tmp_path):
    manifest = write_run_manifest(tmp_path, tmp_path / "no-such-model", model={"path": "./no-such-model"})
    proc = run_cli("validate", str(manifest))
    _assert_clean(proc, 2, "[model.path]", "does not exist")


@pytest.mark.slow
def test_a_model_that_cannot_be_loaded(tmp_path):
    (tmp_path / "not-a-model").mkdir()
    manifest = write_run_manifest(tmp_path, tmp_path / "not-a-model", data={"val": None})
    proc = run_cli("run", str(manifest), "--run-dir", str(tmp_path / "run"), env={"HF_HUB_OFFLINE": "1"})
    _assert_clean(proc, 2, "[model] path", "not-a-model")


def test_a_maximum_response_length_of_zero(tmp_path):
    manifest = write_run_manifest(tmp_path, tmp_path, data={"max_response_tokens": 0})
    proc = run_cli("validate", str(manifest))
    _assert_clean(proc, 2, "[data.max_response_tokens]", "greater than or equal to 1")


def test_grpo_with_one_sample_per_prompt(tmp_path):
    manifest = write_run_manifest(tmp_path, tmp_path, rollout={"samples_per_prompt": 1})
    proc = run_cli("validate", str(manifest))
    _assert_clean(proc, 2, "[rollout.samples_per_prompt]", "every advantage would be zero")


@pytest.mark.slow
def test_prompt_and_response_longer_than_the_context_are_refused_at_start_up(tmp_path, tiny_model):
    """It used to pass validate and crash mid-run when a long prompt came, and again on --resume."""
    manifest = write_run_manifest(
        tmp_path, tiny_model, data={"max_prompt_tokens": 2000, "max_response_tokens": 100}
    )
    proc = run_cli("run", str(manifest), "--run-dir", str(tmp_path / "run"))
    _assert_clean(
        proc,
        2,
        "manifest.toml",
        "max_prompt_tokens = 2000 + max_response_tokens = 100 = 2100 tokens",
        "context of 2048 positions",
    )


def test_prompts_that_do_not_divide_among_ranks_and_mini_batches_name_both_keys(tmp_path, tiny_model):
    from rlcore.errors import UsageError
    from rlcore.manifest.loader import load_manifest
    from rlcore.trainer.startup_checks import batch_divides

    manifest = load_manifest(
        write_run_manifest(tmp_path, tiny_model, data={"prompts_per_step": 6}, algorithm={"mini_batches": 2})
    )
    batch_divides(manifest, world=1)  # 6 = 1 x 2 x 3
    with pytest.raises(
        UsageError,
        match=r"manifest.toml: \[data\] prompts_per_step = 6 .* ranks \(2\) times \[algorithm\] mini_batches \(2\)",
    ):
        batch_divides(manifest, world=2)
