"""Tools written as Python classes, offered without packaging a plugin.

Two ways to name them:

- ``[tools.calc] class = "python:my_tools.py:Calculator"`` (or ``"package.module:Calculator"``):
  the table's other keys are the constructor's keyword arguments;
- ``[agent] tool_config = "tools.yaml"``: verl's tool config file, a list of tools each with a
  ``class_name`` and its ``config`` (the constructor's keyword arguments), optionally a
  ``tool_schema`` (the schema shown to the model) (:func:`read_tool_config`).

The class implements :class:`rlcore.interfaces.Tool`: an async ``execute(trajectory_id,
arguments)`` returning a ``ToolResult``, a ``schema()`` (unless the config file gives
``tool_schema``), and optionally ``name`` and async ``create``/``calc_reward``/``release``. The
checks that need no instance (the file, the class, its methods, the constructor's arguments) run
when the manifest is validated; module targets are only looked for then, not imported (their
package might import torch).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlcore.errors import RlcoreError, UsageError
from rlcore.targets import load_target

OPTIONAL_METHODS = ("create", "calc_reward", "release")
ENTRY_KEYS = ("class_name", "config", "tool_schema")


def normalize_target(target: str) -> str:
    """``python:file.py:Class`` / ``file.py:Class`` / ``package.module:Class`` / verl's dotted
    ``package.module.Class`` -> ``FILE_OR_MODULE:Class``."""
    target = target.strip().removeprefix("python:")
    if ":" not in target and "." in target and not target.endswith(".py"):
        module, _, name = target.rpartition(".")
        return f"{module}:{name}"
    return target


def resolve_target(target: str, base_dir: str | Path | None) -> str:
    """The target with a relative file made absolute (so a driver elsewhere finds it)."""
    target = normalize_target(target)
    where, sep, name = target.rpartition(":")
    if sep and where.endswith(".py") and base_dir is not None and not Path(where).expanduser().is_absolute():
        return f"{(Path(base_dir) / where).resolve()}:{name}"
    return target


def check_target(target: str, base_dir: str | Path | None, *, import_modules: bool) -> type | None:
    """Check the class a target names; return it when it was imported (file targets, or module
    targets with ``import_modules``). Raises RlcoreError with what is wrong."""
    normalized = normalize_target(target)
    where, sep, name = normalized.rpartition(":")
    if not sep or not where or not name:
        raise RlcoreError(
            f"expected 'python:FILE.py:CLASS', 'package.module:CLASS' or 'package.module.CLASS', got {target!r}"
        )
    if not where.endswith(".py") and not import_modules:
        if importlib.util.find_spec(where.split(".")[0]) is None:
            raise RlcoreError(
                f"tool module {where!r} cannot be imported: no module named {where.split('.')[0]!r}"
            )
        return None
    cls, origin = load_target(normalized, what="class", source="tool", base_dir=base_dir)
    if not inspect.isclass(cls):
        raise RlcoreError(f"{origin}: {name!r} is a {type(cls).__name__}, not a class")
    problems = []
    execute = getattr(cls, "execute", None)
    if execute is None:
        problems.append("it has no execute(self, trajectory_id, arguments) method")
    elif not inspect.iscoroutinefunction(execute):
        problems.append("execute must be async (async def execute(self, trajectory_id, arguments))")
    for method in OPTIONAL_METHODS:
        fn = getattr(cls, method, None)
        if fn is not None and not inspect.iscoroutinefunction(fn):
            problems.append(f"{method} must be async")
    if problems:
        raise RlcoreError(f"{origin}: class {name!r} is not a tool: " + "; ".join(problems))
    return cls


def check_arguments(cls: type, kwargs: dict[str, Any]) -> None:
    """The constructor takes ``kwargs`` (RlcoreError naming what it does take otherwise)."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        raise RlcoreError(f"{cls.__name__}{signature} cannot be built with {sorted(kwargs)}: {exc}") from None


