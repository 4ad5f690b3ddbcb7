"""MATH conversion (``rlcore data math``): the published layout and row files, verl's wording,
and \\boxed{} answers with nested braces."""

from __future__ import annotations

import json

import pytest

from rlcore.cli import main
from rlcore.data.io import read_rows
from rlcore.data.math import INSTRUCTION, convert, last_boxed


@pytest.mark.parametrize(
    ("solution", "expected"),
    [
        ("so $x = \\boxed{5}$.", "5"),
        ("first \\boxed{1}, then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("the answer is $\\boxed 7$", "7"),
        ("\\fbox{12}", "12"),
        ("no box here", None),
        ("\\boxed{unclosed", None),
    ],
)
def test_last_boxed(solution, expected):
    assert last_boxed(solution) == expected


def _problem(path, problem, solution, level="Level 1", kind="Algebra"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"problem": problem, "level": level, "type": kind, "solution": solution}))


def test_the_published_layout_converts_split_by_split(tmp_path):
    root = tmp_path / "MATH"
    _problem(root / "train" / "algebra" / "10.json", "What is $2+3$?", "It is $\\boxed{5}$.")
    _problem(root / "train" / "algebra" / "2.json", "Half of 1?", "$\\boxed{\\frac{1}{2}}$")
    _problem(
        root / "test" / "geometry" / "1.json", "Angles of a triangle?", "They sum to $\\boxed{180^\\circ}$."
    )
    assert main(["data", "math", "--input", str(root), "--output", str(tmp_path / "out")]) == 0
    train = read_rows(tmp_path / "out" / "train.parquet")
    # Problem files in numeric order within a subject (2 before 10).
    assert [r["reward_model"]["ground_truth"] for r in train] == ["\\frac{1}{2}", "5"]
    assert train[0] == {
        "data_source": "DigitalLearningGmbH/MATH-lighteval",
        "prompt": [{"role": "user", "content": f"Half of 1? {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "\\frac{1}{2}"},
        "extra_info": {"split": "train", "index": 0},
    }
    assert "\\boxed{}" in INSTRUCTION
    (test,) = read_rows(tmp_path / "out" / "test.parquet")
    assert test["reward_model"]["ground_truth"] == "180^\\circ"


def test_row_files_convert_and_the_math_reward_accepts_them(tmp_path):
    src = tmp_path / "math_test.jsonl"
    src.write_text(json.dumps({"problem": "1+1?", "solution": "$\\boxed{2}$"}) + "\n")
    written = convert(src, tmp_path / "out")
    (row,) = read_rows(written["test"])
    pytest.importorskip("rlcore_reward_rule")
    from rlcore_reward_rule.math_answer import build
    from rlcore_reward_rule.options import MathOptions

    from rlcore.interfaces import RewardInput

    fn = build(MathOptions())
    score = fn(RewardInput(response="so \\boxed{2}", ground_truth=row["reward_model"]["ground_truth"]))
    assert getattr(score, "score", score) == 1.0


def test_bad_inputs_are_located(tmp_path, capsys):
    bad = tmp_path / "MATH" / "train" / "algebra" / "1.json"
    _problem(bad, "x?", "no boxed answer")
    assert main(["data", "math", "--input", str(tmp_path / "MATH"), "--output", str(tmp_path / "out")]) == 2
    assert "row 0: the solution has no \\boxed{...} answer" in "".join(capsys.readouterr())
    assert main(["data", "math", "--input", str(tmp_path / "nope"), "--output", str(tmp_path / "out")]) == 2
    assert "does not exist" in "".join(capsys.readouterr())
