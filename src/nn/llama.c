/* Llama-family ModelSpecs (llama3, qwen3 dense): flavors with TorchTitan's shapes, config
 * validation, parameter counts and FLOPs/token, and the builders that declare each unit's
 * parameters (names, shapes, TorchTitan init rules, stacking) and assemble its module tree:
 * embedding -> blocks (attention_norm, attention [wq|wk|wv, qk-norm, RoPE, core, wo],
 * ffn_norm, feed_forward [w1|w3, SwiGLU, w2]) -> head (norm, output). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "nn/nn-model.h"

/* ---- flavors ----------------------------------------------------------------------------- */

static int llama_hidden(int dim, int multiple_of, float mult) {
    // TorchTitan: hidden = 4*dim; int(2*hidden/3); int(mult*hidden); round up to multiple_of
    int hidden = 4 * dim;
    hidden = (int)(2 * hidden / 3);
    if (mult > 0.0f) hidden = (int)(mult * (float)hidden);
    return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

static void set_llama3(hp_model_config_t *c, const char *flavor, int dim, int layers, int heads,
                       int kv, int multiple_of, float mult, int vocab) {
    memset(c, 0, sizeof(*c));
    snprintf(c->name, sizeof(c->name), "llama3");
    snprintf(c->flavor, sizeof(c->flavor), "%s", flavor);
    c->dim = dim;
    c->n_layers = layers;
    c->n_heads = heads;
    c->n_kv_heads = kv;
    c->vocab_size = vocab;
    c->multiple_of = multiple_of;
    c->ffn_dim_multiplier = mult;
    c->norm_eps = 1e-5f;
    c->rope_theta = 500000.0f;
    c->rope_scaling = 1;   // TorchTitan RoPE scaling="llama": factor 8, low 1, high 4, orig 8192
    c->rope_factor = 8.0f;
    c->rope_low_freq_factor = 1.0f;
    c->rope_high_freq_factor = 4.0f;
    c->rope_original_max_pos = 8192;
    c->max_seq_len = 131072;
}

static void set_qwen3(hp_model_config_t *c, const char *flavor, int dim, int layers, int heads,
                      int kv, int head_dim, int hidden, int vocab) {
    memset(c, 0, sizeof(*c));
    snprintf(c->name, sizeof(c->name), "qwen3");
    snprintf(c->flavor, sizeof(c->flavor), "%s", flavor);
    c->dim = dim;
    c->n_layers = layers;
    c->n_heads = heads;
    c->n_kv_heads = kv;
    c->head_dim = head_dim;
    c->hidden_dim = hidden;
    c->vocab_size = vocab;
    c->norm_eps = 1e-6f;
    c->rope_theta = 1000000.0f;
    c->qk_norm = 1;
    c->tie_embeddings = 1;
    c->max_seq_len = 4096;
}

/* --- mixture of experts (owner moe; docs/moe.md) ---
 * deepseek_v3: DeepSeek-V3 as TorchTitan's deepseek_v3: MLA attention (src/nn/mla.c) with
 * YaRN RoPE, and DeepSeek's MoE (sigmoid router, node-limited groups, route_scale, one shared
 * expert, dense first layers).
 * qwen3_moe: Qwen3-MoE (softmax router with route_norm, no shared experts, qk-norm GQA). */
static void set_moe(hp_model_config_t *c, int E, int K, int F, int shared, int score_fn, int norm, float scale,
                    int groups, int limited, int dense) {
    c->moe_experts = E;
    c->moe_top_k = K;
    c->moe_hidden = F;
    c->moe_shared_experts = shared;
    c->moe_score_fn = score_fn;
    c->moe_route_norm = norm;
    c->moe_route_scale = scale;
    c->moe_expert_groups = groups;
    c->moe_limited_groups = limited;
    c->moe_n_dense_layers = dense;
    c->moe_load_balance_coeff = 1e-3f;   // TorchTitan's default
}

/* MLA sizes and YaRN (TorchTitan deepseek_v3 DeepSeekV3ModelArgs). */
static void set_mla(hp_model_config_t *c, int q_lora, int kv_lora, int nope, int rope, int v, float mscale) {
    c->mla = 1;
    c->q_lora_rank = q_lora;
    c->kv_lora_rank = kv_lora;
    c->qk_nope_head_dim = nope;
    c->qk_rope_head_dim = rope;
    c->v_head_dim = v;
    c->mla_mscale = mscale;
    c->rope_theta = 10000.0f;
    c->rope_factor = 40.0f;
    c->rope_beta_fast = 32.0f;
    c->rope_beta_slow = 1.0f;
    c->rope_original_max_pos = 4096;
    c->max_seq_len = 16384;
    c->head_dim = 0;   // derived: the core's head width
}

static hp_status_t moe_flavor(const char *model_name, const char *flavor, hp_model_config_t *cfg, int *found) {
    *found = 1;
    if (strcmp(model_name, "deepseek_v3") == 0) {
        if (strcmp(flavor, "debugmodel") == 0) {   // TorchTitan's deepseek_v3 debugmodel sizes
            set_llama3(cfg, flavor, 256, 6, 16, 16, 256, 0.0f, 2048);
            cfg->hidden_dim = 1024;
            set_moe(cfg, 8, 3, 256, 2, HP_MOE_SCORE_SOFTMAX, 0, 1.0f, 0, 0, 1);
            set_mla(cfg, 0, 512, 128, 64, 128, 0.70f);
        } else if (strcmp(flavor, "671B") == 0) {
            set_llama3(cfg, flavor, 7168, 61, 128, 128, 256, 0.0f, 129280);
            cfg->hidden_dim = 18432;
            set_moe(cfg, 256, 8, 2048, 1, HP_MOE_SCORE_SIGMOID, 1, 2.5f, 8, 4, 3);
            set_mla(cfg, 1536, 512, 128, 64, 128, 1.0f);
        } else {
            return hp_error(HP_ERR_INVALID_ARG, "model 'deepseek_v3': unknown flavor '%s'; valid flavors: "
                            "debugmodel, 671B", flavor);
        }
        snprintf(cfg->name, sizeof(cfg->name), "deepseek_v3");
        cfg->rope_scaling = 0;   // YaRN (set_mla), not Llama 3.1's
        return HP_OK;
    }
    if (strcmp(model_name, "qwen3_moe") == 0) {
        if (strcmp(flavor, "debugmodel") == 0) {
            set_qwen3(cfg, flavor, 256, 4, 16, 8, 32, 768, 2048);
            set_moe(cfg, 8, 2, 256, 0, HP_MOE_SCORE_SOFTMAX, 1, 1.0f, 0, 0, 1);
        } else if (strcmp(flavor, "30B-A3B") == 0) {   // Qwen3-30B-A3B: every layer MoE
            set_qwen3(cfg, flavor, 2048, 48, 32, 4, 128, 6144, 151936);
            set_moe(cfg, 128, 8, 768, 0, HP_MOE_SCORE_SOFTMAX, 1, 1.0f, 0, 0, 0);
        } else {
            return hp_error(HP_ERR_INVALID_ARG, "model 'qwen3_moe': unknown flavor '%s'; valid flavors: "
                            "debugmodel, 30B-A3B", flavor);
        }
        snprintf(cfg->name, sizeof(cfg->name), "qwen3_moe");
        cfg->tie_embeddings = 0;
        return HP_OK;
    }
    *found = 0;
    return HP_OK;
}

int hp_model_layer_is_moe(const hp_model_config_t *c, int layer) {
    return c->moe_experts > 0 && layer >= c->moe_n_dense_layers;
}

void hp_model_moe_config(const hp_model_config_t *c, hp_moe_config_t *o) {
    memset(o, 0, sizeof(*o));
    o->dim = c->dim;
    o->hidden = c->moe_hidden;
    o->n_experts = c->moe_experts;
    o->top_k = c->moe_top_k;
    o->score_fn = c->moe_score_fn;
    o->route_norm = c->moe_route_norm;
    o->route_scale = c->moe_route_scale;
    o->score_before_experts = c->moe_score_before_experts;
    o->n_shared_experts = c->moe_shared_experts;
    o->shared_hidden = c->moe_hidden;
    o->n_expert_groups = c->moe_expert_groups;
    o->n_limited_groups = c->moe_limited_groups;
    o->aux_loss_coeff = c->moe_aux_loss_coeff;
}
/* --- end --- */

hp_status_t hp_model_flavor(const char *model_name, const char *flavor, hp_model_config_t *cfg) {
    if (!model_name || !flavor || !cfg)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_flavor: model name, flavor and cfg must be non-NULL");
    int moe_found = 0;
    HP_TRY(moe_flavor(model_name, flavor, cfg, &moe_found));
    if (moe_found) {
    } else if (strcmp(model_name, "llama3") == 0) {
        if (strcmp(flavor, "debugmodel") == 0)
            set_llama3(cfg, flavor, 256, 6, 16, 16, 256, 0.0f, 2048);
        else if (strcmp(flavor, "1B") == 0) {
            // Llama 3.2 1B shape (untied here as TorchTitan's llama3 model; rope factor 32)
            set_llama3(cfg, flavor, 2048, 16, 32, 8, 256, 1.5f, 128256);
            cfg->rope_factor = 32.0f;
        } else if (strcmp(flavor, "8B") == 0)
            set_llama3(cfg, flavor, 4096, 32, 32, 8, 1024, 1.3f, 128256);
        else if (strcmp(flavor, "70B") == 0)
            set_llama3(cfg, flavor, 8192, 80, 64, 8, 4096, 1.3f, 128256);
        else if (strcmp(flavor, "405B") == 0)
            set_llama3(cfg, flavor, 16384, 126, 128, 8, 4096, 1.2f, 128256);
        else
            return hp_error(HP_ERR_INVALID_ARG, "model 'llama3': unknown flavor '%s'; valid flavors: "
                            "debugmodel, 1B, 8B, 70B, 405B", flavor);
    } else if (strcmp(model_name, "qwen3") == 0) {
        if (strcmp(flavor, "debugmodel") == 0)
            set_qwen3(cfg, flavor, 256, 8, 16, 8, 128, 3072, 2048);
        else if (strcmp(flavor, "0.6B") == 0)
            set_qwen3(cfg, flavor, 1024, 28, 16, 8, 128, 3072, 151936);
        else
            return hp_error(HP_ERR_INVALID_ARG, "model 'qwen3': unknown flavor '%s'; valid flavors: "
                            "debugmodel, 0.6B", flavor);
    } else {
        return hp_error(HP_ERR_INVALID_ARG, "unknown model '%s'; valid models: llama3 (debugmodel, 1B, "
                        "8B, 70B, 405B), qwen3 (debugmodel, 0.6B), deepseek_v3 (debugmodel, 671B), qwen3_moe (debugmodel, "
                        "30B-A3B)", model_name);
    }
    return hp_model_config_validate(cfg);
}

int hp_model_mla_yarn(const hp_model_config_t *c) {
    return c->mla && c->max_seq_len > c->rope_original_max_pos;   // TorchTitan: seqlen > original_seq_len
}

double hp_model_mla_softmax_scale(const hp_model_config_t *c) {
    double s = 1.0 / sqrt((double)(c->qk_nope_head_dim + c->qk_rope_head_dim));
    if (hp_model_mla_yarn(c)) {
        const double ms = 0.1 * c->mla_mscale * log((double)c->rope_factor) + 1.0;
        s *= ms * ms;
    }
    return s;
}

/* MLA: the sizes, and the derived n_kv_heads (= n_heads) and head_dim (the core's width). */
static hp_status_t mla_validate(hp_model_config_t *c) {
#define MLA_BAD(field, cond, want)                                                                           \
    if (cond)                                                                                                \
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s' (MLA): " #field " = %d, expected " want, \
                        c->name, c->flavor, (int)c->field);
    MLA_BAD(q_lora_rank, c->q_lora_rank < 0 || c->q_lora_rank > HP_MODEL_MAX_DIM, "0 (a full wq) .. 2^20")
    MLA_BAD(kv_lora_rank, c->kv_lora_rank <= 0 || c->kv_lora_rank > HP_MODEL_MAX_DIM, "1 .. 2^20")
    MLA_BAD(qk_nope_head_dim, c->qk_nope_head_dim < 0 || c->qk_nope_head_dim > 512, "0 .. 512")
    MLA_BAD(qk_rope_head_dim, c->qk_rope_head_dim <= 0 || c->qk_rope_head_dim % 2 || c->qk_rope_head_dim > 512,
            "an even 2 .. 512 (RoPE rotates pairs)")
    MLA_BAD(v_head_dim, c->v_head_dim <= 0 || c->v_head_dim > 512, "1 .. 512")
#undef MLA_BAD
    if (c->qk_norm || c->rope_scaling)
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': qk_norm %d / rope_scaling %d do not apply to MLA "
                        "attention (its norms are q_norm over q_lora_rank and kv_norm over kv_lora_rank, its RoPE "
                        "scaling YaRN); hint: leave model.qk_norm and model.rope_scaling at the flavor's",
                        c->name, c->flavor, c->qk_norm, c->rope_scaling);
    if (c->max_seq_len > c->rope_original_max_pos &&
        (!(c->rope_factor > 0.0f) || !(c->rope_beta_fast > c->rope_beta_slow) || !(c->rope_beta_slow > 0.0f) ||
         c->rope_original_max_pos <= 0))
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s' (MLA YaRN): rope_factor %g, beta_fast %g, beta_slow "
                        "%g, rope_original_max_pos %d; expected factor > 0, beta_fast > beta_slow > 0, original > 0",
                        c->name, c->flavor, c->rope_factor, c->rope_beta_fast, c->rope_beta_slow,
                        c->rope_original_max_pos);
    const int qk = c->qk_nope_head_dim + c->qk_rope_head_dim, hc = qk > c->v_head_dim ? qk : c->v_head_dim;
    c->n_kv_heads = c->n_heads;   // every head has its own k_nope and v; k_pe is shared
    c->head_dim = (hc + 1) & ~1;
    return HP_OK;
}

