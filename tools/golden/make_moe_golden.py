#!/usr/bin/env python3
"""Golden reference for tests/test_moe.c: a pure-PyTorch re-implementation of TorchTitan's MoE
(TokenChoiceTopKRouter, GroupedExperts with the for-loop path, shared experts, the local
dispatcher's stable argsort and scatter_add combine; no torchtitan import), run in float64 on
float32-representable weights. For each case it stores the weights, the input x, the output
gradient dout, the output out = moe(x), tokens_per_expert and every gradient (x, gate, experts,
shared experts) of sum(out * dout), to tests/data/golden_moe.safetensors (float32).

Run:  /opt/torchvenv/bin/python tools/golden/make_moe_golden.py [--out tests/data]
"""
import argparse
import json
import os
import struct

import torch
import torch.nn.functional as F


def save_file(tensors, path, metadata):
    """A minimal safetensors writer (8-byte little-endian header size, JSON header, raw
    little-endian float32 data), so the script needs torch only."""
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for k in sorted(tensors):
        b = tensors[k].numpy().astype("<f4").tobytes()
        header[k] = {"dtype": "F32", "shape": list(tensors[k].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)

torch.set_default_dtype(torch.float64)

# must match the golden cases in tests/test_moe.c
CASES = {
    "ds": dict(dim=16, hidden=12, n_experts=8, top_k=3, score_fn="sigmoid", route_norm=True,
               route_scale=2.5, score_before_experts=False, n_shared_experts=1, shared_hidden=12,
               n_expert_groups=4, n_limited_groups=2, N=20, bias=True),
    "qw": dict(dim=16, hidden=10, n_experts=6, top_k=2, score_fn="softmax", route_norm=True,
               route_scale=1.0, score_before_experts=False, n_shared_experts=0, shared_hidden=0,
               n_expert_groups=0, n_limited_groups=0, N=18, bias=False),
    "sb": dict(dim=12, hidden=8, n_experts=4, top_k=2, score_fn="softmax", route_norm=False,
               route_scale=1.0, score_before_experts=True, n_shared_experts=2, shared_hidden=6,
               n_expert_groups=0, n_limited_groups=0, N=15, bias=False),
}


def f32(t):
    """Round to float32-representable values (the C side holds float32)."""
    return t.to(torch.float32).to(torch.float64)


def router(c, x, gate, expert_bias):
    scores = x @ gate.T
    scores = torch.sigmoid(scores) if c["score_fn"] == "sigmoid" else F.softmax(scores, dim=1)
    choice = scores + expert_bias if expert_bias is not None else scores
    G = c["n_expert_groups"]
    if G and G > 1 and c["n_limited_groups"] < G:
        grouped = choice.view(-1, G, c["n_experts"] // G)
        group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=c["n_limited_groups"], dim=-1)[1]
        mask = torch.ones_like(group_scores, dtype=torch.bool)
        mask.scatter_(1, group_idx, False)
        choice = grouped.masked_fill(mask.unsqueeze(-1), float("-inf")).view(-1, c["n_experts"])
    idx = torch.topk(choice.detach(), k=c["top_k"], dim=1)[1]
    top = scores.gather(1, idx)   # gate values from the unbiased scores
    if c["route_norm"]:
        top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
    return top * c["route_scale"], idx


def moe(c, x, p, expert_bias):
    N, D = x.shape
    K, E = c["top_k"], c["n_experts"]
    top, idx = router(c, x, p["gate"], expert_bias)
    counts = torch.bincount(idx.flatten(), minlength=E)
    order = torch.argsort(idx.flatten(), stable=True)
    tok = order // K
    routed = x[tok]
    sc = top.flatten()[order].reshape(-1, 1)
    if c["score_before_experts"]:
        routed = routed * sc
    outs, r0 = [], 0
    for e in range(E):
        n = int(counts[e])
        xe = routed[r0:r0 + n]
        h = F.silu(xe @ p["w1"][e].T) * (xe @ p["w3"][e].T)
        outs.append(h @ p["w2"][e].T)
        r0 += n
    routed_out = torch.cat(outs, dim=0)
    if not c["score_before_experts"]:
        routed_out = routed_out * sc
    if c["n_shared_experts"]:
        out = (F.silu(x @ p["sw1"].T) * (x @ p["sw3"].T)) @ p["sw2"].T
    else:
        out = torch.zeros_like(x)
    out = out.scatter_add(0, tok.reshape(-1, 1).expand(-1, D), routed_out)
    return out, counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data"))
    args = ap.parse_args()
    torch.manual_seed(20261201)
    tensors, meta = {}, {}
    for name, c in CASES.items():
        D, Fh, E = c["dim"], c["hidden"], c["n_experts"]
        Fs = c["n_shared_experts"] * c["shared_hidden"]
        p = {"gate": f32(torch.randn(E, D) * 0.5), "w1": f32(torch.randn(E, Fh, D) * 0.3),
             "w2": f32(torch.randn(E, D, Fh) * 0.3), "w3": f32(torch.randn(E, Fh, D) * 0.3)}
        if Fs:
            p.update(sw1=f32(torch.randn(Fs, D) * 0.3), sw2=f32(torch.randn(D, Fs) * 0.3),
                     sw3=f32(torch.randn(Fs, D) * 0.3))
        bias = f32(torch.randn(E) * 0.05) if c["bias"] else None
        x = f32(torch.randn(c["N"], D))
        dout = f32(torch.randn(c["N"], D))
        for t in list(p.values()) + [x]:
            t.requires_grad_(True)
        out, counts = moe(c, x, p, bias)
        (out * dout).sum().backward()
        tensors[f"{name}.x"] = x.detach()
        tensors[f"{name}.dout"] = dout
        tensors[f"{name}.out"] = out.detach()
        tensors[f"{name}.tokens_per_expert"] = counts.to(torch.float64)
        tensors[f"{name}.grad.x"] = x.grad
        if bias is not None:
            tensors[f"{name}.expert_bias"] = bias
        for k, v in p.items():
            tensors[f"{name}.param.{k}"] = v.detach()
            tensors[f"{name}.grad.{k}"] = v.grad
        meta[name] = {k: v for k, v in c.items()}
    tensors = {k: v.to(torch.float32).contiguous() for k, v in tensors.items()}
    path = os.path.join(args.out, "golden_moe.safetensors")
    save_file(tensors, path, metadata={"cases": json.dumps(meta), "torch": torch.__version__})
    print(f"wrote {path}: {len(tensors)} tensors, {sum(t.numel() for t in tensors.values())} floats")


if __name__ == "__main__":
    main()
