/* The training configuration's checks and model keys (docs/config.md): validation of every
 * key's range and the cross-key rules, and the model: a flavor plus the model.* overrides
 * (resolve, describe). Keys and value parsing: config_keys.c; YAML: config_yaml.c; command
 * line: config_args.c; printing: config_print.c. */
#include "hyperparallel/comm.h"
#include "hyperparallel/config.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"   /* the registry: flavors; model.flavor = hf reads an HF config.json */

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "hyperparallel/comm.h"
#include "train/config-impl.h"

/* ---- checks ------------------------------------------------------------------------------ */

static hp_status_t check_model_keys(const hp_config_t *c);

hp_status_t hp_config_validate(const hp_config_t *c) {
#define REQUIRE(cond, key, fmt, ...)                                                               \
    do {                                                                                           \
        if (!(cond)) return hp_error(HP_ERR_INVALID_ARG, "config key '" key "': " fmt, __VA_ARGS__); \
    } while (0)
    REQUIRE(c->training.steps >= 1, "training.steps", "must be >= 1, got %lld", (long long)c->training.steps);
    REQUIRE(c->training.seq_len >= 1, "training.seq_len", "must be >= 1, got %lld", (long long)c->training.seq_len);
    REQUIRE(c->training.local_batch_size >= 1, "training.local_batch_size", "must be >= 1, got %lld",
            (long long)c->training.local_batch_size);
    REQUIRE(c->training.global_batch_size == -1 || c->training.global_batch_size >= 1, "training.global_batch_size",
            "must be -1 (= local x dp) or >= 1, got %lld", (long long)c->training.global_batch_size);
    REQUIRE(c->training.max_norm >= 0, "training.max_norm", "must be >= 0 (0 disables clipping), got %g",
            c->training.max_norm);
    REQUIRE(c->optimizer.lr >= 0, "optimizer.lr", "must be >= 0, got %g", c->optimizer.lr);
    REQUIRE(c->optimizer.beta1 >= 0 && c->optimizer.beta1 < 1, "optimizer.beta1", "must be in [0, 1), got %g",
            c->optimizer.beta1);
    REQUIRE(c->optimizer.beta2 >= 0 && c->optimizer.beta2 < 1, "optimizer.beta2", "must be in [0, 1), got %g",
            c->optimizer.beta2);
    REQUIRE(c->optimizer.eps > 0, "optimizer.eps", "must be > 0, got %g", c->optimizer.eps);
    REQUIRE(c->optimizer.weight_decay >= 0, "optimizer.weight_decay", "must be >= 0, got %g",
            c->optimizer.weight_decay);
    REQUIRE(c->optimizer.momentum >= 0 && c->optimizer.momentum < 1, "optimizer.momentum",
            "must be in [0, 1), got %g", c->optimizer.momentum);
    REQUIRE(c->lr_scheduler.warmup_steps >= 0, "lr_scheduler.warmup_steps", "must be >= 0, got %lld",
            (long long)c->lr_scheduler.warmup_steps);
    REQUIRE(c->lr_scheduler.decay_ratio == -1 || (c->lr_scheduler.decay_ratio >= 0 && c->lr_scheduler.decay_ratio <= 1),
            "lr_scheduler.decay_ratio", "must be -1 (None) or in [0, 1], got %g", c->lr_scheduler.decay_ratio);
    REQUIRE(c->lr_scheduler.min_lr_factor >= 0 && c->lr_scheduler.min_lr_factor <= 1, "lr_scheduler.min_lr_factor",
            "must be in [0, 1], got %g", c->lr_scheduler.min_lr_factor);
    REQUIRE(c->checkpoint.interval >= 1, "checkpoint.interval", "must be >= 1, got %lld",
            (long long)c->checkpoint.interval);
    REQUIRE(c->checkpoint.keep_latest_k == 0 || c->checkpoint.keep_latest_k >= 2, "checkpoint.keep_latest_k",
            "must be 0 (keep all) or >= 2 (1 could delete the only good checkpoint mid-save), got %lld",
            (long long)c->checkpoint.keep_latest_k);
    REQUIRE(c->metrics.log_freq >= 1, "metrics.log_freq", "must be >= 1, got %lld", (long long)c->metrics.log_freq);
    REQUIRE(c->metrics.peak_flops >= 0 || c->metrics.peak_flops == -1, "metrics.peak_flops",
            "must be > 0, 0 (measure) or -1 (no MFU), got %g", c->metrics.peak_flops);
    REQUIRE(c->validation.freq >= 1, "validation.freq", "must be >= 1, got %lld", (long long)c->validation.freq);
    REQUIRE(c->validation.steps == -1 || c->validation.steps >= 1, "validation.steps",
            "must be -1 (whole split) or >= 1, got %lld", (long long)c->validation.steps);
    REQUIRE(c->validation.local_batch_size == -1 || c->validation.local_batch_size >= 1,
            "validation.local_batch_size", "must be -1 or >= 1, got %lld", (long long)c->validation.local_batch_size);
    REQUIRE(c->data.validation_fraction >= 0 && c->data.validation_fraction < 1, "data.validation_fraction",
            "must be in [0, 1), got %g", c->data.validation_fraction);
    REQUIRE(!c->validation.enable || c->data.validation_fraction > 0, "validation.enable",
            "needs a validation split; set data.validation_fraction > 0 (e.g. %g)", 0.05);
    REQUIRE(c->tokenizer.vocab_size >= 1, "tokenizer.vocab_size", "must be >= 1, got %lld",
            (long long)c->tokenizer.vocab_size);
    REQUIRE(c->optimizer.lr > 0, "optimizer.lr", "must be > 0 (0 trains nothing), got %g", c->optimizer.lr);
#undef REQUIRE
    /* The schema's ranges and float32 checks once more, for values set directly in the struct. */
    for (size_t i = 0; i < hp_cfg_n_keys; i++) {
        const hp_config_key_t *k = &hp_cfg_keys[i];
        const char *field = (const char *)c + k->offset;
        char what[160];
        snprintf(what, sizeof what, "config key '%s.%s'", k->section, k->key);
        if (k->type == HP_CONFIG_INT) {
            int64_t v;
            memcpy(&v, field, sizeof v);
            if (!(k->flavor_default && v == -1)) HP_TRY(hp_check_i64(what, v, k->int_min, k->int_max, hp_cfg_range_hint(k)));
        } else if (k->type == HP_CONFIG_FLOAT) {
            double v;
            memcpy(&v, field, sizeof v);
            if (k->flavor_default && v == -1) continue;
            if (!(v >= k->float_min && v <= k->float_max))
                return hp_error(HP_ERR_INVALID_ARG, "%s = %g is out of range: expected a number in [%g, %g]%s%s", what,
                                v, k->float_min, k->float_max, hp_cfg_range_hint(k) ? "; hint: " : "",
                                hp_cfg_range_hint(k) ? hp_cfg_range_hint(k) : "");
            if (k->f32) HP_TRY(hp_check_f32(what, v));
        } else if (k->type == HP_CONFIG_TRISTATE) {
            int v;
            memcpy(&v, field, sizeof v);
            if (v < -1 || v > 1)
                return hp_error(HP_ERR_INVALID_ARG, "%s = %d: expected -1 (default), 0 (false) or 1 (true)", what, v);
        }
    }
    if (c->fault_tolerance.enable) {
        char mpi[256];
        int ulfm = hp_comm_survives_failures(mpi, sizeof mpi);
        /* without ULFM a lost rank ends the whole job: there is nothing to continue with */
        return hp_error(HP_ERR_UNSUPPORTED,
                        "config key 'fault_tolerance.enable' = true: %s (this build's MPI: %s); hint: set it to false "
                        "and run hp-train "
                        "--max-restarts N, which restarts from the last complete checkpoint on the hosts that are "
                        "left (docs/multihost.md)",
                        ulfm ? "TorchFT-style continuation of the surviving replica groups is not implemented in "
                               "this build (the MPI has ULFM, the premise)"
                             : "continuing past a lost host needs an MPI with ULFM (MPIX_Comm_shrink: Open MPI 5 "
                               "built with --with-ft=ulfm)",
                        mpi);
    }
    return check_model_keys(c);
}

