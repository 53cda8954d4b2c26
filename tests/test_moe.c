// The MoE feed-forward (src/nn/moe.c) against a plain per-token reference loop in double:
// router (sigmoid / softmax, expert_bias for the choice only, node-limited groups, route_norm,
// route_scale), grouped experts, shared experts, score before / after experts. Outputs equal
// the loop; every gradient (input, gate, experts, shared experts) equals central finite
// differences of the loop; tokens_per_expert equals the loop's routing (each token reaches
// exactly its top-k experts, no drops); two micro-batch contexts in flight keep their own
// routing; the harness fails on an injected 1e-4 error; bad configs are named. The same module
// equals a PyTorch re-implementation of TorchTitan's MoE (tools/golden/make_moe_golden.py,
// tests/data/golden_moe.safetensors): outputs, tokens_per_expert and every gradient.
// hp-test: ranks 1 timeout 60 coretype 1
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/nn.h"
#include "hyperparallel/safetensors.h"
#include "hp_test.h"

enum { MAXP = 8 };

typedef struct {
    hp_moe_config_t c;
    int N;
    int np;
    int64_t numel[MAXP];
    float *w[MAXP], *g[MAXP];   // module params (f32)
    double *wd[MAXP];           // the same values in double (the reference reads these)
    float *bias;
    double *x;                  // (N, D)
    double *dout;               // (N, D) the loss is sum(out * dout)
} prob_t;

static double urand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static void prob_init(prob_t *p, const hp_moe_config_t *c, int N, uint64_t seed) {
    memset(p, 0, sizeof(*p));
    p->c = *c;
    p->N = N;
    const int64_t D = c->dim, F = c->hidden, E = c->n_experts, Fs = (int64_t)c->n_shared_experts * c->shared_hidden;
    int64_t n[MAXP] = {E * D, E * F * D, E * D * F, E * F * D, Fs * D, D * Fs, Fs * D};
    p->np = Fs ? 7 : 4;
    for (int i = 0; i < p->np; i++) {
        p->numel[i] = n[i];
        p->w[i] = calloc((size_t)n[i], sizeof(float));
        p->g[i] = calloc((size_t)n[i], sizeof(float));
        p->wd[i] = calloc((size_t)n[i], sizeof(double));
        const double sc = i == 0 ? 0.8 : 0.4;
        for (int64_t j = 0; j < n[i]; j++) {
            p->w[i][j] = (float)(sc * urand(&seed));
            p->wd[i][j] = p->w[i][j];
        }
    }
    p->bias = calloc((size_t)E, sizeof(float));
    p->x = calloc((size_t)N * D, sizeof(double));
    p->dout = calloc((size_t)N * D, sizeof(double));
    for (int64_t j = 0; j < N * D; j++) {
        p->x[j] = (float)urand(&seed);
        p->dout[j] = (float)urand(&seed);
    }
}

static void prob_free(prob_t *p) {
    for (int i = 0; i < p->np; i++) { free(p->w[i]); free(p->g[i]); free(p->wd[i]); }
    free(p->bias); free(p->x); free(p->dout);
}

static double silu(double v) { return v / (1.0 + exp(-v)); }

/* Top-k by the module's rule (larger first, ties to the lower index). */
static void ref_topk(int *idx, const double *v, const int *allowed, int E, int K) {
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            if (allowed && !allowed[e]) continue;
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= idx[j] == e;
            if (!taken && (best < 0 || v[e] > v[best])) best = e;
        }
        idx[k] = best;
    }
}

/* The plain loop: per token, route then run each chosen expert and the shared experts.
 * out (N, D); counts (E) += routed tokens; returns sum(out * dout). *margin: the smallest gap
 * between the k-th and (k+1)-th biased score (finite differences must not flip a choice). */
