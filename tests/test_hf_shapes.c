/* HF folders made by transformers for shapes no preset has (tools/golden/make_hf_shapes.py,
 * tests/data/hf_shapes/: one KV head, head_dim != hidden/heads, tied and untied, RoPE with and
 * without llama3 scaling; llama and qwen3; Qwen3-MoE and DeepSeek-V3 with MLA): the model config read from config.json alone, the
 * weights imported three ways (hp_hf_import, hp-ckpt from-hf without --flavor, hp-train's
 * initial load with model.flavor = hf), and logits against transformers' forward. Then the
 * refusals (issue 18 acceptance 2): a flavor disagreeing with config.json, in a shape field or in
 * one that changes no shape (rope_theta, rope_scaling, eps), and each unsupported field. Issue 28:
 * DeepSeek-V3 folders with its YaRN numbers, a correction bias, expert groups, YaRN betas and
 * MLA norms at rms_norm_eps 1e-5 through hp-generate's loader (transformers' logits and greedy
 * tokens), from-hf's hint fed back and through to-hf for every folder, and the refusals and
 * messages that issue named. */
// hp-test: ranks 1 timeout 240
#define _GNU_SOURCE
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hp_test_tokenizer.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/config.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/nn.h"
#include "hyperparallel/safetensors.h"
#include "hyperparallel/trainer.h"

/* As tests/test_golden.c: the C model in f32 against transformers' forward in f64 on the same
 * f32 weights; f32 rounding through 2-3 layers of width <= 64 and a 264-way output stays below
 * 1e-6 relative; 2e-5 of max |ref| is that file's bound. */
#define TOL_LOGITS 2e-5

static const char *const SHAPES[] = {"llama_kv1_untied", "llama_hd16_tied_rope3", "llama_mha_untied_rope3",
                                     "qwen3_kv1_hd16_tied", "qwen3_untied_rope3"};
#define N_SHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])

static char ROOT[] = "/tmp/hp_test_hf_shapes_XXXXXX";
static char BDIR[1024], SRC[1024];
static char OUT[1 << 16];
static hp_comm_t WORLD;

typedef struct {
    int32_t tokens[64];   /* (B, T) */
    float *logits;        /* (B, T, V) */
    int B, T, V;
} expected_t;

static int load_expected(const char *dir, expected_t *e) {
    char p[1400];
    HP_ASSERT(snprintf(p, sizeof p, "%s/expected.safetensors", dir) < (int)sizeof p);
    hp_safetensors_t st = NULL;
    HP_CHECK_OK(hp_safetensors_open(p, &st));
    if (!st) return 0;
    const hp_st_info_t *ti = NULL, *li = NULL;
    HP_CHECK_OK(hp_safetensors_find(st, "tokens", &ti));
    HP_CHECK_OK(hp_safetensors_find(st, "logits", &li));
    int ok = ti && li && ti->ndim == 2 && li->ndim == 3 && ti->shape[0] * ti->shape[1] <= 64;
    if (ok) {
        e->B = (int)ti->shape[0];
        e->T = (int)ti->shape[1];
        e->V = (int)li->shape[2];
        e->logits = malloc(sizeof(float) * (size_t)(e->B * e->T * e->V));
        HP_CHECK_OK(hp_safetensors_read_raw(st, "tokens", e->tokens, sizeof(int32_t) * (size_t)(e->B * e->T)));
        HP_CHECK_OK(hp_safetensors_read_raw(st, "logits", e->logits, sizeof(float) * (size_t)(e->B * e->T * e->V)));
    }
    hp_safetensors_close(st);
    return ok;
}

/* max |logits - ref| / max |ref| of m's forward over the expected tokens */
static double logits_err(hp_model_t m, const expected_t *e) {
    float loss = 0;
    HP_CHECK_OK(hp_model_forward(m, e->tokens, NULL, e->B, e->T, 1.0f, &loss));
    const float *l = hp_model_logits(m);
    double md = 0, mr = 0;
    for (int64_t i = 0; i < (int64_t)e->B * e->T * e->V; i++) {
        md = fmax(md, fabs((double)l[i] - e->logits[i]));
        mr = fmax(mr, fabs((double)e->logits[i]));
    }
    return md / (mr > 0 ? mr : 1);
}

static int run(const char *fmt, const char *a, const char *b) {
    char args[3000], cmd[4096];
    snprintf(args, sizeof args, fmt, a, b);
    snprintf(cmd, sizeof cmd, "cd %s && %s 2>&1", ROOT, args);
    return hp_test_run_capture(cmd, OUT, sizeof OUT);
}

/* hp-train for one step of the (e.B, e.T) batch, the model from dir's config.json
 * (model.flavor = hf) and dir as checkpoint.initial_load_path. */
static void hf_initial_load_config(hp_config_t *c, const char *model, const char *name, const char *dir,
                                   const expected_t *ep) {
    const expected_t e = *ep;
    hp_config_defaults(c);
    snprintf(c->model.name, sizeof c->model.name, "%s", model);
    snprintf(c->model.flavor, sizeof c->model.flavor, "hf");
    HP_ASSERT(snprintf(c->checkpoint.initial_load_path, sizeof c->checkpoint.initial_load_path, "%s", dir) < (int)sizeof c->checkpoint.initial_load_path);
    c->checkpoint.enable = 1;
    snprintf(c->job.dump_folder, sizeof c->job.dump_folder, "%s/run_%s", ROOT, name);
    snprintf(c->tokenizer.path, sizeof c->tokenizer.path, "%s/tok.json", ROOT);
    snprintf(c->data.path, sizeof c->data.path, "%s/corpus.txt", ROOT);
    snprintf(c->data.format, sizeof c->data.format, "text");
    c->training.seq_len = e.T;
    c->training.local_batch_size = e.B;
    c->training.steps = 1;
    c->parallelism.data_parallel_shard_degree = 1;
    c->metrics.peak_flops = -1;
}

