"""The engine on a CUDA device (skipped without one): sharing, own copy with offload, bfloat16."""

from __future__ import annotations

import pytest
import torch
import transformers
from rlcore_rollout_hf.engine import build
from rlcore_rollout_hf.options import HFEngineOptions

from rlcore.interfaces import BuildContext, SamplingParams
from rlcore.testing.engines import check_rollout_engine

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

VOCAB = 2048


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    return transformers.LlamaForCausalLM(config).eval()


def test_shared_cuda_actor_passes_the_kit_and_matches_generate():
    actor = tiny_llama().cuda()
    engine = build(HFEngineOptions(), BuildContext(actor=actor, device="cuda"))
    assert engine.shares_actor and engine.device.type == "cuda"
    results = check_rollout_engine(engine, vocab_size=VOCAB, reference_model=actor)
    assert set(results.values()) - {"skipped: no tokenizer given"} == {"passed"}, results
    prompt = [5, 6, 7, 8]
    ids = torch.tensor([prompt], device="cuda")
    want = actor.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=10, pad_token_id=0
    )
    got = engine.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=10))[0][0].token_ids
    assert got == want[0, len(prompt) :].tolist()[: len(got)]


def test_own_copy_offloads_on_sleep_and_follows_update_weights(tmp_path):
    source = tiny_llama(0)
    source.save_pretrained(tmp_path / "m")
    engine = build(
        HFEngineOptions(offload_weights=True), BuildContext(model_path=str(tmp_path / "m"), device="cuda")
    )
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    before = engine.generate([[1, 2, 3]], params)
    engine.sleep()
    assert next(engine.model.parameters()).device.type == "cpu"
    engine.wake_up()
    assert next(engine.model.parameters()).device.type == "cuda"
    assert engine.generate([[1, 2, 3]], params)[0][0].token_ids == before[0][0].token_ids
    other = tiny_llama(1)
    engine.update_weights(other.state_dict().items())  # CPU tensors into CUDA parameters
    results = check_rollout_engine(engine, vocab_size=VOCAB, reference_model=other.cuda())
    assert set(results.values()) - {"skipped: no tokenizer given"} == {"passed"}, results


def test_bfloat16_engine_passes_the_kit_at_a_bfloat16_tolerance():
    actor = tiny_llama().cuda().to(torch.bfloat16)
    engine = build(HFEngineOptions(), BuildContext(actor=actor, device="cuda"))
    results = check_rollout_engine(
        engine, vocab_size=VOCAB, reference_model=actor, logprob_atol=0.05, greedy_margin=0.05
    )
    assert set(results.values()) - {"skipped: no tokenizer given"} == {"passed"}, results


def test_cuda_graph_fast_path_equals_the_plain_path_under_refills_and_caps():
    actor = tiny_llama().cuda()
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(3, VOCAB, (int(n),), generator=g).tolist()
        for n in torch.randint(1, 60, (40,), generator=g)
    ]
    caps = torch.randint(1, 40, (40,), generator=g).tolist()
    params = SamplingParams(n=3, temperature=0.0, max_new_tokens=40, stop_token_ids=[7, 11])
    results = {}
    for name, options in {
        "plain": dict(fast_path="off"),
        "graphs": dict(max_batch_size=32, sync_every=5),
    }.items():
        engine = build(HFEngineOptions(**options), BuildContext(actor=actor, device="cuda"))
        assert (engine.fast is not None) == (name == "graphs")
        results[name] = [
            (c.token_ids, c.finish_reason) for group in engine.generate(prompts, params, caps) for c in group
        ]
        if engine.fast is not None:
            assert (
                engine.fast.use_graphs and engine.fast.workspace.graphs
            )  # graphs were captured and replayed
    assert results["graphs"] == results["plain"]
    sampled = SamplingParams(n=4, temperature=1.0, max_new_tokens=40, seed=5)
    engine = build(HFEngineOptions(max_batch_size=32), BuildContext(actor=actor, device="cuda"))
    first = engine.generate(prompts, sampled, caps)
    assert [[c.token_ids for c in g] for g in first] == [
        [c.token_ids for c in g] for g in engine.generate(prompts, sampled, caps)
    ]
    assert [len(c.token_ids) for group in first for c in group] == [cap for cap in caps for _ in range(4)]


