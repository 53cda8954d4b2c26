/* fully_shard (FSDP2) and HSDP over the model's units, driven by the model hooks. A tied model
 * (qwen3) puts the embedding and the root into one group, fully_shard([tok_embeddings, norm,
 * output]): unsharded at the first of its units to run, resharded / reduced after the last.
 * Layout as PyTorch's FSDPParam / foreach_all_gather / foreach_reduce (docs/fsdp.md):
 *   shard size W; per param chunk c = ceil(d0 / W) rows, padded shard c * rest floats;
 *   group shard S = sum of padded shards (param order); all-gather output (W, S), row r =
 *   rank r's padded shards concatenated; copy-out row r, param j -> rows [r c, r c + rows_r)
 *   of the unsharded param; reduce-scatter input (W, S) built the same way from the
 *   unsharded gradients (padding rows zero), output S = this rank's padded sharded grads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/fsdp.h"
#include "parallel/dp-impl.h"

/* ---- registry of wrapped models (fully_shard twice, DDP over FSDP) ---------------------- */

#define DP_MAX_WRAPPED 64
static struct { hp_model_t model; const char *what; } g_wrapped[DP_MAX_WRAPPED];

hp_status_t hp_dp_register(hp_model_t model, const char *what) {
    for (int i = 0; i < DP_MAX_WRAPPED; i++)
        if (g_wrapped[i].model == model)
            return hp_error(HP_ERR_STATE, "%s: the model is already wrapped by %s; hint: apply one "
                            "data-parallel wrapper once per model (fully_shard each unit once)", what,
                            g_wrapped[i].what);
    for (int i = 0; i < DP_MAX_WRAPPED; i++)
        if (!g_wrapped[i].model) {
            g_wrapped[i].model = model;
            g_wrapped[i].what = what;
            return HP_OK;
        }
    return hp_error(HP_ERR_OOM, "%s: more than %d wrapped models in one process", what, DP_MAX_WRAPPED);
}

void hp_dp_unregister(hp_model_t model) {
    for (int i = 0; i < DP_MAX_WRAPPED; i++)
        if (g_wrapped[i].model == model) g_wrapped[i].model = NULL;
}

hp_status_t hp_dp_attach_hooks(hp_model_t model, void *user, const hp_module_hook_fn fns[HP_HOOK_KINDS]) {
    int u0, u1;
    hp_model_unit_range(model, &u0, &u1);   // a pipeline stage holds units [u0, u1) only
    for (int u = u0; u < u1; u++)
        for (int k = 0; k < HP_HOOK_KINDS; k++) {
            if (!fns[k]) continue;
            hp_status_t st = hp_module_add_hook(hp_model_unit_module(model, u), (hp_hook_kind_t)k, fns[k], user, NULL);
            if (st != HP_OK) {
                hp_dp_detach_hooks(model, user);
                return st;
            }
        }
    return HP_OK;
}

void hp_dp_detach_hooks(hp_model_t model, void *user) {
    int u0, u1;
    hp_model_unit_range(model, &u0, &u1);
    for (int u = u0; u < u1; u++) hp_module_remove_hooks_of(hp_model_unit_module(model, u), user);
}

/* ---- state --------------------------------------------------------------------------- */

enum { SHARDED = 0, UNSHARDED, SHARDED_POST_FORWARD };

typedef struct fparam {
    int index;               /* model param index */
    int64_t d0, rest;        /* global rows, floats per row */
    size_t unit_off;         /* offset in the unit's unsharded span */
    int64_t chunk, rows;     /* layout W: ceil(d0/W), this rank's rows */
    size_t shard_off;        /* offset in the group's flat shard (layout W) */
    int64_t pf_chunk;        /* layout k (reshard_after_forward = k) */
    size_t pf_off;
} fparam_t;

typedef struct group {
    int u_lo, u_hi;          /* its units: u_lo runs first in forward, u_hi first in backward
                                (equal except the tied group: tok_embeddings and the root) */
    char name[24];
    int n;
    fparam_t *p;
    size_t span;             /* floats of the unsharded group (the unit's span in the model's
                                flat layout; the tied group: both spans, concatenated) */
    size_t S, S_pf;          /* per-rank flat shard floats (layout W, layout k) */
    size_t S_t;              /* the trainable prefix of S: frozen params (LoRA's base) are laid out
                                after every trainable one, and only [0, S_t) is reduce-scattered */
    float *shard, *gshard;   /* (S) padded sharded params / grads: persistent */
    float *pf_shard;         /* (S_pf) SHARDED_POST_FORWARD copy */
    float *accum;            /* (span) unsharded grads kept by backwards without sync */
    float *gown;             /* (span) unsharded grads of a group whose backward spans other
                                units (the tied group), else NULL: f->gfull is used */
    float *gcur;             /* the unsharded grads of the backward in progress */
    int accum_pending;
    /* backward_input passes whose backward_weight has not run yet (zero-bubble schedules run
     * I of several micro-batches before their W): the group stays unsharded, its gradient
     * pointers stay on gcur, and it reshards and reduces after the last pending weight pass */
    int pending_w;
    float *partial;          /* (S) HSDP reduce-scatter outputs kept without all-reduce */
    int partial_pending;
    int raf;                 /* 1 reshard, 0 keep, k >= 2 reshard to k */
    int state;
    float *own;              /* (span) unsharded params of a group kept from forward into
                                backward (raf 0: the root, every group under pipelining), else
                                NULL: a slot of the rotating pool while unsharded */
    int slot;                /* rotating slot while unsharded or gathering, else -1 */
    float *full;             /* the unsharded params while unsharded or gathering: own or a slot's */
    int ag;                  /* all-gather buffer while gathering, else -1 */
    int ag_pending;          /* all-gather issued, copy-out not done */
    int ag_pf;               /* the pending all-gather is over the k group */
    hp_work_t ag_work;
    int *fwd_pf, n_fwd_pf;   /* explicit prefetch lists (units; set_modules_to_forward_prefetch, */
    int *bwd_pf, n_bwd_pf;   /* set_modules_to_backward_prefetch); n -1: the implicit one */
} group_t;

typedef struct pslot {
    float *full;   /* (max rotating span) unsharded params */
    int busy;
} pslot_t;

typedef struct agbuf {
    void *ag;      /* all-gather output (W, S) */
    void *send;    /* param_dtype send buffer (bf16 params), else NULL */
    int busy;
} agbuf_t;

typedef struct red {
    group_t *g;
    int stage;     /* 0 free, 1 reduce-scatter in flight, 2 all-reduce in flight */
    void *out;     /* (S) reduce-scatter output (then all-reduced in place under HSDP) */
    hp_work_t work;
} red_t;

#define FSDP_MAX_EVENTS 4096
#define FSDP_EVENT_LEN 40

struct hp_fsdp {
    hp_model_t model;
    hp_mesh_t mesh;
    hp_mesh_t spmd_mesh;     /* FSDP over TP: mesh dims + the TP mesh dim (owned), else NULL */
    hp_mesh_t tp_mesh;       /* the TP mesh of the model's DTensor parameters, else NULL */
    hp_fsdp_options_t o;
    hp_comm_t shard_comm, rep_comm, pf_comm;
    int W, rank, R, k;
    int n_groups, n_params, n_units;
    int u0, u1;              /* the units the model holds (a pipeline stage: a range) */
    hp_arena_t tables;       /* g, ug, pg, pj, params, events live here */
    group_t *g;
    int *ug;                 /* (n_units) unit -> group */
    int *pg, *pj;            /* (n_params) param -> group, index in the group */
    hp_param_t *params;      /* sharded params (model order) */
    hp_param_t *mparams;     /* the model's param table */
    pslot_t *slots;          /* the rotating pool of unsharded-parameter buffers */
    int n_slots;
    size_t rot_span;         /* floats of each rotating slot: the largest span that rotates */
    agbuf_t *ags;            /* all-gather buffers: held from the all-gather to its copy-out */
    int n_ags;
    int *ag_order, n_ag_order;   /* (n_ags) the held buffers, oldest all-gather first */
    float *gfull;            /* (max span) unsharded grads of the unit in backward */
    void *red_in;            /* (W, S) reduce-scatter input: one, rebuilt per group (the previous
                                reduce-scatter is waited before; HSDP's all-reduce runs on out) */
    red_t red[2];
    int red_last;            /* index of the newest in-flight reduction, -1 none */
    size_t max_span, max_S, max_S_pf;
    hp_dtype_t pdt, rdt;     /* all-gather dtype, reduce dtype */
    hp_redop_t rs_op, ar_op;
    int rs_premul, ar_premul;
    double pre_div, post_div;
    int sync, all_reduce;
    size_t ws_bytes;         /* fixed workspace (kept groups' buffers, gradient and reduction buffers) */
    size_t pool_bytes;       /* the rotating slots and all-gather buffers */
    int rec;
    int n_events;
    char (*events)[FSDP_EVENT_LEN];
    double wait_s;
    /* ignored_params: their values / grads in storage of our own (the model's is released) */
    float *ign_v, *ign_g;
    size_t ign_floats;
};

