/* The parallel styles on single modules, as PyTorch's test_tp_style.py: collective counts in
 * forward and backward (CommDebugMode analog: hp_comm_counts) and the local results against
 * the single-rank computation of the same module (outputs, input and weight gradients).
 * Linear(16, 16) on input (8, 16); embedding (16 x 16) on token ids (2, 8); loss_parallel
 * against the full cross-entropy. */
// hp-test: ranks 2 4 timeout 60 coretype 2
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hyperparallel/comm.h"
#include "hyperparallel/mesh.h"
#include "hyperparallel/nn.h"
#include "hyperparallel/tp.h"

#define IN 16
#define OUT 16
#define ROWS 8

static int W, R;
static hp_mesh_t g_mesh;

static float val(int64_t i, int salt) { return (float)(((i * 37 + salt * 11) % 29) - 14) / 29.0f; }

typedef struct counts { uint64_t ar, ag, rs, total; } counts_t;
static counts_t take(void) {
    counts_t c = {hp_comm_count(HP_COMM_ALL_REDUCE), hp_comm_count(HP_COMM_ALL_GATHER),
                  hp_comm_count(HP_COMM_REDUCE_SCATTER), hp_comm_count_total()};
    hp_comm_counts_reset();
    return c;
}
#define CHECK_COUNTS(c, ar_, ag_, rs_, what)                                                          \
    HP_CHECK((c).ar == (ar_) && (c).ag == (ag_) && (c).rs == (rs_) && (c).total == (ar_) + (ag_) + (rs_), \
             "%s: all_reduce %llu all_gather %llu reduce_scatter %llu total %llu, expected %d %d %d", what, \
             (unsigned long long)(c).ar, (unsigned long long)(c).ag, (unsigned long long)(c).rs,           \
             (unsigned long long)(c).total, ar_, ag_, rs_)

static hp_tensor_t t2(float *d, int64_t r, int64_t c) {
    hp_tensor_t t;
    int64_t s[2] = {r, c};
    HP_ASSERT(hp_tensor_init(&t, HP_F32, 2, s, d) == HP_OK);
    return t;
}

typedef struct lin {
    hp_module_t m;
    hp_linear_impl_t impl;
    hp_param_t w;
    float wv[OUT * IN], wg[OUT * IN];
} lin_t;

static void lin_init(lin_t *L) {
    memset(L, 0, sizeof(*L));
    snprintf(L->w.name, sizeof(L->w.name), "lin.weight");
    for (int i = 0; i < OUT * IN; i++) L->wv[i] = val(i, 1);
    int64_t s[2] = {OUT, IN};
    HP_ASSERT(hp_tensor_init(&L->w.value.local, HP_F32, 2, s, L->wv) == HP_OK);
    HP_ASSERT(hp_tensor_init(&L->w.grad.local, HP_F32, 2, s, L->wg) == HP_OK);
    L->w.value.global_shape[0] = L->w.grad.global_shape[0] = OUT;
    L->w.value.global_shape[1] = L->w.grad.global_shape[1] = IN;
    hp_param_t *ps[1] = {&L->w};
    hp_linear_module_init(&L->m, &L->impl, "lin", ps, 1, NULL, IN, OUT);
    L->m.id = 0;
}

/* Full single-rank reference: y = x W^T, dx = dy W, dW = dy^T x over `rows` rows. */
static void ref_linear(float *y, float *dx, float *dw, const float *x, const float *dy, int rows) {
    float w[OUT * IN];
    for (int i = 0; i < OUT * IN; i++) w[i] = val(i, 1);
    memset(dw, 0, sizeof(float) * OUT * IN);
    hp_ref_linear_forward(y, x, w, NULL, rows, IN, OUT);
    hp_ref_linear_backward(dx, dw, NULL, dy, x, w, rows, IN, OUT);
}

static hp_tp_plan_entry_t entry(const char *pat, hp_tp_style_t s) {
    hp_tp_plan_entry_t e;
    memset(&e, 0, sizeof(e));
    snprintf(e.pattern, sizeof(e.pattern), "%s", pat);
    e.style = s;
    return e;
}

