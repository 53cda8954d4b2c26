/* Tensor and sequence parallel: parallelize_module and the parallel styles (PyTorch
 * torch.distributed.tensor.parallel.style semantics, docs/tp.md). A parallelized module is
 * replaced in its parent (hp_model_replace_module / hp_module_replace_child) by a wrapper module
 * that holds it as its only child and redistributes inputs, outputs and gradients around it (the
 * style's input / output functions); the module itself is never modified, its parameters only
 * become DTensors whose local shards it computes with. Activation layouts on the 1-D TP mesh:
 *   Replicate: every rank holds the whole (N, C) tensor;
 *   Shard(-1): columns (features) chunked, (N, C/k);
 *   Shard(0): rows chunked ((N/k, C)); Shard(1): the sequence of (B, T, C) chunked, each rank
 *   holding rows (b, t) with t in its chunk, B = hp_act_t.B.
 * Gathered inputs that backward reuses live in the micro-batch context's arena (the wrapper's
 * act_bytes reserves them), and the token ids of a rowwise embedding are kept per context, so
 * several micro-batches can be in flight (pipeline schedules); scratch used within one call
 * (output gradients, partial outputs) stays in per-module buffers sized at parallelize time.
 * No allocation in the step loop. */
#include <fnmatch.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/tp.h"
#include "hyperparallel/comm.h"
#include "hyperparallel/nn.h"

/* ---- styles ------------------------------------------------------------------------------ */

static hp_tp_style_t style_base(hp_tp_style_kind_t kind) {
    hp_tp_style_t s;
    memset(&s, 0, sizeof(s));
    s.kind = kind;
    s.use_local_output = 1;
    s.sequence_dim = 1;
    return s;
}

hp_tp_style_t hp_tp_colwise(void) { return style_base(HP_TP_COLWISE); }
hp_tp_style_t hp_tp_rowwise(void) { return style_base(HP_TP_ROWWISE); }
hp_tp_style_t hp_tp_sequence_parallel(void) {
    hp_tp_style_t s = style_base(HP_TP_SEQUENCE_PARALLEL);
    s.use_local_output = 0;
    return s;
}
hp_tp_style_t hp_tp_no_parallel(void) { return style_base(HP_TP_NO_PARALLEL); }

hp_tp_style_t hp_tp_prepare_input(hp_placement_t input_layout, hp_placement_t desired_input_layout) {
    hp_tp_style_t s = style_base(HP_TP_PREPARE_INPUT);
    s.use_local_output = 0;
    s.has_input_layout = s.has_desired_input = 1;
    s.input_layout = input_layout;
    s.desired_input_layout = desired_input_layout;
    return s;
}

hp_tp_style_t hp_tp_prepare_output(hp_placement_t output_layout, hp_placement_t desired_output_layout) {
    hp_tp_style_t s = style_base(HP_TP_PREPARE_OUTPUT);
    s.has_output_layout = s.has_desired_output = 1;
    s.output_layout = output_layout;
    s.desired_output_layout = desired_output_layout;
    return s;
}

hp_tp_style_t hp_tp_prepare_input_output(hp_placement_t input_layout, hp_placement_t desired_input_layout,
                                         hp_placement_t output_layout, hp_placement_t desired_output_layout) {
    hp_tp_style_t s = style_base(HP_TP_PREPARE_INPUT_OUTPUT);
    s.use_local_output = 0;
    s.has_input_layout = s.has_desired_input = s.has_output_layout = s.has_desired_output = 1;
    s.input_layout = input_layout;
    s.desired_input_layout = desired_input_layout;
    s.output_layout = output_layout;
    s.desired_output_layout = desired_output_layout;
    return s;
}

hp_tp_style_t hp_tp_with_input(hp_tp_style_t s, hp_placement_t input_layout) {
    s.has_input_layout = 1;
    s.input_layout = input_layout;
    return s;
}

hp_tp_style_t hp_tp_with_output(hp_tp_style_t s, hp_placement_t output_layout, int use_local_output) {
    s.has_output_layout = 1;
    s.output_layout = output_layout;
    s.use_local_output = use_local_output;
    return s;
}

const char *hp_tp_style_name(hp_tp_style_kind_t kind) {
    switch (kind) {
    case HP_TP_COLWISE: return "ColwiseParallel";
    case HP_TP_ROWWISE: return "RowwiseParallel";
    case HP_TP_SEQUENCE_PARALLEL: return "SequenceParallel";
    case HP_TP_PREPARE_INPUT: return "PrepareModuleInput";
    case HP_TP_PREPARE_OUTPUT: return "PrepareModuleOutput";
    case HP_TP_PREPARE_INPUT_OUTPUT: return "PrepareModuleInputOutput";
    case HP_TP_NO_PARALLEL: return "NoParallel";
    }
    return "?";
}

static int style_equal(const hp_tp_style_t *a, const hp_tp_style_t *b) {
    return memcmp(a, b, sizeof(*a)) == 0;
}

/* ---- plans ------------------------------------------------------------------------------- */

int hp_tp_plan_add(hp_tp_plan_entry_t *plan, int cap, int n, const char *pattern, hp_tp_style_t s) {
    if (plan && n < cap) {
        snprintf(plan[n].pattern, sizeof(plan[n].pattern), "%s", pattern);
        plan[n].style = s;
    }
    return n + 1;
}

/* ---- state ------------------------------------------------------------------------------- */

enum { MK_LINEAR, MK_EMBEDDING, MK_RMSNORM, MK_OTHER };

#define TP_MAX_CTX 64   /* micro-batch contexts a rowwise embedding tells apart */

/* Per-context state of a rowwise embedding: its token ids (the context's own copy). */
typedef struct tp_saved {
    const hp_act_t *act;
    const int32_t *tok;
    int64_t ntok;
    const float *edout;
    /* a split-backward context's own copy of the gathered / sliced output gradient: the inner
     * module keeps a pointer to it for its weight pass, which may run after the input passes
     * of later micro-batches (zero-bubble pipeline schedules); allocated at its first use */
    float *dbuf;
} tp_saved_t;

typedef struct tp_mod {
    hp_module_t wrap;       /* the wrapper: takes m's place in its parent; m is its child 0 */
    hp_module_t *m;         /* the wrapped module (untouched; it runs its params' local shards) */
    hp_module_t *parent;    /* m's parent (NULL: a unit's module, or a root of parallelize_modules) */
    int installed;          /* wrap stands in m's place */
    hp_tp_style_t style;
    int mk;
    struct hp_tp *tp;
    int acc_out;            /* rowwise linear: the module fuses a residual add (out +=) */
    int din_by_parent;      /* colwise: input grad left Partial for a PrepareModuleInput parent */
    int din_partial;        /* PrepareModuleInput: colwise children leave the input grad Partial */
    int reduce_own_grads;   /* the module's own params are Replicate over sharded work: reduce */
    int64_t in_f, out_f;    /* global features of a linear (in, out) / embedding (vocab, dim) */
    int64_t vocab_lo;       /* rowwise embedding: first owned row */
    float *in_buf, *dout_buf, *tmp, *tmp2, *gsave;
    size_t in_buf_n, dout_buf_n, tmp_n, tmp2_n, gsave_n;
    tp_saved_t saved[TP_MAX_CTX];   /* rowwise embedding: per context (token ids, output gradient) */
    int n_saved;
} tp_mod_t;

struct hp_tp {
    hp_mesh_t mesh;
    hp_comm_t comm;
    int k, rank;
    int n_mods;
    tp_mod_t *mods;
    int64_t max_rows;
    size_t buf_bytes;
    float *scratch;         /* shared gather / scatter scratch (tp_mod.tmp) */
    size_t scratch_n;
    hp_model_t model;
    /* loss_parallel: the module that replaced the model's cross-entropy (the head's child) */
    hp_module_t lp, *lp_parent, *lp_orig;
};

int hp_tp_degree(hp_tp_t tp) { return tp ? tp->k : 1; }
size_t hp_tp_buffer_bytes(hp_tp_t tp) { return tp ? tp->buf_bytes : 0; }

/* Puts `orig` back where `repl` stands (the model's tree, or a parent's children). */
static void put_back(hp_tp_t tp, hp_module_t *parent, hp_module_t *repl, hp_module_t *orig) {
    if (tp->model) (void)hp_model_replace_module(tp->model, parent, repl, orig);
    else if (parent) (void)hp_module_replace_child(parent, repl, orig);
}

void hp_tp_destroy(hp_tp_t tp) {
    if (!tp) return;
    if (tp->lp_orig) put_back(tp, tp->lp_parent, &tp->lp, tp->lp_orig);
    for (int i = tp->n_mods - 1; i >= 0; i--) {   // the modules go back in their parents (outer ones first)
        tp_mod_t *t = &tp->mods[i];
        if (t->installed) put_back(tp, t->parent, &t->wrap, t->m);
        hp_free_aligned(t->in_buf);
        hp_free_aligned(t->dout_buf);
        hp_free_aligned(t->tmp2);
        hp_free_aligned(t->gsave);
        for (int c = 0; c < t->n_saved; c++) hp_free_aligned(t->saved[c].dbuf);
    }
    hp_free_aligned(tp->scratch);
    free(tp->mods);
    free(tp);
}

/* ---- layout helpers ------------------------------------------------------------------------ */

/* Outer count of a sequence-sharded activation: Shard(0) of (N, C) = 1 block; Shard(1) of
 * (B, T, C) = B blocks. */
static int64_t outer_of(const hp_placement_t *p, const hp_act_t *act) {
    return p->dim == 0 ? 1 : (act && act->B > 0 ? act->B : 1);
}

/* dst (outer, k*S, C) = all-gather of src (outer, S, C) over the sequence dim. scratch holds
 * k*outer*S*C floats (unused when outer == 1). */
static hp_status_t gather_seq(hp_tp_t tp, float *dst, const float *src, int64_t outer, int64_t S, int64_t C,
                              float *scratch) {
    const size_t blk = (size_t)outer * S * C;
    if (outer == 1) return hp_all_gather(src, dst, blk, HP_F32, tp->comm, NULL);
    HP_TRY(hp_all_gather(src, scratch, blk, HP_F32, tp->comm, NULL));
    for (int r = 0; r < tp->k; r++)
        for (int64_t o = 0; o < outer; o++)
            memcpy(dst + ((size_t)o * tp->k * S + (size_t)r * S) * C, scratch + r * blk + (size_t)o * S * C,
                   sizeof(float) * (size_t)(S * C));
    return HP_OK;
}

