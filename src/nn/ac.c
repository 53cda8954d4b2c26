/* Activation checkpointing: the checkpoint wrapper (forward with the dropped state in a
 * recompute region, backward = replay of the forward then the block's backward) and the save
 * policies that decide, item by item, what a checkpointed block keeps: full (nothing),
 * TorchTitan's op-level selective AC, and torch's memory-budget knapsack. docs/nn.md
 * "Activation checkpointing". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "nn/nn-model.h"

hp_ac_options_t hp_ac_default_options(void) {
    hp_ac_options_t o = {.every_k = 0, .policy = HP_AC_FULL, .memory_budget = 0.5};
    snprintf(o.force_recompute, sizeof o.force_recompute, "moe.router.gate");
    return o;
}

hp_status_t hp_ac_options_check(const hp_ac_options_t *o, const char *what) {
    if (!what) what = "activation checkpointing";
    if (!o) return hp_error(HP_ERR_INVALID_ARG, "%s: options are NULL", what);
    if (o->every_k < 0)
        return hp_error(HP_ERR_INVALID_ARG, "%s: every_k = %d, expected 0 (off), 1 (every block) or k > 1 (every k-th "
                        "block)", what, o->every_k);
    if (o->policy != HP_AC_FULL && o->policy != HP_AC_OP && o->policy != HP_AC_BUDGET)
        return hp_error(HP_ERR_INVALID_ARG, "%s: policy %d, expected full, op or memory budget", what, (int)o->policy);
    if (o->policy == HP_AC_BUDGET && !(o->memory_budget >= 0.0 && o->memory_budget <= 1.0))
        return hp_error(HP_ERR_INVALID_ARG, "%s: memory_budget = %g, expected a fraction in [0, 1] (0: full AC, 1: "
                        "keep every activation); hint: --activation_checkpoint.memory_budget=0.5", what,
                        o->memory_budget);
    if (!memchr(o->force_recompute, '\0', sizeof o->force_recompute))
        return hp_error(HP_ERR_INVALID_ARG, "%s: force_recompute is not terminated", what);
    return HP_OK;
}

const char *hp_ac_options_describe(const hp_ac_options_t *o, char *buf, size_t n) {
    if (!o || o->every_k <= 0) snprintf(buf, n, "none");
    else if (o->policy == HP_AC_OP) snprintf(buf, n, "op-level selective");
    else if (o->policy == HP_AC_BUDGET) snprintf(buf, n, "memory_budget %g", o->memory_budget);
    else if (o->every_k == 1) snprintf(buf, n, "full");
    else snprintf(buf, n, "layer-level selective, every %d", o->every_k);
    return buf;
}

/* ---- the items of a module -------------------------------------------------------------------- */

int hp_ac_items(const hp_module_t *m, int B, int T, hp_save_item_t *items, int cap) {
    hp_save_list_t L = {.items = items, .cap = cap};
    if (hp_module_is_checkpoint(m)) {   // the wrapped module's items and its output (the caller's buffer)
        hp_save_child(&L, m->children[0], B, T, 0, HP_SAVE_OTHER, 0.0, NULL, 0);
        if (L.n <= cap) items[L.n - 1].caller_out = 1;
    }
    else if (m->ops->save_items)
        m->ops->save_items(m, B, T, &L);
    return L.n;
}

/* The items in a heap array (the list grows until it holds them all). */
static hp_status_t items_of(const hp_module_t *m, int B, int T, hp_save_item_t **out, int *n) {
    int cap = 64;
    for (;;) {
        hp_save_item_t *it = hp_malloc(sizeof(*it) * (size_t)cap);
        if (!it) return HP_ERR_OOM;
        const int k = hp_ac_items(m, B, T, it, cap);
        if (k <= cap) {
            *out = it;
            *n = k;
            return HP_OK;
        }
        free(it);
        cap = k;
    }
}

/* ---- op-level selective AC (TorchTitan's _apply_op_sac) ----------------------------------------- */

