#!/usr/bin/env python3
"""Makes the small HF model folders of tests/test_hf_shapes.c with transformers: shapes no
preset has (GQA with one KV head, head_dim != hidden/heads, tied and untied embeddings, RoPE
with and without Llama 3.1 "llama3" scaling; llama and qwen3; a Qwen3-MoE (Qwen3MoeForCausalLM:
4 experts top-2, norm_topk_prob, one dense first layer), whose experts transformers saves one
tensor per expert; a DeepSeek-V3 (DeepseekV3ForCausalLM: MLA with q_lora, YaRN, group-limited
sigmoid routing, a shared expert)), fp32 weights drawn at a scale
that gives logits of order 1, and the expected logits of fixed random tokens.

Two more DeepSeek-V3 folders for issue 28 (interop without silent errors):
- deepseek_v3_yarn4k_bias: DeepSeek-V3's own YaRN numbers (original context 4096,
  max_position_embeddings 163840, factor 40, mscale = mscale_all_dim = 1, beta 32 / 1), a non-zero
  e_score_correction_bias (every real checkpoint has one), 8 experts in 4 groups (topk_group 2),
  rms_norm_eps 1e-5 with small q/kv latents (q_a_proj and the latent rows of
  kv_a_proj_with_mqa x 0.01), so that transformers' fixed 1e-6 eps of q_a_layernorm /
  kv_a_layernorm matters; a byte-level BPE tokenizer.json (the `tokenizers` library) and
  transformers' greedy tokens for a prompt (hp-generate must reproduce them).
- deepseek_v3_beta16_g4: YaRN with beta_fast 16 / beta_slow 2, 8 experts in 4 groups, a full
  q_proj (q_lora_rank null): what hp-ckpt to-hf must write back as config.json has it.
Each of these is checked here to be discriminating: the logits move by far more than the C
test's bound (2e-5 of max |ref|) when the bias is dropped, YaRN is off, the MLA norms use
rms_norm_eps, or the betas are 32 / 1; the greedy tokens change without the bias or without
YaRN; and every greedy step's top-2 logit margin and every router decision's margin are far
above float32 rounding, so the C model (f32) must pick the same tokens and experts.

Each folder tests/data/hf_shapes/NAME/ holds what save_pretrained writes (config.json,
model.safetensors, generation_config.json) and expected.safetensors with "tokens" (I32, (B, T))
and "logits" (F32, (B, T, vocab)): transformers' forward in float64 on the same fp32 weights
(the rule of tests/test_golden.c: the C model in f32 against an f64 reference); with
"generate", also tokenizer.json and "prompt_ids" / "greedy_ids" (I32: BOS + the prompt's ids,
then transformers' greedy continuation) with the prompt text in the metadata.

    python tools/golden/make_hf_shapes.py [OUT_DIR [NAME ...]]     # default tests/data/hf_shapes, all
(needs transformers >= 5, torch, safetensors and tokenizers; made with the versions in each
expected.safetensors' metadata)
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
    # issue 28: DeepSeek-V3's YaRN numbers (4096 -> 163840, factor 40, mscale 1, beta 32 / 1), a non-zero
    # e_score_correction_bias, 8 experts in 4 groups, rms_norm_eps 1e-5 with small latents, greedy tokens
    dict(name="deepseek_v3_yarn4k_bias", arch="deepseek_v3", hidden_size=48, num_attention_heads=4,
         num_key_value_heads=4, intermediate_size=64, num_hidden_layers=3, tie_word_embeddings=False,
         rope_theta=10000.0, rope_scaling=dict(rope_type="yarn", factor=40.0, beta_fast=32.0, beta_slow=1.0, mscale=1.0,
                                               mscale_all_dim=1.0, original_max_position_embeddings=4096),
         max_position_embeddings=163840, rms_norm_eps=1e-5, n_routed_experts=8, num_experts_per_tok=3,
         moe_intermediate_size=16, n_shared_experts=1, first_k_dense_replace=1, n_group=4, topk_group=2,
         routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=16, kv_lora_rank=8, qk_nope_head_dim=8,
         qk_rope_head_dim=16, v_head_dim=12, rope_interleave=True,
         extra=dict(bias_std=0.1, latent_scale=0.01, prompt="the quick brown fox", max_new=12)),
    # issue 28: YaRN beta_fast 16 / beta_slow 2 (hp-ckpt to-hf once wrote 32 / 1), 8 experts in 4 groups
    # (to-hf once could not write n_group), a full q_proj
    dict(name="deepseek_v3_beta16_g4", arch="deepseek_v3", hidden_size=32, num_attention_heads=4,
         num_key_value_heads=4, intermediate_size=48, num_hidden_layers=3, tie_word_embeddings=True,
         rope_theta=10000.0, rope_scaling=dict(rope_type="yarn", factor=4.0, beta_fast=16.0, beta_slow=2.0, mscale=1.0,
                                               mscale_all_dim=1.0, original_max_position_embeddings=64),
         rms_norm_eps=1e-6, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=2,
         first_k_dense_replace=1, n_group=4, topk_group=2, routed_scaling_factor=1.5, norm_topk_prob=False,
         q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=16, v_head_dim=8,
         rope_interleave=True, extra=dict(bias_std=0.05)),
]

TOL = 2e-5   # tests/test_hf_shapes.c TOL_LOGITS: max |C - ref| / max |ref|
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def make_config(spec, rope_override=None, **ids):
    kw = {k: v for k, v in spec.items() if k not in ("name", "arch", "rope_theta", "rope_scaling", "extra")}
    rope = dict(rope_override or spec["rope_scaling"] or {"rope_type": "default"})
    rope["rope_theta"] = spec["rope_theta"]
    kw.setdefault("max_position_embeddings", 256)
    common = dict(vocab_size=VOCAB, bos_token_id=ids.get("bos", 1), eos_token_id=ids.get("eos", 2), **kw)
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
    return cfg, Model


def build(spec, seed, **ids):
    cfg, Model = make_config(spec, **ids)
    torch.manual_seed(seed)
    model = Model(cfg).float().eval()
    g = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():   # weights of a scale that makes every layer matter (HF's init is 0.02)
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
        extra = spec.get("extra", {})
        for name, b in model.named_buffers():   # the router's selection bias (a buffer: zeros by default)
            if name.endswith("e_score_correction_bias") and extra.get("bias_std"):
                b.copy_(extra["bias_std"] * torch.randn(b.shape, generator=g))
        if extra.get("latent_scale"):   # small q / kv latents: the MLA norms' eps then shows
            for layer in model.model.layers:
                a = layer.self_attn
                if a.q_lora_rank is not None:
                    a.q_a_proj.weight.mul_(extra["latent_scale"])
                a.kv_a_proj_with_mqa.weight[: spec["kv_lora_rank"]].mul_(extra["latent_scale"])
    return model


def tokenizer_for(text):
    """A byte-level BPE of VOCAB - 0 ids at most: 256 bytes, merges, then BOS / EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 2, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([text] * 50, trainer)
    tok.add_special_tokens([BOS, EOS])
    assert tok.get_vocab_size() <= VOCAB, tok.get_vocab_size()
    return tok


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def router_margins(model, ids):
    """The smallest gap of every routing decision over ids: group choice (the topk_group-th vs
    the next group score) and expert choice (the top_k-th vs the next allowed score)."""
    gaps = []

    def hook(mod, inp, out):
        h = inp[0].reshape(-1, mod.hidden_dim).double()
        s = torch.sigmoid(h @ mod.weight.double().t()) + mod.e_score_correction_bias.double()
        E, G = mod.num_experts, mod.num_group
        gs = s.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1).sort(-1, descending=True)[0]
        if mod.topk_group < G:
            gaps.append((gs[:, mod.topk_group - 1] - gs[:, mod.topk_group]).min().item())
        keep = torch.zeros_like(gs).scatter_(1, s.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1).topk(
            mod.topk_group, dim=-1)[1], 1).bool()
        m = s.masked_fill(~keep.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E), float("-inf"))
        srt = m.sort(-1, descending=True)[0]
        nxt = srt[:, mod.top_k]
        gaps.append(torch.where(torch.isinf(nxt), torch.full_like(nxt, 1.0), srt[:, mod.top_k - 1] - nxt).min().item())

    hs = [l.mlp.gate.register_forward_hook(hook) for l in model.model.layers if hasattr(l.mlp, "gate")]
    with torch.no_grad():
        model(ids)
    for h in hs:
        h.remove()
    return min(gaps)


