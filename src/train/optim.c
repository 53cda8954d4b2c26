/* AdamW, SGD (momentum, dampening, nesterov) and Muon over hp_param_t local shards, and
 * gradient clipping by global norm. Update formulas and their order follow torch.optim
 * (single-tensor paths) so results match PyTorch to f32 rounding; state in one arena. A Muon
 * matrix sharded over a mesh is gathered within its shard group for Newton-Schulz (the
 * distributed Muon recipe, docs/optim.md); every product runs through the kernel table. */
#include "hyperparallel/optim.h"
#include "hyperparallel/backend.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/arena.h"
#include "hyperparallel/dtensor.h"
#include "hyperparallel/mesh.h"

typedef enum { UPD_ADAMW = 0, UPD_SGD, UPD_MUON, UPD_NONE /* frozen: no state, never changed */ } upd_t;

/* Where a Muon parameter's whole matrix is. */
typedef enum {
    MUON_HERE = 0,   /* the local value is the whole matrix (plain, or Replicate on every mesh dim) */
    MUON_GATHER,     /* sharded over some mesh dims: the update is gathered over them each step */
    MUON_ABSENT      /* a pipeline placeholder (another stage's parameter): nothing to do */
} muon_where_t;

typedef struct {
    upd_t upd;
    float *s0;          /* AdamW exp_avg | SGD/Muon momentum_buffer; (numel) */
    float *s1;          /* AdamW exp_avg_sq; (numel) */
    int sgd_started;    /* SGD: momentum buffer holds a value (first step copies the grad) */
    muon_where_t where; /* Muon */
    int64_t *ridx;      /* MUON_GATHER: global row of each local row; (local rows) */
    int64_t *cidx;      /* MUON_GATHER: global column of each local column; (local cols) */
} pstate_t;

struct hp_optim {
    hp_optim_config_t cfg;
    hp_param_t *params;
    int n;
    pstate_t *ps;
    hp_arena_t arena;
    int64_t step;
    /* Muon Newton-Schulz workspace over the whole matrix: X, Y (m, n) and A, B (m, m) with
     * m <= n; U the local update of a gathered matrix (local numel) */
    float *ns_x, *ns_y, *ns_a, *ns_b, *ns_u;
    hp_arena_t ws;      /* scratch of the gathers (full_tensor), rewound after each */
    int n_states;
    int64_t *offset;    /* (n + 1) element offsets of the parameters, concatenated */
    int n_hooks;        /* step pre-hooks */
    hp_optim_hook_fn hook_fn[HP_OPTIM_MAX_HOOKS];
    void *hook_user[HP_OPTIM_MAX_HOOKS];
};

hp_status_t hp_optim_register_step_pre_hook(hp_optim_t o, hp_optim_hook_fn fn, void *user) {
    if (!o || !fn) return hp_error(HP_ERR_INVALID_ARG, "hp_optim_register_step_pre_hook: NULL optimizer or hook");
    if (o->n_hooks >= HP_OPTIM_MAX_HOOKS)
        return hp_error(HP_ERR_INVALID_ARG, "hp_optim_register_step_pre_hook: already %d hooks (HP_OPTIM_MAX_HOOKS)",
                        o->n_hooks);
    o->hook_fn[o->n_hooks] = fn;
    o->hook_user[o->n_hooks++] = user;
    return HP_OK;
}

/* Calls fn(i, lo, hi, ctx) for the pieces [lo, hi) of parameter i that fall in [glo, ghi) of the
 * concatenation of all parameters (offset[] are the prefix sums of their sizes). */
typedef void (*segment_fn)(int i, int64_t lo, int64_t hi, void *ctx);
static void for_segments(const int64_t *offset, int n, int64_t glo, int64_t ghi, segment_fn fn, void *ctx) {
    int a = 0, b = n;   /* first param whose range ends after glo */
    while (a < b) {
        int mid = (a + b) / 2;
        if (offset[mid + 1] <= glo) a = mid + 1;
        else b = mid;
    }
    for (int i = a; i < n && offset[i] < ghi; i++) {
        int64_t lo = glo > offset[i] ? glo - offset[i] : 0;
        int64_t hi = (ghi < offset[i + 1] ? ghi : offset[i + 1]) - offset[i];
        if (hi > lo) fn(i, lo, hi, ctx);
    }
}

/* One parallel region over every element of every parameter: thread t takes an equal
 * contiguous slice of the concatenation (no per-parameter fork/join). */