/* A GEMM item's weight shape (in, out): the stacked weights' columns and summed rows. */
static void mm_shape(const hp_save_item_t *it, int64_t *in, int64_t *out) {
    *in = *out = 0;
    for (int i = 0; i < it->mm_nw; i++) {
        const hp_tensor_t *w = &it->mm_w[i]->value.local;
        *in = w->ndim > 1 ? w->shape[w->ndim - 1] : 0;
        *out += w->shape[0];
    }
}

static int fqn_matches(const hp_save_item_t *it, const char *patterns) {
    char buf[HP_AC_FORCE_MAX];
    snprintf(buf, sizeof buf, "%s", patterns);
    for (char *save = NULL, *p = strtok_r(buf, ", ", &save); p; p = strtok_r(NULL, ", ", &save))
        for (int i = 0; i < it->mm_nw; i++)
            if (strstr(it->mm_w[i]->name, p)) return 1;
    return 0;
}

/* Saves the outputs of the ops in TorchTitan's save list (SDPA, the collectives it lists, max /
 * top-k) and of every GEMM except every second one (counted in forward order within the
 * block), recomputes the rest. A GEMM whose weight shape is that of a weight named in
 * force_recompute is recomputed and not counted (per_op_sac_force_recompute_mm_shapes_by_fqns,
 * which matches by shape: every GEMM of that shape). */
static void decide_op(const hp_save_item_t *it, int n, const char *force, unsigned char *keep_item) {
    int64_t fs[64][2];
    int nf = 0;
    for (int i = 0; i < n; i++)
        if (!it[i].same_as && it[i].kind == HP_SAVE_MM && it[i].mm_nw > 0 && force[0] && fqn_matches(&it[i], force) &&
            nf < 64) {
            mm_shape(&it[i], &fs[nf][0], &fs[nf][1]);
            nf++;
        }
    int mm = 0;
    for (int i = 0; i < n; i++) {
        if (it[i].same_as) continue;
        switch (it[i].kind) {
        case HP_SAVE_MM: {
            int forced = 0;
            if (it[i].mm_nw > 0) {
                int64_t a, b;
                mm_shape(&it[i], &a, &b);
                for (int f = 0; f < nf; f++) forced |= fs[f][0] == a && fs[f][1] == b;
            }
            if (forced) {
                keep_item[i] = 0;
                break;
            }
            mm++;
            keep_item[i] = mm % 2 == 1;
            break;
        }
        case HP_SAVE_ATTENTION: case HP_SAVE_CHOICE: case HP_SAVE_COMM: keep_item[i] = 1; break;
        default: keep_item[i] = 0; break;
        }
    }
}

/* ---- memory budget (torch._functorch.partitioners: choose_saved_values_set, dp_knapsack) ------- */

/* A 0-1 knapsack over the block's items, as torch's "dp" solver: each item's memory is its share
 * of the block's saveable bytes, quantized to 1/10000, the capacity is memory_budget; its value
 * is the recompute FLOPs it saves (torch's "flops" runtime estimate, at least 1); items sorted by
 * size, largest first (stable), and the table backtracked from the last item. Tied items (decided
 * together) are one knapsack item. */
