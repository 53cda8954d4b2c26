/* Model weights file (hp_model_save_weights / hp_model_load_weights): one safetensors file
 * with every parameter in f32, each MoE layer's expert_bias, and the model config in its
 * __metadata__, so hp-generate can rebuild the model from the file alone (its family's flavor
 * from the registry, then the metadata's fields), or from an HF directory. Metadata values are
 * range-checked before any allocation; non-finite weights are refused by name. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/checkpoint.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/nn.h"
#include "hyperparallel/parse.h"
#include "hyperparallel/safetensors.h"

/* Integer fields carry the range hp_model_config_validate accepts, so a file's metadata is
 * refused by name before any allocation (max_seq_len 1e9 would fail in malloc). */
#define META_INT(field, lo, hi) {#field, offsetof(hp_model_config_t, field), 'i', lo, hi}
#define META_FLT(field) {#field, offsetof(hp_model_config_t, field), 'f', 0, 0}

typedef struct { const char *key; size_t offset; char kind; int32_t min, max; } meta_field_t;

static const meta_field_t meta_fields[] = {
    META_INT(dim, 1, HP_MODEL_MAX_DIM), META_INT(n_layers, 1, HP_MODEL_MAX_LAYERS),
    META_INT(n_heads, 1, HP_MODEL_MAX_HEADS), META_INT(n_kv_heads, 0, HP_MODEL_MAX_HEADS),
    META_INT(head_dim, 0, HP_MODEL_MAX_DIM), META_INT(vocab_size, 1, HP_MODEL_MAX_VOCAB),
    META_INT(hidden_dim, 0, HP_MODEL_MAX_DIM), META_INT(multiple_of, 0, HP_MODEL_MAX_DIM), META_FLT(ffn_dim_multiplier),
    META_FLT(norm_eps), META_FLT(rope_theta), META_INT(rope_scaling, 0, 1), META_FLT(rope_factor),
    META_FLT(rope_low_freq_factor), META_FLT(rope_high_freq_factor), META_INT(rope_original_max_pos, 0, INT32_MAX),
    META_INT(qk_norm, 0, 1), META_INT(tie_embeddings, 0, 1), META_INT(max_seq_len, 1, HP_MODEL_MAX_SEQ_LEN),
};
#define N_META_FIELDS ((int)(sizeof meta_fields / sizeof meta_fields[0]))

/* The MoE sizes: written for MoE models only; a file without them keeps the flavor's (files
 * written before these keys existed). */
static const meta_field_t meta_moe_fields[] = {
    META_INT(moe_experts, 0, HP_MOE_MAX_EXPERTS), META_INT(moe_top_k, 0, HP_MOE_MAX_EXPERTS),
    META_INT(moe_hidden, 0, HP_MODEL_MAX_DIM), META_INT(moe_shared_experts, 0, 64), META_INT(moe_score_fn, 0, 1),
    META_INT(moe_route_norm, 0, 1), META_FLT(moe_route_scale), META_INT(moe_score_before_experts, 0, 1),
    META_INT(moe_expert_groups, 0, HP_MOE_MAX_EXPERTS), META_INT(moe_limited_groups, 0, HP_MOE_MAX_EXPERTS),
    META_INT(moe_n_dense_layers, 0, HP_MODEL_MAX_LAYERS), META_FLT(moe_load_balance_coeff), META_FLT(moe_aux_loss_coeff),
};
#define N_META_MOE ((int)(sizeof meta_moe_fields / sizeof meta_moe_fields[0]))

/* The MLA sizes, YaRN and norm eps: written for MLA models only; a file without them keeps the
 * flavor's (files written before these keys existed). */
static const meta_field_t meta_mla_fields[] = {
    META_INT(q_lora_rank, 0, HP_MODEL_MAX_DIM), META_INT(kv_lora_rank, 1, HP_MODEL_MAX_DIM),
    META_INT(qk_nope_head_dim, 0, 512), META_INT(qk_rope_head_dim, 2, 512), META_INT(v_head_dim, 1, 512),
    META_FLT(mla_mscale), META_FLT(rope_beta_fast), META_FLT(rope_beta_slow), META_FLT(mla_norm_eps),
};
#define N_META_MLA ((int)(sizeof meta_mla_fields / sizeof meta_mla_fields[0]))
#define N_META_ALL (N_META_FIELDS + N_META_MOE + N_META_MLA)

static const meta_field_t *meta_field(int i) {
    return i < N_META_FIELDS ? &meta_fields[i]
           : i < N_META_FIELDS + N_META_MOE ? &meta_moe_fields[i - N_META_FIELDS]
                                            : &meta_mla_fields[i - N_META_FIELDS - N_META_MOE];
}

/* Whether the metadata field i applies to the model (the MoE and MLA ones to those models). */
static int meta_applies(int i, const hp_model_config_t *c) {
    return i < N_META_FIELDS || (i < N_META_FIELDS + N_META_MOE ? c->moe_experts > 0 : c->mla);
}

