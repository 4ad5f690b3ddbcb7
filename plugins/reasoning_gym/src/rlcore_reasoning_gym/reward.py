"""The ``reasoning_gym`` reward: each row scored by its own task's ``score_answer``.

The row (from the ``reasoning_gym`` data source) carries its task, the task's options and the
generated item in ``extra_info.reasoning_gym``; the scorer is that task's dataset object, built
once per task and options in each reward worker. Mixtures need no routing: every row names its
task. What counts as the answer is an option: the last ``<answer>`` tag (reasoning-gym's own
convention), the whole response, or its last line.
"""

from __future__ import annotations

import re
from typing import Any

from rlcore.errors import RlcoreError
from rlcore.interfaces import RewardInput, RewardResult
from rlcore_reasoning_gym.options import ReasoningGymRewardOptions

KEY = "reasoning_gym"


class ReasoningGymReward:
    def __init__(self, options: ReasoningGymRewardOptions) -> None:
        self.options = options
        self._tag = re.compile(rf"<{options.tag}>\s?(.*?)\s?</{options.tag}>", re.DOTALL)
        self._scorers: dict[str, Any] = {}

    def extract(self, response: str) -> str | None:
        if self.options.answer == "tag":
            found = self._tag.findall(response)
            return found[-1].strip() if found else None
        if self.options.answer == "last_line":
            lines = [line.strip() for line in response.splitlines() if line.strip()]
            return lines[-1] if lines else ""
        return response.strip()

    def _scorer(self, info: dict[str, Any]) -> Any:
        import reasoning_gym

        key = repr((info["task"], sorted(info.get("config", {}).items())))
        if key not in self._scorers:
            self._scorers[key] = reasoning_gym.create_dataset(
                info["task"], seed=info.get("seed", 0), size=1, **info.get("config", {})
            )
        return self._scorers[key]

    def __call__(self, item: RewardInput) -> RewardResult:
        info = (item.extra_info or {}).get(KEY)
        if not isinstance(info, dict) or "entry" not in info:
            raise RlcoreError(f"row of {item.data_source!r} has no extra_info.{KEY}: not a reasoning_gym row")
        answer = self.extract(item.response)
        score = 0.0 if answer is None else float(self._scorer(info).score_answer(answer, info["entry"]))
        return RewardResult(score, {"answer_found": float(answer is not None)})

    def check_data(self, prompts: list[Any], source_name: str) -> None:
        """Refuse a data set whose rows this reward cannot score, naming the first such row."""
        from rlcore_reasoning_gym.options import task_table

        tasks = None
        for prompt in prompts:
            info = (prompt.extra_info or {}).get(KEY)
            if not isinstance(info, dict) or "entry" not in info or "task" not in info:
                raise RlcoreError(
                    f"data {source_name!r}, row {prompt.index}: the reasoning_gym reward scores rows of the "
                    f'reasoning_gym data source (data.train = "reasoning_gym:TASK"), and this row has no '
                    f"extra_info.{KEY}; route other sources to another reward with [reward.routes]"
                )
            tasks = tasks or task_table()
            if info["task"] not in tasks:
                raise RlcoreError(
                    f"data {source_name!r}, row {prompt.index}: unknown reasoning_gym task {info['task']!r}"
                )


def build(options: ReasoningGymRewardOptions, context: Any = None) -> ReasoningGymReward:
    return ReasoningGymReward(options)
