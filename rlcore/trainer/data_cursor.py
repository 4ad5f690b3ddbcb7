"""A resumable position in the training prompts: epoch-wise seeded shuffles, saved in checkpoints;
and a mixture of data sources in fixed proportions."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace

from rlcore.errors import RlcoreError


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

    def copy(self) -> DataCursor:
        return replace(self)

    def load(self, state: dict) -> None:
        if "sources" in state:
            raise RlcoreError(
                f"the checkpoint's data position is per source ({', '.join(sorted(state['sources']))}): it was trained "
                "with [data] source_weights; resume with them"
            )
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])


def shares(total: int, weights: dict[str, float]) -> dict[str, int]:
    """``total`` split in proportion to ``weights`` (largest remainders; ties by name), summing to ``total``."""
    norm = sum(weights.values())
    exact = {name: total * w / norm for name, w in weights.items()}
    counts = {name: int(x) for name, x in exact.items()}
    left = total - sum(counts.values())
    for name in sorted(exact, key=lambda n: (-(exact[n] - counts[n]), n))[:left]:
        counts[name] += 1
    return counts


@dataclass
class MixedCursor:
    """Each step's prompts drawn from several data sources in fixed proportions (``[data]
    source_weights``): one :class:`DataCursor` per source over its own rows, so each source runs
    through its epochs at its own pace. ``members[name]`` are the source's row indices."""

    members: dict[str, list[int]]
    weights: dict[str, float]
    seed: int
    shuffle: bool = True

    def __post_init__(self) -> None:
        self.cursors = {
            name: DataCursor(len(rows), seed=self.seed + 7919 * i, shuffle=self.shuffle)
            for i, (name, rows) in enumerate(sorted(self.members.items()))
        }

    @property
    def epoch(self) -> int:
        """Passes completed over the slowest source."""
        return min(c.epoch for name, c in self.cursors.items() if self.weights.get(name, 0) > 0)

    def take(self, count: int) -> list[int]:
        """``count`` row indices, the sources' shares interleaved (so every rank's part mixes them too)."""
        picked = {
            name: [self.members[name][i] for i in self.cursors[name].take(n)]
            for name, n in shares(count, {k: v for k, v in self.weights.items() if v > 0}).items()
        }
        out: list[int] = []
        for position in range(max((len(v) for v in picked.values()), default=0)):
            out.extend(rows[position] for _, rows in sorted(picked.items()) if position < len(rows))
        return out

    def copy(self) -> MixedCursor:
        twin = MixedCursor(self.members, self.weights, self.seed, self.shuffle)
        twin.load(self.state())
        return twin

    def state(self) -> dict:
        return {"sources": {name: c.state() for name, c in self.cursors.items()}}

    def load(self, state: dict) -> None:
        sources = state.get("sources")
        if not isinstance(sources, dict) or set(sources) != set(self.cursors):
            raise RlcoreError(
                f"the checkpoint's data position covers the sources {sorted(sources or [])}, this run's [data] "
                f"source_weights {sorted(self.cursors)}; resume with the weights it was trained with"
            )
        for name, cursor in self.cursors.items():
            cursor.load(sources[name])
