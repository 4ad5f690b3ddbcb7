"""Every plugin distribution declares the range of rlcore it works with, and that range holds the
core of this repository: a plugin installed from PyPI beside another core release is then refused
by pip, not broken at run time. Read from the pyproject files, so a version bump keeps it honest."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
CORE_VERSION = Version(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])
PLUGINS = sorted(p.parent.name for p in (ROOT / "plugins").glob("*/pyproject.toml"))


def _rlcore_requirements(project: dict) -> list[Requirement]:
    return [r for r in map(Requirement, project.get("dependencies", [])) if r.name == "rlcore"]


def test_plugins_are_found():
    assert len(PLUGINS) >= 10


@pytest.mark.parametrize("name", PLUGINS)
def test_a_plugin_declares_a_bounded_rlcore_range_holding_the_core(name):
    project = tomllib.loads((ROOT / "plugins" / name / "pyproject.toml").read_text())["project"]
    requirements = _rlcore_requirements(project)
    assert len(requirements) == 1, (
        f"plugins/{name}: [project] dependencies should name rlcore once, with a range"
    )
    specifier = requirements[0].specifier
    assert str(specifier), f"plugins/{name}: 'rlcore' without a range; declare the versions it works with"
    assert specifier.contains(CORE_VERSION, prereleases=True), (
        f"plugins/{name}: rlcore{specifier} leaves out this repository's core, {CORE_VERSION}"
    )
    assert any(s.operator in ("<", "<=", "==", "~=") for s in specifier), (
        f"plugins/{name}: rlcore{specifier} has no upper bound; a plugin API change would break it silently"
    )
    next_major = Version(f"{CORE_VERSION.major + 1}.0")
    assert not specifier.contains(next_major), f"plugins/{name}: rlcore{specifier} admits {next_major}"
