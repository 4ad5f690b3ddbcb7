"""The fast path (slot cache, continuous batching) against the plain path: the same greedy tokens
and log-probs for every supported architecture, under refills, compaction and per-prompt caps,
with its products fused (q/k/v, gate/up) and adapters unmerged."""

from __future__ import annotations

import shutil

import pytest
import torch
import transformers
from rlcore_rollout_hf.decoder import unsupported_reason
from rlcore_rollout_hf.engine import HFRolloutEngine
from rlcore_rollout_hf.layout import lay_out_gate_up, place_back_to_back
from rlcore_rollout_hf.options import HFEngineOptions
from rlcore_rollout_hf.projections import stacked
from rlcore_rollout_hf.sampling import sample_with_uniform

from rlcore.errors import UsageError
from rlcore.interfaces import SamplingParams
from rlcore.testing.engines import check_rollout_engine

VOCAB = 512
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    bos_token_id=1,
    eos_token_id=2,
)
ARCHITECTURES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),  # q/k/v biases
    "qwen3": (
        transformers.Qwen3Config,
        transformers.Qwen3ForCausalLM,
        {"head_dim": 24},
    ),  # q/k norms, wide heads
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {"sliding_window": None}),
}


def build(kind: str, seed: int = 0):
    config_class, model_class, extra = ARCHITECTURES[kind]
    torch.manual_seed(seed)
    return model_class(config_class(**COMMON, **extra)).eval()


def prompts(count: int = 5, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, VOCAB, (int(n),), generator=g).tolist()
        for n in torch.randint(1, 40, (count,), generator=g)
    ]


def run(model, items, params, caps=None, **options):
    engine = HFRolloutEngine(model, options=HFEngineOptions(**options))
    return engine.generate(items, params, max_new_tokens=caps)


def flat(out):
    return [(c.token_ids, c.finish_reason) for group in out for c in group]


def largest_logprob_gap(a, b) -> float:
    return max(abs(x - y) for g, h in zip(a, b) for c, d in zip(g, h) for x, y in zip(c.logprobs, d.logprobs))


@pytest.mark.parametrize("kind", sorted(ARCHITECTURES))
@pytest.mark.parametrize(
    "options",
    [dict(), dict(max_batch_size=4, sync_every=3), dict(max_batch_size=7, sync_every=1, share_prefill=False)],
    ids=["one-batch", "refills", "refills-unshared"],
)
def test_greedy_tokens_and_logprobs_equal_the_plain_path(kind, options):
    model = build(kind)
    assert unsupported_reason(model) is None
    items = prompts()
    # Stopping on a token that greedy decoding really produces exercises the device-side stops.
    params = SamplingParams(n=3, temperature=0.0, max_new_tokens=24)
    plain = run(model, items, params, fast_path="off", **options)
    stop = plain[1][0].token_ids[5]
    params = params.model_copy(update={"stop_token_ids": [stop]})
    plain = run(model, items, params, fast_path="off", **options)
    fast = run(model, items, params, fast_path="on", **options)
    assert flat(fast) == flat(plain)
    assert any(reason == "stop" for _, reason in flat(fast)) and any(
        reason == "length" for _, reason in flat(fast)
    )
    assert largest_logprob_gap(fast, plain) < 1e-4


def test_per_prompt_caps_and_varied_lengths_with_refills():
    model = build("qwen2")
    items = prompts(9, seed=1)
    caps = [1, 5, 24, 2, 13, 7, 24, 3, 11]
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=24, seed=4)
    fast = run(model, items, params, caps=caps, fast_path="on", max_batch_size=6, sync_every=4)
    assert [[len(c.token_ids) for c in group] for group in fast] == [[cap, cap] for cap in caps]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    assert flat(run(model, items, greedy, caps=caps, fast_path="on", max_batch_size=6)) == flat(
        run(model, items, greedy, caps=caps, fast_path="off")
    )
    with pytest.raises(UsageError, match="max_new_tokens has 2 entries for 9 prompts"):
        run(model, items, greedy, caps=[3, 4], fast_path="on")


