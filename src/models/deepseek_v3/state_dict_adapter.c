/* deepseek_v3's HF state-dict adapter (DeepseekV3ForCausalLM, model_type "deepseek_v3"): the
 * MLA attention's and the shared experts' names, the trainer's expert_bias as
 * mlp.gate.e_score_correction_bias, then the decoder's (router, routed experts, dense layers).
 * HF keeps the interleaved RoPE layout (rope_interleave true): nothing is permuted. Its
 * config.json mapping: DeepseekV3Config's MLA sizes, routing and YaRN. */
#include <stdio.h>
#include <string.h>
#include "models/models-impl.h"

static const hp_hf_name_pair_t mla_names[] = {
    {"attention.wq.weight", "self_attn.q_proj.weight", 0},
    {"attention.wq_a.weight", "self_attn.q_a_proj.weight", 0},
    {"attention.q_norm.weight", "self_attn.q_a_layernorm.weight", 0},
    {"attention.wq_b.weight", "self_attn.q_b_proj.weight", 0},
    {"attention.wkv_a.weight", "self_attn.kv_a_proj_with_mqa.weight", 0},
    {"attention.kv_norm.weight", "self_attn.kv_a_layernorm.weight", 0},
    {"attention.wkv_b.weight", "self_attn.kv_b_proj.weight", 0},
    {"attention.wo.weight", "self_attn.o_proj.weight", 0},
    {"moe.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight", 0},
    {"moe.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight", 0},
    {"moe.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight", 0},
    {"moe.expert_bias", "mlp.gate.e_score_correction_bias", 0},   /* the trainer's checkpoint entry */
    {NULL, NULL, 0},
};

/* DeepseekV3TopkRouter: sigmoid, the bias for selection, groups, norm, scale; and routed experts
 * in some layer (HF has no dense-only DeepSeek-V3). */
static hp_status_t check_moe(const hp_model_config_t *mc, const char *what) {
    if (mc->moe_experts <= 0)
        return hp_error(HP_ERR_UNSUPPORTED, "HF %s: deepseek_v3 without routed experts has no HF architecture; hint: "
                        "keep model.moe_num_experts", what);
    const char *key = mc->moe_score_fn != HP_MOE_SCORE_SIGMOID ? "model.moe_score_func (HF: sigmoid)"
                      : mc->moe_shared_experts < 1            ? "model.moe_num_shared_experts (HF: >= 1)"
                      : mc->moe_score_before_experts          ? "model.moe_score_before_experts (HF: false)"
                      : mc->moe_n_dense_layers >= mc->n_layers ? "model.moe_n_dense_layers (HF: < n_layers)"
                                                              : NULL;
    if (key)
        return hp_error(HP_ERR_UNSUPPORTED, "HF %s: DeepseekV3ForCausalLM cannot express this deepseek_v3 model's %s; "
                        "hint: set it (the 671B flavor has HF's values), or use the DCP checkpoint", what, key);
    /* transformers builds q_a_layernorm / kv_a_layernorm with DeepseekV3RMSNorm's default eps
     * 1e-6 whatever rms_norm_eps says; TorchTitan's flavors use norm_eps (1e-5) */
    if (mc->mla && hp_model_mla_norm_eps(mc) != 1e-6f)
        return hp_error(HP_ERR_UNSUPPORTED, "HF %s: DeepseekV3ForCausalLM's q_a_layernorm / kv_a_layernorm use eps 1e-6 "
                        "whatever rms_norm_eps says, but this deepseek_v3 model's q_norm / kv_norm use %g "
                        "(model.mla_norm_eps = %g; 0 means model.norm_eps, as TorchTitan's flavors); hint: set "
                        "model.mla_norm_eps = 1e-6 (hp-ckpt: --model.mla_norm_eps 1e-6) for transformers' numerics (an HF "
                        "import has it), or keep the DCP checkpoint: in the HF class these norms compute with 1e-6", what,
                        hp_model_mla_norm_eps(mc), mc->mla_norm_eps);
    return HP_OK;
}

/* DeepseekV3Config: MLA sizes, routing, YaRN. HF always routes with a sigmoid (scoring_func /
 * topk_method, when present, must say so) and applies YaRN whenever rope_type is "yarn"; the
 * model applies it when max_seq_len > the original context, and scales the softmax by mscale^2
 * with HF's attention_factor 1 (mscale == mscale_all_dim). */