static double ref_moe(const prob_t *p, const double *x, double *out, double *counts, double *margin) {
    const hp_moe_config_t *c = &p->c;
    const int D = c->dim, F = c->hidden, E = c->n_experts, K = c->top_k, Fs = c->n_shared_experts * c->shared_hidden;
    double loss = 0.0, mg = 1e30, cnt[HP_MOE_MAX_EXPERTS] = {0}, ssum[HP_MOE_MAX_EXPERTS] = {0};
    for (int n = 0; n < p->N; n++) {
        const double *xr = x + (size_t)n * D;
        double sc[HP_MOE_MAX_EXPERTS], ch[HP_MOE_MAX_EXPERTS], o[64] = {0};
        for (int e = 0; e < E; e++) {
            double l = 0;
            for (int d = 0; d < D; d++) l += p->wd[0][e * D + d] * xr[d];
            sc[e] = l;
        }
        if (c->score_fn == HP_MOE_SCORE_SOFTMAX) {
            double z = 0;
            for (int e = 0; e < E; e++) z += exp(sc[e]);
            for (int e = 0; e < E; e++) sc[e] = exp(sc[e]) / z;
        } else {
            for (int e = 0; e < E; e++) sc[e] = 1.0 / (1.0 + exp(-sc[e]));
        }
        for (int e = 0; e < E; e++) ch[e] = sc[e] + p->bias[e];
        for (int e = 0; e < E; e++) ssum[e] += sc[e];
        int allowed[HP_MOE_MAX_EXPERTS], *al = NULL;
        const int G = c->n_expert_groups;
        if (G > 1 && c->n_limited_groups < G) {
            const int per = E / G;
            double gs[HP_MOE_MAX_EXPERTS];
            for (int g = 0; g < G; g++) {
                int t2[2];
                ref_topk(t2, ch + g * per, NULL, per, 2);
                gs[g] = ch[g * per + t2[0]] + ch[g * per + t2[1]];
            }
            int sel[HP_MOE_MAX_EXPERTS];
            ref_topk(sel, gs, NULL, G, c->n_limited_groups);
            for (int e = 0; e < E; e++) allowed[e] = 0;
            for (int i = 0; i < c->n_limited_groups; i++)
                for (int e = 0; e < per; e++) allowed[sel[i] * per + e] = 1;
            al = allowed;
        }
        int ix[HP_MOE_MAX_EXPERTS];
        ref_topk(ix, ch, al, E, K < E ? K + 1 : K);
        if (K < E && ix[K] >= 0) mg = fmin(mg, ch[ix[K - 1]] - ch[ix[K]]);
        double gv[HP_MOE_MAX_EXPERTS], S = 0;
        for (int k = 0; k < K; k++) { gv[k] = sc[ix[k]]; S += gv[k]; }
        for (int k = 0; k < K; k++) gv[k] = (c->route_norm ? gv[k] / (S + 1e-20) : gv[k]) * c->route_scale;
        for (int k = 0; k < K; k++) {
            const int e = ix[k];
            if (counts) counts[e] += 1;
            cnt[e] += 1;
            double xin[64], a[64];
            for (int d = 0; d < D; d++) xin[d] = xr[d] * (c->score_before_experts ? gv[k] : 1.0);
            for (int f = 0; f < F; f++) {
                double h1 = 0, h3 = 0;
                for (int d = 0; d < D; d++) {
                    h1 += p->wd[1][((size_t)e * F + f) * D + d] * xin[d];
                    h3 += p->wd[3][((size_t)e * F + f) * D + d] * xin[d];
                }
                a[f] = silu(h1) * h3;
            }
            for (int d = 0; d < D; d++) {
                double y = 0;
                for (int f = 0; f < F; f++) y += p->wd[2][((size_t)e * D + d) * F + f] * a[f];
                o[d] += (c->score_before_experts ? 1.0 : gv[k]) * y;
            }
        }
        if (Fs) {
            double a[256];
            for (int f = 0; f < Fs; f++) {
                double h1 = 0, h3 = 0;
                for (int d = 0; d < D; d++) {
                    h1 += p->wd[4][(size_t)f * D + d] * xr[d];
                    h3 += p->wd[6][(size_t)f * D + d] * xr[d];
                }
                a[f] = silu(h1) * h3;
            }
            for (int d = 0; d < D; d++)
                for (int f = 0; f < Fs; f++) o[d] += p->wd[5][(size_t)d * Fs + f] * a[f];
        }
        for (int d = 0; d < D; d++) {
            if (out) out[(size_t)n * D + d] = o[d];
            loss += o[d] * p->dout[(size_t)n * D + d];
        }
    }
    if (c->aux_loss_coeff > 0) {   // HyperParallel's aux loss: coeff * E * sum_e f_e p_e
        double aux = 0;
        for (int e = 0; e < E; e++) aux += cnt[e] / ((double)p->N * K) * (ssum[e] / p->N);
        loss += c->aux_loss_coeff * E * aux;
    }
    if (margin) *margin = mg;
    return loss;
}

