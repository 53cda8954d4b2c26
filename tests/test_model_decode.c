// KV-cache inference (model.h: hp_model_kv_cache_create, hp_model_prefill, hp_model_decode):
// for llama3, qwen3 (GQA, qk-norm, both RoPE styles) and deepseek_v3 (MLA) the logits of prefill and of each
// decoded position equal the matching row of a full hp_model_forward over the same prefix;
// chunked prefill; the decode attention kernel against the reference; no heap allocation
// per decoded token; errors for a full cache, bad token ids and TP / FSDP models.
// hp-test: ranks 1 timeout 120 isa
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/nn.h"
#include "hyperparallel/nn.h"
#include "hp_test.h"

/* Counts heap allocations while `count_allocs` is set (as test_model.c; not under ASan). */
#if !defined(__SANITIZE_ADDRESS__)
#define HP_COUNT_ALLOCS 1
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
static volatile int count_allocs = 0;
static volatile long n_allocs = 0;
void *malloc(size_t n) { if (count_allocs) __atomic_add_fetch(&n_allocs, 1, __ATOMIC_RELAXED); return __libc_malloc(n); }
void *calloc(size_t a, size_t b) { if (count_allocs) __atomic_add_fetch(&n_allocs, 1, __ATOMIC_RELAXED); return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { if (count_allocs) __atomic_add_fetch(&n_allocs, 1, __ATOMIC_RELAXED); return __libc_realloc(p, n); }
#endif

enum { PROMPT = 20, PREFILL = 7, LONG = 150, LONG_DECODE = 10 };
static const double TOL = 1e-5;   // max |diff| relative to the row's max |logit| of the full forward

static uint32_t lcg(uint32_t *s) { *s = *s * 1664525u + 1013904223u; return *s >> 8; }

/* Small 2-layer configs with GQA; qwen3 gets head_dim 24 (not dim / n_heads, and not a
 * multiple of 16: the plain attention loops) and qk-norm, llama3 head_dim 16. */
static hp_model_config_t small_config(const char *name) {
    hp_model_config_t c;
    HP_CHECK_OK(hp_model_flavor(name, "debugmodel", &c));
    c.dim = 64;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.vocab_size = 256;
    c.max_seq_len = 256;
    if (c.mla) {   // deepseek_v3: MLA (the cache holds per-head k and zero-padded v rows), YaRN on, MoE layers
        c.hidden_dim = 128; c.moe_hidden = 32; c.moe_experts = 4; c.moe_top_k = 2;
        c.kv_lora_rank = 16; c.qk_nope_head_dim = 8; c.qk_rope_head_dim = 8; c.v_head_dim = 12; c.q_lora_rank = 12;
        c.rope_original_max_pos = 64;
    } else if (c.qk_norm) { c.head_dim = 24; c.hidden_dim = 128; }
    else { c.head_dim = 0; c.hidden_dim = 0; c.multiple_of = 32; }
    HP_CHECK_OK(hp_model_config_validate(&c));
    return c;
}

static double rel_err(const float *a, const float *ref, int V) {
    double mx = 0.0, e = 0.0;
    for (int v = 0; v < V; v++) {
        if (fabs(ref[v]) > mx) mx = fabs(ref[v]);
        if (fabs((double)a[v] - ref[v]) > e) e = fabs((double)a[v] - ref[v]);
    }
    return e / (mx > 0.0 ? mx : 1.0);
}

static void test_model_decode(const char *name) {
    hp_model_config_t c = small_config(name);
    const int V = c.vocab_size;
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(&c, 1, 160, &m));
    if (!m) return;
    HP_CHECK_OK(hp_model_init_weights(m, 42));
    int32_t tok[160];
    uint32_t s = 7;
    for (int i = 0; i < 160; i++) tok[i] = (int32_t)(lcg(&s) % (uint32_t)V);

    // reference: the full forward over the 20-token prompt
    float loss;
    float *full = malloc(sizeof(float) * 160 * (size_t)V);
    HP_CHECK_OK(hp_model_forward(m, tok, NULL, 1, PROMPT, 1.0f, &loss));
    memcpy(full, hp_model_logits(m), sizeof(float) * PROMPT * (size_t)V);
    const float *model_logits = hp_model_logits(m);

    hp_model_kv_cache_t kc = NULL;
    HP_CHECK_OK(hp_model_kv_cache_create(m, PROMPT, &kc));
    if (!kc) { hp_model_destroy(m); free(full); return; }
    const float *lg = NULL;
    double worst_prefill = 0.0, worst_decode = 0.0;
    HP_CHECK_OK(hp_model_prefill(m, kc, tok, PREFILL, &lg));
    HP_CHECK(hp_model_kv_cache_pos(kc) == PREFILL, "%s: pos %d after prefill", name, hp_model_kv_cache_pos(kc));
    double e = rel_err(lg, full + (size_t)(PREFILL - 1) * V, V);
    worst_prefill = e;
    HP_CHECK(e <= TOL, "%s: prefill %d: rel err %.3g", name, PREFILL, e);
    for (int p = PREFILL; p < PROMPT; p++) {
        HP_CHECK_OK(hp_model_decode(m, kc, tok[p], &lg));
        e = rel_err(lg, full + (size_t)p * V, V);
        if (e > worst_decode) worst_decode = e;
        HP_CHECK(e <= TOL, "%s: decode at position %d: rel err %.3g", name, p, e);
    }
    HP_CHECK(hp_model_kv_cache_pos(kc) == PROMPT, "%s: pos %d", name, hp_model_kv_cache_pos(kc));
    // the model's own forward state is untouched
    HP_CHECK(hp_model_logits(m) == model_logits && memcmp(model_logits, full, sizeof(float) * PROMPT * (size_t)V) == 0,
             "%s: hp_model_logits changed by prefill/decode", name);

    // cache full: nothing changes
    const float *before = lg;
    float last0 = lg[0];
    HP_CHECK_ERR(hp_model_decode(m, kc, tok[0], &lg), HP_ERR_INVALID_ARG, "KV cache full");
    HP_CHECK_ERR(hp_model_prefill(m, kc, tok, 1, &lg), HP_ERR_INVALID_ARG, "max_len is 20");
    HP_CHECK(hp_model_kv_cache_pos(kc) == PROMPT && lg == before && lg[0] == last0, "%s: state after cache-full", name);

    // prefill of the whole prompt after a reset
    hp_model_kv_cache_reset(kc);
    HP_CHECK(hp_model_kv_cache_pos(kc) == 0, "%s: pos after reset", name);
    HP_CHECK_OK(hp_model_prefill(m, kc, tok, PROMPT, &lg));
    e = rel_err(lg, full + (size_t)(PROMPT - 1) * V, V);
    if (e > worst_prefill) worst_prefill = e;
    HP_CHECK(e <= TOL, "%s: prefill %d: rel err %.3g", name, PROMPT, e);

    // bad token ids: error names the id and range; the cache keeps its positions
    hp_model_kv_cache_reset(kc);
    HP_CHECK_OK(hp_model_prefill(m, kc, tok, 3, NULL));
    HP_CHECK_ERR(hp_model_decode(m, kc, V, &lg), HP_ERR_INVALID_ARG, "token id 256 at index 0 is outside [0, 256)");
    HP_CHECK_ERR(hp_model_decode(m, kc, -1, &lg), HP_ERR_INVALID_ARG, "outside [0, 256)");
    int32_t bad[4] = {1, 2, 999, 3};
    HP_CHECK_ERR(hp_model_prefill(m, kc, bad, 4, &lg), HP_ERR_INVALID_ARG, "token id 999 at index 2");
    HP_CHECK_ERR(hp_model_prefill(m, kc, tok, 0, &lg), HP_ERR_INVALID_ARG, "n >= 1");
    HP_CHECK(hp_model_kv_cache_pos(kc) == 3, "%s: pos %d after bad tokens", name, hp_model_kv_cache_pos(kc));
    hp_model_kv_cache_destroy(kc);

    // chunked prefill (150 tokens: chunks of 64, 64, 22), then decode against a 160-token forward
    HP_CHECK_OK(hp_model_forward(m, tok, NULL, 1, LONG + LONG_DECODE, 1.0f, &loss));
    memcpy(full, hp_model_logits(m), sizeof(float) * (LONG + LONG_DECODE) * (size_t)V);
    kc = NULL;
    HP_CHECK_ERR(hp_model_kv_cache_create(m, 161, &kc), HP_ERR_INVALID_ARG, "max_len 161, expected 1 .. 160");
    HP_CHECK_OK(hp_model_kv_cache_create(m, 160, &kc));
    if (kc) {
        HP_CHECK_OK(hp_model_prefill(m, kc, tok, LONG, &lg));
        e = rel_err(lg, full + (size_t)(LONG - 1) * V, V);
        if (e > worst_prefill) worst_prefill = e;
        HP_CHECK(e <= TOL, "%s: prefill %d: rel err %.3g", name, LONG, e);
        HP_CHECK_OK(hp_model_decode(m, kc, tok[LONG], &lg));   // warm-up before counting
        long allocs = 0;
#ifdef HP_COUNT_ALLOCS
        n_allocs = 0;
        count_allocs = 1;
#endif
        for (int p = LONG + 1; p < LONG + LONG_DECODE; p++) {
            hp_status_t st = hp_model_decode(m, kc, tok[p], &lg);
            e = rel_err(lg, full + (size_t)p * V, V);
            if (e > worst_decode) worst_decode = e;
            HP_CHECK(st == HP_OK && e <= TOL, "%s: decode at position %d: rel err %.3g", name, p, e);
        }
#ifdef HP_COUNT_ALLOCS
        count_allocs = 0;
        allocs = n_allocs;
#endif
        HP_CHECK(allocs == 0, "%s: %ld heap allocations in %d decode steps", name, allocs, LONG_DECODE - 1);
        hp_model_kv_cache_destroy(kc);
    }
    printf("%s: max rel err prefill %.3g, decode %.3g (tolerance %g)\n", name, worst_prefill, worst_decode, TOL);

    // FSDP-wrapped (the entries point into another owner's storage, here none): refused,
    // naming the wrapper
    kc = NULL;
    HP_CHECK_OK(hp_model_kv_cache_create(m, 8, &kc));
    for (int i = 0; i < hp_model_num_params(m); i++)
        hp_model_params(m)[i].value.local.data = hp_model_params(m)[i].grad.local.data = NULL;
    HP_CHECK_OK(hp_model_compact_storage(m));
    HP_CHECK_ERR(hp_model_decode(m, kc, 1, &lg), HP_ERR_STATE, "FSDP-wrapped");
    hp_model_kv_cache_t kc2 = NULL;
    HP_CHECK_ERR(hp_model_kv_cache_create(m, 8, &kc2), HP_ERR_STATE, "FSDP-wrapped");
    hp_model_kv_cache_destroy(kc);
    hp_model_destroy(m);

    // tensor-parallel (wo holds half its input columns, a TP 2 rowwise shard): refused
    m = NULL;
    HP_CHECK_OK(hp_model_create(&c, 1, 16, &m));
    hp_model_find_param(m, "layers.0.attention.wo.weight")->value.local.shape[1] /= 2;
    kc = NULL;
    HP_CHECK_ERR(hp_model_kv_cache_create(m, 8, &kc), HP_ERR_STATE, "tensor-parallel");
    hp_model_destroy(m);
    free(full);
}