def test_sampling_is_reproducible_and_log_probs_match_a_teacher_forced_forward():
    model = build("llama")
    items = prompts(3, seed=2)
    params = SamplingParams(n=2, temperature=0.8, top_k=40, top_p=0.9, max_new_tokens=12, seed=11)
    first = run(model, items, params, fast_path="on", max_batch_size=4)
    assert flat(first) == flat(run(model, items, params, fast_path="on", max_batch_size=4))
    for prompt, group in zip(items, first):
        for c in group:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1 : -1]
            want = (
                torch.log_softmax(logits.float() / 0.8, -1)
                .gather(-1, torch.tensor(c.token_ids)[:, None])
                .squeeze(-1)
            )
            assert torch.allclose(torch.tensor(c.logprobs), want, atol=1e-4)


def lora_model(kind: str, seed: int = 0, **config):
    """A peft LoRA model whose adapters change the output (B initialised non-zero)."""
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(build(kind), peft.LoraConfig(r=4, lora_alpha=8, **config))
    torch.manual_seed(seed)
    for name, tensor in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(tensor, std=0.5)
    return model


def test_lora_adapters_apply_on_the_fast_path():
    model = lora_model("llama", target_modules="all-linear")  # the CPU default: q, k and v apart
    items = prompts(4, seed=3)
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=16)
    fast = run(model, items, params, fast_path="on")
    assert flat(fast) == flat(run(model, items, params, fast_path="off"))
    with model.disable_adapter():
        assert flat(run(model, items, params, fast_path="on")) != flat(fast)


def test_in_place_weight_updates_are_seen_and_sleep_frees_the_workspace():
    model = build("llama")
    items = prompts(3, seed=5)
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=10)
    engine = HFRolloutEngine(model, options=HFEngineOptions(fast_path="on"))
    before = engine.generate(items, params)
    assert engine.fast.workspace is not None
    with torch.no_grad():  # what an optimizer step does: the same tensors, new values
        for tensor in model.parameters():
            tensor.add_(torch.randn_like(tensor) * 0.2)
    after = engine.generate(items, params)
    assert flat(after) != flat(before)
    assert flat(after) == flat(run(model, items, params, fast_path="off"))
    engine.sleep()
    assert engine.fast.workspace is None  # auto on CPU: released
    engine.wake_up()
    assert flat(engine.generate(items, params)) == flat(after)
    keeper = HFRolloutEngine(model, options=HFEngineOptions(fast_path="on", release_cache_on_sleep="never"))
    keeper.generate(items, params)
    workspace = keeper.fast.workspace
    keeper.sleep()
    keeper.wake_up()
    assert keeper.fast.workspace is workspace and flat(keeper.generate(items, params)) == flat(after)


def test_unsupported_architectures_fall_back_or_are_refused():
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2)
    ).eval()
    assert "model_type 'gpt2'" in unsupported_reason(gpt2)
    with pytest.raises(UsageError, match="fast_path = \"on\" cannot run this model: model_type 'gpt2'"):
        HFRolloutEngine(gpt2, options=HFEngineOptions(fast_path="on"))
    assert HFRolloutEngine(gpt2, options=HFEngineOptions(fast_path="auto")).fast is None  # CPU: plain path
    windowed = transformers.MistralForCausalLM(transformers.MistralConfig(**COMMON, sliding_window=16))
    assert "sliding-window" in unsupported_reason(windowed)


def test_the_fast_path_passes_the_engine_conformance_kit():
    model = build("qwen2")
    engine = HFRolloutEngine(model, options=HFEngineOptions(fast_path="on", max_batch_size=8))
    assert (
        not engine.fast.compiled and engine.fast.sample is sample_with_uniform
    )  # compile = "auto": off on CPU
    results = check_rollout_engine(engine, vocab_size=VOCAB, reference_model=model)
    assert set(results.values()) - {"skipped: no tokenizer given"} == {"passed"}, results


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_decode_layers_give_the_same_tokens():
    model = build("qwen2")
    items = prompts(3, seed=6)
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=8)
    engine = HFRolloutEngine(model, options=HFEngineOptions(fast_path="on", compile=True, max_batch_size=8))
    out = engine.generate(items, params)
    assert engine.fast.compiled, "compilation failed and the engine fell back to uncompiled layers"
    assert flat(out) == flat(run(model, items, params, fast_path="off"))
    # Sampling runs compiled too: the same seed draws the same tokens as the uncompiled fast path.
    sampled = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=3)
    compiled_out = engine.generate(items, sampled)
    eager_out = run(model, items, sampled, fast_path="on", max_batch_size=8)
    assert engine.fast.sample is not sample_with_uniform
    assert flat(compiled_out) == flat(eager_out)
    assert largest_logprob_gap(compiled_out, eager_out) < 1e-4


