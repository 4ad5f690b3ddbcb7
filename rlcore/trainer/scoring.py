"""The reward role: the manifest's reward function, run safely (time limits, worker processes) on
decoded trajectories."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlcore import progress
from rlcore.errors import UsageError
from rlcore.interfaces import Prompt, RewardInput, Trajectory
from rlcore.reward_pool import RewardRunner, check_required_fields, score_batched


class RoutedReward:
    """Scores each row with the reward function of its ``data_source`` (``[reward.routes]``), or
    with ``default`` (``[reward] function``) for the sources without a route."""

    def __init__(self, routes: dict[str, Callable[..., Any]], default: Callable[..., Any] | None):
        batched = [
            source for source, fn in {**routes, "(default)": default}.items() if getattr(fn, "batched", False)
        ]
        if batched:
            raise UsageError(
                f"[reward.routes]: the reward of {', '.join(map(repr, batched))} is a batched reward (a reward model or "
                "a judge), which routes do not take yet; route per-item rewards, or train that source on its own"
            )
        self.routes, self.default = routes, default

    def function_for(self, source: str) -> Callable[..., Any] | None:
        return self.routes.get(source, self.default)

    def __call__(self, item: RewardInput):
        fn = self.function_for(item.data_source)
        if fn is None:  # check_data refuses such rows up front; this is for rows made elsewhere
            raise ValueError(f"no reward function for data_source {item.data_source!r}")
        return fn(item)

    def check_data(self, prompts: list[Prompt], source_name: str) -> None:
        """Every row has a route (or there is a default), with the fields its function needs."""
        by_source: dict[str, list[Prompt]] = {}
        for prompt in prompts:
            by_source.setdefault(prompt.data_source, []).append(prompt)
        for source, rows in by_source.items():
            fn = self.function_for(source)
            if fn is None:
                routed = ", ".join(repr(s) for s in sorted(self.routes))
                raise UsageError(
                    f"data {source_name!r}: row {rows[0].index} has data_source {source!r}, which no "
                    f"[reward.routes] table scores (routed: {routed}) and [reward] sets no function for the rest"
                )
            check_reward_data(fn, rows, source_name)


def check_reward_data(fn: Any, prompts: list[Prompt], source_name: str) -> None:
    """The fields ``fn`` declares in ``required_fields``, then its own ``check_data(prompts,
    source_name)`` when it defines one (a router refusing a source it cannot score)."""
    check_required_fields(prompts, getattr(fn, "required_fields", ()) or (), source_name)
    own_check = getattr(fn, "check_data", None)
    if callable(own_check):
        own_check(prompts, source_name)


class Scorer:
    def __init__(self, reward_fn, timeout_s: float, workers: int, batch_timeout_s: float = 600.0):
        self.reward_fn, self.timeout_s, self.batch_timeout_s = reward_fn, timeout_s, batch_timeout_s
        self.batched = bool(getattr(reward_fn, "batched", False))
        # Per-item rewards run in worker processes, forked while the trainer's process is still
        # small; a batched one runs here (see BatchRewardFunction).
        self.runner = (
            None if self.batched else RewardRunner(reward_fn, timeout_s=timeout_s, workers=workers).start()
        )

    def check_data(self, prompts: list[Prompt], source_name: str) -> None:
        """Fail early, naming the file and row, on rows the reward cannot score."""
        check_reward_data(self.reward_fn, prompts, source_name)

    def score(self, trajectories: list[Trajectory], tokenizer) -> tuple[list[float], dict[str, float]]:
        """Each trajectory's score (its agent loop's step rewards added) and the batch's reward metrics."""
        scores, metrics, _ = self.score_items(trajectories, tokenizer)
        return scores, metrics

    def score_items(
        self, trajectories: list[Trajectory], tokenizer
    ) -> tuple[list[float], dict[str, float], list[dict[str, float]]]:
        """As :meth:`score`, and each item's own reward metrics (an ``acc`` for dynamic sampling)."""
        groups: dict[int, int] = {}
        items = [
            RewardInput(
                response=tokenizer.decode(t.response_ids, skip_special_tokens=True),
                prompt=tokenizer.decode(t.prompt.token_ids, skip_special_tokens=False),
                ground_truth=t.prompt.ground_truth,
                data_source=t.prompt.data_source,
                extra_info=t.prompt.extra_info,
                group=groups.setdefault(id(t.prompt), len(groups)),
                messages=list(t.prompt.messages or []),
            )
            for t in trajectories
        ]
        with progress.phase("scoring", len(items), "responses"):
            if self.batched:
                _call(self.reward_fn, "wake_up")
                try:
                    result = score_batched(self.reward_fn, items, self.batch_timeout_s)
                finally:
                    _call(self.reward_fn, "sleep")
            else:
                result = self.runner.score(items)
            progress.advance(len(items))
        scores = [s + t.step_reward for s, t in zip(result.scores, trajectories)]
        return scores, dict(result.metrics), list(result.item_metrics) or [{} for _ in scores]

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()
        else:
            _call(self.reward_fn, "close")  # a batched reward's clients, threads, models


def _call(obj: Any, method: str) -> None:
    fn = getattr(obj, method, None)
    if callable(fn):
        fn()
