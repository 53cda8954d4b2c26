/* The module protocol (forward / backward_input / backward_weight over a per-microbatch
 * activation context) and the parameter-owning leaf layers: linear, RMSNorm, embedding.
 * Composite layers (attention, feed-forward, transformer block) live in src/nn/model.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "hyperparallel/nn.h"
#include "hyperparallel/nn.h"

hp_status_t hp_act_init(hp_act_t *act, int n_modules, size_t bytes) {
    memset(act, 0, sizeof(*act));
    if (n_modules <= 0)
        return hp_error(HP_ERR_INVALID_ARG, "hp_act_init: n_modules=%d, expected > 0", n_modules);
    act->slots = hp_calloc((size_t)n_modules, sizeof(void *));
    if (!act->slots) return HP_ERR_OOM;
    act->n_slots = n_modules;
    act->be = hp_backend_default();
    hp_status_t st = hp_arena_init(&act->arena, "activations", bytes);
    if (st != HP_OK) {
        free(act->slots);
        act->slots = NULL;
    }
    return st;
}

void hp_act_free(hp_act_t *act) {
    if (!act) return;
    hp_arena_free(&act->arena);
    free(act->slots);
    memset(act, 0, sizeof(*act));
}

void hp_act_reset(hp_act_t *act) {
    hp_arena_reset(&act->arena);
    memset(act->slots, 0, sizeof(void *) * (size_t)act->n_slots);
}

/* Where an allocation goes: inside a checkpointed block the dropped state goes to the block's
 * recompute region, except while a kept call runs (keep_depth); everything else to the arena. */
static hp_arena_t *alloc_target(hp_act_t *act) {
    return act->region && act->keep_depth == 0 ? act->region : &act->arena;
}

static void *arena_take(hp_arena_t *a, size_t bytes) {
    void *p = hp_arena_alloc(a, bytes);
    HP_ASSERT_MSG(p != NULL, "%s arena exhausted (%zu of %zu bytes used, %zu requested): "
                  "the size table undercounts", a->name, a->used, a->capacity, bytes);
    return p;
}

void *hp_act_alloc(hp_act_t *act, size_t bytes) { return arena_take(alloc_target(act), bytes); }

/* ---- saved tensors under activation checkpointing ------------------------------------------ */

/* The decision for (m, slot) inside a checkpointed block; 0 elsewhere. */
static int decided_keep(const hp_act_t *act, const hp_module_t *m, int slot) {
    const hp_act_ckpt_t *c = act->ckpt;
    return act->region && c && c->keep && m->id >= 0 && m->id < act->n_slots &&
           c->keep[(size_t)m->id * HP_SAVE_SLOTS + slot];
}

static void *save(hp_act_t *act, const hp_module_t *m, int slot, size_t bytes, int *run) {
    *run = 1;
    if (!act->region) return hp_act_alloc(act, bytes);
    const int keep = act->keep_depth > 0 || decided_keep(act, m, slot);
    if (!keep) return hp_act_alloc(act, bytes);
    HP_ASSERT(m->id >= 0 && m->id < act->n_slots);
    void **rec = &act->ckpt->kept[(size_t)m->id * HP_SAVE_SLOTS + slot];
    if (act->replay) {   // kept by this micro-batch's forward: the same bits at the same address
        HP_ASSERT_MSG(*rec != NULL, "module '%s' (%s): item %d kept but not saved by the forward", m->name,
                      m->ops->kind, slot);
        *run = 0;
        return *rec;
    }
    *rec = arena_take(&act->arena, bytes);
    return *rec;
}

void *hp_act_save(hp_act_t *act, const hp_module_t *m, int slot, size_t bytes, int *run) {
    HP_ASSERT(slot > HP_SAVE_OUT && slot < HP_SAVE_SLOTS);
    return save(act, m, slot, bytes, run);
}

void *hp_act_save_out(hp_act_t *act, const hp_module_t *c, size_t bytes) {
    int run;
    return save(act, c, HP_SAVE_OUT, bytes, &run);
}

int hp_act_save_kept(const hp_act_t *act, const hp_module_t *m, int slot) {
    return act->keep_depth > 0 || decided_keep(act, m, slot);
}

int hp_act_out_kept(const hp_act_t *act, const hp_module_t *m) {
    return act->replay && hp_act_save_kept(act, m, HP_SAVE_OUT);
}