static void parallel_segments(const int64_t *offset, int n, segment_fn fn, void *ctx) {
    int64_t total = offset[n];
#pragma omp parallel if (total > 65536)
    {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        for_segments(offset, n, total * t / nt, total * (t + 1) / nt, fn, ctx);
    }
}

hp_optim_config_t hp_optim_default(hp_optim_kind_t kind) {
    hp_optim_config_t c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.lr = 1e-3;
    c.weight_decay = kind == HP_OPTIM_ADAMW ? 0.01 : kind == HP_OPTIM_MUON ? 0.1 : 0.0;
    c.beta1 = 0.9;
    c.beta2 = 0.999;
    c.eps = 1e-8;
    c.muon_momentum = 0.95;
    c.muon_nesterov = 1;
    c.ns_steps = 5;
    c.ns_a = 3.4445;
    c.ns_b = -4.7750;
    c.ns_c = 2.0315;
    c.ns_eps = 1e-7;
    c.adjust_lr = HP_MUON_ADJUST_ORIGINAL;
    return c;
}

static const char *kind_names[HP_OPTIM_KIND_COUNT] = {"adamw", "sgd", "muon"};

const char *hp_optim_kind_name(hp_optim_kind_t kind) {
    return (kind >= 0 && kind < HP_OPTIM_KIND_COUNT) ? kind_names[kind] : "?";
}

hp_status_t hp_optim_kind_from_name(const char *name, hp_optim_kind_t *out) {
    for (int i = 0; i < HP_OPTIM_KIND_COUNT; i++)
        if (strcasecmp(name, kind_names[i]) == 0) {
            *out = (hp_optim_kind_t)i;
            return HP_OK;
        }
    return hp_error(HP_ERR_INVALID_ARG, "optimizer '%s' is unknown; expected adamw, sgd or muon", name);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0 && (a == b || s[a - b - 1] == '.');
}

int hp_optim_muon_applies(const hp_param_t *p) {
    if (p->value.local.ndim != 2) return 0;
    static const char *excluded[] = {"tok_embeddings.weight", "embed_tokens.weight",
                                     "output.weight", "lm_head.weight"};
    for (size_t i = 0; i < sizeof excluded / sizeof excluded[0]; i++)
        if (ends_with(p->name, excluded[i])) return 0;
    return 1;
}

static int shards_a_dim(const hp_dtensor_t *t) {
    for (int d = 0; t->mesh && d < t->mesh_ndim; d++)
        if ((t->placements[d].kind == HP_SHARD || t->placements[d].kind == HP_STRIDED_SHARD) &&
            hp_mesh_size(t->mesh, d) > 1)
            return 1;
    return 0;
}

/* Where Muon finds parameter p's whole matrix: over its shard group when a mesh dim (of size
 * > 1) shards it, decided by the placements alone so every rank of the group gathers, even one
 * whose piece happens to be the whole (uneven Shard of fewer rows than ranks); here when the
 * local value has every element of the global shape; a value that is neither (Replicate on
 * every dim, fewer local elements) is a pipeline placeholder for another stage's parameter. A
 * Partial value has no matrix to orthogonalise yet. */
static hp_status_t muon_where(const hp_param_t *p, muon_where_t *where) {
    const hp_dtensor_t *v = &p->value;
    for (int d = 0; v->mesh && d < v->mesh_ndim; d++)
        if (v->placements[d].kind == HP_PARTIAL)
            return hp_error(HP_ERR_UNSUPPORTED, "optimizer.name = muon: parameter '%s' is Partial on mesh dim %d; "
                            "Newton-Schulz needs the reduced matrix; hint: reduce the value before building the "
                            "optimizer", p->name, d);
    const int64_t whole = v->mesh ? v->global_shape[0] * v->global_shape[1] : hp_tensor_numel(&v->local);
    *where = shards_a_dim(v) ? MUON_GATHER : hp_tensor_numel(&v->local) == whole ? MUON_HERE : MUON_ABSENT;
    return HP_OK;
}

/* The global row (dim 0) and column (dim 1) indices of a gathered parameter's local piece, in
 * local order (hp_layout_dim_indices: Shard, _StridedShard and nesting). idx arrays hold the
 * global sizes. */
