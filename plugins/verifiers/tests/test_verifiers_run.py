"""examples/verifiers_env.toml end to end on a tiny model: the environment's tasks are the data,
its episodes are played by the verifiers agent loop through the hf engine, and its own reward
scores them, for training and validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlcore.testing import require_plugins
from rlcore.testing.runs import read_metrics, run_cli, train_rows

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "verifiers_env.toml"


@pytest.mark.skipif(not EXAMPLE.is_file(), reason="runs from a source checkout (examples/)")
def test_the_example_runs_end_to_end(tiny_model, tmp_path):
    require_plugins("rlcore_rollout_hf", "rlcore_algo_grpo")
    manifest = tmp_path / "verifiers_env.toml"
    manifest.write_text(EXAMPLE.read_text())
    (tmp_path / "verifiers_env.py").write_text((EXAMPLE.parent / "verifiers_env.py").read_text())
    sets = [
        f"model.path={tiny_model}",
        "model.gguf_file=''",
        "data.train.size=16",
        "data.val.size=4",
        "data.prompts_per_step=4",
        "rollout.samples_per_prompt=2",
        "data.max_response_tokens=4",
        "trainer.steps=2",
        "trainer.eval_every=2",
        "trainer.save_every=0",
        'trainer.loggers=["jsonl"]',
    ]
    args = [a for s in sets for a in ("--set", s)]
    validated = run_cli("validate", str(manifest), *args)
    assert validated.returncode == 0, validated.stdout + validated.stderr
    proc = run_cli("run", str(manifest), "--run-dir", str(tmp_path / "run"), *args, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = train_rows(tmp_path / "run")
    assert len(rows) == 2
    for row in rows:  # the loop played every episode (one turn each: the seat's max_turns = 1)
        assert row["verifiers/num_turns"] == 1.0 and row["verifiers/episode_errors"] == 0.0, sorted(row)
        assert 0.0 <= row["reward/correct"] <= 1.0 and row["reward/metric/reply_chars"] >= 0.0, sorted(row)
    val = [m for m in read_metrics(tmp_path / "run") if "val/reward/mean" in m]
    assert val and "val/verifiers/verifiers_env/reward/mean" in val[-1], sorted(val[-1])
    assert all(0.0 <= m["val/reward/mean"] <= 1.0 for m in val)
