"""attn_implementation = "rlcore_varlen": packed rows attended per sequence, everything else as SDPA."""

from __future__ import annotations

import copy

import pytest
import torch

from rlcore.interfaces import Prompt, Trajectory
from rlcore.trainer.attention import NAME, register
from rlcore.trainer.batch import build_batch, pack
from rlcore.trainer.logprobs import token_logprobs

SHAPES = [(5, 7), (9, 3), (2, 11), (1, 1)]


def _models(device="cpu", dtype=torch.float32):
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
    sdpa = Qwen2ForCausalLM(config).to(device=device, dtype=dtype)
    varlen = copy.deepcopy(sdpa)
    varlen.set_attn_implementation(NAME)
    return sdpa, varlen


def _batch(vocab=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    trajectories = [
        Trajectory(
            prompt=Prompt(token_ids=torch.randint(0, vocab, (p,), generator=g).tolist(), messages=[]),
            response_ids=torch.randint(0, vocab, (r,), generator=g).tolist(),
            response_mask=[1] * r,
            rollout_logprobs=[0.0] * r,
        )
        for p, r in SHAPES
    ]
    return build_batch(trajectories, [0.0] * len(trajectories), 1)


def _logprobs_and_grads(model, micro):
    model.zero_grad(set_to_none=True)
    lp, ent = token_logprobs(model, micro, with_entropy=True)
    (lp.sum() + ent.sum()).backward()
    return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_packed_row_matches_sdpa_and_separate_sequences():
    sdpa, varlen = _models()
    batch = _batch()
    packed = pack(batch, list(range(batch.size)), 4096)
    assert len(packed) == 1 and packed[0].num_tokens == sum(p + r for p, r in SHAPES)
    lp_a, ent_a, grads_a = _logprobs_and_grads(sdpa, packed[0])
    lp_b, ent_b, grads_b = _logprobs_and_grads(varlen, packed[0])
    torch.testing.assert_close(lp_b, lp_a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent_b, ent_a, rtol=1e-5, atol=1e-5)
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-4, atol=1e-6, msg=name)
    # and each sequence alone (one micro-batch per row) gives the same log-probs
    alone = torch.cat([token_logprobs(sdpa, m)[0].detach() for m in pack(batch, list(range(batch.size)), 1)])
    order = [r for m in pack(batch, list(range(batch.size)), 1) for r in m.rows]
    assert order == sorted(order, key=lambda r: -sum(SHAPES[r]))
    by_row = {}
    offset = 0
    for r in order:
        by_row[r] = alone[offset : offset + SHAPES[r][1]]
        offset += SHAPES[r][1]
    torch.testing.assert_close(lp_b, torch.cat([by_row[r] for r in packed[0].rows]), rtol=1e-5, atol=1e-5)


def test_padded_batches_and_cached_generation_go_through_sdpa_unchanged():
    sdpa, varlen = _models()
    ids = torch.randint(0, 300, (3, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    mask[2, :1] = 0
    with torch.no_grad():
        a = sdpa(input_ids=ids, attention_mask=mask).logits
        b = varlen(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(b[mask.bool()], a[mask.bool()], rtol=1e-5, atol=1e-5)
    gen = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    out_a = sdpa.generate(input_ids=ids, attention_mask=mask, **gen)
    out_b = varlen.generate(input_ids=ids, attention_mask=mask, **gen)
    assert torch.equal(out_a, out_b)
    one = ids[1:2]
    assert torch.equal(sdpa.generate(input_ids=one, **gen), varlen.generate(input_ids=one, **gen))


def test_manifest_option_loads_the_model_with_it(tmp_path):
    from rlcore.manifest.schema import ModelTable
    from rlcore.trainer.models import load_causal_lm

    sdpa, _ = _models()
    sdpa.save_pretrained(tmp_path)
    lm = load_causal_lm(ModelTable(path=str(tmp_path), attn_implementation=NAME), "cpu")
    assert lm.config._attn_implementation == NAME


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16-flash", "fp32-padded"])
def test_cuda_varlen_matches_sdpa(dtype):
    """bfloat16: the flash varlen kernel; float32: one SDPA call over right-padded sequences."""
    sdpa, varlen = _models("cuda", dtype)
    batch = _batch()
    micro = pack(batch, list(range(batch.size)), 4096, "cuda")[0]
    lp_a, ent_a, grads_a = _logprobs_and_grads(sdpa, micro)
    lp_b, ent_b, grads_b = _logprobs_and_grads(varlen, micro)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(lp_b, lp_a, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(ent_b, ent_a, rtol=tolerance, atol=tolerance)
    for name in grads_a:
        if dtype == torch.bfloat16:
            cos = torch.nn.functional.cosine_similarity(
                grads_a[name].float().flatten(), grads_b[name].float().flatten(), dim=0
            )
            assert cos > 0.99, (name, float(cos))
        else:
            torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-3, atol=1e-5, msg=name)


def test_padded_kernel_matches_one_call_per_sequence():
    """The float32 CUDA path (one causal SDPA call over right-padded sequences), run on CPU:
    the same outputs and input gradients as one call per sequence, grouped heads included."""
    from rlcore.trainer.attention import _padded, _per_sequence

    torch.manual_seed(0)
    lengths = [5, 1, 9, 3]
    cu_list = [0]
    for n in lengths:
        cu_list.append(cu_list[-1] + n)
    cu = torch.tensor(cu_list, dtype=torch.int32)
    total = cu_list[-1]
    q = torch.randn(total, 4, 8, requires_grad=True)
    k = torch.randn(total, 2, 8, requires_grad=True)
    v = torch.randn(total, 2, 8, requires_grad=True)
    outs, grads = [], []
    for run in (
        lambda: _padded(q, k, v, cu, cu_list, max(lengths), 0.3),
        lambda: _per_sequence(q, k, v, cu_list, 0.3),
    ):
        out = run()
        weights = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape).sin()
        grads.append(torch.autograd.grad((out * weights).sum(), (q, k, v)))
        outs.append(out.detach())
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
