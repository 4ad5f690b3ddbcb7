"""``rlcore eval``: a checkpoint or an export scores on validation what the run itself logged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlcore.cli import main
from rlcore.testing.runs import read_metrics, write_run_manifest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def trained(tmp_path, tiny_model):
    """A 2-step run with a reward that varies (so the comparison means something), exported."""
    shutil.copy(FIXTURES / "dense_rewards.py", tmp_path / "dense_rewards.py")
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        reward={"function": "python:dense_rewards.py:upper", "method": None},
        rollout={"val_samples_per_prompt": 2, "val_temperature": 1.0},
        trainer={"steps": 2, "lr": 5e-3, "export_final": True},
    )
    assert main(["run", str(manifest), "--run-dir", str(tmp_path / "run")]) == 0
    last_val = [r for r in read_metrics(tmp_path / "run") if "val/reward/mean" in r][-1]
    assert last_val["step"] == 2 and 0 < last_val["val/reward/mean"] < 1
    return manifest, tmp_path / "run", last_val


@pytest.mark.slow
def test_eval_of_the_final_checkpoint_reproduces_the_runs_last_validation(trained, capsys):
    manifest, run_dir, last_val = trained
    assert main(["eval", str(manifest), "--checkpoint", str(run_dir / "checkpoints" / "step_000002")]) == 0
    report = json.loads((run_dir / "eval" / "step_000002.json").read_text())
    assert report["step"] == 2 and report["samples_per_prompt"] == 2
    val = report["sets"]["val"]
    for key in ("val/reward/mean", "val/synthetic/addition/pass@1", "val/synthetic/addition/pass@2"):
        assert val[key] == last_val[key], key
    shown = capsys.readouterr().out
    assert "synthetic/addition" in shown and "pass@2" in shown and "report:" in shown
    # A run directory means its newest intact checkpoint; the export scores the same.
    out = run_dir / "by-run-dir.json"
    assert main(["eval", str(manifest), "--checkpoint", str(run_dir), "--output", str(out)]) == 0
    assert json.loads(out.read_text())["sets"]["val"]["val/reward/mean"] == last_val["val/reward/mean"]


@pytest.mark.slow
def test_eval_of_an_export_on_named_sets(trained, tmp_path):
    manifest, run_dir, last_val = trained
    out = tmp_path / "report.json"
    assert (
        main(
            [
                "eval",
                str(manifest),
                "--model",
                str(run_dir / "export"),
                "--data",
                "small=synthetic:addition?size=4&seed=5&split=test",
                "--samples",
                "3",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert set(report["sets"]) == {"small"} and report["sets"]["small"]["prompts"] == 4
    assert "val/synthetic/addition/pass@3" in report["sets"]["small"]


def test_eval_bad_input_is_located(tmp_path, tiny_model, capsys):
    manifest = write_run_manifest(tmp_path, tiny_model)
    assert main(["eval", str(manifest), "--checkpoint", str(tmp_path / "nope")]) == 2
    assert "--checkpoint" in (shown := "".join(capsys.readouterr())) and "no such directory" in shown
    (tmp_path / "empty").mkdir()
    assert main(["eval", str(manifest), "--model", str(tmp_path / "empty")]) == 2
    assert "no config.json" in "".join(capsys.readouterr())
    assert main(["eval", str(manifest), "--samples", "0"]) == 2
