/* HF config.json -> model config (every field LlamaForCausalLM / Qwen3ForCausalLM read), with
 * each field the project cannot reproduce refused by name, and the comparison of two model
 * configs field by field (a flavor against a checkpoint's config.json; docs/checkpoint.md). */
#define _GNU_SOURCE
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyperparallel/checkpoint.h"
#include "hyperparallel/model.h"
#include "hyperparallel/parse.h"

typedef struct {
    const char *path;   /* DIR/config.json, for the messages */
    json_object *o;
} cfg_t;

/* a present, non-null value of key in o (NULL when absent or JSON null) */
static json_object *get(json_object *o, const char *key) {
    json_object *v = NULL;
    if (!o || !json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null)) return NULL;
    return v;
}

static hp_status_t get_int(const cfg_t *c, const char *key, int required, int64_t def, int64_t lo, int64_t hi,
                           int64_t *out) {
    json_object *v = get(c->o, key);
    if (!v) {
        if (required)
            return hp_error(HP_ERR_FORMAT, "%s: '%s' is missing; expected an integer (every LlamaConfig / Qwen3Config "
                            "has it); hint: use the config.json saved with the weights", c->path, key);
        *out = def;
        return HP_OK;
    }
    char what[4400];
    snprintf(what, sizeof what, "%s: '%s'", c->path, key);
    if (!json_object_is_type(v, json_type_int))   /* json_object_get_int would take 1e9 or "2048" */
        return hp_error(HP_ERR_FORMAT, "%s expects an integer, got %s '%s'", what,
                        json_type_to_name(json_object_get_type(v)), json_object_to_json_string(v));
    *out = json_object_get_int64(v);
    return hp_check_i64(what, *out, lo, hi, NULL);
}

static hp_status_t get_num(const cfg_t *c, json_object *o, const char *key, int required, double def, double lo,
                           double hi, double *out) {
    json_object *v = get(o, key);
    if (!v) {
        if (required)
            return hp_error(HP_ERR_FORMAT, "%s: '%s' is missing; expected a number; hint: use the config.json saved "
                            "with the weights", c->path, key);
        *out = def;
        return HP_OK;
    }
    if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double))
        return hp_error(HP_ERR_FORMAT, "%s: '%s' expects a number, got %s '%s'", c->path, key,
                        json_type_to_name(json_object_get_type(v)), json_object_to_json_string(v));
    *out = json_object_get_double(v);
    if (!(*out >= lo && *out <= hi))
        return hp_error(HP_ERR_FORMAT, "%s: '%s' = %g is out of range: expected a number in [%g, %g]", c->path, key, *out,
                        lo, hi);
    return HP_OK;
}

static hp_status_t get_bool(const cfg_t *c, const char *key, int def, int *out) {
    json_object *v = get(c->o, key);
    if (!v) {
        *out = def;
        return HP_OK;
    }
    if (!json_object_is_type(v, json_type_boolean))
        return hp_error(HP_ERR_FORMAT, "%s: '%s' expects true or false, got %s '%s'", c->path, key,
                        json_type_to_name(json_object_get_type(v)), json_object_to_json_string(v));
    *out = json_object_get_boolean(v);
    return HP_OK;
}

static hp_status_t unsupported(const cfg_t *c, const char *key, const char *value, const char *expected) {
    return hp_error(HP_ERR_UNSUPPORTED, "%s: '%s' = %s is not supported: the llama3 / qwen3 models here have %s; "
                    "hint: this checkpoint needs a model the project does not implement (docs/checkpoint.md "
                    "\"HF config.json\")", c->path, key, value, expected);
}

/* rope_scaling (transformers 4) or rope_parameters (transformers 5): none / "default" or
 * "llama3"; every other type (linear, dynamic, yarn, longrope, ...) changes the frequencies
 * in a way the model does not implement. */
