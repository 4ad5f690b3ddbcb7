"""One GRPO step, rlcore against TRL's GRPOTrainer, on one device, at equal precision.

    python benchmarks/grpo_step.py [--shape 0.5b|1.5b|3b|7b|tiny] [--device cuda|cpu] [--steps 3]
                                   [--precision mixed|float32|bf16] [--trl-vllm] [--skip-trl] [--lora RANK]
                                   [--workload P S T R] [--also-unshared] [--json OUT]

Issue 24's set: ``--shape 3b --trl-vllm`` (full fine-tuning), ``--shape 7b --lora 16 --trl-vllm``
(LoRA on every linear layer, TRL through peft) and ``--shape 1.5b --workload 256 4 128 256``.
``--also-unshared`` runs rlcore's step a second time with ``[model] share_prompts = false`` (each
sample packed whole, as before prompt sharing), so both rlcore figures come from the same run.

The workload of issue 7: P prompts x S samples (64 x 4), 128-token prompts, 256-token responses
forced to full length, one optimizer step, no KL. The model is randomly initialised with a real
architecture (speed does not depend on weight values); prompts are random token ids and the
reward is synthetic and dense (the share of even token ids in the response), so no tokenizer
files, data sets or downloads are needed. A word-level tokenizer ("t0" ... "tV-1") maps every id
of the model's vocabulary, so text round-trips to the same ids exactly.

Precision: both sides keep float32 master weights and float32 optimizer state and compute in
bfloat16 (--precision mixed, rlcore's CUDA default; TRL with bf16=True, which autocasts over
float32 weights). --precision float32 / --trl-precision fp32 compare float32 compute instead.

Measured, in this order:
  (a) TRL GRPOTrainer without vLLM (transformers generate), first step (on_step_begin to
      on_step_end): its later steps are not usable on random weights (NaN gradients, then a failed
      generation; ../shared/gpu/README.md). Full-length completions: min_new_tokens.
  (a') with --trl-vllm: TRL GRPOTrainer with vLLM colocated (use_vllm=True, vllm_mode="colocate",
      the set-up its users pick), in a child process of its own (vLLM keeps GPU memory until its
      process ends): --trl-steps steps, the median after the first. Full length: ignore_eos.
  (b) rlcore's step through RLTrainer.train_step (what `rlcore run` calls each step): the `hf`
      engine, grpo advantages, ppo_clip loss, one optimizer step per rollout batch. The first
      --warmup steps are run and reported but not timed into the mean (CUDA and allocator warm-up).
      Model loading and set-up are excluded. Peak memory per step: max_memory_allocated, reset
      before each step. The tokenizer has no EOS, so every response has exactly R tokens.
  (c) rlcore's actor update alone (RLTrainer.update_actor: packed forward, chunked log-probs and
      entropy, backward, clipping, AdamW) on a batch of the step's shape (P*S sequences of
      prompt+response tokens): tokens/s and MFU = 6 * N * tokens/s / peak, N counting every
      parameter once (the tied embedding once), attention score FLOPs not counted.
  (d) with --shape 1.5b (or --also-1.5b): the same rlcore step on the Qwen2.5-1.5B shape.

Plugins: the `hf` engine and `grpo` estimator come from plugins/rollout_hf and plugins/algo_grpo.
When they are not installed (no entry points, as on the GPU machine), they are registered here
from plugins/*/src, exactly as the entry points would register them.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from model_shapes import (
    QWEN2_5_0_5B,
    QWEN2_5_1_5B,
    QWEN2_5_3B,
    QWEN2_5_7B,
    config_kwargs,
)  # benchmarks/ is on sys.path

ROOT = Path(__file__).resolve().parent.parent
# --precision -> ([model] dtype, [model] compute_dtype): what is stored, what is computed.
PRECISIONS = {
    "mixed": ("float32", "bfloat16"),
    "float32": ("float32", "float32"),
    "bf16": ("bfloat16", "bfloat16"),
}
PEAK_TFLOPS = {"cuda": 790.0}  # measured dense bf16 matrix products on the H200 (../shared/gpu/README.md)

SHAPES = {
    "0.5b": QWEN2_5_0_5B,
    "1.5b": QWEN2_5_1_5B,
    "3b": QWEN2_5_3B,
    "7b": QWEN2_5_7B,
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=4096,
    ),
}
# Workload per shape: (prompts, samples per prompt, prompt tokens, response tokens).
WORKLOADS = {
    "0.5b": (64, 4, 128, 256),
    "1.5b": (64, 4, 128, 256),
    "3b": (64, 4, 128, 256),
    "7b": (64, 4, 128, 256),
    "tiny": (4, 2, 16, 16),
}

REWARD = '''
def score(data_source, solution_str, ground_truth, extra_info=None):
    """Share of even token ids in the response ("t12 t7 ..."): dense, cheap, varies per sample."""
    ids = [int(w[1:]) for w in solution_str.split() if w[:1] == "t" and w[1:].isdigit()]
    return sum(i % 2 == 0 for i in ids) / max(len(ids), 1)
'''


# ---------------------------------------------------------------------------- model, tokenizer, data


def build_tokenizer(vocab_size: int, *, with_eos: bool):
    """A word-level tokenizer over "t0" ... "t{V-1}": every model id has a token, nothing is
    split or merged, so a prompt of K words is K ids. The last id doubles as padding (and as EOS
    for TRL, which needs one; rlcore's copy has none so responses run to full length)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    last = f"t{vocab_size - 1}"
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=last, eos_token=last if with_eos else None, model_max_length=1 << 20
    )
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return fast


