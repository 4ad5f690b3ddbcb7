"""Conformance kit for metrics sinks (``rlcore_metrics_sinks``, :class:`rlcore.interfaces.MetricsSink`).

A sink is built with the run's context (``run_dir`` set), gets ``log(metrics, step)`` once a step
and ``close()`` at the end; ``log_samples(rows, step)`` is optional. The trainer hands it what a
step measured, which can be odd: NaN and infinities (a loss that blew up), ints, huge and tiny
numbers, an empty dict (a step that measured nothing), names with spaces or non-ASCII letters. A
sink must take all of that without raising and leave the dict as it was (the trainer keeps using
it). ::

    from rlcore.testing.sinks import check_metrics_sink

    def test_my_sink(rlcore_registry, tmp_path):
        check_metrics_sink(rlcore_registry.get("metrics_sink", "my_sink"), {"project": "x"}, run_dir=tmp_path)

A sink that keeps what it was given can prove it: pass ``read_back(run_dir) -> {step: {name:
value}}`` and the kit checks every step and every finite value arrived, and had arrived before
``close()``: a run killed mid-way keeps the steps it logged (``flushes=False`` for a sink that
writes only when closed).
"""

from __future__ import annotations

import copy
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlcore.components import Component
from rlcore.interfaces import BuildContext
from rlcore.testing import build_subject

# What the trainer may log over a few steps, odd values included.
STEPS: tuple[tuple[int, dict[str, Any]], ...] = (
    (
        1,
        {"critic/score/mean": 0.25, "actor/pg_loss": -0.0125, "timing_s/gen": 1.5, "perf/total_tokens": 4096},
    ),
    (
        2,
        {
            "actor/pg_loss": float("nan"),
            "actor/grad_norm": float("inf"),
            "actor/kl": float("-inf"),
            "critic/score/mean": 0.0,
        },
    ),
    (3, {}),
    (
        4,
        {
            "perf/throughput": 1e308,
            "actor/entropy": 5e-324,
            "response_length/mean": 17,
            "val/reward/mean": -3.0,
            "val/score/math äöü": 0.5,
            "custom metric with spaces": 1.0,
        },
    ),
    (10, {"critic/score/mean": 1.0, "training/epoch": 0}),
)

SAMPLES = [
    {
        "step": 4,
        "data_source": "gsm8k",
        "prompt": "What is 2 + 3?",
        "response": "5 | <b>five</b>\n",
        "score": 1.0,
    },
    {"step": 4, "data_source": "math", "prompt": "ünïcode ∫x dx", "response": "", "score": float("nan")},
]


def check_metrics_sink(
    component: Component | Any,
    options: Any = None,
    *,
    run_dir: str | Path | None = None,
    context: BuildContext | None = None,
    read_back: Callable[[Path], dict[int, dict[str, Any]]] | None = None,
    flushes: bool = True,
) -> dict[str, Any]:
    """Build the sink (a registered :class:`~rlcore.components.Component` with ``options``, or a
    built sink) into ``run_dir`` (a temporary directory by default), log :data:`STEPS` to it, hand
    it validation samples when it takes them, and close it. Checks that it has ``log`` and
    ``close``; that nothing raises on NaN, infinities, ints, extreme numbers, an empty dict or odd
    names; that the dicts and rows it was given are unchanged; and, with ``read_back``, that every
    step arrived with every finite value (NaN and infinities may be kept or dropped, but never
    turned into another number), already before ``close()`` unless ``flushes`` is False. Returns
    ``{"run_dir": Path, "read": what read_back gave after close}``."""
    holder = None
    if run_dir is None and (context is None or context.run_dir is None):
        holder = tempfile.TemporaryDirectory(prefix="rlcore-sink-kit-")
        run_dir = holder.name
    try:
        if context is None:
            context = BuildContext(run_dir=str(run_dir), manifest={"run": {"name": "kit"}})
        elif run_dir is not None:
            context.run_dir = str(run_dir)
        directory = Path(context.run_dir)
        sink = build_subject(component, options, context)
        name = type(sink).__name__
        for method in ("log", "close"):
            assert callable(getattr(sink, method, None)), f"a metrics sink needs {method}(); {name} has none"
        for step, metrics in STEPS:
            given = copy.deepcopy(metrics)
            try:
                sink.log(given, step)
            except Exception as exc:  # noqa: BLE001 - the kit reports what the sink could not take
                raise AssertionError(
                    f"{name}.log raised on step {step} {_show(metrics)}: {type(exc).__name__}: {exc}"
                ) from exc
            assert _same(given, metrics), (
                f"{name}.log changed the metrics it was given (step {step}): {given}"
            )
        if callable(getattr(sink, "log_samples", None)):
            rows = copy.deepcopy(SAMPLES)
            try:
                sink.log_samples(rows, 4)
            except Exception as exc:  # noqa: BLE001
                raise AssertionError(
                    f"{name}.log_samples raised on rows {SAMPLES}: {type(exc).__name__}: {exc}"
                ) from exc
            assert _same(rows, SAMPLES), f"{name}.log_samples changed the rows it was given"
        if read_back is not None and flushes:
            _check_read_back(read_back(directory), name, " before close() (log must flush each step)")
        try:
            sink.close()
        except Exception as exc:  # noqa: BLE001
            raise AssertionError(f"{name}.close raised: {type(exc).__name__}: {exc}") from exc
        read = None
        if read_back is not None:
            read = read_back(directory)
            _check_read_back(read, name, "")
        return {"run_dir": directory, "read": read}
    finally:
        if holder is not None:
            holder.cleanup()


def _check_read_back(read: Any, name: str, when: str) -> None:
    assert isinstance(read, dict), (
        f"read_back must return {{step: {{name: value}}}}, got {type(read).__name__}"
    )
    for step, metrics in STEPS:
        if not metrics:
            continue
        assert step in read, f"{name} lost step {step}{when}: read back steps {sorted(read)}"
        for key, value in metrics.items():
            if not math.isfinite(value):
                kept = read[step].get(key)
                assert (
                    kept is None
                    or (isinstance(kept, (int, float)) and not math.isfinite(kept))
                    or kept in ("nan", "inf", "-inf", "NaN", "Infinity", "-Infinity")
                ), f"{name} turned step {step}'s {key} = {value} into {kept!r}"
                continue
            assert key in read[step], f"{name} lost {key!r} of step {step}: read back {sorted(read[step])}"
            got = read[step][key]
            assert (
                isinstance(got, (int, float))
                and math.isclose(got, value, rel_tol=1e-6, abs_tol=0.0)
                or got == value
            ), f"{name} read back step {step}'s {key} as {got!r}, logged {value!r}"


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _show(metrics: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in metrics.items()) + "}"
