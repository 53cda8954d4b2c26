/* The ring reductions of the MPI backend (large all_reduce and reduce_scatter on 3 or more
 * ranks): results equal a reference folded in a fixed order, for every native dtype and op,
 * in place and out of place, at counts 0, 1, below the rank count, uneven and multi-chunk
 * (tiny chunks exercise the pipeline's windows), with halving-doubling (power-of-two rank
 * counts, all_reduce) and without; blocking and asynchronous calls under every
 * progress mode give the same bits, and all_reduce gives every rank the same bits; repeating
 * them allocates nothing. */
// hp-test: ranks 3 4 5 8 timeout 300
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm-impl.h"
#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hyperparallel/comm.h"

static hp_comm_t W;
static int R, N;

static void *xalloc(size_t bytes) {
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) {
        fprintf(stderr, "test_comm_ring: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

/* Small integers, so every dtype and op has an exact answer (products stay below 2^24). */
static double val(int rank, size_t i, hp_redop_t op) {
    if (op == HP_PROD) return (double)(1 + (rank + (int)(i % 3)) % 2);   /* 1 or 2 */
    return (double)((rank * 7 + (int)(i % 11) * 3) % 13);
}

static void put(void *buf, hp_dtype_t dt, size_t i, double v) {
    switch (dt) {
    case HP_F32: ((float *)buf)[i] = (float)v; break;
    case HP_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case HP_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case HP_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case HP_BF16: ((uint16_t *)buf)[i] = hp_f32_to_bf16((float)v); break;
    default: break;
    }
}

static double get(const void *buf, hp_dtype_t dt, size_t i) {
    switch (dt) {
    case HP_F32: return ((const float *)buf)[i];
    case HP_I32: return ((const int32_t *)buf)[i];
    case HP_I64: return (double)((const int64_t *)buf)[i];
    case HP_U8: return ((const uint8_t *)buf)[i];
    case HP_BF16: return hp_bf16_to_f32(((const uint16_t *)buf)[i]);
    default: return 0;
    }
}

/* Reference for element i (global index of the reduced vector): ranks folded 0..N-1. */
static double ref(size_t i, hp_redop_t op, hp_dtype_t dt) {
    double a = val(0, i, op);
    for (int r = 1; r < N; r++) {
        double b = val(r, i, op);
        switch (op) {
        case HP_SUM: case HP_AVG: a += b; break;
        case HP_PROD: a *= b; break;
        case HP_MAX: a = b > a ? b : a; break;
        case HP_MIN: a = b < a ? b : a; break;
        default: break;
        }
    }
    if (dt == HP_U8 && op != HP_AVG) a = (double)((unsigned)a & 0xffu);   /* wraps like MPI */
    if (op == HP_AVG) a = dt == HP_F32 || dt == HP_BF16 ? a / N : (double)((long)a / N);
    return a;
}

/* The reference as the dtype holds it. */
static double want(size_t i, hp_redop_t op, hp_dtype_t dt) {
    char b[8];
    put(b, dt, 0, ref(i, op, dt));
    return get(b, dt, 0);
}

static void check_all_reduce(hp_dtype_t dt, hp_redop_t op, size_t n, int inplace, int async) {
    size_t es = hp_dtype_size(dt);
    char *s = xalloc(n * es), *r = inplace ? s : xalloc(n * es);
    for (size_t i = 0; i < n; i++) put(s, dt, i, val(R, i, op));
    if (!inplace) memset(r, 0xab, n * es);
    hp_work_t wk = NULL;
    HP_CHECK_OK(hp_all_reduce(s, r, n, dt, op, W, async ? &wk : NULL));
    if (wk) HP_CHECK_OK(hp_work_wait(&wk));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (get(r, dt, i) != want(i, op, dt) && !bad++) first = i;
    HP_CHECK(bad == 0, "all_reduce %s %s n=%zu %s %s: %zu wrong, first at %zu: %g vs %g",
             hp_dtype_name(dt), hp_redop_name(op), n, inplace ? "in place" : "out of place",
             async ? "async" : "blocking", bad, first, get(r, dt, first), want(first, op, dt));
    free(s);
    if (!inplace) free(r);
}

static void check_reduce_scatter(hp_dtype_t dt, hp_redop_t op, size_t n, int inplace, int async) {
    size_t es = hp_dtype_size(dt), total = n * (size_t)N;
    char *s = xalloc(total * es), *r = inplace ? s + (size_t)R * n * es : xalloc(n * es);
    for (size_t i = 0; i < total; i++) put(s, dt, i, val(R, i, op));
    if (!inplace) memset(r, 0xab, n * es);
    hp_work_t wk = NULL;
    HP_CHECK_OK(hp_reduce_scatter(s, r, n, dt, op, W, async ? &wk : NULL));
    if (wk) HP_CHECK_OK(hp_work_wait(&wk));
    size_t bad = 0, first = 0, base = (size_t)R * n;
    for (size_t i = 0; i < n; i++)
        if (get(r, dt, i) != want(base + i, op, dt) && !bad++) first = i;
    HP_CHECK(bad == 0, "reduce_scatter %s %s n=%zu %s %s: %zu wrong, first at %zu: %g vs %g",
             hp_dtype_name(dt), hp_redop_name(op), n, inplace ? "in place" : "out of place",
             async ? "async" : "blocking", bad, first, get(r, dt, first), want(base + first, op, dt));
    free(s);
    if (!inplace) free(r);
}

/* Every dtype and op at small and odd counts, forced onto the ring with 64-byte chunks
 * (16 floats), so blocks span many chunks and the windows wrap many times. On power-of-two
 * rank counts all_reduce runs halving-doubling (hd = 1) or, with it disabled, the ring. */
static void test_exact(int hd) {
    hp_comm_mpi_set_hd_max(hd ? (size_t)4 << 20 : 0);
    hp_comm_debug_force_ring(1);
    hp_comm_mpi_set_ring_chunk(64);
    const hp_dtype_t dts[5] = {HP_F32, HP_I32, HP_I64, HP_U8, HP_BF16};
    const hp_redop_t ops[5] = {HP_SUM, HP_PROD, HP_MAX, HP_MIN, HP_AVG};
    size_t counts[6] = {0, 1, (size_t)N - 1, (size_t)N + 1, 7 * (size_t)N + 3, 1009};
    for (int di = 0; di < 5; di++)
        for (int oi = 0; oi < 5; oi++) {
            if (dts[di] == HP_BF16 && ops[oi] == HP_PROD) continue;   /* covered by f32 */
            for (int ci = 0; ci < 6; ci++)
                for (int ip = 0; ip < 2; ip++) {
                    int async = (ci + ip + oi) % 2;
                    check_all_reduce(dts[di], ops[oi], counts[ci], ip, async);
                    check_reduce_scatter(dts[di], ops[oi], counts[ci], ip, async);
                }
        }
    hp_comm_mpi_set_ring_chunk((size_t)256 << 10);
    hp_comm_debug_force_ring(0);
    hp_comm_mpi_set_hd_max((size_t)4 << 20);
}

/* Inputs whose sums depend on the order of additions. */
static float fval(int rank, size_t i) {
    return (float)(1.0 / (1.0 + (double)((rank * 7919 + i * 104729) % 1000003))) * (float)(1 + rank % 3) +
           (float)((rank + i) % 5) * 1e3f;
}

/* Large f32 sums (above the 256 KiB threshold, the real path, default chunks): within float
 * tolerance of a double reference, and blocking == asynchronous under poll, thread and none,
 * bit for bit, in place and out of place. */
static void test_bitwise(int hd) {
    hp_comm_mpi_set_hd_max(hd ? (size_t)4 << 20 : 0);
    const size_t M = 300007;   /* per-rank block of reduce_scatter; all_reduce count */
    size_t total = M * (size_t)N;
    float *x = xalloc(total * 4), *ref_ = xalloc(total * 4), *got = xalloc(total * 4);
    for (size_t i = 0; i < total; i++) x[i] = fval(R, i);
    const char *modes[3] = {"poll", "thread", "none"};
    for (int kind = 0; kind < 2; kind++)
        for (int ip = 0; ip < 2; ip++) {
            const char *kn = kind == 0 ? "all_reduce" : "reduce_scatter";
            size_t out_n = M, off = kind == 1 && ip ? (size_t)R * M : 0;
            for (int m = -1; m < 3; m++) {   /* -1: blocking reference */
                float *out = m < 0 ? ref_ : got;
                hp_work_t wk = NULL, *wp = m < 0 ? NULL : &wk;
                if (m >= 0) HP_CHECK_OK(hp_comm_set_progress(modes[m]));
                if (ip) memcpy(out, x, (kind ? total : M) * 4);
                else memset(out, 0, total * 4);
                if (kind == 0) HP_CHECK_OK(hp_all_reduce(ip ? out : x, out, M, HP_F32, HP_SUM, W, wp));
                else HP_CHECK_OK(hp_reduce_scatter(ip ? out : x, out + off, M, HP_F32, HP_SUM, W, wp));
                if (wk) HP_CHECK_OK(hp_work_wait(&wk));
                if (m >= 0)
                    HP_CHECK(!memcmp(ref_ + off, got + off, out_n * 4), "%s of %zu floats (%s): async "
                             "under %s differs in bits from the blocking call", kn, M,
                             ip ? "in place" : "out of place", modes[m]);
            }
            HP_CHECK_OK(hp_comm_set_progress("poll"));
            size_t base = kind == 1 ? (size_t)R * M : 0, bad = 0;
            for (size_t i = 0; i < out_n; i++) {
                double w = 0;
                for (int r = 0; r < N; r++) w += fval(r, base + i);
                if (fabs(ref_[off + i] - w) > 1e-6 * fabs(w) + 1e-6) bad++;
            }
            HP_CHECK(bad == 0, "%s (%s): %zu of %zu elements off the double reference", kn,
                     ip ? "in place" : "out of place", bad, out_n);
            if (kind == 0) {   /* every rank holds the same bits */
                if (R == 0) memcpy(got, ref_, M * 4);
                HP_CHECK_OK(hp_broadcast(got, M, HP_F32, 0, W, NULL));
                HP_CHECK(!memcmp(got, ref_, M * 4), "all_reduce (%s): rank %d's bits differ from "
                         "rank 0's", ip ? "in place" : "out of place", R);
            }
        }
    free(x), free(ref_), free(got);
    hp_comm_mpi_set_hd_max((size_t)4 << 20);
}

/* After warm-up, repeated ring reductions (blocking, two asynchronous ones in flight, in
 * place) allocate nothing in the comm layer. Waiting in start order swaps the two pool works
 * between the two asynchronous calls each round, so warm-up is two rounds. */
static void test_steady(void) {
    const size_t M = 131101;
    float *a = xalloc(M * (size_t)N * 4), *b = xalloc(M * (size_t)N * 4), *c = xalloc(M * 4);
    uint64_t before = 0;
    for (int round = 0; round < 5; round++) {
        if (round == 2) before = hp_comm_debug_allocs();
        for (size_t i = 0; i < M * (size_t)N; i++) a[i] = 1.0f, b[i] = 2.0f;
        HP_CHECK_OK(hp_all_reduce(a, c, M, HP_F32, HP_SUM, W, NULL));
        hp_work_t w1 = NULL, w2 = NULL;
        HP_CHECK_OK(hp_reduce_scatter(a, c, M, HP_F32, HP_SUM, W, &w1));
        HP_CHECK_OK(hp_all_reduce(b, b, M, HP_F32, HP_SUM, W, &w2));
        HP_CHECK_OK(hp_work_wait(&w1));
        HP_CHECK_OK(hp_work_wait(&w2));
        HP_CHECK(c[M - 1] == (float)N && b[7] == 2.0f * (float)N, "round %d: %g %g", round,
                 c[M - 1], b[7]);
        HP_CHECK_OK(hp_reduce_scatter(a, a + (size_t)R * M, M, HP_F32, HP_SUM, W, NULL));
        HP_CHECK(a[(size_t)R * M + 3] == (float)N, "in-place reduce_scatter %g", a[(size_t)R * M + 3]);
    }
    HP_CHECK(hp_comm_debug_allocs() == before, "steady state allocated %llu times",
             (unsigned long long)(hp_comm_debug_allocs() - before));
    free(a), free(b), free(c);
}

int main(int argc, char **argv) {
    W = hp_test_mpi_init(&argc, &argv, &R, &N);
    int pow2 = (N & (N - 1)) == 0;
    test_exact(1);
    if (pow2) test_exact(0);
    test_bitwise(1);
    if (pow2) test_bitwise(0);
    test_steady();
    return hp_test_mpi_finish("test_comm_ring");
}
