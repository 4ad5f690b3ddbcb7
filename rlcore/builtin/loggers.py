"""Builtin metrics sinks: console (rich) and jsonl (tensorboard and wandb are the rlcore-loggers plugin).

Every sink receives ``log(metrics, step)`` once per training step (and once per validation, with
``val/`` keys), and ``close()`` at the end. A resumed run truncates what was logged after the
checkpoint it resumes from, so a file never holds a step twice.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from rlcore.errors import RlcoreError

# The keys the console shows, in this order, when present.
HEADLINE = (
    ("critic/score/mean", "score"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/entropy", "entropy"),
    ("actor/ppo_kl", "ppo_kl"),
    ("actor/grad_norm", "grad_norm"),
    ("response_length/mean", "resp_len"),
    ("timing_s/step", "step_s"),
)


def _run_dir(context) -> Path:
    if context is None or getattr(context, "run_dir", None) is None:
        raise RlcoreError("this metrics sink needs a run directory")
    return Path(context.run_dir)


def _resume_step(context) -> int | None:
    return getattr(context, "resume_step", None)


class ConsoleSink:
    """A progress bar on a terminal, a line per step elsewhere, and the reward curve at the end.
    Piped or redirected, a line is never wrapped (a step's metrics stay on one line). Each step's
    line also goes to ``run.log`` in the run directory, whatever ``every`` is.

    Within a step (rlcore.progress): on a terminal a second bar line shows the phase (generating
    32/64 samples, updating 3/6 micro-batches); without the bar, a line every ``heartbeat_s``
    seconds of silence says where the run is, so a piped run never looks hung."""

    def __init__(self, options, context):
        from rich.console import Console

        self.every = options.every
        self.console = Console(highlight=False)
        if not self.console.is_terminal:
            self.console = Console(highlight=False, soft_wrap=True)
        run_dir = getattr(context, "run_dir", None)
        self.run_dir = Path(run_dir) if run_dir else None
        self.plot = getattr(options, "plot", True)
        self.rows: list[dict[str, Any]] = []  # for the figure when the run keeps no metrics.jsonl
        # Appended line by line beside the trainer's own log lines (loguru's file sink appends too).
        self.log_file = None
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.log_file = open(self.run_dir / "run.log", "a", encoding="utf-8", buffering=1)
        self.total = getattr(context, "total_steps", None)
        self.last_step = _resume_step(context) or 0
        self.curve: list[tuple[int, float]] = []
        self.val_curve: list[tuple[int, float]] = []
        self.progress = None
        self._shown = None  # the phase the bar's second line shows
        self.heartbeat = None
        if options.live and self.console.is_terminal and self.total:
            self.start_bar()
        elif getattr(options, "heartbeat_s", 0):
            self.heartbeat = _Heartbeat(self, options.heartbeat_s)
        from rlcore import progress

        progress.listen(self)

    def start_bar(self) -> None:
        """The live bar: the training steps, and under them the phase of the one under way."""
        from rich.progress import BarColumn, Progress, TextColumn

        # The step count and the time left first, so a narrow terminal cuts the bar, not them.
        self.progress = Progress(
            TextColumn("{task.description}"),
            _CountColumn(),
            _TimeColumn(),
            BarColumn(bar_width=None),
            console=self.console,
            transient=False,
            expand=False,
        )
        self.task = self.progress.add_task(
            "[bold]training", total=self.total, completed=self.last_step, start_step=self.last_step
        )
        self.phase_task = self.progress.add_task("", total=None, visible=False, phase=True)
        self.progress.start()

    def phase_changed(self, phase) -> None:
        """rlcore.progress: a phase began, advanced or ended."""
        if self.progress is None:
            return
        from rlcore import progress

        if phase is None:
            self.progress.update(self.phase_task, visible=False)
            return
        if self._shown is not phase:  # a new phase: its own clock
            self._shown = phase
            self.progress.reset(self.phase_task, total=phase.total, visible=True)
        self.progress.update(
            self.phase_task,
            description=f"  {progress.describe()}",
            total=phase.total,
            completed=phase.done,
            visible=True,
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.rows.append({"step": step, **metrics})
        if "val/reward/mean" in metrics:
            self.val_curve.append((step, metrics["val/reward/mean"]))
            line = f"validation step {step}: " + _format(
                {k: v for k, v in metrics.items() if k.startswith("val/")}
            )
            self.console.print(line.replace("validation", "[cyan]validation[/]", 1))
            self._to_log(line)
            return
        if "critic/score/mean" in metrics:
            self.curve.append((step, metrics["critic/score/mean"]))
        headline = " | ".join(f"{label} {_num(metrics[key])}" for key, label in HEADLINE if key in metrics)
        self.last_step = step
        if self.progress is not None:
            self.progress.update(self.task, completed=step)
        total = f"/{self.total}" if self.total else ""
        line = f"step {step}{total} | {headline}"
        self._to_log(line)
        if step % self.every == 0:
            self.console.print(line, markup=False)

    def _to_log(self, line: str) -> None:
        if self.heartbeat is not None:
            self.heartbeat.said()
        if self.log_file is not None:
            from datetime import datetime

            self.log_file.write(f"{datetime.now():%Y-%m-%d %H:%M:%S.%f}"[:-3] + f" | METRICS  | {line}\n")

    def where(self, silent_s: float = 0.0) -> str:
        """Where the run is now, for a heartbeat line; between marked phases (an optimizer step),
        the step under way and ``silent_s``, the seconds since the last line."""
        from rlcore import progress

        phases = progress.stack()
        if not phases:
            return (
                f"step {self.last_step + 1}"
                + (f"/{self.total}" if self.total else "")
                + f", {silent_s:.0f} s since the last line"
            )
        text = f"{progress.describe()}, {phases[-1].elapsed:.0f} s"
        if all(p.within_step for p in phases):
            text = f"step {self.last_step + 1}" + (f"/{self.total}" if self.total else "") + f": {text}"
        return text

    def close(self) -> None:
        from rlcore import progress

        progress.unlisten(self)
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None
        if self.progress is not None:
            self.progress.stop()
        if self.curve:
            self.console.print("[bold]training reward (mean score per step)[/]")
            self.console.print(_sparkline(self.curve))
            self._to_log("training reward: " + _sparkline(self.curve))
        if self.val_curve:
            line = "validation reward: " + "  ".join(f"step {s}: {v:.3f}" for s, v in self.val_curve)
            self.console.print(line.replace("validation reward", "[bold]validation reward[/]", 1))
            self._to_log(line)
        if self.plot and self.run_dir is not None and self.rows:
            self._write_curves()
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None

    def _write_curves(self) -> None:
        """curves.png from the run's metrics.jsonl (all of a resumed run), else from what this sink saw."""
        from rlcore.plotting import CURVES_FILE, curves_from_rows, plot_runs, read_run

        try:
            try:
                curves = read_run(self.run_dir)
            except RlcoreError:  # no metrics.jsonl (the jsonl logger is off or renamed)
                curves = curves_from_rows(self.rows, self.run_dir.name)
            if not curves.series:
                return
            out = plot_runs([curves], self.run_dir / CURVES_FILE)
        except Exception as exc:  # noqa: BLE001 - a figure must never fail the run it draws
            line = f"{CURVES_FILE} not written: {exc}"
        else:
            line = f"curves: {out}"
        self.console.print(line, markup=False)
        self._to_log(line)


class _Heartbeat:
    """A thread that prints where the run is after every ``interval`` seconds without a line
    (piped output shows no bar); rich's console serialises it with the sink's own lines."""

    def __init__(self, sink: ConsoleSink, interval: float):
        import threading
        import time

        self.sink, self.interval, self._time = sink, interval, time.monotonic
        self.last_line = self.last_beat = self._time()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="rlcore-heartbeat", daemon=True)
        self.thread.start()

    def said(self) -> None:
        """The sink printed a line: the silence starts again."""
        self.last_line = self.last_beat = self._time()

    def _run(self) -> None:
        from datetime import datetime

        while not self._stop.wait(
            min(self.interval, max(0.05, self.interval - (self._time() - self.last_beat)))
        ):
            now = self._time()
            if now - self.last_beat < self.interval:
                continue
            where = self.sink.where(now - self.last_line)
            self.sink.console.print(f"{datetime.now():%H:%M:%S} ...     {where}", markup=False)
            self.last_beat = now

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)


