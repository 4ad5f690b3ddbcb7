"""Where the GPU time goes, by kernel category (CUDA only; a development tool, no ratios to meet).

    python benchmarks/profile_gpu.py [decode|call|train|gemm|both] [--shape 0.5b|1.5b|3b|7b] [--batches 64,256]
                                     [--capacities 384,1536] [--attention triton,sdpa] [--mlp fused,separate]
                                     [--workloads fixed,varied] [noeager]

decode: one step of the hf engine's fast path (compiled layers and compiled sampling) at each
        batch, the first capacity, every row at position capacity - 128, profiled eagerly by kernel
        category; then, for every attention kernel x batch x capacity, the step timed as a CUDA
        graph with and without the sampling, beside its bounds (the weights and live KV read at
        4.3 TB/s; the matrix products at 790 TFLOP/s). ``--mlp fused,separate`` repeats it all with
        gate and up as one product and apart.
gemm:   each matrix product of one decoder layer and the lm_head at those batch sizes through
        cuBLAS (torch.nn.functional.linear), alone and fused (q/k/v as one, gate/up as one):
        microseconds, TFLOP/s and the weights' read rate. Each call is timed alone with the L2
        flushed, which reads lower than a decode step's back-to-back products
        (benchmarks/skinny_gemm.py times those).
call:   where one ``generate`` call of the hf engine goes (CUDA defaults, ``--workloads`` of
        rollout_gpu.py, 256 prompts, after a warm-up call): CUDA events recorded at each phase
        boundary split the GPU's timeline into prefill (with the first token), decode steps by
        batch bucket (ms a step), and the host's looks (reading which rows finished, collecting,
        compacting); the sum is the call's wall time. Then one prefill pass by kernel category,
        with the compiled layers (the default) and eager ones.
train:  the actor update at the Qwen2.5-0.5B shape (256 sequences x 384 tokens, packed), eager
        (unless ``noeager``) and with ``[model] compile``'s compiled layers and head, at 32K-,
        48K- and 96K-token micro-batches: ms per update, tokens/s, MFU by 6N against 790 TFLOP/s,
        peak memory, and a kernel-time breakdown (matrix products, fused Triton, element-wise...).

The figures in docs/performance.md (issues 7 and 24, "where the time went") come from this script.
"""

import argparse
import functools
import re
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from grpo_step import random_model
from torch.profiler import ProfilerActivity, profile

BANDWIDTH, MATMUL_FLOPS = 4.3e12, 790e12  # measured on the H200 (../shared/gpu/README.md)


def cat(name):
    n = name.lower()
    if re.search(r"gemm|cutlass|sm90|nvjet|cublas|xmma|matmul", n):
        return "matmul"
    if "flash" in n or "fmha" in n or "attention" in n:
        return "attention"
    if "triton" in n:
        return "triton(fused)"
    if "reduce" in n or "softmax" in n or "scan" in n or "sort" in n:
        return "reduce/scan"
    if "memcpy" in n or "memset" in n or "copy" in n or "fill" in n:
        return "copy/fill"
    if "adam" in n or "foreach" in n or "multi_tensor" in n:
        return "optimizer"
    return "elementwise/other"


def summary(prof, label, per=1, n=22):
    evs = [e for e in prof.key_averages() if e.device_time_total > 0]
    tot = sum(e.device_time_total for e in evs)
    cats = {}
    for e in evs:
        cats[cat(e.key)] = cats.get(cat(e.key), 0) + e.device_time_total
    launches = sum(e.count for e in evs) // per
    print(f"\n=== {label}: GPU kernel time {tot / 1e3 / per:.2f} ms per iteration, {launches} kernels")
    for k, v in sorted(cats.items(), key=lambda kv: -kv[1]):
        print(f"  {k:20s} {v / 1e3 / per:9.2f} ms  {100 * v / tot:5.1f}%")
    for e in sorted(evs, key=lambda e: -e.device_time_total)[:n]:
        print(f"  {e.device_time_total / 1e3 / per:8.2f} ms {e.count // per:5d}x  {e.key[:110]}")


parser = argparse.ArgumentParser()
parser.add_argument("part", nargs="?", default="both", choices=["both", "decode", "call", "train", "gemm"])
parser.add_argument("noeager", nargs="?", default=None)
parser.add_argument("--shape", default="0.5b")
parser.add_argument("--batches", default="256")
parser.add_argument("--capacities", default="384")
parser.add_argument("--attention", default="triton,sdpa")
parser.add_argument(
    "--mlp", default="fused", help="decode: comma list of fused (gate and up as one product), separate"
)
parser.add_argument("--workloads", default="fixed,varied", help="call: comma list of fixed, fixed-n4, varied")
parser.add_argument("--prompts", type=int, default=256, help="call: prompts of each workload")
parser.add_argument("--max-new", type=int, default=256, help="call: most new tokens")
args = parser.parse_args()
part = args.part
if args.noeager:
    sys.argv.append("noeager")