def model_config(shape: str):
    from transformers import Qwen2Config

    tok_pad = SHAPES[shape]["vocab_size"] - 1
    return Qwen2Config(
        **config_kwargs(
            SHAPES[shape],
            max_position_embeddings=4096,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=tok_pad,
        )
    )


def random_model(shape: str, device: str, dtype):
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    with torch.device(device):  # initialising a 1.5B model on the GPU takes a second, on 16 cores much longer
        model = Qwen2ForCausalLM(model_config(shape)).to(dtype)
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    return model


def save_model_dir(shape: str, target: Path, device: str) -> tuple[Path, Path]:
    """Hugging Face directories for rlcore: bfloat16 random weights, and beside them the tokenizer
    without EOS (a directory of its own: next to a Qwen2 config.json, AutoTokenizer would pick
    the Qwen2 tokenizer class instead of the word-level one saved here)."""
    import torch

    tokenizer_dir = target.with_name(target.name + "-tokenizer")
    if not (target / "config.json").exists():
        model = random_model(shape, device, torch.bfloat16)
        model.save_pretrained(target)
        del model
        _free()
    if not (tokenizer_dir / "tokenizer.json").exists():
        build_tokenizer(SHAPES[shape]["vocab_size"], with_eos=False).save_pretrained(tokenizer_dir)
    return target, tokenizer_dir


def prompt_texts(count: int, length: int, vocab_size: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(f"t{rng.randrange(vocab_size - 1)}" for _ in range(length)) for _ in range(count)]


def _free() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _reset_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device: str) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None


# ---------------------------------------------------------------------------- (a) TRL


