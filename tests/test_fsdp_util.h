/* Parity harness of the fully_shard tests: the llama3 debug model (T = 8, one sequence per rank per
 * micro-batch) trained for AdamW steps with clipping on FSDP over every rank (and HSDP 2 x
 * W/2 on 4 and 8 ranks) against the single-rank model in the same program, with and without
 * gradient accumulation (sync every micro-batch, and no-sync until the last),
 * reshard_after_forward True/False/2, overlap on and off (bitwise equal losses). bf16 mixed
 * precision is compared against fully_shard over a 1-rank mesh under the same policy. Every
 * step compares the loss, the full_tensor of every gradient element, the gradient norm and
 * the new weights at identical weights, with the derived bounds of the parity engine in
 * test_dp_util.h (docs/testing.md); a pcase's `inject` runs one of its negative tests. */
#ifndef HP_TEST_FSDP_UTIL_H
#define HP_TEST_FSDP_UTIL_H
#include "test_dp_util.h"

#include "hyperparallel/comm.h"
#include "hyperparallel/fsdp.h"
#include "hyperparallel/mesh.h"

static int g_rank, g_world;
/* The model of run_case: the llama3 debug model unless a test sets g_cfg (test_fsdp_tied:
 * qwen3 with tied embeddings). */
static hp_model_config_t g_cfg;
static int g_cfg_set;
/* Explicit prefetch lists of run_case's FSDP model (test_fsdp_controls): 0 the implicit
 * prefetches, k > 0 every unit prefetches the next k units in forward and the previous k in
 * backward (hp_fsdp_set_modules_to_forward_prefetch / _backward_prefetch). */
static int g_prefetch;

/* Sets f's explicit prefetch lists of depth k over the model's units [0, n). */
static inline void fsdp_set_prefetch(hp_fsdp_t f, int n, int k) {
    for (int u = 0; u < n; u++) {
        int fw[8], bw[8], nf = 0, nb = 0;
        for (int d = 1; d <= k && d < 8; d++) {
            if (u + d < n) fw[nf++] = u + d;
            if (u - d >= 0) bw[nb++] = u - d;
        }
        HP_CHECK_OK(hp_fsdp_set_modules_to_forward_prefetch(f, u, fw, nf));
        HP_CHECK_OK(hp_fsdp_set_modules_to_backward_prefetch(f, u, bw, nb));
    }
}

typedef struct pcase {
    const char *what;
    int steps, accum, nosync, raf, R, overlap;
    hp_dtype_t pdt, rdt;
    dp_inject_t inject;   /* a negative test: the harness must report the injected error */
} pcase_t;

static inline hp_mesh_t make_mesh(hp_comm_t world, int R) {
    hp_mesh_t mesh = NULL;
    if (R > 1) {
        int64_t shape[2] = {R, g_world / R};
        const char *names[2] = {"dp_replicate", "dp_shard"};
        HP_ASSERT(hp_mesh_create(world, 2, shape, names, &mesh) == HP_OK);
    } else {
        int64_t shape[1] = {g_world};
        const char *names[1] = {"dp_shard"};
        HP_ASSERT(hp_mesh_create(world, 1, shape, names, &mesh) == HP_OK);
    }
    return mesh;
}

