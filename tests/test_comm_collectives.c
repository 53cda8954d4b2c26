/* Every collective on every dtype and reduction op, in place and out of place, at sizes 0, 1,
 * a prime and large, blocking and asynchronous; uneven all_to_all_v; split/dup; grouped
 * point-to-point; exact counters; argument errors. Inputs are small integers so every
 * expected value is exact (bf16 holds integers up to 256 exactly).
 * hp-test line below: */
// hp-test: ranks 1 2 4 8 timeout 240
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hyperparallel/comm.h"

static hp_comm_t W;

static int R, N;

static const hp_dtype_t k_dts[] = {HP_F32, HP_BF16, HP_F16, HP_I32, HP_I64, HP_U8};
#define NDT 6
enum { OP_SUM, OP_AVG, OP_PROD, OP_MAX, OP_MIN, OP_PREMUL2, OP_PREMUL_HALF, NOPS };
static const char *k_opn[NOPS] = {"sum", "avg", "prod", "max", "min", "premul2", "premul0.5"};

/* ---- element access ---------------------------------------------------------------------- */

static void set_el(void *b, hp_dtype_t dt, size_t i, double v) {
    switch (dt) {
    case HP_F32: ((float *)b)[i] = (float)v; break;
    case HP_BF16: ((uint16_t *)b)[i] = hp_f32_to_bf16((float)v); break;
    case HP_F16: ((uint16_t *)b)[i] = hp_f32_to_f16((float)v); break;
    case HP_I32: ((int32_t *)b)[i] = (int32_t)v; break;
    case HP_I64: ((int64_t *)b)[i] = (int64_t)v; break;
    case HP_U8: ((uint8_t *)b)[i] = (uint8_t)(int64_t)v; break;
    default: break;
    }
}

static double get_el(const void *b, hp_dtype_t dt, size_t i) {
    switch (dt) {
    case HP_F32: return ((const float *)b)[i];
    case HP_BF16: return hp_bf16_to_f32(((const uint16_t *)b)[i]);
    case HP_F16: return hp_f16_to_f32(((const uint16_t *)b)[i]);
    case HP_I32: return ((const int32_t *)b)[i];
    case HP_I64: return (double)((const int64_t *)b)[i];
    case HP_U8: return ((const uint8_t *)b)[i];
    default: return 0;
    }
}

static int is_signed(hp_dtype_t dt) { return dt != HP_U8; }
static int is_float(hp_dtype_t dt) { return dt == HP_F32 || dt == HP_BF16 || dt == HP_F16; }

/* Input of rank r at element i for op: small integers, exact in every dtype. */
static double in_val(int op, int r, size_t i, hp_dtype_t dt) {
    switch (op) {
    case OP_PROD: return 1 + (double)((r + i) % 2);                  /* product <= 2^4 */
    case OP_MAX:
    case OP_MIN: return (double)((r * 3 + i) % 11) - (is_signed(dt) ? 5 : 0);
    default: return (double)((r + 2 * i) % 13);                      /* sum <= 96 */
    }
}

/* The value a reduction over ranks gives, rounded as the library defines (F32 accumulation,
 * one rounding into the dtype; integer AVG truncates). */
static double expect_red(int op, size_t i, hp_dtype_t dt) {
    double acc = (op == OP_PROD) ? 1 : (op == OP_MAX) ? -1e30 : (op == OP_MIN) ? 1e30 : 0;
    for (int r = 0; r < N; r++) {
        double v = in_val(op, r, i, dt);
        if (op == OP_PREMUL2) v *= 2;
        if (op == OP_PREMUL_HALF) v *= 0.5;
        if (op == OP_PROD) acc *= v;
        else if (op == OP_MAX) acc = v > acc ? v : acc;
        else if (op == OP_MIN) acc = v < acc ? v : acc;
        else acc += v;
    }
    if (op == OP_AVG) {
        if (is_float(dt)) acc = (double)((float)acc / (float)N);
        else acc = (double)((int64_t)acc / N);
    }
    /* round into the dtype */
    unsigned char tmp[8];
    set_el(tmp, dt, 0, acc);
    return get_el(tmp, dt, 0);
}

static hp_redop_t PREMUL2, PREMUL_HALF;

