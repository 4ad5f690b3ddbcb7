"""A converted verl command trains: tiny_grpo.sh (a verl GRPO command scaled down) becomes a
manifest that runs one step on a tiny model, scored by the ``verl`` reward as verl's default scorer."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlcore.testing import require_plugins
from rlcore.testing.runs import run_in_process as main
from rlcore.testing.runs import train_rows

SCRIPTS = Path(__file__).parent / "scripts"
require_plugins("rlcore_rollout_hf", "rlcore_reward_rule", "rlcore_algo_grpo")


def write_gsm8k_rows(path, n):
    """Rows in verl's GSM8K format (data_source openai/gsm8k, the answer in reward_model)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"index": i},
        }
        for i in range(n)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.mark.slow
def test_a_converted_verl_command_runs_a_step(tiny_model, tmp_path, monkeypatch, capfd):
    data = tmp_path / "data"
    write_gsm8k_rows(data / "train.parquet", 8)
    write_gsm8k_rows(data / "test.parquet", 4)
    monkeypatch.setenv("MODEL_PATH", str(tiny_model))
    monkeypatch.setenv("DATA_DIR", str(data))
    monkeypatch.chdir(tmp_path)
    manifest = tmp_path / "m.toml"
    # On this CPU machine: the embedded engine and one device, given after the script as verl takes "$@".
    code = main(
        [
            "from-verl",
            str(SCRIPTS / "tiny_grpo.sh"),
            "actor_rollout_ref.rollout.name=hf",
            "trainer.n_gpus_per_node=1",
            "--out",
            str(manifest),
        ]
    )
    err = capfd.readouterr().err
    assert code == 0, err
    assert (
        "actor_rollout_ref.rollout.gpu_memory_utilization = 0.4 (tiny_grpo.sh:27): an option of the vllm"
        in err
    )
    text = manifest.read_text()
    assert 'function = "verl"' in text and "steps = 1" in text and "kl_coef = 0.001" in text
    assert main(["run", str(manifest), "--run-dir", str(tmp_path / "run")]) == 0
    rows = train_rows(tmp_path / "run")
    assert len(rows) == 1
    assert "critic/score/mean" in rows[0] and "actor/kl_loss" in rows[0]  # KL loss: verl's use_kl_loss
    assert "reward/answer_found" in rows[0]  # gsm8k's strict scorer ran (verl routes openai/gsm8k there)
