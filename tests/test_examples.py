"""Every example manifest validates (GSM8K data stubbed: validation checks the files exist)."""

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
    data = tmp_path / "data" / "gsm8k"
    data.mkdir(parents=True)
    for split in ("train", "test"):
        (data / f"{split}.parquet").write_bytes(b"")
    assert main(["validate", str(tmp_path / "examples" / name)]) == 0, capsys.readouterr().out


def test_the_examples_are_there():
    assert {"quickstart.toml", "gsm8k_grpo.toml", "gsm8k_ppo.toml", "agent_python_tool.toml"} <= set(EXAMPLES)
