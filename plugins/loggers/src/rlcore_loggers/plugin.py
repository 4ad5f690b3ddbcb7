"""Registers the ``tensorboard`` and ``wandb`` metrics sinks. Imports nothing heavy: neither
library is imported until a run builds its sink."""

from __future__ import annotations

import rlcore
from rlcore.components import Component
from rlcore_loggers.options import TensorboardOptions, WandbOptions


@rlcore.hookimpl
def rlcore_metrics_sinks():
    return [
        Component(
            "tensorboard", "rlcore_loggers.sinks:tensorboard", TensorboardOptions, "TensorBoard event files"
        ),
        Component(
            "wandb",
            "rlcore_loggers.sinks:wandb",
            WandbOptions,
            "Weights & Biases (offline mode works without a network)",
        ),
    ]
