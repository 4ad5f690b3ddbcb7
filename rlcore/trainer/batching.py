"""How a step's batch is cut for the passes: mini-batches (one optimizer step each) along prompt
groups, packed micro-batches (one forward/backward each), and the padding that keeps ranks in step.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable

import torch

from rlcore.trainer.batch import MicroBatch, RolloutBatch, pack
from rlcore.trainer.distributed import Distributed


@dataclasses.dataclass(frozen=True)
class Batching:
    dist: Distributed
    device: str
    micro_batch_tokens: int
    mini_batch_count: int
    share_prompts: bool = False  # pack a prompt's samples as the prompt once, then each response

    def unshared(self) -> Batching:
        """The same cuts with every sample packed whole (for a model whose attention cannot take
        a prompt-sharing layout, such as the critic's)."""
        return dataclasses.replace(self, share_prompts=False)

    def micro_batches(self, batch: RolloutBatch, rows=None) -> list[MicroBatch | None]:
        """Packed micro-batches of ``rows``; with several ranks, padded with ``None`` (a dummy
        forward) to the largest count, since every sharded forward is a collective."""
        rows = range(batch.size) if rows is None else rows
        micro: list[MicroBatch | None] = list(
            pack(batch, list(rows), self.micro_batch_tokens, self.device, share_prompts=self.share_prompts)
        )
        return micro + [None] * (self.dist.max(len(micro)) - len(micro))

    def mini_batches(self, batch: RolloutBatch) -> list[list[int]]:
        """Split rows into mini-batches along prompt groups, so a group stays together."""
        groups = defaultdict(list)
        for row, g in enumerate(batch.group_ids.tolist()):
            groups[g].append(row)
        ordered = [groups[g] for g in sorted(groups)]
        per = math.ceil(len(ordered) / self.mini_batch_count)
        return [sum(ordered[i : i + per], []) for i in range(0, len(ordered), per)]

    @torch.no_grad()
    def per_token(
        self, batch: RolloutBatch, compute: Callable[[MicroBatch], torch.Tensor], dummy: Callable[[], object]
    ) -> torch.Tensor:
        """``compute(micro)`` (one value per selected token) over every micro-batch, scattered
        into a [B, T] CPU tensor, 0 outside the response mask; ``dummy()`` stands in for the
        micro-batches another rank has more of."""
        out = torch.zeros(batch.size, batch.width)
        for micro in self.micro_batches(batch):
            if micro is None:
                dummy()
                continue
            out[micro.rows] = micro.scatter(compute(micro).float(), batch.width).cpu()
        return out * batch.response_mask
