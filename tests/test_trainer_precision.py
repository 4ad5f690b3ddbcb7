"""Mixed precision learns: float32 master weights under bfloat16 compute keep every small update.

Also the rollout/trainer log-prob gap, measured each step (and caught when an engine is left on
stale weights), and the corrections that weigh the loss by it.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from rlcore.cli import main
from rlcore.testing.runs import train_rows, write_run_manifest

ROOT = Path(__file__).resolve().parents[1]  # the repository

DENSE = {"function": "python:dense_rewards.py:sum_and_upper", "method": None}


def _dense_manifest(tmp_path, model_dir, **tables):
    shutil.copy(ROOT / "tests" / "fixtures" / "dense_rewards.py", tmp_path / "dense_rewards.py")
    base = dict(
        reward=DENSE,
        algorithm={"advantage": "reinforce_pp"},
        data={"val": None},
        rollout={"samples_per_prompt": 2, "temperature": 1.0},
    )
    for key, value in tables.items():
        base[key] = {**base.get(key, {}), **value}
    return write_run_manifest(tmp_path, model_dir, **base)


def _weights(directory) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = {}
    for shard in sorted(directory.glob("*.safetensors")):
        state.update(load_file(shard))
    return state


def _moved(before: dict, after: dict) -> tuple[float, float]:
    """(fraction of weights that changed, mean absolute change) over the matrices; ``before`` is
    first rounded to the dtype ``after`` was stored in."""
    changed = total = 0
    delta = 0.0
    for name, old in before.items():
        if old.dim() < 2:
            continue
        new = after[name]
        diff = (new.float() - old.to(new.dtype).float()).abs()
        changed += int((diff > 0).sum())
        total += diff.numel()
        delta += float(diff.sum())
    return changed / total, delta / total


# ---------------------------------------------------------------------- small updates accumulate


@pytest.mark.slow
def test_bf16_compute_keeps_small_updates_in_float32_masters(tmp_path, tiny_model):
    """Six Adam steps at lr 1e-5 move every weight by about 6e-5: under bfloat16 compute with
    float32 masters they all land; with the weights themselves in bfloat16 (the old default on
    GPUs) nearly all round away, since half a bfloat16 ulp of a weight of 0.02 is about 6e-5."""
    steps, lr = 6, 1e-5
    initial = _weights(tiny_model)
    runs = {}
    for name, model in (("mixed", {"compute_dtype": "bfloat16"}), ("pure", {"dtype": "bfloat16"})):
        directory = tmp_path / name
        directory.mkdir()
        manifest = _dense_manifest(
            directory, tiny_model, model=model, trainer={"steps": steps, "lr": lr, "grad_clip": 1e6}
        )
        assert main(["run", str(manifest), "--run-dir", str(directory / "run")]) == 0
        rows = train_rows(directory / "run")
        assert all(r["actor/grad_norm"] > 0 for r in rows)
        runs[name] = _weights(directory / "run" / "checkpoints" / f"step_{steps:06d}" / "model")
    mixed_changed, mixed_delta = _moved(initial, runs["mixed"])
    pure_changed, _ = _moved(initial, runs["pure"])
    print(
        f"mixed: {mixed_changed:.3f} of weights moved, mean |change| {mixed_delta:.2e}; pure bf16: {pure_changed:.3f}"
    )
    # The checkpoint holds the float32 masters, not their bfloat16 casts.
    assert all(t.dtype == torch.float32 for t in runs["mixed"].values())
    assert mixed_changed > 0.99
    assert mixed_delta > 0.3 * steps * lr
    assert pure_changed < 0.3


def test_master_weights_accumulate_what_bf16_parameters_lose():
    """The mechanism alone: 200 steps of 1e-6 on weights near 0.5 (half a bf16 ulp there is 1e-3)."""
    from rlcore.trainer.precision import MasterWeights

    def train(mixed: bool) -> torch.Tensor:
        torch.manual_seed(0)
        layer = torch.nn.Linear(16, 16, bias=False)
        with torch.no_grad():
            layer.weight.fill_(0.5)
        if mixed:
            masters = MasterWeights(layer, torch.bfloat16)
            params = masters.params
        else:
            layer.to(torch.bfloat16)
            params = list(layer.parameters())
        optimizer = torch.optim.SGD(params, lr=1e-6)
        x = torch.ones(4, 16, dtype=torch.bfloat16)
        for _ in range(200):
            optimizer.zero_grad(set_to_none=True)
            layer(x).sum().backward()
            if mixed:
                assert layer.weight.grad is None  # handed to the master as soon as it was produced
            optimizer.step()
            if mixed:
                masters.publish()
        return params[0].detach().float()

    # d(sum)/dw = 4 per weight: 200 steps of SGD at 1e-6 take each weight from 0.5 to 0.4992.
    assert torch.allclose(train(mixed=True), torch.full((16, 16), 0.5 - 200 * 4e-6), atol=1e-6)
    assert torch.equal(train(mixed=False), torch.full((16, 16), 0.5))


def test_master_weights_tied_parameters_publish_and_full_precision():
    from rlcore.trainer.precision import MasterWeights

    embed = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = embed.weight  # tied, as in most small LMs
    model = torch.nn.ModuleDict({"embed": embed, "head": head})
    buffer = torch.arange(3, dtype=torch.float32)
    model.register_buffer("freq", buffer)
    original = embed.weight.detach().clone()
    masters = MasterWeights(model, torch.bfloat16)
    assert len(masters.params) == 1 and masters.params[0].dtype == torch.float32
    assert embed.weight.dtype == head.weight.dtype == torch.bfloat16 and model.freq.dtype == torch.float32
    assert torch.equal(masters.params[0].detach(), original)
    # Both uses of the tied weight reach the one master gradient.
    ids = torch.tensor([1, 2])
    head(embed(ids)).sum().backward()
    assert masters.params[0].grad is not None and embed.weight.grad is None
    with torch.no_grad():
        masters.params[0].add_(1e-4)
    address = embed.weight.data_ptr()
    masters.publish()
    assert embed.weight.data_ptr() == address  # in place: captured graphs stay valid
    assert torch.equal(embed.weight, (original + 1e-4).to(torch.bfloat16))
    with masters.full_precision():
        assert embed.weight.dtype == torch.float32
        state = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(
            {**state, "embed.weight": torch.zeros(10, 4), "head.weight": torch.zeros(10, 4)}
        )
    assert torch.equal(masters.params[0].detach(), torch.zeros(10, 4))  # a restore lands in the master
    assert embed.weight.dtype == torch.bfloat16 and torch.equal(
        embed.weight, torch.zeros(10, 4, dtype=torch.bfloat16)
    )


@pytest.mark.slow
def test_mixed_precision_resume_matches_an_uninterrupted_run(tmp_path, tiny_model):
    """The checkpoint's float32 masters and optimizer state continue the run exactly."""
    manifest = _dense_manifest(
        tmp_path,
        tiny_model,
        model={"compute_dtype": "bfloat16"},
        trainer={"steps": 3, "lr": 1e-3, "save_every": 1},
    )
    assert main(["run", str(manifest), "--run-dir", str(tmp_path / "straight")]) == 0
    manifest.write_text(manifest.read_text().replace("steps = 3", "steps = 2"))
    assert main(["run", str(manifest), "--run-dir", str(tmp_path / "resumed")]) == 0
    manifest.write_text(manifest.read_text().replace("steps = 2", "steps = 3"))
    assert main(["run", str(manifest), "--run-dir", str(tmp_path / "resumed"), "--resume"]) == 0
    straight, resumed = train_rows(tmp_path / "straight"), train_rows(tmp_path / "resumed")
    assert [r["step"] for r in resumed] == [1, 2, 3]
    for key in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "rollout_corr/logprob_diff/mean"):
        assert straight[2][key] == pytest.approx(resumed[2][key], rel=1e-6, abs=1e-9), key


