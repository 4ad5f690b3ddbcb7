"""Synchronous against one-step-off-policy GRPO steps, with the engine in a process of its own.

    python benchmarks/async_gpu.py [--shape 0.5b] [--steps 4] [--modes colocated,split,split:1]
                                   [--engine-option KEY=TOML ...] [--json OUT]

Each mode is one run of benchmarks/grpo_step.py (rlcore side only, its workload: 64 prompts x 4
samples, 128-token prompts, 256-token responses forced to full length, random weights of a real
architecture, float32 master weights with bfloat16 compute), in a child process of its own:

- ``colocated``: rlcore's default. The ``hf`` engine generates with the actor's own module in the
  trainer's process; generation, then the update, then generation.
- ``split``: ``[rollout] placement = "split"``: the engine in a second process on the same GPU,
  with its own weights, sent after every update through a CUDA IPC bucket buffer (two processes
  on one GPU cannot form an NCCL group). Still synchronous: this isolates the transfer's cost.
- ``split:N``: the same with ``max_staleness = N``: the engine generates batch s+N while the
  trainer trains on batch s, both on the one GPU.

Printed: the mean step (after the warm-up steps), its generation, update and weight-sync parts,
the trainer's wait for rollouts, the engine's busy fraction, and each mode's speed against the
first. The learning side of one-step-off training is checked by benchmarks/learning_async.py
(same reward curve as synchronous on the quickstart); this benchmark measures time only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

MODES = {
    "colocated": [],
    "split": ['placement="split"'],
}


def options_for(mode: str) -> list[str]:
    if mode in MODES:
        return MODES[mode]
    base, _, staleness = mode.partition(":")
    if base not in MODES or not staleness.isdigit():
        raise SystemExit(f"--modes: {mode!r} is not colocated, split or BASE:N (e.g. split:1)")
    return MODES[base] + [f"max_staleness={int(staleness)}"]


def run_mode(args, mode: str, out: Path) -> dict:
    target = out / f"{mode.replace(':', '-')}.json"
    cmd = [
        sys.executable,
        str(HERE / "grpo_step.py"),
        "--shape",
        args.shape,
        "--skip-trl",
        "--skip-train-only",
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--micro-batch-tokens",
        str(args.micro_batch_tokens),
        "--out",
        str(out / mode.replace(":", "-")),
        "--json",
        str(target),
    ]
    if args.device:
        cmd += ["--device", args.device]
    if args.engine:
        cmd += ["--engine", args.engine]
    if args.workload:
        cmd += ["--workload", *map(str, args.workload)]
    for option in args.engine_option + options_for(mode):
        cmd += ["--engine-option", option]
    print(f"== {mode}: {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, check=True)
    whole = json.loads(target.read_text())
    return {
        **whole["rlcore"],
        "precision": whole["precision"],
        "device": whole["device"],
        "gpu": whole.get("gpu"),
    }


def timed_mean(result: dict, key: str, warmup: int) -> float:
    steps = result["steps"][warmup:] or result["steps"]
    return sum(s.get(key, 0.0) for s in steps) / len(steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="0.5b")
    parser.add_argument("--device", default=None)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per mode")
    parser.add_argument(
        "--warmup", type=int, default=2, help="steps first run and left out (one-step-off fills its pipe)"
    )
    parser.add_argument("--modes", default="colocated,split,split:1")
    parser.add_argument(
        "--workload", type=int, nargs=4, metavar=("PROMPTS", "SAMPLES", "PROMPT_TOKENS", "RESPONSE_TOKENS")
    )
    parser.add_argument("--micro-batch-tokens", type=int, default=49152)
    parser.add_argument("--engine", default=None, help="[rollout] engine (default: hf; vllm where installed)")
    parser.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=TOML",
        help="[rollout] keys for every mode (e.g. max_batch_size=256)",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="async-gpu-"))
    out.mkdir(parents=True, exist_ok=True)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes:
        options_for(mode)  # refuse a bad mode before the first run
    results = {mode: run_mode(args, mode, out) for mode in modes}
    first = results[modes[0]]["step_s"]
    r0 = results[modes[0]]
    print(
        f"\n{args.shape} on {r0['gpu'] or r0['device']}, precision {r0['precision']} (grpo_step.py's --precision), "
        f"mean of {args.steps} steps after {args.warmup}:"
    )
    print(
        f"{'mode':<12} {'step':>8} {'gen':>8} {'update':>8} {'w-sync':>8} {'wait':>8} {'engine busy':>12} {'peak':>9}  vs {modes[0]}"
    )
    for mode, r in results.items():
        wait = timed_mean(r, "timing_s/wait_rollout", args.warmup)
        busy = timed_mean(r, "async/engine_busy_fraction", args.warmup)
        peak = f"{r['peak_gib']:.1f} GiB" if r.get("peak_gib") is not None else "-"
        print(
            f"{mode:<12} {r['step_s']:>7.3f}s {r['gen_s']:>7.3f}s {r['update_actor_s']:>7.3f}s "
            f"{r['update_weights_s']:>7.3f}s {wait:>7.3f}s {busy:>12.2f} {peak:>9}  {first / r['step_s']:.2f}x"
        )
    print(
        "(gen is the trainer's own generation time: 0 for one-step-off, whose generation is inside the engine's "
        "busy share; peak is the trainer process's, the engine's process holds its own)"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