/* |a - b| <= tol * (1 + |b|): the largest violation ratio (<= 1 passes). */
static double worst(const float *a, const double *b, int64_t n, double tol) {
    double w = 0;
    for (int64_t i = 0; i < n; i++) w = fmax(w, fabs(a[i] - b[i]) / (tol * (1.0 + fabs(b[i]))));
    return w;
}

/* One forward of the module (x -> y, N x D rows, accumulating into y) and its backward (dy ->
 * dx, then the weight gradients). */
static void module_fwd_bwd(hp_module_t *mod, hp_act_t *act, float *x, float *y, float *dy, float *dx, int N, int D) {
    hp_tensor_t tx, ty, tdy, tdx;
    hp_tensor_view2(&tx, x, N, D);
    hp_tensor_view2(&ty, y, N, D);
    hp_tensor_view2(&tdy, dy, N, D);
    hp_tensor_view2(&tdx, dx, N, D);
    HP_CHECK_OK(hp_module_forward(mod, act, &tx, &ty));
    HP_CHECK_OK(hp_module_backward_input(mod, act, &tdy, &tdx));
    HP_CHECK_OK(hp_module_backward_weight(mod, act));
}

static void make_param(hp_param_t *pp, const char *name, float *v, float *g, int64_t n) {
    memset(pp, 0, sizeof(*pp));
    snprintf(pp->name, sizeof pp->name, "%s", name);
    HP_ASSERT(hp_tensor_init(&pp->value.local, HP_F32, 1, &n, v) == HP_OK);
    HP_ASSERT(hp_tensor_init(&pp->grad.local, HP_F32, 1, &n, g) == HP_OK);
}

