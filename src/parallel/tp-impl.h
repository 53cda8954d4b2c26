/* Private to the tensor-parallel files (tp_plan.c: styles, plans and matching a plan to the
 * modules; tp_wrap.c: the wrapper modules' forward and backward; tp.c: parallelize, the
 * parameters' sharded storage, the loss child): the handle, a wrapped module's state and the
 * small helpers they share. */
#ifndef HP_TP_IMPL_H
#define HP_TP_IMPL_H

#include <string.h>
#include "hyperparallel/tp.h"
#include "hyperparallel/nn.h"

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
    int planning;           /* hp_tp_plan_model: buffers counted, never allocated; no mesh */
};

/* The memory plan's tensor parallel (memory_plan.c): parallelize_model of an empty model over
 * k ranks without a mesh (as rank 0): the entries get their TP-local shapes, the wrappers and
 * loss_parallel take their places (their per-context state counts in the contexts' sizes), and
 * the buffers are counted (hp_tp_buffer_bytes), not allocated. The model is for sizing only. */
hp_status_t hp_tp_plan_model(hp_tp_t *out, hp_model_t model, int k, const hp_tp_plan_entry_t *plan, int n_plan);

/* The module kinds TP shards (its ops' kind string), MK_OTHER for composite modules. */
static inline int module_kind(const hp_module_t *m) {
    const char *k = m->ops && m->ops->kind ? m->ops->kind : "";
    if (strcmp(k, "linear") == 0 || strcmp(k, "lora") == 0) return MK_LINEAR;   /* LoRA: a linear plus adapters */
    if (strcmp(k, "embedding") == 0) return MK_EMBEDDING;
    if (strcmp(k, "rmsnorm") == 0) return MK_RMSNORM;
    return MK_OTHER;
}

/* LoRA's module (nn: kind "lora", its linear the only child) is sharded as its linear, the
 * adapters with it (tp.c apply, docs/finetune.md "LoRA"); tp_lin is the linear that holds the
 * (stacked) weights and hp_linear_impl_t of a MK_LINEAR module. */
static inline int is_lora(const hp_module_t *m) { return m && m->ops && m->ops->kind && !strcmp(m->ops->kind, "lora"); }
static inline hp_module_t *tp_lin(hp_module_t *m) { return is_lora(m) ? m->children[0] : m; }
static inline const hp_module_t *tp_lin_c(const hp_module_t *m) { return is_lora(m) ? m->children[0] : m; }

static inline int is_shard_seq(const hp_placement_t *p) { return p->kind == HP_SHARD && (p->dim == 0 || p->dim == 1); }
static inline int is_shard_last(const hp_placement_t *p) { return p->kind == HP_SHARD && p->dim == -1; }
static inline int is_rep(const hp_placement_t *p) { return p->kind == HP_REPLICATE; }
static inline int prep_in(const tp_mod_t *t) {
    return t->style.kind == HP_TP_PREPARE_INPUT || t->style.kind == HP_TP_PREPARE_INPUT_OUTPUT;
}
static inline int prep_out(const tp_mod_t *t) {
    return t->style.kind == HP_TP_PREPARE_OUTPUT || t->style.kind == HP_TP_PREPARE_INPUT_OUTPUT;
}
static inline tp_mod_t *mod_of(hp_module_t *m) { return (tp_mod_t *)m->impl; }

/* tp_wrap.c: whether m is a TP wrapper; the wrapper ops of t's (module kind, style). */
int hp_tp_is_wrapper_(const hp_module_t *m);
const hp_module_ops_t *hp_tp_wrapper_ops_(const tp_mod_t *t);
/* The module a TP wrapper holds, or m itself. */
static inline hp_module_t *unwrapped(hp_module_t *m) { return hp_tp_is_wrapper_(m) ? mod_of(m)->m : m; }

/* tp_plan.c: one (module, style) pair validated; the plan resolved over the modules (a style
 * per module, NULL none, and the plan entry it came from). */
hp_status_t hp_tp_check_pair_(hp_tp_t tp, hp_module_t *m, const hp_tp_style_t *s, const char *pattern);
/* "1, 2, 4, 8": the TP degrees that divide n, for the hint of a divisibility error. */
const char *hp_tp_divisors_(int64_t n, char *buf, size_t cap);
hp_status_t hp_tp_resolve_plan_(hp_module_t **mods, hp_module_t **parents, int n, const hp_tp_plan_entry_t *plan,
                                int n_plan, const hp_tp_style_t **styles, int *entry_of);

#endif
