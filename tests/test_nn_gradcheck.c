// Finite-difference gradient checks for every layer: linear (with and without bias),
// RMSNorm, head-wise RMSNorm (qk-norm), RoPE (both styles, Llama 3.1 scaling), causal
// attention (MHA, GQA), SwiGLU, embedding, cross-entropy (ignore index, divisor), and whole
// models (llama3 untied GQA; qwen3 tied with qk-norm; deepseek_v3's MLA attention with and
// without q_lora, V and q|k padded, YaRN) which cover the transformer block, the
// attention and feed-forward modules, the final norm and the (tied) output projection.
//
// Method: the f32 kernels compute L = sum(R * y) (R random) accumulated in double; central
// differences (L(x + h e) - L(x - h e)) / 2h are compared with the analytic gradient for a
// few single elements and for random +-1 directions u over the whole tensor
// (directional derivative vs g . u), h = 1e-2. Tolerances: |fd - an| <= atol + rtol |an|;
// kernels: rtol 1e-2, atol 1e-3 * mean |g| (elements) or 1e-3 * |g|_1 (directions); whole
// models: rtol 2e-2, atol 2e-4 (element) and 2e-4 + 1e-4 |g|_1 (directions), the
// largest-gradient element and three directions per parameter, h = 1% of the tensor's rms
// (the f32 forward has a loss noise floor near 1e-6, i.e. ~1e-4 in fd at these steps).
// hp-test: ranks 1 timeout 120 coretype 1 isa
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/nn.h"
#include "hp_test.h"
#include "hp_test_rand.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float frand(void) { return hp_test_frand(&rng_state); }   // uniform in [-1, 1)
static float *rnd(size_t n, float scale) { return hp_test_rnd(&rng_state, n, scale); }
static float *zeros(size_t n) { return calloc(n, sizeof(float)); }
static double dot(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

typedef double (*loss_fn)(void *ctx);
static double worst_ratio = 0.0;

/* Checks g (analytic dL/dx) against central differences of f at n_elem single elements and
 * n_dir random directions. */
static void fd_check_tol(const char *what, loss_fn f, void *ctx, float *x, const float *g, size_t n,
                         double h, int n_elem, int n_dir, double rtol, double atol_elem, double atol_dir) {
    double gabs = 0;
    size_t imax = 0;
    for (size_t i = 0; i < n; i++) {
        gabs += fabs(g[i]);
        if (fabs(g[i]) > fabs(g[imax])) imax = i;
    }
    for (int e = 0; e < n_elem && (size_t)e < n; e++) {
        // the largest-gradient element first, then random ones
        size_t i = e == 0 ? imax : (size_t)(((frand() + 1.0f) * 0.5f) * (float)(n - 1));
        float orig = x[i];
        x[i] = orig + (float)h;
        double lp = f(ctx);
        x[i] = orig - (float)h;
        double lm = f(ctx);
        x[i] = orig;
        double fd = (lp - lm) / (2 * h), an = g[i];
        double atol = atol_elem > 0 ? atol_elem : 1e-3 * gabs / (double)n + 1e-6;
        double r = fabs(fd - an) / (atol + rtol * fabs(an));
        if (r > worst_ratio) worst_ratio = r;
        HP_CHECK(r <= 1.0, "%s element %zu: fd %.8g analytic %.8g", what, i, fd, an);
    }
    float *u = malloc(sizeof(float) * n), *x0 = malloc(sizeof(float) * n);
    memcpy(x0, x, sizeof(float) * n);
    for (int d = 0; d < n_dir; d++) {
        for (size_t i = 0; i < n; i++) u[i] = frand() > 0 ? 1.0f : -1.0f;
        for (size_t i = 0; i < n; i++) x[i] = x0[i] + (float)h * u[i];
        double lp = f(ctx);
        for (size_t i = 0; i < n; i++) x[i] = x0[i] - (float)h * u[i];
        double lm = f(ctx);
        memcpy(x, x0, sizeof(float) * n);
        double fd = (lp - lm) / (2 * h), an = dot(g, u, n);
        double atol = atol_dir > 0 ? atol_dir : 1e-3 * gabs + 1e-6;
        double r = fabs(fd - an) / (atol + rtol * fabs(an));
        if (r > worst_ratio) worst_ratio = r;
        HP_CHECK(r <= 1.0, "%s direction %d: fd %.8g analytic %.8g (|g|_1 %.3g)", what, d, fd, an, gabs);
    }
    free(u);
    free(x0);
}

static void fd_check(const char *what, loss_fn f, void *ctx, float *x, const float *g, size_t n,
                     double h, int n_elem, int n_dir) {
    fd_check_tol(what, f, ctx, x, g, n, h, n_elem, n_dir, 1e-2, 0.0, 0.0);
}

/* ---- linear ---- */
typedef struct { float *x, *w, *b, *y, *R; int N, IC, OC; } lin_t;
static double lin_loss(void *c_) {
    lin_t *c = c_;
    hp_linear_forward(c->y, c->x, c->w, c->b, c->N, c->IC, c->OC);
    return dot(c->y, c->R, (size_t)c->N * c->OC);
}
static void check_linear(int bias) {
    lin_t c = {rnd(5 * 7, 1), rnd(6 * 7, 1), bias ? rnd(6, 1) : NULL, zeros(5 * 6), rnd(5 * 6, 1), 5, 7, 6};
    float *dx = zeros(35), *dw = zeros(42), *db = bias ? zeros(6) : NULL;
    hp_linear_backward_input(dx, c.R, c.w, c.N, c.IC, c.OC, 0);
    hp_linear_backward_weight(dw, db, c.R, c.x, c.N, c.IC, c.OC);
    fd_check("linear dx", lin_loss, &c, c.x, dx, 35, 1e-2, 4, 2);
    fd_check("linear dW", lin_loss, &c, c.w, dw, 42, 1e-2, 4, 2);
    if (bias) fd_check("linear db", lin_loss, &c, c.b, db, 6, 1e-2, 3, 2);
    free(c.x); free(c.w); free(c.b); free(c.y); free(c.R); free(dx); free(dw); free(db);
}

/* ---- RMSNorm (plain and head-wise) ---- */
typedef struct { float *x, *w, *y, *rstd, *R; int N, H, C, ld; float eps; } rms_t;
static double rms_loss(void *c_) {
    rms_t *c = c_;
    hp_rmsnorm_heads_forward(c->y, c->ld, c->rstd, c->x, c->ld, c->w, c->N, c->H, c->C, c->eps);
    return dot(c->y, c->R, (size_t)c->N * c->ld);
}
static void check_rmsnorm(int N, int H, int C, int pad) {
    int ld = H * C + pad;
    rms_t c = {rnd((size_t)N * ld, 1.5f), rnd(C, 1), zeros((size_t)N * ld), zeros((size_t)N * H), rnd((size_t)N * ld, 1), N, H, C, ld, 1e-5f};
    for (int n = 0; n < N; n++) for (int k = H * C; k < ld; k++) c.R[(size_t)n * ld + k] = 0;   // padding is not output
    rms_loss(&c);
    float *dx = zeros((size_t)N * ld), *dw = zeros(C);
    const char *nm = H == 1 ? "rmsnorm" : "qk-norm (head-wise rmsnorm)";
    char what[64];
    if (H == 1 && pad == 0) {
        hp_rmsnorm_backward_input(dx, c.R, c.x, c.w, c.rstd, N, C, 0);
        hp_rmsnorm_backward_weight(dw, c.R, c.x, c.rstd, N, C);
    } else {
        hp_rmsnorm_heads_backward_input(dx, ld, c.R, ld, c.x, ld, c.w, c.rstd, N, H, C);
        hp_rmsnorm_heads_backward_weight(dw, c.R, ld, c.x, ld, c.rstd, N, H, C);
    }
    snprintf(what, sizeof what, "%s dx", nm);
    fd_check(what, rms_loss, &c, c.x, dx, (size_t)N * ld, 1e-2, 4, 2);
    snprintf(what, sizeof what, "%s dw", nm);
    fd_check(what, rms_loss, &c, c.w, dw, C, 1e-2, 4, 2);
    free(c.x); free(c.w); free(c.y); free(c.rstd); free(c.R); free(dx); free(dw);
}

/* ---- RoPE ---- */
typedef struct { float *x, *tmp, *cos_t, *sin_t, *R; int B, T, H, hd, ld; hp_rope_style_t st; } rope_t;
static double rope_loss(void *c_) {
    rope_t *c = c_;
    size_t n = (size_t)c->B * c->T * c->ld;
    memcpy(c->tmp, c->x, sizeof(float) * n);
    hp_rope_apply(c->tmp, c->ld, c->B, c->T, c->H, c->hd, c->cos_t, c->sin_t, c->st, 0);
    return dot(c->tmp, c->R, n);
}
static void check_rope(hp_rope_style_t st, int scaled) {
    int B = 2, T = 9, H = 2, hd = 8, ld = H * hd;
    size_t n = (size_t)B * T * ld;
    hp_rope_scaling_t sc = {scaled, 8.0f, 1.0f, 4.0f, 16, 0, 0.0f, 0.0f};
    rope_t c = {rnd(n, 1), zeros(n), zeros((size_t)T * hd / 2), zeros((size_t)T * hd / 2), rnd(n, 1), B, T, H, hd, ld, st};
    hp_rope_table(c.cos_t, c.sin_t, T, hd, 10000.0f, &sc);
    float *g = malloc(sizeof(float) * n);
    memcpy(g, c.R, sizeof(float) * n);
    hp_rope_apply(g, ld, B, T, H, hd, c.cos_t, c.sin_t, st, 1);   // backward = inverse rotation
    fd_check(st == HP_ROPE_INTERLEAVED ? "rope (interleaved) dx" : "rope (rotate_half) dx", rope_loss, &c, c.x, g, n, 1e-2, 4, 2);
    free(c.x); free(c.tmp); free(c.cos_t); free(c.sin_t); free(c.R); free(g);
}

/* ---- attention ---- */
typedef struct { float *qkv, *o, *lse, *R; int B, T, Hq, Hkv, hd, ld; } att_t;
static double att_loss(void *c_) {
    att_t *c = c_;
    hp_attention_forward(c->o, c->lse, c->qkv, c->ld, c->qkv + c->Hq * c->hd, c->ld,
                         c->qkv + (c->Hq + c->Hkv) * c->hd, c->ld, c->B, c->T, c->Hq, c->Hkv, c->hd);
    return dot(c->o, c->R, (size_t)c->B * c->T * c->Hq * c->hd);
}
static void check_attention(int B, int T, int Hq, int Hkv, int hd) {
    int ld = (Hq + 2 * Hkv) * hd;
    size_t n = (size_t)B * T * ld;
    att_t c = {rnd(n, 1.0f), zeros((size_t)B * T * Hq * hd), zeros((size_t)B * T * Hq), rnd((size_t)B * T * Hq * hd, 1), B, T, Hq, Hkv, hd, ld};
    att_loss(&c);
    float *g = zeros(n);
    hp_attention_backward(g, ld, g + Hq * hd, ld, g + (Hq + Hkv) * hd, ld, c.R, c.o, c.lse, c.qkv, ld,
                          c.qkv + Hq * hd, ld, c.qkv + (Hq + Hkv) * hd, ld, B, T, Hq, Hkv, hd);
    // split q / k / v parts for separate reports
    float *gq = zeros(n), *gk = zeros(n), *gv = zeros(n);
    for (size_t r = 0; r < (size_t)B * T; r++)
        for (int j = 0; j < ld; j++) {
            float *dst = j < Hq * hd ? gq : (j < (Hq + Hkv) * hd ? gk : gv);
            dst[r * ld + j] = g[r * ld + j];
        }
    char what[64];
    snprintf(what, sizeof what, "attention %s dq", Hq == Hkv ? "MHA" : "GQA");
    fd_check(what, att_loss, &c, c.qkv, gq, n, 1e-2, 0, 0);   // elements below, directions on all
    fd_check(Hq == Hkv ? "attention MHA dqkv" : "attention GQA dqkv", att_loss, &c, c.qkv, g, n, 1e-2, 8, 3);
    free(c.qkv); free(c.o); free(c.lse); free(c.R); free(g); free(gq); free(gk); free(gv);
}

/* ---- SwiGLU ---- */
typedef struct { float *h, *y, *R; int N, H; } swi_t;
static double swi_loss(void *c_) {
    swi_t *c = c_;
    hp_swiglu_forward(c->y, c->h, c->N, c->H);
    return dot(c->y, c->R, (size_t)c->N * c->H);
}
static void check_swiglu(void) {
    swi_t c = {rnd(4 * 2 * 9, 3), zeros(4 * 9), rnd(4 * 9, 1), 4, 9};
    float *g = zeros(4 * 2 * 9);
    hp_swiglu_backward(g, c.R, c.h, 4, 9);
    fd_check("swiglu dh13", swi_loss, &c, c.h, g, 72, 1e-2, 6, 2);
    free(c.h); free(c.y); free(c.R); free(g);
}

/* ---- embedding ---- */
typedef struct { float *w, *y, *R; int32_t *tok; int N, C; } emb_t;
static double emb_loss(void *c_) {
    emb_t *c = c_;
    hp_embedding_forward(c->y, c->tok, c->w, c->N, c->C);
    return dot(c->y, c->R, (size_t)c->N * c->C);
}
static void check_embedding(void) {
    int32_t tok[7] = {3, 1, 3, 0, 5, 3, 1};
    emb_t c = {rnd(6 * 4, 1), zeros(7 * 4), rnd(7 * 4, 1), tok, 7, 4};
    float *g = zeros(6 * 4);
    hp_embedding_backward(g, c.R, tok, 7, 4, 6);
    fd_check("embedding dW", emb_loss, &c, c.w, g, 24, 1e-2, 6, 2);
    free(c.w); free(c.y); free(c.R); free(g);
}

/* ---- cross-entropy ---- */
typedef struct { float *z; double *losses; float *lse; int32_t *t; int N, V; double div; } ce_t;
static double ce_loss(void *c_) {
    ce_t *c = c_;
    int64_t nv;
    return hp_cross_entropy_forward(c->losses, c->lse, c->z, c->t, c->N, c->V, &nv) / c->div;
}
static void check_cross_entropy(void) {
    int32_t t[6] = {2, -100, 10, 0, -100, 7};
    ce_t c = {rnd(6 * 11, 3), calloc(6, sizeof(double)), zeros(6), t, 6, 11, 5.0};
    ce_loss(&c);
    float *g = zeros(66);
    hp_cross_entropy_backward(g, c.z, c.lse, t, (float)(1.0 / c.div), 6, 11);
    fd_check("cross-entropy dlogits", ce_loss, &c, c.z, g, 66, 1e-2, 6, 2);
    free(c.z); free(c.losses); free(c.lse); free(g);
}

/* ---- whole model (block, attention/ffn modules, final norm, output, tied output) ---- */
typedef struct { hp_model_t m; int32_t *tok, *tgt; int B, T; float div; } mod_t;
static double model_loss(void *c_) {
    mod_t *c = c_;
    float loss = 0;
    HP_ASSERT(hp_model_forward(c->m, c->tok, c->tgt, c->B, c->T, c->div, &loss) == HP_OK);
    return hp_model_loss_sum(c->m) / c->div;   // double: the f32 loss would quantise the differences
}
static int mla_q_lora, mla_v;   // deepseek_v3's MLA case
static void check_model(const char *name) {
    hp_model_config_t cfg;
    HP_ASSERT(hp_model_flavor(name, "debugmodel", &cfg) == HP_OK);
    cfg.dim = 24; cfg.n_layers = 2; cfg.n_heads = 4; cfg.n_kv_heads = 2; cfg.vocab_size = 19;
    cfg.head_dim = strcmp(name, "qwen3") == 0 ? 8 : 0;
    cfg.hidden_dim = strcmp(name, "qwen3") == 0 ? 40 : 0;
    cfg.multiple_of = 16;
    if (cfg.mla) {   // deepseek_v3: MLA on dense blocks (MoE routing is not smooth), YaRN on
        cfg.hidden_dim = 40;
        cfg.moe_n_dense_layers = cfg.n_layers;
        cfg.q_lora_rank = mla_q_lora;
        cfg.kv_lora_rank = 6; cfg.qk_nope_head_dim = 4; cfg.qk_rope_head_dim = 4; cfg.v_head_dim = mla_v;
        cfg.rope_factor = 4.0f; cfg.rope_original_max_pos = 4; cfg.max_seq_len = 32;
        HP_CHECK_OK(hp_model_config_validate(&cfg));
    }
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(&cfg, 2, 7, &m));
    if (!m) return;
    HP_CHECK_OK(hp_model_init_weights(m, 7));
    // larger weights than the init so that every path carries a visible gradient
    hp_param_t *p = hp_model_params(m);
    int np = hp_model_num_params(m);
    for (int i = 0; i < np; i++) {
        size_t n = 1;
        for (int d = 0; d < p[i].value.local.ndim; d++) n *= p[i].value.local.shape[d];
        float *w = p[i].value.local.data;
        int is_norm = strstr(p[i].name, "norm") != NULL;
        for (size_t k = 0; k < n; k++) w[k] = is_norm ? 1.0f + 0.3f * frand() : w[k] * 8.0f + 0.05f * frand();
    }
    int32_t tok[14], tgt[14];
    for (int i = 0; i < 14; i++) { tok[i] = (i * 7 + 3) % 19; tgt[i] = (i * 5 + 1) % 19; }
    tgt[3] = -100;
    mod_t c = {m, tok, tgt, 2, 7, 13.0f};
    HP_CHECK_OK(hp_model_zero_grad(m));
    model_loss(&c);
    HP_CHECK_OK(hp_model_backward(m));
    char what[160];
    for (int i = 0; i < np; i++) {
        size_t n = 1;
        for (int d = 0; d < p[i].value.local.ndim; d++) n *= p[i].value.local.shape[d];
        float *g = malloc(sizeof(float) * n);
        memcpy(g, p[i].grad.local.data, sizeof(float) * n);
        snprintf(what, sizeof what, "%s %s", name, p[i].name);
        // step relative to the tensor's scale: 1% of its rms (a perturbation of every element
        // along u moves the tensor by 1%, keeping the third-order error small)
        double ss = 0;
        const float *w = p[i].value.local.data;
        for (size_t k = 0; k < n; k++) ss += (double)w[k] * w[k];
        double h = fmax(1e-2 * sqrt(ss / (double)n), 1e-3);
        double gabs = 0;
        for (size_t k = 0; k < n; k++) gabs += fabs(g[k]);
        fd_check_tol(what, model_loss, &c, p[i].value.local.data, g, n, h, 1, 3, 2e-2, 2e-4, 2e-4 + 1e-4 * gabs);
        free(g);
    }
    hp_model_destroy(m);
}

int main(void) {
    check_linear(0);
    check_linear(1);
    check_rmsnorm(5, 1, 12, 0);
    check_rmsnorm(4, 3, 8, 5);
    check_rope(HP_ROPE_INTERLEAVED, 1);
    check_rope(HP_ROPE_HALF, 0);
    check_attention(2, 11, 2, 2, 8);
    check_attention(1, 70, 4, 2, 8);   // two key tiles
    check_swiglu();
    check_embedding();
    check_cross_entropy();
    check_model("llama3");
    check_model("qwen3");
    mla_q_lora = 0; mla_v = 6;    // wq; V padded to the q|k width 8
    check_model("deepseek_v3");
    mla_q_lora = 5; mla_v = 10;   // wq_a, q_norm, wq_b; q|k padded to the V width 10
    check_model("deepseek_v3");
    printf("worst |fd - analytic| / tolerance: %.3g\n", worst_ratio);
    return hp_test_finish("test_nn_gradcheck");
}
