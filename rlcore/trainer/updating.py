"""The update loop both trained roles share: epochs over mini-batches, gradients accumulated over
packed micro-batches, one optimizer step per mini-batch.

A role gives what is its own: for each mini-batch, a function that runs one micro-batch's forward
pass and returns the loss to back-propagate with that micro-batch's share of each metric. The loop
keeps ranks in step (a rank with fewer micro-batches runs dummy passes), adds the metric shares up
over micro-batches and ranks, clips the gradient, skips a step whose gradient norm is not finite,
and averages the metrics over mini-batches and epochs.
"""

from __future__ import annotations

import math
import re
import warnings
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from loguru import logger

from rlcore import progress
from rlcore.trainer.batch import MicroBatch, RolloutBatch
from rlcore.trainer.batching import Batching
from rlcore.trainer.distributed import Distributed, clip_grad_norm

# For one micro-batch: (loss to back-propagate, this micro-batch's share of each metric).
MicroStep = Callable[[MicroBatch], tuple[torch.Tensor, dict[str, Any]]]


def run_updates(
    role,
    batch: RolloutBatch,
    *,
    epochs: int,
    batching: Batching,
    dist: Distributed,
    grad_clip: float,
    mini_batch: Callable[[list[int], float], MicroStep],
    prefix: str,
) -> dict[str, float]:
    """``epochs`` passes over ``batch``'s mini-batches, one optimizer step of ``role`` each; the
    mean over the steps of every metric, and ``{prefix}/grad_norm`` (``{prefix}/skipped_updates``
    counts steps left out for a non-finite gradient). ``mini_batch(rows, tokens)`` gets the
    mini-batch's rows and its response tokens summed over the ranks. ``role`` is a :class:`TrainedRole` with
    ``optimizer``, ``params``, ``scheduler`` and ``dummy_forward()``."""
    sums: dict[str, list[float]] = defaultdict(list)
    for _ in range(epochs):
        for rows in batching.mini_batches(batch):
            tokens = dist.sum(float(batch.response_mask[rows].sum()))  # in the loss, on every rank
            if not tokens:
                # Nothing in the loss on any rank (dynamic sampling's padding): no step, which on a
                # zero gradient would still move the weights by the optimizer's momentum and decay.
                sums[f"{prefix}/empty_mini_batches"].append(1.0)
                continue
            role.optimizer.zero_grad(set_to_none=True)
            micro_step = mini_batch(rows, tokens)
            # Metrics stay on the device until the mini-batch ends: a read-back per micro-batch
            # would stall the GPU between its forward and backward passes.
            acc: dict[str, Any] = defaultdict(float)
            for micro in progress.each(
                batching.micro_batches(batch, rows), f"updating the {prefix}", "micro-batches"
            ):
                if micro is None:
                    role.dummy_forward().backward()
                    continue
                loss, shares = micro_step(micro)
                # FSDP averages gradients over ranks; the weights already normalise globally.
                (loss * dist.world).backward()
                for key, value in shares.items():
                    acc[key] += value
            # Each rank holds its share of every sum; add them up.
            acc = {k: dist.sum(float(v)) for k, v in sorted(acc.items())}
            grad_norm = clip_grad_norm(role.params, grad_clip, dist)
            if math.isfinite(grad_norm):
                role.optimizer_step()
            else:
                logger.warning("{}: non-finite gradient norm; the update is skipped", prefix)
                sums[f"{prefix}/skipped_updates"].append(1.0)
            acc[f"{prefix}/grad_norm"] = grad_norm
            for key, value in acc.items():
                sums[key].append(value)
    empty = f"{prefix}/empty_mini_batches"
    with warnings.catch_warnings():
        if empty in sums and f"{prefix}/grad_norm" not in sums:  # no step this time, and maybe never yet
            warnings.filterwarnings(
                "ignore", re.escape("Detected call of `lr_scheduler.step()` before `optimizer.step()`")
            )
        role.scheduler.step()  # once a batch, as always: the schedule counts trainer steps
    out = {k: sum(v) / len(v) for k, v in sums.items()}
    if empty in sums:  # a count, not a mean; a batch of padding only has no gradient at all
        out[empty] = float(len(sums[empty]))
        out.setdefault(f"{prefix}/grad_norm", 0.0)
    return out
