"""A resumable position in the training prompts: epoch-wise seeded shuffles, saved in checkpoints."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass


@dataclass
class DataCursor:
    size: int
    seed: int
    shuffle: bool = True
    epoch: int = 0
    offset: int = 0

    def _order(self, epoch: int) -> list[int]:
        order = list(range(self.size))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def take(self, count: int) -> list[int]:
        """The next ``count`` indices, crossing into the next epoch when this one runs out."""
        picked: list[int] = []
        while len(picked) < count:
            order = self._order(self.epoch)
            room = min(count - len(picked), self.size - self.offset)
            picked.extend(order[self.offset : self.offset + room])
            self.offset += room
            if self.offset >= self.size:
                self.epoch, self.offset = self.epoch + 1, 0
        return picked

    def state(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if k in ("epoch", "offset")}

    def load(self, state: dict[str, int]) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
