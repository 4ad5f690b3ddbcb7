"""``[model] share_prompts``: a prompt's samples packed as the prompt once, then each response.

The shared packing must give the same per-token log-probs, entropies and parameter gradients as
packing every sample whole, while running fewer tokens through the model."""

from __future__ import annotations

import pytest
import torch

from rlcore.interfaces import Prompt, Trajectory
from rlcore.trainer.attention import NAME, register
from rlcore.trainer.batch import build_batch, pack
from rlcore.trainer.logprobs import token_logprobs

# (prompt length, [response lengths]) per prompt; one empty response, one prompt sampled once.
GROUPS = [(6, [5, 9, 1, 4]), (3, [7, 0, 2]), (11, [3]), (1, [6, 6])]


def _model(attention=NAME, dtype=torch.float32):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    register()
    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=300,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    model = Qwen2ForCausalLM(config).to(dtype)
    model.set_attn_implementation(attention)
    return model


def _batch(groups=GROUPS, vocab=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    trajectories = []
    for plen, responses in groups:
        prompt = torch.randint(0, vocab, (plen,), generator=g).tolist()
        for r in responses:
            trajectories.append(
                Trajectory(
                    prompt=Prompt(token_ids=prompt, messages=[]),
                    response_ids=torch.randint(0, vocab, (r,), generator=g).tolist(),
                    response_mask=[1] * r,
                    rollout_logprobs=[0.0] * r,
                )
            )
    return build_batch(trajectories, [0.0] * len(trajectories), 1)


def _per_row(model, batch, micro_batches, with_grads=True):
    """{row: (log-probs, entropies)} over the micro-batches, and the summed gradients."""
    model.zero_grad(set_to_none=True)
    out = {}
    for micro in micro_batches:
        lp, ent = token_logprobs(model, micro, with_entropy=True)
        if with_grads:
            # a weight per (row, position), the same however the rows are packed
            row = torch.tensor(micro.rows, device=lp.device)[micro.local_rows]
            ((0.5 + ((row * 31 + micro.cols) % 7) / 7) * lp).sum().backward()
        width = batch.width
        lp_rows, ent_rows = micro.scatter(lp.detach(), width), micro.scatter(ent.detach(), width)
        for i, r in enumerate(micro.rows):
            n = len(batch.response_ids[r])
            out[r] = (lp_rows[i, :n], ent_rows[i, :n])
    grads = {n: p.grad.clone() for n, p in model.named_parameters()} if with_grads else {}
    return out, grads


def test_shared_packing_counts_each_prompt_once_and_keeps_rows():
    batch = _batch()
    plain = pack(batch, list(range(batch.size)), 4096)
    shared = pack(batch, list(range(batch.size)), 4096, share_prompts=True)
    assert len(plain) == len(shared) == 1
    responses = sum(sum(rs) for _, rs in GROUPS)
    assert plain[0].num_tokens == sum(p * len(rs) for p, rs in GROUPS) + responses
    assert shared[0].num_tokens == sum(p for p, _ in GROUPS) + responses
    assert sorted(shared[0].rows) == list(range(batch.size))
    assert shared[0].shared is not None and plain[0].shared is None
    # positions continue the prompt's: the first response of the first group starts at 6
    pos = shared[0].position_ids[0].tolist()
    assert pos[: 6 + 5] == list(range(6 + 5))
    assert pos[6 + 5 : 6 + 5 + 9] == list(range(6, 6 + 9))


def test_shared_prompts_match_whole_samples_in_logprobs_entropy_and_gradients():
    model = _model()
    batch = _batch()
    plain, grads_plain = _per_row(model, batch, pack(batch, list(range(batch.size)), 4096))
    shared, grads_shared = _per_row(
        model, batch, pack(batch, list(range(batch.size)), 4096, share_prompts=True)
    )
    assert plain.keys() == shared.keys()
    for r in plain:
        torch.testing.assert_close(
            shared[r][0], plain[r][0], rtol=1e-5, atol=1e-5, msg=f"log-probs of row {r}"
        )
        torch.testing.assert_close(shared[r][1], plain[r][1], rtol=1e-5, atol=1e-5, msg=f"entropy of row {r}")
    for name in grads_plain:
        torch.testing.assert_close(grads_shared[name], grads_plain[name], rtol=1e-4, atol=1e-6, msg=name)


def test_gradient_checkpointing_recomputes_with_the_shared_layout():
    """A checkpointed layer is run again in the backward: it must see the same layout."""
    model = _model()
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batch = _batch()
    _, grads_plain = _per_row(model, batch, pack(batch, list(range(batch.size)), 4096))
    _, grads_shared = _per_row(model, batch, pack(batch, list(range(batch.size)), 4096, share_prompts=True))
    for name in grads_plain:
        torch.testing.assert_close(grads_shared[name], grads_plain[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_group_over_the_budget_is_split_with_its_prompt_repeated():
    model = _model()
    batch = _batch([(6, [5, 9, 1, 4, 7]), (3, [7, 2])])
    micro = pack(batch, list(range(batch.size)), 16, share_prompts=True)
    assert len(micro) > 2 and all(m.num_tokens <= 16 for m in micro)
    assert sorted(r for m in micro for r in m.rows) == list(range(batch.size))
    plain, grads_plain = _per_row(model, batch, pack(batch, list(range(batch.size)), 4096))
    shared, grads_shared = _per_row(model, batch, micro)
    for r in plain:
        torch.testing.assert_close(shared[r][0], plain[r][0], rtol=1e-5, atol=1e-5, msg=f"row {r}")
    for name in grads_plain:
        torch.testing.assert_close(grads_shared[name], grads_plain[name], rtol=1e-4, atol=1e-6, msg=name)


def test_one_sample_per_prompt_packs_as_before():
    batch = _batch([(4, [3]), (5, [2]), (2, [6])])
    plain = pack(batch, [0, 1, 2], 4096)
    shared = pack(batch, [0, 1, 2], 4096, share_prompts=True)
    assert shared[0].shared is None
    assert torch.equal(shared[0].input_ids, plain[0].input_ids) and shared[0].rows == plain[0].rows


def test_a_shared_micro_batch_refuses_an_attention_that_cannot_read_it():
    model = _model(attention="sdpa")
    batch = _batch()
    micro = pack(batch, list(range(batch.size)), 4096, share_prompts=True)[0]
    with pytest.raises(RuntimeError, match="rlcore_varlen"):
        token_logprobs(model, micro)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the flash varlen kernel needs CUDA")
def test_flash_kernel_aligns_a_response_with_the_end_of_its_keys():
    """On CUDA in bfloat16 the varlen kernel runs the shared layout: it must match packing
    every sample whole (same kernel, plain layout) to bfloat16 accuracy, compiled layers or not."""
    from rlcore.trainer.compiling import compile_decoder_layers

    model = _model(dtype=torch.bfloat16).cuda()
    batch = _batch([(128, [40, 200, 17, 256]), (64, [256, 3, 90, 1])], seed=3)
    rows = list(range(batch.size))
    for compiled in (False, True):
        if compiled:
            compile_decoder_layers(model)
        plain, _ = _per_row(model, batch, pack(batch, rows, 4096, "cuda"), with_grads=False)
        shared, _ = _per_row(
            model, batch, pack(batch, rows, 4096, "cuda", share_prompts=True), with_grads=False
        )
        for r in plain:
            torch.testing.assert_close(shared[r][0], plain[r][0], rtol=0.05, atol=0.05, msg=f"row {r}")
            assert (shared[r][0] - plain[r][0]).abs().mean() < 0.01, r


RUNS = {
    # a critic (which packs samples whole) and a KL reference (a frozen copy, which shares like the actor)
    "gae-critic-kl": (
        {"algorithm": {"advantage": "gae", "kl_coef": 0.01, "kl_estimator": "k3"}},
        ("actor/kl_loss", "critic/vf_loss", "critic/values/mean"),
    ),
    # LoRA adapters (the reference is the base with adapters off) under gradient checkpointing
    "lora-checkpointed-kl": (
        {
            "model": {"lora": {"rank": 4, "alpha": 8}, "gradient_checkpointing": True},
            "algorithm": {"advantage": "grpo", "kl_coef": 0.01, "kl_estimator": "k3"},
        },
        ("actor/kl_loss",),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_run_sharing_prompts_makes_the_same_first_update(tmp_path, tiny_model, name):
    """Through `rlcore run`: the same rollouts, and up to float rounding the same first update."""
    import math

    from rlcore.cli import main
    from rlcore.testing.runs import train_rows, write_run_manifest

    tables, extra_keys = RUNS[name]
    rows = {}
    for setting in (False, True):
        (tmp_path / str(setting)).mkdir()
        model = {**tables.get("model", {}), "share_prompts": setting, "attn_implementation": NAME}
        manifest = write_run_manifest(
            tmp_path / str(setting),
            tiny_model,
            model=model,
            rollout={"samples_per_prompt": 4},
            algorithm=tables["algorithm"],
            trainer={"steps": 1},
        )
        assert main(["run", str(manifest), "--run-dir", str(tmp_path / str(setting) / "run")]) == 0
        rows[setting] = train_rows(tmp_path / str(setting) / "run")[0]
    assert rows[True]["response_length/mean"] == rows[False]["response_length/mean"]
    assert rows[True]["critic/score/mean"] == rows[False]["critic/score/mean"]
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", *extra_keys):
        assert math.isclose(rows[True][key], rows[False][key], rel_tol=1e-4, abs_tol=1e-6), (
            key,
            rows[True][key],
            rows[False][key],
        )


def test_share_prompts_true_refuses_another_attention_at_its_key(tmp_path):
    from rlcore.testing.runs import run_cli

    manifest = tmp_path / "m.toml"
    manifest.write_text(
        '[model]\npath = "x"\nshare_prompts = true\nattn_implementation = "sdpa"\n'
        '[data]\ntrain = "synthetic:addition?size=8"\n[reward]\nfunction = "gsm8k"\n'
    )
    proc = run_cli("validate", str(manifest))
    assert proc.returncode == 2
    assert "model" in proc.stdout + proc.stderr and "rlcore_varlen" in proc.stdout + proc.stderr
