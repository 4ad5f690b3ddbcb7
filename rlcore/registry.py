"""Discovers plugins through the ``rlcore`` entry-point group and indexes their components.

Builtins register through the same hooks as third parties, but are registered first and
directly, so they work even when external plugins are switched off (``--no-plugins`` or
``RLCORE_NO_PLUGINS=1``) or rlcore runs from a source tree. A plugin that fails to import, or
whose hooks fail, is recorded as broken with its error; everything else keeps working.
A name provided twice is a conflict naming both providers; the last registration never wins.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from importlib.metadata import version as dist_version
from types import ModuleType
from typing import Any

import pluggy
from loguru import logger

from rlcore import hookspecs
from rlcore.components import KINDS, Command, Component
from rlcore.errors import BrokenPluginError, ConflictError, UnknownComponentError, did_you_mean
from rlcore.kinds import install_hints

ENTRY_POINT_GROUP = "rlcore"
BUILTIN_MODULES = ("rlcore.builtin",)

# (kind, name) -> the first-party distribution providing it, so an unknown name can say what to
# install. Kept by hand in the table of kinds (an uninstalled plugin cannot be asked);
# tests/test_first_party.py checks that it equals exactly what plugins/*/ register.
FIRST_PARTY: dict[tuple[str, str], str] = install_hints()


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


@dataclass
class PluginInfo:
    """One registered plugin module and what it provides."""

    name: str
    distribution: str
    version: str
    status: str = "ok"  # ok | broken | disabled
    error: str = ""
    builtin: bool = False
    components: dict[str, list[str]] = field(default_factory=dict)
    # kind -> name -> where the factory lives ("package.module:attr"), for `rlcore plugins --verbose`
    factories: dict[str, dict[str, str]] = field(default_factory=dict)

    def as_dict(self, verbose: bool = False) -> dict[str, Any]:
        out = {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "error": self.error,
            "builtin": self.builtin,
            "components": self.components,
        }
        if verbose:
            out["factories"] = self.factories
        return out


def target_path(target: Any) -> str:
    """Where a factory or command function lives: a ``"module:attr"`` string as given, or a
    callable's ``module:qualname``."""
    if isinstance(target, str):
        return target
    named = target if hasattr(target, "__qualname__") else type(target)
    module = getattr(named, "__module__", None) or "?"
    return f"{module}:{getattr(named, '__qualname__', repr(target))}"


