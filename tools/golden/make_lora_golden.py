#!/usr/bin/env python3
"""PEFT LoRA golden files for tests/test_lora.c (docs/finetune.md "LoRA").

For a tiny Qwen3 and a tiny Llama (transformers), writes under tests/data/lora/<family>/:
  base/        the HF folder (config.json, model.safetensors, float32)
  adapter/     a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors) on all seven
               projections, r 4, alpha 8, with non-zero A and B (B drawn, not PEFT's zeros, so the
               adapter changes the logits)
  golden.safetensors  tokens (T,) i32 and logits (T, V) f32 of the PEFT model (base + adapter),
               and logits_base of the base model alone

The C test loads base + adapter and compares logits, merges the adapter with hp_hf_merge_lora
and compares the merged folder's logits, and saves the adapter back and compares it with this one.
The tests never run Python. Regenerate (CPU torch is enough):

    python3 -m venv /tmp/loravenv && /tmp/loravenv/bin/pip install torch transformers peft safetensors
    /tmp/loravenv/bin/python tools/golden/make_lora_golden.py
"""
import json
import os
import shutil

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "lora")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
T = 12


def build(family):
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  torch_dtype="float32")
    if family == "qwen3":
        cfg = Qwen3Config(head_dim=16, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True, **common)
        return Qwen3ForCausalLM(cfg)
    cfg = LlamaConfig(rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False, **common)
    return LlamaForCausalLM(cfg)


def make(family, seed):
    torch.manual_seed(seed)
    model = build(family).float().eval()
    out = os.path.join(ROOT, family)
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(os.path.join(out, "base"), safe_serialization=True)
    for extra in ("generation_config.json",):   # keep the folder to what the test needs
        p = os.path.join(out, "base", extra)
        if os.path.exists(p):
            os.remove(p)
    tokens = torch.tensor([[(i * 37 + 5) % 96 for i in range(T)]])
    with torch.no_grad():
        logits_base = model(tokens).logits[0].float().contiguous()
    lcfg = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0, bias="none",
                      task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, lcfg)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:   # PEFT starts B at zeros; a non-zero B makes the adapter count
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    peft_model.eval()
    with torch.no_grad():
        logits = peft_model(tokens).logits[0].float().contiguous()
    peft_model.save_pretrained(os.path.join(out, "adapter"), safe_serialization=True)
    readme = os.path.join(out, "adapter", "README.md")   # PEFT's model card: not needed
    if os.path.exists(readme):
        os.remove(readme)
    save_file({"tokens": tokens[0].to(torch.int32).contiguous(), "logits": logits, "logits_base": logits_base},
              os.path.join(out, "golden.safetensors"))
    delta = (logits - logits_base).abs().max().item()
    print(f"{family}: max |logits - logits_base| = {delta:.4f}, max |logits| = {logits.abs().max().item():.4f}")
    with open(os.path.join(out, "adapter", "adapter_config.json")) as f:
        ac = json.load(f)
    print(f"{family}: adapter r {ac['r']} alpha {ac['lora_alpha']} targets {sorted(ac['target_modules'])}")


if __name__ == "__main__":
    make("qwen3", 1)
    make("llama", 2)
