/* Tensor and sequence parallel: parallelize_module / parallelize_model (the parameters sharded
 * in place, the wrappers sized and put in their modules' places, loss_parallel as the head's
 * loss child) and the handle; the styles and plan matching are in tp_plan.c, the wrapper
 * modules in tp_wrap.c (PyTorch torch.distributed.tensor.parallel semantics, docs/tp.md).
 * A parallelized module is
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
#include "hyperparallel/comm.h"
#include "parallel/tp-impl.h"

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

/* ---- parallelize ---------------------------------------------------------------------------- */

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

static hp_status_t alloc_buf(hp_tp_t tp, float **p, size_t *cap, size_t n) {
    if (n == 0) return HP_OK;
    if (tp->planning) {   // the memory plan: counted only
        *cap = n;
        tp->buf_bytes += sizeof(float) * n;
        return HP_OK;
    }
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

/* LoRA's adapters sharded with their base (docs/finetune.md "LoRA"). A colwise base (output rows
 * sharded): A (r, in) Replicate, each B_i (out_i, r) Shard(0) with its member's rows, so the
 * module's B_i (A_i x) lands on this rank's rows; dA sums over every output row, a partial sum
 * over the TP ranks. A rowwise base (input columns sharded): A Shard(1) with the base's columns,
 * B Replicate: A x is then a partial sum that the wrapper's all-reduce (or reduce-scatter)
 * completes together with the base's partial product (linear), and dB is the partial sum.
 * The Replicate adapters' gradients are all-reduced after the weight pass (reduce_own_grads). */
static hp_status_t shard_lora(hp_tp_t tp, tp_mod_t *t, int col) {
    hp_module_t *m = t->m;
    const int k = tp->k, r = tp->rank;
    size_t partial = 0;
    for (int i = 0; i < m->n_params; i++) {
        hp_param_t *p = m->params[i];
        const int is_b = strstr(p->name, ".lora_b.") != NULL;
        const int64_t R0 = p->value.global_shape[0], C0 = p->value.global_shape[1];
        float *w = hp_param_w(p), *g = hp_param_g(p);
        if (col && is_b) {   // rows [r R0/k, (r+1) R0/k)
            const int64_t lr = R0 / k;
            if (w) {
                memmove(w, w + (size_t)(r * lr * C0), sizeof(float) * (size_t)(lr * C0));
                memmove(g, g + (size_t)(r * lr * C0), sizeof(float) * (size_t)(lr * C0));
            }
            int64_t ls[2] = {lr, C0};
            set_param_layout(p, tp, hp_shard(0), ls, w, g);
        } else if (!col && !is_b) {   // columns [r C0/k, (r+1) C0/k) of every row
            const int64_t lc = C0 / k;
            for (int64_t o = 0; w && o < R0; o++) {
                memmove(w + (size_t)(o * lc), w + (size_t)(o * C0 + r * lc), sizeof(float) * (size_t)lc);
                memmove(g + (size_t)(o * lc), g + (size_t)(o * C0 + r * lc), sizeof(float) * (size_t)lc);
            }
            int64_t ls[2] = {R0, lc};
            set_param_layout(p, tp, hp_shard(1), ls, w, g);
        } else {
            set_param_layout(p, tp, hp_replicate(), NULL, NULL, NULL);
            partial += (size_t)hp_tensor_numel(&p->grad.local);
        }
    }
    t->reduce_own_grads = 1;
    return alloc_buf(tp, &t->gsave, &t->gsave_n, partial);
}

/* Shards the parameters in place (each shard packed at the start of its old span, its local
 * shape the shard's) and sizes the wrapper's buffers; installing the wrapper in the tree is
 * the caller's. */
static hp_status_t apply(hp_tp_t tp, tp_mod_t *t) {
    hp_module_t *m = t->m;
    const int k = tp->k, r = tp->rank;
    const hp_tp_style_t *s = &t->style;
    t->tp = tp;
    const int64_t R = tp->max_rows;
    if (t->mk == MK_LINEAR && (s->kind == HP_TP_COLWISE || s->kind == HP_TP_ROWWISE)) {
        hp_module_t *lin = tp_lin(m);   // the linear (under LoRA's module: its adapters follow below)
        hp_linear_impl_t *L = lin->impl;
        const int64_t IC = L->in_features, OC = L->out_features;
        t->in_f = IC;
        t->out_f = OC;
        float *w = hp_param_w(lin->params[0]), *g = hp_param_g(lin->params[0]);
        if (s->kind == HP_TP_COLWISE) {
            // each stacked param: its rows [r*rows/k, (r+1)*rows/k) packed after the previous (an
            // empty model's entries have no storage: only their layouts change)
            size_t dst = 0, src = 0;
            hp_param_t *p0 = lin->params[0];
            if (lin->n_params == 1 && p0->value.mesh == tp->mesh) {
                // a tied weight already sharded by the embedding (qwen3): same rows
                if (!hp_placement_equal(p0->value.placements[0], hp_shard(0)))
                    return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: tied parameter '%s' would get two "
                                    "placements (linear '%s' needs Shard(0)); hint: shard the embedding rowwise",
                                    p0->name, m->name);
            } else
            for (int i = 0; i < lin->n_params; i++) {
                hp_param_t *p = lin->params[i];
                const int64_t rows = p->value.global_shape[0], lr = rows / k;
                if (w) {
                    memmove(w + dst, w + src + (size_t)(r * lr) * IC, sizeof(float) * (size_t)(lr * IC));
                    memmove(g + dst, g + src + (size_t)(r * lr) * IC, sizeof(float) * (size_t)(lr * IC));
                }
                int64_t ls[2] = {lr, IC};
                set_param_layout(p, tp, hp_shard(0), ls, w ? w + dst : NULL, g ? g + dst : NULL);
                dst += (size_t)(lr * IC);
                src += (size_t)(rows * IC);
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
            for (int64_t o = 0; w && o < OC; o++) {
                memmove(w + (size_t)o * lc, w + (size_t)o * IC + (size_t)(r * lc), sizeof(float) * (size_t)lc);
                memmove(g + (size_t)o * lc, g + (size_t)o * IC + (size_t)(r * lc), sizeof(float) * (size_t)lc);
            }
            int64_t row0 = 0;
            for (int i = 0; i < lin->n_params; i++) {
                hp_param_t *p = lin->params[i];
                int64_t ls[2] = {p->value.global_shape[0], lc};
                set_param_layout(p, tp, hp_shard(1), ls, w ? w + row0 * lc : NULL, g ? g + row0 * lc : NULL);
                row0 += ls[0];
            }
            t->acc_out = L->accumulate_output;
            const int seq = is_shard_seq(&s->output_layout);
            HP_TRY(alloc_buf(tp, &t->tmp2, &t->tmp2_n, (seq || t->acc_out) ? (size_t)(R * OC) : 0));
            HP_TRY(alloc_buf(tp, &t->dout_buf, &t->dout_buf_n, seq ? (size_t)(R * OC) : 0));
            want_scratch(tp, seq ? (size_t)(R * OC) : 0);
        }
        if (is_lora(m)) HP_TRY(shard_lora(tp, t, s->kind == HP_TP_COLWISE));
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
            if (E_w) {
                memmove(E_w, E_w + (size_t)(r * lv) * C, sizeof(float) * (size_t)(lv * C));
                memmove(E_g, E_g + (size_t)(r * lv) * C, sizeof(float) * (size_t)(lv * C));
            }
            int64_t ls[2] = {lv, C};
            set_param_layout(p, tp, hp_shard(0), ls, E_w, E_g);
        } else {
            const int64_t lc = C / k;
            for (int64_t v = 0; E_w && v < V; v++) {
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
        } else {
            const int rep = is_rep(&s->output_layout);
            HP_TRY(alloc_buf(tp, &t->tmp2, &t->tmp2_n, rep ? (size_t)(R * C / k) : 0));
            HP_TRY(alloc_buf(tp, &t->dout_buf, &t->dout_buf_n, rep ? (size_t)(R * C / k) : 0));
            want_scratch(tp, rep ? (size_t)(R * C) : 0);
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
                    C = ((const hp_linear_impl_t *)tp_lin(unwrapped(m->children[c]))->impl)->in_features;
            if (!C && module_kind(m) == MK_LINEAR) C = ((hp_linear_impl_t *)tp_lin(m)->impl)->in_features;
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
            if (module_kind(m) == MK_LINEAR) C = ((hp_linear_impl_t *)tp_lin(m)->impl)->out_features;
            else if (module_kind(m) == MK_RMSNORM) C = ((hp_rmsnorm_impl_t *)m->impl)->dim;
            if (!C)
                return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: PrepareModuleOutput on '%s' (kind '%s'): "
                                "supported on linear and rmsnorm modules", m->name, m->ops->kind);
            size_t need = (size_t)(R * C);
            if (t->tmp2_n < need) { hp_free_aligned(t->tmp2); t->tmp2 = NULL; HP_TRY(alloc_buf(tp, &t->tmp2, &t->tmp2_n, need)); }
            want_scratch(tp, need);
            HP_TRY(alloc_buf(tp, &t->dout_buf, &t->dout_buf_n, need));
        }
    }
    // the wrapper carries the module's name (its FQN in the plan and in messages)
    hp_module_base_init(&t->wrap, hp_tp_wrapper_ops_(t), m->name, t);
    t->wrap.children[t->wrap.n_children++] = m;
    return HP_OK;
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
    if (st == HP_OK) st = hp_tp_resolve_plan_(mods, parents, n, plan, n_plan, styles, entry_of);
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
        st = hp_tp_check_pair_(tp, mods[i], s, entry_of[i] >= 0 ? plan[entry_of[i]].pattern : "(implicit)");
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
    "loss_parallel", hp_loss_act_bytes, NULL, lp_forward, lp_backward_input, NULL, NULL, NULL,
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

static hp_status_t parallelize_model(hp_tp_t tp, hp_model_t model, const hp_tp_plan_entry_t *plan, int n_plan,
                                     hp_tp_t *out);

hp_status_t hp_tp_parallelize_model(hp_tp_t *out, hp_model_t model, hp_mesh_t tp_mesh,
                                    const hp_tp_plan_entry_t *plan, int n_plan) {
    if (!out || !model || (!plan && n_plan > 0))
        return hp_error(HP_ERR_INVALID_ARG, "hp_tp_parallelize_model: NULL argument");
    *out = NULL;
    hp_tp_t tp;
    HP_TRY(tp_new(&tp, tp_mesh, hp_model_max_tokens(model)));
    return parallelize_model(tp, model, plan, n_plan, out);
}

/* The memory plan's layouts stand on a mesh no parallel code reads (an address only). */
static char planning_mesh_tag;

hp_status_t hp_tp_plan_model(hp_tp_t *out, hp_model_t model, int k, const hp_tp_plan_entry_t *plan, int n_plan) {
    if (!out || !model || k < 1 || (!plan && n_plan > 0) || !hp_model_is_empty(model))
        return hp_error(HP_ERR_INVALID_ARG, "hp_tp_plan_model: an empty model, k >= 1 and a plan are required");
    *out = NULL;
    hp_tp_t tp = hp_calloc(1, sizeof(*tp));
    if (!tp) return HP_ERR_OOM;
    tp->mesh = (hp_mesh_t)(void *)&planning_mesh_tag;
    tp->k = k;
    tp->max_rows = hp_model_max_tokens(model);
    tp->planning = 1;
    return parallelize_model(tp, model, plan, n_plan, out);
}

static hp_status_t parallelize_model(hp_tp_t tp, hp_model_t model, const hp_tp_plan_entry_t *plan, int n_plan,
                                     hp_tp_t *out) {
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
                                  c->n_kv_heads, tp->k, hp_tp_divisors_(g, dv, sizeof dv));
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
