/* safetensors reader/writer: round trips of every dtype (raw and hp tensors, strided views,
 * scalars, empty tensors, metadata), dtype conversion on read, a file written by Python's
 * safetensors, and crafted bad files (truncated, garbage and overflowing header lengths,
 * bad JSON, unknown dtypes, bad shapes and offsets, overlap, holes) that must fail with a
 * clear message and never crash; plus every truncation of a valid file and byte flips. */
// hp-test: ranks 1 timeout 60
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hp_test.h"
#include "hyperparallel/safetensors.h"

static char dir[256];

static void path_in(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", dir, name); }

/* File image: 8-byte LE length of hdr, hdr, then data_len bytes of `fill`. */
static size_t craft(unsigned char *out, size_t cap, const char *hdr, uint64_t hlen_override,
                    size_t data_len) {
    size_t hl = strlen(hdr);
    uint64_t L = hlen_override ? hlen_override : hl;
    HP_ASSERT(8 + hl + data_len <= cap);
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)(L >> (8 * i));
    memcpy(out + 8, hdr, hl);
    for (size_t i = 0; i < data_len; i++) out[8 + hl + i] = (unsigned char)(i * 7 + 1);
    return 8 + hl + data_len;
}

static hp_status_t open_crafted(const char *hdr, uint64_t hlen_override, size_t data_len) {
    static unsigned char buf[4096];
    size_t n = craft(buf, sizeof buf, hdr, hlen_override, data_len);
    hp_safetensors_t st = NULL;
    hp_status_t s = hp_safetensors_open_memory(buf, n, "crafted", &st);
    if (s == HP_OK) hp_safetensors_close(st);
    /* the same bytes through the file path give the same verdict */
    char p[300];
    path_in(p, sizeof p, "crafted.safetensors");
    FILE *f = fopen(p, "wb");
    HP_ASSERT(f && fwrite(buf, 1, n, f) == n);
    fclose(f);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", hp_last_error());
    hp_safetensors_t st2 = NULL;
    hp_status_t s2 = hp_safetensors_open(p, &st2);
    if (s2 == HP_OK) hp_safetensors_close(st2);
    HP_CHECK(s == s2, "memory and file verdicts differ for header %.60s: %d vs %d", hdr, s, s2);
    hp_error(s, "%s", msg);   /* restore the memory path's message for the caller's check */
    return s;
}

