"""DAPO's pieces (the rlcore-algo-dapo plugin) through the core's score-shaper and batch-filter
seams: the batch refill of dynamic sampling, the retired [algorithm] keys,
and an end-to-end run of examples/dapo.toml on a tiny model."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from rlcore.interfaces import Prompt, SamplingParams, Trajectory
from rlcore.trainer.data_cursor import DataCursor
from rlcore.trainer.filling import BatchMaker, Filling

dapo = pytest.importorskip("rlcore_algo_dapo")

from rlcore_algo_dapo.filters import DynamicSampling  # noqa: E402
from rlcore_algo_dapo.shapers import Overlong  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# The pure functions (overlong_penalty, informative_groups) are checked by hand in the plugin's own tests.


class Rounds:
    """A fake engine + reward: prompt i's samples score as ``plan[i]`` says (uniform or not)."""

    def __init__(self, informative: set[int]):
        self.informative, self.calls = informative, []

    def inputs(self, step, cursor):
        indices = cursor.take(2)
        prompts = [Prompt(token_ids=[i], messages=[], ground_truth=str(i), index=i) for i in indices]
        return prompts, SamplingParams(n=2, max_new_tokens=4, seed=7)

    def generate(self, prompts, params):
        self.calls.append((params.seed, [p.index for p in prompts]))
        return [
            Trajectory(
                prompt=p,
                response_ids=[1] * (3 + k),
                response_mask=[1] * (3 + k),
                rollout_logprobs=[0.0] * (3 + k),
            )
            for p in prompts
            for k in range(params.n)
        ]

    def score(self, trajectories, tokenizer):  # the scorer's plain form
        return self.score_items(trajectories, tokenizer)[:2]

    def score_items(self, trajectories, tokenizer):
        scores = [
            float(k % 2) if t.prompt.index in self.informative else 1.0 for k, t in enumerate(trajectories)
        ]
        return scores, {"reward/correct": sum(scores) / len(scores)}, [{} for _ in scores]


def _maker(fake, **filling):
    return BatchMaker(fake, None, fake.inputs, Filling(**filling))


def _rounds(n: int) -> list:
    return [DynamicSampling(max_rounds=n)]


def test_dynamic_sampling_refills_the_batch_with_informative_groups():
    fake = Rounds(informative={1, 2, 3})
    cursor = DataCursor(size=100, seed=0, shuffle=False)
    batch = _maker(fake, filters=_rounds(5)).make(fake.generate, 0, cursor, 0)
    # Round 1: prompts 0, 1 (0 is uniform, dropped); round 2: 2, 3 -> 3 groups, 2 wanted.
    assert [p.index for p in batch.prompts] == [1, 2]
    assert len(batch.trajectories) == 4 and batch.scores == [0.0, 1.0, 0.0, 1.0]
    assert (
        batch.metrics["dynamic_sampling/rounds"] == 2
        and batch.metrics["dynamic_sampling/groups_dropped"] == 1
    )
    assert (
        batch.metrics["dynamic_sampling/groups_kept"] == 2
        and batch.metrics["dynamic_sampling/groups_padded"] == 0
    )
    assert len({seed for seed, _ in fake.calls}) == 2  # each round samples with its own seed
    assert batch.cursor == {"epoch": 0, "offset": 4}  # both rounds' prompts were used up


def test_dynamic_sampling_stops_at_its_cap_and_trains_on_what_it_has():
    fake = Rounds(informative={5})
    cursor = DataCursor(size=100, seed=0, shuffle=False)
    batch = _maker(fake, filters=_rounds(3)).make(fake.generate, 0, cursor, 0)
    # Three rounds (prompts 0-5), one informative group; the batch keeps its size with a uniform one.
    assert len(fake.calls) == 3 and [p.index for p in batch.prompts] == [5, 0]
    assert (
        batch.metrics["dynamic_sampling/rounds"] == 3
        and batch.metrics["dynamic_sampling/groups_dropped"] == 5
    )
    assert (
        batch.metrics["dynamic_sampling/groups_kept"] == 1
        and batch.metrics["dynamic_sampling/groups_padded"] == 1
    )


def test_overlong_punishment_is_added_to_the_scores():
    fake = Rounds(informative=set())
    batch = _maker(fake, shapers=[Overlong(buffer=2, penalty=1.0, max_response_tokens=4)]).make(
        fake.generate, 0, DataCursor(10, 0, False), 0
    )
    # Responses of 3 and 4 tokens, max 4, buffer 2: penalties -0.5 and -1 on a score of 1.
    assert batch.scores == [0.5, 0.0, 0.5, 0.0]
    assert batch.metrics["reward/overlong_penalty/mean"] == -0.75