class Registry:
    """The set of installed components, by kind and name."""

    def __init__(self, *, external: bool | None = None, disabled: Iterable[str] | None = None):
        if external is None:
            external = not _env_flag("RLCORE_NO_PLUGINS")
        if disabled is None:
            disabled = [
                p.strip() for p in os.environ.get("RLCORE_DISABLE_PLUGINS", "").split(",") if p.strip()
            ]
        self.external = external
        self.disabled = set(disabled)
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self._components: dict[str, dict[str, Component]] = {kind: {} for kind in KINDS}
        self._conflicts: dict[tuple[str, str], list[str]] = {}
        self._indexed = False

    # ------------------------------------------------------------------ loading

    @classmethod
    def discover(cls, **kwargs: Any) -> Registry:
        registry = cls(**kwargs)
        for module in BUILTIN_MODULES:
            registry.register(
                importlib.import_module(module), name=module, distribution="rlcore", builtin=True
            )
        if registry.external:
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                registry._load_entry_point(ep)
        return registry

    def _load_entry_point(self, ep: EntryPoint) -> None:
        dist = ep.dist.name if ep.dist is not None else "(unknown)"
        ver = ep.dist.version if ep.dist is not None else ""
        if ep.value in BUILTIN_MODULES:
            return  # rlcore's own entry point: already registered directly
        name = ep.name
        if name in self.plugins:
            name = f"{dist}:{ep.name}"
        if ep.name in self.disabled or dist in self.disabled:
            self.plugins[name] = PluginInfo(name, dist, ver, status="disabled")
            return
        try:
            module = ep.load()
        except BaseException as exc:  # noqa: BLE001 - a broken plugin must never stop rlcore
            if isinstance(exc, KeyboardInterrupt):
                raise
            logger.warning("plugin {} from {} {} failed to import: {!r}", ep.name, dist, ver, exc)
            self.plugins[name] = PluginInfo(
                name, dist, ver, status="broken", error=f"{type(exc).__name__}: {exc}"
            )
            return
        self.register(module, name=name, distribution=dist, version=ver)

    def register(
        self,
        plugin: ModuleType | object,
        *,
        name: str | None = None,
        distribution: str | None = None,
        version: str | None = None,
        builtin: bool = False,
    ) -> PluginInfo:
        """Register a plugin object (usually a module of ``@hookimpl`` functions)."""
        name = name or getattr(plugin, "__name__", None) or repr(plugin)
        distribution = distribution or name
        if version is None:
            try:
                version = dist_version(distribution)
            except Exception:  # noqa: BLE001 - not an installed distribution
                version = ""
        info = PluginInfo(name, distribution, version, builtin=builtin)
        self.plugins[name] = info
        try:
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            self._unregister_quietly(name)
            info.status, info.error = "broken", _explain_validation(exc)
        except ValueError as exc:
            info.status, info.error = "broken", str(exc)
        self._indexed = False
        return info

    def _unregister_quietly(self, name: str) -> None:
        try:
            self.pm.unregister(name=name)
        except Exception:  # noqa: BLE001
            pass

    def unregister(self, name: str) -> None:
        self._unregister_quietly(name)
        self.plugins.pop(name, None)
        self._indexed = False

    # ------------------------------------------------------------------ indexing

    def _index(self) -> None:
        if self._indexed:
            return
        self._components = {kind: {} for kind in KINDS}
        self._conflicts = {}
        for info in self.plugins.values():
            if info.status == "ok":  # a broken plugin keeps the names it was seen to provide
                info.components = {}
                info.factories = {}
        for kind, (hook_name, _) in KINDS.items():
            hook = getattr(self.pm.hook, hook_name)
            # In registration order: builtins first, then entry points.
            for impl in hook.get_hookimpls():
                info = self.plugins.get(impl.plugin_name)
                if info is None or info.status != "ok":
                    continue
                try:
                    records = impl.function()
                    records = _check_records(records, hook_name)
                except Exception as exc:  # noqa: BLE001 - a failing hook marks its plugin broken
                    info.status, info.error = "broken", f"{hook_name}() failed: {type(exc).__name__}: {exc}"
                    continue
                for record in records:
                    stamped = record.stamped(
                        kind=kind, distribution=info.distribution, version=info.version, plugin=info.name
                    )
                    info.components.setdefault(kind, []).append(record.name)
                    info.factories.setdefault(kind, {})[record.name] = target_path(record.factory)
                    existing = self._components[kind].get(record.name)
                    if existing is not None:
                        providers = self._conflicts.setdefault((kind, record.name), [existing.provider])
                        providers.append(stamped.provider)
                        continue
                    self._components[kind][record.name] = stamped
        # A plugin that broke while indexing must not contribute partially.
        broken = {n for n, i in self.plugins.items() if i.status == "broken"}
        for kind in KINDS:
            self._components[kind] = {
                n: c for n, c in self._components[kind].items() if c.plugin not in broken
            }
        self._indexed = True

    # ------------------------------------------------------------------ queries

    def components(self, kind: str) -> dict[str, Component]:
        _check_kind(kind)
        self._index()
        return dict(self._components[kind])

    def conflicts(self) -> dict[tuple[str, str], list[str]]:
        self._index()
        return dict(self._conflicts)

    def plugin_infos(self) -> list[PluginInfo]:
        self._index()
        return list(self.plugins.values())

    def commands(self) -> list[Command]:
        """Sub-commands from hook ``rlcore_commands``, builtins (``data``, ``eval``, ``plot``) first, each
        stamped with its plugin and distribution. A hook that fails marks its plugin broken."""
        found: list[Command] = []
        for impl in self.pm.hook.rlcore_commands.get_hookimpls():  # in registration order
            info = self.plugins.get(impl.plugin_name)
            if info is None or info.status != "ok":
                continue
            try:
                records = list(impl.function() or [])
                if not all(isinstance(r, Command) for r in records):
                    raise TypeError("rlcore_commands must return Command records")
            except Exception as exc:  # noqa: BLE001
                info.status, info.error = "broken", f"rlcore_commands() failed: {type(exc).__name__}: {exc}"
                continue
            found.extend(r.stamped(distribution=info.distribution, plugin=info.name) for r in records)
        return found

    def get(self, kind: str, name: str) -> Component:
        """The component ``name`` of ``kind``, or a clear error saying what is available."""
        _check_kind(kind)
        self._index()
        if (kind, name) in self._conflicts:
            raise ConflictError(kind, name, self._conflicts[(kind, name)])
        found = self._components[kind].get(name)
        if found is not None:
            return found
        broken = [i for i in self.plugins.values() if i.status == "broken"]
        providers = [
            i
            for i in broken
            if FIRST_PARTY.get((kind, name)) == i.distribution or name in i.components.get(kind, [])
        ]
        if providers:
            info = providers[0]
            raise BrokenPluginError(
                f"{kind.replace('_', ' ')} {name!r} comes from {_plugin_label(info)}, which failed to load: {info.error}"
            )
        available = self._components[kind]
        hint = FIRST_PARTY.get((kind, name))
        # A plugin that failed before saying what it provides (its import, or this kind's hook, failed) may be the one.
        unknown = [f"{_plugin_label(i)} ({i.error})" for i in broken if kind not in i.components]
        raise UnknownComponentError(kind, name, available, install_hint=hint, maybe_broken=unknown)


def _plugin_label(info: PluginInfo) -> str:
    """``plugin short from rlcore-short 0.1``, or ``rlcore-short 0.1`` where the names agree."""
    dist = f"{info.distribution} {info.version}".strip()
    return (
        dist
        if info.name in (info.distribution, info.distribution.replace("-", "_"))
        else f"plugin {info.name!r} of {dist}"
    )


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown component kind {kind!r}; kinds: {', '.join(KINDS)}")


def _check_records(records: Any, hook_name: str) -> list[Component]:
    if records is None:
        return []
    if isinstance(records, Component):
        records = [records]
    records = list(records)
    for record in records:
        if not isinstance(record, Component):
            raise TypeError(f"{hook_name} must return Component records, got {type(record).__name__}")
    return records


def _explain_validation(exc: pluggy.PluginValidationError) -> str:
    text = str(exc)
    for word in text.replace("'", " ").split():
        if word.startswith("rlcore_"):
            hint = did_you_mean(word, [hook for hook, _ in KINDS.values()])
            if hint and hint != word:
                return f"{text} (did you mean {hint}?)"
    return text
