"""Row files are read as written: no type coercion of ground truth, and located errors."""

from __future__ import annotations

import json

import pytest

from rlcore.data.io import read_rows
from rlcore.errors import RlcoreError


def test_ground_truth_keeps_its_type_and_text_in_mixed_rows(tmp_path):
    """One numeric ground truth among strings made datasets fall back to pandas, which turned
    "007" into 7, "1e3" into 1000.0 and "3.50" into 3.5 in every row."""
    rows = [
        {"prompt": "a", "ground_truth": "007"},
        {"prompt": "b", "ground_truth": "1e3"},
        {"prompt": "c", "ground_truth": "3.50"},
        {"prompt": "d", "ground_truth": 5},
        {"prompt": "e", "reward_model": {"ground_truth": "0.10"}, "extra_info": {"k": [1, "x"]}},
    ]
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    array = tmp_path / "rows.json"
    array.write_text(json.dumps(rows, indent=2))
    assert read_rows(jsonl) == rows
    assert read_rows(array) == rows


@pytest.mark.parametrize(
    ("content", "phrases"),
    [
        (b'{"prompt": "a"}\n{"prompt": "b",}\n', ["rows.jsonl', line 2, column", "not valid JSON"]),
        (b'{"prompt": "a"}\n{"prompt": "\xff"}\n', ["rows.jsonl', line 2", "not UTF-8"]),
        (b'{"prompt": "a"}\n\n[1, 2]\n', ["rows.jsonl', line 3", "expected a JSON object, got list"]),
    ],
)
def test_bad_lines_are_named(tmp_path, content, phrases):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(content)
    with pytest.raises(RlcoreError) as info:
        read_rows(path)
    for phrase in phrases:
        assert phrase in str(info.value), str(info.value)


def test_an_empty_file_has_no_rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n")
    assert read_rows(path) == []
