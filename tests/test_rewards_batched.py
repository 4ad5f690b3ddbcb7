"""Batched rewards (``BatchRewardFunction``): a whole batch per call, in the trainer's process,
with group-wise access and failures counted, never raised."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from rlcore.interfaces import RewardInput, RewardResult
from rlcore.reward_pool import score_batched

FIXTURES = Path(__file__).parent / "fixtures"


class Batched:
    batched = True

    def __init__(self, fn):
        self.fn = fn

    def score_batch(self, items):
        return self.fn(items)


ITEMS = [RewardInput(response=r, group=g) for r, g in (("a", 0), ("bbb", 0), ("cc", 1))]


def test_results_in_order_with_metrics():
    batch = score_batched(
        Batched(lambda items: [RewardResult(len(i.response), {"len": len(i.response)}) for i in items]),
        ITEMS,
        5,
    )
    assert batch.scores == [1.0, 3.0, 2.0] and batch.statuses == ["ok"] * 3
    assert batch.metrics["reward/len"] == 2.0 and batch.metrics["reward/errors"] == 0


@pytest.mark.parametrize(
    ("fn", "status", "metric"),
    [
        (lambda items: 1 / 0, "error", "reward/errors"),
        (lambda items: [1.0], "error", "reward/errors"),  # one result for three items
        (lambda items: time.sleep(3) or [1.0] * 3, "timeout", "reward/timeouts"),
    ],
    ids=["raises", "wrong-length", "late"],
)
def test_a_failing_batch_scores_zero_and_is_counted(fn, status, metric):
    started = time.monotonic()
    batch = score_batched(Batched(fn), ITEMS, timeout_s=0.5)
    assert batch.scores == [0.0] * 3 and batch.statuses == [status] * 3 and batch.metrics[metric] == 3
    assert time.monotonic() - started < 2.5


def test_an_invalid_item_scores_zero_alone():
    batch = score_batched(Batched(lambda items: [1.0, float("nan"), "x"]), ITEMS, 5)
    assert batch.scores == [1.0, 0.0, 0.0] and batch.statuses == ["ok", "invalid", "invalid"]
    assert batch.metrics["reward/invalid"] == 2


@pytest.mark.slow
def test_a_group_wise_batched_reward_trains_end_to_end(tmp_path, tiny_model):
    from rlcore.cli import main
    from rlcore.testing.runs import read_metrics, write_run_manifest

    shutil.copy(FIXTURES / "ranking_rewards.py", tmp_path / "ranking_rewards.py")
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        rollout={"samples_per_prompt": 3, "temperature": 1.0},
        reward={"function": "python:ranking_rewards.py:shortest_first", "method": None},
        data={"max_response_tokens": 8},
        trainer={"steps": 2},
    )
    assert main(["validate", str(manifest)]) == 0
    assert main(["run", str(manifest), "--run-dir", str(tmp_path / "run")]) == 0
    train = [r for r in read_metrics(tmp_path / "run") if "actor/pg_loss" in r]
    # 4 prompts a step, seen as 4 groups; every score is a rank in [0, 1].
    assert all(r["reward/group_size"] == 4 and 0 <= r["critic/score/mean"] <= 1 for r in train)
    assert all(r["reward/errors"] == 0 for r in train)


def test_the_conformance_kit_checks_batched_rewards(tmp_path):
    from rlcore.registry import Registry
    from rlcore.testing.rewards import check_reward_function

    shutil.copy(FIXTURES / "ranking_rewards.py", tmp_path / "ranking_rewards.py")
    component = Registry.discover().get("reward_function", "python")
    options = component.options.model_validate(
        {"target": str(tmp_path / "ranking_rewards.py") + ":shortest_first"}
    )
    built = check_reward_function(
        component,
        options=options,
        cases=[(RewardInput(response="abc"), 1.0), (RewardInput(response="a much longer one"), 1.0)],
    )
    assert built.batched and built.calls > 3  # one by one, then together

    class Wrong:
        batched = True

        def score_batch(self, items):
            return [1.0]  # one result, whatever the batch

    from rlcore.components import Component

    wrong = Component(name="wrong", factory=lambda options, context: Wrong(), kind="reward_function")
    with pytest.raises(AssertionError, match="score_batch returned 1 results for 2 items"):
        check_reward_function(
            wrong, cases=[(RewardInput(response="a"), 1.0), (RewardInput(response="b"), 1.0)]
        )
