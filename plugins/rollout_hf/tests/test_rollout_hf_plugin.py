"""Registration and options: discoverable as ``hf``, cheap to import, bad values rejected."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError
from rlcore_rollout_hf.options import HFEngineOptions

from rlcore.registry import Registry


def test_the_entry_point_registers_hf():
    registry = Registry.discover(external=True, disabled=())
    component = registry.get("rollout_engine", "hf")
    assert component.distribution == "rlcore-rollout-hf"
    assert component.options is HFEngineOptions
    assert component.factory == "rlcore_rollout_hf.engine:build"
    assert callable(component.load_factory())


def test_the_plugin_module_imports_no_torch():
    code = "import sys, rlcore_rollout_hf.plugin; sys.exit('torch' in sys.modules or 'transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize(
    "options, key",
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"compact_fraction": 1.5}, "compact_fraction"),
        ({"dtype": "float8"}, "dtype"),
        ({"max_batchsize": 4}, "max_batchsize"),
    ],
)
def test_bad_options_are_rejected_naming_the_key(options, key):
    with pytest.raises(ValidationError, match=key):
        HFEngineOptions.model_validate(options)