static hp_status_t muon_indices(const hp_param_t *p, int64_t *ridx, int64_t *cidx) {
    const hp_dtensor_t *v = &p->value;
    int64_t ms[HP_MESH_MAX_DIMS];
    int coord[HP_MESH_MAX_DIMS];
    for (int d = 0; d < v->mesh_ndim; d++) ms[d] = hp_mesh_size(v->mesh, d);
    if (!hp_mesh_get_coordinate(v->mesh, coord))
        return hp_error(HP_ERR_INVALID_ARG, "optimizer.name = muon: parameter '%s' lives on a mesh without this rank",
                        p->name);
    int64_t *idx[2] = {ridx, cidx};
    for (int a = 0; a < 2; a++) {
        int64_t n = hp_layout_dim_indices(v->global_shape[a], a, v->mesh_ndim, ms, coord, v->placements, idx[a]);
        if (n != v->local.shape[a])
            return hp_error(HP_ERR_INVALID_ARG, "optimizer.name = muon: parameter '%s' holds %lld entries of dim %d "
                            "but its placements give %lld on this rank", p->name, (long long)v->local.shape[a], a,
                            (long long)n);
    }
    return HP_OK;
}

static hp_status_t check_config(const hp_optim_config_t *c) {
    if (c->kind < 0 || c->kind >= HP_OPTIM_KIND_COUNT)
        return hp_error(HP_ERR_INVALID_ARG, "optimizer kind %d is not adamw/sgd/muon", (int)c->kind);
    if (!(c->lr >= 0) || !(c->weight_decay >= 0))
        return hp_error(HP_ERR_INVALID_ARG, "optimizer %s: lr (%g) and weight_decay (%g) must be >= 0",
                        hp_optim_kind_name(c->kind), c->lr, c->weight_decay);
    if (c->kind == HP_OPTIM_ADAMW || c->kind == HP_OPTIM_MUON) {
        if (!(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 >= 0 && c->beta2 < 1) || !(c->eps >= 0))
            return hp_error(HP_ERR_INVALID_ARG, "AdamW: betas (%g, %g) must be in [0, 1) and eps "
                            "(%g) >= 0", c->beta1, c->beta2, c->eps);
    }
    if (c->kind == HP_OPTIM_SGD) {
        if (!(c->momentum >= 0) || !(c->dampening >= 0))
            return hp_error(HP_ERR_INVALID_ARG, "SGD: momentum (%g) and dampening (%g) must be >= 0",
                            c->momentum, c->dampening);
        if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
            return hp_error(HP_ERR_INVALID_ARG, "SGD: nesterov momentum requires a momentum > 0 "
                            "and zero dampening (as PyTorch)");
    }
    if (c->kind == HP_OPTIM_MUON) {
        if (!(c->muon_momentum >= 0 && c->muon_momentum < 1) || c->ns_steps < 0 || c->ns_steps >= 100)
            return hp_error(HP_ERR_INVALID_ARG, "Muon (optimizer.name = muon): momentum %g (optimizer.momentum) must be "
                            "in [0, 1) and ns_steps %d in [0, 100)", c->muon_momentum, c->ns_steps);
        if (c->muon_adamw_lr < 0)
            return hp_error(HP_ERR_INVALID_ARG, "Muon (optimizer.name = muon): muon_adamw_lr %g must be >= 0",
                            c->muon_adamw_lr);
    }
    return HP_OK;
}