/* Module forward + backward on p; compares with the loop. */
static void run_case(const char *label, const hp_moe_config_t *c, int B, int T, uint64_t seed, int biased) {
    prob_t p;
    const int N = B * T, D = c->dim, E = c->n_experts;
    prob_init(&p, c, N, seed);
    if (biased) {   // a strong bias on expert 1 and against expert 0: selection must change, gates not
        p.bias[1] = 0.5f;
        p.bias[0] = -0.5f;
    }
    hp_param_t prm[MAXP], *pp[MAXP];
    static const char *names[MAXP] = {"gate", "w1", "w2", "w3", "sw1", "sw2", "sw3"};
    for (int i = 0; i < p.np; i++) { make_param(&prm[i], names[i], p.w[i], p.g[i], p.numel[i]); pp[i] = &prm[i]; }
    float tpe[HP_MOE_MAX_EXPERTS] = {0};
    hp_module_t mod;
    hp_moe_impl_t impl;
    HP_CHECK_OK(hp_moe_module_init(&mod, &impl, "layers.1.moe", c, pp, p.np, p.bias, tpe));
    mod.id = 0;
    hp_act_t act;
    HP_CHECK_OK(hp_act_init(&act, 1, mod.ops->act_bytes(&mod, B, T)));
    act.B = B;
    act.T = T;
    size_t sfl = mod.ops->grad_scratch_floats(&mod, B, T);
    float *scratch = calloc(sfl, sizeof(float));
    act.grad_scratch = scratch;
    act.grad_scratch_floats = sfl;
    float *x = malloc(sizeof(float) * (size_t)N * D), *y = calloc((size_t)N * D, sizeof(float));
    float *dy = malloc(sizeof(float) * (size_t)N * D), *dx = malloc(sizeof(float) * (size_t)N * D);
    for (int i = 0; i < N * D; i++) { x[i] = (float)p.x[i]; dy[i] = (float)p.dout[i]; y[i] = 0.25f; }
    module_fwd_bwd(&mod, &act, x, y, dy, dx, N, D);

    double *ref = calloc((size_t)N * D, sizeof(double)), counts[HP_MOE_MAX_EXPERTS] = {0}, margin;
    ref_moe(&p, p.x, ref, counts, &margin);
    for (int i = 0; i < N * D; i++) ref[i] += 0.25;   // forward accumulates into out
    /* f32 module vs the double loop: each output is a few chained dot products of length
     * <= 32 over O(1) values plus exp; f32 rounding (6e-8 per op) over ~100 ops bounds the
     * relative error near 1e-5. */
    const double tol = 2e-5;
    double wo = worst(y, ref, (int64_t)N * D, tol);
    HP_CHECK(wo <= 1.0, "%s: output differs from the per-token loop (worst %.2f x tol)", label, wo);
    int cnt_ok = 1;
    double total = 0;
    for (int e = 0; e < E; e++) { cnt_ok &= tpe[e] == (float)counts[e]; total += tpe[e]; }
    HP_CHECK(cnt_ok && total == (double)N * c->top_k, "%s: tokens_per_expert differs from the loop's routing "
             "(total %.0f, expected %d)", label, total, N * c->top_k);
    if (biased) HP_CHECK(counts[1] > counts[0], "%s: the bias did not steer the choice", label);
    // the harness catches a small injected error
    const float keepy = y[3];
    y[3] += 1e-4f;
    HP_CHECK(worst(y, ref, (int64_t)N * D, tol) > 1.0, "%s: harness missed an injected 1e-4 output error", label);
    y[3] = keepy;

    /* gradients: central differences of the double loop (h 1e-5: truncation h^2 f''' ~ 1e-10,
     * rounding 1e-16/h ~ 1e-11), valid while no perturbation flips a top-k choice */
    HP_CHECK(margin > 1e-4, "%s: routing margin %.2e too small for finite differences", label, margin);
    const double h = 1e-5;
    const double gtol = 5e-5;   // f32 backward chains twice the forward's ops
    double wg = 0;
    for (int i = 0; i < p.np; i++) {
        double *fd = malloc(sizeof(double) * (size_t)p.numel[i]);
        for (int64_t j = 0; j < p.numel[i]; j++) {
            const double v = p.wd[i][j];
            p.wd[i][j] = v + h;
            double lp = ref_moe(&p, p.x, NULL, NULL, NULL);
            p.wd[i][j] = v - h;
            double lm = ref_moe(&p, p.x, NULL, NULL, NULL);
            p.wd[i][j] = v;
            fd[j] = (lp - lm) / (2 * h);
        }
        double w = worst(p.g[i], fd, p.numel[i], gtol);
        HP_CHECK(w <= 1.0, "%s: grad of %s differs from finite differences (worst %.2f x tol)", label, names[i], w);
        wg = fmax(wg, w);
        free(fd);
    }
    double *fdx = malloc(sizeof(double) * (size_t)N * D);
    for (int j = 0; j < N * D; j++) {
        const double v = p.x[j];
        p.x[j] = v + h;
        double lp = ref_moe(&p, p.x, NULL, NULL, NULL);
        p.x[j] = v - h;
        double lm = ref_moe(&p, p.x, NULL, NULL, NULL);
        p.x[j] = v;
        fdx[j] = (lp - lm) / (2 * h);
    }
    double wx = worst(dx, fdx, (int64_t)N * D, gtol);
    HP_CHECK(wx <= 1.0, "%s: input grad differs from finite differences (worst %.2f x tol)", label, wx);
    const float keep = dx[1];
    dx[1] += 1e-3f;
    HP_CHECK(worst(dx, fdx, (int64_t)N * D, gtol) > 1.0, "%s: harness missed an injected 1e-3 grad error", label);
    dx[1] = keep;
    printf("%s: output %.3f, grads %.3f, dx %.3f of tol; margin %.1e\n", label, wo, wg, wx, margin);

    /* two micro-batches in flight: forward A (x), forward B (other x), backward A equals the
     * single-context backward */
    float *dx2 = malloc(sizeof(float) * (size_t)N * D), *x2 = malloc(sizeof(float) * (size_t)N * D);
    float *y2 = calloc((size_t)N * D, sizeof(float));
    for (int i = 0; i < N * D; i++) { x2[i] = -x[(i * 7) % (N * D)]; y[i] = 0; }
    hp_act_t act2;
    HP_CHECK_OK(hp_act_init(&act2, 1, mod.ops->act_bytes(&mod, B, T)));
    act2.B = B;
    act2.T = T;
    act2.grad_scratch = calloc(sfl, sizeof(float));
    act2.grad_scratch_floats = sfl;
    hp_act_reset(&act);
    hp_tensor_t tx, ty, tdy, tx2, ty2, tdx2;
    hp_tensor_view2(&tx, x, N, D);
    hp_tensor_view2(&ty, y, N, D);
    hp_tensor_view2(&tdy, dy, N, D);
    hp_tensor_view2(&tx2, x2, N, D);
    hp_tensor_view2(&ty2, y2, N, D);
    hp_tensor_view2(&tdx2, dx2, N, D);
    HP_CHECK_OK(hp_module_forward(&mod, &act, &tx, &ty));
    HP_CHECK_OK(hp_module_forward(&mod, &act2, &tx2, &ty2));
    HP_CHECK_OK(hp_module_backward_input(&mod, &act, &tdy, &tdx2));
    HP_CHECK(memcmp(dx2, dx, sizeof(float) * (size_t)N * D) == 0,
             "%s: a second context in flight changed the first one's backward", label);
    free(act2.grad_scratch);
    hp_act_free(&act2);
    free(dx2); free(x2); free(y2);
    free(fdx); free(ref);
    free(x); free(y); free(dy); free(dx); free(scratch);
    hp_act_free(&act);
    prob_free(&p);
}