hp_status_t hp_config_grad_accum_steps(const hp_config_t *cfg, int64_t dp_degree, int64_t *out) {
    if (dp_degree < 1) return hp_error(HP_ERR_INVALID_ARG, "grad accumulation: dp degree must be >= 1, got %lld",
                                       (long long)dp_degree);
    int64_t per_step = cfg->training.local_batch_size * dp_degree;
    int64_t global = cfg->training.global_batch_size;
    if (global == -1) {
        *out = 1;
        return HP_OK;
    }
    if (global < per_step || global % per_step != 0)
        return hp_error(HP_ERR_INVALID_ARG,
                        "config key 'training.global_batch_size' = %lld is not a multiple of local_batch_size (%lld) "
                        "x dp degree (%lld) = %lld; hint: use a multiple of %lld or -1",
                        (long long)global, (long long)cfg->training.local_batch_size, (long long)dp_degree,
                        (long long)per_step, (long long)per_step);
    *out = global / per_step;
    return HP_OK;
}

/* ---- model: the flavor plus the model.* overrides ----------------------------------------- */

/* The keys that override a flavor field, in schema order. */
static bool model_key_set(const hp_config_t *c, const hp_config_key_t *k) {
    if (!k->flavor_default) return false;
    const char *field = (const char *)c + k->offset;
    if (k->type == HP_CONFIG_INT) {
        int64_t v;
        memcpy(&v, field, sizeof v);
        return v != -1;
    }
    if (k->type == HP_CONFIG_FLOAT) {
        double v;
        memcpy(&v, field, sizeof v);
        return v != -1;
    }
    int v;
    memcpy(&v, field, sizeof v);
    return v != -1;
}

