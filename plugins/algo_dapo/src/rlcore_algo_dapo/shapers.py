"""DAPO's soft overlong punishment as a score shaper."""

from __future__ import annotations

from collections.abc import Sequence

from rlcore.errors import UsageError
from rlcore.interfaces import BuildContext, Trajectory
from rlcore_algo_dapo.shaping import overlong_penalty


class Overlong:
    def __init__(self, buffer: int, penalty: float, max_response_tokens: int):
        self.buffer, self.penalty, self.max_response_tokens = buffer, penalty, max_response_tokens

    def shape(
        self, trajectories: Sequence[Trajectory], scores: Sequence[float]
    ) -> tuple[list[float], dict[str, float]]:
        penalties = [
            overlong_penalty(len(t.response_ids), self.max_response_tokens, self.buffer, self.penalty)
            for t in trajectories
        ]
        shaped = [s + p for s, p in zip(scores, penalties)]
        return shaped, {"reward/overlong_penalty/mean": sum(penalties) / max(len(penalties), 1)}


def build_overlong(options, context: BuildContext | None = None) -> Overlong:
    """The buffer ends at ``[data] max_response_tokens`` of the run's manifest."""
    data = (context.manifest.get("data") if context is not None else None) or {}
    length = data.get("max_response_tokens")
    if not isinstance(length, int):
        raise UsageError("[shapers.overlong] needs [data] max_response_tokens, where its buffer ends")
    if options.buffer > length:
        raise UsageError(
            f"[shapers.overlong] buffer = {options.buffer} is longer than [data] max_response_tokens = {length}; "
            "the buffer is the last part of the response length"
        )
    return Overlong(options.buffer, options.penalty, length)
