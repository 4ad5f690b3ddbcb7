"""The default agent loop: one engine call for the whole batch, one trajectory per completion."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlcore.errors import RlcoreError
from rlcore.interfaces import Prompt, RolloutEngine, SamplingParams, Trajectory


class SingleTurnLoop:
    """Every token of a single-turn response is model-generated, so the mask is all ones."""

    def run(
        self, prompts: Sequence[Prompt], engine: RolloutEngine, params: SamplingParams
    ) -> list[Trajectory]:
        if not prompts:
            return []
        outputs = engine.generate([list(p.token_ids) for p in prompts], params)
        if len(outputs) != len(prompts):
            raise RlcoreError(
                f"the rollout engine returned {len(outputs)} results for {len(prompts)} prompts"
            )
        trajectories: list[Trajectory] = []
        for prompt, completions in zip(prompts, outputs):
            if len(completions) != params.n:
                raise RlcoreError(
                    f"the rollout engine returned {len(completions)} completions, expected n={params.n}"
                )
            for c in completions:
                ids = list(c.token_ids)
                if len(c.logprobs) != len(ids):
                    raise RlcoreError(
                        f"the rollout engine returned {len(c.logprobs)} log-probabilities for {len(ids)} tokens"
                    )
                trajectories.append(
                    Trajectory(
                        prompt=prompt,
                        response_ids=ids,
                        response_mask=[1] * len(ids),
                        rollout_logprobs=[float(x) for x in c.logprobs],
                        finish_reason=c.finish_reason,
                        num_turns=1,
                        metrics={"agent/num_turns": 1.0},
                    )
                )
        return trajectories


def build(options: Any, context: Any) -> SingleTurnLoop:
    return SingleTurnLoop()