static size_t esize(hp_dtype_t dt) { return dt == HP_F32 ? 4 : 2; }

static void event(hp_fsdp_t f, const char *what, const group_t *g) {
    if (!f->rec || f->n_events >= FSDP_MAX_EVENTS) return;
    snprintf(f->events[f->n_events++], FSDP_EVENT_LEN, "%s %s", what, g->name);
}

static hp_status_t wait_work(hp_fsdp_t f, hp_work_t *w) {
    if (!*w) return HP_OK;
    double t0 = hp_clock_now_seconds();
    hp_status_t s = hp_work_wait(w);
    f->wait_s += hp_clock_now_seconds() - t0;
    return s;
}

/* Blocking collectives count as exposed communication too. */
#define TIMED(f, work, call)                                 \
    do {                                                     \
        double t0_ = hp_clock_now_seconds();                            \
        HP_TRY(call);                                        \
        if (!(work)) (f)->wait_s += hp_clock_now_seconds() - t0_;       \
    } while (0)

hp_fsdp_options_t hp_fsdp_default_options(void) {
    hp_fsdp_options_t o;
    memset(&o, 0, sizeof(o));
    o.reshard_after_forward = HP_FSDP_RESHARD_DEFAULT;
    o.mp.param_dtype = o.mp.reduce_dtype = o.mp.output_dtype = HP_F32;
    o.mp.cast_forward_inputs = 1;
    o.overlap = 1;
    return o;
}

hp_status_t hp_fsdp_validate_param(const hp_param_t *p) {
    const hp_tensor_t *t = &p->value.local;
    if (t->ndim == 0)
        return hp_error(HP_ERR_INVALID_ARG, "fully_shard: parameter '%s' is a scalar; Change %s to a 1D "
                        "tensor with numel equal to 1.", p->name, p->name);
    if (t->dtype != HP_F32)
        return hp_error(HP_ERR_UNSUPPORTED, "fully_shard: parameter '%s' has dtype %s; sharded parameters "
                        "are f32 (use mp.param_dtype for bf16 compute)", p->name, hp_dtype_name(t->dtype));
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] > 1 && t->stride[d] != expect)
            return hp_error(HP_ERR_UNSUPPORTED, "fully_shard: parameter '%s' is not contiguous; FSDP does not "
                            "support non-contiguous parameters yet", p->name);
        expect *= t->shape[d];
    }
    return HP_OK;
}

/* ---- slots --------------------------------------------------------------------------- */

/* The group's unsharded-parameter buffer: its own (kept groups), or a free rotating slot. */
static hp_status_t slot_get(hp_fsdp_t f, group_t *g) {
    if (g->own) {
        g->full = g->own;
        return HP_OK;
    }
    for (int i = 0; i < f->n_slots; i++)
        if (!f->slots[i].busy) {
            f->slots[i].busy = 1;
            g->slot = i;
            g->full = f->slots[i].full;
            return HP_OK;
        }
    return hp_error(HP_ERR_STATE, "fully_shard: no free workspace slot for '%s' (%d slots); hint: the prefetch lists "
                    "(hp_fsdp_set_modules_to_forward_prefetch) size the pool: set them before the first step",
                    g->name, f->n_slots);
}

static void slot_put(hp_fsdp_t f, group_t *g) {
    if (g->slot >= 0) f->slots[g->slot].busy = 0;
    g->slot = -1;
    g->full = NULL;
}

/* ---- all-gather --------------------------------------------------------------------- */

static hp_status_t wait_unshard(hp_fsdp_t f, group_t *g);

/* A free all-gather buffer; when every one is held by an all-gather in flight, the oldest issued
 * is waited and copied out first (its group keeps its slot, so only the buffer is freed). */
static hp_status_t ag_get(hp_fsdp_t f, group_t *g) {
    for (;;) {
        for (int i = 0; i < f->n_ags; i++)
            if (!f->ags[i].busy) {
                f->ags[i].busy = 1;
                g->ag = i;
                return HP_OK;
            }
        group_t *old = NULL;
        for (int u = 0; u < f->n_groups && !old; u++)
            if (f->g[u].ag_pending && f->g[u].ag == f->ag_order[0]) old = &f->g[u];
        if (!old) return hp_error(HP_ERR_STATE, "fully_shard: no all-gather buffer for '%s'", g->name);
        HP_TRY(wait_unshard(f, old));
    }
}

static void ag_put(hp_fsdp_t f, group_t *g) {
    if (g->ag < 0) return;
    f->ags[g->ag].busy = 0;
    for (int i = 0, j = 0; i < f->n_ag_order; i++)   // issue order without this buffer
        if (f->ag_order[i] != g->ag) f->ag_order[j++] = f->ag_order[i];
    f->n_ag_order--;
    g->ag = -1;
}

/* Issues the all-gather of a sharded (or post-forward sharded) group; no-op when it is
 * unsharded or already gathering. */
static hp_status_t unshard(hp_fsdp_t f, group_t *g) {
    if (g->state == UNSHARDED || g->ag_pending) return HP_OK;
    HP_TRY(slot_get(f, g));
    hp_status_t st = ag_get(f, g);
    if (st != HP_OK) {
        slot_put(f, g);
        return st;
    }
    f->ag_order[f->n_ag_order++] = g->ag;
    agbuf_t *s = &f->ags[g->ag];
    const int pf = g->state == SHARDED_POST_FORWARD;
    const float *src = pf ? g->pf_shard : g->shard;
    size_t n = pf ? g->S_pf : g->S;
    hp_comm_t comm = pf ? f->pf_comm : f->shard_comm;
    const void *send = src;
    if (f->pdt == HP_BF16) {
        uint16_t *b = s->send;
        for (size_t i = 0; i < n; i++) b[i] = hp_f32_to_bf16(src[i]);
        send = b;
    }
    event(f, "unshard", g);
    hp_work_t *w = f->o.overlap ? &g->ag_work : NULL;
    TIMED(f, w, hp_all_gather(send, s->ag, n, f->pdt, comm, w));
    g->ag_pending = 1;
    g->ag_pf = pf;
    return HP_OK;
}

/* Waits for the group's all-gather and copies out (W, S) -> unsharded params. */
static hp_status_t wait_unshard(hp_fsdp_t f, group_t *g) {
    if (!g->ag_pending) return HP_OK;
    HP_TRY(wait_work(f, &g->ag_work));
    const agbuf_t *s = &f->ags[g->ag];
    const int pf = g->ag_pf;
    const int W = pf ? f->k : f->W;
    const size_t S = pf ? g->S_pf : g->S;
    for (int r = 0; r < W; r++)
        for (int j = 0; j < g->n; j++) {
            const fparam_t *p = &g->p[j];
            int64_t chunk = pf ? p->pf_chunk : p->chunk, rows, row0;
            hp_shard_size_and_offset(p->d0, W, r, &rows, &row0);
            size_t off = (size_t)r * S + (pf ? p->pf_off : p->shard_off), cnt = (size_t)(rows * p->rest);
            float *dst = g->full + p->unit_off + (size_t)(row0 * p->rest);
            (void)chunk;
            if (f->pdt == HP_BF16) {
                const uint16_t *b = (const uint16_t *)s->ag + off;
                for (size_t i = 0; i < cnt; i++) dst[i] = hp_bf16_to_f32(b[i]);
            } else {
                memcpy(dst, (const float *)s->ag + off, sizeof(float) * cnt);
            }
        }
    g->ag_pending = 0;
    ag_put(f, g);
    g->state = UNSHARDED;
    return HP_OK;
}

static void point_model(hp_fsdp_t f, group_t *g, float *values, float *grads) {
    for (int j = 0; j < g->n; j++) {
        hp_param_t *mp = &f->mparams[g->p[j].index];
        mp->value.local.data = values ? values + g->p[j].unit_off : NULL;
        // a pending weight pass (split backward) keeps writing into the gradient buffer even
        // when a later forward re-points the values
        float *gr = grads ? grads : g->pending_w ? g->gcur : NULL;
        mp->grad.local.data = gr ? gr + g->p[j].unit_off : NULL;
    }
}

/* Frees the unsharded params: to SHARDED, or to SHARDED_POST_FORWARD keeping this rank's
 * rows of the k-group layout (to_pf). */
static void reshard(hp_fsdp_t f, group_t *g, int to_pf) {
    if (g->state != UNSHARDED) return;
    if (to_pf) {
        const int kr = f->rank % f->k;
        memset(g->pf_shard, 0, sizeof(float) * g->S_pf);
        for (int j = 0; j < g->n; j++) {
            const fparam_t *p = &g->p[j];
            int64_t rows, row0;
            hp_shard_size_and_offset(p->d0, f->k, kr, &rows, &row0);
            memcpy(g->pf_shard + p->pf_off, g->full + p->unit_off + (size_t)(row0 * p->rest),
                   sizeof(float) * (size_t)(rows * p->rest));
        }
    }
    event(f, "reshard", g);
    slot_put(f, g);
    g->state = to_pf ? SHARDED_POST_FORWARD : SHARDED;
    point_model(f, g, NULL, NULL);
}

