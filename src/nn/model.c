/* Llama-family decoder (llama3, qwen3 dense) built from modules: embedding -> blocks
 * (attention_norm, attention [fused wq|wk|wv GEMM, qk-norm, RoPE, flash attention, wo],
 * ffn_norm, feed_forward [fused w1|w3 GEMM, SwiGLU, w2]) -> norm -> output -> summed
 * cross-entropy / divisor. Flavors, parameter counts and FLOPs/token follow TorchTitan.
 * Memory: arenas for params, grads, activations and workspace sized before allocation.
 * Inference: a KV cache (one allocation) with prefill/decode of new positions only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "hyperparallel/model.h"
#include "hyperparallel/nn.h"
#include "hyperparallel/rng.h"
#include "nn/nn-impl.h"

/* ---- flavors ----------------------------------------------------------------------------- */

static int llama_hidden(int dim, int multiple_of, float mult) {
    // TorchTitan: hidden = 4*dim; int(2*hidden/3); int(mult*hidden); round up to multiple_of
    int hidden = 4 * dim;
    hidden = (int)(2 * hidden / 3);
    if (mult > 0.0f) hidden = (int)(mult * (float)hidden);
    return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

static void set_llama3(hp_model_config_t *c, const char *flavor, int dim, int layers, int heads,
                       int kv, int multiple_of, float mult, int vocab) {
    memset(c, 0, sizeof(*c));
    snprintf(c->name, sizeof(c->name), "llama3");
    snprintf(c->flavor, sizeof(c->flavor), "%s", flavor);
    c->dim = dim;
    c->n_layers = layers;
    c->n_heads = heads;
    c->n_kv_heads = kv;
    c->vocab_size = vocab;
    c->multiple_of = multiple_of;
    c->ffn_dim_multiplier = mult;
    c->norm_eps = 1e-5f;
    c->rope_theta = 500000.0f;
    c->rope_scaling = 1;   // TorchTitan RoPE scaling="llama": factor 8, low 1, high 4, orig 8192
    c->rope_factor = 8.0f;
    c->rope_low_freq_factor = 1.0f;
    c->rope_high_freq_factor = 4.0f;
    c->rope_original_max_pos = 8192;
    c->max_seq_len = 131072;
}

static void set_qwen3(hp_model_config_t *c, const char *flavor, int dim, int layers, int heads,
                      int kv, int head_dim, int hidden, int vocab) {
    memset(c, 0, sizeof(*c));
    snprintf(c->name, sizeof(c->name), "qwen3");
    snprintf(c->flavor, sizeof(c->flavor), "%s", flavor);
    c->dim = dim;
    c->n_layers = layers;
    c->n_heads = heads;
    c->n_kv_heads = kv;
    c->head_dim = head_dim;
    c->hidden_dim = hidden;
    c->vocab_size = vocab;
    c->norm_eps = 1e-6f;
    c->rope_theta = 1000000.0f;
    c->qk_norm = 1;
    c->tie_embeddings = 1;
    c->max_seq_len = 4096;
}

hp_status_t hp_model_flavor(const char *model_name, const char *flavor, hp_model_config_t *cfg) {
    if (!model_name || !flavor || !cfg)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_flavor: model name, flavor and cfg must be non-NULL");
    if (strcmp(model_name, "llama3") == 0) {
        if (strcmp(flavor, "debugmodel") == 0)
            set_llama3(cfg, flavor, 256, 6, 16, 16, 256, 0.0f, 2048);
        else if (strcmp(flavor, "1B") == 0) {
            // Llama 3.2 1B shape (untied here as TorchTitan's llama3 model; rope factor 32)
            set_llama3(cfg, flavor, 2048, 16, 32, 8, 256, 1.5f, 128256);
            cfg->rope_factor = 32.0f;
        } else if (strcmp(flavor, "8B") == 0)
            set_llama3(cfg, flavor, 4096, 32, 32, 8, 1024, 1.3f, 128256);
        else if (strcmp(flavor, "70B") == 0)
            set_llama3(cfg, flavor, 8192, 80, 64, 8, 4096, 1.3f, 128256);
        else if (strcmp(flavor, "405B") == 0)
            set_llama3(cfg, flavor, 16384, 126, 128, 8, 4096, 1.2f, 128256);
        else
            return hp_error(HP_ERR_INVALID_ARG, "model 'llama3': unknown flavor '%s'; valid flavors: "
                            "debugmodel, 1B, 8B, 70B, 405B", flavor);
    } else if (strcmp(model_name, "qwen3") == 0) {
        if (strcmp(flavor, "debugmodel") == 0)
            set_qwen3(cfg, flavor, 256, 8, 16, 8, 128, 3072, 2048);
        else if (strcmp(flavor, "0.6B") == 0)
            set_qwen3(cfg, flavor, 1024, 28, 16, 8, 128, 3072, 151936);
        else
            return hp_error(HP_ERR_INVALID_ARG, "model 'qwen3': unknown flavor '%s'; valid flavors: "
                            "debugmodel, 0.6B", flavor);
    } else {
        return hp_error(HP_ERR_INVALID_ARG, "unknown model '%s'; valid models: llama3 (debugmodel, 1B, "
                        "8B, 70B, 405B), qwen3 (debugmodel, 0.6B)", model_name);
    }
    return hp_model_config_validate(cfg);
}

hp_status_t hp_model_config_validate(hp_model_config_t *c) {
    if (!c) return hp_error(HP_ERR_INVALID_ARG, "hp_model_config_validate: cfg is NULL");
#define HP_CFG_POS(field)                                                                       \
    if (c->field <= 0)                                                                          \
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': " #field " = %d, expected > 0", \
                        c->name, c->flavor, (int)c->field);
    HP_CFG_POS(dim) HP_CFG_POS(n_layers) HP_CFG_POS(n_heads) HP_CFG_POS(vocab_size)
#undef HP_CFG_POS
    if (c->n_kv_heads <= 0) c->n_kv_heads = c->n_heads;
    if (c->n_heads % c->n_kv_heads != 0)
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': n_heads %d is not a multiple of "
                        "n_kv_heads %d", c->name, c->flavor, c->n_heads, c->n_kv_heads);
    if (c->head_dim <= 0) {
        if (c->dim % c->n_heads != 0)
            return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': dim %d is not divisible by "
                            "n_heads %d; hint: set head_dim explicitly", c->name, c->flavor, c->dim, c->n_heads);
        c->head_dim = c->dim / c->n_heads;
    }
    if (c->head_dim % 2 != 0 || c->head_dim > 512)
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': head_dim %d must be even and <= 512 "
                        "(RoPE rotates pairs)", c->name, c->flavor, c->head_dim);
    if (c->hidden_dim <= 0) {
        if (c->multiple_of <= 0)
            return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': hidden_dim unset and multiple_of "
                            "= %d; set one of them", c->name, c->flavor, c->multiple_of);
        c->hidden_dim = llama_hidden(c->dim, c->multiple_of, c->ffn_dim_multiplier);
    }
    if (!(c->norm_eps > 0.0f) || !(c->rope_theta > 0.0f))
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': norm_eps %g and rope_theta %g must "
                        "be > 0", c->name, c->flavor, c->norm_eps, c->rope_theta);
    if (c->rope_scaling && (!(c->rope_factor > 0.0f) || c->rope_original_max_pos <= 0 ||
                            !(c->rope_high_freq_factor > c->rope_low_freq_factor)))
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': rope scaling needs factor > 0, "
                        "original_max_pos > 0 and high_freq_factor > low_freq_factor", c->name, c->flavor);
    if (c->max_seq_len <= 0) c->max_seq_len = 4096;
    /* Upper bounds: a dimension from a file or flag beyond them would overflow a product of
     * dims or ask for an absurd allocation instead of failing with a message. */
#define HP_CFG_MAX(field, lim, why)                                                                          \
    if ((int64_t)c->field > (int64_t)(lim))                                                                  \
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': " #field " = %d exceeds the limit %lld (%s)", \
                        c->name, c->flavor, (int)c->field, (long long)(lim), why);
    HP_CFG_MAX(vocab_size, HP_MODEL_MAX_VOCAB, "HP_MODEL_MAX_VOCAB; token ids are at most 2^24")
    HP_CFG_MAX(max_seq_len, HP_MODEL_MAX_SEQ_LEN, "HP_MODEL_MAX_SEQ_LEN; RoPE tables and activations grow with it")
    HP_CFG_MAX(dim, HP_MODEL_MAX_DIM, "HP_MODEL_MAX_DIM")
    HP_CFG_MAX(hidden_dim, HP_MODEL_MAX_DIM, "HP_MODEL_MAX_DIM")
    HP_CFG_MAX(n_layers, HP_MODEL_MAX_LAYERS, "HP_MODEL_MAX_LAYERS")
    HP_CFG_MAX(n_heads, HP_MODEL_MAX_HEADS, "HP_MODEL_MAX_HEADS")
#undef HP_CFG_MAX
    if ((int64_t)c->n_heads * c->head_dim > HP_MODEL_MAX_DIM)
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': n_heads x head_dim = %d x %d exceeds the limit %d "
                        "(HP_MODEL_MAX_DIM)", c->name, c->flavor, c->n_heads, c->head_dim, HP_MODEL_MAX_DIM);
    /* Each factor is bounded above, so the count fits int64; compare before any allocation. */
    int64_t nparams = hp_model_param_count(c, 0);
    if (nparams > HP_MODEL_MAX_PARAMS)
        return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s': %lld parameters (vocab_size %d x dim %d, %d layers "
                        "of dim %d / hidden %d) exceed the limit 2^40 = %lld (HP_MODEL_MAX_PARAMS, 4 TiB of float32); "
                        "hint: check vocab_size and the flavor", c->name, c->flavor, (long long)nparams, c->vocab_size,
                        c->dim, c->n_layers, c->dim, c->hidden_dim, (long long)HP_MODEL_MAX_PARAMS);
    return HP_OK;
}

static int64_t layer_params(const hp_model_config_t *c) {
    int64_t d = c->dim, qd = (int64_t)c->n_heads * c->head_dim, kd = (int64_t)c->n_kv_heads * c->head_dim;
    return d * qd + 2 * d * kd + qd * d + 3 * d * (int64_t)c->hidden_dim + 2 * d +
           (c->qk_norm ? 2 * (int64_t)c->head_dim : 0);
}