def test_the_triton_decode_attention_is_refused_where_it_cannot_run_and_auto_falls_back():
    model = build("llama")
    with pytest.raises(UsageError, match="decode_attention"):
        HFRolloutEngine(model, options=HFEngineOptions(fast_path="on", decode_attention="triton"))
    engine = HFRolloutEngine(model, options=HFEngineOptions(fast_path="on"))
    assert engine.fast.decoder.attention == "sdpa"  # on CPU


@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # without and with q/k/v biases
def test_fused_qkv_projections_follow_in_place_updates(kind):
    from rlcore_rollout_hf.projections import QKVCopies

    model = build(kind)
    items = prompts(4, seed=7)
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=12)
    engine = HFRolloutEngine(model, options=HFEngineOptions(fast_path="on"))
    assert engine.fast.decoder.fused is None  # CPU default: separate products
    engine.fast.decoder.fused = QKVCopies()  # as on CUDA
    plain = flat(run(model, items, params, fast_path="off"))
    assert flat(engine.generate(items, params)) == plain
    assert all(plan.qkv is not None and plan.qkv.a is None for plan in engine.fast.decoder.plans)
    with torch.no_grad():  # an optimizer step: the fused copies must follow
        for tensor in model.parameters():
            tensor.add_(torch.randn_like(tensor) * 0.2)
    assert flat(engine.generate(items, params)) == flat(run(model, items, params, fast_path="off")) != plain


def fast_engine_fused(model) -> HFRolloutEngine:
    """The fast path with the products fused as on CUDA (q/k/v as one, gate/up as one)."""
    return HFRolloutEngine(model, options=HFEngineOptions(fast_path="on", fuse_projections=True))


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize(
    "targets",
    ["all-linear", ["q_proj", "v_proj", "down_proj"]],  # k without an adapter: a zero block in the fused B
    ids=["all-linear", "q-v-down"],
)
def test_lora_projections_run_unmerged_and_fused_and_match_peft(kind, targets):
    model = lora_model(kind, target_modules=targets)
    items = prompts(4, seed=3)
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=16)
    engine = fast_engine_fused(model)
    plain = run(model, items, params, fast_path="off")  # peft's own forward
    fast = engine.generate(items, params)
    assert flat(fast) == flat(plain) and largest_logprob_gap(fast, plain) < 1e-4
    for plan in engine.fast.decoder.plans:  # the direct products ran, adapters included
        rank = 12 if targets == "all-linear" else 8
        assert plan.qkv is not None and plan.qkv.a.shape[0] == rank and plan.qkv.scale == 2.0
        assert (plan.o.a is not None) == (targets == "all-linear") and plan.mlp.down.a is not None
        assert plan.mlp.gate_up is not None and (plan.mlp.gate.a is not None) == (targets == "all-linear")
    # An optimizer step moves the adapters in place: the fused copies follow.
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "lora_" in name:
                tensor.add_(torch.randn_like(tensor) * 0.3)
    moved = engine.generate(items, params)
    assert flat(moved) == flat(run(model, items, params, fast_path="off")) != flat(fast)
    # Disabled adapters: the base alone (fused without adapter blocks), as peft computes it.
    with model.disable_adapter():
        base = engine.generate(items, params)
        assert all(plan.qkv.a is None for plan in engine.fast.decoder.plans)
        assert flat(base) == flat(run(model, items, params, fast_path="off")) != flat(moved)
    # Merged into the base weights: the base alone again, which now holds the adapters.
    model.merge_adapter()
    merged = engine.generate(items, params)
    assert all(plan.qkv.a is None for plan in engine.fast.decoder.plans)
    assert flat(merged) == flat(moved)
    model.unmerge_adapter()
    # And calling the modules themselves (what the fast path did before) gives the same.
    engine.fast.decoder.direct = False
    assert flat(engine.generate(items, params)) == flat(moved) and engine.fast.decoder.plans is None


