"""Options of the sinks (``[loggers.tensorboard]``, ``[loggers.wandb]``); importing them is light."""

from __future__ import annotations

from pydantic import Field

from rlcore.components import Options


class TensorboardOptions(Options):
    subdir: str = Field("tensorboard", description="the event files' directory inside the run directory")


class WandbOptions(Options):
    project: str = "rlcore"
    entity: str | None = None
    mode: str = Field("offline", pattern="^(online|offline|disabled)$")
    tags: list[str] = Field(default_factory=list)