def greedy(model, ids, n, eos):
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=eos)
        logits = model(out).logits[0]
    # the top-2 margin of every greedy step (the logits that chose out[t + 1])
    steps = logits[ids.shape[1] - 1: out.shape[1] - 1]
    top2 = steps.topk(2, dim=-1)[0]
    return out[0], ((top2[:, 0] - top2[:, 1]) / logits.abs().max()).min().item()


def discriminating(spec, seed, model, tokens, ref, ids):
    """The variants each issue-28 item once computed: each must move the logits far past TOL."""
    state = model.state_dict()

    def variant(rope=None):
        cfg, Model = make_config(spec, rope_override=rope, **ids)
        m = Model(cfg).double().eval()
        m.load_state_dict(state)
        return m

    out = {}
    m = variant()
    for name, b in m.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.zero_()
    out["no e_score_correction_bias"] = m
    out["YaRN off"] = variant(rope={"rope_type": "default"})
    r = dict(spec["rope_scaling"])
    r["beta_fast"], r["beta_slow"] = (32.0, 1.0) if r["beta_fast"] != 32.0 else (16.0, 2.0)
    out["beta %g / %g" % (r["beta_fast"], r["beta_slow"])] = variant(rope=r)
    if spec["rms_norm_eps"] != 1e-6:
        m = variant()
        for layer in m.model.layers:
            for n in ("q_a_layernorm", "kv_a_layernorm"):
                if getattr(layer.self_attn, n, None) is not None:
                    getattr(layer.self_attn, n).variance_epsilon = spec["rms_norm_eps"]
        out["MLA norms at rms_norm_eps"] = m
    for what, m in out.items():
        with torch.no_grad():
            e = rel(m(tokens).logits.float(), ref)
        print(f"  {what}: logits rel err {e:.3g}")
        assert e > 100 * TOL, f"{spec['name']}: {what} moves the logits by {e:.3g} only"
    return out


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../tests/data/hf_shapes")
    only = sys.argv[2:]   # names to (re)make; default all
    for i, spec in enumerate(SHAPES):
        if only and spec["name"] not in only:
            continue
        d = os.path.join(out, spec["name"])
        extra = spec.get("extra", {})
        tok, ids = None, {}
        if "prompt" in extra:   # the folder's tokenizer; config.json's bos / eos are its specials
            tok = tokenizer_for("the quick brown fox jumps over the lazy dog. " * 4)
            ids = {"bos": tok.token_to_id(BOS), "eos": tok.token_to_id(EOS)}
        model = build(spec, i, **ids)
        model.save_pretrained(d, safe_serialization=True)
        g = torch.Generator().manual_seed(7 + i)
        tokens = torch.randint(0, VOCAB, (B, T), generator=g)
        with torch.no_grad():
            ref = model.double()(tokens).logits.float()
        tensors = {"tokens": tokens.to(torch.int32).contiguous(), "logits": ref.contiguous()}
        meta = {"transformers": transformers.__version__, "torch": torch.__version__, "spec": json.dumps(spec)}
        if extra:
            margin = router_margins(model, tokens)
            print(f"  router margin over the tokens {margin:.3g}")
            assert margin > 1e-4, f"{spec['name']}: a routing decision within {margin:.3g} of a tie"
            variants = discriminating(spec, i, model, tokens, ref, ids)
        if tok is not None:
            tok.save(os.path.join(d, "tokenizer.json"))
            prompt = [ids["bos"]] + tok.encode(extra["prompt"], add_special_tokens=False).ids
            p = torch.tensor([prompt])
            seq, margin = greedy(model, p, extra["max_new"], ids["eos"])
            print(f"  greedy {seq.tolist()}: top-2 margin {margin:.3g} of max |logit|")
            # two logits each within TOL x max |ref| of the reference: a margin above 2 TOL keeps the
            # argmax; 5 TOL leaves room for the decode path's other summation order
            assert margin > 5 * TOL, f"{spec['name']}: a greedy step within {margin:.3g} of a tie"
            rm = router_margins(model, seq.unsqueeze(0))
            assert rm > 1e-4, f"{spec['name']}: a routing decision of the greedy run within {rm:.3g} of a tie"
            assert len(seq) == len(prompt) + extra["max_new"], "the greedy run stopped at EOS"
            for what in ("no e_score_correction_bias", "YaRN off"):
                other, _ = greedy(variants[what], p, extra["max_new"], ids["eos"])
                print(f"  greedy with {what}: {other.tolist()}")
                assert other.tolist() != seq.tolist(), f"{spec['name']}: greedy tokens do not depend on {what}"
            tensors["prompt_ids"] = p[0].to(torch.int32).contiguous()
            tensors["greedy_ids"] = seq.to(torch.int32).contiguous()
            meta["prompt"] = extra["prompt"]
        save_file(tensors, os.path.join(d, "expected.safetensors"), metadata=meta)
        print(f"{d}: logits max |x| {ref.abs().max():.3g}")


if __name__ == "__main__":
    main()