static hp_redop_t to_redop(int op) {
    switch (op) {
    case OP_SUM: return HP_SUM;
    case OP_AVG: return HP_AVG;
    case OP_PROD: return HP_PROD;
    case OP_MAX: return HP_MAX;
    case OP_MIN: return HP_MIN;
    case OP_PREMUL2: return PREMUL2;
    default: return PREMUL_HALF;
    }
}

static int op_valid(int op, hp_dtype_t dt) { return !(op == OP_PREMUL_HALF && !is_float(dt)); }

static void *xalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    memset(p, 0xA5, bytes);
    return p;
}

/* Blocking when async == 0; otherwise through a work handle, completed by wait (async 1) or
 * by polling hp_work_test (async 2). */
static void finish(hp_status_t st, hp_work_t *wk, int async, const char *what) {
    HP_CHECK(st == HP_OK, "%s: %s", what, hp_last_error());
    if (!async || st != HP_OK) return;
    HP_CHECK(*wk != NULL, "%s: no work handle", what);
    if (async == 1) {
        HP_CHECK_OK(hp_work_wait(wk));
    } else {
        int done = 0;
        while (!done) {
            hp_status_t ts = hp_work_test(wk, &done);
            if (ts != HP_OK) {
                HP_CHECK_OK(ts);
                break;
            }
        }
    }
    HP_CHECK(*wk == NULL, "%s: handle not released", what);
}

#define WK (async ? &wk : NULL)

static size_t g_sizes[4];

/* Compares and reports the first mismatch only. */
static int check_buf(const void *b, hp_dtype_t dt, size_t n, double (*f)(size_t, void *), void *ctx,
                     const char *what) {
    for (size_t i = 0; i < n; i++) {
        double got = get_el(b, dt, i), want = f(i, ctx);
        if (got != want) {
            HP_CHECK(got == want, "%s %s n=%zu: element %zu is %g, expected %g", what,
                     hp_dtype_name(dt), n, i, got, want);
            return 0;
        }
    }
    HP_CHECK(1, "ok");
    return 1;
}

typedef struct { int op; hp_dtype_t dt; size_t n; int rank; } red_ctx;
static double f_red(size_t i, void *c) { red_ctx *x = c; return expect_red(x->op, i, x->dt); }
static double f_red_block(size_t i, void *c) {
    red_ctx *x = c;
    return expect_red(x->op, (size_t)x->rank * x->n + i, x->dt);
}

static void test_all_reduce(int async) {
    for (int k = 0; k < NDT; k++)
        for (int op = 0; op < NOPS; op++)
            for (int s = 0; s < 4; s++)
                for (int inplace = 0; inplace < 2; inplace++) {
                    hp_dtype_t dt = k_dts[k];
                    size_t n = g_sizes[s];
                    if (!op_valid(op, dt)) continue;
                    if (s == 3 && (op != OP_SUM || inplace)) continue;   /* large: sum, out of place */
                    size_t es = hp_dtype_size(dt);
                    void *a = xalloc(n * es), *b = inplace ? a : xalloc(n * es);
                    for (size_t i = 0; i < n; i++) set_el(a, dt, i, in_val(op, R, i, dt));
                    hp_work_t wk = NULL;
                    char what[96];
                    snprintf(what, sizeof what, "all_reduce %s %s%s", k_opn[op],
                             inplace ? "in-place" : "out-of-place", async ? " async" : "");
                    finish(hp_all_reduce(a, b, n, dt, to_redop(op), W, WK), &wk, async, what);
                    red_ctx c = {op, dt, n, R};
                    check_buf(b, dt, n, f_red, &c, what);
                    if (!inplace) free(b);
                    free(a);
                }
}