# ---------------------------------------------------------------------- the rollout/trainer gap


@pytest.mark.slow
def test_mismatch_metrics_catch_an_engine_left_on_stale_weights(tmp_path, tiny_model, monkeypatch):
    """The engine holds its own copy (share_actor = false). Synced after every update, its
    log-probs stay within float32 noise of the trainer's; never synced, the gap opens at step 2."""
    from rlcore_rollout_hf.engine import HFRolloutEngine

    def run(name: str) -> list[dict]:
        directory = tmp_path / name
        directory.mkdir()
        # On the CPU in float32, where a synced engine agrees with the trainer to rounding.
        manifest = _dense_manifest(
            directory,
            tiny_model,
            run={"device": "cpu"},
            rollout={"share_actor": False},
            trainer={"steps": 3, "lr": 3e-2},
        )
        assert main(["run", str(manifest), "--run-dir", str(directory / "run")]) == 0
        return train_rows(directory / "run")

    synced = run("synced")
    monkeypatch.setattr(HFRolloutEngine, "update_weights", lambda self, named_tensors: None)
    stale = run("stale")
    keys = (
        "rollout_corr/logprob_diff/mean",
        "rollout_corr/logprob_diff/max",
        "rollout_corr/ratio/min",
        "rollout_corr/ratio/mean",
        "rollout_corr/ratio/max",
        "rollout_corr/kl",
    )
    for row in synced + stale:
        assert all(key in row for key in keys), sorted(row)
    print("synced:", [r["rollout_corr/logprob_diff/mean"] for r in synced])
    print("stale: ", [r["rollout_corr/logprob_diff/mean"] for r in stale])
    # Step 1: both engines hold the initial weights.
    assert (
        synced[0]["rollout_corr/logprob_diff/mean"] < 1e-4
        and stale[0]["rollout_corr/logprob_diff/mean"] < 1e-4
    )
    for s, t in zip(synced[1:], stale[1:]):
        assert s["rollout_corr/logprob_diff/mean"] < 1e-4
        assert s["rollout_corr/ratio/min"] > 0.999 and s["rollout_corr/ratio/max"] < 1.001
        assert t["rollout_corr/logprob_diff/mean"] > 100 * max(s["rollout_corr/logprob_diff/mean"], 1e-6)
        assert t["rollout_corr/kl"] > 1e-4