/* ---- reduce-scatter / all-reduce ------------------------------------------------------ */

static hp_status_t red_finish(hp_fsdp_t f, red_t *e) {
    group_t *g = e->g;
    const int hsdp_partial = f->R > 1 && !f->all_reduce;
    float *dst = hsdp_partial ? g->partial : g->gshard;
    const float post = (float)f->post_div;
    if (f->rdt != HP_BF16 && f->post_div == 1.0) {   // the common case as a plain loop (vectorised)
        const float *src = e->out;
        for (size_t i = 0; i < g->S_t; i++) dst[i] += src[i];
    } else {
        for (size_t i = 0; i < g->S_t; i++) {
            float v = f->rdt == HP_BF16 ? hp_bf16_to_f32(((const uint16_t *)e->out)[i]) : ((const float *)e->out)[i];
            if (f->post_div != 1.0) v /= post;
            dst[i] += v;
        }
    }
    if (hsdp_partial) g->partial_pending = 1;
    e->stage = 0;
    e->g = NULL;
    return HP_OK;
}

/* Moves a reduction one stage on (waiting for its current collective). */
static hp_status_t red_advance(hp_fsdp_t f, red_t *e) {
    if (e->stage == 1) {
        HP_TRY(wait_work(f, &e->work));
        if (f->R > 1 && f->all_reduce) {
            group_t *g = e->g;
            if (g->partial_pending) {   // set_requires_all_reduce(False) outputs join this one
                for (size_t i = 0; i < g->S_t; i++) {
                    if (f->rdt == HP_BF16) {
                        uint16_t *o = e->out;
                        o[i] = hp_f32_to_bf16(hp_bf16_to_f32(o[i]) + g->partial[i]);
                    } else {
                        ((float *)e->out)[i] += g->partial[i];
                    }
                    g->partial[i] = 0.0f;
                }
                g->partial_pending = 0;
            }
            hp_work_t *w = f->o.overlap ? &e->work : NULL;
            TIMED(f, w, hp_all_reduce(e->out, e->out, g->S_t, f->rdt, f->ar_op, f->rep_comm, w));
            e->stage = 2;
            if (!w) return red_finish(f, e);
            return HP_OK;
        }
        return red_finish(f, e);
    }
    if (e->stage == 2) {
        HP_TRY(wait_work(f, &e->work));
        return red_finish(f, e);
    }
    return HP_OK;
}

static hp_status_t red_drain(hp_fsdp_t f) {
    // oldest first: the entry that is not the newest
    for (int pass = 0; pass < 2; pass++) {
        int i = f->red_last < 0 ? pass : (pass == 0 ? 1 - f->red_last : f->red_last);
        while (f->red[i].stage) HP_TRY(red_advance(f, &f->red[i]));
    }
    f->red_last = -1;
    return HP_OK;
}

/* Reduce-scatter of a group's unsharded gradients `grads` (span floats). */
static hp_status_t reduce_grads(hp_fsdp_t f, group_t *g, const float *grads) {
    if (g->S_t == 0) return HP_OK;   // every param frozen (LoRA's embedding, head): nothing to reduce
    // the previous reduction moves on (its reduce-scatter is waited here, one unit later)
    int prev = f->red_last;
    if (prev >= 0) HP_TRY(red_advance(f, &f->red[prev]));
    int e_i = prev < 0 ? 0 : 1 - prev;
    red_t *e = &f->red[e_i];
    while (e->stage) HP_TRY(red_advance(f, e));   // older one: finish its all-reduce
    e->g = g;
    const float pre = (float)f->pre_div;
    for (int r = 0; r < f->W; r++)
        for (int j = 0; j < g->n; j++) {
            const fparam_t *p = &g->p[j];
            if (p->shard_off >= g->S_t) continue;   // frozen: laid out after S_t, never reduced
            int64_t rows, row0;
            hp_shard_size_and_offset(p->d0, f->W, r, &rows, &row0);
            size_t off = (size_t)r * g->S_t + p->shard_off, cnt = (size_t)(rows * p->rest),
                   pad = (size_t)(p->chunk * p->rest) - cnt;
            const float *src = grads + p->unit_off + (size_t)(row0 * p->rest);
            if (f->rdt == HP_BF16) {
                uint16_t *b = (uint16_t *)f->red_in + off;
                for (size_t i = 0; i < cnt; i++) b[i] = hp_f32_to_bf16(f->pre_div != 1.0 ? src[i] / pre : src[i]);
                memset(b + cnt, 0, 2 * pad);
            } else {
                float *b = (float *)f->red_in + off;
                if (f->pre_div != 1.0)
                    for (size_t i = 0; i < cnt; i++) b[i] = src[i] / pre;
                else
                    memcpy(b, src, sizeof(float) * cnt);
                memset(b + cnt, 0, 4 * pad);
            }
        }
    hp_work_t *w = f->o.overlap ? &e->work : NULL;
    TIMED(f, w, hp_reduce_scatter(f->red_in, e->out, g->S_t, f->rdt, f->rs_op, f->shard_comm, w));
    e->stage = 1;
    f->red_last = e_i;
    if (!w) {   // blocking: finish now (same arithmetic as the overlapped order)
        HP_TRY(red_advance(f, e));
        while (e->stage) HP_TRY(red_advance(f, e));
        f->red_last = -1;
    }
    return HP_OK;
}

/* ---- hooks ---------------------------------------------------------------------------- */
/* Hooks come per unit; a group's state changes at its first unit (unshard, gradient buffer)
 * and its last (reshard, reduce) in each pass. For a one-unit group both are the unit. */

static group_t *group_of(hp_fsdp_t f, int unit) { return &f->g[f->ug[unit]]; }

/* The units whose all-gathers unit u starts after its own copy-out: its explicit list
 * (set_modules_to_forward_prefetch / _backward_prefetch), else with overlap the implicit one
 * (forward: the next unit; backward: the previous unit in post-forward order), none outside
 * the model's units. Returns the count written to out (capacity f->n_units). */
static int prefetch_list(hp_fsdp_t f, int u, int backward, int *out) {
    const group_t *g = group_of(f, u);
    const int n = backward ? g->n_bwd_pf : g->n_fwd_pf;
    if (n >= 0) {   // explicit (PyTorch: the list replaces the implicit prefetch)
        if (n) memcpy(out, backward ? g->bwd_pf : g->fwd_pf, sizeof(int) * (size_t)n);
        return n;
    }
    const int next = backward ? u - 1 : u + 1;
    if (!f->o.overlap || next < f->u0 || next >= f->u1) return 0;
    out[0] = next;
    return 1;
}

/* The group g unsharded (waited for), then the all-gathers of unit u's prefetch list started
 * so they run while g's unit computes; a no-op for a group already unsharded (the tied group
 * before the root). */
static hp_status_t unshard_prefetch(hp_fsdp_t f, group_t *g, int u, int backward) {
    HP_TRY(unshard(f, g));
    HP_TRY(wait_unshard(f, g));
    int list[HP_FSDP_MAX_PREFETCH];
    const int n = prefetch_list(f, u, backward, list);
    for (int i = 0; i < n; i++) HP_TRY(unshard(f, group_of(f, list[i])));
    return HP_OK;
}

static hp_status_t pre_forward(void *ctx, hp_module_t *mod, hp_act_t *act) {
    (void)act;
    hp_fsdp_t f = ctx;
    group_t *g = group_of(f, mod->unit);
    HP_TRY(unshard_prefetch(f, g, mod->unit, 0));
    point_model(f, g, g->full, NULL);
    return HP_OK;
}

static hp_status_t post_forward(void *ctx, hp_module_t *mod, hp_act_t *act) {
    (void)act;
    hp_fsdp_t f = ctx;
    group_t *g = group_of(f, mod->unit);
    if (mod->unit != g->u_hi) return HP_OK;   // another unit of the group runs later in forward
    if (g->raf == 1) reshard(f, g, 0);
    else if (g->raf >= 2) reshard(f, g, 1);
    else point_model(f, g, NULL, NULL);
    return HP_OK;
}

/* The buffer the group's unsharded gradients go to in this backward (g->gcur, zeroed): its
 * own, or FSDP's shared one; the accumulator, kept, when gradients sum over steps without
 * reduction (no sync) or a sum is pending. */
static hp_status_t grad_buffer(hp_fsdp_t f, group_t *g) {
    if (!f->sync || g->accum_pending) {
        if (!g->accum) {
            g->accum = hp_aligned_alloc(sizeof(float) * g->span);
            if (!g->accum) return HP_ERR_OOM;
            f->ws_bytes += sizeof(float) * g->span;
        }
        if (!g->accum_pending) memset(g->accum, 0, sizeof(float) * g->span);
        g->gcur = g->accum;
    } else {
        g->gcur = g->gown ? g->gown : f->gfull;
        memset(g->gcur, 0, sizeof(float) * g->span);
    }
    return HP_OK;
}

