"""Where the hf engine's weights come from: the shared actor (no copy), its own loaded copy
(update_weights copies in), a copy of the actor; and the conformance kit on each."""

from __future__ import annotations

import pytest
import torch
from rlcore_rollout_hf.engine import build
from rlcore_rollout_hf.options import HFEngineOptions
from rlcore_rollout_hf.weights import canonical_name

from rlcore.errors import UsageError
from rlcore.interfaces import BuildContext, SamplingParams
from rlcore.testing.engines import check_rollout_engine

peft = pytest.importorskip("peft")

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


def greedy_tokens(engine, prompts):
    return [g[0].token_ids for g in engine.generate(prompts, GREEDY)]


def hf_greedy(model, prompts, max_new_tokens=8):
    outs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=0,
        )
        outs.append(out[0, len(prompt) :].tolist())
    return outs


def lora(model, seed=0):
    """A peft LoRA model whose adapters change the outputs (B initialised non-zero)."""
    torch.manual_seed(seed)
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
    )
    return peft.get_peft_model(model, config)


def test_shared_actor_is_used_without_a_copy(tiny, tokenizer, chat_prompts):
    engine = build(HFEngineOptions(), BuildContext(actor=tiny, tokenizer=tokenizer))
    assert engine.shares_actor and engine.model is tiny
    before = greedy_tokens(engine, chat_prompts)
    with torch.no_grad():  # the trainer's optimizer step, in place
        tiny.lm_head.weight.copy_(tiny.lm_head.weight.roll(1, dims=0))
    after = greedy_tokens(engine, chat_prompts)
    assert after != before and after == hf_greedy(tiny, chat_prompts)

    def never_consumed():
        raise AssertionError("update_weights consumed the tensors although it shares the actor")
        yield

    engine.update_weights(never_consumed())
    results = check_rollout_engine(
        engine, vocab_size=len(tokenizer), tokenizer=tokenizer, reference_model=tiny, prompts=chat_prompts
    )
    assert set(results.values()) == {"passed"}, results


def test_shared_peft_actor_with_gradient_checkpointing_then_trains(tiny, tokenizer, chat_prompts):
    actor = lora(tiny)
    enable = getattr(tiny, "activation_checkpointing_enable", None) or tiny.gradient_checkpointing_enable
    enable()
    tiny.config.use_cache = False
    actor.train()
    engine = build(HFEngineOptions(), BuildContext(actor=actor, tokenizer=tokenizer))
    assert engine.shares_actor
    with actor.disable_adapter():
        base = hf_greedy(actor, chat_prompts)
    adapted = greedy_tokens(engine, chat_prompts)
    assert adapted != base
    assert actor.training
    results = check_rollout_engine(
        engine, vocab_size=len(tokenizer), tokenizer=tokenizer, reference_model=actor, prompts=chat_prompts
    )
    assert set(results.values()) == {"passed"}, results
    # Generation left nothing behind that breaks a training step (e.g. inference tensors).
    ids = torch.tensor([chat_prompts[0] + adapted[0]])
    loss = actor(input_ids=ids, labels=ids).loss
    loss.backward()
    assert any(p.grad is not None for n, p in actor.named_parameters() if "lora_" in n)


def test_own_model_loaded_from_a_path_and_updated_from_another_model(
    tiny, other_tiny, tokenizer, chat_prompts, tmp_path
):
    tiny.save_pretrained(tmp_path / "model")
    context = BuildContext(model_path=str(tmp_path / "model"), tokenizer=tokenizer, actor=None)
    engine = build(HFEngineOptions(), context)
    assert not engine.shares_actor and engine.model is not tiny
    assert greedy_tokens(engine, chat_prompts) == hf_greedy(tiny, chat_prompts)
    engine.update_weights(other_tiny.state_dict().items())
    assert greedy_tokens(engine, chat_prompts) == hf_greedy(other_tiny, chat_prompts)
    results = check_rollout_engine(
        engine,
        vocab_size=len(tokenizer),
        tokenizer=tokenizer,
        reference_model=other_tiny,
        prompts=chat_prompts,
    )
    assert set(results.values()) == {"passed"}, results


def test_update_weights_accepts_merged_peft_names(tiny, other_tiny, tokenizer, chat_prompts):
    engine = build(HFEngineOptions(share_actor=False), BuildContext(actor=tiny, tokenizer=tokenizer))
    assert not engine.shares_actor  # a copy of the actor
    trained = lora(other_tiny, seed=3)
    want = hf_greedy(trained, chat_prompts)  # with adapters
    trained.merge_adapter()  # merged in place: names keep peft's prefixes and .base_layer
    named = [(n, p) for n, p in trained.named_parameters() if "lora_" not in n]
    assert any(n.startswith("base_model.model.") and ".base_layer." in n for n, _ in named)
    engine.update_weights(named)
    assert greedy_tokens(engine, chat_prompts) == want


def test_update_weights_errors_name_the_tensor(tiny, tokenizer):
    engine = build(HFEngineOptions(share_actor=False), BuildContext(actor=tiny))
    trained = lora(tiny)
    lora_name, lora_tensor = next((n, p) for n, p in trained.named_parameters() if "lora_A" in n)
    with pytest.raises(UsageError, match="unmerged LoRA tensor .*lora_A"):
        engine.update_weights([(lora_name, lora_tensor)])
    with pytest.raises(UsageError, match="'model.nope.weight'.*model does not have"):
        engine.update_weights({"model.nope.weight": torch.zeros(2)})
    with pytest.raises(UsageError, match=r"shape \(3,\)"):
        engine.update_weights([("lm_head.weight", torch.zeros(3))])