def test_lora_layers_that_the_direct_products_cannot_reproduce_are_called_as_modules():
    from rlcore_rollout_hf.projections import as_linear

    items = prompts(3, seed=4)
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=10)
    dora = lora_model("llama", target_modules=["q_proj", "o_proj"], use_dora=True)
    engine = fast_engine_fused(dora)
    assert flat(engine.generate(items, params)) == flat(run(dora, items, params, fast_path="off"))
    plans = engine.fast.decoder.plans
    assert all(p.q is None and p.qkv is None and p.o is None and p.k is not None for p in plans)
    scaled = lora_model("qwen2", target_modules=["q_proj", "k_proj"], alpha_pattern={"k_proj": 16})
    engine = fast_engine_fused(scaled)  # two scales in one layer: q, k and v apart, adapters unmerged
    assert flat(engine.generate(items, params)) == flat(run(scaled, items, params, fast_path="off"))
    assert all(p.qkv is None and p.q.scale == 2.0 and p.k.scale == 4.0 for p in engine.fast.decoder.plans)
    dropping = lora_model("llama", target_modules=["q_proj"], lora_dropout=0.1)
    layer = dropping.get_base_model().model.layers[0].self_attn.q_proj
    dropping.eval()  # as the engine generates: the dropout is not at work
    assert as_linear(layer) is not None
    dropping.train()
    assert as_linear(layer) is None


def test_a_compiler_failure_in_prefill_or_decode_falls_back_to_the_uncompiled_layers():
    from loguru import logger

    model = build("qwen2")
    items = prompts(3, seed=8)
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=6)
    engine = HFRolloutEngine(model, options=HFEngineOptions(fast_path="on", max_batch_size=8))
    decoder = engine.fast.decoder

    def compiler_failure(*args, **kwargs):
        raise RuntimeError("inductor: simulated failure")

    # As compile_layers(True) leaves them, but the first call fails as a broken compiler would.
    decoder.prefill_layer = decoder.layer_step = compiler_failure
    assert engine.fast.compiled
    warnings: list[str] = []
    sink = logger.add(warnings.append, level="WARNING")
    try:
        out = engine.generate(items, params)
    finally:
        logger.remove(sink)
    assert not engine.fast.compiled
    assert len(warnings) == 1 and "simulated failure" in warnings[0]
    assert decoder.prefill_layer == decoder._prefill_layer and decoder.layer_step == decoder._layer_step
    assert flat(out) == flat(run(model, items, params, fast_path="off"))


# ---------------------------------------------------------------------- gate and up as one product
# The engine moves each layer's gate and up weights back to back in memory (the same parameters,
# the same values) and multiplies them at once: generation must not change, and neither may
# anything the trainer does with those parameters afterwards.

LAYOUT_PARAMS = SamplingParams(n=2, temperature=0.0, max_new_tokens=12)


def gate_up(model, index: int = 0):
    mlp = model.model.layers[index].mlp
    return mlp.gate_proj.weight, mlp.up_proj.weight


def fused_engine(model, fuse=True) -> HFRolloutEngine:
    return HFRolloutEngine(model, options=HFEngineOptions(fast_path="on", fuse_projections=fuse))


def test_stacked_is_a_view_only_of_tensors_back_to_back():
    block = torch.arange(24.0).reshape(6, 4)
    top, bottom = block[:2], block[2:]
    view = stacked([top, bottom])
    assert view is not None and view.data_ptr() == block.data_ptr() and torch.equal(view, block)
    assert stacked([bottom, top]) is None  # the wrong order
    assert stacked([block[:2], block[3:]]) is None  # a gap
    assert stacked([top, torch.zeros(4, 4)]) is None  # another storage
    assert stacked([block[:, :2], block[:, 2:]]) is None  # not contiguous
    assert stacked([top.double(), bottom.double()]) is None  # copies: no longer one storage


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral"])
def test_gate_and_up_as_one_product_generate_the_same_and_keep_the_parameters(kind):
    model = build(kind)
    items = prompts(4, seed=11)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    objects = dict(model.named_parameters())
    plain = run(model, items, LAYOUT_PARAMS, fast_path="off")
    engine = fused_engine(model)
    fast = engine.generate(items, LAYOUT_PARAMS)
    assert flat(fast) == flat(plain) and largest_logprob_gap(fast, plain) < 1e-4
    assert all(plan.mlp.gate_up is not None for plan in engine.fast.decoder.plans)
    # Moved, not copied: the same parameter objects with the same values, now back to back.
    assert dict(model.named_parameters()) == objects
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    assert all(stacked(list(gate_up(model, i))) is not None for i in range(len(model.model.layers)))
    assert all(p.requires_grad and p.is_leaf for p in objects.values())
    unfused = fused_engine(model, fuse=False)
    assert flat(unfused.generate(items, LAYOUT_PARAMS)) == flat(fast)
    assert all(plan.mlp.gate_up is None for plan in unfused.fast.decoder.plans)