void hp_config_model_overrides(const hp_config_t *c, char *buf, size_t n) {
    if (!n) return;
    buf[0] = '\0';
    size_t o = 0;
    for (size_t i = 0; i < hp_cfg_n_keys && o < n; i++) {
        if (!model_key_set(c, &hp_cfg_keys[i])) continue;
        char v[64];
        hp_cfg_format_value(c, &hp_cfg_keys[i], v, sizeof v);
        o += (size_t)snprintf(buf + o, n - o, "%smodel.%s=%s", o ? " " : "", hp_cfg_keys[i].key, v);
    }
}

void hp_config_describe_model(const hp_model_config_t *mc, char *buf, size_t n) {
    int o = snprintf(buf, n, "dim %d, n_layers %d, n_heads %d, n_kv_heads %d, head_dim %d, hidden_dim %d, vocab_size %d, "
                     "norm_eps %g, rope_theta %g, rope_scaling ", mc->dim, mc->n_layers, mc->n_heads, mc->n_kv_heads,
                     mc->head_dim, mc->hidden_dim, mc->vocab_size, mc->norm_eps, mc->rope_theta);
    if (o < 0 || (size_t)o >= n) return;
    if (mc->rope_scaling)
        o += snprintf(buf + o, n - (size_t)o, "true (factor %g, low %g, high %g, original %d)", mc->rope_factor,
                      mc->rope_low_freq_factor, mc->rope_high_freq_factor, mc->rope_original_max_pos);
    else
        o += snprintf(buf + o, n - (size_t)o, "false");
    if (o < 0 || (size_t)o >= n) return;
    o += snprintf(buf + o, n - (size_t)o, ", qk_norm %s, tie_embeddings %s, max_seq_len %d", mc->qk_norm ? "true" : "false",
                  mc->tie_embeddings ? "true" : "false", mc->max_seq_len);
    if (o >= 0 && (size_t)o < n && mc->mla)   /* MLA: head_dim above is the core's padded width */
        o += snprintf(buf + o, n - (size_t)o, ", MLA: q_lora_rank %d, kv_lora_rank %d, qk_nope %d + qk_rope %d, v_head %d, "
                      "norm eps %g, YaRN %s (factor %g, mscale %g, beta %g / %g, original %d)", mc->q_lora_rank,
                      mc->kv_lora_rank, mc->qk_nope_head_dim, mc->qk_rope_head_dim, mc->v_head_dim,
                      hp_model_mla_norm_eps(mc), hp_model_mla_yarn(mc) ? "on" : "off", mc->rope_factor, mc->mla_mscale,
                      mc->rope_beta_fast, mc->rope_beta_slow, mc->rope_original_max_pos);
    if (o < 0 || (size_t)o >= n || mc->moe_experts == 0) return;   /* the MoE sizes, for MoE models */
    o += snprintf(buf + o, n - (size_t)o, ", moe: %d experts top-%d hidden %d, %d shared, %s%s, route_scale %g, %d dense "
                  "layers, load_balance_coeff %g", mc->moe_experts, mc->moe_top_k, mc->moe_hidden, mc->moe_shared_experts,
                  mc->moe_score_fn == HP_MOE_SCORE_SIGMOID ? "sigmoid" : "softmax", mc->moe_route_norm ? " route_norm" : "",
                  mc->moe_route_scale, mc->moe_n_dense_layers, mc->moe_load_balance_coeff);
    if (o >= 0 && (size_t)o < n && mc->moe_expert_groups > 1)
        snprintf(buf + o, n - (size_t)o, ", %d expert groups (%d per token)", mc->moe_expert_groups,
                 mc->moe_limited_groups);
}

/* "" when the value came from a model.* key, " (the flavor's)" when from the flavor. */
static const char *from_flavor(double key_value) { return key_value == -1 ? " (the flavor's)" : ""; }

/* Divisors of n, "1, 2, 3, 6", for hints. */
static void divisors(int n, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = '\0';
    for (int d = 1; d <= n && o + 16 < cap; d++)
        if (n % d == 0) o += (size_t)snprintf(buf + o, cap - o, "%s%d", o ? ", " : "", d);
}