/* dst (outer, S, C) = reduce-scatter (sum) of src (outer, k*S, C) over the sequence dim;
 * scratch holds k*outer*S*C floats (unused when outer == 1). */
static hp_status_t scatter_seq(hp_tp_t tp, float *dst, const float *src, int64_t outer, int64_t S, int64_t C,
                               float *scratch) {
    const size_t blk = (size_t)outer * S * C;
    if (outer == 1) return hp_reduce_scatter(src, dst, blk, HP_F32, HP_SUM, tp->comm, NULL);
    for (int r = 0; r < tp->k; r++)
        for (int64_t o = 0; o < outer; o++)
            memcpy(scratch + r * blk + (size_t)o * S * C, src + ((size_t)o * tp->k * S + (size_t)r * S) * C,
                   sizeof(float) * (size_t)(S * C));
    return hp_reduce_scatter(scratch, dst, blk, HP_F32, HP_SUM, tp->comm, NULL);
}

/* dst (N, k*Cl) = all-gather of the column shards src (N, Cl); scratch k*N*Cl floats. */
static hp_status_t gather_cols(hp_tp_t tp, float *dst, const float *src, int64_t N, int64_t Cl, float *scratch) {
    HP_TRY(hp_all_gather(src, scratch, (size_t)(N * Cl), HP_F32, tp->comm, NULL));
    for (int r = 0; r < tp->k; r++)
        for (int64_t n = 0; n < N; n++)
            memcpy(dst + (size_t)n * tp->k * Cl + (size_t)r * Cl, scratch + ((size_t)r * N + n) * Cl,
                   sizeof(float) * (size_t)Cl);
    return HP_OK;
}

/* dst (N, Cl) = this rank's columns of src (N, k*Cl); no communication. */
static void slice_cols(hp_tp_t tp, float *dst, const float *src, int64_t N, int64_t Cl) {
    for (int64_t n = 0; n < N; n++)
        memcpy(dst + (size_t)n * Cl, src + (size_t)n * tp->k * Cl + (size_t)tp->rank * Cl, sizeof(float) * (size_t)Cl);
}

/* dst (outer, S, C) = this rank's sequence chunk of src (outer, k*S, C); no communication. */
static void slice_seq(hp_tp_t tp, float *dst, const float *src, int64_t outer, int64_t S, int64_t C) {
    for (int64_t o = 0; o < outer; o++)
        memcpy(dst + (size_t)o * S * C, src + ((size_t)o * tp->k * S + (size_t)tp->rank * S) * C,
               sizeof(float) * (size_t)(S * C));
}


static int is_shard_seq(const hp_placement_t *p) { return p->kind == HP_SHARD && (p->dim == 0 || p->dim == 1); }
static int is_shard_last(const hp_placement_t *p) { return p->kind == HP_SHARD && p->dim == -1; }
static int is_rep(const hp_placement_t *p) { return p->kind == HP_REPLICATE; }

static hp_status_t need_buf(size_t have, size_t want, const tp_mod_t *t, const char *what) {
    if (want > have)
        return hp_error(HP_ERR_INVALID_ARG, "tensor parallel '%s': %s needs %zu floats, the buffer sized at "
                        "parallelize time holds %zu; hint: pass a larger max_rows", t->m->name, what, want, have);
    return HP_OK;
}

/* Parameter grads of module m: all-reduced over TP (Replicate params whose work is sharded).
 * The accumulated value from earlier microbatches is kept aside so only this backward's
 * contribution is summed. */
static hp_status_t reduce_own_grads(tp_mod_t *t, hp_status_t (*bw)(hp_module_t *, hp_act_t *), hp_act_t *act) {
    hp_module_t *m = t->m;
    size_t off = 0;
    for (int i = 0; i < m->n_params; i++) {
        hp_tensor_t *g = &m->params[i]->grad.local;
        size_t n = (size_t)hp_tensor_numel(g);
        memcpy(t->gsave + off, g->data, sizeof(float) * n);
        memset(g->data, 0, sizeof(float) * n);
        off += n;
    }
    HP_TRY(bw(t->m, act));
    off = 0;
    for (int i = 0; i < m->n_params; i++) {
        hp_tensor_t *g = &m->params[i]->grad.local;
        size_t n = (size_t)hp_tensor_numel(g);
        float *gd = g->data;
        HP_TRY(hp_all_reduce(gd, gd, n, HP_F32, HP_SUM, t->tp->comm, NULL));
        for (size_t j = 0; j < n; j++) gd[j] += t->gsave[off + j];
        off += n;
    }
    return HP_OK;
}

static tp_mod_t *mod_of(hp_module_t *m) { return (tp_mod_t *)m->impl; }
static int is_wrapper(const hp_module_t *m);
/* The module a TP wrapper holds, or m itself. */
static hp_module_t *unwrapped(hp_module_t *m) { return is_wrapper(m) ? mod_of(m)->m : m; }

/* The wrapped module's sizes as it runs them: its weights' local shapes (the shards apply()
 * laid out). A linear: in features, (stacked) out features; an embedding: rows, columns. */
static int64_t lin_in(const tp_mod_t *t) { return t->m->params[0]->value.local.shape[1]; }
static int64_t lin_out(const tp_mod_t *t) {
    const hp_linear_impl_t *L = t->m->impl;
    int64_t rows = 0;
    for (int i = 0; i < L->n_weights; i++) rows += t->m->params[i]->value.local.shape[0];
    return rows;
}
static int64_t emb_rows(const tp_mod_t *t) { return t->m->params[0]->value.local.shape[0]; }
static int64_t emb_cols(const tp_mod_t *t) { return t->m->params[0]->value.local.shape[1]; }

/* ---- wrapper ops ------------------------------------------------------------------------------ */

static size_t w_act_bytes(const hp_module_t *m, int B, int T) {
    const tp_mod_t *t = (const tp_mod_t *)m->impl;
    size_t own = t->in_buf_n ? (t->in_buf_n * sizeof(float) + 128) : 0;   // the gathered input, aligned
    return own + (t->m->ops->act_bytes ? t->m->ops->act_bytes(t->m, B, T) : 0);
}

/* The gathered input of this micro-batch, from the context's arena: the inner module keeps a
 * pointer to it for its weight gradient, so it must live as long as the context's forward. */
static float *gathered_input(tp_mod_t *t, hp_act_t *act) { return hp_act_alloc(act, sizeof(float) * t->in_buf_n); }

static tp_saved_t *saved_of(tp_mod_t *t, const hp_act_t *act, int create) {
    for (int i = 0; i < t->n_saved; i++)
        if (t->saved[i].act == act) return &t->saved[i];
    if (!create) return NULL;
    if (t->n_saved == TP_MAX_CTX) return NULL;
    tp_saved_t *s = &t->saved[t->n_saved++];
    memset(s, 0, sizeof *s);
    s->act = act;
    return s;
}

/* Where the output gradient a wrapper hands to its inner module goes: the module's shared
 * buffer when the weight pass follows directly, else (a split-backward context) the context's
 * own buffer, so a deferred weight pass reads its micro-batch's gradient. */
static hp_status_t dout_dest(tp_mod_t *t, hp_act_t *act, size_t want, const char *what, float **out) {
    HP_TRY(need_buf(t->dout_buf_n, want, t, what));
    *out = t->dout_buf;
    if (!act->keep_recompute) return HP_OK;
    tp_saved_t *sv = saved_of(t, act, 1);
    if (!sv)
        return hp_error(HP_ERR_UNSUPPORTED, "tensor parallel '%s': more than %d split-backward micro-batch contexts; "
                        "hint: fewer micro-batches in flight", t->m->name, TP_MAX_CTX);
    if (!sv->dbuf) {   // once per context (the first step), reused by every later step
        sv->dbuf = hp_aligned_alloc(sizeof(float) * t->dout_buf_n);
        if (!sv->dbuf) return HP_ERR_OOM;
        t->tp->buf_bytes += sizeof(float) * t->dout_buf_n;
    }
    *out = sv->dbuf;
    return HP_OK;
}

static size_t w_scratch(const hp_module_t *m, int B, int T) {
    const tp_mod_t *t = (const tp_mod_t *)m->impl;
    int gathers = (t->style.kind == HP_TP_PREPARE_INPUT || t->style.kind == HP_TP_PREPARE_INPUT_OUTPUT) &&
                  t->style.input_layout.kind == HP_SHARD && t->style.input_layout.dim == 1;
    if (!t->m->ops->grad_scratch_floats) return 0;
    return t->m->ops->grad_scratch_floats(t->m, B, gathers ? T * t->tp->k : T);
}

static hp_status_t w_backward_weight(hp_module_t *m, hp_act_t *act) {
    tp_mod_t *t = mod_of(m);
    if (t->reduce_own_grads && t->m->n_params > 0) return reduce_own_grads(t, hp_module_backward_weight, act);
    return hp_module_backward_weight(t->m, act);
}

/* Linear, ColwiseParallel: weight Shard(0) (each stacked param by its own rows). */
static hp_status_t col_linear_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    tp_mod_t *t = mod_of(m);
    hp_tp_t tp = t->tp;
    const int64_t IC = lin_in(t), OC = lin_out(t);
    hp_tensor_t x = *in, y;
    int64_t rows = hp_tensor_rows(in);
    if (is_shard_seq(&t->style.input_layout)) {   // all-gather the input rows
        int64_t outer = outer_of(&t->style.input_layout, act);
        HP_TRY(need_buf(t->in_buf_n, (size_t)(rows * tp->k * IC), t, "the gathered input"));
        float *ib = gathered_input(t, act);
        HP_TRY(gather_seq(tp, ib, in->data, outer, rows / outer, IC, t->tmp));
        rows *= tp->k;
        hp_tensor_view2(&x, ib, rows, IC);
    }
    if (is_rep(&t->style.output_layout)) {   // all-gather the output columns
        HP_TRY(need_buf(t->tmp2_n, (size_t)(rows * OC), t, "the local output"));
        hp_tensor_view2(&y, t->tmp2, rows, OC);
        HP_TRY(hp_module_forward(t->m, act, &x, &y));
        return gather_cols(tp, out->data, t->tmp2, rows, OC, t->tmp);
    }
    return hp_module_forward(t->m, act, &x, out);
}

