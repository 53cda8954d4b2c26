// Model flavors against TorchTitan's numbers (parameter counts, FLOPs/token), the model
// registry (models.h), config errors, parameter names and shapes, init statistics,
// forward/backward sanity (initial loss near ln V, ignore index, loss divisor), no heap
// allocation in a step, bitwise determinism.
// hp-test: ranks 1 timeout 120 coretype 1 isa
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hp_test.h"

/* Counts heap allocations while `count_allocs` is set: this program's malloc/calloc/realloc
 * interpose glibc's (not under AddressSanitizer, which interposes them itself). */
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

static void test_flavors(void) {
    hp_model_config_t c;
    HP_CHECK_OK(hp_model_flavor("llama3", "debugmodel", &c));
    HP_CHECK(c.hidden_dim == 768 && c.head_dim == 16 && c.n_kv_heads == 16, "debugmodel hidden %d hd %d kv %d",
             c.hidden_dim, c.head_dim, c.n_kv_heads);
    // TorchTitan: 6,163,712 params, 5,639,424 without the embedding, 71.6 MFLOP/token at T=2048
    HP_CHECK(hp_model_param_count(&c, 0) == 6163712, "debugmodel params %lld", (long long)hp_model_param_count(&c, 0));
    HP_CHECK(hp_model_param_count(&c, 1) == 5639424, "debugmodel non-emb %lld", (long long)hp_model_param_count(&c, 1));
    HP_CHECK_CLOSE(hp_model_flops_per_token(&c, 2048), 6.0 * 5639424 + 12.0 * 6 * 256 * 2048, 0, 0.5);
    HP_CHECK_CLOSE(hp_model_flops_per_token(&c, 2048) / 1e6, 71.585280, 0, 1e-6);
    HP_CHECK_OK(hp_model_flavor("llama3", "8B", &c));
    HP_CHECK(c.hidden_dim == 14336, "8B hidden %d", c.hidden_dim);
    HP_CHECK(hp_model_param_count(&c, 0) == 8030261248LL, "8B params %lld", (long long)hp_model_param_count(&c, 0));
    HP_CHECK_OK(hp_model_flavor("llama3", "70B", &c));
    HP_CHECK(c.hidden_dim == 28672, "70B hidden %d", c.hidden_dim);
    HP_CHECK(hp_model_param_count(&c, 0) == 70553706496LL, "70B params %lld", (long long)hp_model_param_count(&c, 0));
    HP_CHECK_OK(hp_model_flavor("llama3", "405B", &c));
    HP_CHECK(c.hidden_dim == 53248, "405B hidden %d", c.hidden_dim);
    HP_CHECK(hp_model_param_count(&c, 0) == 405853388800LL, "405B params %lld", (long long)hp_model_param_count(&c, 0));
    HP_CHECK_OK(hp_model_flavor("llama3", "1B", &c));
    HP_CHECK(c.hidden_dim == 8192 && c.head_dim == 64, "1B hidden %d hd %d", c.hidden_dim, c.head_dim);
    HP_CHECK_OK(hp_model_flavor("qwen3", "0.6B", &c));
    // Qwen3-0.6B: 596,049,920 params (tied), 440,467,456 without the embedding
    HP_CHECK(hp_model_param_count(&c, 0) == 596049920LL, "qwen3 0.6B params %lld", (long long)hp_model_param_count(&c, 0));
    HP_CHECK(c.tie_embeddings && c.qk_norm && c.head_dim == 128, "qwen3 flags");
    HP_CHECK_OK(hp_model_flavor("qwen3", "debugmodel", &c));
    HP_CHECK(c.n_layers == 8 && c.hidden_dim == 3072 && c.n_kv_heads == 8, "qwen3 debug shape");
    // tied: the embedding is not subtracted in the FLOPs count
    HP_CHECK(hp_model_param_count(&c, 1) == hp_model_param_count(&c, 0), "qwen3 tied count");
    HP_CHECK_ERR(hp_model_flavor("llama3", "7B", &c), HP_ERR_INVALID_ARG, "debugmodel, 1B, 8B, 70B, 405B");
    HP_CHECK_ERR(hp_model_flavor("gpt2", "small", &c), HP_ERR_INVALID_ARG, "valid models");
    HP_CHECK_OK(hp_model_flavor("llama3", "debugmodel", &c));
    c.n_kv_heads = 5;
    HP_CHECK_ERR(hp_model_config_validate(&c), HP_ERR_INVALID_ARG, "n_kv_heads");
}

