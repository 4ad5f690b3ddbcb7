"""The TensorBoard and Weights & Biases metrics sinks.

Every sink receives ``log(metrics, step)`` once per training step (and once per validation, with
``val/`` keys), ``log_samples(rows, step)`` with validation generations, and ``close()`` at the
end. A resumed run drops what was logged after the checkpoint it resumes from (TensorBoard's
``purge_step``, wandb's resumed run id). A library that is not installed is a one-line error
naming the extra to install, raised when the run builds the sink, before its first step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlcore.errors import RlcoreError


def _run_dir(context) -> Path:
    if context is None or getattr(context, "run_dir", None) is None:
        raise RlcoreError("this metrics sink needs a run directory")
    return Path(context.run_dir)


def _resume_step(context) -> int | None:
    return getattr(context, "resume_step", None)


def missing_library(sink: str, package: str, extra: str, exc: ImportError) -> RlcoreError:
    """The error for a selected sink whose library is not installed, located at ``[trainer] loggers``."""
    return RlcoreError(
        f'[trainer] loggers: the "{sink}" metrics sink needs the {package} package, which is not installed '
        f'({exc}): pip install "rlcore-loggers[{extra}]"'
    )


class TensorboardSink:
    def __init__(self, options, context):
        try:
            import torch  # noqa: F401 - SummaryWriter is torch's
        except ImportError as exc:
            raise missing_library("tensorboard", "torch", "tensorboard", exc) from None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise missing_library("tensorboard", "tensorboard", "tensorboard", exc) from None
        kwargs: dict[str, Any] = {}
        if _resume_step(context) is not None:
            kwargs["purge_step"] = _resume_step(context) + 1
        self.writer = SummaryWriter(log_dir=str(_run_dir(context) / options.subdir), **kwargs)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_samples(self, rows: list[dict[str, Any]], step: int) -> None:
        """A markdown table under the text tab (val/generations)."""
        cell = lambda v: str(v).replace("|", "\\|").replace("\n", "<br>")  # noqa: E731
        lines = ["| data_source | prompt | response | score |", "|---|---|---|---|"]
        lines += [
            f"| {cell(r['data_source'])} | {cell(r['prompt'])} | {cell(r['response'])} | {r['score']:.4g} |"
            for r in rows
        ]
        self.writer.add_text("val/generations", "\n".join(lines), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, options, context):
        try:
            import wandb
        except ImportError as exc:
            raise missing_library("wandb", "wandb", "wandb", exc) from None
        run_dir = _run_dir(context)
        manifest = getattr(context, "manifest", None) or {}
        self.run = wandb.init(
            project=options.project,
            entity=options.entity,
            mode=options.mode,
            tags=options.tags,
            dir=str(run_dir),
            name=run_dir.name,
            id=run_dir.name.replace("/", "-"),
            resume="allow",
            config=manifest,
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_samples(self, rows: list[dict[str, Any]], step: int) -> None:
        import wandb

        columns = ["step", "data_source", "prompt", "response", "score"]
        table = wandb.Table(columns=columns, data=[[step] + [r[c] for c in columns[1:]] for r in rows])
        self.run.log({"val/generations": table}, step=step)

    def close(self) -> None:
        self.run.finish()


def tensorboard(options, context):
    return TensorboardSink(options, context)


def wandb(options, context):
    return WandbSink(options, context)
