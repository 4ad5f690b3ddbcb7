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
    """All rows of a parquet or jsonl file, through ``datasets`` (local files only, kept in memory)."""
    path = Path(path)
    if not path.is_file():
        raise RlcoreError(f"data file {str(path)!r} does not exist")
    fmt = file_format(path)
    if fmt == "json" and not path.read_bytes().strip():
        return []  # datasets cannot read an empty json file; callers say it is empty
    import datasets

    datasets.disable_progress_bars()
    try:
        if fmt == "parquet":
            ds = datasets.Dataset.from_parquet(str(path), keep_in_memory=True)
        else:
            ds = datasets.Dataset.from_json(str(path), keep_in_memory=True)
    except Exception as exc:  # noqa: BLE001 - a malformed file: say which, and why
        reason = str(exc).strip().splitlines()
        raise RlcoreError(
            f"cannot read data file {str(path)!r} as {fmt}: {type(exc).__name__}: {reason[-1] if reason else ''}"
        ) from None
    return ds.to_list()


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
