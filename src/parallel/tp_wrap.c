/* The tensor-parallel wrapper modules: per style (colwise / rowwise linear and embedding,
 * SequenceParallel, NoParallel, PrepareModuleInput / Output) the forward and backward that
 * redistribute inputs, outputs and gradients around the wrapped module, and their ops tables. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/comm.h"
#include "parallel/tp-impl.h"

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

static hp_status_t need_buf(size_t have, size_t want, const tp_mod_t *t, const char *what) {
    if (want > have)
        return hp_error(HP_ERR_INVALID_ARG, "tensor parallel '%s': %s needs %zu floats, the buffer sized at "
                        "parallelize time holds %zu; hint: pass a larger max_rows", t->m->name, what, want, have);
    return HP_OK;
}

/* Parameter grads of module m: all-reduced over TP (Replicate params whose work is sharded).
 * The accumulated value from earlier microbatches is kept aside so only this backward's
 * contribution is summed. */
static int own_partial(const tp_mod_t *t, const hp_param_t *p) {   /* Replicate over TP: a Partial gradient */
    return !p->frozen && !(p->grad.mesh == t->tp->mesh && p->grad.placements[0].kind == HP_SHARD);
}
static hp_status_t reduce_own_grads(tp_mod_t *t, hp_status_t (*bw)(hp_module_t *, hp_act_t *), hp_act_t *act) {
    hp_module_t *m = t->m;
    size_t off = 0;
    for (int i = 0; i < m->n_params; i++) {
        if (!own_partial(t, m->params[i])) continue;   // LoRA's B of a colwise base, A of a rowwise one
        hp_tensor_t *g = &m->params[i]->grad.local;
        size_t n = (size_t)hp_tensor_numel(g);
        memcpy(t->gsave + off, g->data, sizeof(float) * n);
        memset(g->data, 0, sizeof(float) * n);
        off += n;
    }
    HP_TRY(bw(t->m, act));
    off = 0;
    for (int i = 0; i < m->n_params; i++) {
        if (!own_partial(t, m->params[i])) continue;
        hp_tensor_t *g = &m->params[i]->grad.local;
        size_t n = (size_t)hp_tensor_numel(g);
        float *gd = g->data;
        HP_TRY(hp_all_reduce(gd, gd, n, HP_F32, HP_SUM, t->tp->comm, NULL));
        for (size_t j = 0; j < n; j++) gd[j] += t->gsave[off + j];
        off += n;
    }
    return HP_OK;
}

/* The wrapped module's sizes as it runs them: its weights' local shapes (the shards apply()
 * laid out). A linear: in features, (stacked) out features; an embedding: rows, columns. */
static int64_t lin_in(const tp_mod_t *t) { return tp_lin(t->m)->params[0]->value.local.shape[1]; }
static int64_t lin_out(const tp_mod_t *t) {
    const hp_module_t *lin = tp_lin(t->m);
    const hp_linear_impl_t *L = lin->impl;
    int64_t rows = 0;
    for (int i = 0; i < L->n_weights; i++) rows += lin->params[i]->value.local.shape[0];
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
    const hp_linear_impl_t *L = tp_lin(t->m)->impl;
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
    w_act_split, NULL,
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
    w_act_split, NULL,
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
    for (int64_t n = 0; !t->m->params[0]->frozen && n < sv->ntok; n++) {   // frozen: no gradient (LoRA)
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
    w_act_split, NULL,
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
    w_act_split, NULL,
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
/* Activation checkpointing (save_items, nn_module.h): a wrapper that writes its output only
 * through its module lists the module's items, the module's output being its own, so the
 * policy sees the ops inside (the gathered input of PrepareModuleInput is not an item: an
 * all-gather, which TorchTitan's op list recomputes, so the replay gathers again). */
static void pass_save_items(const hp_module_t *m, int B, int T, hp_save_list_t *L) {
    hp_save_final(L, m, ((const tp_mod_t *)m->impl)->m, B, T, HP_SAVE_OTHER, 0.0, NULL, 0);
}
static const hp_module_ops_t sp_ops = {
    "tp_sequence_parallel", w_act_bytes, w_scratch, pass_forward, pass_backward_input, sp_backward_weight,
    sp_act_split, pass_save_items,
};
static const hp_module_ops_t np_ops = {
    "tp_no_parallel", w_act_bytes, w_scratch, pass_forward, pass_backward_input, w_backward_weight, NULL,
    pass_save_items,
};

/* PrepareModuleInput / Output / InputOutput around any module (the model's attention and
 * feed_forward). Input Shard(1) -> Replicate: all-gather (the module then runs on the full
 * sequence: hp_act_t.T is multiplied by k during the call); backward: the input gradient,
 * Partial from the colwise children, is reduce-scattered. Input Replicate -> Replicate: no
 * forward comm; the Partial input gradient is all-reduced. Output layout changes: Shard(seq)
 * -> Replicate all-gathers (backward slices), Replicate -> Shard(seq) slices (backward
 * all-gathers). */

static int prep_out_changes(const tp_mod_t *t) {
    return prep_out(t) && !(t->style.output_layout.kind == t->style.desired_output_layout.kind &&
                            t->style.output_layout.dim == t->style.desired_output_layout.dim);
}

/* A wrapper that converts its module's output lists no items: the replay runs it whole (an
 * output buffer its parent keeps gets the same bits again). Sizes follow w_act_bytes (the
 * module's at the caller's T). */
static void prep_save_items(const hp_module_t *m, int B, int T, hp_save_list_t *L) {
    const tp_mod_t *t = m->impl;
    if (!prep_out_changes(t)) pass_save_items(m, B, T, L);
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
    prep_save_items,
};

int hp_tp_is_wrapper_(const hp_module_t *m) {
    const hp_module_ops_t *o = m->ops;
    return o == &col_linear_ops || o == &row_linear_ops || o == &row_emb_ops || o == &col_emb_ops || o == &sp_ops ||
           o == &np_ops || o == &prep_ops;
}

const hp_module_ops_t *hp_tp_wrapper_ops_(const tp_mod_t *t) {
    const hp_tp_style_kind_t k = t->style.kind;
    const int sharded = k == HP_TP_COLWISE || k == HP_TP_ROWWISE;
    if (t->mk == MK_LINEAR && sharded) return k == HP_TP_COLWISE ? &col_linear_ops : &row_linear_ops;
    if (t->mk == MK_EMBEDDING && sharded) return k == HP_TP_ROWWISE ? &row_emb_ops : &col_emb_ops;
    return k == HP_TP_SEQUENCE_PARALLEL ? &sp_ops : k == HP_TP_NO_PARALLEL ? &np_ops : &prep_ops;
}