static hp_status_t pre_backward(void *ctx, hp_module_t *mod, hp_act_t *act) {
    (void)act;
    hp_fsdp_t f = ctx;
    const int unit = mod->unit;
    group_t *g = group_of(f, unit);
    HP_TRY(unshard_prefetch(f, g, unit, 1));
    // the group's first unit in backward: its gradient buffer (once while weight passes of
    // earlier micro-batches are pending: they and this one add into the same buffer)
    if (unit == g->u_hi && g->pending_w++ == 0) HP_TRY(grad_buffer(f, g));
    // a later unit of the group (the embedding of the tied group) accumulates (+=) into the
    // same buffer: both uses of the shared weight add to one gradient
    point_model(f, g, g->full, g->gcur);
    return HP_OK;
}

static hp_status_t post_backward(void *ctx, hp_module_t *mod, hp_act_t *act) {
    (void)act;
    hp_fsdp_t f = ctx;
    group_t *g = group_of(f, mod->unit);
    // the group's last unit in backward: reshard and reduce after the last pending weight pass
    if (mod->unit == g->u_lo && (g->pending_w == 0 || --g->pending_w == 0)) {
        reshard(f, g, 0);
        event(f, "post_backward", g);
        if (!f->sync) {
            g->accum_pending = 1;
        } else {
            HP_TRY(reduce_grads(f, g, g->gcur));
            g->accum_pending = 0;
        }
        g->gcur = NULL;
    }
    if (mod->unit == f->u0) HP_TRY(red_drain(f));   // the root's final callback: wait every reduction
    return HP_OK;
}

/* ---- creation ------------------------------------------------------------------------ */

static const char *unit_name(hp_model_t m, int u, char *buf, size_t n) {
    int L = hp_model_num_units(m) - 2;
    if (u == 0) snprintf(buf, n, "tok_embeddings");
    else if (u <= L) snprintf(buf, n, "layers.%d", u - 1);
    else snprintf(buf, n, "root");
    return buf;
}

/* The TP mesh of the model's DTensor parameters (parallelize_module ran first), or NULL when
 * every parameter is a plain tensor. FSDP then shards the TP-local tensor's dim 0 over the
 * data-parallel dims and records the 2-D layout (see sharded_layout). */
static hp_status_t tp_mesh_of(const hp_param_t *mp, int np, hp_mesh_t mesh, int (*ignored)(const hp_param_t *),
                             hp_mesh_t *tpm) {
    *tpm = NULL;
    char b1[256], b2[256];
    for (int i = 0; i < np; i++) {
        const hp_dtensor_t *v = &mp[i].value;
        if (!v->mesh || (ignored && ignored(&mp[i]))) continue;
        if (v->mesh_ndim != 1)
            return hp_error(HP_ERR_UNSUPPORTED, "fully_shard: parameter '%s' is a DTensor on a %d-D mesh; expected "
                            "plain tensors or tensor-parallel DTensors on a 1-D mesh", mp[i].name, v->mesh_ndim);
        if (hp_mesh_equal(v->mesh, mesh))
            return hp_error(HP_ERR_INVALID_ARG, "fully_shard: parameter '%s' is already a DTensor on the FSDP mesh "
                            "%s; hint: parallelize (TP) over a different mesh dim than the one given to fully_shard",
                            mp[i].name, hp_mesh_str(mesh, b1, sizeof b1));
        hp_placement_t p = v->placements[0];
        if (p.kind != HP_SHARD && p.kind != HP_REPLICATE)
            return hp_error(HP_ERR_UNSUPPORTED, "fully_shard: parameter '%s' has placement %s on its TP mesh; "
                            "expected Shard or Replicate", mp[i].name, hp_placement_str(p, b1, sizeof b1));
        if (*tpm && !hp_mesh_equal(*tpm, v->mesh))
            return hp_error(HP_ERR_UNSUPPORTED, "fully_shard: parameters are DTensors on two meshes (%s and %s); "
                            "expected one tensor-parallel mesh", hp_mesh_str(*tpm, b1, sizeof b1),
                            hp_mesh_str(v->mesh, b2, sizeof b2));
        if (!*tpm) *tpm = v->mesh;
    }
    return HP_OK;
}

/* Placements of a sharded parameter (PyTorch FSDPParam._init_sharded_param): on the FSDP mesh
 * (Shard(0)) or HSDP (Replicate(), Shard(0)); over TP, the SPMD mesh (FSDP dims..., tp) with
 * the TP placement last, and the dp_shard placement _StridedShard(0, tp) when TP also shards
 * dim 0 (FSDP splits each TP chunk's rows: ColwiseParallel, RowwiseParallel embeddings),
 * Shard(0) otherwise ([Shard(0), Shard(1)] rowwise, [Shard(0), Replicate()] norms). The
 * global shape is the full parameter's. */
static void sharded_layout(hp_fsdp_t f, int nd, const hp_dtensor_t *tpv, hp_dtensor_t *d) {
    const int tp = tpv->mesh != NULL;
    d->mesh = tp ? f->spmd_mesh : f->mesh;
    d->mesh_ndim = nd + tp;
    if (nd == 2) d->placements[0] = hp_replicate();
    d->placements[nd - 1] = hp_shard(0);
    if (tp) {
        hp_placement_t p = tpv->placements[0];
        d->placements[nd] = p;
        if (p.kind == HP_SHARD && p.dim == 0)
            d->placements[nd - 1] = hp_strided_shard(0, (int)hp_mesh_size(tpv->mesh, 0));
    }
    for (int a = 0; a < tpv->local.ndim; a++) d->global_shape[a] = tp ? tpv->global_shape[a] : tpv->local.shape[a];
}

/* ---- the rotating pools ---------------------------------------------------------------- */

/* Rotating slots held at once by one micro-batch's forward and backward with the prefetch
 * lists, walked hook by hook (kept groups use their own buffers and are not counted). */
static int slots_needed(hp_fsdp_t f) {
    unsigned char *held = hp_calloc((size_t)f->n_groups, 1);
    int *list = hp_calloc((size_t)HP_FSDP_MAX_PREFETCH, sizeof(int));
    if (!held || !list) {   // the simulation's scratch only: then every group gets a slot
        free(held);
        free(list);
        return f->n_groups;
    }
    int cur = 0, peak = 0;
#define TAKE(grp)                                                      \
    do {                                                               \
        const group_t *g_ = (grp);                                     \
        if (!g_->own && !held[g_ - f->g]) {                            \
            held[g_ - f->g] = 1;                                       \
            if (++cur > peak) peak = cur;                              \
        }                                                              \
    } while (0)
#define DROP(grp)                                                      \
    do {                                                               \
        const group_t *g_ = (grp);                                     \
        if (held[g_ - f->g]) { held[g_ - f->g] = 0; cur--; }           \
    } while (0)
    for (int u = f->u0; u < f->u1; u++) {   // forward: reshard after the group's last unit
        const group_t *g = group_of(f, u);
        TAKE(g);
        const int n = prefetch_list(f, u, 0, list);
        for (int i = 0; i < n; i++) TAKE(group_of(f, list[i]));
        if (u == g->u_hi && g->raf != 0) DROP(g);
    }
    for (int u = f->u1 - 1; u >= f->u0; u--) {   // backward: reshard after the group's last unit
        const group_t *g = group_of(f, u);
        TAKE(g);
        const int n = prefetch_list(f, u, 1, list);
        for (int i = 0; i < n; i++) TAKE(group_of(f, list[i]));
        if (u == g->u_lo) DROP(g);
    }
#undef TAKE
#undef DROP
    free(held);
    free(list);
    return peak;
}

static void free_pools(hp_fsdp_t f) {
    for (int i = 0; f->slots && i < f->n_slots; i++) hp_free_aligned(f->slots[i].full);
    for (int i = 0; f->ags && i < f->n_ags; i++) {
        hp_free_aligned(f->ags[i].ag);
        hp_free_aligned(f->ags[i].send);
    }
    free(f->slots);
    free(f->ags);
    free(f->ag_order);
    f->slots = NULL;
    f->ags = NULL;
    f->ag_order = NULL;
    f->n_slots = f->n_ags = f->n_ag_order = 0;
    f->pool_bytes = 0;
}

/* The rotating slots (as many as the prefetch schedule holds at once, each of the largest
 * rotating span) and the all-gather buffers (one per all-gather a prefetch list keeps in
 * flight, at least one). Set-up time only: every group is sharded. */