static hp_status_t read_keys(const hfj_t *c, hp_model_config_t *mc, int64_t maxpos) {
    int64_t ne, k, mh, sh, dense, ng, tg, ql = 0, kvl, nope, rope, v;
    int norm = 0, il = 1;
    double rsf = 1.0;
    HP_TRY(hfj_int(c, "n_routed_experts", 1, 0, 1, 1 << 16, &ne));
    HP_TRY(hfj_int(c, "num_experts_per_tok", 1, 0, 1, ne, &k));
    HP_TRY(hfj_int(c, "moe_intermediate_size", 1, 0, 1, HP_MODEL_MAX_DIM, &mh));
    HP_TRY(hfj_int(c, "n_shared_experts", 0, 1, 1, 64, &sh));
    HP_TRY(hfj_int(c, "first_k_dense_replace", 0, 0, 0, HP_MODEL_MAX_LAYERS, &dense));
    if (dense > mc->n_layers)   /* named here: the model config would report its own field */
        return hp_error(HP_ERR_FORMAT, "%s: 'first_k_dense_replace' = %lld exceeds 'num_hidden_layers' = %d: it counts "
                        "the dense layers before the MoE ones; hint: at most num_hidden_layers (DeepSeek-V3: 3 of 61)",
                        c->path, (long long)dense, mc->n_layers);
    HP_TRY(hfj_int(c, "n_group", 0, 1, 1, ne, &ng));
    HP_TRY(hfj_int(c, "topk_group", 0, ng, 1, ng, &tg));
    HP_TRY(hfj_bool(c, "norm_topk_prob", 0, &norm));
    HP_TRY(hfj_num(c, c->o, "routed_scaling_factor", 0, 1.0, 1e-6, 1e6, &rsf));
    HP_TRY(hfj_int(c, "q_lora_rank", 0, 0, 0, HP_MODEL_MAX_DIM, &ql));   /* null: a full q_proj */
    HP_TRY(hfj_int(c, "kv_lora_rank", 1, 0, 1, HP_MODEL_MAX_DIM, &kvl));
    HP_TRY(hfj_int(c, "qk_nope_head_dim", 1, 0, 0, 512, &nope));
    HP_TRY(hfj_int(c, "qk_rope_head_dim", 1, 0, 2, 512, &rope));
    HP_TRY(hfj_int(c, "v_head_dim", 1, 0, 1, 512, &v));
    HP_TRY(hfj_bool(c, "rope_interleave", 1, &il));
    if (!il) return hfj_unsupported(c, "rope_interleave", "false", "interleaved RoPE pairs (true, TorchTitan's layout)");
    const char *fixed[2][2] = {{"scoring_func", "sigmoid"}, {"topk_method", "noaux_tc"}};
    for (int i = 0; i < 2; i++) {
        json_object *x = hfj_get(c->o, fixed[i][0]);
        if (x && (!json_object_is_type(x, json_type_string) || strcmp(json_object_get_string(x), fixed[i][1]) != 0))
            return hfj_unsupported(c, fixed[i][0], json_object_to_json_string(x), fixed[i][1]);
    }
    if (ne % ng != 0)
        return hp_error(HP_ERR_FORMAT, "%s: 'n_routed_experts' = %lld is not divisible by 'n_group' = %lld", c->path,
                        (long long)ne, (long long)ng);
    mc->moe_experts = (int)ne;
    mc->moe_top_k = (int)k;
    mc->moe_hidden = (int)mh;
    mc->moe_shared_experts = (int)sh;
    mc->moe_n_dense_layers = (int)dense;
    mc->moe_expert_groups = ng > 1 ? (int)ng : 0;
    mc->moe_limited_groups = ng > 1 ? (int)tg : 0;
    mc->moe_route_norm = norm;
    mc->moe_route_scale = (float)rsf;
    mc->moe_score_fn = HP_MOE_SCORE_SIGMOID;
    mc->moe_score_before_experts = 0;
    mc->q_lora_rank = (int)ql;
    mc->kv_lora_rank = (int)kvl;
    mc->qk_nope_head_dim = (int)nope;
    mc->qk_rope_head_dim = (int)rope;
    mc->v_head_dim = (int)v;
    mc->n_kv_heads = mc->head_dim = 0;   /* MLA: derived (HF's head_dim is the RoPE width) */
    mc->mla_norm_eps = 1e-6f;   /* DeepseekV3RMSNorm's default: q/kv_a_layernorm are built without rms_norm_eps */
    json_object *r;
    const char *rkey, *type;
    HP_TRY(models_hf_rope_object(c, &r, &rkey, &type));
    double theta = 10000.0;
    HP_TRY(hfj_num(c, c->o, "rope_theta", 0, theta, 1.0, 1e12, &theta));
    if (r) HP_TRY(hfj_num(c, r, "rope_theta", 0, theta, 1.0, 1e12, &theta));
    mc->rope_theta = (float)theta;
    mc->rope_scaling = 0;
    char key[64];
    if (!strcmp(type, "default")) {   /* no YaRN: the model's condition max_seq_len > original is false */
        mc->rope_original_max_pos = (int)maxpos;
        return HP_OK;
    }
    snprintf(key, sizeof key, "%s.rope_type", rkey);
    if (strcmp(type, "yarn") != 0) {
        char b[300];
        snprintf(b, sizeof b, "'%.200s'", type);
        return hfj_unsupported(c, key, b, "plain RoPE (\"default\") or DeepSeek's \"yarn\"");
    }
    hfj_t rc = {c->path, r, c->cls};
    double f, bf = 32, bs = 1, ms = 1, msa = 0, af = 0;
    int64_t orig;
    int truncate = 1;
    HP_TRY(hfj_bool(&rc, "truncate", 1, &truncate));
    if (!truncate) {   /* transformers then keeps the correction range unrounded */
        snprintf(key, sizeof key, "%s.truncate", rkey);
        return hfj_unsupported(c, key, "false", "YaRN with the correction range rounded to whole dimensions (truncate "
                               "true, DeepSeek-V3's and TorchTitan's precompute_freqs_cis)");
    }
    HP_TRY(hfj_num(c, r, "factor", 1, 0, 1e-6, 1e6, &f));
    HP_TRY(hfj_num(c, r, "beta_fast", 0, bf, 1e-6, 1e6, &bf));
    HP_TRY(hfj_num(c, r, "beta_slow", 0, bs, 1e-6, 1e6, &bs));
    HP_TRY(hfj_num(c, r, "mscale", 0, ms, 0, 1e6, &ms));
    HP_TRY(hfj_num(c, r, "mscale_all_dim", 0, msa, 0, 1e6, &msa));
    HP_TRY(hfj_num(c, r, "attention_factor", 0, 0, 0, 1e6, &af));
    HP_TRY(hfj_int(&rc, "original_max_position_embeddings", 1, 0, 1, HP_MODEL_MAX_SEQ_LEN, &orig));
    snprintf(key, sizeof key, "%s.mscale_all_dim", rkey);
    if (msa != ms || !(ms > 0) || (af != 0 && af != 1)) {
        char b[128];
        snprintf(b, sizeof b, "%g (mscale %g, attention_factor %g)", msa, ms, af);
        return hfj_unsupported(c, key, b, "mscale_all_dim == mscale > 0 (HF's attention_factor 1 and the softmax scale "
                           "x mscale^2, TorchTitan's deepseek_v3)");
    }
    if (maxpos <= orig) {
        char b[128];
        snprintf(b, sizeof b, "%lld with original_max_position_embeddings %lld", (long long)maxpos, (long long)orig);
        return hfj_unsupported(c, "max_position_embeddings", b, "a context above the original one (TorchTitan applies "
                           "YaRN only then; HF always does)");
    }
    mc->rope_factor = (float)f;
    mc->rope_beta_fast = (float)bf;
    mc->rope_beta_slow = (float)bs;
    mc->mla_mscale = (float)ms;
    mc->rope_original_max_pos = (int)orig;
    return HP_OK;
}

