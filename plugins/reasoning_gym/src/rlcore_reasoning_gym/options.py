"""Manifest options of the ``reasoning_gym`` data source and reward.

The source's options are checked against reasoning-gym's own task table: an unknown task, an
option its configuration does not have, or a value its ``validate()`` refuses is a located error
at ``rlcore validate``, listing what is available. reasoning_gym is imported then (pure Python:
sympy, no torch), never when the plugin registers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from rlcore.components import Options
from rlcore.errors import RlcoreError, did_you_mean

# Options the source sets itself on every task's configuration.
_OWN = ("seed", "size")


def task_table() -> dict[str, tuple[type, type]]:
    """reasoning-gym's registered tasks: name -> (dataset class, configuration dataclass)."""
    try:
        import reasoning_gym  # noqa: F401 - importing registers every task
    except ImportError as exc:  # a dependency left out (a --no-deps install): one line, not a traceback
        raise RlcoreError(
            f"reasoning-gym cannot be imported ({exc}); install it with its dependencies: "
            "pip install rlcore-reasoning-gym (or pip install reasoning-gym==0.1.25)"
        ) from None
    from reasoning_gym.factory import DATASETS

    return DATASETS


def task_options(name: str) -> list[str]:
    _, config = task_table()[name]
    return [f.name for f in dataclasses.fields(config) if f.name not in _OWN]


def check_task(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The task's options, typed as its configuration declares ("3" -> 3); RlcoreError otherwise."""
    table = task_table()
    if name not in table:
        hint = did_you_mean(name, table)
        raise RlcoreError(
            f"unknown reasoning_gym task {name!r}"
            + (f"; did you mean {hint!r}?" if hint else "")
            + f"; available ({len(table)}): "
            + ", ".join(sorted(table))
        )
    _, config_cls = table[name]
    allowed = task_options(name)
    for key in options:
        if key in _OWN:
            raise RlcoreError(f"task {name!r}: {key!r} is an option of the source, not of one task")
        if key not in allowed:
            hint = did_you_mean(key, allowed)
            raise RlcoreError(
                f"task {name!r} has no option {key!r}"
                + (f"; did you mean {hint!r}?" if hint else "")
                + "; its options: "
                + (", ".join(allowed) or "none")
            )
    try:
        config = TypeAdapter(config_cls).validate_python({**options, "seed": 0, "size": 1})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise RlcoreError(f"task {name!r}: {problems}") from None
    try:
        if hasattr(config, "validate"):
            config.validate()
    except (AssertionError, ValueError, TypeError) as exc:
        raise RlcoreError(
            f"task {name!r}: its configuration is refused by reasoning_gym: {exc or type(exc).__name__}"
        ) from None
    return {key: getattr(config, key) for key in options}


class ReasoningGymSourceOptions(Options):
    """``reasoning_gym:TASK?size=N&seed=S&OPTION=...`` (one task; its own options as query keys),
    or a table with ``tasks = {NAME = {weight = W, OPTION = ...}, ...}`` for a mixture."""

    model_config = ConfigDict(extra="allow")

    task: str | None = Field(None, description="one task; the table's other keys are its options")
    tasks: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="a weighted mixture: task -> {weight = W, and the task's options}; rows are drawn in "
        "proportion to the weights",
    )
    size: int = Field(1000, ge=1, le=10_000_000, description="rows in all (a mixture shares them by weight)")
    seed: int = Field(0, ge=0, description="generation seed")
    split: Literal["train", "test"] | None = Field(
        None,
        description="which half of the question space (split by a hash of the question); default: train for "
        "data.train, test for data.val, so the two never share an item",
    )
    system_prompt: str = Field("", description="a system message before each question (none by default)")
    instruction: str = Field(
        "", description="appended to each question, e.g. 'Give only the answer.' (none by default)"
    )

    @model_validator(mode="after")
    def _tasks(self) -> ReasoningGymSourceOptions:
        extra = dict(self.model_extra or {})
        if self.task and self.tasks:
            raise RlcoreError("give task (one task) or tasks (a mixture), not both")
        if not self.task and not self.tasks:
            raise RlcoreError(
                "name a task (reasoning_gym:TASK) or a mixture (tasks = {NAME = {weight = 1}, ...})"
            )
        if self.task:
            mixture = {self.task: {"weight": 1.0, **extra}}
        else:
            if extra:
                raise RlcoreError(
                    f"unknown option(s) {', '.join(sorted(extra))}: with tasks = {{...}} each task's options go in "
                    "its own table"
                )
            mixture = self.tasks
        resolved: dict[str, dict[str, Any]] = {}
        for name, entry in mixture.items():
            if not isinstance(entry, dict):
                raise RlcoreError(f"tasks.{name}: expected a table {{weight = W, ...}}, got {entry!r}")
            entry = dict(entry)
            try:
                weight = float(entry.pop("weight", 1.0))
            except (TypeError, ValueError):
                raise RlcoreError(f"task {name!r}: weight must be a number") from None
            if weight <= 0:
                raise RlcoreError(f"task {name!r}: weight must be above 0, got {weight:g}")
            resolved[name] = {"weight": weight, **check_task(name, entry)}
        # Normalised: one table of tasks, options typed; the extra keys were the single task's.
        object.__setattr__(self, "tasks", resolved)
        object.__setattr__(self, "task", None)
        if self.__pydantic_extra__:
            self.__pydantic_extra__.clear()
        return self


class ReasoningGymRewardOptions(Options):
    answer: Literal["tag", "full", "last_line"] = Field(
        "tag",
        description="what of the response is the answer: the last <answer>...</answer> (tag; none scores 0), the "
        "whole response stripped (full), or its last non-empty line (last_line)",
    )
    tag: str = Field(
        "answer", pattern=r"^[A-Za-z_][A-Za-z0-9_\-]*$", description='the tag for answer = "tag"'
    )
