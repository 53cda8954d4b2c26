// Activation checkpointing of the transformer blocks (hp_model_set_activation_checkpoint[_options]),
// bitwise against AC off over 2 AdamW steps (losses, every gradient of every step, the final
// weights, the MoE layers' tokens-per-expert statistic):
// - TorchTitan's layer rule every_k = 1, 2, 3 (llama3 debugmodel, 4 layers, T 32); the arena is
//   strictly smaller with 1 and 2 (3 checkpoints one block: no saving);
// - op-level selective AC and memory budgets 0, 0.5 and 1 on llama3 (GQA) and qwen3_moe (qk-norm,
//   MoE without shared experts), op SAC and budget 0.5 on deepseek_v3 (MLA, MoE with shared
//   experts): the forward
//   FLOPs the replays run (counted at the kernel table during backward) equal the estimate
//   (hp_model_activation_checkpoint_estimate), which equals the closed form for llama3 under op
//   SAC (wo and w2 of every block); the measured arena equals the estimate; budget 1 keeps
//   everything (no recompute, the arena of AC off), budget 0 recomputes what full AC does but the
//   blocks' last GEMM (its output is not needed: torch's partitioner never recomputes it);
// - negative: a one-ulp change of one weight is seen by the same comparisons, and options out of
//   range are refused, naming the input.
// hp-test: ranks 1 timeout 600 coretype 1
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/optim.h"
#include "hp_test.h"

enum { STEPS = 2, B = 2, T = 32 };

/* The kernel table with the forward GEMM and attention kernels counted while g_on (FlopCounterMode's
 * counts: 2 M N K per GEMM, 4 B H T T d per causal SDPA as torch counts it, without a causal discount). */
static hp_backend_t g_count;
static const hp_backend_t *g_base;
static double g_flops;
static int g_on;
static void c_linear_forward(void *ctx, float *out, const float *inp, const float *w, const float *b, int N, int IC,
                             int OC, int acc) {
    if (g_on) g_flops += 2.0 * N * IC * OC;
    g_base->linear_forward(ctx, out, inp, w, b, N, IC, OC, acc);
}
static void c_attention_forward(void *ctx, float *out, float *lse, const float *q, int ldq, const float *k, int ldk,
                                const float *v, int ldv, int Bn, int Tn, int Hq, int Hkv, int hd) {
    if (g_on) g_flops += 4.0 * Bn * Hq * (double)Tn * Tn * hd;
    g_base->attention_forward(ctx, out, lse, q, ldq, k, ldk, v, ldv, Bn, Tn, Hq, Hkv, hd);
}

typedef struct run {
    float losses[STEPS];
    float *grads;     // every gradient of every step, concatenated
    float *weights;   // final weights
    float *tpe;       // the MoE layers' tokens per expert after the steps
    size_t n, n_tpe;  // floats per step; of tpe
    size_t act_bytes;
    double replay_flops;   // forward FLOPs run inside backward, per micro-batch (the last step's)
    hp_ac_estimate_t est;
} run_t;

static size_t total_floats(hp_model_t m) {
    size_t n = 0;
    for (int i = 0; i < hp_model_num_params(m); i++) n += (size_t)hp_tensor_numel(&hp_model_params(m)[i].grad.local);
    return n;
}

static void free_run(run_t *r) {
    free(r->grads);
    free(r->weights);
    free(r->tpe);
}