static hp_status_t check_heads(const char *origin, int n_heads, double key_h, int n_kv, double key_kv) {
    if (n_kv > 0 && n_heads % n_kv == 0) return HP_OK;
    char ok[256];
    divisors(n_heads, ok, sizeof ok);
    return hp_error(HP_ERR_INVALID_ARG, "%s 'model.n_heads' = %d%s is not a multiple of model.n_kv_heads = %d%s: "
                    "grouped-query attention shares each KV head among n_heads / n_kv_heads query heads; hint: set "
                    "model.n_kv_heads to a divisor of %d (%s)", origin, n_heads, from_flavor(key_h), n_kv,
                    from_flavor(key_kv), n_heads, ok);
}

static hp_status_t check_head_dim(const char *origin, int head_dim) {
    if (head_dim % 2 == 0) return HP_OK;
    return hp_error(HP_ERR_INVALID_ARG, "%s 'model.head_dim' = %d must be even: RoPE rotates pairs of channels; hint: "
                    "use %d or %d", origin, head_dim, head_dim - 1, head_dim + 1);
}

/* Checks between model.* keys that are set (the flavor's values are checked by
 * hp_config_resolve_model); part of hp_config_validate. */
/* MLA keys (deepseek_v3): they size the MLA attention, which has no head_dim / n_kv_heads of
 * its own (both derived: hp_model_config_validate); on a GQA model they are refused. */
static hp_status_t apply_mla_keys(const hp_config_t *c, const hp_model_config_t *base, hp_model_config_t *mc) {
    const struct { const char *key; int64_t v; } k[] = {
        {"q_lora_rank", c->model.q_lora_rank}, {"kv_lora_rank", c->model.kv_lora_rank},
        {"qk_nope_head_dim", c->model.qk_nope_head_dim}, {"qk_rope_head_dim", c->model.qk_rope_head_dim},
        {"v_head_dim", c->model.v_head_dim}, {"mla_mscale", c->model.mla_mscale != -1 ? 0 : -1},
        {"mla_norm_eps", c->model.mla_norm_eps != -1 ? 0 : -1}, {"rope_beta_fast", c->model.rope_beta_fast != -1 ? 0 : -1},
        {"rope_beta_slow", c->model.rope_beta_slow != -1 ? 0 : -1}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (k[i].v != -1 && !base->mla)
            return hp_error(HP_ERR_INVALID_ARG, "config key 'model.%s' sizes MLA attention, which model.name = %s does "
                            "not have (grouped-query attention); hint: use model.name = deepseek_v3, or leave "
                            "model.%s at -1", k[i].key, c->model.name, k[i].key);
    if (!base->mla) return HP_OK;
    if (c->model.head_dim != -1 || c->model.n_kv_heads != -1)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.%s' = %lld does not apply to %s's MLA attention: every "
                        "head has its own keys and values (n_kv_heads = n_heads) and the head widths are "
                        "model.qk_nope_head_dim, qk_rope_head_dim and v_head_dim; hint: leave model.%s at -1",
                        c->model.head_dim != -1 ? "head_dim" : "n_kv_heads",
                        (long long)(c->model.head_dim != -1 ? c->model.head_dim : c->model.n_kv_heads), c->model.name,
                        c->model.head_dim != -1 ? "head_dim" : "n_kv_heads");
    if (c->model.q_lora_rank != -1) mc->q_lora_rank = (int)c->model.q_lora_rank;
    if (c->model.kv_lora_rank != -1) mc->kv_lora_rank = (int)c->model.kv_lora_rank;
    if (c->model.qk_nope_head_dim != -1) mc->qk_nope_head_dim = (int)c->model.qk_nope_head_dim;
    if (c->model.qk_rope_head_dim != -1) mc->qk_rope_head_dim = (int)c->model.qk_rope_head_dim;
    if (c->model.v_head_dim != -1) mc->v_head_dim = (int)c->model.v_head_dim;
    if (c->model.mla_mscale != -1) mc->mla_mscale = (float)c->model.mla_mscale;
    if (c->model.mla_norm_eps != -1) mc->mla_norm_eps = (float)c->model.mla_norm_eps;
    if (c->model.rope_beta_fast != -1) mc->rope_beta_fast = (float)c->model.rope_beta_fast;
    if (c->model.rope_beta_slow != -1) mc->rope_beta_slow = (float)c->model.rope_beta_slow;
    if (!(mc->rope_beta_fast > mc->rope_beta_slow))
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.rope_beta_fast' = %g%s must be above model.rope_beta_slow "
                        "= %g%s (YaRN's correction range runs from beta_fast down to beta_slow rotations); hint: "
                        "DeepSeek-V3 uses 32 and 1", mc->rope_beta_fast, from_flavor(c->model.rope_beta_fast),
                        mc->rope_beta_slow, from_flavor(c->model.rope_beta_slow));
    if (mc->qk_rope_head_dim % 2 != 0)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.qk_rope_head_dim' = %d must be even: RoPE rotates pairs "
                        "of channels; hint: use %d or %d", mc->qk_rope_head_dim, mc->qk_rope_head_dim - 1,
                        mc->qk_rope_head_dim + 1);
    return HP_OK;
}

