"""``[rollout] score_chunks``: a step's prompts generated in chunks, each scored while the next
generates, the scores still those of their own trajectories."""

from __future__ import annotations

import threading
import time

import pytest

from rlcore.cli import main
from rlcore.interfaces import Prompt, SamplingParams, Trajectory
from rlcore.testing import require_plugins
from rlcore.testing.runs import TINY_RUN_PLUGINS, read_metrics, write_run_manifest
from rlcore.trainer.data_cursor import DataCursor
from rlcore.trainer.filling import BatchMaker, Filling, merge_chunk_metrics

GEN_S = SCORE_S = 0.3


class Clock:
    """What happened when: (event, chunk, time), from both threads."""

    def __init__(self):
        self.events, self.lock = [], threading.Lock()

    def __call__(self, event: str, chunk: int) -> None:
        with self.lock:
            self.events.append((event, chunk, time.perf_counter()))

    def at(self, event: str, chunk: int) -> float:
        return next(t for e, c, t in self.events if (e, c) == (event, chunk))


class SlowScorer:
    """Scores each trajectory with its prompt's ground truth, slowly; counts one error per chunk."""

    def __init__(self, clock: Clock):
        self.clock, self.calls = clock, 0

    def score(self, trajectories, tokenizer):  # the scorer's plain form
        return self.score_items(trajectories, tokenizer)[:2]

    def score_items(self, trajectories, tokenizer):
        chunk, self.calls = self.calls, self.calls + 1
        self.clock("score_start", chunk)
        time.sleep(SCORE_S)
        self.clock("score_end", chunk)
        return (
            [float(t.prompt.ground_truth) for t in trajectories],
            {"reward/errors": 1.0, "reward/time_s": SCORE_S, "reward/correct": float(chunk)},
            [{} for _ in trajectories],
        )


def _maker(chunks: int, clock: Clock, prompts: int = 6):
    rows = [Prompt(token_ids=[i], messages=[], ground_truth=i) for i in range(prompts)]

    def inputs(step, cursor):
        return [rows[i] for i in cursor.take(prompts)], SamplingParams(n=2, seed=5, max_new_tokens=1)

    seeds, calls = [], [0]

    def generate(batch, params):
        chunk = calls[0]
        calls[0] += 1
        clock("gen_start", chunk)
        seeds.append(params.seed)
        time.sleep(GEN_S)
        clock("gen_end", chunk)
        return [
            Trajectory(prompt=p, response_ids=[1], response_mask=[1], rollout_logprobs=[0.0])
            for p in batch
            for _ in range(params.n)
        ]

    maker = BatchMaker(SlowScorer(clock), tokenizer=None, inputs=inputs, filling=Filling(score_chunks=chunks))
    return maker, generate, seeds


@pytest.mark.parametrize("chunks", [1, 3])
def test_each_chunk_is_scored_while_the_next_generates(chunks):
    clock = Clock()
    maker, generate, seeds = _maker(chunks, clock)
    batch = maker.make(generate, 0, DataCursor(size=6, seed=0, shuffle=False), version=0)
    # Every trajectory keeps its own prompt's score, in prompt order, whatever the chunking.
    assert [t.prompt.ground_truth for t in batch.trajectories] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert batch.scores == [float(t.prompt.ground_truth) for t in batch.trajectories]
    assert len(seeds) == chunks and len(set(seeds)) == chunks  # each chunk its own draws
    assert batch.metrics["reward/errors"] == chunks  # counts add up across chunks
    if chunks == 1:
        assert clock.at("score_start", 0) >= clock.at("gen_end", 0)
        return
    assert batch.metrics["reward/correct"] == pytest.approx(1.0)  # chunk means, weighted by size
    for chunk in range(chunks - 1):  # scoring chunk k overlaps generating chunk k + 1
        assert clock.at("score_start", chunk) < clock.at("gen_end", chunk + 1)
    # Only the last chunk's scoring is waited for after generation, not all of them.
    assert batch.metrics["timing_s/reward"] < 2 * SCORE_S


def test_merged_metrics_add_counts_and_weigh_means():
    merged = merge_chunk_metrics(
        [
            ({"reward/timeouts": 1.0, "reward/acc": 1.0, "reward/time_s": 2.0}, 3),
            ({"reward/timeouts": 2.0, "reward/acc": 0.0, "reward/time_s": 1.0}, 1),
        ]
    )
    assert merged == {"reward/timeouts": 3.0, "reward/acc": 0.75, "reward/time_s": 3.0}


@pytest.mark.slow
def test_a_run_with_score_chunks_trains_and_logs_the_whole_batch(tmp_path, tiny_model):
    require_plugins(*TINY_RUN_PLUGINS)
    manifest = write_run_manifest(tmp_path, tiny_model, rollout={"score_chunks": 2})
    assert main(["run", str(manifest), "--run-dir", str(tmp_path / "run")]) == 0
    rows = [r for r in read_metrics(tmp_path / "run") if "actor/pg_loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    # 4 prompts x 2 samples a step, scored in two chunks, logged as one batch.
    assert all(
        r["response_length/mean"] > 0 and r["reward/errors"] == 0 and "reward/answer_found" in r for r in rows
    )
    assert all(r["timing_s/gen"] > 0 and r["timing_s/reward"] >= 0 for r in rows)
