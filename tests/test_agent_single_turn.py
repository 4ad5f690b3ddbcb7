"""The default single_turn loop, built through the registry as a run builds it."""

from __future__ import annotations

import pytest

from rlcore.errors import RlcoreError
from rlcore.interfaces import Completion, Prompt, SamplingParams
from rlcore.registry import Registry
from rlcore.testing.tools import ScriptedEngine, make_chat_tokenizer


@pytest.fixture(scope="module")
def tok():
    return make_chat_tokenizer()


def test_single_turn_groups_by_prompt_with_full_mask(tok):
    loop = Registry.discover(external=False).get("agent_loop", "single_turn").build({}, None)
    engine = ScriptedEngine(tok, lambda text, i: f"reply {i} to {text.count('q')}")
    prompts = [Prompt(token_ids=tok.encode("q" * k), messages=[], index=k) for k in (1, 2, 3)]
    out = loop.run(prompts, engine, SamplingParams(n=2, max_new_tokens=64))
    assert engine.calls == [6]  # one engine call for the whole batch
    assert [t.prompt.index for t in out] == [1, 1, 2, 2, 3, 3]
    for t in out:
        assert t.response_mask == [1] * len(t.response_ids)
        assert len(t.rollout_logprobs) == len(t.response_ids)
        assert t.finish_reason == "stop" and t.num_turns == 1
    assert tok.decode(out[3].response_ids, skip_special_tokens=True) == "reply 1 to 2"


def test_single_turn_reports_length_and_bad_engines(tok):
    loop = Registry.discover(external=False).get("agent_loop", "single_turn").build({}, None)
    engine = ScriptedEngine(tok, lambda text, i: "a long reply that will be cut " * 5)
    [t] = loop.run([Prompt(token_ids=[5], messages=[])], engine, SamplingParams(max_new_tokens=4))
    assert t.finish_reason == "length" and len(t.response_ids) == 4

    class Broken:
        def generate(self, prompts, params):
            return [[Completion(token_ids=[1, 2], logprobs=[0.0])]]

    with pytest.raises(RlcoreError, match="log-probabilities"):
        loop.run([Prompt(token_ids=[5], messages=[])], Broken(), SamplingParams())
