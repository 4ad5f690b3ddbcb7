"""The ``python`` tool: the model writes a program, the sandbox runs it, the model reads its output.

Before running, the code is taken out of a Markdown fence when the model wrapped it in prose
(:func:`extract_code`), and, with ``print_last_expr``, a final bare expression is printed as a
REPL would (:func:`print_last_expression`). Both work on the source text in this process; nothing
of the model's code runs outside the sandbox (``ast.parse`` only parses).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from rlcore.interfaces import ToolResult
from rlcore_agent.options import PythonToolOptions
from rlcore_agent.sandbox.local import Limits, RunResult

DESCRIPTION = (
    "Run a Python 3 program and return what it prints (stdout, then stderr). "
    "Each call starts fresh; there is no network. Use print() to see results."
)
DESCRIPTION_REPL = (
    "Run a Python 3 program and return what it prints (stdout, then stderr); the value of a final "
    "expression is printed too, as in a REPL. Each call starts fresh; there is no network."
)

# A Markdown code fence: ``` or ~~~, an optional language tag, the code, the same fence closing it.
_FENCE = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+.-]*)[^\n]*\n(?P<code>.*?)^[ \t]*(?P=fence)[ \t]*$",
    re.M | re.S,
)
_PYTHON_TAGS = {"python", "py", "python3", "py3"}
_LAST = "_rlcore_last_value"


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def extract_code(text: str) -> tuple[str, bool]:
    """The program in ``text``, and whether it was taken out of a Markdown fence.

    Code that parses as Python runs as it is. Otherwise (prose around a fenced block), the blocks
    tagged ``python``/``py``/``python3`` are joined in order, as cells of one program; without a
    tagged block, the first untagged one is taken (a later untagged block is often the expected
    output); blocks of other languages (```bash) are never run. Without a fence, the text is
    returned unchanged (the sandbox then reports its syntax error)."""
    if "```" not in text and "~~~" not in text or _parses(text):
        return text, False
    blocks = [(m.group("lang").lower(), m.group("code")) for m in _FENCE.finditer(text)]
    tagged = [code for lang, code in blocks if lang in _PYTHON_TAGS]
    if tagged:
        return "\n".join(code.rstrip("\n") for code in tagged) + "\n", True
    bare = [code for lang, code in blocks if not lang]
    if bare:
        return bare[0], True
    return text, False


def print_last_expression(code: str) -> str:
    """``code`` with its final top-level expression statement replaced by printing its ``repr``
    unless it is None, as the Python REPL does; line numbers of everything before it are kept.
    Code that does not parse, or does not end in an expression, is returned unchanged."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return code
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    node = tree.body[-1]
    lines = code.splitlines(keepends=True)
    # ast offsets are in UTF-8 bytes of the line
    start = len("".join(lines[: node.lineno - 1]).encode()) + node.col_offset
    end = len("".join(lines[: node.end_lineno - 1]).encode()) + node.end_col_offset  # type: ignore[operator]
    raw = code.encode()
    after = raw[end:].decode()
    if after.lstrip(" \t").startswith(";"):  # `value;` hides the value, as in Jupyter
        return code
    replacement = (
        f"{_LAST} = ({raw[start:end].decode()})\nif {_LAST} is not None:\n    print(repr({_LAST}))\n"
    )
    return raw[:start].decode() + replacement + after


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
                self.limits,
                python=options.python,
                isolation=options.isolation,
                max_concurrency=options.max_concurrency,
            )
            # The tool loop queues calls beyond this before its per-call timeout starts (see loop.py).
            self.max_concurrency = self.sandbox.max_concurrency

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.options.description
                or (DESCRIPTION_REPL if self.options.print_last_expr else DESCRIPTION),
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
        code, extracted = extract_code(code) if self.options.extract_code else (code, False)
        if self.options.print_last_expr:
            code = print_last_expression(code)
        result = await self.sandbox.run(code)
        text, failed = format_result(result, self.options.max_output_chars)
        metrics = {
            "exec_time_s": result.execution_time,
            "timeouts": float(result.status == "TimeLimitExceeded"),
            "code_extracted": float(extracted),
        }
        return ToolResult(text=text, error=failed, metrics=metrics)


def build(options: PythonToolOptions, context: Any) -> PythonTool:
    return PythonTool(options)
