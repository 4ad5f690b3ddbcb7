"""rlcore's builtin components, registered through the same hooks as any third-party plugin."""

from __future__ import annotations

from rlcore.builtin.options import (
    ConsoleOptions,
    JsonlOptions,
    LocalLauncherOptions,
    PPOClipOptions,
    PythonRewardOptions,
    SingleTurnOptions,
)
from rlcore.components import Command, Component
from rlcore.hookspecs import hookimpl


@hookimpl
def rlcore_launchers():
    return [
        Component(
            name="local",
            factory="rlcore.builtin.local:build",
            options=LocalLauncherOptions,
            description="runs the driver in this process",
        )
    ]


@hookimpl
def rlcore_metrics_sinks():
    return [
        Component(
            "console",
            "rlcore.builtin.loggers:console",
            ConsoleOptions,
            "a live rich view with a progress bar",
        ),
        Component(
            "jsonl", "rlcore.builtin.loggers:jsonl", JsonlOptions, "one JSON object per step in metrics.jsonl"
        ),
    ]


@hookimpl
def rlcore_agent_loops():
    return [
        Component(
            name="single_turn",
            factory="rlcore.builtin.single_turn:build",
            options=SingleTurnOptions,
            description="one generation per sample; the default",
        )
    ]


@hookimpl
def rlcore_policy_losses():
    return [
        Component(
            name="ppo_clip",
            factory="rlcore.algorithms.losses:build_ppo_clip",
            options=PPOClipOptions,
            description="PPO clipped surrogate with clip-higher and dual-clip",
        )
    ]


@hookimpl
def rlcore_reward_functions():
    return [
        Component(
            name="python",
            factory="rlcore.builtin.python_reward:build_python_reward",
            options=PythonRewardOptions,
            target_option="target",
            description='a user function named as "python:file.py:function"',
        )
    ]


@hookimpl
def rlcore_data_sources():
    from rlcore.data.synthetic import SyntheticSourceOptions  # pure Python and pydantic

    return [
        Component(
            name="synthetic",
            factory="rlcore.data.synthetic:build_source",
            options=SyntheticSourceOptions,
            target_option="task",
            description="synthetic tasks with checkable answers (addition, arithmetic)",
        )
    ]


@hookimpl
def rlcore_commands():
    # Named by strings: nothing is imported until the command is invoked (or asked for its help).
    return [
        Command(
            name="data",
            help="prepare datasets (GSM8K conversion, synthetic tasks)",
            configure="rlcore.data.cli:configure",
            run="rlcore.data.cli:run",
        ),
        Command(
            name="eval",
            help="score a checkpoint or an exported model on validation sets: mean reward and pass@k per data source",
            configure="rlcore.evaluation:configure",
            run="rlcore.evaluation:run",
        ),
        Command(
            name="plot",
            help="plot runs' reward, validation and response-length curves into a PNG",
            configure="rlcore.plotting:configure",
            run="rlcore.plotting:run",
        ),
    ]
