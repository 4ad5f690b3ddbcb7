"""The real SmolLM2-135M-Instruct (GGUF, de-quantised to float32) through the engine's own loader."""

from __future__ import annotations

import pytest
from rlcore_rollout_hf.engine import build
from rlcore_rollout_hf.options import HFEngineOptions

from rlcore.interfaces import BuildContext, SamplingParams
from rlcore.testing.engines import check_rollout_engine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(smol_dir, tokenizer):
    context = BuildContext(
        model_path=str(smol_dir), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", tokenizer=tokenizer
    )
    return build(HFEngineOptions(), context)


def test_greedy_answer_to_two_plus_three(engine, tokenizer, encode_chat):
    assert not engine.shares_actor
    out = engine.generate([encode_chat("What is 2 + 3?")], SamplingParams(temperature=0.0, max_new_tokens=40))
    completion = out[0][0]
    text = tokenizer.decode(completion.token_ids, skip_special_tokens=True)
    assert "5" in text, text
    assert completion.finish_reason == "stop" and completion.token_ids[-1] == tokenizer.eos_token_id


def test_conformance_with_the_real_model(engine, tokenizer, encode_chat):
    prompts = [encode_chat("What is 2 + 3?"), encode_chat("Tell me a story about a cat.")]
    results = check_rollout_engine(
        engine,
        vocab_size=len(tokenizer),
        tokenizer=tokenizer,
        reference_model=engine.model,
        prompts=prompts,
        max_new_tokens=6,
    )
    assert set(results.values()) == {"passed"}, results