static double maxdiff(const float *a, const float *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

static void test_colwise(int shard_input) {
    const char *what = shard_input ? "colwise input Shard(0)" : "colwise";
    lin_t L;
    lin_init(&L);
    hp_act_t act;
    HP_CHECK_OK(hp_act_init(&act, 1, 1 << 16));
    act.B = 1;
    act.T = ROWS;
    hp_tp_style_t s = hp_tp_colwise();
    if (shard_input) s = hp_tp_with_input(s, hp_shard(0));
    hp_tp_plan_entry_t e = entry("lin", s);
    hp_module_t *mods[1] = {&L.m};
    const hp_module_ops_t *ops0 = L.m.ops;
    hp_tp_t tp = NULL;
    HP_CHECK_OK(hp_tp_parallelize_modules(&tp, mods, 1, g_mesh, &e, 1, ROWS * W));
    if (!tp) return;
    HP_CHECK(mods[0] != &L.m && mods[0]->n_children == 1 && mods[0]->children[0] == &L.m &&
             strcmp(mods[0]->name, "lin") == 0 && L.m.ops == ops0 && L.impl.out_features == OUT,
             "%s: the root's entry is a wrapper holding the untouched module", what);
    HP_CHECK(L.w.value.local.shape[0] == OUT / W && L.w.value.placements[0].kind == HP_SHARD &&
             L.w.value.placements[0].dim == 0 && L.w.value.mesh == g_mesh, "%s: weight is Shard(0) local (%d, %d)",
             what, OUT / W, IN);
    // global input: (ROWS*W, IN) when sharded on rows (each rank holds ROWS), else (ROWS, IN) replicated
    const int grows = shard_input ? ROWS * W : ROWS;
    float xg[ROWS * 4 * IN], dyg[ROWS * 4 * OUT], y_ref[ROWS * 4 * OUT], dx_ref[ROWS * 4 * IN], dw_ref[OUT * IN];
    for (int i = 0; i < grows * IN; i++) xg[i] = val(i, 2);
    for (int i = 0; i < grows * OUT; i++) dyg[i] = val(i, 3);
    ref_linear(y_ref, dx_ref, dw_ref, xg, dyg, grows);
    const float *xl = shard_input ? xg + (size_t)R * ROWS * IN : xg;
    float x[ROWS * IN], y[ROWS * 4 * OUT], dy[ROWS * 4 * OUT], dx[ROWS * IN];
    memcpy(x, xl, sizeof(x));
    hp_tensor_t tx = t2(x, ROWS, IN), ty = t2(y, grows, OUT / W);
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_module_forward(mods[0], &act, &tx, &ty));
    counts_t c = take();
    if (shard_input) CHECK_COUNTS(c, 0, 1, 0, "colwise Shard(0) input forward");
    else CHECK_COUNTS(c, 0, 0, 0, "colwise forward");
    // local output = columns [R*OUT/W, ...) of the full output
    double d = 0;
    for (int r = 0; r < grows; r++) {
        d = fmax(d, maxdiff(y + r * (OUT / W), y_ref + r * OUT + R * (OUT / W), OUT / W));
        for (int j = 0; j < OUT / W; j++) dy[r * (OUT / W) + j] = dyg[r * OUT + R * (OUT / W) + j];
    }
    HP_CHECK(d < 1e-5, "%s: output differs by %g", what, d);
    hp_tensor_t tdy = t2(dy, grows, OUT / W), tdx = t2(dx, ROWS, IN);
    HP_CHECK_OK(hp_module_backward_input(mods[0], &act, &tdy, &tdx));
    HP_CHECK_OK(hp_module_backward_weight(mods[0], &act));
    c = take();
    if (shard_input) CHECK_COUNTS(c, 0, 0, 1, "colwise Shard(0) input backward");
    else CHECK_COUNTS(c, 1, 0, 0, "colwise backward");
    HP_CHECK(maxdiff(dx, dx_ref + (shard_input ? (size_t)R * ROWS * IN : 0), ROWS * IN) < 1e-5, "%s: input grad", what);
    HP_CHECK(maxdiff(L.wg, dw_ref + (size_t)R * (OUT / W) * IN, (OUT / W) * IN) < 1e-5, "%s: weight grad", what);
    hp_tp_destroy(tp);
    hp_act_free(&act);
}