static void test_bad_files(void) {
    unsigned char tiny[5] = {1, 2, 3, 4, 5};
    hp_safetensors_t st = NULL;
    HP_CHECK_ERR(hp_safetensors_open_memory(tiny, 0, "empty", &st), HP_ERR_FORMAT, "too short");
    HP_CHECK_ERR(hp_safetensors_open_memory(tiny, 5, "five", &st), HP_ERR_FORMAT, "too short");
    HP_CHECK(st == NULL, "no handle on failure");
    char p[300];
    path_in(p, sizeof p, "does-not-exist.safetensors");
    HP_CHECK_ERR(hp_safetensors_open(p, &st), HP_ERR_IO, "cannot open");

    /* crafted headers: header length (garbage, overflowing, larger than the file), JSON, entries */
    static const struct {
        const char *hdr;
        uint64_t hlen;   /* the length field; 0: the header's own length */
        size_t data;     /* bytes of data after the header */
        hp_status_t status;
        const char *needle;   /* part of the message */
    } bad[] = {
        {"{}", UINT64_MAX, 0, HP_ERR_FORMAT, "exceeds the 100 MB"},
        {"{}", (uint64_t)1 << 63, 0, HP_ERR_FORMAT, "exceeds the 100 MB"},
        {"{}", 1000, 0, HP_ERR_FORMAT, "truncated"},
        {"{}", 0x7473696874736574ull, 0, HP_ERR_FORMAT, "100 MB"},
        {"{\"a\": {\"dtype\"", 0, 0, HP_ERR_FORMAT, "not valid JSON"},
        {"[1, 2]", 0, 0, HP_ERR_FORMAT, "does not start with '{'"},
        {"{}xx", 0, 0, HP_ERR_FORMAT, "near byte 2 of 4"},
        {"{}{}", 0, 0, HP_ERR_FORMAT, "near byte 2 of 4"},
        {"{\"a\": 1}", 0, 0, HP_ERR_FORMAT, "not an object"},
        {"{\"a\": tru}", 0, 0, HP_ERR_FORMAT, "not valid JSON"},
        {"{\"a\": {\"dtype\": \"F32\",}}", 0, 0, HP_ERR_FORMAT, "not valid JSON"},
        {"{\"\xff\xfe\": 1}", 0, 0, HP_ERR_FORMAT, "not valid JSON"},
        {"{\"w\": {\"dtype\": \"F33\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
         0, 4, HP_ERR_FORMAT, "unknown dtype 'F33'"},
        {"{\"w\": {\"dtype\": \"F4\", \"shape\": [2], \"data_offsets\": [0, 1]}}", 0, 1, HP_ERR_UNSUPPORTED, "F4"},
        {"{\"w\": {\"dtype\": 3, \"shape\": [1], \"data_offsets\": [0, 4]}}", 0, 4, HP_ERR_FORMAT, "dtype"},
        {"{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 0, 4, HP_ERR_FORMAT, "shape"},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1]}}", 0, 4, HP_ERR_FORMAT, "data_offsets"},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 0, 4, HP_ERR_FORMAT, "data_offsets"},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 0, 4, HP_ERR_FORMAT, "shape[0]"},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 0, 4, HP_ERR_FORMAT, "shape[0]"},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904, 4611686018427387904], "
         "\"data_offsets\": [0, 4]}}",
         0, 4, HP_ERR_FORMAT, "overflows"},
        {"{\"w\": {\"dtype\": \"F64\", \"shape\": [4611686018427387904], \"data_offsets\": [0, 4]}}",
         0, 4, HP_ERR_FORMAT, "overflows"},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [99999999999999999999], \"data_offsets\": [0, 4]}}",
         0, 4, HP_ERR_FORMAT, "shape[0]"},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}",
         0, 4, HP_ERR_FORMAT, "9 dims"},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 64]}}",
         0, 8, HP_ERR_FORMAT, "run past the data section"},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}",
         0, 8, HP_ERR_FORMAT, "end before begin"},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, -8]}}",
         0, 8, HP_ERR_FORMAT, "non-negative"},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}",
         0, 8, HP_ERR_FORMAT, "span 8 bytes"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
         "\"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
         0, 12, HP_ERR_FORMAT, "overlap"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
         "\"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}",
         0, 8, HP_ERR_FORMAT, "overlap"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
         "\"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}",
         0, 12, HP_ERR_FORMAT, "unused bytes"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
         0, 9, HP_ERR_FORMAT, "cover 4 bytes but the data section has 9"},
        {"{\"__metadata__\": {\"k\": 3}}", 0, 0, HP_ERR_FORMAT, "not a string"},
        {"{\"__metadata__\": [\"k\"]}", 0, 0, HP_ERR_FORMAT, "__metadata__"},
        {"{\"\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 0, 4, HP_ERR_FORMAT, "tensor name"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        HP_CHECK_ERR(open_crafted(bad[i].hdr, bad[i].hlen, bad[i].data), bad[i].status, bad[i].needle);
    {
        static char hdr[200];
        memcpy(hdr, "{}\0   ", 6);   /* NUL inside the header region */
        static unsigned char buf[64];
        size_t n = craft(buf, sizeof buf, "{}", 6, 0);
        memcpy(buf + 8, hdr, 6);
        n = 8 + 6;
        HP_CHECK_ERR(hp_safetensors_open_memory(buf, n, "nul", &st), HP_ERR_FORMAT, "trailing");
    }
    /* valid minimal files */
    HP_CHECK_OK(open_crafted("{}", 0, 0));
    HP_CHECK_OK(open_crafted("{}      ", 0, 0));
    HP_CHECK_OK(open_crafted("{\"__metadata__\": {\"format\": \"pt\"}, \"w\": {\"dtype\": \"F32\", "
                             "\"shape\": [], \"data_offsets\": [0, 4]}, \"e\": {\"dtype\": \"BF16\", "
                             "\"shape\": [0, 3], \"data_offsets\": [4, 4]}}", 0, 4));
}

