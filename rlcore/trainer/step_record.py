"""One training step's record: what each stage of the step pipeline reads and adds to.

The stages (rl.py's ``train_step``: rollout, assemble, prepare, estimate, update, sync) take the
record and fill it in, instead of sharing state on the trainer, so a stage can move (into a
background thread, behind a filter) without the others noticing (docs/architecture.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlcore.interfaces import SamplingParams, Trajectory
    from rlcore.trainer.batch import RolloutBatch
    from rlcore.trainer.filling import ScoredBatch
    from rlcore.trainer.phases import Timer


@dataclass
class StepRecord:
    """``step``: the optimizer steps taken before this one (the trainer's count). ``timer``: the
    step's phases (``timing_s/*``). Then, as the stages run: ``scored`` (the scheduler's
    generated, scored, shaped and filtered batch), ``batch`` (its tensors), ``recomputed_old``
    (the old log-probs were computed before the update rather than by its own pass) and
    ``metrics``."""

    step: int
    timer: Timer
    scored: ScoredBatch | None = None
    batch: RolloutBatch | None = None
    recomputed_old: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def cursor(self) -> dict[str, int]:
        """The data position after this step's prompts: where the trainer's cursor goes once it trained them."""
        assert self.scored is not None, "the rollout stage has not run"
        return self.scored.cursor

    @property
    def params(self) -> SamplingParams:
        assert self.scored is not None, "the rollout stage has not run"
        return self.scored.params

    @property
    def trajectories(self) -> list[Trajectory]:
        assert self.scored is not None, "the rollout stage has not run"
        return self.scored.trajectories