def _clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _rich_columns():
    from rich.progress import ProgressColumn
    from rich.text import Text

    class CountColumn(ProgressColumn):
        """``3/24`` for the training bar; nothing for the phase line (its text holds its count)."""

        def render(self, task):
            if task.fields.get("phase"):
                return Text("")
            return Text(f"{int(task.completed)}/{int(task.total)}", style="progress.download")

    class TimeColumn(ProgressColumn):
        """The training bar: the time left, from this process's mean step time so far (one step
        is enough; rich's own estimate needs several within 30 s). The phase line: its elapsed time."""

        max_refresh = 1.0

        def render(self, task):
            elapsed = task.elapsed or 0.0
            if task.fields.get("phase"):
                return Text(_clock(elapsed) if task.visible else "", style="progress.elapsed")
            done = task.completed - task.fields.get("start_step", 0)
            if done <= 0 or task.total is None:
                return Text("-:--:-- left", style="progress.remaining")
            return Text(
                f"{_clock(elapsed / done * (task.total - task.completed))} left", style="progress.remaining"
            )

    return CountColumn, TimeColumn


def _CountColumn():
    return _rich_columns()[0]()


def _TimeColumn():
    return _rich_columns()[1]()


def _num(value: float) -> str:
    if isinstance(value, float) and (abs(value) >= 1e4 or (0 < abs(value) < 1e-3)):
        return f"{value:.2e}"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _format(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k.removeprefix('val/')}={_num(v)}" for k, v in sorted(metrics.items()))


