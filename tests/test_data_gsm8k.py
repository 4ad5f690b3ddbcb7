"""GSM8K conversion from a small hand-written file in GSM8K's own format, and the offline hub error."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rlcore.data.gsm8k import INSTRUCTION, convert, final_answer
from rlcore.data.io import read_rows, write_parquet
from rlcore.errors import RlcoreError

RECORDS = [
    {
        "question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
        "answer": "He has 3 + 4 = <<3+4=7>>7 apples.\n#### 7",
    },
    {
        "question": "A bike costs $1,200 and a helmet $50. What do both cost?",
        "answer": "Together they cost 1200 + 50 = <<1200+50=1250>>1,250 dollars.\n#### 1,250",
    },
    {"question": "It was 5 degrees and fell by 8. What is it now?", "answer": "5 - 8 = -3\n#### -3"},
]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("... #### 7", "7"),
        ("#### 1,250", "1250"),
        ("x\n#### -3", "-3"),
        ("#### 2.5\n", "2.5"),
        ("no marker 7", None),
        ("#### 7 apples", None),
    ],
)
def test_final_answer(answer, expected):
    assert final_answer(answer) == expected


def test_convert_a_file(tmp_path):
    src = write_jsonl(tmp_path / "gsm8k_train.jsonl", RECORDS)
    written = convert(src, tmp_path / "out")
    assert written == {"train": tmp_path / "out" / "train.parquet"}
    rows = read_rows(written["train"])
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["7", "1250", "-3"]
    first = rows[0]
    assert first["data_source"] == "openai/gsm8k"
    assert first["reward_model"]["style"] == "rule"
    assert first["prompt"] == [{"role": "user", "content": f"{RECORDS[0]['question']} {INSTRUCTION}"}]
    assert "####" in INSTRUCTION
    assert first["extra_info"]["split"] == "train" and first["extra_info"]["index"] == 0
    assert first["extra_info"]["answer"] == RECORDS[0]["answer"]


def test_convert_a_directory_of_splits(tmp_path):
    src = tmp_path / "gsm8k"
    src.mkdir()
    write_jsonl(src / "train.jsonl", RECORDS[:2])
    write_parquet(RECORDS[2:], src / "test.parquet")
    (src / "README.md").write_text("ignored")
    written = convert(src, tmp_path / "out")
    assert set(written) == {"train", "test"}
    assert len(read_rows(written["train"])) == 2
    assert read_rows(written["test"])[0]["extra_info"]["split"] == "test"


def test_converted_data_scores_with_the_gsm8k_reward(tmp_path):
    """The ground truth written here is what the rule reward compares against."""
    gsm8k = pytest.importorskip("rlcore_reward_rule.gsm8k")
    from rlcore_reward_rule.options import GSM8KOptions

    from rlcore.interfaces import RewardInput

    rows = read_rows(convert(write_jsonl(tmp_path / "test.jsonl", RECORDS), tmp_path / "o")["test"])
    fn = gsm8k.build(GSM8KOptions())
    for record, row in zip(RECORDS, rows):
        item = RewardInput(response=record["answer"], ground_truth=row["reward_model"]["ground_truth"])
        assert fn(item).score == 1.0


@pytest.mark.parametrize(
    ("records", "phrases"),
    [
        ([{"question": "q", "answer": "no final line"}], ["row 0", "#### <number>"]),
        ([RECORDS[0], {"question": "q"}], ["row 1", "'question' and 'answer'"]),
        ([{"prompt": "q", "answer": "#### 1"}], ["row 0", "its fields: answer, prompt"]),
    ],
)
def test_bad_records(tmp_path, records, phrases):
    src = write_jsonl(tmp_path / "train.jsonl", records)
    with pytest.raises(RlcoreError) as info:
        convert(src, tmp_path / "out")
    for phrase in [str(src), *phrases]:
        assert phrase in str(info.value)


def test_bad_inputs(tmp_path):
    with pytest.raises(RlcoreError, match="does not exist"):
        convert(tmp_path / "nope.jsonl", tmp_path / "out")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(RlcoreError, match="holds no"):
        convert(tmp_path / "empty_dir", tmp_path / "out")
    (tmp_path / "train.jsonl").write_text("")
    with pytest.raises(RlcoreError, match=r"train.jsonl \(train\) is empty"):
        convert(tmp_path / "train.jsonl", tmp_path / "out")


def test_hub_offline_is_a_clear_error(tmp_path):
    code = (
        "from rlcore.data.gsm8k import convert\n"
        "from rlcore.errors import RlcoreError\n"
        "try:\n"
        f"    convert('hub', {str(tmp_path)!r})\n"
        "except RlcoreError as e:\n"
        "    print('ERROR', e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    ).stdout
    assert out.startswith("ERROR could not load openai/gsm8k"), out
    assert "--input" in out


def test_verl_style_gives_verls_rows_field_for_field(tmp_path):
    """What verl's examples/data_preprocess/gsm8k.py writes: the question as given, a space, its
    instruction; the first "#### N" without commas; extra_info with the answer before the question."""
    records = [{"question": "  Tom has 3 apples. ", "answer": "3 apples.\n#### 1,003"}]
    written = convert(write_jsonl(tmp_path / "test.jsonl", records), tmp_path / "out", style="verl")
    (row,) = read_rows(written["test"])
    assert row == {
        "data_source": "openai/gsm8k",
        "prompt": [
            {
                "role": "user",
                "content": '  Tom has 3 apples.  Let\'s think step by step and output the final answer after "####".',
            }
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "1003"},
        "extra_info": {
            "split": "test",
            "index": 0,
            "answer": "3 apples.\n#### 1,003",
            "question": "  Tom has 3 apples. ",
        },
    }
    assert list(row) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert list(row["extra_info"]) == ["split", "index", "answer", "question"]


def test_dapo_style_asks_for_the_answer_line_math_dapo_reads(tmp_path):
    """examples/dapo.toml's data: rlcore's rows, with an instruction to end on "Answer: N", which
    the math_dapo reward extracts (+1 when it is right, -1 otherwise)."""
    from rlcore.data.gsm8k import DAPO_INSTRUCTION

    records = [{"question": "  Tom has 3 apples. ", "answer": "3 apples.\n#### 1,003"}]
    (row,) = read_rows(
        convert(write_jsonl(tmp_path / "test.jsonl", records), tmp_path / "out", style="dapo")["test"]
    )
    assert row["prompt"] == [{"role": "user", "content": f"Tom has 3 apples. {DAPO_INSTRUCTION}"}]
    assert row["reward_model"]["ground_truth"] == "1003" and '"Answer: <answer>"' in DAPO_INSTRUCTION
    try:
        from rlcore_reward_rule.math_dapo import extract_answer
    except ImportError:  # the reward plugin is not installed: the row is checked, not its scoring
        return
    assert extract_answer("3 + 1000 = 1003.\nAnswer: 1003") == "1003"