static void test_shape(const char *name) {
    char dir[1400];
    snprintf(dir, sizeof dir, "%s/tests/data/hf_shapes/%s", SRC, name);
    expected_t e = {0};
    if (!load_expected(dir, &e)) return;
    hp_model_config_t mc;
    HP_CHECK_OK(hp_hf_read_config(dir, &mc));
    HP_CHECK(mc.vocab_size == e.V, "%s: vocab %d vs logits %d", name, mc.vocab_size, e.V);
    /* none of them is a preset: the flavor "config.json" */
    HP_CHECK(!strcmp(mc.flavor, "config.json") && !strcmp(mc.name, strncmp(name, "qwen3", 5) ? "llama3" : "qwen3"),
             "%s: %s/%s", name, mc.name, mc.flavor);
    mc.max_seq_len = e.T;
    hp_model_t m = NULL, m2 = NULL;
    HP_CHECK_OK(hp_model_create(&mc, e.B, e.T, &m));
    HP_CHECK_OK(hp_model_create(&mc, e.B, e.T, &m2));
    if (!m || !m2) return;
    /* 1. the library import */
    HP_CHECK_OK(hp_hf_import(dir, hp_model_hf_adapter(&mc), &mc, hp_model_params(m), hp_model_num_params(m), NULL));
    double err = logits_err(m, &e);
    HP_CHECK(err <= TOL_LOGITS, "%s: hp_hf_import logits rel err %.3g > %.1e", name, err, TOL_LOGITS);
    printf("%s: dim %d L %d H %d KV %d hd %d F %d tied %d rope_scaling %d: logits rel err %.2g\n", name, mc.dim,
           mc.n_layers, mc.n_heads, mc.n_kv_heads, mc.head_dim, mc.hidden_dim, mc.tie_embeddings, mc.rope_scaling, err);
    /* negative control: norm.weight * (1 + 1e-4) scales every logit by 1e-4, 5x the bound */
    hp_param_t *nw = hp_model_find_param(m, "norm.weight");
    HP_ASSERT(nw);
    float *w = nw->value.local.data;
    for (int i = 0; i < mc.dim; i++) w[i] *= 1.0001f;
    double eb = logits_err(m, &e);
    HP_CHECK(eb > TOL_LOGITS, "%s: an injected 1e-4 error went unnoticed (rel err %.3g)", name, eb);
    /* a config that changes no shape (rope_theta 1% off) is refused by the import, naming it */
    hp_model_config_t bad = mc;
    bad.rope_theta *= 1.01f;
    HP_CHECK_ERR(hp_hf_import(dir, hp_model_hf_adapter(&bad), &bad, hp_model_params(m), hp_model_num_params(m), NULL),
                 HP_ERR_INVALID_ARG, "config.json 'rope_theta' = ");
    /* 2. hp-ckpt from-hf, model from config.json, then the DCP load */
    char out[1500];
    snprintf(out, sizeof out, "dcp_%s", name);
    int rc = run("'%s/hp-ckpt' from-hf '%s' ", BDIR, dir);
    HP_CHECK(rc != 0, "from-hf without OUT must fail");
    char cmd[3000];
    HP_ASSERT(snprintf(cmd, sizeof cmd, "'%s/hp-ckpt' from-hf '%s' %s", BDIR, dir, out) < (int)sizeof cmd);
    rc = run("%s%s", cmd, "");
    HP_CHECK(rc == 0 && strstr(OUT, "from config.json"), "%s: from-hf exit %d\n%s", name, rc, OUT);
    int np = hp_model_num_params(m2);
    hp_dcp_tensor_t *ts = calloc((size_t)np, sizeof *ts);
    for (int i = 0; i < np; i++) ts[i] = (hp_dcp_tensor_t){hp_model_params(m2)[i].name, &hp_model_params(m2)[i].value, -1, 0};
    hp_dcp_state_t st = {ts, np, NULL, 0};
    char p[1600];
    snprintf(p, sizeof p, "%s/%s", ROOT, out);
    HP_CHECK_OK(hp_dcp_load(p, &st, NULL, NULL));
    err = logits_err(m2, &e);
    HP_CHECK(err <= TOL_LOGITS, "%s: from-hf logits rel err %.3g", name, err);
    free(ts);
    /* 3. hp-train's initial load, the model from config.json (model.flavor = hf) */
    hp_config_t *c = calloc(1, sizeof *c);
    hf_initial_load_config(c, mc.name, name, dir, &e);
    hp_trainer_t t = NULL;
    HP_CHECK_OK(hp_trainer_create(c, WORLD, &t));
    if (t) {
        err = logits_err(hp_trainer_model(t), &e);
        HP_CHECK(err <= TOL_LOGITS, "%s: initial load logits rel err %.3g", name, err);
        hp_trainer_destroy(t);
    }
    /* a tokenizer with fewer ids than the checkpoint's rows (a padded embedding) trains */
    if (name == SHAPES[0]) {
        snprintf(c->tokenizer.path, sizeof c->tokenizer.path, "%s/tok260.json", ROOT);
        snprintf(c->job.dump_folder, sizeof c->job.dump_folder, "%s/run_padded", ROOT);   /* its own checkpoints */
        HP_CHECK_OK(hp_trainer_create(c, WORLD, &t));
        if (t) {
            hp_step_stats_t st1;
            HP_CHECK_OK(hp_trainer_step(t, &st1));
            HP_CHECK(isfinite(st1.loss) && hp_model_config(hp_trainer_model(t))->vocab_size == 264,
                     "padded vocabulary: loss %g", st1.loss);
            hp_trainer_destroy(t);
        }
        snprintf(c->tokenizer.path, sizeof c->tokenizer.path, "%s/tok.json", ROOT);
        snprintf(c->job.dump_folder, sizeof c->job.dump_folder, "%s/run_%s", ROOT, name);
    }
    /* the same with a flavor: config.json disagrees, the fields are listed (once: the
     * debugmodel's init is most of this test's time) */
    snprintf(c->model.flavor, sizeof c->model.flavor, "debugmodel");
    if (name == SHAPES[0]) HP_CHECK_ERR(hp_trainer_create(c, WORLD, &t), HP_ERR_INVALID_ARG, "config.json disagrees with the");
    if (name == SHAPES[0])
        HP_CHECK(strstr(hp_last_error(), "config.json 'hidden_size' = ") && strstr(hp_last_error(), "model.flavor = hf"),
                 "%s: the message lists the fields and the hint: %s", name, hp_last_error());
    free(c);
    hp_model_destroy(m);
    hp_model_destroy(m2);
    free(e.logits);
}

/* hp-train's initial load (model.flavor = hf) of an MoE folder: the trainer's list has each MoE
 * layer's expert_bias (deepseek_v3: read from mlp.gate.e_score_correction_bias; qwen3_moe: none,
 * skipped); the logits are transformers' again. */
static void trainer_load(const char *name, const char *model, const char *dir, const expected_t *ep) {
    expected_t e = *ep;
    double err;
    hp_config_t *c = calloc(1, sizeof *c);
    hf_initial_load_config(c, model, name, dir, &e);
    hp_trainer_t t = NULL;
    HP_CHECK_OK(hp_trainer_create(c, WORLD, &t));
    if (t) {
        err = logits_err(hp_trainer_model(t), &e);
        HP_CHECK(err <= TOL_LOGITS, "%s: initial load logits rel err %.3g", name, err);
        printf("%s: hp-train initial load (model.flavor = hf): logits rel err %.2g\n", name, err);
        hp_trainer_destroy(t);
    }
    free(c);
}

/* hp-ckpt from-hf of an MoE folder into ROOT/out: every parameter of m is in the DCP checkpoint
 * (which also holds each MoE layer's expert_bias) and gives transformers' logits again; then
 * hp-train's initial load from the folder. */