def test_the_fused_product_follows_an_optimizer_step_and_a_move_of_the_weights():
    model = build("llama")
    items = prompts(3, seed=12)
    engine = fused_engine(model)
    first = engine.generate(items, LAYOUT_PARAMS)
    gate, up = gate_up(model)
    # A trainer's step: gradients and AdamW on the moved parameters (in place, as optimizers do).
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    model(torch.tensor(items[0])[None], labels=torch.tensor(items[0])[None]).loss.backward()
    assert gate.grad is not None and gate.grad.data_ptr() != gate.data_ptr()
    optimizer.step()
    model.eval()
    assert stacked([gate, up]) is not None  # still back to back: updated in place
    stepped = engine.generate(items, LAYOUT_PARAMS)
    assert flat(stepped) == flat(run(model, items, LAYOUT_PARAMS, fast_path="off")) != flat(first)
    # Something gives the parameters new storage (an offload round trip, .to()): laid out again.
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data + torch.randn_like(param) * 0.2  # a new tensor
    assert stacked([gate, up]) is None
    moved = engine.generate(items, LAYOUT_PARAMS)
    assert stacked([gate, up]) is not None
    assert flat(moved) == flat(run(model, items, LAYOUT_PARAMS, fast_path="off")) != flat(stepped)


def test_a_model_saved_after_the_move_loads_back_the_same(tmp_path):
    model = build("qwen2")
    fused_engine(model).generate(prompts(2), LAYOUT_PARAMS)
    assert stacked(list(gate_up(model))) is not None
    model.save_pretrained(tmp_path)  # safetensors: tensors sharing a storage are cloned apart
    loaded = type(model).from_pretrained(tmp_path)
    assert all(torch.equal(p, loaded.state_dict()[name]) for name, p in model.state_dict().items())


def test_what_cannot_move_stays_where_it_is():
    model = build("llama")
    gate, up = gate_up(model)
    up.data = up.data.double()  # another dtype: no common allocation
    assert lay_out_gate_up(model, list(model.model.layers)) == 1  # the other layer moved
    assert stacked([gate, up]) is None and gate.dtype == torch.float32
    meta = torch.nn.Parameter(torch.empty(3, 4, device="meta"))
    assert not place_back_to_back([meta, torch.nn.Parameter(torch.zeros(3, 4))])
    pieces = [torch.nn.Parameter(torch.randn(2, 4)) for _ in range(3)]
    values = [p.detach().clone() for p in pieces]
    assert place_back_to_back(pieces) and not place_back_to_back(pieces)  # once
    assert all(torch.equal(p, v) for p, v in zip(pieces, values)) and stacked(pieces) is not None


def test_parameters_that_fsdp_manages_are_left_where_they_are():
    """FSDP frees and refills its parameters' storage itself: moving them would break it."""
    from torch.distributed.fsdp import FSDPModule

    model = build("llama")
    layer = model.model.layers[0]
    layer.__class__ = type("FSDPLlamaDecoderLayer", (FSDPModule, type(layer)), {})  # what fully_shard makes
    assert lay_out_gate_up(model, list(model.model.layers)) == 0
    assert all(stacked(list(gate_up(model, i))) is None for i in range(len(model.model.layers)))


def test_the_move_happens_outside_inference_mode():
    """The engine generates under inference mode; the moved parameters must stay usable for autograd."""
    model = build("llama")
    with torch.inference_mode():
        fused_engine(model).generate(prompts(2), LAYOUT_PARAMS)
    gate, _ = gate_up(model)
    assert not gate.is_inference()
    model(torch.tensor([[3, 4, 5]]), labels=torch.tensor([[3, 4, 5]])).loss.backward()
    assert gate.grad is not None
