"""Data sources named by a prefix: ``[data] train = "NAME:ARGS?key=value"`` or a table.

A spec that is not a file names a component of kind ``data_source`` (hook
``rlcore_data_sources``): ``synthetic:addition?size=100`` is the builtin synthetic source with
``task = "addition"`` and ``size = 100``; ``[data.train] source = "reasoning_gym"`` with the
options as keys is the table form. Parsing and validation use only the source's options model,
so ``rlcore validate`` checks a spec without building the source (and without torch).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from pydantic import BaseModel, ValidationError

from rlcore.errors import RlcoreError

_PREFIX = re.compile(r"^([A-Za-z_][A-Za-z0-9_\-]+):(?!//)")  # two or more characters: not a drive letter


PATH_SCHEMES = frozenset({"package"})  # package:NAME/file is a path (the manifest loader resolves it)


@dataclass(frozen=True)
class SourceSpec:
    """A data spec that names a source: the source's name and its options as written."""

    name: str
    target: str  # the text after "NAME:" and before "?" ("" in the table form)
    query: dict[str, Any]
    written: str  # how to name the spec in messages


def source_spec(spec: str | dict[str, Any]) -> SourceSpec | None:
    """The source a spec names, or None for a file."""
    if isinstance(spec, dict):
        options = dict(spec)
        name = options.pop("source", None)
        if not isinstance(name, str) or not name:
            raise RlcoreError(
                f"a data table needs source = \"NAME\" (a data source such as synthetic or reasoning_gym); got {describe(spec)}"
            )
        return SourceSpec(name, "", options, describe(spec))
    match = _PREFIX.match(spec)
    if match is None or match.group(1) in PATH_SCHEMES:
        return None
    body = spec[match.end():]
    target, _, query = body.partition("?")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise RlcoreError(f"{spec!r}: options must look like ?size=100&seed=1") from None
    options: dict[str, Any] = {}
    for key, value in pairs:
        if key in options:
            raise RlcoreError(f"{spec!r}: the option {key!r} is given twice")
        options[key] = value
    return SourceSpec(match.group(1), target, options, spec)


def describe(spec: str | dict[str, Any]) -> str:
    """A spec as one line: the string itself, or the table as ``{source = ..., ...}``."""
    if isinstance(spec, str):
        return spec
    return "{" + ", ".join(f"{k} = {json.dumps(v, default=str)}" for k, v in spec.items()) + "}"


def source_options(parsed: SourceSpec, registry: Any, base_dir: Any = None) -> tuple[Any, BaseModel]:
    """The source component and its validated options; a located :class:`RlcoreError` otherwise.

    ``base_dir`` (the manifest's directory, when known) reaches the options model as the pydantic
    validation context ``{"manifest_dir": DIR}`` (as component tables are), so a source that names a file resolves it as every
    other path of a manifest is: relative to the manifest."""
    component = registry.get("data_source", parsed.name)
    options = dict(parsed.query)
    if parsed.target:
        if not component.target_option:
            raise RlcoreError(
                f"{parsed.written!r}: data source {parsed.name!r} takes no argument after '{parsed.name}:'; "
                f"give its options as ?key=value"
            )
        options[component.target_option] = parsed.target
    try:
        context = {"manifest_dir": str(base_dir)} if base_dir is not None else None
        return component, component.options.model_validate(options, context=context)
    except RlcoreError as exc:  # a source's validator that explains the problem itself
        raise RlcoreError(f"{parsed.written!r}: {exc}") from None
    except ValidationError as exc:
        fields = ", ".join(component.options.model_fields)
        problems = "; ".join(_problem(e) for e in exc.errors())
        raise RlcoreError(f"{parsed.written!r}: {problems} (options of data source {parsed.name!r}: {fields})") from None


def _problem(error: dict[str, Any]) -> str:
    where = ".".join(str(x) for x in error["loc"]) or "options"
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown option"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}"


def default_registry() -> Any:
    """The installed components, discovered once per process (data loading has no registry at hand)."""
    global _REGISTRY
    if _REGISTRY is None:
        from rlcore.registry import Registry

        _REGISTRY = Registry.discover()
    return _REGISTRY


_REGISTRY: Any = None


def check_source(parsed: SourceSpec, registry: Any = None, base_dir: Any = None) -> str | None:
    """A problem with a source spec, or None."""
    try:
        source_options(parsed, registry or default_registry(), base_dir)
    except RlcoreError as exc:
        return str(exc)
    return None


def read_rows(parsed: SourceSpec, role: str, *, registry: Any = None, context: Any = None,
              base_dir: Any = None) -> list[dict[str, Any]]:
    """Build the source and return its rows for ``role`` ("train" or "val")."""
    if base_dir is None:
        base_dir = getattr(context, "manifest_dir", None)
    component, options = source_options(parsed, registry or default_registry(), base_dir)
    source = component.load_factory()(options, context)
    rows = source.rows(role)
    if not isinstance(rows, list):
        rows = list(rows)
    return rows
