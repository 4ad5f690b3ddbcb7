"""Manifest options of the agent plugin's components (kept light: pydantic only)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlcore.components import Options


class ToolLoopOptions(Options):
    max_turns: int = Field(4, ge=1, le=256, description="assistant turns per trajectory (tool results come between them)")
    tools: list[str] | None = Field(None, description="names of the [tools.*] to offer; default: all configured tools")
    parser: Literal["auto", "hermes", "json"] = Field(
        "auto", description="tool-call format: hermes <tool_call> tags, OpenAI JSON, or auto (both)"
    )
    tool_timeout_s: float = Field(30.0, gt=0, description="a tool call running longer returns an error to the model")
    max_tool_response_chars: int = Field(4000, ge=16, description="longer tool results are cut (marked) before the model sees them")
    max_tokens_per_turn: int | None = Field(None, ge=1, description="cap of one assistant turn (the whole response is capped by data.max_response_tokens)")
    max_calls_per_turn: int = Field(8, ge=1, description="further calls in one turn get an error message")
    max_concurrent_calls: int = Field(64, ge=1, description="tool calls running at once across the batch")
    tools_in_prompt: bool = Field(
        True,
        description="render the prompt again with the tool schemas (through the chat template, or a system message when the template ignores tools)",
    )


class PythonToolOptions(Options):
    sandbox_url: str | None = Field(None, description="run code through an `rlcore sandbox serve` (or sandbox-fusion) server at this URL instead of locally")
    timeout_s: float = Field(10.0, gt=0, le=3600, description="wall-clock limit per execution")
    cpu_time_s: int = Field(10, ge=1, le=3600, description="CPU-time limit per execution")
    memory_mb: int = Field(1024, ge=64, description="address-space limit per execution")
    max_processes: int = Field(16, ge=1, le=4096, description="processes (and threads) the code may run at once")
    max_output_bytes: int = Field(1_000_000, ge=1024, description="stdout+stderr captured before the program is stopped")
    max_output_chars: int = Field(4000, ge=64, description="characters of output returned to the model (the middle is cut)")
    max_file_mb: int = Field(64, ge=1, description="largest file the code may write")
    max_concurrency: int = Field(32, ge=1, le=128, description="executions running at once in this process")
    python: str | None = Field(None, description="interpreter that runs the code (default: the one running rlcore)")
    isolation: Literal["auto", "bwrap", "none"] = Field(
        "auto", description="bwrap: bubblewrap namespaces (required); none: rlimits only; auto: bwrap when installed"
    )
    description: str | None = Field(None, description="tool description shown to the model")


class FunctionToolOptions(Options):
    function: str = Field(..., min_length=3, description='"python:file.py:func" or "package.module:func"')
    name: str | None = Field(None, description="tool name shown to the model (default: the [tools.NAME] or function name)")
    description: str | None = Field(None, description="default: the function's docstring")
