"""rlcore.registry.FIRST_PARTY (which first-party distribution to install for an unknown name) is
kept by hand, since a plugin that is not installed cannot be asked. This checks it equals exactly
what the plugins in plugins/*/ register, so it cannot drift."""

from __future__ import annotations

import importlib
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from rlcore.components import KINDS
from rlcore.errors import UnknownComponentError
from rlcore.registry import ENTRY_POINT_GROUP, FIRST_PARTY, Registry

ROOT = Path(__file__).resolve().parents[1]  # the repository


def first_party_entry_points() -> list[tuple[str, str, str]]:
    """(distribution, entry-point name, module) of every plugin under plugins/, from its pyproject."""
    found = []
    for pyproject in sorted(ROOT.glob("plugins/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        for name, module in project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {}).items():
            found.append((project["name"], name, module))
    return found


def test_every_plugin_directory_is_a_distribution_with_an_rlcore_entry_point():
    directories = {p.name for p in (ROOT / "plugins").iterdir() if (p / "src").is_dir()}
    with_entry_points = {
        pyproject.parent.name
        for pyproject in ROOT.glob("plugins/*/pyproject.toml")
        if ENTRY_POINT_GROUP in tomllib.loads(pyproject.read_text())["project"].get("entry-points", {})
    }
    assert directories and directories == with_entry_points


def test_first_party_table_equals_what_the_plugins_register():
    registry = Registry(external=False, disabled=[])  # no builtins: they are not in the table
    for distribution, name, module in first_party_entry_points():
        info = registry.register(importlib.import_module(module), name=name, distribution=distribution)
        assert info.status == "ok", f"{distribution} ({module}): {info.error}"
    assert registry.conflicts() == {}
    registered = {
        (kind, name): component.distribution
        for kind in KINDS
        for name, component in registry.components(kind).items()
    }
    missing = {key: dist for key, dist in registered.items() if key not in FIRST_PARTY}
    stale = {key: dist for key, dist in FIRST_PARTY.items() if key not in registered}
    wrong = {
        key: (FIRST_PARTY[key], dist)
        for key, dist in registered.items()
        if key in FIRST_PARTY and FIRST_PARTY[key] != dist
    }
    assert (missing, stale, wrong) == ({}, {}, {}), (
        "rlcore/registry.py FIRST_PARTY is out of date: add `missing`, remove `stale`, fix `wrong` (table, actual)"
    )


def test_installed_entry_points_match_the_pyprojects():
    """The plugins are installed (editable) as their pyprojects declare, so the table's names are
    the names `pip install` knows."""
    installed = {
        (ep.dist.name, ep.name, ep.value)
        for ep in entry_points(group=ENTRY_POINT_GROUP)
        if ep.dist is not None
    }
    for expected in first_party_entry_points():
        assert expected in installed, f"{expected} is not installed; run scripts/setup.sh"


@pytest.mark.parametrize(("kind", "name"), sorted(FIRST_PARTY))
def test_an_uninstalled_first_party_name_says_what_to_install(kind, name):
    registry = Registry.discover(external=False, disabled=[])
    with pytest.raises(UnknownComponentError, match=f"pip install {FIRST_PARTY[(kind, name)]}"):
        registry.get(kind, name)