static hp_status_t col_linear_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    tp_mod_t *t = mod_of(m);
    hp_tp_t tp = t->tp;
    const hp_linear_impl_t *L = t->m->impl;
    const int64_t IC = lin_in(t), OC = lin_out(t);
    int64_t rows = hp_tensor_rows(dout);
    hp_tensor_t dy = *dout, dx;
    if (is_rep(&t->style.output_layout)) {   // this rank's columns of the replicated gradient
        float *db;
        HP_TRY(dout_dest(t, act, (size_t)(rows * OC), "the output gradient", &db));
        slice_cols(tp, db, dout->data, rows, OC);
        hp_tensor_view2(&dy, db, rows, OC);
    }
    if (!din) return hp_module_backward_input(t->m, act, &dy, NULL);
    if (is_shard_seq(&t->style.input_layout)) {   // Partial (rows*k... ) -> reduce-scatter
        int64_t outer = outer_of(&t->style.input_layout, act);
        hp_tensor_view2(&dx, t->tmp2, rows, IC);
        HP_TRY(need_buf(t->tmp2_n, (size_t)(rows * IC), t, "the input gradient"));
        HP_TRY(hp_module_backward_input(t->m, act, &dy, &dx));
        return scatter_seq(tp, din->data, t->tmp2, outer, rows / tp->k / outer, IC, t->tmp);
    }
    if (t->din_by_parent) return hp_module_backward_input(t->m, act, &dy, din);
    if (L->accumulate_input_grad) {   // din += allreduce(partial): the module adds into zeroed scratch
        HP_TRY(need_buf(t->tmp2_n, (size_t)(rows * IC), t, "the input gradient"));
        hp_tensor_view2(&dx, t->tmp2, rows, IC);
        memset(t->tmp2, 0, sizeof(float) * (size_t)(rows * IC));
        HP_TRY(hp_module_backward_input(t->m, act, &dy, &dx));
        HP_TRY(hp_all_reduce(t->tmp2, t->tmp2, (size_t)(rows * IC), HP_F32, HP_SUM, tp->comm, NULL));
        hp_add_inplace(din->data, t->tmp2, rows * IC);
        return HP_OK;
    }
    HP_TRY(hp_module_backward_input(t->m, act, &dy, din));
    return hp_all_reduce(din->data, din->data, (size_t)(rows * IC), HP_F32, HP_SUM, tp->comm, NULL);
}

/* The split an activation layout means (nn.h act_split): Shard(0|1) rows, Shard(-1) columns. */
static hp_act_split_t split_of(const tp_mod_t *t, const hp_placement_t *p) {
    return (hp_act_split_t){is_shard_seq(p) ? t->tp->k : 1, is_shard_last(p) ? t->tp->k : 1};
}

/* Colwise and rowwise wrappers decide both sides: the style's input layout, and its output
 * layout (a colwise module's rows are whole again after it gathered a sequence-sharded input;
 * a rowwise module's input is its column shard). */
static int w_act_split(const hp_module_t *m, int output, hp_act_split_t *s) {
    const tp_mod_t *t = m->impl;
    const int col = t->style.kind == HP_TP_COLWISE;
    if (output) {
        *s = split_of(t, &t->style.output_layout);
        if (col) s->seq = 1;
    } else {
        *s = col || t->mk == MK_EMBEDDING ? split_of(t, &t->style.input_layout) : (hp_act_split_t){1, t->tp->k};
    }
    return 1;
}

static const hp_module_ops_t col_linear_ops = {
    "tp_colwise", w_act_bytes, w_scratch, col_linear_forward, col_linear_backward_input, w_backward_weight,
    w_act_split,
};

/* Linear, RowwiseParallel: weight Shard(1), input Shard(-1), output Partial -> Replicate
 * (all-reduce) or Shard(seq) (reduce-scatter). */
static hp_status_t row_linear_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    tp_mod_t *t = mod_of(m);
    hp_tp_t tp = t->tp;
    const int64_t rows = hp_tensor_rows(in), OC = lin_out(t);
    hp_tensor_t y;
    if (is_rep(&t->style.output_layout)) {
        if (!t->acc_out) {
            HP_TRY(hp_module_forward(t->m, act, in, out));
            return hp_all_reduce(out->data, out->data, (size_t)(rows * OC), HP_F32, HP_SUM, tp->comm, NULL);
        }
        // the module adds its partial product into zeroed scratch; the reduced sum joins out
        HP_TRY(need_buf(t->tmp2_n, (size_t)(rows * OC), t, "the partial output"));
        hp_tensor_view2(&y, t->tmp2, rows, OC);
        memset(t->tmp2, 0, sizeof(float) * (size_t)(rows * OC));
        HP_TRY(hp_module_forward(t->m, act, in, &y));
        HP_TRY(hp_all_reduce(t->tmp2, t->tmp2, (size_t)(rows * OC), HP_F32, HP_SUM, tp->comm, NULL));
        hp_add_inplace(out->data, t->tmp2, rows * OC);
        return HP_OK;
    }
    // Shard(seq): reduce-scatter rows
    const int64_t outer = outer_of(&t->style.output_layout, act), lrows = rows / tp->k;
    HP_TRY(need_buf(t->tmp2_n, (size_t)(rows * OC), t, "the partial output"));
    hp_tensor_view2(&y, t->tmp2, rows, OC);
    if (t->acc_out) memset(t->tmp2, 0, sizeof(float) * (size_t)(rows * OC));
    HP_TRY(hp_module_forward(t->m, act, in, &y));
    if (!t->acc_out) return scatter_seq(tp, out->data, t->tmp2, outer, lrows / outer, OC, t->tmp);
    HP_TRY(scatter_seq(tp, t->dout_buf, t->tmp2, outer, lrows / outer, OC, t->tmp));
    hp_add_inplace(out->data, t->dout_buf, lrows * OC);
    return HP_OK;
}

static hp_status_t row_linear_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    tp_mod_t *t = mod_of(m);
    hp_tp_t tp = t->tp;
    const int64_t OC = lin_out(t);
    if (is_rep(&t->style.output_layout)) return hp_module_backward_input(t->m, act, dout, din);
    // Shard(seq) output: all-gather the gradient rows (kept for backward_weight)
    const int64_t lrows = hp_tensor_rows(dout), outer = outer_of(&t->style.output_layout, act);
    float *db;
    HP_TRY(dout_dest(t, act, (size_t)(lrows * tp->k * OC), "the gathered output gradient", &db));
    HP_TRY(gather_seq(tp, db, dout->data, outer, lrows / outer, OC, t->tmp));
    hp_tensor_t dy;
    hp_tensor_view2(&dy, db, lrows * tp->k, OC);
    return hp_module_backward_input(t->m, act, &dy, din);
}

static const hp_module_ops_t row_linear_ops = {
    "tp_rowwise", w_act_bytes, w_scratch, row_linear_forward, row_linear_backward_input, w_backward_weight,
    w_act_split,
};

/* Embedding, RowwiseParallel: weight Shard(0) (vocab rows [lo, lo + V/k)), input Replicate
 * token ids, output Partial -> Replicate (all-reduce) or Shard(seq) (reduce-scatter). */
static hp_status_t row_emb_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    tp_mod_t *t = mod_of(m);
    hp_tp_t tp = t->tp;
    const int64_t EV = emb_rows(t), EC = emb_cols(t);
    if (!in || in->dtype != HP_I32 || !in->data)
        return hp_error(HP_ERR_INVALID_ARG, "embedding '%s': input must be i32 token ids", m->name);
    int64_t N = 1;
    for (int i = 0; i < in->ndim; i++) N *= in->shape[i];
    const int32_t *tok = in->data;
    const int64_t V = t->in_f, C = EC, lo = t->vocab_lo, hi = lo + EV;
    for (int64_t n = 0; n < N; n++)
        if (tok[n] < 0 || tok[n] >= V)
            return hp_error(HP_ERR_INVALID_ARG, "embedding '%s': token %d at position %lld is outside [0, %lld); "
                            "hint: does the tokenizer match the model's vocab_size?", m->name, tok[n],
                            (long long)n, (long long)V);
    tp_saved_t *sv = saved_of(t, act, 1);
    if (!sv)
        return hp_error(HP_ERR_UNSUPPORTED, "embedding '%s': more than %d micro-batch contexts in use with tensor "
                        "parallel", m->name, TP_MAX_CTX);
    sv->tok = tok;   // the context's own token ids (hp_model_ctx_begin copies them)
    sv->ntok = N;
    const int seq = is_shard_seq(&t->style.output_layout);
    HP_TRY(need_buf(t->tmp2_n, (size_t)(N * C), t, "the partial embedding"));
    float *y = seq ? t->tmp2 : out->data;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        float *dst = y + (size_t)n * C;
        if (tok[n] >= lo && tok[n] < hi) memcpy(dst, hp_param_w(t->m->params[0]) + (size_t)(tok[n] - lo) * C, sizeof(float) * (size_t)C);
        else memset(dst, 0, sizeof(float) * (size_t)C);
    }
    if (!seq) return hp_all_reduce(y, y, (size_t)(N * C), HP_F32, HP_SUM, tp->comm, NULL);
    const int64_t outer = outer_of(&t->style.output_layout, act);
    return scatter_seq(tp, out->data, y, outer, N / tp->k / outer, C, t->tmp);
}

static hp_status_t row_emb_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    tp_mod_t *t = mod_of(m);
    const int64_t EC = emb_cols(t);
    tp_saved_t *sv = saved_of(t, act, 0);
    HP_ASSERT_MSG(sv != NULL, "embedding '%s': backward without its forward in this context", m->name);
    if (!is_shard_seq(&t->style.output_layout)) {
        sv->edout = dout->data;
        return HP_OK;
    }
    const int64_t lrows = hp_tensor_rows(dout), outer = outer_of(&t->style.output_layout, act);
    float *db;
    HP_TRY(dout_dest(t, act, (size_t)(lrows * t->tp->k * EC), "the gathered output gradient", &db));
    HP_TRY(gather_seq(t->tp, db, dout->data, outer, lrows / outer, EC, t->tmp));
    sv->edout = db;   // used by this context's backward_weight
    return HP_OK;
}

