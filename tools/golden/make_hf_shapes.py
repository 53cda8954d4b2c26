#!/usr/bin/env python3
"""Makes the small HF model folders of tests/test_hf_shapes.c with transformers: shapes no
preset has (GQA with one KV head, head_dim != hidden/heads, tied and untied embeddings, RoPE
with and without Llama 3.1 "llama3" scaling; llama and qwen3; a Qwen3-MoE (Qwen3MoeForCausalLM:
4 experts top-2, norm_topk_prob, one dense first layer), whose experts transformers saves one
tensor per expert; a DeepSeek-V3 (DeepseekV3ForCausalLM: MLA with q_lora, YaRN, group-limited
sigmoid routing, a shared expert)), fp32 weights drawn at a scale
that gives logits of order 1, and the expected logits of fixed random tokens.

Each folder tests/data/hf_shapes/NAME/ holds what save_pretrained writes (config.json,
model.safetensors, generation_config.json) and expected.safetensors with "tokens" (I32, (B, T))
and "logits" (F32, (B, T, vocab)): transformers' forward in float64 on the same fp32 weights
(the rule of tests/test_golden.c: the C model in f32 against an f64 reference).

    python tools/golden/make_hf_shapes.py [OUT_DIR]     # default tests/data/hf_shapes
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

VOCAB = 264   # = the test tokenizer: 256 bytes, 2 special tokens, 6 merges (initial load through hp-train)
B, T = 2, 12

SHAPES = [
    # Llama 2 style: one KV head, no rope scaling, eps 1e-6, untied
    dict(name="llama_kv1_untied", arch="llama", hidden_size=48, num_attention_heads=4, num_key_value_heads=1,
         intermediate_size=80, num_hidden_layers=2, tie_word_embeddings=False, rope_theta=10000.0,
         rope_scaling=None, rms_norm_eps=1e-6),
    # head_dim 16 != 48 / 4, tied, Llama 3.1 scaling with a short original context
    dict(name="llama_hd16_tied_rope3", arch="llama", hidden_size=48, num_attention_heads=4, num_key_value_heads=2,
         head_dim=16, intermediate_size=96, num_hidden_layers=2, tie_word_embeddings=True, rope_theta=500000.0,
         rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position_embeddings=32), rms_norm_eps=1e-5),
    # multi-head (KV = heads), 3 layers, untied, another scaling factor
    dict(name="llama_mha_untied_rope3", arch="llama", hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
         intermediate_size=48, num_hidden_layers=3, tie_word_embeddings=False, rope_theta=500000.0,
         rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position_embeddings=16), rms_norm_eps=1e-5),
    # qwen3: one KV head, head_dim 16 != 32 / 4, tied, theta 1e6
    dict(name="qwen3_kv1_hd16_tied", arch="qwen3", hidden_size=32, num_attention_heads=4, num_key_value_heads=1,
         head_dim=16, intermediate_size=64, num_hidden_layers=2, tie_word_embeddings=True, rope_theta=1000000.0,
         rope_scaling=None, rms_norm_eps=1e-6),
    # qwen3 untied with llama3 scaling, 6 heads of 8 over hidden 48
    dict(name="qwen3_untied_rope3", arch="qwen3", hidden_size=48, num_attention_heads=6, num_key_value_heads=2,
         head_dim=8, intermediate_size=80, num_hidden_layers=2, tie_word_embeddings=False, rope_theta=1000000.0,
         rope_scaling=dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position_embeddings=64), rms_norm_eps=1e-6),
    # qwen3_moe: layer 0 dense (mlp_only_layers), layers 1-2 MoE of 4 experts (hidden 16), top-2, tied
    dict(name="qwen3_moe_e4_top2_tied", arch="qwen3_moe", hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
         head_dim=8, intermediate_size=48, num_hidden_layers=3, tie_word_embeddings=True, rope_theta=1000000.0,
         rope_scaling=None, rms_norm_eps=1e-6, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
         norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0]),
    # deepseek_v3: MLA (q_lora 12, kv_lora 16, q|k 8 + 4, v 12, interleaved RoPE) with YaRN whose HF
    # semantics equal TorchTitan's (mscale == mscale_all_dim: attention_factor 1, softmax scale x mscale^2;
    # max_position_embeddings 256 > the original 64); layer 0 dense, layers 1-2 MoE of 4 experts in 2 groups
    # (topk_group 1), top-2, sigmoid router with norm_topk_prob and routed_scaling_factor, one shared expert
    dict(name="deepseek_v3_mla_e4_yarn", arch="deepseek_v3", hidden_size=32, num_attention_heads=4,
         num_key_value_heads=4, intermediate_size=48, num_hidden_layers=3, tie_word_embeddings=False,
         rope_theta=10000.0, rope_scaling=dict(rope_type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0, mscale=0.7,
                                               mscale_all_dim=0.7, original_max_position_embeddings=64),
         rms_norm_eps=1e-6, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1,
         first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
         q_lora_rank=12, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12, rope_interleave=True),
]


def build(spec, seed):
    kw = {k: v for k, v in spec.items() if k not in ("name", "arch", "rope_theta", "rope_scaling")}
    rope = dict(spec["rope_scaling"] or {"rope_type": "default"})
    rope["rope_theta"] = spec["rope_theta"]
    common = dict(vocab_size=VOCAB, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, **kw)
    if spec["arch"] in ("qwen3_moe", "deepseek_v3"):   # the per-expert loop (torch's grouped_mm has no float64)
        common["experts_implementation"] = "eager"
    Cfg, Model = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                  "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
                  "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
                  "deepseek_v3": (transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM)}[spec["arch"]]
    try:   # transformers 5: rope_parameters; 4.x: rope_theta + rope_scaling
        cfg = Cfg(rope_parameters=rope, **common)
        assert cfg.rope_parameters["rope_theta"] == spec["rope_theta"]
    except (TypeError, AttributeError, AssertionError, KeyError):
        cfg = Cfg(rope_theta=spec["rope_theta"], rope_scaling=spec["rope_scaling"], **common)
    torch.manual_seed(seed)
    model = Model(cfg).float().eval()
    g = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():   # weights of a scale that makes every layer matter (HF's init is 0.02)
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return model


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../tests/data/hf_shapes")
    only = sys.argv[2:]   # names to (re)make; default all
    for i, spec in enumerate(SHAPES):
        if only and spec["name"] not in only:
            continue
        d = os.path.join(out, spec["name"])
        model = build(spec, i)
        model.save_pretrained(d, safe_serialization=True)
        g = torch.Generator().manual_seed(7 + i)
        tokens = torch.randint(0, VOCAB, (B, T), generator=g)
        with torch.no_grad():
            ref = model.double()(tokens).logits.float()
        save_file({"tokens": tokens.to(torch.int32).contiguous(), "logits": ref.contiguous()},
                  os.path.join(d, "expected.safetensors"),
                  metadata={"transformers": transformers.__version__, "torch": torch.__version__,
                            "spec": json.dumps(spec)})
        print(f"{d}: logits max |x| {ref.abs().max():.3g}")


if __name__ == "__main__":
    main()
