"""Reads, overrides and validates a manifest, collecting every problem before reporting.

Order of precedence: the file, then environment variables (``RLCORE_<TABLE>__<KEY>=value``,
read by pydantic-settings), then ``--set table.key=value``. Validation has two phases: the core
tables (:mod:`rlcore.manifest.schema`), then each selected component's own options model.
Nothing here imports torch.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from rlcore.components import Component
from rlcore.errors import ManifestError, Problem, RlcoreError, did_you_mean
from rlcore.manifest.locate import find_duplicate, key_lines, line_of
from rlcore.manifest.schema import COMPONENT_MAPS, COMPONENT_TABLES, PLUGIN_DEFAULTS, RETIRED_KEYS, Manifest
from rlcore.registry import Registry

_TOML_POSITION = re.compile(r"\(at line (\d+), column (\d+)\)")


@dataclass
class Selected:
    """One component chosen by the manifest, with its validated options."""

    role: str  # e.g. "rollout.engine", "tools.python"
    component: Component
    options: BaseModel


@dataclass
class ResolvedManifest:
    path: Path
    raw: dict[str, Any]  # after overrides, paths resolved
    core: Manifest
    selected: dict[str, Selected] = field(default_factory=dict)
    # The data sources [data] train / val name ("data.train" -> its source), kept apart from
    # `selected`: their options live in the data spec itself, and the trainer reads them from there.
    data_sources: dict[str, Selected] = field(default_factory=dict)

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def component(self, role: str) -> Selected:
        return self.selected[role]

    def roles(self, prefix: str) -> list[Selected]:
        return [s for role, s in self.selected.items() if role.startswith(prefix + ".")]

    def versions(self) -> dict[str, str]:
        """distribution -> version of every plugin the run uses."""
        chosen = [*self.selected.values(), *self.data_sources.values()]
        return {s.component.distribution: s.component.version for s in chosen}

    def resolved_dict(self) -> dict[str, Any]:
        """The full manifest with defaults filled in, as written to the run directory."""
        out = self.core.model_dump(mode="json", exclude_none=True)
        for role, sel in self.selected.items():
            table, _, rest = role.partition(".")
            opts = sel.options.model_dump(mode="json", exclude_none=True)
            if table in COMPONENT_MAPS:
                out.setdefault(table, {})[rest] = opts
            elif rest.startswith("routes."):  # [reward.routes."SOURCE"]: the function and its options
                out[table]["routes"][rest[len("routes.") :]] = {"function": sel.component.name, **opts}
            else:
                out[table].update(opts)
        out["plugins"] = {
            role: {
                "name": s.component.name,
                "distribution": s.component.distribution,
                "version": s.component.version,
            }
            for role, s in {**self.selected, **self.data_sources}.items()
        }
        return out


# ----------------------------------------------------------------------------- overrides


def parse_value(text: str) -> Any:
    """A TOML value (``0.7``, ``true``, ``[1, 2]``, ``"x"``), or the text itself as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _set_dotted(doc: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = doc
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value


def _deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


class _EnvOverrides(BaseSettings):
    """Environment overrides: ``RLCORE_ROLLOUT__TEMPERATURE=0.7`` sets ``rollout.temperature``."""

    model_config = SettingsConfigDict(env_prefix="RLCORE_", env_nested_delimiter="__", extra="ignore")

    run: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    rollout: dict[str, Any] | None = None
    reward: dict[str, Any] | None = None
    algorithm: dict[str, Any] | None = None
    critic: dict[str, Any] | None = None
    trainer: dict[str, Any] | None = None
    agent: dict[str, Any] | None = None
    tools: dict[str, Any] | None = None
    loggers: dict[str, Any] | None = None
    launcher: dict[str, Any] | None = None


def _parse_leaves(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _parse_leaves(v) for k, v in node.items()}
    return parse_value(node) if isinstance(node, str) else node


def env_overrides(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The manifest values the environment sets; a variable that cannot set one is a
    :class:`ManifestError` naming it."""
    try:
        if environ is None:
            settings = _EnvOverrides()
        else:
            old = dict(os.environ)
            try:
                os.environ.clear()
                os.environ.update(environ)
                settings = _EnvOverrides()
            finally:
                os.environ.clear()
                os.environ.update(old)
    except ValidationError as exc:
        variables = env_variables(environ)
        problems = []
        for err in exc.errors():
            table = str(err["loc"][0]) if err["loc"] else ""
            variable = variables.get(table, f"RLCORE_{table.upper()}")
            problems.append(
                Problem(
                    table,
                    (
                        f"the environment variable {variable} must hold a JSON object of [{table}] keys "
                        f"(or set one key: RLCORE_{table.upper()}__KEY=value); got {_describe(err.get('input'))}"
                    ),
                    file="<environment>",
                )
            )
        raise ManifestError(problems) from None
    return {k: _parse_leaves(v) for k, v in settings.model_dump(exclude_none=True).items()}


def env_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """dotted key -> the ``RLCORE_...`` variable that sets it, as the environment spells it
    (``trainer.steps`` -> ``RLCORE_TRAINER__STEPS``; ``trainer`` -> ``RLCORE_TRAINER``)."""
    environ = os.environ if environ is None else environ
    tables = set(_EnvOverrides.model_fields)
    found: dict[str, str] = {}
    for name in environ:
        if not name.upper().startswith("RLCORE_"):
            continue
        parts = name[len("RLCORE_") :].lower().split("__")
        if parts[0] in tables:
            found[".".join(parts)] = name
    return found


# ----------------------------------------------------------------------------- paths


def resolve_path(value: str, base_dir: Path) -> str:
    """``package:NAME`` is an installed package's directory; a relative path that exists is taken
    relative to the manifest; anything else (a hub id, ``synthetic:...``) is left as it is."""
    if value.startswith("package:"):
        spec = importlib.util.find_spec(value.removeprefix("package:"))
        if spec is None or not spec.submodule_search_locations:
            raise RlcoreError(f"package {value.removeprefix('package:')!r} is not installed")
        return str(Path(list(spec.submodule_search_locations)[0]))
    if ":" in value.split("/")[0] and not Path(value).exists():
        return value  # a scheme such as synthetic:addition
    candidate = Path(value).expanduser()
    if not candidate.is_absolute():
        candidate = base_dir / candidate
    looks_local = value.startswith(("/", "./", "../", "~")) or candidate.exists()
    return str(candidate.resolve()) if looks_local else value


# ----------------------------------------------------------------------------- loading


class _Collector:
    def __init__(
        self,
        path: Path,
        lines: dict[str, int],
        overridden: dict[str, str] | None = None,
        end_line: int | None = None,
    ):
        """``end_line``: the file's last line, where a missing table is reported (it goes after it)."""
        self.path, self.lines, self.problems = path, lines, []
        self.overridden: dict[str, str] = dict(overridden or {})  # dotted key -> where its value came from
        self.end_line = end_line
        self.text = ""  # the manifest's text, for hints drawn from its comments

    def add(self, key: str, message: str, missing: bool = False) -> None:
        # The override that set this key, a table above it or a key below it; the most specific wins.
        origins = [
            o for o in self.overridden if key == o or key.startswith(o + ".") or o.startswith(key + ".")
        ]
        if origins:
            origin = max(origins, key=lambda o: (o == key, len(o)))
            message += f" (from an override: {self.overridden[origin]})"
            line = None
        else:
            line = line_of(self.lines, key)
            if line is None and missing:
                line = self.end_line
        self.problems.append(Problem(key=key, message=message, line=line, file=str(self.path)))


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _pydantic_problems(
    col: _Collector, exc: ValidationError, prefix: str, model: type[BaseModel] | None = None
) -> None:
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join([p for p in [prefix, *loc] if p])
        kind = err["type"]
        if kind == "extra_forbidden":
            parent = _model_at(model, loc[:-1]) if model else None
            fields = sorted(parent.model_fields) if parent else []
            hint = did_you_mean(loc[-1], fields)
            msg = "unknown key" + (f"; did you mean {hint!r}?" if hint else "")
            if fields:
                msg += " Expected one of: " + ", ".join(fields)
        elif kind == "missing":
            table = _model_at(model, loc) if model else None
            if table is not None:
                needed = [n for n, f in table.model_fields.items() if f.is_required()]
                msg = f"required table is missing: add [{key}]" + (
                    f" with {', '.join(f'{n} = ...' for n in needed)}" if needed else ""
                )
            else:
                msg = "required key is missing"
            col.add(key, msg, missing=True)
            continue
        else:
            msg = f"{err['msg']}; got {_describe(err.get('input'))}"
        col.add(key, msg)


def _model_at(model: type[BaseModel], loc: list[str]) -> type[BaseModel] | None:
    current: Any = model
    for part in loc:
        fld = getattr(current, "model_fields", {}).get(part)
        if fld is None:
            return None
        current = fld.annotation
        args = getattr(current, "__args__", None)
        if args:  # Optional[Model]
            current = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def load_manifest(
    path: str | os.PathLike[str],
    overrides: list[str] | tuple[str, ...] = (),
    *,
    registry: Registry | None = None,
    environ: Mapping[str, str] | None = None,
) -> ResolvedManifest:
    """Read, override and validate a manifest; raise :class:`ManifestError` with every problem."""
    path = Path(path)
    shown = path
    if not path.is_file():
        raise ManifestError(
            [Problem("", "no such manifest file" if not path.exists() else "not a file", file=str(shown))]
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError([Problem("", f"cannot read the file: {exc}", file=str(shown))]) from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = _TOML_POSITION.search(str(exc))
        line = int(match.group(1)) if match else None
        message = _TOML_POSITION.sub("", str(exc)).strip()
        duplicate = (
            find_duplicate(text) if message.startswith(("Cannot overwrite", "Cannot declare")) else None
        )
        if duplicate is not None:  # tomllib names neither the key nor the table
            problem = Problem(
                duplicate.key, f"invalid TOML: {duplicate.describe()}", line=duplicate.line, file=str(shown)
            )
            raise ManifestError([problem]) from None
        if match:
            message += f" (column {match.group(2)})"
        raise ManifestError([Problem("", f"invalid TOML: {message}", line=line, file=str(shown))]) from None

    col = _Collector(shown, key_lines(text), end_line=max(1, len(text.splitlines())))
    col.text = text
    env = env_overrides(environ)
    variables = env_variables(environ)
    for table, values in env.items():
        for key in _flatten(values, table):
            variable = variables.get(key) or next(
                (variables[v] for v in sorted(variables, key=len, reverse=True) if key.startswith(v + ".")),
                None,
            )
            col.overridden[key] = f"the environment variable {variable}" if variable else "the environment"
    _deep_merge(doc, env)
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or not re.fullmatch(r"[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*", key):
            col.problems.append(
                Problem("", f"--set expects TABLE.KEY=VALUE, got {item!r}", file="<command line>")
            )
            continue
        col.overridden[key] = f"--set {item.strip()}"
        _set_dotted(doc, key, parse_value(value.strip()))
    if col.problems:
        raise ManifestError(col.problems)
    return validate_document(doc, path.resolve(), col, registry or Registry.discover())


def _flatten(values: Any, prefix: str) -> list[str]:
    if isinstance(values, dict):
        return [k for key, v in values.items() for k in _flatten(v, f"{prefix}.{key}")]
    return [prefix]


def validate_document(
    doc: dict[str, Any], path: Path, col: _Collector, registry: Registry
) -> ResolvedManifest:
    base_dir = path.parent
    doc = _with_plugin_defaults(_without_retired(doc, col), col, registry)
    core_doc = copy.deepcopy(doc)
    extras: dict[str, dict[str, Any]] = {}

    # Phase 1: the core tables, with each component table's extra keys set aside.
    for table in COMPONENT_TABLES:
        value = core_doc.get(table)
        if isinstance(value, dict):
            model = Manifest.model_fields[table].annotation
            core_keys = set(model.model_fields)  # type: ignore[union-attr]
            extras[table] = {k: value.pop(k) for k in list(value) if k not in core_keys}
    for table in Manifest.model_fields:
        if table in core_doc and not isinstance(core_doc[table], dict):
            col.add(table, f"expected a table [{table}], got {_describe(core_doc[table])}")
            core_doc.pop(table)
    core: Manifest | None = None
    try:
        core = Manifest.model_validate(core_doc)
    except ValidationError as exc:
        _pydantic_problems(col, exc, "", Manifest)

    # Phase 2: every component the manifest selects, with its own options.
    selected: dict[str, Selected] = {}
    for table, selectors in COMPONENT_TABLES.items():
        table_doc = doc.get(table) if isinstance(doc.get(table), dict) else {}
        table_model = Manifest.model_fields[table].annotation
        chosen: list[tuple[str, str, Component]] = []
        for field_name, kind in selectors:
            name = table_doc.get(field_name, table_model.model_fields[field_name].default)  # type: ignore[union-attr]
            if not isinstance(name, str) or name is ... or not name:
                continue  # phase 1 reported it
            component, options_seed = _lookup(registry, kind, name, base_dir, col, f"{table}.{field_name}")
            if component is not None:
                chosen.append((field_name, kind, component))
                for key, value in options_seed.items():
                    extras.setdefault(table, {}).setdefault(key, value)
        _validate_table_options(col, registry, table, extras.get(table, {}), chosen, selected)

    _validate_reward_routes(col, registry, doc, base_dir, selected)
    data_sources = _validate_data_sources(col, registry, doc, base_dir)
    _check_steps(col, doc)
    for table, kind in COMPONENT_MAPS.items():
        entries = doc.get(table)
        if not isinstance(entries, dict):
            continue
        for name, options in entries.items():
            key = f"{table}.{name}"
            if not isinstance(options, dict):
                col.add(key, f"expected a table [{key}] of options, got {_describe(options)}")
                continue
            component, seed = _lookup(registry, kind, name, base_dir, col, key, options=options)
            if component is None:
                continue
            _validate_options(col, component, {**seed, **options}, key, selected, role=key)
    if core is not None:
        for name in core.trainer.loggers:
            if f"loggers.{name}" not in selected:
                component, _ = _lookup(registry, "metrics_sink", name, base_dir, col, "trainer.loggers")
                if component is not None:
                    _validate_options(col, component, {}, f"loggers.{name}", selected, role=f"loggers.{name}")
        for name in core.loggers:
            if name not in core.trainer.loggers:
                col.add(
                    f"loggers.{name}",
                    f"options are given for logger {name!r} but trainer.loggers does not enable it",
                )

    _check_targets(col, doc, selected)

    if col.problems:
        raise ManifestError(col.problems)
    assert core is not None
    _resolve_paths(core, base_dir, col)
    if col.problems:
        raise ManifestError(col.problems)
    return ResolvedManifest(path=path, raw=doc, core=core, selected=selected, data_sources=data_sources)


def _without_retired(doc: dict[str, Any], col: _Collector) -> dict[str, Any]:
    """``doc`` without the keys rlcore no longer has, each reported with what replaces it."""
    out = doc
    for dotted, message in RETIRED_KEYS.items():
        table, _, key = dotted.partition(".")
        if isinstance(doc.get(table), dict) and key in doc[table]:
            col.add(dotted, f"{key} {message}")
            if out is doc:
                out = copy.copy(doc)
            out[table] = {k: v for k, v in out[table].items() if k != key}
    return out


def _validate_data_sources(
    col: _Collector, registry: Registry, doc: dict[str, Any], base_dir: Path
) -> dict[str, Selected]:
    """``[data] train`` and ``val`` that name a data source (``reasoning_gym:TASK?...`` or a
    ``[data.train]`` table) are validated by that source's options model; files are checked later.
    Returns each source found, by role. ``base_dir`` (the manifest's directory) reaches the
    options models as their validation context, for paths they name."""
    from rlcore.data.sources import source_options, source_spec

    found: dict[str, Selected] = {}
    data = doc.get("data")
    if not isinstance(data, dict):
        return found
    for key in ("train", "val"):
        spec = data.get(key)
        if not isinstance(spec, (str, dict)) or (isinstance(spec, str) and Path(spec).exists()):
            continue
        try:
            parsed = source_spec(spec)
        except RlcoreError as exc:
            col.add(f"data.{key}", str(exc))
            continue
        if parsed is None:
            continue
        try:
            component, options = source_options(parsed, registry, base_dir)
        except RlcoreError as exc:
            col.add(f"data.{key}", str(exc))
            continue
        found[f"data.{key}"] = Selected(role=f"data.{key}", component=component, options=options)
    return found


def _with_plugin_defaults(doc: dict[str, Any], col: _Collector, registry: Registry) -> dict[str, Any]:
    """``doc`` with each selecting key of :data:`PLUGIN_DEFAULTS` (``[rollout] engine``,
    ``[algorithm] advantage``) that the manifest leaves out set to the installed component marked
    ``default``, so the resolved manifest names it. None installed, or several: a problem."""
    out = doc
    for table, selectors in COMPONENT_TABLES.items():
        if table in doc and not isinstance(doc[table], dict):
            continue  # phase 1 reports it
        for field_name, kind in selectors:
            if (table, field_name) not in PLUGIN_DEFAULTS or field_name in doc.get(table, {}):
                continue
            defaults = [c for c in registry.components(kind).values() if c.default]
            if len(defaults) == 1:
                if out is doc:
                    out = copy.copy(doc)
                out[table] = {**out.get(table, {}), field_name: defaults[0].name}
                continue
            what = kind.replace("_", " ")
            if defaults:
                said = f"several installed {what}s are marked default ({', '.join(sorted(c.name for c in defaults))})"
            else:
                installed = sorted(registry.components(kind))
                said = f"no installed {what} is marked default (installed: {', '.join(installed) or 'none'})"
            col.add(f"{table}.{field_name}", f"required key is missing: {said}; name one")
    return out


def _check_steps(col: _Collector, doc: dict[str, Any]) -> None:
    """``[trainer]`` says how long to train: ``steps`` or ``total_epochs``, one of them."""
    trainer = doc.get("trainer")
    if not isinstance(trainer, dict):
        return  # phase 1 reported it
    if "steps" not in trainer and "total_epochs" not in trainer:
        col.add("trainer.steps", "required key is missing (or give total_epochs, passes over data.train)")
    elif "steps" in trainer and "total_epochs" in trainer:
        col.add(
            "trainer.total_epochs",
            "set one of steps (optimizer steps) and total_epochs (passes over data.train), not both",
        )


def _validate_reward_routes(
    col: _Collector, registry: Registry, doc: dict[str, Any], base_dir: Path, selected: dict[str, Selected]
) -> None:
    """``[reward]`` names a function, routes, or both. Each ``[reward.routes."SOURCE"]`` table selects
    a reward function (``function = NAME``) and gives its options, validated as ``[reward]``'s own
    are; the role is ``reward.routes.SOURCE``."""
    reward = doc.get("reward")
    if not isinstance(reward, dict):
        return  # phase 1 reported it
    routes = reward.get("routes")
    if reward.get("function") is None and not routes:
        col.add(
            "reward.function",
            'required key is missing (or give [reward.routes."DATA_SOURCE"] tables, a function per data source)',
        )
    if not isinstance(routes, dict):
        return
    for source, table in routes.items():
        key = f"reward.routes.{source}"
        if not isinstance(table, dict):
            col.add(
                key,
                f'expected a table [reward.routes."{source}"] with function = "NAME", got {_describe(table)}',
            )
            continue
        options = dict(table)
        name = options.pop("function", None)
        if not isinstance(name, str) or not name:
            col.add(f"{key}.function", "missing: the reward function that scores this data source's rows")
            continue
        component, seed = _lookup(registry, "reward_function", name, base_dir, col, f"{key}.function")
        if component is not None:
            _validate_options(col, component, {**seed, **options}, key, selected, role=key)


def _check_targets(col: _Collector, doc: dict[str, Any], selected: dict[str, Selected]) -> None:
    """The code each selected component's ``target_option`` names (``python:rewards.py:score``)
    must exist and be callable, so that a misspelled function fails here and not when the run
    builds it. A file target is loaded (the user's file: no torch unless it imports it); a module
    target is only looked for, not imported (its package might import anything)."""
    from rlcore.targets import load_target

    for role, chosen in selected.items():
        option = chosen.component.target_option
        target = getattr(chosen.options, option, None) if option else None
        if not isinstance(target, str):
            continue
        table, _, field_name = role.partition(".")
        written = doc.get(table, {}).get(field_name) if isinstance(doc.get(table), dict) else None
        if field_name.startswith("routes."):  # [reward.routes."SOURCE"] function = "python:..."
            key = f"{role}.function"
        elif isinstance(written, str) and written.startswith(f"{chosen.component.name}:"):
            key = role  # given inline: function = "python:rewards.py:score"
        else:
            key = f"{role}.{option}" if table in COMPONENT_MAPS else f"{table}.{option}"
        where, sep, name = target.rpartition(":")
        if not sep or not where or not name:
            col.add(key, f"expected 'FILE.py:FUNCTION' or 'package.module:FUNCTION', got {target!r}")
            continue
        what = chosen.component.kind.split("_")[0] or "code"  # "reward", "tool": as errors at run time say
        if not where.endswith(".py"):
            if importlib.util.find_spec(where.split(".")[0]) is None:
                col.add(
                    key,
                    f"{what} module {where!r} cannot be imported: no module named {where.split('.')[0]!r}",
                )
            continue
        try:
            obj, origin = load_target(target, what="function", source=what)
        except RlcoreError as exc:
            col.add(key, str(exc))
            continue
        if not callable(obj) and not callable(getattr(obj, "score_batch", None)):
            col.add(
                key,
                f"{origin}: {name!r} is not a function (or a batched reward) but a {type(obj).__name__} value",
            )


def _lookup(
    registry: Registry,
    kind: str,
    name: str,
    base_dir: Path,
    col: _Collector,
    key: str,
    options: dict | None = None,
) -> tuple[Component | None, dict[str, Any]]:
    """Find a component. ``NAME:TARGET`` selects a component that declares a ``target_option``
    (the builtin ``python`` reward); a table of a name nobody registered selects the component
    whose ``selected_by`` option it sets (the ``function`` tool). Returns the component and the
    options the name itself gave."""
    known = registry.components(kind)
    prefix, sep, target = name.partition(":")
    inline = known.get(prefix) if sep else None
    if inline is not None and inline.target_option:
        file_part, sep, func = target.rpartition(":")
        if not sep or not file_part or not func:
            col.add(
                key,
                f"expected '{prefix}:FILE.py:FUNCTION' or '{prefix}:package.module:FUNCTION', got {name!r}",
            )
            return None, {}
        if file_part.endswith(".py"):
            file_path = Path(file_part) if Path(file_part).is_absolute() else base_dir / file_part
            if not file_path.is_file():
                col.add(key, f"{prefix} file {str(file_path)!r} does not exist")
                return None, {}
            file_part = str(file_path)
        return inline, {inline.target_option: f"{file_part}:{func}"}
    if name not in known and options:
        chosen = [c for c in known.values() if c.selected_by and c.selected_by in options]
        if len(chosen) == 1:
            return chosen[0], {}
    try:
        return registry.get(kind, name), {}
    except RlcoreError as exc:
        col.add(key, str(exc))
        return None, {}


def _validate_table_options(
    col: _Collector,
    registry: Registry,
    table: str,
    extras: dict[str, Any],
    chosen: list[tuple[str, str, Component]],
    selected: dict[str, Selected],
) -> None:
    """Give each extra key of a component table to the component(s) whose options declare it."""
    per_component: dict[str, dict[str, Any]] = {f: {} for f, _, _ in chosen}
    for key, value in extras.items():
        owners = [f for f, _, c in chosen if key in c.options.model_fields]
        if owners:
            for f in owners:
                per_component[f][key] = value
            continue
        if not chosen:
            continue  # the selector itself failed; reported already
        core_fields = sorted(Manifest.model_fields[table].annotation.model_fields)  # type: ignore[union-attr]
        descriptions = [f"[{table}] takes " + ", ".join(core_fields)]
        all_fields: list[str] = list(core_fields)
        for _f, kind, c in chosen:
            fields = sorted(c.options.model_fields)
            all_fields += fields
            descriptions.append(
                f"{kind.replace('_', ' ')} {c.name!r} takes "
                + (", ".join(fields) if fields else "no options")
            )
        message = "unknown key: " + "; ".join(descriptions)
        others: dict[str, list[str]] = {}  # kind -> every other installed component declaring the key
        for _, kind, c in chosen:
            for o in registry.components(kind).values():
                if o.name != c.name and key in o.options.model_fields:
                    others.setdefault(kind, []).append(o.name)
        if others:
            owners_text = " and ".join(_names_of(kind, names) for kind, names in others.items())
            message = (
                f"{key!r} is an option of {owners_text}, not of the selected one; "
                + message.removeprefix("unknown key: ")
            )
        else:
            hint = did_you_mean(key, all_fields)
            if hint:
                message = f"unknown key; did you mean {hint!r}? " + message.removeprefix("unknown key: ")
        col.add(f"{table}.{key}", message)
    for f, _kind, c in chosen:
        _validate_options(col, c, per_component[f], table, selected, role=f"{table}.{f}", forbid_extra=False)


def _names_of(kind: str, names: list[str]) -> str:
    """``rollout engine 'vllm'``, ``rollout engines 'sglang' and 'vllm'``."""
    quoted = [repr(n) for n in sorted(names)]
    if len(quoted) == 1:
        return f"{kind.replace('_', ' ')} {quoted[0]}"
    return f"{kind.replace('_', ' ')}s " + ", ".join(quoted[:-1]) + f" and {quoted[-1]}"


def _validate_options(
    col: _Collector,
    component: Component,
    options: dict[str, Any],
    prefix: str,
    selected: dict[str, Selected],
    *,
    role: str,
    forbid_extra: bool = True,
) -> None:
    try:
        # Validators that check files the options name read the manifest's directory from the context.
        value = component.options.model_validate(options, context={"manifest_dir": str(col.path.parent)})
    except ValidationError as exc:
        _pydantic_problems(col, exc, prefix, component.options if forbid_extra else None)
        return
    selected[role] = Selected(role=role, component=component, options=value)


_DATA_COMMANDS = {  # a data directory named so is what this command writes
    "gsm8k": "rlcore data gsm8k --input hub --output {dir}   (or --input a local copy of GSM8K)",
    "math": "rlcore data math --input MATH_DIR --output {dir}   (MATH in its published layout)",
}


def _data_hint(missing: Path, text: str) -> str:
    """How to make a missing data file: the ``rlcore data`` command the manifest's own comments
    give, else the one that writes a directory of that name, else where the converters are listed."""
    commands = [
        line.lstrip("#").strip()
        for line in text.splitlines()
        if line.lstrip().startswith("#") and "rlcore data " in line
    ]
    if commands:
        return f"; make it first with: {commands[0]} (as the manifest's comment says)"
    template = _DATA_COMMANDS.get(missing.parent.name.lower())
    if template:
        try:
            shown = missing.parent.relative_to(Path.cwd())
        except ValueError:
            shown = missing.parent
        return f"; make it first with: {template.format(dir=shown)}"
    return (
        "; `rlcore data --help` lists the converters that write verl-format parquet (gsm8k, math, synthetic)"
    )


def _resolve_paths(core: Manifest, base_dir: Path, col: _Collector) -> None:
    for key, getter, setter in (
        ("model.path", lambda: core.model.path, lambda v: setattr(core.model, "path", v)),
        ("model.tokenizer", lambda: core.model.tokenizer, lambda v: setattr(core.model, "tokenizer", v)),
        ("data.train", lambda: core.data.train, lambda v: setattr(core.data, "train", v)),
        ("data.val", lambda: core.data.val, lambda v: setattr(core.data, "val", v)),
        ("critic.path", lambda: core.critic.path, lambda v: setattr(core.critic, "path", v)),
    ):
        value = getter()
        if value is None or not isinstance(value, str):  # a data table names a source, not a path
            continue
        try:
            resolved = resolve_path(value, base_dir)
        except RlcoreError as exc:
            col.add(key, str(exc))
            continue
        if value.startswith(("/", "./", "../", "~")) and not Path(resolved).exists():
            hint = _data_hint(Path(resolved), col.text) if key.startswith("data.") else ""
            col.add(key, f"path {resolved!r} does not exist{hint}")
            continue
        setter(resolved)
    out = Path(core.run.output_dir).expanduser()
    core.run.output_dir = str(out if out.is_absolute() else (base_dir / out).resolve())
    if (
        core.model.gguf_file
        and Path(core.model.path).is_dir()
        and not (Path(core.model.path) / core.model.gguf_file).is_file()
    ):
        available = sorted(p.name for p in Path(core.model.path).glob("*.gguf"))
        col.add(
            "model.gguf_file",
            f"no file {core.model.gguf_file!r} in {core.model.path}; available: {', '.join(available) or 'none'}",
        )