hp_status_t hp_model_config_validate(hp_model_config_t *c) {
    if (!c) return hp_error(HP_ERR_INVALID_ARG, "hp_model_config_validate: cfg is NULL");
#define HP_CFG_POS(field)                                                                       \
    if (c->field <= 0)                                                                          \
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': " #field " = %d, expected > 0", \
                        c->name, c->flavor, (int)c->field);
    HP_CFG_POS(dim) HP_CFG_POS(n_layers) HP_CFG_POS(n_heads) HP_CFG_POS(vocab_size)
#undef HP_CFG_POS
    if (c->mla) HP_TRY(mla_validate(c));
    if (c->n_kv_heads <= 0) c->n_kv_heads = c->n_heads;
    if (c->n_heads % c->n_kv_heads != 0)
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': n_heads %d is not a multiple of "
                        "n_kv_heads %d", c->name, c->flavor, c->n_heads, c->n_kv_heads);
    if (c->head_dim <= 0) {
        if (c->dim % c->n_heads != 0)
            return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': dim %d is not divisible by "
                            "n_heads %d; hint: set head_dim explicitly", c->name, c->flavor, c->dim, c->n_heads);
        c->head_dim = c->dim / c->n_heads;
    }
    if (c->head_dim % 2 != 0 || c->head_dim > 512)
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': head_dim %d must be even and <= 512 "
                        "(RoPE rotates pairs)", c->name, c->flavor, c->head_dim);
    if (c->hidden_dim <= 0) {
        if (c->multiple_of <= 0)
            return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': hidden_dim unset and multiple_of "
                            "= %d; set one of them", c->name, c->flavor, c->multiple_of);
        c->hidden_dim = llama_hidden(c->dim, c->multiple_of, c->ffn_dim_multiplier);
    }
    if (!(c->norm_eps > 0.0f) || !(c->rope_theta > 0.0f))
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': norm_eps %g and rope_theta %g must "
                        "be > 0", c->name, c->flavor, c->norm_eps, c->rope_theta);
    if (c->rope_scaling && (!(c->rope_factor > 0.0f) || c->rope_original_max_pos <= 0 ||
                            !(c->rope_high_freq_factor > c->rope_low_freq_factor)))
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': rope scaling needs factor > 0, "
                        "original_max_pos > 0 and high_freq_factor > low_freq_factor", c->name, c->flavor);
    if (c->max_seq_len <= 0) c->max_seq_len = 4096;
    if (c->moe_experts > 0) {   /* --- mixture of experts (owner moe) --- */
        hp_moe_config_t mc;
        hp_model_moe_config(c, &mc);
        char what[96];
        snprintf(what, sizeof what, "model config '%s/%s' (moe)", c->name, c->flavor);
        HP_TRY(hp_moe_config_check(&mc, what));
        if (c->moe_n_dense_layers < 0 || c->moe_n_dense_layers > c->n_layers)
            return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': moe_n_dense_layers = %d, expected 0 .. n_layers "
                            "(%d)", c->name, c->flavor, c->moe_n_dense_layers, c->n_layers);
        if (!(c->moe_load_balance_coeff >= 0.0f))
            return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': moe_load_balance_coeff = %g, expected >= 0 (0: "
                            "off)", c->name, c->flavor, c->moe_load_balance_coeff);
    } else if (c->moe_experts < 0) {
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': moe_experts = %d, expected >= 0 (0: dense)",
                        c->name, c->flavor, c->moe_experts);
    }   /* --- end --- */
    /* Upper bounds: a dimension from a file or flag beyond them would overflow a product of
     * dims or ask for an absurd allocation instead of failing with a message. */
