/* LoRA (PEFT's LoraLayer, TorchTitan's LoRAConverter): a module holding a (possibly stacked)
 * linear as its only child and adding, to the output rows of each adapted member i,
 * scale * B_i (A_i x) with A_i (r, in), B_i (out_i, r), scale = alpha / r. Forward, backward
 * input and weight are three GEMMs each through the kernel table (docs/finetune.md "LoRA"). */
#include <string.h>
#include "hyperparallel/model_builder.h"
#include "hyperparallel/nn.h"

#define LORA_MAX 4   /* members of a stacked linear (wq|wk|wv: 3) */

typedef struct lora_impl {
    int n;                       /* the base linear's stacked members */
    int rank;                    /* r, declared */
    float scale;                 /* alpha / r */
    hp_param_t *A[LORA_MAX];     /* (r, in) or NULL: member not adapted */
    hp_param_t *B[LORA_MAX];     /* (out_i, r) */
} lora_impl_t;

typedef struct lora_saved {
    const float *inp;            /* (N, in) the caller's input (outlives backward, as the linear's) */
    const float *dout;           /* (N, out) recorded by backward_input */
    float *t[LORA_MAX];          /* (N, r) A_i x, for dB */
    float *u[LORA_MAX];          /* (N, r) scale * dout_i B_i, for dA */
    int64_t N;
} lora_saved_t;

static hp_module_t *base_of(const hp_module_t *m) { return m->children[0]; }

/* Sizes from the parameters' local shapes at call time (FSDP's gathered entries). */
static int lora_in(const hp_module_t *m) { return (int)base_of(m)->params[0]->value.local.shape[1]; }
static int member_rows(const hp_module_t *m, int i) { return (int)base_of(m)->params[i]->value.local.shape[0]; }
static int lora_out(const hp_module_t *m) {
    const lora_impl_t *L = m->impl;
    int rows = 0;
    for (int i = 0; i < L->n; i++) rows += member_rows(m, i);
    return rows;
}

static size_t lora_act_bytes(const hp_module_t *m, int B, int T) {
    const lora_impl_t *L = m->impl;
    size_t b = hp_arena_round(sizeof(lora_saved_t));
    for (int i = 0; i < L->n; i++)
        if (L->A[i]) b += 2 * hp_arena_round(sizeof(float) * (size_t)B * T * (size_t)L->rank);
    const hp_module_t *c = base_of(m);
    return b + (c->ops->act_bytes ? c->ops->act_bytes(c, B, T) : 0);
}

static size_t lora_scratch(const hp_module_t *m, int B, int T) {
    const hp_module_t *c = base_of(m);
    return c->ops->grad_scratch_floats ? c->ops->grad_scratch_floats(c, B, T) : 0;
}

static hp_status_t lora_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    lora_impl_t *L = m->impl;
    HP_TRY(hp_module_forward(base_of(m), act, in, out));   // out (N, OC) = (or +=) x W^T
    lora_saved_t *s = hp_act_slot_new(act, m, sizeof(*s));
    s->inp = in->data;
    s->N = hp_tensor_rows(in);
    const int N = (int)s->N, IC = lora_in(m), OC = lora_out(m), r = L->rank;
    float *y = out->data;
    for (int i = 0, off = 0; i < L->n; off += member_rows(m, i), i++) {
        if (!L->A[i]) continue;
        HP_ASSERT_MSG(L->A[i]->value.local.shape[0] == r && L->B[i]->value.local.shape[1] == r,
                      "lora '%s': adapter of member %d is not rank %d here (a sharded entry at compute time)",
                      m->name, i, r);
        s->t[i] = hp_act_alloc(act, sizeof(float) * (size_t)N * r);
        s->u[i] = hp_act_alloc(act, sizeof(float) * (size_t)N * r);
        // t (N, r) = x A^T; y[:, off:off+out_i] += scale t B^T
        act->be->gemm(act->be->ctx, s->t[i], r, s->inp, IC, hp_param_w(L->A[i]), IC, N, r, IC, 0, 1, 1.0f, 0.0f);
        act->be->gemm(act->be->ctx, y + off, OC, s->t[i], r, hp_param_w(L->B[i]), r, N, member_rows(m, i), r, 0, 1,
                      L->scale, 1.0f);
    }
    return HP_OK;
}

