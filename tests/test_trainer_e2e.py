"""End-to-end training runs on a tiny random model with the real SmolLM2 tokenizer (CPU)."""

from __future__ import annotations

import math
import shutil

import pytest

from rlcore.cli import main
from rlcore.testing.runs import read_metrics, train_rows, write_run_manifest

FINITE_KEYS = (
    "actor/pg_loss",
    "actor/entropy",
    "actor/grad_norm",
    "critic/score/mean",
    "response_length/mean",
)


def _run(manifest, run_dir, *extra):
    return main(["run", str(manifest), "--run-dir", str(run_dir), *extra])


def _assert_finite(rows):
    for row in rows:
        for key in FINITE_KEYS:
            assert key in row and math.isfinite(row[key]), (key, row)


@pytest.mark.slow
def test_grpo_runs_writes_metrics_checkpoints_and_resumes(tmp_path, tiny_model):
    manifest = write_run_manifest(tmp_path, tiny_model, trainer={"save_every": 1, "steps": 2})
    run_dir = tmp_path / "run"
    assert _run(manifest, run_dir) == 0
    rows = train_rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    _assert_finite(rows)
    for key in (
        "timing_s/gen",
        "timing_s/update_actor",
        "perf/throughput",
        "response_length/clip_ratio",
        "actor/ppo_kl",
        "actor/pg_clipfrac",
    ):
        assert key in rows[0], key
    assert (run_dir / "manifest.resolved.toml").exists()
    assert "rlcore-rollout-hf" in (run_dir / "manifest.resolved.toml").read_text()
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000002"
    assert (run_dir / "checkpoints" / "step_000002" / "model" / "config.json").exists()
    # Running again into the same directory without --resume would overwrite: refused.
    assert _run(manifest, run_dir) == 2
    # Resume to 3 steps: continues at step 3 only.
    assert _run(manifest, run_dir, "--resume", "--set", "trainer.steps=3") == 0
    assert [r["step"] for r in train_rows(run_dir)] == [1, 2, 3]
    val = [m for m in read_metrics(run_dir) if "val/reward/mean" in m]
    assert val and val[-1]["step"] == 3


@pytest.mark.slow
def test_ppo_with_critic_and_kl_runs(tmp_path, tiny_model):
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        algorithm={
            "advantage": "gae",
            "policy_loss": "ppo_clip",
            "kl_coef": 0.01,
            "kl_estimator": "k3",
            "entropy_coef": 0.001,
            "ppo_epochs": 2,
            "mini_batches": 2,
            "loss_agg_mode": "seq-mean-token-mean",
        },
        rollout={"samples_per_prompt": 1},
        trainer={"steps": 2},
    )
    run_dir = tmp_path / "run"
    assert _run(manifest, run_dir) == 0
    rows = train_rows(run_dir)
    _assert_finite(rows)
    for key in (
        "critic/vf_loss",
        "critic/values/mean",
        "actor/kl_loss",
        "timing_s/ref",
        "timing_s/values",
        "timing_s/old_log_prob",
    ):
        assert key in rows[0] and math.isfinite(rows[0][key]), key


@pytest.mark.slow
def test_lora_with_kl_in_reward_and_export(tmp_path, tiny_model):
    # A reward that varies between samples (the untrained model never answers an addition), so
    # that step 1's update moves the adapters away from zero.
    (tmp_path / "reward.py").write_text(
        "def score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return len(set(solution_str)) / 10\n"
    )
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        model={"lora": {"rank": 4, "alpha": 8}, "gradient_checkpointing": True},
        rollout={"fast_path": "on"},  # the decode path GPUs take ("auto" is off on CPU)
        reward={"function": f"python:{tmp_path / 'reward.py'}:score", "method": None},
        algorithm={
            "advantage": "rloo",
            "kl_coef": 0.05,
            "kl_in_reward": True,
            "rollout_correction": "token_truncate",
        },
        trainer={"steps": 2, "export_final": True},
    )
    run_dir = tmp_path / "run"
    assert _run(manifest, run_dir) == 0
    rows = train_rows(run_dir)
    _assert_finite(rows)
    assert "actor/reward_kl_penalty" in rows[0]
    # Step 2 generates with the adapters step 1 trained, run unmerged as direct products by the
    # engine (which shares the actor): its log-probs are the trainer's, up to float32 rounding.
    assert rows[1]["rollout_corr/logprob_diff/max"] < 1e-4
    assert (run_dir / "checkpoints" / "step_000002" / "model" / "adapter_config.json").exists()
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(run_dir / "export")
    assert not any("lora" in name for name, _ in exported.named_parameters())


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_trainer_matches_eager_run(tmp_path, tiny_model):
    """`[model] compile = true` through `rlcore run`: the same rollouts (the engine's layers stay
    eager) and, up to float rounding, the same first update as an uncompiled run."""
    rows = {}
    for setting in (False, True):
        (tmp_path / str(setting)).mkdir()
        manifest = write_run_manifest(
            tmp_path / str(setting), tiny_model, model={"compile": setting}, trainer={"steps": 1}
        )
        assert _run(manifest, tmp_path / str(setting) / "run") == 0
        rows[setting] = train_rows(tmp_path / str(setting) / "run")[0]
    _assert_finite([rows[True]])
    assert "torch.compile: 2 decoder layers" in (tmp_path / "True" / "run" / "run.log").read_text()
    assert rows[True]["response_length/mean"] == rows[False]["response_length/mean"]
    assert rows[True]["critic/score/mean"] == rows[False]["critic/score/mean"]
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert math.isclose(rows[True][key], rows[False][key], rel_tol=1e-3, abs_tol=1e-5), (
            key,
            rows[True][key],
            rows[False][key],
        )