batches = [int(b) for b in args.batches.split(",")]
capacities = [int(c) for c in args.capacities.split(",")]


def graph_ms(fn, iters=30):
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e3


if part in ("both", "decode"):
    from rlcore_rollout_hf.decoder import SlotDecoder
    from rlcore_rollout_hf.sampling import sample_with_uniform

    m = random_model(args.shape, "cuda", torch.bfloat16)
    cfg = m.config
    weight_bytes = sum(p.numel() * p.element_size() for p in m.parameters())
    emb = m.get_input_embeddings().weight
    tied = m.get_output_embeddings().weight.data_ptr() == emb.data_ptr()
    matrix_params = sum(p.numel() for p in m.parameters()) - (0 if tied else emb.numel())
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * 2
    sample = torch.compile(sample_with_uniform, dynamic=False)
    print(
        f"shape {args.shape}: {weight_bytes / 1e9:.2f} GB of bf16 weights ({weight_bytes / BANDWIDTH * 1e3:.2f} ms at 4.3 TB/s), "
        f"{matrix_params / 1e9:.2f}B matrix parameters, {kv_per_token / 1024:.1f} KiB of KV per token"
    )
    rows = []
    for kernel, mlp in [(k, f) for f in args.mlp.split(",") for k in args.attention.split(",")]:
        d = SlotDecoder(m, attention=kernel, fuse_mlp=mlp == "fused")
        d.compile_layers(True)
        d.refresh()
        for B in batches:
            for cap in capacities:
                cache = d.new_cache(B, cap)
                for t in (*cache.keys, *cache.values):
                    t.normal_()
                tok = torch.randint(0, 1000, (B,), device="cuda")
                pos = torch.full((B,), cap - 128, device="cuda")
                u = torch.rand(B, device="cuda")
                full = lambda d=d, cache=cache, tok=tok, pos=pos, u=u: sample(
                    d.decode(cache, tok, pos), 1.0, 0, 1.0, u
                )  # noqa: E731
                with torch.inference_mode():
                    for _ in range(3):
                        full()
                    torch.cuda.synchronize()
                    # Profiled for the first attention kernel and capacity, under each --mlp choice.
                    if kernel == args.attention.split(",")[0] and cap == capacities[0]:
                        with profile(activities=[ProfilerActivity.CUDA]) as prof:
                            for _ in range(5):
                                full()
                            torch.cuda.synchronize()
                        summary(
                            prof,
                            f"{args.shape} decode step ({kernel} attention, {mlp} gate/up, compiled layers) + sampling, "
                            f"batch {B}, cap {cap}",
                            per=5,
                            n=30,
                        )
                    with_sample = graph_ms(full)
                    alone = graph_ms(functools.partial(d.decode, cache, tok, pos))
                read = (weight_bytes + B * (cap - 127) * kv_per_token) / BANDWIDTH * 1e3
                flops = 2 * matrix_params * B / MATMUL_FLOPS * 1e3
                rows.append((f"{kernel}/{mlp}", B, cap, with_sample, alone, read, flops))
                del cache
                torch.cuda.empty_cache()
    # The prefill of the rollout benchmark's prompts: 256 x 128 tokens in one pass (PREFILL_TOKENS).
    d = SlotDecoder(m)
    d.refresh()
    cache = d.new_cache(256, 256)
    ids = torch.randint(0, 1000, (256, 128), device="cuda")
    with torch.inference_mode():
        run = lambda: d.prefill(
            cache, ids, torch.full((256,), 128, device="cuda"), torch.arange(256, device="cuda")
        )  # noqa: E731
        run()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(3):
            run()
        torch.cuda.synchronize()
    ms = (time.perf_counter() - t) / 3 * 1e3
    print(
        f"prefill 256 x 128 tokens: {ms:.1f} ms, {2 * matrix_params * 256 * 128 / ms / 1e9:.0f} TFLOP/s by 2N "
        f"(bound {2 * matrix_params * 256 * 128 / MATMUL_FLOPS * 1e3:.1f} ms)"
    )
    del cache
    print(
        f"\n{'attn/mlp':16} {'batch':>5} {'cap':>5} {'step+sample ms':>15} {'step ms':>8} {'read bound':>11} {'matmul bound':>13} {'of bound':>9}"
    )
    for kernel, B, cap, with_sample, alone, read, flops in rows:
        print(
            f"{kernel:16} {B:5d} {cap:5d} {with_sample:15.3f} {alone:8.3f} {read:11.3f} {flops:13.3f} {max(read, flops) / with_sample:9.1%}"
        )
    del m
    torch.cuda.empty_cache()