static hp_status_t check_model_keys(const hp_config_t *c) {
    if (c->model.head_dim != -1) HP_TRY(check_head_dim("config key", (int)c->model.head_dim));
    if (c->model.n_heads != -1 && c->model.n_kv_heads != -1)
        HP_TRY(check_heads("config key", (int)c->model.n_heads, (double)c->model.n_heads, (int)c->model.n_kv_heads,
                           (double)c->model.n_kv_heads));
    if (c->model.rope_low_freq_factor != -1 && c->model.rope_high_freq_factor != -1 &&
        !(c->model.rope_high_freq_factor > c->model.rope_low_freq_factor))
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.rope_high_freq_factor' = %g must be above "
                        "model.rope_low_freq_factor = %g; hint: Llama 3.1 uses 4 and 1",
                        c->model.rope_high_freq_factor, c->model.rope_low_freq_factor);
    return HP_OK;
}

/* model.flavor = hf: the model is the one of checkpoint.initial_load_path's config.json
 * (hp_hf_read_config); model.name must be its family, no model.* key may change it, and
 * the tokenizer's ids must fit its vocab_size. */
static hp_status_t resolve_model_from_hf(const hp_config_t *c, int vocab_size, const char *vocab_from, int seq_len,
                                         hp_model_config_t *out) {
    const char *dir = c->checkpoint.initial_load_path;
    if (!dir[0] || !hp_hf_is_hf_dir(dir))
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.flavor' = hf takes the model from the HF checkpoint at "
                        "checkpoint.initial_load_path, but that is %s%s%s; hint: point checkpoint.initial_load_path "
                        "at an HF folder (config.json + model.safetensors[.index.json]) or name a flavor",
                        dir[0] ? "'" : "empty", dir, dir[0] ? "', not an HF folder" : "");
    hp_model_config_t mc;
    HP_TRY(hp_hf_read_config(dir, &mc));
    char ov[1024];
    hp_config_model_overrides(c, ov, sizeof ov);
    if (ov[0])
        return hp_error(HP_ERR_INVALID_ARG, "config keys %s change the model, but model.flavor = hf takes every "
                        "dimension from %s/config.json; hint: remove them, or name a flavor with them (the "
                        "checkpoint's config.json must then agree)", ov, dir);
    if (strcmp(c->model.name, mc.name) != 0)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.name' = %.100s, but %s/config.json describes a %s "
                        "model; hint: set model.name = %s", c->model.name, dir, mc.name, mc.name);
    /* HF checkpoints often pad the embedding beyond the tokenizer (Qwen3: 151936 rows for
     * 151669 ids): every id must have a row, spare rows are harmless */
    if (vocab_size > mc.vocab_size)
        return hp_error(HP_ERR_INVALID_ARG, "%s/config.json 'vocab_size' = %d is below the vocabulary of %s (%d "
                        "tokens): the embedding rows are token ids; hint: use the checkpoint's tokenizer",
                        dir, mc.vocab_size, vocab_from ? vocab_from : "the data", vocab_size);
    /* the RoPE table covers the trained context; MLA keeps config.json's longer context, which
     * decides whether YaRN applies (hp_model_mla_yarn) */
    if (seq_len > 0 && !(mc.mla && mc.max_seq_len >= seq_len)) mc.max_seq_len = seq_len;
    *out = mc;
    return HP_OK;
}