/* The model's parameters, then each MoE layer's expert_bias as "layers.N.moe.expert_bias" (the
 * trainer's checkpoint name, which the HF adapters map: DeepSeek-V3's
 * mlp.gate.e_score_correction_bias), viewing the MoE module's own storage: the list that the
 * weights file and an HF import fill, so the routing keeps its selection bias. *out: caller
 * frees (hp_calloc'd); *n its length. */
static hp_status_t state_list(hp_model_t m, hp_param_t **out, int *n) {
    const int np = hp_model_num_params(m), nm = hp_model_modules(m, NULL, 0);
    hp_module_t **mods = hp_calloc((size_t)nm + 1, sizeof *mods);
    hp_param_t *l = hp_calloc((size_t)(np + nm) + 1, sizeof *l);
    if (!mods || !l) {
        free(mods);
        free(l);
        return HP_ERR_OOM;
    }
    memcpy(l, hp_model_params(m), sizeof(hp_param_t) * (size_t)np);
    hp_model_modules(m, mods, nm);
    int k = np;
    hp_status_t s = HP_OK;
    for (int i = 0; s == HP_OK && i < nm; i++) {
        if (!hp_module_is_moe(mods[i])) continue;
        hp_moe_impl_t *M = mods[i]->impl;
        if (!M->expert_bias) continue;
        const int64_t shape[1] = {M->c.n_experts};
        if (snprintf(l[k].name, sizeof l[k].name, "%.*s.expert_bias", (int)(sizeof l[k].name - 13), mods[i]->name) >=
            (int)sizeof l[k].name)
            s = hp_error(HP_ERR_STATE, "MoE module '%s': its expert_bias name is too long", mods[i]->name);
        if (s == HP_OK) s = hp_tensor_init(&l[k].value.local, HP_F32, 1, shape, M->expert_bias);
        l[k].value.global_shape[0] = M->c.n_experts;
        k++;
    }
    free(mods);
    if (s != HP_OK) {
        free(l);
        return s;
    }
    *out = l;
    *n = k;
    return HP_OK;
}

hp_status_t hp_model_save_weights(hp_model_t m, const char *path) {
    const hp_model_config_t *cfg = hp_model_config(m);
    int np = 0;
    hp_param_t *params = NULL;
    HP_TRY(state_list(m, &params, &np));
    hp_st_entry_t *entries = hp_calloc((size_t)np + 1, sizeof *entries);
    char (*vals)[64] = hp_calloc(N_META_ALL, 64);
    const char **meta = hp_calloc(2 * (N_META_ALL + 3), sizeof(char *));
    if (!entries || !vals || !meta) {
        free(params); free(entries); free(vals); free(meta);
        return HP_ERR_OOM;
    }
    for (int i = 0; i < np; i++) {
        entries[i].name = params[i].name;
        entries[i].tensor = &params[i].value.local;
        entries[i].dtype = hp_st_dtype_from_hp(HP_F32);
    }
    int k = 0;
    meta[k++] = "format"; meta[k++] = "hyperparallel-weights";
    meta[k++] = "model.name"; meta[k++] = cfg->name;
    meta[k++] = "model.flavor"; meta[k++] = cfg->flavor;
    for (int i = 0; i < N_META_ALL; i++) {
        if (!meta_applies(i, cfg)) continue;
        const meta_field_t *f = meta_field(i);
        const char *base = (const char *)cfg + f->offset;
        if (f->kind == 'i') snprintf(vals[i], 64, "%d", *(const int *)base);
        else snprintf(vals[i], 64, "%.9g", *(const float *)base);
        meta[k++] = f->key;
        meta[k++] = vals[i];
    }
    hp_status_t s = hp_safetensors_write(path, entries, np, meta, k / 2);
    free(params); free(entries); free(vals); free(meta);
    return s;
}

/* The positions to build a model for: max_seq_len when given (at most the model's context),
 * else the context, capped at 4096 for an HF directory when `cap` (its RoPE table and
 * activations; a context of Llama 3.1's 131072 would cost GBs before any token). */
static int build_len(int max_seq_len, const hp_model_config_t *cfg, int cap) {
    if (max_seq_len > 0) return max_seq_len < cfg->max_seq_len ? max_seq_len : cfg->max_seq_len;
    return cap && cfg->max_seq_len > 4096 ? 4096 : cfg->max_seq_len;
}

/* An HF directory: the model from its config.json, the weights and each MoE layer's selection
 * bias through hp_hf_import. The config keeps max_position_embeddings as max_seq_len, the
 * context that decides DeepSeek-V3's YaRN (hp_model_mla_yarn) and hp-generate's window; the
 * model is built for build_len positions. */
static hp_status_t load_hf_dir(const char *dir, int max_batch, int max_seq_len, hp_model_t *out) {
    hp_model_config_t cfg;
    HP_TRY(hp_hf_read_config(dir, &cfg));
    hp_model_t m = NULL;
    HP_TRY(hp_model_create(&cfg, max_batch, build_len(max_seq_len, &cfg, 1), &m));
    hp_param_t *list = NULL;
    int n = 0;
    hp_status_t s = state_list(m, &list, &n);
    if (s == HP_OK) s = hp_hf_import(dir, hp_model_hf_adapter(&cfg), &cfg, list, n, NULL);
    free(list);
    if (s != HP_OK) {
        hp_model_destroy(m);
        return s;
    }
    *out = m;
    return HP_OK;
}