/* perturb: add one ulp to the first weight before training (the negative check). */
static void train(const hp_model_config_t *cfg, const hp_ac_options_t *o, int perturb, run_t *r) {
    memset(r, 0, sizeof(*r));
    hp_model_t m = NULL;
    HP_ASSERT(hp_model_create(cfg, B, T, &m) == HP_OK);
    HP_ASSERT(hp_model_init_weights(m, 7) == HP_OK);
    if (perturb) {
        float *w = hp_model_params(m)[0].value.local.data;
        w[0] = nextafterf(w[0], INFINITY);
    }
    HP_CHECK_OK(hp_model_set_activation_checkpoint_options(m, o));
    HP_CHECK(hp_model_activation_checkpoint(m) == o->every_k, "every_k read back");
    hp_model_memory(m, NULL, NULL, &r->act_bytes, NULL);
    HP_CHECK_OK(hp_model_activation_checkpoint_estimate(m, o, B, T, 0, &r->est));
    HP_CHECK(r->est.act_bytes == r->act_bytes, "estimate %zu bytes == the arena the model sized, %zu",
             r->est.act_bytes, r->act_bytes);
    r->n = total_floats(m);
    r->grads = malloc(sizeof(float) * r->n * STEPS);
    r->weights = malloc(sizeof(float) * r->n);
    HP_ASSERT(r->grads && r->weights);
    hp_model_ctx_t ctx = NULL;
    HP_ASSERT(hp_model_ctx_create(m, B, T, 0, &ctx) == HP_OK);
    hp_model_ctx_act(ctx)->be = &g_count;
    int32_t tok[B * T + 1], tgt[B * T];
    uint32_t x = 4242;
    for (int i = 0; i < B * T + 1; i++) {
        x = x * 1664525u + 1013904223u;
        tok[i] = (int32_t)((x >> 8) % (uint32_t)cfg->vocab_size);
    }
    for (int i = 0; i < B * T; i++) tgt[i] = tok[i + 1];
    tgt[3] = -100;
    hp_optim_config_t oc = hp_optim_default(HP_OPTIM_ADAMW);
    oc.lr = 3e-3;
    hp_optim_t opt = NULL;
    HP_ASSERT(hp_optim_create(&oc, hp_model_params(m), hp_model_num_params(m), &opt) == HP_OK);
    for (int s = 0; s < STEPS; s++) {
        HP_CHECK_OK(hp_model_zero_grad(m));
        HP_CHECK_OK(hp_model_forward_ctx(m, ctx, tok, tgt, B, T, 63.0f, &r->losses[s]));
        g_flops = 0.0;
        g_on = 1;
        HP_CHECK_OK(hp_model_backward_ctx(m, ctx));
        g_on = 0;
        r->replay_flops = g_flops;
        size_t off = 0;
        for (int i = 0; i < hp_model_num_params(m); i++) {
            const hp_tensor_t *g = &hp_model_params(m)[i].grad.local;
            size_t k = (size_t)hp_tensor_numel(g);
            memcpy(r->grads + (size_t)s * r->n + off, g->data, sizeof(float) * k);
            off += k;
        }
        HP_CHECK_OK(hp_optim_step(opt, 1.0));
        if (s == 0) {   // a context sized before the setting changed is refused
            HP_CHECK_OK(hp_model_set_activation_checkpoint_options(m, o));
            float l;
            HP_CHECK_ERR(hp_model_forward_ctx(m, ctx, tok, tgt, B, T, 63.0f, &l), HP_ERR_STATE, "re-create");
            hp_model_ctx_destroy(ctx);
            HP_ASSERT(hp_model_ctx_create(m, B, T, 0, &ctx) == HP_OK);
            hp_model_ctx_act(ctx)->be = &g_count;
        }
    }
    size_t off = 0;
    for (int i = 0; i < hp_model_num_params(m); i++) {
        const hp_tensor_t *v = &hp_model_params(m)[i].value.local;
        size_t k = (size_t)hp_tensor_numel(v);
        memcpy(r->weights + off, v->data, sizeof(float) * k);
        off += k;
    }
    hp_module_t *mods[512];
    const int nm = hp_model_modules(m, mods, 512);
    for (int i = 0; i < nm; i++)
        if (hp_module_is_moe(mods[i])) {
            const hp_moe_impl_t *M = mods[i]->impl;
            r->tpe = realloc(r->tpe, sizeof(float) * (r->n_tpe + (size_t)M->c.n_experts));
            memcpy(r->tpe + r->n_tpe, M->tokens_per_expert, sizeof(float) * (size_t)M->c.n_experts);
            r->n_tpe += (size_t)M->c.n_experts;
        }
    HP_CHECK_ERR(hp_model_set_activation_checkpoint(m, -1), HP_ERR_INVALID_ARG, "every_k");
    hp_model_ctx_destroy(ctx);
    hp_optim_free(opt);
    hp_model_destroy(m);
}

