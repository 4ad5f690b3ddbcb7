"""Shared helpers of rlcore's own test suite (importable: tests/ is on pytest's pythonpath)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pydantic import Field

import rlcore
from rlcore.components import Component, Options

ROOT = Path(__file__).resolve().parent.parent


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


VALID = """\
[run]
name = "t"

[model]
path = "org/model"

[data]
train = "synthetic:addition"

[rollout]
engine = "toy"
samples_per_prompt = 2

[reward]
function = "match"

[algorithm]
advantage = "group"
policy_loss = "clipped"

[trainer]
steps = 3
"""


def run_cli(*args: str, env: dict | None = None, cwd: str | Path | None = None, timeout: float = 120):
    """Run ``python -m rlcore`` in a subprocess; returns the CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "rlcore", *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=timeout
    )
