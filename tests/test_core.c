/* Core layer: status messages (also those built from hp_last_error()), dtype conversions
 * (round to nearest even), arenas, tensor views / copy / fill, and the Philox RNG
 * (known-answer vectors, shard = slice of whole), and the file helpers (whole-file reads with a
 * cap, atomic replacement, folders with parents, the folder commit). */
// hp-test: ranks 1 timeout 120
#include <hyperparallel/status.h>
#include <hyperparallel/dtype.h>
#include <hyperparallel/arena.h>
#include <hyperparallel/tensor.h>
#include <hyperparallel/rng.h>
#include <hyperparallel/file.h>

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hp_test.h"

static uint32_t fbits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float bitsf(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

static void test_status(void) {
    HP_CHECK(strcmp(hp_status_string(HP_OK), "ok") == 0, "ok string");
    HP_CHECK(strcmp(hp_status_string(HP_ERR_INVALID_ARG), "invalid argument") == 0, "invalid arg string");
    HP_CHECK(strcmp(hp_status_string((hp_status_t)999), "unknown status") == 0, "unknown");
    hp_status_t s = hp_error(HP_ERR_IO, "file '%s' missing", "x.bin");
    HP_CHECK(s == HP_ERR_IO && strcmp(hp_last_error(), "file 'x.bin' missing") == 0, "message %s", hp_last_error());
    hp_clear_error();
    HP_CHECK(hp_last_error()[0] == 0, "cleared");
    /* A message built from hp_last_error() keeps the whole reason, once: hp_error formats
     * into a temporary before it overwrites the buffer hp_last_error() returns. */
    hp_error(HP_ERR_IO, "cannot open: No such file or directory");
    hp_error(HP_ERR_IO, "%s '%s': %s", "parallelism.pipeline_parallel_schedule_csv", "stage5.csv", hp_last_error());
    HP_CHECK(strcmp(hp_last_error(), "parallelism.pipeline_parallel_schedule_csv 'stage5.csv': cannot open: No such "
                                     "file or directory") == 0, "wrapped: %s", hp_last_error());
    hp_error(HP_ERR_FORMAT, "line 3: unknown key 'x'");
    s = hp_error_prefix(HP_ERR_FORMAT, "config file '%s': ", "a.yaml");
    HP_CHECK(s == HP_ERR_FORMAT && strcmp(hp_last_error(), "config file 'a.yaml': line 3: unknown key 'x'") == 0,
             "prefixed: %s", hp_last_error());
    hp_clear_error();   /* nothing recorded: the status words stand in for the reason */
    hp_error_prefix(HP_ERR_IO, "file 'b': ");
    HP_CHECK(strcmp(hp_last_error(), "file 'b': I/O error") == 0, "prefix of nothing: %s", hp_last_error());
    hp_clear_error();
}

static void test_dtype(void) {
    HP_CHECK(hp_dtype_size(HP_F32) == 4 && hp_dtype_size(HP_BF16) == 2 && hp_dtype_size(HP_I64) == 8 &&
                 hp_dtype_size(HP_U8) == 1, "sizes");
    /* bf16: nearest even */
    HP_CHECK(hp_f32_to_bf16(1.0f) == 0x3f80, "bf16 1");
    HP_CHECK(hp_f32_to_bf16(bitsf(0x3f808000u)) == 0x3f80, "bf16 tie to even (down)");
    HP_CHECK(hp_f32_to_bf16(bitsf(0x3f818000u)) == 0x3f82, "bf16 tie to even (up)");
    HP_CHECK(hp_f32_to_bf16(bitsf(0x3f808001u)) == 0x3f81, "bf16 above tie");
    HP_CHECK(hp_f32_to_bf16(bitsf(0x7f7fffffu)) == 0x7f80, "bf16 overflow to inf");
    HP_CHECK((hp_f32_to_bf16(NAN) & 0x7fff) > 0x7f80, "bf16 nan stays nan");
    /* f16 known values */
    HP_CHECK(hp_f32_to_f16(1.0f) == 0x3c00, "f16 1");
    HP_CHECK(hp_f32_to_f16(65504.0f) == 0x7bff, "f16 max");
    HP_CHECK(hp_f32_to_f16(65519.0f) == 0x7bff, "f16 below tie");
    HP_CHECK(hp_f32_to_f16(65520.0f) == 0x7c00, "f16 tie to inf");
    HP_CHECK(hp_f32_to_f16(0x1p-24f) == 0x0001, "f16 min subnormal");
    HP_CHECK(hp_f32_to_f16(0x1p-25f) == 0x0000, "f16 half of min subnormal ties to even 0");
    HP_CHECK(hp_f32_to_f16(0x1.8p-25f) == 0x0001, "f16 above half rounds up");
    HP_CHECK(hp_f32_to_f16(0.1f) == 0x2e66, "f16 0.1 -> %#x", hp_f32_to_f16(0.1f));
    HP_CHECK(hp_f32_to_f16(-2.0f) == 0xc000, "f16 -2");
    /* Every finite 16-bit value round-trips exactly. */
    int bad_bf = 0, bad_h = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float fb = hp_bf16_to_f32((uint16_t)h), fh = hp_f16_to_f32((uint16_t)h);
        if (!isnan(fb) && hp_f32_to_bf16(fb) != h) bad_bf++;
        if (!isnan(fh) && hp_f32_to_f16(fh) != h) bad_h++;
    }
    HP_CHECK(bad_bf == 0 && bad_h == 0, "round trips: %d bf16, %d f16 wrong", bad_bf, bad_h);
#if defined(__FLT16_MAX__)
    /* Compare with the compiler's IEEE conversion (round to nearest even) on many floats. */
    int bad = 0;
    uint32_t x = 12345u;
    for (int i = 0; i < 2000000; i++) {
        x = x * 1664525u + 1013904223u;
        uint32_t u = (x & 0x8fffffffu) | ((i & 7) << 27);   /* spread over exponents */
        float f = bitsf(u);
        if (isnan(f)) continue;
        _Float16 r = (_Float16)f;
        uint16_t rb;
        memcpy(&rb, &r, 2);
        if (hp_f32_to_f16(f) != rb) bad++;
    }
    HP_CHECK(bad == 0, "f16 conversion differs from the compiler's on %d inputs", bad);
#endif
    /* bf16 rounding equals the definition: nearest of the two neighbours, ties to even. */
    int badb = 0;
    uint32_t y = 777u;
    for (int i = 0; i < 1000000; i++) {
        y = y * 1664525u + 1013904223u;
        float f = bitsf(y & 0x7f7fffffu);
        uint16_t r = hp_f32_to_bf16(f);
        uint32_t lo = fbits(f) & 0xffff0000u, hi = lo + 0x10000u;
        double hv = hi == 0x7f800000u ? 0x1p128 : (double)bitsf(hi);   /* next step past max is 2^128 */
        double dlo = fabs((double)f - bitsf(lo)), dhi = fabs(hv - f);
        uint16_t want = dlo < dhi ? (uint16_t)(lo >> 16) : dhi < dlo ? (uint16_t)(hi >> 16)
                                                           : (uint16_t)(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
        if (r != want) badb++;
    }
    HP_CHECK(badb == 0, "bf16 rounding wrong on %d inputs", badb);
    /* generic conversions */
    float src[4] = {1.5f, -2.7f, 300.0f, -1.0f};
    int32_t i32[4];
    uint8_t u8[4];
    hp_convert(i32, HP_I32, src, HP_F32, 4);
    hp_convert(u8, HP_U8, src, HP_F32, 4);
    HP_CHECK(i32[0] == 1 && i32[1] == -2 && i32[2] == 300 && i32[3] == -1, "f32->i32 truncates");
    HP_CHECK(u8[0] == 1 && u8[2] == 255 && u8[3] == 0, "f32->u8 saturates");
    int64_t i64[4];
    hp_convert(i64, HP_I64, i32, HP_I32, 4);
    HP_CHECK(i64[1] == -2 && i64[2] == 300, "i32->i64");
}

static void test_arena(void) {
    hp_arena_t a;
    HP_CHECK_OK(hp_arena_init(&a, "test", 1000));
    char *p = hp_arena_alloc(&a, 10), *q = hp_arena_alloc(&a, 100);
    HP_CHECK(p && q && ((uintptr_t)p % 64) == 0 && ((uintptr_t)q % 64) == 0 && q - p == 64, "aligned bumps");
    size_t m = hp_arena_mark(&a);
    HP_CHECK(hp_arena_alloc(&a, 500) != NULL, "fits");
    hp_clear_error();
    HP_CHECK(hp_arena_alloc(&a, 5000) == NULL && strstr(hp_last_error(), "arena 'test' exhausted"), "exhausted: %s",
             hp_last_error());
    hp_arena_reset_to(&a, m);
    HP_CHECK(a.used == m && a.peak >= m + 512, "reset keeps peak");
    hp_arena_free(&a);
}

static void test_tensor(void) {
    int64_t shape[3] = {2, 3, 4};
    hp_tensor_t t;
    HP_CHECK_OK(hp_tensor_malloc(&t, HP_F32, 3, shape));
    HP_CHECK(hp_tensor_numel(&t) == 24 && t.stride[0] == 12 && t.stride[1] == 4 && t.stride[2] == 1, "strides");
    for (int i = 0; i < 24; i++) ((float *)t.data)[i] = (float)i;
    hp_tensor_t v;
    HP_CHECK_OK(hp_tensor_narrow(&v, &t, 1, 1, 2));
    HP_CHECK(v.shape[1] == 2 && hp_tensor_get_flat(&v, 0) == 4 && hp_tensor_get_flat(&v, 4) == 8 && hp_tensor_get_flat(&v, 8) == 16, "narrow");
    HP_CHECK(!hp_tensor_is_contiguous(&v), "narrow not contiguous");
    HP_CHECK_OK(hp_tensor_select(&v, &t, -1, 2));
    HP_CHECK(v.ndim == 2 && hp_tensor_get_flat(&v, 0) == 2 && hp_tensor_get_flat(&v, 5) == 22, "select");
    HP_CHECK_OK(hp_tensor_transpose(&v, &t, 0, 2));
    HP_CHECK(v.shape[0] == 4 && v.shape[2] == 2 && hp_tensor_get_flat(&v, 1) == 12, "transpose");
    /* strided copy with conversion into bf16, and back */
    int64_t ts[3] = {4, 3, 2};
    hp_tensor_t c, back;
    HP_CHECK_OK(hp_tensor_malloc(&c, HP_BF16, 3, ts));
    HP_CHECK_OK(hp_tensor_copy(&c, &v));
    HP_CHECK_OK(hp_tensor_malloc(&back, HP_F32, 3, ts));
    HP_CHECK_OK(hp_tensor_copy(&back, &c));
    double diff;
    HP_CHECK(hp_tensor_allclose(&back, &v, 0, 0, &diff), "copy round trip diff %g", diff);
    int64_t rs[2] = {-1, 6};
    HP_CHECK_OK(hp_tensor_reshape(&v, &t, 2, rs));
    HP_CHECK(v.shape[0] == 4 && v.shape[1] == 6, "reshape infers");
    HP_CHECK_ERR(hp_tensor_reshape(&v, &back, 2, (int64_t[]){5, 5}), HP_ERR_INVALID_ARG, "has 24");
    HP_CHECK_ERR(hp_tensor_narrow(&v, &t, 1, 2, 2), HP_ERR_INVALID_ARG, "outside dim 1");
    HP_CHECK_ERR(hp_tensor_select(&v, &t, 3, 0), HP_ERR_INVALID_ARG, "out of range");
    hp_tensor_t tt;
    HP_CHECK_OK(hp_tensor_transpose(&tt, &t, 1, 2));
    HP_CHECK_ERR(hp_tensor_reshape(&v, &tt, 1, (int64_t[]){24}), HP_ERR_INVALID_ARG, "not contiguous");
    HP_CHECK_ERR(hp_tensor_copy(&c, &t), HP_ERR_INVALID_ARG, "differ in shape");
    /* fill of a strided view touches only the view */
    HP_CHECK_OK(hp_tensor_narrow(&v, &t, 2, 1, 2));
    HP_CHECK_OK(hp_tensor_fill(&v, -1.0));
    HP_CHECK(((float *)t.data)[0] == 0 && ((float *)t.data)[1] == -1 && ((float *)t.data)[2] == -1 &&
                 ((float *)t.data)[3] == 3, "fill view");
    /* zero-size tensors */
    int64_t zs[2] = {0, 5};
    hp_tensor_t z;
    HP_CHECK_OK(hp_tensor_malloc(&z, HP_F32, 2, zs));
    HP_CHECK(hp_tensor_numel(&z) == 0 && hp_tensor_nbytes(&z) == 0, "empty");
    HP_CHECK_OK(hp_tensor_fill(&z, 1.0));
    char buf[64];
    HP_CHECK(strcmp(hp_tensor_shape_str(&t, buf, sizeof buf), "(2, 3, 4) f32") == 0, "shape str %s", buf);
    hp_tensor_free_data(&z);
    hp_tensor_free_data(&t);
    hp_tensor_free_data(&c);
    hp_tensor_free_data(&back);
}

static void test_rng(void) {
    /* Known-answer vectors of Philox4x32-10 (Random123 kat_vectors). */
    uint32_t out[4];
    hp_philox4x32_10((uint32_t[]){0, 0, 0, 0}, (uint32_t[]){0, 0}, out);
    HP_CHECK(out[0] == 0x6627e8d5u && out[1] == 0xe169c58du && out[2] == 0xbc57ac4cu && out[3] == 0x9b00dbd8u,
             "kat0 %08x %08x %08x %08x", out[0], out[1], out[2], out[3]);
    hp_philox4x32_10((uint32_t[]){0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                     (uint32_t[]){0xffffffffu, 0xffffffffu}, out);
    HP_CHECK(out[0] == 0x408f276du && out[1] == 0x41c83b0eu && out[2] == 0xa20bc7c6u && out[3] == 0x6d5451fdu,
             "kat1 %08x %08x %08x %08x", out[0], out[1], out[2], out[3]);
    hp_philox4x32_10((uint32_t[]){0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                     (uint32_t[]){0xa4093822u, 0x299f31d0u}, out);
    HP_CHECK(out[0] == 0xd16cfe09u && out[1] == 0x94fdccebu && out[2] == 0x5001e420u && out[3] == 0x24126ea1u,
             "kat2 %08x %08x %08x %08x", out[0], out[1], out[2], out[3]);

    hp_rng_key_t k = hp_rng_key(42, "layers.0.attention.wq.weight");
    hp_rng_key_t k2 = hp_rng_key(42, "layers.0.attention.wk.weight");
    HP_CHECK(k.stream != k2.stream, "streams differ by name");
    /* moments */
    const int n = 200000;
    double s = 0, s2 = 0, tmin = 1e9, tmax = -1e9, us = 0;
    double ts = 0, ts2 = 0;
    for (int i = 0; i < n; i++) {
        double x = hp_rng_normal_at(k, (uint64_t)i, 0.0f, 1.0f);
        s += x;
        s2 += x * x;
        double u = hp_rng_uniform_at(k, (uint64_t)i);
        us += u;
        HP_CHECK(u >= 0.0 && u < 1.0, "uniform range %g", u);
        double t = hp_rng_trunc_normal_at(k2, (uint64_t)i, 0.0f, 0.02f, -0.04f, 0.04f);
        if (t < tmin) tmin = t;
        if (t > tmax) tmax = t;
        ts += t;
        ts2 += t * t;
    }
    HP_CHECK(fabs(s / n) < 0.01 && fabs(s2 / n - 1.0) < 0.02, "normal moments %g %g", s / n, s2 / n);
    HP_CHECK(fabs(us / n - 0.5) < 0.005, "uniform mean %g", us / n);
    HP_CHECK(tmin >= -0.04 && tmax <= 0.04 && tmin < -0.039 && tmax > 0.039, "trunc bounds %g %g", tmin, tmax);
    /* variance of N(0, .02) truncated at 2 sigma: 0.02^2 * 0.7737 */
    HP_CHECK(fabs(ts2 / n - 0.0004 * 0.77372) < 0.0004 * 0.02 && fabs(ts / n) < 1e-4, "trunc var %g", ts2 / n);

    /* A shard filled with its global offset equals the slice of the whole (bitwise). */
    int64_t gs[2] = {7, 5};
    hp_tensor_t whole, part;
    HP_CHECK_OK(hp_tensor_malloc(&whole, HP_F32, 2, gs));
    hp_rng_spec_t spec = {HP_RNG_TRUNC_NORMAL, 0.0f, 0.02f, -0.04f, 0.04f};
    HP_CHECK_OK(hp_rng_fill(&whole, k, &spec, NULL, NULL));
    int64_t ps[2] = {3, 2};
    HP_CHECK_OK(hp_tensor_malloc(&part, HP_F32, 2, ps));
    HP_CHECK_OK(hp_rng_fill(&part, k, &spec, gs, (int64_t[]){4, 3}));
    hp_tensor_t slice, tmp;
    hp_tensor_narrow(&tmp, &whole, 0, 4, 3);
    hp_tensor_narrow(&slice, &tmp, 1, 3, 2);
    HP_CHECK(hp_tensor_allclose(&part, &slice, 0, 0, NULL), "shard equals slice");
    HP_CHECK_ERR(hp_rng_fill(&part, k, &spec, gs, (int64_t[]){5, 3}), HP_ERR_INVALID_ARG, "outside the global size");
    /* bf16 fill equals the rounded f32 fill */
    hp_tensor_t wb;
    HP_CHECK_OK(hp_tensor_malloc(&wb, HP_BF16, 2, gs));
    HP_CHECK_OK(hp_rng_fill(&wb, k, &spec, NULL, NULL));
    int bad = 0;
    for (int i = 0; i < 35; i++)
        if (((uint16_t *)wb.data)[i] != hp_f32_to_bf16(((float *)whole.data)[i])) bad++;
    HP_CHECK(bad == 0, "bf16 fill differs on %d", bad);
    hp_tensor_free_data(&whole);
    hp_tensor_free_data(&part);
    hp_tensor_free_data(&wb);
}

/* I64 elements above 2^53 read and write exactly; allclose compares them exactly; the
 * non-finite counter finds NaN / inf. */
static void test_tensor_i64(void) {
    int64_t n = 3, big = (INT64_C(1) << 53) + 1, vals[3] = {INT64_C(1) << 53, 0, -7};
    vals[1] = big;
    hp_tensor_t t, u;
    HP_CHECK_OK(hp_tensor_init(&t, HP_I64, 1, &n, vals));
    HP_CHECK(hp_tensor_get_flat_i64(&t, 1) == big && hp_tensor_get_flat_i64(&t, 2) == -7,
             "get_flat_i64: %lld", (long long)hp_tensor_get_flat_i64(&t, 1));
    int64_t other[3];
    memcpy(other, vals, sizeof other);
    HP_CHECK_OK(hp_tensor_init(&u, HP_I64, 1, &n, other));
    hp_tensor_set_flat_i64(&u, 0, INT64_MAX);
    HP_CHECK(other[0] == INT64_MAX, "set_flat_i64");
    hp_tensor_set_flat_i64(&u, 0, vals[0]);
    HP_CHECK(hp_tensor_allclose(&t, &u, 0, 0, NULL), "equal i64 tensors");
    other[1] = big - 1; /* equal as doubles, not as integers */
    HP_CHECK(!hp_tensor_allclose(&t, &u, 0, 0, NULL), "2^53+1 vs 2^53 must differ");
    float f[5] = {1, NAN, 2, INFINITY, -INFINITY};
    int64_t n5 = 5, first = 0;
    hp_tensor_t ft;
    HP_CHECK_OK(hp_tensor_init(&ft, HP_F32, 1, &n5, f));
    HP_CHECK(hp_tensor_count_nonfinite(&ft, &first) == 3 && first == 1, "nonfinite: first %lld",
             (long long)first);
    HP_CHECK(hp_tensor_count_nonfinite(&t, &first) == 0 && first == -1, "nonfinite of i64");
}

/* Entries of folder d whose name contains `part` (leftover temporaries). */
static int count_named(const char *d, const char *part) {
    DIR *dir = opendir(d);
    int n = 0;
    for (struct dirent *e; dir && (e = readdir(dir));) n += strstr(e->d_name, part) != NULL;
    if (dir) closedir(dir);
    return n;
}

static void test_file(void) {
    char root[] = "/tmp/hp_test_core_XXXXXX", p[128], q[256];
    HP_CHECK(mkdtemp(root) != NULL, "mkdtemp");
    /* atomic write, then read back whole (NUL after the last byte); no temporary left */
    snprintf(p, sizeof p, "%s/a/b/c", root);
    HP_CHECK_OK(hp_file_mkdirs(p));
    HP_CHECK_OK(hp_file_mkdirs(p));   /* an existing folder is fine */
    snprintf(q, sizeof q, "%s/x.txt", p);
    HP_CHECK_OK(hp_file_write_atomic(q, "old", 3));
    HP_CHECK_OK(hp_file_write_atomic(q, "hello", 5));
    char *data = NULL;
    size_t len = 0;
    HP_CHECK_OK(hp_file_read_all(q, "test file", 5, &data, &len));
    HP_CHECK(data && len == 5 && !strcmp(data, "hello"), "read back %zu bytes", len);
    free(data);
    HP_CHECK(count_named(p, ".tmp") == 0, "temporary files left in %s", p);
    /* the cap, a missing file, a folder: each names the path and what it is */
    HP_CHECK_ERR(hp_file_read_all(q, "test file", 4, &data, &len), HP_ERR_FORMAT, "larger than 4 bytes");
    HP_CHECK(data == NULL, "no data on error");
    snprintf(q, sizeof q, "%s/missing.txt", root);
    HP_CHECK_ERR(hp_file_read_all(q, "test file", 100, &data, &len), HP_ERR_IO,
                 "missing.txt: cannot open the test file");
    HP_CHECK_ERR(hp_file_read_all(p, "test file", 100, &data, &len), HP_ERR_IO, "Is a directory");
    /* a file in the way of a folder; a failed atomic write leaves nothing behind */
    snprintf(q, sizeof q, "%s/x.txt", p);
    HP_CHECK_ERR(hp_file_mkdirs(q), HP_ERR_IO, "exists and is not a folder");
    snprintf(q, sizeof q, "%s/x.txt/y", p);
    HP_CHECK_ERR(hp_file_mkdirs(q), HP_ERR_IO, "cannot create folder");
    HP_CHECK_ERR(hp_file_write_atomic(q, "z", 1), HP_ERR_IO, "temporary file");
    HP_CHECK(count_named(p, ".tmp") == 0, "a failed write left a temporary in %s", p);
    HP_CHECK_ERR(hp_file_probe_writable_dir(q, 0), HP_ERR_IO, "cannot create folder");
    HP_CHECK_ERR(hp_file_probe_writable_file(q, 0), HP_ERR_IO, "exists and is not a folder");
    HP_CHECK_ERR(hp_file_probe_writable_file(p, 0), HP_ERR_IO, "is a folder");
    HP_CHECK_OK(hp_file_probe_writable_dir(p, 0));
    HP_CHECK(count_named(p, ".hp-write-probe") == 0, "probe file left behind");
    /* parent folders */
    char par[64];
    HP_CHECK(!strcmp(hp_file_parent("a/b/c", par, sizeof par), "a/b") &&
                 !strcmp(hp_file_parent("c", par, sizeof par), ".") &&
                 !strcmp(hp_file_parent("/c", par, sizeof par), "/") &&
                 !strcmp(hp_file_parent("a/b/", par, sizeof par), "a"), "hp_file_parent");
    /* the folder commit: tmp replaces dir, the old dir is gone */
    char tmp[128], dir[128];
    snprintf(tmp, sizeof tmp, "%s/new.tmp-1", root);
    snprintf(dir, sizeof dir, "%s/a", root);
    HP_CHECK_OK(hp_file_mkdirs(tmp));
    snprintf(q, sizeof q, "%s/marker", tmp);
    HP_CHECK_OK(hp_file_write_atomic(q, "new", 3));
    HP_CHECK_OK(hp_file_replace_dir(tmp, dir));
    snprintf(q, sizeof q, "%s/marker", dir);
    struct stat sb;
    HP_CHECK(stat(q, &sb) == 0 && stat(tmp, &sb) != 0 && count_named(root, ".old-") == 0 && stat(p, &sb) != 0,
             "after replace_dir: the new folder in place, the old one and tmp gone");
    HP_CHECK_OK(hp_file_rmtree(root));
    HP_CHECK(stat(root, &sb) != 0, "rmtree left %s", root);
    HP_CHECK_OK(hp_file_rmtree(root));   /* a missing path is fine */
}

int main(void) {
    test_status();
    test_dtype();
    test_arena();
    test_tensor();
    test_tensor_i64();
    test_rng();
    test_file();
    return hp_test_finish("test_core");
}
