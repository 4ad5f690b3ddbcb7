"""What a data row must hold, checked field by field, so a bad row is named (file, row, field)
before training rather than failing deep inside it or, worse, scoring 0 without a word.

The same check serves ``rlcore validate`` (on a sample of the rows, read with pyarrow or the json
module: no torch, no datasets) and the loader (on every row). What a ground truth must be is
the reward's business (its ``check_data``), not this module's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VALIDATE_SAMPLE = 2000  # rows `rlcore validate` checks per data file (the first ones)


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _tolist(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def row_problem(row: Any, prompt_key: str = "prompt") -> str | None:
    """What is wrong with one row (naming the field and what was expected), or None."""
    if not isinstance(row, dict):
        return f"expected an object (a row), got {_type(row)}"
    if prompt_key not in row or row[prompt_key] is None:
        return f"field {prompt_key!r} is missing; expected a list of chat messages or a string"
    prompt = _tolist(row[prompt_key])
    if isinstance(prompt, str):
        if not prompt.strip():
            return f"field {prompt_key!r} is empty"
    elif isinstance(prompt, list):
        if not prompt:
            return f"field {prompt_key!r} is an empty list; expected at least one chat message"
        for i, message in enumerate(prompt):
            problem = _message_problem(message)
            if problem:
                return f"field {prompt_key}[{i}]: {problem}"
    else:
        return f"field {prompt_key!r} is {_type(prompt)}; expected a list of chat messages or a string"
    source = row.get("data_source")
    if source is not None and not isinstance(source, str):
        return f"field 'data_source' is {_type(source)} ({source!r}); expected a string"
    for name in ("extra_info", "reward_model"):
        value = row.get(name)
        if value is not None and not isinstance(value, dict):
            return f"field {name!r} is {_type(value)} ({value!r}); expected an object (a mapping) or nothing"
    return None


def _message_problem(message: Any) -> str | None:
    if not isinstance(message, dict):
        return f"a chat message must be an object with 'role' and 'content', got {_type(message)}"
    if "role" not in message or "content" not in message:
        return f"a chat message needs 'role' and 'content', got {message!r}"[:300]
    role = message.get("role")
    if not isinstance(role, str) or not role.strip():
        return f"'role' is {_type(role) if not isinstance(role, str) else 'empty'}; expected a string such as 'user'"
    content = _tolist(message.get("content"))
    if isinstance(content, str):
        return None
    if content is None and message.get("tool_calls"):  # an assistant turn that only calls tools
        return None
    if isinstance(content, list) and all(isinstance(part, dict) for part in content):  # content parts
        return None
    return f"'content' is {_type(content)}; expected a string (or a list of content parts)"


def sample_rows(path: Path, limit: int = VALIDATE_SAMPLE) -> tuple[list[Any], str]:
    """The first ``limit`` rows of a parquet or JSON file, and how each is named ("row N" for
    parquet and JSON arrays, "line N" for JSON lines), cheaply. Raises ``ValueError`` (with the
    reason) for a file that cannot be read."""
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq  # ImportError: see check_sample

        try:
            file = pq.ParquetFile(path)
            batch = next(file.iter_batches(batch_size=limit), None)
        except Exception as exc:  # noqa: BLE001 - a malformed file: the reason is what matters
            raise ValueError(f"cannot read it as parquet: {type(exc).__name__}: {exc}") from None
        return ([] if batch is None else batch.to_pylist()), "row"
    import json

    with open(path, "rb") as f:
        head = f.read(4096).lstrip()
        f.seek(0)
        if head.startswith(b"["):
            try:
                rows = json.loads(f.read().decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ValueError(f"not valid JSON: {exc}") from None
            if not isinstance(rows, list):
                raise ValueError("expected JSON lines or an array of objects")
            return rows[:limit], "row"
        rows = []
        for number, line in enumerate(f, start=1):
            if len(rows) >= limit:
                break
            if not line.strip():
                continue
            try:
                rows.append((number, json.loads(line.decode("utf-8"))))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ValueError(f"line {number}: not valid JSON: {exc}") from None
        return rows, "line"


def check_sample(path: Path, prompt_key: str = "prompt", limit: int = VALIDATE_SAMPLE) -> str | None:
    """The first problem among the first ``limit`` rows of a data file (naming the file, the row
    or line, and the field), or None. Parquet rows are not checked where pyarrow is missing (the
    core installed without ``[train]``); the loader still checks every row."""
    try:
        rows, unit = sample_rows(path, limit)
    except ImportError:  # a bare core (a launcher's machine): parquet is read where the run trains
        return None
    except (OSError, ValueError) as exc:
        return f"data file {str(path)!r}: {exc}"
    if not rows:
        return f"data file {str(path)!r} holds no rows"
    for index, row in enumerate(rows):
        number, row = row if unit == "line" else (index, row)
        problem = row_problem(row, prompt_key)
        if problem:
            return f"data file {str(path)!r}, {unit} {number}: {problem}"
    return None