#define HP_CFG_MAX(field, lim, why)                                                                          \
    if ((int64_t)c->field > (int64_t)(lim))                                                                  \
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': " #field " = %d exceeds the limit %lld (%s)", \
                        c->name, c->flavor, (int)c->field, (long long)(lim), why);
    HP_CFG_MAX(vocab_size, HP_MODEL_MAX_VOCAB, "HP_MODEL_MAX_VOCAB; token ids are at most 2^24")
    HP_CFG_MAX(max_seq_len, HP_MODEL_MAX_SEQ_LEN, "HP_MODEL_MAX_SEQ_LEN; RoPE tables and activations grow with it")
    HP_CFG_MAX(dim, HP_MODEL_MAX_DIM, "HP_MODEL_MAX_DIM")
    HP_CFG_MAX(hidden_dim, HP_MODEL_MAX_DIM, "HP_MODEL_MAX_DIM")
    HP_CFG_MAX(moe_hidden, HP_MODEL_MAX_DIM, "HP_MODEL_MAX_DIM")
    HP_CFG_MAX(n_layers, HP_MODEL_MAX_LAYERS, "HP_MODEL_MAX_LAYERS")
    HP_CFG_MAX(n_heads, HP_MODEL_MAX_HEADS, "HP_MODEL_MAX_HEADS")
