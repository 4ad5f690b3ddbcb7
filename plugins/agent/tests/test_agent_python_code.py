"""The python tool's handling of what models send: code fenced inside prose, and (an option) the
value of a final expression printed as a REPL does."""

from __future__ import annotations

import asyncio

import pytest
from rlcore_agent.options import PythonToolOptions
from rlcore_agent.python_tool import PythonTool, extract_code, print_last_expression

FENCED = """I'll compute it step by step.

```python
values = [3, 4, 5]
total = sum(values)
```

Then print it:

```py
print(total * 2)
```

Output:

```
24
```
"""


def test_extract_code_takes_fenced_python_out_of_prose():
    assert extract_code(FENCED) == ("values = [3, 4, 5]\ntotal = sum(values)\nprint(total * 2)\n", True)
    # no tagged block: the first bare one (the next is usually the expected output); never bash
    assert extract_code("Run this:\n```\nprint(2)\n```\nIt prints\n```\n2\n```") == ("print(2)\n", True)
    assert extract_code("~~~python3\nx = 1\n~~~") == ("x = 1\n", True)
    assert extract_code("```bash\nrm -rf /\n```") == ("```bash\nrm -rf /\n```", False)
    # code that parses runs as it is, fences inside strings included
    assert extract_code('print("```python\\nx\\n```")') == ('print("```python\\nx\\n```")', False)
    assert extract_code("just prose, no code") == ("just prose, no code", False)


@pytest.mark.parametrize(
    "code, printed",
    [
        ("x = 6\nx * 7", "42"),
        ("a = 2; a * 3  # comment\n", "6"),
        ("'text'", "'text'"),  # the repr, as the REPL shows it
        ("(1 +\n 2)", "3"),
        ("print('once')", "once"),  # print returns None: nothing more
        ("x = 1\nx;", ""),  # a trailing semicolon hides the value (Jupyter)
        ("x = 5", ""),
        ("def f():\n    return [1]\nf()", "[1]"),
    ],
)
def test_print_last_expression_behaves_like_the_repl(code, printed, capsys):
    exec(compile(print_last_expression(code), "<test>", "exec"), {})
    assert capsys.readouterr().out.strip() == printed


def test_print_last_expression_keeps_line_numbers():
    code = "a = 1\nb = 0\na / b\n"
    rewritten = print_last_expression(code)
    assert rewritten.splitlines()[:2] == ["a = 1", "b = 0"] and "a / b" in rewritten.splitlines()[2]
    assert print_last_expression("def broken(:\n") == "def broken(:\n"  # the sandbox reports the error


def run(tool, code):
    return asyncio.run(tool.execute("t", {"code": code}))


def test_python_tool_runs_fenced_code_and_prints_the_last_value():
    default = PythonTool(PythonToolOptions(timeout_s=10))
    result = run(default, FENCED)
    assert (result.text, result.error, result.metrics["code_extracted"]) == ("24", False, 1.0)
    assert run(default, "x = 6\nx * 7").text == "(no output)"  # print_last_expr is off by default
    assert "print() to see results" in default.schema()["function"]["description"]

    repl = PythonTool(PythonToolOptions(timeout_s=10, print_last_expr=True))
    assert "REPL" in repl.schema()["function"]["description"]
    assert run(repl, "```python\nimport math\nmath.factorial(5)\n```").text == "120"
    failed = run(repl, "a = 1\nb = 0\na / b")
    assert failed.error and "ZeroDivisionError" in failed.text and "line 3" in failed.text

    off = PythonTool(PythonToolOptions(timeout_s=10, extract_code=False))
    result = run(off, FENCED)
    assert result.error and "SyntaxError" in result.text and result.metrics["code_extracted"] == 0.0