static float *st_read(hp_safetensors_t st, const char *name, int64_t *numel) {
    const hp_st_info_t *ti = NULL;
    if (hp_safetensors_find(st, name, &ti) != HP_OK) return NULL;
    int64_t n = 1;
    for (int i = 0; i < ti->ndim; i++) n *= ti->shape[i];
    float *b = malloc(sizeof(float) * (size_t)n);
    HP_ASSERT(hp_safetensors_read_raw(st, name, b, sizeof(float) * (size_t)n) == HP_OK);
    if (numel) *numel = n;
    return b;
}

/* A golden reference tensor, widened to double for worst(). */
static double *st_ref(hp_safetensors_t st, const char *name) {
    int64_t n = 0;
    float *f = st_read(st, name, &n);
    double *d = f ? malloc(sizeof(double) * (size_t)n) : NULL;
    for (int64_t i = 0; d && i < n; i++) d[i] = f[i];
    free(f);
    return d;
}

/* One golden case (the configs must match CASES in make_moe_golden.py). */
static void golden_case(hp_safetensors_t st, const char *nm, const hp_moe_config_t *c) {
    char key[128];
    int64_t nx = 0;
    snprintf(key, sizeof key, "%s.x", nm);
    float *x = st_read(st, key, &nx);
    HP_CHECK(x != NULL, "golden %s: no x", nm);
    if (!x) return;
    const int D = c->dim, N = (int)(nx / D), E = c->n_experts;
    static const char *pn[7] = {"gate", "w1", "w2", "w3", "sw1", "sw2", "sw3"};
    const int np = c->n_shared_experts ? 7 : 4;
    float *w[7], *g[7];
    int64_t numel[7];
    hp_param_t prm[7], *pp[7];
    for (int i = 0; i < np; i++) {
        snprintf(key, sizeof key, "%s.param.%s", nm, pn[i]);
        w[i] = st_read(st, key, &numel[i]);
        HP_ASSERT(w[i] != NULL);
        g[i] = calloc((size_t)numel[i], sizeof(float));
        make_param(&prm[i], pn[i], w[i], g[i], numel[i]);
        pp[i] = &prm[i];
    }
    snprintf(key, sizeof key, "%s.expert_bias", nm);
    float *bias = st_read(st, key, NULL);
    float tpe[HP_MOE_MAX_EXPERTS] = {0};
    hp_module_t mod;
    hp_moe_impl_t impl;
    HP_CHECK_OK(hp_moe_module_init(&mod, &impl, nm, c, pp, np, bias, tpe));
    mod.id = 0;
    hp_act_t act;
    HP_CHECK_OK(hp_act_init(&act, 1, mod.ops->act_bytes(&mod, 1, N)));
    act.B = 1;
    act.T = N;
    size_t sfl = mod.ops->grad_scratch_floats(&mod, 1, N);
    act.grad_scratch = calloc(sfl, sizeof(float));
    act.grad_scratch_floats = sfl;
    snprintf(key, sizeof key, "%s.dout", nm);
    float *dy = st_read(st, key, NULL);
    float *y = calloc((size_t)N * D, sizeof(float)), *dx = calloc((size_t)N * D, sizeof(float));
    module_fwd_bwd(&mod, &act, x, y, dy, dx, N, D);
    /* PyTorch ran in float64 on these float32 values and stored float32 (6e-8 relative); the
     * module's f32 chain is bounded as in run_case: 2e-5 for outputs, 5e-5 for gradients */
    snprintf(key, sizeof key, "%s.out", nm);
    double *ref = st_ref(st, key);
    double wo = worst(y, ref, (int64_t)N * D, 2e-5);
    HP_CHECK(wo <= 1.0, "golden %s: output differs from PyTorch (worst %.2f x tol)", nm, wo);
    ref[5] = (float)ref[5] + 1e-4f;
    HP_CHECK(worst(y, ref, (int64_t)N * D, 2e-5) > 1.0, "golden %s: harness missed an injected error", nm);
    free(ref);
    snprintf(key, sizeof key, "%s.tokens_per_expert", nm);
    float *tref = st_read(st, key, NULL);
    HP_CHECK(memcmp(tref, tpe, sizeof(float) * (size_t)E) == 0, "golden %s: tokens_per_expert differs", nm);
    free(tref);
    snprintf(key, sizeof key, "%s.grad.x", nm);
    ref = st_ref(st, key);
    double wg = worst(dx, ref, (int64_t)N * D, 5e-5);
    HP_CHECK(wg <= 1.0, "golden %s: grad x differs from PyTorch (worst %.2f x tol)", nm, wg);
    free(ref);
    for (int i = 0; i < np; i++) {
        snprintf(key, sizeof key, "%s.grad.%s", nm, pn[i]);
        ref = st_ref(st, key);
        double wi = worst(g[i], ref, numel[i], 5e-5);
        HP_CHECK(wi <= 1.0, "golden %s: grad %s differs from PyTorch (worst %.2f x tol)", nm, pn[i], wi);
        wg = fmax(wg, wi);
        free(ref);
        free(w[i]);
        free(g[i]);
    }
    printf("golden %s: output %.3f, grads %.3f of tol\n", nm, wo, wg);
    free(act.grad_scratch);
    hp_act_free(&act);
    free(x); free(y); free(dy); free(dx); free(bias);
}