static hp_status_t row_emb_backward_weight(hp_module_t *m, hp_act_t *act) {
    tp_mod_t *t = mod_of(m);
    const int64_t EV = emb_rows(t), EC = emb_cols(t);
    tp_saved_t *sv = saved_of(t, act, 0);
    HP_ASSERT_MSG(sv && sv->edout != NULL, "embedding '%s': backward_weight before backward_input", m->name);
    const int64_t C = EC, lo = t->vocab_lo, hi = lo + EV;
    // in token order per row (as the single-rank kernel: each vocab row sums its tokens in order)
    for (int64_t n = 0; n < sv->ntok; n++) {
        int32_t v = sv->tok[n];
        if (v < lo || v >= hi) continue;
        float *dw = hp_param_g(t->m->params[0]) + (size_t)(v - lo) * C;
        const float *g = sv->edout + (size_t)n * C;
        for (int64_t c = 0; c < C; c++) dw[c] += g[c];
    }
    sv->edout = NULL;
    return HP_OK;
}

static const hp_module_ops_t row_emb_ops = {
    "tp_rowwise", w_act_bytes, w_scratch, row_emb_forward, row_emb_backward_input, row_emb_backward_weight,
    w_act_split,
};

/* Embedding, ColwiseParallel: weight Shard(1), output Shard(-1) (default) or Replicate. */
static hp_status_t col_emb_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    tp_mod_t *t = mod_of(m);
    const int64_t EC = emb_cols(t);
    if (!is_rep(&t->style.output_layout)) return hp_module_forward(t->m, act, in, out);
    int64_t N = 1;
    for (int i = 0; i < in->ndim; i++) N *= in->shape[i];
    HP_TRY(need_buf(t->tmp2_n, (size_t)(N * EC), t, "the local embedding"));
    hp_tensor_t y;
    hp_tensor_view2(&y, t->tmp2, N, EC);
    HP_TRY(hp_module_forward(t->m, act, in, &y));
    return gather_cols(t->tp, out->data, t->tmp2, N, EC, t->tmp);
}

static hp_status_t col_emb_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    tp_mod_t *t = mod_of(m);
    const int64_t EC = emb_cols(t);
    if (!is_rep(&t->style.output_layout)) return hp_module_backward_input(t->m, act, dout, din);
    const int64_t N = hp_tensor_rows(dout);
    float *db;
    HP_TRY(dout_dest(t, act, (size_t)(N * EC), "the output gradient", &db));
    slice_cols(t->tp, db, dout->data, N, EC);
    hp_tensor_t dy;
    hp_tensor_view2(&dy, db, N, EC);
    return hp_module_backward_input(t->m, act, &dy, din);
}

static const hp_module_ops_t col_emb_ops = {
    "tp_colwise", w_act_bytes, w_scratch, col_emb_forward, col_emb_backward_input, w_backward_weight,
    w_act_split,
};

/* SequenceParallel: runs on the local sequence shard; Replicate params whose grads are
 * Partial over TP are all-reduced in backward_weight. NoParallel: replicated work. */
static hp_status_t pass_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    return hp_module_forward(mod_of(m)->m, act, in, out);
}
static hp_status_t pass_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    return hp_module_backward_input(mod_of(m)->m, act, dout, din);
}
static hp_status_t pass_backward_weight_inner(hp_module_t *inner, hp_act_t *act) {
    return inner->ops->backward_weight ? inner->ops->backward_weight(inner, act) : HP_OK;
}
static hp_status_t sp_backward_weight(hp_module_t *m, hp_act_t *act) {
    tp_mod_t *t = mod_of(m);
    if (t->m->n_params == 0) return hp_module_backward_weight(t->m, act);
    return reduce_own_grads(t, pass_backward_weight_inner, act);
}
/* SequenceParallel: the sequence stays sharded through the module. */
static int sp_act_split(const hp_module_t *m, int output, hp_act_split_t *s) {
    (void)output;
    *s = (hp_act_split_t){((const tp_mod_t *)m->impl)->tp->k, 1};
    return 1;
}
static const hp_module_ops_t sp_ops = {
    "tp_sequence_parallel", w_act_bytes, w_scratch, pass_forward, pass_backward_input, sp_backward_weight,
    sp_act_split,
};
static const hp_module_ops_t np_ops = {
    "tp_no_parallel", w_act_bytes, w_scratch, pass_forward, pass_backward_input, w_backward_weight, NULL,
};

/* PrepareModuleInput / Output / InputOutput around any module (the model's attention and
 * feed_forward). Input Shard(1) -> Replicate: all-gather (the module then runs on the full
 * sequence: hp_act_t.T is multiplied by k during the call); backward: the input gradient,
 * Partial from the colwise children, is reduce-scattered. Input Replicate -> Replicate: no
 * forward comm; the Partial input gradient is all-reduced. Output layout changes: Shard(seq)
 * -> Replicate all-gathers (backward slices), Replicate -> Shard(seq) slices (backward
 * all-gathers). */
static int prep_in(const tp_mod_t *t) {
    return t->style.kind == HP_TP_PREPARE_INPUT || t->style.kind == HP_TP_PREPARE_INPUT_OUTPUT;
}
static int prep_out(const tp_mod_t *t) {
    return t->style.kind == HP_TP_PREPARE_OUTPUT || t->style.kind == HP_TP_PREPARE_INPUT_OUTPUT;
}

static hp_status_t prep_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    tp_mod_t *t = mod_of(m);
    hp_tp_t tp = t->tp;
    hp_tensor_t x = *in, y = *out;
    int saved_T = act->T, seq_gather = 0;
    if (prep_in(t) && is_shard_seq(&t->style.input_layout) && is_rep(&t->style.desired_input_layout)) {
        const int64_t rows = hp_tensor_rows(in), C = in->shape[in->ndim - 1], outer = outer_of(&t->style.input_layout, act);
        HP_TRY(need_buf(t->in_buf_n, (size_t)(rows * tp->k * C), t, "the gathered input"));
        float *ib = gathered_input(t, act);
        HP_TRY(gather_seq(tp, ib, in->data, outer, rows / outer, C, t->tmp));
        hp_tensor_view2(&x, ib, rows * tp->k, C);
        if (t->style.input_layout.dim == 1) {
            act->T = saved_T * tp->k;
            seq_gather = 1;
        }
    }
    const int out_change = prep_out(t) && !(t->style.output_layout.kind == t->style.desired_output_layout.kind &&
                                            t->style.output_layout.dim == t->style.desired_output_layout.dim);
    if (out_change) {
        // the module writes its natural layout into tmp2, converted into out
        const int64_t C = out->shape[out->ndim - 1];
        int64_t orows = hp_tensor_rows(out);
        if (is_rep(&t->style.output_layout)) orows *= tp->k;        // R -> Shard: module writes full rows
        else orows /= tp->k;                                          // Shard -> R
        HP_TRY(need_buf(t->tmp2_n, (size_t)(orows * C), t, "the module output"));
        hp_tensor_view2(&y, t->tmp2, orows, C);
    }
    hp_status_t st = hp_module_forward(t->m, act, &x, &y);
    if (seq_gather) act->T = saved_T;
    HP_TRY(st);
    if (out_change) {
        const int64_t C = out->shape[out->ndim - 1], rows = hp_tensor_rows(&y);
        const hp_placement_t *sp = is_rep(&t->style.output_layout) ? &t->style.desired_output_layout
                                                                    : &t->style.output_layout;
        const int64_t outer = outer_of(sp, act);
        if (is_rep(&t->style.output_layout))
            slice_seq(tp, out->data, t->tmp2, outer, rows / tp->k / outer, C);
        else
            HP_TRY(gather_seq(tp, out->data, t->tmp2, outer, rows / outer, C, t->tmp));
    }
    return HP_OK;
}

static hp_status_t prep_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    tp_mod_t *t = mod_of(m);
    hp_tp_t tp = t->tp;
    hp_tensor_t dy = *dout, dx;
    const int out_change = prep_out(t) && !(t->style.output_layout.kind == t->style.desired_output_layout.kind &&
                                            t->style.output_layout.dim == t->style.desired_output_layout.dim);
    if (out_change) {
        const int64_t C = dout->shape[dout->ndim - 1], rows = hp_tensor_rows(dout);
        const hp_placement_t *sp = is_rep(&t->style.output_layout) ? &t->style.desired_output_layout
                                                                    : &t->style.output_layout;
        const int64_t outer = outer_of(sp, act);
        if (is_rep(&t->style.output_layout)) {   // module output was full: gather the grad
            float *db;
            HP_TRY(dout_dest(t, act, (size_t)(rows * tp->k * C), "the output gradient", &db));
            HP_TRY(gather_seq(tp, db, dout->data, outer, rows / outer, C, t->tmp));
            hp_tensor_view2(&dy, db, rows * tp->k, C);
        } else {                                  // module output was a shard: slice
            float *db;
            HP_TRY(dout_dest(t, act, (size_t)(rows / tp->k * C), "the output gradient", &db));
            slice_seq(tp, db, dout->data, outer, rows / tp->k / outer, C);
            hp_tensor_view2(&dy, db, rows / tp->k, C);
        }
    }
    const int gathered = prep_in(t) && is_shard_seq(&t->style.input_layout) && is_rep(&t->style.desired_input_layout);
    if (!din) return hp_module_backward_input(t->m, act, &dy, din);
    const int64_t rows = hp_tensor_rows(din), C = din->shape[din->ndim - 1];
    if (!t->din_partial) {
        // a Replicate input gradient: Shard(seq) input takes its local chunk (no comm)
        if (!gathered) return hp_module_backward_input(t->m, act, &dy, din);
        const int64_t outer = outer_of(&t->style.input_layout, act);
        HP_TRY(need_buf(t->tmp2_n, (size_t)(rows * tp->k * C), t, "the input gradient"));
        hp_tensor_view2(&dx, t->tmp2, rows * tp->k, C);
        HP_TRY(hp_module_backward_input(t->m, act, &dy, &dx));
        slice_seq(tp, din->data, t->tmp2, outer, rows / outer, C);
        return HP_OK;
    }
    // the input stayed a DTensor for the colwise children: their input grads are Partial
    if (is_shard_seq(&t->style.input_layout)) {
        const int64_t outer = outer_of(&t->style.input_layout, act);
        HP_TRY(need_buf(t->tmp2_n, (size_t)(rows * tp->k * C), t, "the input gradient"));
        hp_tensor_view2(&dx, t->tmp2, rows * tp->k, C);
        HP_TRY(hp_module_backward_input(t->m, act, &dy, &dx));
        return scatter_seq(tp, din->data, t->tmp2, outer, rows / outer, C, t->tmp);
    }
    HP_TRY(hp_module_backward_input(t->m, act, &dy, din));
    return hp_all_reduce(din->data, din->data, (size_t)(rows * C), HP_F32, HP_SUM, tp->comm, NULL);
}