static void moe_from_hf(const char *name, const char *model, const char *dir, const char *out, hp_model_t m,
                        const expected_t *e) {
    char fmt[1700], want[64];
    snprintf(fmt, sizeof fmt, "'%%s/hp-ckpt' from-hf '%%s' %s", out);
    snprintf(want, sizeof want, "%s from config.json", model);
    int rc = run(fmt, BDIR, dir);
    HP_CHECK(rc == 0 && strstr(OUT, want), "%s: from-hf exit %d\n%s", name, rc, OUT);
    int np = hp_model_num_params(m);
    hp_dcp_tensor_t *ts = calloc((size_t)np, sizeof *ts);
    for (int i = 0; i < np; i++) ts[i] = (hp_dcp_tensor_t){hp_model_params(m)[i].name, &hp_model_params(m)[i].value, -1, 0};
    hp_dcp_state_t st = {ts, np, NULL, 0};
    char p[1600];
    snprintf(p, sizeof p, "%s/%s", ROOT, out);
    hp_dcp_load_options_t lo = {0, 1, NULL, 0, 0};
    if (rc == 0) HP_CHECK_OK(hp_dcp_load(p, &st, NULL, &lo));
    for (int i = 0; rc == 0 && i < np; i++) HP_CHECK(ts[i].loaded, "%s: from-hf lacks %s", name, ts[i].name);
    double err = logits_err(m, e);
    HP_CHECK(rc == 0 && err <= TOL_LOGITS, "%s: hp-ckpt from-hf logits rel err %.3g > %.1e", name, err, TOL_LOGITS);
    free(ts);
    trainer_load(name, model, dir, e);
}

/* --- mixture of experts (owner moe): the Qwen3-MoE folder (one tensor per expert, mlp.gate,
 * num_local_experts / mlp_only_layers in config.json): the qwen3_moe model from config.json,
 * hp_hf_import, logits against transformers' (the same f32-vs-f64 bound; the routing's top-2
 * margins of these tokens are far above f32 rounding, or the error would be O(1)); the
 * negative control; the offline converter (hp-ckpt from-hf) gives the same logits --- */
static void test_moe_shape(const char *name) {
    char dir[1400];
    snprintf(dir, sizeof dir, "%s/tests/data/hf_shapes/%s", SRC, name);
    expected_t e = {0};
    if (!load_expected(dir, &e)) return;
    hp_model_config_t mc;
    HP_CHECK_OK(hp_hf_read_config(dir, &mc));
    HP_CHECK(!strcmp(mc.name, "qwen3_moe") && mc.moe_experts == 4 && mc.moe_top_k == 2 && mc.moe_hidden == 16 &&
             mc.moe_route_norm && mc.moe_n_dense_layers == 1 && mc.hidden_dim == 48 && mc.tie_embeddings,
             "%s: config.json read as %s, %d experts top-%d hidden %d, norm %d, %d dense", name, mc.name, mc.moe_experts,
             mc.moe_top_k, mc.moe_hidden, mc.moe_route_norm, mc.moe_n_dense_layers);
    mc.max_seq_len = e.T;
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(&mc, e.B, e.T, &m));
    if (!m) return;
    HP_CHECK_OK(hp_hf_import(dir, hp_model_hf_adapter(&mc), &mc, hp_model_params(m), hp_model_num_params(m), NULL));
    double err = logits_err(m, &e);
    HP_CHECK(err <= TOL_LOGITS, "%s: hp_hf_import logits rel err %.3g > %.1e", name, err, TOL_LOGITS);
    printf("%s: %d experts top-%d of hidden %d, %d dense layer: logits rel err %.2g\n", name, mc.moe_experts,
           mc.moe_top_k, mc.moe_hidden, mc.moe_n_dense_layers, err);
    hp_param_t *w2 = hp_model_find_param(m, "layers.2.moe.experts.w2");   // negative control: one expert's down_proj
    HP_ASSERT(w2);
    float *w = w2->value.local.data;
    for (int64_t i = 0; i < hp_tensor_numel(&w2->value.local) / 4; i++) w[3 * hp_tensor_numel(&w2->value.local) / 4 + i] *= 1.01f;
    double eb = logits_err(m, &e);
    HP_CHECK(eb > TOL_LOGITS, "%s: expert 3's down_proj x 1.01 went unnoticed (rel err %.3g)", name, eb);
    hp_model_config_t bad = mc;   // a routing key that changes no shape is named
    bad.moe_top_k = 1;
    HP_CHECK_ERR(hp_hf_import(dir, hp_model_hf_adapter(&bad), &bad, hp_model_params(m), hp_model_num_params(m), NULL),
                 HP_ERR_INVALID_ARG, "config.json 'num_experts_per_tok' = 2 (model.moe_top_k = 1)");
    /* the offline converter: each expert's three HF tensors into the (E, ., .) DCP tensors; the
     * converted checkpoint gives transformers' logits again (the model's experts reloaded) */
    moe_from_hf(name, "qwen3_moe", dir, "dcp_moe", m, &e);
    hp_model_destroy(m);
    free(e.logits);
}
/* --- end --- */

/* DeepSeek-V3 (DeepseekV3ForCausalLM, MLA with q_lora, YaRN with mscale == mscale_all_dim,
 * group-limited sigmoid routing, a shared expert): the deepseek_v3 model from config.json alone,
 * hp_hf_import, logits against transformers' (same bound; the model keeps config.json's
 * max_position_embeddings 256 > the original 64, so YaRN applies as in HF); a kv_b_proj change
 * is caught; a field that changes no shape (mscale) is named; hp-ckpt from-hf converts it. */
static void test_deepseek_shape(const char *name) {
    char dir[1400];
    snprintf(dir, sizeof dir, "%s/tests/data/hf_shapes/%s", SRC, name);
    expected_t e = {0};
    if (!load_expected(dir, &e)) return;
    hp_model_config_t mc;
    HP_CHECK_OK(hp_hf_read_config(dir, &mc));
    HP_CHECK(!strcmp(mc.name, "deepseek_v3") && mc.mla && mc.q_lora_rank == 12 && mc.kv_lora_rank == 16 &&
             mc.qk_nope_head_dim == 8 && mc.qk_rope_head_dim == 4 && mc.v_head_dim == 12 && mc.moe_experts == 4 &&
             mc.moe_top_k == 2 && mc.moe_shared_experts == 1 && mc.moe_expert_groups == 2 && mc.moe_limited_groups == 1 &&
             mc.moe_route_scale == 2.5f && mc.moe_route_norm && mc.moe_score_fn == HP_MOE_SCORE_SIGMOID &&
             mc.moe_n_dense_layers == 1 && hp_model_mla_yarn(&mc) && fabsf(mc.mla_mscale - 0.7f) < 1e-7f &&
             mc.rope_original_max_pos == 64 && mc.rope_factor == 4.0f,
             "%s: config.json read as %s mla %d (q_lora %d kv_lora %d %d/%d/%d), %d experts top-%d, yarn %d", name,
             mc.name, mc.mla, mc.q_lora_rank, mc.kv_lora_rank, mc.qk_nope_head_dim, mc.qk_rope_head_dim, mc.v_head_dim,
             mc.moe_experts, mc.moe_top_k, hp_model_mla_yarn(&mc));
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(&mc, e.B, e.T, &m));   // the RoPE table for T rows; max_seq_len stays 256
    if (!m) return;
    HP_CHECK_OK(hp_hf_import(dir, hp_model_hf_adapter(&mc), &mc, hp_model_params(m), hp_model_num_params(m), NULL));
    double err = logits_err(m, &e);
    HP_CHECK(err <= TOL_LOGITS, "%s: hp_hf_import logits rel err %.3g > %.1e", name, err, TOL_LOGITS);
    printf("%s: MLA + %d experts top-%d (%d groups), YaRN: logits rel err %.2g\n", name, mc.moe_experts, mc.moe_top_k,
           mc.moe_expert_groups, err);
    hp_param_t *kvb = hp_model_find_param(m, "layers.2.attention.wkv_b.weight");   // negative control
    HP_ASSERT(kvb);
    float *w = kvb->value.local.data;
    const float keep = w[5];
    w[5] *= 1.01f;
    double eb = logits_err(m, &e);
    HP_CHECK(eb > TOL_LOGITS, "%s: one kv_b_proj entry x 1.01 went unnoticed (rel err %.3g)", name, eb);
    w[5] = keep;
    hp_model_config_t bad = mc;   // a YaRN field that changes no shape is named
    bad.mla_mscale = 1.0f;
    HP_CHECK_ERR(hp_hf_import(dir, hp_model_hf_adapter(&bad), &bad, hp_model_params(m), hp_model_num_params(m), NULL),
                 HP_ERR_INVALID_ARG, "config.json 'rope_parameters.mscale' = 0.699999988 (model.mla_mscale = 1)");
    moe_from_hf(name, "deepseek_v3", dir, "dcp_ds", m, &e);
    hp_model_destroy(m);
    free(e.logits);
}

