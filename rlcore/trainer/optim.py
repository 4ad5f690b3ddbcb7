"""The optimizer and learning-rate schedule every trained role uses."""

from __future__ import annotations

import torch


def adamw(
    params: list[torch.nn.Parameter], lr: float, betas: tuple[float, float], weight_decay: float
) -> torch.optim.AdamW:
    """AdamW, fused into one kernel per step when every parameter is on a CUDA device."""
    fused = bool(params) and all(p.is_cuda for p in params)
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused or None)


def warmup(optimizer: torch.optim.Optimizer, steps: int):
    """Linear warm-up over ``steps`` optimizer steps, then constant."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / (steps + 1)) if steps else 1.0
    )


def train_temperature(temperature: float) -> float:
    """The temperature log-probs are computed at: the sampling one, or 1 for greedy sampling."""
    return temperature if temperature > 0 else 1.0