/* PrepareModule*: the layouts the style names (input: input_layouts; output: the desired
 * output layouts); a side the style leaves alone is not decided here. */
static int prep_act_split(const hp_module_t *m, int output, hp_act_split_t *s) {
    const tp_mod_t *t = m->impl;
    if (output ? !prep_out(t) : !prep_in(t)) return 0;
    *s = split_of(t, output ? &t->style.desired_output_layout : &t->style.input_layout);
    return 1;
}
static const hp_module_ops_t prep_ops = {
    "tp_prepare", w_act_bytes, w_scratch, prep_forward, prep_backward_input, w_backward_weight, prep_act_split,
};


/* ---- parallelize ---------------------------------------------------------------------------- */

static int module_kind(const hp_module_t *m) {
    const char *k = m->ops && m->ops->kind ? m->ops->kind : "";
    if (strcmp(k, "linear") == 0) return MK_LINEAR;
    if (strcmp(k, "embedding") == 0) return MK_EMBEDDING;
    if (strcmp(k, "rmsnorm") == 0) return MK_RMSNORM;
    return MK_OTHER;
}

/* Names a module answers to: its own, and for a stacked linear its params' module names. */
static int module_names(const hp_module_t *m, char names[][HP_PARAM_NAME_MAX], int cap) {
    int n = 0;
    snprintf(names[n++], HP_PARAM_NAME_MAX, "%s", m->name);
    if (module_kind(m) == MK_LINEAR && m->n_params > 1) {
        for (int i = 0; i < m->n_params && n < cap; i++) {
            const char *pn = m->params[i]->name;
            size_t len = strlen(pn);
            if (len > 7 && strcmp(pn + len - 7, ".weight") == 0) len -= 7;
            snprintf(names[n++], HP_PARAM_NAME_MAX, "%.*s", (int)len, pn);
        }
    }
    return n;
}

static void collect(hp_module_t *m, hp_module_t **list, int *n, int cap) {
    for (int i = 0; i < *n && i < cap; i++)
        if (list[i] == m) return;
    if (*n < cap) list[*n] = m;
    (*n)++;
    for (int c = 0; c < m->n_children; c++) collect(m->children[c], list, n, cap);
}

static void set_param_layout(hp_param_t *p, hp_tp_t tp, hp_placement_t pl, const int64_t *lshape, float *v, float *g) {
    hp_dtensor_t *ts[2] = {&p->value, &p->grad};
    float *data[2] = {v, g};
    for (int k = 0; k < 2; k++) {
        hp_dtensor_t *d = ts[k];
        d->mesh = tp->mesh;
        d->mesh_ndim = 1;
        d->placements[0] = pl;
        if (lshape) {
            int nd = d->local.ndim;
            for (int i = 0; i < nd; i++) d->local.shape[i] = lshape[i];
            int64_t st = 1;
            for (int i = nd - 1; i >= 0; i--) { d->local.stride[i] = st; st *= lshape[i]; }
            d->local.data = data[k];
        }
    }
}

/* "1, 2, 4, 8": the TP degrees that divide n (for the hint of a divisibility error); the
 * library does not know config keys, the trainer names them (src/train/trainer.c). */
static const char *tp_divisors(int64_t n, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = 0;
    for (int64_t d = 1; d <= n && o + 24 < cap; d++)
        if (n % d == 0) o += (size_t)snprintf(buf + o, cap - o, "%s%lld", o ? ", " : "", (long long)d);
    return buf;
}

/* Validates one (module, style) pair; fills the linear/embedding sizes. */
static hp_status_t check_pair(hp_tp_t tp, hp_module_t *m, const hp_tp_style_t *s, const char *pattern) {
    const int mk = module_kind(m), k = tp->k;
    const char *sn = hp_tp_style_name(s->kind);
    switch (s->kind) {
    case HP_TP_COLWISE:
    case HP_TP_ROWWISE:
        if (mk != MK_LINEAR && mk != MK_EMBEDDING)
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' applies %s to module '%s' of "
                            "kind '%s'; %s supports only linear and embedding modules (NotImplementedError in "
                            "PyTorch); hint: use PrepareModuleInput/Output for composite modules",
                            pattern, sn, m->name, m->ops->kind, sn);
        break;
    case HP_TP_SEQUENCE_PARALLEL:
        if (mk != MK_RMSNORM)
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' applies SequenceParallel to "
                            "module '%s' of kind '%s'; here it supports rmsnorm modules (rowwise ops over the "
                            "sequence)", pattern, m->name, m->ops->kind);
        break;
    case HP_TP_PREPARE_INPUT:
    case HP_TP_PREPARE_OUTPUT:
    case HP_TP_PREPARE_INPUT_OUTPUT:
        if (mk == MK_EMBEDDING && prep_in(&(tp_mod_t){.style = *s}))
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s': %s on embedding '%s' (token "
                            "ids cannot be redistributed here)", pattern, sn, m->name);
        break;
    case HP_TP_NO_PARALLEL:
        break;
    }
    // layouts
    if (s->kind == HP_TP_COLWISE) {
        if (s->has_input_layout && !is_rep(&s->input_layout) && !is_shard_seq(&s->input_layout))
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' (module '%s'): ColwiseParallel "
                            "input_layouts must be Replicate, Shard(0) or Shard(1)", pattern, m->name);
        if (s->has_output_layout && !is_rep(&s->output_layout) && !is_shard_last(&s->output_layout))
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' (module '%s'): ColwiseParallel "
                            "output_layouts must be Shard(-1) or Replicate", pattern, m->name);
        if (mk == MK_EMBEDDING && s->has_input_layout && !is_rep(&s->input_layout))
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' (embedding '%s'): input must be "
                            "Replicate token ids", pattern, m->name);
    }
    if (s->kind == HP_TP_ROWWISE) {
        if (mk == MK_LINEAR && s->has_input_layout && !is_shard_last(&s->input_layout))
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' (linear '%s'): RowwiseParallel "
                            "input_layouts other than Shard(-1) are not supported; hint: put the colwise "
                            "producer before it", pattern, m->name);
        if (mk == MK_EMBEDDING && s->has_input_layout && !is_rep(&s->input_layout))
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' (embedding '%s'): input must be "
                            "Replicate token ids", pattern, m->name);
        if (s->has_output_layout && !is_rep(&s->output_layout) && !is_shard_seq(&s->output_layout))
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' (module '%s'): RowwiseParallel "
                            "output_layouts must be Replicate, Shard(0) or Shard(1)", pattern, m->name);
    }
    if (prep_in(&(tp_mod_t){.style = *s})) {
        const hp_placement_t *a = &s->input_layout, *b = &s->desired_input_layout;
        int ok = (is_rep(a) && is_rep(b)) || (is_shard_seq(a) && is_rep(b)) || (is_shard_seq(a) && is_shard_seq(b) && a->dim == b->dim);
        if (!ok)
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' (module '%s'): PrepareModuleInput "
                            "supports Replicate->Replicate and Shard(0|1)->Replicate", pattern, m->name);
    }
    if (prep_out(&(tp_mod_t){.style = *s})) {
        const hp_placement_t *a = &s->output_layout, *b = &s->desired_output_layout;
        int ok = (is_rep(a) && is_rep(b)) || (is_shard_seq(a) && is_rep(b)) || (is_rep(a) && is_shard_seq(b)) ||
                 (is_shard_seq(a) && is_shard_seq(b) && a->dim == b->dim);
        if (!ok)
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' (module '%s'): PrepareModuleOutput "
                            "supports Replicate<->Shard(0|1)", pattern, m->name);
    }
    // divisibility
    char dv[256];
    if (mk == MK_LINEAR && (s->kind == HP_TP_COLWISE || s->kind == HP_TP_ROWWISE)) {
        const hp_linear_impl_t *L = m->impl;
        if (s->kind == HP_TP_COLWISE) {
            for (int i = 0; i < m->n_params; i++) {
                const hp_param_t *p = m->params[i];
                if (L->has_bias && i == L->n_weights) continue;
                if (p->value.local.shape[0] % k != 0)
                    return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: ColwiseParallel on '%s': parameter '%s' has "
                                    "%lld rows, not divisible by the TP degree %d; hint: degrees dividing it: %s",
                                    m->name, p->name, (long long)p->value.local.shape[0], k,
                                    tp_divisors(p->value.local.shape[0], dv, sizeof dv));
            }
            if (L->has_bias)
                return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: linear '%s' has a bias; sharded biases are "
                                "not implemented (the llama/qwen models have none)", m->name);
        } else if (L->in_features % k != 0) {
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: RowwiseParallel on '%s': in_features %d is not "
                            "divisible by the TP degree %d; hint: degrees dividing it: %s", m->name, L->in_features, k,
                            tp_divisors(L->in_features, dv, sizeof dv));
        }
    }
    if (mk == MK_EMBEDDING && (s->kind == HP_TP_COLWISE || s->kind == HP_TP_ROWWISE)) {
        const hp_embedding_impl_t *E = m->impl;
        int64_t n = s->kind == HP_TP_ROWWISE ? E->vocab : E->dim;
        if (n % k != 0)
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: %s on embedding '%s': %s %lld is not divisible by "
                            "the TP degree %d; hint: degrees dividing it: %s", sn, m->name,
                            s->kind == HP_TP_ROWWISE ? "vocab" : "dim", (long long)n, k, tp_divisors(n, dv, sizeof dv));
    }
    return HP_OK;
}

static hp_status_t alloc_buf(hp_tp_t tp, float **p, size_t *cap, size_t n) {
    if (n == 0) return HP_OK;
    *p = hp_aligned_alloc(sizeof(float) * n);
    if (!*p) return hp_error(HP_ERR_OOM, "tensor parallel: %zu bytes of buffers", sizeof(float) * n);
    memset(*p, 0, sizeof(float) * n);
    *cap = n;
    tp->buf_bytes += sizeof(float) * n;
    return HP_OK;
}

/* The gather / scatter scratch (`tmp`) is only used inside one helper call, so all modules
 * share one buffer of the largest size any of them asks for. */
static void want_scratch(hp_tp_t tp, size_t n) {
    if (n > tp->scratch_n) tp->scratch_n = n;
}