/* ---- issue 28: DeepSeek-V3 HF interop without silent errors -------------------------------- */

static void edited_copy(const char *name, const char *to, const char *edit);

/* The MoE modules' selection bias of m, in layer order: at most cap pointers, the count. */
static int moe_biases(hp_model_t m, float **out, int *E, int cap) {
    hp_module_t *mods[1024];
    const int nm = hp_model_modules(m, mods, 1024);
    int n = 0;
    for (int i = 0; i < nm && i < 1024; i++)
        if (hp_module_is_moe(mods[i]) && n < cap) {
            hp_moe_impl_t *M = mods[i]->impl;
            out[n++] = M->expert_bias;
            *E = M->c.n_experts;
        }
    return n;
}

/* logits error of the model `cfg` describes carrying m's weights and selection biases: what a
 * reader that got one config field wrong would compute */
static double variant_err(const hp_model_config_t *cfg, hp_model_t m, const expected_t *e) {
    hp_model_config_t c = *cfg;
    HP_CHECK_OK(hp_model_config_validate(&c));
    hp_model_t v = NULL;
    HP_CHECK_OK(hp_model_create(&c, e->B, e->T, &v));
    if (!v) return -1;
    for (int i = 0; i < hp_model_num_params(m); i++)
        memcpy(hp_param_w(&hp_model_params(v)[i]), hp_param_w(&hp_model_params(m)[i]),
               sizeof(float) * (size_t)hp_tensor_numel(&hp_model_params(m)[i].value.local));
    float *bm[64], *bv[64];
    int E = 0;
    const int nb = moe_biases(m, bm, &E, 64);
    HP_CHECK(moe_biases(v, bv, &E, 64) == nb, "variant: %d MoE layers", nb);
    for (int j = 0; j < nb; j++) memcpy(bv[j], bm[j], sizeof(float) * (size_t)E);
    const double err = logits_err(v, e);
    hp_model_destroy(v);
    return err;
}

/* The ids line of hp-generate's --print-ids output into ids; the count. */
static int parse_ids(const char *out, int32_t *ids, int cap) {
    const char *p = strstr(out, "\nids:");
    p = p ? p + 5 : !strncmp(out, "ids:", 4) ? out + 4 : NULL;
    int n = 0;
    while (p && *p && *p != '\n' && n < cap) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        ids[n++] = (int32_t)v;
        p = end;
    }
    return n;
}

/* DeepSeek-V3's own YaRN numbers (original 4096, max_position_embeddings 163840, factor 40,
 * mscale 1), a non-zero e_score_correction_bias, 4 expert groups, rms_norm_eps 1e-5 with small
 * latents (tools/golden/make_hf_shapes.py checks each of these moves transformers' logits by
 * > 100x the bound and the greedy tokens without the bias or YaRN): the model as hp-generate
 * loads it (hp_model_load_weights: config.json's context, the bias) gives transformers' logits,
 * and each old misreading is caught by the same bound; hp-generate gives transformers' greedy
 * tokens (every greedy step's top-2 margin is > 5x the bound, so f32 keeps the argmax). */