int64_t hp_model_param_count(const hp_model_config_t *c, int exclude_embedding) {
    int64_t emb = (int64_t)c->vocab_size * c->dim;
    int64_t n = emb + (int64_t)c->n_layers * layer_params(c) + c->dim + (c->tie_embeddings ? 0 : emb);
    // tied embeddings still feed the output GEMM, so TorchTitan keeps them in the count
    if (exclude_embedding && !c->tie_embeddings) n -= emb;
    return n;
}

double hp_model_flops_per_token(const hp_model_config_t *c, int seq_len) {
    return 6.0 * (double)hp_model_param_count(c, 1) +
           6.0 * c->n_layers * c->n_heads * (2.0 * c->head_dim) * (double)seq_len;
}

/* ---- composite modules: attention, feed-forward, block ----------------------------------- */

typedef struct attn_impl {
    int dim, n_heads, n_kv, hd, qd, kd, qkvd;
    int qk_norm;
    float eps;
    hp_rope_style_t style;
    const float *cos_t, *sin_t;   // (max_T, hd/2)
    float *qn_w, *qn_dw, *kn_w, *kn_dw;   // (hd) qk-norm weights (qwen3)
    hp_module_t *wqkv, *wo;
} attn_impl_t;

typedef struct attn_saved {
    float *qkv;    // (B*T, qkvd) wq|wk|wv output
    float *qkr;    // (B*T, qd+kd) q, k after qk-norm and RoPE
    float *rstd_q; // (B*T, H)   qk-norm
    float *rstd_k; // (B*T, KV)
    float *o;      // (B*T, qd) attention output
    float *lse;    // (B, H, T)
    float *dqkr;   // scratch: grads of qkr (qk-norm only)
    int B, T;
} attn_saved_t;

static size_t attn_act_bytes(const hp_module_t *m, int B, int T) {
    const attn_impl_t *A = m->impl;
    size_t N = (size_t)B * T;
    size_t s = hp_arena_round(sizeof(attn_saved_t)) + hp_arena_round(sizeof(float) * N * A->qkvd) +
               hp_arena_round(sizeof(float) * N * (A->qd + A->kd)) + hp_arena_round(sizeof(float) * N * A->qd) +
               hp_arena_round(sizeof(float) * N * A->n_heads);
    if (A->qk_norm)
        s += hp_arena_round(sizeof(float) * N * A->n_heads) + hp_arena_round(sizeof(float) * N * A->n_kv);
    return s + A->wqkv->ops->act_bytes(A->wqkv, B, T) + A->wo->ops->act_bytes(A->wo, B, T);
}

static size_t attn_scratch(const hp_module_t *m, int B, int T) {
    const attn_impl_t *A = m->impl;
    size_t N = (size_t)B * T;
    return N * ((size_t)A->qd + A->qkvd + (A->qk_norm ? (size_t)(A->qd + A->kd) : 0));
}

static void tensor2(hp_tensor_t *t, float *data, int64_t rows, int64_t cols) {
    memset(t, 0, sizeof(*t));
    t->dtype = HP_F32;
    t->ndim = 2;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->stride[0] = cols;
    t->stride[1] = 1;
    t->data = data;
}

static hp_status_t attn_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    attn_impl_t *A = m->impl;
    const int B = act->B, T = act->T, N = B * T;
    attn_saved_t *s = hp_act_slot_new(act, m, sizeof(*s));
    s->B = B;
    s->T = T;
    s->qkv = hp_act_alloc(act, sizeof(float) * (size_t)N * A->qkvd);
    s->qkr = hp_act_alloc(act, sizeof(float) * (size_t)N * (A->qd + A->kd));
    s->o = hp_act_alloc(act, sizeof(float) * (size_t)N * A->qd);
    s->lse = hp_act_alloc(act, sizeof(float) * (size_t)N * A->n_heads);
    hp_tensor_t t_in, t_qkv, t_o;
    tensor2(&t_in, in->data, N, A->dim);
    tensor2(&t_qkv, s->qkv, N, A->qkvd);
    HP_TRY(hp_module_forward(A->wqkv, act, &t_in, &t_qkv));
    const int ldr = A->qd + A->kd;
    double t0 = omp_get_wtime();
    if (A->qk_norm) {
        s->rstd_q = hp_act_alloc(act, sizeof(float) * (size_t)N * A->n_heads);
        s->rstd_k = hp_act_alloc(act, sizeof(float) * (size_t)N * A->n_kv);
        hp_rmsnorm_heads_forward(s->qkr, ldr, s->rstd_q, s->qkv, A->qkvd, A->qn_w, N, A->n_heads, A->hd, A->eps);
        hp_rmsnorm_heads_forward(s->qkr + A->qd, ldr, s->rstd_k, s->qkv + A->qd, A->qkvd, A->kn_w, N,
                                 A->n_kv, A->hd, A->eps);
        if (act->prof) act->prof[HP_NN_OP_QK_NORM] += omp_get_wtime() - t0;
    } else {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++)
            memcpy(s->qkr + (size_t)n * ldr, s->qkv + (size_t)n * A->qkvd, sizeof(float) * (size_t)ldr);
        if (act->prof) act->prof[HP_NN_OP_ELEMENTWISE] += omp_get_wtime() - t0;
    }
    t0 = omp_get_wtime();
    hp_rope_apply(s->qkr, ldr, B, T, A->n_heads, A->hd, A->cos_t, A->sin_t, A->style, 0);
    hp_rope_apply(s->qkr + A->qd, ldr, B, T, A->n_kv, A->hd, A->cos_t, A->sin_t, A->style, 0);
    if (act->prof) act->prof[HP_NN_OP_ROPE] += omp_get_wtime() - t0;
    t0 = omp_get_wtime();
    hp_attention_forward(s->o, s->lse, s->qkr, ldr, s->qkr + A->qd, ldr, s->qkv + A->qd + A->kd, A->qkvd,
                         B, T, A->n_heads, A->n_kv, A->hd);
    if (act->prof) act->prof[HP_NN_OP_ATTENTION_FWD] += omp_get_wtime() - t0;
    tensor2(&t_o, s->o, N, A->qd);
    return hp_module_forward(A->wo, act, &t_o, out);   // out += o Wo^T (residual)
}

static hp_status_t attn_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    attn_impl_t *A = m->impl;
    attn_saved_t *s = hp_act_slot(act, m);
    const int B = s->B, T = s->T, N = B * T, ldr = A->qd + A->kd;
    size_t off = 0;
    float *dO = hp_act_scratch(act, &off, (size_t)N * A->qd);
    float *dqkv = hp_act_scratch(act, &off, (size_t)N * A->qkvd);
    hp_tensor_t t_dO, t_dqkv;
    tensor2(&t_dO, dO, N, A->qd);
    HP_TRY(hp_module_backward_input(A->wo, act, dout, &t_dO));
    // dq/dk land in dqkr (qk-norm) or straight in dqkv; dv always in dqkv
    float *dq = dqkv;
    int ldq = A->qkvd;
    if (A->qk_norm) {
        s->dqkr = hp_act_scratch(act, &off, (size_t)N * ldr);
        dq = s->dqkr;
        ldq = ldr;
    }
    double t0 = omp_get_wtime();
    hp_attention_backward(dq, ldq, dq + A->qd, ldq, dqkv + A->qd + A->kd, A->qkvd, dO, s->o, s->lse, s->qkr, ldr,
                          s->qkr + A->qd, ldr, s->qkv + A->qd + A->kd, A->qkvd, B, T, A->n_heads,
                          A->n_kv, A->hd);
    if (act->prof) act->prof[HP_NN_OP_ATTENTION_BWD] += omp_get_wtime() - t0;
    t0 = omp_get_wtime();
    hp_rope_apply(dq, ldq, B, T, A->n_heads, A->hd, A->cos_t, A->sin_t, A->style, 1);
    hp_rope_apply(dq + A->qd, ldq, B, T, A->n_kv, A->hd, A->cos_t, A->sin_t, A->style, 1);
    if (act->prof) act->prof[HP_NN_OP_ROPE] += omp_get_wtime() - t0;
    if (A->qk_norm) {
        t0 = omp_get_wtime();
        hp_rmsnorm_heads_backward_input(dqkv, A->qkvd, s->dqkr, ldr, s->qkv, A->qkvd, A->qn_w, s->rstd_q,
                                        N, A->n_heads, A->hd);
        hp_rmsnorm_heads_backward_input(dqkv + A->qd, A->qkvd, s->dqkr + A->qd, ldr, s->qkv + A->qd,
                                        A->qkvd, A->kn_w, s->rstd_k, N, A->n_kv, A->hd);
        if (act->prof) act->prof[HP_NN_OP_QK_NORM] += omp_get_wtime() - t0;
    }
    tensor2(&t_dqkv, dqkv, N, A->qkvd);
    hp_tensor_t t_din;
    tensor2(&t_din, din->data, N, A->dim);
    return hp_module_backward_input(A->wqkv, act, &t_dqkv, &t_din);
}

static hp_status_t attn_backward_weight(hp_module_t *m, hp_act_t *act) {
    attn_impl_t *A = m->impl;
    attn_saved_t *s = hp_act_slot(act, m);
    HP_TRY(hp_module_backward_weight(A->wo, act));
    HP_TRY(hp_module_backward_weight(A->wqkv, act));
    if (A->qk_norm) {
        const int N = s->B * s->T, ldr = A->qd + A->kd;
        double t0 = omp_get_wtime();
        hp_rmsnorm_heads_backward_weight(A->qn_dw, s->dqkr, ldr, s->qkv, A->qkvd, s->rstd_q, N, A->n_heads, A->hd);
        hp_rmsnorm_heads_backward_weight(A->kn_dw, s->dqkr + A->qd, ldr, s->qkv + A->qd, A->qkvd, s->rstd_k,
                                         N, A->n_kv, A->hd);
        if (act->prof) act->prof[HP_NN_OP_QK_NORM] += omp_get_wtime() - t0;
    }
    return HP_OK;
}

static const hp_module_ops_t attn_ops = {
    "attention", attn_act_bytes, attn_scratch, attn_forward, attn_backward_input, attn_backward_weight,
};

typedef struct ffn_impl {
    int dim, hidden;
    hp_module_t *w13, *w2;
} ffn_impl_t;

typedef struct ffn_saved {
    float *h13;   // (N, 2*hidden) w1|w3 outputs
    float *a;     // (N, hidden) silu(h1) * h3
    int N;
} ffn_saved_t;