/* The registry (models.h): every family is found by its name, resolves its debugmodel flavor
 * with its architecture, and has a TP plan and an HF adapter; an unknown name lists them all;
 * a config without an architecture is refused by hp_model_create, naming the fix. */
static void test_registry(void) {
    HP_CHECK(hp_model_spec_count() >= 4 && hp_model_spec_at(hp_model_spec_count()) == NULL && !hp_model_spec_find("gpt2"),
             "registry bounds");
    char all[512] = "";
    for (int i = 0; i < hp_model_spec_count(); i++) {
        const hp_model_spec_t *s = hp_model_spec_at(i);
        hp_model_config_t c;
        HP_CHECK(s && hp_model_spec_find(s->name) == s, "family %d found by its name", i);
        HP_CHECK_OK(hp_model_flavor(s->name, "debugmodel", &c));
        HP_CHECK(!strcmp(c.name, s->name) && c.arch == s->arch && s->tp_plan && s->tp_plan(&c, 1, 1, NULL, 0) > 0 &&
                 hp_model_hf_adapter(&c) == s->hf && s->hf,
                 "%s: name, arch, tp plan, adapter", s->name);
        snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s (%s)", i ? ", " : "", s->name, s->flavors);
    }
    hp_model_config_t c;
    HP_CHECK_ERR(hp_model_flavor("gpt2", "small", &c), HP_ERR_INVALID_ARG, all);
    memset(&c, 0, sizeof c);
    HP_CHECK_OK(hp_model_flavor("llama3", "debugmodel", &c));
    c.arch = NULL;   // a config made by hand, not through the registry
    hp_model_t m = NULL;
    HP_CHECK_ERR(hp_model_create(&c, 1, 8, &m), HP_ERR_INVALID_ARG, "has no architecture");
    HP_CHECK(m == NULL && hp_model_describe_params(&c, 0, 2, NULL, 0) == -1, "no model without an architecture");
}

static hp_model_config_t tiny(const char *name) {
    hp_model_config_t c;
    memset(&c, 0, sizeof(c));
    HP_ASSERT(hp_model_flavor(name, "debugmodel", &c) == HP_OK);
    c.dim = 48;
    c.n_layers = 2;
    c.n_heads = 6;
    c.n_kv_heads = 2;
    c.head_dim = strcmp(name, "qwen3") == 0 ? 12 : 0;
    c.hidden_dim = strcmp(name, "qwen3") == 0 ? 80 : 0;
    c.vocab_size = 97;
    return c;
}