def run_trl(args, prompts: list[str]) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    P, S, _, R = args.workload
    cuda = args.device.startswith("cuda")
    tf32_before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    # LoRA: a frozen bf16 base (what TRL + peft users load), float32 adapters (peft's default
    # autocast), bf16 compute; as rlcore's LoRA run keeps it. Full fine-tuning: float32 weights.
    model = random_model(args.shape, args.device, torch.bfloat16 if args.lora else torch.float32)
    tokenizer = build_tokenizer(SHAPES[args.shape]["vocab_size"], with_eos=True)
    peft_config = None
    if args.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=args.lora, lora_alpha=2 * args.lora, target_modules="all-linear", task_type="CAUSAL_LM"
        )

    def reward(completions, **kwargs):
        out = []
        for text in completions:
            ids = [int(w[1:]) for w in text.split() if w[:1] == "t" and w[1:].isdigit()]
            out.append(sum(i % 2 == 0 for i in ids) / max(len(ids), 1))
        return out

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.begin, self.times = None, []

        def on_step_begin(self, *a, **k):
            _sync(args.device)
            self.begin = time.perf_counter()

        def on_step_end(self, *a, **k):
            _sync(args.device)
            self.times.append(time.perf_counter() - self.begin)

    micro = min(args.trl_micro_batch, P * S)
    bf16 = args.trl_precision == "bf16"
    if (P * S) % micro:
        raise SystemExit(f"--trl-micro-batch {micro} must divide {P * S}")
    out_dir = Path(tempfile.mkdtemp(prefix="trl-", dir=args.out))
    vllm = (
        dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=args.trl_vllm_memory)
        if args.only == "trl-vllm"
        else {}
    )
    if vllm:  # vLLM loads the model by its path (TRL then syncs the trainer's weights into it)
        model_dir = args.out / f"trl-model-{args.shape}"
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        model.name_or_path = model.config._name_or_path = str(model_dir)
    if vllm:  # colocated vLLM joins a torch.distributed group of this one process
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(
            RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
    config = GRPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=P * S // micro,
        num_generations=S,
        max_completion_length=R,
        # Full-length completions: vLLM ignores EOS, transformers suppresses it until R tokens.
        generation_kwargs={"ignore_eos": True} if vllm else {"min_new_tokens": R},
        temperature=1.0,
        beta=0.0,
        learning_rate=1e-6,
        max_steps=args.trl_steps if vllm else 1,
        num_train_epochs=1,
        bf16=bf16 and cuda,
        gradient_checkpointing=not args.trl_no_gradient_checkpointing,  # TRL's default is on
        tf32=(not bf16) if cuda else None,
        **vllm,
        use_cpu=not cuda,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=1,
        disable_tqdm=True,
    )
    timer = StepTimer()
    dataset = Dataset.from_dict({"prompt": prompts * (args.trl_steps if vllm else 1)})
    _reset_peak(args.device)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
        peft_config=peft_config,
    )
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    logs = [row for row in trainer.state.log_history if "loss" in row or "grad_norm" in row]
    steady = sorted(timer.times[1:]) or timer.times
    result = {
        "setup": "vLLM colocated" if vllm else "transformers generate",
        "precision": "bf16 autocast over float32 weights"
        if bf16 and cuda
        else "float32" + ("+TF32" if cuda else ""),
        "step_times_s": timer.times,
        # With vLLM: the median step after the first (steady state); without: the first step.
        "step_s": steady[len(steady) // 2] if vllm else timer.times[0],
        "train_call_s": total,
        "peak_gib": _peak_gib(args.device),
        "micro_batch": micro,
        "gradient_checkpointing": not args.trl_no_gradient_checkpointing,
        "completion_length": (logs[0].get("completions/mean_length") if logs else None),
        "grad_norm": (logs[0].get("grad_norm") if logs else None),
    }
    del trainer, model
    _free()
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32_before
    torch.set_float32_matmul_precision("highest")
    return result


# ---------------------------------------------------------------------------- (b) rlcore


def registry():
    """The registry `rlcore run` would use; plugins without entry points registered from source."""
    import importlib

    from rlcore.registry import Registry

    reg = Registry.discover()
    for plugin, kind, name in (
        ("rollout_hf", "rollout_engine", "hf"),
        ("algo_grpo", "advantage_estimator", "grpo"),
    ):
        if name in reg.components(kind):
            continue
        src = ROOT / "plugins" / plugin / "src"
        if str(src) not in sys.path:
            sys.path.insert(0, str(src))
        reg.register(
            importlib.import_module(f"rlcore_{plugin}.plugin"),
            name=plugin,
            distribution=f"rlcore-{plugin.replace('_', '-')}",
        )
    return reg


def toml_lines(options: list[str]) -> str:
    """``KEY=TOML`` command-line options as the ``key = value`` lines of a manifest table."""
    return "".join(f"{k} = {v}\n" for k, v in (kv.split("=", 1) for kv in options))


def write_manifest(
    args,
    shape: str,
    model_dir: Path,
    tokenizer_dir: Path,
    work: Path,
    prompts: list[str],
    model_options: list[str],
) -> Path:
    P, S, T, R = args.workload
    data = work / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "ground_truth": "0"}) + "\n" for p in prompts))
    (work / "reward.py").write_text(REWARD)
    engine = toml_lines(args.engine_option)
    trainer_extra = toml_lines(args.trainer_option)
    algorithm_extra = toml_lines(args.algorithm_option)
    storage, compute = PRECISIONS[args.precision]
    model_extra = f'dtype = "{storage}"\ncompute_dtype = "{compute}"\n'
    model_extra += f'attn_implementation = "{args.attn}"\n' if args.attn else ""
    model_extra += toml_lines(model_options)
    if args.gradient_checkpointing:
        model_extra += "gradient_checkpointing = true\n"
    lora_table = f"[model.lora]\nrank = {args.lora}\nalpha = {2 * args.lora}\n" if args.lora else ""
    text = f'''
[run]
name = "grpo-step-{shape}"
seed = 1
device = "{"cuda" if args.device.startswith("cuda") else "cpu"}"
[model]
path = "{model_dir}"
tokenizer = "{tokenizer_dir}"
{model_extra}
{lora_table}[data]
train = "{data}"
prompts_per_step = {P}
max_prompt_tokens = {T}
max_response_tokens = {R}
shuffle = false
[rollout]
engine = "{args.engine}"
samples_per_prompt = {S}
temperature = 1.0
{engine}
[reward]
function = "python:{work / "reward.py"}:score"
[algorithm]
advantage = "grpo"
policy_loss = "ppo_clip"
kl_coef = 0.0
mini_batches = 1
ppo_epochs = 1
{algorithm_extra}[trainer]
steps = {args.warmup + args.steps}
lr = 1e-6
micro_batch_tokens = {args.micro_batch_tokens}
loggers = ["jsonl"]
eval_before_train = false
save_every = 0
{trainer_extra}'''
    path = work / f"manifest-{shape}.toml"
    path.write_text(text)
    return path