static size_t ffn_act_bytes(const hp_module_t *m, int B, int T) {
    const ffn_impl_t *F = m->impl;
    size_t N = (size_t)B * T;
    return hp_arena_round(sizeof(ffn_saved_t)) + hp_arena_round(sizeof(float) * N * 2 * F->hidden) +
           hp_arena_round(sizeof(float) * N * F->hidden) + F->w13->ops->act_bytes(F->w13, B, T) +
           F->w2->ops->act_bytes(F->w2, B, T);
}

static size_t ffn_scratch(const hp_module_t *m, int B, int T) {
    const ffn_impl_t *F = m->impl;
    return (size_t)B * T * 3 * F->hidden;
}

static hp_status_t ffn_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    ffn_impl_t *F = m->impl;
    const int N = act->B * act->T;
    ffn_saved_t *s = hp_act_slot_new(act, m, sizeof(*s));
    s->N = N;
    s->h13 = hp_act_alloc(act, sizeof(float) * (size_t)N * 2 * F->hidden);
    s->a = hp_act_alloc(act, sizeof(float) * (size_t)N * F->hidden);
    hp_tensor_t t_in, t_h13, t_a;
    tensor2(&t_in, in->data, N, F->dim);
    tensor2(&t_h13, s->h13, N, 2 * F->hidden);
    tensor2(&t_a, s->a, N, F->hidden);
    HP_TRY(hp_module_forward(F->w13, act, &t_in, &t_h13));
    double t0 = omp_get_wtime();
    hp_swiglu_forward(s->a, s->h13, N, F->hidden);
    if (act->prof) act->prof[HP_NN_OP_SWIGLU_FWD] += omp_get_wtime() - t0;
    return hp_module_forward(F->w2, act, &t_a, out);   // out += a W2^T (residual)
}

static hp_status_t ffn_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    ffn_impl_t *F = m->impl;
    ffn_saved_t *s = hp_act_slot(act, m);
    const int N = s->N;
    size_t off = 0;
    float *da = hp_act_scratch(act, &off, (size_t)N * F->hidden);
    float *dh13 = hp_act_scratch(act, &off, (size_t)N * 2 * F->hidden);
    hp_tensor_t t_da, t_dh13, t_din;
    tensor2(&t_da, da, N, F->hidden);
    tensor2(&t_dh13, dh13, N, 2 * F->hidden);
    HP_TRY(hp_module_backward_input(F->w2, act, dout, &t_da));
    double t0 = omp_get_wtime();
    hp_swiglu_backward(dh13, da, s->h13, N, F->hidden);
    if (act->prof) act->prof[HP_NN_OP_SWIGLU_BWD] += omp_get_wtime() - t0;
    tensor2(&t_din, din->data, N, F->dim);
    return hp_module_backward_input(F->w13, act, &t_dh13, &t_din);
}

static hp_status_t ffn_backward_weight(hp_module_t *m, hp_act_t *act) {
    ffn_impl_t *F = m->impl;
    HP_TRY(hp_module_backward_weight(F->w2, act));
    return hp_module_backward_weight(F->w13, act);
}

static const hp_module_ops_t ffn_ops = {
    "feed_forward", ffn_act_bytes, ffn_scratch, ffn_forward, ffn_backward_input, ffn_backward_weight,
};

typedef struct block_impl {
    int dim;
    hp_module_t *attention_norm, *attention, *ffn_norm, *feed_forward;
} block_impl_t;

typedef struct block_saved {
    float *xn;   // (N, dim) attention_norm(x)
    float *h;    // (N, dim) x + attention(xn)
    float *hn;   // (N, dim) ffn_norm(h)
    int N;
} block_saved_t;

static size_t block_act_bytes(const hp_module_t *m, int B, int T) {
    const block_impl_t *K = m->impl;
    size_t N = (size_t)B * T, s = hp_arena_round(sizeof(block_saved_t)) + 3 * hp_arena_round(sizeof(float) * N * K->dim);
    for (int i = 0; i < m->n_children; i++) s += m->children[i]->ops->act_bytes(m->children[i], B, T);
    return s;
}

static size_t block_scratch(const hp_module_t *m, int B, int T) {
    const block_impl_t *K = m->impl;
    return (size_t)B * T * 3 * K->dim + K->attention->ops->grad_scratch_floats(K->attention, B, T) +
           K->feed_forward->ops->grad_scratch_floats(K->feed_forward, B, T);
}

static hp_status_t block_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    block_impl_t *K = m->impl;
    const int N = act->B * act->T;
    if (!in || !out || in->dtype != HP_F32 || hp_tensor_numel(in) != (int64_t)N * K->dim ||
        hp_tensor_numel(out) != (int64_t)N * K->dim)
        return hp_error(HP_ERR_INVALID_ARG, "block '%s': input and output must be f32 (%d, %d, %d)",
                        m->name, act->B, act->T, K->dim);
    block_saved_t *s = hp_act_slot_new(act, m, sizeof(*s));
    s->N = N;
    s->xn = hp_act_alloc(act, sizeof(float) * (size_t)N * K->dim);
    s->h = hp_act_alloc(act, sizeof(float) * (size_t)N * K->dim);
    s->hn = hp_act_alloc(act, sizeof(float) * (size_t)N * K->dim);
    hp_tensor_t t_x, t_xn, t_h, t_hn, t_out;
    tensor2(&t_x, in->data, N, K->dim);
    tensor2(&t_xn, s->xn, N, K->dim);
    tensor2(&t_h, s->h, N, K->dim);
    tensor2(&t_hn, s->hn, N, K->dim);
    tensor2(&t_out, out->data, N, K->dim);
    HP_TRY(hp_module_forward(K->attention_norm, act, &t_x, &t_xn));
    memcpy(s->h, in->data, sizeof(float) * (size_t)N * K->dim);
    HP_TRY(hp_module_forward(K->attention, act, &t_xn, &t_h));        // h = x + attn(xn)
    HP_TRY(hp_module_forward(K->ffn_norm, act, &t_h, &t_hn));
    memcpy(out->data, s->h, sizeof(float) * (size_t)N * K->dim);
    return hp_module_forward(K->feed_forward, act, &t_hn, &t_out);  // out = h + ffn(hn)
}

static hp_status_t block_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    block_impl_t *K = m->impl;
    block_saved_t *s = hp_act_slot(act, m);
    const int N = s->N;
    float *base = act->grad_scratch;
    size_t cap = act->grad_scratch_floats, off = 0;
    float *dhn = hp_act_scratch(act, &off, (size_t)N * K->dim);
    float *dh = hp_act_scratch(act, &off, (size_t)N * K->dim);
    float *dxn = hp_act_scratch(act, &off, (size_t)N * K->dim);
    size_t attn_floats = K->attention->ops->grad_scratch_floats(K->attention, act->B, act->T);
    hp_tensor_t t_dhn, t_dh, t_dxn, t_din;
    tensor2(&t_dhn, dhn, N, K->dim);
    tensor2(&t_dh, dh, N, K->dim);
    tensor2(&t_dxn, dxn, N, K->dim);
    tensor2(&t_din, din->data, N, K->dim);
    hp_status_t st;
    // children carve their scratch from disjoint regions so their weight parts can run later
    act->grad_scratch = base + off + attn_floats;
    act->grad_scratch_floats = cap - off - attn_floats;
    st = hp_module_backward_input(K->feed_forward, act, dout, &t_dhn);
    if (st == HP_OK) {
        memcpy(dh, dout->data, sizeof(float) * (size_t)N * K->dim);
        st = hp_module_backward_input(K->ffn_norm, act, &t_dhn, &t_dh);   // dh = dout + ...
    }
    if (st == HP_OK) {
        act->grad_scratch = base + off;
        act->grad_scratch_floats = attn_floats;
        st = hp_module_backward_input(K->attention, act, &t_dh, &t_dxn);
    }
    act->grad_scratch = base;
    act->grad_scratch_floats = cap;
    HP_TRY(st);
    memcpy(din->data, dh, sizeof(float) * (size_t)N * K->dim);
    return hp_module_backward_input(K->attention_norm, act, &t_dxn, &t_din);   // din = dh + ...
}

static hp_status_t block_backward_weight(hp_module_t *m, hp_act_t *act) {
    block_impl_t *K = m->impl;
    HP_TRY(hp_module_backward_weight(K->feed_forward, act));
    HP_TRY(hp_module_backward_weight(K->ffn_norm, act));
    HP_TRY(hp_module_backward_weight(K->attention, act));
    return hp_module_backward_weight(K->attention_norm, act);
}

static const hp_module_ops_t block_ops = {
    "transformer_block", block_act_bytes, block_scratch, block_forward, block_backward_input,
    block_backward_weight,
};

/* ---- the model ----------------------------------------------------------------------- */

/* Per layer: block, attention_norm, attention, wqkv, wo, ffn_norm, feed_forward, w13, w2. */
enum { MODS_PER_LAYER = 9 };

typedef struct layer_mods {
    hp_module_t block, attention_norm, attention, wqkv, wo, ffn_norm, feed_forward, w13, w2;
    block_impl_t block_i;
    hp_rmsnorm_impl_t attention_norm_i, ffn_norm_i;
    attn_impl_t attention_i;
    hp_linear_impl_t wqkv_i, wo_i, w13_i, w2_i;
    ffn_impl_t ffn_i;
} layer_mods_t;

typedef struct model_saved {
    int32_t *tokens, *targets;   // (B, T) copies
    float *x0;                   // (B, T, dim) embedding output
    float **xs;                  // per layer output (B, T, dim)
    float *hf;                   // (B, T, dim) final norm output
    float *logits;               // (B, T, V)
    double *losses;              // (B*T) per-row cross-entropy
    float *lse;                  // (B*T)
} model_saved_t;

