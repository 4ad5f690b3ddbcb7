"""Fault injection against exact resume (issue 28, item 1 and the acceptance's harness): a run
killed at generation, after an update, or inside a checkpoint, then resumed, logs the same
metrics as a run never stopped, on every non-timing metric of every step, synchronous, with
background rollouts one step behind (max_staleness = 1), and with the engine in its own process.

CI runs one kill per mode (about 2 minutes); RLCORE_FAULTS_MATRIX=1 runs every kill point in
every mode, and SIGTERM and SIGUSR1 stops too.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rlcore.cli import main
from rlcore.testing import require_plugins
from rlcore.testing.faults import env
from rlcore.testing.runs import TINY_RUN_PLUGINS, read_metrics, run_cli, write_run_manifest

require_plugins(*TINY_RUN_PLUGINS)
pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures"
UNTIMED = ("timing_s/", "perf/", "async/", "reward/time_s")
STEPS = 4
MODES = {
    "sync": {"share_actor": False},
    "staleness0": {"max_staleness": 0},
    "staleness1": {"max_staleness": 1},
    "split1": {"placement": "split", "max_staleness": 1},
}
FULL = os.environ.get("RLCORE_FAULTS_MATRIX") == "1"
# (mode, fault) pairs: CI's share, then the whole matrix behind RLCORE_FAULTS_MATRIX=1.
CASES = [
    ("staleness0", "generate@3=sigkill"),
    ("staleness1", "update@3=sigkill"),
    ("split1", "checkpoint@2=sigkill"),
]
if FULL:
    CASES = [
        (mode, fault)
        for mode in MODES
        for fault in (
            "generate@3=sigkill",
            "update@2=sigkill",
            "update@3=sigterm",
            "update@2=sigusr1",
            "checkpoint@2=sigkill",
            "checkpoint@3=exit",
        )
    ]


def _untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(UNTIMED)} for row in rows]


def _manifest(directory: Path, tiny_model, mode: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(
        FIXTURES / "dense_rewards.py", directory / "dense_rewards.py"
    )  # a reward that varies: weights move
    return write_run_manifest(
        directory,
        tiny_model,
        rollout=MODES[mode],
        data={"val": None},
        trainer={"steps": STEPS, "lr": 5e-3, "save_every": 1, "keep_checkpoints": 4},
        reward={"function": "python:dense_rewards.py:upper", "method": None},
    )


_REFERENCE: dict[str, list[dict]] = {}


def _reference(tmp_path_factory, tiny_model, mode: str) -> list[dict]:
    """The uninterrupted run's metrics (split placement reproduces the colocated run, so it
    shares the staleness-1 reference)."""
    key = "staleness1" if mode == "split1" else mode
    if key not in _REFERENCE:
        directory = tmp_path_factory.mktemp(f"reference-{key}")
        manifest = _manifest(directory, tiny_model, key)
        assert main(["run", str(manifest), "--run-dir", str(directory / "run")]) == 0
        _REFERENCE[key] = read_metrics(directory / "run")
    return _REFERENCE[key]


def _compare(got: list[dict], want: list[dict]) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, STEPS + 1))
    for have, expected in zip(_untimed(got), _untimed(want)):
        differing = {
            k: (expected.get(k), have.get(k))
            for k in expected.keys() | have.keys()
            if expected.get(k) != have.get(k)
        }
        assert not differing, (have["step"], differing)


def test_a_background_run_resumed_without_a_kill_is_identical(tmp_path, tmp_path_factory, tiny_model):
    """The issue's first finding: max_staleness = 1 to step 2, --resume to step 4 (no kill)
    differed in 32 metrics from step 3 (staleness 0.0 instead of 1.0)."""
    manifest = _manifest(tmp_path, tiny_model, "staleness1")
    run_dir = tmp_path / "run"
    assert main(["run", str(manifest), "--run-dir", str(run_dir), "--set", "trainer.steps=2"]) == 0
    assert main(["run", str(manifest), "--run-dir", str(run_dir), "--resume"]) == 0
    got = read_metrics(run_dir)
    assert [r["rollout/staleness/mean"] for r in got] == [0.0, 1.0, 1.0, 1.0]
    _compare(got, _reference(tmp_path_factory, tiny_model, "staleness1"))


@pytest.mark.parametrize("mode, fault", CASES, ids=[f"{m}-{f}" for m, f in CASES])
def test_a_run_killed_then_resumed_is_identical(tmp_path, tmp_path_factory, tiny_model, mode, fault):
    manifest = _manifest(tmp_path, tiny_model, mode)
    run_dir = tmp_path / "run"
    killed = run_cli("run", str(manifest), "--run-dir", str(run_dir), env=env(fault), timeout=300)
    assert killed.returncode != 0, killed.stdout + killed.stderr
    assert f"rlcore fault injection: {fault}" in killed.stderr, killed.stderr
    resumed = run_cli("run", str(manifest), "--run-dir", str(run_dir), "--resume", timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from" in resumed.stderr and "not an exact resume" not in resumed.stderr
    _compare(read_metrics(run_dir), _reference(tmp_path_factory, tiny_model, mode))