static void test_round_trip(void) {
    char p[300];
    path_in(p, sizeof p, "rt.safetensors");
    float f32[6] = {1.5f, -2.25f, 3.0f, 1e-3f, -0.0f, 65504.0f};
    hp_tensor_t a, at, b16, i32t, scal, empty;
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s04[2] = {0, 4};
    HP_CHECK_OK(hp_tensor_init(&a, HP_F32, 2, s23, f32));
    HP_CHECK_OK(hp_tensor_transpose(&at, &a, 0, 1));   /* strided (3, 2) view */
    uint16_t bf[3] = {hp_f32_to_bf16(1.0f), hp_f32_to_bf16(-3.5f), hp_f32_to_bf16(0.15625f)};
    int64_t s3[1] = {3};
    HP_CHECK_OK(hp_tensor_init(&b16, HP_BF16, 1, s3, bf));
    int32_t iv[3] = {-7, 0, 2147483647};
    HP_CHECK_OK(hp_tensor_init(&i32t, HP_I32, 1, s3, iv));
    float one = 42.0f;
    HP_CHECK_OK(hp_tensor_init(&scal, HP_F32, 0, NULL, &one));
    HP_CHECK_OK(hp_tensor_init(&empty, HP_F32, 2, s04, NULL));
    int8_t i8[4] = {-128, -1, 0, 127};
    double f64[2] = {0.1, -1e300};
    uint8_t bools[3] = {1, 0, 1};
    uint16_t u16[2] = {65535, 7};
    int64_t i64[3] = {-5, 1LL << 40, 9};
    int64_t s4[1] = {4}, s2[1] = {2}, s2b[1] = {3};
    hp_st_entry_t e[] = {
        {"a", &a, HP_ST_AUTO, NULL, 0, NULL},
        {"a_t", &at, HP_ST_AUTO, NULL, 0, NULL},
        {"a_as_bf16", &a, HP_ST_BF16, NULL, 0, NULL},
        {"a_as_f16", &a, HP_ST_F16, NULL, 0, NULL},
        {"b16", &b16, HP_ST_AUTO, NULL, 0, NULL},
        {"i32", &i32t, HP_ST_AUTO, NULL, 0, NULL},
        {"scalar", &scal, HP_ST_AUTO, NULL, 0, NULL},
        {"empty", &empty, HP_ST_AUTO, NULL, 0, NULL},
        {"raw.i8", NULL, HP_ST_I8, i8, 1, s4},
        {"raw.f64", NULL, HP_ST_F64, f64, 1, s2},
        {"raw.bool", NULL, HP_ST_BOOL, bools, 1, s2b},
        {"raw.u16", NULL, HP_ST_U16, u16, 1, s2},
        {"raw.i64", NULL, HP_ST_I64, i64, 1, s2b},
    };
    int n = (int)(sizeof e / sizeof e[0]);
    const char *meta[] = {"format", "pt", "note", "quote \" and \\ and \xc3\xa9"};
    HP_CHECK_OK(hp_safetensors_write(p, e, n, meta, 2));

    hp_safetensors_t st = NULL;
    HP_CHECK_OK(hp_safetensors_open(p, &st));
    if (!st) return;
    HP_CHECK(hp_safetensors_count(st) == n, "count %d", hp_safetensors_count(st));
    HP_CHECK(hp_safetensors_metadata_count(st) == 2, "metadata count");
    const char *note = hp_safetensors_metadata(st, "note");
    HP_CHECK(note && strcmp(note, meta[3]) == 0, "metadata value '%s'", note ? note : "(null)");
    HP_CHECK(hp_safetensors_metadata(st, "missing") == NULL, "absent key");
    const hp_st_info_t *info;
    HP_CHECK_OK(hp_safetensors_find(st, "raw.f64", &info));
    HP_CHECK(info->dtype == HP_ST_F64 && info->ndim == 1 && info->shape[0] == 2 &&
             info->end - info->begin == 16, "raw.f64 info");
    HP_CHECK_ERR(hp_safetensors_find(st, "nope", &info), HP_ERR_NOT_FOUND, "no tensor named 'nope'");

    float back[6];
    hp_tensor_t t;
    HP_CHECK_OK(hp_tensor_init(&t, HP_F32, 2, s23, back));
    HP_CHECK_OK(hp_safetensors_read(st, "a", &t, 0));
    HP_CHECK(memcmp(back, f32, sizeof f32) == 0, "f32 round trip");
    /* the transposed view was stored contiguous (3, 2) */
    HP_CHECK_OK(hp_tensor_init(&t, HP_F32, 2, s32, back));
    HP_CHECK_OK(hp_safetensors_read(st, "a_t", &t, 0));
    HP_CHECK(back[1] == f32[3] && back[2] == f32[1] && back[5] == f32[5], "transposed round trip");
    /* read into a strided destination */
    float dstbuf[6] = {0};
    hp_tensor_t d, dt;
    HP_CHECK_OK(hp_tensor_init(&d, HP_F32, 2, s23, dstbuf));
    HP_CHECK_OK(hp_tensor_transpose(&dt, &d, 0, 1));
    HP_CHECK_OK(hp_safetensors_read(st, "a_t", &dt, 0));
    HP_CHECK(memcmp(dstbuf, f32, sizeof f32) == 0, "strided destination");
    /* bf16 stored, read as f32 with conversion; refused without */
    HP_CHECK_OK(hp_tensor_init(&t, HP_F32, 2, s23, back));
    HP_CHECK_ERR(hp_safetensors_read(st, "a_as_bf16", &t, 0), HP_ERR_INVALID_ARG, "is BF16 in the file");
    HP_CHECK_OK(hp_safetensors_read(st, "a_as_bf16", &t, 1));
    for (int i = 0; i < 6; i++)
        HP_CHECK(back[i] == hp_bf16_to_f32(hp_f32_to_bf16(f32[i])), "bf16 value %d: %g", i, back[i]);
    HP_CHECK_OK(hp_safetensors_read(st, "a_as_f16", &t, 1));
    for (int i = 0; i < 6; i++)
        HP_CHECK(back[i] == hp_f16_to_f32(hp_f32_to_f16(f32[i])), "f16 value %d: %g", i, back[i]);
    /* f32 -> bf16 destination */
    uint16_t bback[6];
    hp_tensor_t tb;
    HP_CHECK_OK(hp_tensor_init(&tb, HP_BF16, 2, s23, bback));
    HP_CHECK_OK(hp_safetensors_read(st, "a", &tb, 1));
    HP_CHECK(bback[1] == hp_f32_to_bf16(-2.25f) && bback[3] == hp_f32_to_bf16(1e-3f), "f32->bf16");
    /* F64 -> f32 */
    float f2[2];
    HP_CHECK_OK(hp_tensor_init(&t, HP_F32, 1, s2, f2));
    HP_CHECK_OK(hp_safetensors_read(st, "raw.f64", &t, 1));
    HP_CHECK(f2[0] == 0.1f && isinf(f2[1]) && f2[1] < 0, "f64->f32 %g %g", f2[0], f2[1]);
    /* shape mismatch */
    HP_CHECK_OK(hp_tensor_init(&t, HP_F32, 2, s32, back));
    HP_CHECK_ERR(hp_safetensors_read(st, "a", &t, 0), HP_ERR_INVALID_ARG, "has shape (2, 3)");
    /* ints */
    int32_t ib[3];
    hp_tensor_t ti;
    HP_CHECK_OK(hp_tensor_init(&ti, HP_I32, 1, s3, ib));
    HP_CHECK_OK(hp_safetensors_read(st, "i32", &ti, 0));
    HP_CHECK(ib[0] == -7 && ib[2] == 2147483647, "i32 round trip");
    HP_CHECK_ERR(hp_safetensors_read(st, "raw.i64", &ti, 1), HP_ERR_INVALID_ARG, "does not fit in i32");
    HP_CHECK_ERR(hp_safetensors_read(st, "raw.i64", &ti, 0), HP_ERR_INVALID_ARG, "convert=0");
    int64_t lb[3];
    hp_tensor_t tl;
    HP_CHECK_OK(hp_tensor_init(&tl, HP_I64, 1, s3, lb));
    HP_CHECK_OK(hp_safetensors_read(st, "raw.i64", &tl, 0));
    HP_CHECK(lb[1] == (1LL << 40), "i64");
    HP_CHECK_OK(hp_safetensors_read(st, "i32", &tl, 1));
    HP_CHECK(lb[0] == -7, "i32->i64");
    HP_CHECK_ERR(hp_safetensors_read(st, "i32", &tl, 0), HP_ERR_INVALID_ARG, "I32");
    uint8_t ub[3];
    hp_tensor_t tu;
    HP_CHECK_OK(hp_tensor_init(&tu, HP_U8, 1, s3, ub));
    HP_CHECK_OK(hp_safetensors_read(st, "raw.bool", &tu, 1));
    HP_CHECK(ub[0] == 1 && ub[1] == 0 && ub[2] == 1, "bool->u8");
    HP_CHECK_ERR(hp_safetensors_read(st, "i32", &tu, 1), HP_ERR_INVALID_ARG, "does not fit in u8");
    HP_CHECK_ERR(hp_safetensors_read(st, "a", &ti, 1), HP_ERR_INVALID_ARG, "has shape");
    /* float -> int refused even with convert */
    int32_t i6[6];
    hp_tensor_t t6;
    HP_CHECK_OK(hp_tensor_init(&t6, HP_I32, 2, s23, i6));
    HP_CHECK_ERR(hp_safetensors_read(st, "a", &t6, 1), HP_ERR_INVALID_ARG, "not convertible");
    /* raw */
    int8_t rb[4];
    HP_CHECK_OK(hp_safetensors_read_raw(st, "raw.i8", rb, 4));
    HP_CHECK(memcmp(rb, i8, 4) == 0, "raw i8");
    HP_CHECK_ERR(hp_safetensors_read_raw(st, "raw.i8", rb, 3), HP_ERR_INVALID_ARG, "holds 4 bytes");
    /* scalar and empty */
    float sv = 0;
    hp_tensor_t ts;
    HP_CHECK_OK(hp_tensor_init(&ts, HP_F32, 0, NULL, &sv));
    HP_CHECK_OK(hp_safetensors_read(st, "scalar", &ts, 0));
    HP_CHECK(sv == 42.0f, "scalar");
    hp_tensor_t te;
    HP_CHECK_OK(hp_tensor_init(&te, HP_F32, 2, s04, NULL));
    HP_CHECK_OK(hp_safetensors_read(st, "empty", &te, 0));
    hp_safetensors_close(st);

    /* writer errors */
    hp_st_entry_t dup[2] = {{"x", &a, HP_ST_AUTO, NULL, 0, NULL}, {"x", &a, HP_ST_AUTO, NULL, 0, NULL}};
    HP_CHECK_ERR(hp_safetensors_write(p, dup, 2, NULL, 0), HP_ERR_INVALID_ARG, "given twice");
    hp_st_entry_t bad = {"x", &i32t, HP_ST_BF16, NULL, 0, NULL};
    HP_CHECK_ERR(hp_safetensors_write(p, &bad, 1, NULL, 0), HP_ERR_INVALID_ARG, "cannot be stored as BF16");
    hp_st_entry_t resv = {"__metadata__", &a, HP_ST_AUTO, NULL, 0, NULL};
    HP_CHECK_ERR(hp_safetensors_write(p, &resv, 1, NULL, 0), HP_ERR_INVALID_ARG, "reserved");
    char nodir[300];
    path_in(nodir, sizeof nodir, "no/such/dir/x.safetensors");
    HP_CHECK_ERR(hp_safetensors_write(nodir, e, 1, NULL, 0), HP_ERR_IO, "temporary file");
    /* the failed writes left the earlier file intact and no temporary files behind */
    HP_CHECK_OK(hp_safetensors_open(p, &st));
    if (st) {
        HP_CHECK(hp_safetensors_count(st) == n, "file intact after failed writes");
        hp_safetensors_close(st);
    }
    DIR *dd = opendir(dir);
    struct dirent *de;
    int tmp_left = 0;
    while (dd && (de = readdir(dd)) != NULL)
        if (strstr(de->d_name, ".tmp")) tmp_left++;
    if (dd) closedir(dd);
    HP_CHECK(tmp_left == 0, "%d temporary files left behind", tmp_left);
}