static void run_golden(void) {
    char path[512];
    hp_test_source_path(path, sizeof path, "tests/data/golden_moe.safetensors");
    hp_safetensors_t st = NULL;
    HP_CHECK_OK(hp_safetensors_open(path, &st));
    if (!st) return;
    hp_moe_config_t ds = {.dim = 16, .hidden = 12, .n_experts = 8, .top_k = 3, .score_fn = HP_MOE_SCORE_SIGMOID,
                          .route_norm = 1, .route_scale = 2.5f, .n_shared_experts = 1, .shared_hidden = 12,
                          .n_expert_groups = 4, .n_limited_groups = 2};
    hp_moe_config_t qw = {.dim = 16, .hidden = 10, .n_experts = 6, .top_k = 2, .score_fn = HP_MOE_SCORE_SOFTMAX,
                          .route_norm = 1, .route_scale = 1.0f};
    hp_moe_config_t sb = {.dim = 12, .hidden = 8, .n_experts = 4, .top_k = 2, .score_fn = HP_MOE_SCORE_SOFTMAX,
                          .route_norm = 0, .route_scale = 1.0f, .score_before_experts = 1,
                          .n_shared_experts = 2, .shared_hidden = 6};
    golden_case(st, "ds", &ds);
    golden_case(st, "qw", &qw);
    golden_case(st, "sb", &sb);
    hp_safetensors_close(st);
}

