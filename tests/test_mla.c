// MLA attention (DeepSeek-V3, src/nn/mla.c) in the deepseek_v3 model: the logits of a tiny
// one-layer model equal a plain double reference written here from TorchTitan's deepseek_v3
// semantics (q path wq or wq_a -> q_norm -> wq_b; wkv_a -> [c | k_pe]; kv_norm; wkv_b ->
// [k_nope | v]; interleaved RoPE on q_pe and the shared k_pe; YaRN frequencies; softmax scale
// qk_head^-0.5 x mscale^2; wo), for v_head < qk_head (V padded) and v_head > qk_head (q|k
// padded), YaRN on and off; an injected 1e-2 change of one wkv_b entry fails the comparison.
// Full activation checkpointing gives bitwise the same gradients; the flavors' counts are
// DeepSeek's (671B: 671B total, 37B active) and the FLOPs use qk_nope + qk_rope + v_head;
// bad MLA sizes are refused by field. (Gradients: test_nn_gradcheck's deepseek_v3 cases;
// the KV cache: test_model_decode.)
// hp-test: ranks 1 timeout 120
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hp_test.h"

enum { B = 2, T = 9 };

typedef struct {
    int q_lora, nope, rope, v, yarn;
} mla_case_t;

static hp_model_config_t tiny(const mla_case_t *k) {
    hp_model_config_t c;
    HP_CHECK_OK(hp_model_flavor("deepseek_v3", "debugmodel", &c));
    c.dim = 32; c.n_layers = 1; c.n_heads = 4; c.vocab_size = 29; c.hidden_dim = 16;
    c.moe_n_dense_layers = 1;   // the block's feed-forward is dense: the reference stays short
    c.q_lora_rank = k->q_lora; c.kv_lora_rank = 8; c.qk_nope_head_dim = k->nope; c.qk_rope_head_dim = k->rope;
    c.v_head_dim = k->v;
    c.rope_factor = 4.0f; c.rope_original_max_pos = 16;
    c.max_seq_len = k->yarn ? 64 : 16;   // YaRN and mscale apply when max_seq_len > the original 16
    HP_CHECK_OK(hp_model_config_validate(&c));
    return c;
}

static const float *W(hp_model_t m, int l, const char *suffix) {
    char nm[128];
    if (l >= 0) snprintf(nm, sizeof nm, "layers.%d.%s", l, suffix);
    else snprintf(nm, sizeof nm, "%s", suffix);
    hp_param_t *p = hp_model_find_param(m, nm);
    HP_ASSERT_MSG(p != NULL, "no parameter %s", nm);
    return p->value.local.data;
}

/* y (n) = rmsnorm(x (n)) * w in double. */
static void rms(double *y, const double *x, const float *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}
/* y (o) = W (o, i) x (i). */
static void mv(double *y, const float *Wt, const double *x, int o, int in) {
    for (int r = 0; r < o; r++) {
        double s = 0;
        for (int i = 0; i < in; i++) s += (double)Wt[(size_t)r * in + i] * x[i];
        y[r] = s;
    }
}