@pytest.mark.slow
def test_an_actor_laid_out_by_the_engine_trains_and_resumes_as_one_left_alone(tmp_path, tiny_model):
    """The hf engine's fast path moves the shared actor's gate and up weights back to back
    (``fuse_projections``); the trainer's float32 masters, bf16 compute parameters, checkpoints and
    resume must not notice."""

    def manifest(name: str, fuse: bool, steps: int):
        directory = tmp_path / name
        directory.mkdir(exist_ok=True)
        return _dense_manifest(
            directory,
            tiny_model,
            run={"device": "cpu"},
            model={"compute_dtype": "bfloat16"},
            rollout={"fast_path": "on", "fuse_projections": fuse, "compile": False},
            trainer={"steps": steps, "lr": 1e-3, "save_every": 1},
        )

    runs = {}
    for name, fuse in (("fused", True), ("separate", False)):
        assert main(["run", str(manifest(name, fuse, 3)), "--run-dir", str(tmp_path / name / "run")]) == 0
        runs[name] = train_rows(tmp_path / name / "run")
    resumed = tmp_path / "resumed" / "run"
    assert main(["run", str(manifest("resumed", True, 2)), "--run-dir", str(resumed)]) == 0
    assert main(["run", str(manifest("resumed", True, 3)), "--run-dir", str(resumed), "--resume"]) == 0
    runs["resumed"] = train_rows(resumed)
    keys = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "rollout_corr/logprob_diff/mean")
    for step in range(3):
        for key in keys:
            fused = runs["fused"][step][key]
            assert runs["separate"][step][key] == pytest.approx(fused, rel=1e-6, abs=1e-9), (step, key)
            assert runs["resumed"][step][key] == pytest.approx(fused, rel=1e-6, abs=1e-9), (step, key)
    assert runs["fused"][2]["actor/grad_norm"] > 0


def test_correction_weights_by_hand():
    from rlcore.algorithms import correction_weights

    rollout = torch.zeros(2, 3)
    old = torch.log(torch.tensor([[1.0, 3.0, 0.25], [1.5, 1.0, 1.0]]))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    w, stats = correction_weights(old, rollout, mask, "token_truncate", 2.0, 0.5)
    assert torch.allclose(w, torch.tensor([[1.0, 2.0, 0.25], [1.5, 1.0, 0.0]]))
    assert float(stats["rollout_corr/truncated_fraction"]) == pytest.approx(1 / 5)
    w, stats = correction_weights(old, rollout, mask, "token_mask", 2.0, 0.5)
    assert torch.allclose(w, torch.tensor([[1.0, 0.0, 0.0], [1.5, 1.0, 0.0]]))
    assert float(stats["rollout_corr/rejected_fraction"]) == pytest.approx(2 / 5)
    # Sequence level: row 0's ratio is 1 * 3 * 0.25 = 0.75, row 1's is 1.5 (its third token is masked out).
    w, _ = correction_weights(old, rollout, mask, "sequence_truncate", 1.2, 0.5)
    assert torch.allclose(w, torch.tensor([[0.75, 0.75, 0.75], [1.2, 1.2, 0.0]]))
    w, stats = correction_weights(old, rollout, mask, "sequence_mask", 1.2, 0.8)
    assert torch.allclose(w, torch.zeros(2, 3))
    assert float(stats["rollout_corr/rejected_fraction"]) == pytest.approx(1.0)
    w, _ = correction_weights(old, rollout, mask, "sequence_mask", 2.0, 0.5)
    assert torch.allclose(w, torch.tensor([[0.75, 0.75, 0.75], [1.5, 1.5, 0.0]]))
    # A huge gap neither overflows nor leaks through the mask.
    w, _ = correction_weights(
        torch.full((1, 2), 500.0), torch.zeros(1, 2), torch.tensor([[1, 0]]), "token_truncate", 2.0, 0.5
    )
    assert torch.equal(w, torch.tensor([[2.0, 0.0]]))
    with pytest.raises(ValueError, match="band"):
        correction_weights(old, rollout, mask, "token_mask", 0.9, 0.5)


