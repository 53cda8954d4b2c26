/* Shared harness of the data-parallel tests (test_fsdp*, test_ddp*, test_zero*): the llama3
 * debug model with short sequences, deterministic token data, a single-rank reference run of
 * the whole global batch in the same program, and comparisons of losses, gradients and
 * weights. */
#ifndef HP_TEST_DP_UTIL_H
#define HP_TEST_DP_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hyperparallel/comm.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/optim.h"

#define DP_T 8        /* sequence length */
#define DP_B 1        /* sequences per rank per micro-batch */
#define DP_SEED 1234

static inline uint32_t dp_hash(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
    return x;
}

/* Tokens and targets of global sequence `seq` of micro-batch `a` of step `step`; every 5th
 * target is ignored (-100) so the valid count differs per rank. */
static inline void dp_sequence(int step, int a, int seq, int V, int32_t *tok, int32_t *tgt) {
    for (int t = 0; t < DP_T; t++) {
        uint32_t h = dp_hash((uint32_t)(step * 1000003 + a * 10007 + seq * 101 + t));
        tok[t] = (int32_t)(h % (uint32_t)V);
        tgt[t] = (t + seq + step) % 5 == 4 ? -100 : (int32_t)(dp_hash(h) % (uint32_t)V);
    }
}

static inline int64_t dp_valid(int step, int accum, int n_seqs, int V) {
    int32_t tok[DP_T], tgt[DP_T];
    int64_t n = 0;
    for (int a = 0; a < accum; a++)
        for (int s = 0; s < n_seqs; s++) {
            dp_sequence(step, a, s, V, tok, tgt);
            for (int t = 0; t < DP_T; t++) n += tgt[t] != -100;
        }
    return n;
}

static inline hp_model_config_t dp_config(int n_layers) {
    hp_model_config_t c;
    hp_status_t s = hp_model_flavor("llama3", "debugmodel", &c);
    HP_ASSERT(s == HP_OK);
    if (n_layers > 0) c.n_layers = n_layers;
    c.max_seq_len = 64;
    return c;
}

static inline hp_optim_config_t dp_optim(void) {
    hp_optim_config_t o = hp_optim_default(HP_OPTIM_ADAMW);
    o.lr = 1e-3; o.beta1 = 0.9; o.beta2 = 0.95; o.weight_decay = 0.1;
    return o;
}

/* max |a - b| / max |b| */
static inline double dp_rel_err(const float *a, const float *b, int64_t n) {
    double d = 0.0, m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (e > d) d = e;
        if (fabs((double)b[i]) > m) m = fabs((double)b[i]);
    }
    return m > 0 ? d / m : d;
}

/* ---- The parity engine (docs/testing.md, "Data-parallel parity") ------------------------
 * The reference is the single-rank model run on the same shapes as one rank, doing what
 * that rank does before its gradients are reduced: from zero gradients, rank r's
 * micro-batches accumulated in order (or one micro-batch, where the layout reduces after
 * each). Same weights, same (B, T), the same kernels adding into the gradient buffer in the
 * same order, one thread: the reference's partial is bitwise the gradient that rank r hands
 * to its reduction, whatever the CPU, the BLAS kernel or the compiler's FMA contraction. Their
 * exact sum S (in double) and the sum of their magnitudes A are kept per element. A layout
 * may only add those n partials in another order (ring, tree, reduce-scatter), so for every
 * element
 *     |g_layout - S| <= gamma_n * A + u * |S|,   gamma_n = n*u / (1 - n*u)
 * (Higham, Accuracy and Stability of Numerical Algorithms, eq. 4.4: any order of summing n
 * terms; the last term for the final rounding of S); a bf16 reduction adds u = 2^-8 for each
 * of its additions and conversions. The step then goes on at identical weights: the
 * layout's clipped gradients are gathered into the reference's gradients and the reference's
 * optimizer (the same replicated AdamW) must give bitwise the layout's new weights, which are
 * then the weights of the next step on both sides. So every step is compared at identical
 * weights, and Adam's amplification of near-zero gradients (an element whose gradient can
 * change sign between two valid orders moves by up to 2 lr) cannot make the result depend on
 * the CPU. */
#define DP_U32 (1.0 / 16777216.0)   /* unit roundoff of f32: 2^-24 */
#define DP_UBF16 (1.0 / 256.0)      /* 2^-8 */

typedef struct dp_par {
    hp_param_t *rp;          /* the reference's params (full f32 tensors): gradient oracle and shadow */
    int np;
    int64_t *off, total;     /* element offset of each param in S, A */
    double *S, *A;           /* exact sum / sum of |.| of the step's partial gradients */
    double lsum, labs;       /* exact sum / sum of |.| of the step's partial losses */
    double gamma;            /* relative bound on A (see above) */
    int nsum;                /* ranks whose f32 norms are added (norm rounding) */
    int negative;            /* 1: a negative test; violations are counted, not reported */
    long violations;
    double worst_l, worst_g; /* worst error / bound seen */
    int64_t w_diff;          /* weights not bitwise equal to the shadow's */
} dp_par_t;