/* Every proper prefix of a valid file must be rejected; byte flips in the header must never
 * crash (the verdict may be either way). */
static void test_truncations_and_flips(void) {
    char p[300];
    path_in(p, sizeof p, "rt.safetensors");
    FILE *f = fopen(p, "rb");
    HP_CHECK(f != NULL, "open %s", p);
    if (!f) return;
    static unsigned char img[1 << 16];
    size_t n = fread(img, 1, sizeof img, f);
    fclose(f);
    HP_CHECK(n > 100 && n < sizeof img, "file size %zu", n);
    int accepted = 0;
    for (size_t len = 0; len < n; len++) {
        hp_safetensors_t st = NULL;
        if (hp_safetensors_open_memory(img, len, "prefix", &st) == HP_OK) {
            accepted++;
            hp_safetensors_close(st);
        }
    }
    HP_CHECK(accepted == 0, "%d truncated prefixes accepted", accepted);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | img[i];
    static unsigned char mut[1 << 16];
    int ok = 0, bad = 0;
    for (size_t i = 0; i < 8 + hlen; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            memcpy(mut, img, n);
            mut[i] ^= (unsigned char)(1u << bit);
            hp_safetensors_t st = NULL;
            if (hp_safetensors_open_memory(mut, n, "flip", &st) == HP_OK) {
                ok++;
                /* whatever was accepted must be readable within bounds */
                for (int k = 0; k < hp_safetensors_count(st); k++) {
                    const hp_st_info_t *info = hp_safetensors_info(st, k);
                    static unsigned char sink[1 << 16];
                    if (info->end - info->begin <= sizeof sink)
                        hp_safetensors_read_raw(st, info->name, sink, info->end - info->begin);
                }
                hp_safetensors_close(st);
            } else {
                bad++;
                HP_CHECK(strlen(hp_last_error()) > 0, "failure without a message at byte %zu", i);
            }
        }
    }
    HP_CHECK(bad > 0, "byte flips: %d accepted, %d rejected", ok, bad);
}