def test_mismatch_metrics_by_hand():
    from rlcore.algorithms import merge_mismatch, mismatch_metrics, mismatch_sums

    trainer = torch.log(torch.tensor([[2.0, 1.0], [0.5, 9.0]]))
    mask = torch.tensor([[1, 1], [1, 0]])
    first = mismatch_sums(trainer[:1], torch.zeros(1, 2), mask[:1])
    second = mismatch_sums(trainer[1:], torch.zeros(1, 2), mask[1:])
    metrics = mismatch_metrics(merge_mismatch(merge_mismatch(None, first), second))
    assert metrics["rollout_corr/logprob_diff/mean"] == pytest.approx((math.log(2) + 0 + math.log(2)) / 3)
    assert metrics["rollout_corr/logprob_diff/max"] == pytest.approx(math.log(2))
    assert metrics["rollout_corr/ratio/min"] == pytest.approx(0.5)
    assert metrics["rollout_corr/ratio/max"] == pytest.approx(2.0)
    assert metrics["rollout_corr/ratio/mean"] == pytest.approx(3.5 / 3)
    kl = ((2 - 1 - math.log(2)) + 0 + (0.5 - 1 + math.log(2))) / 3
    assert metrics["rollout_corr/kl"] == pytest.approx(kl)
    assert mismatch_metrics(mismatch_sums(trainer, trainer, torch.zeros(2, 2))) == {}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sequence_mask", "token_truncate"])
def test_rollout_corrections_train_end_to_end(tmp_path, tiny_model, mode):
    manifest = _dense_manifest(
        tmp_path,
        tiny_model,
        run={"device": "cpu"},
        algorithm={"rollout_correction": mode, "rollout_is_threshold": 1.5},
        trainer={"steps": 2},
    )
    assert main(["run", str(manifest), "--run-dir", str(tmp_path / "run")]) == 0
    rows = train_rows(tmp_path / "run")
    kind = "rejected" if mode.endswith("mask") else "truncated"
    for row in rows:
        assert row[f"rollout_corr/{kind}_fraction"] == pytest.approx(
            0.0, abs=1e-9
        )  # fp32 on CPU: no gap to correct
        assert row["rollout_corr/weight/mean"] == pytest.approx(1.0, abs=1e-3)
        assert row["actor/grad_norm"] > 0


# ---------------------------------------------------------------------- LoRA and the manifest


def test_merged_state_equals_peft_merge_without_touching_the_model(tiny_model):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rlcore.trainer.lora import merged_state
    from rlcore.trainer.precision import cast_parameters

    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model),
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"),
    )
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    cast_parameters(model, torch.bfloat16)  # the frozen base as mixed precision keeps it
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ours = dict(merged_state(model))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # nothing merged in place
    import copy

    reference = copy.deepcopy(model)
    cast_parameters(reference, torch.float32)
    expected = reference.merge_and_unload().state_dict()
    assert set(ours) == set(expected)
    for name, tensor in ours.items():
        assert tensor.dtype == torch.bfloat16
        assert torch.allclose(tensor.float(), expected[name].float(), atol=1e-2, rtol=1e-2), name
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(ours[q], before[f"base_model.model.{q}".replace(".weight", ".base_layer.weight")])


def test_manifest_precision_keys(tmp_path, tiny_model):
    from rlcore.manifest.schema import ModelTable

    with pytest.raises(ValueError, match='compute_dtype = "float32" needs dtype = "float32"'):
        ModelTable(path="m", dtype="bfloat16", compute_dtype="float32")
    manifest = write_run_manifest(tmp_path, tiny_model, model={"dtype": "bfloat16"})
    from rlcore.manifest.checks import check_resolved
    from rlcore.manifest.loader import load_manifest
    from rlcore.registry import Registry

    warnings = check_resolved(load_manifest(manifest, [], registry=Registry.discover()))
    assert any("model.dtype = 'bfloat16'" in w and "lost" in w for w in warnings), warnings


def test_precision_resolution():
    from rlcore.manifest.schema import ModelTable
    from rlcore.trainer.precision import resolve

    assert (
        resolve(ModelTable(path="m"), "cuda:0").describe()
        == "float32 master weights and optimizer state, bfloat16 compute"
    )
    assert not resolve(ModelTable(path="m"), "cpu").mixed
    assert resolve(ModelTable(path="m", compute_dtype="bfloat16"), "cpu").mixed
    assert resolve(ModelTable(path="m", dtype="bfloat16"), "cuda").compute == "bfloat16"
    assert not resolve(ModelTable(path="m", compute_dtype="float32"), "cuda").mixed
