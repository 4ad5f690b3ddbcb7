"""Manifest options of the ``verifiers`` data source, reward and agent loop.

The source's options are checked against the environment itself at ``rlcore validate``: the
environment's code is imported (verifiers is pure Python; no torch), its taskset's config
validates the extra keys, its Env config validates ``env_options``, and what rlcore cannot play
(a second seat, a harness program, sandbox hooks, judges, interception hooks) is refused with the
reason. Errors name what is available.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, model_validator

from rlcore.components import Options
from rlcore.errors import RlcoreError


def _manifest_dir(info: ValidationInfo) -> str | None:
    context = info.context if isinstance(info.context, dict) else {}
    value = context.get("manifest_dir")
    return str(value) if value else None


class VerifiersSourceOptions(Options):
    """``verifiers:ENV?limit=N&OPTION=...``, or a ``[data.train]`` table with ``source =
    "verifiers"``; keys that are not the source's own are the taskset's config options (as are
    those of ``taskset_options``)."""

    model_config = ConfigDict(extra="allow")

    env: str | None = Field(
        None,
        description="the environment: PACKAGE, PACKAGE:NAME, or python:FILE.py[:NAME] (relative to the manifest)",
    )
    env_options: dict[str, Any] = Field(
        default_factory=dict,
        description="the Env's own config (its seat, e.g. {agent = {max_turns = 4}}, and its knobs), checked by it",
    )
    skip: int = Field(0, ge=0, description="tasks skipped from the start of the taskset")
    limit: int | None = Field(
        None, ge=1, description="at most this many tasks (needed for an infinite taskset)"
    )
    shuffle: bool = Field(False, description="shuffle the tasks (with shuffle_seed) before skip and limit")
    shuffle_seed: int = Field(0, ge=0, description="the shuffle's seed")
    # After validation, env is in canonical form (a file made absolute) and taskset_options holds
    # the extra keys too, typed. Rows carry both, so the reward and the loop load the same
    # environment in any process.
    taskset_options: dict[str, Any] = Field(
        default_factory=dict,
        description="the taskset's options; the table's other keys are added to them (give an option here when "
        "its name is one of the source's own, e.g. a taskset's own limit)",
    )

    @model_validator(mode="after")
    def _load(self, info: ValidationInfo) -> VerifiersSourceOptions:
        from rlcore_verifiers import envs

        extra = dict(self.model_extra or {})
        taskset_options = {**self.taskset_options, **extra}
        spec = self.env
        if not spec:
            raise RlcoreError(
                "name an environment: verifiers:PACKAGE, verifiers:PACKAGE:NAME or verifiers:python:FILE.py[:NAME]"
            )
        loaded = envs.load(spec, taskset_options, self.env_options, _manifest_dir(info))
        object.__setattr__(self, "env", loaded.classes.ref.spec)
        typed = loaded.taskset_config.model_dump(mode="json", include=set(taskset_options))
        object.__setattr__(self, "taskset_options", typed)
        if self.__pydantic_extra__:
            self.__pydantic_extra__.clear()
        if loaded.classes.taskset.INFINITE and self.limit is None:
            raise RlcoreError(f"taskset {loaded.classes.taskset.__name__} is infinite: give limit = N")
        return self


class VerifiersRewardOptions(Options):
    missing: Literal["error", "zero"] = Field(
        "error",
        description="a row not from the verifiers source: refuse the data (error) or score it 0 (zero); route "
        "other sources to other rewards with [reward.routes]",
    )


class VerifiersLoopOptions(Options):
    max_turns: int | None = Field(
        None,
        ge=1,
        le=256,
        description="model turns per episode; default: the seat's own max_turns, else 8",
    )
    max_tokens_per_turn: int | None = Field(
        None,
        ge=1,
        description="cap of one model turn (the whole episode is capped by data.max_response_tokens)",
    )
    parser: Literal["auto", "hermes", "json"] = Field(
        "auto",
        description="how tool calls are read from the model's text: hermes <tool_call> tags, OpenAI JSON, or both",
    )
    tool_timeout_s: float = Field(
        30.0, gt=0, description="a tool call running longer returns an error to the model"
    )
    max_tool_response_chars: int = Field(
        4000, ge=16, description="longer tool results are cut (marked) before the model sees them"
    )
    max_calls_per_turn: int = Field(8, ge=1, description="further calls in one turn get an error message")
    episode_timeout_s: float = Field(
        600.0, gt=0, description="an episode (the env's run) running longer is ended"
    )