static void test_reduce(int async) {
    int root = N - 1;
    for (int k = 0; k < NDT; k++)
        for (int op = 0; op < NOPS; op++)
            for (int s = 0; s < 4; s++)
                for (int inplace = 0; inplace < 2; inplace++) {
                    hp_dtype_t dt = k_dts[k];
                    size_t n = g_sizes[s], es = hp_dtype_size(dt);
                    if (!op_valid(op, dt)) continue;
                    if (s == 3 && (op != OP_SUM || inplace)) continue;   /* large: sum, out of place */
                    void *a = xalloc(n * es), *b = inplace ? a : xalloc(n * es);
                    for (size_t i = 0; i < n; i++) set_el(a, dt, i, in_val(op, R, i, dt));
                    hp_work_t wk = NULL;
                    char what[96];
                    snprintf(what, sizeof what, "reduce %s %s%s", k_opn[op],
                             inplace ? "in-place" : "out-of-place", async ? " async" : "");
                    /* out of place on non-roots: recvbuf is not significant, pass NULL */
                    void *rb = (R == root || inplace) ? b : NULL;
                    finish(hp_reduce(a, rb, n, dt, to_redop(op), root, W, WK), &wk, async, what);
                    if (R == root) {
                        red_ctx c = {op, dt, n, R};
                        check_buf(b, dt, n, f_red, &c, what);
                    }
                    if (!inplace) free(b);
                    free(a);
                }
}

static void test_reduce_scatter(int async) {
    for (int k = 0; k < NDT; k++)
        for (int op = 0; op < NOPS; op++)
            for (int s = 0; s < 4; s++)
                for (int inplace = 0; inplace < 2; inplace++) {
                    hp_dtype_t dt = k_dts[k];
                    size_t n = s == 3 ? g_sizes[3] / (size_t)N : g_sizes[s], es = hp_dtype_size(dt);
                    if (!op_valid(op, dt)) continue;
                    if (s == 3 && (op != OP_SUM || inplace)) continue;
                    size_t total = n * (size_t)N;
                    void *a = xalloc(total * es);
                    for (size_t i = 0; i < total; i++) set_el(a, dt, i, in_val(op, R, i, dt));
                    void *b = inplace ? (char *)a + (size_t)R * n * es : xalloc(n * es);
                    hp_work_t wk = NULL;
                    char what[96];
                    snprintf(what, sizeof what, "reduce_scatter %s %s%s", k_opn[op],
                             inplace ? "in-place" : "out-of-place", async ? " async" : "");
                    finish(hp_reduce_scatter(a, b, n, dt, to_redop(op), W, WK), &wk, async, what);
                    red_ctx c = {op, dt, n, R};
                    check_buf(b, dt, n, f_red_block, &c, what);
                    if (!inplace) free(b);
                    free(a);
                }
}

/* Data-movement collectives: the value of element i sent by rank r. */
static double mv(int r, size_t i) { return (double)((r * 7 + i) % 100); }
typedef struct { size_t n; int root; } mv_ctx;
static double f_gathered(size_t i, void *c) { mv_ctx *x = c; return mv((int)(i / x->n), i % x->n); }
static double f_root(size_t i, void *c) { mv_ctx *x = c; return mv(x->root, i); }
static double f_scattered(size_t i, void *c) { mv_ctx *x = c; return mv(x->root, (size_t)R * x->n + i); }
/* all_to_all: rank r sends block j element e = mv(r, j*n + e); I receive from j block R. */
static double f_a2a(size_t i, void *c) {
    mv_ctx *x = c;
    size_t j = i / x->n, e = i % x->n;
    return mv((int)j, (size_t)R * x->n + e);
}