void hp_act_keep_begin(hp_act_t *act, int kept) { act->keep_depth += kept != 0; }
void hp_act_keep_end(hp_act_t *act, int kept) { act->keep_depth -= kept != 0; }

void *hp_act_slot_new(hp_act_t *act, const hp_module_t *m, size_t bytes) {
    HP_ASSERT(m->id >= 0 && m->id < act->n_slots);
    void *p = hp_act_alloc(act, bytes);
    act->slots[m->id] = p;
    return p;
}

void *hp_act_slot(hp_act_t *act, const hp_module_t *m) {
    HP_ASSERT(m->id >= 0 && m->id < act->n_slots);
    void *p = act->slots[m->id];
    HP_ASSERT_MSG(p != NULL, "module '%s' (%s): backward without a saved forward in this "
                  "activation context", m->name, m->ops->kind);
    return p;
}

float *hp_act_scratch(hp_act_t *act, size_t *offset, size_t floats) {
    HP_ASSERT_MSG(*offset + floats <= act->grad_scratch_floats,
                  "gradient scratch too small (%zu + %zu > %zu floats)", *offset, floats,
                  act->grad_scratch_floats);
    float *p = act->grad_scratch + *offset;
    *offset += floats;
    return p;
}

static void prof_add(hp_act_t *act, int op, double t0) {
    if (act->prof) act->prof[op] += omp_get_wtime() - t0;
}

static hp_status_t run_hooks(hp_module_t *m, hp_hook_kind_t k, hp_act_t *act) {
    for (int i = 0; i < m->n_hooks[k]; i++) HP_TRY(m->hooks[k][i].fn(m->hooks[k][i].user, m, act));
    return HP_OK;
}

static hp_status_t forward_call(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    HP_TRY(run_hooks(m, HP_HOOK_PRE_FORWARD, act));
    HP_TRY(m->ops->forward(m, act, in, out));
    return run_hooks(m, HP_HOOK_POST_FORWARD, act);
}

hp_status_t hp_module_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    if (!m || !m->ops || !m->ops->forward)
        return hp_error(HP_ERR_INVALID_ARG, "hp_module_forward: module '%s' has no forward",
                        m ? m->name : "(null)");
    /* a one-op module whose output a checkpointed block keeps: its whole state is kept with the
     * output, and the replay does not run it (its hooks neither: the op is not re-issued) */
    if (act->region && act->keep_depth == 0 && !m->ops->save_items && decided_keep(act, m, HP_SAVE_OUT)) {
        if (act->replay) return HP_OK;
        act->keep_depth++;
        hp_status_t st = forward_call(m, act, in, out);
        act->keep_depth--;
        return st;
    }
    return forward_call(m, act, in, out);
}

hp_status_t hp_module_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    if (!m || !m->ops || !m->ops->backward_input)
        return hp_error(HP_ERR_INVALID_ARG, "hp_module_backward_input: module '%s' has no backward_input",
                        m ? m->name : "(null)");
    HP_TRY(run_hooks(m, HP_HOOK_PRE_BACKWARD, act));
    return m->ops->backward_input(m, act, dout, din);
}

hp_status_t hp_module_backward_weight(hp_module_t *m, hp_act_t *act) {
    if (!m || !m->ops)
        return hp_error(HP_ERR_INVALID_ARG, "hp_module_backward_weight: module is NULL");
    if (m->ops->backward_weight) HP_TRY(m->ops->backward_weight(m, act));
    return run_hooks(m, HP_HOOK_POST_BACKWARD, act);
}

hp_status_t hp_module_replace_child(hp_module_t *parent, hp_module_t *old, hp_module_t *repl) {
    if (!parent || !old || !repl)
        return hp_error(HP_ERR_INVALID_ARG, "hp_module_replace_child: parent, old and replacement are required");
    for (int i = 0; i < parent->n_children; i++)
        if (parent->children[i] == old) {
            parent->children[i] = repl;
            return HP_OK;
        }
    return hp_error(HP_ERR_INVALID_ARG, "hp_module_replace_child: '%s' is not a child of '%s'", old->name,
                    parent->name);
}

static int g_hook_handle = 0;

