#!/usr/bin/env python3
"""PyTorch's side of bench/gemm_bf16.c: the same 75 products of the llama3 debugmodel's training
step (per layer wq|wk|wv 768x256, wo 256x256, w1|w3 1536x256, w2 256x768, x 6 layers, + the
output projection 2048x256; each as forward x W^T, backward input dy W, backward weight dy^T x
added into the gradient) at rows = B * T, with torch.matmul / torch.addmm on --dtype bfloat16
(what CPU autocast runs: bf16 operands and bf16 outputs, ATen's oneDNN (mkldnn) bf16 matmul where
the CPU has AVX512_BF16 / AMX) or float32, torch.set_num_threads(threads) (ATen splits each
product itself). Rates per CPU-second of the process (time.process_time), the best of --rounds.

  python bench/gemm_bf16_torch.py [--dtype bfloat16|float32] [--threads 2] [--rounds 5] [--rows 2048]
"""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", type=int, default=2048)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dt = getattr(torch, a.dtype)
    lin = [(768, 256), (256, 256), (1536, 256), (256, 768)]
    L, V, D, n = 6, 2048, 256, a.rows
    shapes = [o_i for _ in range(L) for o_i in lin] + [(V, D)]
    g = torch.Generator().manual_seed(0)
    ops = []
    for o, i in shapes:
        x = torch.randn(n, i, generator=g).to(dt)
        w = torch.randn(o, i, generator=g).to(dt)
        dy = torch.randn(n, o, generator=g).to(dt)
        ops.append((x, w, dy, torch.empty(n, o, dtype=dt), torch.empty(n, i, dtype=dt), torch.zeros(o, i, dtype=dt)))
    flops = sum(3.0 * 2.0 * n * o * i for o, i in shapes)
    best = cbest = 1e30
    with torch.no_grad():
        for r in range(a.rounds + 1):  # round 0 warms up
            t0, c0 = time.perf_counter(), time.process_time()
            for x, w, dy, out, dx, dw in ops:
                torch.matmul(x, w.t(), out=out)        # forward
                torch.matmul(dy, w, out=dx)            # backward input
                torch.addmm(dw, dy.t(), x, out=dw)     # backward weight, accumulated
            t, c = time.perf_counter() - t0, time.process_time() - c0
            if r > 0:
                best, cbest = min(best, t), min(cbest, c)
    print(f"torch {torch.__version__} {a.dtype} matmul, {a.threads} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, mkldnn bf16 {torch.ops.mkldnn._is_mkldnn_bf16_supported()}")
    print(f"RESULT gemm_bf16 impl torch_{a.dtype} step_gflops {flops / best / 1e9:.2f} step_cpu {flops / cbest / 1e9:.2f}")


if __name__ == "__main__":
    main()