hp_status_t hp_optim_create(const hp_optim_config_t *cfg, hp_param_t *params, int n_params,
                            hp_optim_t *out) {
    *out = NULL;
    HP_TRY(check_config(cfg));
    if (n_params < 0 || (n_params > 0 && !params))
        return hp_error(HP_ERR_INVALID_ARG, "optimizer: %d parameters with params=%p", n_params,
                        (void *)params);
    hp_optim_t o = calloc(1, sizeof *o);
    if (!o) return hp_error(HP_ERR_OOM, "optimizer: no memory");
    o->cfg = *cfg;
    o->params = params;
    o->n = n_params;
    o->ps = calloc((size_t)n_params + 1, sizeof(pstate_t));
    o->offset = calloc((size_t)n_params + 1, sizeof(int64_t));
    if (!o->ps || !o->offset) {
        free(o->ps);
        free(o->offset);
        free(o);
        return hp_error(HP_ERR_OOM, "optimizer: no memory for %d parameter states", n_params);
    }
    /* Size table first, then one arena. */
    size_t bytes = 0, ws_bytes = 0;
    int64_t ns_mn = 0, ns_mm = 0, ns_un = 0;
    hp_status_t s = HP_OK;
    for (int i = 0; i < n_params && s == HP_OK; i++) {
        hp_param_t *p = &params[i];
        const hp_tensor_t *v = &p->value.local, *g = &p->grad.local;
        if (v->dtype != HP_F32 || g->dtype != HP_F32 || !hp_tensor_same_shape(v, g) ||
            !hp_tensor_is_contiguous(v) || !hp_tensor_is_contiguous(g)) {
            char b1[96], b2[96];
            s = hp_error(HP_ERR_INVALID_ARG, "optimizer: parameter '%s' value %s and grad %s must "
                         "be contiguous f32 of the same shape", p->name,
                         hp_tensor_shape_str(v, b1, sizeof b1), hp_tensor_shape_str(g, b2, sizeof b2));
            break;
        }
        size_t nb = hp_arena_round((size_t)hp_tensor_numel(v) * sizeof(float));
        o->offset[i + 1] = o->offset[i] + hp_tensor_numel(v);
        pstate_t *ps = &o->ps[i];
        switch (cfg->kind) {
        case HP_OPTIM_ADAMW: ps->upd = UPD_ADAMW; break;
        case HP_OPTIM_SGD: ps->upd = UPD_SGD; break;
        default: ps->upd = hp_optim_muon_applies(p) ? UPD_MUON : UPD_ADAMW; break;
        }
        if (p->frozen) ps->upd = UPD_NONE;   // torch.optim is built on the trainable parameters only
        if (ps->upd == UPD_MUON) {
            s = muon_where(p, &ps->where);
            if (s != HP_OK) break;
            if (ps->where != MUON_ABSENT) {   // the workspace holds the whole matrix
                const hp_dtensor_t *pv = &p->value;
                const int gather = ps->where == MUON_GATHER;
                int64_t r = gather ? pv->global_shape[0] : v->shape[0], c = gather ? pv->global_shape[1] : v->shape[1];
                int64_t m = r < c ? r : c, n = r < c ? c : r;
                if (m * n > ns_mn) ns_mn = m * n;
                if (m * m > ns_mm) ns_mm = m * m;
            }
            if (ps->where == MUON_GATHER) {
                hp_placement_t rep[HP_MESH_MAX_DIMS];
                for (int d = 0; d < HP_MESH_MAX_DIMS; d++) rep[d] = hp_replicate();
                size_t sb = 0;
                s = hp_dtensor_redistribute_scratch(&sb, &p->value, p->value.mesh_ndim, rep);
                if (s != HP_OK) break;
                if (sb > ws_bytes) ws_bytes = sb;
                if (hp_tensor_numel(v) > ns_un) ns_un = hp_tensor_numel(v);
                bytes += hp_arena_round(sizeof(int64_t) * (size_t)p->value.global_shape[0]) +
                         hp_arena_round(sizeof(int64_t) * (size_t)p->value.global_shape[1]);
            }
        }
        if (ps->upd == UPD_ADAMW) {
            bytes += 2 * nb;
            o->n_states += 2;
        } else if (ps->upd == UPD_MUON || (ps->upd == UPD_SGD && cfg->momentum != 0)) {
            bytes += nb;
            o->n_states += 1;
        }
    }
    if (s == HP_OK) {
        bytes += 2 * hp_arena_round((size_t)ns_mn * sizeof(float)) +
                 2 * hp_arena_round((size_t)ns_mm * sizeof(float)) + hp_arena_round((size_t)ns_un * sizeof(float));
        s = hp_arena_init(&o->arena, "optimizer state", bytes + 64);
    }
    if (s == HP_OK && ns_un > 0) s = hp_arena_init(&o->ws, "optimizer gather scratch", ws_bytes + 64);
    for (int i = 0; i < n_params && s == HP_OK; i++) {
        pstate_t *ps = &o->ps[i];
        size_t nb = (size_t)hp_tensor_numel(&params[i].value.local) * sizeof(float);
        if (ps->upd == UPD_ADAMW) {
            ps->s0 = hp_arena_alloc(&o->arena, nb);
            ps->s1 = hp_arena_alloc(&o->arena, nb);
        } else if (ps->upd == UPD_MUON || (ps->upd == UPD_SGD && cfg->momentum != 0)) {
            ps->s0 = hp_arena_alloc(&o->arena, nb);
        }
        if (ps->upd == UPD_MUON && ps->where == MUON_GATHER) {
            const int64_t *gs = params[i].value.global_shape;
            ps->ridx = hp_arena_alloc(&o->arena, sizeof(int64_t) * (size_t)gs[0]);
            ps->cidx = hp_arena_alloc(&o->arena, sizeof(int64_t) * (size_t)gs[1]);
            s = muon_indices(&params[i], ps->ridx, ps->cidx);
        }
    }
    if (s == HP_OK && ns_mn > 0) {
        o->ns_x = hp_arena_alloc(&o->arena, (size_t)ns_mn * sizeof(float));
        o->ns_y = hp_arena_alloc(&o->arena, (size_t)ns_mn * sizeof(float));
        o->ns_a = hp_arena_alloc(&o->arena, (size_t)ns_mm * sizeof(float));
        o->ns_b = hp_arena_alloc(&o->arena, (size_t)ns_mm * sizeof(float));
    }
    if (s == HP_OK && ns_un > 0) o->ns_u = hp_arena_alloc(&o->arena, (size_t)ns_un * sizeof(float));
    if (s != HP_OK) {
        hp_optim_free(o);
        return s;
    }
    *out = o;
    return HP_OK;
}