#undef HP_CFG_MAX
    if ((int64_t)c->n_heads * c->head_dim > HP_MODEL_MAX_DIM)
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': n_heads x head_dim = %d x %d exceeds the limit %d "
                        "(HP_MODEL_MAX_DIM)", c->name, c->flavor, c->n_heads, c->head_dim, HP_MODEL_MAX_DIM);
    /* Each factor is bounded above, so the count fits int64; compare before any allocation. */
    int64_t nparams = hp_model_param_count(c, 0);
    if (nparams > HP_MODEL_MAX_PARAMS)
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': %lld parameters (vocab_size %d x dim %d, %d layers "
                        "of dim %d / hidden %d) exceed the limit 2^40 = %lld (HP_MODEL_MAX_PARAMS, 4 TiB of float32); "
                        "hint: check vocab_size and the flavor", c->name, c->flavor, (long long)nparams, c->vocab_size,
                        c->dim, c->n_layers, c->dim, c->hidden_dim, (long long)HP_MODEL_MAX_PARAMS);
    return HP_OK;
}

/* One block's parameters; an MoE block counts its routed experts `experts_counted` of E times
 * (E for the total, top_k for the active count). */
static int64_t block_params(const hp_model_config_t *c, int layer, int64_t experts_counted) {
    int64_t d = c->dim, qd = (int64_t)c->n_heads * c->head_dim, kd = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t attn = d * qd + 2 * d * kd + qd * d + 2 * d + (c->qk_norm ? 2 * (int64_t)c->head_dim : 0);
    if (c->mla) {   // wq or wq_a, q_norm, wq_b; wkv_a, kv_norm, wkv_b, wo; the two block norms
        const int64_t H = c->n_heads, qk = c->qk_nope_head_dim + c->qk_rope_head_dim, ql = c->q_lora_rank,
                      kvl = c->kv_lora_rank;
        attn = (ql ? d * ql + ql + ql * H * qk : d * H * qk) + d * (kvl + c->qk_rope_head_dim) + kvl +
               kvl * H * (c->qk_nope_head_dim + c->v_head_dim) + H * c->v_head_dim * d + 2 * d;
    }
    if (!hp_model_layer_is_moe(c, layer)) return attn + 3 * d * (int64_t)c->hidden_dim;
    const int64_t F = c->moe_hidden;
    return attn + (int64_t)c->moe_experts * d + experts_counted * 3 * d * F + 3 * d * F * c->moe_shared_experts;
}