static void test_movement(int async) {
    for (int k = 0; k < NDT; k++)
        for (int s = 0; s < 4; s++)
            for (int inplace = 0; inplace < 2; inplace++) {
                hp_dtype_t dt = k_dts[k];
                if (s == 3 && inplace) continue;   /* large: out of place */
                size_t n = s == 3 ? g_sizes[3] / (size_t)N : g_sizes[s], es = hp_dtype_size(dt);
                size_t total = n * (size_t)N;
                hp_work_t wk = NULL;
                char what[96];
                const char *mode = inplace ? "in-place" : "out-of-place";
                int root = (N > 2) ? 1 : 0;
                mv_ctx c = {n, root};

                /* broadcast (one buffer; run once per size) */
                if (!inplace) {
                    void *a = xalloc(n * es);
                    for (size_t i = 0; i < n; i++) set_el(a, dt, i, R == root ? mv(root, i) : 255);
                    snprintf(what, sizeof what, "broadcast%s", async ? " async" : "");
                    finish(hp_broadcast(a, n, dt, root, W, WK), &wk, async, what);
                    check_buf(a, dt, n, f_root, &c, what);
                    free(a);
                }
                /* all_gather */
                {
                    void *r = xalloc(total * es);
                    void *sb = inplace ? (char *)r + (size_t)R * n * es : xalloc(n * es);
                    for (size_t i = 0; i < n; i++) set_el(sb, dt, i, mv(R, i));
                    snprintf(what, sizeof what, "all_gather %s%s", mode, async ? " async" : "");
                    finish(hp_all_gather(sb, r, n, dt, W, WK), &wk, async, what);
                    check_buf(r, dt, total, f_gathered, &c, what);
                    if (!inplace) free(sb);
                    free(r);
                }
                /* all_to_all */
                {
                    void *sb = xalloc(total * es);
                    void *r = inplace ? sb : xalloc(total * es);
                    for (size_t i = 0; i < total; i++) set_el(sb, dt, i, mv(R, i));
                    snprintf(what, sizeof what, "all_to_all %s%s", mode, async ? " async" : "");
                    finish(hp_all_to_all(sb, r, n, dt, W, WK), &wk, async, what);
                    check_buf(r, dt, total, f_a2a, &c, what);
                    if (!inplace) free(r);
                    free(sb);
                }
                /* gather */
                {
                    void *r = xalloc(total * es);
                    void *sb = (inplace && R == root) ? (char *)r + (size_t)R * n * es : xalloc(n * es);
                    for (size_t i = 0; i < n; i++) set_el(sb, dt, i, mv(R, i));
                    snprintf(what, sizeof what, "gather %s%s", mode, async ? " async" : "");
                    finish(hp_gather(sb, R == root ? r : NULL, n, dt, root, W, WK), &wk, async, what);
                    if (R == root) check_buf(r, dt, total, f_gathered, &c, what);
                    if (!(inplace && R == root)) free(sb);
                    free(r);
                }
                /* scatter */
                {
                    void *sb = xalloc(total * es);
                    for (size_t i = 0; i < total; i++) set_el(sb, dt, i, mv(R, i));
                    void *r = (inplace && R == root) ? (char *)sb + (size_t)R * n * es : xalloc(n * es);
                    snprintf(what, sizeof what, "scatter %s%s", mode, async ? " async" : "");
                    finish(hp_scatter(R == root ? sb : NULL, r, n, dt, root, W, WK), &wk, async, what);
                    check_buf(r, dt, n, f_scattered, &c, what);
                    if (!(inplace && R == root)) free(r);
                    free(sb);
                }
            }
}

/* Uneven all_to_all_v: rank r sends (r + 2j) % 4 elements to rank j (zeros included) at
 * stride-5 displacements with gaps; in place uses the same layout for both directions. */
static void test_all_to_all_v(int async) {
    size_t sc[64], sd[64], rc[64], rd[64];
    for (int j = 0; j < N; j++) {
        sc[j] = (size_t)((R + 2 * j) % 4);
        rc[j] = (size_t)((j + 2 * R) % 4);
        sd[j] = rd[j] = 5 * (size_t)j;
    }
    for (int k = 0; k < NDT; k++)
        for (int inplace = 0; inplace < 2; inplace++) {
            hp_dtype_t dt = k_dts[k];
            size_t es = hp_dtype_size(dt), ext = 5 * (size_t)N;
            void *sb = xalloc(ext * es), *r = inplace ? sb : xalloc(ext * es);
            for (size_t i = 0; i < ext; i++) set_el(sb, dt, i, mv(R, i));
            if (!inplace) for (size_t i = 0; i < ext; i++) set_el(r, dt, i, 99);
            hp_work_t wk = NULL;
            char what[96];
            snprintf(what, sizeof what, "all_to_all_v %s%s", inplace ? "in-place" : "out-of-place",
                     async ? " async" : "");
            finish(hp_all_to_all_v(sb, sc, sd, r, rc, rd, dt, W, WK), &wk, async, what);
            int bad = 0;
            for (int j = 0; j < N && !bad; j++) {
                for (size_t e = 0; e < 5; e++) {
                    double got = get_el(r, dt, 5 * (size_t)j + e);
                    /* rank j put my block at its displacement 5*R */
                    double want = e < rc[j] ? mv(j, 5 * (size_t)R + e) : (inplace ? mv(R, 5 * (size_t)j + e) : 99);
                    if (got != want) {
                        HP_CHECK(got == want, "%s %s: from rank %d element %zu is %g, expected %g",
                                 what, hp_dtype_name(dt), j, e, got, want);
                        bad = 1;
                        break;
                    }
                }
            }
            if (!inplace) free(r);
            free(sb);
        }
}

