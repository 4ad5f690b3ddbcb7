"""Build the small models that ``gpu_check.py`` compares vLLM against, on CPU, in a minute or two.

Random weights give near-flat next-token distributions: bf16 kernel differences then flip
argmaxes, and one flip changes the rest of a greedy sequence, so a weight-update check on them
cannot tell a loading bug from rounding. These models are *trained* on deterministic synthetic
tasks instead, so that every greedy step has a wide margin:

- ``A``: a 4-layer Qwen2 (hidden 256, vocab 2048) trained to repeat the token two back
  (``s[t+1] = s[t-1]``), so its greedy output alternates the prompt's last two tokens.
- ``B``: ``A`` trained further to emit the successor of the last token
  (``s[t+1] = succ(s[t])``, counting through the domain): the lag-2 attention path must be
  switched off and the output remapped, so B's greedy output differs from A's everywhere. Its
  full state is what a full update sends.
- ``lora1`` / ``lora2``: PEFT LoRA adapters (rank 8, all linear layers) trained on top of ``A``
  to repeat the token three back, and to count like B.

Each model is trained until its greedy outputs on the check prompts follow its task (a few
hundred steps; a stalled run gets more steps), and is refused otherwise.
All tokens are drawn from ``DOMAIN`` (256 ids); the other ids exist only to give the model a
realistic vocabulary. Models are saved in bf16 (what vLLM runs), with a word-level tokenizer
(``t0`` ... ``t2047``) so that ``vllm serve`` starts without downloads. ``manifest.json`` records
the tasks, the check prompts, and what was measured here (task accuracy and greedy margins in
bf16).

    python plugins/rollout_vllm/scripts/make_check_models.py [OUT_DIR]   # default .gpu/check_models
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

VOCAB, DOMAIN_START, DOMAIN_SIZE = 2048, 8, 256
TRAIN_LEN, PROMPT_LEN, NEW_TOKENS, N_PROMPTS = 32, 12, 16, 8
LORA_RANK, LORA_ALPHA = 8, 16
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# name -> (lag, successor?): s[t+1] = f(s[t+1-lag]), f = identity or the domain successor.
TASKS = {"A": (2, False), "B": (1, True), "lora1": (3, False), "lora2": (1, True)}
VERSION = 1  # bump when the recipe changes, so that stale model directories are rebuilt
DEFAULT_DIR = Path(__file__).resolve().parents[3] / ".gpu" / "check_models"


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def rule(task: str, seq: list[int]) -> int:
    """The next token of ``seq`` under ``task``."""
    lag, succ = TASKS[task]
    tok = seq[-lag]
    return DOMAIN_START + (tok - DOMAIN_START + 1) % DOMAIN_SIZE if succ else tok


def check_prompts(seed: int = 1234) -> list[list[int]]:
    """The prompts gpu_check.py uses: random domain tokens (none seen in training as such)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(DOMAIN_START, DOMAIN_START + DOMAIN_SIZE, (N_PROMPTS, PROMPT_LEN), generator=g)
    ).tolist()


def batch(task: str, size: int, g):
    """Sequences with a random prefix (4..16 tokens) continued by the task's rule, and the
    rule's target at every position where it is defined (-100 elsewhere)."""
    import torch

    lag, succ = TASKS[task]
    seqs = torch.randint(DOMAIN_START, DOMAIN_START + DOMAIN_SIZE, (size, TRAIN_LEN + 1), generator=g)
    prefix = torch.randint(max(4, lag), 17, (size,), generator=g)
    for t in range(lag, TRAIN_LEN + 1):
        src = seqs[:, t - lag]
        nxt = DOMAIN_START + (src - DOMAIN_START + 1) % DOMAIN_SIZE if succ else src
        seqs[:, t] = torch.where(t >= prefix, nxt, seqs[:, t])
    inputs = seqs[:, :-1]
    # the target at position t is f(s[t+1-lag]), defined on random prefixes too
    targets = torch.full_like(inputs, -100)
    src = inputs[:, : TRAIN_LEN - lag + 1]
    targets[:, lag - 1 :] = DOMAIN_START + (src - DOMAIN_START + 1) % DOMAIN_SIZE if succ else src
    return inputs, targets


def train(model, task: str, steps: int, lr: float, seed: int, batch_size: int = 16) -> float:
    import torch

    g = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / steps)
    )
    model.train()
    loss = torch.tensor(0.0)
    for step in range(steps):
        inputs, targets = batch(task, batch_size, g)
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1)
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            log(f"  {task} step {step}: loss {loss.item():.4f}")
    model.eval()
    return float(loss.item())


def greedy_with_margins(model, prompts, new: int = NEW_TOKENS):
    """Greedy continuations (full forward each step, no cache) and the top-1/top-2 logit gap
    at every step."""
    import torch

    outs, margins = [], []
    with torch.no_grad():
        for p in prompts:
            seq = list(p)
            for _ in range(new):
                logits = model(input_ids=torch.tensor([seq])).logits[0, -1].float()
                top = torch.topk(logits, 2)
                margins.append(float(top.values[0] - top.values[1]))
                seq.append(int(top.indices[0]))
            outs.append(seq[len(p) :])
    return outs, margins


def task_accuracy(task: str, prompts, outs) -> float:
    """Fraction of generated tokens that follow the task's rule given what came before."""
    hits = total = 0
    for p, o in zip(prompts, outs):
        seq = list(p)
        for tok in o:
            hits += tok == rule(task, seq)
            total += 1
            seq.append(tok)
    return hits / total


