"""Two ranks (torchrun-style, gloo on CPU, FSDP2) train like one process on the same global batch."""

from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlcore.testing.runs import train_rows, write_run_manifest

ROOT = Path(__file__).resolve().parents[1]  # the repository


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(manifest, run_dir, world: int, *extra: str) -> None:
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "rlcore", "run", str(manifest), "--run-dir", str(run_dir), *extra],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:]


@pytest.mark.slow
def test_two_ranks_match_one_rank(tmp_path, tiny_model):
    shutil.copy(ROOT / "tests" / "fixtures" / "dense_rewards.py", tmp_path / "dense_rewards.py")
    # Greedy rollouts make every sample independent of how prompts are split between ranks; the
    # batch-whitened estimator and a dense reward give non-zero advantages.
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        rollout={"samples_per_prompt": 1, "temperature": 0.0},
        reward={"function": "python:dense_rewards.py:sum_and_upper", "method": None},
        algorithm={"advantage": "reinforce_pp"},
        data={
            "prompts_per_step": 4,
            "max_response_tokens": 6,
            "val": "synthetic:addition?size=4&seed=0&split=test",
        },
        trainer={"steps": 3, "lr": 1e-2, "save_every": 2},
    )
    single, double = tmp_path / "one", tmp_path / "two"
    _run_ranks(manifest, single, 1)
    _run_ranks(manifest, double, 2)
    one, two = train_rows(single), train_rows(double)
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2, 3]
    # Stated tolerance: the same samples, so the same scores; losses, entropies and gradient norms
    # agree to 1e-3 relative. The first step agrees to ~1e-7 (float sums in another order: FSDP's
    # reduce-scatter, per-rank partial sums); Adam's early, nearly sign-like updates then amplify
    # those differences to ~1e-4 by the third step.
    for a, b in zip(one, two):
        assert a["critic/score/mean"] == pytest.approx(b["critic/score/mean"], abs=1e-9)
        assert a["response_length/mean"] == b["response_length/mean"]
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
            assert math.isclose(a[key], b[key], rel_tol=1e-3, abs_tol=1e-6), (key, a[key], b[key])
    assert any(r["actor/grad_norm"] > 0 for r in one)
    assert (double / "checkpoints" / "step_000002" / "optimizers-rank1.pt").exists()
    # A two-rank run resumes from its own checkpoint: one more step, on both ranks.
    text = manifest.read_text().replace("steps = 3", "steps = 4")
    manifest.write_text(text)
    _run_ranks(manifest, double, 2, "--resume")
    assert [r["step"] for r in train_rows(double)] == [1, 2, 3, 4]
    # A 2-rank run resumes from its checkpoint.


@pytest.mark.slow
def test_two_ranks_mixed_precision_match_one_rank(tmp_path, tiny_model):
    """bfloat16 compute over float32 weights: one process keeps float32 masters beside a bfloat16
    module, two ranks use FSDP2's MixedPrecisionPolicy over float32 shards. They compute the same
    thing, so the runs agree as bfloat16 rounding allows, and both checkpoints hold float32."""
    shutil.copy(ROOT / "tests" / "fixtures" / "dense_rewards.py", tmp_path / "dense_rewards.py")
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        model={"compute_dtype": "bfloat16"},
        rollout={"samples_per_prompt": 1, "temperature": 0.0},
        reward={"function": "python:dense_rewards.py:sum_and_upper", "method": None},
        algorithm={"advantage": "reinforce_pp"},
        data={"prompts_per_step": 4, "max_response_tokens": 6, "val": None},
        trainer={"steps": 2, "lr": 1e-3},
    )
    single, double = tmp_path / "one", tmp_path / "two"
    _run_ranks(manifest, single, 1)
    _run_ranks(manifest, double, 2)
    one, two = train_rows(single), train_rows(double)
    print("one:", [(r["actor/pg_loss"], r["actor/grad_norm"]) for r in one])
    print("two:", [(r["actor/pg_loss"], r["actor/grad_norm"]) for r in two])
    # The first step runs on the same weights: the same greedy samples and scores, and a gradient
    # norm equal up to bfloat16 rounding of differently ordered sums.
    assert one[0]["critic/score/mean"] == pytest.approx(two[0]["critic/score/mean"], abs=1e-9)
    assert math.isclose(one[0]["actor/grad_norm"], two[0]["actor/grad_norm"], rel_tol=1e-2)  # measured 2e-3
    assert math.isclose(one[1]["actor/grad_norm"], two[1]["actor/grad_norm"], rel_tol=3e-2)  # measured 6e-3
    from safetensors.torch import load_file

    for run_dir in (single, double):
        weights = load_file(next((run_dir / "checkpoints" / "step_000002" / "model").glob("*.safetensors")))
        assert {t.dtype for t in weights.values()} == {torch.float32}