/* Shards the parameters in place (each shard packed at the start of its old span, its local
 * shape the shard's) and sizes the wrapper's buffers; installing the wrapper in the tree is
 * the caller's. */
static hp_status_t apply(hp_tp_t tp, tp_mod_t *t) {
    hp_module_t *m = t->m;
    const int k = tp->k, r = tp->rank;
    const hp_tp_style_t *s = &t->style;
    const hp_module_ops_t *ops;
    t->tp = tp;
    const int64_t R = tp->max_rows;
    if (t->mk == MK_LINEAR && (s->kind == HP_TP_COLWISE || s->kind == HP_TP_ROWWISE)) {
        hp_linear_impl_t *L = m->impl;
        const int64_t IC = L->in_features, OC = L->out_features;
        t->in_f = IC;
        t->out_f = OC;
        float *w = hp_param_w(m->params[0]), *g = hp_param_g(m->params[0]);
        if (s->kind == HP_TP_COLWISE) {
            // each stacked param: its rows [r*rows/k, (r+1)*rows/k) packed after the previous
            float *wd = w, *gd = g;
            const float *ws = w, *gs = g;
            hp_param_t *p0 = m->params[0];
            if (m->n_params == 1 && p0->value.mesh == tp->mesh) {
                // a tied weight already sharded by the embedding (qwen3): same rows
                if (!hp_placement_equal(p0->value.placements[0], hp_shard(0)))
                    return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: tied parameter '%s' would get two "
                                    "placements (linear '%s' needs Shard(0)); hint: shard the embedding rowwise",
                                    p0->name, m->name);
            } else
            for (int i = 0; i < m->n_params; i++) {
                hp_param_t *p = m->params[i];
                const int64_t rows = p->value.global_shape[0], lr = rows / k;
                memmove(wd, ws + (size_t)(r * lr) * IC, sizeof(float) * (size_t)(lr * IC));
                memmove(gd, gs + (size_t)(r * lr) * IC, sizeof(float) * (size_t)(lr * IC));
                int64_t ls[2] = {lr, IC};
                set_param_layout(p, tp, hp_shard(0), ls, wd, gd);
                wd += lr * IC;
                gd += lr * IC;
                ws += rows * IC;
                gs += rows * IC;
            }
            t->in_buf_n = is_shard_seq(&s->input_layout) ? (size_t)(R * IC) : 0;   // per context (w_act_bytes)
            HP_TRY(alloc_buf(tp, &t->dout_buf, &t->dout_buf_n, is_rep(&s->output_layout) ? (size_t)(R * OC / k) : 0));
            size_t t2 = 0, t1 = 0;
            if (is_rep(&s->output_layout)) { t2 = (size_t)(R * OC / k); t1 = (size_t)(R * OC); }
            if (is_shard_seq(&s->input_layout)) {
                t2 = t2 > (size_t)(R * IC) ? t2 : (size_t)(R * IC);
                t1 = t1 > (size_t)(R * IC) ? t1 : (size_t)(R * IC);
            }
            if (L->accumulate_input_grad) t2 = t2 > (size_t)(R * IC) ? t2 : (size_t)(R * IC);
            HP_TRY(alloc_buf(tp, &t->tmp2, &t->tmp2_n, t2));
            want_scratch(tp, t1);
        } else {
            // columns [r*IC/k, ...) of every row (stacked params share the column split)
            const int64_t lc = IC / k;
            for (int64_t o = 0; o < OC; o++) {
                memmove(w + (size_t)o * lc, w + (size_t)o * IC + (size_t)(r * lc), sizeof(float) * (size_t)lc);
                memmove(g + (size_t)o * lc, g + (size_t)o * IC + (size_t)(r * lc), sizeof(float) * (size_t)lc);
            }
            int64_t row0 = 0;
            for (int i = 0; i < m->n_params; i++) {
                hp_param_t *p = m->params[i];
                int64_t ls[2] = {p->value.global_shape[0], lc};
                set_param_layout(p, tp, hp_shard(1), ls, w + row0 * lc, g + row0 * lc);
                row0 += ls[0];
            }
            t->acc_out = L->accumulate_output;
            const int seq = is_shard_seq(&s->output_layout);
            HP_TRY(alloc_buf(tp, &t->tmp2, &t->tmp2_n, (seq || t->acc_out) ? (size_t)(R * OC) : 0));
            HP_TRY(alloc_buf(tp, &t->dout_buf, &t->dout_buf_n, seq ? (size_t)(R * OC) : 0));
            want_scratch(tp, seq ? (size_t)(R * OC) : 0);
        }
        ops = s->kind == HP_TP_COLWISE ? &col_linear_ops : &row_linear_ops;
    } else if (t->mk == MK_EMBEDDING && (s->kind == HP_TP_COLWISE || s->kind == HP_TP_ROWWISE)) {
        hp_embedding_impl_t *E = m->impl;
        hp_param_t *p = m->params[0];
        float *E_w = hp_param_w(p), *E_g = hp_param_g(p);
        const int64_t V = E->vocab, C = E->dim;
        t->in_f = V;
        t->out_f = C;
        if (p->value.mesh == tp->mesh) {
            // a tied weight already sharded by the other module (qwen3 output / tok_embeddings)
            hp_placement_t want = s->kind == HP_TP_ROWWISE ? hp_shard(0) : hp_shard(1);
            if (!hp_placement_equal(p->value.placements[0], want))
                return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: tied parameter '%s' would get two placements "
                                "(embedding '%s' needs %s); hint: shard both users the same way", p->name, m->name,
                                s->kind == HP_TP_ROWWISE ? "Shard(0)" : "Shard(1)");
        } else if (s->kind == HP_TP_ROWWISE) {
            const int64_t lv = V / k;
            memmove(E_w, E_w + (size_t)(r * lv) * C, sizeof(float) * (size_t)(lv * C));
            memmove(E_g, E_g + (size_t)(r * lv) * C, sizeof(float) * (size_t)(lv * C));
            int64_t ls[2] = {lv, C};
            set_param_layout(p, tp, hp_shard(0), ls, E_w, E_g);
        } else {
            const int64_t lc = C / k;
            for (int64_t v = 0; v < V; v++) {
                memmove(E_w + (size_t)v * lc, E_w + (size_t)v * C + (size_t)(r * lc), sizeof(float) * (size_t)lc);
                memmove(E_g + (size_t)v * lc, E_g + (size_t)v * C + (size_t)(r * lc), sizeof(float) * (size_t)lc);
            }
            int64_t ls[2] = {V, lc};
            set_param_layout(p, tp, hp_shard(1), ls, E_w, E_g);
        }
        if (s->kind == HP_TP_ROWWISE) {
            t->vocab_lo = (int64_t)r * (V / k);
            const int seq = is_shard_seq(&s->output_layout);
            HP_TRY(alloc_buf(tp, &t->tmp2, &t->tmp2_n, (size_t)(R * C)));
            HP_TRY(alloc_buf(tp, &t->dout_buf, &t->dout_buf_n, seq ? (size_t)(R * C) : 0));
            want_scratch(tp, seq ? (size_t)(R * C) : 0);
            ops = &row_emb_ops;
        } else {
            const int rep = is_rep(&s->output_layout);
            HP_TRY(alloc_buf(tp, &t->tmp2, &t->tmp2_n, rep ? (size_t)(R * C / k) : 0));
            HP_TRY(alloc_buf(tp, &t->dout_buf, &t->dout_buf_n, rep ? (size_t)(R * C / k) : 0));
            want_scratch(tp, rep ? (size_t)(R * C) : 0);
            ops = &col_emb_ops;
        }
    } else {
        // SequenceParallel, NoParallel, PrepareModule*: params Replicate
        for (int i = 0; i < m->n_params; i++)
            if (!m->params[i]->value.mesh) set_param_layout(m->params[i], tp, hp_replicate(), NULL, NULL, NULL);
        if (s->kind == HP_TP_SEQUENCE_PARALLEL || t->reduce_own_grads) {
            size_t n = 0;
            for (int i = 0; i < m->n_params; i++) n += (size_t)hp_tensor_numel(&m->params[i]->grad.local);
            HP_TRY(alloc_buf(tp, &t->gsave, &t->gsave_n, n));
        }
        if (prep_in(t) && is_shard_seq(&s->input_layout) && is_rep(&s->desired_input_layout)) {
            // input rows (R, C): C from the module's first child linear, else its params
            int64_t C = 0;
            for (int c = 0; c < m->n_children && !C; c++)
                if (module_kind(unwrapped(m->children[c])) == MK_LINEAR)
                    C = ((const hp_linear_impl_t *)unwrapped(m->children[c])->impl)->in_features;
            if (!C && module_kind(m) == MK_LINEAR) C = ((hp_linear_impl_t *)m->impl)->in_features;
            if (!C && m->n_params) C = m->params[0]->value.global_shape[m->params[0]->value.local.ndim - 1];
            if (!C)
                return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: PrepareModuleInput on '%s': cannot size the "
                                "gathered input (no linear child)", m->name);
            // children linears may already be colwise-sharded: in_features of colwise is unchanged
            t->in_buf_n = (size_t)(R * C);   // per context (w_act_bytes)
            HP_TRY(alloc_buf(tp, &t->tmp2, &t->tmp2_n, (size_t)(R * C)));
            want_scratch(tp, (size_t)(R * C));
        }
        if (prep_out(t)) {
            int64_t C = 0;
            // output features: a linear's out_features, else the input size (same-size modules)
            if (module_kind(m) == MK_LINEAR) C = ((hp_linear_impl_t *)m->impl)->out_features;
            else if (module_kind(m) == MK_RMSNORM) C = ((hp_rmsnorm_impl_t *)m->impl)->dim;
            if (!C)
                return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: PrepareModuleOutput on '%s' (kind '%s'): "
                                "supported on linear and rmsnorm modules", m->name, m->ops->kind);
            size_t need = (size_t)(R * C);
            if (t->tmp2_n < need) { hp_free_aligned(t->tmp2); t->tmp2 = NULL; HP_TRY(alloc_buf(tp, &t->tmp2, &t->tmp2_n, need)); }
            want_scratch(tp, need);
            HP_TRY(alloc_buf(tp, &t->dout_buf, &t->dout_buf_n, need));
        }
        ops = s->kind == HP_TP_SEQUENCE_PARALLEL ? &sp_ops : s->kind == HP_TP_NO_PARALLEL ? &np_ops : &prep_ops;
    }
    // the wrapper carries the module's name (its FQN in the plan and in messages)
    hp_module_base_init(&t->wrap, ops, m->name, t);
    t->wrap.children[t->wrap.n_children++] = m;
    return HP_OK;
}

