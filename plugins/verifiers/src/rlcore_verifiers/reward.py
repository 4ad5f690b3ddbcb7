"""The ``verifiers`` reward: each row scored by its own task's ``@vf.reward`` functions.

The row names its environment and task (``extra_info.verifiers``, from the data source). The
trace scored is the episode the ``verifiers`` agent loop played (its record rides in the row it
returns: prompt, model turns, tool results, user turns, stop condition, task state), or, for a
row played by another loop (``single_turn``), the row's prompt and the decoded response as one
turn. The score is verifiers' own: the weighted sum of the task's rewards; each reward and each
``@vf.metric`` is also reported (as ``reward/NAME`` and ``reward/metric/NAME`` in the run's metrics).
"""

from __future__ import annotations

import asyncio
from typing import Any

from rlcore.errors import RlcoreError
from rlcore.interfaces import RewardInput, RewardResult
from rlcore_verifiers import envs, traces
from rlcore_verifiers.options import VerifiersRewardOptions
from rlcore_verifiers.traces import KEY

RECORD = "episode"  # extra_info.verifiers key of the played episode's record


class VerifiersReward:
    def __init__(self, options: VerifiersRewardOptions) -> None:
        self.options = options

    def __call__(self, item: RewardInput) -> RewardResult:
        info = (item.extra_info or {}).get(KEY)
        if not isinstance(info, dict) or "task" not in info:
            if self.options.missing == "zero":
                return RewardResult(0.0, {"not_verifiers": 1.0})
            raise RlcoreError(f"row of {item.data_source!r} has no extra_info.{KEY}: not a verifiers row")
        loaded = envs.load_from_row(info)
        task = loaded.task(info["task"])
        rec = info.get(RECORD)
        if rec is not None and rec.get("error"):  # the env's own code failed (or timed out) in this episode
            return RewardResult(0.0, {"episode_error": 1.0})
        if rec is not None:
            trace = traces.from_record(task, loaded.seat, loaded.seat_config, rec)
        else:
            trace = traces.from_response(
                task, loaded.seat, loaded.seat_config, list(item.messages), item.response
            )
        score, metrics = asyncio.run(traces.score(task, trace))
        return RewardResult(score, metrics)

    def check_data(self, prompts: list[Any], source_name: str) -> None:
        """Refuse rows that are not the verifiers source's (naming the first), unless told to score them 0;
        load each environment the rows name, so a broken one fails before training."""
        seen: set[str] = set()
        for prompt in prompts:
            info = (prompt.extra_info or {}).get(KEY)
            if not isinstance(info, dict) or "task" not in info or "env" not in info:
                if self.options.missing == "zero":
                    continue
                raise RlcoreError(
                    f"data {source_name!r}, row {prompt.index}: the verifiers reward scores rows of the verifiers data "
                    f'source (data.train = "verifiers:ENV"), and this row has no extra_info.{KEY}; route other '
                    'sources to another reward with [reward.routes], or set [reward] missing = "zero"'
                )
            if info["env"] not in seen:
                seen.add(info["env"])
                envs.load_from_row(info)


def build(options: VerifiersRewardOptions, context: Any = None) -> VerifiersReward:
    return VerifiersReward(options)