struct hp_model {
    hp_model_config_t cfg;
    int max_batch, max_seq_len;
    int n_params;
    hp_param_t *params;
    float *param_data, *grad_data;   // one buffer each, same offsets (zero_grad = one memset)
    size_t param_floats;
    hp_module_t embedding, norm, output;
    hp_embedding_impl_t embedding_i;
    hp_rmsnorm_impl_t norm_i;
    hp_linear_impl_t output_i;
    layer_mods_t *layers;
    int n_modules;
    float *cos_t, *sin_t;   // (max_seq_len, hd/2)
    hp_act_t act;
    float *workspace;       // dlogits, two (B*T, dim) ping-pong buffers, gradient scratch
    size_t workspace_floats;
    float *dlogits, *gbuf[2], *scratch;
    size_t scratch_floats;
    int B, T;
    const float *logits;    // (B, T, V) of the last forward (in the activation arena)
    int have_forward;       // a forward with targets whose backward has not run
    float loss_divisor;
    int64_t n_valid;
    double loss_sum;
    double prof[HP_NN_OP_COUNT];
    double prof_seconds[HP_NN_OP_COUNT];
    const char *prof_names[HP_NN_OP_COUNT];
    size_t *param_off;      // per param: float offset in the flat layout (units contiguous)
    hp_model_hooks_t hooks; // data-parallel wrappers (FSDP, DDP); all NULL = none
    void *hooks_ctx;
    int storage_released;   // param/grad storage belongs to an external owner
    /* activation checkpointing: ac_every = 0 off, k >= 1 checkpoints block l when
     * (l + 1) % k == 0 (TorchTitan's layer-level rule); ac_base_bytes and
     * ac_block_bytes[l] are the arena sizes computed at create (before any wrapper) */
    int ac_every;
    size_t ac_base_bytes, *ac_block_bytes;
    /* tensor parallel (src/parallel/tp.c): the residual stream holds T/seq_shard positions
     * per rank (sequence parallel), the output module writes logits_cols columns (the
     * local vocab under loss_parallel), and loss_fn replaces the cross-entropy kernels. */
    int seq_shard, logits_cols;
    hp_model_loss_fn_t loss_fn;
    void *loss_ctx;
};

const hp_model_config_t *hp_model_config(hp_model_t m) { return &m->cfg; }
int hp_model_num_params(hp_model_t m) { return m->n_params; }
hp_param_t *hp_model_params(hp_model_t m) { return m->params; }
const float *hp_model_logits(hp_model_t m) { return m->logits; }
int64_t hp_model_valid_tokens(hp_model_t m) { return m->n_valid; }
double hp_model_loss_sum(hp_model_t m) { return m->loss_sum; }

hp_param_t *hp_model_find_param(hp_model_t m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
    return NULL;
}

static void param_desc(hp_param_t *p, const char *name, float *value, float *grad, int ndim,
                       int64_t d0, int64_t d1) {
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s", name);
    int64_t shape[2] = {d0, d1};
    hp_tensor_t *ts[2] = {&p->value.local, &p->grad.local};
    float *data[2] = {value, grad};
    for (int k = 0; k < 2; k++) {
        hp_tensor_t *t = ts[k];
        t->dtype = HP_F32;
        t->ndim = ndim == 2 ? 2 : 1;
        t->shape[0] = shape[0];
        t->stride[0] = 1;
        if (ndim == 2) {
            t->shape[1] = shape[1];
            t->stride[0] = d1;
            t->stride[1] = 1;
        }
        t->data = data[k];
    }
    for (int i = 0; i < ndim; i++) p->value.global_shape[i] = p->grad.global_shape[i] = shape[i];
    p->value.mesh = p->grad.mesh = NULL;
    p->value.mesh_ndim = p->grad.mesh_ndim = 0;
}

/* Parameter table in list order, with storage offsets in memory order (wq|wk|wv and w1|w3
 * adjacent so they form one GEMM each). */
typedef struct pspec {
    char name[HP_PARAM_NAME_MAX];
    int ndim;
    int64_t d0, d1;
    size_t offset;
} pspec_t;

static int build_specs(const hp_model_config_t *c, pspec_t *sp, size_t *total) {
    int n = 0;
    size_t off = 0;
    const int64_t d = c->dim, qd = (int64_t)c->n_heads * c->head_dim, kd = (int64_t)c->n_kv_heads * c->head_dim,
                  hid = c->hidden_dim, V = c->vocab_size;
#define ADD(nm, nd, a, b, o)                                                     \
    do {                                                                         \
        if (sp) {                                                                \
            snprintf(sp[n].name, HP_PARAM_NAME_MAX, "%s", nm);                   \
            sp[n].ndim = nd; sp[n].d0 = a; sp[n].d1 = b; sp[n].offset = o;       \
        }                                                                        \
        n++;                                                                     \
    } while (0)
    // keep every tensor 16-float aligned (64 bytes)
#define ROUND(x) (((x) + 15) & ~(size_t)15)
    ADD("tok_embeddings.weight", 2, V, d, off);
    off += ROUND((size_t)(V * d));
    char nm[HP_PARAM_NAME_MAX];
    for (int l = 0; l < c->n_layers; l++) {
        size_t wq = off, wk = wq + (size_t)(qd * d), wv = wk + (size_t)(kd * d);
        off = ROUND(wv + (size_t)(kd * d));
        size_t wo = off;
        off = ROUND(off + (size_t)(d * qd));
        size_t qn = off, kn = 0;
        if (c->qk_norm) { off = ROUND(off + (size_t)c->head_dim); kn = off; off = ROUND(off + (size_t)c->head_dim); }
        size_t an = off;
        off = ROUND(off + (size_t)d);
        size_t w1 = off, w3 = w1 + (size_t)(hid * d);
        off = ROUND(w3 + (size_t)(hid * d));
        size_t w2 = off;
        off = ROUND(off + (size_t)(d * hid));
        size_t fn = off;
        off = ROUND(off + (size_t)d);
#define LADD(suffix, nd, a, b, o) do { snprintf(nm, sizeof(nm), "layers.%d.%s", l, suffix); ADD(nm, nd, a, b, o); } while (0)
        LADD("attention.wq.weight", 2, qd, d, wq);
        LADD("attention.wk.weight", 2, kd, d, wk);
        LADD("attention.wv.weight", 2, kd, d, wv);
        LADD("attention.wo.weight", 2, d, qd, wo);
        if (c->qk_norm) {
            LADD("attention.q_norm.weight", 1, c->head_dim, 0, qn);
            LADD("attention.k_norm.weight", 1, c->head_dim, 0, kn);
        }
        LADD("attention_norm.weight", 1, d, 0, an);
        LADD("feed_forward.w1.weight", 2, hid, d, w1);
        LADD("feed_forward.w2.weight", 2, d, hid, w2);
        LADD("feed_forward.w3.weight", 2, hid, d, w3);
        LADD("ffn_norm.weight", 1, d, 0, fn);
#undef LADD
    }
    ADD("norm.weight", 1, d, 0, off);
    off = ROUND(off + (size_t)d);
    if (!c->tie_embeddings) {
        ADD("output.weight", 2, V, d, off);
        off = ROUND(off + (size_t)(V * d));
    }
#undef ADD
#undef ROUND
    *total = off;
    return n;
}

static size_t model_saved_bytes(const hp_model_config_t *c, int B, int T) {
    size_t N = (size_t)B * T;
    return hp_arena_round(sizeof(model_saved_t)) + hp_arena_round(sizeof(float *) * (size_t)c->n_layers) +
           2 * hp_arena_round(sizeof(int32_t) * N) + (size_t)(c->n_layers + 2) * hp_arena_round(sizeof(float) * N * c->dim) +
           hp_arena_round(sizeof(float) * N * c->vocab_size) + hp_arena_round(sizeof(double) * N) + hp_arena_round(sizeof(float) * N);
}

void hp_model_destroy(hp_model_t m) {
    if (!m) return;
    hp_act_free(&m->act);
    hp_free_aligned(m->param_data);
    hp_free_aligned(m->grad_data);
    hp_free_aligned(m->workspace);
    free(m->cos_t);
    free(m->sin_t);
    free(m->params);
    free(m->param_off);
    free(m->layers);
    free(m->ac_block_bytes);
    free(m);
}

