"""Synthetic tasks: exact prompt text, correct answers, disjoint splits, determinism, parquet output."""

from __future__ import annotations

import re

import pytest

from rlcore.data import check_data_spec
from rlcore.data.io import read_rows
from rlcore.data.synthetic import generate, parse_spec, write_synthetic
from rlcore.errors import RlcoreError


def questions(rows):
    return [r["prompt"][0]["content"] for r in rows]


def test_addition_rows_are_verl_format_with_correct_sums():
    rows = generate("addition", size=50, seed=1)
    assert len(rows) == 50
    for row in rows:
        assert row["data_source"] == "synthetic/addition"
        assert row["prompt"][0]["role"] == "user" and len(row["prompt"]) == 1
        m = re.fullmatch(r"What is (\d) \+ (\d)\? Reply with only the number\.", row["prompt"][0]["content"])
        assert m, row["prompt"][0]["content"]
        assert row["reward_model"] == {"style": "rule", "ground_truth": str(int(m[1]) + int(m[2]))}
        assert (row["extra_info"]["a"], row["extra_info"]["b"]) == (int(m[1]), int(m[2]))


@pytest.mark.parametrize("digits", [1, 2, 3, 5])
def test_addition_digits_and_disjoint_splits(digits):
    train = generate("addition", size=300, seed=1, digits=digits)
    test = generate("addition", size=100, seed=2, digits=digits, split="test")
    for row in train + test:
        a, b = row["extra_info"]["a"], row["extra_info"]["b"]
        assert len(str(a)) == digits and len(str(b)) == digits
    assert not set(questions(train)) & set(questions(test))


def test_single_digit_splits_cover_the_space_without_overlap():
    # 100 pairs in all; asking for more than a split holds repeats within it, never across.
    train = set(questions(generate("addition", size=1000, seed=0)))
    test = set(questions(generate("addition", size=1000, seed=0, split="test")))
    assert not train & test
    assert len(train) + len(test) == 100
    assert 10 <= len(test) <= 30


def test_no_repeats_while_the_split_has_room():
    rows = generate("addition", size=60, seed=4)
    assert len(set(questions(rows))) == 60


def test_deterministic_by_seed():
    assert generate("arithmetic", size=20, seed=3) == generate("arithmetic", size=20, seed=3)
    assert generate("addition", size=20, seed=3) != generate("addition", size=20, seed=4)


def test_arithmetic_answers_are_the_value_of_the_expression():
    rows = generate("arithmetic", size=100, seed=5, steps=3, max_operand=30)
    for row in rows:
        text = row["prompt"][0]["content"]
        m = re.fullmatch(r"Compute (.+)\. Put the final answer in \\boxed\{\}\.", text)
        assert m, text
        expression = m[1]
        assert expression == row["extra_info"]["expression"]
        assert re.fullmatch(r"[\d ()+\-*]+", expression)
        assert expression.count("+") + expression.count("-") + expression.count("*") == 3
        assert row["reward_model"]["ground_truth"] == str(eval(expression))  # noqa: S307 - our own digits and operators
        assert row["data_source"] == "synthetic/arithmetic"
    test = generate("arithmetic", size=50, seed=5, steps=3, max_operand=30, split="test")
    assert not set(questions(rows)) & set(questions(test))


def test_parse_spec():
    name, params = parse_spec("synthetic:addition?size=12&seed=3&digits=2&split=test")
    assert name == "addition" and (params.size, params.seed, params.digits, params.split) == (
        12,
        3,
        2,
        "test",
    )
    name, params = parse_spec("synthetic:arithmetic")
    assert name == "arithmetic" and params.steps == 2


@pytest.mark.parametrize(
    ("spec", "phrases"),
    [
        ("synthetic:adition", ["unknown synthetic task 'adition'", "did you mean 'addition'", "arithmetic"]),
        ("synthetic:addition?size=0", ["size", "greater than or equal to 1"]),
        ("synthetic:addition?digits=two", ["digits", "integer"]),
        ("synthetic:addition?steps=2", ["steps", "parameters of 'addition': size, seed, split, digits"]),
        ("synthetic:addition?split=val", ["split", "'train' or 'test'"]),
        ("synthetic:addition?size", ["?size=100"]),
    ],
)
def test_bad_specs_name_what_is_wrong(spec, phrases):
    message = check_data_spec(spec)
    assert message is not None
    for phrase in phrases:
        assert phrase in message, message
    with pytest.raises(RlcoreError):
        parse_spec(spec)


def test_write_synthetic_round_trips_through_parquet(tmp_path):
    path = write_synthetic("arithmetic", tmp_path / "sub" / "train.parquet", size=30, seed=2)
    assert path.is_file() and not list(tmp_path.glob("sub/*.tmp"))
    assert read_rows(path) == generate("arithmetic", size=30, seed=2)


def test_write_synthetic_errors(tmp_path):
    with pytest.raises(RlcoreError, match=r"must end in \.parquet"):
        write_synthetic("addition", tmp_path / "x.csv", size=3)
    with pytest.raises(RlcoreError, match="unknown synthetic task"):
        write_synthetic("multiplication", tmp_path / "x.parquet")