static hp_status_t decide_budget(const hp_save_item_t *it, int n, double budget, unsigned char *keep_item) {
    int *grp = hp_malloc(sizeof(int) * (size_t)(n + 1) * 3);
    if (!grp) return HP_ERR_OOM;
    int *order = grp + n + 1, *gid = order + n + 1;
    int ng = 0;
    for (int i = 0; i < n; i++) {   // groups: an item and the tied items after it
        if (it[i].same_as) { gid[i] = -1; continue; }
        if (it[i].caller_out) {   // never recomputed: backward does not need the block's output (torch's
            gid[i] = -1;          // partitioner recomputes only what backward reads)
            keep_item[i] = 1;
            continue;
        }
        if (it[i].tie && ng > 0) gid[i] = ng - 1;
        else gid[i] = ng++;
    }
    // per group: bytes, value, then the decision (one allocation)
    double *gb = hp_calloc(1, sizeof(double) * (size_t)(2 * ng + 1) + (size_t)ng + 1), *gv = gb + ng;
    if (!gb) { free(grp); return HP_ERR_OOM; }
    double total = 0.0;
    for (int i = 0; i < n; i++)
        if (gid[i] >= 0) {
            gb[gid[i]] += (double)it[i].bytes;
            gv[gid[i]] += it[i].flops;
            total += (double)it[i].bytes;
        }
    for (int g = 0; g < ng; g++) {
        gv[g] = gv[g] > 1.0 ? gv[g] : 1.0;
        order[g] = g;
    }
    for (int a = 1; a < ng; a++)   // insertion sort: stable, size descending (torch sorts by _size_of, reverse)
        for (int b = a; b > 0 && gb[order[b]] > gb[order[b - 1]]; b--) {
            const int t = order[b]; order[b] = order[b - 1]; order[b - 1] = t;
        }
    enum { S = 10000 };
    const long cap = budget >= 1.0 ? -1 : lround(budget * S);   // budget 1: everything (torch's shortcut)
    unsigned char *gkeep = (unsigned char *)(gb + 2 * ng + 1);
    if (cap < 0 || total <= 0.0) {
        for (int g = 0; g < ng; g++) gkeep[g] = 1;
    } else {
        long *qw = hp_malloc(sizeof(long) * (size_t)(ng + 1));
        double *dp = hp_calloc((size_t)(ng + 1) * (size_t)(cap + 1), sizeof(double));
        if (!qw || !dp) { free(qw); free(dp); free(gb); free(grp); return HP_ERR_OOM; }
        for (int i = 0; i < ng; i++) qw[i] = lround(gb[order[i]] / total * S);
        for (int i = 1; i <= ng; i++) {
            const double *prev = dp + (size_t)(i - 1) * (cap + 1);
            double *row = dp + (size_t)i * (cap + 1);
            const long w = qw[i - 1];
            const double v = gv[order[i - 1]];
            for (long j = 0; j <= cap; j++) {
                row[j] = prev[j];
                if (j >= w && prev[j - w] + v > row[j]) row[j] = prev[j - w] + v;
            }
        }
        long j = cap;
        for (int i = ng; i >= 1; i--) {
            const int keep = dp[(size_t)i * (cap + 1) + j] != dp[(size_t)(i - 1) * (cap + 1) + j];
            gkeep[order[i - 1]] = (unsigned char)keep;
            if (keep) j -= qw[i - 1];
        }
        free(qw);
        free(dp);
    }
    for (int i = 0; i < n; i++)
        if (gid[i] >= 0) keep_item[i] = gkeep[gid[i]];
    free(gb);
    free(grp);
    return HP_OK;
}