static int64_t count_params(const hp_model_config_t *c, int exclude_embedding, int active) {
    int64_t emb = (int64_t)c->vocab_size * c->dim, layers = 0;
    for (int l = 0; l < c->n_layers; l++) layers += block_params(c, l, active ? c->moe_top_k : c->moe_experts);
    int64_t n = emb + layers + c->dim + (c->tie_embeddings ? 0 : emb);
    // tied embeddings still feed the output GEMM, so TorchTitan keeps them in the count
    if (exclude_embedding && !c->tie_embeddings) n -= emb;
    return n;
}

int64_t hp_model_param_count(const hp_model_config_t *c, int exclude_embedding) {
    return count_params(c, exclude_embedding, 0);
}

int64_t hp_model_active_param_count(const hp_model_config_t *c, int exclude_embedding) {
    return count_params(c, exclude_embedding, 1);
}

double hp_model_flops_per_token(const hp_model_config_t *c, int seq_len) {
    // TorchTitan's head_dims: 2 head_dim, or qk_nope + qk_rope + v_head (deepseek_v3)
    const double hds = c->mla ? (double)(c->qk_nope_head_dim + c->qk_rope_head_dim + c->v_head_dim)
                              : 2.0 * c->head_dim;
    return 6.0 * (double)hp_model_active_param_count(c, 1) + 6.0 * c->n_layers * c->n_heads * hds * (double)seq_len;
}

/* ---- the builders ------------------------------------------------------------------------- */

static int llama_n_units(const hp_model_config_t *c) { return c->n_layers + 2; }

static int llama_unit_kind(const hp_model_config_t *c, int u) {
    return u == 0 ? NN_UNIT_EMBEDDING : u <= c->n_layers ? NN_UNIT_BLOCK : NN_UNIT_HEAD;
}

static nn_pdecl_t *decl(nn_pdecl_t *d, int *n, const char *name, int ndim, int64_t d0, int64_t d1, int group) {
    nn_pdecl_t *p = &d[(*n)++];
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = d1;
    p->group = group;
    p->init = NN_INIT_RNG;
    p->rng = (hp_rng_spec_t){HP_RNG_TRUNC_NORMAL, 0.0f, 0.02f, -2.0f, 2.0f};   // torch defaults a=-2, b=2
    return p;
}

static void init_ones(nn_pdecl_t *p) { p->init = NN_INIT_ONES; }
/* TorchTitan's output projection: trunc_normal(std = dim^-0.5) cut at +-3 std. */
static void init_output(nn_pdecl_t *p, int dim) {
    const float s = 1.0f / sqrtf((float)dim);
    p->rng = (hp_rng_spec_t){HP_RNG_TRUNC_NORMAL, 0.0f, s, -3.0f * s, 3.0f * s};
}

