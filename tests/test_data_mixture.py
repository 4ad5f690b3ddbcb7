"""``[data] source_weights``: each step's prompts drawn from the data sources in fixed
proportions, each source through its own epochs, resumable."""

from __future__ import annotations

import pytest

from rlcore.errors import RlcoreError
from rlcore.trainer.data_cursor import DataCursor, MixedCursor, shares

A, B = list(range(10)), list(range(10, 14))


def test_shares_by_hand():
    assert shares(10, {"a": 3, "b": 1}) == {"a": 8, "b": 2}  # 7.5 and 2.5: the tie goes by name
    assert shares(4, {"a": 1, "b": 1, "c": 1}) == {"a": 2, "b": 1, "c": 1}
    assert shares(5, {"a": 1}) == {"a": 5}


def test_each_step_mixes_the_sources_in_proportion_and_interleaved():
    cursor = MixedCursor({"a": A, "b": B}, {"a": 3, "b": 1}, seed=1, shuffle=False)
    first = cursor.take(8)
    assert sorted(first) == [0, 1, 2, 3, 4, 5, 10, 11]
    assert first[:2] == [0, 10]  # interleaved, so every rank's share mixes the sources too
    cursor.take(8)
    # b (4 rows, 2 a step) finished its first pass after 2 steps; a (10 rows, 6 a step) did not.
    assert cursor.cursors["b"].epoch == 1 and cursor.cursors["a"].epoch == 1 and cursor.epoch == 1


def test_a_zero_weight_leaves_a_source_out():
    cursor = MixedCursor({"a": A, "b": B}, {"a": 1, "b": 0}, seed=1)
    assert all(i < 10 for _ in range(5) for i in cursor.take(4))


def test_state_copy_and_a_checkpoint_of_other_weights():
    cursor = MixedCursor({"a": A, "b": B}, {"a": 1, "b": 1}, seed=3)
    cursor.take(6)
    twin = cursor.copy()
    assert twin.take(6) == cursor.take(6)  # the copy goes on as the original, independently
    other = MixedCursor({"a": A, "c": B}, {"a": 1, "c": 1}, seed=3)
    with pytest.raises(RlcoreError, match="resume with the weights it was trained with"):
        other.load(cursor.state())
    with pytest.raises(RlcoreError, match="trained with \\[data\\] source_weights"):
        DataCursor(14, seed=3).load(cursor.state())


@pytest.mark.slow
def test_a_weighted_mixture_trains_and_resumes(tmp_path, tiny_model):
    import json

    from rlcore.cli import main
    from rlcore.testing.runs import read_metrics, write_run_manifest

    rows = [
        {
            "data_source": source,
            "prompt": [{"role": "user", "content": f"{i}+{i}?"}],
            "reward_model": {"ground_truth": str(2 * i)},
        }
        for source in ("openai/gsm8k", "lighteval/MATH")
        for i in range(3)
    ]
    (tmp_path / "mix.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        data={
            "train": str(tmp_path / "mix.jsonl"),
            "val": None,
            "prompts_per_step": 4,
            "source_weights": {"openai/gsm8k": 3, "lighteval/MATH": 1},
        },
        reward={"function": "gsm8k", "method": "numeric"},
    )
    run = tmp_path / "run"
    assert main(["run", str(manifest), "--run-dir", str(run), "--set", "trainer.save_every=1"]) == 0
    assert main(["run", str(manifest), "--run-dir", str(run), "--resume", "--set", "trainer.steps=3"]) == 0
    train = [r for r in read_metrics(run) if "actor/pg_loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(
        "critic/score/openai/gsm8k/mean" in r and "critic/score/lighteval/MATH/mean" in r for r in train
    )
    bad = write_run_manifest(
        tmp_path,
        tiny_model,
        data={
            "train": str(tmp_path / "mix.jsonl"),
            "val": None,
            "source_weights": {"openai/gsm8k": 1, "nosuch": 1},
        },
    )
    assert main(["run", str(bad), "--run-dir", str(tmp_path / "bad")]) == 2