static void test_p2p(void) {
    int right = (R + 1) % N, left = (R + N - 1) % N;
    /* blocking: even ranks send first */
    int32_t out[5], in[5];
    for (int i = 0; i < 5; i++) out[i] = R * 10 + i, in[i] = -1;
    if (R % 2 == 0) {
        HP_CHECK_OK(hp_send(out, 5, HP_I32, right, W, NULL));
        HP_CHECK_OK(hp_recv(in, 5, HP_I32, left, W, NULL));
    } else {
        HP_CHECK_OK(hp_recv(in, 5, HP_I32, left, W, NULL));
        HP_CHECK_OK(hp_send(out, 5, HP_I32, right, W, NULL));
    }
    if (N % 2 == 0)
        for (int i = 0; i < 5; i++) HP_CHECK(in[i] == left * 10 + i, "ring recv %d: %d", i, in[i]);
    /* grouped: everyone sends right and left and receives from both, large enough that
     * unbatched blocking sends could deadlock */
    size_t n = 1 << 16;
    float *sr = xalloc(n * 4), *sl = xalloc(n * 4), *rr = xalloc(n * 4), *rl = xalloc(n * 4);
    for (size_t i = 0; i < n; i++) sr[i] = (float)(R * 1000 + i % 1000), sl[i] = (float)(-R - 1);
    HP_CHECK_OK(hp_group_start());
    HP_CHECK_OK(hp_send(sr, n, HP_F32, right, W, NULL));
    HP_CHECK_OK(hp_send(sl, n, HP_F32, left, W, NULL));
    HP_CHECK_OK(hp_recv(rl, n, HP_F32, left, W, NULL));
    HP_CHECK_OK(hp_recv(rr, n, HP_F32, right, W, NULL));
    HP_CHECK_ERR(hp_all_reduce(sr, sr, 1, HP_F32, HP_SUM, W, NULL), HP_ERR_STATE, "hp_group_start");
    HP_CHECK_OK(hp_group_end());
    if (N > 2) {
        int ok = 1;
        for (size_t i = 0; i < n && ok; i++)
            ok = rl[i] == (float)(left * 1000 + i % 1000) && rr[i] == (float)(-right - 1);
        HP_CHECK(ok, "grouped ring exchange values");
    }
    /* the same group without waiting (hp_group_end_work): one handle completes all four */
    {
        for (size_t i = 0; i < n; i++) rl[i] = rr[i] = 0.0f;
        hp_work_t gw = NULL;
        HP_CHECK_OK(hp_group_start());
        HP_CHECK_OK(hp_send(sr, n, HP_F32, right, W, NULL));
        HP_CHECK_OK(hp_send(sl, n, HP_F32, left, W, NULL));
        HP_CHECK_OK(hp_recv(rl, n, HP_F32, left, W, NULL));
        HP_CHECK_OK(hp_recv(rr, n, HP_F32, right, W, NULL));
        HP_CHECK_OK(hp_group_end_work(&gw));
        HP_CHECK(gw != NULL, "hp_group_end_work gave no handle");
        HP_CHECK_OK(hp_work_wait(&gw));
        if (N > 2) {
            int ok = 1;
            for (size_t i = 0; i < n && ok; i++)
                ok = rl[i] == (float)(left * 1000 + i % 1000) && rr[i] == (float)(-right - 1);
            HP_CHECK(ok, "grouped ring exchange values (hp_group_end_work)");
        }
        HP_CHECK_ERR(hp_group_end_work(&gw), HP_ERR_STATE, "outermost hp_group_start");
    }
    /* async send/recv */
    hp_work_t ws = NULL, wr = NULL;
    for (int i = 0; i < 5; i++) in[i] = -1;
    HP_CHECK_OK(hp_recv(in, 5, HP_I32, left, W, &wr));
    HP_CHECK_OK(hp_send(out, 5, HP_I32, right, W, &ws));
    HP_CHECK_OK(hp_work_wait(&ws));
    HP_CHECK_OK(hp_work_wait(&wr));
    for (int i = 0; i < 5; i++) HP_CHECK(in[i] == left * 10 + i, "async ring recv %d: %d", i, in[i]);
    free(sr), free(sl), free(rr), free(rl);
}

