"""Testing helpers for rlcore plugin authors (loaded as a pytest plugin through ``pytest11``).

Fixtures (available in any pytest session once rlcore is installed):

- ``rlcore_registry``: an isolated registry holding only rlcore's builtins, so a test sees
  exactly the plugins it registers, whatever else is installed.
- ``rlcore_register``: ``rlcore_register(plugin_object, name="x")`` registers a plugin into that
  registry for one test and returns its :class:`~rlcore.registry.PluginInfo`.
- ``rlcore_manifest``: ``rlcore_manifest({"model": {...}, ...})`` writes a TOML manifest into the
  test's temporary directory and returns its path.
- ``tiny_model``: (session) the directory of a random 2-layer Llama with SmolLM2's tokenizer
  (:mod:`rlcore.testing.models`), built on first use.

Conformance kits, one per component kind, that any plugin's own tests can run:
:mod:`rlcore.testing.engines`, :mod:`rlcore.testing.algorithms`, :mod:`rlcore.testing.rewards`,
:mod:`rlcore.testing.tools`, :mod:`rlcore.testing.shaping`, :mod:`rlcore.testing.agents`,
:mod:`rlcore.testing.sinks`, :mod:`rlcore.testing.launchers` (``rlcore.kinds`` names each kind's).

Helpers: :func:`require_plugins` (skip a test that needs other plugins when they are absent),
:mod:`rlcore.testing.runs` (a tiny training manifest, the CLI in a subprocess, a run's
metrics), :mod:`rlcore.testing.models` (tiny random models), :mod:`rlcore.testing.api` (the
rlcore modules a plugin may import, :data:`~rlcore.testing.api.PLUGIN_API`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import tomli_w

from rlcore.registry import PluginInfo, Registry


def isolated_registry() -> Registry:
    """A registry with rlcore's builtins only (external plugins are not loaded)."""
    return Registry.discover(external=False, disabled=())


def register(
    registry: Registry,
    plugin: Any,
    name: str | None = None,
    distribution: str | None = None,
    version: str = "0.0.test",
) -> PluginInfo:
    """Register ``plugin`` (a module or an object with ``@rlcore.hookimpl`` methods)."""
    name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
    return registry.register(plugin, name=name, distribution=distribution or name, version=version)


def write_manifest(directory: Path, document: dict[str, Any], name: str = "manifest.toml") -> Path:
    """Write ``document`` as TOML to ``directory/name``; returns that path."""
    path = Path(directory) / name
    path.write_text(tomli_w.dumps(document), encoding="utf-8")
    return path


def build_subject(component: Any, options: Any, context: Any) -> Any:
    """What a conformance kit checks: a :class:`~rlcore.components.Component` record built as a run
    builds it (with ``options`` and the ``BuildContext``), or an object already built, taken as it
    is (``options`` must then be None)."""
    from rlcore.components import Component

    if isinstance(component, Component):
        return component.build(options or {}, context)
    if options is not None:
        raise TypeError("options are only used with a Component record; pass the built object alone")
    return component


def require_plugins(*packages: str) -> None:
    """Skip the calling test (or, called at module level, the module) unless the plugin packages
    ``packages`` (``"rlcore_rollout_hf"``, ...) are installed. For tests that use components of
    plugins their own distribution does not depend on: .ci/plugins_alone.sh runs each plugin's
    tests without the other plugins, and there such a test skips, saying what it lacks."""
    __tracebackhide__ = True  # pytest reports the skip at the caller's line
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        import pytest

        pytest.skip(
            f"needs other plugins' packages, not installed here: {', '.join(missing)}",
            allow_module_level=True,
        )