static void test_rowwise(int shard_output) {
    const char *what = shard_output ? "rowwise output Shard(0)" : "rowwise";
    lin_t L;
    lin_init(&L);
    hp_act_t act;
    HP_CHECK_OK(hp_act_init(&act, 1, 1 << 16));
    act.B = 1;
    act.T = ROWS;
    hp_tp_style_t s = hp_tp_rowwise();
    if (shard_output) s = hp_tp_with_output(s, hp_shard(0), 1);
    hp_tp_plan_entry_t e = entry("lin", s);
    hp_module_t *mods[1] = {&L.m};
    hp_tp_t tp = NULL;
    HP_CHECK_OK(hp_tp_parallelize_modules(&tp, mods, 1, g_mesh, &e, 1, ROWS));
    if (!tp) return;
    HP_CHECK(L.w.value.local.shape[1] == IN / W && L.w.value.placements[0].kind == HP_SHARD &&
             L.w.value.placements[0].dim == 1, "%s: weight is Shard(1)", what);
    float xg[ROWS * IN], dyg[ROWS * OUT], y_ref[ROWS * OUT], dx_ref[ROWS * IN], dw_ref[OUT * IN];
    for (int i = 0; i < ROWS * IN; i++) xg[i] = val(i, 2);
    for (int i = 0; i < ROWS * OUT; i++) dyg[i] = val(i, 3);
    ref_linear(y_ref, dx_ref, dw_ref, xg, dyg, ROWS);
    const int lc = IN / W, orows = shard_output ? ROWS / W : ROWS;
    float x[ROWS * IN], y[ROWS * OUT], dx[ROWS * IN];
    for (int r = 0; r < ROWS; r++) memcpy(x + r * lc, xg + r * IN + R * lc, sizeof(float) * lc);
    hp_tensor_t tx = t2(x, ROWS, lc), ty = t2(y, orows, OUT);
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_module_forward(mods[0], &act, &tx, &ty));
    counts_t c = take();
    if (shard_output) CHECK_COUNTS(c, 0, 0, 1, "rowwise Shard(0) output forward");
    else CHECK_COUNTS(c, 1, 0, 0, "rowwise forward");
    const float *yr = y_ref + (shard_output ? (size_t)R * orows * OUT : 0);
    HP_CHECK(maxdiff(y, yr, orows * OUT) < 1e-5, "%s: output", what);
    const float *dy = dyg + (shard_output ? (size_t)R * orows * OUT : 0);
    hp_tensor_t tdy = t2((float *)dy, orows, OUT), tdx = t2(dx, ROWS, lc);
    HP_CHECK_OK(hp_module_backward_input(mods[0], &act, &tdy, &tdx));
    HP_CHECK_OK(hp_module_backward_weight(mods[0], &act));
    c = take();
    if (shard_output) CHECK_COUNTS(c, 0, 1, 0, "rowwise Shard(0) output backward");
    else CHECK_COUNTS(c, 0, 0, 0, "rowwise backward");
    double d = 0, dw = 0;
    for (int r = 0; r < ROWS; r++) d = fmax(d, maxdiff(dx + r * lc, dx_ref + r * IN + R * lc, lc));
    for (int o = 0; o < OUT; o++) dw = fmax(dw, maxdiff(L.wg + o * lc, dw_ref + o * IN + R * lc, lc));
    HP_CHECK(d < 1e-5 && dw < 1e-5, "%s: input grad %g weight grad %g", what, d, dw);
    hp_tp_destroy(tp);
    hp_act_free(&act);
}

