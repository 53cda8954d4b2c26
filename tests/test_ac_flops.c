// TorchTitan's activation-checkpointing FLOP test (tests/unit_tests/test_activation_checkpoint.py,
// test_flops) reproduced through this library's module protocol: the same toy block (x (512, 512)
// with its gradient, gate 512 -> 512, wq 512 -> 512, output 512 -> 1024, loss = output.sum()), its
// parameters named as TorchTitan's (layers.0.moe.router.gate, layers.0.attention.wq,
// layers.0.output). The backward's FLOPs are counted at the kernel table as FlopCounterMode counts
// them (2 M N K per GEMM: the backward's own and its replay's), in units of 2 * 512^3:
//   no AC 8; op-level SAC 9 (gate and output saved, wq, the second GEMM, recomputed);
//   SAC with per_op_sac_force_recompute_mm_shapes_by_fqns = moe.router.gate 10 (every GEMM of the
//   gate's shape: gate and wq recomputed); = output 11 (wq and output); full AC 12:
// TorchTitan's counts. The estimate (hp_ac_decide) predicts each recompute, and the input and
// parameter gradients are bitwise equal in the five runs. Kept bytes (TorchTitan's test_mem
// measures 2, 3, 2, 1, 0 MB): here 2, 1, 0, 1, 0 MiB, because the checkpointed module's output is
// the caller's buffer (TorchTitan's SAC also stores the 2 MB output of the saved last GEMM).
// hp-test: ranks 1 timeout 300
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/nn.h"
#include "hp_test.h"

enum { N = 512, D = 512, O = 1024 };
static const double UNIT = 2.0 * 512 * 512 * 512;

/* FlopCounterMode at the kernel table: every GEMM while g_on. */
static hp_backend_t g_count;
static const hp_backend_t *g_base;
static double g_flops;
static int g_on;
static void c_fwd(void *ctx, float *out, const float *inp, const float *w, const float *b, int n, int ic, int oc,
                  int acc) {
    if (g_on) g_flops += 2.0 * n * ic * oc;
    g_base->linear_forward(ctx, out, inp, w, b, n, ic, oc, acc);
}
static void c_bwi(void *ctx, float *din, const float *dout, const float *w, int n, int ic, int oc, int acc) {
    if (g_on) g_flops += 2.0 * n * ic * oc;
    g_base->linear_backward_input(ctx, din, dout, w, n, ic, oc, acc);
}
static void c_bww(void *ctx, float *dw, float *db, const float *dout, const float *inp, int n, int ic, int oc) {
    if (g_on) g_flops += 2.0 * n * ic * oc;
    g_base->linear_backward_weight(ctx, dw, db, dout, inp, n, ic, oc);
}

/* The toy TransformerBlock: gate -> wq -> output (children 0, 1, 2). */
typedef struct toy_saved {
    float *g, *q;   // (N, D) gate and wq outputs
    int n;
} toy_saved_t;
#define T_GATE(m) ((m)->children[0])
#define T_WQ(m) ((m)->children[1])
#define T_OUT(m) ((m)->children[2])
static size_t fl(size_t n) { return hp_arena_round(sizeof(float) * n); }

static size_t toy_act_bytes(const hp_module_t *m, int B, int T) {
    size_t s = hp_arena_round(sizeof(toy_saved_t)) + 2 * fl((size_t)B * T * D);
    for (int i = 0; i < m->n_children; i++) s += m->children[i]->ops->act_bytes(m->children[i], B, T);
    return s;
}
static size_t toy_scratch(const hp_module_t *m, int B, int T) { (void)m; return 2 * (size_t)B * T * D; }

