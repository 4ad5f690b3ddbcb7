"""The plugin author's manual names real code: every example in rlcore/hookspecs.py is a first-party
plugin's actual record, and every ``"module:attr"`` string, options class and ``rlcore...`` name in
hookspecs.py's docstrings and in README.md resolves.

Only names under a third party's own package are exempt (PLACEHOLDERS): the README tutorial's
``rlcore_short`` is written out from the README's own blocks and resolved for real; hookspecs.py's
``rlcore_my_reward`` shows only its plugin module, not the implementation it names.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from rlcore import hookspecs
from rlcore.components import KINDS
from rlcore.errors import RlcoreError
from rlcore.registry import Registry, target_path
from rlcore.targets import load_target

ROOT = Path(__file__).resolve().parents[1]  # the repository

# Top-level packages that are first party: names under them must resolve.
FIRST_PARTY_PACKAGES = {"rlcore"} | {
    package.name for package in ROOT.glob("plugins/*/src/rlcore_*") if (package / "__init__.py").is_file()
}
# A third party's own package in an example: package -> why it is not resolved here.
PLACEHOLDERS = {
    "rlcore_my_reward": "hookspecs.py's example distribution; its implementation module is not shown",
    "module": 'the form itself ("module:function"), not a name',
    "package": 'the form itself ("package.module:NAME"), not a name',
}
TUTORIAL_PACKAGE = "rlcore_short"  # written out from the README's blocks (see tutorial_package)

MODULE_ATTR = re.compile(r"""["']([A-Za-z_][\w.]*:[A-Za-z_][\w.]*)["']""")
OPTIONS_NAME = re.compile(r"\boptions=([A-Za-z_]\w*)")
DOTTED_NAME = re.compile(r"`(rlcore\w*(?:\.[A-Za-z_]\w*)+)`")
EXAMPLE = re.compile(r"``((?:Component|Command)\(.*?\))``", re.S)
HOOK_KIND = {hook: kind for kind, (hook, _) in KINDS.items()}


def hookspec_docs() -> dict[str, str]:
    """Where -> docstring: the module's and each hook's."""
    docs = {"rlcore/hookspecs.py": hookspecs.__doc__ or ""}
    for name, function in inspect.getmembers(hookspecs, inspect.isfunction):
        if name.startswith("rlcore_"):
            docs[f"hookspecs.{name}"] = function.__doc__ or ""
    return docs


def readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def readme_blocks() -> list[tuple[str, str]]:
    """(language, body) of each fenced code block of the README."""
    return [(lang, textwrap.dedent(body)) for lang, body in re.findall(r"```(\w*)\n(.*?)```", readme(), re.S)]


def resolve_problem(target: str) -> str | None:
    """Why ``target`` ("module:attr" or "module.attr") does not resolve, or None if it does or
    is a placeholder."""
    package = target.split(":")[0].split(".")[0]
    if package in PLACEHOLDERS:
        return None
    if package not in FIRST_PARTY_PACKAGES and package != TUTORIAL_PACKAGE:
        return f"{target!r}: {package!r} is neither first party nor a listed placeholder"
    if ":" not in target:  # a dotted name: the longest importable module, then attributes
        parts = target.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            if cut == len(parts):
                return None
            target = ".".join(parts[:cut]) + ":" + ".".join(parts[cut:])
            break
    try:
        load_target(target, what="name")
    except RlcoreError as exc:
        return f"{target!r}: {exc}"
    return None


def is_ours(name: str) -> bool:
    """Whether a module name is first party (or the tutorial's): imports of others are not checked."""
    return name.split(".")[0] in FIRST_PARTY_PACKAGES | {TUTORIAL_PACKAGE}


def problems_in(where: str, text: str, defined_here: set[str] = frozenset()) -> list[str]:
    """Unresolvable "module:attr" strings, options classes and ``rlcore...`` names in ``text``."""
    problems = []
    for target in MODULE_ATTR.findall(text):
        if ".py:" in target or target.startswith("python:"):
            continue  # a user's file, e.g. "python:path.py:function"
        if (problem := resolve_problem(target)) is not None:
            problems.append(f"{where}: {problem}")
    for target in DOTTED_NAME.findall(text):
        if (problem := resolve_problem(target)) is not None:
            problems.append(f"{where}: {problem}")
    classes = set(re.findall(r"^\s*class (\w+)", text, re.M)) | set(defined_here)
    for name in OPTIONS_NAME.findall(text):
        if name not in classes and not _is_options_class_of_a_plugin(name):
            problems.append(
                f"{where}: options class {name!r} is not defined there nor by any first-party plugin"
            )
    return problems


def _is_options_class_of_a_plugin(name: str) -> bool:
    registry = _registry()
    return any(c.options.__name__ == name for kind in KINDS for c in registry.components(kind).values())


_REGISTRY: Registry | None = None


def _registry() -> Registry:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = Registry.discover(external=True, disabled=[])
    return _REGISTRY


@pytest.fixture
def tutorial_package(tmp_path, monkeypatch):
    """The README tutorial's package, written out from the README's blocks, on sys.path."""

    def block(marker: str) -> str:
        return next(body for _, body in readme_blocks() if marker in body)

    package = tmp_path / TUTORIAL_PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "plugin.py").write_text(block("class ShortOptions"))
    (package / "reward.py").write_text(block("def build(options, context)"))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for name in [m for m in sys.modules if m == TUTORIAL_PACKAGE or m.startswith(TUTORIAL_PACKAGE + ".")]:
        del sys.modules[name]


