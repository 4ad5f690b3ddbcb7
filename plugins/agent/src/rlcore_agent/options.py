"""Manifest options of the agent plugin's components (kept light: pydantic only)."""

from __future__ import annotations

import shutil
from typing import Any, Literal

from loguru import logger
from pydantic import ConfigDict, Field, ValidationInfo, create_model, field_validator, model_validator
from pydantic_core import PydanticCustomError

from rlcore.components import Options


def _manifest_dir(info: ValidationInfo) -> str | None:
    """The manifest's directory, which the manifest loader passes as validation context."""
    return (info.context or {}).get("manifest_dir") if isinstance(info.context, dict) else None


def _problem(message: str) -> PydanticCustomError:
    """A validation error whose message the manifest loader prints as it is (located at the key)."""
    return PydanticCustomError("rlcore_agent", "{message}", {"message": message})


class ToolLoopOptions(Options):
    max_turns: int = Field(
        4, ge=1, le=256, description="assistant turns per trajectory (tool results come between them)"
    )
    tools: list[str] | None = Field(
        None, description="names of the [tools.*] to offer; default: all configured tools"
    )
    parser: Literal["auto", "hermes", "json"] = Field(
        "auto", description="tool-call format: hermes <tool_call> tags, OpenAI JSON, or auto (both)"
    )
    tool_timeout_s: float = Field(
        30.0,
        gt=0,
        description="a tool call running longer returns an error to the model (waiting for a tool's free slot, "
        "e.g. the python tool's max_concurrency, does not count)",
    )
    max_tool_response_chars: int = Field(
        4000, ge=16, description="longer tool results are cut (marked) before the model sees them"
    )
    max_tokens_per_turn: int | None = Field(
        None,
        ge=1,
        description="cap of one assistant turn (the whole response is capped by data.max_response_tokens)",
    )
    max_calls_per_turn: int = Field(8, ge=1, description="further calls in one turn get an error message")
    max_concurrent_calls: int = Field(64, ge=1, description="tool calls running at once across the batch")
    tools_in_prompt: bool = Field(
        True,
        description="render the prompt again with the tool schemas (through the chat template, or a system message when the template ignores tools)",
    )
    tool_config: str | None = Field(
        None,
        description="a tool config file in verl's format (YAML, JSON or TOML; relative to the manifest): tools: a list "
        "of {class_name: 'python:file.py:Class' or 'package.module:Class', config: {constructor arguments}, "
        "tool_schema: optional}; offered beside the [tools.*] tables",
    )

    @field_validator("tool_config")
    @classmethod
    def _check_tool_config(cls, value: str | None, info: ValidationInfo) -> str | None:
        """The file exists and parses, each entry is well formed, each python: class exists with the
        methods of a tool and takes its config; the path becomes absolute."""
        if value is None:
            return value
        from rlcore.errors import RlcoreError
        from rlcore_agent.class_tool import check_tool_config

        try:
            return check_tool_config(value, _manifest_dir(info))
        except RlcoreError as exc:
            raise _problem(str(exc)) from None