/* The MoE keys against each other and the flavor. */
static hp_status_t check_moe_keys(const hp_config_t *c, const hp_model_config_t *base, const hp_model_config_t *mc) {
    const int set = c->model.moe_num_experts != -1 || c->model.moe_top_k != -1 || c->model.moe_hidden_dim != -1 ||
                    c->model.moe_num_shared_experts != -1 || c->model.moe_n_dense_layers != -1 ||
                    strcmp(c->model.moe_score_func, "default") != 0 || c->model.moe_route_norm != -1 ||
                    c->model.moe_score_before_experts != -1 || c->model.moe_route_scale != -1 ||
                    c->model.moe_load_balance_coeff != -1 || c->model.moe_aux_loss_coeff != -1 ||
                    c->model.moe_n_expert_groups != -1 || c->model.moe_n_limited_groups != -1;
    if (base->moe_experts == 0) {
        if (set)
            return hp_error(HP_ERR_INVALID_ARG, "config keys 'model.moe_*' are set but model.name = %s is a dense model; "
                            "hint: use model.name = deepseek_v3 or qwen3_moe", c->model.name);
        return HP_OK;
    }
    if (mc->moe_top_k > mc->moe_experts)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.moe_top_k' = %d%s exceeds model.moe_num_experts = %d%s: "
                        "each token picks top_k distinct experts; hint: lower model.moe_top_k or raise "
                        "model.moe_num_experts", mc->moe_top_k, from_flavor((double)c->model.moe_top_k), mc->moe_experts,
                        from_flavor((double)c->model.moe_num_experts));
    if (mc->moe_n_dense_layers > mc->n_layers)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.moe_n_dense_layers' = %d%s exceeds model.n_layers = %d; "
                        "hint: at most n_layers (then no layer is MoE)", mc->moe_n_dense_layers,
                        from_flavor((double)c->model.moe_n_dense_layers), mc->n_layers);
    if (mc->moe_expert_groups > 1 && mc->moe_experts % mc->moe_expert_groups != 0)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.moe_num_experts' = %d%s is not divisible by "
                        "model.moe_n_expert_groups = %d%s (node-limited routing); hint: use a multiple of %d, or a "
                        "divisor of %d expert groups", mc->moe_experts, from_flavor((double)c->model.moe_num_experts),
                        mc->moe_expert_groups, from_flavor((double)c->model.moe_n_expert_groups), mc->moe_expert_groups,
                        mc->moe_experts);
    if (mc->moe_expert_groups > 1 && (mc->moe_limited_groups < 1 || mc->moe_limited_groups > mc->moe_expert_groups))
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.moe_n_limited_groups' = %d%s must be in 1 .. "
                        "model.moe_n_expert_groups = %d%s (the groups a token may use); hint: HF's topk_group",
                        mc->moe_limited_groups, from_flavor((double)c->model.moe_n_limited_groups),
                        mc->moe_expert_groups, from_flavor((double)c->model.moe_n_expert_groups));
    if (mc->moe_expert_groups > 1 &&
        (int64_t)mc->moe_limited_groups * (mc->moe_experts / mc->moe_expert_groups) < mc->moe_top_k)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.moe_top_k' = %d exceeds the experts of the %d groups a "
                        "token may use (%d each); hint: lower model.moe_top_k", mc->moe_top_k, mc->moe_limited_groups,
                        mc->moe_experts / mc->moe_expert_groups);
    const int64_t ep = c->parallelism.expert_parallel_degree;
    if (ep > 1 && mc->moe_experts % ep != 0)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'parallelism.expert_parallel_degree' = %lld must divide "
                        "model.moe_num_experts = %d%s (each EP rank holds num_experts / ep whole experts); hint: use "
                        "a divisor of %d", (long long)ep, mc->moe_experts, from_flavor((double)c->model.moe_num_experts),
                        mc->moe_experts);
    return HP_OK;
}

