"""The GPU benchmarks still run end to end, at a tiny shape on CPU (their figures come from the
GPU machine; this only keeps the scripts from rotting between GPU sessions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def run_rollout_benchmark(*args: str) -> subprocess.CompletedProcess:
    """benchmarks/rollout_gpu.py at the tiny shape on CPU: 8 prompts, 8 new tokens, no vLLM."""
    tiny = ["--shape", "tiny", "--device", "cpu", "--prompts", "8", "--max-new", "8", "--no-vllm"]
    return subprocess.run(
        [sys.executable, "benchmarks/rollout_gpu.py", *tiny, *args],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_rollout_benchmark_runs_every_workload(tmp_path):
    out = tmp_path / "rollout.json"
    run_rollout_benchmark("--variants", "eager,plain", "--json", str(out))
    results = json.loads(out.read_text())
    for engine in ("rlcore-eager", "rlcore-plain"):
        assert set(results[engine]) == {"fixed", "fixed-n4", "varied"}
        assert results[engine]["fixed"]["tokens"] == 8 * 8
    assert results["transformers"]["fixed"]["tokens_per_s"] > 0


def test_rollout_benchmark_with_lora_adapters_times_the_three_lora_variants(tmp_path):
    out = tmp_path / "rollout.json"
    variants = "compiled,lora-modules,lora-off"
    done = run_rollout_benchmark(
        "--no-transformers",
        "--lora",
        "4",
        "--variants",
        variants,
        "--workloads",
        "fixed-n4",
        "--json",
        str(out),
    )
    results = json.loads(out.read_text())
    for engine in ("rlcore-compiled", "rlcore-lora-modules", "rlcore-lora-off"):
        assert set(results[engine]) == {"fixed-n4"} and results[engine]["fixed-n4"]["tokens"] == 2 * 4 * 8
    assert "fixed-n4   peft's modules called:" in done.stdout


def test_grpo_step_benchmark_runs_rlcore_steps(tmp_path):
    out = tmp_path / "grpo.json"
    subprocess.run(
        [
            sys.executable,
            "benchmarks/grpo_step.py",
            "--shape",
            "tiny",
            "--device",
            "cpu",
            "--skip-trl",
            "--steps",
            "1",
            "--model-option",
            "share_prompts=true",
            "--also-unshared",
            "--algorithm-option",
            'rollout_correction="token_truncate"',
            "--json",
            str(out),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    results = json.loads(out.read_text())
    for key in ("rlcore", "rlcore_unshared"):
        step = results[key]
        assert (
            step["shape"] == "tiny"
            and step["step_s"] > 0
            and step["gen_s"] > 0
            and step["update_actor_s"] > 0
        )
        assert step["response_length"] > 0 and step["training"]
    # 4 prompts x 2 samples of 16 + 16 tokens: the prompt once per pair when shared
    assert results["rlcore"]["training"]["packed_tokens"] == 4 * (16 + 2 * 16)
    assert (
        results["rlcore_unshared"]["training"]["packed_tokens"]
        == results["rlcore"]["training"]["tokens"]
        == 8 * 32
    )


def test_offload_capacity_benchmark_quick(tmp_path):
    """Tiny shapes on the CPU, each attempt a child process, with and without fsdp_offload."""
    out = tmp_path / "capacity.json"
    subprocess.run(
        [sys.executable, "benchmarks/offload_capacity.py", "--quick", "--json", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    results = json.loads(out.read_text())
    assert {(r["offload"], r["layers"]) for r in results} == {(False, 1), (False, 2), (True, 1), (True, 2)}
    assert all(r["fits"] and r["step_s"] > 0 for r in results), results


def test_async_benchmark_runs_one_step_off_with_a_split_engine(tmp_path):
    """The engine in its own process, one step behind: the trainer's steps and the engine's share."""
    out = tmp_path / "async.json"
    subprocess.run(
        [
            sys.executable,
            "benchmarks/async_gpu.py",
            "--shape",
            "tiny",
            "--device",
            "cpu",
            "--steps",
            "1",
            "--warmup",
            "1",
            "--modes",
            "split:1",
            "--micro-batch-tokens",
            "4096",
            "--out",
            str(tmp_path / "work"),
            "--json",
            str(out),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    run = json.loads(out.read_text())["split:1"]
    assert run["step_s"] > 0 and run["response_length"] == 16
    assert [s["rollout/staleness/max"] for s in run["steps"]] == [0.0, 1.0]
    assert 0 < run["steps"][-1]["async/engine_busy_fraction"] <= 1


def test_profile_of_a_generate_call_splits_it_into_phases_that_add_up():
    """benchmarks/profile_gpu.py call wraps the fast path's private phases (_Run._admit, _look,
    FastGenerator._runner): a rename there must fail here, not in a GPU session."""
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/profile_gpu.py",
            "call",
            "--shape",
            "tiny",
            "--prompts",
            "8",
            "--max-new",
            "8",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    for workload in ("fixed", "varied"):
        section = done.stdout.split(f"=== tiny {workload}:")[1].split("===")[0]
        wall = float(section.split(" ms wall")[0])
        phases = float(section.split("(the phases together)")[1].split("ms")[0])
        assert abs(phases - wall) < 0.1 * wall, section
        assert "prefill + first token" in section and "host: look" in section
    fixed = done.stdout.split("=== tiny fixed:")[1].split("===")[0]
    assert "7 steps" in fixed, fixed  # 8 new tokens: the first comes with the prefill


def test_vllm_is_timed_with_its_prefix_cache_emptied_as_in_an_rl_step(monkeypatch, tmp_path):
    """rollout_gpu.py's warm-up call leaves the same prompts in vLLM's prefix cache; an RL step's
    prompts are new (and the cache is emptied after each weight update), so the timed call must
    start with the cache emptied. A fake ``vllm`` records the order of calls."""
    import types

    import torch
    import transformers

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import rollout_gpu

    events: list[str] = []

    class FakeLLM:
        def __init__(self, **kwargs):
            events.append("start")

        def generate(self, requests, params, use_tqdm=True):
            events.append("generate")
            return [
                types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=[7] * p.max_tokens)] * p.n)
                for p in params
            ]

        def reset_prefix_cache(self):
            events.append("reset")

    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = FakeLLM, types.SimpleNamespace
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = types.SimpleNamespace
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    works = rollout_gpu.workloads(8, 8, 512)
    config = transformers.Qwen2Config(
        vocab_size=512, hidden_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    out = rollout_gpu.run_vllm(config, works)
    # Per workload: warm-up, emptied, the timed call, then the call with the prompts left cached.
    assert events == ["start"] + ["generate", "reset", "generate", "generate"] * len(works)
    for name, work in works.items():
        assert out[name]["tokens"] == rollout_gpu.generated(work)
        assert out[name]["tokens_per_s"] > 0 and out[name]["prompts_cached_tokens_per_s"] > 0