int main(void) {
    // DeepSeek-V3 style: sigmoid, route_norm, route_scale, node-limited groups, shared expert,
    // scores after the experts, a selection bias
    hp_moe_config_t ds = {.dim = 12, .hidden = 8, .n_experts = 8, .top_k = 3, .score_fn = HP_MOE_SCORE_SIGMOID,
                          .route_norm = 1, .route_scale = 2.5f, .score_before_experts = 0,
                          .n_shared_experts = 1, .shared_hidden = 8, .n_expert_groups = 4, .n_limited_groups = 2};
    run_case("deepseek-style", &ds, 2, 7, 11, 1);
    // Qwen3-MoE style: softmax, route_norm, no shared experts
    hp_moe_config_t qw = {.dim = 10, .hidden = 6, .n_experts = 6, .top_k = 2, .score_fn = HP_MOE_SCORE_SOFTMAX,
                          .route_norm = 1, .route_scale = 1.0f};
    run_case("qwen3-style", &qw, 3, 5, 12, 0);
    // TorchTitan defaults of the debug MoE with scores before the experts, no norm, two shared
    hp_moe_config_t sb = {.dim = 8, .hidden = 5, .n_experts = 5, .top_k = 2, .score_fn = HP_MOE_SCORE_SOFTMAX,
                          .route_norm = 0, .route_scale = 1.0f, .score_before_experts = 1,
                          .n_shared_experts = 2, .shared_hidden = 3};
    run_case("score-before", &sb, 2, 6, 13, 1);
    // top_k = n_experts (every expert for every token)
    hp_moe_config_t all = {.dim = 6, .hidden = 4, .n_experts = 3, .top_k = 3, .score_fn = HP_MOE_SCORE_SIGMOID,
                           .route_norm = 0, .route_scale = 1.0f};
    run_case("top_k=E", &all, 1, 5, 14, 0);
    // more experts than K x D floats per token (the router's buffers do not borrow the rows')
    hp_moe_config_t wide = {.dim = 4, .hidden = 3, .n_experts = 16, .top_k = 1, .score_fn = HP_MOE_SCORE_SIGMOID,
                            .route_norm = 0, .route_scale = 1.0f};
    run_case("E > K*D", &wide, 2, 4, 15, 0);
    // the auxiliary loss: its gradient reaches the gate and the input (finite differences of the loop with it)
    hp_moe_config_t aux = qw;
    aux.aux_loss_coeff = 0.5f;
    run_case("aux loss", &aux, 3, 5, 16, 0);
    aux = ds;
    aux.aux_loss_coeff = 0.5f;
    run_case("aux loss (sigmoid, groups)", &aux, 2, 7, 17, 1);

    run_golden();

    // bad configs are named
    hp_moe_config_t bad = qw;
    bad.top_k = 7;
    HP_CHECK_ERR(hp_moe_config_check(&bad, "model.moe.top_k"), HP_ERR_INVALID_ARG, "top_k = 7");
    bad = ds;
    bad.n_expert_groups = 3;
    HP_CHECK_ERR(hp_moe_config_check(&bad, "model.moe"), HP_ERR_INVALID_ARG, "num_expert_groups 3");
    bad = ds;
    bad.n_limited_groups = 1;   // 1 group x 2 experts < top_k 3
    HP_CHECK_ERR(hp_moe_config_check(&bad, "model.moe"), HP_ERR_INVALID_ARG, "< top_k 3");
    return hp_test_finish("test_moe");
}
