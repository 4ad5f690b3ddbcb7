"""The plugin API: the rlcore modules a plugin's code may import, and a check of a plugin's sources.

A plugin builds on :data:`PLUGIN_API` only; everything else in rlcore (the trainer, the manifest
loader, the registry, the CLI, ...) may change without notice. A plugin also never imports another
plugin's package (``rlcore_<other>``): it would depend on a distribution it does not declare, and
components reach each other through the registry instead. Third-party packages and the standard
library are the plugin's own business (declare them in its ``pyproject.toml``).

Any plugin's tests can run the check on its sources::

    from pathlib import Path
    from rlcore.testing.api import check_plugin_imports, describe_violations

    def test_my_plugin_uses_only_the_plugin_api():
        src = Path(__file__).resolve().parents[1] / "src"
        violations = check_plugin_imports(sorted(src.rglob("*.py")), own={"rlcore_my_plugin"})
        assert not violations, describe_violations(violations)

It reads the files with :mod:`ast` (nothing is imported): ``import a.b``, ``from a.b import c``
(``c`` counts as the module ``a.b.c`` when that is one of rlcore's modules) and
``importlib.import_module("a.b")`` / ``__import__("a.b")`` with a literal name, anywhere in a
file (inside functions and ``if TYPE_CHECKING:`` too). Relative imports stay in the plugin's
package and are not checked.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# The rlcore modules a plugin may import. A name ending in ".*" allows the package and all its
# submodules; any other name allows that module only.
PLUGIN_API: tuple[str, ...] = (
    "rlcore",  # the package itself: Component, Options, NoOptions, hookimpl, __version__
    "rlcore.interfaces",
    "rlcore.errors",
    "rlcore.components",
    "rlcore.targets",
    "rlcore.tool_calls",
    "rlcore.chat",  # token glue between chat turns, for multi-turn agent loops
    "rlcore.algorithms.*",
    "rlcore.engine_kit.*",  # the kit for engines that drive vLLM/SGLang
    "rlcore.launching",
    "rlcore.manifest_api",  # the core tables and components' options, for manifest writers
    "rlcore.serving",  # a manifest's engine and tokenizer, for servers (rlcore-serve)
    "rlcore.testing.*",
)

_RLCORE_DIR = Path(__file__).resolve().parents[1]


def is_plugin_api(module: str) -> bool:
    """Whether a plugin may import ``module`` (a dotted name inside rlcore)."""
    for entry in PLUGIN_API:
        if entry.endswith(".*"):
            package = entry[:-2]
            if module == package or module.startswith(package + "."):
                return True
        elif module == entry:
            return True
    return False


@dataclass(frozen=True)
class ImportViolation:
    """One import that breaks the rules: where it is, what it imports, why that is refused."""

    path: Path
    line: int
    module: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: imports {self.module} ({self.reason})"


def describe_violations(violations: Iterable[ImportViolation]) -> str:
    """One line per violation, then the modules a plugin may import."""
    allowed = ", ".join(e[:-2] + " (and its submodules)" if e.endswith(".*") else e for e in PLUGIN_API)
    lines = [str(v) for v in violations]
    return "\n".join(
        lines
        + [
            f"a plugin may import these rlcore modules only: {allowed} "
            "(rlcore.testing.api.PLUGIN_API); never another plugin's package (rlcore_*)"
        ]
    )


def _is_rlcore_module(name: str) -> bool:
    """Whether ``name`` (``rlcore.x.y``) is a module or package in rlcore's sources (not a class or function)."""
    parts = name.split(".")[1:]
    if not parts:
        return True
    base = _RLCORE_DIR.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imported_modules(tree: ast.AST) -> Iterable[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level or not node.module:
                continue  # relative: inside the plugin's own package
            submodules = []
            if node.module == "rlcore" or node.module.startswith("rlcore."):
                # `from rlcore import trainer` imports the module rlcore.trainer
                submodules = [
                    f"{node.module}.{a.name}"
                    for a in node.names
                    if a.name != "*" and _is_rlcore_module(f"{node.module}.{a.name}")
                ]
            for module in submodules or [node.module]:
                yield node.lineno, module
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            func = node.func
            name = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else None
            )
            if name in ("import_module", "__import__"):
                yield node.lineno, node.args[0].value


def check_plugin_imports(
    files: Iterable[Path], own: Iterable[str], *, root: Path | None = None
) -> list[ImportViolation]:
    """The imports in ``files`` (a plugin's sources) of rlcore modules outside :data:`PLUGIN_API`
    or of another plugin's package (a top-level ``rlcore_*`` not in ``own``, the plugin's own
    top-level packages). Paths in the result are relative to ``root`` when given."""
    own = set(own)
    violations = []
    for path in files:
        path = Path(path)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        shown = path.relative_to(root) if root is not None else path
        seen = set()
        for line, module in _imported_modules(tree):
            top = module.split(".")[0]
            if top == "rlcore":
                reason = None if is_plugin_api(module) else "not part of the plugin API"
            elif top.startswith("rlcore_") and top not in own:
                reason = "another plugin's package"
            else:
                reason = None
            if reason and (line, module) not in seen:
                seen.add((line, module))
                violations.append(ImportViolation(shown, line, module, reason))
    return violations
