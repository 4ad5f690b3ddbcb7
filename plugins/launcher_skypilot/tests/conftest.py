"""Fixtures for the SkyPilot launcher's tests. Nothing here reaches a cloud: the task is checked
with SkyPilot's own parser, and its run script is executed here with SkyPilot's variables set by
hand, as SkyPilot sets them on a node."""

from __future__ import annotations

import pytest
from rlcore_launcher_skypilot.launcher import SkyPilotLauncher
from rlcore_launcher_skypilot.options import SkyPilotOptions

from rlcore.interfaces import LaunchRequest

# What the resolved manifest's [plugins] table holds for a run of the hf engine, the gsm8k reward
# and GRPO (its shape: rlcore/manifest/loader.py, ResolvedManifest.resolved_dict).
PLUGINS = {
    "rollout.engine": {"name": "hf", "distribution": "rlcore-rollout-hf", "version": "0.3.1"},
    "reward.function": {"name": "gsm8k", "distribution": "rlcore-reward-rule", "version": "0.2.0"},
    "algorithm.advantage": {"name": "grpo", "distribution": "rlcore-algo-grpo", "version": "0.1.0"},
    "algorithm.policy_loss": {"name": "ppo_clip", "distribution": "rlcore", "version": "0.1.0"},
    "launcher.name": {"name": "skypilot", "distribution": "rlcore-launcher-skypilot", "version": "0.1.0"},
}


@pytest.fixture
def launch_request(tmp_path):
    """``launch_request(manifest=None, dry_run=False, resume=False)`` -> a LaunchRequest in tmp_path."""

    def make(manifest: dict | None = None, dry_run: bool = False, resume: bool = False) -> LaunchRequest:
        return LaunchRequest(
            manifest_path=str(tmp_path / "manifest.toml"),
            resolved_manifest=manifest
            if manifest is not None
            else {
                "run": {"name": "gsm8k grpo", "output_dir": str(tmp_path / "outputs")},
                "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"},
                "launcher": {"name": "local"},
            },
            run_dir=str(tmp_path / "run"),
            resume=resume,
            dry_run=dry_run,
        )

    return make


@pytest.fixture
def sky_launcher():
    """``sky_launcher(plugins=PLUGINS, **options)`` -> a SkyPilotLauncher (validated options)."""

    def make(plugins: dict | None = None, **options) -> SkyPilotLauncher:
        return SkyPilotLauncher(
            SkyPilotOptions.model_validate(options), PLUGINS if plugins is None else plugins
        )

    return make