/* 1 when r equals the reference bitwise (losses, gradients, weights, MoE statistics). */
static int same(const run_t *r, const run_t *ref) {
    return r->n == ref->n && r->n_tpe == ref->n_tpe && memcmp(r->losses, ref->losses, sizeof(ref->losses)) == 0 &&
           memcmp(r->grads, ref->grads, sizeof(float) * ref->n * STEPS) == 0 &&
           memcmp(r->weights, ref->weights, sizeof(float) * ref->n) == 0 &&
           (ref->n_tpe == 0 || memcmp(r->tpe, ref->tpe, sizeof(float) * ref->n_tpe) == 0);
}

static hp_ac_options_t opts(int every_k, hp_ac_policy_t p, double budget) {
    hp_ac_options_t o = hp_ac_default_options();
    o.every_k = every_k;
    o.policy = p;
    o.memory_budget = budget;
    return o;
}

/* The policies on one model: bitwise equal to AC off, the replay's FLOPs as estimated. all = 0:
 * op SAC and budget 0.5 only (the items of MLA and shared experts, at a third of the cost). */
static void policies(const char *name, const hp_model_config_t *cfg, int all) {
    run_t off, r[5];
    const hp_ac_options_t none = opts(0, HP_AC_FULL, 0.5);
    train(cfg, &none, 0, &off);
    const struct { const char *what; hp_ac_options_t o; } P[5] = {
        {"full", opts(1, HP_AC_FULL, 0.5)},      {"op", opts(1, HP_AC_OP, 0.5)},
        {"budget 0", opts(1, HP_AC_BUDGET, 0.0)}, {"budget 0.5", opts(1, HP_AC_BUDGET, 0.5)},
        {"budget 1", opts(1, HP_AC_BUDGET, 1.0)},
    };
    memset(r, 0, sizeof(r));
    for (int i = 0; i < 5; i++) {
        if (!all && i != 1 && i != 3) continue;
        train(cfg, &P[i].o, 0, &r[i]);
        HP_CHECK(same(&r[i], &off), "%s %s: losses %.9g %.9g vs off %.9g %.9g, gradients, weights and tokens per "
                 "expert bitwise", name, P[i].what, r[i].losses[0], r[i].losses[1], off.losses[0], off.losses[1]);
        HP_CHECK(r[i].replay_flops == r[i].est.recompute_flops, "%s %s: the replays ran %.6g FLOPs, the estimate "
                 "says %.6g", name, P[i].what, r[i].replay_flops, r[i].est.recompute_flops);
        printf("%s %-10s: activations %9zu bytes (%.3f MiB; kept %.3f, region %.3f; off %.3f MiB), recompute %.4g "
               "FLOPs per micro-batch (full AC %.4g)\n", name, P[i].what, r[i].act_bytes, r[i].act_bytes / 1048576.0,
               r[i].est.kept_bytes / 1048576.0, r[i].est.region_bytes / 1048576.0, off.act_bytes / 1048576.0,
               r[i].est.recompute_flops, r[i].est.checkpointed_flops);
    }
    const run_t *full = &r[0], *op = &r[1], *b0 = &r[2], *b5 = &r[3], *b1 = &r[4];
    HP_CHECK(off.replay_flops == 0.0, "%s: no replay without AC (%.6g FLOPs)", name, off.replay_flops);
    if (!all) {
        HP_CHECK(op->act_bytes < off.act_bytes && b5->act_bytes < off.act_bytes && op->replay_flops > 0.0 &&
                 b5->replay_flops > 0.0, "%s: op and budget 0.5 keep less and replay some", name);
        free_run(&r[1]);
        free_run(&r[3]);
        free_run(&off);
        return;
    }
    HP_CHECK(full->replay_flops == full->est.checkpointed_flops, "%s full: the replay runs every item's op", name);
    HP_CHECK(op->act_bytes < off.act_bytes && op->act_bytes > full->act_bytes, "%s op: %zu bytes between full %zu and "
             "off %zu", name, op->act_bytes, full->act_bytes, off.act_bytes);
    HP_CHECK(op->replay_flops > 0.0 && op->replay_flops < full->replay_flops, "%s op: recompute %.6g < full %.6g", name,
             op->replay_flops, full->replay_flops);
    // budget 1: everything kept (the arena of AC off, nothing recomputed)
    // budget 1: everything kept, nothing recomputed; the slot structs (no items) of the blocks share one
    // region (the replay re-creates them), so the arena is at most AC off's
    HP_CHECK(b1->act_bytes <= off.act_bytes && b1->replay_flops == 0.0, "%s budget 1: %zu bytes (off %zu), "
             "recompute %.6g", name, b1->act_bytes, off.act_bytes, b1->replay_flops);
    // budget 0: full AC's memory but for the last op's state (a linear's slot per block); its
    // recompute is full AC's without the blocks' last GEMM
    HP_CHECK(b0->act_bytes <= full->act_bytes + (size_t)cfg->n_layers * 64 && b0->replay_flops < full->replay_flops,
             "%s budget 0: %zu bytes (full %zu), recompute %.6g (full %.6g)", name, b0->act_bytes, full->act_bytes,
             b0->replay_flops, full->replay_flops);
    HP_CHECK(b5->act_bytes > b0->act_bytes && b5->act_bytes < b1->act_bytes && b5->replay_flops < b0->replay_flops &&
             b5->replay_flops > b1->replay_flops, "%s budget 0.5: %zu bytes, recompute %.6g, between budgets 0 and 1",
             name, b5->act_bytes, b5->replay_flops);
    // the knapsack's capacity: the blocks' kept items take at most half their items' bytes (full AC
    // keeps none of them: its kept bytes are the other units'; 1e-3: the 1/10000 quantization)
    const double base = (double)full->est.kept_bytes, items = (double)b1->est.kept_bytes - base;
    HP_CHECK((double)b5->est.kept_bytes - base <= 0.5 * items * (1 + 1e-3), "%s budget 0.5: kept %.0f of %.0f item "
             "bytes", name, (double)b5->est.kept_bytes - base, items);
    if (strcmp(name, "llama3") == 0) {   // op SAC: wo and w2 of every block (the 2nd and 4th GEMM) are replayed
        const double N = B * T, D = cfg->dim, qd = cfg->n_heads * (cfg->dim / cfg->n_heads), F = cfg->hidden_dim;
        const double want = cfg->n_layers * 2.0 * N * (qd * D + F * D);
        HP_CHECK(op->est.recompute_flops == want, "llama3 op: recompute %.9g FLOPs, closed form wo + w2 %.9g",
                 op->est.recompute_flops, want);
    }
    if (strcmp(name, "llama3") == 0) {   // negative: the same comparisons see a one-ulp change of one weight
        run_t bad;
        train(cfg, &P[1].o, 1, &bad);
        HP_CHECK(!same(&bad, &off), "%s: a one-ulp weight change must fail the bitwise comparison", name);
        free_run(&bad);
    }
    for (int i = 0; i < 5; i++) free_run(&r[i]);
    free_run(&off);
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    g_base = hp_backend_default();
    g_count = *g_base;
    g_count.linear_forward = c_linear_forward;
    g_count.attention_forward = c_attention_forward;

    hp_model_config_t cfg;
    HP_ASSERT(hp_model_flavor("llama3", "debugmodel", &cfg) == HP_OK);
    cfg.n_layers = 4;
    HP_ASSERT(hp_model_config_validate(&cfg) == HP_OK);
    run_t off;
    const hp_ac_options_t none = opts(0, HP_AC_FULL, 0.5);
    train(&cfg, &none, 0, &off);
    const int ks[] = {1, 2, 3};
    for (int i = 0; i < 3; i++) {
        run_t ac;
        const hp_ac_options_t o = opts(ks[i], HP_AC_FULL, 0.5);
        train(&cfg, &o, 0, &ac);
        HP_CHECK(same(&ac, &off), "k=%d: losses %.9g %.9g vs off %.9g %.9g, gradients and weights bitwise", ks[i],
                 ac.losses[0], ac.losses[1], off.losses[0], off.losses[1]);
        /* one checkpointed block (k = 3 of 4 layers) saves nothing: the other blocks' state stays
         * through backward, and the recompute region is one block */
        if (ks[i] < 3)
            HP_CHECK(ac.act_bytes < off.act_bytes, "k=%d: activations %zu bytes < %zu without AC", ks[i],
                     ac.act_bytes, off.act_bytes);
        else
            HP_CHECK(ac.act_bytes == off.act_bytes, "k=%d: activations %zu bytes == %zu without AC", ks[i],
                     ac.act_bytes, off.act_bytes);
        printf("activation checkpointing every %d: activations %zu bytes (%.3f MiB), off %zu bytes (%.3f MiB)\n",
               ks[i], ac.act_bytes, ac.act_bytes / 1048576.0, off.act_bytes, off.act_bytes / 1048576.0);
        free_run(&ac);
    }
    free_run(&off);
    policies("llama3", &cfg, 1);
    HP_ASSERT(hp_model_flavor("qwen3_moe", "debugmodel", &cfg) == HP_OK);
    cfg.n_layers = 2;
    HP_ASSERT(hp_model_config_validate(&cfg) == HP_OK);
    policies("qwen3_moe", &cfg, 1);
    HP_ASSERT(hp_model_flavor("deepseek_v3", "debugmodel", &cfg) == HP_OK);
    cfg.n_layers = 2;   // a dense layer, then an MoE one
    HP_ASSERT(hp_model_config_validate(&cfg) == HP_OK);
    policies("deepseek_v3", &cfg, 0);

    // turning it off again restores the full arena; bad options are refused by name
    hp_model_t m = NULL;
    HP_ASSERT(hp_model_flavor("llama3", "debugmodel", &cfg) == HP_OK);
    cfg.n_layers = 4;
    HP_ASSERT(hp_model_create(&cfg, B, T, &m) == HP_OK);
    size_t a0, a1, a2;
    hp_model_memory(m, NULL, NULL, &a0, NULL);
    HP_CHECK_OK(hp_model_set_activation_checkpoint(m, 1));
    hp_model_memory(m, NULL, NULL, &a1, NULL);
    HP_CHECK_OK(hp_model_set_activation_checkpoint(m, 0));
    hp_model_memory(m, NULL, NULL, &a2, NULL);
    HP_CHECK(a1 < a0 && a2 == a0, "arena %zu -> %zu (full) -> %zu (off)", a0, a1, a2);
    {   // refused between a forward and its backward
        int32_t tok[B * T];
        for (int i = 0; i < B * T; i++) tok[i] = i % cfg.vocab_size;
        float l;
        HP_CHECK_OK(hp_model_forward(m, tok, tok, B, T, (float)(B * T), &l));
        hp_ac_options_t o = opts(1, HP_AC_OP, 0.5);
        HP_CHECK_ERR(hp_model_set_activation_checkpoint_options(m, &o), HP_ERR_STATE, "between steps");
        HP_CHECK_OK(hp_model_backward(m));
    }
    hp_ac_options_t bad = opts(1, HP_AC_BUDGET, 1.5);
    HP_CHECK_ERR(hp_model_set_activation_checkpoint_options(m, &bad), HP_ERR_INVALID_ARG, "memory_budget = 1.5");
    bad.memory_budget = -0.25;
    HP_CHECK_ERR(hp_model_set_activation_checkpoint_options(m, &bad), HP_ERR_INVALID_ARG, "memory_budget = -0.25");
    bad = opts(1, (hp_ac_policy_t)7, 0.5);
    HP_CHECK_ERR(hp_model_set_activation_checkpoint_options(m, &bad), HP_ERR_INVALID_ARG, "policy 7");
    bad = opts(-2, HP_AC_OP, 0.5);
    HP_CHECK_ERR(hp_model_set_activation_checkpoint_options(m, &bad), HP_ERR_INVALID_ARG, "every_k = -2");
    hp_ac_estimate_t e;
    bad = opts(1, HP_AC_OP, 0.5);
    HP_CHECK_ERR(hp_model_activation_checkpoint_estimate(m, &bad, 0, T, 0, &e), HP_ERR_INVALID_ARG, "(B, T)");
    hp_model_destroy(m);
    return hp_test_finish("test_model_ac");
}