class PythonToolOptions(Options):
    sandbox_url: str | None = Field(
        None,
        description="run code through an `rlcore sandbox serve` (or sandbox-fusion) server at this URL instead of locally",
    )
    timeout_s: float = Field(10.0, gt=0, le=3600, description="wall-clock limit per execution")
    cpu_time_s: int = Field(10, ge=1, le=3600, description="CPU-time limit per execution")
    memory_mb: int = Field(1024, ge=64, description="address-space limit per execution")
    max_processes: int = Field(
        16, ge=1, le=4096, description="processes (and threads) the code may run at once"
    )
    max_output_bytes: int = Field(
        1_000_000, ge=1024, description="stdout+stderr captured before the program is stopped"
    )
    max_output_chars: int = Field(
        4000, ge=64, description="characters of output returned to the model (the middle is cut)"
    )
    max_file_mb: int = Field(64, ge=1, description="largest file the code may write")
    max_concurrency: int | None = Field(
        None,
        ge=1,
        le=128,
        description="executions running at once in this process (default: 2 per available CPU core, at most 32); "
        "further calls wait for a slot, and the wait never counts against timeout_s",
    )
    python: str | None = Field(
        None,
        description="interpreter that runs the code, with its packages (default: the one running rlcore, virtual "
        "environment included); checked at start-up to be the Python that really runs inside the sandbox",
    )
    isolation: Literal["bubblewrap", "process"] = Field(
        "bubblewrap",
        description="bubblewrap (default): namespaces hide the file system, cut the network and contain processes; "
        "the tool refuses to start where bwrap is missing or cannot create namespaces (apt-get install -y bubblewrap). "
        "process: explicit opt-in to a weaker sandbox without namespaces (rlimits, a private directory, Landlock where "
        "the kernel has it, a private uid as root). RISK: without Landlock the code can read every world-readable "
        "file on the machine (keys, tokens, other users' data) and, unless rlcore runs as root, leave files in /tmp; "
        "without root or Landlock ABI 4 it may reach the network. Use it only for trusted models or throwaway machines",
    )
    description: str | None = Field(None, description="tool description shown to the model")
    extract_code: bool = Field(
        True,
        description="when the code does not parse as Python but holds a Markdown fence (```python ... ```, "
        "```py, or a bare ```), run the fenced code instead (the prose a model wrote around it is dropped)",
    )
    print_last_expr: bool = Field(
        False,
        description="print the value of a final bare expression as a REPL does (its repr, unless None); "
        "the description shown to the model says so",
    )

    @field_validator("isolation", mode="before")
    @classmethod
    def _renamed(cls, value: object) -> object:
        if value in ("auto", "bwrap", "none"):
            raise ValueError(
                f"isolation = {value!r} is gone: use 'bubblewrap' (the default; refuses to start without bwrap) or "
                "'process' (an explicit opt-in to the weaker sandbox without namespaces); nothing falls back silently"
            )
        return value

    @model_validator(mode="after")
    def _flag_missing_bwrap(self) -> PythonToolOptions:
        """`rlcore validate` runs this on the machine it validates on: a cheap PATH lookup, no probe. A
        warning, not an error: a launcher may run the tool on another machine, where bwrap may be."""
        if self.sandbox_url is None and self.isolation == "bubblewrap" and shutil.which("bwrap") is None:
            logger.warning(
                '[tools.python] isolation = "bubblewrap" (the default), but bwrap is not installed on this machine: '
                "the python tool will refuse to start here. Install bubblewrap (apt-get install -y bubblewrap) or, "
                'accepting the risks, set isolation = "process"'
            )
        return self


class _ClassToolBase(Options):
    # Keys besides `class` are the constructor's keyword arguments.
    model_config = ConfigDict(extra="allow")

    @field_validator("class", check_fields=False)
    @classmethod
    def _check_class(cls, value: str, info: ValidationInfo) -> str:
        """A file target is imported (the user's file) and its class checked; a module target is
        only looked for. The file becomes absolute."""
        from rlcore.errors import RlcoreError
        from rlcore_agent.class_tool import check_target, resolve_target

        base_dir = _manifest_dir(info)
        resolved = resolve_target(value, base_dir)
        try:
            check_target(resolved, None, import_modules=False)
        except RlcoreError as exc:
            raise _problem(str(exc)) from None
        return resolved

    @model_validator(mode="after")
    def _check_arguments(self) -> Any:
        from rlcore.errors import RlcoreError
        from rlcore_agent.class_tool import check_arguments, check_target

        try:
            found = check_target(getattr(self, "class"), None, import_modules=False)
            if found is not None:
                check_arguments(found, dict(self.model_extra or {}))
                if not callable(getattr(found, "schema", None)):
                    raise RlcoreError(
                        f"{found.__name__} has no schema() method (the function schema shown to the model)"
                    )
        except RlcoreError as exc:
            raise _problem(str(exc)) from None
        return self


# `class` is a Python keyword, so the field is made by name.
ClassToolOptions = create_model(
    "ClassToolOptions",
    __base__=_ClassToolBase,
    **{
        "class": (
            str,
            Field(
                ...,
                min_length=3,
                description='"python:file.py:Class" (relative to the manifest) or "package.module:Class"; the other keys are its constructor\'s arguments',
            ),
        )
    },
)


class FunctionToolOptions(Options):
    function: str = Field(..., min_length=3, description='"python:file.py:func" or "package.module:func"')
    name: str | None = Field(
        None, description="tool name shown to the model (default: the [tools.NAME] or function name)"
    )
    description: str | None = Field(None, description="default: the function's docstring")
