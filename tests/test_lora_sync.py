"""A LoRA run whose engine holds its own weights and loads adapters (the hf engine with
share_actor = false; vLLM with lora_rank): each weight sync sends the adapter tensors alone, and
the engine's log-probs then equal the trainer's (float32 on the CPU: to rounding)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rlcore.cli import main
from rlcore.testing.runs import train_rows, write_run_manifest

ROOT = Path(__file__).resolve().parents[1]
LORA = {"rank": 4, "alpha": 16}


def _manifest(tmp_path, model_dir, **tables):
    shutil.copy(ROOT / "tests" / "fixtures" / "dense_rewards.py", tmp_path / "dense_rewards.py")
    base = dict(
        reward={"function": "python:dense_rewards.py:sum_and_upper", "method": None},
        algorithm={"advantage": "reinforce_pp"},
        data={"val": None},
        rollout={"samples_per_prompt": 2, "temperature": 1.0, "share_actor": False},
        run={"device": "cpu"},
        model={"lora": LORA},
        trainer={"steps": 3, "lr": 5e-2},
    )
    for key, value in tables.items():
        base[key] = {**base.get(key, {}), **value}
    return write_run_manifest(tmp_path, model_dir, **base)


@pytest.mark.slow
def test_a_lora_sync_sends_only_the_adapter_and_the_engine_then_matches_the_trainer(
    tmp_path, tiny_model, monkeypatch
):
    from rlcore_rollout_hf.engine import HFRolloutEngine

    calls: list[tuple[list[str], object]] = []
    real = HFRolloutEngine.update_weights

    def recording(self, named_tensors, *, lora=None):
        tensors = list(named_tensors)
        calls.append(([name for name, _ in tensors], lora))
        return real(self, tensors, lora=lora)

    def run(name: str) -> list[dict]:
        (tmp_path / name).mkdir()
        assert (
            main(
                [
                    "run",
                    str(_manifest(tmp_path / name, tiny_model)),
                    "--run-dir",
                    str(tmp_path / name / "run"),
                ]
            )
            == 0
        )
        return train_rows(tmp_path / name / "run")

    monkeypatch.setattr(HFRolloutEngine, "update_weights", recording)
    synced = run("synced")
    assert len(calls) == 3  # after every update
    for names, lora in calls:
        assert names and all("lora_A" in n or "lora_B" in n for n in names), names[:3]
        assert (
            lora["rank"] == LORA["rank"]
            and lora["alpha"] == LORA["alpha"]
            and lora["peft_config"]["peft_type"] == "LORA"
        )
    assert len(calls[0][0]) == 2 * len(
        lora["peft_config"]["target_modules"]
    )  # A and B of every adapted module
    monkeypatch.setattr(HFRolloutEngine, "update_weights", lambda self, named_tensors, *, lora=None: None)
    stale = run("stale")
    gap = "rollout_corr/logprob_diff/mean"
    print("synced:", [r[gap] for r in synced], "stale:", [r[gap] for r in stale])
    for s, t in zip(synced[1:], stale[1:]):  # from step 2 on the adapter has moved
        assert s[gap] < 1e-4 and s["rollout_corr/ratio/min"] > 0.999 and s["rollout_corr/ratio/max"] < 1.001
        assert t[gap] > 100 * max(s[gap], 1e-6)