def check_schema(schema: Any, what: str) -> str:
    """An OpenAI function schema; return its function name."""
    fn = schema.get("function") if isinstance(schema, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise RlcoreError(
            f'{what} must be {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}, got {schema!r:.80}'
        )
    if schema.get("type", "function") != "function":
        raise RlcoreError(f"{what}: type must be 'function', got {schema.get('type')!r}")
    return fn["name"]


def instantiate(
    cls: type, kwargs: dict[str, Any], where: str, tool_schema: dict[str, Any] | None = None
) -> Any:
    """Build the tool; give it the file's schema (and its name) when there is one; check that its
    name and schema agree. UsageError naming ``where`` for anything wrong."""
    try:
        check_arguments(cls, kwargs)
        tool = cls(**kwargs)
    except RlcoreError as exc:
        raise UsageError(f"{where}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the user's constructor
        raise UsageError(f"{where}: {cls.__name__}(...) raised {type(exc).__name__}: {exc}") from None
    try:
        if tool_schema is not None:
            name = check_schema(tool_schema, "tool_schema")
            tool.schema = lambda: tool_schema
            tool.name = name
        if not callable(getattr(tool, "schema", None)):
            raise RlcoreError(
                f"{cls.__name__} has no schema() method (or give tool_schema in a tool config file)"
            )
        name = check_schema(tool.schema(), f"{cls.__name__}.schema()")
        own = getattr(tool, "name", None)
        if own is None:
            tool.name = name
        elif own != name:
            raise RlcoreError(
                f"{cls.__name__}.name is {own!r} but its schema names the function {name!r}; make them agree"
            )
    except RlcoreError as exc:
        raise UsageError(f"{where}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the user's schema()
        raise UsageError(f"{where}: {type(exc).__name__}: {exc}") from None
    return tool


# ----------------------------------------------------------------------------- tool config files


@dataclass
class ToolEntry:
    """One tool of a tool config file."""

    where: str  # "FILE: tools[i]"
    class_name: str  # resolved (files absolute)
    config: dict[str, Any] = field(default_factory=dict)
    tool_schema: dict[str, Any] | None = None


def _parse(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise RlcoreError(
                f"{path}: reading YAML needs PyYAML (pip install pyyaml), or write the file as .json or .toml"
            ) from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            raise RlcoreError(f"{path}: invalid YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
    if suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise RlcoreError(
                f"{path}: invalid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"
            ) from None
    if suffix == ".toml":
        import tomllib

        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise RlcoreError(f"{path}: invalid TOML: {exc}") from None
    raise RlcoreError(
        f"{path}: a tool config file is .yaml/.yml, .json or .toml, not {suffix or 'without a suffix'!r}"
    )


def read_tool_config(path: str | Path, base_dir: str | Path | None = None) -> list[ToolEntry]:
    """Read and check a tool config file (verl's format)::

        tools:
          - class_name: "python:my_tools.py:SubmitAnswer"   # or package.module:Class, package.module.Class
            config: {type: native, penalty: 0.1}            # the constructor's keyword arguments
            tool_schema: {type: function, function: {...}}   # optional: the schema shown to the model

    ``python:`` files are relative to the config file. ``config.type`` is verl's tool type: only
    ``native`` exists here, and it is not passed on. Raises RlcoreError naming the file and the entry.
    """
    path = Path(path).expanduser()
    if not path.is_absolute():
        path = Path(base_dir or ".") / path
    path = path.resolve()
    if not path.is_file():
        raise RlcoreError(f"tool config file {str(path)!r} does not exist")
    doc = _parse(path)
    tools = doc.get("tools") if isinstance(doc, dict) else doc
    if isinstance(doc, dict) and set(doc) - {"tools"}:
        raise RlcoreError(
            f"{path}: unknown top-level keys {sorted(set(doc) - {'tools'})}; expected only 'tools' (a list)"
        )
    if not isinstance(tools, list):
        raise RlcoreError(
            f"{path}: expected 'tools: [...]', a list of tools with class_name and config; got {type(tools).__name__}"
        )
    entries = []
    for i, raw in enumerate(tools):
        where = f"{path}: tools[{i}]"
        if not isinstance(raw, dict):
            raise RlcoreError(
                f"{where}: expected a mapping with class_name and config, got {type(raw).__name__}"
            )
        unknown = sorted(set(raw) - set(ENTRY_KEYS))
        if unknown:
            raise RlcoreError(f"{where}: unknown keys {unknown}; expected {', '.join(ENTRY_KEYS)}")
        target = raw.get("class_name")
        if not isinstance(target, str) or not target.strip():
            raise RlcoreError(
                f"{where}.class_name: required, e.g. 'python:my_tools.py:MyTool' or 'package.module:MyTool'"
            )
        config = raw.get("config") or {}
        if not isinstance(config, dict):
            raise RlcoreError(
                f"{where}.config: expected a mapping of constructor arguments, got {type(config).__name__}"
            )
        config = dict(config)
        kind = config.pop("type", "native")
        if kind != "native":
            raise RlcoreError(
                f"{where}.config.type: {kind!r} tools (verl's MCP tools) are not supported; only 'native'"
            )
        schema = raw.get("tool_schema")
        if schema is not None:
            try:
                check_schema(schema, "tool_schema")
            except RlcoreError as exc:
                raise RlcoreError(f"{where}.{exc}") from None
        entries.append(
            ToolEntry(
                where=where, class_name=resolve_target(target, path.parent), config=config, tool_schema=schema
            )
        )
    return entries


def check_tool_config(path: str | Path, base_dir: str | Path | None) -> str:
    """What ``rlcore validate`` checks of a tool config file (file targets are imported, module
    targets only looked for); return the file's absolute path. RlcoreError for any problem."""
    entries = read_tool_config(path, base_dir)
    names: dict[str, str] = {}
    for entry in entries:
        try:
            cls = check_target(entry.class_name, None, import_modules=False)
            if cls is not None:
                check_arguments(cls, entry.config)
                if entry.tool_schema is None and not callable(getattr(cls, "schema", None)):
                    raise RlcoreError(f"{cls.__name__} has no schema() method; give tool_schema")
        except RlcoreError as exc:
            raise RlcoreError(f"{entry.where}: {exc}") from None
        if entry.tool_schema is not None:
            name = entry.tool_schema["function"]["name"]
            if name in names:
                raise RlcoreError(f"{entry.where}: a second tool named {name!r} (the first is {names[name]})")
            names[name] = entry.where
    path = Path(path).expanduser()
    return str((path if path.is_absolute() else Path(base_dir or ".") / path).resolve())


def build_config_tools(path: str | Path, base_dir: str | Path | None = None) -> dict[str, Any]:
    """The tools of a tool config file, built, by name (UsageError for anything wrong)."""
    try:
        entries = read_tool_config(path, base_dir)
    except RlcoreError as exc:
        raise UsageError(str(exc)) from None
    tools: dict[str, Any] = {}
    for entry in entries:
        try:
            cls = check_target(entry.class_name, None, import_modules=True)
        except RlcoreError as exc:
            raise UsageError(f"{entry.where}.class_name: {exc}") from None
        assert cls is not None
        tool = instantiate(cls, entry.config, entry.where, entry.tool_schema)
        if tool.name in tools:
            raise UsageError(f"{entry.where}: a second tool named {tool.name!r}")
        tools[tool.name] = tool
    return tools


# ----------------------------------------------------------------------------- [tools.NAME] class = "..."


def build(options: Any, context: Any) -> Any:
    """The ``class`` tool component: ``[tools.NAME] class = TARGET``, other keys to the constructor."""
    target = getattr(options, "class")
    base_dir = getattr(context, "manifest_dir", None)
    try:
        cls = check_target(resolve_target(target, base_dir), None, import_modules=True)
    except RlcoreError as exc:
        raise UsageError(f"tool class {target!r}: {exc}") from None
    assert cls is not None
    tool = instantiate(cls, dict(options.model_extra or {}), f"tool class {target!r}")
    return tool