hp_status_t hp_module_add_hook(hp_module_t *m, hp_hook_kind_t kind, hp_module_hook_fn fn, void *user, int *handle) {
    if (!m || !fn || (unsigned)kind >= HP_HOOK_KINDS)
        return hp_error(HP_ERR_INVALID_ARG, "hp_module_add_hook: module, hook function and a kind in "
                        "[0, %d) are required", HP_HOOK_KINDS);
    if (m->n_hooks[kind] >= HP_MODULE_MAX_HOOKS)
        return hp_error(HP_ERR_INVALID_ARG, "hp_module_add_hook: module '%s' already has %d hooks of kind %d "
                        "(HP_MODULE_MAX_HOOKS)", m->name, HP_MODULE_MAX_HOOKS, (int)kind);
    hp_module_hook_t *h = &m->hooks[kind][m->n_hooks[kind]++];
    h->fn = fn;
    h->user = user;
    h->handle = ++g_hook_handle;   // set-up time only (single-threaded)
    if (handle) *handle = h->handle;
    return HP_OK;
}

static void remove_if(hp_module_t *m, int handle, void *user, int by_user) {
    for (int k = 0; k < HP_HOOK_KINDS; k++) {
        int w = 0;
        for (int i = 0; i < m->n_hooks[k]; i++) {
            const hp_module_hook_t *h = &m->hooks[k][i];
            if (by_user ? h->user == user : h->handle == handle) continue;
            m->hooks[k][w++] = *h;
        }
        m->n_hooks[k] = w;
    }
}

void hp_module_remove_hook(hp_module_t *m, int handle) { if (m) remove_if(m, handle, NULL, 0); }
void hp_module_remove_hooks_of(hp_module_t *m, void *user) { if (m) remove_if(m, 0, user, 1); }

hp_status_t hp_module_move_hooks(hp_module_t *to, hp_module_t *m) {
    for (int k = 0; k < HP_HOOK_KINDS; k++) {
        if (to->n_hooks[k] + m->n_hooks[k] > HP_MODULE_MAX_HOOKS)
            return hp_error(HP_ERR_INVALID_ARG, "hp_module_move_hooks: '%s' would exceed %d hooks of kind %d",
                            to->name, HP_MODULE_MAX_HOOKS, k);
        for (int i = 0; i < m->n_hooks[k]; i++) to->hooks[k][to->n_hooks[k]++] = m->hooks[k][i];
        m->n_hooks[k] = 0;
    }
    return HP_OK;
}


int hp_module_act_split(const hp_module_t *m, int output, hp_act_split_t *s) {
    return m && m->ops && m->ops->act_split ? m->ops->act_split(m, output, s) : 0;
}

/* ---- save_items builders ---------------------------------------------------------------------- */

static hp_save_item_t *save_push(hp_save_list_t *L) {
    hp_save_item_t *it = L->n < L->cap ? &L->items[L->n] : NULL;
    if (it) memset(it, 0, sizeof(*it));
    L->n++;
    return it;
}

static const hp_module_ops_t linear_ops;

/* The linear under a chain of single-child wrappers (tensor parallel's), or NULL. */
static const hp_module_t *leaf_linear(const hp_module_t *c) {
    while (c && c->ops != &linear_ops && c->n_children == 1) c = c->children[0];
    return c && c->ops == &linear_ops ? c : NULL;
}

static void default_weights(const hp_module_t *c, hp_save_kind_t kind, const hp_param_t *const **w, int *nw) {
    if (*w || kind != HP_SAVE_MM) return;
    const hp_module_t *lin = leaf_linear(c);
    if (!lin) return;
    *w = (const hp_param_t *const *)lin->params;
    *nw = ((const hp_linear_impl_t *)lin->impl)->n_weights;
}

void hp_save_own(hp_save_list_t *L, const hp_module_t *m, int slot, hp_save_kind_t kind, size_t bytes, double flops) {
    hp_save_item_t *it = save_push(L);
    if (it) *it = (hp_save_item_t){.owner = m, .slot = slot, .kind = kind, .bytes = bytes, .flops = flops};
}

void hp_save_own_mm(hp_save_list_t *L, const hp_module_t *m, int slot, size_t bytes, double flops,
                    const hp_param_t *const *w, int nw) {
    hp_save_item_t *it = save_push(L);
    if (it)
        *it = (hp_save_item_t){.owner = m, .slot = slot, .kind = HP_SAVE_MM, .bytes = bytes, .flops = flops,
                               .mm_w = w, .mm_nw = nw};
}

/* c's items (when it lists them) and the producer of its output: the final child c declared,
 * else (kind, flops, w) as given; *state: the bytes kept with the output (a one-op module's
 * whole state, or the final child's). */
