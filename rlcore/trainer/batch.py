"""Turns trajectories into training tensors, and packs them into micro-batches by token budget.

Response-level quantities (masks, log-probs, advantages) live as padded [B, T] tensors; forward
passes run on packed rows (sequences concatenated, positions restarting at 0, no padding), and
their per-token outputs are scattered back into [B, T].

With ``share_prompts``, the samples of one prompt are packed as the prompt once followed by each
response (``[prompt, response 1, response 2, ...]``), and :class:`SharedPrompts` tells the
attention which keys each response sees (the prompt's and its own): a GRPO step of 4 samples of a
128-token prompt and 256-token responses then runs 25% fewer tokens through every forward and
backward, computing the same log-probs (the prompt's hidden states do not depend on what follows
it, and its gradient is the sum over the responses either way).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

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


def build_batch(
    trajectories: Sequence[Trajectory],
    scores: Sequence[float],
    samples_per_prompt: int,
    group_offset: int = 0,
) -> RolloutBatch:
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
        groups.append(
            group_offset + group_of_prompt.setdefault(row // samples_per_prompt, len(group_of_prompt))
        )
    return RolloutBatch(
        trajectories=list(trajectories),
        prompt_ids=[list(t.prompt.token_ids) for t in trajectories],
        response_ids=[list(t.response_ids) for t in trajectories],
        response_mask=mask,
        rollout_logprobs=rollout_lp * mask,
        group_ids=torch.tensor(groups, dtype=torch.long),
        scores=torch.tensor(list(scores), dtype=torch.float32),
    )


@dataclass(frozen=True)
class SharedPrompts:
    """Which keys each query of a prompt-sharing micro-batch attends to.

    The packed row is cut into query segments (a prompt, then each of its responses); segment i
    attends causally, aligned at the end, to the keys ``kv_index[k_bounds[i]:k_bounds[i + 1]]``
    (for a prompt, itself; for a response, its prompt then itself). The bounds come as device
    tensors for the varlen kernel and as lists for the per-segment path, so the forward needs no
    host sync."""

    cu_q: torch.Tensor  # [S + 1] int32: query segment bounds in the packed row
    cu_k: torch.Tensor  # [S + 1] int32: key segment bounds in kv_index
    kv_index: torch.Tensor  # [K] long: packed-row position of each segment's keys, segment after segment
    q_bounds: list[int]
    k_bounds: list[int]
    max_q: int
    max_k: int


@dataclass
class MicroBatch:
    rows: list[int]  # which samples of the batch, in packing order
    input_ids: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N]
    select: torch.Tensor  # [M] positions whose next token is a response token
    targets: torch.Tensor  # [M] those response tokens
    local_rows: torch.Tensor  # [M] index into `rows`
    cols: torch.Tensor  # [M] response position of each target
    shared: SharedPrompts | None = None  # set when samples share their prompt's tokens in this row

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]

    def scatter(self, flat: torch.Tensor, width: int) -> torch.Tensor:
        """[M] per-target values -> [len(rows), width] (zeros elsewhere; differentiable)."""
        out = flat.new_zeros(len(self.rows), width)
        return out.index_put((self.local_rows, self.cols), flat)


def pack(
    batch: RolloutBatch,
    rows: Sequence[int],
    token_budget: int,
    device: str | torch.device = "cpu",
    share_prompts: bool = False,
) -> list[MicroBatch]:
    """Pack ``rows`` into as few micro-batches of at most ``token_budget`` tokens as
    first-fit-decreasing finds (a longer sequence gets a micro-batch of its own), with the load
    spread evenly over them: 256 sequences of 384 tokens in 32K-token micro-batches become four
    of 64, not three of 85 and one of a single sequence, whose tiny forward leaves the GPU idle.

    With ``share_prompts``, the unit packed is a prompt with its samples (split into several units
    when they do not fit the budget together), each prompt's tokens counted once; where no prompt
    has two samples among ``rows`` the plain packing is used."""
    units = _prompt_units(batch, rows, token_budget) if share_prompts else None
    if units is None:
        units = {r: [r] for r in rows}
        lengths = {r: len(batch.prompt_ids[r]) + len(batch.response_ids[r]) for r in rows}
        build = lambda members: _micro(batch, sorted(r for u in members for r in units[u]), device)  # noqa: E731
    else:
        lengths = {
            u: len(batch.prompt_ids[m[0]]) + sum(len(batch.response_ids[r]) for r in m)
            for u, m in units.items()
        }
        build = lambda members: _shared_micro(batch, [units[u] for u in sorted(members)], device)  # noqa: E731
    order = sorted(units, key=lambda u: -lengths[u])
    first_fit = _bins(order, lengths, token_budget, count=0, least_loaded=False)
    balanced = _bins(order, lengths, token_budget, count=len(first_fit), least_loaded=True)
    bins = balanced if len(balanced) <= len(first_fit) else first_fit
    return [build(b) for b in bins if b]


def _prompt_units(batch: RolloutBatch, rows: Sequence[int], token_budget: int) -> dict[int, list[int]] | None:
    """Rows grouped by identical prompt tokens (in order of first appearance), each group cut into
    consecutive units whose prompt plus responses fit ``token_budget`` (a response too long for
    that gets a unit of its own); None when no prompt has two rows."""
    families: dict[tuple[int, ...], list[int]] = {}
    for r in rows:
        families.setdefault(tuple(batch.prompt_ids[r]), []).append(r)
    if all(len(members) < 2 for members in families.values()):
        return None
    units: dict[int, list[int]] = {}
    for prompt, members in families.items():
        current: list[int] = []
        load = len(prompt)
        for r in members:
            size = len(batch.response_ids[r])
            if current and load + size > token_budget:
                units[len(units)] = current
                current, load = [], len(prompt)
            current.append(r)
            load += size
        units[len(units)] = current
    return units


def _bins(
    order: list[int], lengths: dict[int, int], budget: int, count: int, least_loaded: bool
) -> list[list[int]]:
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


class _Row:
    """The lists a packed row is built from, and the micro-batch they become."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.pos: list[int] = []
        self.select: list[int] = []
        self.targets: list[int] = []
        self.local_rows: list[int] = []
        self.cols: list[int] = []

    def append(self, tokens: list[int], first_position: int = 0) -> int:
        """Append ``tokens`` at positions ``first_position, ...``; return where they start in the row."""
        start = len(self.ids)
        self.ids.extend(tokens)
        self.pos.extend(range(first_position, first_position + len(tokens)))
        return start

    def predict(self, local: int, response: list[int], at: Sequence[int]) -> None:
        """Response token t of row ``local`` is predicted from row position ``at[t]``."""
        for t, (token, where) in enumerate(zip(response, at)):
            self.select.append(where)
            self.targets.append(token)
            self.local_rows.append(local)
            self.cols.append(t)

    def micro_batch(self, rows: list[int], device, shared: SharedPrompts | None = None) -> MicroBatch:
        as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
        return MicroBatch(
            rows=rows,
            input_ids=as_long(self.ids).unsqueeze(0),
            position_ids=as_long(self.pos).unsqueeze(0),
            select=as_long(self.select),
            targets=as_long(self.targets),
            local_rows=as_long(self.local_rows),
            cols=as_long(self.cols),
            shared=shared,
        )