def run_rlcore(args, shape: str, prompts: list[str], model_options: list[str] | None = None) -> dict:
    import torch

    from rlcore.manifest.loader import load_manifest
    from rlcore.trainer.driver import prepare_run_dir
    from rlcore.trainer.rl import RLTrainer

    work = Path(tempfile.mkdtemp(prefix=f"rlcore-{shape}-", dir=args.out))
    model_dir, tokenizer_dir = save_model_dir(shape, args.out / f"model-{shape}", args.device)
    merged = dict(kv.split("=", 1) for kv in [*args.model_option, *(model_options or [])])  # a later key wins
    model_options = [f"{k}={v}" for k, v in merged.items()]
    manifest = load_manifest(
        write_manifest(args, shape, model_dir, tokenizer_dir, work, prompts, model_options),
        registry=registry(),
    )
    run_dir = work / "run"
    prepare_run_dir(manifest, run_dir, resume=False)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    trainer = RLTrainer(manifest, run_dir)
    trainer.setup()
    steps = []
    try:
        for i in range(args.warmup + args.steps):
            _reset_peak(args.device)
            metrics = trainer.train_step()
            trainer.step += 1
            metrics["peak_gib"] = _peak_gib(args.device)
            steps.append(metrics)
            print(
                f"  rlcore {shape} step {i + 1}{' (warm-up)' if i < args.warmup else ''}: "
                f"{metrics['timing_s/step']:.3f} s (gen {metrics.get('timing_s/gen', 0):.3f}, "
                f"update {metrics.get('timing_s/update_actor', 0):.3f}), "
                f"response length {metrics.get('response_length/mean', 0):.0f}",
                flush=True,
            )
        training = measure_training(args, trainer) if not args.skip_train_only else None
        params = sum(p.numel() for p in trainer.actor.module.parameters())
    finally:
        trainer.close()  # the sinks, the reward workers, a background rollout thread, an engine process
    timed = steps[args.warmup :] or steps
    mean = lambda key: sum(m.get(key, 0.0) for m in timed) / len(timed)  # noqa: E731
    result = {
        "shape": shape,
        "model_options": model_options,
        "parameters": params,
        "step_s": mean("timing_s/step"),
        "gen_s": mean("timing_s/gen"),
        "reward_s": mean("timing_s/reward"),
        "update_actor_s": mean("timing_s/update_actor"),
        "update_weights_s": mean("timing_s/update_weights"),
        "other_s": mean("timing_s/step")
        - sum(
            mean(k)
            for k in ("timing_s/gen", "timing_s/reward", "timing_s/update_actor", "timing_s/update_weights")
        ),
        "response_length": mean("response_length/mean"),
        "logprob_diff": mean("rollout_corr/logprob_diff/mean"),
        "peak_gib": max((m["peak_gib"] for m in timed if m["peak_gib"] is not None), default=None),
        "steps": [
            {
                k: v
                for k, v in m.items()
                if k.startswith(
                    ("timing_s/", "actor/", "async/", "rollout/staleness", "peak_gib", "response_length/mean")
                )
            }
            for m in steps
        ],
        "training": training,
    }
    del trainer
    _free()
    torch.backends.cuda.matmul.allow_tf32 = False
    return result


