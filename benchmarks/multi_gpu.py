"""GRPO on 1 GPU and on N GPUs of one host (FSDP2 ranks, the embedded engine colocated), side by side.

    python benchmarks/multi_gpu.py --gpus 2 --tokenizer DIR [--shape qwen2.5-0.5b] [--steps 5]

Builds a randomly initialised model of a real architecture with the given tokenizer (speed does
not depend on weight values), runs the same manifest with 1 rank and with N ranks (one per GPU,
started like torchrun does), and prints per-step scores, losses and step times, the largest
differences between the runs and the scaling efficiency: (1-GPU step time) / (N-GPU step time)
for the same global batch, over N. Rollouts are greedy, so every sample is independent of how
prompts are split between ranks and the two runs' curves can be compared step by step.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and friends), as the GPU machine requires.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from model_shapes import QWEN2_5_0_5B  # benchmarks/ is the script directory, so on sys.path

SHAPES = {
    "qwen2.5-0.5b": QWEN2_5_0_5B,
    "small": dict(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
}
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

REWARD = """
def score(data_source, solution_str, ground_truth, extra_info=None):
    text = solution_str.replace(" ", "")
    upper = sum(c.isupper() for c in text) / len(text) if text else 0.0
    return float(ground_truth) / 18.0 + upper
"""


# --precision -> ([model] dtype, [model] compute_dtype): what is stored, what is computed.
PRECISIONS = {
    "mixed": ("float32", "bfloat16"),
    "float32": ("float32", "float32"),
    "bf16": ("bfloat16", "bfloat16"),
}


def build_model(target: Path, tokenizer_dir: Path, shape: str, dtype: str) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    shape_kwargs = {
        **SHAPES[shape],
        "vocab_size": len(tokenizer),
    }  # the tokenizer's vocabulary, not the shape's
    config = Qwen2Config(
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **shape_kwargs,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


def manifest(model_dir: Path, out: Path, args) -> Path:
    text = f'''
[run]
name = "bench"
seed = 1
[model]
path = "{model_dir}"
dtype = "{PRECISIONS[args.precision][0]}"
compute_dtype = "{PRECISIONS[args.precision][1]}"
[data]
train = "synthetic:addition?digits=2&size=4096&seed=0&split=train"
prompts_per_step = {args.prompts}
max_prompt_tokens = 128
max_response_tokens = {args.response_tokens}
[rollout]
engine = "hf"
samples_per_prompt = 1
temperature = 0.0
[reward]
function = "python:reward.py:score"
[algorithm]
advantage = "reinforce_pp"
[trainer]
steps = {args.steps}
lr = 1e-5
micro_batch_tokens = 16384
loggers = ["jsonl"]
eval_before_train = false
'''
    (out / "reward.py").write_text(REWARD)
    path = out / "manifest.toml"
    path.write_text(text)
    return path


def run(manifest_path: Path, run_dir: Path, ranks: int) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.perf_counter()
    procs = []
    for rank in range(ranks):
        env = {
            **os.environ,
            **NO_MULTICAST,
            "RANK": str(rank),
            "WORLD_SIZE": str(ranks),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "rlcore", "run", str(manifest_path), "--run-dir", str(run_dir)],
                env=env,
            )
        )
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"{ranks}-rank run failed: exit codes {codes}")
    return time.perf_counter() - start


def rows(run_dir: Path) -> list[dict]:
    return [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if "critic/score/mean" in line
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    parser.add_argument(
        "--precision",
        default="mixed",
        choices=sorted(PRECISIONS),
        help="mixed = float32 weights and optimizer state, bf16 compute (the CUDA default); "
        "float32; bf16 = bf16 weights, no master (does not learn at RL learning rates)",
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--response-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path("/tmp/rlcore-multi-gpu"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = args.out / f"model-{args.shape}"
    if not (model_dir / "config.json").exists():
        build_model(model_dir, args.tokenizer, args.shape, PRECISIONS[args.precision][0])
    path = manifest(model_dir, args.out, args)
    results = {}
    for ranks in (1, args.gpus):
        run_dir = args.out / f"run-{ranks}"
        wall = run(path, run_dir, ranks)
        results[ranks] = (wall, rows(run_dir))
    one, many = results[1][1], results[args.gpus][1]
    print(
        f"\nGRPO-style step, {args.shape} ({args.precision}), {args.prompts} prompts x {args.response_tokens} tokens, greedy"
    )
    print(
        f"{'step':>4} {'score 1':>9} {'score N':>9} {'pg_loss 1':>11} {'pg_loss N':>11} {'gnorm 1':>9} {'gnorm N':>9} {'step_s 1':>9} {'step_s N':>9}"
    )
    for a, b in zip(one, many):
        print(
            f"{a['step']:>4} {a['critic/score/mean']:>9.4f} {b['critic/score/mean']:>9.4f} {a['actor/pg_loss']:>11.3e} "
            f"{b['actor/pg_loss']:>11.3e} {a['actor/grad_norm']:>9.4f} {b['actor/grad_norm']:>9.4f} "
            f"{a['timing_s/step']:>9.2f} {b['timing_s/step']:>9.2f}"
        )
    later = lambda rs: rs[1:] if len(rs) > 1 else rs  # noqa: E731  (the first step includes warm-up)
    t1 = sum(r["timing_s/step"] for r in later(one)) / len(later(one))
    tn = sum(r["timing_s/step"] for r in later(many)) / len(later(many))
    score_diff = max(abs(a["critic/score/mean"] - b["critic/score/mean"]) for a, b in zip(one, many))
    gn_diff = max(
        abs(a["actor/grad_norm"] - b["actor/grad_norm"]) / max(abs(a["actor/grad_norm"]), 1e-12)
        for a, b in zip(one, many)
    )
    print(f"\nmax |score 1 - score N| = {score_diff:.2e}; max relative grad-norm difference = {gn_diff:.2e}")
    print(
        f"mean step time after the first: 1 GPU {t1:.2f} s, {args.gpus} GPUs {tn:.2f} s; "
        f"speed-up {t1 / tn:.2f}x, scaling efficiency {t1 / tn / args.gpus:.0%}"
    )
    for key in ("timing_s/gen", "timing_s/update_actor"):
        a = sum(r.get(key, 0) for r in later(one)) / len(later(one))
        b = sum(r.get(key, 0) for r in later(many)) / len(later(many))
        print(f"  {key}: 1 GPU {a:.2f} s, {args.gpus} GPUs {b:.2f} s")


if __name__ == "__main__":
    main()
