"""GSM8K in its source format (``question``, ``answer`` ending in ``#### N``) to verl-format parquet.

The ground truth is the number after ``####`` without thousands separators; the prompt is the
question followed by an instruction to reason and end with ``#### <answer>``, which is what the
``gsm8k`` reward (``rlcore-reward-rule``) looks for. Two wordings: rlcore's own (``style =
"rlcore"``), and verl's preprocessing (``style = "verl"``: its instruction appended to the question
as given, its ground-truth extraction), so that a published verl recipe sees the same rows.
``style = "dapo"`` asks for a last line ``Answer: <answer>`` instead, which the ``math_dapo``
reward (verl's DAPO scorer, +1 or -1) reads: GSM8K for examples/dapo.toml.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rlcore.data.io import EXTENSIONS, rows_by_split, write_parquet
from rlcore.errors import RlcoreError

DATA_SOURCE = "openai/gsm8k"
HUB_ID, HUB_CONFIG = "openai/gsm8k", "main"
INSTRUCTION = 'Reason step by step, then write the final answer on its own after "####".'
VERL_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
DAPO_INSTRUCTION = 'Reason step by step, then write the final answer alone on the last line, as "Answer: <answer>".'
STYLES = ("rlcore", "verl", "dapo")
_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)\s*$")
_VERL_FINAL = re.compile(r"#### (\-?[0-9\.\,]+)")  # verl's extraction: the first "#### N"


def final_answer(answer: str) -> str | None:
    """The number after the closing ``####`` of a GSM8K solution, without commas."""
    match = _FINAL.search(answer.strip())
    return match.group(1).replace(",", "") if match else None


def verl_answer(answer: str) -> str | None:
    """The ground truth as verl's preprocessing extracts it: the first ``#### N``, commas removed."""
    match = _VERL_FINAL.search(answer)
    return match.group(1).replace(",", "") if match else None


def to_rows(records: list[dict[str, Any]], split: str, source: str, style: str = "rlcore") -> list[dict[str, Any]]:
    if style not in STYLES:
        raise RlcoreError(f"unknown GSM8K style {style!r}; known: {', '.join(STYLES)}")
    rows = []
    for i, record in enumerate(records):
        question, answer = record.get("question"), record.get("answer")
        if not isinstance(question, str) or not isinstance(answer, str):
            raise RlcoreError(
                f"{source}: row {i} needs the text fields 'question' and 'answer' (GSM8K's format); "
                f"its fields: {', '.join(sorted(record)) or '(none)'}"
            )
        truth = verl_answer(answer) if style == "verl" else final_answer(answer)
        if truth is None:
            raise RlcoreError(f"{source}: row {i}: the answer does not end with '#### <number>': {answer[-60:]!r}")
        content = (f"{question} {VERL_INSTRUCTION}" if style == "verl"
                   else f"{question.strip()} {DAPO_INSTRUCTION if style == 'dapo' else INSTRUCTION}")
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": content}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": truth},
                # verl writes the answer before the question: the same struct, field for field.
                "extra_info": ({"split": split, "index": i, "question": question, "answer": answer} if style != "verl"
                               else {"split": split, "index": i, "answer": answer, "question": question}),
            }
        )
    return rows


def _local_splits(source: Path) -> dict[str, list[dict[str, Any]]]:
    if source.is_dir():
        files = sorted(p for p in source.iterdir() if p.suffix.lower() in EXTENSIONS)
        if not files:
            raise RlcoreError(
                f"directory {str(source)!r} holds no {', '.join(sorted(EXTENSIONS))} files in GSM8K's format"
            )
    elif source.is_file():
        files = [source]
    else:
        raise RlcoreError(f"GSM8K input {str(source)!r} does not exist (give a file, a directory, or 'hub')")
    return rows_by_split(files)


def _hub_splits() -> dict[str, list[dict[str, Any]]]:
    import datasets

    try:
        loaded = datasets.load_dataset(HUB_ID, HUB_CONFIG)
    except Exception as exc:  # noqa: BLE001 - offline, blocked, or a hub error
        raise RlcoreError(
            f"could not load {HUB_ID} from the Hugging Face hub ({type(exc).__name__}: {str(exc)[:200]}); "
            "when offline, fetch GSM8K's train/test jsonl files elsewhere and pass them with --input"
        ) from None
    return {name: split.to_list() for name, split in loaded.items()}


def convert(source: str | Path, output_dir: str | Path, style: str = "rlcore") -> dict[str, Path]:
    """Convert GSM8K (a local jsonl/parquet file or directory of them, or ``"hub"``) into
    ``output_dir/<split>.parquet`` in ``style``'s wording; return ``{split: path}``. A file's name
    picks its split."""
    splits = _hub_splits() if str(source) == "hub" else _local_splits(Path(source).expanduser())
    out = Path(output_dir).expanduser()
    written: dict[str, Path] = {}
    for name, records in splits.items():
        where = f"GSM8K {name} split" if str(source) == "hub" else f"{source} ({name})"
        if not records:
            raise RlcoreError(f"{where} is empty")
        written[name] = write_parquet(to_rows(records, name, where, style), out / f"{name}.parquet")
    return written
