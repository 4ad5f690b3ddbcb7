"""Every example manifest validates (GSM8K data stubbed with one row in its format: validation reads a
sample of the rows)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rlcore.cli import main

ROOT = Path(__file__).resolve().parents[1]  # the repository

EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.toml"))


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_validates(tmp_path, capsys, name):
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples" / name, tmp_path / "examples" / name)
    for code in (ROOT / "examples").glob("*.py"):  # code an example names beside it (verifiers_env.py)
        shutil.copy(code, tmp_path / "examples" / code.name)
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    from rlcore.data.io import write_parquet

    row = {
        "prompt": [{"role": "user", "content": "1 + 1?"}],
        "data_source": "openai/gsm8k",
        "reward_model": {"ground_truth": "2", "style": "rule"},
        "extra_info": {"index": 0},
    }
    (tmp_path / "data" / "gsm8k_dapo").mkdir()
    for split in ("train", "test"):
        write_parquet([row], data / f"{split}.parquet")
        write_parquet([row], tmp_path / "data" / "gsm8k_dapo" / f"{split}.parquet")  # examples/dapo.toml's
    assert main(["validate", str(tmp_path / "examples" / name)]) == 0, capsys.readouterr().out


def test_the_examples_are_there():
    assert {"quickstart.toml", "gsm8k_grpo.toml", "gsm8k_ppo.toml", "agent_python_tool.toml"} <= set(EXAMPLES)
