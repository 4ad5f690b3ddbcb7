"""Does a real model learn on reasoning-gym tasks through rlcore? SmolLM2-135M-Instruct, GRPO, on
the mixture of examples/reasoning_gym.toml (single-digit chain_sum and products, each scored by its
task's own scorer), validated on the test half of the same tasks (never a training item).

    python benchmarks/learning_reasoning_gym.py [--steps 14] [--eval-every 7]      # CPU, the example as it is
    python benchmarks/learning_reasoning_gym.py --steps 6 --eval-every 3 --set data.prompts_per_step=8 \
        --set data.max_response_tokens=8 --set data.val.size=32                   # CPU, smaller

On the GPU (one H200), larger batches and more steps:

    python benchmarks/learning_reasoning_gym.py --gpu --steps 40 --eval-every 10

(``--gpu`` sets prompts_per_step = 128, 8 samples each, 256 validation questions and lr 1e-5.)
Printed: the validation reward at each evaluation, per task and in all, the training reward per
step and the mean step time; as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPU = [
    "data.prompts_per_step=128",
    "rollout.samples_per_prompt=8",
    "data.val.size=256",
    "trainer.lr=1e-5",
    "trainer.micro_batch_tokens=16384",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", type=Path, default=ROOT / "examples" / "reasoning_gym.toml")
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--eval-every", type=int, default=7)
    parser.add_argument("--gpu", action="store_true", help="the GPU-sized settings above")
    parser.add_argument(
        "--out", type=Path, default=None, help="keep the run here (default: a temporary directory)"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="TABLE.KEY=VALUE",
        help="more manifest overrides (a smaller batch on a busy CPU: --set data.prompts_per_step=8)",
    )
    args = parser.parse_args()
    sets = (
        [
            f"trainer.steps={args.steps}",
            f"trainer.eval_every={args.eval_every}",
            "trainer.save_every=0",
            'trainer.loggers=["jsonl"]',
        ]
        + (GPU if args.gpu else [])
        + args.overrides
    )
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.out or Path(tmp) / "run"
        cmd = [sys.executable, "-m", "rlcore", "run", str(args.manifest), "--run-dir", str(run_dir)]
        for item in sets:
            cmd += ["--set", item]
        started = time.monotonic()
        subprocess.run(cmd, check=True)
        wall = time.monotonic() - started
        rows = [
            json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()
        ]
    val = [
        {k: v for k, v in r.items() if k == "step" or (k.startswith("val/") and "reward/mean" in k)}
        for r in rows
        if "val/reward/mean" in r
    ]
    train = [(r["step"], r.get("critic/score/mean")) for r in rows if "actor/pg_loss" in r]
    step_times = [r["timing_s/step"] for r in rows if "timing_s/step" in r]
    result = {
        "validation": val,
        "train_reward": train,
        "wall_s": round(wall, 1),
        "mean_step_s": round(sum(step_times) / len(step_times), 2) if step_times else None,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"validation reward ({args.manifest.name}, {args.steps} steps, {wall / 60:.1f} min in all):")
    for r in val:
        parts = ", ".join(f"{k.removeprefix('val/')} {v:.3f}" for k, v in sorted(r.items()) if k != "step")
        print(f"  step {r['step']:>3}: {parts}")
    print("training reward per step: " + " ".join(f"{v:.2f}" for _, v in train if v is not None))
    print(f"mean step time: {result['mean_step_s']} s")


if __name__ == "__main__":
    main()