@pytest.mark.slow
def test_the_dapo_example_runs_end_to_end_on_a_tiny_model(tmp_path, tiny_model):
    from rlcore.cli import main
    from rlcore.testing.runs import read_metrics, write_run_manifest

    doc = tomllib.loads((ROOT / "examples" / "dapo.toml").read_text())
    assert doc["data"]["gen_batch_size"] == 3 * doc["data"]["prompts_per_step"]  # as verl's DAPO scripts
    assert (doc["reward"]["function"], doc["algorithm"]["clip_ratio_c"], doc["trainer"]["weight_decay"]) == (
        "math_dapo",
        10.0,
        0.1,
    )
    # A random tiny model solves nothing: three rounds, then padding rather than verl's stop.
    sampling = doc["filters"]["dynamic_sampling"] | {"max_generation_rounds": 3, "on_exhausted": "pad"}
    assert doc["filters"]["dynamic_sampling"]["metric"] == "acc"
    # The tiny model solves nothing: a reward its samples differ in (a third score 1), so that
    # dynamic sampling on correctness finds groups.
    (tmp_path / "rewards.py").write_text(
        "def score(item):\n    return float(sum(map(ord, item.response)) % 3 == 0)\n"
    )
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        algorithm=doc["algorithm"],
        rollout={"samples_per_prompt": 4, "temperature": 1.0},
        filters={"dynamic_sampling": sampling, "mask_truncated": {}},
        shapers={"overlong": {"buffer": 4}},
        data={"max_response_tokens": 8, "prompts_per_step": 4, "gen_batch_size": 8},
        trainer={"steps": 2, "lr": 1e-3},
        reward={"function": f"python:{tmp_path / 'rewards.py'}:score", "method": None},
    )
    assert main(["run", str(manifest), "--run-dir", str(tmp_path / "run")]) == 0
    rows = [r for r in read_metrics(tmp_path / "run") if "actor/pg_loss" in r]
    assert len(rows) == 2
    for key in (
        "dynamic_sampling/groups_kept",
        "dynamic_sampling/groups_dropped",
        "dynamic_sampling/rounds",
        "reward/overlong_penalty/mean",
    ):
        assert key in rows[0], key
    assert all(1 <= r["dynamic_sampling/rounds"] <= 3 for r in rows)
    assert all(r["dynamic_sampling/groups_kept"] + r["dynamic_sampling/groups_padded"] == 4 for r in rows)
    assert sum(r["dynamic_sampling/groups_kept"] for r in rows) > 0
    assert all(r["reward/overlong_penalty/mean"] <= 0 for r in rows)
    # Responses cut at max_response_tokens are out of the loss: as many as were cut.
    assert all(r["response_length/masked_truncated"] == r["response_length/clip_ratio"] for r in rows)


def _dapo_text() -> str:
    """examples/dapo.toml on synthetic data (its GSM8K files need preparing)."""
    text = (ROOT / "examples" / "dapo.toml").read_text()
    return text.replace('"../data/gsm8k_dapo/train.parquet"', '"synthetic:addition"').replace(
        '"../data/gsm8k_dapo/test.parquet"', '"synthetic:addition?split=test"'
    )


@pytest.mark.parametrize(
    "key, table",
    [
        ("dynamic_sampling", "[filters.dynamic_sampling]"),
        ("max_generation_rounds", "[filters.dynamic_sampling]"),
        ("overlong_buffer", "[shapers.overlong]"),
        ("overlong_penalty", "[shapers.overlong]"),
        ("mask_truncated", "[filters.mask_truncated]"),
    ],
)
def test_the_old_algorithm_keys_name_their_new_table(tmp_path, key, table):
    from rlcore.errors import ManifestError
    from rlcore.manifest.loader import load_manifest

    text = _dapo_text().replace("mini_batches = 4", f"mini_batches = 4\n{key} = 1")
    path = tmp_path / "dapo.toml"
    path.write_text(text)
    with pytest.raises(ManifestError) as info:
        load_manifest(path, environ={})
    problem = next(p for p in info.value.problems if p.key == f"algorithm.{key}")
    assert table in problem.message and "rlcore-algo-dapo" in problem.message
    assert problem.line == text.splitlines().index(f"{key} = 1") + 1


def test_dynamic_sampling_needs_groups(tmp_path):
    from rlcore.errors import ManifestError
    from rlcore.manifest.checks import check_resolved
    from rlcore.manifest.loader import load_manifest

    path = tmp_path / "dapo.toml"
    path.write_text(_dapo_text().replace("samples_per_prompt = 8", "samples_per_prompt = 1"))
    with pytest.raises(
        ManifestError, match=r"batch filter 'dynamic_sampling' compares samples of one prompt"
    ):
        check_resolved(load_manifest(path, environ={}))