static void test_deepseek_generate(const char *name) {
    char dir[1400];
    snprintf(dir, sizeof dir, "%s/tests/data/hf_shapes/%s", SRC, name);
    expected_t e = {0};
    if (!load_expected(dir, &e)) return;
    hp_model_config_t mc;
    HP_CHECK_OK(hp_hf_read_config(dir, &mc));
    HP_CHECK(hp_model_mla_yarn(&mc) && mc.max_seq_len == 163840 && mc.rope_original_max_pos == 4096 &&
                 mc.rope_factor == 40.0f && mc.mla_mscale == 1.0f && mc.rope_beta_fast == 32.0f &&
                 mc.rope_beta_slow == 1.0f && mc.moe_expert_groups == 4 && mc.moe_limited_groups == 2 &&
                 mc.norm_eps == 1e-5f && hp_model_mla_norm_eps(&mc) == 1e-6f,
             "%s: read as yarn %d (context %d, original %d, factor %g, mscale %g), groups %d/%d, eps %g / MLA %g", name,
             hp_model_mla_yarn(&mc), mc.max_seq_len, mc.rope_original_max_pos, mc.rope_factor, mc.mla_mscale,
             mc.moe_expert_groups, mc.moe_limited_groups, mc.norm_eps, hp_model_mla_norm_eps(&mc));
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_load_weights(dir, e.B, e.T, &m));   /* hp-generate's loader */
    if (!m) return;
    HP_CHECK(hp_model_max_seq_len(m) == e.T && hp_model_config(m)->max_seq_len == 163840,
             "%s: built for %d positions, context %d (config.json's)", name, hp_model_max_seq_len(m),
             hp_model_config(m)->max_seq_len);
    float *bias[8];
    int E = 0;
    const int nb = moe_biases(m, bias, &E, 8);
    int nonzero = 0;
    for (int j = 0; j < nb; j++)
        for (int k = 0; k < E; k++) nonzero += bias[j][k] != 0.0f;
    HP_CHECK(nb == 2 && nonzero == 2 * E, "%s: e_score_correction_bias loaded into %d MoE layers (%d non-zero)", name,
             nb, nonzero);
    double err = logits_err(m, &e);
    HP_CHECK(err <= TOL_LOGITS, "%s: logits rel err %.3g > %.1e", name, err, TOL_LOGITS);
    printf("%s: YaRN 4096 -> 163840, bias, 4 groups, MLA eps 1e-6 at rms_norm_eps 1e-5: logits rel err %.2g\n", name,
           err);
    /* each reading the issue found, against the same bound: the bias dropped (item 1), YaRN off
     * by a context capped at 4096 (item 2), the MLA norms at rms_norm_eps (item 4) */
    float keep[8][64];
    for (int j = 0; j < nb; j++) memcpy(keep[j], bias[j], sizeof(float) * (size_t)E), memset(bias[j], 0, sizeof(float) * (size_t)E);
    double eb = logits_err(m, &e);
    HP_CHECK(eb > TOL_LOGITS, "%s: the bias dropped went unnoticed (rel err %.3g)", name, eb);
    for (int j = 0; j < nb; j++) memcpy(bias[j], keep[j], sizeof(float) * (size_t)E);
    hp_model_config_t bad = mc;
    bad.max_seq_len = 4096;
    double ey = variant_err(&bad, m, &e);
    bad = mc;
    bad.mla_norm_eps = 0.0f;   /* = norm_eps 1e-5, TorchTitan's */
    double ee = variant_err(&bad, m, &e);
    HP_CHECK(ey > TOL_LOGITS && ee > TOL_LOGITS && !hp_model_mla_yarn(&(hp_model_config_t){.mla = 1, .max_seq_len = 4096,
                                                                                        .rope_original_max_pos = 4096}),
             "%s: YaRN off (%.3g) or the MLA norms at rms_norm_eps (%.3g) went unnoticed", name, ey, ee);
    printf("%s: without the bias %.3g, YaRN off %.3g, MLA norms at rms_norm_eps %.3g (bound %.0e)\n", name, eb, ey, ee,
           TOL_LOGITS);
    /* hp-train's weights file of this model (hp_model_save_weights): the MLA sizes, YaRN, the MLA
     * eps in its metadata and each layer's expert_bias; loaded back it computes bitwise the same */
    char wp[1600];
    snprintf(wp, sizeof wp, "%s/ds_weights.safetensors", ROOT);
    HP_CHECK_OK(hp_model_save_weights(m, wp));
    hp_model_t w = NULL;
    HP_CHECK_OK(hp_model_load_weights(wp, e.B, e.T, &w));
    if (w) {
        float *wb[8];
        int wE = 0, same = moe_biases(w, wb, &wE, 8) == nb && wE == E;
        for (int j = 0; same && j < nb; j++) same = !memcmp(wb[j], bias[j], sizeof(float) * (size_t)E);
        const double ew = logits_err(w, &e);
        HP_CHECK(same && ew == err && hp_model_mla_norm_eps(hp_model_config(w)) == 1e-6f &&
                     hp_model_config(w)->kv_lora_rank == 8 && hp_model_mla_yarn(hp_model_config(w)),
                 "%s: the weights file round trip: biases %s, logits rel err %.3g vs %.3g", name, same ? "equal" : "differ",
                 ew, err);
        hp_model_destroy(w);
    }
    hp_model_destroy(m);
    /* acceptance 3: hp-generate on the folder gives transformers' greedy tokens */
    char p[1500];
    snprintf(p, sizeof p, "%s/expected.safetensors", dir);
    hp_safetensors_t st = NULL;
    HP_CHECK_OK(hp_safetensors_open(p, &st));
    const hp_st_info_t *pi = NULL, *gi = NULL;
    if (st) HP_CHECK_OK(hp_safetensors_find(st, "prompt_ids", &pi));
    if (st) HP_CHECK_OK(hp_safetensors_find(st, "greedy_ids", &gi));
    const char *prompt = st ? hp_safetensors_metadata(st, "prompt") : NULL;
    int32_t want[128], got[128];
    const int nw = gi && gi->shape[0] <= 128 ? (int)gi->shape[0] : 0, np = pi ? (int)pi->shape[0] : 0;
    if (nw) HP_CHECK_OK(hp_safetensors_read_raw(st, "greedy_ids", want, sizeof(int32_t) * (size_t)nw));
    HP_CHECK(prompt && nw > np && np > 1, "%s: expected.safetensors lacks the prompt or the greedy tokens", name);
    if (prompt && nw > np && np > 1) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "'%s/hp-generate' --weights '%s' --tokenizer '%s/tokenizer.json' --prompt '%s' "
                 "--max-new-tokens %d --temperature 0 --print-ids", BDIR, dir, dir, prompt, nw - np);
        int rc = run("%s%s", cmd, "");
        const int ng = parse_ids(OUT, got, 128);
        HP_CHECK(rc == 0 && ng == nw && !memcmp(got, want, sizeof(int32_t) * (size_t)nw),
                 "%s: hp-generate (exit %d) gave %d ids, transformers' greedy run %d; output:\n%s", name, rc, ng, nw, OUT);
        printf("%s: hp-generate's %d greedy tokens = transformers'\n", name, nw - np);
        /* the numbers, context 16384: transformers takes YaRN's factor as given, so its
         * greedy tokens are the same; hp-generate once capped the context at 4096 (YaRN off) and
         * refused the folder */
        edited_copy(name, "ctx16k", "{\"max_position_embeddings\": 16384}");
        snprintf(cmd, sizeof cmd, "'%s/hp-generate' --weights '%s/ctx16k' --tokenizer '%s/tokenizer.json' --prompt '%s' "
                 "--max-new-tokens %d --temperature 0 --print-ids", BDIR, ROOT, dir, prompt, nw - np);
        rc = run("%s%s", cmd, "");
        HP_CHECK(rc == 0 && parse_ids(OUT, got, 128) == nw && !memcmp(got, want, sizeof(int32_t) * (size_t)nw),
                 "%s with context 16384: hp-generate exit %d\n%s", name, rc, OUT);
    }
    hp_safetensors_close(st);
    free(e.logits);
}

/* YaRN beta_fast 16 / beta_slow 2, 4 expert groups, a full q_proj: read and computed as
 * transformers does; the betas 32 / 1 (what to-hf once wrote) are caught. */
static void test_deepseek_beta(const char *name) {
    char dir[1400];
    snprintf(dir, sizeof dir, "%s/tests/data/hf_shapes/%s", SRC, name);
    expected_t e = {0};
    if (!load_expected(dir, &e)) return;
    hp_model_config_t mc;
    HP_CHECK_OK(hp_hf_read_config(dir, &mc));
    HP_CHECK(mc.rope_beta_fast == 16.0f && mc.rope_beta_slow == 2.0f && mc.moe_expert_groups == 4 &&
                 mc.moe_limited_groups == 2 && mc.q_lora_rank == 0 && !mc.moe_route_norm && mc.tie_embeddings,
             "%s: beta %g / %g, groups %d / %d, q_lora %d", name, mc.rope_beta_fast, mc.rope_beta_slow,
             mc.moe_expert_groups, mc.moe_limited_groups, mc.q_lora_rank);
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_load_weights(dir, e.B, e.T, &m));
    if (!m) return;
    const double err = logits_err(m, &e);
    hp_model_config_t bad = mc;
    bad.rope_beta_fast = 32.0f;
    bad.rope_beta_slow = 1.0f;
    const double eb = variant_err(&bad, m, &e);
    HP_CHECK(err <= TOL_LOGITS && eb > TOL_LOGITS, "%s: logits rel err %.3g (bound %.1e); with beta 32 / 1 %.3g", name,
             err, TOL_LOGITS, eb);
    printf("%s: YaRN beta 16 / 2, 4 groups, full q_proj: logits rel err %.2g (beta 32 / 1: %.3g)\n", name, err, eb);
    hp_model_destroy(m);
    free(e.logits);
}

