"""A training run with ``[trainer] loggers = ["jsonl", "tensorboard"]``: TensorBoard holds each
step's metrics as metrics.jsonl does, and the validation samples as a text table."""

from __future__ import annotations

import math

import pytest

from rlcore.testing import require_plugins
from rlcore.testing.runs import read_metrics, run_in_process, write_run_manifest

pytest.importorskip("tensorboard")
# The tiny run's engine, advantage estimator and reward.
require_plugins("rlcore_rollout_hf", "rlcore_algo_grpo", "rlcore_reward_rule")


@pytest.mark.slow
def test_a_run_logs_steps_and_validation_samples_to_tensorboard(tmp_path, tiny_model):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        trainer={
            "steps": 2,
            "save_every": 1,
            "eval_every": 1,
            "log_val_generations": 3,
            "loggers": ["jsonl", "tensorboard"],
        },
    )
    run = tmp_path / "run"
    assert run_in_process("run", manifest, "--run-dir", run) == 0
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    rows = [r for r in read_metrics(run) if "critic/score/mean" in r]
    scores = [(e.step, e.value) for e in events.Scalars("critic/score/mean")]
    assert [s for s, _ in scores] == [r["step"] for r in rows] == [1, 2]
    assert all(
        math.isclose(v, r["critic/score/mean"], rel_tol=1e-6, abs_tol=1e-7) for (_, v), r in zip(scores, rows)
    )
    assert [e.step for e in events.Tensors("val/generations/text_summary")] == [1, 2]
    table = events.Tensors("val/generations/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| data_source | prompt | response | score |" in table and "synthetic/addition" in table
