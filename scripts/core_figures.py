"""Figures for rlcore's core: lines, the longest functions, the import graph.

Run from a checkout: python scripts/core_figures.py [ROOT]. Counts every import statement, module level and
inside functions (lazy imports included), between modules of the rlcore package."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
pkg = root / "rlcore"
modules = {}
for path in sorted(pkg.rglob("*.py")):
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    modules[".".join(parts)] = path

lines = sum(len(p.read_text().splitlines()) for p in modules.values())
funcs = []
edges = set()


def resolve(name):
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


for mod, path in modules.items():
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            funcs.append(
                (node.end_lineno - node.lineno + 1, f"{path.relative_to(root)}:{node.lineno} {node.name}")
            )
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = mod.split(".") if is_pkg else mod.split(".")[:-1]
                here = here[: len(here) - node.level + 1]
                base = ".".join(here + ([base] if base else []))
            targets = [base + "." + a.name for a in node.names] + [base]
        for t in targets:
            if t.startswith("rlcore"):
                r = resolve(t)
                if r and r != mod:
                    edges.add((mod, r))

UPPER = ("rlcore.trainer",)
COMMANDS = (
    "rlcore.cli",
    "rlcore.evaluation",
    "rlcore.debug",
    "rlcore.serving",
    "rlcore.data.cli",
    "rlcore.testing",
    "rlcore.builtin",
    "rlcore.__main__",
)


def under(m, prefixes):
    return any(m == p or m.startswith(p + ".") for p in prefixes)


up = sorted((a, b) for a, b in edges if under(b, UPPER) and not under(a, UPPER + COMMANDS))
cmd_up = sorted((a, b) for a, b in edges if under(b, UPPER) and under(a, COMMANDS))
print(f"python files in rlcore/: {len(modules)}; lines: {lines}")
print(f"import graph: {len(modules)} modules, {len(edges)} edges (module-level and lazy imports)")
print(f"edges from base modules (not trainer, not a command/builtin/testing) into rlcore.trainer: {len(up)}")
for a, b in up:
    print(f"  {a} -> {b}")
print(f"edges from commands/builtin/testing into rlcore.trainer: {len(cmd_up)}")
print("10 longest functions:")
for n, where in sorted(funcs, reverse=True)[:10]:
    print(f"  {n:4d}  {where}")