static int is_wrapper(const hp_module_t *m) {
    const hp_module_ops_t *o = m->ops;
    return o == &col_linear_ops || o == &row_linear_ops || o == &row_emb_ops || o == &col_emb_ops || o == &sp_ops ||
           o == &np_ops || o == &prep_ops;
}

/* Resolves the plan over the modules: style per module (NULL = none). TP wrappers are not
 * matched (they carry their module's name); a module a wrapper already holds is an error. */
static hp_status_t resolve(hp_module_t **mods, hp_module_t **parents, int n, const hp_tp_plan_entry_t *plan,
                           int n_plan, const hp_tp_style_t **styles, int *entry_of) {
    int *hits = hp_calloc((size_t)(n_plan > 0 ? n_plan : 1), sizeof(int));
    if (!hits) return HP_ERR_OOM;
    hp_status_t st = HP_OK;
    for (int i = 0; i < n && st == HP_OK; i++) {
        styles[i] = NULL;
        entry_of[i] = -1;
        if (is_wrapper(mods[i])) continue;
        char names[HP_MODULE_MAX_PARAMS + 1][HP_PARAM_NAME_MAX];
        int nn = module_names(mods[i], names, HP_MODULE_MAX_PARAMS + 1);
        const hp_tp_style_t *got[HP_MODULE_MAX_PARAMS + 1] = {0};
        int got_e[HP_MODULE_MAX_PARAMS + 1];
        for (int j = 0; j < nn && st == HP_OK; j++) {
            got_e[j] = -1;
            for (int e = 0; e < n_plan; e++) {
                if (fnmatch(plan[e].pattern, names[j], 0) != 0) continue;
                hits[e]++;
                if (got[j] && !style_equal(got[j], &plan[e].style)) {
                    st = hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: module '%s' matches pattern '%s' (%s) "
                                  "and pattern '%s' (%s) with different styles; hint: make the patterns disjoint",
                                  names[j], plan[got_e[j]].pattern, hp_tp_style_name(got[j]->kind), plan[e].pattern,
                                  hp_tp_style_name(plan[e].style.kind));
                    break;
                }
                got[j] = &plan[e].style;
                got_e[j] = e;
            }
        }
        if (st != HP_OK) break;
        styles[i] = got[0];
        entry_of[i] = got_e[0];
        if (nn > 1) {   // a fused linear: its stacked parts must agree
            for (int j = 1; j < nn; j++) {
                int same = (got[j] == NULL && got[1] == NULL) ||
                           (got[j] && got[1] && style_equal(got[j], got[1]));
                if (!same) {
                    st = hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: '%s' and '%s' are one fused GEMM ('%s') "
                                  "and need the same style, got %s and %s", names[1], names[j], mods[i]->name,
                                  got[1] ? hp_tp_style_name(got[1]->kind) : "none",
                                  got[j] ? hp_tp_style_name(got[j]->kind) : "none");
                    break;
                }
            }
            if (st != HP_OK) break;
            if (got[1]) {
                if (got[0] && !style_equal(got[0], got[1])) {
                    st = hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: fused module '%s' gets %s by its own name "
                                  "and %s by its parts", mods[i]->name, hp_tp_style_name(got[0]->kind),
                                  hp_tp_style_name(got[1]->kind));
                    break;
                }
                styles[i] = got[1];
                entry_of[i] = got_e[1];
            }
        }
        if (styles[i] && parents[i] && is_wrapper(parents[i])) {
            st = hp_error(HP_ERR_STATE, "tensor parallel: module '%s' is already parallelized; hint: call "
                          "parallelize once per module", mods[i]->name);
            break;
        }
    }
    for (int e = 0; st == HP_OK && e < n_plan; e++)
        if (hits[e] == 0) {
            char ex[HP_PARAM_NAME_MAX * 3] = "";
            int shown = 0;
            for (int i = 0; i < n && shown < 3; i++) {
                if (!mods[i]->name[0] || is_wrapper(mods[i])) continue;
                size_t len = strlen(ex);
                snprintf(ex + len, sizeof(ex) - len, "%s'%s'", shown ? ", " : "", mods[i]->name);
                shown++;
            }
            st = hp_error(HP_ERR_NOT_FOUND, "tensor parallel plan: pattern '%s' (%s) matches no module; module "
                          "names look like %s (fnmatch over dotted names)", plan[e].pattern,
                          hp_tp_style_name(plan[e].style.kind), ex);
        }
    free(hits);
    return st;
}

static hp_status_t tp_new(hp_tp_t *out, hp_mesh_t mesh, int64_t max_rows) {
    if (!mesh || hp_mesh_ndim(mesh) != 1)
        return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: the TP mesh must be 1-D (got %d dims); hint: pass "
                        "mesh[\"tp\"] (hp_mesh_slice)", mesh ? hp_mesh_ndim(mesh) : 0);
    if (!hp_mesh_contains_self(mesh))
        return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: this rank is not in the TP mesh");
    if (max_rows <= 0) return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: max_rows %lld must be > 0", (long long)max_rows);
    hp_tp_t tp = hp_calloc(1, sizeof(*tp));
    if (!tp) return HP_ERR_OOM;
    tp->mesh = mesh;
    tp->comm = hp_mesh_get_comm(mesh, 0);
    tp->k = (int)hp_mesh_size(mesh, 0);
    tp->rank = hp_mesh_get_local_rank(mesh, 0);
    tp->max_rows = max_rows;
    *out = tp;
    return HP_OK;
}

static int mark_children(hp_module_t *m, const hp_tp_style_t **styles, hp_module_t **mods, int n, tp_mod_t *tms) {
    int marked = 0;
    for (int c = 0; c < m->n_children; c++) {
        hp_module_t *ch = m->children[c];
        for (int i = 0; i < n; i++)
            if (mods[i] == ch && styles[i] && styles[i]->kind == HP_TP_COLWISE) {
                tms[i].din_by_parent = 1;
                marked++;
            }
        marked += mark_children(ch, styles, mods, n, tms);
    }
    return marked;
}

/* Core: validate everything, then apply (shard the parameters, size the wrappers), then put
 * each wrapper in its module's place, leaves first. reduce_own: modules (by index) wrapped
 * NoParallel with reduce_own_grads although the plan does not name them. roots: the caller's
 * list of tree roots (parallelize_modules), whose entries become their wrappers. */
static hp_status_t parallelize(hp_tp_t tp, hp_module_t **mods, int n, const hp_tp_plan_entry_t *plan, int n_plan,
                               const int *reduce_own, const char *attn_kind, hp_module_t **roots, int n_roots) {
    const hp_tp_style_t **styles = hp_calloc((size_t)n, sizeof(*styles));
    int *entry_of = hp_calloc((size_t)n, sizeof(int));
    tp_mod_t *tms = hp_calloc((size_t)n, sizeof(tp_mod_t));
    hp_module_t **parents = hp_calloc((size_t)n, sizeof(*parents));
    hp_status_t st = (!styles || !entry_of || !tms || !parents) ? HP_ERR_OOM : HP_OK;
    for (int i = 0; st == HP_OK && i < n; i++)   // each module's parent among the listed ones
        for (int j = 0; j < n && !parents[i]; j++)
            for (int c = 0; c < mods[j]->n_children; c++)
                if (mods[j]->children[c] == mods[i]) parents[i] = mods[j];
    if (st == HP_OK) st = resolve(mods, parents, n, plan, n_plan, styles, entry_of);
    static const hp_tp_style_t np_style = {HP_TP_NO_PARALLEL, 0, 0, 0, 0, {0}, {0}, {0}, {0}, 1, 1};
    for (int i = 0; st == HP_OK && i < n; i++) {
        if (!styles[i]) continue;
        tms[i].m = mods[i];
        tms[i].parent = parents[i];
        tms[i].style = *styles[i];
        tms[i].mk = module_kind(mods[i]);
        hp_tp_style_t *s = &tms[i].style;
        // PyTorch defaults
        if (s->kind == HP_TP_COLWISE) {
            if (!s->has_input_layout) s->input_layout = hp_replicate();
            if (!s->has_output_layout) s->output_layout = hp_shard(-1);
        } else if (s->kind == HP_TP_ROWWISE) {
            if (!s->has_input_layout) s->input_layout = tms[i].mk == MK_EMBEDDING ? hp_replicate() : hp_shard(-1);
            if (!s->has_output_layout) s->output_layout = hp_replicate();
        }
        st = check_pair(tp, mods[i], s, entry_of[i] >= 0 ? plan[entry_of[i]].pattern : "(implicit)");
    }
    // attention / feed-forward with a colwise child run local heads / features (their
    // projections' local shards): the plan must shard both projections
    int attn_k = 1;
    for (int i = 0; st == HP_OK && i < n; i++) {
        if (!attn_kind) break;
        const char *kind = mods[i]->ops->kind;
        int is_attn = strcmp(kind, "attention") == 0, is_ffn = strcmp(kind, "feed_forward") == 0;
        const int is_mla = strcmp(kind, "mla_attention") == 0;
        is_attn |= is_mla;
        if (!is_attn && !is_ffn) continue;
        int col = 0, row = 0;
        for (int c = 0; c < mods[i]->n_children; c++)
            for (int j = 0; j < n; j++)
                if (mods[j] == mods[i]->children[c] && styles[j]) {
                    col += styles[j]->kind == HP_TP_COLWISE;
                    row += styles[j]->kind == HP_TP_ROWWISE;
                }
        if (col + row == 0) continue;
        if (is_mla && (col != 2 || row != 1))
            st = hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: MLA attention '%s' needs wq (or wq_b) and wkv_b "
                          "ColwiseParallel and wo RowwiseParallel (got %d colwise, %d rowwise); hint: use the family's "
                          "plan (hp_model_spec_t.tp_plan, models.h)", mods[i]->name, col, row);
        else if (!is_mla && (col != 1 || row != 1))
            st = hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: module '%s' needs its input projection(s) "
                          "ColwiseParallel and its output projection RowwiseParallel (got %d colwise, %d rowwise); "
                          "hint: shard wq, wk, wv / w1, w3 colwise and wo / w2 rowwise", mods[i]->name, col, row);
        if (is_attn) attn_k = tp->k;
    }
    // own params of modules whose work is sharded (qk-norm weights over local heads)
    for (int i = 0; st == HP_OK && attn_k > 1 && reduce_own && i < n; i++) {
        if (!reduce_own[i]) continue;
        if (!styles[i]) {
            styles[i] = &np_style;
            tms[i].m = mods[i];
            tms[i].parent = parents[i];
            tms[i].style = np_style;
            tms[i].mk = module_kind(mods[i]);
        }
        tms[i].reduce_own_grads = 1;
    }
    if (st == HP_OK) {
        for (int i = 0; i < n; i++)
            if (styles[i] && prep_in(&tms[i]) && !tms[i].style.use_local_output &&
                strcmp(mods[i]->ops->kind, "mla_attention") != 0)   // MLA: the colwise projections reduce their own
                tms[i].din_partial = mark_children(mods[i], styles, mods, n, tms) > 0;
        int count = 0;
        for (int i = 0; i < n; i++) count += styles[i] != NULL;
        tp->mods = hp_calloc((size_t)(count ? count : 1), sizeof(tp_mod_t));
        if (!tp->mods) st = HP_ERR_OOM;
        // leaves first (a parent's buffers and its wrapper's place follow its children's), each once
        for (int pass = 0; st == HP_OK && pass < 2; pass++)
            for (int i = 0; st == HP_OK && i < n; i++) {
                if (!styles[i]) continue;
                int leaf = tms[i].mk != MK_OTHER;
                if ((pass == 0) != leaf) continue;
                tp->mods[tp->n_mods] = tms[i];
                st = apply(tp, &tp->mods[tp->n_mods]);
                tp->n_mods++;
            }
        if (st == HP_OK) st = alloc_buf(tp, &tp->scratch, &tp->scratch_n, tp->scratch_n);
        for (int i = 0; st == HP_OK && i < tp->n_mods; i++) {
            tp->mods[i].tmp = tp->scratch;
            tp->mods[i].tmp_n = tp->scratch_n;
        }
        // each wrapper takes its module's place (the module becomes the wrapper's child)
        for (int i = 0; st == HP_OK && i < tp->n_mods; i++) {
            tp_mod_t *t = &tp->mods[i];
            if (tp->model) {
                st = hp_model_replace_module(tp->model, t->parent, t->m, &t->wrap);
            } else if (t->parent) {
                st = hp_module_replace_child(t->parent, t->m, &t->wrap);
            } else {
                for (int r = 0; r < n_roots; r++)
                    if (roots[r] == t->m) roots[r] = &t->wrap;
            }
            t->installed = st == HP_OK;
        }
    }
    free(styles);
    free(entry_of);
    free(tms);
    free(parents);
    return st;
}

