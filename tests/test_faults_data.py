"""Data whose content is wrong (issue 28, item 5): ``rlcore validate`` reads a sample of each data
file's rows and names the file, row (or line) and field of the first bad one; the loader refuses
every bad row the same way, never with a traceback."""

from __future__ import annotations

import json

import pytest

from rlcore.data.prompts import load_prompts
from rlcore.errors import RlcoreError
from rlcore.testing.runs import run_cli, write_run_manifest

GOOD = {
    "prompt": [{"role": "user", "content": "1 + 1?"}],
    "data_source": "x",
    "reward_model": {"ground_truth": "2"},
}


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _validate(tmp_path, train: str):
    manifest = write_run_manifest(tmp_path, tmp_path, data={"train": train, "val": None})
    (tmp_path / "config.json").write_text("{}")  # model.path must exist for validate
    return run_cli("validate", str(manifest))


@pytest.mark.parametrize(
    "bad, field, words",
    [
        (
            {"prompt": [{"role": "user", "content": None}]},
            "prompt[0]",
            ["'content' is null", "expected a string"],
        ),
        ({"prompt": [{"role": "user", "content": {"text": "hi"}}]}, "prompt[0]", ["'content' is dict"]),
        ({"prompt": [{"role": None, "content": "hi"}]}, "prompt[0]", ["'role' is null"]),
        ({"data_source": 7}, "'data_source'", ["is int", "expected a string"]),
        ({"extra_info": 3}, "'extra_info'", ["is int", "expected an object"]),
        ({"prompt": 5}, "'prompt'", ["is int"]),
    ],
)
def test_validate_names_the_file_line_and_field_of_a_bad_row(tmp_path, bad, field, words):
    data = _jsonl(tmp_path / "rows.jsonl", [GOOD, GOOD, {**GOOD, **bad}, GOOD])
    proc = _validate(tmp_path, str(data))
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, text
    assert f"data file '{data}', line 3: field {field}" in text, text
    for word in words:
        assert word in text, (word, text)
    assert "Traceback" not in text


def test_validate_reads_parquet_rows_and_says_a_directory_is_one(tmp_path):
    from rlcore.data.io import write_parquet

    data = write_parquet([{**GOOD, "extra_info": 1}, {**GOOD, "extra_info": 2}], tmp_path / "rows.parquet")
    proc = _validate(tmp_path, str(data))
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2 and f"data file '{data}', row 0: field 'extra_info' is int" in text, text
    (tmp_path / "shards.parquet").mkdir()
    proc = _validate(tmp_path, str(tmp_path / "shards.parquet"))
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2 and "is a directory" in text and "does not exist" not in text, text
    good = _jsonl(tmp_path / "good.jsonl", [GOOD] * 3)
    assert _validate(tmp_path, str(good)).returncode == 0


class _Tokenizer:
    chat_template = None

    def __call__(self, text, **_):
        return {"input_ids": list(range(len(text.split())))}


def test_the_loader_refuses_a_bad_row_naming_it(tmp_path):
    from rlcore.data.io import write_parquet

    rows = [{**GOOD, "extra_info": None}] * 5 + [{**GOOD, "extra_info": 9}]
    data = write_parquet(rows, tmp_path / "rows.parquet")
    with pytest.raises(RlcoreError) as caught:
        load_prompts(str(data), tokenizer=_Tokenizer(), max_prompt_tokens=100)
    assert (
        str(caught.value)
        == f"data {str(data)!r}: row 5: field 'extra_info' is int (9); expected an object (a mapping) or nothing"
    )
    prompts = load_prompts(
        str(write_parquet([GOOD] * 3, tmp_path / "good.parquet")),
        tokenizer=_Tokenizer(),
        max_prompt_tokens=100,
    )
    assert len(prompts) == 3