static hp_status_t alloc_pools(hp_fsdp_t f) {
    free_pools(f);
    int lists = 1, list[HP_FSDP_MAX_PREFETCH];
    for (int u = f->u0; u < f->u1; u++)
        for (int b = 0; b < 2; b++) {
            const int n = prefetch_list(f, u, b, list);
            if (n > lists) lists = n;
        }
    f->n_slots = slots_needed(f);
    f->n_ags = lists;
    size_t ag_elems = (size_t)f->W * f->max_S;
    if (f->k && (size_t)f->k * f->max_S_pf > ag_elems) ag_elems = (size_t)f->k * f->max_S_pf;
    const size_t send_elems = f->max_S > f->max_S_pf ? f->max_S : f->max_S_pf;
    f->slots = hp_calloc((size_t)f->n_slots + 1, sizeof(pslot_t));
    f->ags = hp_calloc((size_t)f->n_ags, sizeof(agbuf_t));
    f->ag_order = hp_calloc((size_t)f->n_ags, sizeof(int));
    if (!f->slots || !f->ags || !f->ag_order) return HP_ERR_OOM;
    for (int i = 0; i < f->n_slots; i++) {
        f->slots[i].full = hp_aligned_alloc(sizeof(float) * (f->rot_span + 1));
        if (!f->slots[i].full) return HP_ERR_OOM;
        memset(f->slots[i].full, 0, sizeof(float) * (f->rot_span + 1));
        f->pool_bytes += sizeof(float) * (f->rot_span + 1);
    }
    for (int i = 0; i < f->n_ags; i++) {
        agbuf_t *a = &f->ags[i];
        a->ag = hp_aligned_alloc(esize(f->pdt) * (ag_elems + 1));
        a->send = f->pdt == HP_F32 ? NULL : hp_aligned_alloc(esize(f->pdt) * (send_elems + 1));
        if (!a->ag || (f->pdt != HP_F32 && !a->send)) return HP_ERR_OOM;
        f->pool_bytes += esize(f->pdt) * (ag_elems + 1 + (a->send ? send_elems + 1 : 0));
    }
    return HP_OK;
}

hp_status_t hp_fsdp_plan_memory(hp_model_t model, int W, int R, const hp_fsdp_options_t *opts, int no_sync,
                                size_t *param_bytes, size_t *grad_bytes, size_t *workspace_bytes,
                                size_t *rs_input_bytes) {
    if (!model || W < 1 || R < 1)
        return hp_error(HP_ERR_INVALID_ARG, "hp_fsdp_plan_memory: a model and shard / replicate sizes >= 1 are required");
    const hp_fsdp_options_t o = opts ? *opts : hp_fsdp_default_options();
    int mu0, mu1;
    hp_model_unit_range(model, &mu0, &mu1);
    const int nu = hp_model_num_units(model);
    const int tied = hp_model_config(model)->tie_embeddings != 0 && mu0 == 0 && mu1 == nu;
    int raf = o.reshard_after_forward;
    if (raf >= 2 && raf >= W) raf = 1;
    const int k = raf >= 2 ? raf : 0;
    hp_param_t *mp = hp_model_params(model);
    int (*const ign)(const hp_param_t *) = o.ignored_params;
    /* the same groups, layouts and workspace rule as hp_fully_shard, on a handle with no storage */
    struct hp_fsdp f;
    memset(&f, 0, sizeof f);
    f.o = o;
    f.W = W;
    f.n_units = nu;
    f.u0 = mu0;
    f.u1 = mu1;
    f.n_groups = nu - tied;
    f.g = hp_calloc((size_t)f.n_groups, sizeof(group_t));
    f.ug = hp_calloc((size_t)nu, sizeof(int));
    if (!f.g || !f.ug) {
        free(f.g);
        free(f.ug);
        return HP_ERR_OOM;
    }
    const int root_u = nu - 1;
    static float own_mark;   /* a kept group's buffer, for the slot count only */
    size_t shards = 0, ws = 0, ign_floats = 0, max_S_pf = 0;
    for (int u = 0; u < nu; u++) f.ug[u] = u == root_u && tied ? 0 : u;
    for (int gi = 0; gi < f.n_groups; gi++) {
        group_t *g = &f.g[gi];
        const int units[2] = {gi, root_u}, n2 = tied && gi == 0 ? 2 : 1;
        g->u_lo = gi;
        g->u_hi = units[n2 - 1];
        g->n_fwd_pf = g->n_bwd_pf = -1;
        g->raf = raf == HP_FSDP_RESHARD_DEFAULT ? (g->u_hi == root_u ? 0 : 1) : raf;
        if (gi < mu0 || gi >= mu1) continue;   // a pipeline stage holds its units only
        size_t S = 0, S_pf = 0;
        for (int q = 0; q < n2; q++) {
            int first, cnt;
            size_t uoff, uspan;
            hp_model_unit_params(model, units[q], &first, &cnt);
            hp_model_unit_span(model, units[q], &uoff, &uspan);
            g->span = (g->span + 15) / 16 * 16 + uspan;
            for (int i = first; i < first + cnt; i++) {
                const hp_tensor_t *t = &mp[i].value.local;
                if (ign && ign(&mp[i])) {
                    ign_floats += (size_t)hp_tensor_numel(t);
                    continue;
                }
                const int64_t d0 = t->shape[0], rest = hp_tensor_numel(t) / (d0 > 0 ? d0 : 1);
                S += (size_t)((d0 + W - 1) / W * rest);
                if (k) S_pf += (size_t)((d0 + k - 1) / k * rest);
            }
        }
        g->S = S;
        shards += S;
        if (g->span > f.max_span) f.max_span = g->span;
        if (S > f.max_S) f.max_S = S;
        if (S_pf > max_S_pf) max_S_pf = S_pf;
        if (g->raf == 0) {
            g->own = &own_mark;
            ws += sizeof(float) * (g->span + 1);
        } else if (g->span > f.rot_span) {
            f.rot_span = g->span;
        }
        if (n2 == 2) ws += sizeof(float) * g->span;                    // the tied group's gradient
        if (k && g->raf >= 2) ws += sizeof(float) * S_pf;               // the post-forward copy
        if (R > 1) ws += sizeof(float) * S;                             // HSDP's partial sums
        if (no_sync) ws += sizeof(float) * g->span;                    // unsharded gradients kept between backwards
    }
    const int n_slots = slots_needed(&f);
    free(f.g);
    free(f.ug);
    const size_t pe = esize(o.mp.param_dtype), re = esize(o.mp.reduce_dtype);
    size_t ag_elems = (size_t)W * f.max_S;
    if (k && (size_t)k * max_S_pf > ag_elems) ag_elems = (size_t)k * max_S_pf;
    const size_t send_elems = f.max_S > max_S_pf ? f.max_S : max_S_pf;
    ws += (size_t)n_slots * sizeof(float) * (f.rot_span + 1);
    ws += pe * (ag_elems + 1) + (o.mp.param_dtype == HP_F32 ? 0 : pe * (send_elems + 1));   // one all-gather buffer
    ws += sizeof(float) * (f.max_span + 1) + re * ((size_t)W * f.max_S + 1) + (R > 1 ? 2 : 1) * re * (f.max_S + 1);
    if (rs_input_bytes) *rs_input_bytes = W > 1 ? re * (size_t)W * f.max_S : 0;
    if (param_bytes) *param_bytes = sizeof(float) * (shards + ign_floats);
    if (grad_bytes) *grad_bytes = sizeof(float) * (shards + ign_floats);
    if (workspace_bytes) *workspace_bytes = ws;
    return HP_OK;
}

