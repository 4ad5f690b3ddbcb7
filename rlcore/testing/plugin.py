"""The pytest plugin behind :mod:`rlcore.testing` (kept light: no torch import)."""

from __future__ import annotations

import pytest

from rlcore.testing import isolated_registry, register, write_manifest


@pytest.fixture
def rlcore_registry():
    return isolated_registry()


@pytest.fixture
def rlcore_register(rlcore_registry):
    def _register(plugin, name=None, distribution=None, version="0.0.test"):
        return register(rlcore_registry, plugin, name=name, distribution=distribution, version=version)

    return _register


@pytest.fixture
def rlcore_manifest(tmp_path):
    def _write(document, name="manifest.toml"):
        return write_manifest(tmp_path, document, name)

    return _write
