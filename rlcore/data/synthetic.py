"""Synthetic tasks with checkable answers, for smoke tests, tutorials and CPU-sized runs.

``addition``: "What is 3 + 5? Reply with only the number." (reward: ``gsm8k`` with
``method = "numeric"``, or ``exact_match``). ``arithmetic``: multi-step integer expressions
whose answer goes in ``\\boxed{}`` (reward: ``math``), e.g. for tool-use training.

The train and test splits never share a question: which split a question belongs to is decided
by a hash of the question itself (one in five goes to test), independent of the seed and size,
so any train set and any test set are disjoint. Only pure Python and pydantic are imported here,
so ``rlcore validate`` can check a ``synthetic:`` spec without the training stack.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from hashlib import sha1
from pathlib import Path
from typing import Any, Callable, Literal
from urllib.parse import parse_qsl

from pydantic import ConfigDict, Field, ValidationError, model_validator

from rlcore.components import Options
from rlcore.errors import RlcoreError, did_you_mean, suggest

PREFIX = "synthetic:"
TEST_EVERY = 5  # one question in TEST_EVERY belongs to the test split
_ENUMERATE_LIMIT = 200_000  # spaces up to this size are listed; larger ones sampled


class TaskParams(Options):
    size: int = Field(1000, ge=1, le=10_000_000, description="number of rows")
    seed: int = Field(0, ge=0, description="random seed")
    split: Literal["train", "test"] = Field("train", description="train and test never share a question")


class AdditionParams(TaskParams):
    digits: int = Field(1, ge=1, le=9, description="digits of each operand (1 means 0-9)")
    max_digits: int | None = Field(
        None, ge=1, le=9,
        description="mix sizes: each operand gets from digits to max_digits digits, each count equally often "
        "(digits=1&max_digits=2: 3 + 5, 3 + 47, 62 + 18), so a run has easy and hard questions to learn from",
    )

    @model_validator(mode="after")
    def _digit_range(self):
        if self.max_digits is not None and self.max_digits < self.digits:
            raise ValueError(f"max_digits ({self.max_digits}) must be at least digits ({self.digits})")
        return self


class ArithmeticParams(TaskParams):
    steps: int = Field(2, ge=1, le=6, description="number of operations in the expression")
    max_operand: int = Field(50, ge=2, le=1_000_000, description="operands are drawn from 1..max_operand")


def _in_split(question: str, split: str) -> bool:
    is_test = int(sha1(question.encode()).hexdigest()[:8], 16) % TEST_EVERY == 0
    return is_test == (split == "test")


def _row(task: str, text: str, answer: int, index: int, split: str, **info: Any) -> dict[str, Any]:
    return {
        "data_source": f"synthetic/{task}",
        "prompt": [{"role": "user", "content": text}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index, **info},
    }


def _addition_question(a: int, b: int) -> str:
    return f"What is {a} + {b}? Reply with only the number."


def _operand_range(digits: int) -> tuple[int, int]:
    return (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1


def addition(p: AdditionParams) -> list[dict[str, Any]]:
    rng = random.Random(p.seed)
    if p.max_digits is not None and p.max_digits > p.digits:
        def operand() -> int:
            return rng.randint(*_operand_range(rng.randint(p.digits, p.max_digits)))

        pairs = _draw_unique(lambda: (operand(), operand()), lambda ab: _addition_question(*ab), p, rng)
        return [
            _row("addition", _addition_question(a, b), a + b, i, p.split, a=a, b=b) for i, (a, b) in enumerate(pairs)
        ]
    lo, hi = (0 if p.digits == 1 else 10 ** (p.digits - 1)), 10**p.digits - 1
    span = hi - lo + 1
    if span * span <= _ENUMERATE_LIMIT:
        pool = [(a, b) for a in range(lo, hi + 1) for b in range(lo, hi + 1) if _in_split(_addition_question(a, b), p.split)]
        pairs = _draw_from_pool(pool, p.size, rng)
    else:
        pairs = _draw_unique(lambda: (rng.randint(lo, hi), rng.randint(lo, hi)), lambda ab: _addition_question(*ab), p, rng)
    return [
        _row("addition", _addition_question(a, b), a + b, i, p.split, a=a, b=b) for i, (a, b) in enumerate(pairs)
    ]


def _draw_from_pool(pool: list, size: int, rng: random.Random) -> list:
    """``size`` items from ``pool``: without repeats while the pool lasts, then in fresh shuffles."""
    out: list = []
    while len(out) < size:
        batch = pool[:]
        rng.shuffle(batch)
        out.extend(batch[: size - len(out)])
    return out


def _draw_unique(draw: Callable[[], Any], question: Callable[[Any], str], p: TaskParams, rng: random.Random) -> list:
    """Draw until ``size`` distinct questions of the split are found (repeats allowed only when the
    space seems exhausted)."""
    seen: set[str] = set()
    out: list = []
    attempts, budget = 0, 50 * p.size + 1000
    while len(out) < p.size:
        item = draw()
        text = question(item)
        attempts += 1
        if not _in_split(text, p.split):
            continue
        if text in seen and attempts < budget:
            continue
        seen.add(text)
        out.append(item)
    return out


_OPS = ("+", "-", "*")


def _expression(rng: random.Random, steps: int, max_operand: int) -> tuple[str, int]:
    text, value = str(first := rng.randint(1, max_operand)), first
    for step in range(steps):
        op, m = rng.choice(_OPS), rng.randint(1, max_operand)
        left = f"({text})" if step > 0 else text
        if rng.random() < 0.5:
            text, value = f"{left} {op} {m}", _apply(op, value, m)
        else:
            text, value = f"{m} {op} {left}", _apply(op, m, value)
    return text, value


def _apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _arithmetic_question(expression: str) -> str:
    return f"Compute {expression}. Put the final answer in \\boxed{{}}."


def arithmetic(p: ArithmeticParams) -> list[dict[str, Any]]:
    rng = random.Random(p.seed)
    drawn = _draw_unique(
        lambda: _expression(rng, p.steps, p.max_operand), lambda ev: _arithmetic_question(ev[0]), p, rng
    )
    return [
        _row("arithmetic", _arithmetic_question(text), value, i, p.split, expression=text)
        for i, (text, value) in enumerate(drawn)
    ]


@dataclass(frozen=True)
class Task:
    params: type[TaskParams]
    generate: Callable[[Any], list[dict[str, Any]]]
    description: str


TASKS: dict[str, Task] = {
    "addition": Task(AdditionParams, addition, "What is a + b? Reply with only the number."),
    "arithmetic": Task(ArithmeticParams, arithmetic, "multi-step integer expressions, answer in \\boxed{}"),
}


def parse_spec(spec: str) -> tuple[str, TaskParams]:
    """``synthetic:<task>?size=N&seed=S&...`` -> (task name, validated parameters)."""
    body = spec.removeprefix(PREFIX)
    name, _, query = body.partition("?")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise RlcoreError(f"{spec!r}: parameters must look like ?size=100&seed=1") from None
    return name, task_params(name, dict(pairs), where=spec)


def task_params(name: str, params: dict[str, Any], where: str = "") -> TaskParams:
    """Validate a task's parameters; ``where`` (e.g. the spec) prefixes the error message."""
    prefix = f"{where}: " if where else ""
    task = TASKS.get(name)
    if task is None:
        hint = did_you_mean(name, TASKS)
        raise RlcoreError(
            f"{prefix}unknown synthetic task {name!r}"
            + suggest(hint)
            + "; available: "
            + ", ".join(sorted(TASKS))
        )
    try:
        return task.params.model_validate(params)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or 'parameters'}: {e['msg']}" for e in exc.errors()
        )
        allowed = ", ".join(task.params.model_fields)
        raise RlcoreError(f"{prefix or f'synthetic task {name!r}: '}{problems} (parameters of {name!r}: {allowed})") from None