hp_status_t hp_fully_shard(hp_model_t model, hp_mesh_t mesh, const hp_fsdp_options_t *opts, hp_fsdp_t *out) {
    if (!model || !mesh || !out)
        return hp_error(HP_ERR_INVALID_ARG, "fully_shard: model, mesh and out must be non-NULL");
    *out = NULL;
    hp_fsdp_options_t o = opts ? *opts : hp_fsdp_default_options();
    const int nd = hp_mesh_ndim(mesh);
    if (nd != 1 && nd != 2)
        return hp_error(HP_ERR_INVALID_ARG, "fully_shard expects a 1D or 2D DeviceMesh but got a %d-D mesh; "
                        "hint: slice the data-parallel dims (mesh[\"dp_replicate\", \"dp_shard\"])", nd);
    if (nd == 2 && (!hp_mesh_dim_name(mesh, 0) || !hp_mesh_dim_name(mesh, 1)))
        return hp_error(HP_ERR_INVALID_ARG, "fully_shard: Please init the 2D mesh for HSDP with "
                        "mesh_dim_names specified (dims are (replicate, shard))");
    if (!hp_mesh_contains_self(mesh))
        return hp_error(HP_ERR_INVALID_ARG, "fully_shard: this rank is not in the mesh");
    if (o.mp.param_dtype != HP_F32 && o.mp.param_dtype != HP_BF16)
        return hp_error(HP_ERR_UNSUPPORTED, "fully_shard: mp.param_dtype %s; expected f32 or bf16",
                        hp_dtype_name(o.mp.param_dtype));
    if (o.mp.reduce_dtype != HP_F32 && o.mp.reduce_dtype != HP_BF16)
        return hp_error(HP_ERR_UNSUPPORTED, "fully_shard: mp.reduce_dtype %s; expected f32 or bf16",
                        hp_dtype_name(o.mp.reduce_dtype));
    if (o.mp.output_dtype != HP_F32)
        return hp_error(HP_ERR_UNSUPPORTED, "fully_shard: mp.output_dtype %s: the model's outputs (logits, "
                        "loss) stay f32 in this build", hp_dtype_name(o.mp.output_dtype));
    // tied embeddings (qwen3: output uses tok_embeddings.weight): the embedding and the root
    // form one group, as fully_shard([tok_embeddings, norm, output]) in TorchTitan
    // A pipeline stage (units [u0, u1)) that holds only one of the two uses keeps its own copy
    // of the tied weight as an ordinary parameter (the pipeline sums the two copies' gradients).
    int mu0, mu1;
    hp_model_unit_range(model, &mu0, &mu1);
    const int tied = hp_model_config(model)->tie_embeddings != 0 && mu0 == 0 && mu1 == hp_model_num_units(model);
    const int sd = nd - 1;
    const int W = (int)hp_mesh_size(mesh, sd), R = nd == 2 ? (int)hp_mesh_size(mesh, 0) : 1;
    int raf = o.reshard_after_forward;
    if (raf < -1 || (raf >= 2 && (W % raf != 0 || raf == W)))
        return hp_error(HP_ERR_INVALID_ARG, "fully_shard: reshard_after_forward = %d; expected Default (-1), "
                        "0, 1, or a non-trivial divisor of the shard size %d", raf, W);
    if (raf >= 2 && raf >= W) raf = 1;
    if (o.gradient_divide_factor < 0)
        return hp_error(HP_ERR_INVALID_ARG, "fully_shard: gradient_divide_factor %g must be > 0 (or 0 = unset)",
                        o.gradient_divide_factor);
    hp_param_t *mp = hp_model_params(model);
    const int np = hp_model_num_params(model);
    int (*const ign)(const hp_param_t *) = o.ignored_params;
    for (int i = 0; i < np; i++)
        if (!ign || !ign(&mp[i])) HP_TRY(hp_fsdp_validate_param(&mp[i]));
    hp_mesh_t tpm = NULL;
    HP_TRY(tp_mesh_of(mp, np, mesh, ign, &tpm));
    HP_TRY(hp_dp_register(model, "fully_shard"));

    hp_status_t st = HP_OK;
    hp_fsdp_t f = hp_calloc(1, sizeof(*f));
    if (!f) { hp_dp_unregister(model); return HP_ERR_OOM; }
    f->model = model;
    f->mesh = mesh;
    f->tp_mesh = tpm;
    f->o = o;
    if (tpm) {
        st = hp_mesh_concat(mesh, tpm, &f->spmd_mesh);
        if (st != HP_OK) goto fail;
    }
    f->W = W;
    f->R = R;
    f->shard_comm = hp_mesh_get_comm(mesh, sd);
    f->rep_comm = nd == 2 ? hp_mesh_get_comm(mesh, 0) : NULL;
    f->rank = hp_comm_rank(f->shard_comm);
    f->k = raf >= 2 ? raf : 0;
    f->n_units = hp_model_num_units(model);
    f->u0 = mu0;
    f->u1 = mu1;
    f->n_groups = f->n_units - tied;
    f->n_params = np;
    f->mparams = mp;
    f->pdt = o.mp.param_dtype;
    f->rdt = o.mp.reduce_dtype;
    f->sync = 1;
    f->all_reduce = 1;
    f->red_last = -1;
    // the tables of the handle's lifetime in one arena, sized first
    const size_t table_bytes[6] = {(size_t)f->n_groups * sizeof(group_t), (size_t)np * sizeof(hp_param_t),
                                   (size_t)FSDP_MAX_EVENTS * FSDP_EVENT_LEN, (size_t)f->n_units * sizeof(int),
                                   (size_t)np * sizeof(int), (size_t)np * sizeof(int)};
    void *const tables[6] = {&f->g, &f->params, &f->events, &f->ug, &f->pg, &f->pj};
    st = hp_arena_init_tables(&f->tables, "FSDP tables", 6, table_bytes, tables);
    if (st != HP_OK) goto fail;
    if (f->k) {
        st = hp_comm_split(f->shard_comm, f->rank / f->k, f->rank, &f->pf_comm);
        if (st != HP_OK) goto fail;
    }

    // divide factors (PyTorch _get_gradient_divide_factors)
    {
        const int N = W * R;
        const double fac = o.gradient_divide_factor;
        f->pre_div = f->post_div = 1.0;
        f->rs_op = f->ar_op = HP_SUM;
        if (o.force_sum_reduction) {
            double ff = fac > 0 ? fac : (double)N;
            int64_t fi = (int64_t)ff, pre = 1;
            if ((double)fi == ff && fi >= 1) {
                while (fi % pre == 0 && fi / pre > pre) pre *= 2;
                f->pre_div = (double)pre;
                f->post_div = ff / (double)pre;
            } else {
                f->post_div = ff;
            }
        } else if (N == 1) {
            if (fac > 0) f->post_div = fac;
        } else if (fac > 0) {
            if (fac == (double)W) f->rs_op = HP_AVG;
            else if (fac != 1.0) {   // PREMUL_SUM(1/1) == SUM exactly
                st = hp_redop_create_premul_sum(1.0 / fac, f->shard_comm, &f->rs_op);
                if (st != HP_OK) goto fail;
                f->rs_premul = 1;
            }
            f->ar_op = HP_SUM;
        } else {
            f->rs_op = HP_AVG;
            f->ar_op = HP_AVG;
        }
    }

    // groups and layouts: group u = unit u; tied: group 0 = units 0 and root, the root's
    // parameters (norm) follow the embedding's in the group's flat shard and unsharded span
    const int root_u = f->n_units - 1;
    for (int u = 0; u < f->n_units; u++) f->ug[u] = u == root_u && tied ? 0 : u;
    for (int gi = 0; gi < f->n_groups; gi++) {
        group_t *g = &f->g[gi];
        int units[2] = {gi, root_u}, nu = tied && gi == 0 ? 2 : 1;
        g->u_lo = gi;
        g->u_hi = units[nu - 1];
        unit_name(model, gi, g->name, sizeof(g->name));
        if (nu == 2) snprintf(g->name, sizeof(g->name), "tok_embeddings+root");
        int first[2], cnt[2];
        size_t uoff[2], uspan[2], base[2];
        g->n = 0;
        g->span = 0;
        for (int k = 0; k < nu; k++) {
            hp_model_unit_params(model, units[k], &first[k], &cnt[k]);
            hp_model_unit_span(model, units[k], &uoff[k], &uspan[k]);
            base[k] = (g->span + 15) / 16 * 16;   // 16-float aligned, as the model's layout
            g->span = base[k] + uspan[k];
            for (int i = first[k]; i < first[k] + cnt[k]; i++) {
                if (ign && ign(&mp[i])) { f->pg[i] = -1; continue; }   // left to its owner
                g->n++;
            }
        }
        g->p = hp_calloc((size_t)g->n, sizeof(fparam_t));
        if (!g->p) { st = HP_ERR_OOM; goto fail; }
        if (nu == 2) {
            g->gown = hp_aligned_alloc(sizeof(float) * (g->span + 1));
            if (!g->gown) { st = HP_ERR_OOM; goto fail; }
            memset(g->gown, 0, sizeof(float) * (g->span + 1));
            f->ws_bytes += sizeof(float) * g->span;
        }
        g->slot = -1;
        g->n_fwd_pf = g->n_bwd_pf = -1;
        const int is_root = g->u_hi == root_u;
        g->raf = raf == HP_FSDP_RESHARD_DEFAULT ? (is_root ? 0 : 1) : raf;
        size_t S = 0, S_pf = 0;
        for (int j = 0, k = 0, jk = 0; j < g->n; j++, jk++) {
            while (jk == cnt[k] || f->pg[first[k] + jk] < 0) {   // next unit, or skip an ignored param
                if (jk == cnt[k]) { k++; jk = 0; } else jk++;
            }
            fparam_t *p = &g->p[j];
            p->index = first[k] + jk;
            const hp_param_t *q = &mp[p->index];
            f->pg[p->index] = gi;
            f->pj[p->index] = j;
            p->d0 = q->value.local.shape[0];
            p->rest = hp_tensor_numel(&q->value.local) / (p->d0 > 0 ? p->d0 : 1);
            p->unit_off = base[k] + (hp_model_param_offset(model, p->index) - uoff[k]);
            p->chunk = (p->d0 + W - 1) / W;
            int64_t row0;
            hp_shard_size_and_offset(p->d0, W, f->rank, &p->rows, &row0);
            p->shard_off = S;
            S += (size_t)(p->chunk * p->rest);
            if (f->k) {
                p->pf_chunk = (p->d0 + f->k - 1) / f->k;
                p->pf_off = S_pf;
                S_pf += (size_t)(p->pf_chunk * p->rest);
            }
        }
        g->S = S;
        g->S_pf = S_pf;
        /* frozen params after the trainable ones (same order otherwise: without frozen params
         * the offsets above stay), so their zero gradients are never reduced */
        size_t St = 0, Sf = 0;
        for (int j = 0; j < g->n; j++)
            if (!mp[g->p[j].index].frozen) St += (size_t)(g->p[j].chunk * g->p[j].rest);
        if (St < S)
        {
            size_t t = 0;
            for (int j = 0; j < g->n; j++) {
                fparam_t *p = &g->p[j];
                const size_t sz = (size_t)(p->chunk * p->rest);
                if (!mp[p->index].frozen) { p->shard_off = t; t += sz; }
                else { p->shard_off = St + Sf; Sf += sz; }
            }
        }
        g->S_t = St;
        g->shard = hp_aligned_alloc(sizeof(float) * (S ? S : 1));
        g->gshard = hp_aligned_alloc(sizeof(float) * (S ? S : 1));
        if (!g->shard || !g->gshard) { st = HP_ERR_OOM; goto fail; }
        memset(g->shard, 0, sizeof(float) * S);
        memset(g->gshard, 0, sizeof(float) * S);
        if (f->k && g->raf >= 2) {
            g->pf_shard = hp_aligned_alloc(sizeof(float) * (S_pf ? S_pf : 1));
            if (!g->pf_shard) { st = HP_ERR_OOM; goto fail; }
            f->ws_bytes += sizeof(float) * S_pf;
        }
        if (R > 1) {
            g->partial = hp_aligned_alloc(sizeof(float) * (S ? S : 1));
            if (!g->partial) { st = HP_ERR_OOM; goto fail; }
            memset(g->partial, 0, sizeof(float) * S);
            f->ws_bytes += sizeof(float) * S;
        }
        // copy this rank's rows from the model's weights; sharded DTensor descriptors
        for (int j = 0; j < g->n; j++) {
            fparam_t *p = &g->p[j];
            const hp_param_t *q = &mp[p->index];
            int64_t rows, row0;
            hp_shard_size_and_offset(p->d0, W, f->rank, &rows, &row0);
            if (q->value.local.data)   // an empty model's entries have none: the shards are drawn later
                memcpy(g->shard + p->shard_off, (const float *)q->value.local.data + row0 * p->rest,
                       sizeof(float) * (size_t)(rows * p->rest));
            hp_param_t *s = &f->params[p->index];
            snprintf(s->name, sizeof(s->name), "%s", q->name);
            s->frozen = q->frozen;
            hp_dtensor_t *dts[2] = {&s->value, &s->grad};
            float *data[2] = {g->shard + p->shard_off, g->gshard + p->shard_off};
            for (int k = 0; k < 2; k++) {
                hp_dtensor_t *d = dts[k];
                d->local = q->value.local;
                d->local.shape[0] = rows;
                d->local.data = data[k];
                sharded_layout(f, nd, &q->value, d);
                d->owned = NULL;
            }
        }
        if (g->span > f->max_span) f->max_span = g->span;
        if (S > f->max_S) f->max_S = S;
        if (S_pf > f->max_S_pf) f->max_S_pf = S_pf;
    }

    // workspace: the kept groups' own unsharded buffers, the rotating slots and all-gather
    // buffers (pools sized by the prefetch schedule), one unsharded gradient buffer (plus the
    // tied group's own), one reduce-scatter input and two outputs
    for (int u = 0; u < f->n_groups; u++) {
        group_t *g = &f->g[u];
        g->ag = -1;
        if (g->raf != 0) {
            if (g->span > f->rot_span) f->rot_span = g->span;
            continue;
        }
        g->own = hp_aligned_alloc(sizeof(float) * (g->span + 1));
        if (!g->own) { st = HP_ERR_OOM; goto fail; }
        memset(g->own, 0, sizeof(float) * (g->span + 1));
        f->ws_bytes += sizeof(float) * (g->span + 1);
    }
    st = alloc_pools(f);
    if (st != HP_OK) goto fail;
    f->gfull = hp_aligned_alloc(sizeof(float) * (f->max_span + 1));
    f->red_in = hp_aligned_alloc(esize(f->rdt) * ((size_t)W * f->max_S + 1));
    if (!f->gfull || !f->red_in) { st = HP_ERR_OOM; goto fail; }
    memset(f->gfull, 0, sizeof(float) * (f->max_span + 1));
    f->ws_bytes += sizeof(float) * (f->max_span + 1) + esize(f->rdt) * ((size_t)W * f->max_S + 1);
    // two reductions are in flight only under HSDP (a reduce-scatter and the previous group's
    // all-reduce, on its output); otherwise the previous reduce-scatter is finished before the
    // next starts and one output serves both
    for (int i = 0; i < (R > 1 ? 2 : 1); i++) {
        f->red[i].out = hp_aligned_alloc(esize(f->rdt) * (f->max_S + 1));
        if (!f->red[i].out) { st = HP_ERR_OOM; goto fail; }
        f->ws_bytes += esize(f->rdt) * (f->max_S + 1);
    }
    if (R == 1) f->red[1].out = f->red[0].out;

    // ignored params move to storage of our own, listed with their own layout
    for (int i = 0; i < np; i++)
        if (f->pg[i] < 0) f->ign_floats += (size_t)hp_tensor_numel(&mp[i].value.local);
    if (f->ign_floats) {
        f->ign_v = hp_aligned_alloc(sizeof(float) * f->ign_floats);
        f->ign_g = hp_aligned_alloc(sizeof(float) * f->ign_floats);
        if (!f->ign_v || !f->ign_g) { st = HP_ERR_OOM; goto fail; }
    }
    hp_param_t *ign_keep = f->ign_floats ? hp_calloc((size_t)np, sizeof(hp_param_t)) : NULL;
    if (f->ign_floats && !ign_keep) { st = HP_ERR_OOM; goto fail; }
    for (size_t i = 0, off = 0; i < (size_t)np; i++) {
        if (f->pg[i] >= 0) continue;
        const size_t n = (size_t)hp_tensor_numel(&mp[i].value.local);
        if (mp[i].value.local.data) {
            memcpy(f->ign_v + off, mp[i].value.local.data, sizeof(float) * n);
            memcpy(f->ign_g + off, mp[i].grad.local.data, sizeof(float) * n);
        } else {   // an empty model: drawn later, gradients zero
            memset(f->ign_v + off, 0, sizeof(float) * n);
            memset(f->ign_g + off, 0, sizeof(float) * n);
        }
        ign_keep[i] = mp[i];
        ign_keep[i].value.local.data = f->ign_v + off;
        ign_keep[i].grad.local.data = f->ign_g + off;
        f->params[i] = ign_keep[i];
        off += n;
    }
    // the entries now point at our storage (the shards' gathered buffers while a group is
    // unsharded, the ignored params' copies), so the model keeps none (model.h)
    for (int i = 0; i < np; i++) {
        mp[i].value.local.data = f->pg[i] < 0 ? ign_keep[i].value.local.data : NULL;
        mp[i].grad.local.data = f->pg[i] < 0 ? ign_keep[i].grad.local.data : NULL;
    }
    free(ign_keep);
    st = hp_model_release_storage(model);
    if (st != HP_OK) goto fail;
    {
        const hp_module_hook_fn h[HP_HOOK_KINDS] = {pre_forward, post_forward, pre_backward, post_backward};
        st = hp_dp_attach_hooks(model, f, h);
        if (st != HP_OK) goto fail;
    }
    *out = f;
    return HP_OK;
fail:
    hp_fsdp_destroy(f);
    return st;
}

