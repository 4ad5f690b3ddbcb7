"""The CPU-side pieces of scripts/gpu_check.py and scripts/make_check_models.py: the synthetic
tasks, the greedy comparisons, and the read-back comparison against vLLM's fused layout."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import gpu_check  # noqa: E402
import make_check_models as mcm  # noqa: E402


def test_helpers_import_without_vllm_or_torch_at_import_time():
    """The CPU tests (and --dry-run) import the script where vLLM is absent: it must import vllm
    (and torch) only inside the functions that need them."""
    import subprocess

    code = (
        "import sys; sys.modules['vllm'] = None; sys.modules['torch'] = None; "
        f"sys.path.insert(0, {str(Path(gpu_check.__file__).parent)!r}); import gpu_check; print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize("task", list(mcm.TASKS))
def test_training_targets_follow_the_task_rule(task):
    inputs, targets = mcm.batch(task, 8, torch.Generator().manual_seed(0))
    lag, _ = mcm.TASKS[task]
    checked = 0
    for seq, tgt in zip(inputs.tolist(), targets.tolist()):
        for t, want in enumerate(tgt):
            if t + 1 - lag < 0:
                assert want == -100
                continue
            assert want == mcm.rule(task, seq[: t + 1]), (task, t)
            checked += 1
        # after the random prefix the sequence continues by the rule
        assert seq[-1] == mcm.rule(task, seq[:-1])
    assert checked > 100
    assert inputs.min() >= mcm.DOMAIN_START and inputs.max() < mcm.DOMAIN_START + mcm.DOMAIN_SIZE


def test_tasks_give_different_greedy_continuations():
    prompts = mcm.check_prompts()
    outs = {}
    for task in mcm.TASKS:
        rows = []
        for p in prompts:
            seq = list(p)
            for _ in range(mcm.NEW_TOKENS):
                seq.append(mcm.rule(task, seq))
            rows.append(seq[len(p) :])
        outs[task] = rows
        assert mcm.task_accuracy(task, prompts, rows) == 1.0
    assert mcm.token_overlap(outs["B"], outs["A"]) < 0.1
    assert mcm.token_overlap(outs["lora1"], outs["A"]) < gpu_check.DIFFER_MAX
    assert mcm.token_overlap(outs["lora2"], outs["lora1"]) < gpu_check.DIFFER_MAX


def test_token_match():
    m = gpu_check.token_match([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 0, 6]])
    assert m == {"seq_match": 0.5, "token_match": 5 / 6, "prefix_match": 4 / 6}
    with pytest.raises(ValueError):
        gpu_check.token_match([[1]], [[1], [2]])


def _tiny_state(seed: int) -> dict:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    return {n: t.clone() for n, t in Qwen2ForCausalLM(cfg).state_dict().items()}


@pytest.mark.parametrize("wrapped", [False, True])
def test_read_back_comparison_on_vllm_layout(wrapped):
    old, new = _tiny_state(0), _tiny_state(1)
    fused = gpu_check.fuse_like_vllm(new, wrapped)
    assert any("qkv_proj" in n for n in fused) and not any(".q_proj." in n for n in fused)
    assert any(".base_layer." in n for n in fused) == wrapped
    cmp = gpu_check.compare_params(fused, new, old)
    assert cmp["ok"] and cmp["max_abs_diff"] == 0.0 and cmp["tensors"] == len(fused)
    assert not cmp["hf_tensors_not_in_vllm"]

    # one fused tensor left at the old values, one parameter never sent, a bf16 rounding
    stale = dict(fused)
    key = next(n for n in stale if "qkv_proj" in n and n.endswith("weight"))
    stale[key] = gpu_check.fuse_like_vllm(old, wrapped)[key]
    cmp = gpu_check.compare_params(stale, new, old)
    assert not cmp["ok"] and cmp["not_updated"] == [key]
    assert cmp["per_tensor_max_abs_diff"][key] > 0

    missing = {n: t for n, t in fused.items() if "gate_up_proj" not in n or ".0." not in n}
    cmp = gpu_check.compare_params(missing, new, old)
    assert not cmp["ok"] and sorted(cmp["hf_tensors_not_in_vllm"]) == [
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
    ]

    rounded = {n: t.to(torch.bfloat16) for n, t in fused.items()}
    cmp = gpu_check.compare_params(rounded, new, old)
    assert not cmp["ok"] and 0 < cmp["max_abs_diff"] < 0.01
    assert gpu_check.compare_params(rounded, new, old, tol=0.01)["ok"]


def test_read_back_reports_padding_and_unknown_parameters():
    new = _tiny_state(1)
    fused = gpu_check.fuse_like_vllm(new)
    fused["lm_head.weight"] = torch.cat([fused["lm_head.weight"], torch.zeros(64, 32)])  # vocab padded to 128
    fused["model.layers.0.self_attn.extra.weight"] = torch.zeros(2)
    fused["model.layers.0.self_attn.qkv_proj.lora_a_stacked"] = torch.zeros(2)  # LoRA slots are skipped
    cmp = gpu_check.compare_params(fused, new)
    assert cmp["per_tensor_max_abs_diff"]["lm_head.weight"] == 0.0
    assert cmp["vllm_params_without_hf_tensor"] == ["model.layers.0.self_attn.extra.weight"]
    fused.pop("model.layers.0.self_attn.extra.weight")
    fused["model.norm.weight"] = torch.zeros(5)
    cmp = gpu_check.compare_params(fused, new)
    assert not cmp["ok"] and any(m.startswith("model.norm.weight: vLLM (5,)") for m in cmp["mismatched"])


def test_diff_stats():
    s = gpu_check.diff_stats([0.0, -1.0, -2.0], [0.0, -1.5, -2.0])
    assert s["n"] == 3 and s["max_abs_diff"] == 0.5 and abs(s["mean_abs_diff"] - 1 / 6) < 1e-9
    assert gpu_check.diff_stats([], [])["n"] == 0


@pytest.mark.slow
def test_dry_run_on_the_check_models(tmp_path):
    """Builds the models when missing (minutes on a 2-core CPU), then checks them, the read-back
    comparison and the plugin's weight files without vLLM."""
    code = gpu_check.main(str(tmp_path), dry=True)
    import json

    results = json.loads((tmp_path / "results.json").read_text())
    failed = {k: v for k, v in results["checks"].items() if not v["ok"]}
    assert not failed and not results["errors"], (failed, results["errors"])
    assert code == 0 and len(results["checks"]) >= 15