#define V 16
#define C 16
#define EB 2
#define ET 8

static void test_embedding(int rowwise, int shard_output) {
    char what[64];
    snprintf(what, sizeof(what), "%s embedding%s", rowwise ? "rowwise" : "colwise", shard_output ? " output Shard(1)" : "");
    hp_module_t m;
    hp_embedding_impl_t impl;
    hp_param_t w;
    float wv[V * C], wg[V * C];
    memset(&w, 0, sizeof(w));
    memset(wg, 0, sizeof(wg));
    snprintf(w.name, sizeof(w.name), "emb.weight");
    for (int i = 0; i < V * C; i++) wv[i] = val(i, 5);
    int64_t s[2] = {V, C};
    HP_ASSERT(hp_tensor_init(&w.value.local, HP_F32, 2, s, wv) == HP_OK);
    HP_ASSERT(hp_tensor_init(&w.grad.local, HP_F32, 2, s, wg) == HP_OK);
    w.value.global_shape[0] = w.grad.global_shape[0] = V;
    w.value.global_shape[1] = w.grad.global_shape[1] = C;
    hp_embedding_module_init(&m, &impl, "emb", &w, V, C);
    m.id = 0;
    hp_act_t act;
    HP_CHECK_OK(hp_act_init(&act, 1, 1 << 16));
    act.B = EB;
    act.T = ET;
    hp_tp_style_t st = rowwise ? hp_tp_rowwise() : hp_tp_colwise();
    if (shard_output) st = hp_tp_with_output(st, hp_shard(1), 1);
    hp_tp_plan_entry_t e = entry("emb", st);
    hp_module_t *mods[1] = {&m};
    hp_tp_t tp = NULL;
    HP_CHECK_OK(hp_tp_parallelize_modules(&tp, mods, 1, g_mesh, &e, 1, EB * ET));
    if (!tp) return;
    int32_t tok[EB * ET];
    for (int i = 0; i < EB * ET; i++) tok[i] = (int32_t)((i * 7 + 3) % V);
    hp_tensor_t tt;
    int64_t ts[2] = {EB, ET};
    HP_ASSERT(hp_tensor_init(&tt, HP_I32, 2, ts, tok) == HP_OK);
    const int N = EB * ET, lt = shard_output ? ET / W : ET, orows = EB * lt, ocols = rowwise ? C : C / W;
    float y[EB * ET * C], dy[EB * ET * C];
    hp_tensor_t ty = t2(y, orows, ocols);
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_module_forward(mods[0], &act, &tt, &ty));
    counts_t c = take();
    if (!rowwise) CHECK_COUNTS(c, 0, 0, 0, "colwise embedding forward");
    else if (shard_output) CHECK_COUNTS(c, 0, 0, 1, "rowwise embedding Shard(1) forward");
    else CHECK_COUNTS(c, 1, 0, 0, "rowwise embedding forward");
    // expected rows: (b, t) for t in this rank's chunk when Shard(1)
    double d = 0;
    float gref[V * C];
    memset(gref, 0, sizeof(gref));
    (void)N;
    for (int b = 0; b < EB; b++)
        for (int t = 0; t < lt; t++) {
            int gt = shard_output ? R * lt + t : t, n = b * ET + gt, row = b * lt + t;
            for (int j = 0; j < ocols; j++) {
                int gc = rowwise ? j : R * (C / W) + j;
                d = fmax(d, fabs(y[row * ocols + j] - val(tok[n] * C + gc, 5)));
                dy[row * ocols + j] = val(n * C + gc, 6);
            }
        }
    HP_CHECK(d < 1e-6, "%s: output differs by %g", what, d);
    // reference weight gradient (full): every token's full gradient row
    for (int n = 0; n < N; n++)
        for (int j = 0; j < C; j++) gref[tok[n] * C + j] += val(n * C + j, 6);
    hp_tensor_t tdy = t2(dy, orows, ocols);
    HP_CHECK_OK(hp_module_backward_input(mods[0], &act, &tdy, NULL));
    HP_CHECK_OK(hp_module_backward_weight(mods[0], &act));
    c = take();
    if (rowwise && shard_output) CHECK_COUNTS(c, 0, 1, 0, "rowwise embedding Shard(1) backward");
    else CHECK_COUNTS(c, 0, 0, 0, "embedding backward");
    hp_tensor_t full;
    void *owned = NULL;
    HP_CHECK_OK(hp_dtensor_full_tensor(&full, &owned, NULL, &w.grad));
    if (owned) HP_CHECK(maxdiff(full.data, gref, V * C) < 1e-5, "%s: weight grad", what);
    free(owned);
    hp_tp_destroy(tp);
    hp_act_free(&act);
}