# ---------------------------------------------------------------------------- (c) training alone


def measure_training(args, trainer) -> dict:
    """Time RLTrainer.update_actor on a synthetic batch of the step's exact shape."""
    import torch

    from rlcore.interfaces import Prompt, Trajectory
    from rlcore.trainer.batch import build_batch

    P, S, T, R = args.workload
    vocab = trainer.actor.module.config.vocab_size
    g = torch.Generator().manual_seed(0)
    trajectories = []
    for _p in range(P):
        prompt = Prompt(token_ids=torch.randint(0, vocab, (T,), generator=g).tolist(), messages=[])
        for _ in range(S):
            trajectories.append(
                Trajectory(
                    prompt=prompt,
                    response_ids=torch.randint(0, vocab, (R,), generator=g).tolist(),
                    response_mask=[1] * R,
                    rollout_logprobs=[-11.0] * R,
                )
            )
    scores = torch.rand(len(trajectories), generator=g).tolist()
    batch = build_batch(trajectories, scores, S)
    trainer._advantages(batch, {})
    tokens = sum(batch.sequence_lengths())
    packed = sum(m.num_tokens for m in trainer.actor.batching.micro_batches(batch) if m is not None)
    times, peaks = [], []
    for i in range(args.train_iters + 1):  # the first call warms up
        _reset_peak(args.device)
        start = time.perf_counter()
        out = trainer.update_actor(batch, 1.0, has_old=False)
        _sync(args.device)
        if i:
            times.append(time.perf_counter() - start)
            peaks.append(_peak_gib(args.device))
    seconds = sum(times) / len(times)
    params = sum(p.numel() for p in trainer.actor.module.parameters())
    peak = PEAK_TFLOPS.get(args.device.split(":")[0])
    flops = 6 * params * tokens / seconds
    return {
        "tokens": tokens,
        "packed_tokens": packed,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "tflops": flops / 1e12,
        "mfu": flops / (peak * 1e12) if peak else None,
        "peak_gib": max(peaks) if peaks and peaks[0] is not None else None,
        "grad_norm": out.get("actor/grad_norm"),
    }


# ---------------------------------------------------------------------------- report


