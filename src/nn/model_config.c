/* The decoder config every model family fills (hp_model_config_t): its checks and derived
 * fields (TorchTitan's FFN rule, head_dim, MLA's core width), parameter counts and FLOPs/token,
 * and the MoE / MLA quantities read from it. Family-free: the flavors and builders are in
 * src/models/. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/model.h"

static int llama_hidden(int dim, int multiple_of, float mult) {
    // TorchTitan: hidden = 4*dim; int(2*hidden/3); int(mult*hidden); round up to multiple_of
    int hidden = 4 * dim;
    hidden = (int)(2 * hidden / 3);
    if (mult > 0.0f) hidden = (int)(mult * (float)hidden);
    return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

/* The MoE layers of a config and their module config (docs/moe.md). */
int hp_model_layer_is_moe(const hp_model_config_t *c, int layer) {
    return c->moe_experts > 0 && layer >= c->moe_n_dense_layers;
}

void hp_model_moe_config(const hp_model_config_t *c, hp_moe_config_t *o) {
    *o = (hp_moe_config_t){.dim = c->dim, .hidden = c->moe_hidden, .n_experts = c->moe_experts, .top_k = c->moe_top_k,
                           .score_fn = c->moe_score_fn, .route_norm = c->moe_route_norm,
                           .route_scale = c->moe_route_scale, .score_before_experts = c->moe_score_before_experts,
                           .n_shared_experts = c->moe_shared_experts, .shared_hidden = c->moe_hidden,
                           .n_expert_groups = c->moe_expert_groups, .n_limited_groups = c->moe_limited_groups,
                           .aux_loss_coeff = c->moe_aux_loss_coeff};
}

int hp_model_mla_yarn(const hp_model_config_t *c) {
    return c->mla && c->max_seq_len > c->rope_original_max_pos;   // TorchTitan: seqlen > original_seq_len
}

float hp_model_mla_norm_eps(const hp_model_config_t *c) { return c->mla_norm_eps > 0.0f ? c->mla_norm_eps : c->norm_eps; }

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
    if (!(c->mla_norm_eps >= 0.0f && c->mla_norm_eps <= 1.0f))
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s' (MLA): mla_norm_eps %g, expected 0 (norm_eps, as "
                        "TorchTitan) or an epsilon in (0, 1] such as 1e-6 (transformers' DeepseekV3)", c->name,
                        c->flavor, c->mla_norm_eps);
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
    if (c->moe_experts > 0) {   // the MoE module's bounds and the dense-layer count
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
    }
    if (c->lora_rank < 0 || (c->lora_rank > 0 && (!(c->lora_alpha > 0.0f) || c->lora_targets <= 0 ||
                                                  c->lora_targets >= (1 << HP_LORA_N_TARGETS))))
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': LoRA rank %d, alpha %g, targets 0x%x; expected "
                        "lora.rank >= 0 and, when > 0, lora.alpha > 0 and at least one of lora.target_modules",
                        c->name, c->flavor, c->lora_rank, c->lora_alpha, (unsigned)c->lora_targets);
    if (c->lora_rank > 0 && (c->mla || c->moe_experts > 0))
        return hp_error(HP_ERR_UNSUPPORTED, "model config '%s/%s': LoRA (lora.enable) is implemented for dense GQA "
                        "decoders (llama3, qwen3); this one has %s; hint: set lora.enable = false",
                        c->name, c->flavor, c->mla ? "MLA attention" : "MoE layers");
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

static const char *const lora_names[HP_LORA_N_TARGETS][2] = {
    {"wq", "q_proj"}, {"wk", "k_proj"}, {"wv", "v_proj"}, {"wo", "o_proj"},
    {"w1", "gate_proj"}, {"w2", "down_proj"}, {"w3", "up_proj"},
};
const char *hp_lora_target_name(int i) { return i >= 0 && i < HP_LORA_N_TARGETS ? lora_names[i][0] : "?"; }
const char *hp_lora_target_peft_name(int i) { return i >= 0 && i < HP_LORA_N_TARGETS ? lora_names[i][1] : "?"; }
int hp_lora_target_bit(const char *name) {
    for (int i = 0; i < HP_LORA_N_TARGETS; i++)
        if (!strcmp(name, lora_names[i][0]) || !strcmp(name, lora_names[i][1])) return 1 << i;
    return 0;
}