static void test_model_basics(const char *name) {
    hp_model_config_t c = tiny(name);
    hp_model_t m = NULL;
    HP_CHECK_ERR(hp_model_create(&c, 2, c.max_seq_len + 1, &m), HP_ERR_INVALID_ARG, "max_seq_len");
    HP_CHECK_OK(hp_model_create(&c, 3, 16, &m));
    if (!m) return;
    const hp_model_config_t *mc = hp_model_config(m);
    int64_t total = 0;
    hp_param_t *p = hp_model_params(m);
    for (int i = 0; i < hp_model_num_params(m); i++) {
        int64_t n = 1;
        for (int d = 0; d < p[i].value.local.ndim; d++) n *= p[i].value.local.shape[d];
        total += n;
        HP_CHECK(p[i].value.mesh == NULL && p[i].grad.local.data != p[i].value.local.data, "param %s", p[i].name);
    }
    HP_CHECK(total == hp_model_param_count(mc, 0), "sum of param sizes %lld vs count %lld", (long long)total,
             (long long)hp_model_param_count(mc, 0));
    HP_CHECK(hp_model_find_param(m, "layers.1.attention.wk.weight") != NULL, "wk present");
    hp_param_t *wk = hp_model_find_param(m, "layers.1.attention.wk.weight");
    if (wk) HP_CHECK(wk->value.local.shape[0] == 2 * mc->head_dim && wk->value.local.shape[1] == 48, "wk shape");
    HP_CHECK((hp_model_find_param(m, "output.weight") == NULL) == (mc->tie_embeddings != 0), "output presence");
    HP_CHECK((hp_model_find_param(m, "layers.0.attention.q_norm.weight") != NULL) == (mc->qk_norm != 0), "q_norm");
    HP_CHECK_OK(hp_model_init_weights(m, 1234));
    hp_param_t *wq = hp_model_find_param(m, "layers.0.attention.wq.weight");
    hp_param_t *w2 = hp_model_find_param(m, "layers.1.feed_forward.w2.weight");
    hp_param_t *nw = hp_model_find_param(m, "layers.1.ffn_norm.weight");
    double s1 = 0, s2 = 0;
    int64_t n1 = wq->value.local.shape[0] * wq->value.local.shape[1], n2 = w2->value.local.shape[0] * w2->value.local.shape[1];
    for (int64_t i = 0; i < n1; i++) s1 += pow(((float *)wq->value.local.data)[i], 2);
    for (int64_t i = 0; i < n2; i++) s2 += pow(((float *)w2->value.local.data)[i], 2);
    HP_CHECK_CLOSE(sqrt(s1 / n1), 0.02, 0.1, 0);                 // std 0.02
    HP_CHECK_CLOSE(sqrt(s2 / n2), 0.02 / sqrt(4.0), 0.1, 0);     // depth init, layer 1
    HP_CHECK(((float *)nw->value.local.data)[5] == 1.0f, "norm init ones");

    int B = 3, T = 16, N = B * T;
    int32_t tok[48], tgt[48];
    for (int i = 0; i < N; i++) { tok[i] = (i * 37 + 11) % 97; tgt[i] = (i * 53 + 5) % 97; }
    tgt[4] = -100;
    tgt[20] = -100;
    float loss = 0, loss2 = 0;
    HP_CHECK_ERR(hp_model_backward(m), HP_ERR_STATE, "forward");
    HP_CHECK_OK(hp_model_forward(m, tok, tgt, B, T, (float)(N - 2), &loss));
    HP_CHECK(hp_model_valid_tokens(m) == N - 2, "valid tokens %lld", (long long)hp_model_valid_tokens(m));
    // small init: loss of the order of ln(V) (logits have std ~1 at init)
    HP_CHECK(loss > log(97.0) - 0.5 && loss < log(97.0) + 3.0, "initial loss %g vs ln V %g", loss, log(97.0));
    HP_CHECK_OK(hp_model_forward(m, tok, tgt, B, T, 2.0f * (float)(N - 2), &loss2));
    HP_CHECK_CLOSE(loss2, loss / 2, 1e-6, 0);   // divisor is applied as given
    HP_CHECK_OK(hp_model_zero_grad(m));
    HP_CHECK_OK(hp_model_forward(m, tok, tgt, B, T, (float)(N - 2), &loss));
    HP_CHECK_OK(hp_model_backward(m));
    HP_CHECK_ERR(hp_model_backward(m), HP_ERR_STATE, "forward");
    // repeat: gradients accumulate to twice the first (GEMMs add partial products into the
    // existing grad, so equal up to rounding)
    size_t pb = 0, gb = 0, ab = 0, wb = 0;
    hp_model_memory(m, &pb, &gb, &ab, &wb);
    HP_CHECK(pb > 0 && gb == pb && ab > 0 && wb > 0, "memory report");
    int np = hp_model_num_params(m);
    float **g1 = malloc(sizeof(float *) * np);
    for (int i = 0; i < np; i++) {
        size_t n = 1;
        for (int d = 0; d < p[i].grad.local.ndim; d++) n *= p[i].grad.local.shape[d];
        g1[i] = malloc(sizeof(float) * n);
        memcpy(g1[i], p[i].grad.local.data, sizeof(float) * n);
    }
    // a second zero_grad + forward + backward is bitwise identical
    HP_CHECK_OK(hp_model_zero_grad(m));
    HP_CHECK_OK(hp_model_forward(m, tok, tgt, B, T, (float)(N - 2), &loss2));
    HP_CHECK(loss2 == loss, "forward not bitwise reproducible: %.9g vs %.9g", loss2, loss);
    HP_CHECK_OK(hp_model_backward(m));
    int same = 1;
    for (int i = 0; i < np; i++) {
        size_t n = 1;
        for (int d = 0; d < p[i].grad.local.ndim; d++) n *= p[i].grad.local.shape[d];
        same &= memcmp(p[i].grad.local.data, g1[i], sizeof(float) * n) == 0;
    }
    HP_CHECK(same, "backward not bitwise reproducible");
    // without zero_grad the gradients accumulate to twice the first (up to rounding: GEMMs
    // add their partial products into the existing grad)
    HP_CHECK_OK(hp_model_forward(m, tok, tgt, B, T, (float)(N - 2), &loss2));
    HP_CHECK_OK(hp_model_backward(m));
    int acc_ok = 1, nonzero = 1;
    for (int i = 0; i < np; i++) {
        size_t n = 1;
        double mag = 0, err = 0;
        for (int d = 0; d < p[i].grad.local.ndim; d++) n *= p[i].grad.local.shape[d];
        for (size_t k = 0; k < n; k++) {
            err = fmax(err, fabs(((float *)p[i].grad.local.data)[k] - 2.0f * g1[i][k]));
            mag = fmax(mag, fabs(g1[i][k]));
        }
        if (!(err <= 1e-5 * mag)) { acc_ok = 0; fprintf(stderr, "%s: max err %g, max |g| %g\n", p[i].name, err, mag); }
        if (!(mag > 0)) { nonzero = 0; fprintf(stderr, "zero grad: %s\n", p[i].name); }
        free(g1[i]);
    }
    free(g1);
    HP_CHECK(acc_ok, "gradients do not accumulate exactly");
    HP_CHECK(nonzero, "a parameter got no gradient");
    // a smaller batch reuses the arenas
    HP_CHECK_OK(hp_model_forward(m, tok, tgt, 1, 5, 5.0f, &loss));
    HP_CHECK(hp_model_logits(m) != NULL, "logits");
    // bad inputs
    tok[3] = 97;
    HP_CHECK_ERR(hp_model_forward(m, tok, tgt, B, T, 1.0f, &loss), HP_ERR_INVALID_ARG, "outside");
    tok[3] = 1;
    HP_CHECK_ERR(hp_model_forward(m, tok, tgt, B, T, 0.0f, &loss), HP_ERR_INVALID_ARG, "loss_divisor");
    HP_CHECK_ERR(hp_model_forward(m, tok, tgt, 4, T, 1.0f, &loss), HP_ERR_INVALID_ARG, "max_batch");
    const char **names;
    const double *secs;
    int nops = hp_model_profile(m, &names, &secs);
    HP_CHECK(nops > 5 && names[0] != NULL, "profile");
    hp_model_destroy(m);
}