/* TorchTitan deepseek_v3 precompute_freqs_cis, in double. */
static void freqs(double *f, const hp_model_config_t *c) {
    const int r = c->qk_rope_head_dim;
    int lo = 0, hi = 0;
    if (c->max_seq_len > c->rope_original_max_pos) {
        const double lb = 2 * log((double)c->rope_theta);
        lo = (int)floor(r * log(c->rope_original_max_pos / (c->rope_beta_fast * 2 * M_PI)) / lb);
        hi = (int)ceil(r * log(c->rope_original_max_pos / (c->rope_beta_slow * 2 * M_PI)) / lb);
        lo = lo < 0 ? 0 : lo;
        hi = hi > r - 1 ? r - 1 : hi;
    }
    for (int i = 0; i < r / 2; i++) {
        f[i] = 1.0 / pow((double)c->rope_theta, 2.0 * i / r);
        if (c->max_seq_len > c->rope_original_max_pos) {
            const double mx = lo == hi ? hi + 0.001 : hi;
            double ramp = (i - lo) / (mx - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            const double smooth = 1 - ramp;
            f[i] = f[i] / c->rope_factor * (1 - smooth) + f[i] * smooth;
        }
    }
}

static void rot(double *x, int r, int t, const double *f) {   // interleaved pairs (2i, 2i+1)
    for (int i = 0; i < r / 2; i++) {
        const double a = t * f[i], cs = cos(a), sn = sin(a), x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * cs - x1 * sn;
        x[2 * i + 1] = x0 * sn + x1 * cs;
    }
}

/* logits (B*T, V) of the one-layer model; `bump` is added to wkv_b[0] (the negative test). */
static void reference(double *logits, hp_model_t m, const int32_t *tok, double bump) {
    const hp_model_config_t *c = hp_model_config(m);
    const int D = c->dim, H = c->n_heads, ql = c->q_lora_rank, kvl = c->kv_lora_rank, np_ = c->qk_nope_head_dim,
              r = c->qk_rope_head_dim, vd = c->v_head_dim, qk = np_ + r, F = c->hidden_dim, V = c->vocab_size;
    const double eps = c->norm_eps;
    double mscale = 1.0;
    if (c->max_seq_len > c->rope_original_max_pos) mscale = 0.1 * c->mla_mscale * log((double)c->rope_factor) + 1.0;
    const double scale = mscale * mscale / sqrt((double)qk);
    double f[256];
    freqs(f, c);
    const size_t nb = (size_t)H * (np_ + vd) * kvl;
    float *wkvb = malloc(sizeof(float) * nb);
    memcpy(wkvb, W(m, 0, "attention.wkv_b.weight"), sizeof(float) * nb);
    wkvb[0] += (float)bump;
    double *x = calloc((size_t)T * D, sizeof(double)), *q = calloc((size_t)T * H * qk, sizeof(double));
    double *k = calloc((size_t)T * H * qk, sizeof(double)), *v = calloc((size_t)T * H * vd, sizeof(double));
    double *tmp = calloc(4096, sizeof(double)), *tmp2 = calloc(4096, sizeof(double)), *tmp3 = calloc(4096, sizeof(double));
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float *e = W(m, -1, "tok_embeddings.weight") + (size_t)tok[b * T + t] * D;
            double *xt = x + (size_t)t * D, xn[64];
            for (int i = 0; i < D; i++) xt[i] = e[i];
            rms(xn, xt, W(m, 0, "attention_norm.weight"), D, eps);
            double *qt = q + (size_t)t * H * qk;
            if (ql) {
                mv(tmp, W(m, 0, "attention.wq_a.weight"), xn, ql, D);
                rms(tmp2, tmp, W(m, 0, "attention.q_norm.weight"), ql, eps);
                mv(qt, W(m, 0, "attention.wq_b.weight"), tmp2, H * qk, ql);
            } else {
                mv(qt, W(m, 0, "attention.wq.weight"), xn, H * qk, D);
            }
            mv(tmp, W(m, 0, "attention.wkv_a.weight"), xn, kvl + r, D);
            rot(tmp + kvl, r, t, f);
            for (int h = 0; h < H; h++) rot(qt + (size_t)h * qk + np_, r, t, f);
            rms(tmp2, tmp, W(m, 0, "attention.kv_norm.weight"), kvl, eps);
            mv(tmp3, wkvb, tmp2, H * (np_ + vd), kvl);
            for (int h = 0; h < H; h++) {
                double *kh = k + ((size_t)t * H + h) * qk;
                for (int j = 0; j < np_; j++) kh[j] = tmp3[(size_t)h * (np_ + vd) + j];
                for (int j = 0; j < r; j++) kh[np_ + j] = tmp[kvl + j];
                for (int j = 0; j < vd; j++) v[((size_t)t * H + h) * vd + j] = tmp3[(size_t)h * (np_ + vd) + np_ + j];
            }
        }
        for (int t = 0; t < T; t++) {
            double o[1024] = {0}, s[64];
            for (int h = 0; h < H; h++) {
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double a = 0;
                    for (int d = 0; d < qk; d++) a += q[((size_t)t * H + h) * qk + d] * k[((size_t)j * H + h) * qk + d];
                    s[j] = a * scale;
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j <= t; j++) sum += exp(s[j] - mx);
                for (int j = 0; j <= t; j++)
                    for (int d = 0; d < vd; d++) o[h * vd + d] += exp(s[j] - mx) / sum * v[((size_t)j * H + h) * vd + d];
            }
            double hres[64], hn[64], a1[256], a3[256], out[64], fin[64];
            mv(hres, W(m, 0, "attention.wo.weight"), o, D, H * vd);
            for (int i = 0; i < D; i++) hres[i] += x[(size_t)t * D + i];
            rms(hn, hres, W(m, 0, "ffn_norm.weight"), D, eps);
            mv(a1, W(m, 0, "feed_forward.w1.weight"), hn, F, D);
            mv(a3, W(m, 0, "feed_forward.w3.weight"), hn, F, D);
            for (int i = 0; i < F; i++) a1[i] = a1[i] / (1 + exp(-a1[i])) * a3[i];
            mv(out, W(m, 0, "feed_forward.w2.weight"), a1, D, F);
            for (int i = 0; i < D; i++) out[i] += hres[i];
            rms(fin, out, W(m, -1, "norm.weight"), D, eps);
            mv(logits + ((size_t)b * T + t) * V, W(m, -1, "output.weight"), fin, V, D);
        }
    }
    free(wkvb); free(x); free(q); free(k); free(v); free(tmp); free(tmp2); free(tmp3);
}

