"""The `tool` loop on a real transformers model through the `hf` engine, then a few GRPO steps of
the trainer with the python tool.

The model is a tiny random Llama, first fitted for a few seconds to always answer with a python
tool call, so that real sampling produces real multi-turn rollouts: the call is parsed, the code
runs in the sandbox, its output is glued in, and the model generates again. The engine's
log-probabilities of every model token are then recomputed with one forward pass over the
accumulated ids: they match only if every turn saw exactly the context that was accumulated.
"""

from __future__ import annotations

import json
import textwrap

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rlcore_agent.options import PythonToolOptions  # noqa: E402
from rlcore_agent.python_tool import PythonTool  # noqa: E402

from rlcore.interfaces import BuildContext, Prompt, SamplingParams  # noqa: E402
from rlcore.registry import Registry  # noqa: E402
from rlcore.testing import require_plugins  # noqa: E402
from rlcore.testing.tools import make_chat_tokenizer  # noqa: E402

CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(6*7)"}}</tool_call>'


def question(expression: str) -> str:
    return f"Compute {expression}. Put the final answer in \\boxed{{}}."  # the synthetic task's wording


def fitted_tool_caller(tok):
    """A 2-layer Llama fitted (a few seconds) to answer arithmetic questions with CALL.

    The tools stay out of the prompt (``tools_in_prompt = false``) to keep sequences short."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config)
    response = tok.encode(CALL, add_special_tokens=False) + [tok.eos_token_id]
    rows = []
    for expression in ("3 + 4", "12 * 5 - 7", "2 + 2", "40 - 9 * 2", "8 * 1", "7 - 5"):
        msgs = [{"role": "user", "content": question(expression)}]
        prompt = tok.encode(
            tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )
        rows.append((prompt, response))
    width = max(len(p) + len(r) for p, r in rows)
    pad = tok.pad_token_id
    ids = torch.tensor([p + r + [pad] * (width - len(p) - len(r)) for p, r in rows])
    labels = torch.tensor([[-100] * len(p) + r + [-100] * (width - len(p) - len(r)) for p, r in rows])
    attention = (labels != -100) | (
        torch.arange(width)[None, :] < torch.tensor([len(p) for p, _ in rows])[:, None]
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(80):
        loss = model(input_ids=ids, attention_mask=attention.long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return model


@pytest.fixture(scope="module")
def tok():
    return make_chat_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return fitted_tool_caller(tok)


@pytest.mark.slow
def test_tool_loop_on_the_hf_engine_with_a_real_model(tok, model):
    require_plugins("rlcore_rollout_hf")
    registry = Registry.discover()
    engine = registry.get("rollout_engine", "hf").build(
        {}, BuildContext(tokenizer=tok, actor=model, device="cpu")
    )
    tool = PythonTool(PythonToolOptions())
    loop = registry.get("agent_loop", "tool").build(
        {"max_turns": 2, "tools_in_prompt": False}, BuildContext(tokenizer=tok, tools={"python": tool})
    )
    messages = [{"role": "user", "content": question("6 * 7")}]
    prompt = Prompt(
        token_ids=tok.encode(
            tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        ),
        messages=messages,
    )
    params = SamplingParams(
        n=3, temperature=1.0, max_new_tokens=160, stop_token_ids=[tok.eos_token_id], seed=3
    )
    out = loop.run([prompt], engine, params)
    assert len(out) == 3
    multi = [t for t in out if t.num_turns == 2]
    assert multi, [tok.decode(t.response_ids) for t in out]
    for t in multi:
        assert t.tool_calls >= 1 and t.finish_reason in ("max_turns", "length", "stop")
        glue = tok.decode(
            [i for i, m in zip(t.response_ids, t.response_mask) if m == 0], skip_special_tokens=False
        )
        assert "<|im_start|>tool\n42<|im_end|>" in glue
    for t in out:
        ids = torch.tensor([t.prompt.token_ids + t.response_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
        logp = torch.log_softmax(logits[:-1], dim=-1)
        start = len(t.prompt.token_ids)
        for k, (token, mask, lp) in enumerate(zip(t.response_ids, t.response_mask, t.rollout_logprobs)):
            if mask:
                assert lp == pytest.approx(logp[start + k - 1, token].item(), abs=2e-3), k
            else:
                assert lp == 0.0


@pytest.mark.slow
def test_grpo_steps_with_the_python_tool(tok, model, tmp_path):
    """The trainer runs GRPO steps whose rollouts call the python tool (manifest built like the example)."""
    require_plugins("rlcore_rollout_hf", "rlcore_reward_rule", "rlcore_algo_grpo")  # hf, math, grpo
    from rlcore.manifest.loader import load_manifest
    from rlcore.trainer.driver import run_driver

    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    manifest = tmp_path / "agent.toml"
    manifest.write_text(
        textwrap.dedent(
            f"""
            [run]
            name = "agent-e2e"
            device = "cpu"
            output_dir = "{tmp_path / "runs"}"
            [model]
            path = "{model_dir}"
            [data]
            train = "synthetic:arithmetic?steps=1&max_operand=9&size=40&seed=0&split=train"
            prompts_per_step = 2
            max_prompt_tokens = 512
            max_response_tokens = 160
            [rollout]
            engine = "hf"
            samples_per_prompt = 2
            [agent]
            loop = "tool"
            max_turns = 2
            tools_in_prompt = false
            [tools.python]
            timeout_s = 5
            [reward]
            function = "math"
            [algorithm]
            advantage = "grpo"
            [trainer]
            steps = 2
            lr = 1e-4
            eval_before_train = false
            loggers = ["jsonl"]
            """
        )
    )
    resolved = load_manifest(manifest)
    run_dir = tmp_path / "runs" / "agent-e2e"
    assert run_driver(resolved, run_dir) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train_rows = [r for r in rows if "agent/num_turns" in r or "agent/num_turns/mean" in r]
    assert len(train_rows) >= 2
    assert any(r.get("agent/tool_calls/mean", r.get("agent/tool_calls", 0)) > 0 for r in train_rows)