def _fmt(value, spec: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def report(results: dict, args) -> None:
    P, S, T, R = args.workload
    storage, compute = PRECISIONS[args.precision]
    print(
        f"\nGRPO step: {P} prompts x {S} samples, {T}-token prompts, {R}-token responses, one optimizer step, "
        f"no KL; device {args.device}; rlcore: {storage} weights and optimizer state, {compute} compute; "
        f"options {results['rlcore_options']}"
    )
    rows = []
    peers = [(key, results[key]) for key in ("trl", "trl_vllm") if results.get(key)]
    for key, trl in peers:
        which = "median after the 1st" if key == "trl_vllm" else "1st step"
        what = f"TRL, {trl['setup']}, {which} ({trl['precision']}, mb {trl['micro_batch']}{', GC' if trl['gradient_checkpointing'] else ''})"
        rows.append((what, args.shape, trl["step_s"], None, None, trl["peak_gib"]))
    for key in ("rlcore", "rlcore_unshared", "rlcore_1.5b"):
        r = results.get(key)
        if r:
            options = f", {', '.join(r['model_options'])}" if r.get("model_options") else ""
            rows.append(
                (
                    f"rlcore step (mean of {args.steps}, after {args.warmup} warm-up{options})",
                    r["shape"],
                    r["step_s"],
                    r["gen_s"],
                    r["update_actor_s"],
                    r["peak_gib"],
                )
            )
    print(f"{'what':<96} {'shape':>6} {'step s':>8} {'gen s':>8} {'train s':>8} {'peak GiB':>9}")
    for what, shape, step, gen, train, peak in rows:
        print(
            f"{what:<96} {shape:>6} {_fmt(step, '.3f'):>8} {_fmt(gen, '.3f'):>8} {_fmt(train, '.3f'):>8} {_fmt(peak, '.1f'):>9}"
        )
    goals = {"trl": 5, "trl_vllm": 3}
    for key, trl in peers:
        for ours in ("rlcore", "rlcore_unshared"):
            if results.get(ours):
                ratio = trl["step_s"] / results[ours]["step_s"]
                results[f"ratio_{key}_over_{ours}"] = ratio
                print(
                    f"\nTRL ({trl['setup']}) / {ours} step time: {ratio:.2f}x (goal: at least {goals[key]}x); "
                    f"TRL step times {', '.join(f'{t:.2f}' for t in trl['step_times_s'])} s"
                )
    for key in ("rlcore", "rlcore_unshared", "rlcore_1.5b"):
        r = results.get(key)
        if r and r.get("training"):
            t = r["training"]
            print(
                f"\nactor update alone ({key}, {r['shape']}, {t['tokens']} tokens, {t.get('packed_tokens', '-')} packed, "
                f"N = {r['parameters'] / 1e6:.1f}M "
                f"parameters, tied embedding once): {t['seconds'] * 1e3:.1f} ms, {t['tokens_per_s']:,.0f} tokens/s, "
                f"{t['tflops']:.1f} TFLOP/s by 6N over all tokens, MFU {_fmt(t['mfu'] and 100 * t['mfu'], '.1f', '%')} "
                f"of {PEAK_TFLOPS.get(args.device.split(':')[0], '-')} TFLOP/s; peak {_fmt(t['peak_gib'], '.1f', ' GiB')}"
            )
        if r:
            print(
                f"rlcore {r['shape']} step split: gen {r['gen_s']:.3f} s, reward {r['reward_s']:.3f} s, "
                f"actor update {r['update_actor_s']:.3f} s, weight sync {r['update_weights_s']:.3f} s, "
                f"other {r['other_s']:.3f} s; mean response length {r['response_length']:.1f}; "
                f"rollout/trainer log-prob gap {_fmt(r.get('logprob_diff'), '.4f')} (mean |diff|)"
            )


def run_trl_vllm_child(args) -> dict:
    """TRL with vLLM colocated, in a child process: vLLM holds its GPU memory until its process ends."""
    import subprocess

    out = args.out / "trl-vllm.json"
    command = [
        sys.executable,
        __file__,
        "--only",
        "trl-vllm",
        "--shape",
        args.shape,
        "--device",
        args.device,
        "--workload",
        *map(str, args.workload),
        "--trl-steps",
        str(args.trl_steps),
        "--trl-precision",
        args.trl_precision,
        "--trl-micro-batch",
        str(args.trl_micro_batch),
        "--trl-vllm-memory",
        str(args.trl_vllm_memory),
        "--out",
        str(args.out),
        "--json",
        str(out),
        "--lora",
        str(args.lora),
    ]
    if args.trl_no_gradient_checkpointing:
        command.append("--trl-no-gradient-checkpointing")
    subprocess.run(command, check=True)
    return json.loads(out.read_text())["trl_vllm"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="0.5b", choices=sorted(SHAPES))
    parser.add_argument(
        "--also-1.5b",
        dest="also_15b",
        action="store_true",
        help="after the 0.5b runs, the rlcore step at 1.5b too",
    )
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--steps", type=int, default=3, help="timed rlcore steps")
    parser.add_argument(
        "--warmup", type=int, default=1, help="rlcore steps run first and left out of the mean"
    )
    parser.add_argument(
        "--train-iters", type=int, default=3, help="timed actor updates in (c), after one warm-up"
    )
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument(
        "--skip-train-only", action="store_true", help="skip the actor-update-alone measurement"
    )
    parser.add_argument(
        "--workload", type=int, nargs=4, metavar=("PROMPTS", "SAMPLES", "PROMPT_TOKENS", "RESPONSE_TOKENS")
    )
    parser.add_argument(
        "--precision",
        default=None,
        choices=sorted(PRECISIONS),
        help="rlcore: mixed = float32 weights, bf16 compute (default on cuda); float32; bf16 = bf16 weights (no master)",
    )
    parser.add_argument(
        "--trl-precision",
        default="bf16",
        choices=["bf16", "fp32"],
        help="TRL: bf16 = bf16=True (autocast over float32 weights, the like of --precision mixed); fp32 = float32 with TF32",
    )
    parser.add_argument(
        "--trl-vllm", action="store_true", help="also TRL with vLLM colocated (a child process)"
    )
    parser.add_argument(
        "--trl-steps", type=int, default=6, help="TRL steps with vLLM; the median after the first is reported"
    )
    parser.add_argument(
        "--trl-vllm-memory", type=float, default=0.3, help="TRL's vllm_gpu_memory_utilization"
    )
    parser.add_argument("--only", choices=["trl-vllm"], default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--attn", default=None, help="[model] attn_implementation for rlcore (default: transformers' choice)"
    )
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument(
        "--lora",
        type=int,
        default=0,
        metavar="RANK",
        help="LoRA of this rank on every linear layer (alpha = 2 x rank) on both sides; TRL through peft",
    )
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument(
        "--model-option",
        action="append",
        default=[],
        metavar="KEY=TOML",
        help="extra [model] keys for rlcore (e.g. share_prompts=false)",
    )
    parser.add_argument(
        "--also-unshared",
        action="store_true",
        help="run rlcore's step again with [model] share_prompts = false, side by side",
    )
    parser.add_argument(
        "--trainer-option",
        action="append",
        default=[],
        metavar="KEY=TOML",
        help="extra [trainer] keys (e.g. profile_steps=[2])",
    )
    parser.add_argument(
        "--algorithm-option",
        action="append",
        default=[],
        metavar="KEY=TOML",
        help='extra [algorithm] keys (e.g. rollout_correction="token_truncate", which an FP8 vLLM rollout needs)',
    )
    parser.add_argument(
        "--engine", default="hf", help="rlcore's [rollout] engine (hf, or vllm where installed)"
    )
    parser.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=TOML",
        help='a [rollout] option of the engine, e.g. max_batch_size=256 or quantization="fp8" (repeatable)',
    )
    parser.add_argument(
        "--trl-micro-batch",
        type=int,
        default=64,
        help="TRL per_device_train_batch_size; gradient accumulation makes up the rest of the batch (one optimizer step)",
    )
    parser.add_argument(
        "--trl-no-gradient-checkpointing",
        action="store_true",
        help="turn off TRL's default gradient checkpointing",
    )
    parser.add_argument("--out", type=Path, default=None, help="working directory (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()

    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.precision = args.precision or ("mixed" if args.device.startswith("cuda") else "float32")
    args.workload = tuple(args.workload or WORKLOADS[args.shape])
    args.out = args.out or Path(tempfile.mkdtemp(prefix="grpo-step-"))
    args.out.mkdir(parents=True, exist_ok=True)
    P, S, T, R = args.workload
    prompts = prompt_texts(P, T, SHAPES[args.shape]["vocab_size"])

    results: dict = {
        "device": args.device,
        "workload": dict(prompts=P, samples=S, prompt_tokens=T, response_tokens=R),
        "shape": args.shape,
        "precision": args.precision,
        "trl_precision": args.trl_precision,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "rlcore_options": {
            "attn_implementation": args.attn,
            "micro_batch_tokens": args.micro_batch_tokens,
            "gradient_checkpointing": args.gradient_checkpointing,
            "engine": args.engine_option,
            "lora_rank": args.lora or None,
        },
    }
    if args.only == "trl-vllm":
        import trl

        results = {"trl_vllm": {**run_trl(args, prompts), "version": trl.__version__}}
        args.json.write_text(json.dumps(results, indent=2))
        return
    if args.trl_vllm:
        print(f"(a') TRL GRPOTrainer with vLLM colocated, {args.shape} (child process)", flush=True)
        results["trl_vllm"] = run_trl_vllm_child(args)
        print(f"  TRL with vLLM: median step {results['trl_vllm']['step_s']:.3f} s", flush=True)
    if not args.skip_trl:
        import trl

        print(f"(a) TRL {trl.__version__} GRPOTrainer, {args.shape}", flush=True)
        results["trl"] = run_trl(args, prompts)
        results["trl"]["version"] = trl.__version__
        print(f"  TRL first step: {results['trl']['step_s']:.3f} s", flush=True)
    print(f"(b) rlcore step, {args.shape}", flush=True)
    results["rlcore"] = run_rlcore(args, args.shape, prompts)
    if args.also_unshared:
        print(f"(b') rlcore step, {args.shape}, share_prompts = false", flush=True)
        results["rlcore_unshared"] = run_rlcore(args, args.shape, prompts, ["share_prompts=false"])
    if args.also_15b and args.shape != "1.5b":
        print("(d) rlcore step, 1.5b", flush=True)
        results["rlcore_1.5b"] = run_rlcore(args, "1.5b", prompt_texts(P, T, SHAPES["1.5b"]["vocab_size"]))
    report(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"\nresults written to {args.json}")


if __name__ == "__main__":
    main()
