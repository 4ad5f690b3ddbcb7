"""Building blocks of advantage estimators: group statistics and per-token discounted returns.

Conventions every estimator here follows:

- A reward sitting on a masked position (tool output, template glue, padding) is credited to
  the last model token before it, so a score placed after a tool's output is not lost; rewards
  before the first model token have no action to credit and are dropped.
- Discounting counts model tokens only: masked positions between two model tokens neither
  discount nor receive a return.
"""

from __future__ import annotations

import torch

from rlcore.algorithms.masked import as_bool_mask, masked_fill_zero
from rlcore.interfaces import AdvantageInput


def check_advantage_input(batch: AdvantageInput, needs_values: bool = False) -> None:
    """Raise ``ValueError`` naming the field when the shapes do not fit together."""
    mask = batch.response_mask
    if mask.dim() != 2:
        raise ValueError(f"response_mask must be [B, T], got shape {tuple(mask.shape)}")
    b = mask.shape[0]
    if tuple(batch.token_rewards.shape) != tuple(mask.shape):
        raise ValueError(
            f"token_rewards has shape {tuple(batch.token_rewards.shape)}, response_mask {tuple(mask.shape)}"
        )
    if tuple(batch.scores.shape) != (b,):
        raise ValueError(f"scores must be [B] = [{b}], got shape {tuple(batch.scores.shape)}")
    if tuple(batch.group_ids.shape) != (b,):
        raise ValueError(f"group_ids must be [B] = [{b}], got shape {tuple(batch.group_ids.shape)}")
    if needs_values:
        if batch.values is None:
            raise ValueError("this advantage estimator needs critic values (AdvantageInput.values), got None")
        if tuple(batch.values.shape) != tuple(mask.shape):
            raise ValueError(
                f"values has shape {tuple(batch.values.shape)}, response_mask {tuple(mask.shape)}"
            )


def group_stats(
    scores: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For each sample: its group's mean, unbiased standard deviation and size, each [B].

    Computed in float64 so that a group of equal scores has exactly zero spread. The standard
    deviation of a single-sample group is 0.
    """
    x = scores.detach().to(torch.float64)
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    count = torch.zeros(n_groups, dtype=torch.float64, device=x.device).index_add_(
        0, inverse, torch.ones_like(x)
    )
    total = torch.zeros(n_groups, dtype=torch.float64, device=x.device).index_add_(0, inverse, x)
    mean = (total / count)[inverse]
    sq = torch.zeros(n_groups, dtype=torch.float64, device=x.device).index_add_(0, inverse, (x - mean) ** 2)
    n = count[inverse]
    var = torch.where(n > 1, sq[inverse] / (n - 1).clamp(min=1), torch.zeros_like(x))
    return mean, var.sqrt(), n


def credit_masked_rewards(token_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Move each reward on a masked position onto the last model token before it; 0 elsewhere."""
    m = as_bool_mask(mask)
    t = token_rewards.shape[-1]
    positions = torch.arange(t, device=m.device).expand_as(m)
    last_valid = torch.where(m, positions, torch.full_like(positions, -1)).cummax(dim=-1).values
    rewards = torch.nan_to_num(token_rewards.detach(), nan=0.0, posinf=0.0, neginf=0.0)
    credited = rewards * (last_valid >= 0)
    out = torch.zeros_like(rewards)
    out.scatter_add_(-1, last_valid.clamp(min=0), credited)
    return masked_fill_zero(out, m)


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """``G_t = r_t + gamma * G_next`` over model tokens (``G_next``: the next model token's return), 0 elsewhere."""
    m = as_bool_mask(mask)
    rewards = credit_masked_rewards(token_rewards, m)
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0]) if rewards.shape[-1] else None
    for t in reversed(range(rewards.shape[-1])):
        step = rewards[:, t] + gamma * running
        running = torch.where(m[:, t], step, running)
        out[:, t] = torch.where(m[:, t], step, torch.zeros_like(step))
    return out


def broadcast_over_tokens(
    per_sample: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """A [B] value copied onto every model token of its row, [B, T], 0 elsewhere."""
    m = as_bool_mask(mask)
    values = per_sample.to(dtype or torch.float32).unsqueeze(-1).expand(m.shape)
    return masked_fill_zero(values, m)