static void diff(models_diff_t *d, const hp_model_config_t *hf, const hp_model_config_t *mc) {
#define INT_KF(hfkey, key, f) models_diff_int(d, hfkey, key, hf->f, mc->f)
#define INT_F(hfkey, f) models_diff_int(d, hfkey, #f, hf->f, mc->f)
#define FLT_F(hfkey, f) models_diff_float(d, hfkey, #f, hf->f, mc->f)
    INT_KF("n_routed_experts", "moe_num_experts", moe_experts);
    INT_KF("num_experts_per_tok", "moe_top_k", moe_top_k);
    INT_KF("moe_intermediate_size", "moe_hidden_dim", moe_hidden);
    INT_KF("n_shared_experts", "moe_num_shared_experts", moe_shared_experts);
    INT_KF("first_k_dense_replace", "moe_n_dense_layers", moe_n_dense_layers);
    /* HF's n_group 1 is no grouping (0 here) */
    models_diff_int(d, "n_group", "moe_n_expert_groups", hf->moe_expert_groups > 1 ? hf->moe_expert_groups : 0,
                    mc->moe_expert_groups > 1 ? mc->moe_expert_groups : 0);
    if (hf->moe_expert_groups > 1) INT_KF("topk_group", "moe_n_limited_groups", moe_limited_groups);
    models_diff_bool(d, "norm_topk_prob", "moe_route_norm", hf->moe_route_norm, mc->moe_route_norm);
    FLT_F("routed_scaling_factor", moe_route_scale);
    if (hf->moe_score_fn != mc->moe_score_fn)
        models_diff_str(d, "scoring_func", "moe_score_func", hf->moe_score_fn == HP_MOE_SCORE_SIGMOID ? "sigmoid" : "softmax",
                        mc->moe_score_fn == HP_MOE_SCORE_SIGMOID ? "sigmoid" : "softmax");
    INT_F("q_lora_rank", q_lora_rank);
    INT_F("kv_lora_rank", kv_lora_rank);
    INT_F("qk_nope_head_dim", qk_nope_head_dim);
    INT_F("qk_rope_head_dim", qk_rope_head_dim);
    INT_F("v_head_dim", v_head_dim);
    models_diff_float(d, "q_a_layernorm / kv_a_layernorm eps (transformers: 1e-6)", "mla_norm_eps",
                      hp_model_mla_norm_eps(hf), hp_model_mla_norm_eps(mc));
    const int yh = hp_model_mla_yarn(hf), ym = hp_model_mla_yarn(mc);
    if (yh != ym) {   /* YaRN applies when max_seq_len > rope_original_max_pos (TorchTitan's rule) */
        char m[512], f[160];
        snprintf(m, sizeof m, "config.json 'rope_parameters.rope_type' = %s with max_position_embeddings %d (model YaRN "
                 "%s: model.max_seq_len %d %s model.rope_original_max_pos %d)", yh ? "yarn" : "default", hf->max_seq_len,
                 ym ? "on" : "off", mc->max_seq_len, ym ? ">" : "<=", mc->rope_original_max_pos);
        snprintf(f, sizeof f, "--model.max_seq_len %d", hf->max_seq_len);
        models_diff_add(d, m, f);
        if (!yh && hf->rope_original_max_pos != mc->rope_original_max_pos) {
            char v[32];
            snprintf(v, sizeof v, "%d", hf->rope_original_max_pos);
            models_diff_flag(d, "rope_original_max_pos", v);
        }
    }
    /* the context changes no numerics while YaRN's state agrees, but to-hf writes it as
     * max_position_embeddings (and hp-generate's window is it) */
    if (yh == ym && hf->max_seq_len != mc->max_seq_len) {
        char v[32];
        snprintf(v, sizeof v, "%d", hf->max_seq_len);
        models_diff_flag(d, "max_seq_len", v);
    }
    if (yh) {
        FLT_F("rope_parameters.factor", rope_factor);
        FLT_F("rope_parameters.mscale", mla_mscale);
        FLT_F("rope_parameters.beta_fast", rope_beta_fast);
        FLT_F("rope_parameters.beta_slow", rope_beta_slow);
        INT_F("rope_parameters.original_max_position_embeddings", rope_original_max_pos);
    }
#undef INT_KF
#undef INT_F
#undef FLT_F
}