hp_status_t hp_ac_decide(const hp_module_t *wrapper, const hp_ac_options_t *o, int B, int T, unsigned char *keep,
                         int n_ids, hp_ac_stats_t *stats) {
    if (!wrapper || !o || !keep || B <= 0 || T <= 0)
        return hp_error(HP_ERR_INVALID_ARG, "hp_ac_decide: wrapper, options and table are required and (B, T) = (%d, "
                        "%d) must be positive", B, T);
    HP_TRY(hp_ac_options_check(o, "hp_ac_decide"));
    if (!hp_module_is_checkpoint(wrapper))
        return hp_error(HP_ERR_INVALID_ARG, "hp_ac_decide: module '%s' (%s) is not a checkpoint wrapper",
                        wrapper->name, wrapper->ops->kind);
    hp_save_item_t *it = NULL;
    int n = 0;
    HP_TRY(items_of(wrapper, B, T, &it, &n));
    unsigned char *ki = hp_calloc((size_t)n + 1, 1);
    if (!ki) { free(it); return HP_ERR_OOM; }
    hp_status_t st = HP_OK;
    if (o->policy == HP_AC_OP) {
        decide_op(it, n, o->force_recompute, ki);
        for (int i = n - 1; i > 0; i--)   // tied items: kept when one of them is (keeping more is safe)
            if (it[i].tie && !it[i].same_as && ki[i]) ki[i - 1] = 1;
        for (int i = 1; i < n; i++)
            if (it[i].tie && !it[i].same_as && ki[i - 1]) ki[i] = 1;
    }
    else if (o->policy == HP_AC_BUDGET) st = decide_budget(it, n, o->memory_budget, ki);
    // HP_AC_FULL: nothing kept (the whole forward again, TorchTitan's full AC)
    const hp_module_t *inner = wrapper->children[0];
    hp_ac_stats_t s = {.bytes = inner->ops->act_bytes(inner, B, T)};
    for (int i = 0; st == HP_OK && i < n; i++) {
        const hp_module_t *ow = it[i].owner;
        if (ow->id < 0 || ow->id >= n_ids) {
            st = hp_error(HP_ERR_INVALID_ARG, "hp_ac_decide: module '%s' under '%s' has id %d outside the table's %d "
                          "modules; hint: register it with the model (hp_model_replace_module)", ow->name,
                          wrapper->name, ow->id, n_ids);
            break;
        }
        if (it[i].same_as) continue;
        keep[(size_t)ow->id * HP_SAVE_SLOTS + it[i].slot] = ki[i];
        s.n_items++;
        s.n_kept += ki[i];
        s.forward_flops += it[i].flops;
        if (ki[i]) s.kept_bytes += it[i].bytes;
        else s.recompute_flops += it[i].flops;
    }
    // aliases last to first: a module's final child shares the module's output decision
    for (int i = n - 1; st == HP_OK && i >= 0; i--)
        if (it[i].same_as)
            keep[(size_t)it[i].owner->id * HP_SAVE_SLOTS + HP_SAVE_OUT] =
                keep[(size_t)it[i].same_as->id * HP_SAVE_SLOTS + HP_SAVE_OUT];
    if (st == HP_OK) {
        size_t all = 0;
        for (int i = 0; i < n; i++) all += it[i].same_as ? 0 : it[i].bytes;
        HP_ASSERT_MSG(all <= s.bytes, "checkpoint '%s': its items declare %zu bytes, more than the module's %zu "
                      "(act_bytes): a save_items op overcounts", wrapper->name, all, s.bytes);
        s.region_bytes = s.bytes - s.kept_bytes;
        if (stats) *stats = s;
    }
    free(ki);
    free(it);
    return st;
}

/* ---- the checkpoint wrapper --------------------------------------------------------------------- */

/* The wrapper keeps its input as its slot pointer (no arena bytes); the block's kept items and
 * its recompute region are sized by the context from the decisions (hp_ac_decide). */
static size_t ckpt_act_bytes(const hp_module_t *m, int B, int T) {
    (void)m; (void)B; (void)T;
    return 0;
}

static size_t ckpt_scratch(const hp_module_t *m, int B, int T) {
    const hp_checkpoint_impl_t *C = m->impl;
    const hp_module_t *in = m->children[0];
    const size_t s = in->ops->grad_scratch_floats ? in->ops->grad_scratch_floats(in, B, T) : 0;
    const size_t y = (size_t)B * T * C->out_cols;
    return s > y ? s : y;
}

static hp_arena_t *ckpt_region(const hp_module_t *m, hp_act_t *act) {
    const hp_act_ckpt_t *c = act->ckpt;
    HP_ASSERT_MSG(c && c->regions && c->region_of && m->id >= 0 && m->id < act->n_slots &&
                  c->region_of[m->id] >= 0 && c->region_of[m->id] < c->n_regions,
                  "checkpoint '%s': the context has no recompute region for it (contexts are sized after "
                  "activation checkpointing is set)", m->name);
    HP_ASSERT_MSG(act->region == NULL, "checkpoint '%s': nested checkpoint wrappers are not supported", m->name);
    return &c->regions[c->region_of[m->id]];
}

