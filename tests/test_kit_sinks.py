"""rlcore.testing.sinks: rlcore's metrics sinks pass the kit (jsonl proving what it kept by reading
it back; tensorboard and wandb are plugins/loggers, tested there), and sinks broken in the ways that lose a run's metrics or
crash it fail the kit with a message naming the rule."""

from __future__ import annotations

import json
import math

import pytest

from rlcore.testing import isolated_registry
from rlcore.testing.sinks import check_metrics_sink


def _jsonl_back(run_dir):
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        out[record.pop("step")] = record
    return out


def test_jsonl_passes_and_keeps_every_step(tmp_path):
    result = check_metrics_sink(
        isolated_registry().get("metrics_sink", "jsonl"), run_dir=tmp_path, read_back=_jsonl_back
    )
    assert result["read"][2]["actor/pg_loss"] is None  # NaN kept as null, never as a number
    assert (tmp_path / "generations.jsonl").read_text().count("\n") == 2


def test_console_passes(tmp_path):
    check_metrics_sink(isolated_registry().get("metrics_sink", "console"), {"plot": False}, run_dir=tmp_path)


# ----------------------------------------------------------------------------- broken sinks


class StrictJson:
    """Writes JSON that refuses NaN."""

    def __init__(self):
        self.lines = []

    def log(self, metrics, step):
        self.lines.append(json.dumps({"step": step, **metrics}, allow_nan=False))

    def close(self):
        pass


class NoClose:
    def log(self, metrics, step):
        pass


class PopsWhatItLogs:
    def log(self, metrics, step):
        metrics.pop("critic/score/mean", None)

    def close(self):
        pass


class FloatsOnly:
    def log(self, metrics, step):
        for key, value in metrics.items():
            if not isinstance(value, float):
                raise TypeError(f"{key} is not a float")

    def close(self):
        pass


class SamplesBreak:
    def log(self, metrics, step):
        pass

    def log_samples(self, rows, step):
        return [f"{r['score']:.2f}" + r["missing"] for r in rows]

    def close(self):
        pass


class CloseTwiceOnly:
    """close() fails: the file was never opened."""

    def log(self, metrics, step):
        pass

    def close(self):
        raise OSError("file not open")


class LosesEmptyThenAll:
    """Writes only the first step (a buffer never flushed)."""

    def __init__(self, run_dir):
        self.path = run_dir / "metrics.jsonl"
        self.buffer = []

    def log(self, metrics, step):
        self.buffer.append(
            {"step": step, **{k: (v if math.isfinite(v) else None) for k, v in metrics.items()}}
        )
        if step == 1:
            self.path.write_text(json.dumps(self.buffer[0]) + "\n")

    def close(self):
        pass


class RoundsValues:
    def __init__(self, run_dir):
        self.path = run_dir / "metrics.jsonl"
        self.file = open(self.path, "w")

    def log(self, metrics, step):
        clean = {k: (round(v, 2) if math.isfinite(v) else None) for k, v in metrics.items()}
        self.file.write(json.dumps({"step": step, **clean}) + "\n")
        self.file.flush()

    def close(self):
        self.file.close()


class NanAsZero:
    def __init__(self, run_dir):
        self.path = run_dir / "metrics.jsonl"
        self.file = open(self.path, "w")

    def log(self, metrics, step):
        clean = {k: (v if math.isfinite(v) else 0.0) for k, v in metrics.items()}
        self.file.write(json.dumps({"step": step, **clean}) + "\n")
        self.file.flush()

    def close(self):
        self.file.close()


@pytest.mark.parametrize(
    "sink, message",
    [
        (StrictJson(), "log raised on step 2 .*ValueError"),
        (NoClose(), r"needs close\(\)"),
        (PopsWhatItLogs(), "changed the metrics"),
        (FloatsOnly(), "log raised on step 1 .*perf/total_tokens is not a float"),
        (SamplesBreak(), "log_samples raised"),
        (CloseTwiceOnly(), "close raised: OSError"),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, str) else "",
)
def test_broken_sinks_fail_the_kit_saying_why(sink, message):
    with pytest.raises(AssertionError, match=message):
        check_metrics_sink(sink)


class WritesOnClose:
    """Keeps every step in memory until close(): a run killed mid-way loses them all."""

    def __init__(self, run_dir):
        self.path = run_dir / "metrics.jsonl"
        self.path.write_text("")
        self.records = []

    def log(self, metrics, step):
        self.records.append(
            {"step": step, **{k: (v if math.isfinite(v) else None) for k, v in metrics.items()}}
        )

    def close(self):
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.records))


def test_a_sink_that_writes_on_close_passes_only_when_it_says_so(tmp_path):
    check_metrics_sink(WritesOnClose(tmp_path), run_dir=tmp_path, read_back=_jsonl_back, flushes=False)
    again = tmp_path / "again"
    again.mkdir()
    with pytest.raises(AssertionError, match=r"lost step 1 before close\(\) \(log must flush each step\)"):
        check_metrics_sink(WritesOnClose(again), run_dir=again, read_back=_jsonl_back)


@pytest.mark.parametrize(
    "make, message",
    [
        (LosesEmptyThenAll, "lost step 2"),
        (RoundsValues, "read back step 1's actor/pg_loss as -0.01, logged -0.0125"),
        (NanAsZero, "turned step 2's actor/pg_loss = nan into 0.0"),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_sinks_that_lose_or_change_values_fail_the_read_back(tmp_path, make, message):
    with pytest.raises(AssertionError, match=message):
        check_metrics_sink(make(tmp_path), run_dir=tmp_path, read_back=_jsonl_back)