static int llama_declare(const hp_model_config_t *c, int u, int has_embedding, nn_pdecl_t *d) {
    const int64_t dm = c->dim, qd = (int64_t)c->n_heads * c->head_dim, kd = (int64_t)c->n_kv_heads * c->head_dim,
                  hid = c->hidden_dim, V = c->vocab_size;
    int n = 0;
    char nm[HP_PARAM_NAME_MAX];
    switch (llama_unit_kind(c, u)) {
    case NN_UNIT_EMBEDDING: {
        nn_pdecl_t *e = decl(d, &n, "tok_embeddings.weight", 2, V, dm, 0);
        if (c->tie_embeddings) init_output(e, c->dim);   // the shared tensor is initialised as the output
        else e->rng = (hp_rng_spec_t){HP_RNG_NORMAL, 0.0f, 1.0f, 0.0f, 0.0f};
        break;
    }
    case NN_UNIT_BLOCK: {
        const int l = u - 1;
        const float depth = 0.02f / sqrtf(2.0f * (float)(l + 1));   // TorchTitan depth init
#define L(suffix) (snprintf(nm, sizeof(nm), "layers.%d.%s", l, suffix), nm)
        if (c->mla) {   // TorchTitan deepseek_v3 Attention: linears std 0.02, wo depth-scaled, norms ones
            const int64_t H = c->n_heads, qk = c->qk_nope_head_dim + c->qk_rope_head_dim, ql = c->q_lora_rank,
                          kvl = c->kv_lora_rank;
            if (ql) {
                decl(d, &n, L("attention.wq_a.weight"), 2, ql, dm, 0);
                init_ones(decl(d, &n, L("attention.q_norm.weight"), 1, ql, 0, 0));
                decl(d, &n, L("attention.wq_b.weight"), 2, H * qk, ql, 0);
            } else {
                decl(d, &n, L("attention.wq.weight"), 2, H * qk, dm, 0);
            }
            decl(d, &n, L("attention.wkv_a.weight"), 2, kvl + c->qk_rope_head_dim, dm, 0);
            init_ones(decl(d, &n, L("attention.kv_norm.weight"), 1, kvl, 0, 0));
            decl(d, &n, L("attention.wkv_b.weight"), 2, H * (c->qk_nope_head_dim + c->v_head_dim), kvl, 0);
            decl(d, &n, L("attention.wo.weight"), 2, dm, H * c->v_head_dim, 0)->rng.p1 = depth;
        } else {
        decl(d, &n, L("attention.wq.weight"), 2, qd, dm, 1);
        decl(d, &n, L("attention.wk.weight"), 2, kd, dm, 1);
        decl(d, &n, L("attention.wv.weight"), 2, kd, dm, 1);
        decl(d, &n, L("attention.wo.weight"), 2, dm, qd, 0)->rng.p1 = depth;
        if (c->qk_norm) {
            init_ones(decl(d, &n, L("attention.q_norm.weight"), 1, c->head_dim, 0, 0));
            init_ones(decl(d, &n, L("attention.k_norm.weight"), 1, c->head_dim, 0, 0));
        }
        }
        init_ones(decl(d, &n, L("attention_norm.weight"), 1, dm, 0, 0));
        if (hp_model_layer_is_moe(c, l)) {   /* --- mixture of experts (owner moe) --- */
            // TorchTitan MoE.init_weights: experts w1 std 0.02, w2/w3 and the gate depth-scaled
            const int64_t E = c->moe_experts, F = c->moe_hidden, Fs = F * c->moe_shared_experts;
            nn_pdecl_t *p = decl(d, &n, L("moe.experts.w1"), 3, E, F, 0);
            p->shape[2] = dm;
            p = decl(d, &n, L("moe.experts.w2"), 3, E, dm, 0);
            p->shape[2] = F;
            p->rng.p1 = depth;
            p = decl(d, &n, L("moe.experts.w3"), 3, E, F, 0);
            p->shape[2] = dm;
            p->rng.p1 = depth;
            decl(d, &n, L("moe.router.gate.weight"), 2, E, dm, 0)->rng.p1 = depth;
            if (Fs > 0) {
                decl(d, &n, L("moe.shared_experts.w1.weight"), 2, Fs, dm, 0);
                decl(d, &n, L("moe.shared_experts.w2.weight"), 2, dm, Fs, 0)->rng.p1 = depth;
                decl(d, &n, L("moe.shared_experts.w3.weight"), 2, Fs, dm, 0)->rng.p1 = depth;
            }
            init_ones(decl(d, &n, L("ffn_norm.weight"), 1, dm, 0, 0));
            break;
        }   /* --- end --- */
        decl(d, &n, L("feed_forward.w1.weight"), 2, hid, dm, 2);
        decl(d, &n, L("feed_forward.w2.weight"), 2, dm, hid, 0)->rng.p1 = depth;
        decl(d, &n, L("feed_forward.w3.weight"), 2, hid, dm, 2)->rng.p1 = depth;
        init_ones(decl(d, &n, L("ffn_norm.weight"), 1, dm, 0, 0));
#undef L
        break;
    }
    default:
        init_ones(decl(d, &n, "norm.weight", 1, dm, 0, 0));
        if (!c->tie_embeddings) init_output(decl(d, &n, "output.weight", 2, V, dm, 0), c->dim);
        else if (!has_embedding) init_output(decl(d, &n, "tok_embeddings.weight", 2, V, dm, 0), c->dim);
        break;
    }
    return n;
}

