"""Validation samples in generations.jsonl (``[trainer] log_val_generations``) and the metrics verl users
look for: ``actor/entropy_loss``, ``perf/throughput`` per GPU, ``perf/mfu/actor``."""

from __future__ import annotations

import json

import pytest

from rlcore.cli import main
from rlcore.testing.runs import read_metrics, train_rows, write_run_manifest
from rlcore.trainer.flops import mfu, peak_tflops


def test_peak_and_mfu_by_hand():
    assert peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("NVIDIA L40S") == 362.0 and peak_tflops("NVIDIA L40") == 181.0  # the longer name first
    assert peak_tflops("cpu") is None
    # 6 x 1e9 parameters x 1e4 tokens in 1 s = 6e13 FLOP/s of a 600 TFLOP/s peak: 10%.
    assert mfu(10**9, 10**4, 1.0, 600.0) == pytest.approx(0.1)
    assert mfu(10**9, 10**4, 1.0, None) is None


@pytest.mark.slow
def test_validation_samples_go_to_generations_jsonl(tmp_path, tiny_model):
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        trainer={
            "steps": 2,
            "save_every": 1,
            "eval_every": 1,
            "log_val_generations": 3,
            "loggers": ["jsonl"],
        },
    )
    run = tmp_path / "run"
    assert main(["run", str(manifest), "--run-dir", str(run)]) == 0
    samples = [json.loads(line) for line in (run / "generations.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1, 1, 1, 2, 2, 2]
    assert all(set(s) == {"step", "data_source", "prompt", "response", "score"} for s in samples)
    assert "What is" in samples[0]["prompt"] and samples[0]["data_source"] == "synthetic/addition"
    # The metrics verl users look for.
    row = train_rows(run)[0]
    assert row["actor/entropy_loss"] == row["actor/entropy"] and row["perf/throughput"] > 0
    assert "perf/mfu/actor" not in row  # a CPU has no known peak: not made up
    # A resumed run does not log a step's samples twice.
    assert main(["run", str(manifest), "--run-dir", str(run), "--resume", "--set", "trainer.steps=3"]) == 0
    steps = [json.loads(line)["step"] for line in (run / "generations.jsonl").read_text().splitlines()]
    assert steps == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert [r["step"] for r in read_metrics(run) if "val/reward/mean" in r] == [1, 2, 3]


@pytest.mark.slow
def test_profile_steps_write_a_trace_with_the_phases_labelled(tmp_path, tiny_model):
    manifest = write_run_manifest(tmp_path, tiny_model, trainer={"steps": 2, "profile_steps": [2]})
    assert main(["run", str(manifest), "--run-dir", str(tmp_path / "run")]) == 0
    traces = sorted((tmp_path / "run" / "profile").iterdir())
    assert [t.name for t in traces] == ["step_000002.pt.trace.json"]
    names = {event.get("name") for event in json.loads(traces[0].read_text())["traceEvents"]}
    assert {"gen", "reward", "update_actor", "adv"} <= names


def test_out_of_memory_names_the_phase_and_the_knob():
    import torch

    from rlcore.trainer.phases import OutOfMemory, Timer

    timer = Timer()
    with pytest.raises(
        OutOfMemory, match=r"out of GPU memory in the 'update_actor' phase .*micro_batch_tokens"
    ):
        with timer("step"), timer("update_actor"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with pytest.raises(OutOfMemory, match=r"'gen' phase .*the engine's batch or memory options"):
        with timer.phase("gen"):
            raise torch.OutOfMemoryError("CUDA out of memory")
    # The run's engine names its own options (its options model's memory_options); the core names none.
    from rlcore.components import Options
    from rlcore.trainer.phases import generation_knobs

    class EngineOptions(Options):
        memory_options = ("kv_cache_gb",)

    knowing = Timer(knobs={"gen": generation_knobs("toy", EngineOptions)})
    with pytest.raises(
        OutOfMemory,
        match=r"lower \[rollout\] kv_cache_gb \(the toy engine's\) or \[data\] max_response_tokens",
    ):
        with knowing.phase("gen"):
            raise torch.OutOfMemoryError("CUDA out of memory")
    assert "timing_s/update_actor" in timer.times  # timed even when it failed