static hp_status_t lora_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    lora_impl_t *L = m->impl;
    HP_TRY(hp_module_backward_input(base_of(m), act, dout, din));   // din (= or +=) dout W
    lora_saved_t *s = hp_act_slot(act, m);
    s->dout = dout->data;
    const int N = (int)s->N, IC = lora_in(m), OC = lora_out(m), r = L->rank;
    for (int i = 0, off = 0; i < L->n; off += member_rows(m, i), i++) {
        if (!L->A[i]) continue;
        // u (N, r) = scale dout_i B_i; din += u A
        act->be->gemm(act->be->ctx, s->u[i], r, s->dout + off, OC, hp_param_w(L->B[i]), r, N, r, member_rows(m, i),
                      0, 0, L->scale, 0.0f);
        if (din)
            act->be->gemm(act->be->ctx, din->data, IC, s->u[i], r, hp_param_w(L->A[i]), IC, N, IC, r, 0, 0, 1.0f,
                          1.0f);
    }
    return HP_OK;
}

static hp_status_t lora_backward_weight(hp_module_t *m, hp_act_t *act) {
    lora_impl_t *L = m->impl;
    HP_TRY(hp_module_backward_weight(base_of(m), act));   // nothing when the base is frozen
    lora_saved_t *s = hp_act_slot(act, m);
    HP_ASSERT_MSG(s->dout != NULL, "lora '%s': backward_weight before backward_input", m->name);
    const int N = (int)s->N, IC = lora_in(m), OC = lora_out(m), r = L->rank;
    for (int i = 0, off = 0; i < L->n; off += member_rows(m, i), i++) {
        if (!L->A[i]) continue;
        // dA (r, in) += u^T x; dB (out_i, r) += scale dout_i^T t
        if (!L->A[i]->frozen)
            act->be->gemm(act->be->ctx, hp_param_g(L->A[i]), IC, s->u[i], r, s->inp, IC, r, IC, N, 1, 0, 1.0f, 1.0f);
        if (!L->B[i]->frozen)
            act->be->gemm(act->be->ctx, hp_param_g(L->B[i]), r, s->dout + off, OC, s->t[i], r, member_rows(m, i), r,
                          N, 1, 0, L->scale, 1.0f);
    }
    s->dout = NULL;
    return HP_OK;
}

static int lora_act_split(const hp_module_t *m, int output, hp_act_split_t *sp) {
    return hp_module_act_split(base_of(m), output, sp);
}

static const hp_module_ops_t lora_ops = {
    "lora", lora_act_bytes, lora_scratch, lora_forward, lora_backward_input, lora_backward_weight, lora_act_split,
    NULL,
};

hp_status_t hp_lora_new(hp_model_t m, hp_module_t *base, hp_param_t *const *A, hp_param_t *const *B, int rank,
                        float alpha, hp_module_t **out) {
    *out = NULL;
    if (!base || strcmp(base->ops->kind, "linear") != 0 || rank <= 0 || !(alpha > 0.0f))
        return hp_error(HP_ERR_INVALID_ARG, "hp_lora_new: '%s' needs a linear base (got %s), rank > 0 (%d) and "
                        "alpha > 0 (%g)", base ? base->name : "(null)", base ? base->ops->kind : "none", rank, alpha);
    const hp_linear_impl_t *lin = base->impl;
    if (lin->n_weights > LORA_MAX)
        return hp_error(HP_ERR_INVALID_ARG, "hp_lora_new: '%s' stacks %d weights, at most %d", base->name,
                        lin->n_weights, LORA_MAX);
    hp_module_t *w = hp_model_module_new(m, sizeof(lora_impl_t));
    if (!w) return HP_ERR_OOM;
    lora_impl_t *L = w->impl;
    hp_module_base_init(w, &lora_ops, base->name, L);
    L->n = lin->n_weights;
    L->rank = rank;
    L->scale = alpha / (float)rank;   // PEFT's scaling (use_rslora = False)
    w->children[w->n_children++] = base;
    for (int i = 0; i < L->n; i++) {
        if (!A[i]) continue;
        if (!B[i] || A[i]->value.local.ndim != 2 || B[i]->value.local.ndim != 2 ||
            A[i]->value.global_shape[0] != rank || B[i]->value.global_shape[1] != rank ||
            A[i]->value.global_shape[1] != base->params[i]->value.global_shape[1] ||
            B[i]->value.global_shape[0] != base->params[i]->value.global_shape[0])
            return hp_error(HP_ERR_INVALID_ARG, "hp_lora_new: '%s' member %d ('%s'): expected A (%d, in) and B (out, "
                            "%d) matching the weight's (out, in)", base->name, i, base->params[i]->name, rank, rank);
        L->A[i] = A[i];
        L->B[i] = B[i];
        w->params[w->n_params++] = A[i];
        w->params[w->n_params++] = B[i];
    }
    *out = w;
    return HP_OK;
}
