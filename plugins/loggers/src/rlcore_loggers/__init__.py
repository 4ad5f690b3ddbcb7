"""rlcore-loggers: the ``tensorboard`` and ``wandb`` metrics sinks (``[trainer] loggers``)."""