static hp_module_t *new_linear(hp_model_t m, const char *name, hp_param_t **w, int n, int in, int out, int acc_out) {
    hp_module_t *mod = nn_module_new(m, sizeof(hp_linear_impl_t));
    if (!mod) return NULL;
    hp_linear_impl_t *L = mod->impl;
    hp_linear_module_init(mod, L, name, w, n, NULL, in, out);
    L->accumulate_output = acc_out;
    return mod;
}

static hp_module_t *new_rmsnorm(hp_model_t m, const char *name, hp_param_t *w, int dim, float eps, int acc) {
    hp_module_t *mod = nn_module_new(m, sizeof(hp_rmsnorm_impl_t));
    if (!mod) return NULL;
    hp_rmsnorm_impl_t *R = mod->impl;
    hp_rmsnorm_module_init(mod, R, name, w, dim, eps);
    R->accumulate_input_grad = acc;
    return mod;
}

/* MLA attention of block l over its params P (declared order). */
static hp_status_t build_mla(hp_model_t m, int l, hp_param_t **P, hp_module_t **out) {
    const hp_model_config_t *c = hp_model_config(m);
    const int d = c->dim, H = c->n_heads, qk = c->qk_nope_head_dim + c->qk_rope_head_dim, ql = c->q_lora_rank,
              kvl = c->kv_lora_rank;
    char nm[HP_PARAM_NAME_MAX];
#define N(suffix) (snprintf(nm, sizeof(nm), "layers.%d.attention.%s", l, suffix), nm)
    hp_module_t *kids[7];
    int n = 0, p = 0;
    if (ql) {
        kids[n++] = new_linear(m, N("wq_a"), &P[p++], 1, d, ql, 0);
        kids[n++] = new_rmsnorm(m, N("q_norm"), P[p++], ql, c->norm_eps, 0);
        kids[n++] = new_linear(m, N("wq_b"), &P[p++], 1, ql, H * qk, 0);
    } else {
        kids[n++] = new_linear(m, N("wq"), &P[p++], 1, d, H * qk, 0);
    }
    kids[n++] = new_linear(m, N("wkv_a"), &P[p++], 1, d, kvl + c->qk_rope_head_dim, 0);
    kids[n++] = new_rmsnorm(m, N("kv_norm"), P[p++], kvl, c->norm_eps, 0);
    kids[n++] = new_linear(m, N("wkv_b"), &P[p++], 1, kvl, H * (c->qk_nope_head_dim + c->v_head_dim), 0);
    kids[n++] = new_linear(m, N("wo"), &P[p++], 1, H * c->v_head_dim, d, 1);
    for (int i = 0; i < n; i++)
        if (!kids[i]) return HP_ERR_OOM;
    ((hp_linear_impl_t *)kids[ql ? 3 : 1]->impl)->accumulate_input_grad = 1;   // wkv_a adds to the q path's din
#undef N
    snprintf(nm, sizeof(nm), "layers.%d.attention", l);
    nn_mla_cfg_t mc = {d, H, l, ql, kvl, c->qk_nope_head_dim, c->qk_rope_head_dim, c->v_head_dim, c->head_dim,
                       (float)hp_model_mla_softmax_scale(c), m->cos_t, m->sin_t};
    return nn_mla_new(m, nm, &mc, kids, n, out);
}