/* A file written by Python's safetensors (the golden reference) opens and reads. */
static void test_python_file(void) {
    char p[512];
    hp_test_source_path(p, sizeof p, "tests/data/golden_llama3.safetensors");
    hp_safetensors_t st = NULL;
    HP_CHECK_OK(hp_safetensors_open(p, &st));
    if (!st) return;
    const char *cfg = hp_safetensors_metadata(st, "config");
    HP_CHECK(cfg && strstr(cfg, "\"dim\": 96"), "config metadata '%s'", cfg ? cfg : "(null)");
    const hp_st_info_t *info;
    HP_CHECK_OK(hp_safetensors_find(st, "tokens", &info));
    HP_CHECK(info->dtype == HP_ST_I32 && info->ndim == 2 && info->shape[0] == 2 && info->shape[1] == 17,
             "tokens info");
    HP_CHECK_OK(hp_safetensors_find(st, "param.tok_embeddings.weight", &info));
    HP_CHECK(info->dtype == HP_ST_F32 && info->shape[0] == 301 && info->shape[1] == 96, "embedding info");
    hp_safetensors_close(st);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/hp_test_safetensors_XXXXXX");
    HP_ASSERT(mkdtemp(dir) != NULL);
    test_bad_files();
    test_round_trip();
    test_truncations_and_flips();
    test_python_file();
    hp_test_remove_dir(dir);
    return hp_test_finish("test_safetensors");
}