void hp_optim_free(hp_optim_t o) {
    if (!o) return;
    if (o->arena.base) hp_arena_free(&o->arena);
    if (o->ws.base) hp_arena_free(&o->ws);
    free(o->ps);
    free(o->offset);
    free(o);
}

int64_t hp_optim_get_step(hp_optim_t o) { return o->step; }
void hp_optim_set_step(hp_optim_t o, int64_t step) {
    o->step = step;
    /* a loaded SGD momentum buffer is a real buffer from the first step on */
    for (int i = 0; i < o->n; i++) o->ps[i].sgd_started = step > 0;
}
const hp_optim_config_t *hp_optim_config(hp_optim_t o) { return &o->cfg; }
size_t hp_optim_state_bytes(hp_optim_t o) { return o->arena.capacity + o->ws.capacity; }

int hp_optim_num_states(hp_optim_t o) { return o->n_states; }

void hp_optim_state_at(hp_optim_t o, int idx, int *param_index, const char **slot,
                       hp_tensor_t *state) {
    HP_ASSERT(idx >= 0 && idx < o->n_states);
    int k = 0;
    for (int i = 0; i < o->n; i++) {
        pstate_t *ps = &o->ps[i];
        int ns = ps->s1 ? 2 : ps->s0 ? 1 : 0;
        if (idx < k + ns) {
            int j = idx - k;
            *param_index = i;
            *slot = ps->upd == UPD_ADAMW ? (j == 0 ? "exp_avg" : "exp_avg_sq") : "momentum_buffer";
            const hp_tensor_t *v = &o->params[i].value.local;
            hp_status_t s = hp_tensor_init(state, HP_F32, v->ndim, v->shape, j == 0 ? ps->s0 : ps->s1);
            HP_ASSERT(s == HP_OK);
            return;
        }
        k += ns;
    }
    HP_ASSERT_MSG(0, "optimizer state index %d not found", idx);
}

/* ---- updates ------------------------------------------------------------------------------ */

/* The AdamW and SGD element updates are kernels of the backend table (backend.h). */
static void adamw_update(float *p, float *m, float *v, const float *g, int64_t n, double lr,
                         double b1, double b2, double eps, double wd, int64_t step) {
    const hp_backend_t *be = hp_backend_default();
    be->adamw_update(be->ctx, p, m, v, g, n, lr, b1, b2, eps, wd, step);
}

static void sgd_update(float *p, float *buf, const float *g, int64_t n, double lr, double wd,
                       double mom, double damp, int nesterov, int started) {
    const hp_backend_t *be = hp_backend_default();
    be->sgd_update(be->ctx, p, buf, g, n, lr, wd, mom, damp, nesterov, started);
}

/* Newton-Schulz quintic iteration on X (m, n), m <= n, in place:
 * X /= max(||X||_F, eps); repeat k: A = X X^T; B = b A + c A A; X = a X + B X.
 * The products are the kernel table's GEMM (the CPU backend: one BLAS sgemm each). */