/* hp-ckpt from-hf against a flavor: its hint is a complete, valid description of the folder
 * (fed back, from-hf accepts it), and to-hf with the same flags writes the folder's config.json
 * back (the model config read from it equals the original's, field by field: n_group, YaRN's
 * betas, the MLA eps), with weights (and DeepSeek-V3's bias) that give transformers' logits. */
static void test_hint_round_trip(const char *name, const char *model) {
    char dir[1400], cmd[8192], flags[4096];
    snprintf(dir, sizeof dir, "%s/tests/data/hf_shapes/%s", SRC, name);
    expected_t e = {0};
    if (!load_expected(dir, &e)) return;
    snprintf(cmd, sizeof cmd, "cd %s && '%s/hp-ckpt' from-hf '%s' rt_refused_%s --model %s --flavor debugmodel 2>&1", ROOT,
             BDIR, dir, name, model);
    int rc = hp_test_run_capture(cmd, OUT, sizeof OUT);
    const char *h = strstr(OUT, "describe it with ");
    HP_CHECK(rc != 0 && h, "%s: from-hf against debugmodel: exit %d\n%s", name, rc, OUT);
    if (!h) return;
    snprintf(flags, sizeof flags, "%s", h + 17);
    flags[strcspn(flags, "\n")] = 0;
    snprintf(cmd, sizeof cmd, "cd %s && '%s/hp-ckpt' from-hf '%s' rt_dcp_%s --model %s --flavor debugmodel %s 2>&1", ROOT,
             BDIR, dir, name, model, flags);
    rc = hp_test_run_capture(cmd, OUT, sizeof OUT);
    HP_CHECK(rc == 0, "%s: from-hf with its own hint (%s): exit %d\n%s", name, flags, rc, OUT);
    snprintf(cmd, sizeof cmd, "cd %s && '%s/hp-ckpt' to-hf rt_dcp_%s rt_hf_%s --model %s --flavor debugmodel %s 2>&1",
             ROOT, BDIR, name, name, model, flags);
    if (rc == 0) rc = hp_test_run_capture(cmd, OUT, sizeof OUT);
    HP_CHECK(rc == 0, "%s: to-hf with the hint: exit %d\n%s", name, rc, OUT);
    if (rc != 0) return;
    char back[1600], msg[4096], fl[2048];
    snprintf(back, sizeof back, "%s/rt_hf_%s", ROOT, name);
    hp_model_config_t a, b;
    HP_CHECK_OK(hp_hf_read_config(dir, &a));
    HP_CHECK_OK(hp_hf_read_config(back, &b));
    const int n = hp_hf_config_diff(&a, &b, msg, sizeof msg, fl, sizeof fl);
    /* the context is in the hint where it decides the numerics (MLA's YaRN) */
    HP_CHECK(n == 0 && (!a.mla || a.max_seq_len == b.max_seq_len), "%s: to-hf wrote a config.json that differs in %d "
             "field(s): %s (context %d vs %d)", name, n, msg, a.max_seq_len, b.max_seq_len);
    if (a.mla) {   /* the keys config.json spells out, as transformers reads them */
        char cj[1700];
        snprintf(cj, sizeof cj, "%s/config.json", back);
        json_object *o = json_object_from_file(cj), *rp = NULL, *v = NULL;
        const int ok = o && json_object_object_get_ex(o, "rope_parameters", &rp) &&
                       json_object_object_get_ex(rp, "beta_fast", &v) && json_object_get_double(v) == a.rope_beta_fast &&
                       json_object_object_get_ex(rp, "beta_slow", &v) && json_object_get_double(v) == a.rope_beta_slow &&
                       json_object_object_get_ex(o, "n_group", &v) &&
                       json_object_get_int(v) == (a.moe_expert_groups > 1 ? a.moe_expert_groups : 1) &&
                       json_object_object_get_ex(o, "topk_group", &v) &&
                       json_object_get_int(v) == (a.moe_expert_groups > 1 ? a.moe_limited_groups : 1);
        HP_CHECK(ok, "%s: to-hf's config.json lacks beta_fast %g / beta_slow %g / n_group %d / topk_group %d", name,
                 a.rope_beta_fast, a.rope_beta_slow, a.moe_expert_groups, a.moe_limited_groups);
        json_object_put(o);
    }
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_load_weights(back, e.B, e.T, &m));
    const double err = m ? logits_err(m, &e) : 1.0;
    HP_CHECK(err <= TOL_LOGITS, "%s: the to-hf folder's logits rel err %.3g > %.1e", name, err, TOL_LOGITS);
    printf("%s: from-hf's hint (%zu characters) -> to-hf -> config.json and logits (rel err %.2g) round trip\n", name,
           strlen(flags), err);
    hp_model_destroy(m);
    free(e.logits);
}

/* a copy of a shape's folder whose config.json gets `edit` (a JSON object merged in; a null
 * value removes the key) */
static void edited_copy(const char *name, const char *to, const char *edit) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/%s' && cp -r '%s/tests/data/hf_shapes/%s' '%s/%s'", ROOT, to, SRC, name, ROOT, to);
    HP_CHECK(system(cmd) == 0, "%s", cmd);
    char p[1600];
    snprintf(p, sizeof p, "%s/%s/config.json", ROOT, to);
    json_object *cj = json_object_from_file(p), *ed = json_tokener_parse(edit);
    HP_ASSERT(cj && ed);
    json_object_object_foreach(ed, k, v) {
        if (!v) json_object_object_del(cj, k);
        else json_object_object_add(cj, k, json_object_get(v));
    }
    HP_CHECK(json_object_to_file(p, cj) == 0, "write %s", p);
    json_object_put(cj);
    json_object_put(ed);
}