static hp_status_t ckpt_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    HP_ASSERT(m->id >= 0 && m->id < act->n_slots);
    act->slots[m->id] = in->data;
    hp_arena_t *r = ckpt_region(m, act);
    hp_arena_reset(r);
    const size_t used = act->arena.used;
    act->region = r;
    act->replay = 0;
    hp_status_t st = hp_module_forward(m->children[0], act, in, out);
    act->region = NULL;
    const size_t want = act->ckpt->kept_of ? act->ckpt->kept_of[m->id] : act->arena.used - used;
    HP_ASSERT_MSG(st != HP_OK || act->arena.used - used <= want, "checkpoint '%s': its forward kept %zu bytes, its "
                  "save items declare %zu: a save_items op undercounts", m->name, act->arena.used - used, want);
    return st;
}

static hp_status_t ckpt_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    hp_checkpoint_impl_t *C = m->impl;
    float *x = hp_act_slot(act, m);
    const int N = act->B * act->T;
    /* the replay: the same forward (same kernels, threads and inputs, so bitwise the state the
     * first forward made, and the same collectives in the same order on every rank) after this
     * unit's pre_backward hooks, without the wrapper's forward hooks; the dropped state lands in
     * the region at the addresses it had (same allocations in the same order), the ops of kept
     * items are skipped. Its output is not needed: it lands in the gradient scratch. */
    hp_arena_t *r = ckpt_region(m, act);
    hp_arena_reset(r);
    hp_tensor_t t_x, t_y;
    hp_tensor_view2(&t_x, x, N, C->in_cols);
    HP_ASSERT(act->grad_scratch_floats >= (size_t)N * C->out_cols);
    hp_tensor_view2(&t_y, act->grad_scratch, N, C->out_cols);
    act->region = r;
    act->replay = 1;
    hp_status_t st = hp_module_forward(m->children[0], act, &t_x, &t_y);
    act->region = NULL;
    act->replay = 0;
    HP_TRY(st);
    return hp_module_backward_input(m->children[0], act, dout, din);
}

static hp_status_t ckpt_backward_weight(hp_module_t *m, hp_act_t *act) {
    return hp_module_backward_weight(m->children[0], act);
}

static int ckpt_act_split(const hp_module_t *m, int output, hp_act_split_t *s) {
    return hp_module_act_split(m->children[0], output, s);
}

static const hp_module_ops_t ckpt_ops = {
    "checkpoint", ckpt_act_bytes, ckpt_scratch, ckpt_forward, ckpt_backward_input, ckpt_backward_weight,
    ckpt_act_split, NULL,
};

int hp_module_is_checkpoint(const hp_module_t *m) { return m && m->ops == &ckpt_ops; }

void hp_checkpoint_module_init(hp_module_t *w, hp_checkpoint_impl_t *impl, hp_module_t *inner, int in_cols,
                               int out_cols) {
    impl->in_cols = in_cols;
    impl->out_cols = out_cols;
    hp_module_base_init(w, &ckpt_ops, inner->name, impl);   // TorchTitan's checkpoint_wrapper keeps the FQN
    w->children[w->n_children++] = inner;
}

hp_status_t nn_checkpoint_new(hp_model_t m, hp_module_t *inner, hp_module_t **out) {
    hp_module_t *w = hp_model_module_new(m, sizeof(hp_checkpoint_impl_t));
    if (!w) return HP_ERR_OOM;
    const int dim = hp_model_config(m)->dim;   // a block maps the residual stream (B*T, dim) to itself
    hp_checkpoint_module_init(w, w->impl, inner, dim, dim);
    *out = w;
    return HP_OK;
}