static double max_rel(const float *a, const double *ref, size_t n) {
    double mx = 0, e = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) e = fmax(e, fabs(a[i] - ref[i]));
    return e / mx;
}

static void check_case(const mla_case_t *k) {
    hp_model_config_t c = tiny(k);
    const int hc = (c.qk_nope_head_dim + c.qk_rope_head_dim > c.v_head_dim ? c.qk_nope_head_dim + c.qk_rope_head_dim
                                                                            : c.v_head_dim);
    HP_CHECK(c.head_dim == ((hc + 1) & ~1) && c.n_kv_heads == c.n_heads, "MLA derived head_dim %d (core width %d), "
             "n_kv_heads %d", c.head_dim, hc, c.n_kv_heads);
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(&c, B, T, &m));
    if (!m) return;
    HP_CHECK_OK(hp_model_init_weights(m, 5));
    // larger weights than the init so that attention is far from uniform
    hp_param_t *p = hp_model_params(m);
    for (int i = 0; i < hp_model_num_params(m); i++) {
        float *w = p[i].value.local.data;
        const int64_t n = hp_tensor_numel(&p[i].value.local);
        if (strstr(p[i].name, "attention.w"))
            for (int64_t j = 0; j < n; j++) w[j] *= 6.0f;
    }
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) { tok[i] = (i * 11 + 5) % 29; tgt[i] = (i * 7 + 2) % 29; }
    float loss = 0;
    HP_CHECK_OK(hp_model_forward(m, tok, tgt, B, T, (float)(B * T), &loss));
    const size_t nl = (size_t)B * T * c.vocab_size;
    double *ref = malloc(sizeof(double) * nl);
    reference(ref, m, tok, 0.0);
    /* f32 sums of K <= 64 products round like a random walk, ~sqrt(K) u = 5e-7 relative per
     * stage (u = 2^-24; the worst case K u = 4e-6 needs every rounding one way), about eight
     * stages in sequence and a softmax: 4e-6 of the largest logit */
    const double e = max_rel(hp_model_logits(m), ref, nl);
    HP_CHECK(e < 4e-6, "MLA q_lora %d nope %d rope %d v %d yarn %d: logits differ from the reference by %.2e",
             k->q_lora, k->nope, k->rope, k->v, k->yarn, e);
    reference(ref, m, tok, 1e-2);
    const double eb = max_rel(hp_model_logits(m), ref, nl);
    HP_CHECK(eb > 4e-6, "an injected 1e-2 change of wkv_b[0] went unnoticed (%.2e)", eb);
    printf("MLA q_lora %d nope %d rope %d v %d yarn %d: logits vs reference %.2e (injected: %.2e)\n", k->q_lora,
           k->nope, k->rope, k->v, k->yarn, e, eb);
    // full activation checkpointing recomputes the block: bitwise the same gradients
    HP_CHECK_OK(hp_model_zero_grad(m));
    HP_CHECK_OK(hp_model_forward(m, tok, tgt, B, T, (float)(B * T), &loss));
    HP_CHECK_OK(hp_model_backward(m));
    size_t pb, gb, ab, wb;
    hp_model_memory(m, &pb, &gb, &ab, &wb);
    float *g0 = malloc(gb);
    memcpy(g0, hp_model_params(m)[0].grad.local.data, gb);
    HP_CHECK_OK(hp_model_set_activation_checkpoint(m, 1));
    HP_CHECK_OK(hp_model_zero_grad(m));
    float l2 = 0;
    HP_CHECK_OK(hp_model_forward(m, tok, tgt, B, T, (float)(B * T), &l2));
    HP_CHECK_OK(hp_model_backward(m));
    HP_CHECK(l2 == loss && memcmp(g0, hp_model_params(m)[0].grad.local.data, gb) == 0,
             "MLA under full AC: loss %.9g vs %.9g or gradients differ", l2, loss);
    free(g0);
    free(ref);
    hp_model_destroy(m);
}