hp_status_t hp_config_resolve_model(const hp_config_t *c, int vocab_size, const char *vocab_from, int seq_len,
                                    hp_model_config_t *out) {
    if (!c || !out) return hp_error(HP_ERR_INVALID_ARG, "hp_config_resolve_model: NULL argument");
    if (!strcmp(c->model.flavor, "hf")) return resolve_model_from_hf(c, vocab_size, vocab_from, seq_len, out);
    hp_model_config_t base, mc;
    hp_status_t s = hp_model_flavor(c->model.name, c->model.flavor, &base);
    if (s != HP_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", hp_last_error());
        return hp_error(s, "config keys 'model.name' = %.200s, 'model.flavor' = %.200s: %s", c->model.name,
                        c->model.flavor, msg);
    }
    HP_TRY(check_model_keys(c));
    const char *fl = c->model.flavor;
    mc = base;
    /* what the flavor derives (docs/config.md): head_dim = dim / n_heads, TorchTitan's FFN rule,
     * n_kv_heads = n_heads; the flavor structs hold the derived values, so recognise them */
    const int hd_follows = base.head_dim * base.n_heads == base.dim;
    const int ffn_follows = base.multiple_of > 0 || c->model.multiple_of != -1;
    const int kv_follows = base.n_kv_heads == base.n_heads;
#define SET_INT(f) if (c->model.f != -1) mc.f = (int)c->model.f
#define SET_F32(f) if (c->model.f != -1) mc.f = (float)c->model.f
#define SET_TRI(f) if (c->model.f != -1) mc.f = c->model.f
    SET_INT(dim); SET_INT(n_layers); SET_INT(n_heads); SET_INT(n_kv_heads); SET_INT(head_dim); SET_INT(hidden_dim);
    SET_INT(vocab_size); SET_INT(multiple_of); SET_INT(rope_original_max_pos); SET_INT(max_seq_len);
    SET_F32(ffn_dim_multiplier); SET_F32(norm_eps); SET_F32(rope_theta); SET_F32(rope_factor);
    SET_F32(rope_low_freq_factor); SET_F32(rope_high_freq_factor);
    SET_TRI(rope_scaling); SET_TRI(qk_norm); SET_TRI(tie_embeddings);
    // the MoE keys (-1 / default keep the flavor's)
    if (c->model.moe_num_experts != -1) mc.moe_experts = (int)c->model.moe_num_experts;
    if (c->model.moe_top_k != -1) mc.moe_top_k = (int)c->model.moe_top_k;
    if (c->model.moe_hidden_dim != -1) mc.moe_hidden = (int)c->model.moe_hidden_dim;
    if (c->model.moe_num_shared_experts != -1) mc.moe_shared_experts = (int)c->model.moe_num_shared_experts;
    if (c->model.moe_n_dense_layers != -1) mc.moe_n_dense_layers = (int)c->model.moe_n_dense_layers;
    if (c->model.moe_n_expert_groups != -1) mc.moe_expert_groups = (int)c->model.moe_n_expert_groups;
    if (c->model.moe_n_limited_groups != -1) mc.moe_limited_groups = (int)c->model.moe_n_limited_groups;
    if (strcmp(c->model.moe_score_func, "sigmoid") == 0) mc.moe_score_fn = HP_MOE_SCORE_SIGMOID;
    if (strcmp(c->model.moe_score_func, "softmax") == 0) mc.moe_score_fn = HP_MOE_SCORE_SOFTMAX;
    if (c->model.moe_route_norm != -1) mc.moe_route_norm = c->model.moe_route_norm;
    if (c->model.moe_score_before_experts != -1) mc.moe_score_before_experts = c->model.moe_score_before_experts;
    if (c->model.moe_route_scale != -1) mc.moe_route_scale = (float)c->model.moe_route_scale;
    if (c->model.moe_load_balance_coeff != -1) mc.moe_load_balance_coeff = (float)c->model.moe_load_balance_coeff;
    if (c->model.moe_aux_loss_coeff != -1) mc.moe_aux_loss_coeff = (float)c->model.moe_aux_loss_coeff;
    HP_TRY(check_moe_keys(c, &base, &mc));
    HP_TRY(apply_mla_keys(c, &base, &mc));
#undef SET_INT
#undef SET_F32
#undef SET_TRI
    if (c->model.n_kv_heads == -1 && kv_follows) mc.n_kv_heads = mc.n_heads;
    if (c->model.head_dim == -1 && hd_follows && (c->model.dim != -1 || c->model.n_heads != -1)) {
        if (mc.dim % mc.n_heads != 0)
            return hp_error(HP_ERR_INVALID_ARG, "config key 'model.dim' = %d%s is not divisible by model.n_heads = %d%s, "
                            "and head_dim follows dim / n_heads in %s/%s; hint: set model.head_dim, or a dim that is a "
                            "multiple of n_heads (e.g. %d)", mc.dim, from_flavor((double)c->model.dim), mc.n_heads,
                            from_flavor((double)c->model.n_heads), c->model.name, fl,
                            mc.n_heads * (mc.dim / mc.n_heads > 0 ? mc.dim / mc.n_heads : 1));
        mc.head_dim = mc.dim / mc.n_heads;
        if (mc.head_dim % 2 != 0 || mc.head_dim > 512)
            return hp_error(HP_ERR_INVALID_ARG, "config keys 'model.dim' = %d%s, 'model.n_heads' = %d%s give head_dim = dim / "
                            "n_heads = %d, which must be even and at most 512 (RoPE rotates pairs of channels); hint: "
                            "set model.head_dim or change dim or n_heads", mc.dim, from_flavor((double)c->model.dim),
                            mc.n_heads, from_flavor((double)c->model.n_heads), mc.head_dim);
    }
    if (c->model.hidden_dim == -1 && (c->model.dim != -1 || c->model.multiple_of != -1 ||
                                      c->model.ffn_dim_multiplier != -1)) {
        if (ffn_follows) mc.hidden_dim = 0;   /* hp_model_config_validate applies the rule */
        else if (c->model.ffn_dim_multiplier != -1)
            return hp_error(HP_ERR_INVALID_ARG, "config key 'model.ffn_dim_multiplier' = %g has no effect: %s/%s sets the "
                            "FFN size explicitly (hidden_dim %d); hint: set model.hidden_dim, or model.multiple_of to use "
                            "TorchTitan's rule", c->model.ffn_dim_multiplier, c->model.name, fl, base.hidden_dim);
    }
    HP_TRY(check_heads("config key", mc.n_heads, (double)c->model.n_heads, mc.n_kv_heads, (double)c->model.n_kv_heads));
    if (mc.rope_scaling && (!(mc.rope_factor > 0) || mc.rope_original_max_pos <= 0 ||
                            !(mc.rope_high_freq_factor > mc.rope_low_freq_factor)))
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.rope_scaling' = true needs model.rope_factor > 0 (it is "
                        "%g%s), model.rope_original_max_pos > 0 (%d%s) and model.rope_high_freq_factor (%g%s) above "
                        "model.rope_low_freq_factor (%g%s); hint: set them, e.g. 8, 8192, 4 and 1 as Llama 3.1",
                        mc.rope_factor, from_flavor(c->model.rope_factor), mc.rope_original_max_pos,
                        from_flavor((double)c->model.rope_original_max_pos), mc.rope_high_freq_factor,
                        from_flavor(c->model.rope_high_freq_factor), mc.rope_low_freq_factor,
                        from_flavor(c->model.rope_low_freq_factor));
    if (vocab_size > 0) {   /* the data's vocabulary decides (TorchTitan's update_from_config) */
        if (c->model.vocab_size != -1 && c->model.vocab_size != vocab_size)
            return hp_error(HP_ERR_INVALID_ARG, "config key 'model.vocab_size' = %lld does not match the vocabulary of "
                            "%s (%d tokens): the embedding and output rows are token ids; hint: set model.vocab_size = "
                            "%d or -1 (take it from there), or use the matching tokenizer", (long long)c->model.vocab_size,
                            vocab_from ? vocab_from : "the data", vocab_size, vocab_size);
        mc.vocab_size = vocab_size;
    }
    if (seq_len > 0) {
        if (c->model.max_seq_len == -1) mc.max_seq_len = seq_len;
        else if (c->model.max_seq_len < seq_len)
            return hp_error(HP_ERR_INVALID_ARG, "config key 'model.max_seq_len' = %lld is below training.seq_len = %d (the "
                            "RoPE table must cover every trained position); hint: set model.max_seq_len >= %d or -1 (= "
                            "training.seq_len)", (long long)c->model.max_seq_len, seq_len, seq_len);
    }
    s = hp_model_config_validate(&mc);
    if (s != HP_OK) {
        char msg[1024], ov[1024];
        snprintf(msg, sizeof msg, "%s", hp_last_error());
        hp_config_model_overrides(c, ov, sizeof ov);
        char vb[600] = "";
        if (vocab_size > 0)
            snprintf(vb, sizeof vb, ", vocabulary %d from %.500s", vocab_size, vocab_from ? vocab_from : "the data");
        return hp_error(s, "%s (model.name %.100s, model.flavor %.100s%s%s%s); hint: check %s%s%s", msg, c->model.name,
                        fl, ov[0] ? ", with " : "", ov, vb, ov[0] ? "the model.* keys (docs/config.md)" : "",
                        ov[0] && vb[0] ? " and " : "", vb[0] ? (vocab_from ? vocab_from : "the data") :
                        ov[0] ? "" : "model.name and model.flavor");
    }
    *out = mc;
    return HP_OK;
}

