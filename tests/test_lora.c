/* LoRA against PEFT (docs/finetune.md "LoRA"): a tiny Qwen3 and Llama HF folder with a PEFT
 * adapter on all seven projections (non-zero B; tools/golden/make_lora_golden.py wrote them with
 * transformers + peft, tests/data/lora/): base + adapter loaded here give PEFT's logits; the merged
 * folder (hp_hf_merge_lora) gives them without LoRA, and its weights are W + (alpha/r) B A; the
 * adapter saved back equals PEFT's file bitwise and loads back bitwise; frozen parameters get no
 * gradient; the lora module's gradients match finite differences. Negative cases for each bound. */
// hp-test: ranks 1 timeout 120
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hp_test.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/file.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/safetensors.h"

enum { T = 12, R = 4 };
#define ALPHA 8.0f
static char ROOT[] = "/tmp/hp_test_lora_XXXXXX";

/* Logits tolerance: ours and PyTorch's float32 forward differ only in summation order (GEMMs of
 * K <= 128, the attention's softmax sums, RMSNorm means): a worst-case relative error of ~K u =
 * 128 x 6e-8 = 8e-6 per op over ~15 chained ops of a 2-layer model gives ~1e-4 relative to the
 * largest logit (|logits| <= ~1 here), while the adapter moves the logits by 0.4-0.6 and an
 * injected 1e-2 in one element of one B by more than the bound (checked). */
#define LOGIT_RTOL 1e-4

static double max_abs(const float *a, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
    return m;
}
static double max_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* A tensor of a safetensors file as f32 (caller frees). */
static float *read_f32(const char *path, const char *name, int64_t *numel) {
    hp_safetensors_t st;
    if (hp_safetensors_open(path, &st) != HP_OK) return NULL;
    const hp_st_info_t *info;
    float *buf = NULL;
    if (hp_safetensors_find(st, name, &info) == HP_OK) {
        int64_t n = 1;
        for (int d = 0; d < info->ndim; d++) n *= info->shape[d];
        buf = malloc(sizeof(float) * (size_t)n);
        hp_tensor_t t;
        hp_tensor_init(&t, HP_F32, info->ndim, info->shape, buf);
        if (hp_safetensors_read(st, name, &t, 1) != HP_OK) {
            free(buf);
            buf = NULL;
        }
        if (numel) *numel = n;
    }
    hp_safetensors_close(st);
    return buf;
}

/* The model of HF folder dir (config.json), with LoRA r R / ALPHA on all seven targets when lora,
 * weights from dir (adapters drawn: hp_hf_import leaves them). */
static hp_model_t load(const char *dir, int lora, hp_model_config_t *mc) {
    HP_CHECK_OK(hp_hf_read_config(dir, mc));
    mc->max_seq_len = T;
    if (lora) {
        mc->lora_rank = R;
        mc->lora_alpha = ALPHA;
        mc->lora_targets = (1 << HP_LORA_N_TARGETS) - 1;
    }
    HP_CHECK_OK(hp_model_config_validate(mc));
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(mc, 1, T, &m));
    if (!m) return NULL;
    HP_CHECK_OK(hp_model_init_weights(m, 7));
    HP_CHECK_OK(hp_hf_import(dir, hp_model_hf_adapter(mc), mc, hp_model_params(m), hp_model_num_params(m), NULL));
    return m;
}

static void forward(hp_model_t m, const int32_t *tok) {
    float loss;
    HP_CHECK_OK(hp_model_forward(m, tok, NULL, 1, T, 1.0f, &loss));
}