def _sparkline(points: list[tuple[int, float]]) -> str:
    bars = "▁▂▃▄▅▆▇█"
    values = [v for _, v in points]
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    line = "".join(bars[min(len(bars) - 1, int((v - low) / span * (len(bars) - 1)))] for v in values)
    return f"{line}  (step {points[0][0]}: {values[0]:.3f} -> step {points[-1][0]}: {values[-1]:.3f}; min {low:.3f}, max {high:.3f})"


class JsonlSink:
    """One JSON object per line: ``{"step": N, ...metrics}``."""

    SAMPLES_FILE = "generations.jsonl"

    def __init__(self, options, context):
        self.path = _run_dir(context) / options.filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.resume = _resume_step(context)
        self.file = _open_for_append(self.path, self.resume)
        self.samples = None  # generations.jsonl, opened on the first samples

    def log(self, metrics: dict[str, float], step: int) -> None:
        clean = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()
        }
        self.file.write(json.dumps({"step": step, **clean}) + "\n")
        self.file.flush()

    def log_samples(self, rows: list[dict[str, Any]], step: int) -> None:
        if self.samples is None:
            self.samples = _open_for_append(self.path.with_name(self.SAMPLES_FILE), self.resume)
        for row in rows:
            self.samples.write(json.dumps({"step": step, **row}) + "\n")
        self.samples.flush()

    def close(self) -> None:
        self.file.close()
        if self.samples is not None:
            self.samples.close()


def _open_for_append(path: Path, resume: int | None):
    """``path`` for appending, keeping only the records of steps up to ``resume`` (a fresh run
    keeps none), so a resumed run never logs a step twice; a line cut by a crash is dropped."""
    if path.exists():
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if resume is not None and record.get("step", 0) <= resume:
                kept.append(line)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
        os.replace(tmp, path)
    return open(path, "a", encoding="utf-8")


def console(options, context):
    return ConsoleSink(options, context)


def jsonl(options, context):
    return JsonlSink(options, context)
