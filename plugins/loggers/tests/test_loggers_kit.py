"""The tensorboard and wandb sinks pass rlcore's metrics-sink kit (rlcore.testing.sinks): tensorboard
proving by reading its event files back that every step and every finite value arrived, flushed
before close(); and each writes where its reader looks for it."""

from __future__ import annotations

import math
import struct

import pytest
import rlcore_loggers.plugin

from rlcore.interfaces import BuildContext
from rlcore.testing.runs import registry_with
from rlcore.testing.sinks import STEPS, check_metrics_sink


def _sink(name):
    return registry_with(rlcore_loggers.plugin, "loggers", "rlcore-loggers").get("metrics_sink", name)


def _tensorboard_scalars(directory):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    out: dict[int, dict] = {}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            out.setdefault(event.step, {})[tag] = event.value
    return out


def _as_float32(value):
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:  # beyond float32: stored as an infinity
        return math.copysign(math.inf, value)


def _float32(read_back):
    """TensorBoard stores float32: a value read back equal to the logged one in float32 counts as kept."""

    def wrapped(run_dir):
        read = read_back(run_dir)
        for step, metrics in STEPS:
            for key, value in metrics.items():
                got = read.get(step, {}).get(key)
                if (
                    got is not None
                    and math.isfinite(value)
                    and math.isclose(got, _as_float32(value), rel_tol=1e-6)
                ):
                    read[step][key] = value
        return read

    return wrapped


def test_tensorboard_passes_the_kit_and_keeps_every_finite_value(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("torch")
    result = check_metrics_sink(
        _sink("tensorboard"),
        {"subdir": "tb"},
        run_dir=tmp_path,
        read_back=_float32(lambda run_dir: _tensorboard_scalars(run_dir / "tb")),
    )
    assert math.isnan(result["read"][2]["actor/pg_loss"])
    assert result["read"][1]["critic/score/mean"] == 0.25


def test_tensorboard_resumed_drops_the_steps_after_the_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    first = _sink("tensorboard").build({}, BuildContext(run_dir=str(tmp_path)))
    for step in (1, 2, 3):
        first.log({"critic/score/mean": step / 10}, step)
    first.close()
    resumed = _sink("tensorboard").build({}, BuildContext(run_dir=str(tmp_path), resume_step=1))
    resumed.log({"critic/score/mean": 0.9}, 2)
    resumed.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 3)) for e in events.Scalars("critic/score/mean")] == [(1, 0.1), (2, 0.9)]


def test_wandb_offline_passes_the_kit_and_writes_an_offline_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    result = check_metrics_sink(
        _sink("wandb"), {"mode": "offline", "project": "kit"}, run_dir=tmp_path / "run"
    )
    assert list((result["run_dir"] / "wandb").glob("offline-run-*"))
