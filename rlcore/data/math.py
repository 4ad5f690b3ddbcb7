"""The MATH dataset (Hendrycks et al.) from local files to verl-format parquet, as verl's
``math_dataset.py`` preprocessing writes it: the problem followed by verl's instruction to put the
answer in ``\\boxed{}``, and the ground truth taken from the last ``\\boxed{...}`` of the reference
solution.

Inputs: the published layout (``<root>/train/<subject>/<n>.json`` and ``<root>/test/...``, one
problem per file), or jsonl/json/parquet files of rows with ``problem`` and ``solution`` (the
hub's copies), one file per split (its name picks the split), or a directory of such files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlcore.data.io import EXTENSIONS, rows_by_split, write_parquet
from rlcore.errors import RlcoreError

DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"  # verl's name for it (its default scorer routes it to math)
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (braces matched) or ``\\boxed X`` in ``text``; also
    ``\\fbox{...}``. None when there is none or its braces never close."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start:]
    command = "\\boxed" if rest.startswith("\\boxed") else "\\fbox"
    after = rest[len(command):]
    if after.startswith(" "):  # "\boxed 5": up to the next "$" or the end
        return after[1:].split("$")[0].strip() or None
    if not after.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(after):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return after[1:i]
    return None


def to_rows(records: list[dict[str, Any]], split: str, source: str) -> list[dict[str, Any]]:
    rows = []
    for i, record in enumerate(records):
        problem, solution = record.get("problem"), record.get("solution")
        if not isinstance(problem, str) or not isinstance(solution, str):
            raise RlcoreError(
                f"{source}: row {i} needs the text fields 'problem' and 'solution' (MATH's format); "
                f"its fields: {', '.join(sorted(record)) or '(none)'}"
            )
        truth = last_boxed(solution)
        if truth is None:
            raise RlcoreError(f"{source}: row {i}: the solution has no \\boxed{{...}} answer: {solution[-80:]!r}")
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"{problem} {INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": truth},
                "extra_info": {"split": split, "index": i},
            }
        )
    return rows


def _published_layout(root: Path) -> dict[str, list[dict[str, Any]]]:
    """``root/<split>/<subject>/<n>.json``, read in a stable order (subject, then problem number)."""
    splits: dict[str, list[dict[str, Any]]] = {}
    for split_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        files = sorted(split_dir.glob("*/*.json"), key=lambda p: (p.parent.name, int(p.stem) if p.stem.isdigit() else 0, p.stem))
        if not files:
            continue
        records = []
        for path in files:
            try:
                records.append(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise RlcoreError(f"{path}: not a MATH problem file ({exc})") from None
        splits[split_dir.name] = records
    return splits


def _splits(source: Path) -> dict[str, list[dict[str, Any]]]:
    if source.is_dir():
        published = _published_layout(source)
        if published:
            return published
        files = sorted(p for p in source.iterdir() if p.suffix.lower() in EXTENSIONS)
        if not files:
            raise RlcoreError(
                f"directory {str(source)!r} holds neither MATH's layout (<split>/<subject>/<n>.json) nor "
                f"{', '.join(sorted(EXTENSIONS))} files"
            )
    elif source.is_file():
        files = [source]
    else:
        raise RlcoreError(f"MATH input {str(source)!r} does not exist (give a directory or a file)")
    return rows_by_split(files, ("train", "test"))


def convert(source: str | Path, output_dir: str | Path) -> dict[str, Path]:
    """Convert MATH into ``output_dir/<split>.parquet``; return ``{split: path}``."""
    out = Path(output_dir).expanduser()
    written: dict[str, Path] = {}
    for name, records in _splits(Path(source).expanduser()).items():
        where = f"{source} ({name})"
        if not records:
            raise RlcoreError(f"{where} is empty")
        written[name] = write_parquet(to_rows(records, name, where), out / f"{name}.parquet")
    return written
