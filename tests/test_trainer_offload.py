"""[trainer] fsdp_offload on one rank: FSDP2 over a process group of one, with the CPU offload
policy, trains as the same run without offload does.

On a CPU-only machine the shards never leave the CPU, so these check the offload path (FSDP over
one rank, its mixed-precision policy, full float32 state dicts in checkpoints, resuming) and that
it computes the same thing, not the memory it saves (benchmarks/offload_capacity.py measures that
on a GPU).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from rlcore.testing.runs import run_cli, train_rows, write_run_manifest

ROOT = Path(__file__).resolve().parents[1]  # the repository

# Greedy rollouts and a dense reward: the same weights give the same samples and non-zero advantages.
COMMON = dict(
    rollout={"samples_per_prompt": 1, "temperature": 0.0},
    reward={"function": "python:dense_rewards.py:sum_and_upper", "method": None},
    algorithm={"advantage": "reinforce_pp"},
    data={"prompts_per_step": 4, "max_response_tokens": 6, "val": None},
)


def _run(manifest: Path, run_dir: Path, *extra: str) -> str:
    proc = run_cli("run", str(manifest), "--run-dir", str(run_dir), *extra, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc.stdout + proc.stderr


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for shard in sorted(directory.glob("*.safetensors")):
        out.update(load_file(shard))
    return out


def _manifest(tmp_path: Path, tiny_model: Path, name: str, **tables) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    shutil.copy(ROOT / "tests" / "fixtures" / "dense_rewards.py", directory / "dense_rewards.py")
    return write_run_manifest(directory, tiny_model, **{**COMMON, **tables})


@pytest.mark.slow
def test_one_rank_offload_trains_like_no_offload_and_resumes(tmp_path, tiny_model):
    """Three steps without offload; two with it, then a resume from its checkpoint for the third.
    Same losses, gradient norms and final weights (float32 throughout), and the checkpoint holds
    the full float32 model."""
    plain = _manifest(tmp_path, tiny_model, "plain", trainer={"steps": 3, "lr": 1e-2})
    _run(plain, tmp_path / "plain-run")
    offload = _manifest(
        tmp_path,
        tiny_model,
        "offload",
        trainer={"steps": 2, "lr": 1e-2, "fsdp_offload": True, "export_final": True},
    )
    _run(offload, tmp_path / "offload-run")
    saved = _weights(tmp_path / "offload-run" / "checkpoints" / "step_000002" / "model")
    assert {t.dtype for t in saved.values()} == {torch.float32}
    assert (
        _weights(tmp_path / "offload-run" / "export").keys() == saved.keys()
    )  # export_final gathers the shards too
    offload.write_text(offload.read_text().replace("steps = 2", "steps = 3"))
    log = _run(offload, tmp_path / "offload-run", "--resume")
    assert "resumed from" in log

    a, b = train_rows(tmp_path / "plain-run"), train_rows(tmp_path / "offload-run")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3]
    # The tolerance of the distributed tests (test_trainer_distributed.py): float sums in another
    # order (FSDP's copy-in and reduce-scatter), amplified by Adam's early sign-like updates.
    for x, y in zip(a, b):
        assert x["critic/score/mean"] == pytest.approx(y["critic/score/mean"], abs=1e-9)
        assert x["response_length/mean"] == y["response_length/mean"]
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
            assert math.isclose(x[key], y[key], rel_tol=1e-3, abs_tol=1e-6), (x["step"], key, x[key], y[key])
    assert all(r["actor/grad_norm"] > 0 for r in a)

    final_plain = _weights(tmp_path / "plain-run" / "checkpoints" / "step_000003" / "model")
    final_offload = _weights(tmp_path / "offload-run" / "checkpoints" / "step_000003" / "model")
    assert final_plain.keys() == final_offload.keys()
    for name, w in final_plain.items():
        assert final_offload[name].dtype == torch.float32
        torch.testing.assert_close(final_offload[name], w, rtol=1e-3, atol=1e-4, msg=name)
    initial = _weights(Path(tiny_model))
    moved = [n for n in final_plain if n in initial and not torch.equal(final_plain[n], initial[n].float())]
    assert moved  # the runs trained (lr 1e-2): equal weights are not the untouched ones


@pytest.mark.slow
def test_one_rank_offload_mixed_precision_keeps_float32_masters(tmp_path, tiny_model):
    """bfloat16 compute over float32 weights: without offload one process keeps float32 masters
    beside a bfloat16 module; with it, FSDP2's MixedPrecisionPolicy gathers float32 shards in
    bfloat16. They agree as bfloat16 rounding allows (the distributed test's tolerance), and the
    checkpoint holds float32."""
    common = {"model": {"compute_dtype": "bfloat16"}}
    plain = _manifest(tmp_path, tiny_model, "plain", trainer={"steps": 2, "lr": 1e-3}, **common)
    _run(plain, tmp_path / "plain-run")
    offload = _manifest(
        tmp_path, tiny_model, "offload", trainer={"steps": 2, "lr": 1e-3, "fsdp_offload": True}, **common
    )
    _run(offload, tmp_path / "offload-run")
    a, b = train_rows(tmp_path / "plain-run"), train_rows(tmp_path / "offload-run")
    assert a[0]["critic/score/mean"] == pytest.approx(b[0]["critic/score/mean"], abs=1e-9)
    assert math.isclose(a[0]["actor/grad_norm"], b[0]["actor/grad_norm"], rel_tol=1e-2)
    assert math.isclose(a[1]["actor/grad_norm"], b[1]["actor/grad_norm"], rel_tol=3e-2)
    weights = _weights(tmp_path / "offload-run" / "checkpoints" / "step_000002" / "model")
    assert {t.dtype for t in weights.values()} == {torch.float32}


@pytest.mark.slow
def test_one_rank_offload_with_a_critic_and_an_engine_of_its_own(tmp_path, tiny_model):
    """PPO's critic is sharded and offloaded too, and an engine holding its own weights receives
    the actor's, gathered from the one rank's shards: its log-probs match the trainer's."""
    tables = dict(
        rollout={"samples_per_prompt": 1, "temperature": 0.0, "share_actor": False},
        algorithm={"advantage": "gae"},
    )
    plain = _manifest(tmp_path, tiny_model, "plain", trainer={"steps": 2, "lr": 1e-2}, **tables)
    _run(plain, tmp_path / "plain-run")
    offload = _manifest(
        tmp_path, tiny_model, "offload", trainer={"steps": 2, "lr": 1e-2, "fsdp_offload": True}, **tables
    )
    _run(offload, tmp_path / "offload-run")
    a, b = train_rows(tmp_path / "plain-run"), train_rows(tmp_path / "offload-run")
    for x, y in zip(a, b):
        assert x["critic/score/mean"] == pytest.approx(y["critic/score/mean"], abs=1e-9)
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm"):
            assert math.isclose(x[key], y[key], rel_tol=1e-3, abs_tol=1e-6), (x["step"], key, x[key], y[key])
    assert all(r["rollout_corr/logprob_diff/max"] < 1e-3 for r in b), [
        r["rollout_corr/logprob_diff/max"] for r in b
    ]


@pytest.mark.slow
def test_resuming_with_another_fsdp_offload_setting_is_refused(tmp_path, tiny_model):
    manifest = _manifest(tmp_path, tiny_model, "run", trainer={"steps": 1})
    _run(manifest, tmp_path / "run")
    manifest.write_text(manifest.read_text().replace("steps = 1", "steps = 2\nfsdp_offload = true"))
    proc = run_cli("run", str(manifest), "--run-dir", str(tmp_path / "run"), "--resume", timeout=600)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "Traceback" not in text, text
    assert "manifest.toml" in text and "fsdp_offload" in text and "without FSDP" in text, text
