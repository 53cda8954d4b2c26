/* Parity harness of the DDP / ZeRO-1 tests: the llama3 debug model wrapped by DDP (optionally
 * with ZeRO-1) against the single-rank model in the same program, every step at identical
 * weights with the derived bounds of the parity engine in test_dp_util.h (docs/testing.md). */
#ifndef HP_TEST_DDP_UTIL_H
#define HP_TEST_DDP_UTIL_H
#include "test_dp_util.h"

#include "hyperparallel/comm.h"
#include "hyperparallel/ddp.h"
#include "hyperparallel/optim.h"
#include "hyperparallel/zero.h"

static int g_rank, g_world;

/* steps AdamW steps with clipping; accum micro-batches (no_sync on all but the last);
 * zero = ZeRO-1 optimizer; cap = bucket_cap bytes (0: default); inject: a negative test. */
static inline void ddp_parity(hp_comm_t world, const char *what, int steps, int accum, int zero, size_t cap,
                              int overlap, dp_inject_t inject, double *losses) {
    const hp_model_config_t cfg = dp_config(0);
    const int V = cfg.vocab_size, G = g_world * DP_B;
    hp_model_t ref = NULL, m = NULL;
    HP_ASSERT(hp_model_create(&cfg, DP_B, DP_T, &ref) == HP_OK);
    HP_ASSERT(hp_model_init_weights(ref, DP_SEED) == HP_OK);
    HP_ASSERT(hp_model_create(&cfg, DP_B, DP_T, &m) == HP_OK);
    // ranks other than 0 start from other weights: DDP's init broadcast must fix that
    HP_ASSERT(hp_model_init_weights(m, g_rank == 0 ? DP_SEED : DP_SEED + 1) == HP_OK);
    hp_ddp_options_t o = hp_ddp_default_options();
    o.average = 0;   // the loss is globally normalised: sums
    o.overlap = overlap;
    if (cap) o.bucket_cap_bytes = cap;
    hp_ddp_t d = NULL;
    HP_CHECK_OK(hp_ddp_create(m, world, &o, &d));
    if (!d) return;
    const int np = hp_model_num_params(m);
    hp_param_t *RP = hp_model_params(ref), *P = hp_model_params(m);
    hp_optim_config_t oc = dp_optim(), moc = oc;
    if (inject == DP_INJECT_LR && g_rank == 1) moc.lr *= 1.0 + 1e-3;
    hp_optim_t ropt = NULL, opt = NULL;
    hp_zero_t z = NULL;
    HP_ASSERT(hp_optim_create(&oc, RP, np, &ropt) == HP_OK);
    const hp_zero_local_optim_t zlo = hp_optim_zero_local(&moc);
    if (zero) HP_CHECK_OK(hp_zero_create(&zlo, P, np, world, &z));
    else HP_ASSERT(hp_optim_create(&moc, P, np, &opt) == HP_OK);
    dp_par_t par;
    dp_par_init(&par, RP, np, g_world, 0, 0.0, 0);   // one reduction per step (no_sync before the last)
    par.negative = inject != DP_INJECT_NONE;
    for (int i = 0; i < np; i++)   // the broadcast gave every rank rank 0's (the reference's) init
        HP_CHECK(memcmp(P[i].value.local.data, RP[i].value.local.data, sizeof(float) * (size_t)dp_numel(&RP[i])) == 0,
                 "%s: weights of %s after DDP's init broadcast differ from rank 0's", what, P[i].name);
    int32_t *tok = hp_malloc(sizeof(int32_t) * DP_B * DP_T), *tgt = hp_malloc(sizeof(int32_t) * DP_B * DP_T);
    for (int step = 0; step < steps; step++) {
        const float divisor = (float)dp_valid(step, accum, G, V);
        HP_CHECK_OK(hp_model_zero_grad(m));
        dp_par_begin_step(&par);
        for (int r = 0; r < g_world; r++) {   // reference: rank r's accumulated micro-batches, from zero
            HP_CHECK_OK(hp_model_zero_grad(ref));
            double lr_ = 0.0;
            for (int a = 0; a < accum; a++) {
                for (int b = 0; b < DP_B; b++) dp_sequence(step, a, r * DP_B + b, V, tok + b * DP_T, tgt + b * DP_T);
                float l = 0.0f;
                HP_CHECK_OK(hp_model_forward(ref, tok, tgt, DP_B, DP_T, divisor, &l));
                HP_CHECK_OK(hp_model_backward(ref));
                lr_ += l;
            }
            dp_par_add_partial(&par, (float)lr_);
        }
        double local = 0.0;
        for (int a = 0; a < accum; a++) {
            hp_ddp_set_requires_gradient_sync(d, a == accum - 1);
            for (int b = 0; b < DP_B; b++) dp_sequence(step, a, g_rank * DP_B + b, V, tok + b * DP_T, tgt + b * DP_T);
            const float div = inject == DP_INJECT_DIVISOR && g_rank == 1 && a == 0 ? divisor * 1.001f : divisor;
            float l = 0.0f;
            HP_CHECK_OK(hp_model_forward(m, tok, tgt, DP_B, DP_T, div, &l));
            HP_CHECK_OK(hp_model_backward(m));
            local += l;
        }
        if (inject == DP_INJECT_ROW && g_rank == 1) dp_inject_row(&P[1]);
        dp_par_check_global_loss(&par, world, what, step, local, &losses[step]);
        double fn = 0.0, rn = 0.0;
        HP_CHECK_OK(hp_clip_grad_norm(P, np, 1.0, NULL, 0, &fn));   // replicated: the local norm
        dp_par_check_norm(&par, what, step, fn, &rn);
        for (int i = 0; i < np; i++) dp_par_check_grad(&par, what, step, i, P[i].grad.local.data, fn, rn, 1.0);
        HP_CHECK_OK(hp_optim_step(ropt, 1.0));
        if (z) HP_CHECK_OK(hp_zero_step(z, 1.0));
        else HP_CHECK_OK(hp_optim_step(opt, 1.0));
        for (int i = 0; i < np; i++) dp_par_check_weights(&par, what, step, i, P[i].value.local.data);
    }
    dp_par_check_caught(&par, world, what);
    if (z) {   // optimizer state ~1/W of the replicated optimizer's
        size_t mine = hp_zero_state_bytes(z), total = hp_optim_state_bytes(ropt);
        HP_CHECK(mine < total / g_world + total / (2 * g_world) + 4096,
                 "ZeRO-1 state %zu bytes on this rank vs %zu replicated (W=%d)", mine, total, g_world);
        if (g_rank == 0 && !par.negative)
            printf("  ZeRO-1 optimizer state on rank 0: %.2f MiB of %.2f MiB (1/%d = %.2f)\n", mine / 1048576.0,
                   total / 1048576.0, g_world, total / 1048576.0 / g_world);
    }
    if (g_rank == 0)
        printf("%-40s W=%d: %2d steps, %d buckets, worst error / bound: loss %.2e grad %.2e; weights off the "
               "shadow: %lld%s\n", what, g_world, steps, hp_ddp_num_buckets(d), par.worst_l, par.worst_g,
               (long long)par.w_diff, par.negative ? " (negative test)" : "");
    dp_par_free(&par);
    free(tok);
    free(tgt);
    hp_optim_free(ropt);
    hp_optim_free(opt);
    hp_zero_free(z);
    hp_ddp_destroy(d);
    hp_model_destroy(m);
    hp_model_destroy(ref);
}
#endif