def _micro(batch: RolloutBatch, rows: list[int], device) -> MicroBatch:
    row = _Row()
    for local, r in enumerate(rows):
        prompt, response = batch.prompt_ids[r], batch.response_ids[r]
        start = row.append(prompt + response)
        first = start + len(prompt) - 1  # the prompt's last token predicts the first response token
        row.predict(local, response, range(first, first + len(response)))
    return row.micro_batch(rows, device)


def _shared_micro(batch: RolloutBatch, units: list[list[int]], device) -> MicroBatch:
    """One packed row of ``[prompt, response, response, ...]`` per unit (rows sharing a prompt).

    A response's first token is predicted from the prompt's last position, which every response
    of the unit shares; its positions continue the prompt's (len(prompt), len(prompt) + 1, ...)."""
    row = _Row()
    rows: list[int] = []
    q_bounds = [0]
    k_bounds = [0]
    kv_index: list[int] = []
    for members in units:
        prompt = batch.prompt_ids[members[0]]
        start = row.append(prompt)
        prompt_keys = range(start, start + len(prompt))
        q_bounds.append(len(row.ids))
        kv_index.extend(prompt_keys)
        k_bounds.append(len(kv_index))
        for r in members:
            local = len(rows)
            rows.append(r)
            response = batch.response_ids[r]
            if not response:
                continue
            first = row.append(response, first_position=len(prompt))
            q_bounds.append(len(row.ids))
            kv_index.extend(prompt_keys)
            kv_index.extend(range(first, first + len(response)))
            k_bounds.append(len(kv_index))
            row.predict(local, response, [prompt_keys[-1], *range(first, first + len(response) - 1)])
    as_int = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
    q_sizes = [b - a for a, b in zip(q_bounds, q_bounds[1:])]
    k_sizes = [b - a for a, b in zip(k_bounds, k_bounds[1:])]
    shared = SharedPrompts(
        cu_q=as_int(q_bounds),
        cu_k=as_int(k_bounds),
        kv_index=torch.tensor(kv_index, dtype=torch.long, device=device),
        q_bounds=q_bounds,
        k_bounds=k_bounds,
        max_q=max(q_sizes),
        max_k=max(k_sizes),
    )
    return row.micro_batch(rows, device, shared)