def test_a_copied_actor_follows_only_update_weights(tiny, tokenizer, chat_prompts):
    engine = build(HFEngineOptions(share_actor=False, dtype="float32"), BuildContext(actor=tiny))
    before = greedy_tokens(engine, chat_prompts)
    with torch.no_grad():
        tiny.lm_head.weight.copy_(tiny.lm_head.weight.roll(1, dims=0))
    assert greedy_tokens(engine, chat_prompts) == before
    engine.update_weights(tiny.named_parameters())
    assert greedy_tokens(engine, chat_prompts) == hf_greedy(tiny, chat_prompts)


def test_dtype_override_and_load_errors(tiny, tmp_path):
    tiny.save_pretrained(tmp_path / "m")
    engine = build(HFEngineOptions(dtype="bfloat16"), BuildContext(model_path=str(tmp_path / "m")))
    assert next(engine.model.parameters()).dtype == torch.bfloat16
    out = engine.generate([[5, 6, 7]], SamplingParams(temperature=1.0, max_new_tokens=4, seed=0))
    assert len(out[0][0].token_ids) == 4
    with pytest.raises(UsageError, match="could not load \\[model\\] path .*missing"):
        build(HFEngineOptions(), BuildContext(model_path=str(tmp_path / "missing")))
    with pytest.raises(UsageError, match="needs a model"):
        build(HFEngineOptions(), BuildContext())


@pytest.mark.parametrize(
    "name, want",
    [
        ("model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"),
        (
            "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight",
            "model.layers.0.self_attn.q_proj.weight",
        ),
        ("_orig_mod.module.lm_head.weight", "lm_head.weight"),
        (
            "model.layers.1._checkpoint_wrapped_module.mlp.down_proj.weight",
            "model.layers.1.mlp.down_proj.weight",
        ),
        ("base_model.model.lm_head.modules_to_save.default.weight", "lm_head.weight"),
        ("base_model.model.lm_head.original_module.weight", None),
    ],
)
def test_canonical_names(name, want):
    assert canonical_name(name) == want


@pytest.mark.parametrize("fast_path", ["on", "off"])
def test_update_weights_with_lora_loads_the_adapter_alone(tiny, tokenizer, chat_prompts, tmp_path, fast_path):
    import copy

    from rlcore.trainer.lora import adapter_spec, adapter_state, takes_adapters

    tiny.save_pretrained(tmp_path / "model")
    engine = build(
        HFEngineOptions(fast_path=fast_path),
        BuildContext(model_path=str(tmp_path / "model"), tokenizer=tokenizer),
    )
    base = {k: v.clone() for k, v in engine.model.state_dict().items()}
    trained = lora(copy.deepcopy(tiny), seed=3)
    assert takes_adapters(engine)
    for _ in range(2):  # the first sync injects the LoRA layers, the second loads new values into them
        with torch.no_grad():
            for name, tensor in trained.named_parameters():
                if "lora_B" in name:
                    tensor.normal_(std=0.3)
        sent = list(adapter_state(trained))
        assert sent and all("lora_" in name for name, _ in sent)
        engine.update_weights(sent, lora=adapter_spec(trained))
        assert greedy_tokens(engine, chat_prompts) == hf_greedy(trained, chat_prompts)
    kept = {
        canonical_name(k): v
        for k, v in engine.model.get_base_model().state_dict().items()
        if "lora_" not in k
    }
    assert all(torch.equal(kept[k], v) for k, v in base.items())  # the base weights were not touched
    if fast_path == "on":  # the adapters ran as direct products, not through peft's modules
        assert all(plan.q.a is not None and plan.v.a is not None for plan in engine.fast.decoder.plans)
    with pytest.raises(UsageError, match="only LoRA adapter tensors"):
        engine.update_weights([("model.norm.weight", torch.ones(4))], lora=adapter_spec(trained))


def test_a_bfloat16_engine_loads_bfloat16_adapters(tiny, tokenizer, chat_prompts, tmp_path):
    """peft would make the injected adapters float32 over a bfloat16 base; kept in bfloat16 they are
    what the trainer computes with, and the fast path runs them as direct products."""
    from rlcore.trainer.lora import adapter_spec, adapter_state

    tiny.to(torch.bfloat16).save_pretrained(tmp_path / "model")
    engine = build(
        HFEngineOptions(fast_path="on", dtype="bfloat16"),
        BuildContext(model_path=str(tmp_path / "model"), tokenizer=tokenizer),
    )
    trained = lora(tiny, seed=3).to(torch.bfloat16)
    engine.update_weights(list(adapter_state(trained)), lora=adapter_spec(trained))
    adapters = [p for n, p in engine.model.named_parameters() if "lora_" in n]
    assert adapters and all(p.dtype == torch.bfloat16 for p in adapters)
    greedy_tokens(engine, chat_prompts)
    assert all(plan.q.a is not None for plan in engine.fast.decoder.plans)
