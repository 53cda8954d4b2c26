#!/usr/bin/env python3
"""Golden reference for tests/test_golden.c: a pure-PyTorch re-implementation of TorchTitan's
llama3 and qwen3 decoders (no torchtitan import) with small odd dims, run in float64 on
float32-representable weights. Writes weights, inputs, targets, logits, loss, every parameter
gradient, and the per-step losses / grad norms / learning rates and final weights of 10 steps
of torch.optim.AdamW with TorchTitan's warmup-stable-decay LambdaLR and clip_grad_norm_, to
tests/data/golden_{llama3,qwen3}.safetensors (stored as float32 / int32).

Run:  /opt/torchvenv/bin/python tools/golden/make_golden.py [--out tests/data]
"""
import argparse
import functools
import json
import math
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

torch.set_default_dtype(torch.float64)

# ---- configs (must match tests/test_golden.c) --------------------------------------------
CONFIGS = {
    "llama3": dict(
        name="llama3", dim=96, n_layers=3, n_heads=6, n_kv_heads=2, head_dim=16, vocab_size=301,
        multiple_of=24, ffn_dim_multiplier=0.5, hidden_dim=None, norm_eps=1e-5,
        rope_theta=500000.0, rope_scaling=True, rope_factor=8.0, rope_low_freq_factor=1.0,
        rope_high_freq_factor=4.0, rope_original_max_pos=8192, qk_norm=False,
        tie_embeddings=False, rope_style="interleaved"),
    "qwen3": dict(
        name="qwen3", dim=96, n_layers=3, n_heads=6, n_kv_heads=2, head_dim=20, vocab_size=301,
        multiple_of=None, ffn_dim_multiplier=None, hidden_dim=160, norm_eps=1e-6,
        rope_theta=1000000.0, rope_scaling=False, rope_factor=1.0, rope_low_freq_factor=1.0,
        rope_high_freq_factor=1.0, rope_original_max_pos=0, qk_norm=True,
        tie_embeddings=True, rope_style="half"),
}
B, T = 2, 17
STEPS = 10
OPT = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
SCHED = dict(warmup_steps=3, decay_ratio=0.5, decay_type="cosine", min_lr_factor=0.1)
MAX_NORM = 0.5


def llama_hidden(cfg):
    """TorchTitan llama3 FeedForward hidden size rule."""
    hidden = 4 * cfg["dim"]
    hidden = int(2 * hidden / 3)
    if cfg["ffn_dim_multiplier"] is not None:
        hidden = int(cfg["ffn_dim_multiplier"] * hidden)
    m = cfg["multiple_of"]
    return m * ((hidden + m - 1) // m)


# ---- model ----------------------------------------------------------------------------------
def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_freqs(cfg):
    hd = cfg["head_dim"]
    freqs = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2)[: hd // 2].double() / hd))
    if cfg["rope_scaling"]:
        # Llama 3.1 scaling (torchtitan llama3 precompute_freqs_cis)
        factor, lo, hi = cfg["rope_factor"], cfg["rope_low_freq_factor"], cfg["rope_high_freq_factor"]
        old = cfg["rope_original_max_pos"]
        lo_wl, hi_wl = old / lo, old / hi
        out = []
        for f in freqs.tolist():
            wl = 2 * math.pi / f
            if wl < hi_wl:
                out.append(f)
            elif wl > lo_wl:
                out.append(f / factor)
            else:
                smooth = (old / wl - lo) / (hi - lo)
                out.append((1 - smooth) * f / factor + smooth * f)
        freqs = torch.tensor(out)
    ang = torch.outer(torch.arange(T).double(), freqs)  # (T, hd/2)
    return torch.cos(ang), torch.sin(ang)


def apply_rope(x, cos, sin, style):
    # x (B, T, H, hd)
    if style == "interleaved":  # llama3: complex pairs (x[2i], x[2i+1])
        a, b = x[..., 0::2], x[..., 1::2]
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        out = torch.stack((a * c - b * s, a * s + b * c), dim=-1)
        return out.flatten(-2)
    half = x.shape[-1] // 2  # qwen3: rotate_half, pairs (x[i], x[i + hd/2])
    a, b = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat((a * c - b * s, b * c + a * s), dim=-1)


def forward(cfg, P, tokens):
    H, KV, hd = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    cos, sin = rope_freqs(cfg)
    h = P["tok_embeddings.weight"][tokens]  # (B, T, D)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg["n_layers"]):
        p = f"layers.{i}."
        x = rms_norm(h, P[p + "attention_norm.weight"], cfg["norm_eps"])
        q = (x @ P[p + "attention.wq.weight"].T).view(B, T, H, hd)
        k = (x @ P[p + "attention.wk.weight"].T).view(B, T, KV, hd)
        v = (x @ P[p + "attention.wv.weight"].T).view(B, T, KV, hd)
        if cfg["qk_norm"]:
            q = rms_norm(q, P[p + "attention.q_norm.weight"], cfg["norm_eps"])
            k = rms_norm(k, P[p + "attention.k_norm.weight"], cfg["norm_eps"])
        q = apply_rope(q, cos, sin, cfg["rope_style"])
        k = apply_rope(k, cos, sin, cfg["rope_style"])
        rep = H // KV  # GQA: kv head j serves query heads j*rep .. j*rep+rep-1 (repeat_interleave)
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, H * hd)
        h = h + o @ P[p + "attention.wo.weight"].T
        x = rms_norm(h, P[p + "ffn_norm.weight"], cfg["norm_eps"])
        ff = F.silu(x @ P[p + "feed_forward.w1.weight"].T) * (x @ P[p + "feed_forward.w3.weight"].T)
        h = h + ff @ P[p + "feed_forward.w2.weight"].T
    h = rms_norm(h, P["norm.weight"], cfg["norm_eps"])
    out_w = P["tok_embeddings.weight"] if cfg["tie_embeddings"] else P["output.weight"]
    return h @ out_w.T  # (B, T, V)