static inline int64_t dp_numel(const hp_param_t *q) {
    int64_t n = 1;
    for (int d = 0; d < q->value.local.ndim; d++) n *= q->value.global_shape[d];
    return n;
}

/* terms: partials added per element (ranks, x micro-batches where each is reduced);
 * reduce_steps/u_reduce: additions and conversions done in a narrower reduce dtype (0 for f32). */
static inline void dp_par_init(dp_par_t *p, hp_param_t *rp, int np, int64_t terms, int reduce_steps, double u_reduce,
                               int nsum) {
    memset(p, 0, sizeof *p);
    p->rp = rp;
    p->np = np;
    p->off = hp_malloc(sizeof(int64_t) * (size_t)(np + 1));
    p->off[0] = 0;
    for (int i = 0; i < np; i++) {
        HP_ASSERT(rp[i].value.local.dtype == HP_F32 && hp_tensor_numel(&rp[i].value.local) == dp_numel(&rp[i]));
        p->off[i + 1] = p->off[i] + dp_numel(&rp[i]);
    }
    p->total = p->off[np];
    p->S = hp_malloc(sizeof(double) * (size_t)p->total);
    p->A = hp_malloc(sizeof(double) * (size_t)p->total);
    p->gamma = (double)terms * DP_U32 / (1.0 - (double)terms * DP_U32) + reduce_steps * u_reduce;
    p->nsum = nsum;
}

static inline void dp_par_free(dp_par_t *p) { free(p->off); free(p->S); free(p->A); }

#define DP_PAR_CHECK(p, cond, ...)           \
    do {                                      \
        if ((p)->negative) {                  \
            if (!(cond)) (p)->violations++;   \
        } else {                              \
            HP_CHECK(cond, __VA_ARGS__);      \
        }                                     \
    } while (0)

static inline void dp_par_begin_step(dp_par_t *p) {
    memset(p->S, 0, sizeof(double) * (size_t)p->total);
    memset(p->A, 0, sizeof(double) * (size_t)p->total);
    p->lsum = p->labs = 0.0;
}

/* After one reference partial (run from zero gradients): adds its loss and gradients. */
static inline void dp_par_add_partial(dp_par_t *p, float loss) {
    p->lsum += loss;
    p->labs += fabs(loss);
    for (int i = 0; i < p->np; i++) {
        const float *g = p->rp[i].grad.local.data;
        double *S = p->S + p->off[i], *A = p->A + p->off[i];
        for (int64_t k = 0; k < p->off[i + 1] - p->off[i]; k++) {
            S[k] += g[k];
            A[k] += fabs(g[k]);
        }
    }
}

/* The layout's global loss is the double sum of per-rank f32 losses, each the f32 rounding of
 * bitwise-equal partial losses: one f32 rounding per rank. */
static inline void dp_par_check_loss(dp_par_t *p, const char *what, int step, double loss) {
    const double bound = 2.0 * DP_U32 * p->labs + 1e-300, e = fabs(loss - p->lsum);
    p->worst_l = fmax(p->worst_l, e / bound);
    DP_PAR_CHECK(p, e <= bound, "%s step %d: loss %.9g vs single-rank %.9g (|diff| %.3g > bound %.3g)", what, step,
                 loss, p->lsum, e, bound);
}

static inline double dp_par_bound(const dp_par_t *p, int64_t k) {
    return p->gamma * p->A[k] + DP_U32 * fabs(p->S[k]) + 1e-37;   /* + a few f32 underflows */
}

static inline double dp_clip_coef(double norm, double max_norm) {   /* torch.nn.utils.clip_grad_norm_ */
    double c = max_norm / (norm + 1e-6);
    return c >= 1.0 ? 1.0 : (double)(float)c;
}

/* The layout's gradient norm fn against the exact norm of S: they differ by at most
 * ||g_layout - S||_2 <= ||bound||_2, plus the f32 cross-rank sum of squares (nsum + 1
 * roundings of the squared norm). */
static inline void dp_par_check_norm(dp_par_t *p, const char *what, int step, double fn, double *rn_out) {
    double ss = 0.0, bb = 0.0;
    for (int64_t k = 0; k < p->total; k++) {
        ss += p->S[k] * p->S[k];
        double b = dp_par_bound(p, k);
        bb += b * b;
    }
    const double rn = sqrt(ss), bound = sqrt(bb) + (p->nsum + 2) * DP_U32 * rn;
    *rn_out = rn;
    DP_PAR_CHECK(p, fabs(fn - rn) <= bound, "%s step %d: gradient norm %.9g vs single-rank %.9g (bound %.3g)", what,
                 step, fn, rn, bound);
}

/* g: the layout's full gradient of param i after clipping with coefficient of its norm fn;
 * compared with the clipped exact sum, then copied into the reference (the shadow optimizer
 * steps on exactly the layout's gradients). */
