"""The rollout-engine conformance kit passes a correct engine and catches each kind of broken one.

The engine here is deliberately naive and independent of the ``hf`` plugin: one sequence at a
time, a full forward pass per token, no KV cache. Each ``flaw`` breaks one rule of the contract.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rlcore.interfaces import Completion, RolloutEngine, SamplingParams  # noqa: E402
from rlcore.testing.engines import check_rollout_engine, default_prompts  # noqa: E402

VOCAB = 300


class LetterTokenizer:
    """Token i decodes to a letter (ids >= 260 to two letters), enough for stop strings."""

    all_special_ids: list[int] = []

    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 250 for c in text]

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return "".join(chr(97 + i % 26) * (2 if i >= 260 else 1) for i in ids)


class NaiveEngine:
    shares_actor = False

    def __init__(self, model, tokenizer=None, flaw: str | None = None):
        self.model, self.tokenizer, self.flaw = model, tokenizer, flaw
        self.asleep = False

    def _logits(self, ids):
        with torch.no_grad():
            return self.model(input_ids=torch.tensor([ids])).logits[0, -1].float()

    def _one(self, prompt, params, generator):
        ids, out, logprobs, reason = list(prompt), [], [], "length"
        limit = params.max_new_tokens + (1 if self.flaw == "overlong" else 0)
        for _ in range(limit):
            logits = self._logits(ids)
            temperature = params.temperature or 1.0
            logp = torch.log_softmax(logits / temperature, -1)
            if params.temperature == 0:
                token = int(logp.topk(2).indices[1]) if self.flaw == "second_best" else int(logp.argmax())
            else:
                kept = logp.clone()
                if params.top_k > 0:
                    kept[kept < kept.topk(params.top_k).values[-1]] = float("-inf")
                token = int(torch.multinomial(kept.softmax(-1), 1, generator=generator))
            lp = float(logp[token])
            if self.flaw == "untempered_logprobs":
                lp = float(torch.log_softmax(logits, -1)[token])
            ids.append(token)
            out.append(token)
            logprobs.append(lp)
            if token in params.stop_token_ids and self.flaw != "ignore_stop_ids":
                reason = "stop"
                break
            if params.stop and any(s in self.tokenizer.decode(out) for s in params.stop):
                reason = "stop"
                break
        return Completion(out, logprobs, reason)

    def generate(self, prompts, params):
        if self.asleep:
            raise RuntimeError("asleep")
        seed = params.seed if params.seed is not None and self.flaw != "ignore_seed" else torch.seed() % 2**31
        groups = []
        for prompt in prompts:
            group = []
            for j in range(params.n):
                generator = torch.Generator().manual_seed(
                    seed if self.flaw == "shared_noise" else seed * 1000 + j
                )
                group.append(self._one(prompt, params, generator))
            groups.append(group)
        if self.flaw == "drop_sample":
            groups = [g[:-1] for g in groups]
        if self.flaw == "reverse_order":
            groups = groups[::-1]
        return groups

    def update_weights(self, named_tensors):
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name in params:
                    params[name].copy_(tensor)

    def sleep(self):
        self.asleep = True
        if self.flaw == "sleep_corrupts":
            with torch.no_grad():
                self.model.lm_head.weight.copy_(self.model.lm_head.weight.flip(0))

    def wake_up(self):
        self.asleep = False


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices gain nothing from threads, and on a busy machine threads cost 10x."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_model(one_thread):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    return transformers.LlamaForCausalLM(config).eval()


def test_a_correct_engine_passes_every_check(tiny_model):
    engine = NaiveEngine(tiny_model, LetterTokenizer())
    assert isinstance(engine, RolloutEngine)
    results = check_rollout_engine(
        engine, vocab_size=VOCAB, tokenizer=LetterTokenizer(), reference_model=tiny_model, max_new_tokens=5
    )
    assert results == {name: "passed" for name in results}, results
    assert set(results) >= {"structure", "reference_logprobs", "stop_strings", "update_weights_identity"}


def test_checks_needing_a_tokenizer_or_reference_are_reported_skipped(tiny_model):
    results = check_rollout_engine(NaiveEngine(tiny_model), vocab_size=VOCAB)
    assert results["stop_strings"].startswith("skipped")
    assert results["reference_logprobs"].startswith("skipped")
    assert results["structure"] == "passed"


@pytest.mark.parametrize(
    "flaw, check",
    [
        ("drop_sample", "structure"),
        ("overlong", "structure"),
        ("reverse_order", "prompt_order"),
        ("ignore_seed", "seed"),
        ("shared_noise", "seed"),
        ("ignore_stop_ids", "stop_token_ids"),
        ("sleep_corrupts", "sleep_wake"),
        ("second_best", "top_k_one"),
        ("untempered_logprobs", "reference_logprobs"),
    ],
)
def test_each_broken_engine_is_caught_by_its_check(tiny_model, flaw, check):
    model = type(tiny_model)(tiny_model.config).eval()
    model.load_state_dict(tiny_model.state_dict())  # sleep_corrupts changes weights
    engine = NaiveEngine(model, LetterTokenizer(), flaw=flaw)
    with pytest.raises(AssertionError, match=rf"\[{check}\]"):
        check_rollout_engine(
            engine,
            vocab_size=VOCAB,
            tokenizer=LetterTokenizer(),
            reference_model=tiny_model,
            max_new_tokens=5,
        )


def test_greedy_against_the_reference_catches_a_wrong_model(tiny_model):
    other = type(tiny_model)(tiny_model.config).eval()  # different random weights
    from rlcore.testing.engines import check_greedy_deterministic, check_reference_greedy

    prompts = default_prompts(VOCAB)
    greedy = check_greedy_deterministic(NaiveEngine(other), prompts, 6)
    with pytest.raises(AssertionError, match=r"\[reference_greedy\]"):
        check_reference_greedy(NaiveEngine(other), prompts, greedy, tiny_model, 1e-4)


def test_default_prompts_use_the_tokenizer_when_given():
    class Encoder:
        def encode(self, text, add_special_tokens=False):
            return [len(word) for word in text.split()]

    assert default_prompts(VOCAB, Encoder())[0] == [3, 7, 2, 6, 2]
    ids = default_prompts(VOCAB)
    assert [len(p) for p in ids] == [5, 11, 2] and all(0 <= t < VOCAB for p in ids for t in p)
    assert SamplingParams().n == 1