static void child_items(hp_save_list_t *L, const hp_module_t *c, int B, int T, hp_save_kind_t *kind, double *flops,
                        const hp_param_t *const **w, int *nw, size_t *state) {
    *state = 0;
    if (c->ops->save_items) {
        L->has_final = 0;
        c->ops->save_items(c, B, T, L);
        if (L->has_final) {
            *kind = L->final_kind;
            *flops = L->final_flops;
            *state = L->final_bytes;
            *w = L->final_w;
            *nw = L->final_nw;
        }
        L->has_final = 0;
    } else {
        *state = c->ops->act_bytes ? c->ops->act_bytes(c, B, T) : 0;
    }
    default_weights(c, *kind, w, nw);
}

void hp_save_child(hp_save_list_t *L, const hp_module_t *c, int B, int T, size_t out_bytes, hp_save_kind_t kind,
                   double flops, const hp_param_t *const *w, int nw) {
    size_t state;
    child_items(L, c, B, T, &kind, &flops, &w, &nw, &state);
    hp_save_item_t *it = save_push(L);
    if (it)
        *it = (hp_save_item_t){.owner = c, .slot = HP_SAVE_OUT, .kind = kind, .bytes = out_bytes + state,
                               .flops = flops, .mm_w = kind == HP_SAVE_MM ? w : NULL, .mm_nw = nw};
}

void hp_save_final(hp_save_list_t *L, const hp_module_t *m, const hp_module_t *c, int B, int T, hp_save_kind_t kind,
                   double flops, const hp_param_t *const *w, int nw) {
    size_t state;
    child_items(L, c, B, T, &kind, &flops, &w, &nw, &state);
    hp_save_item_t *it = save_push(L);
    if (it) *it = (hp_save_item_t){.owner = c, .slot = HP_SAVE_OUT, .same_as = m};
    L->has_final = 1;
    L->final_kind = kind;
    L->final_flops = flops;
    L->final_bytes = state;
    L->final_w = kind == HP_SAVE_MM ? w : NULL;
    L->final_nw = nw;
}

void hp_save_output(hp_save_list_t *L, hp_save_kind_t kind, double flops, const hp_param_t *const *w, int nw) {
    L->has_final = 1;
    L->final_kind = kind;
    L->final_flops = flops;
    L->final_bytes = 0;
    L->final_w = kind == HP_SAVE_MM ? w : NULL;
    L->final_nw = nw;
}

void hp_save_tie(hp_save_list_t *L) {
    if (L->n >= 2 && L->n <= L->cap) L->items[L->n - 1].tie = 1;
}

static hp_status_t check_last_dim(const hp_module_t *m, const char *what, const hp_tensor_t *t, int64_t C) {
    if (!t || !t->data || t->ndim < 1 || t->shape[t->ndim - 1] != C || t->dtype != HP_F32)
        return hp_error(HP_ERR_INVALID_ARG, "%s '%s': %s must be f32 (..., %lld), got ndim %d last dim %lld",
                        m->ops->kind, m->name, what, (long long)C, t ? t->ndim : -1,
                        t && t->ndim ? (long long)t->shape[t->ndim - 1] : -1LL);
    return HP_OK;
}

/* ---- linear ------------------------------------------------------------------------- */

typedef struct linear_saved {
    const float *inp;    // (N, IC) the caller's input, which must outlive backward
    const float *dout;   // (N, OC) recorded by backward_input for backward_weight
    int64_t N;
} linear_saved_t;

static size_t linear_act_bytes(const hp_module_t *m, int B, int T) {
    return hp_arena_round(sizeof(linear_saved_t));
}

/* The GEMM's sizes from the weights' local shapes: in = columns, out = the stacked rows. */
static int lin_in(const hp_module_t *m) { return (int)m->params[0]->value.local.shape[1]; }
static int lin_out(const hp_module_t *m) {
    const hp_linear_impl_t *L = m->impl;
    int64_t rows = 0;
    for (int i = 0; i < L->n_weights; i++) rows += m->params[i]->value.local.shape[0];
    return (int)rows;
}