/* A reduction's bits do not depend on blocking vs asynchronous or on the progress mode:
 * non-integer inputs whose float sums depend on the order of additions. */
static void test_determinism(void) {
    /* below and above the size where reductions switch to the non-blocking MPI algorithm */
    for (int sz = 0; sz < 2; sz++) {
    const size_t M = sz ? 100003 : 3001;
    size_t total = M * (size_t)N;
    float *x = xalloc(total * 4), *ref = xalloc(total * 4), *got = xalloc(total * 4);
    for (size_t i = 0; i < total; i++)
        x[i] = (float)(1.0 / (1.0 + (double)((R * 7919 + i * 104729) % 1000003))) * (float)(1 + R % 3);
    const char *modes[3] = {"poll", "thread", "none"};
    for (int kind = 0; kind < 3; kind++) {
        const char *kn = kind == 0 ? "all_reduce" : kind == 1 ? "reduce" : "reduce_scatter";
        for (int m = -1; m < 3; m++) {   /* -1: blocking reference */
            float *out = m < 0 ? ref : got;
            memset(out, 0, total * 4);
            hp_work_t wk = NULL, *wp = m < 0 ? NULL : &wk;
            if (m >= 0) HP_CHECK_OK(hp_comm_set_progress(modes[m]));
            if (kind == 0) HP_CHECK_OK(hp_all_reduce(x, out, M, HP_F32, HP_SUM, W, wp));
            else if (kind == 1) HP_CHECK_OK(hp_reduce(x, out, M, HP_F32, HP_SUM, 0, W, wp));
            else HP_CHECK_OK(hp_reduce_scatter(x, out, M, HP_F32, HP_SUM, W, wp));
            if (wk) HP_CHECK_OK(hp_work_wait(&wk));
            if (m >= 0)
                HP_CHECK(!memcmp(ref, got, M * 4), "%s of %zu floats: async under %s differs in "
                         "bits from the blocking call", kn, M, modes[m]);
        }
    }
    HP_CHECK_OK(hp_comm_set_progress("poll"));
    free(x), free(ref), free(got);
    }
}

static void test_split_dup(void) {
    hp_comm_t half = NULL, dup = NULL, none = (hp_comm_t)1;
    /* even/odd groups, ordered by descending world rank */
    HP_CHECK_OK(hp_comm_split(W, R % 2, -R, &half));
    HP_CHECK(half != NULL, "split returned NULL");
    int want_size = (N + 1 - R % 2) / 2;
    HP_CHECK(hp_comm_size(half) == want_size, "split size %d, expected %d", hp_comm_size(half), want_size);
    /* members are R%2, R%2+2, ...; key -R puts the highest first */
    int highest = R % 2 + 2 * (want_size - 1);
    HP_CHECK(hp_comm_rank(half) == (highest - R) / 2, "split rank %d", hp_comm_rank(half));
    HP_CHECK(hp_comm_world_rank(half) == R, "world rank %d", hp_comm_world_rank(half));
    int64_t v = R, sum = 0, want = 0;
    for (int r = R % 2; r < N; r += 2) want += r;
    HP_CHECK_OK(hp_all_reduce(&v, &sum, 1, HP_I64, HP_SUM, half, NULL));
    HP_CHECK(sum == want, "sum over split %lld, expected %lld", (long long)sum, (long long)want);
    HP_CHECK_OK(hp_comm_dup(W, &dup));
    HP_CHECK(hp_comm_size(dup) == N && hp_comm_rank(dup) == R, "dup rank/size");
    HP_CHECK_OK(hp_comm_split(W, R == 0 ? 0 : -1, 0, &none));
    HP_CHECK((R == 0) == (none != NULL), "color < 0 must give NULL");
    HP_CHECK_OK(hp_comm_destroy(none));
    HP_CHECK_OK(hp_comm_destroy(dup));
    HP_CHECK_OK(hp_comm_destroy(half));
    HP_CHECK_OK(hp_comm_destroy(W));   /* world: no-op */
}

