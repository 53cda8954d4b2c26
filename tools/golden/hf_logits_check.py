#!/usr/bin/env python3
"""Loads an HF checkpoint exported by hyperparallel (hp_hf_export) in HF transformers and
compares its logits with ours. Used by tests/test_hf_transformers.c, which writes into DIR:
the HF files, tokens.txt (one line of token ids) and logits.bin (float32, (T, vocab), our
forward). Exit 0 when transformers' logits match within atol/rtol 1e-4, 1 otherwise.

    python tools/golden/hf_logits_check.py DIR
"""
import sys

import numpy as np
import torch
import transformers


def main() -> int:
    d = sys.argv[1]
    tokens = [int(x) for x in open(f"{d}/tokens.txt").read().split()]
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        out = model(torch.tensor([tokens])).logits[0].numpy()
    ours = np.fromfile(f"{d}/logits.bin", dtype=np.float32).reshape(out.shape)
    diff = float(np.abs(out - ours).max())
    ok = np.allclose(out, ours, atol=1e-4, rtol=1e-4)
    print(f"{model.config.model_type}: transformers {transformers.__version__}, logits {out.shape}, "
          f"max abs diff {diff:.3g} -> {'OK' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