static hp_status_t toy_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    const int n = act->B * act->T;
    toy_saved_t *s = hp_act_slot_new(act, m, sizeof(*s));
    s->n = n;
    s->g = hp_act_save_out(act, T_GATE(m), sizeof(float) * (size_t)n * D);
    s->q = hp_act_save_out(act, T_WQ(m), sizeof(float) * (size_t)n * D);
    hp_tensor_t tg, tq;
    hp_tensor_view2(&tg, s->g, n, D);
    hp_tensor_view2(&tq, s->q, n, D);
    HP_TRY(hp_module_forward(T_GATE(m), act, in, &tg));
    HP_TRY(hp_module_forward(T_WQ(m), act, &tg, &tq));
    return hp_module_forward(T_OUT(m), act, &tq, out);
}
static hp_status_t toy_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    toy_saved_t *s = hp_act_slot(act, m);
    size_t off = 0;
    hp_tensor_t tdq, tdg;
    hp_tensor_view2(&tdq, hp_act_scratch(act, &off, (size_t)s->n * D), s->n, D);
    hp_tensor_view2(&tdg, hp_act_scratch(act, &off, (size_t)s->n * D), s->n, D);
    HP_TRY(hp_module_backward_input(T_OUT(m), act, dout, &tdq));
    HP_TRY(hp_module_backward_input(T_WQ(m), act, &tdq, &tdg));
    return hp_module_backward_input(T_GATE(m), act, &tdg, din);
}
static hp_status_t toy_backward_weight(hp_module_t *m, hp_act_t *act) {
    for (int i = 2; i >= 0; i--) HP_TRY(hp_module_backward_weight(m->children[i], act));
    return HP_OK;
}
/* Its items: the gate's and wq's outputs; output writes the block's output. */
static void toy_save_items(const hp_module_t *m, int B, int T, hp_save_list_t *L) {
    const size_t n = (size_t)B * T;
    hp_save_child(L, T_GATE(m), B, T, fl(n * D), HP_SAVE_MM, 2.0 * n * D * D, NULL, 0);
    hp_save_child(L, T_WQ(m), B, T, fl(n * D), HP_SAVE_MM, 2.0 * n * D * D, NULL, 0);
    hp_save_final(L, m, T_OUT(m), B, T, HP_SAVE_MM, 2.0 * n * D * O, NULL, 0);
}
static const hp_module_ops_t toy_ops = {
    "toy_block", toy_act_bytes, toy_scratch, toy_forward, toy_backward_input, toy_backward_weight, NULL,
    toy_save_items,
};