static void golden(const char *fam) {
    char base[400], adapter[512], gold[512], saved[512], merged[512], src[100];
    snprintf(src, sizeof src, "tests/data/lora/%s", fam);
    hp_test_source_path(base, sizeof base, src);
    snprintf(adapter, sizeof adapter, "%s/adapter", base);
    snprintf(gold, sizeof gold, "%s/golden.safetensors", base);
    strcat(base, "/base");
    snprintf(saved, sizeof saved, "%s/%s_saved", ROOT, fam);
    snprintf(merged, sizeof merged, "%s/%s_merged", ROOT, fam);

    int64_t nl = 0, nt = 0;
    float *ref = read_f32(gold, "logits", &nl), *ref_base = read_f32(gold, "logits_base", NULL);
    HP_CHECK(ref && ref_base, "%s: cannot read %s", fam, gold);
    int32_t tok[T];
    {
        hp_safetensors_t st;
        HP_CHECK_OK(hp_safetensors_open(gold, &st));
        HP_CHECK_OK(hp_safetensors_read_raw(st, "tokens", tok, sizeof tok));
        hp_safetensors_close(st);
        nt = T;
    }
    if (!ref || !ref_base || nt != T) return;
    const double bound = LOGIT_RTOL * fmax(1.0, max_abs(ref, nl));

    /* base + PEFT adapter = PEFT's logits; the base alone = transformers' base logits */
    hp_model_config_t mc;
    hp_model_t m = load(base, 1, &mc);
    if (!m) return;
    forward(m, tok);
    const double d_init = max_diff(hp_model_logits(m), ref_base, nl);   /* B = 0: the base model */
    HP_CHECK(d_init <= bound, "%s: with fresh adapters (B = 0) logits differ from the base's by %.3g > %.3g", fam, d_init,
             bound);
    HP_CHECK_OK(hp_hf_import_lora(adapter, hp_model_hf_adapter(&mc), &mc, hp_model_params(m), hp_model_num_params(m),
                                  NULL));
    forward(m, tok);
    const double d = max_diff(hp_model_logits(m), ref, nl);
    printf("%s: base + PEFT adapter: max |logits - peft| = %.3g (bound %.3g; the adapter moves them by %.3g)\n", fam, d,
           bound, max_diff(ref, ref_base, nl));
    HP_CHECK(d <= bound, "%s: logits with the PEFT adapter differ from peft's by %.3g > %.3g", fam, d, bound);
    /* negative: 1e-2 on one element of layer 0's q lora_B leaves the bound */
    hp_param_t *qb = hp_model_find_param(m, "layers.0.attention.wq.lora_b.weight");
    HP_CHECK(qb != NULL, "%s: no layers.0.attention.wq.lora_b.weight", fam);
    if (!qb) return;
    const float q0 = hp_param_w(qb)[0];
    hp_param_w(qb)[0] = q0 + 1e-2f;
    forward(m, tok);
    HP_CHECK(max_diff(hp_model_logits(m), ref, nl) > bound, "%s: a 1e-2 error in one lora_B element stays within %.3g",
             fam, bound);
    hp_param_w(qb)[0] = q0;

    /* frozen: everything but the adapters */
    int nf = 0, na = 0;
    for (int i = 0; i < hp_model_num_params(m); i++) {
        const hp_param_t *p = &hp_model_params(m)[i];
        const int is_lora = hp_hf_is_lora_param(p->name);
        HP_CHECK(p->frozen == !is_lora, "%s: '%s' frozen %d", fam, p->name, p->frozen);
        na += is_lora;
        nf += p->frozen;
    }
    HP_CHECK(na == 2 * 7 * mc.n_layers, "%s: %d adapter tensors, expected %d", fam, na, 14 * mc.n_layers);

    /* save: PEFT's file bitwise (names, shapes, values; Llama's q/k lora_B through the permutation) */
    HP_CHECK_OK(hp_hf_save_lora(saved, hp_model_hf_adapter(&mc), &mc, hp_model_params(m), hp_model_num_params(m), NULL,
                                base));
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/adapter_model.safetensors", adapter);
    snprintf(pb, sizeof pb, "%s/adapter_model.safetensors", saved);
    hp_safetensors_t sa, sb;
    HP_CHECK_OK(hp_safetensors_open(pa, &sa));
    HP_CHECK_OK(hp_safetensors_open(pb, &sb));
    HP_CHECK(hp_safetensors_count(sa) == hp_safetensors_count(sb), "%s: saved %d tensors, PEFT's file has %d", fam,
             hp_safetensors_count(sb), hp_safetensors_count(sa));
    int differ = 0;
    for (int k = 0; k < hp_safetensors_count(sa); k++) {
        const char *name = hp_safetensors_info(sa, k)->name;
        int64_t n1 = 0, n2 = 0;
        float *x = read_f32(pa, name, &n1), *y = read_f32(pb, name, &n2);
        HP_CHECK(x && y && n1 == n2, "%s: '%s' missing or of another size in the saved adapter", fam, name);
        if (x && y && n1 == n2 && memcmp(x, y, sizeof(float) * (size_t)n1) != 0) differ++;
        free(x);
        free(y);
    }
    HP_CHECK(differ == 0, "%s: %d saved adapter tensors differ from PEFT's", fam, differ);
    hp_safetensors_close(sa);
    hp_safetensors_close(sb);

    /* load back into another model: bitwise the adapters */
    hp_model_config_t mc2;
    hp_model_t m2 = load(base, 1, &mc2);
    if (!m2) return;
    HP_CHECK_OK(hp_hf_import_lora(saved, hp_model_hf_adapter(&mc2), &mc2, hp_model_params(m2),
                                  hp_model_num_params(m2), NULL));
    for (int i = 0; i < hp_model_num_params(m); i++) {
        const hp_param_t *p = &hp_model_params(m)[i], *q = &hp_model_params(m2)[i];
        HP_CHECK(!memcmp(hp_param_w(p), hp_param_w(q), sizeof(float) * (size_t)hp_tensor_numel(&p->value.local)),
                 "%s: '%s' differs after the save -> load round trip", fam, p->name);
    }
    /* an adapter of another rank is refused by name */
    mc2.lora_rank = 8;
    HP_CHECK_ERR(hp_hf_import_lora(saved, hp_model_hf_adapter(&mc2), &mc2, hp_model_params(m2),
                                   hp_model_num_params(m2), NULL), HP_ERR_INVALID_ARG, "lora.rank");
    hp_model_destroy(m2);

    /* merge: W' = W + (alpha / r) B A (float32; per element the products of r terms and two
     * additions: error <= (r + 2) u (|W| + s sum |B||A|)), PEFT's logits without LoRA */
    HP_CHECK_OK(hp_hf_merge_lora(base, adapter, merged));
    {
        char wb[600], wm[600];
        snprintf(wb, sizeof wb, "%s/model.safetensors", base);
        snprintf(wm, sizeof wm, "%s/model.safetensors", merged);
        const char *w = "model.layers.1.mlp.down_proj.weight";
        const char *an = "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight";
        const char *bn = "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight";
        int64_t nw = 0;
        float *W = read_f32(wb, w, &nw), *M = read_f32(wm, w, NULL), *A = read_f32(pa, an, NULL),
              *B = read_f32(pa, bn, NULL);
        HP_CHECK(W && M && A && B, "%s: cannot read %s and its adapter", fam, w);
        if (W && M && A && B) {
            const int64_t out = mc.dim, in = nw / mc.dim;
            const double s = ALPHA / R, u = 5.96e-8;
            int bad = 0, moved = 0;
            for (int64_t i = 0; i < out; i++)
                for (int64_t j = 0; j < in; j++) {
                    double ref_ij = W[i * in + j], mag = fabs(W[i * in + j]);
                    for (int k = 0; k < R; k++) {
                        ref_ij += s * (double)B[i * R + k] * A[k * in + j];
                        mag += s * fabs((double)B[i * R + k] * A[k * in + j]);
                    }
                    bad += fabs(M[i * in + j] - ref_ij) > (R + 2) * u * mag;
                    moved += fabs(W[i * in + j] - ref_ij) > (R + 2) * u * mag;   /* negative: the unmerged W */
                }
            HP_CHECK(bad == 0, "%s: %d merged elements of %s differ from W + (alpha/r) B A", fam, bad, w);
            HP_CHECK(moved > out * in / 2, "%s: the unmerged W is within the merge bound at %lld of %lld elements", fam,
                     (long long)(out * in - moved), (long long)(out * in));
        }
        free(W);
        free(M);
        free(A);
        free(B);
    }
    hp_model_config_t mc3;
    hp_model_t m3 = load(merged, 0, &mc3);
    if (m3) {
        forward(m3, tok);
        const double dm = max_diff(hp_model_logits(m3), ref, nl);
        printf("%s: merged folder: max |logits - peft| = %.3g (bound %.3g)\n", fam, dm, bound);
        HP_CHECK(dm <= bound, "%s: the merged folder's logits differ from peft's by %.3g > %.3g", fam, dm, bound);
        hp_model_destroy(m3);
    }
    HP_CHECK_ERR(hp_hf_merge_lora(base, adapter, base), HP_ERR_INVALID_ARG, "base folder");
    hp_model_destroy(m);
    free(ref);
    free(ref_base);
}