/* Runs one case; returns the per-step global losses in `losses` (steps entries). */
static inline void run_case(hp_comm_t world, const pcase_t *pc, double *losses) {
    const hp_model_config_t cfg = g_cfg_set ? g_cfg : dp_config(0);
    const int V = cfg.vocab_size, G = g_world * DP_B;
    hp_mesh_t mesh = make_mesh(world, pc->R);
    hp_fsdp_options_t o = hp_fsdp_default_options();
    o.reshard_after_forward = pc->raf;
    o.overlap = pc->overlap;
    o.gradient_divide_factor = 1.0;   // TorchTitan: the loss is globally normalised -> sums
    o.mp.param_dtype = pc->pdt;
    o.mp.reduce_dtype = pc->rdt;
    const int mixed = pc->pdt != HP_F32 || pc->rdt != HP_F32;

    // reference: one rank's shapes (plain model, or FSDP over a 1-rank mesh under the same
    // mixed-precision policy)
    hp_model_t ref = NULL, fm = NULL;
    HP_ASSERT(hp_model_create(&cfg, DP_B, DP_T, &ref) == HP_OK);
    HP_ASSERT(hp_model_init_weights(ref, DP_SEED) == HP_OK);
    hp_comm_t self_comm = NULL;
    hp_mesh_t self_mesh = NULL;
    hp_fsdp_t rf = NULL;
    hp_param_t *RP = hp_model_params(ref);
    if (mixed) {
        HP_ASSERT(hp_comm_split(world, g_rank, 0, &self_comm) == HP_OK);
        HP_ASSERT(hp_mesh_from_comm(self_comm, "dp_shard", &self_mesh) == HP_OK);
        HP_CHECK_OK(hp_fully_shard(ref, self_mesh, &o, &rf));
        RP = hp_fsdp_params(rf);
    }
    const int np = hp_model_num_params(ref);
    HP_ASSERT(hp_model_create(&cfg, DP_B, DP_T, &fm) == HP_OK);
    HP_ASSERT(hp_model_init_weights(fm, DP_SEED) == HP_OK);
    hp_fsdp_t f = NULL;
    HP_CHECK_OK(hp_fully_shard(fm, mesh, &o, &f));
    if (!f) return;
    if (g_prefetch > 0) fsdp_set_prefetch(f, hp_model_num_units(fm), g_prefetch);
    hp_param_t *FP = hp_fsdp_params(f);
    hp_optim_config_t oc = dp_optim(), foc = oc;
    if (pc->inject == DP_INJECT_LR && g_rank == 1) foc.lr *= 1.0 + 1e-3;
    hp_optim_t ropt = NULL, fopt = NULL;
    HP_ASSERT(hp_optim_create(&oc, RP, np, &ropt) == HP_OK);
    HP_ASSERT(hp_optim_create(&foc, FP, np, &fopt) == HP_OK);
    hp_comm_t comms[2];
    int nc = hp_fsdp_grad_comms(f, comms);
    dp_par_t par;
    // a rank reduces once per step (no sync until the last micro-batch, or one micro-batch),
    // or after every micro-batch
    const int local_accum = pc->nosync || pc->accum == 1;
    const int64_t terms = (int64_t)g_world * (local_accum ? 1 : pc->accum);
    dp_par_init(&par, RP, np, terms, pc->rdt == HP_BF16 ? (int)terms + 2 : 0, DP_UBF16, g_world);
    par.negative = pc->inject != DP_INJECT_NONE;

    int32_t *tok = hp_malloc(sizeof(int32_t) * DP_B * DP_T), *tgt = hp_malloc(sizeof(int32_t) * DP_B * DP_T);
    float *full = hp_malloc(sizeof(float) * (size_t)par.total);
    // step 0 starts from the same weights: layout-independent initialisation (sharded init,
    // full_tensor of the shards equals the 1-rank init bitwise)
    for (int i = 0; i < np; i++) {
        HP_CHECK_OK(hp_fsdp_full_value(f, i, full));
        const int64_t n = dp_numel(&RP[i]);
        HP_CHECK(memcmp(full, RP[i].value.local.data, sizeof(float) * (size_t)n) == 0,
                 "%s: initial weights of %s differ from the 1-rank init", pc->what, FP[i].name);
        memcpy(RP[i].value.local.data, full, sizeof(float) * (size_t)n);
    }
    for (int step = 0; step < pc->steps; step++) {
        const float divisor = (float)dp_valid(step, pc->accum, G, V);
        HP_CHECK_OK(hp_fsdp_zero_grad(f));
        dp_par_begin_step(&par);
        // reference: what each rank hands to its reduction, from zero gradients
        for (int r = 0; r < g_world; r++) {
            double lr_ = 0.0;
            for (int a = 0; a < pc->accum; a++) {
                if (!local_accum || a == 0) {
                    if (rf) HP_CHECK_OK(hp_fsdp_zero_grad(rf));
                    else HP_CHECK_OK(hp_model_zero_grad(ref));
                }
                if (rf) hp_fsdp_set_requires_gradient_sync(rf, !local_accum || a == pc->accum - 1);
                for (int b = 0; b < DP_B; b++) dp_sequence(step, a, r * DP_B + b, V, tok + b * DP_T, tgt + b * DP_T);
                float l = 0.0f;
                HP_CHECK_OK(hp_model_forward(ref, tok, tgt, DP_B, DP_T, divisor, &l));
                HP_CHECK_OK(hp_model_backward(ref));
                lr_ += l;
                if (!local_accum) dp_par_add_partial(&par, l);
            }
            if (local_accum) dp_par_add_partial(&par, (float)lr_);
        }
        double local = 0.0;
        for (int a = 0; a < pc->accum; a++) {
            hp_fsdp_set_requires_gradient_sync(f, pc->nosync ? a == pc->accum - 1 : 1);
            for (int b = 0; b < DP_B; b++)
                dp_sequence(step, a, g_rank * DP_B + b, V, tok + b * DP_T, tgt + b * DP_T);
            const float off = pc->rdt == HP_BF16 ? 1.05f : 1.001f;
            const float div = pc->inject == DP_INJECT_DIVISOR && g_rank == 1 && a == 0 ? divisor * off : divisor;
            float l = 0.0f;
            HP_CHECK_OK(hp_model_forward(fm, tok, tgt, DP_B, DP_T, div, &l));
            HP_CHECK_OK(hp_model_backward(fm));
            local += l;
        }
        if (pc->inject == DP_INJECT_ROW && g_rank == 1) dp_inject_row(&FP[1]);
        dp_par_check_global_loss(&par, world, pc->what, step, local, &losses[step]);
        double fn = 0.0, rn = 0.0;
        HP_CHECK_OK(hp_clip_grad_norm(FP, np, 1.0, comms, nc, &fn));
        dp_par_check_norm(&par, pc->what, step, fn, &rn);
        for (int i = 0; i < np; i++) {   // full_tensor of every clipped gradient
            HP_CHECK_OK(hp_fsdp_full_grad(f, i, full));
            dp_par_check_grad(&par, pc->what, step, i, full, fn, rn, 1.0);
        }
        HP_CHECK_OK(hp_optim_step(ropt, 1.0));
        HP_CHECK_OK(hp_optim_step(fopt, 1.0));
        for (int i = 0; i < np; i++) {
            HP_CHECK_OK(hp_fsdp_full_value(f, i, full));
            dp_par_check_weights(&par, pc->what, step, i, full);
        }
    }
    dp_par_check_caught(&par, world, pc->what);
    if (g_rank == 0)
        printf("%-44s W=%d: %2d steps, worst error / bound: loss %.2e grad %.2e; weights off the shadow: %lld%s\n",
               pc->what, g_world, pc->steps, par.worst_l, par.worst_g, (long long)par.w_diff,
               par.negative ? " (negative test: caught)" : "");
    dp_par_free(&par);
    free(tok); free(tgt); free(full);
    hp_optim_free(ropt);
    hp_optim_free(fopt);
    hp_fsdp_destroy(f);
    hp_fsdp_destroy(rf);
    hp_model_destroy(fm);
    hp_model_destroy(ref);
    hp_mesh_destroy(mesh);
    hp_mesh_destroy(self_mesh);
    if (self_comm) hp_comm_destroy(self_comm);
}