class PhaseClock:
    """Marks at the phase boundaries of one generate call: consecutive marks split the GPU's
    timeline (CUDA events; host clocks on a CPU), each interval charged to the phase that began it
    (idle time waiting for the host included), so the phases add up to the call."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.marks: list[tuple[str, object]] = []

    def mark(self, label: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        else:
            event = time.perf_counter()
        self.marks.append((label, event))

    def totals(self) -> dict[str, float]:
        """Milliseconds by phase."""
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, float] = {}
        for (label, start), (_, end) in zip(self.marks, self.marks[1:]):
            ms = start.elapsed_time(end) if self.cuda else (end - start) * 1e3
            out[label] = out.get(label, 0.0) + ms
        return out


def instrument(clock: PhaseClock, steps: dict) -> None:
    """Wrap the fast path's host-side phases so that each marks the clock (a development probe)."""
    from rlcore_rollout_hf import fast_path

    run, generator = fast_path._Run, fast_path.FastGenerator
    admit, look, runner = run._admit, run._look, generator._runner

    def timed_admit(self):
        clock.mark("prefill + first token")
        admit(self)
        clock.mark("host: look")

    def timed_look(self):
        clock.mark("host: look")
        look(self)

    def timed_runner(self, ws, batch, *rest):
        replay = runner(self, ws, batch, *rest)
        label = f"decode, bucket {batch:3d}"

        def step():
            if clock.marks[-1][0] != label:
                clock.mark(label)
            steps[label] = steps.get(label, 0) + 1
            replay()

        return step

    run._admit, run._look, generator._runner = timed_admit, timed_look, timed_runner


if part == "call":
    from rlcore_rollout_hf.engine import HFRolloutEngine
    from rlcore_rollout_hf.options import HFEngineOptions
    from rollout_gpu import workloads

    from rlcore.interfaces import SamplingParams

    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run of this script only
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None
    m = random_model(args.shape, device, torch.bfloat16 if device == "cuda" else torch.float32)
    m.requires_grad_(False)
    engine = HFRolloutEngine(
        m,
        options=HFEngineOptions(
            fast_path="on", cuda_graphs=True, compile=device == "cuda", max_batch_size=args.prompts
        ),
    )
    works = workloads(args.max_new, args.prompts, m.config.vocab_size)
    clock, steps = PhaseClock(device), {}
    instrument(clock, steps)
    for name in args.workloads.split(","):
        work = works[name]
        params = SamplingParams(n=work["n"], temperature=1.0, max_new_tokens=max(work["caps"]), seed=1)
        call = functools.partial(engine.generate, work["prompts"], params, max_new_tokens=work["caps"])
        call()  # warm-up: compiles and captures every bucket this workload passes through
        sync()
        clock.marks.clear()
        steps.clear()
        start = time.perf_counter()
        clock.mark("host: start (weights refreshed)")
        call()
        clock.mark("end")
        sync()
        wall = (time.perf_counter() - start) * 1e3
        totals = clock.totals()
        tokens = sum(work["caps"]) * work["n"]
        print(f"\n=== {args.shape} {name}: {wall:.1f} ms wall, {tokens / wall * 1e3:,.0f} tokens/s")
        for label in sorted(totals, key=lambda k: (not k.startswith("decode"), k)):
            ms = totals[label]
            per = f"  {steps[label]:4d} steps, {ms / steps[label]:.3f} ms a step" if label in steps else ""
            print(f"  {label:24s} {ms:9.1f} ms {ms / wall:6.1%}{per}")
        print(f"  {'(the phases together)':24s} {sum(totals.values()):9.1f} ms")
    if device == "cuda":  # one prefill pass, compiled (the default) and eager, side by side
        decoder, cache = engine.fast.decoder, engine.fast.workspace.cache
        rows = min(args.prompts, 256)
        ids = torch.randint(0, 1000, (rows, 128), device=device)
        lengths, targets = torch.full((rows,), 128, device=device), torch.arange(rows, device=device)
        for label, layer in (("compiled", decoder.prefill_layer), ("eager", decoder._prefill_layer)):
            decoder.prefill_layer = layer
            with torch.inference_mode():
                decoder.prefill(cache, ids, lengths, targets)
                sync()
                start = time.perf_counter()
                for _ in range(3):
                    decoder.prefill(cache, ids, lengths, targets)
                sync()
                ms = (time.perf_counter() - start) / 3 * 1e3
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    decoder.prefill(cache, ids, lengths, targets)
                    sync()
            summary(prof, f"{args.shape} prefill {rows} x 128, {label} layers: {ms:.1f} ms", n=12)

