"""The manifest a remote driver runs (written by ``rlcore run`` for the ray, slurm and skypilot
launchers into the run directory) loads from anywhere: every path in it is absolute."""

from __future__ import annotations

import shutil
from pathlib import Path

import tomli_w

from rlcore.cli import _driver_document
from rlcore.manifest.loader import load_manifest
from rlcore.testing.runs import write_run_manifest

FIXTURES = Path(__file__).parent / "fixtures"


def test_relative_paths_are_absolute_in_the_driver_manifest(tmp_path, tiny_model):
    here = tmp_path / "project"
    here.mkdir()
    shutil.copy(FIXTURES / "dense_rewards.py", here / "dense_rewards.py")
    shutil.copytree(tiny_model, here / "critic-model")
    manifest = write_run_manifest(
        here,
        tiny_model,
        critic={"path": "critic-model"},
        reward={
            "function": "python:dense_rewards.py:upper",
            "method": None,
            "routes": {"other/source": {"function": "python:dense_rewards.py:digits"}},
        },
    )
    doc = _driver_document(load_manifest(manifest))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "driver.toml").write_text(tomli_w.dumps(doc))
    shutil.rmtree(here / "__pycache__", ignore_errors=True)
    moved = load_manifest(elsewhere / "driver.toml")  # would fail on a relative path: nothing is there
    assert moved.core.critic.path == str((here / "critic-model").resolve())
    assert moved.component("reward.function").options.target.startswith(str(here.resolve()))
    assert moved.component("reward.routes.other/source").options.target.startswith(str(here.resolve()))
    assert doc["launcher"] == {"name": "local"}