static uint32_t g_seed = 7;
static float frand(void) {
    g_seed = g_seed * 1664525u + 1013904223u;
    return (float)((g_seed >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

typedef struct result {
    double bw_units, est_units, kept_mib;
    float *dx, *dw;   // input gradient; the three weight gradients
} result_t;

/* One forward + backward of the toy under `o` (NULL: no wrapper). */
static void run(const hp_ac_options_t *o, const float *x, float *w[3], result_t *r) {
    const int ic[3] = {D, D, D}, oc[3] = {D, D, O};
    static const char *const names[3] = {"layers.0.moe.router.gate.weight", "layers.0.attention.wq.weight",
                                         "layers.0.output.weight"};
    hp_param_t p[3];
    float *g[3];
    hp_module_t lin[3], toy, wrap;
    hp_linear_impl_t li[3];
    hp_checkpoint_impl_t wi;
    for (int i = 0; i < 3; i++) {
        g[i] = calloc((size_t)ic[i] * oc[i], sizeof(float));
        memset(&p[i], 0, sizeof p[i]);
        snprintf(p[i].name, sizeof p[i].name, "%s", names[i]);
        const int64_t shape[2] = {oc[i], ic[i]};
        HP_ASSERT(hp_tensor_init(&p[i].value.local, HP_F32, 2, shape, w[i]) == HP_OK);
        HP_ASSERT(hp_tensor_init(&p[i].grad.local, HP_F32, 2, shape, g[i]) == HP_OK);
        hp_param_t *pp = &p[i];
        hp_linear_module_init(&lin[i], &li[i], names[i], &pp, 1, NULL, ic[i], oc[i]);
        lin[i].id = i;
    }
    hp_module_base_init(&toy, &toy_ops, "layers.0", NULL);
    for (int i = 0; i < 3; i++) toy.children[toy.n_children++] = &lin[i];
    toy.id = 3;
    hp_checkpoint_module_init(&wrap, &wi, &toy, D, O);
    wrap.id = 4;
    hp_module_t *top = o ? &wrap : &toy;

    unsigned char keep[5 * HP_SAVE_SLOTS] = {0};
    void *kept[5 * HP_SAVE_SLOTS] = {0};
    int region_of[5] = {0};
    size_t kept_of[5] = {0};
    hp_arena_t region = {0};
    hp_act_ckpt_t ck = {.keep = keep, .kept = kept, .regions = &region, .n_regions = 1, .region_of = region_of,
                        .kept_of = kept_of};
    hp_ac_stats_t st = {0};
    size_t arena = toy_act_bytes(&toy, 1, N);
    if (o) {
        HP_CHECK_OK(hp_ac_decide(&wrap, o, 1, N, keep, 5, &st));
        HP_ASSERT(hp_arena_init(&region, "recompute region", st.region_bytes) == HP_OK);
        kept_of[4] = st.kept_bytes;
        arena = st.kept_bytes;
    }
    hp_act_t act;
    HP_ASSERT(hp_act_init(&act, 5, arena) == HP_OK);
    act.be = &g_count;
    act.B = 1;
    act.T = N;
    act.ckpt = o ? &ck : NULL;
    const size_t sc = top->ops->grad_scratch_floats(top, 1, N);
    float *scratch = malloc(sizeof(float) * sc), *y = malloc(sizeof(float) * N * O), *dy = malloc(sizeof(float) * N * O);
    r->dx = malloc(sizeof(float) * N * D);
    HP_ASSERT(scratch && y && dy && r->dx);
    act.grad_scratch = scratch;
    act.grad_scratch_floats = sc;
    for (int i = 0; i < N * O; i++) dy[i] = 1.0f;   // d sum / d output
    hp_tensor_t tx, ty, tdy, tdx;
    hp_tensor_view2(&tx, (float *)x, N, D);
    hp_tensor_view2(&ty, y, N, O);
    hp_tensor_view2(&tdy, dy, N, O);
    hp_tensor_view2(&tdx, r->dx, N, D);
    HP_CHECK_OK(hp_module_forward(top, &act, &tx, &ty));
    const size_t kept_bytes = act.arena.used;
    g_flops = 0.0;
    g_on = 1;
    HP_CHECK_OK(hp_module_backward_input(top, &act, &tdy, &tdx));
    HP_CHECK_OK(hp_module_backward_weight(top, &act));
    g_on = 0;
    r->bw_units = g_flops / UNIT;
    r->est_units = st.recompute_flops / UNIT;
    r->kept_mib = kept_bytes / 1048576.0;
    r->dw = malloc(sizeof(float) * (size_t)D * (2 * D + O));
    HP_ASSERT(r->dw);
    memcpy(r->dw, g[0], sizeof(float) * D * D);
    memcpy(r->dw + D * D, g[1], sizeof(float) * D * D);
    memcpy(r->dw + 2 * D * D, g[2], sizeof(float) * (size_t)D * O);
    hp_act_free(&act);
    hp_arena_free(&region);
    for (int i = 0; i < 3; i++) free(g[i]);
    free(scratch);
    free(y);
    free(dy);
}

static hp_ac_options_t op(const char *force) {
    hp_ac_options_t o = hp_ac_default_options();
    o.every_k = 1;
    o.policy = HP_AC_OP;
    snprintf(o.force_recompute, sizeof o.force_recompute, "%s", force);
    return o;
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    g_base = hp_backend_default();
    g_count = *g_base;
    g_count.linear_forward = c_fwd;
    g_count.linear_backward_input = c_bwi;
    g_count.linear_backward_weight = c_bww;
    float *x = malloc(sizeof(float) * N * D), *w[3];
    const int oc[3] = {D, D, O};
    for (int i = 0; i < N * D; i++) x[i] = frand();
    for (int k = 0; k < 3; k++) {
        w[k] = malloc(sizeof(float) * (size_t)oc[k] * D);
        for (int i = 0; i < oc[k] * D; i++) w[k][i] = 0.04f * frand();   // ~ nn.Linear's U(-1/sqrt(512), ..)
    }
    hp_ac_options_t full = hp_ac_default_options();
    full.every_k = 1;
    const hp_ac_options_t sac = op(""), first = op("moe.router.gate"), last = op("output");
    const struct { const char *what; const hp_ac_options_t *o; double want, kept_mib; } C[5] = {
        {"no AC", NULL, 8.0, 2.0},
        {"op-level SAC", &sac, 9.0, 1.0},
        {"SAC, force-recompute moe.router.gate", &first, 10.0, 0.0},
        {"SAC, force-recompute output", &last, 11.0, 1.0},
        {"full AC", &full, 12.0, 0.0},
    };
    result_t r[5];
    for (int i = 0; i < 5; i++) {
        run(C[i].o, x, w, &r[i]);
        printf("%-38s backward %5.2f x 2*512^3 FLOPs (TorchTitan: %.0f), recompute estimated %.2f, kept %.3f MiB\n",
               C[i].what, r[i].bw_units, C[i].want, r[i].est_units, r[i].kept_mib);
        HP_CHECK(r[i].bw_units == C[i].want, "%s: backward FLOPs %.6g units, TorchTitan's test counts %.0f",
                 C[i].what, r[i].bw_units, C[i].want);
        HP_CHECK(r[i].bw_units == 8.0 + r[i].est_units, "%s: backward %.6g = 8 + the estimated recompute %.6g",
                 C[i].what, r[i].bw_units, r[i].est_units);
        // kept bytes: the saved outputs plus the linears' slots (64 bytes each)
        HP_CHECK(fabs(r[i].kept_mib - C[i].kept_mib) < 0.001, "%s: kept %.4f MiB, expected %.0f", C[i].what,
                 r[i].kept_mib, C[i].kept_mib);
        HP_CHECK(memcmp(r[i].dx, r[0].dx, sizeof(float) * N * D) == 0 &&
                 memcmp(r[i].dw, r[0].dw, sizeof(float) * (size_t)D * (2 * D + O)) == 0,
                 "%s: input and weight gradients bitwise those without AC", C[i].what);
    }
    for (int i = 0; i < 5; i++) {
        free(r[i].dx);
        free(r[i].dw);
    }
    for (int k = 0; k < 3; k++) free(w[k]);
    free(x);
    return hp_test_finish("test_ac_flops");
}