static void test_refusals(void) {
    char d[1600];
    /* unsupported fields, named */
    const struct { const char *base, *edit, *want; } un[] = {
        {"llama_kv1_untied", "{\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"rope_theta\": 10000.0}}",
         "'rope_parameters.rope_type' = 'yarn' is not supported"},
        {"llama_kv1_untied", "{\"rope_parameters\": null, \"rope_theta\": 10000.0, \"rope_scaling\": {\"type\": \"linear\", "
         "\"factor\": 2.0}}", "'rope_scaling.rope_type' = 'linear' is not supported"},
        {"llama_kv1_untied", "{\"attention_bias\": true}", "'attention_bias' = true is not supported"},
        {"llama_kv1_untied", "{\"mlp_bias\": true}", "'mlp_bias' = true is not supported"},
        {"llama_kv1_untied", "{\"sliding_window\": 4096}", "'sliding_window' = 4096 is not supported"},
        {"qwen3_untied_rope3", "{\"use_sliding_window\": true}", "'use_sliding_window' = true is not supported"},
        {"qwen3_untied_rope3", "{\"layer_types\": [\"full_attention\", \"sliding_attention\"]}",
         "'layer_types[1]' = \"sliding_attention\" is not supported"},
        {"llama_kv1_untied", "{\"hidden_act\": \"gelu\"}", "'hidden_act' = \"gelu\" is not supported"},
        {"llama_kv1_untied", "{\"model_type\": \"mistral\"}", "'model_type' = 'mistral' is not supported"},
        {"llama_kv1_untied", "{\"attention_dropout\": 0.1}", "'attention_dropout' = 0.1 is not supported"},
        {"llama_kv1_untied", "{\"partial_rotary_factor\": 0.5}", "'partial_rotary_factor' = 0.5 is not supported"},
        {"llama_kv1_untied", "{\"hidden_size\": null}", "'hidden_size' is missing"},
        {"llama_kv1_untied", "{\"num_key_value_heads\": 3}", "is not a multiple of 'num_key_value_heads' = 3"},
        {"llama_kv1_untied", "{\"head_dim\": 4096.0}", "'head_dim' expects an integer, got double"},
        /* issue 28: rope parameters as a bare string, a rope_type that is no string, YaRN's
         * truncate false, first_k_dense_replace past the layers, Qwen3-MoE without an expert
         * count or with more dense layers than layers */
        {"llama_kv1_untied", "{\"rope_parameters\": \"yarn\"}",
         "'rope_parameters' = \"yarn\": expected an object (or null) such as {\"rope_type\": \"yarn\""},
        {"deepseek_v3_yarn4k_bias", "{\"rope_parameters\": \"yarn\"}",
         "'rope_parameters' = \"yarn\": expected an object (or null)"},
        {"deepseek_v3_yarn4k_bias", "{\"rope_parameters\": null, \"rope_scaling\": \"yarn\", \"rope_theta\": 10000.0}",
         "'rope_scaling' = \"yarn\": expected an object (or null)"},
        {"deepseek_v3_yarn4k_bias", "{\"rope_parameters\": {\"rope_type\": 7}}",
         "'rope_parameters.rope_type' = 7: expected a string"},
        {"deepseek_v3_yarn4k_bias", "{\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 40.0, \"mscale\": 1.0, "
         "\"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096, \"truncate\": false}}",
         "'rope_parameters.truncate' = false is not supported"},
        {"deepseek_v3_yarn4k_bias", "{\"first_k_dense_replace\": 4}",
         "'first_k_dense_replace' = 4 exceeds 'num_hidden_layers' = 3"},
        {"deepseek_v3_yarn4k_bias", "{\"kv_lora_rank\": null}", "'kv_lora_rank' is missing; expected an integer (every "
         "DeepseekV3Config has it)"},
        {"qwen3_moe_e4_top2_tied", "{\"num_local_experts\": null, \"num_experts\": null}",
         "neither 'num_experts' (transformers 4.x) nor 'num_local_experts' (transformers 5) is set; expected an integer "
         "(every Qwen3MoeConfig saves one of them)"},
        {"qwen3_moe_e4_top2_tied", "{\"mlp_only_layers\": [0, 1, 2, 3]}",
         "'mlp_only_layers' lists 4 layers but 'num_hidden_layers' = 3"},
    };
    for (size_t i = 0; i < sizeof un / sizeof un[0]; i++) {
        edited_copy(un[i].base, "edited", un[i].edit);
        snprintf(d, sizeof d, "%s/edited", ROOT);
        hp_model_config_t mc;
        hp_clear_error();
        hp_status_t s = hp_hf_read_config(d, &mc);
        HP_CHECK(s != HP_OK && strstr(hp_last_error(), un[i].want) && strstr(hp_last_error(), "edited/config.json"),
                 "%s: %s -> '%s', expected '%s'", un[i].base, un[i].edit, hp_last_error(), un[i].want);
        /* hp-ckpt refuses it the same way and writes nothing */
        int rc = run("'%s/hp-ckpt' from-hf edited %s", BDIR, "dcp_refused");
        HP_CHECK(rc == 1 && strstr(OUT, un[i].want), "hp-ckpt on %s: exit %d\n%s", un[i].edit, rc, OUT);
        snprintf(d, sizeof d, "%s/dcp_refused", ROOT);
        HP_CHECK(access(d, F_OK) != 0, "a refused from-hf wrote dcp_refused");
    }
    /* YaRN's truncate true (transformers' default) is what the model computes: accepted */
    edited_copy("deepseek_v3_yarn4k_bias", "edited", "{\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 40.0, "
                "\"beta_fast\": 32.0, \"beta_slow\": 1.0, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, "
                "\"original_max_position_embeddings\": 4096, \"rope_theta\": 10000.0, \"truncate\": true}}");
    snprintf(d, sizeof d, "%s/edited", ROOT);
    hp_model_config_t tc;
    HP_CHECK_OK(hp_hf_read_config(d, &tc));
    /* the family's model_type from the registry in hp-ckpt's --model message (once 'llama') */
    static const char *const wrong[][3] = {{"qwen3_moe_e4_top2_tied", "llama3", "model_type 'qwen3_moe'"},
                                           {"deepseek_v3_yarn4k_bias", "qwen3", "model_type 'deepseek_v3'"}};
    for (int i = 0; i < 2; i++) {
        char src[1400];
        snprintf(src, sizeof src, "%s/tests/data/hf_shapes/%s", SRC, wrong[i][0]);
        char cmd[3000];
        snprintf(cmd, sizeof cmd, "'%s/hp-ckpt' from-hf '%s' dcp_wrong --model %s", BDIR, src, wrong[i][1]);
        int rc = run("%s%s", cmd, "");
        HP_CHECK(rc == 1 && strstr(OUT, wrong[i][2]) && !strstr(OUT, "'llama'"), "%s with --model %s: exit %d\n%s",
                 wrong[i][0], wrong[i][1], rc, OUT);
    }
    /* the silent cases, now refused: an export of llama3/debugmodel whose config.json says
     * rope_theta 1e4 without rope_scaling and eps 1e-6 (Llama 2 / 3.0), shapes unchanged */
    hp_model_config_t mc;
    HP_CHECK_OK(hp_model_flavor("llama3", "debugmodel", &mc));
    mc.vocab_size = 264;
    mc.max_seq_len = 16;
    HP_CHECK_OK(hp_model_config_validate(&mc));
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(&mc, 1, 1, &m));
    if (!m) return;
    HP_CHECK_OK(hp_model_init_weights(m, 5));
    snprintf(d, sizeof d, "%s/hf_debug", ROOT);
    HP_CHECK_OK(hp_hf_export(d, hp_model_hf_adapter(&mc), &mc, hp_model_params(m), hp_model_num_params(m), NULL, HP_F32,
                             0));
    /* positive control: the unedited export imports with the flavor (flavor and config.json agree) */
    int rc = run("'%s/hp-ckpt' from-hf %s dcp_ok --model llama3 --flavor debugmodel", BDIR, "hf_debug");
    HP_CHECK(rc == 0, "from-hf of an agreeing export: exit %d\n%s", rc, OUT);
    char p[1700];
    snprintf(p, sizeof p, "%s/config.json", d);
    json_object *cj = json_object_from_file(p);
    HP_ASSERT(cj);
    json_object_object_add(cj, "rope_theta", json_object_new_double(10000.0));
    json_object_object_del(cj, "rope_scaling");
    json_object_object_add(cj, "rms_norm_eps", json_object_new_double(1e-6));
    HP_CHECK(json_object_to_file(p, cj) == 0, "write %s", p);
    json_object_put(cj);
    rc = run("'%s/hp-ckpt' from-hf %s dcp_bad --model llama3 --flavor debugmodel", BDIR, "hf_debug");
    HP_CHECK(rc == 1 && strstr(OUT, "disagrees with --flavor debugmodel in 3 field(s)") &&
                 strstr(OUT, "config.json 'rms_norm_eps' = 9.99999997e-07 (model.norm_eps = 9.99999975e-06)") &&
                 strstr(OUT, "config.json 'rope_theta' = 10000 (model.rope_theta = 500000)") &&
                 strstr(OUT, "config.json 'rope_scaling' = false (model.rope_scaling = true)") &&
                 strstr(OUT, "--model.rope_theta 10000"),
             "from-hf with rope_theta / rope_scaling / eps disagreeing: exit %d\n%s", rc, OUT);
    /* the library import (hp-train's initial load with a flavor) refuses it too */
    HP_CHECK_ERR(hp_hf_import(d, hp_model_hf_adapter(&mc), &mc, hp_model_params(m), hp_model_num_params(m), NULL),
                 HP_ERR_INVALID_ARG, "config.json disagrees with the llama3/debugmodel model in 3 field(s)");
    /* without --flavor it imports as the model config.json describes */
    rc = run("'%s/hp-ckpt' from-hf %s dcp_llama2 --model llama3", BDIR, "hf_debug");
    HP_CHECK(rc == 0 && strstr(OUT, "rope_theta 10000"), "from-hf from config.json: exit %d\n%s", rc, OUT);
    rc = run("'%s/hp-ckpt' from-hf %s dcp_x --model qwen3", BDIR, "hf_debug");
    HP_CHECK(rc == 1 && strstr(OUT, "--model qwen3, but"), "--model disagreeing: exit %d\n%s", rc, OUT);
    rc = run("'%s/hp-ckpt' from-hf %s dcp_x --model.dim 64", BDIR, "hf_debug");
    HP_CHECK(rc == 1 && strstr(OUT, "without --flavor"), "--model.* without --flavor: exit %d\n%s", rc, OUT);
    /* model.flavor = hf needs an HF initial load */
    hp_config_t *c = calloc(1, sizeof *c);
    hp_config_defaults(c);
    snprintf(c->model.flavor, sizeof c->model.flavor, "hf");
    HP_CHECK_ERR(hp_config_resolve_model(c, 264, "the test", 16, &mc), HP_ERR_INVALID_ARG,
                 "'model.flavor' = hf takes the model from the HF checkpoint at checkpoint.initial_load_path");
    HP_ASSERT(snprintf(c->checkpoint.initial_load_path, sizeof c->checkpoint.initial_load_path, "%s", d) < (int)sizeof c->checkpoint.initial_load_path);
    HP_CHECK_OK(hp_config_resolve_model(c, 264, "the test", 16, &mc));
    HP_CHECK(mc.rope_theta == 10000.0f && !mc.rope_scaling && mc.max_seq_len == 16, "flavor hf: theta %g scaling %d",
             mc.rope_theta, mc.rope_scaling);
    HP_CHECK_ERR(hp_config_resolve_model(c, 300, "tokenizer.path 'x'", 16, &mc), HP_ERR_INVALID_ARG,
                 "config.json 'vocab_size' = 264 is below the vocabulary of tokenizer.path 'x'");
    HP_CHECK_OK(hp_config_resolve_model(c, 200, "a smaller tokenizer", 16, &mc));   /* padded rows: fine */
    HP_CHECK(mc.vocab_size == 264, "the model keeps config.json's vocab_size: %d", mc.vocab_size);
    c->model.dim = 64;
    HP_CHECK_ERR(hp_config_resolve_model(c, 264, "the test", 16, &mc), HP_ERR_INVALID_ARG, "model.dim=64");
    free(c);
    hp_model_destroy(m);
}