hp_status_t hp_tp_parallelize_modules(hp_tp_t *out, hp_module_t **modules, int n_modules, hp_mesh_t tp_mesh,
                                      const hp_tp_plan_entry_t *plan, int n_plan, int64_t max_rows) {
    if (!out || (!modules && n_modules > 0) || (!plan && n_plan > 0))
        return hp_error(HP_ERR_INVALID_ARG, "hp_tp_parallelize_modules: NULL argument");
    *out = NULL;
    hp_tp_t tp;
    HP_TRY(tp_new(&tp, tp_mesh, max_rows));
    int n = 0;
    for (int i = 0; i < n_modules; i++) collect(modules[i], NULL, &n, 0);
    hp_module_t **mods = hp_calloc((size_t)(n ? n : 1), sizeof(*mods));
    if (!mods) { free(tp); return HP_ERR_OOM; }
    int n2 = 0;
    for (int i = 0; i < n_modules; i++) collect(modules[i], mods, &n2, n);
    hp_status_t st = parallelize(tp, mods, n2 < n ? n2 : n, plan, n_plan, NULL, NULL, modules, n_modules);
    free(mods);
    if (st != HP_OK) { hp_tp_destroy(tp); return st; }
    *out = tp;
    return HP_OK;
}

/* ---- the model ------------------------------------------------------------------------------- */

/* loss_parallel as the model's loss module (nn.h): cross-entropy over this rank's columns of
 * the vocab-sharded logits, the global vocab offset rank x local columns. */
static hp_status_t lp_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    (void)out;
    hp_tp_t tp = m->impl;
    hp_loss_saved_t *s;
    HP_TRY(hp_loss_begin(m, act, in, &s));
    double t0 = omp_get_wtime();
    hp_status_t st = hp_loss_parallel_forward(&s->sum, s->losses, s->lse, s->logits, s->targets, s->N, s->V,
                                              (int64_t)tp->rank * s->V, tp->comm, &s->n_valid);
    if (act->prof) act->prof[HP_NN_OP_CROSS_ENTROPY] += omp_get_wtime() - t0;
    return st;
}

static hp_status_t lp_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    hp_tp_t tp = m->impl;
    const hp_loss_saved_t *s = hp_act_slot(act, m);
    double t0 = omp_get_wtime();
    hp_loss_parallel_backward(din->data, s->logits, s->lse, s->targets, *(const float *)dout->data, s->N, s->V,
                              (int64_t)tp->rank * s->V);
    if (act->prof) act->prof[HP_NN_OP_CROSS_ENTROPY] += omp_get_wtime() - t0;
    return HP_OK;
}

static const hp_module_ops_t lp_ops = {
    "loss_parallel", hp_loss_act_bytes, NULL, lp_forward, lp_backward_input, NULL, NULL,
};

/* loss_parallel: when the head's output is vocab-sharded (its output projection's style says
 * Shard(-1)), the model's cross-entropy child is replaced by the loss_parallel module. */
static hp_status_t install_loss_parallel(hp_tp_t tp, hp_module_t **mods, int n) {
    for (int i = 0; i < n; i++)
        for (int c = 0; c < mods[i]->n_children; c++) {
            hp_module_t *loss = mods[i]->children[c];
            hp_act_split_t s = {1, 1};
            if (!hp_module_is_loss(loss) || !hp_module_act_split(mods[i], 1, &s) || s.cols == 1) continue;
            hp_module_base_init(&tp->lp, &lp_ops, loss->name, tp);
            HP_TRY(hp_model_replace_module(tp->model, mods[i], loss, &tp->lp));
            tp->lp_parent = mods[i];
            tp->lp_orig = loss;
            return HP_OK;
        }
    return HP_OK;
}

hp_status_t hp_tp_parallelize_model(hp_tp_t *out, hp_model_t model, hp_mesh_t tp_mesh,
                                    const hp_tp_plan_entry_t *plan, int n_plan) {
    if (!out || !model || (!plan && n_plan > 0))
        return hp_error(HP_ERR_INVALID_ARG, "hp_tp_parallelize_model: NULL argument");
    *out = NULL;
    hp_tp_t tp;
    HP_TRY(tp_new(&tp, tp_mesh, hp_model_max_tokens(model)));
    const hp_model_config_t *c = hp_model_config(model);
    int n = hp_model_modules(model, NULL, 0);
    hp_module_t **mods = hp_calloc((size_t)n, sizeof(*mods));
    int *reduce_own = hp_calloc((size_t)n, sizeof(int));
    if (!mods || !reduce_own) { free(mods); free(reduce_own); free(tp); return HP_ERR_OOM; }
    hp_model_modules(model, mods, n);
    // attention modules own the qk-norm weights: Replicate params over sharded heads
    for (int i = 0; i < n; i++)
        if (strcmp(mods[i]->ops->kind, "attention") == 0 && mods[i]->n_params > 0) reduce_own[i] = 1;
    if (tp->k > 1 && (c->n_heads % tp->k != 0 || c->n_kv_heads % tp->k != 0)) {
        // named up front so that the message is the heads one whatever the plan says
        int g = c->n_heads, b = c->n_kv_heads;   /* gcd: degrees dividing both */
        while (b) { int r = g % b; g = b; b = r; }
        char dv[256];
        hp_status_t st = hp_error(HP_ERR_INVALID_ARG, "tensor parallel: model '%s/%s' has n_heads %d and n_kv_heads "
                                  "%d; attention heads and KV heads must both be divisible by the TP degree %d; "
                                  "hint: degrees dividing both: %s", c->name, c->flavor, c->n_heads,
                                  c->n_kv_heads, tp->k, tp_divisors(g, dv, sizeof dv));
        free(mods); free(reduce_own); free(tp);
        return st;
    }
    for (int i = 0; i < n_plan; i++) {   // a sequence-sharded residual stream starts at a rowwise embedding
        const hp_tp_style_t *s = &plan[i].style;
        for (int j = 0; j < n; j++) {
            if (module_kind(mods[j]) != MK_EMBEDDING || fnmatch(plan[i].pattern, mods[j]->name, 0) != 0) continue;
            if (s->has_output_layout && is_shard_seq(&s->output_layout) &&
                (s->kind != HP_TP_ROWWISE || s->output_layout.dim != 1)) {
                hp_status_t st = hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: %s output %s; sequence parallel "
                                          "needs RowwiseParallel with output_layouts Shard(1)", mods[j]->name,
                                          hp_tp_style_name(s->kind));
                free(mods); free(reduce_own); free(tp);
                return st;
            }
        }
    }
    tp->model = model;
    hp_status_t st = parallelize(tp, mods, n, plan, n_plan, reduce_own, "model", NULL, 0);
    if (st == HP_OK) {
        // every other parameter: a Replicate DTensor on the TP mesh
        hp_param_t *P = hp_model_params(model);
        for (int i = 0; i < hp_model_num_params(model); i++)
            if (!P[i].value.mesh) set_param_layout(&P[i], tp, hp_replicate(), NULL, NULL, NULL);
        // the shards were packed in place: the model keeps storage of the local sizes (model.h)
        st = hp_model_compact_storage(model);
    }
    if (st == HP_OK) {   // the head's modules as they are now (wrappers included)
        free(mods);
        n = hp_model_modules(model, NULL, 0);
        mods = hp_calloc((size_t)n, sizeof(*mods));
        if (!mods) st = HP_ERR_OOM;
        else hp_model_modules(model, mods, n);
    }
    if (st == HP_OK) st = install_loss_parallel(tp, mods, n);
    // the gathered inputs now live in each context's arena: the model's context is re-sized
    if (st == HP_OK) st = hp_model_refresh_contexts(model);
    free(mods);
    free(reduce_own);
    if (st != HP_OK) { hp_tp_destroy(tp); return st; }
    *out = tp;
    return HP_OK;
}
