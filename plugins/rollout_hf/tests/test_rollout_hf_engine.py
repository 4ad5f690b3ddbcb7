"""The hf engine's sampling against transformers itself: greedy, log-probs, prefill sharing,
batching, stops, seeds -- on the plain path and on the fast path."""

from __future__ import annotations

import pytest
import torch
from rlcore_rollout_hf.engine import HFRolloutEngine
from rlcore_rollout_hf.options import HFEngineOptions

from rlcore.errors import RlcoreError, UsageError
from rlcore.interfaces import SamplingParams

# Every test here runs on both paths: the plain one (the model's forward with a DynamicCache) and
# the fast one (slot cache, continuous batching; CUDA graphs only on CUDA).
ENGINE_DEFAULTS: dict = {}


@pytest.fixture(autouse=True, params=["off", "on"], ids=["plain", "fast"])
def fast_path(request, monkeypatch):
    monkeypatch.setitem(ENGINE_DEFAULTS, "fast_path", request.param)
    return request.param


def engine_for(model, tokenizer=None, **options):
    return HFRolloutEngine(
        model, tokenizer=tokenizer, options=HFEngineOptions(**{**ENGINE_DEFAULTS, **options})
    )


def hf_greedy(model, prompt, max_new_tokens):
    """transformers' own greedy continuation of one unpadded prompt."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def teacher_forced(model, prompt, response, temperature):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), -1)
    return logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def tokens(out):
    return [[c.token_ids for c in group] for group in out]


def test_greedy_equals_transformers_generate(tiny, tokenizer, chat_prompts):
    engine = engine_for(tiny, tokenizer)
    prompts = chat_prompts + [[5, 6, 7]]
    out = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=12))
    for prompt, group in zip(prompts, out):
        assert group[0].token_ids == hf_greedy(tiny, prompt, 12)
        assert group[0].finish_reason == ("stop" if group[0].token_ids[-1] == 2 else "length")


@pytest.mark.parametrize(
    "temperature, top_k, top_p", [(0.0, -1, 1.0), (1.0, -1, 1.0), (0.7, 50, 0.9), (1.3, 5, 1.0)]
)
def test_logprobs_equal_a_teacher_forced_forward_before_truncation(
    tiny, chat_prompts, temperature, top_k, top_p
):
    engine = engine_for(tiny)
    params = SamplingParams(n=2, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=10, seed=3)
    for prompt, group in zip(chat_prompts, engine.generate(chat_prompts, params)):
        for c in group:
            want = teacher_forced(tiny, prompt, c.token_ids, temperature)
            assert torch.allclose(torch.tensor(c.logprobs), want, atol=1e-4), (c.logprobs, want.tolist())


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_top_logprobs_are_the_teacher_forced_top_k(tiny, chat_prompts, temperature):
    """top_logprobs: at each generated position, the k most likely tokens of the same distribution
    the sampled log-probs come from; greedy picks the first of them."""
    engine = engine_for(tiny)
    out = engine.generate(chat_prompts[:2], SamplingParams(temperature=temperature, max_new_tokens=6, seed=1))
    completions = [group[0] for group in out]
    top = engine.top_logprobs(chat_prompts[:2], [c.token_ids for c in completions], 5, temperature)
    for prompt, c, positions in zip(chat_prompts, completions, top):
        assert len(positions) == len(c.token_ids)
        with torch.no_grad():
            logits = (
                tiny(input_ids=torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1 : -1].float()
            )
        want = torch.topk(torch.log_softmax(logits / (temperature or 1.0), -1), 5, dim=-1)
        for entries, values, ids, token, logprob in zip(
            positions, want.values, want.indices, c.token_ids, c.logprobs
        ):
            assert [t for t, _ in entries] == ids.tolist()
            assert torch.allclose(torch.tensor([x for _, x in entries]), values, atol=1e-4)
            assert all(a >= b for (_, a), (_, b) in zip(entries, entries[1:]))
            if temperature == 0.0:
                assert entries[0][0] == token and entries[0][1] == pytest.approx(logprob, abs=1e-4)
    assert engine.top_logprobs([[5, 6]], [[]], 5) == [[]]


def test_truncation_restricts_the_sampled_tokens(tiny, chat_prompts):
    """With top_k=3 every sampled token is among the 3 most likely under the teacher-forced forward."""
    engine = engine_for(tiny)
    out = engine.generate(
        chat_prompts, SamplingParams(n=4, temperature=1.0, top_k=3, max_new_tokens=6, seed=0)
    )
    for prompt, group in zip(chat_prompts, out):
        for c in group:
            with torch.no_grad():
                logits = tiny(input_ids=torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1 : -1]
            top3 = logits.topk(3, dim=-1).indices
            assert all(t in row.tolist() for t, row in zip(c.token_ids, top3))


def test_shared_prefill_equals_separate_prefill(tiny, chat_prompts):
    shared, separate = engine_for(tiny, share_prefill=True), engine_for(tiny, share_prefill=False)
    for params in (
        SamplingParams(n=3, temperature=0.0, max_new_tokens=8),
        SamplingParams(n=3, temperature=1.0, max_new_tokens=8, seed=9),
    ):
        a, b = shared.generate(chat_prompts, params), separate.generate(chat_prompts, params)
        assert tokens(a) == tokens(b)
        for ga, gb in zip(a, b):
            for ca, cb in zip(ga, gb):
                assert torch.allclose(torch.tensor(ca.logprobs), torch.tensor(cb.logprobs), atol=1e-4)


def test_top_k_one_equals_greedy(tiny, chat_prompts):
    engine = engine_for(tiny)
    greedy = engine.generate(chat_prompts, SamplingParams(temperature=0.0, max_new_tokens=8))
    for temperature in (0.5, 1.0):
        top1 = engine.generate(
            chat_prompts, SamplingParams(n=2, temperature=temperature, top_k=1, max_new_tokens=8, seed=4)
        )
        assert [[g[0].token_ids] * 2 for g in greedy] == tokens(top1)
    same_t = engine.generate(chat_prompts, SamplingParams(temperature=1.0, top_k=1, max_new_tokens=8, seed=4))
    for a, b in zip(same_t, greedy):
        assert a[0].logprobs == pytest.approx(b[0].logprobs, abs=1e-5)


def test_n_samples_seeds_and_global_seeding(tiny, chat_prompts):
    engine = engine_for(tiny)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=6, seed=123)
    first = engine.generate(chat_prompts, params)
    assert [len(g) for g in first] == [4, 4, 4]
    assert all(len({tuple(t) for t in group}) == 4 for group in tokens(first))  # distinct samples
    assert tokens(engine.generate(chat_prompts, params)) == tokens(first)
    other = engine.generate(chat_prompts, params.model_copy(update={"seed": 124}))
    assert tokens(other) != tokens(first)
    unseeded = params.model_copy(update={"seed": None})
    torch.manual_seed(5)
    a = engine.generate(chat_prompts, unseeded)
    torch.manual_seed(5)
    assert tokens(engine.generate(chat_prompts, unseeded)) == tokens(a)


def test_max_batch_size_chunks_give_the_same_greedy_output(tiny, chat_prompts):
    params = SamplingParams(n=4, temperature=0.0, max_new_tokens=8)
    whole = engine_for(tiny, max_batch_size=64).generate(chat_prompts, params)
    for size in (1, 3, 5):  # 3 and 5 split one prompt's samples across chunks
        assert tokens(engine_for(tiny, max_batch_size=size).generate(chat_prompts, params)) == tokens(whole)


def test_stop_token_ids_end_samples_and_finished_rows_are_dropped(tiny, chat_prompts):
    greedy = engine_for(tiny).generate(chat_prompts, SamplingParams(temperature=0.0, max_new_tokens=12))
    ref = greedy[0][0].token_ids
    stop = next(t for k, t in enumerate(ref) if k >= 2 and t not in ref[:k])
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=12, stop_token_ids=[stop])
    outputs = [engine_for(tiny, compact_fraction=f).generate(chat_prompts, params) for f in (0.0, 0.5, 1.0)]
    assert tokens(outputs[0]) == tokens(outputs[1]) == tokens(outputs[2])
    first = outputs[0][0][0]
    assert first.token_ids == ref[: ref.index(stop) + 1] and first.finish_reason == "stop"
    for group, g in zip(outputs[0][1:], greedy[1:]):
        full = g[0].token_ids
        want = full[: full.index(stop) + 1] if stop in full else full
        assert group[0].token_ids == want


def test_eos_from_the_tokenizer_and_the_generation_config(tiny, tokenizer, chat_prompts):
    prompt = chat_prompts[1]
    # Point the EOS row of the output layer at the prompt's last hidden state: EOS becomes certain.
    with torch.no_grad():
        hidden = tiny.model(input_ids=torch.tensor([prompt])).last_hidden_state[0, -1]
        tiny.lm_head.weight[tokenizer.eos_token_id] = 60 * hidden / hidden.square().sum()
    tiny.generation_config.eos_token_id = None
    out = engine_for(tiny, tokenizer).generate(
        [prompt], SamplingParams(n=3, temperature=1.0, max_new_tokens=5, seed=0)
    )
    assert [(c.token_ids, c.finish_reason) for c in out[0]] == [([tokenizer.eos_token_id], "stop")] * 3
    # Without the tokenizer the engine knows no EOS ...
    no_eos = engine_for(tiny).generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=5))[0][0]
    assert no_eos.finish_reason == "length" and len(no_eos.token_ids) == 5
    # ... until the generation config names one.
    tiny.generation_config.eos_token_id = [no_eos.token_ids[2]]
    cut = engine_for(tiny).generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=5))[0][0]
    assert (
        cut.finish_reason == "stop"
        and cut.token_ids == no_eos.token_ids[: no_eos.token_ids.index(no_eos.token_ids[2]) + 1]
    )


def test_stop_strings_end_the_response_after_the_completing_token(tiny, tokenizer, chat_prompts):
    engine = engine_for(tiny, tokenizer)
    ref = engine.generate(chat_prompts, SamplingParams(temperature=0.0, max_new_tokens=16))[2][0].token_ids
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    # A stop string spanning the end of token k-1 and the start of token k.
    k = next(
        k
        for k in range(3, len(ref))
        if decode(ref[k - 1 : k]).strip()
        and decode(ref[k : k + 1]).strip()
        and tokenizer.decode(ref[:k]) == decode(ref[:k])
    )
    left, right = decode(ref[:k]), decode(ref[: k + 1])
    stop = left[-2:] + right[len(left) :][:2]
    assert stop not in left
    out = engine.generate(
        chat_prompts, SamplingParams(n=2, temperature=0.0, max_new_tokens=16, stop=["\u2603never", stop])
    )
    for c in out[2]:
        assert c.token_ids == ref[: k + 1] and c.finish_reason == "stop"
        assert decode(c.token_ids).find(stop) >= 0 and stop not in decode(c.token_ids[:-1])
    unreachable = engine.generate(
        chat_prompts, SamplingParams(temperature=0.0, max_new_tokens=16, stop=["\u2603never"])
    )
    assert unreachable[2][0].token_ids == ref


def test_bad_input_gets_clear_errors(tiny, chat_prompts, vocab_size):
    engine = engine_for(tiny)
    with pytest.raises(UsageError, match="prompt 1 is empty"):
        engine.generate([[1, 2], []], SamplingParams())
    with pytest.raises(UsageError, match=rf"outside the model's vocabulary \[0, {vocab_size}\)"):
        engine.generate([[1, vocab_size + 3]], SamplingParams())
    with pytest.raises(UsageError, match="prompt 0 has 256 tokens; the model has only 256 positions"):
        engine.generate([[1] * 256], SamplingParams(max_new_tokens=1))
    with pytest.raises(UsageError, match="stop strings need a tokenizer"):
        engine.generate(chat_prompts, SamplingParams(stop=["x"]))
    assert engine.generate([], SamplingParams()) == []


def test_samples_end_where_the_model_runs_out_of_positions(tiny):
    out = engine_for(tiny).generate(
        [[3] * 250, [4] * 10], SamplingParams(n=2, temperature=1.0, max_new_tokens=9, seed=0)
    )
    assert [len(c.token_ids) for g in out for c in g] == [6, 6, 9, 9]
    assert {c.finish_reason for g in out for c in g} == {"length"}


def test_sleep_and_wake_up(tiny, chat_prompts):
    engine = engine_for(tiny, offload_weights=True)
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    before = engine.generate(chat_prompts, params)
    engine.sleep()
    engine.sleep()  # idempotent
    assert engine.asleep
    with pytest.raises(RlcoreError, match="asleep"):
        engine.generate(chat_prompts, params)
    engine.wake_up()
    engine.wake_up()
    assert tokens(engine.generate(chat_prompts, params)) == tokens(before)
    assert next(tiny.parameters()).device.type == "cpu"


def test_training_flags_are_restored_exactly(tiny, chat_prompts):
    tiny.train()
    tiny.model.layers[0].eval()  # a frozen part the trainer keeps in eval
    engine = engine_for(tiny)
    seen = []
    # The fast path runs the projections as products, not modules; the activation is still a module call.
    hook = tiny.model.layers[1].mlp.act_fn.register_forward_hook(lambda m, i, o: seen.append(m.training))
    engine.generate(chat_prompts, SamplingParams(temperature=0.0, max_new_tokens=3))
    hook.remove()
    assert seen and not any(seen)  # eval during generation
    assert tiny.training and tiny.model.layers[1].training and not tiny.model.layers[0].training