def loss_fn(logits, targets):
    n_valid = int((targets != -100).sum())
    s = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                        ignore_index=-100, reduction="sum")
    return s / n_valid


def param_shapes(cfg):
    D, H, KV, hd, V = cfg["dim"], cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"], cfg["vocab_size"]
    hidden = cfg["hidden_dim"]
    shapes = {"tok_embeddings.weight": (V, D)}
    for i in range(cfg["n_layers"]):
        p = f"layers.{i}."
        shapes[p + "attention.wq.weight"] = (H * hd, D)
        shapes[p + "attention.wk.weight"] = (KV * hd, D)
        shapes[p + "attention.wv.weight"] = (KV * hd, D)
        shapes[p + "attention.wo.weight"] = (D, H * hd)
        if cfg["qk_norm"]:
            shapes[p + "attention.q_norm.weight"] = (hd,)
            shapes[p + "attention.k_norm.weight"] = (hd,)
        shapes[p + "attention_norm.weight"] = (D,)
        shapes[p + "feed_forward.w1.weight"] = (hidden, D)
        shapes[p + "feed_forward.w2.weight"] = (D, hidden)
        shapes[p + "feed_forward.w3.weight"] = (hidden, D)
        shapes[p + "ffn_norm.weight"] = (D,)
    shapes["norm.weight"] = (D,)
    if not cfg["tie_embeddings"]:
        shapes["output.weight"] = (V, D)
    return shapes


def init_params(cfg, gen):
    P = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * torch.randn(shape, generator=gen)  # not all ones, so norms matter
        elif name == "tok_embeddings.weight":
            w = torch.randn(shape, generator=gen) * (0.3 if cfg["tie_embeddings"] else 1.0)
        else:
            w = torch.randn(shape, generator=gen) * (1.0 / math.sqrt(shape[1]))
        P[name] = w.float().double()  # float32-representable, so C starts from identical weights
    return P


def make_batch(cfg, gen):
    tokens = torch.randint(0, cfg["vocab_size"], (B, T), generator=gen)
    targets = torch.randint(0, cfg["vocab_size"], (B, T), generator=gen)
    drop = torch.rand(B, T, generator=gen) < 0.15
    targets[drop] = -100
    return tokens, targets