static hp_status_t read_rope(const cfg_t *c, hp_model_config_t *mc) {
    json_object *rp = get(c->o, "rope_parameters"), *rs = get(c->o, "rope_scaling");
    const char *rkey = rp ? "rope_parameters" : "rope_scaling";
    json_object *r = rp ? rp : rs;
    if (r && !json_object_is_type(r, json_type_object))
        return hp_error(HP_ERR_FORMAT, "%s: '%s' expects an object (or null), got %s", c->path, rkey,
                        json_type_to_name(json_object_get_type(r)));
    double theta = 10000.0;
    HP_TRY(get_num(c, c->o, "rope_theta", 0, theta, 1.0, 1e12, &theta));
    if (r) HP_TRY(get_num(c, r, "rope_theta", 0, theta, 1.0, 1e12, &theta));
    mc->rope_theta = (float)theta;
    double prf = 1.0;
    HP_TRY(get_num(c, c->o, "partial_rotary_factor", 0, prf, 0.0, 1.0, &prf));
    if (r) HP_TRY(get_num(c, r, "partial_rotary_factor", 0, prf, 0.0, 1.0, &prf));
    if (prf != 1.0) {
        char b[64];
        snprintf(b, sizeof b, "%g", prf);
        return unsupported(c, "partial_rotary_factor", b, "RoPE over the whole head (1.0)");
    }
    mc->rope_scaling = 0;
    if (!r) return HP_OK;
    json_object *t = get(r, "rope_type");
    if (!t) t = get(r, "type");
    const char *type = t && json_object_is_type(t, json_type_string) ? json_object_get_string(t) : NULL;
    if (!t) type = "default";
    if (!type)
        return hp_error(HP_ERR_FORMAT, "%s: '%s.rope_type' expects a string, got %s", c->path, rkey,
                        json_type_to_name(json_object_get_type(t)));
    if (!strcmp(type, "default")) return HP_OK;
    if (strcmp(type, "llama3") != 0) {
        char key[64], b[300];
        snprintf(key, sizeof key, "%s.rope_type", rkey);
        snprintf(b, sizeof b, "'%.200s'", type);
        return unsupported(c, key, b, "plain RoPE (\"default\") or Llama 3.1's \"llama3\" frequency scaling");
    }
    double f, lo, hi;
    int64_t orig;
    cfg_t rc = {c->path, r};
    HP_TRY(get_num(c, r, "factor", 1, 0, 1e-6, 1e6, &f));
    HP_TRY(get_num(c, r, "low_freq_factor", 1, 0, 1e-6, 1e6, &lo));
    HP_TRY(get_num(c, r, "high_freq_factor", 1, 0, 1e-6, 1e6, &hi));
    HP_TRY(get_int(&rc, "original_max_position_embeddings", 1, 0, 1, HP_MODEL_MAX_SEQ_LEN, &orig));
    if (!(hi > lo))
        return hp_error(HP_ERR_FORMAT, "%s: '%s.high_freq_factor' = %g must be above low_freq_factor = %g (Llama 3.1: "
                        "4 and 1)", c->path, rkey, hi, lo);
    mc->rope_scaling = 1;
    mc->rope_factor = (float)f;
    mc->rope_low_freq_factor = (float)lo;
    mc->rope_high_freq_factor = (float)hi;
    mc->rope_original_max_pos = (int)orig;
    return HP_OK;
}

/* The fields HF's classes have and the model does not: refused when set to anything but the
 * value that makes them a no-op. */