/* SequenceParallel and PrepareModuleInput / Output around an RMSNorm(16) on (8, 16). */
static void test_norm_styles(void) {
    for (int which = 0; which < 3; which++) {
        hp_module_t m;
        hp_rmsnorm_impl_t impl;
        hp_param_t w;
        float wv[IN], wg[IN];
        memset(&w, 0, sizeof(w));
        memset(wg, 0, sizeof(wg));
        snprintf(w.name, sizeof(w.name), "norm.weight");
        for (int i = 0; i < IN; i++) wv[i] = 1.0f + val(i, 7);
        int64_t s[1] = {IN};
        HP_ASSERT(hp_tensor_init(&w.value.local, HP_F32, 1, s, wv) == HP_OK);
        HP_ASSERT(hp_tensor_init(&w.grad.local, HP_F32, 1, s, wg) == HP_OK);
        w.value.global_shape[0] = w.grad.global_shape[0] = IN;
        hp_rmsnorm_module_init(&m, &impl, "norm", &w, IN, 1e-5f);
        m.id = 0;
        hp_act_t act;
        HP_CHECK_OK(hp_act_init(&act, 1, 1 << 16));
        act.B = 1;
        act.T = ROWS;
        hp_tp_style_t st = which == 0 ? hp_tp_sequence_parallel()
                         : which == 1 ? hp_tp_prepare_input(hp_shard(0), hp_replicate())
                                      : hp_tp_prepare_output(hp_replicate(), hp_shard(0));
        const char *what = hp_tp_style_name(st.kind);
        hp_tp_plan_entry_t e = entry("norm", st);
        hp_module_t *mods[1] = {&m};
        hp_tp_t tp = NULL;
        HP_CHECK_OK(hp_tp_parallelize_modules(&tp, mods, 1, g_mesh, &e, 1, ROWS * W));
        if (!tp) continue;
        HP_CHECK(w.value.mesh == g_mesh && w.value.placements[0].kind == HP_REPLICATE, "%s: weight Replicate", what);
        // rows in / out per style
        const int in_rows = which == 1 ? ROWS : (which == 0 ? ROWS : ROWS * W);
        const int out_rows = which == 1 ? ROWS * W : (which == 0 ? ROWS : ROWS);
        float x[ROWS * 4 * IN], y[ROWS * 4 * IN], dy[ROWS * 4 * IN], dx[ROWS * 4 * IN];
        for (int i = 0; i < in_rows * IN; i++) x[i] = val(i + (which == 2 ? 0 : R * ROWS * IN), 8);
        hp_tensor_t tx = t2(x, in_rows, IN), ty = t2(y, out_rows, IN);
        hp_comm_counts_reset();
        HP_CHECK_OK(hp_module_forward(mods[0], &act, &tx, &ty));
        counts_t c = take();
        if (which == 1) CHECK_COUNTS(c, 0, 1, 0, "PrepareModuleInput Shard(0)->Replicate forward");
        else CHECK_COUNTS(c, 0, 0, 0, which == 0 ? "SequenceParallel forward" : "PrepareModuleOutput R->S(0) forward");
        for (int i = 0; i < out_rows * IN; i++) dy[i] = val(i, 9);
        hp_tensor_t tdy = t2(dy, out_rows, IN), tdx = t2(dx, in_rows, IN);
        HP_CHECK_OK(hp_module_backward_input(mods[0], &act, &tdy, &tdx));
        HP_CHECK_OK(hp_module_backward_weight(mods[0], &act));
        c = take();
        // SequenceParallel: the weight grad (Partial over the sequence shards) is all-reduced
        // here in backward_weight (PyTorch keeps it Partial and reduces it later)
        if (which == 0) CHECK_COUNTS(c, 1, 0, 0, "SequenceParallel backward");
        else if (which == 1) CHECK_COUNTS(c, 0, 0, 0, "PrepareModuleInput backward (replicated grad: local chunk)");
        else CHECK_COUNTS(c, 0, 1, 0, "PrepareModuleOutput backward");
        hp_tp_destroy(tp);
        hp_act_free(&act);
    }
}