if part in ("both", "gemm"):
    import torch.nn.functional as F
    from grpo_step import SHAPES
    from model_shapes import layer_products

    mats = layer_products(SHAPES[args.shape])
    print(f"\n{'matrix':14} {'N x K':>14} {'batch':>5} {'us':>8} {'TFLOP/s':>8} {'weights GB/s':>13}")
    from triton.testing import do_bench

    for name, (n, k) in mats.items():
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(4)]  # rotate past the L2
        for B in batches:
            x = torch.randn(B, k, device="cuda", dtype=torch.bfloat16)
            state = {"i": 0}

            def go(x=x, ws=ws, state=state):
                state["i"] = (state["i"] + 1) % 4
                return F.linear(x, ws[state["i"]])

            us = do_bench(go, warmup=25, rep=100, return_mode="median") * 1e3
            print(
                f"{name:14} {f'{n}x{k}':>14} {B:5d} {us:8.1f} {2 * B * n * k / us / 1e6:8.1f} {n * k * 2 / us / 1e3:13.0f}"
            )
        del ws

if part in ("both", "train"):
    from rlcore.interfaces import Prompt, Trajectory
    from rlcore.trainer import attention
    from rlcore.trainer.batch import build_batch, pack
    from rlcore.trainer.logprobs import token_logprobs

    attention.register()
    m = random_model("0.5b", "cuda", torch.bfloat16)
    m.set_attn_implementation(attention.NAME)
    m.train()
    g = torch.Generator().manual_seed(0)
    V = m.config.vocab_size
    trajs = []
    for _p in range(64):
        pr = Prompt(token_ids=torch.randint(0, V, (128,), generator=g).tolist(), messages=[])
        for _ in range(4):
            trajs.append(
                Trajectory(
                    prompt=pr,
                    response_ids=torch.randint(0, V, (256,), generator=g).tolist(),
                    response_mask=[1] * 256,
                    rollout_logprobs=[-11.0] * 256,
                )
            )
    batch = build_batch(trajs, [0.5] * 256, 4)
    micros = pack(batch, list(range(256)), 32768, "cuda")
    tokens = sum(mb.input_ids.shape[1] for mb in micros)
    N = sum(p.numel() for p in m.parameters())
    opt = torch.optim.AdamW(m.parameters(), lr=1e-7)

    def step(phase=None):
        for mb in micros:
            lp, ent = token_logprobs(m, mb, 1.0, with_entropy=True, entropy_grad=False)
            (lp.sum() * 1e-4).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def timed(label, iters=3):
        step()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
        s = (time.perf_counter() - t) / iters
        print(
            f"\n{label}: {s * 1e3:.0f} ms/update of {tokens} tokens in {len(micros)} micro-batches -> {tokens / s:,.0f} tok/s, MFU {6 * N * tokens / s / 790e12 * 100:.1f}%  peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
        )
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        summary(prof, label)

    if "noeager" not in sys.argv:
        timed("update eager")
    # phases (eager): decoder fwd, head fwd, backward
    mb = micros[0]
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(3):
        with torch.no_grad():
            h = m.model(
                input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False
            ).last_hidden_state
    torch.cuda.synchronize()
    print(f"decoder forward no_grad, one micro-batch: {(time.perf_counter() - t) / 3 * 1e3:.1f} ms")
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(3):
        with torch.no_grad():
            token_logprobs(m, mb, 1.0, with_entropy=True)
    torch.cuda.synchronize()
    print(f"decoder+head forward no_grad, one micro-batch: {(time.perf_counter() - t) / 3 * 1e3:.1f} ms")
    from rlcore.trainer import compiling

    compiling.enable_kernels()
    compiling.compile_decoder_layers(m)
    t = time.perf_counter()
    step()
    torch.cuda.synchronize()
    print(f"\nfirst compiled update (compiles): {time.perf_counter() - t:.1f} s")
    timed("update, [model] compile (layers + head), budget 32768 (balanced)")
    for budget in (49152, 98304):
        micros[:] = pack(batch, list(range(256)), budget, "cuda")
        torch.cuda.reset_peak_memory_stats()
        timed(f"update, [model] compile, budget {budget}")