hp_status_t hp_model_create(const hp_model_config_t *cfg_in, int max_batch, int max_seq_len, hp_model_t *out) {
    if (!cfg_in || !out) return hp_error(HP_ERR_INVALID_ARG, "hp_model_create: cfg and out must be non-NULL");
    *out = NULL;
    hp_model_config_t cfg = *cfg_in;
    HP_TRY(hp_model_config_validate(&cfg));
    if (max_batch <= 0 || max_seq_len <= 0)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_create: max_batch %d and max_seq_len %d must be > 0",
                        max_batch, max_seq_len);
    if (max_seq_len > cfg.max_seq_len)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_create: max_seq_len %d exceeds the model's "
                        "max_seq_len %d (%s/%s)", max_seq_len, cfg.max_seq_len, cfg.name, cfg.flavor);
    hp_model_t m = hp_calloc(1, sizeof(*m));
    if (!m) return HP_ERR_OOM;
    m->cfg = cfg;
    m->max_batch = max_batch;
    m->max_seq_len = max_seq_len;
    hp_status_t st = HP_OK;
    const hp_model_config_t *c = &m->cfg;
    const int d = c->dim, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, hid = c->hidden_dim;

    // 1. sizes: parameter table
    size_t total = 0;
    int np = build_specs(c, NULL, &total);
    pspec_t *sp = hp_calloc((size_t)np, sizeof(pspec_t));
    m->params = hp_calloc((size_t)np, sizeof(hp_param_t));
    m->param_off = hp_calloc((size_t)np, sizeof(size_t));
    m->layers = hp_calloc((size_t)c->n_layers, sizeof(layer_mods_t));
    m->cos_t = hp_malloc(sizeof(float) * (size_t)max_seq_len * (hd / 2));
    m->sin_t = hp_malloc(sizeof(float) * (size_t)max_seq_len * (hd / 2));
    if (!sp || !m->params || !m->param_off || !m->layers || !m->cos_t || !m->sin_t) { st = HP_ERR_OOM; goto fail; }
    build_specs(c, sp, &total);
    m->n_params = np;
    m->param_floats = total;
    m->param_data = hp_aligned_alloc(sizeof(float) * total);
    m->grad_data = hp_aligned_alloc(sizeof(float) * total);
    if (!m->param_data || !m->grad_data) {
        st = hp_error(HP_ERR_OOM, "hp_model_create: %s/%s needs %.2f GiB for parameters and as much for "
                      "gradients; hint: this flavor is for counting and planning, shard it", c->name, c->flavor,
                      (double)total * 4 / (1 << 30));
        goto fail;
    }
    memset(m->param_data, 0, sizeof(float) * total);
    memset(m->grad_data, 0, sizeof(float) * total);
    for (int i = 0; i < np; i++) m->param_off[i] = sp[i].offset;
    for (int i = 0; i < np; i++)
        param_desc(&m->params[i], sp[i].name, m->param_data + sp[i].offset, m->grad_data + sp[i].offset,
                   sp[i].ndim, sp[i].d0, sp[i].d1);
    free(sp);
    sp = NULL;

    // 2. RoPE tables
    hp_rope_scaling_t sc = {c->rope_scaling, c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                            c->rope_original_max_pos};
    hp_rope_table(m->cos_t, m->sin_t, max_seq_len, hd, c->rope_theta, &sc);

    // 3. modules, ids in creation order; the model's own saved state takes the last id
    int id = 0;
    hp_param_t *P = m->params;
    int pi = 0;
    hp_embedding_module_init(&m->embedding, &m->embedding_i, "tok_embeddings", &P[pi++], c->vocab_size, d);
    m->embedding.id = id++;
    char nm[HP_PARAM_NAME_MAX];
    const hp_rope_style_t style = strcmp(c->name, "qwen3") == 0 ? HP_ROPE_HALF : HP_ROPE_INTERLEAVED;
    for (int l = 0; l < c->n_layers; l++) {
        layer_mods_t *L = &m->layers[l];
        hp_param_t *wq = &P[pi], *wk = &P[pi + 1], *wv = &P[pi + 2], *wo = &P[pi + 3];
        pi += 4;
        hp_param_t *qn = NULL, *kn = NULL;
        if (c->qk_norm) { qn = &P[pi]; kn = &P[pi + 1]; pi += 2; }
        hp_param_t *an = &P[pi], *w1 = &P[pi + 1], *w2 = &P[pi + 2], *w3 = &P[pi + 3], *fn = &P[pi + 4];
        pi += 5;
        snprintf(nm, sizeof(nm), "layers.%d.attention_norm", l);
        hp_rmsnorm_module_init(&L->attention_norm, &L->attention_norm_i, nm, an, d, c->norm_eps);
        L->attention_norm_i.accumulate_input_grad = 1;
        hp_param_t *qkv[3] = {wq, wk, wv};
        snprintf(nm, sizeof(nm), "layers.%d.attention.wqkv", l);
        hp_linear_module_init(&L->wqkv, &L->wqkv_i, nm, qkv, 3, NULL, d, (H + 2 * KV) * hd);
        snprintf(nm, sizeof(nm), "layers.%d.attention.wo", l);
        hp_linear_module_init(&L->wo, &L->wo_i, nm, &wo, 1, NULL, H * hd, d);
        L->wo_i.accumulate_output = 1;
        attn_impl_t *A = &L->attention_i;
        A->dim = d; A->n_heads = H; A->n_kv = KV; A->hd = hd;
        A->qd = H * hd; A->kd = KV * hd; A->qkvd = (H + 2 * KV) * hd;
        A->qk_norm = c->qk_norm; A->eps = c->norm_eps; A->style = style;
        A->cos_t = m->cos_t; A->sin_t = m->sin_t;
        A->wqkv = &L->wqkv; A->wo = &L->wo;
        snprintf(nm, sizeof(nm), "layers.%d.attention", l);
        hp_module_base_init(&L->attention, &attn_ops, nm, A);
        L->attention.children[L->attention.n_children++] = &L->wqkv;
        L->attention.children[L->attention.n_children++] = &L->wo;
        if (c->qk_norm) {
            A->qn_w = qn->value.local.data; A->qn_dw = qn->grad.local.data;
            A->kn_w = kn->value.local.data; A->kn_dw = kn->grad.local.data;
            L->attention.params[L->attention.n_params++] = qn;
            L->attention.params[L->attention.n_params++] = kn;
        }
        snprintf(nm, sizeof(nm), "layers.%d.ffn_norm", l);
        hp_rmsnorm_module_init(&L->ffn_norm, &L->ffn_norm_i, nm, fn, d, c->norm_eps);
        L->ffn_norm_i.accumulate_input_grad = 1;
        hp_param_t *w13[2] = {w1, w3};
        snprintf(nm, sizeof(nm), "layers.%d.feed_forward.w13", l);
        hp_linear_module_init(&L->w13, &L->w13_i, nm, w13, 2, NULL, d, 2 * hid);
        snprintf(nm, sizeof(nm), "layers.%d.feed_forward.w2", l);
        hp_linear_module_init(&L->w2, &L->w2_i, nm, &w2, 1, NULL, hid, d);
        L->w2_i.accumulate_output = 1;
        L->ffn_i.dim = d; L->ffn_i.hidden = hid; L->ffn_i.w13 = &L->w13; L->ffn_i.w2 = &L->w2;
        snprintf(nm, sizeof(nm), "layers.%d.feed_forward", l);
        hp_module_base_init(&L->feed_forward, &ffn_ops, nm, &L->ffn_i);
        L->feed_forward.children[L->feed_forward.n_children++] = &L->w13;
        L->feed_forward.children[L->feed_forward.n_children++] = &L->w2;
        L->block_i.dim = d;
        L->block_i.attention_norm = &L->attention_norm;
        L->block_i.attention = &L->attention;
        L->block_i.ffn_norm = &L->ffn_norm;
        L->block_i.feed_forward = &L->feed_forward;
        snprintf(nm, sizeof(nm), "layers.%d", l);
        hp_module_base_init(&L->block, &block_ops, nm, &L->block_i);
        L->block.children[L->block.n_children++] = &L->attention_norm;
        L->block.children[L->block.n_children++] = &L->attention;
        L->block.children[L->block.n_children++] = &L->ffn_norm;
        L->block.children[L->block.n_children++] = &L->feed_forward;
        hp_module_t *all[MODS_PER_LAYER] = {&L->block, &L->attention_norm, &L->attention, &L->wqkv, &L->wo,
                                            &L->ffn_norm, &L->feed_forward, &L->w13, &L->w2};
        for (int k = 0; k < MODS_PER_LAYER; k++) all[k]->id = id++;
    }
    hp_rmsnorm_module_init(&m->norm, &m->norm_i, "norm", &P[pi++], d, c->norm_eps);
    m->norm.id = id++;
    hp_param_t *outw = c->tie_embeddings ? &P[0] : &P[pi++];
    hp_linear_module_init(&m->output, &m->output_i, "output", &outw, 1, NULL, d, c->vocab_size);
    m->output_i.prof_op = HP_NN_OP_OUTPUT_FWD;
    m->output.id = id++;
    HP_ASSERT(pi == np);
    m->n_modules = id + 1;   // + the model's own saved state

    // 4. activation arena and workspace for (max_batch, max_seq_len)
    const int B = max_batch, T = max_seq_len;
    size_t act_bytes = model_saved_bytes(c, B, T) + m->embedding.ops->act_bytes(&m->embedding, B, T) +
                       m->norm.ops->act_bytes(&m->norm, B, T) + m->output.ops->act_bytes(&m->output, B, T);
    size_t scratch = 0;
    m->ac_base_bytes = act_bytes;
    m->ac_block_bytes = calloc((size_t)c->n_layers, sizeof(size_t));
    if (!m->ac_block_bytes) { st = HP_ERR_OOM; goto fail; }
    for (int l = 0; l < c->n_layers; l++) {
        m->ac_block_bytes[l] = block_ops.act_bytes(&m->layers[l].block, B, T);
        act_bytes += m->ac_block_bytes[l];
        size_t s = block_ops.grad_scratch_floats(&m->layers[l].block, B, T);
        if (s > scratch) scratch = s;
    }
    st = hp_act_init(&m->act, m->n_modules, act_bytes);
    if (st != HP_OK) goto fail;
    const size_t N = (size_t)B * T;
    m->scratch_floats = scratch;
    m->workspace_floats = N * c->vocab_size + 2 * N * d + scratch;
    m->workspace = hp_aligned_alloc(sizeof(float) * m->workspace_floats);
    if (!m->workspace) { st = HP_ERR_OOM; goto fail; }
    memset(m->workspace, 0, sizeof(float) * m->workspace_floats);
    m->dlogits = m->workspace;
    m->gbuf[0] = m->dlogits + N * c->vocab_size;
    m->gbuf[1] = m->gbuf[0] + N * d;
    m->scratch = m->gbuf[1] + N * d;
    for (int i = 0; i < HP_NN_OP_COUNT; i++) m->prof_names[i] = hp_nn_op_names[i];
    *out = m;
    return HP_OK;
fail:
    free(sp);
    hp_model_destroy(m);
    return st;
}

void hp_model_memory(hp_model_t m, size_t *param_bytes, size_t *grad_bytes, size_t *act_bytes, size_t *work_bytes) {
    const size_t own = m->storage_released ? 0 : sizeof(float) * m->param_floats;
    if (param_bytes) *param_bytes = own;
    if (grad_bytes) *grad_bytes = own;
    if (act_bytes) *act_bytes = m->act.arena.capacity;
    if (work_bytes) *work_bytes = sizeof(float) * m->workspace_floats;
}

/* TorchTitan's layer-level rule: with every_k = k, block l is checkpointed when (l + 1) % k == 0. */
static int ac_checkpointed(int every_k, int l) { return every_k > 0 && (l + 1) % every_k == 0; }
static int ac_block(const hp_model_t m, int l) { return ac_checkpointed(m->ac_every, l); }

hp_status_t hp_model_set_activation_checkpoint(hp_model_t m, int every_k) {
    if (every_k < 0)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_set_activation_checkpoint: every_k = %d, expected 0 (off), "
                        "1 (every block) or k > 1 (every k-th block)", every_k);
    if (m->have_forward)
        return hp_error(HP_ERR_STATE, "hp_model_set_activation_checkpoint: a forward is waiting for its "
                        "backward; hint: change checkpointing between steps");
    const int L = m->cfg.n_layers;
    size_t bytes = m->ac_base_bytes, region = 0;
    for (int l = 0; l < L; l++) {
        if (!ac_checkpointed(every_k, l)) bytes += m->ac_block_bytes[l];
        else if (m->ac_block_bytes[l] > region) region = m->ac_block_bytes[l];
    }
    bytes += region;   // one checkpointed block's state at a time (forward, then recompute)
    hp_act_t fresh;
    HP_TRY(hp_act_init(&fresh, m->n_modules, bytes));
    fresh.prof = m->act.prof;
    hp_act_free(&m->act);
    m->act = fresh;
    m->ac_every = every_k;
    m->logits = NULL;   // lived in the old arena
    return HP_OK;
}

int hp_model_activation_checkpoint(hp_model_t m) { return m->ac_every; }