static void check_flavors(void) {
    hp_model_config_t c;
    HP_CHECK_OK(hp_model_flavor("deepseek_v3", "671B", &c));
    const double tot = (double)hp_model_param_count(&c, 0), act = (double)hp_model_active_param_count(&c, 0);
    // DeepSeek-V3 (arXiv 2412.19437): 671B total, 37B activated per token (without the MTP module)
    HP_CHECK(tot > 665e9 && tot < 677e9 && act > 36e9 && act < 38.5e9, "deepseek_v3 671B: %.2fB total, %.2fB active",
             tot / 1e9, act / 1e9);
    HP_CHECK(c.mla && c.q_lora_rank == 1536 && c.kv_lora_rank == 512 && c.n_heads == 128 && c.head_dim == 192,
             "671B MLA sizes");
    // FLOPs: 6 N_active(no embedding) + 6 L H (qk_nope + qk_rope + v_head) T (TorchTitan deepseek_v3)
    const double want = 6.0 * (double)hp_model_active_param_count(&c, 1) + 6.0 * 61 * 128 * (128 + 64 + 128) * 4096.0;
    HP_CHECK(fabs(hp_model_flops_per_token(&c, 4096) - want) < 1e-9 * want, "671B FLOPs/token %.6g, want %.6g",
             hp_model_flops_per_token(&c, 4096), want);
    printf("deepseek_v3 671B: %.1fB total, %.1fB active\n", tot / 1e9, act / 1e9);
    HP_CHECK_OK(hp_model_flavor("deepseek_v3", "debugmodel", &c));
    HP_CHECK(c.mla && c.q_lora_rank == 0 && c.kv_lora_rank == 512 && c.qk_nope_head_dim == 128 &&
             c.qk_rope_head_dim == 64 && c.v_head_dim == 128 && c.n_heads == 16 && fabsf(c.mla_mscale - 0.7f) < 1e-7f &&
             c.max_seq_len == 16384 && c.rope_original_max_pos == 4096 && c.rope_factor == 40.0f,
             "debugmodel MLA sizes (TorchTitan's deepseek_v3 debugmodel)");
    hp_model_config_t bad = c;
    bad.qk_rope_head_dim = 7;
    HP_CHECK_ERR(hp_model_config_validate(&bad), HP_ERR_INVALID_ARG, "qk_rope_head_dim = 7");
    bad = c;
    bad.kv_lora_rank = 0;
    HP_CHECK_ERR(hp_model_config_validate(&bad), HP_ERR_INVALID_ARG, "kv_lora_rank = 0");
    bad = c;
    bad.qk_norm = 1;
    HP_CHECK_ERR(hp_model_config_validate(&bad), HP_ERR_INVALID_ARG, "do not apply to MLA");
}

int main(void) {
    check_flavors();
    const mla_case_t cases[] = {{0, 4, 4, 6, 1}, {8, 2, 4, 10, 0}, {6, 4, 2, 4, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
    return hp_test_finish("test_mla");
}