/* Runs base, then base for 2 steps with the overlap off (what_off), whose losses must equal
 * base's bitwise; base's losses into losses. */
static inline void run_case_overlap_off(hp_comm_t world, const pcase_t *base, const char *what_off, double *losses) {
    run_case(world, base, losses);
    pcase_t c = *base;
    double off[10];
    c.what = what_off;
    c.overlap = 0;
    c.steps = 2;
    run_case(world, &c, off);
    dp_check_same_losses(losses, off, 2, "overlap on", "off");
}

/* This rank's DP_B sequences of `step` through m: the forward, and the backward when asked. */
static inline void fsdp_rank_step(hp_model_t m, int step, int backward) {
    int32_t tok[DP_B * DP_T], tgt[DP_B * DP_T];
    const int V = hp_model_config(m)->vocab_size;
    for (int b = 0; b < DP_B; b++) dp_sequence(step, 0, g_rank * DP_B + b, V, tok + b * DP_T, tgt + b * DP_T);
    float l;
    HP_CHECK_OK(hp_model_forward(m, tok, tgt, DP_B, DP_T, 100.0f, &l));
    if (backward) HP_CHECK_OK(hp_model_backward(m));
}

/* A model of cfg initialized with DP_SEED and fully_shard with options o over make_mesh(world,
 * R); *f stays NULL when fully_shard fails (reported). */
static inline void fsdp_shard_model(hp_comm_t world, const hp_model_config_t *cfg, int R, const hp_fsdp_options_t *o,
                                    hp_model_t *m, hp_mesh_t *mesh, hp_fsdp_t *f) {
    *m = NULL;
    *f = NULL;
    HP_ASSERT(hp_model_create(cfg, DP_B, DP_T, m) == HP_OK);
    HP_ASSERT(hp_model_init_weights(*m, DP_SEED) == HP_OK);
    *mesh = make_mesh(world, R);
    HP_CHECK_OK(hp_fully_shard(*m, *mesh, o, f));
}

#endif
