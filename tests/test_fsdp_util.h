/* Parity harness of the fully_shard tests: the llama3 debug model (T = 8, one sequence per rank per
 * micro-batch) trained for AdamW steps with clipping on FSDP over every rank (and HSDP 2 x
 * W/2 on 4 and 8 ranks) against the single-rank run of the whole global batch in the same
 * program: losses, the full_tensor of every sharded gradient, gradient norms and final
 * weights. With and without gradient accumulation (sync every micro-batch, and no-sync until
 * the last), reshard_after_forward True/False/2, overlap on and off (bitwise equal losses).
 * bf16 mixed precision is compared against fully_shard over a 1-rank mesh under the same
 * policy. Tolerances: f32 (reduction order ~1e-6): loss 2e-5 relative, gradients 1e-4 of
 * the tensor's max |g|, weights after the steps max |dw| <= 1e-2 x lr*steps (Adam amplifies
 * differences of near-zero gradients); bf16 params with f32 reduce: loss 1e-3, gradients
 * 1e-3, weights 0.5 x lr*steps; bf16 reduce: gradients 3e-2, weights RMS <= 0.25 x lr*steps. */
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

typedef struct pcase {
    const char *what;
    int steps, accum, nosync, raf, R, overlap;
    hp_dtype_t pdt, rdt;
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

    // reference: the whole global batch on one rank (plain model, or FSDP over a 1-rank mesh
    // under the same mixed-precision policy)
    hp_model_t ref = NULL, fm = NULL;
    HP_ASSERT(hp_model_create(&cfg, G, DP_T, &ref) == HP_OK);
    HP_ASSERT(hp_model_init_weights(ref, DP_SEED) == HP_OK);
    hp_comm_t self_comm = NULL;
    hp_mesh_t self_mesh = NULL;
    hp_fsdp_t *rf = NULL;
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
    hp_fsdp_t *f = NULL;
    HP_CHECK_OK(hp_fully_shard(fm, mesh, &o, &f));
    if (!f) return;
    hp_param_t *FP = hp_fsdp_params(f);
    hp_optim_config_t oc = dp_optim();
    hp_optim_t *ropt = NULL, *fopt = NULL;
    HP_ASSERT(hp_optim_create(&oc, RP, np, &ropt) == HP_OK);
    HP_ASSERT(hp_optim_create(&oc, FP, np, &fopt) == HP_OK);
    hp_comm_t comms[2];
    int nc = hp_fsdp_grad_comms(f, comms);

    int32_t *tok = hp_malloc(sizeof(int32_t) * G * DP_T), *tgt = hp_malloc(sizeof(int32_t) * G * DP_T);
    size_t maxn = 0;
    for (int i = 0; i < np; i++)
        if ((size_t)hp_dtensor_local_numel(&hp_model_params(ref)[i].value) > maxn)
            maxn = (size_t)(hp_model_params(ref)[i].value.global_shape[0] *
                            (hp_model_params(ref)[i].value.local.ndim == 2 ? hp_model_params(ref)[i].value.global_shape[1] : 1));
    float *full = hp_malloc(sizeof(float) * maxn), *rfull = hp_malloc(sizeof(float) * maxn);
    const double gtol = !mixed ? 1e-4 : pc->rdt == HP_BF16 ? 3e-2 : 1e-3, ltol = mixed ? 1e-3 : 2e-5;
    // weights: Adam's update of an element is at most ~lr per step, and for near-zero
    // gradients it is m/sqrt(v) of tiny numbers, so rounding differences show up there; the
    // weights are compared against the size of the total update (lr * steps)
    const double wtol = (mixed ? 0.5 : 1e-2) * oc.lr * pc->steps;
    double worst_g = 0.0, worst_l = 0.0;
    for (int step = 0; step < pc->steps; step++) {
        const float divisor = (float)dp_valid(step, pc->accum, G, V);
        if (rf) HP_CHECK_OK(hp_fsdp_zero_grad(rf));
        else HP_CHECK_OK(hp_model_zero_grad(ref));
        HP_CHECK_OK(hp_fsdp_zero_grad(f));
        double ref_loss = 0.0, local = 0.0;
        for (int a = 0; a < pc->accum; a++) {
            ref_loss += dp_ref_microbatch(ref, step, a, G, divisor, tok, tgt);
            hp_fsdp_set_requires_gradient_sync(f, pc->nosync ? a == pc->accum - 1 : 1);
            for (int b = 0; b < DP_B; b++)
                dp_sequence(step, a, g_rank * DP_B + b, V, tok + b * DP_T, tgt + b * DP_T);
            float l = 0.0f;
            HP_CHECK_OK(hp_model_forward(fm, tok, tgt, DP_B, DP_T, divisor, &l));
            HP_CHECK_OK(hp_model_backward(fm));
            local += l;
        }
        float lf = (float)local, all[64];
        HP_ASSERT(hp_all_gather(&lf, all, 1, HP_F32, world, NULL) == HP_OK);
        double loss = 0.0;
        for (int r = 0; r < g_world; r++) loss += all[r];
        losses[step] = loss;
        double le = fabs(loss - ref_loss) / fabs(ref_loss);
        if (le > worst_l) worst_l = le;
        HP_CHECK(le <= ltol, "%s step %d: loss %.9g vs single-rank %.9g (rel %.3g)", pc->what, step, loss,
                 ref_loss, le);
        // full_tensor of every gradient on the first and the last step (one all-gather per
        // parameter: the slow part on an oversubscribed machine); the loss and the gradient
        // norm are compared every step
        for (int i = 0; i < np && (step == 0 || step == pc->steps - 1); i++) {
            const hp_param_t *q = &hp_model_params(ref)[i];
            int64_t n = q->value.global_shape[0] * (q->value.local.ndim == 2 ? q->value.global_shape[1] : 1);
            HP_CHECK_OK(hp_fsdp_full_grad(f, i, full));
            if (rf) HP_CHECK_OK(hp_fsdp_full_grad(rf, i, rfull));
            else memcpy(rfull, q->grad.local.data, sizeof(float) * (size_t)n);
            double e = dp_rel_err(full, rfull, n);
            if (e > worst_g) worst_g = e;
            HP_CHECK(e <= gtol, "%s step %d: grad of %s differs from the single-rank run (rel %.3g)", pc->what,
                     step, FP[i].name, e);
        }
        double rn = 0.0, fn = 0.0;
        HP_CHECK_OK(hp_clip_grad_norm(RP, np, 1.0, NULL, 0, &rn));
        HP_CHECK_OK(hp_clip_grad_norm(FP, np, 1.0, comms, nc, &fn));
        HP_CHECK_CLOSE(fn, rn, mixed ? 3e-2 : 1e-4, 0.0);
        HP_CHECK_OK(hp_optim_step(ropt, 1.0));
        HP_CHECK_OK(hp_optim_step(fopt, 1.0));
    }
    double worst_w = 0.0;
    for (int i = 0; i < np; i++) {
        const hp_param_t *q = &hp_model_params(ref)[i];
        int64_t n = q->value.global_shape[0] * (q->value.local.ndim == 2 ? q->value.global_shape[1] : 1);
        HP_CHECK_OK(hp_fsdp_full_value(f, i, full));
        if (rf) HP_CHECK_OK(hp_fsdp_full_value(rf, i, rfull));
        else memcpy(rfull, q->value.local.data, sizeof(float) * (size_t)n);
        // bf16 reductions round every gradient to 8 bits of mantissa: Adam's update of an
        // element with a tiny gradient may then change sign, so the weights are compared by
        // the RMS difference (in units of lr*steps) there and by the max difference otherwise
        double e = 0.0, ss = 0.0;
        for (int64_t k = 0; k < n; k++) {
            double dk = fabs((double)full[k] - (double)rfull[k]);
            e = fmax(e, dk);
            ss += dk * dk;
        }
        if (pc->rdt == HP_BF16) e = sqrt(ss / (double)n) / 0.5;   // RMS <= 0.25 lr*steps
        e /= oc.lr * pc->steps;
        if (e > worst_w) worst_w = e;
        HP_CHECK(e * oc.lr * pc->steps <= wtol, "%s: weights of %s after %d steps differ by %.3g of lr*steps",
                 pc->what, FP[i].name, pc->steps, e);
    }
    if (g_rank == 0)
        printf("%-44s W=%d: %2d steps, worst rel err loss %.2e grad %.2e, weights %.2e x lr*steps\n", pc->what, g_world,
               pc->steps, worst_l, worst_g, worst_w);
    free(tok); free(tgt); free(full); free(rfull);
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

#endif