hp_status_t hp_model_init_weights(hp_model_t m, uint64_t seed) {
    const hp_model_config_t *c = &m->cfg;
    if (m->storage_released)
        return hp_error(HP_ERR_STATE, "hp_model_init_weights: the parameter storage was released to an "
                        "external owner (FSDP); initialise before fully_shard");
    for (int i = 0; i < m->n_params; i++) {
        hp_param_t *p = &m->params[i];
        const char *n = p->name;
        hp_rng_spec_t spec = {HP_RNG_TRUNC_NORMAL, 0.0f, 0.02f, -2.0f, 2.0f};   // torch defaults a=-2, b=2
        int layer = -1;
        if (strncmp(n, "layers.", 7) == 0) layer = atoi(n + 7);
        const float out_std = 1.0f / sqrtf((float)c->dim);
        if (strstr(n, "norm.weight")) {
            float *w = p->value.local.data;
            for (int64_t k = 0; k < p->value.local.shape[0]; k++) w[k] = 1.0f;
            continue;
        } else if (strcmp(n, "tok_embeddings.weight") == 0) {
            if (c->tie_embeddings) {   // the shared tensor is initialised as the output projection
                spec.p1 = out_std; spec.a = -3.0f * out_std; spec.b = 3.0f * out_std;
            } else {
                spec.dist = HP_RNG_NORMAL; spec.p0 = 0.0f; spec.p1 = 1.0f;
            }
        } else if (strcmp(n, "output.weight") == 0) {
            spec.p1 = out_std; spec.a = -3.0f * out_std; spec.b = 3.0f * out_std;
        } else if (strstr(n, "attention.wo.") || strstr(n, "feed_forward.w2.") || strstr(n, "feed_forward.w3.")) {
            spec.p1 = 0.02f / sqrtf(2.0f * (float)(layer + 1));   // depth init
        }
        if (p->value.mesh) {   // a shard (tensor parallel): drawn at its global indices
            int64_t goff[HP_MAX_DIMS];
            HP_TRY(hp_dtensor_global_offset(&p->value, goff));
            HP_TRY(hp_rng_fill(&p->value.local, hp_rng_key(seed, n), &spec, p->value.global_shape, goff));
            continue;
        }
        HP_TRY(hp_rng_fill(&p->value.local, hp_rng_key(seed, n), &spec, NULL, NULL));
    }
    return HP_OK;
}

/* ---- units and hooks (data-parallel wrappers) ------------------------------------------ */

int hp_model_num_units(hp_model_t m) { return m->cfg.n_layers + 2; }

void hp_model_unit_params(hp_model_t m, int unit, int *first, int *count) {
    HP_ASSERT_MSG(unit >= 0 && unit < m->cfg.n_layers + 2, "hp_model_unit_params: unit %d outside [0, %d)",
                  unit, m->cfg.n_layers + 2);
    const int per_layer = m->cfg.qk_norm ? 11 : 9;
    int f, n;
    if (unit == 0) { f = 0; n = 1; }
    else if (unit <= m->cfg.n_layers) { f = 1 + (unit - 1) * per_layer; n = per_layer; }
    else { f = 1 + m->cfg.n_layers * per_layer; n = m->n_params - f; }
    if (first) *first = f;
    if (count) *count = n;
}

size_t hp_model_param_offset(hp_model_t m, int i) {
    HP_ASSERT(i >= 0 && i < m->n_params);
    return m->param_off[i];
}

void hp_model_unit_span(hp_model_t m, int unit, size_t *offset, size_t *floats) {
    int f, n;
    hp_model_unit_params(m, unit, &f, &n);
    size_t end = f + n < m->n_params ? m->param_off[f + n] : m->param_floats;
    if (offset) *offset = m->param_off[f];
    if (floats) *floats = end - m->param_off[f];
}

void hp_model_set_hooks(hp_model_t m, const hp_model_hooks_t *hooks, void *ctx) {
    if (hooks) m->hooks = *hooks;
    else memset(&m->hooks, 0, sizeof(m->hooks));
    m->hooks_ctx = ctx;
}

void hp_model_bind_unit(hp_model_t m, int unit) {
    const hp_model_config_t *c = &m->cfg;
    hp_param_t *P = m->params;
#define BIND(impl, p) do { (impl).weight = (p)->value.local.data; (impl).dweight = (p)->grad.local.data; } while (0)
    if (unit == 0) {
        BIND(m->embedding_i, &P[0]);
    } else if (unit <= c->n_layers) {
        layer_mods_t *L = &m->layers[unit - 1];
        int f;
        hp_model_unit_params(m, unit, &f, NULL);
        // list order: wq wk wv wo [q_norm k_norm] attention_norm w1 w2 w3 ffn_norm
        BIND(L->wqkv_i, &P[f]);
        BIND(L->wo_i, &P[f + 3]);
        int k = f + 4;
        if (c->qk_norm) {
            L->attention_i.qn_w = P[k].value.local.data; L->attention_i.qn_dw = P[k].grad.local.data;
            L->attention_i.kn_w = P[k + 1].value.local.data; L->attention_i.kn_dw = P[k + 1].grad.local.data;
            k += 2;
        }
        BIND(L->attention_norm_i, &P[k]);
        BIND(L->w13_i, &P[k + 1]);
        BIND(L->w2_i, &P[k + 2]);
        BIND(L->ffn_norm_i, &P[k + 4]);
    } else {
        int f;
        hp_model_unit_params(m, unit, &f, NULL);
        BIND(m->norm_i, &P[f]);
        BIND(m->output_i, c->tie_embeddings ? &P[0] : &P[f + 1]);
    }
#undef BIND
}

void hp_model_release_storage(hp_model_t m) {
    hp_free_aligned(m->param_data);
    hp_free_aligned(m->grad_data);
    m->param_data = m->grad_data = NULL;
    m->storage_released = 1;
    for (int i = 0; i < m->n_params; i++) {
        m->params[i].value.local.data = NULL;
        m->params[i].grad.local.data = NULL;
    }
    for (int u = 0; u < m->cfg.n_layers + 2; u++) hp_model_bind_unit(m, u);
}

/* Calls a hook (when set) and re-reads the unit's weight pointers, which the hook may have
 * re-pointed (FSDP swaps in gathered buffers). */
static hp_status_t unit_hook(hp_model_t m, hp_status_t (*fn)(void *, int), int unit) {
    if (!fn) return HP_OK;
    HP_TRY(fn(m->hooks_ctx, unit));
    hp_model_bind_unit(m, unit);
    return HP_OK;
}

hp_status_t hp_model_zero_grad(hp_model_t m) {
    if (m->storage_released) return HP_OK;   // the external owner zeroes its gradients
    memset(m->grad_data, 0, sizeof(float) * m->param_floats);
    return HP_OK;
}

hp_status_t hp_model_forward(hp_model_t m, const int32_t *tokens, const int32_t *targets, int B, int T,
                             float loss_divisor, float *loss) {
    const hp_model_config_t *c = &m->cfg;
    if (!tokens) return hp_error(HP_ERR_INVALID_ARG, "hp_model_forward: tokens is NULL");
    if (B <= 0 || B > m->max_batch || T <= 0 || T > m->max_seq_len)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_forward: (B, T) = (%d, %d) outside the created "
                        "(max_batch %d, max_seq_len %d); hint: create the model with larger limits",
                        B, T, m->max_batch, m->max_seq_len);
    if (targets && !(loss_divisor > 0.0f))
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_forward: loss_divisor %g must be > 0 (the global "
                        "number of valid target tokens)", loss_divisor);
    const int N = B * T, d = c->dim, V = c->vocab_size;
    // tensor parallel: residual-stream rows per rank (sequence parallel) and logits columns
    const int ks = m->seq_shard > 1 ? m->seq_shard : 1, Nr = N / ks, Vc = m->logits_cols > 0 ? m->logits_cols : V;
    if (T % ks != 0)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_forward: sequence length %d is not divisible by the "
                        "sequence-parallel degree %d; hint: use a multiple of %d", T, ks, ks);
    if (targets)
        for (int n = 0; n < N; n++)
            if (targets[n] != HP_IGNORE_INDEX && (targets[n] < 0 || targets[n] >= V))
                return hp_error(HP_ERR_INVALID_ARG, "hp_model_forward: target %d at position %d outside "
                                "[0, %d) and not the ignore index -100", targets[n], n, V);
    hp_act_t *act = &m->act;
    hp_act_reset(act);
    act->B = B;
    act->T = T / ks;
    memset(m->prof, 0, sizeof(m->prof));
    act->prof = m->prof;
    m->have_forward = 0;
    m->logits = NULL;
    model_saved_t *s = hp_act_alloc(act, sizeof(*s));
    act->slots[m->n_modules - 1] = s;
    s->xs = hp_act_alloc(act, sizeof(float *) * (size_t)c->n_layers);
    s->tokens = hp_act_alloc(act, sizeof(int32_t) * (size_t)N);
    s->targets = hp_act_alloc(act, sizeof(int32_t) * (size_t)N);
    memcpy(s->tokens, tokens, sizeof(int32_t) * (size_t)N);
    if (targets) memcpy(s->targets, targets, sizeof(int32_t) * (size_t)N);
    s->x0 = hp_act_alloc(act, sizeof(float) * (size_t)N * d);
    hp_tensor_t t_tok, t_x, t_y;
    int64_t tshape[2] = {B, T};
    memset(&t_tok, 0, sizeof(t_tok));
    t_tok.dtype = HP_I32; t_tok.ndim = 2; t_tok.shape[0] = tshape[0]; t_tok.shape[1] = tshape[1];
    t_tok.stride[0] = T; t_tok.stride[1] = 1; t_tok.data = s->tokens;
    tensor2(&t_x, s->x0, Nr, d);
    const int root = c->n_layers + 1;
    HP_TRY(unit_hook(m, m->hooks.pre_forward, 0));
    HP_TRY(hp_module_forward(&m->embedding, act, &t_tok, &t_x));
    HP_TRY(unit_hook(m, m->hooks.post_forward, 0));
    float *x = s->x0;
    for (int l = 0; l < c->n_layers; l++) {
        s->xs[l] = hp_act_alloc(act, sizeof(float) * (size_t)N * d);
        tensor2(&t_x, x, Nr, d);
        tensor2(&t_y, s->xs[l], Nr, d);
        HP_TRY(unit_hook(m, m->hooks.pre_forward, l + 1));
        // checkpointed block: its saved state lives in a region rewound right after; backward
        // recomputes it from the block input (x0 or the previous block's output)
        const size_t mark = hp_arena_mark(&act->arena);
        HP_TRY(hp_module_forward(&m->layers[l].block, act, &t_x, &t_y));
        if (ac_block(m, l)) hp_arena_reset_to(&act->arena, mark);
        HP_TRY(unit_hook(m, m->hooks.post_forward, l + 1));
        x = s->xs[l];
    }
    s->hf = hp_act_alloc(act, sizeof(float) * (size_t)N * d);
    tensor2(&t_x, x, Nr, d);
    tensor2(&t_y, s->hf, Nr, d);
    HP_TRY(unit_hook(m, m->hooks.pre_forward, root));
    HP_TRY(hp_module_forward(&m->norm, act, &t_x, &t_y));
    s->logits = hp_act_alloc(act, sizeof(float) * (size_t)N * V);
    tensor2(&t_x, s->hf, Nr, d);
    tensor2(&t_y, s->logits, N, Vc);
    HP_TRY(hp_module_forward(&m->output, act, &t_x, &t_y));
    HP_TRY(unit_hook(m, m->hooks.post_forward, root));
    m->B = B;
    m->T = T;
    m->logits = s->logits;
    if (!targets) {
        if (loss) *loss = 0.0f;
        m->n_valid = 0;
        m->loss_sum = 0.0;
        return HP_OK;
    }
    s->losses = hp_act_alloc(act, sizeof(double) * (size_t)N);
    s->lse = hp_act_alloc(act, sizeof(float) * (size_t)N);
    double t0 = omp_get_wtime();
    double sum;
    if (m->loss_fn.forward)
        HP_TRY(m->loss_fn.forward(m->loss_ctx, &sum, s->losses, s->lse, s->logits, s->targets, N, Vc, &m->n_valid));
    else
        sum = hp_cross_entropy_forward(s->losses, s->lse, s->logits, s->targets, N, V, &m->n_valid);
    m->prof[HP_NN_OP_CROSS_ENTROPY] += omp_get_wtime() - t0;
    m->loss_divisor = loss_divisor;
    m->loss_sum = sum;
    m->have_forward = 1;
    float l = (float)(sum / (double)loss_divisor);
    if (loss) *loss = l;
    if (!isfinite(l))
        return hp_error(HP_ERR_NUMERIC, "hp_model_forward: loss is %g (sum %g over %lld valid targets); "
                        "hint: lower the learning rate or check the inputs", l, sum, (long long)m->n_valid);
    return HP_OK;
}