void hp_fsdp_destroy(hp_fsdp_t f) {
    if (!f) return;
    for (int i = 0; i < 2; i++) {
        if (f->red[i].work) (void)hp_work_wait(&f->red[i].work);
        if (i == 0 || f->red[1].out != f->red[0].out) hp_free_aligned(f->red[i].out);
    }
    hp_free_aligned(f->red_in);
    if (f->g)
        for (int u = 0; u < f->n_groups; u++) {
            group_t *g = &f->g[u];
            if (g->ag_work) (void)hp_work_wait(&g->ag_work);
            hp_free_aligned(g->shard);
            hp_free_aligned(g->gshard);
            hp_free_aligned(g->pf_shard);
            hp_free_aligned(g->accum);
            hp_free_aligned(g->gown);
            hp_free_aligned(g->partial);
            hp_free_aligned(g->own);
            free(g->p);
            free(g->fwd_pf);
            free(g->bwd_pf);
        }
    free_pools(f);
    hp_free_aligned(f->gfull);
    hp_free_aligned(f->ign_v);
    hp_free_aligned(f->ign_g);
    if (f->rs_premul) (void)hp_redop_destroy(f->rs_op, f->shard_comm);
    if (f->pf_comm) (void)hp_comm_destroy(f->pf_comm);
    if (f->model) {
        hp_dp_detach_hooks(f->model, f);
        hp_dp_unregister(f->model);
    }
    hp_arena_free(&f->tables);
    hp_mesh_destroy(f->spmd_mesh);
    free(f);
}

/* ---- accessors ----------------------------------------------------------------------- */

hp_param_t *hp_fsdp_params(hp_fsdp_t f) { return f->params; }
int hp_fsdp_num_params(hp_fsdp_t f) { return f->n_params; }