/* loss_parallel over vocab-sharded logits (N = 6, V = 32) equals the full cross-entropy:
 * losses, lse, the sum and valid count (one ignored row), and the local columns of dlogits;
 * 3 all-reduces forward (max, sum of exp, target logit), none backward. */
static void test_loss_parallel(hp_comm_t comm) {
    enum { N = 6, VV = 32 };
    float logits[N * VV], lse_ref[N], lse[N], dref[N * VV];
    double losses_ref[N], losses[N];
    int32_t tgt[N] = {3, 31, HP_IGNORE_INDEX, 0, 17, 16};
    for (int i = 0; i < N * VV; i++) logits[i] = 3.0f * val(i, 4);
    int64_t nv_ref = 0, nv = 0;
    double sum_ref = hp_cross_entropy_forward(losses_ref, lse_ref, logits, tgt, N, VV, &nv_ref);
    hp_cross_entropy_backward(dref, logits, lse_ref, tgt, 0.25f, N, VV);
    const int vl = VV / W;
    float loc[N * VV], dl[N * VV];
    for (int n = 0; n < N; n++) memcpy(loc + n * vl, logits + n * VV + R * vl, sizeof(float) * vl);
    double sum = 0;
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_loss_parallel_forward(&sum, losses, lse, loc, tgt, N, vl, (int64_t)R * vl, comm, &nv));
    counts_t c = take();
    CHECK_COUNTS(c, 3, 0, 0, "loss_parallel forward");
    hp_loss_parallel_backward(dl, loc, lse, tgt, 0.25f, N, vl, (int64_t)R * vl);
    c = take();
    CHECK_COUNTS(c, 0, 0, 0, "loss_parallel backward");
    HP_CHECK(nv == nv_ref && nv == N - 1, "valid %lld vs %lld", (long long)nv, (long long)nv_ref);
    HP_CHECK_CLOSE(sum, sum_ref, 1e-6, 0);
    double dmax = 0, lmax = 0;
    for (int n = 0; n < N; n++) {
        lmax = fmax(lmax, fabs(losses[n] - losses_ref[n]) + fabs(lse[n] - lse_ref[n]));
        dmax = fmax(dmax, maxdiff(dl + n * vl, dref + n * VV + R * vl, vl));
    }
    HP_CHECK(lmax < 1e-5 && dmax < 1e-6, "loss_parallel: losses/lse differ by %g, dlogits by %g", lmax, dmax);
    HP_CHECK(losses[2] == 0.0, "ignored row loss %g", losses[2]);
}

int main(int argc, char **argv) {
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &R, &W);
    int64_t shape[1] = {W};
    const char *names[1] = {"tp"};
    HP_ASSERT(hp_mesh_create(world, 1, shape, names, &g_mesh) == HP_OK);
    test_colwise(0);
    test_colwise(1);
    test_rowwise(0);
    test_rowwise(1);
    test_embedding(0, 0);
    test_embedding(1, 0);
    test_embedding(1, 1);
    test_norm_styles();
    test_loss_parallel(world);
    hp_mesh_destroy(g_mesh);
    int rc = hp_test_finish("test_tp_style");
    hp_comm_finalize();
    return rc;
}
