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
