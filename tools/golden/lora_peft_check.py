#!/usr/bin/env python3
"""Checks a PEFT adapter written by hp-train (lora.save_folder) against peft and transformers:
peft.PeftModel.from_pretrained loads it onto the base HF folder, and the folder that
`hp-ckpt merge-lora BASE ADAPTER MERGED` wrote gives the same logits in transformers. A manual
check (docs/finetune.md "LoRA"), not run by the tests (they need no Python):

    /tmp/loravenv/bin/python tools/golden/lora_peft_check.py BASE ADAPTER MERGED [VOCAB]
"""
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def main():
    base, adapter, merged = sys.argv[1:4]
    vocab = int(sys.argv[4]) if len(sys.argv) > 4 else 2410
    tok = torch.tensor([[(i * 37 + 5) % vocab for i in range(32)]])
    m = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        lb = m(tok).logits
    p = PeftModel.from_pretrained(m, adapter).eval()
    with torch.no_grad():
        lp = p(tok).logits
    mm = AutoModelForCausalLM.from_pretrained(merged, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        lm = mm(tok).logits
    # float32: the merged weight W + s B A and the unmerged W x + s B (A x) differ by rounding only
    bound = 1e-4 * max(1.0, lp.abs().max().item())
    d = (lp - lm).abs().max().item()
    print(f"the adapter moves the logits by {(lp - lb).abs().max().item():.4g}; "
          f"peft(base + adapter) vs merged folder: max |diff| {d:.3g} (bound {bound:.3g}) -> {'OK' if d <= bound else 'FAIL'}")
    sys.exit(0 if d <= bound else 1)


if __name__ == "__main__":
    main()
