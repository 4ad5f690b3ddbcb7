"""examples/reasoning_gym.toml end to end on a tiny model: the mixture is generated, validation
reads the test half per task, and the reward scores every row with its own task."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlcore.testing import require_plugins
from rlcore.testing.runs import read_metrics, run_cli, train_rows

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "reasoning_gym.toml"


@pytest.mark.skipif(not EXAMPLE.is_file(), reason="runs from a source checkout (examples/)")
def test_the_example_runs_end_to_end(tiny_model, tmp_path):
    require_plugins("rlcore_rollout_hf", "rlcore_algo_grpo")
    manifest = tmp_path / "reasoning_gym.toml"
    manifest.write_text(EXAMPLE.read_text())
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
    assert run_cli("validate", str(manifest), *[a for s in sets for a in ("--set", s)]).returncode == 0
    proc = run_cli(
        "run",
        str(manifest),
        "--run-dir",
        str(tmp_path / "run"),
        *[a for s in sets for a in ("--set", s)],
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(train_rows(tmp_path / "run")) == 2
    val = [m for m in read_metrics(tmp_path / "run") if "val/reward/mean" in m]
    assert val and {
        "val/reasoning_gym/chain_sum/reward/mean",
        "val/reasoning_gym/products/reward/mean",
    } <= set(val[-1])
    assert all(0.0 <= m["val/reward/mean"] <= 1.0 for m in val)