static hp_status_t refuse_unsupported(const cfg_t *c, int llama) {
    json_object *v;
    int b = 0;
    if ((v = get(c->o, "hidden_act")) &&
        (!json_object_is_type(v, json_type_string) || strcmp(json_object_get_string(v), "silu") != 0))
        return unsupported(c, "hidden_act", json_object_to_json_string(v), "a SiLU-gated feed-forward (\"silu\")");
    HP_TRY(get_bool(c, "attention_bias", 0, &b));
    if (b) return unsupported(c, "attention_bias", "true", "q/k/v/o projections without bias");
    HP_TRY(get_bool(c, "mlp_bias", 0, &b));
    if (b) return unsupported(c, "mlp_bias", "true", "feed-forward projections without bias");
    HP_TRY(get_bool(c, "use_sliding_window", 0, &b));
    if (b) return unsupported(c, "use_sliding_window", "true", "full causal attention in every layer");
    /* LlamaForCausalLM has no sliding window; a llama config.json with one is a Mistral-style
     * model saved under model_type llama. Qwen3 keeps sliding_window set with
     * use_sliding_window false, where HF ignores it. */
    if (llama && (v = get(c->o, "sliding_window")))
        return unsupported(c, "sliding_window", json_object_to_json_string(v), "full causal attention in every layer");
    if ((v = get(c->o, "layer_types"))) {
        if (!json_object_is_type(v, json_type_array))
            return hp_error(HP_ERR_FORMAT, "%s: 'layer_types' expects an array of strings", c->path);
        for (size_t i = 0; i < json_object_array_length(v); i++) {
            json_object *e = json_object_array_get_idx(v, i);
            if (!e || !json_object_is_type(e, json_type_string) ||
                strcmp(json_object_get_string(e), "full_attention") != 0) {
                char key[64];
                snprintf(key, sizeof key, "layer_types[%zu]", i);
                return unsupported(c, key, e ? json_object_to_json_string(e) : "null",
                                   "full causal attention in every layer (\"full_attention\")");
            }
        }
    }
    double drop = 0;
    HP_TRY(get_num(c, c->o, "attention_dropout", 0, 0.0, 0.0, 1.0, &drop));
    if (drop != 0.0) {
        char bb[64];
        snprintf(bb, sizeof bb, "%g", drop);
        return unsupported(c, "attention_dropout", bb, "no attention dropout (0.0, as TorchTitan)");
    }
    return HP_OK;
}

/* --- mixture of experts (owner moe): Qwen3MoeConfig's routing keys. decoder_sparse_step 1 and
 * mlp_only_layers [0, k) (dense first layers) are the layouts the qwen3_moe model has. */
static hp_status_t read_qwen3_moe(const cfg_t *c, hp_model_config_t *mc) {
    int64_t ne = 0, k = 0, mh = 0, step = 1;
    int norm = 0;
    /* transformers 5 writes num_local_experts (its attribute map of num_experts), 4.x num_experts */
    HP_TRY(get_int(c, get(c->o, "num_experts") ? "num_experts" : "num_local_experts", 1, 0, 1, 1 << 16, &ne));
    HP_TRY(get_int(c, "num_experts_per_tok", 1, 0, 1, ne, &k));
    HP_TRY(get_int(c, "moe_intermediate_size", 1, 0, 1, HP_MODEL_MAX_DIM, &mh));
    HP_TRY(get_int(c, "decoder_sparse_step", 0, 1, 1, HP_MODEL_MAX_LAYERS, &step));
    HP_TRY(get_bool(c, "norm_topk_prob", 0, &norm));
    if (step != 1) {
        char b[32];
        snprintf(b, sizeof b, "%lld", (long long)step);
        return unsupported(c, "decoder_sparse_step", b, "MoE in every layer after the mlp_only_layers (1)");
    }
    int dense = 0;
    json_object *v = get(c->o, "mlp_only_layers");
    if (v && !json_object_is_type(v, json_type_array))
        return hp_error(HP_ERR_FORMAT, "%s: 'mlp_only_layers' expects an array of layer indices", c->path);
    for (size_t i = 0; v && i < json_object_array_length(v); i++) {
        json_object *e = json_object_array_get_idx(v, i);
        if (!e || !json_object_is_type(e, json_type_int) || json_object_get_int64(e) != (int64_t)i) {
            char key[64];
            snprintf(key, sizeof key, "mlp_only_layers[%zu]", i);
            return unsupported(c, key, e ? json_object_to_json_string(e) : "null",
                               "the first layers dense, in order (0, 1, ..., as model.moe_n_dense_layers)");
        }
        dense++;
    }
    mc->moe_experts = (int)ne;
    mc->moe_top_k = (int)k;
    mc->moe_hidden = (int)mh;
    mc->moe_route_norm = norm;
    mc->moe_n_dense_layers = dense;
    return HP_OK;
}
/* --- end --- */