def generate(task: str, **params: Any) -> list[dict[str, Any]]:
    """Rows of ``task`` in verl's format."""
    validated = task_params(task, params)
    return TASKS[task].generate(validated)


def write_synthetic(task: str, path: str | Path, **params: Any) -> Path:
    """Write ``task``'s rows as verl-format parquet; return the path."""
    from rlcore.data.io import write_parquet

    return write_parquet(generate(task, **params), path)


class SyntheticSourceOptions(Options):
    """``synthetic:TASK?size=N&...``: the task, and its parameters as the other keys."""

    model_config = ConfigDict(extra="allow")

    task: str = Field(..., description="one of the synthetic tasks: " + ", ".join(sorted(TASKS)))

    @model_validator(mode="after")
    def _task_parameters(self) -> "SyntheticSourceOptions":
        task_params(self.task, dict(self.model_extra or {}))  # raises a located RlcoreError
        return self


@dataclass(frozen=True)
class SyntheticSource:
    """The builtin data source ``synthetic``; its ``split`` parameter decides, not the role."""

    task: str
    params: dict[str, Any]

    def rows(self, role: str) -> list[dict[str, Any]]:
        return generate(self.task, **self.params)


def build_source(options: SyntheticSourceOptions, context: Any = None) -> SyntheticSource:
    return SyntheticSource(options.task, dict(options.model_extra or {}))