# ----------------------------------------------------------------------------- hookspecs.py


def _example_fields(example: str) -> tuple[str, dict[str, object]]:
    call = ast.parse(example, mode="eval").body
    assert isinstance(call, ast.Call) and not call.args, f"use keyword arguments in examples: {example}"
    fields: dict[str, object] = {}
    for keyword in call.keywords:
        value = keyword.value
        if isinstance(value, ast.Name):
            fields[keyword.arg] = ("name", value.id)
        else:
            fields[keyword.arg] = ast.literal_eval(value)
    return call.func.id, fields


def test_every_hook_has_an_example_that_is_a_real_first_party_record():
    registry = _registry()
    commands = {c.name: c for c in registry.commands()}
    checked = []
    for where, doc in hookspec_docs().items():
        if where == "rlcore/hookspecs.py":
            continue
        hook = where.split(".", 1)[1]
        examples = EXAMPLE.findall(doc)
        assert len(examples) == 1, f"{where}: expected one ``Component(...)``/``Command(...)`` example"
        record_type, fields = _example_fields(examples[0])
        if hook == "rlcore_commands":
            assert record_type == "Command"
            real = commands.get(fields["name"])
            assert real is not None, f"{where}: no installed plugin registers the command {fields['name']!r}"
            assert fields["run"] == target_path(real.run), where
            if "configure" in fields:
                assert fields["configure"] == target_path(real.configure), where
        else:
            assert record_type == "Component"
            kind = HOOK_KIND[hook]
            real = registry.components(kind).get(fields["name"])
            assert real is not None, f"{where}: no installed plugin registers the {kind} {fields['name']!r}"
            assert fields["factory"] == target_path(real.factory), where
            assert fields.get("options", ("name", "NoOptions")) == ("name", real.options.__name__), where
            assert set(fields.get("needs", ())) == set(real.needs), (
                f"{where}: needs differ from the real record"
            )
        checked.append(hook)
    assert set(checked) == set(HOOK_KIND) | {"rlcore_commands"}


def test_hookspec_docstrings_name_real_code():
    problems = []
    for where, doc in hookspec_docs().items():
        # The module's example defines its options class in the example itself.
        problems += problems_in(where, doc)
    assert problems == []


# ----------------------------------------------------------------------------- README.md


def test_readme_code_blocks_name_real_code(tutorial_package):
    problems = []
    for index, (lang, body) in enumerate(readme_blocks()):
        where = f"README.md block {index + 1} ({lang or 'plain'})"
        problems += problems_in(where, body)
        if lang == "toml" and "[project" in body:
            entry_points = tomllib.loads(body).get("project", {}).get("entry-points", {}).get("rlcore", {})
            for module in entry_points.values():
                if (problem := resolve_problem(module)) is not None:
                    problems.append(f"{where}: entry point {problem}")
        if lang == "python":
            for node in ast.walk(ast.parse(body)):
                if isinstance(node, ast.ImportFrom) and node.module and is_ours(node.module):
                    for alias in node.names:
                        if (problem := resolve_problem(f"{node.module}:{alias.name}")) is not None:
                            problems.append(f"{where}: import {problem}")
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if is_ours(alias.name) and (problem := resolve_problem(alias.name)) is not None:
                            problems.append(f"{where}: import {problem}")
    assert problems == []


def test_readme_inline_code_names_real_code(tutorial_package):
    prose = re.sub(r"```.*?```", "", readme(), flags=re.S)
    spans = " ".join(f"`{span}`" for span in re.findall(r"`([^`\n]+)`", prose))
    inline_targets = " ".join(f'"{t}"' for t in re.findall(r"`([A-Za-z_][\w.]*:[A-Za-z_][\w.]*)`", prose))
    assert problems_in("README.md prose", spans + " " + inline_targets) == []


# ----------------------------------------------------------------------------- the checker itself


@pytest.mark.parametrize(
    "text",
    [
        'factory="rlcore_loggers.sinks:wandb_sink"',  # a misspelt attribute
        'factory="rlcore_algo_grpo.estimators:grpo"',
        'factory="rlcore_agnet.loop:build"',  # a misspelt first-party package
        "options=HFOptions",  # an options class nobody defines
        "see `rlcore.interfaces.RewardInputs`",
    ],
)
def test_a_misspelt_first_party_name_is_reported(text):
    assert problems_in("example", text), text


def test_correct_names_pass():
    text = (
        'factory="rlcore_loggers.sinks:wandb", options=WandbOptions, "rlcore_my_reward.impl:make", '
        "`rlcore.interfaces.RewardInput` `rlcore.testing.rewards`"
    )
    assert problems_in("example", text) == []