/* --- DeepseekV3Config: MLA sizes, routing, YaRN. HF always routes with a sigmoid
 * (scoring_func / topk_method, when present, must say so) and applies YaRN whenever rope_type is
 * "yarn"; the model applies it when max_seq_len > the original context, and scales the softmax
 * by mscale^2 with HF's attention_factor 1 (mscale == mscale_all_dim). --- */
static hp_status_t read_deepseek_v3(const cfg_t *c, hp_model_config_t *mc, int64_t maxpos) {
    int64_t ne, k, mh, sh, dense, ng, tg, ql = 0, kvl, nope, rope, v;
    int norm = 0, il = 1;
    double rsf = 1.0;
    HP_TRY(get_int(c, "n_routed_experts", 1, 0, 1, 1 << 16, &ne));
    HP_TRY(get_int(c, "num_experts_per_tok", 1, 0, 1, ne, &k));
    HP_TRY(get_int(c, "moe_intermediate_size", 1, 0, 1, HP_MODEL_MAX_DIM, &mh));
    HP_TRY(get_int(c, "n_shared_experts", 0, 1, 1, 64, &sh));
    HP_TRY(get_int(c, "first_k_dense_replace", 0, 0, 0, HP_MODEL_MAX_LAYERS, &dense));
    HP_TRY(get_int(c, "n_group", 0, 1, 1, ne, &ng));
    HP_TRY(get_int(c, "topk_group", 0, ng, 1, ng, &tg));
    HP_TRY(get_bool(c, "norm_topk_prob", 0, &norm));
    HP_TRY(get_num(c, c->o, "routed_scaling_factor", 0, 1.0, 1e-6, 1e6, &rsf));
    HP_TRY(get_int(c, "q_lora_rank", 0, 0, 0, HP_MODEL_MAX_DIM, &ql));   /* null: a full q_proj */
    HP_TRY(get_int(c, "kv_lora_rank", 1, 0, 1, HP_MODEL_MAX_DIM, &kvl));
    HP_TRY(get_int(c, "qk_nope_head_dim", 1, 0, 0, 512, &nope));
    HP_TRY(get_int(c, "qk_rope_head_dim", 1, 0, 2, 512, &rope));
    HP_TRY(get_int(c, "v_head_dim", 1, 0, 1, 512, &v));
    HP_TRY(get_bool(c, "rope_interleave", 1, &il));
    if (!il) return unsupported(c, "rope_interleave", "false", "interleaved RoPE pairs (true, TorchTitan's layout)");
    const char *fixed[2][2] = {{"scoring_func", "sigmoid"}, {"topk_method", "noaux_tc"}};
    for (int i = 0; i < 2; i++) {
        json_object *x = get(c->o, fixed[i][0]);
        if (x && (!json_object_is_type(x, json_type_string) || strcmp(json_object_get_string(x), fixed[i][1]) != 0))
            return unsupported(c, fixed[i][0], json_object_to_json_string(x), fixed[i][1]);
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
    json_object *rp = get(c->o, "rope_parameters"), *rs = get(c->o, "rope_scaling");
    const char *rkey = rp ? "rope_parameters" : "rope_scaling";
    json_object *r = rp ? rp : rs;
    double theta = 10000.0;
    HP_TRY(get_num(c, c->o, "rope_theta", 0, theta, 1.0, 1e12, &theta));
    if (r) HP_TRY(get_num(c, r, "rope_theta", 0, theta, 1.0, 1e12, &theta));
    mc->rope_theta = (float)theta;
    mc->rope_scaling = 0;
    json_object *t = r ? get(r, "rope_type") : NULL;
    if (r && !t) t = get(r, "type");
    const char *type = t && json_object_is_type(t, json_type_string) ? json_object_get_string(t) : "default";
    char key[64];
    if (!strcmp(type, "default")) {   /* no YaRN: the model's condition max_seq_len > original is false */
        mc->rope_original_max_pos = (int)maxpos;
        return HP_OK;
    }
    snprintf(key, sizeof key, "%s.rope_type", rkey);
    if (strcmp(type, "yarn") != 0) {
        char b[300];
        snprintf(b, sizeof b, "'%.200s'", type);
        return unsupported(c, key, b, "plain RoPE (\"default\") or DeepSeek's \"yarn\"");
    }
    cfg_t rc = {c->path, r};
    double f, bf = 32, bs = 1, ms = 1, msa = 0, af = 0;
    int64_t orig;
    HP_TRY(get_num(c, r, "factor", 1, 0, 1e-6, 1e6, &f));
    HP_TRY(get_num(c, r, "beta_fast", 0, bf, 1e-6, 1e6, &bf));
    HP_TRY(get_num(c, r, "beta_slow", 0, bs, 1e-6, 1e6, &bs));
    HP_TRY(get_num(c, r, "mscale", 0, ms, 0, 1e6, &ms));
    HP_TRY(get_num(c, r, "mscale_all_dim", 0, msa, 0, 1e6, &msa));
    HP_TRY(get_num(c, r, "attention_factor", 0, 0, 0, 1e6, &af));
    HP_TRY(get_int(&rc, "original_max_position_embeddings", 1, 0, 1, HP_MODEL_MAX_SEQ_LEN, &orig));
    snprintf(key, sizeof key, "%s.mscale_all_dim", rkey);
    if (msa != ms || !(ms > 0) || (af != 0 && af != 1)) {
        char b[128];
        snprintf(b, sizeof b, "%g (mscale %g, attention_factor %g)", msa, ms, af);
        return unsupported(c, key, b, "mscale_all_dim == mscale > 0 (HF's attention_factor 1 and the softmax scale "
                           "x mscale^2, TorchTitan's deepseek_v3)");
    }
    if (maxpos <= orig) {
        char b[128];
        snprintf(b, sizeof b, "%lld with original_max_position_embeddings %lld", (long long)maxpos, (long long)orig);
        return unsupported(c, "max_position_embeddings", b, "a context above the original one (TorchTitan applies "
                           "YaRN only then; HF always does)");
    }
    mc->rope_factor = (float)f;
    mc->rope_beta_fast = (float)bf;
    mc->rope_beta_slow = (float)bs;
    mc->mla_mscale = (float)ms;
    mc->rope_original_max_pos = (int)orig;
    return HP_OK;
}
/* --- end --- */

hp_status_t hp_hf_read_config(const char *dir, hp_model_config_t *out) {
    if (!dir || !out) return hp_error(HP_ERR_INVALID_ARG, "hp_hf_read_config: NULL argument");
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (access(path, R_OK) != 0)
        return hp_error(HP_ERR_NOT_FOUND, "HF checkpoint %s has no readable config.json; expected the config.json that "
                        "transformers' save_pretrained writes beside the weights; hint: copy it from the model's "
                        "folder, or describe the model with a flavor and model.* keys", dir);
    json_object *o = json_object_from_file(path);
    cfg_t c = {path, o};
    hp_status_t s = HP_OK;
    if (!o || !json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        return hp_error(HP_ERR_FORMAT, "%s: not a JSON object; expected transformers' config.json", path);
    }
    int64_t vocab = 0, hidden = 0, layers = 0, heads = 0, kv = 0, hd = 0, inter = 0, maxpos = 0;
    /* vocab_size first: hp-ckpt's messages for it predate this reader */
    s = get_int(&c, "vocab_size", 1, 0, 1, HP_MODEL_MAX_VOCAB, &vocab);
    json_object *mt = s == HP_OK ? get(o, "model_type") : NULL;
    const char *mts = mt && json_object_is_type(mt, json_type_string) ? json_object_get_string(mt) : NULL;
    if (s == HP_OK && !mts)
        s = hp_error(HP_ERR_FORMAT, "%s: 'model_type' is %s; expected the string \"llama\" or \"qwen3\"", path,
                     mt ? "not a string" : "missing");
    int llama = mts && !strcmp(mts, "llama");
    const int qmoe = mts && !strcmp(mts, "qwen3_moe");   /* mixture of experts (owner moe) */
    const int ds = mts && !strcmp(mts, "deepseek_v3");
    if (s == HP_OK && !llama && !qmoe && !ds && strcmp(mts, "qwen3") != 0) {
        char b[300];
        snprintf(b, sizeof b, "'%.200s'", mts);
        s = unsupported(&c, "model_type", b, "the architectures LlamaForCausalLM (\"llama\"), Qwen3ForCausalLM "
                        "(\"qwen3\"), Qwen3MoeForCausalLM (\"qwen3_moe\") and DeepseekV3ForCausalLM (\"deepseek_v3\")");
    }
    hp_model_config_t mc;
    if (s == HP_OK)
        s = hp_model_flavor(llama ? "llama3" : qmoe ? "qwen3_moe" : ds ? "deepseek_v3" : "qwen3", "debugmodel", &mc);
    if (s == HP_OK && qmoe) s = read_qwen3_moe(&c, &mc);
    if (s == HP_OK) s = refuse_unsupported(&c, llama);
    if (s == HP_OK) s = get_int(&c, "hidden_size", 1, 0, 1, HP_MODEL_MAX_DIM, &hidden);
    if (s == HP_OK) s = get_int(&c, "num_hidden_layers", 1, 0, 1, HP_MODEL_MAX_LAYERS, &layers);
    if (s == HP_OK) s = get_int(&c, "num_attention_heads", 1, 0, 1, HP_MODEL_MAX_HEADS, &heads);
    if (s == HP_OK) s = get_int(&c, "num_key_value_heads", 0, heads, 1, HP_MODEL_MAX_HEADS, &kv);
    if (s == HP_OK) s = get_int(&c, "head_dim", 0, heads ? hidden / heads : 0, 2, 512, &hd);
    if (s == HP_OK) s = get_int(&c, "intermediate_size", 1, 0, 1, HP_MODEL_MAX_DIM, &inter);
    /* HF's defaults: LlamaConfig 2048, Qwen3Config 32768 */
    if (s == HP_OK) s = get_int(&c, "max_position_embeddings", 0, llama ? 2048 : 32768, 1, HP_MODEL_MAX_SEQ_LEN, &maxpos);
    if (s == HP_OK && heads % kv != 0)
        s = hp_error(HP_ERR_FORMAT, "%s: 'num_attention_heads' = %lld is not a multiple of 'num_key_value_heads' = %lld",
                     path, (long long)heads, (long long)kv);
    if (s == HP_OK && get(o, "head_dim") == NULL && hidden % heads != 0)
        s = hp_error(HP_ERR_FORMAT, "%s: no 'head_dim', and 'hidden_size' = %lld is not divisible by "
                     "'num_attention_heads' = %lld", path, (long long)hidden, (long long)heads);
    if (s == HP_OK && hd % 2 != 0)
        s = hp_error(HP_ERR_FORMAT, "%s: head_dim %lld must be even (RoPE rotates pairs of channels)", path, (long long)hd);
    double eps = 1e-6;   /* LlamaConfig and Qwen3Config default */
    if (s == HP_OK) s = get_num(&c, o, "rms_norm_eps", 0, eps, 1e-30, 1.0, &eps);
    if (s == HP_OK) s = ds ? read_deepseek_v3(&c, &mc, maxpos) : read_rope(&c, &mc);
    int tie = 0;
    if (s == HP_OK) s = get_bool(&c, "tie_word_embeddings", 0, &tie);
    json_object_put(o);
    if (s != HP_OK) return s;
    snprintf(mc.flavor, sizeof mc.flavor, "config.json");
    mc.dim = (int)hidden;
    mc.n_layers = (int)layers;
    mc.n_heads = (int)heads;
    mc.n_kv_heads = (int)kv;
    mc.head_dim = (int)hd;
    mc.hidden_dim = (int)inter;   /* explicit: HF has no multiple_of rule */
    mc.multiple_of = 0;
    mc.ffn_dim_multiplier = 0;
    mc.vocab_size = (int)vocab;
    mc.norm_eps = (float)eps;
    mc.qk_norm = !llama && !ds;
    if (ds) mc.n_kv_heads = mc.head_dim = 0;   /* MLA: derived (HF's head_dim is the RoPE width) */
    mc.tie_embeddings = tie;
    mc.max_seq_len = (int)maxpos;
    s = hp_model_config_validate(&mc);
    if (s != HP_OK) return hp_error_prefix(s, "%s: ", path);
    *out = mc;
    return HP_OK;
}

int hp_hf_config_diff(const hp_model_config_t *hf, const hp_model_config_t *mc, char *msg, size_t msg_n, char *flags,
                      size_t flags_n) {
    int n = 0;
    size_t lm = 0, lf = 0;
    if (msg_n) msg[0] = 0;
    if (flags_n) flags[0] = 0;
#define ADD(hfkey, key, hfv, mcv)                                                                              \
    do {                                                                                                       \
        n++;                                                                                                   \
        if (lm < msg_n)                                                                                        \
            lm += (size_t)snprintf(msg + lm, msg_n - lm, "%sconfig.json '%s' = %s (model.%s = %s)", n > 1 ? ", " : "", \
                                   hfkey, hfv, key, mcv);                                                      \
        if (lf < flags_n) lf += (size_t)snprintf(flags + lf, flags_n - lf, "%s--model.%s %s", n > 1 ? " " : "", key, hfv); \
    } while (0)
    char a[64], b[64];
    /* 0 llama, 1 qwen3, 2 qwen3_moe (owner moe) */
    /* 3 deepseek_v3 */
    int hl = hf->mla ? 3 : !strcmp(hf->name, "qwen3_moe") ? 2 : !strcmp(hf->name, "qwen3"),
        ml = mc->mla ? 3 : !strcmp(mc->name, "qwen3_moe") ? 2 : !strcmp(mc->name, "qwen3");
    if (hl != ml) {
        n++;
        if (lm < msg_n)
            lm += (size_t)snprintf(msg + lm, msg_n - lm, "%sconfig.json 'model_type' = '%s' (model.name = %s)",
                                   n > 1 ? ", " : "", hl == 3 ? "deepseek_v3" : hl == 2 ? "qwen3_moe" : hl ? "qwen3" : "llama",
                                   mc->name);
        if (lf < flags_n) lf += (size_t)snprintf(flags + lf, flags_n - lf, "%s--model %s", n > 1 ? " " : "", hf->name);
    }
/* field f, named config key `key` (the field's own name by INT_F / FLT_F) */
#define INT_KF(hfkey, key, f)                              \
    if (hf->f != mc->f) {                                  \
        snprintf(a, sizeof a, "%d", hf->f);                \
        snprintf(b, sizeof b, "%d", mc->f);                \
        ADD(hfkey, key, a, b);                             \
    }
#define FLT_KF(hfkey, key, f)                              \
    if (hf->f != mc->f) {                                  \
        snprintf(a, sizeof a, "%.9g", (double)hf->f);      \
        snprintf(b, sizeof b, "%.9g", (double)mc->f);      \
        ADD(hfkey, key, a, b);                             \
    }
#define INT_F(hfkey, f) INT_KF(hfkey, #f, f)
#define FLT_F(hfkey, f) FLT_KF(hfkey, #f, f)
#define BOOL_F(hfkey, f)                                   \
    if (!hf->f != !mc->f) {                                \
        snprintf(a, sizeof a, "%s", hf->f ? "true" : "false"); \
        snprintf(b, sizeof b, "%s", mc->f ? "true" : "false"); \
        ADD(hfkey, #f, a, b);                              \
    }
    INT_F("hidden_size", dim);
    INT_F("num_hidden_layers", n_layers);
    INT_F("num_attention_heads", n_heads);
    INT_F("num_key_value_heads", n_kv_heads);
    INT_F("head_dim", head_dim);
    INT_F("intermediate_size", hidden_dim);
    INT_F("vocab_size", vocab_size);
    FLT_F("rms_norm_eps", norm_eps);
    FLT_F("rope_theta", rope_theta);
    BOOL_F("rope_scaling", rope_scaling);
    if (hf->rope_scaling && mc->rope_scaling) {
        FLT_F("rope_scaling.factor", rope_factor);
        FLT_F("rope_scaling.low_freq_factor", rope_low_freq_factor);
        FLT_F("rope_scaling.high_freq_factor", rope_high_freq_factor);
        INT_F("rope_scaling.original_max_position_embeddings", rope_original_max_pos);
    }
    BOOL_F("tie_word_embeddings", tie_embeddings);
    if (hl == 2 && ml == 2) {   /* mixture of experts (owner moe): the config keys' names */
        INT_KF("num_experts", "moe_num_experts", moe_experts);
        INT_F("num_experts_per_tok", moe_top_k);
        INT_KF("moe_intermediate_size", "moe_hidden_dim", moe_hidden);
        INT_F("norm_topk_prob", moe_route_norm);
        INT_F("mlp_only_layers (count)", moe_n_dense_layers);
    }
    if (hl == 3 && ml == 3) {   /* DeepseekV3Config's names */
        INT_KF("n_routed_experts", "moe_num_experts", moe_experts);
        INT_F("num_experts_per_tok", moe_top_k);
        INT_KF("moe_intermediate_size", "moe_hidden_dim", moe_hidden);
        INT_KF("n_shared_experts", "moe_num_shared_experts", moe_shared_experts);
        INT_F("first_k_dense_replace", moe_n_dense_layers);
        INT_KF("n_group", "moe_n_expert_groups", moe_expert_groups);
        INT_KF("topk_group", "moe_n_limited_groups", moe_limited_groups);
        INT_F("norm_topk_prob", moe_route_norm);
        FLT_F("routed_scaling_factor", moe_route_scale);
        INT_KF("scoring_func (sigmoid)", "moe_score_func", moe_score_fn);
        INT_F("q_lora_rank", q_lora_rank);
        INT_F("kv_lora_rank", kv_lora_rank);
        INT_F("qk_nope_head_dim", qk_nope_head_dim);
        INT_F("qk_rope_head_dim", qk_rope_head_dim);
        INT_F("v_head_dim", v_head_dim);
        if (hp_model_mla_yarn(hf) != hp_model_mla_yarn(mc)) {
            snprintf(a, sizeof a, "%s", hp_model_mla_yarn(hf) ? "yarn" : "default");
            snprintf(b, sizeof b, "%s", hp_model_mla_yarn(mc) ? "yarn" : "default");
            ADD("rope_parameters.rope_type", "max_seq_len / rope_original_max_pos", a, b);
        } else if (hp_model_mla_yarn(hf)) {
            FLT_F("rope_parameters.factor", rope_factor);
            FLT_F("rope_parameters.mscale", mla_mscale);
            FLT_F("rope_parameters.beta_fast", rope_beta_fast);
            FLT_F("rope_parameters.beta_slow", rope_beta_slow);
            INT_F("rope_parameters.original_max_position_embeddings", rope_original_max_pos);
        }
    }
    if (hl == ml) BOOL_F("model_type (q/k norm)", qk_norm);
#undef INT_F
#undef FLT_F
#undef INT_KF
#undef FLT_KF
#undef BOOL_F
#undef ADD
    return n;
}
