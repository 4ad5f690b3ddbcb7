"""The quickstart's speed and learning, with a plain GRPO loop measured beside it.

    python benchmarks/quickstart.py [--manifest examples/quickstart.toml] [--steps 3] [--no-baseline]

Runs the manifest through `rlcore run` for --steps steps (validation included at the start and
end), then prints steps/s, tokens/s and the validation reward before and after training. Unless
--no-baseline, it also runs the plain loop that ../shared/NOTES.md measured (transformers
`generate`, group-normalised advantages, one policy-gradient step per batch, AdamW) on the same
model, prompts, batch shape and learning rate, and prints the ratio of step times.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_rlcore(manifest: Path, steps: int, run_dir: Path) -> list[dict]:
    cmd = [
        sys.executable,
        "-m",
        "rlcore",
        "run",
        str(manifest),
        "--run-dir",
        str(run_dir),
        "--set",
        f"trainer.steps={steps}",
        "--set",
        f"trainer.eval_every={steps}",
        "--set",
        "trainer.save_every=0",
    ]
    subprocess.run(cmd, check=True)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def plain_loop(manifest: Path, steps: int) -> list[float]:
    """Step times of the plain GRPO loop on the manifest's model, prompts and batch shape."""
    import torch

    from rlcore.data import load_prompts
    from rlcore.manifest.loader import load_manifest
    from rlcore.trainer import models

    m = load_manifest(manifest)
    cfg = m.core
    model_cfg = models.materialize_gguf(cfg.model)
    tokenizer = models.load_tokenizer(model_cfg)
    lm = models.load_causal_lm(model_cfg, "cpu")
    prompts = load_prompts(
        cfg.data.train, tokenizer=tokenizer, max_prompt_tokens=cfg.data.max_prompt_tokens
    ).prompts
    optimizer = torch.optim.AdamW(lm.parameters(), lr=cfg.trainer.lr)
    n, k = cfg.data.prompts_per_step, cfg.rollout.samples_per_prompt
    tokenizer.padding_side = "left"
    times = []
    for step in range(steps):
        start = time.perf_counter()
        batch = prompts[step * n : (step + 1) * n]
        enc = tokenizer.pad({"input_ids": [p.token_ids for p in batch]}, return_tensors="pt")
        with torch.no_grad():
            out = lm.generate(
                **enc,
                do_sample=True,
                temperature=cfg.rollout.temperature,
                num_return_sequences=k,
                max_new_tokens=cfg.data.max_response_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        response = out[:, enc["input_ids"].shape[1] :]
        texts = tokenizer.batch_decode(response, skip_special_tokens=True)
        truths = [p.ground_truth for p in batch for _ in range(k)]
        scores = torch.tensor(
            [
                float(str(t) in text.split()[-1:] or text.strip().endswith(str(t)))
                for text, t in zip(texts, truths)
            ]
        )
        groups = scores.view(n, k)
        adv = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-6)).view(-1)
        mask = (response != tokenizer.pad_token_id).float()
        attention = torch.cat([enc["attention_mask"].repeat_interleave(k, 0), mask.long()], 1)
        logits = (
            lm(input_ids=out, attention_mask=attention).logits[:, enc["input_ids"].shape[1] - 1 : -1].float()
        )
        logp = (
            torch.log_softmax(logits / cfg.rollout.temperature, -1)
            .gather(-1, response.unsqueeze(-1))
            .squeeze(-1)
        )
        loss = -(logp * adv.unsqueeze(1) * mask).sum() / mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--manifest",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "examples" / "quickstart.toml",
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = run_rlcore(args.manifest, args.steps, Path(tmp) / "run")
    train = [r for r in rows if "timing_s/step" in r]
    val = [r for r in rows if "val/reward/mean" in r]
    step_s = sum(r["timing_s/step"] for r in train) / len(train)
    tokens = sum(r["perf/total_num_tokens"] for r in train) / sum(r["timing_s/step"] for r in train)
    print(
        f"\nrlcore: {len(train)} steps, {1 / step_s:.3f} steps/s ({step_s:.1f} s/step), {tokens:.0f} tokens/s "
        f"(prompt + response tokens trained per second)"
    )
    if val:
        print(
            f"validation reward: before {val[0]['val/reward/mean']:.3f}, after {val[-1]['val/reward/mean']:.3f}"
        )
    print("training reward per step:", [round(r["critic/score/mean"], 3) for r in train])
    if not args.no_baseline:
        times = plain_loop(args.manifest, args.steps)
        plain = sum(times) / len(times)
        print(f"plain GRPO loop (transformers generate + one policy-gradient step): {plain:.1f} s/step")
        print(f"ratio plain / rlcore step time: {plain / step_s:.2f}x (above 1: rlcore is faster)")


if __name__ == "__main__":
    main()
