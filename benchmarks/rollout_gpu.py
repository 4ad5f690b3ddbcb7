"""The embedded ``hf`` engine's fast path next to transformers ``generate`` and vLLM, in one run.

    python benchmarks/rollout_gpu.py [--shape qwen2.5-0.5b] [--no-vllm] [--json OUT.json]

A randomly initialised model of a real architecture (speed does not depend on the weights'
values), bf16, token ids in and out, sampling at temperature 1, 128-token random prompts. Every
engine runs every workload after a warm-up call of the same shape:

- ``fixed``: 256 prompts x 256 new tokens, EOS ignored (the issue's anchor workload);
- ``fixed-n4``: 64 prompts x 4 samples x 256 new tokens;
- ``varied``: 256 prompts, each with its own max new tokens drawn uniformly from [16, 256]
  (seed 0), as RL responses end at different lengths.

vLLM keeps its prefix cache on (its default, and what shares a prompt's KV among its samples
within a call) but starts each timed call with it emptied (``reset_prefix_cache``), as an RL step
does: its prompts are new, and an RL framework resets the cache after every weight update. Until
2026-12-06 (late) it did not: the timed call found every prompt of the warm-up call in the cache and
skipped most of its prefill, which rlcore's engine (no cache across calls) had to compute.

transformers ``generate`` runs ``fixed`` only (it has no per-request lengths; as a baseline it
is only needed there). Printed: generated tokens/s, the ratios, and the fraction of the decode
roofline. Each decode step must read the weights and the live KV cache once (at the measured
4.3 TB/s) AND do its matrix products (2 x matrix parameters x live rows FLOPs at the measured 790
TFLOP/s): the step's bound is the larger of the two (at 7B and batch 256 the FLOPs set it). The
last column adds the prefill's matrix products (each distinct prompt once) to that bound.

Variants of rlcore's ``hf`` engine: ``compiled`` (the CUDA defaults: graphs, compiled layers and
sampling, the Triton decode attention), ``compiled-sdpa`` (the same with the masked SDPA attention
over the whole cache, as before issue 24), ``graphs``, ``eager``, ``plain``.

``--lora RANK`` puts peft LoRA adapters on every linear layer (as a ``[model.lora]`` run's actor
has them when the engine shares it) and adds ``lora-modules`` (compiled, but every projection
called as peft's module, as the decoder did before it ran adapters as direct products) and
``lora-off`` (compiled, adapters disabled: the base model's speed), e.g.
``--shape qwen2.5-7b --lora 16 --variants compiled,lora-modules,lora-off --no-vllm --no-transformers``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
from model_shapes import (
    QWEN2_5_0_5B,
    QWEN2_5_1_5B,
    QWEN2_5_3B,
    QWEN2_5_7B,
    SMOLLM2_135M,
    config_kwargs,
)  # benchmarks/ is on sys.path

SHAPES = {
    "smollm2-135m": SMOLLM2_135M,
    "qwen2.5-0.5b": QWEN2_5_0_5B,
    "qwen2.5-1.5b": QWEN2_5_1_5B,
    "qwen2.5-3b": QWEN2_5_3B,
    "qwen2.5-7b": QWEN2_5_7B,
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
    ),
}
BANDWIDTH = 4.3e12  # bytes/s, measured device-memory copies on the H200
MATMUL_FLOPS = 790e12  # FLOP/s, measured dense bf16 matrix products on the H200
PROMPT_TOKENS = 128


def workloads(max_new: int, prompts: int, vocab: int) -> dict[str, dict]:
    rng = random.Random(0)
    ids = [[rng.randrange(100, vocab - 100) for _ in range(PROMPT_TOKENS)] for _ in range(prompts)]
    caps = [rng.randint(min(16, max_new), max_new) for _ in range(prompts)]
    return {
        "fixed": dict(prompts=ids, n=1, caps=[max_new] * prompts),
        "fixed-n4": dict(prompts=ids[: prompts // 4], n=4, caps=[max_new] * (prompts // 4)),
        "varied": dict(prompts=ids, n=1, caps=caps),
    }


def generated(work: dict) -> int:
    return sum(work["caps"]) * work["n"]


def matrix_parameters(model) -> int:
    """Parameters that take part in a matrix product per token: all but the input embedding,
    unless it is tied to the output head (then it is the head's weight)."""
    embedding = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight.data_ptr() == embedding.data_ptr()
    return sum(p.numel() for p in model.parameters()) - (0 if tied else embedding.numel())


def roofline(config, work: dict, param_bytes: int, matrix_params: int) -> dict:
    """Tokens/s if every decode step took the larger of (reading the weights and the live KV cache
    once) and (its matrix products); ``with_prefill`` adds the prompts' matrix products."""
    head_dim = config.hidden_size // config.num_attention_heads
    per_token_kv = config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * 2
    caps = [c for c in work["caps"] for _ in range(work["n"])]
    seconds = 0.0
    for step in range(max(caps)):
        live = sum(1 for c in caps if c > step)
        read = (param_bytes + live * (PROMPT_TOKENS + step) * per_token_kv) / BANDWIDTH
        seconds += max(read, 2 * matrix_params * live / MATMUL_FLOPS)
    prefill = 2 * matrix_params * PROMPT_TOKENS * len(work["prompts"]) / MATMUL_FLOPS
    return {"decode": sum(caps) / seconds, "with_prefill": sum(caps) / (seconds + prefill)}


def build_model(shape: str, device: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        **config_kwargs(SHAPES[shape], max_position_embeddings=4096, eos_token_id=None, bos_token_id=None)
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    model.generation_config.eos_token_id = None
    model.requires_grad_(False)
    return model


def timed(fn, device: str) -> tuple[float, object]:
    """(seconds ``fn()`` took, what it returned)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    value = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start, value


def with_lora(model, rank: int):
    """``model`` with LoRA adapters of ``rank`` on every linear layer (alpha 2 x rank), their B
    factors non-zero so that they change the output, in the model's dtype (as the trainer's
    mixed precision publishes them)."""
    import peft

    config = peft.LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules="all-linear", init_lora_weights=False
    )
    lora = peft.get_peft_model(model, config).to(model.dtype).eval()
    lora.requires_grad_(False)
    return lora


def run_rlcore(model, works: dict, device: str, options: dict) -> dict:
    from rlcore_rollout_hf.engine import HFRolloutEngine
    from rlcore_rollout_hf.options import HFEngineOptions

    from rlcore.interfaces import SamplingParams

    options = dict(options)
    direct = options.pop("direct", True)  # False: the decoder calls peft's modules
    adapters = contextlib.nullcontext() if options.pop("adapters", True) else model.disable_adapter()
    engine = HFRolloutEngine(model, options=HFEngineOptions(**options))
    if engine.fast is not None:
        engine.fast.decoder.direct = direct
    out = {}
    with adapters:
        for name, work in works.items():
            params = SamplingParams(n=work["n"], temperature=1.0, max_new_tokens=max(work["caps"]), seed=1)
            call = functools.partial(engine.generate, work["prompts"], params, max_new_tokens=work["caps"])
            warm, _ = timed(call, device)
            seconds, groups = timed(call, device)
            got = sum(len(c.token_ids) for group in groups for c in group)
            assert got == generated(work), (got, generated(work))
            out[name] = dict(seconds=seconds, warmup_seconds=warm, tokens=got, tokens_per_s=got / seconds)
    engine.sleep()
    return out


def run_transformers(model, work: dict, device: str) -> dict:
    prompts = torch.tensor(work["prompts"], device=device)
    new = max(work["caps"])

    def call():
        model.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new,
            min_new_tokens=new,
            pad_token_id=0,
        )

    with torch.inference_mode():
        model.generate(
            prompts[:8],
            attention_mask=torch.ones_like(prompts[:8]),
            do_sample=True,
            max_new_tokens=8,
            pad_token_id=0,
        )
        seconds, _ = timed(call, device)
    tokens = len(work["prompts"]) * new
    return dict(seconds=seconds, tokens=tokens, tokens_per_s=tokens / seconds)


def run_vllm(config, works: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    directory = Path(tempfile.mkdtemp())
    config.save_pretrained(directory)
    llm = LLM(
        model=str(directory),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        gpu_memory_utilization=0.5,
        max_num_seqs=256,
        max_model_len=1024,
        seed=0,
    )
    out = {}
    for name, work in works.items():
        requests = [TokensPrompt(prompt_token_ids=p) for p in work["prompts"]]
        params = [
            SamplingParams(
                n=work["n"],
                temperature=1.0,
                max_tokens=c,
                min_tokens=c,
                ignore_eos=True,
                detokenize=False,
                logprobs=0,
            )
            for c in work["caps"]
        ]
        call = functools.partial(llm.generate, requests, params, use_tqdm=False)
        call()  # warm-up
        llm.reset_prefix_cache()  # the timed call prefills its prompts, as after a weight update
        seconds, outputs = timed(call, "cuda")
        got = sum(len(c.token_ids) for r in outputs for c in r.outputs)
        assert got == generated(work), (got, generated(work))
        # Beside it, for the record: the same call again with the prompts left in the cache (how
        # this benchmark measured vLLM until 2026-12-06 (late); no RL step can find its prompts there).
        cached, _ = timed(call, "cuda")
        out[name] = dict(
            seconds=seconds, tokens=got, tokens_per_s=got / seconds, prompts_cached_tokens_per_s=got / cached
        )
    return out  # the engine goes with this frame; vLLM runs last


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--max-new", type=int, default=256)
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument(
        "--variants", default="compiled", help="comma list of: compiled, compiled-sdpa, graphs, eager, plain"
    )
    parser.add_argument(
        "--lora",
        type=int,
        metavar="RANK",
        help="adapters of this rank on every linear layer; adds the variants lora-modules and lora-off",
    )
    parser.add_argument(
        "--workloads", default="fixed,fixed-n4,varied", help="comma list of: fixed, fixed-n4, varied"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    lora_variants = {"lora-modules", "lora-off"} & set(args.variants.split(","))
    if lora_variants and not args.lora:
        parser.error(f"--variants {','.join(sorted(lora_variants))} needs --lora RANK")

    model = build_model(args.shape, args.device)
    if args.lora:
        model = with_lora(model, args.lora)
    config = model.config
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    matrix_params = matrix_parameters(model)
    works = {
        k: w
        for k, w in workloads(args.max_new, args.prompts, config.vocab_size).items()
        if k in args.workloads.split(",")
    }
    results: dict = {
        "shape": args.shape,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "roofline_tokens_per_s": {
            k: roofline(config, w, param_bytes, matrix_params) for k, w in works.items()
        },
    }
    variants = {
        "graphs": dict(fast_path="on", cuda_graphs=True, compile=False, max_batch_size=args.prompts),
        "compiled": dict(fast_path="on", cuda_graphs=True, compile=True, max_batch_size=args.prompts),
        "compiled-sdpa": dict(
            fast_path="on",
            cuda_graphs=True,
            compile=True,
            max_batch_size=args.prompts,
            decode_attention="sdpa",
        ),
        "eager": dict(fast_path="on", cuda_graphs=False, compile=False, max_batch_size=args.prompts),
        "plain": dict(fast_path="off", max_batch_size=args.prompts),
    }
    # With --lora: the compiled variant with peft's modules called as before (lora-modules) and
    # with the adapters disabled (lora-off, the base model's speed).
    variants["lora-modules"] = dict(variants["compiled"], direct=False)
    variants["lora-off"] = dict(variants["compiled"], adapters=False)
    for variant in args.variants.split(","):
        # The compiled variant compiles once per batch bucket in the warm-up call (the varied
        # workload passes through a dozen buckets); the timed call reuses them all.
        results[f"rlcore-{variant}"] = run_rlcore(model, works, args.device, variants[variant])
        print(variant, json.dumps(results[f"rlcore-{variant}"]), flush=True)
    if not args.no_transformers:
        results["transformers"] = {"fixed": run_transformers(model, works["fixed"], args.device)}
        print("transformers", json.dumps(results["transformers"]), flush=True)
    del model
    gc.collect()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    if not args.no_vllm:
        try:
            results["vllm"] = run_vllm(config, works)
        except ImportError as error:
            print(f"vLLM not importable ({error}); skipped", file=sys.stderr)

    print(
        f"\n{'workload':10} {'engine':22} {'tokens/s':>10} {'x transformers':>15} {'x vLLM':>8} {'of roofline':>12} {'+prefill':>9}"
    )
    for name in works:
        for engine in [k for k in results if k.startswith("rlcore-") or k in ("transformers", "vllm")]:
            row = results[engine].get(name)
            if not row:
                continue
            tps = row["tokens_per_s"]
            vs_hf = (
                tps / results["transformers"]["fixed"]["tokens_per_s"]
                if "transformers" in results and name == "fixed"
                else None
            )
            vs_vllm = tps / results["vllm"][name]["tokens_per_s"] if "vllm" in results else None
            bound = results["roofline_tokens_per_s"][name]
            print(
                f"{name:10} {engine:22} {tps:10.0f} {vs_hf if vs_hf else float('nan'):15.2f} "
                f"{vs_vllm if vs_vllm else float('nan'):8.2f} {tps / bound['decode']:12.1%} {tps / bound['with_prefill']:9.1%}"
            )
    if "vllm" in results:
        print(
            "\nvLLM with the timed call's prompts still in its prefix cache (not an RL step; for the record):"
        )
        for name in works:
            row = results["vllm"][name]
            print(
                f"  {name:10} {row['prompts_cached_tokens_per_s']:10.0f} tokens/s, "
                f"{row['prompts_cached_tokens_per_s'] / row['tokens_per_s']:.2f}x its speed with the cache emptied"
            )
    if args.lora and {"rlcore-compiled", "rlcore-lora-modules", "rlcore-lora-off"} <= results.keys():
        print(
            f"\nLoRA rank {args.lora} on every linear layer, tokens/s of the direct products (compiled) against:"
        )
        for name in works:
            tps = {
                k: results[f"rlcore-{k}"][name]["tokens_per_s"]
                for k in ("compiled", "lora-modules", "lora-off")
            }
            print(
                f"  {name:10} peft's modules called: {tps['compiled'] / tps['lora-modules']:.2f}x; "
                f"no adapters: {tps['compiled'] / tps['lora-off']:.2f}x"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