def test_results_are_saved_per_check_and_merged(tmp_path):
    import json

    colo = gpu_check.Results(tmp_path / "results_colocated.json", "[colocated]")
    colo.check("colocated_x", True, n=1)
    main = gpu_check.Results(tmp_path / "results.json", "[main]")
    main.check("server_y", False)
    assert (
        json.loads((tmp_path / "results.json").read_text())["checks"]["server_y"]["ok"] is False
    )  # on disk at once
    # a comparison that raises is a failed check, not the end of the run
    assert gpu_check.compare_greedy(main, "server_z", [[1]], None, "A") is False
    assert "AttributeError" in main.data["checks"]["server_z"]["error"]
    merged = gpu_check.merge(tmp_path, main)
    assert set(merged["checks"]) == {"colocated_x", "server_y", "server_z"}


def test_follow_prints_only_new_colocated_lines(tmp_path, capsys):
    log = tmp_path / "colocated.log"
    log.write_text("vllm noise\n[t] [colocated] CHECK a OK\npartial")
    pos = gpu_check.follow(log, 0)
    with open(log, "a") as f:
        f.write(" line [colocated] done\n")
    gpu_check.follow(log, pos)
    assert capsys.readouterr().out.splitlines() == [
        "[t] [colocated] CHECK a OK",
        "partial line [colocated] done",
    ]