def lr_lambda(step, warmup, stable, decay, decay_type, min_lr_factor):
    """torchtitan.components.lr_scheduler.linear_warmup_stable_decay (restated)."""
    ws = warmup + stable
    if step < warmup:
        return (step + 1) / warmup
    if step < ws:
        return 1.0
    progress = (step + 1 - ws) / decay
    if decay_type == "linear":
        f = 1 - progress
    elif decay_type == "sqrt":
        f = 1 - math.sqrt(progress)
    else:
        f = 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_factor + (1 - min_lr_factor) * f


def build(model):
    cfg = dict(CONFIGS[model])
    if cfg["hidden_dim"] is None:
        cfg["hidden_dim"] = llama_hidden(cfg)
    gen = torch.Generator().manual_seed(1234 if model == "llama3" else 4321)
    P = init_params(cfg, gen)
    out = {}
    for k, v in P.items():
        out["param." + k] = v.float()

    # single forward/backward
    tokens, targets = make_batch(cfg, gen)
    params = {k: v.clone().requires_grad_(True) for k, v in P.items()}
    logits = forward(cfg, params, tokens)
    loss = loss_fn(logits, targets)
    loss.backward()
    out["tokens"] = tokens.to(torch.int32)
    out["targets"] = targets.to(torch.int32)
    out["logits"] = logits.detach().float()
    out["loss"] = loss.detach().float().reshape(1)
    for k, v in params.items():
        out["grad." + k] = v.grad.float()

    # 10 AdamW steps with warmup-stable-decay and clipping, a new batch each step
    names = list(P.keys())
    params = [P[k].clone().requires_grad_(True) for k in names]
    opt = torch.optim.AdamW(params, lr=OPT["lr"], betas=OPT["betas"], eps=OPT["eps"],
                            weight_decay=OPT["weight_decay"], foreach=False)
    warmup = min(SCHED["warmup_steps"], STEPS)
    decay = round(STEPS * SCHED["decay_ratio"])
    decay = min(decay, STEPS - warmup)
    stable = STEPS + 1 - warmup - decay
    sched = torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(
        lr_lambda, warmup=warmup, stable=stable, decay=decay, decay_type=SCHED["decay_type"],
        min_lr_factor=SCHED["min_lr_factor"]))
    tok_s, tgt_s, losses, norms, lrs = [], [], [], [], []
    for step in range(STEPS):
        tk, tg = make_batch(cfg, gen)
        tok_s.append(tk)
        tgt_s.append(tg)
        opt.zero_grad()
        loss = loss_fn(forward(cfg, dict(zip(names, params)), tk), tg)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        losses.append(loss.item())
        norms.append(float(norm))
    out["train.tokens"] = torch.stack(tok_s).to(torch.int32)
    out["train.targets"] = torch.stack(tgt_s).to(torch.int32)
    out["train.losses"] = torch.tensor(losses).float()
    out["train.grad_norms"] = torch.tensor(norms).float()
    out["train.lrs"] = torch.tensor(lrs).float()
    for k, p in zip(names, params):
        out["final." + k] = p.detach().float()

    meta_cfg = {k: v for k, v in cfg.items()}
    meta = {
        "config": json.dumps(meta_cfg, sort_keys=True),
        "batch": json.dumps({"B": B, "T": T, "steps": STEPS}),
        "optimizer": json.dumps(dict(OPT, name="AdamW", max_norm=MAX_NORM)),
        "lr_scheduler": json.dumps(dict(SCHED, training_steps=STEPS)),
        "generator": "tools/golden/make_golden.py (PyTorch %s, float64 compute)" % torch.__version__,
    }
    return {k: v.contiguous() for k, v in out.items()}, meta, losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for model in ("llama3", "qwen3"):
        tensors, meta, losses = build(model)
        path = os.path.join(args.out, f"golden_{model}.safetensors")
        save_file(tensors, path, metadata=meta)
        print(f"{path}: {len(tensors)} tensors, {os.path.getsize(path)} bytes; loss {tensors['loss'].item():.6f}; "
              f"10-step losses {', '.join(f'{x:.4f}' for x in losses)}")


if __name__ == "__main__":
    main()
