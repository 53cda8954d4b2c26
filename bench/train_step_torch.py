#!/usr/bin/env python3
"""The PyTorch-eager peer of bench/train_step.c: TorchTitan's llama3 debugmodel (dim 256, 6
layers, 16 heads, ffn 768, vocab 2048, RoPE theta 5e5 with Llama 3.1 scaling) re-implemented
in plain torch (no torchtitan import), one full step = zero_grad, forward, sum cross-entropy /
valid tokens, backward, clip_grad_norm_(1.0), AdamW(8e-4, (0.9, 0.95), wd 0.1), f32, with
torch.set_num_threads(threads). Prints a RESULT line that tools/bench_train_step.sh reads.

  /opt/torchvenv/bin/python bench/train_step_torch.py [--batch 8] [--seq 256] [--steps 5] [--warmup 2] [--threads 2]

With --interleave BUILD/libhyperparallel.so the same process also builds hyperparallel's llama3
debugmodel through ctypes (model.h / optim.h) and alternates one hyperparallel step and one
PyTorch step, so both see the same machine load (the CI machine is shared); it prints a
RESULT line for each, and the median and quartiles of the per-step ratios (PyTorch's step i
over hyperparallel's step i, run back to back).

With --compile the model is wrapped in torch.compile (inductor, forward and backward through
AOTAutograd, as TorchTitan's compile option does; the optimizer stays eager); the compilation
happens in the warm-up steps, which are not timed (at least 2 are run). The RESULT line then
reads "RESULT torch_compile". Every run also prints the CPU model and ATen's CPU capability
(ATEN_CPU_CAPABILITY=avx2 forces the AVX2 kernels on an AVX-512 machine).

With --autocast the forward and the loss run under torch.autocast("cpu", dtype=torch.bfloat16)
(the matmuls in bf16 through oneDNN, parameters and optimizer f32), and an interleaved
hyperparallel step runs with hp_model_set_compute_dtype(bf16) (training.dtype=bfloat16); the
RESULT lines then read "RESULT torch_autocast" / "RESULT hp_interleaved".
"""
import argparse
import contextlib
import ctypes
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DIM, LAYERS, HEADS, KV_HEADS, VOCAB, HIDDEN, EPS, THETA = 256, 6, 16, 16, 2048, 768, 1e-5, 500000.0


def precompute_freqs_cis(hd, end, theta):
    freqs = 1.0 / (theta ** (torch.arange(0, hd, 2)[: hd // 2].float() / hd))
    factor, lo, hi, old = 8.0, 1.0, 4.0, 8192  # Llama 3.1 scaling as TorchTitan
    lo_wl, hi_wl = old / lo, old / hi
    wl = 2 * math.pi / freqs
    smooth = (old / wl - lo) / (hi - lo)
    scaled = torch.where(wl > lo_wl, freqs / factor, freqs)
    mid = (wl >= hi_wl) & (wl <= lo_wl)
    freqs = torch.where(mid, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    ang = torch.outer(torch.arange(end).float(), freqs)
    return torch.polar(torch.ones_like(ang), ang)


def apply_rope(x, fc):  # x (B, T, H, hd), TorchTitan's complex formulation
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * fc[None, :, None, :]).flatten(3).type_as(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        hd = DIM // HEADS
        self.wq = nn.Linear(DIM, HEADS * hd, bias=False)
        self.wk = nn.Linear(DIM, KV_HEADS * hd, bias=False)
        self.wv = nn.Linear(DIM, KV_HEADS * hd, bias=False)
        self.wo = nn.Linear(HEADS * hd, DIM, bias=False)
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)
        self.attention_norm = nn.RMSNorm(DIM, eps=EPS)
        self.ffn_norm = nn.RMSNorm(DIM, eps=EPS)

    def forward(self, h, fc):
        B, T, _ = h.shape
        hd = DIM // HEADS
        x = self.attention_norm(h)
        q = apply_rope(self.wq(x).view(B, T, HEADS, hd), fc)
        k = apply_rope(self.wk(x).view(B, T, KV_HEADS, hd), fc)
        v = self.wv(x).view(B, T, KV_HEADS, hd)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, enable_gqa=KV_HEADS != HEADS)
        h = h + self.wo(o.transpose(1, 2).reshape(B, T, DIM))
        x = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(x)) * self.w3(x))