/* ---- bf16 compute (training.dtype=bfloat16; docs/nn.md "bf16 compute") ----------------------
 * One GEMM c (M, Nn) = op(a) op(b) + beta c of a linear with a (na floats) and b (nb floats)
 * rounded to bf16 (round to nearest even: the backend's convert) into the context's workspace
 * and multiplied by the backend's gemm_bf16 (exact products, f32 sums), its scratch the rest of
 * the workspace: PyTorch CPU autocast's matmul (bf16 operands, f32 accumulation), except that
 * the f32 result is kept, not rounded to bf16. The weights are rounded at each use (forward and
 * backward-input), not kept as a bf16 copy: they change after every optimizer step and exist
 * unsharded only between FSDP's all-gather and reshard, so a per-use rounding is right for every
 * layout with no second parameter buffer; it costs OC IC conversions against N OC IC
 * multiply-adds (1/N of the GEMM). */
static size_t bf16_round(size_t elems) { return (elems + 31) / 32 * 32; }   // 64-byte regions

static size_t lin_bf16_call_bytes(size_t na, size_t nb, int M, int Nn, int K, int ta, int tb) {
    return 2 * (bf16_round(na) + bf16_round(nb)) + sizeof(float) * hp_gemm_bf16_ws_floats(M, Nn, K, ta, tb);
}

size_t hp_linear_bf16_ws_bytes(const hp_module_t *m, int64_t rows) {
    if (!m || m->ops != &linear_ops) return 0;
    const size_t N = (size_t)rows, IC = (size_t)lin_in(m), OC = (size_t)lin_out(m);
    const int n = (int)rows, ic = (int)IC, oc = (int)OC;
    size_t f = lin_bf16_call_bytes(N * IC, OC * IC, n, oc, ic, 0, 1);   // forward
    size_t bi = lin_bf16_call_bytes(N * OC, OC * IC, n, ic, oc, 0, 0);  // backward input
    size_t bw = lin_bf16_call_bytes(N * OC, N * IC, oc, ic, n, 1, 0);   // backward weight
    size_t mx = f > bi ? f : bi;
    return mx > bw ? mx : bw;
}

static hp_status_t lin_bf16_check(const hp_module_t *m, const hp_act_t *act) {
    const hp_linear_impl_t *L = m->impl;
    if (L->has_bias || !hp_backend_has_gemm_bf16(act->be))
        return hp_error(HP_ERR_UNSUPPORTED, "linear '%s': bf16 compute (training.dtype=bfloat16) %s; hint: set "
                        "training.dtype=float32", m->name,
                        L->has_bias ? "of a linear with a bias is not implemented" : "needs a backend with gemm_bf16");
    return HP_OK;
}

static hp_status_t lin_bf16_gemm(const hp_module_t *m, hp_act_t *act, float *c, int ldc, const float *a, size_t na,
                                 int lda, const float *b, size_t nb, int ldb, int M, int Nn, int K, int ta, int tb,
                                 float beta) {
    const size_t need = lin_bf16_call_bytes(na, nb, M, Nn, K, ta, tb);
    if (!act->bf16_ws || need > act->bf16_ws_bytes)
        return hp_error(HP_ERR_STATE, "linear '%s': bf16 compute needs %zu bytes of workspace for %d x %d x %d, the "
                        "context has %zu; hint: create the context after hp_model_set_compute_dtype", m->name, need,
                        M, Nn, K, act->bf16_ws_bytes);
    const hp_backend_t *be = act->be;
    uint16_t *ab = act->bf16_ws, *bb = ab + bf16_round(na);
    float *ws = (float *)(bb + bf16_round(nb));
    be->convert(be->ctx, ab, HP_BF16, a, HP_F32, (int64_t)na);
    be->convert(be->ctx, bb, HP_BF16, b, HP_F32, (int64_t)nb);
    be->gemm_bf16(be->ctx, c, ldc, ab, lda, bb, ldb, M, Nn, K, ta, tb, 1.0f, beta, ws,
                  (act->bf16_ws_bytes - 2 * (bf16_round(na) + bf16_round(nb))) / sizeof(float));
    return HP_OK;
}