static void newton_schulz(float *x, float *y, float *a, float *b, int m, int n, const hp_optim_config_t *c) {
    const hp_backend_t *be = hp_backend_default();
    double ss = 0;
    for (int64_t i = 0; i < (int64_t)m * n; i++) ss += (double)x[i] * x[i];
    double nrm = sqrt(ss);
    float inv = (float)(1.0 / (nrm > c->ns_eps ? nrm : c->ns_eps));
    for (int64_t i = 0; i < (int64_t)m * n; i++) x[i] *= inv;
    for (int k = 0; k < c->ns_steps; k++) {
        // A (m, m) = X X^T
        be->gemm(be->ctx, a, m, x, n, x, n, m, m, n, 0, 1, 1.0f, 0.0f);
        // B (m, m) = b A + c A A
        memcpy(b, a, sizeof(float) * (size_t)m * m);
        be->gemm(be->ctx, b, m, a, m, a, m, m, m, m, 0, 0, (float)c->ns_c, (float)c->ns_b);
        // Y (m, n) = a X + B X
        memcpy(y, x, sizeof(float) * (size_t)m * n);
        be->gemm(be->ctx, y, n, b, m, x, n, m, n, m, 0, 0, 1.0f, (float)c->ns_a);
        memcpy(x, y, sizeof(float) * (size_t)m * n);
    }
}

static double muon_adjust(const hp_optim_config_t *c, double lr, int64_t rows, int64_t cols) {
    double A = (double)rows, B = (double)cols;
    switch (c->adjust_lr) {
    case HP_MUON_ADJUST_ORIGINAL: return lr * sqrt(A / B > 1 ? A / B : 1);
    case HP_MUON_ADJUST_MATCH_RMS_ADAMW: return lr * 0.2 * sqrt(A > B ? A : B);
    case HP_MUON_ADJUST_SPECTRAL_UNCLAMPED: return lr * sqrt(A / B);
    default: return lr;
    }
}

/* buf = lerp(buf, g, w = 1-mu); u = nesterov ? lerp(g, buf, mu) : buf, over n local elements. */
static void muon_momentum(float *u, float *buf, const float *g, int64_t n, float mu, float w, int nesterov) {
    for (int64_t i = 0; i < n; i++) {
        buf[i] = buf[i] + w * (g[i] - buf[i]);
        u[i] = nesterov ? g[i] + mu * (buf[i] - g[i]) : buf[i];
    }
}

/* torch.optim.Muon: buf = lerp(buf, g, 1-mu); u = nesterov ? lerp(g, buf, mu) : buf;
 * O = NS(u) (transposed when rows > cols); p *= 1 - lr wd; p -= adjusted_lr O.
 * Sharded (MUON_GATHER): momentum on the local shard, the update u gathered whole over the
 * mesh dims that shard it (full_tensor), Newton-Schulz on the whole (rows, cols) matrix (every
 * rank of the group computes the same bits from the same input), and each rank keeps the
 * entries of its own shard; adjust_lr uses the global shape. The single-rank path runs the
 * same loops with the local matrix as the whole one. */
static hp_status_t muon_update(hp_optim_t o, hp_param_t *prm, pstate_t *ps, double lr) {
    if (ps->where == MUON_ABSENT) return HP_OK;
    const hp_optim_config_t *c = &o->cfg;
    const int gather = ps->where == MUON_GATHER;
    float *p = prm->value.local.data;
    const int64_t lrows = prm->value.local.shape[0], lcols = prm->value.local.shape[1];   // local (lrows, lcols)
    const int64_t rows = gather ? prm->value.global_shape[0] : lrows;   // the whole (rows, cols)
    const int64_t cols = gather ? prm->value.global_shape[1] : lcols;
    const int transpose = rows > cols;
    float *x = o->ns_x, *whole = transpose ? o->ns_y : x;   // (rows, cols), then x (m, n)
    float *u = gather ? o->ns_u : whole;                     // local (lrows, lcols)
    muon_momentum(u, ps->s0, prm->grad.local.data, lrows * lcols, (float)c->muon_momentum,
                  (float)(1.0 - c->muon_momentum), c->muon_nesterov);
    if (gather) {
        hp_dtensor_t ud = prm->value;
        ud.local.data = u;
        ud.owned = NULL;
        hp_dtensor_mem_t mem = {&o->ws, whole, sizeof(float) * (size_t)(rows * cols)};
        hp_tensor_t full;
        HP_TRY(hp_dtensor_full_tensor(&full, NULL, &mem, &ud));
    }
    if (transpose)   // x (cols, rows) = whole^T
        for (int64_t r = 0; r < rows; r++)
            for (int64_t k = 0; k < cols; k++) x[k * rows + r] = whole[r * cols + k];
    int m = (int)(transpose ? cols : rows), nn = (int)(transpose ? rows : cols);
    newton_schulz(x, o->ns_y, o->ns_a, o->ns_b, m, nn, c);
    const float decay = (float)(1.0 - lr * c->weight_decay);
    const float alr = (float)muon_adjust(c, lr, rows, cols);
    for (int64_t li = 0; li < lrows; li++) {
        const int64_t r = gather ? ps->ridx[li] : li;
        for (int64_t lc = 0; lc < lcols; lc++) {
            const int64_t k = gather ? ps->cidx[lc] : lc;
            float v = transpose ? x[k * rows + r] : x[r * cols + k];
            float *pi = &p[li * lcols + lc];
            *pi = *pi * decay - alr * v;
        }
    }
    return HP_OK;
}

