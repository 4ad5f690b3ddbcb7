"""Shared fixtures of rlcore's own test suite."""

from __future__ import annotations

import pytest
from core_support import ToyComponents

from rlcore.testing import isolated_registry


@pytest.fixture
def toy_registry():
    registry = isolated_registry()
    registry.register(ToyComponents(), name="toy", distribution="rlcore-toy", version="9.9")
    return registry


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A random 2-layer Llama with SmolLM2's real tokenizer, saved as a Hugging Face directory."""
    from rlcore.testing.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"))