static hp_status_t linear_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    hp_linear_impl_t *L = m->impl;
    const int IC = lin_in(m), OC = lin_out(m);
    HP_TRY(check_last_dim(m, "input", in, IC));
    HP_TRY(check_last_dim(m, "output", out, OC));
    linear_saved_t *s = hp_act_slot_new(act, m, sizeof(*s));
    s->inp = in->data;
    s->N = hp_tensor_rows(in);
    double t0 = omp_get_wtime();
    const float *bias = L->has_bias ? hp_param_w(m->params[L->n_weights]) : NULL;
    if (act->compute_dtype == HP_BF16) {   // out (N, OC) (=|+=) bf16(inp) bf16(W)^T
        HP_TRY(lin_bf16_check(m, act));
        HP_TRY(lin_bf16_gemm(m, act, out->data, OC, in->data, (size_t)s->N * IC, IC, hp_param_w(m->params[0]),
                             (size_t)OC * IC, IC, (int)s->N, OC, IC, 0, 1, L->accumulate_output ? 1.0f : 0.0f));
    } else {
        act->be->linear_forward(act->be->ctx, out->data, in->data, hp_param_w(m->params[0]), bias, (int)s->N, IC, OC,
                                L->accumulate_output);
    }
    prof_add(act, L->prof_op, t0);
    return HP_OK;
}

static hp_status_t linear_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    hp_linear_impl_t *L = m->impl;
    linear_saved_t *s = hp_act_slot(act, m);
    const int IC = lin_in(m), OC = lin_out(m);
    HP_TRY(check_last_dim(m, "dout", dout, OC));
    s->dout = dout->data;
    if (din) {
        HP_TRY(check_last_dim(m, "din", din, IC));
        double t0 = omp_get_wtime();
        if (act->compute_dtype == HP_BF16)   // din (N, IC) (=|+=) bf16(dout) bf16(W)
            HP_TRY(lin_bf16_gemm(m, act, din->data, IC, dout->data, (size_t)s->N * OC, OC, hp_param_w(m->params[0]),
                                 (size_t)OC * IC, IC, (int)s->N, IC, OC, 0, 0, L->accumulate_input_grad ? 1.0f : 0.0f));
        else
            act->be->linear_backward_input(act->be->ctx, din->data, dout->data, hp_param_w(m->params[0]), (int)s->N,
                                           IC, OC, L->accumulate_input_grad);
        prof_add(act, L->prof_op + 1, t0);
    }
    return HP_OK;
}

static hp_status_t linear_backward_weight(hp_module_t *m, hp_act_t *act) {
    hp_linear_impl_t *L = m->impl;
    linear_saved_t *s = hp_act_slot(act, m);
    HP_ASSERT_MSG(s->dout != NULL, "linear '%s': backward_weight before backward_input", m->name);
    double t0 = omp_get_wtime();
    float *dbias = L->has_bias ? hp_param_g(m->params[L->n_weights]) : NULL;
    int frozen = !dbias || m->params[L->n_weights]->frozen;   // requires_grad = False: no dW (LoRA's base)
    for (int i = 0; i < L->n_weights; i++) frozen &= m->params[i]->frozen;
    if (!frozen && act->compute_dtype == HP_BF16) {   // dW (OC, IC) += bf16(dout)^T bf16(inp)
        const int IC = lin_in(m), OC = lin_out(m);
        HP_TRY(lin_bf16_gemm(m, act, hp_param_g(m->params[0]), IC, s->dout, (size_t)s->N * OC, OC, s->inp,
                             (size_t)s->N * IC, IC, OC, IC, (int)s->N, 1, 0, 1.0f));
    } else if (!frozen) {
        act->be->linear_backward_weight(act->be->ctx, hp_param_g(m->params[0]), dbias, s->dout, s->inp, (int)s->N,
                                        lin_in(m), lin_out(m));
    }
    prof_add(act, L->prof_op + 2, t0);
    s->dout = NULL;
    return HP_OK;
}

static const hp_module_ops_t linear_ops = {
    "linear", linear_act_bytes, NULL, linear_forward, linear_backward_input, linear_backward_weight, NULL, NULL,
};

static void module_base(hp_module_t *m, const hp_module_ops_t *ops, const char *name, void *impl) {
    memset(m, 0, sizeof(*m));
    snprintf(m->name, sizeof(m->name), "%s", name);
    m->ops = ops;
    m->impl = impl;
    m->id = -1;
    m->unit = -1;
}

