"""The ``python`` tool: the model writes a program, the sandbox runs it, the model reads its output."""

from __future__ import annotations

from typing import Any

from rlcore.interfaces import ToolResult
from rlcore_agent.options import PythonToolOptions
from rlcore_agent.sandbox.local import Limits, RunResult

DESCRIPTION = (
    "Run a Python 3 program and return what it prints (stdout, then stderr). "
    "Each call starts fresh; there is no network. Use print() to see results."
)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]}\n... [{len(text) - 2 * keep} characters cut] ...\n{text[-keep:]}"


def format_result(result: RunResult, max_chars: int) -> tuple[str, bool]:
    """The text the model sees, and whether the run failed."""
    if result.status == "Error" and result.return_code is None:
        return f"Error: the sandbox could not run the code: {result.message}", True
    parts = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    failed = result.status != "Finished" or result.return_code != 0 or result.output_truncated
    if result.message:
        parts.append(f"[{result.message}]")
    elif result.return_code not in (0, None):
        parts.append(f"[exit code {result.return_code}]")
    text = "\n".join(parts) if parts else "(no output)"
    if failed and not text.startswith("Error"):
        text = "Error: the program failed\n" + text
    return _cut(text, max_chars), failed


class PythonTool:
    name = "python"
    max_concurrency: int | None = None  # calls it runs at once (None: no limit of its own)

    def __init__(self, options: PythonToolOptions):
        self.options = options
        self.limits = Limits(
            wall_s=options.timeout_s,
            cpu_s=options.cpu_time_s,
            memory_mb=options.memory_mb,
            max_processes=options.max_processes,
            max_output_bytes=options.max_output_bytes,
            max_file_mb=options.max_file_mb,
        )
        if options.sandbox_url:
            from rlcore_agent.sandbox.client import HttpSandbox

            self.sandbox: Any = HttpSandbox(options.sandbox_url, self.limits)
        else:
            from rlcore_agent.sandbox.local import LocalSandbox

            self.sandbox = LocalSandbox(
                self.limits, python=options.python, isolation=options.isolation, max_concurrency=options.max_concurrency
            )
            # The tool loop queues calls beyond this before its per-call timeout starts (see loop.py).
            self.max_concurrency = self.sandbox.max_concurrency

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.options.description or DESCRIPTION,
                "parameters": {
                    "type": "object",
                    "properties": {"code": {"type": "string", "description": "the complete Python program"}},
                    "required": ["code"],
                },
            },
        }

    async def create(self, trajectory_id: str) -> None:
        return None

    async def release(self, trajectory_id: str) -> None:
        return None

    async def execute(self, trajectory_id: str, arguments: dict[str, Any]) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResult(text='Error: the python tool needs {"code": "<a Python program>"}', error=True)
        result = await self.sandbox.run(code)
        text, failed = format_result(result, self.options.max_output_chars)
        metrics = {"exec_time_s": result.execution_time, "timeouts": float(result.status == "TimeLimitExceeded")}
        return ToolResult(text=text, error=failed, metrics=metrics)


def build(options: PythonToolOptions, context: Any) -> PythonTool:
    return PythonTool(options)
