"""The ``/run_code`` request and response, in the shape sandbox-fusion (and verl's client) use.

Files travel base64-encoded: ``files`` maps a path inside the sandbox directory to its content,
``fetch_files`` names files to send back after the run.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class RunCodeRequest(BaseModel):
    code: str
    language: str = "python"
    compile_timeout: float = 10.0
    run_timeout: float = Field(10.0, gt=0)
    memory_limit_MB: int = -1
    stdin: str | None = ""
    files: dict[str, str] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list)


class CommandRunResult(BaseModel):
    status: Literal["Finished", "TimeLimitExceeded", "Error"]
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    status: Literal["Success", "Failed", "SandboxError"]
    message: str = ""
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
