"""The largest model one GPU trains, with and without ``[trainer] fsdp_offload``.

    python benchmarks/offload_capacity.py [--layers 6,13,32,48] [--no-search] [--budget-s 300]
                                          [--tokens 4096] [--gpu-limit-gib G] [--json OUT]
    python benchmarks/offload_capacity.py --quick      # tiny shapes on CPU: a smoke check

The Llama-2-7B shape family (hidden 4096, 32 heads, intermediate 11008, vocab 32000, untied
embeddings) at several layer counts: 6 layers ~1.5B parameters, 13 ~2.9B, 32 ~6.7B (Llama-2-7B
itself), 48 ~10B, 64 ~13B. Each attempt, in a child process of its own (an out-of-memory error
must not poison the next), builds rlcore's actor exactly as ``rlcore run`` does on one rank
(rlcore.trainer.actor.Actor: float32 weights and AdamW state, bfloat16 compute -- float32 masters
beside a bfloat16 module without offload, FSDP2 over a process group of one with its
MixedPrecisionPolicy and CPUOffloadPolicy with it; gradient checkpointing; the varlen attention)
and runs two actor updates (Actor.update: packed forward, chunked log-probs, backward, clipping,
AdamW) on a synthetic batch of --tokens tokens (sequences of 1024: 512 prompt, 512 response).
Only the model loading is replaced: the weights are random, initialised on the GPU from the
config (writing 27 GB of random weights to disk to load them again would take minutes).

A shape fits when both updates finish; the table gives its parameters, the peak GPU memory
during the updates (max_memory_allocated, reset after the actor is built: the random weights are
made on the GPU, whereas `rlcore run` loads offloaded weights into CPU memory), the peak host memory of the
child (its maximum RSS), and the second update's time. With offload the float32 weights, their
gradients and AdamW's two moments (16 bytes a parameter) live in host memory: an attempt that
would need more than the host has is reported as not fitting without being run (it would only
bring the out-of-memory killer). --gpu-limit-gib caps the GPU memory the children may use
(torch.cuda.set_per_process_memory_fraction), to ask what fits on a smaller GPU.

The listed shapes run smallest first, each mode stopping at its first failure; Then (unless
--no-search) it bisects the layer count between each mode's largest fit and smallest failure while --budget-s
(whole benchmark) lasts, starting at the layer count the measured memory per layer predicts. Without CUDA (and without --quick) it exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LLAMA2_7B_FAMILY = dict(
    hidden_size=4096,
    num_attention_heads=32,
    num_key_value_heads=32,
    intermediate_size=11008,
    vocab_size=32000,
)
TINY_FAMILY = dict(
    hidden_size=64, num_attention_heads=4, num_key_value_heads=4, intermediate_size=128, vocab_size=512
)
SEQUENCE = (512, 512)  # prompt, response tokens of each synthetic sequence (--quick: 16, 16)
# Offloaded: float32 weight, gradient and two AdamW moments (16 bytes), and the copies while sharding;
# measured 17.6 bytes a parameter at 6.7B on the H200 machine.
HOST_BYTES_PER_PARAM = 18


def parameters(family: dict, layers: int) -> int:
    h, i, v = family["hidden_size"], family["intermediate_size"], family["vocab_size"]
    kv = h * family["num_key_value_heads"] // family["num_attention_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h
    return layers * per_layer + 2 * v * h + h


def host_available_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


# ---------------------------------------------------------------------------- one attempt (the child)


def attempt(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from rlcore.algorithms.losses import build_ppo_clip
    from rlcore.algorithms.objective import ObjectiveOptions
    from rlcore.builtin.options import PPOClipOptions
    from rlcore.interfaces import Prompt, Trajectory
    from rlcore.manifest.schema import Manifest
    from rlcore.trainer import models, precision
    from rlcore.trainer.actor import Actor
    from rlcore.trainer.batch import build_batch
    from rlcore.trainer.batching import Batching
    from rlcore.trainer.distributed import Distributed

    family = TINY_FAMILY if args.quick else LLAMA2_7B_FAMILY
    cuda = args.device == "cuda"
    if cuda and args.gpu_limit_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.gpu_limit_gib * 2**30 / total))
    work = Path(args.work)
    config = LlamaConfig(
        **family, num_hidden_layers=args.layers, max_position_embeddings=4096, tie_word_embeddings=False
    )
    config.save_pretrained(work)  # [model] path: a config directory (the weights are made below)

    def random_causal_lm(model_cfg, device, path=None, *, dtype=None, place=None):
        """models.load_causal_lm's result, with random weights: the same attention choice and dtype."""
        attention = model_cfg.attn_implementation or ("rlcore_varlen" if device.startswith("cuda") else None)
        if attention == "rlcore_varlen":
            from rlcore.trainer.attention import register

            register()
        torch.manual_seed(0)
        kwargs = {"attn_implementation": attention} if attention else {}
        with torch.device(device):  # initialising on the GPU takes a second, on the CPU much longer
            lm = AutoModelForCausalLM.from_config(
                config, dtype=precision.torch_dtype(dtype or model_cfg.dtype), **kwargs
            )
        return lm.to(place or device)

    models.load_causal_lm = random_causal_lm
    prompt_len, response_len = (16, 16) if args.quick else SEQUENCE
    cfg = Manifest.model_validate(
        {
            "run": {"device": args.device},
            "model": {
                "path": str(work),
                "dtype": "float32",
                "compute_dtype": "bfloat16",
                "gradient_checkpointing": not args.no_gradient_checkpointing,
                "compile": False,
            },
            "data": {
                "train": "synthetic:addition",
                "max_prompt_tokens": prompt_len,
                "max_response_tokens": response_len,
            },
            "reward": {"function": "gsm8k"},
            "trainer": {"lr": 1e-6, "micro_batch_tokens": args.tokens, "fsdp_offload": args.offload},
        }
    )
    dist = Distributed.from_env(args.device, shard_one=cfg.trainer.fsdp_offload)
    device = "cuda:0" if cuda else "cpu"
    prec = precision.resolve(cfg.model, device)
    batching = Batching(dist, device, cfg.trainer.micro_batch_tokens, 1)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    actor = Actor(cfg, cfg.model, prec, dist, device, batching, None)
    built_s = time.perf_counter() - start
    build_peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    if cuda:  # the random initialisation on the GPU is the benchmark's, not rlcore's (which loads offloaded weights on the CPU)
        torch.cuda.reset_peak_memory_stats()

    count = max(1, args.tokens // (prompt_len + response_len))
    g = torch.Generator().manual_seed(0)
    vocab = family["vocab_size"]
    trajectories = [
        Trajectory(
            prompt=Prompt(
                token_ids=torch.randint(0, vocab, (prompt_len,), generator=g).tolist(), messages=[]
            ),
            response_ids=torch.randint(0, vocab, (response_len,), generator=g).tolist(),
            response_mask=[1] * response_len,
            rollout_logprobs=[-10.0] * response_len,
        )
        for _ in range(count)
    ]
    batch = build_batch(trajectories, torch.rand(count, generator=g).tolist(), 1)
    batch.tensors["advantages"] = torch.randn(batch.response_mask.shape, generator=g) * batch.response_mask
    loss = build_ppo_clip(PPOClipOptions())
    times = []
    for _ in range(2):  # the first update allocates AdamW's state; the second is timed
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = actor.update(
            batch,
            1.0,
            has_old=False,
            policy_loss=loss,
            objective=ObjectiveOptions.from_algorithm(cfg.algorithm, loss),
        )
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    dist.close()
    return {
        "layers": args.layers,
        "offload": args.offload,
        "parameters": actor.parameter_count,
        "fits": True,
        "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "build_peak_gpu_gib": build_peak,
        "peak_host_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "build_s": built_s,
        "first_step_s": times[0],
        "step_s": times[1],
        "tokens": sum(batch.sequence_lengths()),
        "grad_norm": out.get("actor/grad_norm"),
    }


# ---------------------------------------------------------------------------- the parent


def run_attempt(args, layers: int, offload: bool, timeout: float) -> dict:
    family = TINY_FAMILY if args.quick else LLAMA2_7B_FAMILY
    n = parameters(family, layers)
    base = {"layers": layers, "offload": offload, "parameters": n, "fits": False}
    need = HOST_BYTES_PER_PARAM * n + 2 * 2**30
    if offload and not args.quick and need > host_available_bytes():
        return {
            **base,
            "why": f"host memory: needs ~{need / 2**30:.0f} GiB, {host_available_bytes() / 2**30:.0f} available",
        }
    if timeout < 20:
        return {**base, "why": "out of time (--budget-s)", "untried": True}
    with tempfile.TemporaryDirectory() as work:
        result = Path(work) / "result.json"
        cmd = [
            sys.executable,
            __file__,
            "--child",
            "--layers",
            str(layers),
            "--work",
            work,
            "--result",
            str(result),
            "--device",
            args.device,
            "--tokens",
            str(args.tokens),
        ]
        cmd += ["--offload"] if offload else []
        cmd += ["--quick"] if args.quick else []
        cmd += ["--no-gradient-checkpointing"] if args.no_gradient_checkpointing else []
        cmd += ["--gpu-limit-gib", str(args.gpu_limit_gib)] if args.gpu_limit_gib else []
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
        }
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            budget = timeout < args.attempt_timeout_s
            return {
                **base,
                "why": f"timed out after {timeout:.0f} s" + (" (out of --budget-s)" if budget else ""),
                "untried": budget,
                "wall_s": time.perf_counter() - start,
            }
        wall = time.perf_counter() - start
        if proc.returncode == 0 and result.exists():
            return {**json.loads(result.read_text()), "wall_s": wall}
        text = proc.stdout + proc.stderr
        oom = "out of memory" in text.lower() or "OutOfMemoryError" in text
        why = (
            "GPU out of memory"
            if oom
            else f"exit {proc.returncode}: " + (text.strip().splitlines() or ["?"])[-1][:200]
        )
        if proc.returncode in (-9, 137) and not oom:
            why = "killed (host out of memory?)"
        return {**base, "why": why, "wall_s": wall}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--layers", default=None, help="comma-separated layer counts (default 6,13,32,48; --quick 1,2)"
    )
    p.add_argument(
        "--no-search",
        action="store_true",
        help="only the listed shapes (default: then search between "
        "each mode's largest fit and smallest failure)",
    )
    p.add_argument("--budget-s", type=float, default=300.0, help="wall-clock budget of the whole benchmark")
    p.add_argument("--attempt-timeout-s", type=float, default=150.0)
    p.add_argument("--tokens", type=int, default=4096, help="tokens in the update's batch (one micro-batch)")
    p.add_argument("--gpu-limit-gib", type=float, default=None)
    p.add_argument("--no-gradient-checkpointing", action="store_true")
    p.add_argument("--modes", default="plain,offload", help="plain, offload, or both")
    p.add_argument("--quick", action="store_true", help="tiny shapes on the CPU (a smoke check)")
    p.add_argument("--json", default=None, help="write the results here")
    # The child's arguments.
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--offload", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--device", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.child:
        args.layers = int(args.layers)
        Path(args.result).write_text(json.dumps(attempt(args)))
        return 0

    import torch

    if args.quick:
        args.device = "cpu"
        args.tokens = min(args.tokens, 64)
    elif not torch.cuda.is_available():
        print(
            "offload_capacity.py measures GPU memory and needs CUDA, which this machine does not have "
            "(python benchmarks/offload_capacity.py --quick runs tiny shapes on the CPU)",
            file=sys.stderr,
        )
        return 2
    else:
        args.device = "cuda"
    layers = sorted({int(x) for x in (args.layers or ("1,2" if args.quick else "6,13,32,48")).split(",")})
    modes = [m == "offload" for m in args.modes.split(",")]
    deadline = time.perf_counter() + args.budget_s
    results: list[dict] = []

    def run(n: int, offload: bool) -> dict:
        timeout = min(args.attempt_timeout_s, deadline - time.perf_counter())
        r = run_attempt(args, n, offload, timeout)
        results.append(r)
        said = (
            f"fits, peak GPU {_fmt(r.get('peak_gpu_gib'), '.1f')} GiB, step {r['step_s']:.2f} s"
            if r["fits"]
            else f"does not fit: {r['why']}"
        )
        print(
            f"  {'offload' if offload else 'plain  '} {n:3d} layers ({r['parameters'] / 1e9:.2f}B): {said}",
            flush=True,
        )
        return r

    for offload in modes:
        for n in layers:
            if not run(n, offload)["fits"]:
                break
    if not args.no_search:
        for offload in modes:
            mine = [r for r in results if r["offload"] == offload]
            lo = max((r["layers"] for r in mine if r["fits"]), default=0)
            hi = min((r["layers"] for r in mine if not r["fits"] and not r.get("untried")), default=None)
            guess = predict(
                args, mine, offload
            )  # first the layer count the measured memory per layer predicts
            while hi is not None and hi - lo > 1 and deadline - time.perf_counter() > 30:
                mid = min(max(guess, lo + 1), hi - 1) if guess is not None else (lo + hi) // 2
                r = run(mid, offload)
                if r.get("untried"):
                    break
                if r["fits"]:
                    lo = mid
                    guess = (
                        mid + 1 if guess is not None else None
                    )  # the prediction is usually within one layer
                else:
                    hi = mid
                    guess = mid - 1 if guess is not None else None
    report(results, args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def predict(args, mine: list[dict], offload: bool) -> int | None:
    """The largest layer count whose peak memory (GPU without offload, host with it) a straight
    line through the two largest fits keeps under the capacity; None without two fits."""
    key = "peak_host_gib" if offload else "peak_gpu_gib"
    fits = sorted((r for r in mine if r["fits"] and r.get(key)), key=lambda r: r["layers"])[-2:]
    if len(fits) < 2 or args.quick:
        return None
    import torch

    (l1, m1), (l2, m2) = [(r["layers"], r[key]) for r in fits]
    if l2 == l1 or m2 <= m1:
        return None
    capacity = (
        host_available_bytes() / 2**30
        if offload
        else args.gpu_limit_gib or torch.cuda.get_device_properties(0).total_memory / 2**30
    )
    return int(l2 + (capacity * 0.98 - m2) * (l2 - l1) / (m2 - m1))


def _fmt(value, spec: str) -> str:
    return "-" if value is None else f"{value:{spec}}"


def report(results: list[dict], args) -> None:
    device = "cpu (--quick)" if args.quick else torch_device_name()
    limit = f", capped at {args.gpu_limit_gib:g} GiB" if args.gpu_limit_gib else ""
    print(
        f"\nOne actor update (float32 weights and AdamW, bfloat16 compute, {args.tokens} tokens) on {device}{limit}"
    )
    print(
        f"{'mode':8} {'layers':>6} {'params':>8} {'fits':>4} {'peak GPU GiB':>12} {'peak host GiB':>13} {'step s':>7}  note"
    )
    for r in sorted(results, key=lambda r: (r["offload"], r["layers"])):
        print(
            f"{'offload' if r['offload'] else 'plain':8} {r['layers']:6d} {r['parameters'] / 1e9:7.2f}B "
            f"{'yes' if r['fits'] else 'no':>4} {_fmt(r.get('peak_gpu_gib'), '12.1f')} "
            f"{_fmt(r.get('peak_host_gib'), '13.1f')} {_fmt(r.get('step_s'), '7.2f')}  {r.get('why', '')}"
        )
    for offload in (False, True):
        fits = [r for r in results if r["offload"] == offload and r["fits"]]
        if fits:
            best = max(fits, key=lambda r: r["layers"])
            print(
                f"largest that fits {'with' if offload else 'without'} offload: {best['layers']} layers, "
                f"{best['parameters'] / 1e9:.2f}B parameters"
            )


def torch_device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


if __name__ == "__main__":
    sys.exit(main())