def test_lora_adapters_on_the_graphed_fast_path_equal_peft_and_follow_disabling():
    """Adapters as direct products (q/k/v fused with theirs) inside CUDA graphs: the same greedy
    tokens as peft's own forward (float32, so that no bf16 near-tie decides); disabling them (same
    tensors, other products) re-captures."""
    peft = pytest.importorskip("peft")
    actor = peft.get_peft_model(
        tiny_llama(),
        peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False),
    )
    actor = actor.to("cuda").eval()
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12] * 20]
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=16)
    engine = build(HFEngineOptions(max_batch_size=8), BuildContext(actor=actor, device="cuda"))
    plain = build(HFEngineOptions(fast_path="off"), BuildContext(actor=actor, device="cuda"))

    def tokens(e):
        return [c.token_ids for group in e.generate(prompts, params) for c in group]

    adapted = tokens(engine)
    assert engine.fast.workspace.graphs and all(p.qkv.a is not None for p in engine.fast.decoder.plans)
    assert adapted == tokens(plain)
    with actor.disable_adapter():
        base = tokens(engine)
        assert base == tokens(plain) != adapted
    assert tokens(engine) == adapted


@pytest.mark.parametrize(
    "batch,kv_heads,groups,head_dim,capacity",
    [
        (1, 2, 7, 64, 128),
        (3, 2, 6, 128, 384),
        (64, 4, 7, 128, 1536),
        (256, 2, 8, 128, 384),
        (300, 4, 7, 128, 200),
    ],
)
def test_triton_decode_attention_matches_the_sdpa_reference(batch, kv_heads, groups, head_dim, capacity):
    from rlcore_rollout_hf.decode_attention import decode_attention, sdpa_decode_attention, splits_for, usable

    if not usable(torch.device("cuda"), head_dim):
        pytest.skip("Triton is not installed")
    g = torch.Generator(device="cuda").manual_seed(batch)
    rows = batch + 3  # the cache has more rows than the batch uses
    q = torch.randn(batch, kv_heads, groups, head_dim, device="cuda", generator=g).bfloat16()
    keys = torch.randn(rows, kv_heads, capacity, head_dim, device="cuda", generator=g).bfloat16()
    values = torch.randn(rows, kv_heads, capacity, head_dim, device="cuda", generator=g).bfloat16()
    positions = torch.randint(0, capacity, (batch,), device="cuda", generator=g)
    positions[0], positions[-1] = 0, capacity - 1
    scale = head_dim**-0.5
    reference = sdpa_decode_attention(q.double(), keys.double(), values.double(), positions, scale)

    def error(out):
        assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
        return ((out.double() - reference).norm() / reference.norm()).item()

    assert error(decode_attention(q, keys, values, positions, scale, "triton")) < 1e-2
    assert error(decode_attention(q, keys, values, positions, scale, "sdpa")) < 1e-2
    assert splits_for(batch, kv_heads, capacity) >= 1
    # Keys after a row's position must not count: poisoning them changes nothing.
    poisoned_k, poisoned_v = keys.clone(), values.clone()
    after = torch.arange(capacity, device="cuda")[None, :] > positions[:, None]
    poisoned_k[:batch].masked_fill_(after[:, None, :, None], 30.0)
    poisoned_v[:batch].masked_fill_(after[:, None, :, None], float("nan"))
    assert error(decode_attention(q, poisoned_k, poisoned_v, positions, scale, "triton")) < 1e-2
    # Captured in a CUDA graph, a replay follows the positions written into the captured tensor.
    out = torch.empty_like(q)
    decode_attention(q, keys, values, positions, scale, "triton")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(decode_attention(q, keys, values, positions, scale, "triton"))
    new_positions = torch.randint(0, capacity, (batch,), device="cuda", generator=g)
    positions.copy_(new_positions)
    out.fill_(float("nan"))
    graph.replay()
    reference = sdpa_decode_attention(q.double(), keys.double(), values.double(), new_positions, scale)
    assert error(out) < 1e-2


def test_fast_path_with_the_triton_attention_equals_the_sdpa_one():
    """float32 (the kernel's products are IEEE there): greedy tokens identical, log-probs to rounding,
    through graphs, compiled layers, refills and compaction."""
    from rlcore_rollout_hf.decode_attention import usable

    if not usable(torch.device("cuda"), 16):
        pytest.skip("Triton is not installed")
    actor = tiny_llama().cuda()
    g = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(3, VOCAB, (int(n),), generator=g).tolist()
        for n in torch.randint(1, 90, (40,), generator=g)
    ]
    caps = torch.randint(1, 60, (40,), generator=g).tolist()
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=60, stop_token_ids=[7])
    out = {}
    for kernel in ("triton", "sdpa"):
        engine = build(
            HFEngineOptions(max_batch_size=32, sync_every=4, decode_attention=kernel, compile=True),
            BuildContext(actor=actor, device="cuda"),
        )
        assert engine.fast.decoder.attention == kernel
        out[kernel] = [c for group in engine.generate(prompts, params, caps) for c in group]
    assert [c.token_ids for c in out["triton"]] == [c.token_ids for c in out["sdpa"]]
    gap = max(abs(a - b) for x, y in zip(out["triton"], out["sdpa"]) for a, b in zip(x.logprobs, y.logprobs))
    assert gap < 1e-4, gap