hp_status_t hp_fsdp_zero_grad(hp_fsdp_t f) {
    for (int u = 0; u < f->n_groups; u++) {
        group_t *g = &f->g[u];
        if (g->accum_pending || g->partial_pending)
            return hp_error(HP_ERR_STATE, "fsdp zero_grad: unit '%s' holds gradients of backwards run with "
                            "%s that were never reduced; hint: run the last micro-batch with gradient sync "
                            "(and all-reduce) on before zeroing", g->name,
                            g->accum_pending ? "set_requires_gradient_sync(false)" : "set_requires_all_reduce(false)");
        memset(g->gshard, 0, sizeof(float) * g->S);
    }
    if (f->ign_floats) memset(f->ign_g, 0, sizeof(float) * f->ign_floats);
    return HP_OK;
}

void hp_fsdp_set_requires_gradient_sync(hp_fsdp_t f, int sync) { f->sync = sync != 0; }

hp_status_t hp_fsdp_set_requires_all_reduce(hp_fsdp_t f, int all_reduce) {
    if (f->R == 1)
        return hp_error(HP_ERR_INVALID_ARG, "fsdp set_requires_all_reduce(%d): the mesh is 1-D (no replicate "
                        "dim, nothing to all-reduce); hint: use set_requires_gradient_sync for accumulation",
                        all_reduce);
    f->all_reduce = all_reduce != 0;
    return HP_OK;
}

int hp_fsdp_grad_comms(hp_fsdp_t f, hp_comm_t *comms) {
    int n = 0;
    comms[n++] = f->shard_comm;
    if (f->R > 1) comms[n++] = f->rep_comm;
    if (f->tp_mesh) comms[n++] = hp_mesh_get_comm(f->tp_mesh, 0);
    return n;
}

static hp_status_t full_of(hp_fsdp_t f, int i, int grad, float *out) {
    if (i < 0 || i >= f->n_params)
        return hp_error(HP_ERR_INVALID_ARG, "fsdp full tensor: param index %d outside [0, %d)", i, f->n_params);
    if (f->pg[i] < 0) {   // ignored: the owner's local tensor
        const hp_dtensor_t *d = grad ? &f->params[i].grad : &f->params[i].value;
        memcpy(out, d->local.data, sizeof(float) * (size_t)hp_tensor_numel(&d->local));
        return HP_OK;
    }
    const group_t *g = &f->g[f->pg[i]];
    const fparam_t *p = &g->p[f->pj[i]];
    size_t pad = (size_t)(p->chunk * p->rest);
    float *buf = hp_malloc(sizeof(float) * (size_t)f->W * (pad ? pad : 1));
    if (!buf) return HP_ERR_OOM;
    const float *src = (grad ? g->gshard : g->shard) + p->shard_off;
    hp_status_t s = hp_all_gather(src, buf, pad, HP_F32, f->shard_comm, NULL);
    if (s == HP_OK) memcpy(out, buf, sizeof(float) * (size_t)(p->d0 * p->rest));   // (W*chunk, rest)[:d0]
    free(buf);
    return s;
}

hp_status_t hp_fsdp_full_value(hp_fsdp_t f, int i, float *out) { return full_of(f, i, 0, out); }
hp_status_t hp_fsdp_full_grad(hp_fsdp_t f, int i, float *out) { return full_of(f, i, 1, out); }

void hp_fsdp_memory(hp_fsdp_t f, size_t *param_bytes, size_t *grad_bytes, size_t *workspace_bytes) {
    size_t s = 0;
    for (int u = 0; u < f->n_groups; u++) s += sizeof(float) * f->g[u].S;
    s += sizeof(float) * f->ign_floats;   /* ignored params: held whole in our storage */
    if (param_bytes) *param_bytes = s;
    if (grad_bytes) *grad_bytes = s;
    if (workspace_bytes) *workspace_bytes = f->ws_bytes + f->pool_bytes;
}

/* ---- explicit control: unshard / reshard, prefetch lists ---------------------------------- */

static hp_status_t unit_group(hp_fsdp_t f, int unit, const char *fn, group_t **g) {
    if (!f || unit < f->u0 || unit >= f->u1)
        return hp_error(HP_ERR_INVALID_ARG, "%s: unit %d outside the model's units [%d, %d) (0 tok_embeddings, "
                        "1..L layers.0..L-1, L+1 the root)", fn, unit, f ? f->u0 : 0, f ? f->u1 : 0);
    *g = group_of(f, unit);
    return HP_OK;
}

hp_status_t hp_fsdp_unshard(hp_fsdp_t f, int unit, int async_op) {
    group_t *g = NULL;
    HP_TRY(unit_group(f, unit, "hp_fsdp_unshard", &g));
    HP_TRY(unshard(f, g));
    return async_op ? HP_OK : hp_fsdp_wait_unshard(f, unit);
}

hp_status_t hp_fsdp_wait_unshard(hp_fsdp_t f, int unit) {
    group_t *g = NULL;
    HP_TRY(unit_group(f, unit, "hp_fsdp_wait_unshard", &g));
    if (g->state != UNSHARDED && !g->ag_pending)
        return hp_error(HP_ERR_STATE, "hp_fsdp_wait_unshard: unit %d ('%s') has no all-gather in flight; hint: "
                        "hp_fsdp_unshard it first", unit, g->name);
    HP_TRY(wait_unshard(f, g));
    point_model(f, g, g->full, NULL);
    return HP_OK;
}

hp_status_t hp_fsdp_reshard(hp_fsdp_t f, int unit) {
    group_t *g = NULL;
    HP_TRY(unit_group(f, unit, "hp_fsdp_reshard", &g));
    if (g->gcur || g->pending_w)
        return hp_error(HP_ERR_STATE, "hp_fsdp_reshard: unit %d ('%s') is inside its backward (its gradients are not "
                        "reduced yet); hint: reshard between steps", unit, g->name);
    if (g->ag_pending) HP_TRY(wait_unshard(f, g));
    if (g->state == UNSHARDED) reshard(f, g, 0);
    g->state = SHARDED;   // a post-forward copy (reshard_after_forward = k) is dropped too
    return HP_OK;
}

int hp_fsdp_is_unsharded(hp_fsdp_t f, int unit) {
    return f && unit >= f->u0 && unit < f->u1 && group_of(f, unit)->state == UNSHARDED;
}

static hp_status_t set_prefetch(hp_fsdp_t f, int unit, const int *units, int n, int backward, const char *fn) {
    group_t *g = NULL;
    HP_TRY(unit_group(f, unit, fn, &g));
    if (n > HP_FSDP_MAX_PREFETCH || (n > 0 && !units))
        return hp_error(HP_ERR_INVALID_ARG, "%s: %d units to prefetch; expected at most %d (HP_FSDP_MAX_PREFETCH) and "
                        "a list", fn, n, HP_FSDP_MAX_PREFETCH);
    for (int i = 0; i < n; i++) {
        group_t *t = NULL;
        HP_TRY(unit_group(f, units[i], fn, &t));
    }
    for (int u = 0; u < f->n_groups; u++)
        if (f->g[u].state != SHARDED || f->g[u].ag_pending || f->g[u].gcur)
            return hp_error(HP_ERR_STATE, "%s: unit group '%s' is unsharded or gathering; hint: set the prefetch lists "
                            "before the first step or between steps (after hp_fsdp_reshard)", fn, f->g[u].name);
    int *l = n > 0 ? hp_malloc(sizeof(int) * (size_t)n) : NULL;
    if (n > 0 && !l) return HP_ERR_OOM;
    if (n > 0) memcpy(l, units, sizeof(int) * (size_t)n);
    int **dst = backward ? &g->bwd_pf : &g->fwd_pf;
    free(*dst);
    *dst = l;
    *(backward ? &g->n_bwd_pf : &g->n_fwd_pf) = n < 0 ? -1 : n;
    // the pools follow the schedule: as many slots and all-gather buffers as it holds at once
    return alloc_pools(f);
}

hp_status_t hp_fsdp_set_modules_to_forward_prefetch(hp_fsdp_t f, int unit, const int *units, int n) {
    return set_prefetch(f, unit, units, n, 0, "hp_fsdp_set_modules_to_forward_prefetch");
}

hp_status_t hp_fsdp_set_modules_to_backward_prefetch(hp_fsdp_t f, int unit, const int *units, int n) {
    return set_prefetch(f, unit, units, n, 1, "hp_fsdp_set_modules_to_backward_prefetch");
}

int hp_fsdp_num_slots(hp_fsdp_t f) { return f ? f->n_slots : 0; }

void hp_fsdp_record_events(hp_fsdp_t f, int on) { f->rec = on; }
int hp_fsdp_num_events(hp_fsdp_t f) { return f->n_events; }
const char *hp_fsdp_event(hp_fsdp_t f, int i) { return (i >= 0 && i < f->n_events) ? f->events[i] : NULL; }
void hp_fsdp_clear_events(hp_fsdp_t f) { f->n_events = 0; }
double hp_fsdp_comm_wait_seconds(hp_fsdp_t f) { return f->wait_s; }
void hp_fsdp_reset_timers(hp_fsdp_t f) { f->wait_s = 0.0; }
