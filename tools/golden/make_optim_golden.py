#!/usr/bin/env python3
"""Reference values for tests/test_optim.c, from torch.optim itself: 3 steps of AdamW, SGD
(momentum + dampening, nesterov, plain with L2 decay) and Muon (+AdamW for non-matrix and
embedding/output parameters) on four small parameters with fixed gradients per step; the
global-norm clip of torch.nn.utils.clip_grad_norm_; and TorchTitan LR-schedule factors.
Computed in float64 (Muon's Newton-Schulz restated from torch.optim._muon in float64, since
torch runs it in bfloat16), stored as float32 in tests/data/golden_optim.safetensors.

Run:  /opt/torchvenv/bin/python tools/golden/make_optim_golden.py
"""
import functools
import math
import os

import torch
from safetensors.torch import save_file

torch.set_default_dtype(torch.float64)
STEPS = 3
# name, shape (matching tests/test_optim.c)
PARAMS = [("layers.0.attention.wq.weight", (5, 7)), ("layers.0.feed_forward.w2.weight", (9, 4)),
          ("layers.0.ffn_norm.weight", (7,)), ("tok_embeddings.weight", (6, 5))]
LR_FACTORS = [1.0, 0.5, 0.25]   # the schedule factor applied at each step


def ns_f64(g, a, b, c, steps, eps):
    """torch.optim._muon._zeropower_via_newtonschulz, in float64 instead of bfloat16."""
    x = g.clone()
    tr = g.size(0) > g.size(1)
    if tr:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        A = x @ x.T
        Bm = b * A + c * A @ A
        x = a * x + Bm @ x
    return x.T if tr else x


def muon_f64(params, grads_per_step, lr, wd, mom, nesterov, adamw):
    """torch.optim.Muon single-tensor update (momentum lerp, nesterov lerp, decoupled decay,
    'original' lr adjustment) with the NS above; AdamW (torch) for the other parameters."""
    ps = [p.clone() for p in params]
    bufs = [torch.zeros_like(p) for p in params]
    hidden = [i for i, (n, s) in enumerate(PARAMS) if len(s) == 2 and not n.startswith("tok_embeddings")]
    others = [i for i in range(len(PARAMS)) if i not in hidden]
    t_other = [ps[i].clone().requires_grad_(True) for i in others]
    opt = torch.optim.AdamW(t_other, **adamw, foreach=False)
    for step in range(STEPS):
        f = LR_FACTORS[step]
        for i in hidden:
            g = grads_per_step[step][i]
            bufs[i].lerp_(g, 1 - mom)
            u = g.lerp(bufs[i], mom) if nesterov else bufs[i]
            o = ns_f64(u, 3.4445, -4.7750, 2.0315, 5, 1e-7)
            A, B = ps[i].shape
            adj = lr * f * math.sqrt(max(1, A / B))
            ps[i].mul_(1 - lr * f * wd)
            ps[i].add_(o, alpha=-adj)
        for k, i in enumerate(others):
            t_other[k].grad = grads_per_step[step][i].clone()
        for g in opt.param_groups:
            g["lr"] = adamw["lr"] * f
        opt.step()
    for k, i in enumerate(others):
        ps[i] = t_other[k].detach()
    return ps, bufs


def run_torch(opt_cls, params, grads_per_step, **kw):
    ps = [p.clone().requires_grad_(True) for p in params]
    opt = opt_cls(ps, **kw)
    base = kw["lr"]
    for step in range(STEPS):
        for p, g in zip(ps, grads_per_step[step]):
            p.grad = g.clone()
        for g in opt.param_groups:
            g["lr"] = base * LR_FACTORS[step]
        opt.step()
    return [p.detach() for p in ps], opt


def lr_lambda(step, warmup, stable, decay, decay_type, min_lr_factor):
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


def schedule(total, warmup, decay_ratio, decay_type, min_lr_factor):
    """torchtitan build_lr_schedulers' step counts, then the LambdaLR factors of steps 0..total-1."""
    warmup = min(warmup, total)
    if decay_ratio is not None:
        decay = round(total * decay_ratio)
        if warmup + decay > total:
            decay = total - warmup
    else:
        decay = total - warmup
    stable = total + 1 - warmup - decay
    lam = functools.partial(lr_lambda, warmup=warmup, stable=stable, decay=decay,
                            decay_type=decay_type, min_lr_factor=min_lr_factor)
    # through LambdaLR itself, as TorchTitan: the lr in effect at each optimizer step
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=1.0)
    sch = torch.optim.lr_scheduler.LambdaLR(opt, lam)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sch.step()
    return out