/* DeepseekV3Config: MLA sizes, MoE routing, YaRN (rope_parameters; mscale == mscale_all_dim, so
 * HF's attention_factor is 1 and its softmax scale gets mscale^2 as TorchTitan's), or plain
 * RoPE when YaRN is off (max_seq_len <= the original context). */
static void write_keys(json_object *c, const hp_model_config_t *mc) {
#define I(k, v) json_object_object_add(c, k, json_object_new_int(v))
    I("moe_intermediate_size", mc->moe_hidden);
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
    I("max_position_embeddings", mc->max_seq_len > 0 ? mc->max_seq_len : 4096);
    I("num_nextn_predict_layers", 0);
#undef I
    json_object_object_add(c, "q_lora_rank", mc->q_lora_rank ? json_object_new_int(mc->q_lora_rank) : NULL);
    json_object_object_add(c, "routed_scaling_factor", json_object_new_double(mc->moe_route_scale));
    json_object_object_add(c, "norm_topk_prob", json_object_new_boolean(mc->moe_route_norm));
    json_object_object_add(c, "scoring_func", json_object_new_string("sigmoid"));
    json_object_object_add(c, "topk_method", json_object_new_string("noaux_tc"));
    json_object_object_add(c, "rope_interleave", json_object_new_boolean(1));
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
}

static const hp_hf_name_pair_t *const names[] = {mla_names, models_hf_decoder_names, NULL};

/* 32768 when config.json lacks max_position_embeddings, as for Qwen3Config (DeepseekV3Config's
 * own default is 4096, but the config.json of a DeepSeek-V3 checkpoint names it) */
const models_hf_family_t deepseek_v3_hf = {
    {"deepseek_v3", "deepseek_v3", "DeepseekV3ForCausalLM", names, 0, MODELS_HF_HOOKS},
    32768, 0, 0, read_keys, diff, write_keys, check_moe,
};