static inline void dp_par_check_grad(dp_par_t *p, const char *what, int step, int i, const float *g, double fn,
                                     double rn, double max_norm) {
    const double cl = dp_clip_coef(fn, max_norm), cr = max_norm / (rn + 1e-6) >= 1.0 ? 1.0 : max_norm / (rn + 1e-6);
    const double *S = p->S + p->off[i];
    const int64_t n = p->off[i + 1] - p->off[i];
    double worst = 0.0;
    int64_t wk = 0;
    for (int64_t k = 0; k < n; k++) {
        const double b = cl * dp_par_bound(p, p->off[i] + k) + fabs(S[k]) * fabs(cl - cr) + DP_U32 * fabs(g[k]);
        const double r = fabs(g[k] - cr * S[k]) / b;
        if (r > worst) { worst = r; wk = k; }
    }
    p->worst_g = fmax(p->worst_g, worst);
    DP_PAR_CHECK(p, worst <= 1.0, "%s step %d: grad of %s[%lld] = %.9g vs single-rank %.9g: %.3g x its bound", what,
                 step, p->rp[i].name, (long long)wk, g[wk], cr * S[wk], worst);
    memcpy(p->rp[i].grad.local.data, g, sizeof(float) * (size_t)n);
}

/* w: the layout's full weights of param i after its optimizer step; the shadow (the
 * reference's optimizer, stepped on the same gradients from the same state) must agree
 * bitwise. w then becomes the reference's weights for the next step. */
static inline void dp_par_check_weights(dp_par_t *p, const char *what, int step, int i, const float *w) {
    float *rw = p->rp[i].value.local.data;
    const int64_t n = p->off[i + 1] - p->off[i];
    int64_t bad = 0, first = -1;
    for (int64_t k = 0; k < n; k++)
        if (memcmp(&rw[k], &w[k], sizeof(float)) != 0) { bad++; if (first < 0) first = k; }
    p->w_diff += bad;
    DP_PAR_CHECK(p, bad == 0, "%s step %d: %lld weights of %s differ from the replicated optimizer on the same "
                 "gradients (first [%lld]: %.9g vs %.9g)", what, step, (long long)bad, p->rp[i].name,
                 (long long)first, first >= 0 ? w[first] : 0.0, first >= 0 ? rw[first] : 0.0);
    memcpy(rw, w, sizeof(float) * (size_t)n);
}

/* The step's global loss: the double sum over the ranks of `local` (this rank's f32-rounded
 * micro-batch losses), checked against the reference; stored in *loss_out. */
static inline void dp_par_check_global_loss(dp_par_t *p, hp_comm_t world, const char *what, int step, double local,
                                            double *loss_out) {
    const int n = hp_comm_size(world);
    float lf = (float)local, all[64];
    HP_ASSERT(n <= 64 && hp_all_gather(&lf, all, 1, HP_F32, world, NULL) == HP_OK);
    double loss = 0.0;
    for (int r = 0; r < n; r++) loss += all[r];
    *loss_out = loss;
    dp_par_check_loss(p, what, step, loss);
}

/* A negative test's verdict: the injection may be seen on one rank only (DDP's replicas), so
 * the violations are summed over the world and must be > 0 (every rank reports the same). */
static inline void dp_par_check_caught(dp_par_t *p, hp_comm_t world, const char *what) {
    if (!p->negative) return;
    int64_t v = p->violations, any = 0;
    HP_ASSERT(hp_all_reduce(&v, &any, 1, HP_I64, HP_SUM, world, NULL) == HP_OK);
    p->violations = (long)any;
    HP_CHECK(p->violations > 0, "%s: the injected error was not caught (%ld violations)", what, p->violations);
}

/* Two runs that must give bitwise equal losses over their first n steps (an option that only
 * moves communication: overlap, reshard_after_forward). */
static inline void dp_check_same_losses(const double *a, const double *b, int n, const char *a_name,
                                        const char *b_name) {
    for (int s = 0; s < n; s++)
        HP_CHECK(a[s] == b[s], "step %d: %s %.17g != %s %.17g (must be bitwise equal)", s, a_name, a[s], b_name, b[s]);
}

/* Negative tests (docs/testing.md): an injected small error that the harness must catch. */
typedef enum {
    DP_INJECT_NONE = 0,
    DP_INJECT_DIVISOR,   /* rank 1's first micro-batch uses a loss divisor 1.001 x too large (1.05 x
                          * under a bf16 reduction, whose own rounding is 2^-8) */
    DP_INJECT_ROW,       /* rank 1's gradient of one param has one row replaced by its neighbour */
    DP_INJECT_LR,        /* rank 1's optimizer runs with lr x (1 + 1e-3) */
} dp_inject_t;

/* DP_INJECT_ROW: the last local row of param `i`'s gradient on rank 1 takes the row before it. */
static inline void dp_inject_row(hp_param_t *q) {
    hp_tensor_t *g = &q->grad.local;
    if (g->ndim != 2 || g->shape[0] < 2) return;
    float *d = g->data;
    const int64_t c = g->shape[1], r = g->shape[0];
    memcpy(d + (r - 1) * c, d + (r - 2) * c, sizeof(float) * (size_t)c);
}

#endif
