"""Curves of runs as a PNG: the training reward, the validation reward and the response length
per step, read from each run's ``metrics.jsonl``.

    rlcore plot runs/quickstart                        # writes runs/quickstart/curves.png
    rlcore plot runs/a runs/b --out compare.png        # the runs side by side, one colour each

The console sink writes the same figure into the run directory at the end of a run. matplotlib
(in rlcore's ``train`` extra) is imported only when a figure is drawn; nothing here imports torch.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlcore.errors import RlcoreError, UsageError

CURVES_FILE = "curves.png"

# (metric, panel title): one panel each, the runs overlaid.
PANELS = (
    ("critic/score/mean", "training reward (mean score)"),
    ("val/reward/mean", "validation reward"),
    ("response_length/mean", "response length (tokens)"),
)


@dataclass
class RunCurves:
    """One run's curves: metric -> [(step, value)], in step order."""

    label: str
    source: str
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    def summary(self) -> str:
        parts = []
        for key, title in PANELS:
            points = self.series.get(key)
            if points:
                name = title.split(" (")[0]
                parts.append(f"{name} {points[0][1]:.3g} -> {points[-1][1]:.3g}")
        steps = max((p[-1][0] for p in self.series.values() if p), default=0)
        return f"{self.label}: {steps} steps; " + ("; ".join(parts) or "no reward or length metrics")


def curves_from_rows(rows: Iterable[dict[str, Any]], label: str, source: str = "") -> RunCurves:
    """The panels' series from metric rows (``{"step": N, ...}``); a step logged twice keeps its last value."""
    by_key: dict[str, dict[int, float]] = {key: {} for key, _ in PANELS}
    for row in rows:
        step = row.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        for key in by_key:
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                by_key[key][step] = float(value)
    return RunCurves(label, source, {k: sorted(v.items()) for k, v in by_key.items() if v})


def read_run(path: str | Path) -> RunCurves:
    """A run directory (its ``metrics.jsonl``) or a metrics file. Lines a crash cut short are skipped."""
    path = Path(path)
    metrics = path / "metrics.jsonl" if path.is_dir() else path
    if not metrics.is_file():
        where = f"{path} has no metrics.jsonl" if path.is_dir() else f"{path} does not exist"
        raise UsageError(f"{where}: rlcore plot takes run directories (or their metrics.jsonl files)")
    rows = []
    try:
        lines = metrics.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {metrics}: {exc}") from None
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    label = (metrics.parent if metrics.name == "metrics.jsonl" else metrics).name or str(metrics)
    curves = curves_from_rows(rows, label, str(metrics))
    if not curves.series:
        raise UsageError(f"{metrics}: no step holds {', '.join(k for k, _ in PANELS)}")
    return curves


def plot_runs(runs: Sequence[RunCurves], out: str | Path) -> Path:
    """Draw the panels with one line per run and save a PNG to ``out``; returns its path."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise RlcoreError(
            f"drawing curves needs matplotlib (in rlcore's train extra): .venv/bin/pip install matplotlib ({exc})"
        ) from None
    labels = _unique_labels(runs)
    figure = Figure(figsize=(5 * len(PANELS), 3.8), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)  # no pyplot: no global state, no display needed
    axes = figure.subplots(1, len(PANELS))
    for ax, (key, title) in zip(axes, PANELS):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        drawn = False
        for run, label in zip(runs, labels):
            points = run.series.get(key)
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, marker="o" if len(points) < 30 else None, markersize=3, label=label)
                drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="grey")
        elif len(runs) > 1:
            ax.legend(fontsize="small")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    figure.savefig(tmp, format="png")
    tmp.replace(out)  # a reader never sees half a file
    return out


def _unique_labels(runs: Sequence[RunCurves]) -> list[str]:
    labels = [r.label for r in runs]
    if len(set(labels)) == len(labels):
        return labels
    return [r.source or r.label for r in runs]


# ----------------------------------------------------------------------------- rlcore plot


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = "Plot the training reward, the validation reward and the response length of runs."
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (or metrics.jsonl files)")
    parser.add_argument(
        "--out",
        help=f"the PNG to write (default: RUN_DIR/{CURVES_FILE} for one run, ./{CURVES_FILE} for several)",
    )


def run(args: argparse.Namespace) -> int:
    runs = [read_run(path) for path in args.runs]
    if args.out:
        out = Path(args.out)
    elif len(args.runs) == 1 and Path(args.runs[0]).is_dir():
        out = Path(args.runs[0]) / CURVES_FILE
    else:
        out = Path(CURVES_FILE)
    if out.suffix.lower() != ".png":
        raise UsageError(f"--out {out}: the figure is a PNG; name a .png file")
    for curves in runs:
        print(curves.summary())
    print(f"wrote {plot_runs(runs, out)}")
    return 0
