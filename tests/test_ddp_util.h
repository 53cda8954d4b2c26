/* Parity harness of the DDP / ZeRO-1 tests: the llama3 debug model wrapped by DDP (optionally
 * with ZeRO-1) against the single-rank run of the whole global batch in the same program. */
#ifndef HP_TEST_DDP_UTIL_H
#define HP_TEST_DDP_UTIL_H
#include "test_dp_util.h"

#include "hyperparallel/comm.h"
#include "hyperparallel/ddp.h"

static int g_rank, g_world;

/* steps AdamW steps with clipping; accum micro-batches (no_sync on all but the last);
 * zero = ZeRO-1 optimizer; cap = bucket_cap bytes (0: default). Returns the worst errors. */
static inline void ddp_parity(hp_comm_t world, const char *what, int steps, int accum, int zero, size_t cap,
                              int overlap, double *losses) {
    const hp_model_config_t cfg = dp_config(0);
    const int V = cfg.vocab_size, G = g_world * DP_B;
    hp_model_t ref = NULL, m = NULL;
    HP_ASSERT(hp_model_create(&cfg, G, DP_T, &ref) == HP_OK);
    HP_ASSERT(hp_model_init_weights(ref, DP_SEED) == HP_OK);
    HP_ASSERT(hp_model_create(&cfg, DP_B, DP_T, &m) == HP_OK);
    // ranks other than 0 start from other weights: DDP's init broadcast must fix that
    HP_ASSERT(hp_model_init_weights(m, g_rank == 0 ? DP_SEED : DP_SEED + 1) == HP_OK);
    hp_ddp_options_t o = hp_ddp_default_options();
    o.average = 0;   // the loss is globally normalised: sums
    o.overlap = overlap;
    if (cap) o.bucket_cap_bytes = cap;
    hp_ddp_t *d = NULL;
    HP_CHECK_OK(hp_ddp_create(m, world, &o, &d));
    if (!d) return;
    const int np = hp_model_num_params(m);
    hp_param_t *RP = hp_model_params(ref), *P = hp_model_params(m);
    hp_optim_config_t oc = dp_optim();
    hp_optim_t *ropt = NULL, *opt = NULL;
    hp_zero_t *z = NULL;
    HP_ASSERT(hp_optim_create(&oc, RP, np, &ropt) == HP_OK);
    if (zero) HP_CHECK_OK(hp_zero_create(&oc, P, np, world, &z));
    else HP_ASSERT(hp_optim_create(&oc, P, np, &opt) == HP_OK);
    int32_t *tok = hp_malloc(sizeof(int32_t) * G * DP_T), *tgt = hp_malloc(sizeof(int32_t) * G * DP_T);
    double worst_l = 0, worst_g = 0, worst_w = 0;
    for (int step = 0; step < steps; step++) {
        const float divisor = (float)dp_valid(step, accum, G, V);
        HP_CHECK_OK(hp_model_zero_grad(ref));
        HP_CHECK_OK(hp_model_zero_grad(m));
        double ref_loss = 0.0, local = 0.0;
        for (int a = 0; a < accum; a++) {
            ref_loss += dp_ref_microbatch(ref, step, a, G, divisor, tok, tgt);
            hp_ddp_set_requires_gradient_sync(d, a == accum - 1);
            for (int b = 0; b < DP_B; b++) dp_sequence(step, a, g_rank * DP_B + b, V, tok + b * DP_T, tgt + b * DP_T);
            float l = 0.0f;
            HP_CHECK_OK(hp_model_forward(m, tok, tgt, DP_B, DP_T, divisor, &l));
            HP_CHECK_OK(hp_model_backward(m));
            local += l;
        }
        float lf = (float)local, all[64];
        HP_ASSERT(hp_all_gather(&lf, all, 1, HP_F32, world, NULL) == HP_OK);
        double loss = 0.0;
        for (int r = 0; r < g_world; r++) loss += all[r];
        losses[step] = loss;
        double le = fabs(loss - ref_loss) / fabs(ref_loss);
        worst_l = fmax(worst_l, le);
        HP_CHECK(le <= 2e-5, "%s step %d: loss %.9g vs single-rank %.9g", what, step, loss, ref_loss);
        for (int i = 0; i < np; i++) {
            int64_t n = hp_tensor_numel(&P[i].grad.local);
            double e = dp_rel_err(P[i].grad.local.data, RP[i].grad.local.data, n);
            worst_g = fmax(worst_g, e);
            HP_CHECK(e <= 1e-4, "%s step %d: grad of %s (rel %.3g)", what, step, P[i].name, e);
        }
        double rn, n2;
        HP_CHECK_OK(hp_clip_grad_norm(RP, np, 1.0, NULL, 0, &rn));
        HP_CHECK_OK(hp_clip_grad_norm(P, np, 1.0, NULL, 0, &n2));   // replicated: the local norm
        HP_CHECK_CLOSE(n2, rn, 1e-4, 0.0);
        HP_CHECK_OK(hp_optim_step(ropt, 1.0));
        if (z) HP_CHECK_OK(hp_zero_step(z, 1.0));
        else HP_CHECK_OK(hp_optim_step(opt, 1.0));
    }
    for (int i = 0; i < np; i++) {
        int64_t n = hp_tensor_numel(&P[i].value.local);
        const float *a = P[i].value.local.data, *b = RP[i].value.local.data;
        double e = 0;
        for (int64_t k = 0; k < n; k++) e = fmax(e, fabs((double)a[k] - (double)b[k]));
        e /= oc.lr * steps;
        worst_w = fmax(worst_w, e);
        HP_CHECK(e <= 1e-2, "%s: weights of %s differ by %.3g of lr*steps", what, P[i].name, e);
    }
    if (z) {   // optimizer state ~1/W of the replicated optimizer's
        size_t mine = hp_zero_state_bytes(z), total = hp_optim_state_bytes(ropt);
        HP_CHECK(mine < total / g_world + total / (2 * g_world) + 4096,
                 "ZeRO-1 state %zu bytes on this rank vs %zu replicated (W=%d)", mine, total, g_world);
        if (g_rank == 0)
            printf("  ZeRO-1 optimizer state on rank 0: %.2f MiB of %.2f MiB (1/%d = %.2f)\n", mine / 1048576.0,
                   total / 1048576.0, g_world, total / 1048576.0 / g_world);
    }
    if (g_rank == 0)
        printf("%-40s W=%d: %2d steps, %d buckets, worst rel err loss %.2e grad %.2e, weights %.2e x lr*steps\n",
               what, g_world, steps, hp_ddp_num_buckets(d), worst_l, worst_g, worst_w);
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