static void test_counters(void) {
    hp_comm_counts_reset();
    HP_CHECK(hp_comm_count_total() == 0, "reset");
    float x[10] = {0}, y[10 * 64];
    HP_CHECK_OK(hp_all_reduce(x, x, 10, HP_F32, HP_SUM, W, NULL));
    HP_CHECK_OK(hp_all_reduce(x, x, 3, HP_F32, HP_MAX, W, NULL));
    hp_work_t wk = NULL;
    HP_CHECK_OK(hp_all_gather(x, y, 10, HP_F32, W, &wk));
    HP_CHECK_OK(hp_work_wait(&wk));
    HP_CHECK_OK(hp_broadcast(x, 4, HP_F32, 0, W, NULL));
    HP_CHECK_OK(hp_barrier(W, NULL));
    /* failed calls are not counted */
    HP_CHECK_ERR(hp_broadcast(x, 4, HP_F32, N, W, NULL), HP_ERR_INVALID_ARG, "root");
    hp_comm_counts_t c;
    hp_comm_counts_get(&c);
    HP_CHECK(c.calls[HP_COMM_ALL_REDUCE] == 2, "all_reduce calls %llu", (unsigned long long)c.calls[HP_COMM_ALL_REDUCE]);
    HP_CHECK(c.bytes[HP_COMM_ALL_REDUCE] == 52, "all_reduce bytes %llu", (unsigned long long)c.bytes[HP_COMM_ALL_REDUCE]);
    HP_CHECK(c.calls[HP_COMM_ALL_GATHER] == 1 && c.bytes[HP_COMM_ALL_GATHER] == 40, "all_gather counts");
    HP_CHECK(c.calls[HP_COMM_BROADCAST] == 1, "broadcast calls");
    HP_CHECK(c.bytes[HP_COMM_BROADCAST] == (R == 0 ? 16u : 0u), "broadcast bytes");
    HP_CHECK(c.calls[HP_COMM_BARRIER] == 1, "barrier calls");
    HP_CHECK(hp_comm_count(HP_COMM_REDUCE_SCATTER) == 0, "no reduce_scatter");
    HP_CHECK(hp_comm_count_total() == 5, "total %llu", (unsigned long long)hp_comm_count_total());
    HP_CHECK(!strcmp(hp_comm_op_name(HP_COMM_ALL_TO_ALL_V), "all_to_all_v"), "op name");
    hp_comm_counts_reset();
    HP_CHECK(hp_comm_count(HP_COMM_ALL_REDUCE) == 0, "reset all_reduce");
}

