"""Where the GPU time goes, by kernel category (CUDA only; a development tool, no ratios to meet).

    python benchmarks/profile_gpu.py [both|decode|train] [noeager]

decode: one step of the hf engine's fast path at batch 256 (compiled layers and compiled
        sampling), profiled eagerly, then timed as a CUDA graph with and without the sampling.
train:  the actor update at the Qwen2.5-0.5B shape (256 sequences x 384 tokens, packed), eager
        (unless ``noeager``) and with ``[model] compile``'s compiled layers and head, at 32K-,
        48K- and 96K-token micro-batches: ms per update, tokens/s, MFU by 6N against 790 TFLOP/s,
        peak memory, and a kernel-time breakdown (matrix products, fused Triton, element-wise...).

The figures in docs/performance.md (issue 7, "where the time went") come from this script.
"""
import sys, time, re, torch
sys.path.insert(0, "benchmarks")
from torch.profiler import profile, ProfilerActivity

def cat(name):
    n = name.lower()
    if re.search(r"gemm|cutlass|sm90|nvjet|cublas|xmma|matmul", n): return "matmul"
    if "flash" in n or "fmha" in n or "attention" in n: return "attention"
    if "triton" in n: return "triton(fused)"
    if "reduce" in n or "softmax" in n or "scan" in n or "sort" in n: return "reduce/scan"
    if "memcpy" in n or "memset" in n or "copy" in n or "fill" in n: return "copy/fill"
    if "adam" in n or "foreach" in n or "multi_tensor" in n: return "optimizer"
    return "elementwise/other"

def summary(prof, label, per=1, n=22):
    evs = [e for e in prof.key_averages() if e.device_time_total > 0]
    tot = sum(e.device_time_total for e in evs)
    cats = {}
    for e in evs: cats[cat(e.key)] = cats.get(cat(e.key), 0) + e.device_time_total
    print(f"\n=== {label}: GPU kernel time {tot/1e3/per:.2f} ms per iteration")
    for k, v in sorted(cats.items(), key=lambda kv: -kv[1]): print(f"  {k:20s} {v/1e3/per:9.2f} ms  {100*v/tot:5.1f}%")
    for e in sorted(evs, key=lambda e: -e.device_time_total)[:n]:
        print(f"  {e.device_time_total/1e3/per:8.2f} ms {e.count//per:5d}x  {e.key[:110]}")

part = sys.argv[1] if len(sys.argv) > 1 else "both"
from grpo_step import random_model

if part in ("both", "decode"):
    from rlcore_rollout_hf.decoder import SlotDecoder
    from rlcore_rollout_hf.sampling import sample_with_uniform
    m = random_model("0.5b", "cuda", torch.bfloat16)
    d = SlotDecoder(m); d.compile_layers(True)
    sample_with_uniform = torch.compile(sample_with_uniform, dynamic=False)
    B, cap = 256, 384
    cache = d.new_cache(B, cap)
    tok = torch.randint(0, 1000, (B,), device="cuda"); pos = torch.full((B,), 250, device="cuda")
    u = torch.rand(B, device="cuda")
    def full():
        lg = d.decode(cache, tok, pos)
        return sample_with_uniform(lg, 1.0, 0, 1.0, u)
    with torch.inference_mode():
        for _ in range(3): full()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5): full()
            torch.cuda.synchronize()
        summary(prof, "decode step (compiled layers) + sampling, batch 256", per=5)
        for name, fn in (("decode+sample", full), ("decode only", lambda: d.decode(cache, tok, pos))):
            g = torch.cuda.CUDAGraph(); s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s): fn()
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(g): fn()
            for _ in range(3): g.replay()
            torch.cuda.synchronize(); t = time.perf_counter()
            for _ in range(50): g.replay()
            torch.cuda.synchronize(); ms = (time.perf_counter() - t) / 50 * 1e3
            print(f"graph replay {name}: {ms:.3f} ms/step -> {B/ms*1e3:,.0f} tok/s")
    del m, d, cache; torch.cuda.empty_cache()

if part in ("both", "train"):
    from rlcore.trainer import attention
    from rlcore.trainer.logprobs import token_logprobs
    from rlcore.interfaces import Prompt, Trajectory
    from rlcore.trainer.batch import build_batch, pack
    attention.register()
    m = random_model("0.5b", "cuda", torch.bfloat16)
    m.set_attn_implementation(attention.NAME)
    m.train()
    g = torch.Generator().manual_seed(0); V = m.config.vocab_size
    trajs = []
    for p in range(64):
        pr = Prompt(token_ids=torch.randint(0, V, (128,), generator=g).tolist(), messages=[])
        for _ in range(4):
            trajs.append(Trajectory(prompt=pr, response_ids=torch.randint(0, V, (256,), generator=g).tolist(), response_mask=[1]*256, rollout_logprobs=[-11.0]*256))
    batch = build_batch(trajs, [0.5]*256, 4)
    micros = pack(batch, list(range(256)), 32768, "cuda")
    tokens = sum(mb.input_ids.shape[1] for mb in micros)
    N = sum(p.numel() for p in m.parameters())
    opt = torch.optim.AdamW(m.parameters(), lr=1e-7)
    def step(phase=None):
        for mb in micros:
            lp, ent = token_logprobs(m, mb, 1.0, with_entropy=True, entropy_grad=False)
            (lp.sum() * 1e-4).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step(); opt.zero_grad(set_to_none=True)
    def timed(label, iters=3):
        step(); torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(iters): step()
        torch.cuda.synchronize(); s = (time.perf_counter() - t) / iters
        print(f"\n{label}: {s*1e3:.0f} ms/update of {tokens} tokens in {len(micros)} micro-batches -> {tokens/s:,.0f} tok/s, MFU {6*N*tokens/s/790e12*100:.1f}%  peak {torch.cuda.max_memory_allocated()/2**30:.1f} GiB")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step(); torch.cuda.synchronize()
        summary(prof, label)
    if "noeager" not in sys.argv: timed("update eager")
    # phases (eager): decoder fwd, head fwd, backward
    mb = micros[0]
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(3):
        with torch.no_grad(): h = m.model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False).last_hidden_state
    torch.cuda.synchronize(); print(f"decoder forward no_grad, one micro-batch: {(time.perf_counter()-t)/3*1e3:.1f} ms")
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(3):
        with torch.no_grad(): token_logprobs(m, mb, 1.0, with_entropy=True)
    torch.cuda.synchronize(); print(f"decoder+head forward no_grad, one micro-batch: {(time.perf_counter()-t)/3*1e3:.1f} ms")
    from rlcore.trainer import compiling
    compiling.enable_kernels(); compiling.compile_decoder_layers(m)
    t = time.perf_counter(); step(); torch.cuda.synchronize(); print(f"\nfirst compiled update (compiles): {time.perf_counter()-t:.1f} s")
    timed("update, [model] compile (layers + head), budget 32768 (balanced)")
    for budget in (49152, 98304):
        micros[:] = pack(batch, list(range(256)), budget, "cuda")
        torch.cuda.reset_peak_memory_stats()
        timed(f"update, [model] compile, budget {budget}")