/* Gradients: frozen parameters get none (bitwise zero), the adapters' match central finite
 * differences of the loss sum (double) of a tiny llama3 with every target adapted and B drawn.
 * Bound: the difference quotient's truncation error (O(eps^2) f''' ~ 1e-6 here) plus the loss's
 * float32 rounding over 2 eps, ~ (sum over rows of |loss| u) / eps ~ 1e-4 absolute, so atol
 * 5e-4 + rtol 1e-2; a 5% scale error in the analytic gradient (negative case) leaves it. */
static void gradcheck(void) {
    hp_model_config_t mc;
    HP_CHECK_OK(hp_model_flavor("llama3", "debugmodel", &mc));
    mc.dim = 32;
    mc.n_layers = 1;
    mc.n_heads = 4;
    mc.n_kv_heads = 2;
    mc.head_dim = 8;
    mc.hidden_dim = 48;
    mc.multiple_of = 0;
    mc.vocab_size = 40;
    mc.max_seq_len = 8;
    mc.lora_rank = 3;
    mc.lora_alpha = 6.0f;
    mc.lora_targets = (1 << HP_LORA_N_TARGETS) - 1;
    HP_CHECK_OK(hp_model_config_validate(&mc));
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(&mc, 2, 8, &m));
    if (!m) return;
    HP_CHECK_OK(hp_model_init_weights(m, 3));
    for (int i = 0; i < hp_model_num_params(m); i++) {   /* B drawn too, so dA is not zero */
        hp_param_t *p = &hp_model_params(m)[i];
        if (strstr(p->name, "lora_b"))
            for (int64_t k = 0; k < hp_tensor_numel(&p->value.local); k++)
                hp_param_w(p)[k] = 0.1f * sinf(0.7f * (float)k + (float)i);
    }
    int32_t tok[16], tgt[16];
    for (int i = 0; i < 16; i++) {
        tok[i] = (i * 7 + 3) % 40;
        tgt[i] = (i * 11 + 5) % 40;
    }
    float loss;
    HP_CHECK_OK(hp_model_zero_grad(m));
    HP_CHECK_OK(hp_model_forward(m, tok, tgt, 2, 8, 1.0f, &loss));
    HP_CHECK_OK(hp_model_backward(m));
    int nonzero_frozen = 0;
    for (int i = 0; i < hp_model_num_params(m); i++) {
        const hp_param_t *p = &hp_model_params(m)[i];
        if (!p->frozen) continue;
        for (int64_t k = 0; k < hp_tensor_numel(&p->grad.local); k++) nonzero_frozen += hp_param_g(p)[k] != 0.0f;
    }
    HP_CHECK(nonzero_frozen == 0, "%d gradient elements of frozen parameters are not zero", nonzero_frozen);
    const char *names[] = {"layers.0.attention.wq.lora_a.weight", "layers.0.attention.wv.lora_b.weight",
                           "layers.0.attention.wo.lora_a.weight", "layers.0.feed_forward.w3.lora_b.weight",
                           "layers.0.feed_forward.w2.lora_a.weight", "layers.0.feed_forward.w1.lora_b.weight"};
    const float eps = 1e-2f;
    int bad = 0, bad_neg = 0, n = 0;
    for (size_t q = 0; q < sizeof names / sizeof names[0]; q++) {
        hp_param_t *p = hp_model_find_param(m, names[q]);
        HP_CHECK(p != NULL, "no %s", names[q]);
        if (!p) continue;
        for (int64_t k = 0; k < hp_tensor_numel(&p->value.local); k += 5) {
            const float w0 = hp_param_w(p)[k], g = hp_param_g(p)[k];
            hp_param_w(p)[k] = w0 + eps;
            HP_CHECK_OK(hp_model_forward(m, tok, tgt, 2, 8, 1.0f, &loss));
            const double lp = hp_model_loss_sum(m);
            hp_param_w(p)[k] = w0 - eps;
            HP_CHECK_OK(hp_model_forward(m, tok, tgt, 2, 8, 1.0f, &loss));
            const double lm = hp_model_loss_sum(m);
            hp_param_w(p)[k] = w0;
            const double fd = (lp - lm) / (2 * eps);
            bad += fabs(fd - g) > 5e-4 + 1e-2 * fabs(fd);
            bad_neg += fabs(fd - 1.05 * g) > 5e-4 + 1e-2 * fabs(fd) || fabs(fd) < 1e-2;
            n++;
        }
    }
    printf("gradcheck: %d adapter elements, %d outside the bound; a 5%% scale error: %d of them outside\n", n, bad, bad_neg);
    HP_CHECK(bad == 0, "%d of %d adapter gradients differ from finite differences", bad, n);
    HP_CHECK(bad_neg > n / 2, "a 5%% error in the gradients stays within the bound at %d of %d elements", n - bad_neg, n);
    hp_model_destroy(m);
}

int main(void) {
    HP_CHECK(mkdtemp(ROOT) != NULL, "mkdtemp");
    gradcheck();
    golden("qwen3");
    golden("llama");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", ROOT);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", ROOT);
    return hp_test_finish("test_lora");
}
