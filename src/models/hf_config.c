/* HF config.json <-> model config, the part every family shares: the typed JSON readers, the
 * keys every LlamaConfig-style class has (each field the project cannot reproduce refused by
 * name), the family found by model_type through the registry, the comparison of two model
 * configs field by field (a flavor against a checkpoint's config.json; docs/checkpoint.md) and
 * the common keys of the config.json a family writes. A family's own keys come through its
 * hooks (struct hp_model_hf_config, models-impl.h; src/models/<family>/state_dict_adapter.c). */
#define _GNU_SOURCE
#include <json-c/json.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyperparallel/parse.h"
#include "models/models-impl.h"

json_object *hfj_get(json_object *o, const char *key) {
    json_object *v = NULL;
    if (!o || !json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null)) return NULL;
    return v;
}

hp_status_t hfj_int(const hfj_t *c, const char *key, int required, int64_t def, int64_t lo, int64_t hi,
                    int64_t *out) {
    json_object *v = hfj_get(c->o, key);
    if (!v) {
        if (required)
            return hp_error(HP_ERR_FORMAT, "%s: '%s' is missing; expected an integer (every %s has it); hint: use the "
                            "config.json saved with the weights", c->path, key,
                            c->cls ? c->cls : "transformers config class");
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

hp_status_t hfj_num(const hfj_t *c, json_object *o, const char *key, int required, double def, double lo,
                    double hi, double *out) {
    json_object *v = hfj_get(o, key);
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

hp_status_t hfj_bool(const hfj_t *c, const char *key, int def, int *out) {
    json_object *v = hfj_get(c->o, key);
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

hp_status_t hfj_unsupported(const hfj_t *c, const char *key, const char *value, const char *expected) {
    return hp_error(HP_ERR_UNSUPPORTED, "%s: '%s' = %s is not supported: the models here have %s; "
                    "hint: this checkpoint needs a model the project does not implement (docs/checkpoint.md "
                    "\"HF config.json\")", c->path, key, value, expected);
}

hp_status_t models_hf_rope_object(const hfj_t *c, json_object **r, const char **rkey, const char **type) {
    json_object *rp = hfj_get(c->o, "rope_parameters"), *rs = hfj_get(c->o, "rope_scaling");
    *rkey = rp ? "rope_parameters" : "rope_scaling";
    *r = rp ? rp : rs;
    *type = "default";
    /* a bare string ("yarn") names a type without its numbers: refused, not read as no scaling */
    if (*r && !json_object_is_type(*r, json_type_object))
        return hp_error(HP_ERR_FORMAT, "%s: '%s' = %.200s: expected an object (or null) such as {\"rope_type\": "
                        "\"yarn\", \"factor\": 40, ...}, got %s; hint: write the rope parameters out as transformers' "
                        "save_pretrained does", c->path, *rkey, json_object_to_json_string(*r),
                        json_type_to_name(json_object_get_type(*r)));
    if (!*r) return HP_OK;
    json_object *t = hfj_get(*r, "rope_type");
    const char *tkey = "rope_type";
    if (!t) t = hfj_get(*r, "type"), tkey = "type";   /* transformers 4's older spelling */
    if (!t) return HP_OK;
    if (!json_object_is_type(t, json_type_string))
        return hp_error(HP_ERR_FORMAT, "%s: '%s.%s' = %.100s: expected a string such as \"default\", \"llama3\" or "
                        "\"yarn\", got %s", c->path, *rkey, tkey, json_object_to_json_string(t),
                        json_type_to_name(json_object_get_type(t)));
    *type = json_object_get_string(t);
    return HP_OK;
}

/* rope_scaling (transformers 4) or rope_parameters (transformers 5): none / "default" or
 * "llama3"; every other type (linear, dynamic, yarn, longrope, ...) changes the frequencies
 * in a way the model does not implement. */
hp_status_t models_hf_read_rope(const hfj_t *c, hp_model_config_t *mc, int64_t max_pos) {
    json_object *r;
    const char *rkey, *type;
    HP_TRY(models_hf_rope_object(c, &r, &rkey, &type));
    double theta = 10000.0;
    HP_TRY(hfj_num(c, c->o, "rope_theta", 0, theta, 1.0, 1e12, &theta));
    if (r) HP_TRY(hfj_num(c, r, "rope_theta", 0, theta, 1.0, 1e12, &theta));
    mc->rope_theta = (float)theta;
    double prf = 1.0;
    HP_TRY(hfj_num(c, c->o, "partial_rotary_factor", 0, prf, 0.0, 1.0, &prf));
    if (r) HP_TRY(hfj_num(c, r, "partial_rotary_factor", 0, prf, 0.0, 1.0, &prf));
    if (prf != 1.0) {
        char b[64];
        snprintf(b, sizeof b, "%g", prf);
        return hfj_unsupported(c, "partial_rotary_factor", b, "RoPE over the whole head (1.0)");
    }
    mc->rope_scaling = 0;
    if (!r || !strcmp(type, "default")) return HP_OK;
    if (strcmp(type, "llama3") != 0) {
        char key[64], b[300];
        snprintf(key, sizeof key, "%s.rope_type", rkey);
        snprintf(b, sizeof b, "'%.200s'", type);
        return hfj_unsupported(c, key, b, "plain RoPE (\"default\") or Llama 3.1's \"llama3\" frequency scaling");
    }
    double f, lo, hi;
    int64_t orig;
    hfj_t rc = {c->path, r, c->cls};
    HP_TRY(hfj_num(c, r, "factor", 1, 0, 1e-6, 1e6, &f));
    HP_TRY(hfj_num(c, r, "low_freq_factor", 1, 0, 1e-6, 1e6, &lo));
    HP_TRY(hfj_num(c, r, "high_freq_factor", 1, 0, 1e-6, 1e6, &hi));
    HP_TRY(hfj_int(&rc, "original_max_position_embeddings", 1, 0, 1, HP_MODEL_MAX_SEQ_LEN, &orig));
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
static hp_status_t refuse_unsupported(const hfj_t *c, int no_sliding_window) {
    json_object *v;
    int b = 0;
    if ((v = hfj_get(c->o, "hidden_act")) &&
        (!json_object_is_type(v, json_type_string) || strcmp(json_object_get_string(v), "silu") != 0))
        return hfj_unsupported(c, "hidden_act", json_object_to_json_string(v), "a SiLU-gated feed-forward (\"silu\")");
    HP_TRY(hfj_bool(c, "attention_bias", 0, &b));
    if (b) return hfj_unsupported(c, "attention_bias", "true", "q/k/v/o projections without bias");
    HP_TRY(hfj_bool(c, "mlp_bias", 0, &b));
    if (b) return hfj_unsupported(c, "mlp_bias", "true", "feed-forward projections without bias");
    HP_TRY(hfj_bool(c, "use_sliding_window", 0, &b));
    if (b) return hfj_unsupported(c, "use_sliding_window", "true", "full causal attention in every layer");
    /* A class without a sliding window (LlamaForCausalLM): a config.json with one is a
     * Mistral-style model saved under its model_type. Qwen3 keeps sliding_window set with
     * use_sliding_window false, where HF ignores it. */
    if (no_sliding_window && (v = hfj_get(c->o, "sliding_window")))
        return hfj_unsupported(c, "sliding_window", json_object_to_json_string(v),
                               "full causal attention in every layer");
    if ((v = hfj_get(c->o, "layer_types"))) {
        if (!json_object_is_type(v, json_type_array))
            return hp_error(HP_ERR_FORMAT, "%s: 'layer_types' expects an array of strings", c->path);
        for (size_t i = 0; i < json_object_array_length(v); i++) {
            json_object *e = json_object_array_get_idx(v, i);
            if (!e || !json_object_is_type(e, json_type_string) ||
                strcmp(json_object_get_string(e), "full_attention") != 0) {
                char key[64];
                snprintf(key, sizeof key, "layer_types[%zu]", i);
                return hfj_unsupported(c, key, e ? json_object_to_json_string(e) : "null",
                                   "full causal attention in every layer (\"full_attention\")");
            }
        }
    }
    double drop = 0;
    HP_TRY(hfj_num(c, c->o, "attention_dropout", 0, 0.0, 0.0, 1.0, &drop));
    if (drop != 0.0) {
        char bb[64];
        snprintf(bb, sizeof bb, "%g", drop);
        return hfj_unsupported(c, "attention_dropout", bb, "no attention dropout (0.0, as TorchTitan)");
    }
    return HP_OK;
}

const models_hf_family_t *models_hf_family(const hp_model_spec_t *sp) {
    return sp ? (const models_hf_family_t *)sp->hf : NULL;   /* the adapter is its first member */
}

/* The family whose HF class has config.json's model_type, or NULL. */
static const hp_model_spec_t *family_of_model_type(const char *model_type) {
    for (int i = 0; i < hp_model_spec_count(); i++) {
        const hp_model_spec_t *sp = hp_model_spec_at(i);
        if (sp->hf && !strcmp(sp->hf->model_type, model_type)) return sp;
    }
    return NULL;
}

hp_status_t hp_hf_read_config(const char *dir, hp_model_config_t *out) {
    if (!dir || !out) return hp_error(HP_ERR_INVALID_ARG, "hp_hf_read_config: NULL argument");
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (access(path, R_OK) != 0)
        return hp_error(HP_ERR_NOT_FOUND, "HF checkpoint %s has no readable config.json; expected the config.json that "
                        "transformers' save_pretrained writes beside the weights; hint: copy it from the model's "
                        "folder, or describe the model with a flavor and model.* keys", dir);
    json_object *o = json_object_from_file(path);
    hfj_t c = {path, o, NULL};
    hp_status_t s = HP_OK;
    if (!o || !json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        return hp_error(HP_ERR_FORMAT, "%s: not a JSON object; expected transformers' config.json", path);
    }
    int64_t vocab = 0, hidden = 0, layers = 0, heads = 0, kv = 0, hd = 0, inter = 0, maxpos = 0;
    /* vocab_size first: hp-ckpt's messages for it predate this reader */
    s = hfj_int(&c, "vocab_size", 1, 0, 1, HP_MODEL_MAX_VOCAB, &vocab);
    json_object *mt = s == HP_OK ? hfj_get(o, "model_type") : NULL;
    const char *mts = mt && json_object_is_type(mt, json_type_string) ? json_object_get_string(mt) : NULL;
    char types[512];   /* the registry's HF classes, for the messages */
    size_t tl = 0;
    types[0] = 0;
    for (int i = 0, k = 0; i < hp_model_spec_count() && tl < sizeof types; i++) {
        const hp_model_spec_t *sp = hp_model_spec_at(i);
        if (sp->hf)
            tl += (size_t)snprintf(types + tl, sizeof types - tl, "%s%s (\"%s\")", k++ ? ", " : "",
                                   sp->hf->architecture, sp->hf->model_type);
    }
    if (s == HP_OK && !mts)
        s = hp_error(HP_ERR_FORMAT, "%s: 'model_type' is %s; expected a string naming one of the architectures %s",
                     path, mt ? "not a string" : "missing", types);
    const hp_model_spec_t *fam = mts ? family_of_model_type(mts) : NULL;
    if (s == HP_OK && !fam) {
        char b[300], want[600];
        snprintf(b, sizeof b, "'%.200s'", mts);
        snprintf(want, sizeof want, "the architectures %s", types);
        s = hfj_unsupported(&c, "model_type", b, want);
    }
    const models_hf_family_t *fc = models_hf_family(fam);
    char cls[96];   /* the config class of the messages: the architecture's, "...ForCausalLM" -> "...Config" */
    if (fam) {
        const char *a = fam->hf->architecture, *fcl = strstr(a, "ForCausalLM");
        snprintf(cls, sizeof cls, "%.*sConfig", (int)(fcl ? fcl - a : (ptrdiff_t)strlen(a)), a);
        c.cls = cls;
    }
    hp_model_config_t mc;
    if (s == HP_OK) s = hp_model_flavor(fam->name, "debugmodel", &mc);   /* what HF's config does not say */
    if (s == HP_OK) s = refuse_unsupported(&c, fc->refuse_sliding_window);
    if (s == HP_OK) s = hfj_int(&c, "hidden_size", 1, 0, 1, HP_MODEL_MAX_DIM, &hidden);
    if (s == HP_OK) s = hfj_int(&c, "num_hidden_layers", 1, 0, 1, HP_MODEL_MAX_LAYERS, &layers);
    if (s == HP_OK) s = hfj_int(&c, "num_attention_heads", 1, 0, 1, HP_MODEL_MAX_HEADS, &heads);
    if (s == HP_OK) s = hfj_int(&c, "num_key_value_heads", 0, heads, 1, HP_MODEL_MAX_HEADS, &kv);
    if (s == HP_OK) s = hfj_int(&c, "head_dim", 0, heads ? hidden / heads : 0, 2, 512, &hd);
    if (s == HP_OK) s = hfj_int(&c, "intermediate_size", 1, 0, 1, HP_MODEL_MAX_DIM, &inter);
    if (s == HP_OK)
        s = hfj_int(&c, "max_position_embeddings", 0, fc->max_position_default, 1, HP_MODEL_MAX_SEQ_LEN, &maxpos);
    if (s == HP_OK && heads % kv != 0)
        s = hp_error(HP_ERR_FORMAT, "%s: 'num_attention_heads' = %lld is not a multiple of 'num_key_value_heads' = %lld",
                     path, (long long)heads, (long long)kv);
    if (s == HP_OK && hfj_get(o, "head_dim") == NULL && hidden % heads != 0)
        s = hp_error(HP_ERR_FORMAT, "%s: no 'head_dim', and 'hidden_size' = %lld is not divisible by "
                     "'num_attention_heads' = %lld", path, (long long)hidden, (long long)heads);
    if (s == HP_OK && hd % 2 != 0)
        s = hp_error(HP_ERR_FORMAT, "%s: head_dim %lld must be even (RoPE rotates pairs of channels)", path, (long long)hd);
    double eps = 1e-6;   /* LlamaConfig and Qwen3Config default */
    if (s == HP_OK) s = hfj_num(&c, o, "rms_norm_eps", 0, eps, 1e-30, 1.0, &eps);
    int tie = 0;
    if (s == HP_OK) s = hfj_bool(&c, "tie_word_embeddings", 0, &tie);
    if (s == HP_OK) {
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
        mc.qk_norm = fc->qk_norm;
        mc.tie_embeddings = tie;
        mc.max_seq_len = (int)maxpos;
        s = fc->read(&c, &mc, maxpos);   /* the family's keys and its RoPE */
    }
    json_object_put(o);
    if (s != HP_OK) return s;
    s = hp_model_config_validate(&mc);
    if (s != HP_OK) return hp_error_prefix(s, "%s: ", path);
    *out = mc;
    return HP_OK;
}

/* ---- the comparison ------------------------------------------------------------------------ */

void models_diff_add(models_diff_t *d, const char *msg, const char *flags) {
    d->n++;
    if (d->lm < d->msg_n) d->lm += (size_t)snprintf(d->msg + d->lm, d->msg_n - d->lm, "%s%s", d->n > 1 ? ", " : "", msg);
    if (flags && flags[0] && d->lf < d->flags_n)
        d->lf += (size_t)snprintf(d->flags + d->lf, d->flags_n - d->lf, "%s%s", d->lf ? " " : "", flags);
}

void models_diff_flag(models_diff_t *d, const char *key, const char *value) {
    if (d->lf < d->flags_n)
        d->lf += (size_t)snprintf(d->flags + d->lf, d->flags_n - d->lf, "%s--model.%s %s", d->lf ? " " : "", key, value);
}

void models_diff_str(models_diff_t *d, const char *hfkey, const char *key, const char *hfv, const char *mcv) {
    char m[512], f[256];
    snprintf(m, sizeof m, "config.json '%s' = %s (model.%s = %s)", hfkey, hfv, key, mcv);
    snprintf(f, sizeof f, "--model.%s %s", key, hfv);
    models_diff_add(d, m, f);
}

void models_diff_int(models_diff_t *d, const char *hfkey, const char *key, int hf, int mc) {
    if (hf == mc) return;
    char a[64], b[64];
    snprintf(a, sizeof a, "%d", hf);
    snprintf(b, sizeof b, "%d", mc);
    models_diff_str(d, hfkey, key, a, b);
}

void models_diff_float(models_diff_t *d, const char *hfkey, const char *key, float hf, float mc) {
    if (hf == mc) return;
    char a[64], b[64];
    snprintf(a, sizeof a, "%.9g", (double)hf);
    snprintf(b, sizeof b, "%.9g", (double)mc);
    models_diff_str(d, hfkey, key, a, b);
}

void models_diff_bool(models_diff_t *d, const char *hfkey, const char *key, int hf, int mc) {
    if (!hf == !mc) return;
    models_diff_str(d, hfkey, key, hf ? "true" : "false", mc ? "true" : "false");
}

int hp_hf_config_diff(const hp_model_config_t *hf, const hp_model_config_t *mc, char *msg, size_t msg_n, char *flags,
                      size_t flags_n) {
    models_diff_t d = {msg, flags, msg_n, flags_n, 0, 0, 0};
    if (msg_n) msg[0] = 0;
    if (flags_n) flags[0] = 0;
    const hp_model_spec_t *fh = hp_model_spec_find(hf->name), *fm = hp_model_spec_find(mc->name);
    const int same = fh == fm;
    if (!same) {   /* another family: its HF model_type, and the --model flag */
        char m[256], f[64];
        snprintf(m, sizeof m, "config.json 'model_type' = '%s' (model.name = %s)",
                 fh && fh->hf ? fh->hf->model_type : hf->name, mc->name);
        snprintf(f, sizeof f, "--model %s", hf->name);
        models_diff_add(&d, m, f);
    }
#define INT_F(hfkey, f) models_diff_int(&d, hfkey, #f, hf->f, mc->f)
#define FLT_F(hfkey, f) models_diff_float(&d, hfkey, #f, hf->f, mc->f)
#define BOOL_F(hfkey, f) models_diff_bool(&d, hfkey, #f, hf->f, mc->f)
    char v[64];
    INT_F("hidden_size", dim);
    INT_F("num_hidden_layers", n_layers);
    INT_F("num_attention_heads", n_heads);
    /* MLA derives both from its own sizes (compared by the family); GQA: a new dim or n_heads
     * re-derives head_dim, n_kv_heads and TorchTitan's FFN width from the flavor's rules, so
     * the flags name them even where they agree */
    if (!(hf->mla && mc->mla)) {
        INT_F("num_key_value_heads", n_kv_heads);
        INT_F("head_dim", head_dim);
        const int reshaped = hf->dim != mc->dim || hf->n_heads != mc->n_heads;
        if (reshaped && hf->n_kv_heads == mc->n_kv_heads)
            snprintf(v, sizeof v, "%d", hf->n_kv_heads), models_diff_flag(&d, "n_kv_heads", v);
        if (reshaped && hf->head_dim == mc->head_dim)
            snprintf(v, sizeof v, "%d", hf->head_dim), models_diff_flag(&d, "head_dim", v);
    }
    INT_F("intermediate_size", hidden_dim);
    if (hf->dim != mc->dim && hf->hidden_dim == mc->hidden_dim)
        snprintf(v, sizeof v, "%d", hf->hidden_dim), models_diff_flag(&d, "hidden_dim", v);
    INT_F("vocab_size", vocab_size);
    FLT_F("rms_norm_eps", norm_eps);
    FLT_F("rope_theta", rope_theta);
    BOOL_F("rope_scaling", rope_scaling);
    if (hf->rope_scaling && mc->rope_scaling) {
        FLT_F("rope_scaling.factor", rope_factor);
        FLT_F("rope_scaling.low_freq_factor", rope_low_freq_factor);
        FLT_F("rope_scaling.high_freq_factor", rope_high_freq_factor);
        INT_F("rope_scaling.original_max_position_embeddings", rope_original_max_pos);
    } else if (hf->rope_scaling) {   /* turned on by the flags: with config.json's numbers */
        snprintf(v, sizeof v, "%.9g", (double)hf->rope_factor), models_diff_flag(&d, "rope_factor", v);
        snprintf(v, sizeof v, "%.9g", (double)hf->rope_low_freq_factor), models_diff_flag(&d, "rope_low_freq_factor", v);
        snprintf(v, sizeof v, "%.9g", (double)hf->rope_high_freq_factor), models_diff_flag(&d, "rope_high_freq_factor", v);
        snprintf(v, sizeof v, "%d", hf->rope_original_max_pos), models_diff_flag(&d, "rope_original_max_pos", v);
    }
    BOOL_F("tie_word_embeddings", tie_embeddings);
    const models_hf_family_t *fam = models_hf_family(fm);
    if (same && fam && fam->diff) fam->diff(&d, hf, mc);   /* the family's keys */
    if (same) BOOL_F("model_type (q/k norm)", qk_norm);
#undef INT_F
#undef FLT_F
#undef BOOL_F
    return d.n;
}

/* ---- names ----------------------------------------------------------------------------------- */

const hp_hf_name_pair_t models_hf_decoder_names[] = {
    {"attention.wq.weight", "self_attn.q_proj.weight", 1},
    {"attention.wk.weight", "self_attn.k_proj.weight", 1},
    {"attention.wv.weight", "self_attn.v_proj.weight", 0},
    {"attention.wo.weight", "self_attn.o_proj.weight", 0},
    {"attention.q_norm.weight", "self_attn.q_norm.weight", 0},
    {"attention.k_norm.weight", "self_attn.k_norm.weight", 0},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight", 0},
    {"feed_forward.w2.weight", "mlp.down_proj.weight", 0},
    {"feed_forward.w3.weight", "mlp.up_proj.weight", 0},
    {"attention_norm.weight", "input_layernorm.weight", 0},
    {"ffn_norm.weight", "post_attention_layernorm.weight", 0},
    {"moe.router.gate.weight", "mlp.gate.weight", 0},   /* the router of an MoE layer */
    {NULL, NULL, 0},
};

/* ---- writing ------------------------------------------------------------------------------- */

char *models_hf_config_json(const hp_model_config_t *mc, hp_dtype_t dt) {
    const hp_model_spec_t *sp = hp_model_spec_find(mc->name);
    const models_hf_family_t *fam = models_hf_family(sp);
    if (!fam) return NULL;
    json_object *c = json_object_new_object(), *arch = json_object_new_array();
    json_object_array_add(arch, json_object_new_string(sp->hf->architecture));
    json_object_object_add(c, "architectures", arch);
    json_object_object_add(c, "model_type", json_object_new_string(sp->hf->model_type));
    json_object_object_add(c, "hidden_size", json_object_new_int(mc->dim));
    json_object_object_add(c, "intermediate_size", json_object_new_int(mc->hidden_dim));
    json_object_object_add(c, "num_hidden_layers", json_object_new_int(mc->n_layers));
    json_object_object_add(c, "num_attention_heads", json_object_new_int(mc->n_heads));
    json_object_object_add(c, "num_key_value_heads", json_object_new_int(mc->n_kv_heads));   /* MLA: n_heads */
    json_object_object_add(c, "vocab_size", json_object_new_int(mc->vocab_size));
    json_object_object_add(c, "rms_norm_eps", json_object_new_double(mc->norm_eps));
    json_object_object_add(c, "rope_theta", json_object_new_double(mc->rope_theta));
    json_object_object_add(c, "tie_word_embeddings", json_object_new_boolean(mc->tie_embeddings));
    json_object_object_add(c, "hidden_act", json_object_new_string("silu"));
    json_object_object_add(c, "attention_bias", json_object_new_boolean(0));
    json_object_object_add(c, "attention_dropout", json_object_new_double(0.0));
    json_object_object_add(c, "initializer_range", json_object_new_double(0.02));
    json_object_object_add(c, "use_cache", json_object_new_boolean(1));
    json_object_object_add(c, "torch_dtype", json_object_new_string(dt == HP_BF16 ? "bfloat16" : "float32"));
    json_object_object_add(c, "dtype", json_object_new_string(dt == HP_BF16 ? "bfloat16" : "float32"));   /* transformers 5 */
    fam->write(c, mc);   /* the family's keys */
    const char *t = json_object_to_json_string_ext(c, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
                                                          JSON_C_TO_STRING_NOSLASHESCAPE);
    char *text = t ? strdup(t) : NULL;
    json_object_put(c);
    return text;
}

void models_hf_write_llama_rope(json_object *c, const hp_model_config_t *mc) {
    json_object_object_add(c, "head_dim", json_object_new_int(mc->head_dim));
    /* with Llama 3 rope scaling HF wants max_position_embeddings above the original context */
    int64_t maxpos = mc->max_seq_len > 0 ? mc->max_seq_len : 2048;
    if (mc->rope_scaling) {
        int64_t scaled = (int64_t)((double)mc->rope_original_max_pos * mc->rope_factor);
        if (scaled > maxpos) maxpos = scaled;
    }
    json_object_object_add(c, "max_position_embeddings", json_object_new_int64(maxpos));
    if (mc->rope_scaling) {   /* HF's "llama3" rope type serves every model that reads rope_scaling */
        json_object *rs = json_object_new_object();
        json_object_object_add(rs, "rope_type", json_object_new_string("llama3"));
        json_object_object_add(rs, "factor", json_object_new_double(mc->rope_factor));
        json_object_object_add(rs, "low_freq_factor", json_object_new_double(mc->rope_low_freq_factor));
        json_object_object_add(rs, "high_freq_factor", json_object_new_double(mc->rope_high_freq_factor));
        json_object_object_add(rs, "original_max_position_embeddings", json_object_new_int(mc->rope_original_max_pos));
        json_object_object_add(c, "rope_scaling", rs);
    }
}

/* ---- what HF's classes can express ------------------------------------------------------------ */

hp_status_t models_hf_check(const hp_model_config_t *mc, const char *what) {
    const models_hf_family_t *f = models_hf_family(hp_model_spec_find(mc->name));
    if (!f)
        return hp_error(HP_ERR_UNSUPPORTED, "HF %s: the model '%s' has no HF state-dict adapter; hint: use the DCP "
                        "checkpoint or weights.safetensors (TorchTitan names)", what, mc->name);
    if (f->check_moe) HP_TRY(f->check_moe(mc, what));
    else if (mc->moe_experts > 0)
        return hp_error(HP_ERR_UNSUPPORTED, "HF %s: the MoE model '%s' has no HF state-dict adapter: %s has no routed "
                        "experts; hint: use the DCP checkpoint or weights.safetensors (TorchTitan names), or a family "
                        "whose HF class has experts (models.h)", what, mc->name, f->adapter.architecture);
    /* HF's classes fix what a custom config could change: LlamaForCausalLM has no q/k norm,
     * Qwen3ForCausalLM (and Qwen3MoeForCausalLM) always has one */
    if (!mc->qk_norm != !f->qk_norm)
        return hp_error(HP_ERR_UNSUPPORTED, "HF %s: %s with qk_norm %s has no HF architecture (%s %s q_norm/k_norm); "
                        "hint: %s", what, mc->name, mc->qk_norm ? "true" : "false", f->adapter.architecture,
                        f->qk_norm ? "always has" : "has no",
                        f->qk_norm ? "keep model.qk_norm true" : "keep model.qk_norm false, or use a family whose HF "
                        "class has q_norm/k_norm");
    return HP_OK;
}