static hp_status_t build_common(hp_model_t m, int u, hp_param_t **P, int np, hp_module_t **out,
                                hp_rope_style_t style) {
    const hp_model_config_t *c = hp_model_config(m);
    const int d = c->dim, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, hid = c->hidden_dim;
    char nm[HP_PARAM_NAME_MAX];
    switch (llama_unit_kind(c, u)) {
    case NN_UNIT_EMBEDDING: {
        hp_module_t *e = nn_module_new(m, sizeof(hp_embedding_impl_t));
        if (!e) return HP_ERR_OOM;
        hp_embedding_module_init(e, e->impl, "tok_embeddings", P[0], c->vocab_size, d);
        *out = e;
        return HP_OK;
    }
    case NN_UNIT_BLOCK: {
        const int l = u - 1;
        int k = c->mla ? (c->q_lora_rank ? 7 : 5) : 4 + (c->qk_norm ? 2 : 0);
        hp_param_t *qkv[3] = {P[0], P[1], P[2]}, *wo = P[3];
        hp_param_t *qn = NULL, *kn = NULL;
        if (c->qk_norm) { qn = P[4]; kn = P[5]; }
        const int moe = hp_model_layer_is_moe(c, l);
        hp_param_t *an = P[k], *w13[2] = {P[k + 1], P[k + 3]}, *w2 = P[k + 2], *fn = P[np - 1];
        HP_ASSERT(moe ? k + 6 + (c->moe_shared_experts ? 3 : 0) == np : k + 5 == np);
#define N(suffix) (snprintf(nm, sizeof(nm), "layers.%d%s", l, suffix), nm)
        hp_module_t *attention_norm = new_rmsnorm(m, N(".attention_norm"), an, d, c->norm_eps, 1);
        if (!attention_norm) return HP_ERR_OOM;
        hp_module_t *attention, *ffn, *block;
        if (c->mla) {
            HP_TRY(build_mla(m, l, P, &attention));
        } else {
            hp_module_t *wqkv = new_linear(m, N(".attention.wqkv"), qkv, 3, d, (H + 2 * KV) * hd, 0);
            hp_module_t *wom = new_linear(m, N(".attention.wo"), &wo, 1, H * hd, d, 1);
            if (!wqkv || !wom) return HP_ERR_OOM;
            nn_attention_cfg_t ac = {d, H, KV, hd, l, c->qk_norm, c->norm_eps, style, m->cos_t, m->sin_t};
            HP_TRY(nn_attention_new(m, N(".attention"), &ac, wqkv, wom, qn, kn, &attention));
        }
        hp_module_t *ffn_norm = new_rmsnorm(m, N(".ffn_norm"), fn, d, c->norm_eps, 1);
        if (!ffn_norm) return HP_ERR_OOM;
        if (moe) {   /* --- mixture of experts (owner moe) --- */
            hp_moe_config_t mc;
            hp_model_moe_config(c, &mc);
            const size_t E = (size_t)mc.n_experts;
            // impl, then expert_bias (E) and tokens_per_expert (E) in the module's zeroed storage
            hp_module_t *mm = nn_module_new(m, sizeof(hp_moe_impl_t) + 2 * E * sizeof(float));
            if (!mm) return HP_ERR_OOM;
            float *buf = (float *)((char *)mm->impl + sizeof(hp_moe_impl_t));
            hp_param_t *mp[7] = {P[k + 4], P[k + 1], P[k + 2], P[k + 3], NULL, NULL, NULL};
            const int nmp = mc.n_shared_experts ? 7 : 4;
            if (nmp == 7) { mp[4] = P[k + 5]; mp[5] = P[k + 6]; mp[6] = P[k + 7]; }
            HP_TRY(hp_moe_module_init(mm, mm->impl, N(".moe"), &mc, mp, nmp, buf, buf + E));
            HP_TRY(nn_block_new(m, N(""), d, attention_norm, attention, ffn_norm, mm, &block));
            *out = block;
            return HP_OK;
        }   /* --- end --- */
        hp_module_t *w13m = new_linear(m, N(".feed_forward.w13"), w13, 2, d, 2 * hid, 0);
        hp_module_t *w2m = new_linear(m, N(".feed_forward.w2"), &w2, 1, hid, d, 1);
        if (!w13m || !w2m) return HP_ERR_OOM;
        HP_TRY(nn_feed_forward_new(m, N(".feed_forward"), d, hid, w13m, w2m, &ffn));
        HP_TRY(nn_block_new(m, N(""), d, attention_norm, attention, ffn_norm, ffn, &block));
#undef N
        *out = block;
        return HP_OK;
    }
    default: {
        hp_module_t *norm = new_rmsnorm(m, "norm", P[0], d, c->norm_eps, 0);
        hp_param_t *ow = c->tie_embeddings ? hp_model_find_param(m, "tok_embeddings.weight") : P[1];
        HP_ASSERT(ow != NULL);
        hp_module_t *output = new_linear(m, "output", &ow, 1, d, c->vocab_size, 0);
        if (!norm || !output) return HP_ERR_OOM;
        ((hp_linear_impl_t *)output->impl)->prof_op = HP_NN_OP_OUTPUT_FWD;
        return nn_head_new(m, "", d, norm, output, out);
    }
    }
}

static hp_status_t llama_build(hp_model_t m, int u, hp_param_t **P, int np, hp_module_t **out) {
    return build_common(m, u, P, np, out, HP_ROPE_INTERLEAVED);   // llama3: pairs (2i, 2i+1)
}
static hp_status_t qwen3_build(hp_model_t m, int u, hp_param_t **P, int np, hp_module_t **out) {
    return build_common(m, u, P, np, out, HP_ROPE_HALF);   // qwen3: rotate_half
}

static const nn_spec_t specs[] = {
    {"llama3", llama_n_units, llama_unit_kind, llama_declare, llama_build},
    {"qwen3", llama_n_units, llama_unit_kind, llama_declare, qwen3_build},
    {"deepseek_v3", llama_n_units, llama_unit_kind, llama_declare, llama_build},   // MLA attention, MoE
    {"qwen3_moe", llama_n_units, llama_unit_kind, llama_declare, qwen3_build},
};

const nn_spec_t *nn_spec_find(const char *name) {
    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++)
        if (strcmp(specs[i].name, name) == 0) return &specs[i];
    return NULL;
}