class Llama(nn.Module):
    def __init__(self, T):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(DIM, eps=EPS)
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        self.register_buffer("freqs_cis", precompute_freqs_cis(DIM // HEADS, T, THETA), persistent=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h))


def matmul_peak():
    """Best GFLOP/s of torch.mm on 1024^2 and 2048^2 f32 squares (PyTorch's own GEMM, MKL here)."""
    best = 0.0
    for n, reps in ((1024, 5), (2048, 3)):
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b
        for _ in range(reps):
            t0 = time.perf_counter()
            a @ b
            best = max(best, 2 * n ** 3 / (time.perf_counter() - t0) / 1e9)
    return best


class OptimConfig(ctypes.Structure):
    """hp_optim_config_t (include/hyperparallel/optim.h), field for field."""
    _fields_ = [("kind", ctypes.c_int), ("lr", ctypes.c_double), ("weight_decay", ctypes.c_double),
                ("beta1", ctypes.c_double), ("beta2", ctypes.c_double), ("eps", ctypes.c_double),
                ("momentum", ctypes.c_double), ("dampening", ctypes.c_double), ("nesterov", ctypes.c_int),
                ("muon_momentum", ctypes.c_double), ("muon_nesterov", ctypes.c_int), ("ns_steps", ctypes.c_int),
                ("ns_a", ctypes.c_double), ("ns_b", ctypes.c_double), ("ns_c", ctypes.c_double),
                ("ns_eps", ctypes.c_double), ("adjust_lr", ctypes.c_int), ("muon_adamw_lr", ctypes.c_double)]


class HpStep:
    """hyperparallel's full step (zero_grad, forward, backward, clip 1.0, AdamW) through ctypes."""

    def __init__(self, lib_path, B, T, tokens, targets, bf16=False):
        L = self.L = ctypes.CDLL(lib_path)
        L.hp_last_error.restype = ctypes.c_char_p
        L.hp_model_params.restype = ctypes.c_void_p
        L.hp_optim_default.restype = OptimConfig
        self.cfg = ctypes.create_string_buffer(4096)  # hp_model_config_t, filled by the library
        self.m, self.opt = ctypes.c_void_p(), ctypes.c_void_p()
        self.check(L.hp_model_flavor(b"llama3", b"debugmodel", self.cfg))
        self.check(L.hp_model_create(self.cfg, B, T, ctypes.byref(self.m)))
        self.check(L.hp_model_init_weights(self.m, ctypes.c_uint64(0)))
        if bf16:
            self.check(L.hp_model_set_compute_dtype(self.m, 1))  # HP_BF16 (dtype.h)
        oc = L.hp_optim_default(0)
        oc.lr, oc.beta2, oc.weight_decay = 8e-4, 0.95, 0.1
        self.params = ctypes.c_void_p(L.hp_model_params(self.m))
        self.n = L.hp_model_num_params(self.m)
        self.check(L.hp_optim_create(ctypes.byref(oc), self.params, self.n, ctypes.byref(self.opt)))
        self.tok = (ctypes.c_int32 * (B * T))(*tokens.flatten().tolist())
        self.tgt = (ctypes.c_int32 * (B * T))(*targets.flatten().tolist())
        self.B, self.T = B, T
        self.valid = float(int((targets != -100).sum()))

    def check(self, status):
        if status != 0:
            raise RuntimeError(f"hyperparallel: status {status}: {self.L.hp_last_error().decode()}")

    def step(self):
        L, loss, norm = self.L, ctypes.c_float(), ctypes.c_double()
        self.check(L.hp_model_zero_grad(self.m))
        self.check(L.hp_model_forward(self.m, self.tok, self.tgt, self.B, self.T, ctypes.c_float(self.valid),
                                      ctypes.byref(loss)))
        self.check(L.hp_model_backward(self.m))
        self.check(L.hp_clip_grad_norm(self.params, self.n, ctypes.c_double(1.0), None, 0, ctypes.byref(norm)))
        self.check(L.hp_optim_step(self.opt, ctypes.c_double(1.0)))
        return loss.value


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (inductor)")
    ap.add_argument("--autocast", action="store_true", help="forward and loss under CPU autocast bf16")
    ap.add_argument("--interleave", default=None, help="path of libhyperparallel.so: alternate its steps with PyTorch's")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    peak = matmul_peak()
    B, T = a.batch, a.seq
    model = Llama(T)
    for n, p in model.named_parameters():
        if p.ndim == 2:
            nn.init.normal_(p, std=0.02)
    nparams = sum(p.numel() for p in model.parameters())
    step_model = torch.compile(model) if a.compile else model
    if a.compile:
        a.warmup = max(a.warmup, 2)  # the first calls compile forward and backward: never timed
    opt = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    tokens = torch.randint(0, VOCAB, (B, T))
    targets = torch.roll(tokens, -1, 1)
    targets[:, -1] = -100
    valid = int((targets != -100).sum())
    hp = HpStep(a.interleave, B, T, tokens, targets, a.autocast) if a.interleave else None
    ac = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.autocast else contextlib.nullcontext
    times, hp_times = [], []
    for s in range(a.warmup + a.steps):
        if hp:
            t0 = time.perf_counter()
            hp_loss = hp.step()
            if s >= a.warmup:
                hp_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        opt.zero_grad()
        with ac():
            logits = step_model(tokens)
            loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1), ignore_index=-100, reduction="sum") / valid
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if s >= a.warmup:
            times.append(dt)
    med = statistics.median(times)
    emb = VOCAB * DIM
    fpt = 6 * (nparams - emb) + 6 * LAYERS * HEADS * 2 * (DIM // HEADS) * T  # TorchTitan formula
    tps = B * T / med
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
    print(f"cpu: {cpu}; ATen CPU capability: {torch.backends.cpu.get_cpu_capability()}; "
          f"mode: {'torch.compile (inductor)' if a.compile else 'eager'}{', autocast bf16' if a.autocast else ''}")
    print(f"torch {torch.__version__}: llama3 debugmodel B={B} T={T}, {a.threads} threads, {nparams} params, "
          f"{fpt / 1e6:.1f} MFLOP/token; median step {med * 1e3:.1f} ms over {a.steps} steps; loss {loss.item():.4f}")
    best = min(times)
    peak = max(peak, matmul_peak())
    print(f"torch.mm peak (1024^3 and 2048^3, best before and after the steps): {peak:.1f} GFLOP/s")
    if hp:
        hmed, hbest = statistics.median(hp_times), min(hp_times)
        print(f"interleaved in this process: hyperparallel median step {hmed * 1e3:.1f} ms, loss {hp_loss:.4f}")
        print(f"RESULT hp_interleaved tokens_per_s {B * T / hmed:.1f} gflops {fpt * B * T / hmed / 1e9:.2f} "
              f"step_ms {hmed * 1e3:.1f} best_tokens_per_s {B * T / hbest:.1f} best_gflops "
              f"{fpt * B * T / hbest / 1e9:.2f} best_step_ms {hbest * 1e3:.1f}")
        # step-level pairing: PyTorch's step i / hyperparallel's step i (run back to back, so
        # they saw the same load): the speed-up least disturbed by a shared machine
        r = sorted(t / h for t, h in zip(times, hp_times))
        q = lambda f: r[min(len(r) - 1, int(f * len(r)))]
        peer = "PyTorch autocast bf16" if a.autocast else "torch.compile" if a.compile else "PyTorch eager"
        print(f"paired steps: hyperparallel speed-up over {peer} "
              f"median {statistics.median(r):.2f}x, quartiles {q(0.25):.2f}-{q(0.75):.2f}, range {r[0]:.2f}-{r[-1]:.2f} "
              f"over {len(r)} pairs")
        print(f"RESULT paired_ratio median {statistics.median(r):.3f} q1 {q(0.25):.3f} q3 {q(0.75):.3f} "
              f"min {r[0]:.3f} max {r[-1]:.3f} n {len(r)}")
    label = "torch_autocast" if a.autocast else "torch_compile" if a.compile else "torch"
    print(f"RESULT {label} tokens_per_s {tps:.1f} gflops {fpt * tps / 1e9:.2f} step_ms {med * 1e3:.1f} "
          f"best_tokens_per_s {B * T / best:.1f} best_gflops {fpt * B * T / best / 1e9:.2f} best_step_ms {best * 1e3:.1f} "
          f"mm_peak_gflops {peak:.1f}")


if __name__ == "__main__":
    main()