/* No heap allocation in forward / backward (no allocation in the step loop), after a warm-up step, on the
 * llama3 debugmodel at (1, 64). (OpenBLAS's small-matrix sgemm path, taken when
 * M*N*K <= 1e6, mallocs internally; at these sizes every GEMM is above it.) */
static void test_no_alloc(void) {
#ifdef HP_COUNT_ALLOCS
    hp_model_config_t c;
    HP_ASSERT(hp_model_flavor("llama3", "debugmodel", &c) == HP_OK);
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(&c, 1, 64, &m));
    if (!m) return;
    HP_CHECK_OK(hp_model_init_weights(m, 3));
    int32_t tok[64], tgt[64];
    for (int i = 0; i < 64; i++) { tok[i] = (i * 131) % 2048; tgt[i] = (i * 17 + 1) % 2048; }
    float loss;
    for (int warm = 0; warm < 2; warm++) {
        if (warm == 1) { n_allocs = 0; count_allocs = 1; }
        hp_status_t sf = hp_model_forward(m, tok, tgt, 1, 64, 64.0f, &loss);
        hp_status_t sb = hp_model_backward(m);
        count_allocs = 0;
        HP_CHECK(sf == HP_OK && sb == HP_OK, "forward/backward failed");
    }
    HP_CHECK(n_allocs == 0, "forward + backward made %ld heap allocations", (long)n_allocs);
    hp_model_destroy(m);
#endif
}

int main(void) {
    test_no_alloc();
    test_flavors();
    test_registry();
    test_model_basics("llama3");
    test_model_basics("qwen3");
    return hp_test_finish("test_model");
}