def token_overlap(a, b) -> float:
    return sum(x == y for s, t in zip(a, b) for x, y in zip(s, t)) / sum(len(s) for s in a)


def save_tokenizer(path: Path) -> None:
    """A word-level tokenizer ``t0`` ... ``t2047`` (vLLM's server wants one; ids travel as is)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2"
    ).save_pretrained(str(path))


def config():
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        rope_theta=10000.0,
    )


def is_current(out: Path) -> bool:
    """Whether ``out`` holds models of this recipe version."""
    try:
        return json.loads((out / "manifest.json").read_text())["version"] == VERSION
    except (OSError, ValueError, KeyError):
        return False


def train_until(model, task: str, steps: int, lr: float, seed: int, rounds: int = 3) -> dict:
    """Train ``model`` on ``task`` until its greedy outputs on held-out prompts (not the check
    prompts) follow the task; a run stuck before its phase change gets up to ``rounds`` rounds."""
    held_out = check_prompts(seed=99)
    for r in range(rounds):
        loss = train(model, task, steps, lr, seed=seed + 1000 * r)
        outs, margins = greedy_with_margins(model, held_out)
        acc = task_accuracy(task, held_out, outs)
        log(f"  {task} round {r + 1}: held-out task accuracy {acc:.3f}, min margin {min(margins):.2f}")
        if acc >= 0.99 and min(margins) >= 2.0:
            break
    return {"final_loss": round(loss, 5), "rounds": r + 1, "held_out_accuracy_fp32": round(acc, 4)}


def make(out: Path, steps_a: int = 250, steps_b: int = 200, steps_lora: int = 250) -> dict:
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    stats: dict = {}
    prompts = check_prompts()

    log("training A:", TASKS["A"])
    model = Qwen2ForCausalLM(config())
    stats["A_training"] = train_until(model, "A", steps_a, 3e-3, seed=1)
    model.to(torch.bfloat16).save_pretrained(out / "A", safe_serialization=True)

    log("training LoRA adapters on A")
    for i, name in enumerate(("lora1", "lora2")):
        base = Qwen2ForCausalLM.from_pretrained(out / "A", dtype=torch.float32)
        peft_model = get_peft_model(
            base,
            LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, target_modules=LORA_TARGETS, lora_dropout=0.0),
        )
        stats[f"{name}_training"] = train_until(peft_model, name, steps_lora, 5e-3, seed=10 + i)
        peft_model.save_pretrained(str(out / name), safe_serialization=True)

    log("training B from A:", TASKS["B"])
    model = Qwen2ForCausalLM.from_pretrained(out / "A", dtype=torch.float32)
    stats["B_training"] = train_until(model, "B", steps_b, 2e-3, seed=2)
    model.to(torch.bfloat16).save_pretrained(out / "B", safe_serialization=True)

    for d in ("A", "B"):
        save_tokenizer(out / d)
        (out / d / "generation_config.json").unlink(missing_ok=True)  # greedy comes from the request

    log("measuring greedy outputs in bf16 on the check prompts")
    outs, margins = {}, {}
    for name in ("A", "B"):
        m = Qwen2ForCausalLM.from_pretrained(out / name, dtype=torch.bfloat16).eval()
        outs[name], margins[name] = greedy_with_margins(m, prompts)
    for name in ("lora1", "lora2"):
        base = Qwen2ForCausalLM.from_pretrained(out / "A", dtype=torch.bfloat16)
        pm = PeftModel.from_pretrained(base, str(out / name)).eval()
        outs[name], margins[name] = greedy_with_margins(pm, prompts)
    for name, o in outs.items():
        m = sorted(margins[name])
        stats[name] = {
            "task": {"lag": TASKS[name][0], "successor": TASKS[name][1]},
            "task_accuracy_bf16": round(task_accuracy(name, prompts, o), 4),
            "min_greedy_margin_bf16": round(m[0], 3),
            "median_greedy_margin_bf16": round(m[len(m) // 2], 3),
            "token_overlap_with_A": round(token_overlap(o, outs["A"]), 4),
        }
        log(name, stats[name])
    manifest = {
        "version": VERSION,
        "vocab_size": VOCAB,
        "domain": [DOMAIN_START, DOMAIN_START + DOMAIN_SIZE],
        "prompts": prompts,
        "new_tokens": NEW_TOKENS,
        "lora": {"rank": LORA_RANK, "alpha": LORA_ALPHA, "target_modules": LORA_TARGETS},
        "cpu_greedy_bf16": outs,
        "stats": stats,
        "build_s": round(time.time() - t0, 1),
    }
    bad = [
        n for n in outs if stats[n]["task_accuracy_bf16"] < 0.95 or stats[n]["min_greedy_margin_bf16"] < 1.0
    ]
    if bad:
        (out / "manifest.failed.json").write_text(json.dumps(manifest, indent=1))
        raise RuntimeError(
            f"models {bad} did not learn their tasks (see {out / 'manifest.failed.json'}); rerun to retry"
        )
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    for f in out.rglob("*"):  # safetensors files are written 0600; servers may run as another user
        f.chmod(0o755 if f.is_dir() else 0o644)
    log(f"models written to {out} in {manifest['build_s']} s")
    return manifest


def ensure(out: str | Path = DEFAULT_DIR) -> Path:
    """``out``, with current models in it (built when missing or stale)."""
    out = Path(out)
    if not is_current(out):
        make(out)
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR
    make(target)