/* ---- lora ----------------------------------------------------------------------------------- */

hp_status_t hp_config_apply_lora(const hp_config_t *c, hp_model_config_t *mc) {
    if (!c->lora.enable) return HP_OK;
    const hp_config_list_t *tm = &c->lora.target_modules;
    int bits = 0;
    for (int i = 0; i < tm->n; i++) {
        const int b = hp_lora_target_bit(tm->items[i]);
        if (!b)
            return hp_error(HP_ERR_INVALID_ARG, "config key 'lora.target_modules': '%s' is not a projection LoRA can "
                            "adapt; expected q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (PEFT's "
                            "names) or wq, wk, wv, wo, w1, w3, w2", tm->items[i]);
        bits |= b;
    }
    if (!bits)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'lora.target_modules' is empty with lora.enable = true; hint: "
                        "e.g. q_proj,v_proj (PEFT's default for Llama and Qwen)");
    /* the layouts tested with LoRA (docs/finetune.md "LoRA"): the data-parallel ones */
    /* expert parallel needs MoE layers, which LoRA does not adapt (hp_model_config_validate) */
    if (c->parallelism.expert_parallel_degree > 1)
        return hp_error(HP_ERR_UNSUPPORTED, "lora.enable = true with parallelism.expert_parallel_degree = %lld: LoRA "
                        "adapts dense decoders only (docs/finetune.md \"LoRA\"); hint: expert_parallel_degree = 1",
                        (long long)c->parallelism.expert_parallel_degree);
    mc->lora_rank = (int)c->lora.rank;
    mc->lora_alpha = (float)c->lora.alpha;
    mc->lora_targets = bits;
    return hp_model_config_validate(mc);
}