hp_status_t hp_model_backward(hp_model_t m) {
    if (!m->have_forward)
        return hp_error(HP_ERR_STATE, "hp_model_backward: no forward with targets to differentiate (call "
                        "hp_model_forward with targets first; each forward allows one backward)");
    const hp_model_config_t *c = &m->cfg;
    hp_act_t *act = &m->act;
    model_saved_t *s = act->slots[m->n_modules - 1];
    const int B = m->B, T = m->T, N = B * T, d = c->dim, V = c->vocab_size;
    const int Nr = N / (m->seq_shard > 1 ? m->seq_shard : 1), Vc = m->logits_cols > 0 ? m->logits_cols : V;
    act->grad_scratch = m->scratch;
    act->grad_scratch_floats = m->scratch_floats;
    double t0 = omp_get_wtime();
    if (m->loss_fn.backward)
        HP_TRY(m->loss_fn.backward(m->loss_ctx, m->dlogits, s->logits, s->lse, s->targets, 1.0f / m->loss_divisor, N, Vc));
    else
        hp_cross_entropy_backward(m->dlogits, s->logits, s->lse, s->targets, 1.0f / m->loss_divisor, N, V);
    m->prof[HP_NN_OP_CROSS_ENTROPY] += omp_get_wtime() - t0;
    hp_tensor_t t_dl, t_a, t_b;
    tensor2(&t_dl, m->dlogits, N, Vc);
    tensor2(&t_a, m->gbuf[0], Nr, d);
    const int root = c->n_layers + 1;
    HP_TRY(unit_hook(m, m->hooks.pre_backward, root));
    HP_TRY(hp_module_backward_input(&m->output, act, &t_dl, &t_a));
    HP_TRY(hp_module_backward_weight(&m->output, act));
    tensor2(&t_b, m->gbuf[1], Nr, d);
    HP_TRY(hp_module_backward_input(&m->norm, act, &t_a, &t_b));
    HP_TRY(hp_module_backward_weight(&m->norm, act));
    HP_TRY(unit_hook(m, m->hooks.post_backward, root));
    int cur = 1;   // gbuf[cur] holds d(layer output)
    for (int l = c->n_layers - 1; l >= 0; l--) {
        tensor2(&t_a, m->gbuf[cur], Nr, d);
        tensor2(&t_b, m->gbuf[1 - cur], Nr, d);
        HP_TRY(unit_hook(m, m->hooks.pre_backward, l + 1));
        const size_t mark = hp_arena_mark(&act->arena);
        if (ac_block(m, l)) {
            /* recompute: the same block forward (same kernels and threads, so bitwise the same
             * saved state and the same TP collectives in the same order), after the unit's
             * pre_backward hook (FSDP has gathered the block's params) and without the
             * forward hooks; the output rewrites s->xs[l] with the same values */
            hp_tensor_t t_x, t_y;
            tensor2(&t_x, l == 0 ? s->x0 : s->xs[l - 1], Nr, d);
            tensor2(&t_y, s->xs[l], Nr, d);
            HP_TRY(hp_module_forward(&m->layers[l].block, act, &t_x, &t_y));
        }
        HP_TRY(hp_module_backward_input(&m->layers[l].block, act, &t_a, &t_b));
        HP_TRY(hp_module_backward_weight(&m->layers[l].block, act));
        if (ac_block(m, l)) hp_arena_reset_to(&act->arena, mark);
        HP_TRY(unit_hook(m, m->hooks.post_backward, l + 1));
        cur = 1 - cur;
    }
    tensor2(&t_a, m->gbuf[cur], Nr, d);
    HP_TRY(unit_hook(m, m->hooks.pre_backward, 0));
    HP_TRY(hp_module_backward_input(&m->embedding, act, &t_a, NULL));
    HP_TRY(hp_module_backward_weight(&m->embedding, act));
    HP_TRY(unit_hook(m, m->hooks.post_backward, 0));
    m->have_forward = 0;
    return HP_OK;
}

int hp_model_profile(hp_model_t m, const char ***names, const double **seconds) {
    memcpy(m->prof_seconds, m->prof, sizeof(m->prof));
    if (names) *names = m->prof_names;
    if (seconds) *seconds = m->prof_seconds;
    return HP_NN_OP_COUNT;
}

/* ---- tensor parallel support (src/parallel/tp.c; declared in nn-impl.h) ----------------- */

int hp_model_modules(hp_model_t m, hp_module_t **out, int cap) {
    int n = 0;
#define PUT(x) do { if (out && n < cap) out[n] = (x); n++; } while (0)
    PUT(&m->embedding);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        layer_mods_t *L = &m->layers[l];
        PUT(&L->block); PUT(&L->attention_norm); PUT(&L->attention); PUT(&L->wqkv); PUT(&L->wo);
        PUT(&L->ffn_norm); PUT(&L->feed_forward); PUT(&L->w13); PUT(&L->w2);
    }
    PUT(&m->norm);
    PUT(&m->output);
#undef PUT
    return n;
}

hp_status_t hp_model_tp_localize(hp_model_t m, int tp, int ffn_tp) {
    const hp_model_config_t *c = &m->cfg;
    if (tp < 1 || ffn_tp < 1)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_tp_localize: degrees %d, %d, expected >= 1", tp, ffn_tp);
    if (c->n_heads % tp != 0 || c->n_kv_heads % tp != 0)
        return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: model '%s/%s' has n_heads %d and n_kv_heads %d; "
                        "both must be divisible by the TP degree %d; hint: choose a TP degree dividing %d",
                        c->name, c->flavor, c->n_heads, c->n_kv_heads, tp, c->n_kv_heads);
    if (c->hidden_dim % ffn_tp != 0)
        return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: model '%s/%s' hidden_dim %d is not divisible by "
                        "the TP degree %d", c->name, c->flavor, c->hidden_dim, ffn_tp);
    for (int l = 0; l < c->n_layers; l++) {
        attn_impl_t *A = &m->layers[l].attention_i;
        A->n_heads = c->n_heads / tp;
        A->n_kv = c->n_kv_heads / tp;
        A->qd = A->n_heads * A->hd;
        A->kd = A->n_kv * A->hd;
        A->qkvd = A->qd + 2 * A->kd;
        m->layers[l].ffn_i.hidden = c->hidden_dim / ffn_tp;
    }
    return HP_OK;
}

void hp_model_tp_set(hp_model_t m, int seq_shard, int logits_cols, const hp_model_loss_fn_t *loss_fn,
                     void *loss_ctx) {
    m->seq_shard = seq_shard;
    m->logits_cols = logits_cols;
    if (loss_fn) m->loss_fn = *loss_fn;
    else memset(&m->loss_fn, 0, sizeof(m->loss_fn));
    m->loss_ctx = loss_ctx;
}

int hp_model_max_tokens(hp_model_t m) { return m->max_batch * m->max_seq_len; }

void hp_model_tp_adopt_storage(hp_model_t m, float *param_data, float *grad_data, size_t floats,
                               const size_t *param_off) {
    for (int i = 0; i < m->n_params; i++) m->param_off[i] = param_off[i];
    hp_free_aligned(m->param_data);
    hp_free_aligned(m->grad_data);
    m->param_data = param_data;
    m->grad_data = grad_data;
    m->param_floats = floats;
    for (int u = 0; u < m->cfg.n_layers + 2; u++) hp_model_bind_unit(m, u);
}

/* ---- inference: KV cache, prefill and decode -------------------------------------------- */

enum { HP_KV_CHUNK = 64 };   // rows per prefill chunk: bounds the per-row buffers

struct hp_model_kv_cache {
    hp_model_t m;
    int max_len, pos, chunk, n_threads;
    float *k, *v;     // per layer l at l * max_len * kd: (max_len, KV, hd) keys after qk-norm + RoPE, values
    float *x, *xn;    // (chunk, dim) residual stream, normed input
    float *qkv;       // (chunk, qkvd) wq|wk|wv output
    float *q;         // (chunk, qd) queries after qk-norm + RoPE
    float *o;         // (chunk, qd) attention output
    float *h13;       // (chunk, 2 * hidden) w1|w3 output
    float *a;         // (chunk, hidden) silu(h1) * h3
    float *rstd;      // (chunk, n_heads) RMSNorm scratch
    float *hf;        // (dim) final norm of the last row
    float *logits;    // (V) logits of the last row
    float *scores;    // (n_threads, max_len) one attention score row per thread
    float *mem;       // the one allocation all of the above point into
};

/* The cache computes with the full weights of one rank: a tensor-parallel model holds head
 * and vocab shards, an FSDP model gathers its weights only inside hp_model_forward. */
