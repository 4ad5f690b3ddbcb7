"""Turns trajectories into training tensors, and packs them into micro-batches by token budget.

Response-level quantities (masks, log-probs, advantages) live as padded [B, T] tensors; forward
passes run on packed rows (sequences concatenated, positions restarting at 0, no padding), and
their per-token outputs are scattered back into [B, T].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from rlcore.interfaces import Trajectory


@dataclass
class RolloutBatch:
    trajectories: list[Trajectory]
    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    response_mask: torch.Tensor  # [B, T] float
    rollout_logprobs: torch.Tensor  # [B, T]
    group_ids: torch.Tensor  # [B] long
    scores: torch.Tensor  # [B]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # old_logprobs, ref_logprobs, values, ...

    @property
    def size(self) -> int:
        return len(self.response_ids)

    @property
    def width(self) -> int:
        return self.response_mask.shape[1]

    def sequence_lengths(self) -> list[int]:
        return [len(p) + len(r) for p, r in zip(self.prompt_ids, self.response_ids)]


def build_batch(trajectories: Sequence[Trajectory], scores: Sequence[float], samples_per_prompt: int, group_offset: int = 0) -> RolloutBatch:
    width = max(1, max((len(t.response_ids) for t in trajectories), default=1))
    size = len(trajectories)
    mask = torch.zeros(size, width)
    rollout_lp = torch.zeros(size, width)
    group_of_prompt: dict[int, int] = {}
    groups = []
    for row, traj in enumerate(trajectories):
        n = len(traj.response_ids)
        mask[row, :n] = torch.tensor(traj.response_mask[:n], dtype=torch.float32)
        rollout_lp[row, :n] = torch.tensor(traj.rollout_logprobs[:n], dtype=torch.float32)
        # Samples of one prompt share a group; identify prompts by their position in the batch.
        groups.append(group_offset + group_of_prompt.setdefault(row // samples_per_prompt, len(group_of_prompt)))
    return RolloutBatch(
        trajectories=list(trajectories),
        prompt_ids=[list(t.prompt.token_ids) for t in trajectories],
        response_ids=[list(t.response_ids) for t in trajectories],
        response_mask=mask,
        rollout_logprobs=rollout_lp * mask,
        group_ids=torch.tensor(groups, dtype=torch.long),
        scores=torch.tensor(list(scores), dtype=torch.float32),
    )


@dataclass
class MicroBatch:
    rows: list[int]  # which samples of the batch, in packing order
    input_ids: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N]
    select: torch.Tensor  # [M] positions whose next token is a response token
    targets: torch.Tensor  # [M] those response tokens
    local_rows: torch.Tensor  # [M] index into `rows`
    cols: torch.Tensor  # [M] response position of each target

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]

    def scatter(self, flat: torch.Tensor, width: int) -> torch.Tensor:
        """[M] per-target values -> [len(rows), width] (zeros elsewhere; differentiable)."""
        out = flat.new_zeros(len(self.rows), width)
        return out.index_put((self.local_rows, self.cols), flat)


def pack(batch: RolloutBatch, rows: Sequence[int], token_budget: int, device: str | torch.device = "cpu") -> list[MicroBatch]:
    """Pack ``rows`` into as few micro-batches of at most ``token_budget`` tokens as
    first-fit-decreasing finds (a longer sequence gets a micro-batch of its own), with the load
    spread evenly over them: 256 sequences of 384 tokens in 32K-token micro-batches become four
    of 64, not three of 85 and one of a single sequence, whose tiny forward leaves the GPU idle."""
    lengths = {r: len(batch.prompt_ids[r]) + len(batch.response_ids[r]) for r in rows}
    order = sorted(rows, key=lambda r: -lengths[r])
    first_fit = _bins(order, lengths, token_budget, count=0, least_loaded=False)
    balanced = _bins(order, lengths, token_budget, count=len(first_fit), least_loaded=True)
    bins = balanced if len(balanced) <= len(first_fit) else first_fit
    return [_micro(batch, sorted(b), device) for b in bins if b]


def _bins(order: list[int], lengths: dict[int, int], budget: int, count: int, least_loaded: bool) -> list[list[int]]:
    """Place each row (longest first) into the first bin it fits, or the least loaded one; a row
    that fits none opens a new bin. ``count`` empty bins exist from the start."""
    bins: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for r in order:
        fits = [i for i, load in enumerate(loads) if load + lengths[r] <= budget or not bins[i]]
        if fits:
            i = min(fits, key=lambda i: loads[i]) if least_loaded else fits[0]
        else:
            bins.append([])
            loads.append(0)
            i = len(bins) - 1
        bins[i].append(r)
        loads[i] += lengths[r]
    return bins


def _micro(batch: RolloutBatch, rows: list[int], device) -> MicroBatch:
    ids: list[int] = []
    pos: list[int] = []
    select: list[int] = []
    targets: list[int] = []
    local_rows: list[int] = []
    cols: list[int] = []
    for local, r in enumerate(rows):
        prompt, response = batch.prompt_ids[r], batch.response_ids[r]
        start = len(ids)
        seq = prompt + response
        ids.extend(seq)
        pos.extend(range(len(seq)))
        for t in range(len(response)):
            select.append(start + len(prompt) + t - 1)
            targets.append(response[t])
            local_rows.append(local)
            cols.append(t)
    as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
    return MicroBatch(
        rows=rows,
        input_ids=as_long(ids).unsqueeze(0),
        position_ids=as_long(pos).unsqueeze(0),
        select=as_long(select),
        targets=as_long(targets),
        local_rows=as_long(local_rows),
        cols=as_long(cols),
    )
