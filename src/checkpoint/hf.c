/* HF interop: the llama3 / qwen3 state-dict adapters (TorchTitan FQN <-> HF name), Llama's
 * q/k row permutation between TorchTitan's interleaved RoPE and HF's rotate_half (qwen3 uses
 * rotate_half in src/nn already, so it is not permuted), export to HF shards + index +
 * config.json (every dim of the model config, custom ones included) and import of HF weights
 * into any layout, refused when the directory's config.json describes another shape. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyperparallel/checkpoint.h"
#include "hyperparallel/model.h"
#include "hyperparallel/safetensors.h"
#include "dcp-impl.h"

static const struct { const char *tt, *hf; } layer_map[] = {
    {"attention.wq.weight", "self_attn.q_proj.weight"},
    {"attention.wk.weight", "self_attn.k_proj.weight"},
    {"attention.wv.weight", "self_attn.v_proj.weight"},
    {"attention.wo.weight", "self_attn.o_proj.weight"},
    {"attention.q_norm.weight", "self_attn.q_norm.weight"},
    {"attention.k_norm.weight", "self_attn.k_norm.weight"},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
    {"feed_forward.w2.weight", "mlp.down_proj.weight"},
    {"feed_forward.w3.weight", "mlp.up_proj.weight"},
    {"attention_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"moe.router.gate.weight", "mlp.gate.weight"},   /* Qwen3-MoE's router (owner moe) */
};
static const struct { const char *tt, *hf; } top_map[] = {
    {"tok_embeddings.weight", "model.embed_tokens.weight"},
    {"norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

static int is_deepseek(const hp_model_config_t *mc) { return mc->mla; }
static int is_llama(const hp_model_config_t *mc) {
    return strcmp(mc->name, "qwen3") != 0 && strcmp(mc->name, "qwen3_moe") != 0 && !is_deepseek(mc);
}

/* DeepSeek-V3 (DeepseekV3ForCausalLM): the MLA attention and the shared experts; its router,
 * routed experts and dense layers use the common names. HF keeps the interleaved RoPE layout
 * (rope_interleave true): nothing is permuted. */
static const struct { const char *tt, *hf; } mla_map[] = {
    {"attention.wq.weight", "self_attn.q_proj.weight"},
    {"attention.wq_a.weight", "self_attn.q_a_proj.weight"},
    {"attention.q_norm.weight", "self_attn.q_a_layernorm.weight"},
    {"attention.wq_b.weight", "self_attn.q_b_proj.weight"},
    {"attention.wkv_a.weight", "self_attn.kv_a_proj_with_mqa.weight"},
    {"attention.kv_norm.weight", "self_attn.kv_a_layernorm.weight"},
    {"attention.wkv_b.weight", "self_attn.kv_b_proj.weight"},
    {"attention.wo.weight", "self_attn.o_proj.weight"},
    {"moe.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
    {"moe.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
    {"moe.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
    {"moe.expert_bias", "mlp.gate.e_score_correction_bias"},   /* the trainer's checkpoint entry */
};
static int is_qwen3_moe(const hp_model_config_t *mc) { return strcmp(mc->name, "qwen3_moe") == 0; }
/* The trainer checkpoints each MoE layer's expert_bias as "layers.N.moe.expert_bias": DeepSeek-V3's
 * HF name is mlp.gate.e_score_correction_bias; Qwen3-MoE has none (skipped both ways). */
static int is_expert_bias(const char *name) {
    const size_t n = strlen(name), k = strlen(".moe.expert_bias");
    return n > k && !strcmp(name + n - k, ".moe.expert_bias");
}

/* --- mixture of experts (owner moe): Qwen3-MoE (Qwen3MoeForCausalLM) and DeepSeek-V3
 * (DeepseekV3ForCausalLM) maps; a model whose router or experts HF cannot express is refused by
 * the config key --- */
static hp_status_t refuse_moe(const hp_model_config_t *mc, const char *what) {
    if (mc->moe_experts <= 0) return HP_OK;
    if (is_deepseek(mc)) {   /* DeepseekV3TopkRouter: sigmoid, bias for selection, groups, norm, scale */
        const char *key = mc->moe_score_fn != HP_MOE_SCORE_SIGMOID ? "model.moe_score_func (HF: sigmoid)"
                          : mc->moe_shared_experts < 1            ? "model.moe_num_shared_experts (HF: >= 1)"
                          : mc->moe_score_before_experts          ? "model.moe_score_before_experts (HF: false)"
                          : mc->moe_n_dense_layers >= mc->n_layers ? "model.moe_n_dense_layers (HF: < n_layers)"
                                                                  : NULL;
        if (key)
            return hp_error(HP_ERR_UNSUPPORTED, "HF %s: DeepseekV3ForCausalLM cannot express this deepseek_v3 model's "
                            "%s; hint: set it (the 671B flavor has HF's values), or use the DCP checkpoint", what, key);
        return HP_OK;
    }
    if (!is_qwen3_moe(mc))
        return hp_error(HP_ERR_UNSUPPORTED, "HF %s: the MoE model '%s' has no HF state-dict adapter: DeepSeek-V3's HF "
                        "checkpoints use MLA attention, which this model (GQA attention) does not have; hint: use the "
                        "DCP checkpoint or weights.safetensors (TorchTitan names), or qwen3_moe", what, mc->name);
    const char *key = mc->moe_shared_experts > 0                ? "model.moe_num_shared_experts (HF: 0)"
                      : mc->moe_score_fn != HP_MOE_SCORE_SOFTMAX ? "model.moe_score_func (HF: softmax)"
                      : mc->moe_route_scale != 1.0f             ? "model.moe_route_scale (HF: 1)"
                      : mc->moe_score_before_experts            ? "model.moe_score_before_experts (HF: false)"
                      : mc->moe_expert_groups > 1               ? "model.moe_n_expert_groups (HF: none)"
                                                                : NULL;
    if (key)
        return hp_error(HP_ERR_UNSUPPORTED, "HF %s: Qwen3MoeForCausalLM cannot express this qwen3_moe model's %s; hint: "
                        "keep the flavor's value, or use the DCP checkpoint", what, key);
    return HP_OK;
}

static int parse_layer(const char *name, const char *prefix, int *layer, int *used);

/* The routed experts: TorchTitan's 3-D layers.N.moe.experts.w1 / w2 / w3 (E, ., .) are HF's E
 * tensors model.layers.N.mlp.experts.e.gate_proj / down_proj / up_proj.weight. 1 when fqn is
 * one (out: expert e's HF name). */
static int expert_hf_name(const char *fqn, int e, char *out, size_t n) {
    int layer, used;
    if (!parse_layer(fqn, "layers.", &layer, &used)) return 0;
    const char *w = fqn + used, *proj = !strcmp(w, "moe.experts.w1")   ? "gate_proj"
                                        : !strcmp(w, "moe.experts.w2") ? "down_proj"
                                        : !strcmp(w, "moe.experts.w3") ? "up_proj"
                                                                       : NULL;
    if (!proj) return 0;
    snprintf(out, n, "model.layers.%d.mlp.experts.%d.%s.weight", layer, e, proj);
    return 1;
}
int hp_hf_expert_name(const char *fqn, int e, char *out, size_t n) { return expert_hf_name(fqn, e, out, n); }
int hp_hf_is_expert_bias(const char *name) { return is_expert_bias(name); }

/* The model has an HF architecture (hp_hf_export, hp-ckpt to-hf / from-hf). */
hp_status_t hp_hf_check_exportable(const hp_model_config_t *mc, const char *what) {
    HP_TRY(refuse_moe(mc, what));
    if (is_deepseek(mc)) {
        if (mc->moe_experts <= 0)
            return hp_error(HP_ERR_UNSUPPORTED, "HF %s: deepseek_v3 without routed experts has no HF architecture; hint: "
                            "keep model.moe_num_experts", what);
        return HP_OK;
    }
    /* HF's classes fix what a custom config could change: LlamaForCausalLM has no q/k norm,
     * Qwen3ForCausalLM (and Qwen3MoeForCausalLM) always has one */
    if (is_llama(mc) == !!mc->qk_norm)
        return hp_error(HP_ERR_UNSUPPORTED, "HF %s: %s with qk_norm %s has no HF architecture (%s); hint: %s", what,
                        mc->name, mc->qk_norm ? "true" : "false",
                        is_llama(mc) ? "LlamaForCausalLM has no q_norm/k_norm" : "Qwen3ForCausalLM always has q_norm/k_norm",
                        is_llama(mc) ? "use model.name qwen3 for a model with qk_norm" : "keep model.qk_norm true for qwen3");
    return HP_OK;
}
/* --- end --- */

/* "<prefix><layer>." with a decimal layer below HP_MODEL_MAX_LAYERS (names come from files:
 * sscanf's %d would overflow on a long digit string and accept a sign). *used = bytes consumed. */
static int parse_layer(const char *name, const char *prefix, int *layer, int *used) {
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0) return 0;
    const char *p = name + n;
    long v = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 8) v = v * 10 + (*p++ - '0'), digits++;
    if (digits == 0 || *p != '.' || v >= HP_MODEL_MAX_LAYERS) return 0;
    *layer = (int)v;
    *used = (int)(p + 1 - name);
    return 1;
}

hp_status_t hp_hf_name_to_hf(const hp_model_config_t *mc, const char *fqn, char *out, size_t n, int *permute) {
    *permute = 0;
    for (size_t i = 0; i < sizeof top_map / sizeof top_map[0]; i++)
        if (!strcmp(fqn, top_map[i].tt)) {
            snprintf(out, n, "%s", top_map[i].hf);
            return HP_OK;
        }
    int layer, used = 0;
    if (is_deepseek(mc) && parse_layer(fqn, "layers.", &layer, &used))
        for (size_t i = 0; i < sizeof mla_map / sizeof mla_map[0]; i++)
            if (!strcmp(fqn + used, mla_map[i].tt)) {
                snprintf(out, n, "model.layers.%d.%s", layer, mla_map[i].hf);
                return HP_OK;
            }
    if (parse_layer(fqn, "layers.", &layer, &used)) {
        for (size_t i = 0; i < sizeof layer_map / sizeof layer_map[0]; i++)
            if (!strcmp(fqn + used, layer_map[i].tt)) {
                snprintf(out, n, "model.layers.%d.%s", layer, layer_map[i].hf);
                *permute = is_llama(mc) && (i == 0 || i == 1);
                return HP_OK;
            }
    }
    char tmp[160];
    if (expert_hf_name(fqn, 0, tmp, sizeof tmp))   /* mixture of experts (owner moe) */
        return hp_error(HP_ERR_NOT_FOUND, "%s state-dict adapter: '%s' is one HF tensor per expert (%s, ...), not one "
                        "name", mc->name, fqn, tmp);
    return hp_error(HP_ERR_NOT_FOUND, "%s state-dict adapter: no HF name for '%s'", mc->name, fqn);
}

hp_status_t hp_hf_name_from_hf(const hp_model_config_t *mc, const char *hf, char *out, size_t n, int *permute) {
    *permute = 0;
    for (size_t i = 0; i < sizeof top_map / sizeof top_map[0]; i++)
        if (!strcmp(hf, top_map[i].hf)) {
            snprintf(out, n, "%s", top_map[i].tt);
            return HP_OK;
        }
    int layer, used = 0;
    if (is_deepseek(mc) && parse_layer(hf, "model.layers.", &layer, &used))
        for (size_t i = 0; i < sizeof mla_map / sizeof mla_map[0]; i++)
            if (!strcmp(hf + used, mla_map[i].hf)) {
                snprintf(out, n, "layers.%d.%s", layer, mla_map[i].tt);
                return HP_OK;
            }
    if (parse_layer(hf, "model.layers.", &layer, &used)) {
        for (size_t i = 0; i < sizeof layer_map / sizeof layer_map[0]; i++)
            if (!strcmp(hf + used, layer_map[i].hf)) {
                snprintf(out, n, "layers.%d.%s", layer, layer_map[i].tt);
                *permute = is_llama(mc) && (i == 0 || i == 1);
                return HP_OK;
            }
    }
    return hp_error(HP_ERR_NOT_FOUND, "%s state-dict adapter: no TorchTitan name for HF '%s'", mc->name, hf);
}

/* Rows of a (n_heads*hd, dim) q/k weight. to_hf: HF row h*hd + p*hd/2 + i = TorchTitan row
 * h*hd + 2i + p (convert_llama_weights_to_hf's view(nh, hd/2, 2, dim).transpose(1, 2)). */
static void permute_rows(float *dst, const float *src, int64_t rows, int64_t cols, int hd, int to_hf) {
    int64_t nh = rows / hd, half = hd / 2;
    for (int64_t h = 0; h < nh; h++)
        for (int64_t i = 0; i < half; i++)
            for (int p = 0; p < 2; p++) {
                int64_t tt = h * hd + 2 * i + p, hfr = h * hd + p * half + i;
                int64_t d = to_hf ? hfr : tt, s = to_hf ? tt : hfr;
                memcpy(dst + d * cols, src + s * cols, sizeof(float) * (size_t)cols);
            }
}

int hp_hf_is_hf_dir(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    if (access(p, R_OK) == 0) return 1;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    return access(p, R_OK) == 0;
}


/* DeepseekV3Config: MLA sizes, MoE routing, YaRN (rope_parameters; mscale == mscale_all_dim, so
 * HF's attention_factor is 1 and its softmax scale gets mscale^2 as TorchTitan's), or plain
 * RoPE when YaRN is off (max_seq_len <= the original context). */
static json_object *deepseek_config_json(const hp_model_config_t *mc, hp_dtype_t dt) {
    json_object *c = json_object_new_object(), *arch = json_object_new_array();
    json_object_array_add(arch, json_object_new_string("DeepseekV3ForCausalLM"));
    json_object_object_add(c, "architectures", arch);
    json_object_object_add(c, "model_type", json_object_new_string("deepseek_v3"));
#define I(k, v) json_object_object_add(c, k, json_object_new_int(v))
    I("hidden_size", mc->dim);
    I("intermediate_size", mc->hidden_dim);
    I("moe_intermediate_size", mc->moe_hidden);
    I("num_hidden_layers", mc->n_layers);
    I("num_attention_heads", mc->n_heads);
    I("num_key_value_heads", mc->n_heads);
    I("n_shared_experts", mc->moe_shared_experts);
    I("n_routed_experts", mc->moe_experts);
    I("num_experts_per_tok", mc->moe_top_k);
    I("first_k_dense_replace", mc->moe_n_dense_layers);
    I("n_group", mc->moe_expert_groups > 1 ? mc->moe_expert_groups : 1);
    I("topk_group", mc->moe_expert_groups > 1 ? mc->moe_limited_groups : 1);
    I("kv_lora_rank", mc->kv_lora_rank);
    I("qk_nope_head_dim", mc->qk_nope_head_dim);
    I("qk_rope_head_dim", mc->qk_rope_head_dim);
    I("v_head_dim", mc->v_head_dim);
    I("vocab_size", mc->vocab_size);
    I("max_position_embeddings", mc->max_seq_len > 0 ? mc->max_seq_len : 4096);
#undef I
    json_object_object_add(c, "q_lora_rank", mc->q_lora_rank ? json_object_new_int(mc->q_lora_rank) : NULL);
    json_object_object_add(c, "routed_scaling_factor", json_object_new_double(mc->moe_route_scale));
    json_object_object_add(c, "norm_topk_prob", json_object_new_boolean(mc->moe_route_norm));
    json_object_object_add(c, "scoring_func", json_object_new_string("sigmoid"));
    json_object_object_add(c, "topk_method", json_object_new_string("noaux_tc"));
    json_object_object_add(c, "rope_interleave", json_object_new_boolean(1));
    json_object_object_add(c, "rms_norm_eps", json_object_new_double(mc->norm_eps));
    json_object_object_add(c, "rope_theta", json_object_new_double(mc->rope_theta));
    json_object *rs = json_object_new_object();
    json_object_object_add(rs, "rope_theta", json_object_new_double(mc->rope_theta));
    if (hp_model_mla_yarn(mc)) {
        json_object_object_add(rs, "rope_type", json_object_new_string("yarn"));
        json_object_object_add(rs, "factor", json_object_new_double(mc->rope_factor));
        json_object_object_add(rs, "beta_fast", json_object_new_double(mc->rope_beta_fast));
        json_object_object_add(rs, "beta_slow", json_object_new_double(mc->rope_beta_slow));
        json_object_object_add(rs, "mscale", json_object_new_double(mc->mla_mscale));
        json_object_object_add(rs, "mscale_all_dim", json_object_new_double(mc->mla_mscale));
        json_object_object_add(rs, "original_max_position_embeddings", json_object_new_int(mc->rope_original_max_pos));
    } else {
        json_object_object_add(rs, "rope_type", json_object_new_string("default"));
    }
    json_object_object_add(c, "rope_parameters", rs);
    json_object_object_add(c, "tie_word_embeddings", json_object_new_boolean(mc->tie_embeddings));
    json_object_object_add(c, "hidden_act", json_object_new_string("silu"));
    json_object_object_add(c, "attention_bias", json_object_new_boolean(0));
    json_object_object_add(c, "attention_dropout", json_object_new_double(0.0));
    json_object_object_add(c, "initializer_range", json_object_new_double(0.02));
    json_object_object_add(c, "use_cache", json_object_new_boolean(1));
    json_object_object_add(c, "num_nextn_predict_layers", json_object_new_int(0));
    json_object_object_add(c, "torch_dtype", json_object_new_string(dt == HP_BF16 ? "bfloat16" : "float32"));
    json_object_object_add(c, "dtype", json_object_new_string(dt == HP_BF16 ? "bfloat16" : "float32"));
    return c;
}

static json_object *hf_config_json(const hp_model_config_t *mc, hp_dtype_t dt) {
    if (is_deepseek(mc)) return deepseek_config_json(mc, dt);
    json_object *c = json_object_new_object();
    int llama = is_llama(mc);
    json_object *arch = json_object_new_array();
    const int qm = is_qwen3_moe(mc);
    json_object_array_add(arch, json_object_new_string(llama ? "LlamaForCausalLM" : qm ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"));
    json_object_object_add(c, "architectures", arch);
    json_object_object_add(c, "model_type", json_object_new_string(llama ? "llama" : qm ? "qwen3_moe" : "qwen3"));
    if (qm) {   /* mixture of experts (owner moe): the first moe_n_dense_layers are mlp_only_layers */
        json_object_object_add(c, "num_experts", json_object_new_int(mc->moe_experts));
        json_object_object_add(c, "num_experts_per_tok", json_object_new_int(mc->moe_top_k));
        json_object_object_add(c, "moe_intermediate_size", json_object_new_int(mc->moe_hidden));
        json_object_object_add(c, "norm_topk_prob", json_object_new_boolean(mc->moe_route_norm));
        json_object_object_add(c, "decoder_sparse_step", json_object_new_int(1));
        json_object *dense = json_object_new_array();
        for (int l = 0; l < mc->moe_n_dense_layers; l++) json_object_array_add(dense, json_object_new_int(l));
        json_object_object_add(c, "mlp_only_layers", dense);
        json_object_object_add(c, "output_router_logits", json_object_new_boolean(0));
        json_object_object_add(c, "router_aux_loss_coef", json_object_new_double(mc->moe_aux_loss_coeff));
    }
    json_object_object_add(c, "hidden_size", json_object_new_int(mc->dim));
    json_object_object_add(c, "intermediate_size", json_object_new_int(mc->hidden_dim));
    json_object_object_add(c, "num_hidden_layers", json_object_new_int(mc->n_layers));
    json_object_object_add(c, "num_attention_heads", json_object_new_int(mc->n_heads));
    json_object_object_add(c, "num_key_value_heads", json_object_new_int(mc->n_kv_heads));
    json_object_object_add(c, "head_dim", json_object_new_int(mc->head_dim));
    json_object_object_add(c, "vocab_size", json_object_new_int(mc->vocab_size));
    json_object_object_add(c, "rms_norm_eps", json_object_new_double(mc->norm_eps));
    json_object_object_add(c, "rope_theta", json_object_new_double(mc->rope_theta));
    /* with Llama 3 rope scaling HF wants max_position_embeddings above the original context */
    int64_t maxpos = mc->max_seq_len > 0 ? mc->max_seq_len : 2048;
    if (mc->rope_scaling) {
        int64_t scaled = (int64_t)((double)mc->rope_original_max_pos * mc->rope_factor);
        if (scaled > maxpos) maxpos = scaled;
    }
    json_object_object_add(c, "max_position_embeddings", json_object_new_int64(maxpos));
    json_object_object_add(c, "tie_word_embeddings", json_object_new_boolean(mc->tie_embeddings));
    json_object_object_add(c, "hidden_act", json_object_new_string("silu"));
    json_object_object_add(c, "attention_bias", json_object_new_boolean(0));
    json_object_object_add(c, "attention_dropout", json_object_new_double(0.0));
    json_object_object_add(c, "initializer_range", json_object_new_double(0.02));
    json_object_object_add(c, "use_cache", json_object_new_boolean(1));
    json_object_object_add(c, "torch_dtype", json_object_new_string(dt == HP_BF16 ? "bfloat16" : "float32"));
    json_object_object_add(c, "dtype", json_object_new_string(dt == HP_BF16 ? "bfloat16" : "float32"));   /* transformers 5 */
    if (mc->rope_scaling) {   /* HF's "llama3" rope type serves every model that reads rope_scaling */
        json_object *rs = json_object_new_object();
        json_object_object_add(rs, "rope_type", json_object_new_string("llama3"));
        json_object_object_add(rs, "factor", json_object_new_double(mc->rope_factor));
        json_object_object_add(rs, "low_freq_factor", json_object_new_double(mc->rope_low_freq_factor));
        json_object_object_add(rs, "high_freq_factor", json_object_new_double(mc->rope_high_freq_factor));
        json_object_object_add(rs, "original_max_position_embeddings", json_object_new_int(mc->rope_original_max_pos));
        json_object_object_add(c, "rope_scaling", rs);
    }
    if (llama) {
        json_object_object_add(c, "mlp_bias", json_object_new_boolean(0));
        json_object_object_add(c, "pretraining_tp", json_object_new_int(1));
    } else {
        json_object_object_add(c, "use_sliding_window", json_object_new_boolean(0));
        json_object_object_add(c, "sliding_window", NULL);
        json_object_object_add(c, "max_window_layers", json_object_new_int(mc->n_layers));
    }
    return c;
}

hp_status_t hp_hf_write_config(const char *dir, const hp_model_config_t *mc, hp_dtype_t dtype) {
    json_object *cj = hf_config_json(mc, dtype);
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    hp_status_t s = hp_dcp_write_json(path, cj);
    json_object_put(cj);
    return s;
}

/* One parameter as a full f32 tensor (gathered when sharded; collective over the mesh). */
static hp_status_t full_of(const hp_param_t *p, hp_tensor_t *out, void **owned) {
    *owned = NULL;
    if (!p->value.mesh) {
        *out = p->value.local;
        return HP_OK;
    }
    return hp_dtensor_full_tensor(out, owned, NULL, &p->value);
}

hp_status_t hp_hf_export(const char *dir, const hp_model_config_t *mc, const hp_param_t *params, int n_params,
                         hp_comm_t comm, hp_dtype_t dtype, size_t max_shard_bytes) {
    int rank = comm ? hp_comm_rank(comm) : 0;
    HP_TRY(hp_hf_check_exportable(mc, "export"));
    if (dtype != HP_F32 && dtype != HP_BF16)
        return hp_error(HP_ERR_INVALID_ARG, "HF export: dtype %s; expected f32 or bf16", hp_dtype_name(dtype));
    if (!max_shard_bytes) max_shard_bytes = (size_t)5 << 30;
    hp_status_t s = HP_OK;
    if (rank == 0) s = hp_file_mkdirs(dir);
    HP_TRY(hp_dcp_agree(comm, s, "HF export: creating the directory"));
    /* every rank takes part in the gathers; rank 0 keeps the data. Entries: one per
     * parameter, E per routed-expert parameter (views of its expert slices, owner moe) */
    char tmpn[160];
    int n_ent = 0;
    for (int i = 0; i < n_params; i++)
        n_ent += expert_hf_name(params[i].name, 0, tmpn, sizeof tmpn) ? mc->moe_experts
                 : is_expert_bias(params[i].name) && !is_deepseek(mc) ? 0 : 1;
    hp_tensor_t *full = hp_calloc((size_t)n_params + 1, sizeof *full), *ent_t = hp_calloc((size_t)n_ent + 1, sizeof *ent_t);
    void **owned = hp_calloc((size_t)n_params + 1, sizeof *owned);
    float **perm = hp_calloc((size_t)n_params + 1, sizeof *perm);
    char (*names)[160] = hp_calloc((size_t)n_ent + 1, sizeof *names);
    int *file_of = hp_calloc((size_t)n_ent + 1, sizeof *file_of);
    if (!full || !ent_t || !owned || !perm || !names || !file_of) s = HP_ERR_OOM;
    size_t esz = hp_dtype_size(dtype), cur = 0, total = 0;
    int nfiles = 1, k_ent = 0;
    for (int i = 0; s == HP_OK && i < n_params; i++) {
        int pm = 0;
        if (is_expert_bias(params[i].name) && !is_deepseek(mc)) continue;   /* no HF tensor */
        const int expert = expert_hf_name(params[i].name, 0, tmpn, sizeof tmpn);
        if (!expert) s = hp_hf_name_to_hf(mc, params[i].name, names[k_ent], sizeof names[k_ent], &pm);
        if (s == HP_OK) s = full_of(&params[i], &full[i], &owned[i]);
        if (s == HP_OK && expert) {   /* E contiguous (A, B) slices of the (E, A, B) tensor */
            if (full[i].ndim != 3 || full[i].shape[0] != mc->moe_experts || !hp_tensor_is_contiguous(&full[i])) {
                s = hp_error(HP_ERR_INVALID_ARG, "HF export: '%s' is not a contiguous (%d, ., .) expert tensor",
                             params[i].name, mc->moe_experts);
                break;
            }
            const int64_t A = full[i].shape[1], Bc = full[i].shape[2];
            for (int e = 0; e < mc->moe_experts; e++, k_ent++) {
                expert_hf_name(params[i].name, e, names[k_ent], sizeof names[k_ent]);
                hp_tensor_t *v = &ent_t[k_ent];
                *v = full[i];
                v->ndim = 2;
                v->shape[0] = A;
                v->shape[1] = Bc;
                v->stride[0] = Bc;
                v->stride[1] = 1;
                v->data = (float *)full[i].data + (size_t)e * (size_t)(A * Bc);
                size_t nb = (size_t)(A * Bc) * esz;
                if (cur > 0 && cur + nb > max_shard_bytes) {
                    nfiles++;
                    cur = 0;
                }
                cur += nb;
                total += nb;
                file_of[k_ent] = nfiles;
            }
            continue;
        }
        if (s == HP_OK && pm) {
            int64_t rows = full[i].shape[0], cols = full[i].ndim > 1 ? full[i].shape[1] : 1;
            if (full[i].ndim != 2 || rows % mc->head_dim || !hp_tensor_is_contiguous(&full[i])) {
                s = hp_error(HP_ERR_INVALID_ARG, "HF export: '%s' is not a contiguous (heads*%d, dim) weight",
                             params[i].name, mc->head_dim);
                break;
            }
            perm[i] = hp_malloc(sizeof(float) * (size_t)(rows * cols));
            if (!perm[i]) {
                s = HP_ERR_OOM;
                break;
            }
            permute_rows(perm[i], full[i].data, rows, cols, mc->head_dim, 1);
            full[i].data = perm[i];
        }
        if (s != HP_OK) break;
        ent_t[k_ent] = full[i];
        size_t nb = (size_t)hp_tensor_numel(&full[i]) * esz;
        if (cur > 0 && cur + nb > max_shard_bytes) {
            nfiles++;
            cur = 0;
        }
        cur += nb;
        total += nb;
        file_of[k_ent++] = nfiles;
    }
    if (s == HP_OK && rank == 0) {
        json_object *wm = json_object_new_object();
        hp_st_entry_t *ents = hp_calloc((size_t)n_ent + 1, sizeof *ents);
        if (!ents) s = HP_ERR_OOM;
        for (int f = 1; s == HP_OK && f <= nfiles; f++) {
            char fn[64], path[4200];
            snprintf(fn, sizeof fn, "model-%05d-of-%05d.safetensors", f, nfiles);
            snprintf(path, sizeof path, "%s/%s", dir, fn);
            int k = 0;
            for (int i = 0; i < n_ent; i++)
                if (file_of[i] == f) {
                    ents[k++] = (hp_st_entry_t){names[i], &ent_t[i], hp_st_dtype_from_hp(dtype), NULL, 0, NULL};
                    json_object_object_add(wm, names[i], json_object_new_string(fn));
                }
            const char *meta[2] = {"format", "pt"};
            s = hp_safetensors_write(path, ents, k, meta, 1);
        }
        free(ents);
        if (s == HP_OK) {
            json_object *idx = json_object_new_object(), *md = json_object_new_object();
            json_object_object_add(md, "total_size", json_object_new_int64((int64_t)total));
            json_object_object_add(idx, "metadata", md);
            json_object_object_add(idx, "weight_map", wm);
            char path[4200];
            snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
            s = hp_dcp_write_json(path, idx);
            json_object_put(idx);
            if (s == HP_OK) s = hp_hf_write_config(dir, mc, dtype);
            if (s == HP_OK) s = hp_file_fsync(dir);
        } else {
            json_object_put(wm);
        }
    }
    for (int i = 0; full && i < n_params; i++) {
        free(owned[i]);
        free(perm[i]);
    }
    free(full);
    free(ent_t);
    free(owned);
    free(perm);
    free(names);
    free(file_of);
    return hp_dcp_agree(comm, s, "HF export");
}

/* ---- import ------------------------------------------------------------------------------- */

static int is_extra(const char *tn, char (*want)[160], int nw, int tied) {
    if (tied && !strcmp(tn, "model.embed_tokens.weight")) return 0;
    for (int i = 0; i < nw; i++)
        if (!strcmp(tn, want[i])) return 0;
    return 1;
}

/* Warns about each tensor of the checkpoint that no parameter maps to (it is ignored):
 * the names of the index's weight_map, or of the single file's tensors. */
static void warn_extra_tensors(const char *dir, const hp_model_config_t *mc, hp_param_t *params, int n_params,
                               hp_hf_index_t wm, hp_safetensors_t single) {
    char tmp[160];
    size_t cap = 1;
    for (int i = 0; i < n_params; i++)
        cap += expert_hf_name(params[i].name, 0, tmp, sizeof tmp) ? (size_t)mc->moe_experts : 1;
    char (*want)[160] = hp_calloc(cap, sizeof *want);
    if (!want) return;
    int nw = 0;
    for (int i = 0; i < n_params; i++) {
        int pm;
        if (expert_hf_name(params[i].name, 0, tmp, sizeof tmp)) {   /* one HF tensor per expert (owner moe) */
            for (int e = 0; e < mc->moe_experts; e++) expert_hf_name(params[i].name, e, want[nw++], sizeof want[0]);
            continue;
        }
        if (hp_hf_name_to_hf(mc, params[i].name, want[nw], sizeof want[nw], &pm) == HP_OK) nw++;
    }
    int tied = 1;   /* tied embeddings: lm_head.weight is read from model.embed_tokens.weight */
    for (int i = 0; i < nw; i++) tied &= strcmp(want[i], "lm_head.weight") != 0;
    int extra = 0;
    if (wm) {
        for (int k = 0; k < hp_hf_index_count(wm); k++) {
            const char *key = NULL, *file = NULL;
            hp_hf_index_at(wm, k, &key, &file);
            if (is_extra(key, want, nw, tied) && extra++ < 20)
                hp_log(HP_LOG_WARN, "HF checkpoint %s: tensor '%s' is not a parameter of the %s model; ignored", dir,
                       key, mc->name);
        }
    } else if (single) {
        for (int k = 0; k < hp_safetensors_count(single); k++) {
            const char *tn = hp_safetensors_info(single, k)->name;
            if (is_extra(tn, want, nw, tied) && extra++ < 20)
                hp_log(HP_LOG_WARN, "HF checkpoint %s: tensor '%s' is not a parameter of the %s model; ignored", dir,
                       tn, mc->name);
        }
    }
    if (extra > 20)
        hp_log(HP_LOG_WARN, "HF checkpoint %s: %d more tensors the %s model does not have; ignored", dir, extra - 20,
               mc->name);
    free(want);
}

/* DIR/config.json, when present, must describe the model exactly (hp_hf_read_config, then
 * every field that changes the numerics): shapes alone would let extra layers or an untied
 * lm_head be dropped, and rope_theta, rope_scaling or eps would import silently wrong. */
static hp_status_t check_hf_config(const char *dir, const hp_model_config_t *mc) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (access(path, R_OK) != 0) return HP_OK;
    hp_model_config_t hf;
    HP_TRY(hp_hf_read_config(dir, &hf));
    char msg[1500], flags[700];
    int n = hp_hf_config_diff(&hf, mc, msg, sizeof msg, flags, sizeof flags);
    if (n)
        return hp_error(HP_ERR_INVALID_ARG, "HF checkpoint %s: config.json disagrees with the %s/%s model in %d field(s): "
                        "%s; hint: describe the checkpoint's model with those model.* keys (hp-ckpt from-hf: %s), or "
                        "take the model from config.json (hp-ckpt from-hf without --flavor; hp-train with "
                        "model.flavor = hf)", dir, mc->name, mc->flavor, n, msg, flags);
    return HP_OK;
}

/* The HF row of TorchTitan q/k row r (permute_rows: TT row h*hd + 2i + p = HF row h*hd + p*hd/2 + i). */
static int64_t hf_row(int64_t r, int hd) {
    int64_t h = r / hd, w = r % hd;
    return h * hd + (w % 2) * (hd / 2) + w / 2;
}

static hp_hf_import_counts_t hf_counts_;   /* process-wide, as hp_comm_counts */

void hp_hf_import_counts_get(hp_hf_import_counts_t *out) { *out = hf_counts_; }
void hp_hf_import_counts_reset(void) { memset(&hf_counts_, 0, sizeof hf_counts_); }

/* Index k of file fname among the open safetensors files (opened when not; the oldest of 32
 * closed to make room). */
static hp_status_t open_file(const char *dir, const char *fname, hp_safetensors_t *open_st, char (*open_name)[256],
                             int *n_open, int *kout) {
    int k = 0;
    for (; k < *n_open; k++)
        if (!strcmp(open_name[k], fname)) break;
    if (k == *n_open) {
        if (*n_open == 32) {
            hp_safetensors_close(open_st[0]);
            memmove(open_st, open_st + 1, sizeof open_st[0] * 31);
            memmove(open_name, open_name + 1, sizeof open_name[0] * 31);
            (*n_open)--;
            k = *n_open;
        }
        char fp[4400];
        snprintf(fp, sizeof fp, "%s/%s", dir, fname);
        HP_TRY(hp_safetensors_open(fp, &open_st[k]));
        snprintf(open_name[k], sizeof open_name[k], "%s", fname);
        (*n_open)++;
    }
    *kout = k;
    return HP_OK;
}

static hp_status_t stored_dtype(const char *dir, const char *file, const char *hf, const hp_st_info_t *info,
                                hp_dtype_t *sdt) {
    if (info->dtype == HP_ST_F32) *sdt = HP_F32;
    else if (info->dtype == HP_ST_BF16) *sdt = HP_BF16;
    else if (info->dtype == HP_ST_F16) *sdt = HP_F16;
    else
        return hp_error(HP_ERR_UNSUPPORTED, "HF checkpoint %s: %s: tensor '%s' is %s; expected F32, BF16 or F16 "
                        "weights", dir, file, hf, hp_st_dtype_name(info->dtype));
    return HP_OK;
}

/* --- mixture of experts (owner moe): a routed-expert parameter (E, A, B) from HF's E tensors
 * (A, B): only this rank's boxes (its experts, and under Shard(1) / TP its rows / columns),
 * each expert's rows read as column segments. */
static hp_status_t import_experts(const char *dir, const hp_model_config_t *mc, hp_param_t *p, hp_hf_index_t wm,
                                  hp_safetensors_t *open_st, char (*open_name)[256], int *n_open, float **buf,
                                  size_t *buf_cap) {
    hp_dtensor_t *v = &p->value;
    const int64_t *gs = v->mesh ? v->global_shape : v->local.shape;
    if (v->local.ndim != 3 || gs[0] != mc->moe_experts)
        return hp_error(HP_ERR_INVALID_ARG, "HF import: '%s' is not a (%d, ., .) expert tensor", p->name, mc->moe_experts);
    hp_dcp_box_t *boxes = NULL;
    int nbox = 0;
    hp_status_t s = hp_dcp_local_boxes(v, &boxes, &nbox);
    for (int b = 0; s == HP_OK && b < nbox; b++) {
        const int64_t r0 = boxes[b].g[1], nr = boxes[b].s[1], c0 = boxes[b].g[2], nc = boxes[b].s[2];
        for (int64_t e = boxes[b].g[0]; s == HP_OK && e < boxes[b].g[0] + boxes[b].s[0]; e++) {
            char hf[160];
            expert_hf_name(p->name, (int)e, hf, sizeof hf);
            const char *fname = "model.safetensors";
            if (wm && !(fname = hp_hf_index_find(wm, hf))) {
                s = hp_error(HP_ERR_NOT_FOUND, "HF checkpoint %s lacks '%s' (expert %lld of the %s model's '%s')", dir,
                             hf, (long long)e, mc->name, p->name);
                break;
            }
            int k = 0;
            const hp_st_info_t *info;
            s = open_file(dir, fname, open_st, open_name, n_open, &k);
            if (s == HP_OK && hp_safetensors_find(open_st[k], hf, &info) != HP_OK)
                s = hp_error(HP_ERR_NOT_FOUND, "HF checkpoint %s: %s lacks '%s' (expert %lld of '%s')", dir, fname, hf,
                             (long long)e, p->name);
            if (s != HP_OK) break;
            if (info->ndim != 2 || info->shape[0] != gs[1] || info->shape[1] != gs[2]) {
                s = hp_error(HP_ERR_INVALID_ARG, "HF checkpoint %s: '%s' has shape (%lld, %lld), but expert %lld of the "
                             "%s/%s model's '%s' is (%lld, %lld); hint: a different model: describe it with the "
                             "model.moe_* keys, or take it from the checkpoint's config.json", dir, hf,
                             info->ndim > 0 ? (long long)info->shape[0] : 0LL,
                             info->ndim > 1 ? (long long)info->shape[1] : 0LL, (long long)e, mc->name, mc->flavor,
                             p->name, (long long)gs[1], (long long)gs[2]);
                break;
            }
            hp_dtype_t sdt = HP_F32;
            s = stored_dtype(dir, fname, hf, info, &sdt);
            if (s != HP_OK) break;
            const int64_t esz = (int64_t)hp_dtype_size(sdt);
            hf_counts_.bytes_total += (uint64_t)(gs[1] * gs[2] * esz);
            if ((size_t)(nr * nc * esz) > *buf_cap * sizeof(float)) {
                free(*buf);
                *buf_cap = (size_t)(nr * nc * esz + 3) / sizeof(float);
                *buf = hp_malloc(sizeof(float) * *buf_cap);
                if (!*buf) {
                    s = HP_ERR_OOM;
                    break;
                }
            }
            unsigned char *dst = (unsigned char *)*buf;
            if (nc == gs[2]) {   // whole rows: one read
                s = hp_safetensors_read_bytes(open_st[k], hf, (uint64_t)(r0 * gs[2] * esz), dst, (size_t)(nr * nc * esz));
            } else {
                for (int64_t r = 0; s == HP_OK && r < nr; r++)
                    s = hp_safetensors_read_bytes(open_st[k], hf, (uint64_t)(((r0 + r) * gs[2] + c0) * esz),
                                                  dst + r * nc * esz, (size_t)(nc * esz));
            }
            hf_counts_.bytes_read += (uint64_t)(nr * nc * esz);
            if (s != HP_OK) break;
            int64_t first, bad = hp_hf_count_nonfinite_raw(*buf, nr * nc, sdt, &first);
            if (bad) {
                s = hp_error(HP_ERR_FORMAT, "HF checkpoint %s: %s: tensor '%s' has %lld non-finite value(s) (NaN or "
                             "inf); expected finite weights (re-download or re-export the checkpoint)", dir, fname, hf,
                             (long long)bad);
                break;
            }
            int64_t csz[HP_MAX_DIMS] = {1, nr, nc}, off[HP_MAX_DIMS] = {0, 0, 0}, len[HP_MAX_DIMS] = {1, nr, nc};
            int64_t loff[HP_MAX_DIMS] = {boxes[b].l[0] + (e - boxes[b].g[0]), boxes[b].l[1], boxes[b].l[2]};
            hp_dcp_copy_box(&v->local, loff, *buf, sdt, csz, off, len, 3);
        }
    }
    free(boxes);
    return s;
}
/* --- end --- */

static hp_status_t import_local(const char *dir, const hp_model_config_t *mc, hp_param_t *params, int n_params,
                                int warn) {
    HP_TRY(check_hf_config(dir, mc));
    char path[4200];
    hp_hf_index_t wm = NULL;   /* hardened parser: every type checked, plain file names */
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, R_OK) == 0) HP_TRY(hp_hf_index_read(path, &wm));
    hp_safetensors_t open_st[32] = {0};
    char open_name[32][256];
    int n_open = 0;
    hp_status_t s = HP_OK;
    char missing[512] = "";
    int nmiss = 0;
    float *buf = NULL;
    size_t buf_cap = 0;
    for (int i = 0; s == HP_OK && i < n_params; i++) {
        char hf[160];
        int pm;
        if (expert_hf_name(params[i].name, 0, hf, sizeof hf)) {   /* mixture of experts (owner moe) */
            s = import_experts(dir, mc, &params[i], wm, open_st, open_name, &n_open, &buf, &buf_cap);
            continue;
        }
        if (is_expert_bias(params[i].name) && !is_deepseek(mc)) continue;   /* Qwen3-MoE: no HF tensor, kept */
        s = hp_hf_name_to_hf(mc, params[i].name, hf, sizeof hf, &pm);
        if (s != HP_OK) break;
        const char *fname = "model.safetensors";
        if (wm) {
            const char *v = hp_hf_index_find(wm, hf);
            if (!v && !strcmp(hf, "lm_head.weight") && (v = hp_hf_index_find(wm, "model.embed_tokens.weight")))
                snprintf(hf, sizeof hf, "model.embed_tokens.weight");   /* tied embeddings */
            if (!v) {
                if (nmiss < 6) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s'%s'", nmiss ? ", " : "", hf);
                nmiss++;
                continue;
            }
            fname = v;
        }
        int k = 0;
        s = open_file(dir, fname, open_st, open_name, &n_open, &k);
        if (s != HP_OK) break;
        const hp_st_info_t *info;
        if (hp_safetensors_find(open_st[k], hf, &info) != HP_OK) {
            if (!strcmp(hf, "lm_head.weight") && hp_safetensors_find(open_st[k], "model.embed_tokens.weight", &info) == HP_OK) {
                snprintf(hf, sizeof hf, "model.embed_tokens.weight");
            } else {
                if (nmiss < 6) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s'%s'", nmiss ? ", " : "", hf);
                nmiss++;
                continue;
            }
        }
        hp_dtensor_t *v = &params[i].value;
        const int64_t *gs = v->mesh ? v->global_shape : v->local.shape;
        int nd = v->local.ndim, same = info->ndim == nd;
        for (int d = 0; same && d < nd; d++) same = info->shape[d] == gs[d];
        if (!same) {
            char hs[160], ms[160];
            size_t l = 0;
            for (int d = 0; d < info->ndim && l < sizeof hs; d++)
                l += (size_t)snprintf(hs + l, sizeof hs - l, "%s%lld", d ? ", " : "", (long long)info->shape[d]);
            if (!info->ndim) hs[0] = 0;
            l = 0;
            for (int d = 0; d < nd && l < sizeof ms; d++)
                l += (size_t)snprintf(ms + l, sizeof ms - l, "%s%lld", d ? ", " : "", (long long)gs[d]);
            if (!nd) ms[0] = 0;
            s = hp_error(HP_ERR_INVALID_ARG, "HF checkpoint %s: '%s' has shape (%s), but the %s/%s model's '%s' has shape "
                         "(%s); hint: a different model: describe it with the model.* keys, or take it from the "
                         "checkpoint's config.json", dir, hf, hs, mc->name, mc->flavor, params[i].name, ms);
            break;
        }
        /* only this rank's boxes (PyTorch DCP's HuggingFaceStorageReader): each box's rows (q/k
         * rows mapped through the permutation) and columns, in the stored dtype, then cast into
         * the local tensor */
        hp_dtype_t sdt = HP_F32;
        s = stored_dtype(dir, open_name[k], hf, info, &sdt);
        if (s != HP_OK) break;
        const int64_t cols = nd > 1 ? gs[1] : 1, esz = (int64_t)hp_dtype_size(sdt);
        int64_t numel = 1;
        for (int d = 0; d < nd; d++) numel *= gs[d];
        hf_counts_.bytes_total += (uint64_t)(numel * esz);
        hp_dcp_box_t *boxes = NULL;
        int nbox = 0;
        s = hp_dcp_local_boxes(v, &boxes, &nbox);   /* this rank's piece, any layout */
        for (int b = 0; s == HP_OK && b < nbox; b++) {
            /* a box of whole rows is read by runs of rows; a column box (Shard(1)) by one read of
             * its column segment per row, so no rank reads or holds more than its box */
            const int64_t r0 = boxes[b].g[0], nr = boxes[b].s[0];
            const int64_t c0 = nd > 1 ? boxes[b].g[1] : 0, nc = nd > 1 ? boxes[b].s[1] : 1;
            const int whole = nc == cols;
            if ((size_t)(nr * nc * esz) > buf_cap * sizeof(float)) {
                free(buf);
                buf_cap = (size_t)(nr * nc * esz + 3) / sizeof(float);
                buf = hp_malloc(sizeof(float) * buf_cap);
                if (!buf) {
                    s = HP_ERR_OOM;
                    break;
                }
            }
            unsigned char *dst = (unsigned char *)buf;
            for (int64_t r = 0; s == HP_OK && r < nr;) {
                int64_t hr = pm ? hf_row(r0 + r, mc->head_dim) : r0 + r, run = 1;
                while (whole && r + run < nr && (pm ? hf_row(r0 + r + run, mc->head_dim) : r0 + r + run) == hr + run)
                    run++;
                s = hp_safetensors_read_bytes(open_st[k], hf, (uint64_t)((hr * cols + c0) * esz),
                                              dst + r * nc * esz, (size_t)(run * nc * esz));
                hf_counts_.bytes_read += (uint64_t)(run * nc * esz);
                r += run;
            }
            if (s != HP_OK) break;
            int64_t first, bad = hp_hf_count_nonfinite_raw(buf, nr * nc, sdt, &first);
            if (bad) {   /* damaged weights would convert and generate garbage with exit 0 */
                s = hp_error(HP_ERR_FORMAT, "HF checkpoint %s: %s: tensor '%s' has %lld non-finite value(s) (NaN or "
                             "inf) in rows %lld..%lld, the first at row %lld; expected finite weights (re-download "
                             "or re-export the checkpoint)", dir, open_name[k], hf, (long long)bad, (long long)r0,
                             (long long)(r0 + nr - 1), (long long)(r0 + first / nc));
                break;
            }
            int64_t csz[HP_MAX_DIMS] = {nr, nc}, off[HP_MAX_DIMS] = {0, 0};
            hp_dcp_copy_box(&v->local, boxes[b].l, buf, sdt, csz, off, boxes[b].s, nd);
        }
        free(boxes);
    }
    if (s == HP_OK && nmiss)
        s = hp_error(HP_ERR_NOT_FOUND, "HF checkpoint %s lacks %d tensor(s) the %s model needs: %s%s", dir, nmiss, mc->name,
                     missing, nmiss > 6 ? ", ..." : "");
    if (s == HP_OK && warn) warn_extra_tensors(dir, mc, params, n_params, wm, wm ? NULL : open_st[0]);
    for (int k = 0; k < n_open; k++) hp_safetensors_close(open_st[k]);
    free(buf);
    hp_hf_index_free(wm);
    return s;
}

hp_status_t hp_hf_import(const char *dir, const hp_model_config_t *mc, hp_param_t *params, int n_params, hp_comm_t comm) {
    int warn = !comm || hp_comm_rank(comm) == 0;   /* one warning per job, not per rank */
    HP_TRY(refuse_moe(mc, "import"));   /* mixture of experts (owner moe); the same on every rank */
    return hp_dcp_agree(comm, import_local(dir, mc, params, n_params, warn), "HF import");
}
