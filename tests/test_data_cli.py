"""`rlcore data` sub-commands, through their configure/run functions."""

from __future__ import annotations

import argparse
import json

import pytest

from rlcore.data import cli
from rlcore.data.io import read_rows
from rlcore.data.synthetic import generate
from rlcore.errors import RlcoreError, UsageError


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rlcore data")
    cli.configure(parser)
    return parser.parse_args(argv)


def test_synthetic(tmp_path, capsys):
    out = tmp_path / "add.parquet"
    args = parse(
        "synthetic",
        "--task",
        "addition",
        "--size",
        "25",
        "--seed",
        "4",
        "--split",
        "test",
        "--param",
        "digits=2",
        "--output",
        str(out),
    )
    assert cli.run(args) == 0
    assert read_rows(out) == generate("addition", size=25, seed=4, split="test", digits=2)
    assert str(out) in capsys.readouterr().out


def test_synthetic_errors(tmp_path):
    with pytest.raises(UsageError, match="KEY=VALUE"):
        cli.run(
            parse(
                "synthetic",
                "--task",
                "addition",
                "--param",
                "digits",
                "--output",
                str(tmp_path / "a.parquet"),
            )
        )
    with pytest.raises(RlcoreError, match="did you mean 'addition'"):
        cli.run(parse("synthetic", "--task", "additon", "--output", str(tmp_path / "a.parquet")))
    with pytest.raises(RlcoreError, match="digits"):
        cli.run(
            parse(
                "synthetic",
                "--task",
                "addition",
                "--param",
                "digits=99",
                "--output",
                str(tmp_path / "a.parquet"),
            )
        )
    with pytest.raises(SystemExit):
        parse("synthetic", "--task", "addition")  # --output is required


def test_gsm8k(tmp_path, capsys):
    src = tmp_path / "test.jsonl"
    src.write_text(json.dumps({"question": "1 + 1?", "answer": "1 + 1 = 2\n#### 2"}) + "\n")
    assert cli.run(parse("gsm8k", "--input", str(src), "--output", str(tmp_path / "out"))) == 0
    assert read_rows(tmp_path / "out" / "test.parquet")[0]["reward_model"]["ground_truth"] == "2"
    assert "test:" in capsys.readouterr().out


def test_a_sub_command_is_required():
    with pytest.raises(SystemExit):
        parse()