typedef struct {
    hp_optim_t o;
    double lr, adam_lr;
} step_ctx_t;

static void step_segment(int i, int64_t lo, int64_t hi, void *vctx) {
    step_ctx_t *c = vctx;
    hp_optim_t o = c->o;
    const hp_optim_config_t *cfg = &o->cfg;
    hp_param_t *p = &o->params[i];
    pstate_t *ps = &o->ps[i];
    float *v = (float *)p->value.local.data + lo;
    const float *g = (const float *)p->grad.local.data + lo;
    switch (ps->upd) {
    case UPD_ADAMW:
        adamw_update(v, ps->s0 + lo, ps->s1 + lo, g, hi - lo, c->adam_lr, cfg->beta1, cfg->beta2, cfg->eps,
                     cfg->weight_decay, o->step);
        break;
    case UPD_SGD:
        sgd_update(v, ps->s0 ? ps->s0 + lo : NULL, g, hi - lo, c->lr, cfg->weight_decay, cfg->momentum,
                   cfg->dampening, cfg->nesterov, ps->sgd_started);
        break;
    case UPD_MUON:
        break;   /* whole-matrix update, done after the elementwise pass */
    case UPD_NONE:
        break;   /* frozen (requires_grad = False) */
    }
}

hp_status_t hp_optim_step(hp_optim_t o, double lr_factor) {
    if (!(lr_factor >= 0) || !isfinite(lr_factor))
        return hp_error(HP_ERR_INVALID_ARG, "optimizer step: lr factor %g must be finite and >= 0",
                        lr_factor);
    for (int h = 0; h < o->n_hooks; h++) HP_TRY(o->hook_fn[h](o->hook_user[h], o));
    const hp_optim_config_t *c = &o->cfg;
    o->step++;
    step_ctx_t ctx = {o, c->lr * lr_factor,
                      (c->kind == HP_OPTIM_MUON && c->muon_adamw_lr > 0 ? c->muon_adamw_lr : c->lr) * lr_factor};
    parallel_segments(o->offset, o->n, step_segment, &ctx);
    /* In parameter order on every rank, so the gathers of the ranks that share a shard group
     * meet in the same order (a pipeline placeholder issues none, on every rank alike). */
    for (int i = 0; i < o->n; i++) {
        if (o->ps[i].upd == UPD_MUON) HP_TRY(muon_update(o, &o->params[i], &o->ps[i], ctx.lr));
        if (o->ps[i].upd == UPD_SGD) o->ps[i].sgd_started = 1;
    }
    return HP_OK;
}

/* ---- ZeRO-1's local optimizer --------------------------------------------------------- */

static hp_status_t zero_create(void *ctx, hp_param_t *params, int n_params, void **out) {
    hp_optim_t o = NULL;
    hp_status_t s = hp_optim_create(ctx, params, n_params, &o);
    *out = o;
    return s;
}
static hp_status_t zero_step(void *opt, double lr_factor) { return hp_optim_step(opt, lr_factor); }
static size_t zero_state_bytes(void *opt) { return hp_optim_state_bytes(opt); }
static void zero_destroy(void *opt) { hp_optim_free(opt); }

hp_zero_local_optim_t hp_optim_zero_local(const hp_optim_config_t *cfg) {
    return (hp_zero_local_optim_t){zero_create, zero_step, zero_state_bytes, zero_destroy, (void *)cfg};
}