void hp_linear_module_init(hp_module_t *m, hp_linear_impl_t *impl, const char *name,
                           hp_param_t **params, int n_params, hp_param_t *bias,
                           int in_features, int out_features) {
    HP_ASSERT(n_params >= 1 && n_params + (bias != NULL) <= HP_MODULE_MAX_PARAMS);
    memset(impl, 0, sizeof(*impl));
    module_base(m, &linear_ops, name, impl);
    impl->in_features = in_features;
    impl->out_features = out_features;
    impl->prof_op = HP_NN_OP_LINEAR_FWD;
    impl->n_weights = n_params;
    // stacked params must be adjacent in memory so that they form one (out, in) matrix (an
    // empty model's entries have no storage yet: its layout keeps a group's members adjacent)
    int64_t rows = 0;
    const float *w0 = hp_param_w(params[0]), *g0 = hp_param_g(params[0]);
    for (int i = 0; i < n_params; i++) {
        HP_ASSERT_MSG(!w0 || (hp_param_w(params[i]) == w0 + rows * in_features &&
                              hp_param_g(params[i]) == g0 + rows * in_features),
                      "linear '%s': stacked parameter '%s' is not adjacent to the previous one",
                      name, params[i]->name);
        rows += params[i]->value.local.shape[0];
        m->params[m->n_params++] = params[i];
    }
    HP_ASSERT_MSG(rows == out_features, "linear '%s': stacked rows %lld != out_features %d", name,
                  (long long)rows, out_features);
    if (bias) {
        impl->has_bias = 1;
        m->params[m->n_params++] = bias;
    }
}

/* ---- RMSNorm ------------------------------------------------------------------------- */

typedef struct rmsnorm_saved {
    const float *inp;    // (N, C)
    float *rstd;         // (N) in the activation arena
    const float *dout;   // recorded by backward_input
    int64_t N;
} rmsnorm_saved_t;

static size_t rmsnorm_act_bytes(const hp_module_t *m, int B, int T) {
    return hp_arena_round(sizeof(rmsnorm_saved_t)) + hp_arena_round(sizeof(float) * (size_t)B * T);
}

static hp_status_t rmsnorm_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    hp_rmsnorm_impl_t *R = m->impl;
    HP_TRY(check_last_dim(m, "input", in, R->dim));
    HP_TRY(check_last_dim(m, "output", out, R->dim));
    rmsnorm_saved_t *s = hp_act_slot_new(act, m, sizeof(*s));
    s->inp = in->data;
    s->N = hp_tensor_rows(in);
    s->rstd = hp_act_alloc(act, sizeof(float) * (size_t)s->N);
    double t0 = omp_get_wtime();
    act->be->rmsnorm_forward(act->be->ctx, out->data, s->rstd, in->data, hp_param_w(m->params[0]), (int)s->N,
                             R->dim, R->eps);
    prof_add(act, HP_NN_OP_RMSNORM_FWD, t0);
    return HP_OK;
}

static hp_status_t rmsnorm_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    hp_rmsnorm_impl_t *R = m->impl;
    rmsnorm_saved_t *s = hp_act_slot(act, m);
    HP_TRY(check_last_dim(m, "dout", dout, R->dim));
    s->dout = dout->data;
    if (din) {
        HP_TRY(check_last_dim(m, "din", din, R->dim));
        double t0 = omp_get_wtime();
        act->be->rmsnorm_backward_input(act->be->ctx, din->data, dout->data, s->inp, hp_param_w(m->params[0]),
                                        s->rstd, (int)s->N, R->dim, R->accumulate_input_grad);
        prof_add(act, HP_NN_OP_RMSNORM_BWD, t0);
    }
    return HP_OK;
}

static hp_status_t rmsnorm_backward_weight(hp_module_t *m, hp_act_t *act) {
    hp_rmsnorm_impl_t *R = m->impl;
    rmsnorm_saved_t *s = hp_act_slot(act, m);
    HP_ASSERT_MSG(s->dout != NULL, "rmsnorm '%s': backward_weight before backward_input", m->name);
    double t0 = omp_get_wtime();
    if (!m->params[0]->frozen)   // requires_grad = False: no weight gradient
        act->be->rmsnorm_backward_weight(act->be->ctx, hp_param_g(m->params[0]), s->dout, s->inp, s->rstd,
                                         (int)s->N, R->dim);
    prof_add(act, HP_NN_OP_RMSNORM_BWD, t0);
    s->dout = NULL;
    return HP_OK;
}

static const hp_module_ops_t rmsnorm_ops = {
    "rmsnorm", rmsnorm_act_bytes, NULL, rmsnorm_forward, rmsnorm_backward_input, rmsnorm_backward_weight,
    NULL, NULL,
};