static hp_status_t kv_check_model(hp_model_t m, const char *who) {
    const hp_model_config_t *c = &m->cfg;
    if (m->storage_released || m->hooks.pre_forward || m->hooks.post_forward)
        return hp_error(HP_ERR_STATE, "%s: model '%s/%s' is FSDP-wrapped (its parameters are shards, gathered "
                        "only inside hp_model_forward); expected an unwrapped single-rank model; hint: save the "
                        "full weights (hp_model_save_weights) and load them with hp_model_load_weights for "
                        "inference", who, c->name, c->flavor);
    int tp = m->seq_shard > 1 || m->logits_cols > 0;
    for (int l = 0; l < c->n_layers && !tp; l++)
        tp = m->layers[l].attention_i.n_heads != c->n_heads || m->layers[l].ffn_i.hidden != c->hidden_dim;
    for (int i = 0; i < m->n_params && !tp; i++) tp = m->params[i].value.mesh != NULL;
    if (tp)
        return hp_error(HP_ERR_STATE, "%s: model '%s/%s' is tensor-parallel (its heads, FFN and vocab are "
                        "sharded across ranks); expected an unwrapped single-rank model; hint: save the full "
                        "weights (hp_model_save_weights) and load them with hp_model_load_weights for inference",
                        who, c->name, c->flavor);
    return HP_OK;
}

hp_status_t hp_model_kv_cache_create(hp_model_t m, int max_len, hp_model_kv_cache_t *out) {
    if (!m || !out) return hp_error(HP_ERR_INVALID_ARG, "hp_model_kv_cache_create: model and out must be non-NULL");
    *out = NULL;
    HP_TRY(kv_check_model(m, "hp_model_kv_cache_create"));
    if (max_len <= 0 || max_len > m->max_seq_len)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_kv_cache_create: max_len %d, expected 1 .. %d (the "
                        "max_seq_len the model was created with: its RoPE table); hint: create or load the "
                        "model with a larger max_seq_len", max_len, m->max_seq_len);
    const hp_model_config_t *c = &m->cfg;
    const size_t d = c->dim, qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim,
                 hid = c->hidden_dim, V = c->vocab_size, L = c->n_layers;
    const int chunk = max_len < HP_KV_CHUNK ? max_len : HP_KV_CHUNK, n_threads = omp_get_max_threads();
    const size_t C = (size_t)chunk;
    // sizes first (16-float aligned), then one allocation
    const size_t sizes[] = {L * max_len * kd, L * max_len * kd, C * d, C * d, C * (qd + 2 * kd), C * qd, C * qd,
                            C * 2 * hid, C * hid, C * c->n_heads, d, V, (size_t)n_threads * max_len};
    enum { NB = sizeof(sizes) / sizeof(sizes[0]) };
    size_t off[NB], total = 0;
    for (int i = 0; i < NB; i++) { off[i] = total; total += (sizes[i] + 15) & ~(size_t)15; }
    hp_model_kv_cache_t kc = hp_calloc(1, sizeof(*kc));
    if (!kc) return HP_ERR_OOM;
    kc->mem = hp_aligned_alloc(sizeof(float) * total);
    if (!kc->mem) {
        free(kc);
        return hp_error(HP_ERR_OOM, "hp_model_kv_cache_create: %.2f MiB for max_len %d; hint: use a smaller "
                        "max_len", (double)total * 4 / (1 << 20), max_len);
    }
    memset(kc->mem, 0, sizeof(float) * total);
    float **ptr[NB] = {&kc->k, &kc->v, &kc->x, &kc->xn, &kc->qkv, &kc->q, &kc->o, &kc->h13, &kc->a, &kc->rstd,
                       &kc->hf, &kc->logits, &kc->scores};
    for (int i = 0; i < NB; i++) *ptr[i] = kc->mem + off[i];
    kc->m = m;
    kc->max_len = max_len;
    kc->chunk = chunk;
    kc->n_threads = n_threads;
    *out = kc;
    return HP_OK;
}

void hp_model_kv_cache_destroy(hp_model_kv_cache_t c) {
    if (!c) return;
    hp_free_aligned(c->mem);
    free(c);
}

void hp_model_kv_cache_reset(hp_model_kv_cache_t c) { if (c) c->pos = 0; }
int hp_model_kv_cache_pos(hp_model_kv_cache_t c) { return c ? c->pos : 0; }
int hp_model_kv_cache_max_len(hp_model_kv_cache_t c) { return c ? c->max_len : 0; }

/* n <= chunk tokens at positions [pos, pos + n): the forward of hp_model_forward restricted
 * to these rows (same kernels, same weights), keys/values appended to the cache; the final
 * norm and output projection only for the last row when `last`. */
static void kv_forward_rows(hp_model_t m, hp_model_kv_cache_t c, const int32_t *tokens, int n, int last) {
    const hp_model_config_t *cf = &m->cfg;
    const int d = cf->dim, H = cf->n_heads, KV = cf->n_kv_heads, hd = cf->head_dim, hid = cf->hidden_dim;
    const int qd = H * hd, kd = KV * hd, qkvd = qd + 2 * kd, p0 = c->pos;
    hp_embedding_forward(c->x, tokens, m->embedding_i.weight, n, d);
    for (int l = 0; l < cf->n_layers; l++) {
        layer_mods_t *L = &m->layers[l];
        const attn_impl_t *A = &L->attention_i;
        float *K = c->k + (size_t)l * c->max_len * kd, *Vc = c->v + (size_t)l * c->max_len * kd;
        float *kn = K + (size_t)p0 * kd, *vn = Vc + (size_t)p0 * kd;   // (n, kd) rows of the new positions
        hp_rmsnorm_forward(c->xn, c->rstd, c->x, L->attention_norm_i.weight, n, d, L->attention_norm_i.eps);
        hp_linear_forward(c->qkv, c->xn, L->wqkv_i.weight, L->wqkv_i.bias, n, d, qkvd);
        if (A->qk_norm) {
            hp_rmsnorm_heads_forward(c->q, qd, c->rstd, c->qkv, qkvd, A->qn_w, n, H, hd, A->eps);
            hp_rmsnorm_heads_forward(kn, kd, c->rstd, c->qkv + qd, qkvd, A->kn_w, n, KV, hd, A->eps);
        } else {
            for (int i = 0; i < n; i++) {   // serial: n <= 64 row copies
                memcpy(c->q + (size_t)i * qd, c->qkv + (size_t)i * qkvd, sizeof(float) * (size_t)qd);
                memcpy(kn + (size_t)i * kd, c->qkv + (size_t)i * qkvd + qd, sizeof(float) * (size_t)kd);
            }
        }
        for (int i = 0; i < n; i++)
            memcpy(vn + (size_t)i * kd, c->qkv + (size_t)i * qkvd + qd + kd, sizeof(float) * (size_t)kd);
        // RoPE at absolute positions p0 + i: the table from row p0 on
        const float *cs = A->cos_t + (size_t)p0 * (hd / 2), *sn = A->sin_t + (size_t)p0 * (hd / 2);
        hp_rope_apply(c->q, qd, 1, n, H, hd, cs, sn, A->style, 0);
        hp_rope_apply(kn, kd, 1, n, KV, hd, cs, sn, A->style, 0);
        hp_attention_decode_forward(c->o, c->scores, c->q, qd, K, kd, Vc, kd, p0, n, H, KV, hd, c->n_threads);
        hp_linear_forward_acc(c->x, c->o, L->wo_i.weight, L->wo_i.bias, n, qd, d);       // x = x + attn
        hp_rmsnorm_forward(c->xn, c->rstd, c->x, L->ffn_norm_i.weight, n, d, L->ffn_norm_i.eps);
        hp_linear_forward(c->h13, c->xn, L->w13_i.weight, L->w13_i.bias, n, d, 2 * hid);
        hp_swiglu_forward(c->a, c->h13, n, hid);
        hp_linear_forward_acc(c->x, c->a, L->w2_i.weight, L->w2_i.bias, n, hid, d);     // x = x + ffn
    }
    c->pos += n;
    if (!last) return;
    hp_rmsnorm_forward(c->hf, c->rstd, c->x + (size_t)(n - 1) * d, m->norm_i.weight, 1, d, m->norm_i.eps);
    hp_linear_forward(c->logits, c->hf, m->output_i.weight, m->output_i.bias, 1, d, cf->vocab_size);
}

static hp_status_t kv_append(hp_model_t m, hp_model_kv_cache_t c, const int32_t *tokens, int n,
                             const float **logits, const char *who) {
    if (!m || !c) return hp_error(HP_ERR_INVALID_ARG, "%s: model and cache must be non-NULL", who);
    if (c->m != m)
        return hp_error(HP_ERR_INVALID_ARG, "%s: the KV cache was created for another model; hint: create "
                        "one cache per model (hp_model_kv_cache_create)", who);
    HP_TRY(kv_check_model(m, who));
    if (!tokens || n <= 0)
        return hp_error(HP_ERR_INVALID_ARG, "%s: n = %d tokens (%s), expected n >= 1 and a non-NULL token "
                        "array", who, n, tokens ? "non-NULL" : "NULL");
    if (n > c->max_len - c->pos)
        return hp_error(HP_ERR_INVALID_ARG, "%s: KV cache full: %d token(s) at position %d need positions up "
                        "to %d, the cache's max_len is %d; hint: create the cache with a larger max_len (up "
                        "to the model's max_seq_len %d), or reset it and prefill the last window", who, n,
                        c->pos, c->pos + n, c->max_len, m->max_seq_len);
    const int V = m->cfg.vocab_size;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return hp_error(HP_ERR_INVALID_ARG, "%s: token id %d at index %d is outside [0, %d) (vocab_size "
                            "of '%s/%s'); hint: use the tokenizer the model was trained with", who,
                            (int)tokens[i], i, V, m->cfg.name, m->cfg.flavor);
    for (int i = 0; i < n; i += c->chunk) {
        const int k = n - i < c->chunk ? n - i : c->chunk;
        kv_forward_rows(m, c, tokens + i, k, i + k == n);
    }
    if (logits) *logits = c->logits;
    return HP_OK;
}

hp_status_t hp_model_prefill(hp_model_t m, hp_model_kv_cache_t c, const int32_t *tokens, int n,
                             const float **logits) {
    return kv_append(m, c, tokens, n, logits, "hp_model_prefill");
}

hp_status_t hp_model_decode(hp_model_t m, hp_model_kv_cache_t c, int32_t token, const float **logits) {
    return kv_append(m, c, &token, 1, logits, "hp_model_decode");
}
