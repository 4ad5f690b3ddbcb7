"""A small verifiers environment for examples/verifiers_env.toml: sums of two small numbers,
generated from a seed (a local dataset: nothing is downloaded), scored by the task's own reward.

It is a verifiers 0.4 taskset like any installed one: a ``Taskset`` whose ``load()`` yields
tasks, a ``Task`` whose ``@vf.reward`` functions score a finished trace. ``rlcore`` plays it
through the ``verifiers`` data source, agent loop and reward (plugins/verifiers).
"""

from __future__ import annotations

import random

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.reward
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        """1 when the reply is the sum (digits only, as asked)."""
        return float(trace.last_reply.strip().rstrip(".") == task.answer)

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class SumConfig(vf.TasksetConfig):
    size: int = 1000
    max_operand: int = 9
    seed: int = 0
    instruction: str = "Reply with only the number."


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        for _ in range(self.config.size):
            a, b = rng.randint(0, self.config.max_operand), rng.randint(0, self.config.max_operand)
            yield SumTask(
                SumData(prompt=f"What is {a} + {b}? {self.config.instruction}", answer=str(a + b)),
                self.config.task,
            )


__all__ = ["SumTaskset"]
