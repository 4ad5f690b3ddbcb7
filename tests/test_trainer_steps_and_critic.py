"""``[trainer] total_epochs`` as an alternative to ``steps``, and a critic of its own (``[critic] path``)."""

from __future__ import annotations

import pytest

from rlcore.cli import main
from rlcore.errors import ManifestError
from rlcore.manifest.loader import load_manifest
from rlcore.testing.runs import read_metrics, train_rows, write_run_manifest


def test_steps_or_total_epochs_exactly_one(tmp_path, tiny_model):
    both = write_run_manifest(tmp_path, tiny_model, trainer={"steps": 2, "total_epochs": 1.0})
    with pytest.raises(ManifestError, match=r"trainer.total_epochs.*set one of steps .* not both"):
        load_manifest(both)
    neither = write_run_manifest(tmp_path, tiny_model, trainer={"steps": None})
    with pytest.raises(ManifestError, match=r"trainer.steps.*required key is missing \(or give total_epochs"):
        load_manifest(neither)


@pytest.mark.slow
def test_total_epochs_trains_that_many_passes(tmp_path, tiny_model):
    # 64 training prompts, 4 a step: an eighth of an epoch is 2 steps; the run ends after them.
    manifest = write_run_manifest(tmp_path, tiny_model, trainer={"steps": None, "total_epochs": 0.125})
    assert main(["run", str(manifest), "--run-dir", str(tmp_path / "run")]) == 0
    rows = train_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["training/epoch"] == 0
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text() == "step_000002"


PPO = dict(
    algorithm={"advantage": "gae"},
    rollout={"samples_per_prompt": 1},
    trainer={"steps": 1},
    data={"val": None},
)


@pytest.mark.slow
def test_a_critic_of_its_own_starts_from_its_own_weights(tmp_path, tiny_model):
    from rlcore.testing.models import make_tiny_model

    make_tiny_model(tmp_path / "critic-model", seed=7, hidden=32, heads=2, kv_heads=1)
    shared = write_run_manifest(tmp_path, tiny_model, **PPO)
    assert main(["run", str(shared), "--run-dir", str(tmp_path / "shared")]) == 0
    own = write_run_manifest(
        tmp_path, tiny_model, critic={"path": "critic-model"}, **PPO
    )  # relative to the manifest
    assert main(["run", str(own), "--run-dir", str(tmp_path / "own")]) == 0
    values = [read_metrics(tmp_path / run)[-1]["critic/values/mean"] for run in ("shared", "own")]
    assert values[0] != values[1]  # another backbone (another width, other weights) gave other values
    assert "critic-model" in (tmp_path / "own" / "manifest.resolved.toml").read_text()


@pytest.mark.slow
def test_a_critic_with_a_smaller_vocabulary_is_refused(tmp_path, tiny_model, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM

    small = tmp_path / "small-vocab"
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=100,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    ).save_pretrained(small)
    manifest = write_run_manifest(tmp_path, tiny_model, critic={"path": str(small)}, **PPO)
    assert main(["run", str(manifest), "--run-dir", str(tmp_path / "run")]) == 2
    shown = "".join(capsys.readouterr())
    assert "vocabulary of 100 tokens" in shown and "share the actor's tokenizer" in shown