SCHEDULES = [  # must match tests/test_optim.c
    (10, 2, 0.8, "linear", 0.0),
    (20, 5, None, "cosine", 0.1),
    (10, 3, 0.5, "sqrt", 0.0),
    (5, 10, 0.5, "linear", 0.0),
    (10, 0, 0.0, "linear", 0.0),
    (9, 2, 0.25, "cosine", 0.2),
]


def main():
    gen = torch.Generator().manual_seed(7)
    params = [torch.randn(s, generator=gen).float().double() for _, s in PARAMS]
    grads = [[(torch.randn(s, generator=gen) * 0.1).float().double() for _, s in PARAMS] for _ in range(STEPS)]
    out = {}
    for (n, _), p in zip(PARAMS, params):
        out[f"init.{n}"] = p
    for step in range(STEPS):
        for (n, _), g in zip(PARAMS, grads[step]):
            out[f"grad{step}.{n}"] = g
    adamw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    res, opt = run_torch(torch.optim.AdamW, params, grads, foreach=False, **adamw)
    for (n, _), p, q in zip(PARAMS, res, opt.param_groups[0]["params"]):
        out[f"adamw.{n}"] = p
        out[f"adamw.exp_avg.{n}"] = opt.state[q]["exp_avg"]
        out[f"adamw.exp_avg_sq.{n}"] = opt.state[q]["exp_avg_sq"]
    res, _ = run_torch(torch.optim.SGD, params, grads, lr=0.1, momentum=0.9, dampening=0.1,
                       weight_decay=0.01, foreach=False)
    for (n, _), p in zip(PARAMS, res):
        out[f"sgd_momentum.{n}"] = p
    res, _ = run_torch(torch.optim.SGD, params, grads, lr=0.1, momentum=0.9, nesterov=True,
                       weight_decay=0.0, foreach=False)
    for (n, _), p in zip(PARAMS, res):
        out[f"sgd_nesterov.{n}"] = p
    res, _ = run_torch(torch.optim.SGD, params, grads, lr=0.1, weight_decay=0.01, foreach=False)
    for (n, _), p in zip(PARAMS, res):
        out[f"sgd_plain.{n}"] = p
    res, bufs = muon_f64(params, grads, lr=0.02, wd=0.1, mom=0.95, nesterov=True,
                         adamw=dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1))
    for (n, _), p in zip(PARAMS, res):
        out[f"muon.{n}"] = p
    # cross-check the float64 restatement against torch.optim.Muon (bfloat16 Newton-Schulz)
    hidden = [i for i, (n, s) in enumerate(PARAMS) if len(s) == 2 and not n.startswith("tok_embeddings")]
    mp = [params[i].clone().requires_grad_(True) for i in hidden]
    mo = torch.optim.Muon(mp, lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True)
    for step in range(STEPS):
        for k, i in enumerate(hidden):
            mp[k].grad = grads[step][i].clone()
        mo.param_groups[0]["lr"] = 0.02 * LR_FACTORS[step]
        mo.step()
    for k, i in enumerate(hidden):
        d = (mp[k].detach() - res[i]).abs().max().item()
        print(f"torch.optim.Muon (bf16 NS) vs float64 restatement, {PARAMS[i][0]}: max |diff| {d:.2e}")
        assert d < 2e-2 * 0.02 * 3 * 2, d
        out[f"muon_torch_bf16.{PARAMS[i][0]}"] = mp[k].detach()
    # clip_grad_norm_ on the step-0 gradients
    cp = [p.clone().requires_grad_(True) for p in params]
    for p, g in zip(cp, grads[0]):
        p.grad = g.clone()
    norm = torch.nn.utils.clip_grad_norm_(cp, 0.5)
    out["clip.norm"] = norm.reshape(1)
    for (n, _), p in zip(PARAMS, cp):
        out[f"clip.{n}"] = p.grad
    for k, sc in enumerate(SCHEDULES):
        out[f"schedule{k}"] = torch.tensor(schedule(*sc))
    path = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "golden_optim.safetensors")
    save_file({k: v.float().contiguous() for k, v in out.items()}, path,
              metadata={"generator": f"tools/golden/make_optim_golden.py (PyTorch {torch.__version__})"})
    print(path, os.path.getsize(path), "bytes; clip norm", norm.item())


if __name__ == "__main__":
    main()