int main(int argc, char **argv) {
    WORLD = hp_test_mpi_init(&argc, &argv, NULL, NULL);
    const char *bd = getenv("HP_BUILD_DIR"), *src = getenv("HP_SOURCE_DIR");
    if (!realpath(bd && *bd ? bd : ".", BDIR)) snprintf(BDIR, sizeof BDIR, ".");
    if (!realpath(src && *src ? src : "..", SRC)) snprintf(SRC, sizeof SRC, "..");
    HP_ASSERT(mkdtemp(ROOT));
    char tp[1200];
    snprintf(tp, sizeof tp, "%s/hp-ckpt", BDIR);
    if (access(tp, X_OK) != 0) {
        printf("SKIP: %s not built\n", tp);
        hp_comm_finalize();
        return 0;
    }
    /* a corpus and a 264-token tokenizer (the folders' vocab) for the initial load */
    static char text[1 << 15];
    size_t n = 0;
    for (int i = 0; i < 200; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "the quick brown fox %d jumps over the lazy dog.\n%%\n", i);
    char p[1200];
    snprintf(p, sizeof p, "%s/corpus.txt", ROOT);
    FILE *f = fopen(p, "w");
    HP_CHECK(f && fwrite(text, 1, n, f) == n, "write %s", p);
    if (f) fclose(f);
    snprintf(p, sizeof p, "%s/tok.json", ROOT);
    hp_test_train_tokenizer_vocab(text, n, 264, p);
    snprintf(p, sizeof p, "%s/tok260.json", ROOT);
    hp_test_train_tokenizer_vocab(text, n, 260, p);
    for (int i = 0; i < N_SHAPES; i++) test_shape(SHAPES[i]);
    test_moe_shape("qwen3_moe_e4_top2_tied");   /* mixture of experts (owner moe) */
    test_deepseek_shape("deepseek_v3_mla_e4_yarn");
    test_deepseek_generate("deepseek_v3_yarn4k_bias");   /* issue 28 */
    test_deepseek_beta("deepseek_v3_beta16_g4");
    for (int i = 0; i < N_SHAPES; i++) test_hint_round_trip(SHAPES[i], strncmp(SHAPES[i], "qwen3", 5) ? "llama3" : "qwen3");
    test_hint_round_trip("qwen3_moe_e4_top2_tied", "qwen3_moe");
    test_hint_round_trip("deepseek_v3_mla_e4_yarn", "deepseek_v3");
    test_hint_round_trip("deepseek_v3_yarn4k_bias", "deepseek_v3");
    test_hint_round_trip("deepseek_v3_beta16_g4", "deepseek_v3");
    test_refusals();
    if (!getenv("HP_KEEP")) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf %s", ROOT);
        if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", ROOT);
    }
    int rc = hp_test_finish("test_hf_shapes");
    hp_comm_finalize();
    return rc;
}
