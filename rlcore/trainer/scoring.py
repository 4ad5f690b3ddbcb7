"""The reward role: the manifest's reward function, run safely (time limits, worker processes) on
decoded trajectories."""

from __future__ import annotations

from rlcore.interfaces import RewardInput, Trajectory
from rlcore.trainer.reward_runner import RewardRunner


class Scorer:
    def __init__(self, reward_fn, timeout_s: float, workers: int):
        self.reward_fn = reward_fn
        self.runner = RewardRunner(reward_fn, timeout_s=timeout_s, workers=workers)
        # Reward workers are forked processes: started while the trainer's process is still small.
        self.runner.start()

    @property
    def required_fields(self) -> set[str]:
        return set(getattr(self.reward_fn, "required_fields", ()) or ())

    def score(self, trajectories: list[Trajectory], tokenizer) -> tuple[list[float], dict[str, float]]:
        items = [
            RewardInput(
                response=tokenizer.decode(t.response_ids, skip_special_tokens=True),
                prompt=tokenizer.decode(t.prompt.token_ids, skip_special_tokens=False),
                ground_truth=t.prompt.ground_truth,
                data_source=t.prompt.data_source,
                extra_info=t.prompt.extra_info,
            )
            for t in trajectories
        ]
        result = self.runner.score(items)
        scores = [s + t.step_reward for s, t in zip(result.scores, trajectories)]
        return scores, dict(result.metrics)

    def close(self) -> None:
        self.runner.close()
