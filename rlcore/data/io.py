"""Reading and writing row files (parquet, jsonl). The heavy libraries load only when called."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlcore.errors import RlcoreError

EXTENSIONS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}


def file_format(path: Path) -> str:
    fmt = EXTENSIONS.get(path.suffix.lower())
    if fmt is None:
        raise RlcoreError(
            f"data file {str(path)!r} has the unknown extension {path.suffix or '(none)'!r}; "
            f"expected one of {', '.join(sorted(EXTENSIONS))}"
        )
    return fmt


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a parquet, jsonl or json file (local files only, kept in memory).

    Parquet goes through ``datasets`` (its columns are typed already). JSON is read with the
    standard ``json`` module, row by row, because ``datasets`` infers one type per column: a
    column holding both numbers and strings made it fall back to pandas, which rewrote every
    ground truth ("007" became 7, "3.50" became 3.5) and scored right answers 0. Reading rows as
    written keeps every value, and a bad line is named by its number."""
    path = Path(path)
    if not path.is_file():
        raise RlcoreError(f"data file {str(path)!r} does not exist")
    fmt = file_format(path)
    if fmt == "json":
        return _json_rows(path)
    import datasets

    datasets.disable_progress_bars()
    try:
        ds = datasets.Dataset.from_parquet(str(path), keep_in_memory=True)
    except Exception as exc:  # noqa: BLE001 - a malformed file: say which, and why
        reason = str(exc).strip().splitlines()
        raise RlcoreError(
            f"cannot read data file {str(path)!r} as {fmt}: {type(exc).__name__}: {reason[-1] if reason else ''}"
        ) from None
    return ds.to_list()


def _json_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file, or of a JSON file holding one array of objects."""
    import json

    data = path.read_bytes()
    stripped = data.lstrip()
    if stripped.startswith(b"["):  # one JSON document: an array of rows
        try:
            rows = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise RlcoreError(f"data file {str(path)!r} is not UTF-8 text (byte {exc.start})") from None
        except json.JSONDecodeError as exc:
            raise RlcoreError(f"data file {str(path)!r}, line {exc.lineno}, column {exc.colno}: not valid JSON: {exc.msg}") from None
        where = lambda i: f"row {i}"  # noqa: E731
    else:
        rows = []
        for number, line in enumerate(data.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line.decode("utf-8")))
            except UnicodeDecodeError as exc:
                raise RlcoreError(f"data file {str(path)!r}, line {number}: not UTF-8 text (byte {exc.start} of the line)") from None
            except json.JSONDecodeError as exc:
                raise RlcoreError(f"data file {str(path)!r}, line {number}, column {exc.colno}: not valid JSON: {exc.msg}") from None
        lines = [n for n, line in enumerate(data.splitlines(), start=1) if line.strip()]
        where = lambda i: f"line {lines[i]}"  # noqa: E731
    if not isinstance(rows, list):
        raise RlcoreError(f"data file {str(path)!r}: expected JSON lines or an array of objects")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise RlcoreError(f"data file {str(path)!r}, {where(i)}: expected a JSON object, got {type(row).__name__}")
    return rows


def write_parquet(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write rows as one parquet file (atomically: a partial file never has the final name)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if path.suffix.lower() != ".parquet":
        raise RlcoreError(f"output file {str(path)!r} must end in .parquet")
    if not rows:
        raise RlcoreError(f"refusing to write the empty dataset {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.replace(path)
    return path


def rows_by_split(files: list[Path], splits: tuple[str, ...] = ("train", "test", "validation", "val")) -> dict[str, list[dict[str, Any]]]:
    """The rows of each file under its split: the first of ``splits`` its name contains, else its
    stem. Two files of one split are refused (the file name is what picks the split)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in files:
        stem = path.stem.lower()
        name = next((split for split in splits if split in stem), path.stem)
        if name in out:
            raise RlcoreError(f"two input files map to the split {name!r}; rename one (its name picks the split)")
        out[name] = read_rows(path)
    return out