static void test_errors(void) {
    float x[8] = {0};
    HP_CHECK_ERR(hp_all_reduce(x, x, 8, HP_F32, HP_SUM, NULL, NULL), HP_ERR_INVALID_ARG, "NULL");
    HP_CHECK_ERR(hp_all_reduce(x, x, 8, (hp_dtype_t)99, HP_SUM, W, NULL), HP_ERR_INVALID_ARG, "dtype 99");
    HP_CHECK_ERR(hp_all_reduce(x, x, 8, HP_F32, (hp_redop_t)(HP_REDOP_BUILTIN_COUNT + 60), W, NULL),
                 HP_ERR_INVALID_ARG, "PREMUL_SUM");
    HP_CHECK_ERR(hp_all_reduce(x, x + 1, 4, HP_F32, HP_SUM, W, NULL), HP_ERR_INVALID_ARG, "overlap");
    HP_CHECK_ERR(hp_all_reduce(NULL, x, 4, HP_F32, HP_SUM, W, NULL), HP_ERR_INVALID_ARG, "sendbuf is NULL");
    HP_CHECK_ERR(hp_broadcast(x, 1, HP_F32, -1, W, NULL), HP_ERR_INVALID_ARG, "root -1");
    HP_CHECK_ERR(hp_send(x, 1, HP_F32, N, W, NULL), HP_ERR_INVALID_ARG, "peer");
    HP_CHECK_ERR(hp_all_reduce(x, x, 1, HP_I32, PREMUL_HALF, W, NULL), HP_ERR_INVALID_ARG, "integral");
    HP_CHECK_ERR(hp_group_end(), HP_ERR_STATE, "hp_group_start");
    HP_CHECK_ERR(hp_work_wait(NULL), HP_ERR_INVALID_ARG, "NULL work");
    HP_CHECK_ERR(hp_redop_destroy(HP_SUM, W), HP_ERR_INVALID_ARG, "not a PREMUL_SUM");
    if (N > 1) {
        /* sendbuf inside recvbuf but not at recvbuf + 2*rank, on every rank */
        float big[2 * 64 + 2];
        HP_CHECK_ERR(hp_all_gather(big + 2 * R + 1, big, 2, HP_F32, W, NULL), HP_ERR_INVALID_ARG,
                     "in-place position");
    }
    HP_CHECK(!strcmp(hp_redop_name(HP_AVG), "avg") && !strcmp(hp_redop_name(PREMUL2), "premul_sum"),
             "redop names");
    HP_CHECK(hp_comm_get_timeout() > 0, "timeout");
}

int main(int argc, char **argv) {
    W = hp_test_mpi_init(&argc, &argv, &R, &N);
    HP_CHECK(N <= 64, "test supports up to 64 ranks");
    hp_comm_set_timeout(60);   /* a mismatch in this test fails in a minute, not five */
    g_sizes[0] = 0, g_sizes[1] = 1, g_sizes[2] = 1009, g_sizes[3] = (size_t)1 << 20;
    HP_CHECK_OK(hp_redop_create_premul_sum(2.0, W, &PREMUL2));
    HP_CHECK_OK(hp_redop_create_premul_sum(0.5, W, &PREMUL_HALF));
    test_counters();
    test_errors();
    /* pass 0: blocking; then work handles completed by wait (1) and by test polling (2)
     * under each progress mechanism */
    const char *modes[3] = {"poll", "thread", "none"};
    for (int pass = 0; pass < 7; pass++) {
        int async = pass == 0 ? 0 : 1 + (pass - 1) % 2;
        if (pass > 0) HP_CHECK_OK(hp_comm_set_progress(modes[(pass - 1) / 2]));
        /* large = 2^20 elements blocking; the async passes use 2^16 to keep 8 ranks fast */
        g_sizes[3] = async ? (size_t)1 << 16 : (size_t)1 << 20;
        double t0 = hp_clock_now_seconds();
        test_all_reduce(async);
        double t1 = hp_clock_now_seconds();
        test_reduce(async);
        double t2 = hp_clock_now_seconds();
        test_reduce_scatter(async);
        double t3 = hp_clock_now_seconds();
        test_movement(async);
        double t4 = hp_clock_now_seconds();
        test_all_to_all_v(async);
        if (R == 0 && getenv("HP_TEST_VERBOSE"))
            printf("pass %d (%s): all_reduce %.2f s, reduce %.2f s, reduce_scatter %.2f s, "
                   "movement %.2f s, all_to_all_v %.2f s\n", pass, hp_comm_get_progress(),
                   t1 - t0, t2 - t1, t3 - t2, t4 - t3, hp_clock_now_seconds() - t4);
    }
    for (int m = 0; m < 3; m++) {   /* point-to-point under each progress mechanism */
        HP_CHECK_OK(hp_comm_set_progress(modes[m]));
        test_p2p();
    }
    HP_CHECK_OK(hp_comm_set_progress("poll"));
    HP_CHECK_ERR(hp_comm_set_progress("fast"), HP_ERR_INVALID_ARG, "poll, thread or none");
    test_determinism();
    test_split_dup();
    HP_CHECK_OK(hp_redop_destroy(PREMUL2, W));
    HP_CHECK_OK(hp_redop_destroy(PREMUL_HALF, W));
    HP_CHECK_OK(hp_barrier(W, NULL));
    return hp_test_mpi_finish("test_comm_collectives");
}
