"""Decode-shaped matrix products (few rows, large weights): cuBLAS against a Triton split-K kernel,
side by side (CUDA only; a development tool).

    python benchmarks/skinny_gemm.py [--shape 7b] [--batches 16,32,64,128]

At decode, a product ``x @ W.T`` with x [M, K] (M = the rows still generating) reads the whole
weight W [N, K] for little arithmetic: its floor is the weight's bytes over the memory bandwidth.
Prints microseconds and the weights' read rate for each product of one decoder layer and the
lm_head, and the largest difference from cuBLAS's result.
"""

import argparse
import sys

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    sys.exit("skinny_gemm.py needs Triton and a CUDA device (torch's CUDA builds bring Triton)")

sys.path.insert(0, "benchmarks")
from grpo_step import SHAPES  # noqa: E402
from model_shapes import layer_products  # noqa: E402

# What a decode step of the hf engine multiplies (q/k/v and gate/up fused on CUDA).
STEP_PRODUCTS = ("qkv fused", "o", "gate+up fused", "down", "lm_head")


def _configs():
    return [
        triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split}, num_warps=4, num_stages=stages)
        for bn in (32, 64, 128)
        for bk in (128, 256)
        for split in (1, 2, 4)
        for stages in (3, 4)
    ]


@triton.autotune(configs=_configs(), key=["M_PAD", "N", "K"], reset_to_zero=["out_ptr"])
@triton.jit
def _skinny(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    N,
    K,
    M_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.arange(0, M_PAD)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
    k_per = tl.cdiv(K, SPLIT_K * BLOCK_K) * BLOCK_K
    k_start = pid_k * k_per
    for k0 in range(k_start, k_start + k_per, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0
        )
        w = tl.load(
            w_ptr + cols[:, None] * K + ks[None, :], mask=(cols[:, None] < N) & (ks[None, :] < K), other=0.0
        )
        acc += tl.dot(x, tl.trans(w))
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    if SPLIT_K == 1:
        tl.store(out_ptr + rows[:, None] * N + cols[None, :], acc, mask=mask)
    else:
        tl.atomic_add(out_ptr + rows[:, None] * N + cols[None, :], acc, mask=mask, sem="relaxed")


def skinny_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` for few rows: tiles of output columns, the reduction over K split among
    SPLIT_K programs that add into a float32 output (zeroed first), then cast to x's dtype."""
    M, K = x.shape
    N = w.shape[0]
    out = torch.zeros((M, N), device=x.device, dtype=torch.float32)
    m_pad = max(16, triton.next_power_of_2(M))
    grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT_K"])  # noqa: E731
    _skinny[grid](x, w, out, M, N, K, M_PAD=m_pad)
    return out.to(x.dtype)


def graph_us(fn, iters=50):
    """Microseconds per call of ``fn``, ``iters`` calls back to back in one CUDA graph (as a
    decode step runs its products), the mean of 5 replays."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (5 * iters)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="7b", choices=sorted(SHAPES))
    parser.add_argument("--batches", default="16,32,64,128", help="rows of x (comma list)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device: it times cuBLAS and a Triton kernel on the GPU")
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        parser.error(f"--batches: expected whole numbers separated by commas, got {args.batches!r}")
    s = SHAPES[args.shape]
    every = layer_products(s)
    products = {name: every[name] for name in STEP_PRODUCTS}
    print(
        f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  shape {args.shape}"
    )
    print(
        f"{'product':13} {'M':>4} {'cuBLAS us':>10} {'TB/s':>6} {'triton us':>10} {'TB/s':>6} {'max|diff|':>9}"
    )
    total = {}
    for M in batches:
        for name, (N, K) in products.items():
            w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            ref = torch.nn.functional.linear(x, w)
            got = skinny_linear(x, w)
            diff = (got.float() - ref.float()).abs().max().item()
            t_cublas = graph_us(lambda x=x, w=w: torch.nn.functional.linear(x, w))
            t_triton = graph_us(lambda x=x, w=w: skinny_linear(x, w))
            gb = N * K * 2 / 1e9
            line = (
                f"{name:13} {M:4d} {t_cublas:10.1f} {gb / t_cublas * 1e3:6.2f} "
                f"{t_triton:10.1f} {gb / t_triton * 1e3:6.2f} {diff:9.4f}"
            )
            print(line, flush=True)
            print(f"         Triton's pick: {_skinny.best_config}", flush=True)
            times = total.setdefault(M, [0.0, 0.0])
            scale = 1 if name == "lm_head" else s["num_hidden_layers"]
            times[0] += scale * t_cublas
            times[1] += scale * min(t_cublas, t_triton)
    for M, (c, best) in total.items():
        print(
            f"M={M}: a decode step's products: cuBLAS {c / 1e3:.2f} ms, the faster of the two each {best / 1e3:.2f} ms ({c / best:.2f}x)"
        )


if __name__ == "__main__":
    main()
