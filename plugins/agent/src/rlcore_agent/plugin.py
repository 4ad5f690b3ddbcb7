"""Registration only: nothing heavy is imported here (no torch, transformers, fastapi)."""

from __future__ import annotations

import rlcore
from rlcore.components import Command, Component
from rlcore_agent.options import ClassToolOptions, FunctionToolOptions, PythonToolOptions, ToolLoopOptions


@rlcore.hookimpl
def rlcore_agent_loops():
    return [
        Component(
            name="tool",
            factory="rlcore_agent.loop:build",
            options=ToolLoopOptions,
            description="multi-turn: generate, run the tools the model calls, feed results back, repeat",
            needs={"tokenizer"},
        )
    ]


@rlcore.hookimpl
def rlcore_tools():
    return [
        Component(
            name="python",
            factory="rlcore_agent.python_tool:build",
            options=PythonToolOptions,
            description="runs model-written Python in a sandbox (bubblewrap, rlimits, no network)",
        ),
        Component(
            name="function",
            factory="rlcore_agent.function_tool:build",
            selected_by="function",
            options=FunctionToolOptions,
            description='a plain typed Python function, named by [tools.NAME] function = "python:file.py:func"',
        ),
        Component(
            name="class",
            factory="rlcore_agent.class_tool:build",
            selected_by="class",
            options=ClassToolOptions,
            description='a tool class, named by [tools.NAME] class = "python:file.py:Class" (other keys: its constructor\'s arguments)',
        ),
    ]


@rlcore.hookimpl
def rlcore_commands():
    from rlcore_agent.sandbox.cli import configure

    return [
        Command(
            name="sandbox",
            help="run the code sandbox as an HTTP service (`rlcore sandbox serve`)",
            configure=configure,
            run="rlcore_agent.sandbox.cli:run",
        )
    ]