/* The decode kernel against the reference attention (double, full softmax): all rows from
 * p0 = 0, and the last rows of a cache. */
static void test_decode_kernel(int hd) {
    const int T = 37, Hq = 6, Hkv = 2, qd = Hq * hd, kd = Hkv * hd;
    float *q = malloc(sizeof(float) * T * qd), *k = malloc(sizeof(float) * T * kd), *v = malloc(sizeof(float) * T * kd);
    float *ref = malloc(sizeof(float) * T * qd), *lse = malloc(sizeof(float) * T * Hq), *out = malloc(sizeof(float) * T * qd);
    const int nt = omp_get_max_threads();
    float *scratch = malloc(sizeof(float) * (size_t)nt * T);
    uint32_t s = 11;
    for (int i = 0; i < T * qd; i++) q[i] = (float)(lcg(&s) % 2001) / 1000.0f - 1.0f;
    for (int i = 0; i < T * kd; i++) k[i] = (float)(lcg(&s) % 2001) / 1000.0f - 1.0f;
    for (int i = 0; i < T * kd; i++) v[i] = (float)(lcg(&s) % 2001) / 1000.0f - 1.0f;
    hp_ref_attention_forward(ref, lse, q, qd, k, kd, v, kd, 1, T, Hq, Hkv, hd);
    double e = 0.0;
    hp_attention_decode_forward(out, scratch, q, qd, k, kd, v, kd, 0, T, Hq, Hkv, hd, nt);
    for (int i = 0; i < T * qd; i++) e = fmax(e, fabs((double)out[i] - ref[i]));
    const int p0 = T - 3;
    hp_attention_decode_forward(out, scratch, q + (size_t)p0 * qd, qd, k, kd, v, kd, p0, 3, Hq, Hkv, hd, nt);
    for (int i = 0; i < 3 * qd; i++) e = fmax(e, fabs((double)out[i] - ref[(size_t)p0 * qd + i]));
    HP_CHECK(e <= 2e-6, "decode kernel hd %d: max abs err %.3g vs reference", hd, e);
    free(q); free(k); free(v); free(ref); free(lse); free(out); free(scratch);
}

int main(void) {
    test_decode_kernel(16);
    test_decode_kernel(24);
    test_model_decode("llama3");
    test_model_decode("qwen3");
    test_model_decode("deepseek_v3");
    return hp_test_finish("test_model_decode");
}
