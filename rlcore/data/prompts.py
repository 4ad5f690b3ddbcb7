"""Turning a dataset (verl's row format, or a synthetic task) into tokenized prompts.

A row: ``prompt`` (a list of chat messages, or a plain string: one user message),
``data_source``, ``reward_model: {ground_truth, style}`` (a top-level ``ground_truth`` also
works), ``extra_info``. Prompts are tokenized with the tokenizer's chat template and the
generation prompt, so the model answers as the assistant. The tokenizer is passed in: nothing
here imports torch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from loguru import logger

from rlcore.data import sources, synthetic
from rlcore.data.io import EXTENSIONS, read_rows
from rlcore.data.rows import row_problem
from rlcore.errors import RlcoreError
from rlcore.interfaces import Prompt


@dataclass
class PromptSet:
    """The usable prompts of one dataset. ``total``: rows in the source; ``filtered_too_long``:
    rows dropped for exceeding ``max_prompt_tokens``; ``source``: the file or synthetic spec."""

    prompts: list[Prompt]
    filtered_too_long: int = 0
    total: int = 0
    source: str = ""
    stats: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.prompts)

    def __iter__(self) -> Iterator[Prompt]:
        return iter(self.prompts)

    def __getitem__(self, index: int) -> Prompt:
        return self.prompts[index]


def resolve(spec: str, base_dir: str | Path | None = None) -> Path:
    path = Path(spec).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    return path


def check_data_spec(spec: str | dict[str, Any], base_dir: str | Path | None = None, registry: Any = None) -> str | None:
    """A problem with a data spec, or None. Cheap: no torch, no datasets (for ``rlcore validate``).
    A spec is a file, or names a data source (``synthetic:addition``, a ``{source = ...}`` table)."""
    if isinstance(spec, str) and not spec.strip():
        return f"expected {SPEC_FORMS}"
    if not isinstance(spec, (str, dict)):
        return f"expected {SPEC_FORMS}, got {type(spec).__name__}"
    try:
        parsed = sources.source_spec(spec)
    except RlcoreError as exc:
        return str(exc)
    if parsed is not None and not (isinstance(spec, str) and resolve(spec, base_dir).exists()):
        return sources.check_source(parsed, registry, base_dir)
    path = resolve(spec, base_dir)
    if path.is_dir():
        return f"data file {str(path)!r} is a directory; expected a parquet or jsonl file in it, or synthetic:<task>"
    if path.suffix.lower() not in EXTENSIONS:
        return (
            f"data file {str(path)!r} has the unknown extension {path.suffix or '(none)'!r}; expected one of "
            f"{', '.join(sorted(EXTENSIONS))}, or a data source such as synthetic:<task> with a task among "
            f"{', '.join(sorted(synthetic.TASKS))}"
        )
    if not path.is_file():
        return f"data file {str(path)!r} does not exist"
    return None


SPEC_FORMS = "a parquet or jsonl file, or a data source: synthetic:<task>, reasoning_gym:<task>, a [data.train] table with source = ..."


def read_source(spec: str | dict[str, Any], base_dir: str | Path | None = None, *, role: str = "train",
                registry: Any = None, context: Any = None) -> tuple[list[dict[str, Any]], str]:
    """The rows of a data spec, and the name to report it by. ``role`` ("train" or "val") is the
    default split of a source that has splits."""
    parsed = sources.source_spec(spec)
    if parsed is not None and not (isinstance(spec, str) and resolve(spec, base_dir).exists()):
        return sources.read_rows(parsed, role, registry=registry, context=context, base_dir=base_dir), parsed.written
    problem = check_data_spec(spec, base_dir)
    path = resolve(spec, base_dir)
    if problem:
        raise RlcoreError(problem)
    return read_rows(path), str(path)


def load_prompts(
    spec: str | dict[str, Any],
    *,
    role: str = "train",
    registry: Any = None,
    context: Any = None,
    tokenizer: Any,
    max_prompt_tokens: int,
    prompt_key: str = "prompt",
    base_dir: str | Path | None = None,
    limit: int | None = None,
    shuffle_seed: int | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> PromptSet:
    """Read, tokenize and length-filter a dataset. ``limit`` keeps at most that many prompts (after
    shuffling with ``shuffle_seed``, when given); ``Prompt.index`` is the row's position in the source.
    ``chat_template_kwargs`` go to the chat template (``enable_thinking = false`` for Qwen3).
    ``role``: "train" or "val", the default split of a data source with splits; ``registry`` (where
    data sources are looked up; default: the installed ones) and ``context`` (the source's
    :class:`rlcore.interfaces.BuildContext`) matter only for data sources."""
    rows, source = read_source(spec, base_dir, role=role, registry=registry, context=context)
    if not rows:
        raise RlcoreError(f"data {source!r} is empty")
    if prompt_key not in rows[0]:
        columns = ", ".join(sorted(rows[0])) or "(none)"
        raise RlcoreError(
            f"data {source!r} has no {prompt_key!r} column (set data.prompt_key); its columns: {columns}"
        )
    order = list(range(len(rows)))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)
    encoder = _Encoder(tokenizer, chat_template_kwargs)
    prompts: list[Prompt] = []
    too_long: list[int] = []
    longest, shortest = 0, None
    for index in order:
        if limit is not None and len(prompts) >= limit:
            break
        row = rows[index]
        problem = row_problem(row, prompt_key)
        if problem:
            raise RlcoreError(f"data {source!r}: row {index}: {problem}")
        messages = _messages(row.get(prompt_key), prompt_key, index, source)
        token_ids = encoder(messages)
        n = len(token_ids)
        shortest = n if shortest is None else min(shortest, n)
        if n > max_prompt_tokens:
            too_long.append(index)
            longest = max(longest, n)
            continue
        prompts.append(
            Prompt(
                token_ids=token_ids,
                messages=messages,
                data_source=str(row.get("data_source") or ""),
                ground_truth=_ground_truth(row),
                extra_info=dict(row.get("extra_info") or {}),
                index=index,
            )
        )
    if not prompts:
        raise RlcoreError(
            f"every prompt of {source!r} is longer than data.max_prompt_tokens = {max_prompt_tokens} "
            f"(the shortest has {shortest} tokens); raise max_prompt_tokens"
        )
    if too_long:
        rows_named = ", ".join(str(i) for i in sorted(too_long)[:5]) + (", ..." if len(too_long) > 5 else "")
        logger.warning(
            "{}: {} prompt(s) longer than max_prompt_tokens = {} were left out (rows {}; the longest has {} tokens)",
            source,
            len(too_long),
            max_prompt_tokens,
            rows_named,
            longest,
        )
    lengths = [len(p.token_ids) for p in prompts]
    stats = {"prompt_tokens_mean": sum(lengths) / len(lengths), "prompt_tokens_max": float(max(lengths))}
    return PromptSet(prompts, filtered_too_long=len(too_long), total=len(rows), source=source, stats=stats)


def _messages(value: Any, key: str, index: int, source: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        if not value.strip():
            raise RlcoreError(f"data {source!r}: row {index} has an empty {key!r}")
        return [{"role": "user", "content": value}]
    if hasattr(value, "tolist"):  # a numpy array from a parquet reader
        value = value.tolist()
    if not isinstance(value, list) or not value:
        what = "no" if value is None else f"an unusable ({type(value).__name__})"
        raise RlcoreError(
            f"data {source!r}: row {index} has {what} {key!r}; expected a list of chat messages "
            "({'role': ..., 'content': ...}) or a string"
        )
    messages = []
    for m in value:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise RlcoreError(
                f"data {source!r}: row {index}: each message of {key!r} needs 'role' and 'content', got {m!r}"
            )
        # Columnar formats give every message every key seen in the column; drop the empty ones.
        messages.append({k: v for k, v in m.items() if v is not None})
    return messages


def _ground_truth(row: dict[str, Any]) -> Any:
    reward_model = row.get("reward_model")
    if isinstance(reward_model, dict) and reward_model.get("ground_truth") is not None:
        return reward_model["ground_truth"]
    return row.get("ground_truth")


class _Encoder:
    """Chat template with the generation prompt; a tokenizer without a template (a base model)
    gets the messages' contents joined by newlines, with a warning."""

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.templated = bool(getattr(tokenizer, "chat_template", None))
        if not self.templated:
            logger.warning("the tokenizer has no chat template: prompts are the messages' text joined by newlines")

    def __call__(self, messages: list[dict[str, Any]]) -> list[int]:
        if self.templated:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                      **self.template_kwargs)
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        text = "\n".join(str(m.get("content", "")) for m in messages)
        return list(self.tokenizer(text)["input_ids"])
