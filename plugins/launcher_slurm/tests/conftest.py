"""Fixtures for the SLURM launcher's tests: a real SLURM cluster on this host (.ci/slurm/setup.sh).

The cluster starts once per session when this is root and SLURM is installed or apt can install
it; otherwise the tests that need it skip with the reason. RLCORE_REQUIRE_SLURM=1 (set it in CI)
turns that skip into a failure, so CI can never pass by skipping them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rlcore_launcher_slurm.launcher import SlurmLauncher
from rlcore_launcher_slurm.options import SlurmOptions

from rlcore.interfaces import LaunchRequest

REPO = Path(__file__).resolve().parents[3]
SETUP = REPO / ".ci" / "slurm" / "setup.sh"


def _unavailable(reason: str):
    if os.environ.get("RLCORE_REQUIRE_SLURM", "").strip() not in ("", "0"):
        pytest.fail(f"RLCORE_REQUIRE_SLURM is set but no SLURM cluster can be started: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster() -> int:
    """Start (or reuse) the test cluster; returns its number of nodes."""
    if os.geteuid() != 0:
        _unavailable("a real SLURM cluster needs root to start (run .ci/slurm/setup.sh as root)")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        _unavailable("SLURM is not installed and apt-get is not available to install it")
    proc = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"{SETUP} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, check=True)
    return len(set(nodes.stdout.split()))


@pytest.fixture
def launch_request(tmp_path):
    """``launch_request(manifest=None, dry_run=False, run_dir=None)`` -> a LaunchRequest in tmp_path."""

    def make(
        manifest: dict | None = None, dry_run: bool = False, run_dir: Path | None = None
    ) -> LaunchRequest:
        run_dir = run_dir or tmp_path / "run"
        return LaunchRequest(
            manifest_path=str(tmp_path / "manifest.toml"),
            resolved_manifest=manifest if manifest is not None else {"run": {"name": "slurm-test"}},
            run_dir=str(run_dir),
            dry_run=dry_run,
        )

    return make


@pytest.fixture
def slurm_launcher():
    """``slurm_launcher(**options)`` -> a SlurmLauncher (validated options; fast polling)."""

    def make(**options) -> SlurmLauncher:
        options.setdefault("poll_interval", 0.5)
        return SlurmLauncher(SlurmOptions.model_validate(options))

    return make


@pytest.fixture
def slow_python(tmp_path) -> Path:
    """An interpreter wrapper that waits five minutes before running Python: a job that is still
    running when a test cancels it or its time limit passes. (The job's first use of the
    interpreter is finding the rendezvous, whose stdout it reads: the message goes to stderr.)"""
    path = tmp_path / "slow-python"
    path.write_text(
        f'#!/bin/sh\necho "slow interpreter: waiting before the driver" >&2\nsleep 300\nexec {sys.executable} "$@"\n'
    )
    path.chmod(0o755)
    return path
