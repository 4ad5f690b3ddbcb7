"""Shared fixtures of rlcore's own test suite (rlcore's pytest plugin, rlcore.testing, adds
``tiny_model`` and the ``rlcore_*`` fixtures; shared helpers live in rlcore.testing.runs)."""

from __future__ import annotations

import pytest
from pydantic import Field

import rlcore
from rlcore.components import Component, Options
from rlcore.testing import isolated_registry


class ToyEngineOptions(Options):
    speed: int = Field(1, ge=1, le=10)


class GpuEngineOptions(Options):
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    tensor_parallel_size: int = Field(1, ge=1)


class GroupOptions(Options):
    norm_by_std: bool = True


class ClipOptions(Options):
    clip_ratio: float = Field(0.2, gt=0)


class ThresholdOptions(Options):
    threshold: float = 0.5
    mode: str = Field("strict", pattern="^(strict|flexible)$")


class ToyComponents:
    """Components with options, for manifest tests that must not depend on installed plugins."""

    @rlcore.hookimpl
    def rlcore_rollout_engines(self):
        return [
            Component("toy", "builtins:dict", ToyEngineOptions, "a toy engine"),
            Component("gpu_toy", "builtins:dict", GpuEngineOptions, "a toy engine with GPU options"),
        ]

    @rlcore.hookimpl
    def rlcore_advantage_estimators(self):
        return [
            Component("group", "builtins:dict", GroupOptions, "group baseline", needs={"groups"}),
            Component("valued", "builtins:dict", Options, "needs a critic", needs={"critic"}),
        ]

    @rlcore.hookimpl
    def rlcore_policy_losses(self):
        return [Component("clipped", "builtins:dict", ClipOptions, "a clipped loss")]

    @rlcore.hookimpl
    def rlcore_reward_functions(self):
        return [Component("match", "builtins:dict", ThresholdOptions, "a toy reward")]


@pytest.fixture
def toy_registry():
    registry = isolated_registry()
    registry.register(ToyComponents(), name="toy", distribution="rlcore-toy", version="9.9")
    return registry