hp_status_t hp_model_load_weights(const char *path, int max_batch, int max_seq_len, hp_model_t *out) {
    *out = NULL;
    if (hp_hf_is_hf_dir(path)) return load_hf_dir(path, max_batch, max_seq_len, out);
    hp_safetensors_t st = NULL;
    HP_TRY(hp_safetensors_open(path, &st));
    hp_status_t s = HP_OK;
    const char *fmt = hp_safetensors_metadata(st, "format");
    const char *name = hp_safetensors_metadata(st, "model.name");
    const char *flavor = hp_safetensors_metadata(st, "model.flavor");
    if (!fmt || strcmp(fmt, "hyperparallel-weights") != 0 || !name || !flavor) {
        hp_safetensors_close(st);
        return hp_error(HP_ERR_FORMAT, "%s: not a weights file written by hp-train (its __metadata__ lacks "
                                       "format=hyperparallel-weights and model.name/flavor)", path);
    }
    hp_model_config_t cfg;
    /* a model described by its fields rather than a preset (an HF config.json's, flavor
     * "config.json"; hp-train with model.flavor = hf): the family's debugmodel, then the
     * metadata's fields, as hp_hf_read_config builds it */
    const hp_model_spec_t *fam = hp_model_spec_find(name);
    hp_model_config_t probe;
    const int preset = !fam || fam->flavor(flavor, &probe);
    s = hp_model_flavor(name, preset ? flavor : "debugmodel", &cfg);
    if (s == HP_OK && !preset) snprintf(cfg.flavor, sizeof cfg.flavor, "%s", flavor);
    for (int i = 0; s == HP_OK && i < N_META_ALL; i++) {
        const meta_field_t *f = meta_field(i);
        const char *v = hp_safetensors_metadata(st, f->key);
        if (!v && i >= N_META_FIELDS) continue;   /* optional: the flavor's MoE / MLA settings */
        if (!v) {
            s = hp_error(HP_ERR_FORMAT, "%s: __metadata__ lacks '%s'", path, f->key);
            break;
        }
        char *base = (char *)&cfg + f->offset;
        char what[4200];
        snprintf(what, sizeof what, "%s: __metadata__ '%s'", path, f->key);
        int32_t iv;
        if (f->kind == 'i') {
            s = hp_parse_i32(what, v, f->min, f->max,
                             "the model dimension limits are HP_MODEL_MAX_* in model.h; is the file damaged?", &iv);
            if (s == HP_OK) *(int *)base = iv;
        } else {
            s = hp_parse_f32(what, v, -HUGE_VAL, HUGE_VAL, NULL, (float *)base);
        }
        if (s != HP_OK) s = HP_ERR_FORMAT;   /* the message stays; a bad file is a format error */
    }
    if (s == HP_OK) s = hp_model_config_validate(&cfg);
    hp_model_t m = NULL;
    /* the training context (cfg.max_seq_len, which decides YaRN) stays; the model is built
     * for at most it */
    if (s == HP_OK) s = hp_model_create(&cfg, max_batch, build_len(max_seq_len, &cfg, 0), &m);
    hp_param_t *params = NULL;
    int np = 0;
    if (s == HP_OK) s = state_list(m, &params, &np);
    for (int i = 0; s == HP_OK && i < np; i++) {
        const hp_st_info_t *info = NULL;
        if (i >= hp_model_num_params(m) && hp_safetensors_find(st, params[i].name, &info) != HP_OK) {
            hp_clear_error();   /* a file from before expert_bias was saved: zeros (such files dropped it) */
            continue;
        }
        s = hp_safetensors_read(st, params[i].name, &params[i].value.local, 1);
        int64_t first, bad = s == HP_OK ? hp_tensor_count_nonfinite(&params[i].value.local, &first) : 0;
        if (bad) /* damaged weights would generate garbage with exit 0 */
            s = hp_error(HP_ERR_FORMAT, "%s: tensor '%s' has %lld non-finite value(s) (NaN or inf) of %lld, "
                         "the first at flat index %lld; expected finite weights (the file is damaged or "
                         "training diverged: use an earlier checkpoint)", path, params[i].name, (long long)bad,
                         (long long)hp_tensor_numel(&params[i].value.local), (long long)first);
    }
    /* A tensor the model does not have is ignored, but not silently. */
    for (int k = 0; s == HP_OK && k < hp_safetensors_count(st); k++) {
        const char *tn = hp_safetensors_info(st, k)->name;
        int known = 0;
        for (int i = 0; !known && i < np; i++) known = !strcmp(tn, params[i].name);
        if (!known)
            hp_log(HP_LOG_WARN, "%s: tensor '%s' is not a parameter of the %s/%s model; ignored", path, tn,
                   name, flavor);
    }
    hp_safetensors_close(st);
    free(params);
    if (s != HP_OK) {
        hp_model_destroy(m);
        return s;
    }
    *out = m;
    return HP_OK;
}