@pytest.mark.slow
@pytest.mark.parametrize(
    "rollout",
    [
        {"share_actor": False},
        # Each rank's engine in a process of its own, generating in the background one step behind
        # (synchronous split engines are compared with in-process ones in test_trainer_split_placement.py).
        {"placement": "split", "max_staleness": 1, "weight_bucket_mb": 1},
    ],
    ids=["own-weights", "split-one-step-off"],
)
def test_two_ranks_with_engines_holding_their_own_weights_match_one_rank(tmp_path, tiny_model, rollout):
    """Each rank drives its own engine (data-parallel rollout), as vLLM or SGLang would: the hf
    engine with share_actor = false stands in, receiving weights gathered from the FSDP shards
    tensor by tensor after every update. If a rank's engine missed a sync, or got a shard instead
    of the full tensor, its samples would differ from the one-process run's. The same holds with
    the engines in processes of their own, and with background rollouts (the fixed lag makes the
    two runs comparable)."""
    shutil.copy(ROOT / "tests" / "fixtures" / "dense_rewards.py", tmp_path / "dense_rewards.py")
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        rollout={"samples_per_prompt": 1, "temperature": 0.0, **rollout},
        reward={"function": "python:dense_rewards.py:sum_and_upper", "method": None},
        algorithm={"advantage": "reinforce_pp"},
        data={"prompts_per_step": 4, "max_response_tokens": 6, "val": None},
        trainer={"steps": 3, "lr": 1e-2},
    )
    _run_ranks(manifest, tmp_path / "one", 1)
    _run_ranks(manifest, tmp_path / "two", 2)
    one, two = train_rows(tmp_path / "one"), train_rows(tmp_path / "two")
    assert len(one) == len(two) == 3
    for a, b in zip(one, two):
        assert a["critic/score/mean"] == pytest.approx(b["critic/score/mean"], abs=1e-9)
        assert a["response_length/mean"] == b["response_length/mean"]
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert math.isclose(a[key], b[key], rel_tol=1e-3, abs_tol=1e-6), (key, a[key], b[key])
    # Each rank's engine generated with the trainer's current weights: the log-probs it reported
    # are the trainer's own (a stale engine would be off by the update, large at lr 1e-2).
    assert all(r["actor/grad_norm"] > 0 for r in two)
    if "max_staleness" in rollout:  # one step behind: generated by the weights before the last update
        assert [r["rollout/staleness/max"] for r in two] == [0, 1, 1]
        return
    assert all(r["rollout_corr/logprob_diff/max"] < 1e-3 for r in two), [
        r["rollout_corr/logprob_diff/max"] for r in two
    ]


@pytest.mark.slow
def test_fsdp_cpu_offload_trains_like_no_offload(tmp_path, tiny_model):
    """[trainer] fsdp_offload: shards, gradients and optimizer state in CPU memory, the optimizer
    stepping there. On a CPU-only machine the shards never leave the CPU, so this checks the
    offload policy's code path and that it computes the same thing, not the memory it saves."""
    shutil.copy(ROOT / "tests" / "fixtures" / "dense_rewards.py", tmp_path / "dense_rewards.py")
    common = dict(
        rollout={"samples_per_prompt": 1, "temperature": 0.0},
        reward={"function": "python:dense_rewards.py:sum_and_upper", "method": None},
        algorithm={"advantage": "reinforce_pp"},
        data={"prompts_per_step": 4, "max_response_tokens": 6, "val": None},
    )
    plain = write_run_manifest(tmp_path, tiny_model, trainer={"steps": 2, "lr": 1e-2}, **common)
    _run_ranks(plain, tmp_path / "plain", 2)
    offloaded = write_run_manifest(
        tmp_path, tiny_model, trainer={"steps": 2, "lr": 1e-2, "fsdp_offload": True}, **common
    )
    _run_ranks(offloaded, tmp_path / "offload", 2)
    a, b = train_rows(tmp_path / "plain"), train_rows(tmp_path / "offload")
    assert len(a) == len(b) == 2
    for x, y in zip(a, b):
        assert x["critic/score/mean"] == y["critic/score/mean"]
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
            assert math.isclose(x[key], y[key], rel_tol=1e-5, abs_tol=1e-7), (key, x[key], y[key])