void hp_rmsnorm_module_init(hp_module_t *m, hp_rmsnorm_impl_t *impl, const char *name,
                            hp_param_t *weight, int dim, float eps) {
    memset(impl, 0, sizeof(*impl));
    module_base(m, &rmsnorm_ops, name, impl);
    impl->dim = dim;
    impl->eps = eps;
    m->params[m->n_params++] = weight;
}

/* ---- embedding ------------------------------------------------------------------------- */

typedef struct embedding_saved {
    const int32_t *tokens;   // (N) the caller's token ids
    const float *dout;       // (N, C)
    int64_t N;
} embedding_saved_t;

static size_t embedding_act_bytes(const hp_module_t *m, int B, int T) {
    return hp_arena_round(sizeof(embedding_saved_t));
}

/* The table's local shape: (vocab rows, dim columns) this module holds. */
static int emb_vocab(const hp_module_t *m) { return (int)m->params[0]->value.local.shape[0]; }
static int emb_dim(const hp_module_t *m) { return (int)m->params[0]->value.local.shape[1]; }

static hp_status_t embedding_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    const int V = emb_vocab(m), C = emb_dim(m);
    if (!in || in->dtype != HP_I32 || !in->data)
        return hp_error(HP_ERR_INVALID_ARG, "embedding '%s': input must be i32 token ids", m->name);
    HP_TRY(check_last_dim(m, "output", out, C));
    int64_t N = 1;
    for (int i = 0; i < in->ndim; i++) N *= in->shape[i];
    const int32_t *tok = in->data;
    for (int64_t n = 0; n < N; n++)
        if (tok[n] < 0 || tok[n] >= V)
            return hp_error(HP_ERR_INVALID_ARG, "embedding '%s': token %d at position %lld is outside "
                            "[0, %d); hint: does the tokenizer match the model's vocab_size?",
                            m->name, tok[n], (long long)n, V);
    embedding_saved_t *s = hp_act_slot_new(act, m, sizeof(*s));
    s->tokens = tok;
    s->N = N;
    double t0 = omp_get_wtime();
    act->be->embedding_forward(act->be->ctx, out->data, tok, hp_param_w(m->params[0]), (int)N, C);
    prof_add(act, HP_NN_OP_EMBEDDING, t0);
    return HP_OK;
}

static hp_status_t embedding_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    embedding_saved_t *s = hp_act_slot(act, m);
    HP_TRY(check_last_dim(m, "dout", dout, emb_dim(m)));
    s->dout = dout->data;   // token ids have no gradient; din is ignored
    return HP_OK;
}

static hp_status_t embedding_backward_weight(hp_module_t *m, hp_act_t *act) {
    embedding_saved_t *s = hp_act_slot(act, m);
    HP_ASSERT_MSG(s->dout != NULL, "embedding '%s': backward_weight before backward_input", m->name);
    double t0 = omp_get_wtime();
    if (!m->params[0]->frozen)   // requires_grad = False: no weight gradient
        act->be->embedding_backward(act->be->ctx, hp_param_g(m->params[0]), s->dout, s->tokens, (int)s->N,
                                    emb_dim(m), emb_vocab(m));
    prof_add(act, HP_NN_OP_EMBEDDING, t0);
    s->dout = NULL;
    return HP_OK;
}

static const hp_module_ops_t embedding_ops = {
    "embedding", embedding_act_bytes, NULL, embedding_forward, embedding_backward_input,
    embedding_backward_weight, NULL, NULL,
};

void hp_embedding_module_init(hp_module_t *m, hp_embedding_impl_t *impl, const char *name,
                              hp_param_t *weight, int vocab, int dim) {
    memset(impl, 0, sizeof(*impl));
    module_base(m, &embedding_ops, name, impl);
    impl->vocab = vocab;
    impl->dim = dim;
    m->params[m->n_params++] = weight;
}

void hp_module_base_init(hp_module_t *m, const hp_module_ops_t *ops, const char *name, void *impl) {
    module_base(m, ops, name, impl);
}

const char *const hp_nn_op_names[HP_NN_OP_COUNT] = {
    "embedding",
    "rmsnorm.fwd", "rmsnorm.bwd",
    "linear.fwd", "linear.bwd_input", "linear.bwd_weight",
    "output.fwd", "output.bwd_input", "output.bwd_weight",
    "rope", "qk_norm",
    "attention.fwd", "attention.bwd",
    "swiglu.fwd", "swiglu.bwd",
    "cross_entropy", "elementwise",
    "moe.route", "moe.experts", "moe.combine", "moe.dispatch",
};
