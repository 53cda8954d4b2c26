/* The model container: units built by the family's architecture (model_builder.h; the
 * families are in src/models/) over one parameter table, the micro-batch contexts
 * (caller-owned, any number alive), and the range driver that runs forward, backward_input
 * and backward_weight over any contiguous unit range with external input and output
 * activations. The whole-model calls are the range [0, n) on the model's own context.
 * Memory: parameters and gradients in one buffer each; per context one arena (saved
 * activations) and one workspace, sized before allocation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "nn/nn-model.h"

#define ROUND16(x) (((x) + 15) & ~(size_t)15)   // keep every tensor 16-float aligned (64 bytes)

const hp_model_config_t *hp_model_config(hp_model_t m) { return &m->cfg; }
int hp_model_num_params(hp_model_t m) { return m->n_params; }
hp_param_t *hp_model_params(hp_model_t m) { return m->params; }
int hp_model_num_units(hp_model_t m) { return m->n_units_total; }
int hp_model_max_tokens(hp_model_t m) { return m->max_batch * m->max_seq_len; }

void hp_model_unit_range(hp_model_t m, int *u0, int *u1) {
    if (u0) *u0 = m->u0;
    if (u1) *u1 = m->u1;
}

hp_param_t *hp_model_find_param(hp_model_t m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
    return NULL;
}

/* Appends a module to the model's list (set-up time); its index is its id. */
static hp_status_t mods_push(hp_model_t m, hp_module_t *mod) {
    if (m->n_mods == m->cap_mods) {
        int cap = m->cap_mods ? 2 * m->cap_mods : 64;
        hp_module_t **nm = realloc(m->mods, sizeof(*nm) * (size_t)cap);
        if (!nm) return HP_ERR_OOM;
        m->mods = nm;
        m->cap_mods = cap;
    }
    m->mods[m->n_mods++] = mod;
    return HP_OK;
}

hp_module_t *hp_model_module_new(hp_model_t m, size_t impl_bytes) {
    // module and impl in one block (set-up time only)
    const size_t head = hp_arena_round(sizeof(hp_module_t));
    char *blk = hp_calloc(1, head + (impl_bytes ? impl_bytes : 1));
    if (!blk) return NULL;
    hp_module_t *mod = (hp_module_t *)blk;
    mod->impl = blk + head;
    mod->id = -1;
    mod->unit = -1;
    if (mods_push(m, mod) != HP_OK) {
        free(blk);
        return NULL;
    }
    return mod;
}

void hp_model_rope_tables(hp_model_t m, const float **cos_t, const float **sin_t) {
    *cos_t = m->cos_t;
    *sin_t = m->sin_t;
}

/* Marks the modules of the tree under `mod` (by id; a module from outside the model has none
 * and is not listed, its children are). */
static void mark_tree(hp_model_t m, const hp_module_t *mod, unsigned char *seen) {
    if (mod->id >= 0 && mod->id < m->n_mods && m->mods[mod->id] == mod) {
        if (seen[mod->id]) return;
        seen[mod->id] = 1;
    }
    for (int i = 0; i < mod->n_children; i++) mark_tree(m, mod->children[i], seen);
}

int hp_model_modules(hp_model_t m, hp_module_t **out, int cap) {
    unsigned char *seen = hp_calloc((size_t)m->n_mods + 1, 1);
    HP_ASSERT_MSG(seen != NULL, "hp_model_modules: out of memory");
    for (int u = m->u0; u < m->u1; u++) mark_tree(m, m->units[u].module, seen);
    int n = 0;
    for (int i = 0; i < m->n_mods; i++) {
        if (!seen[i]) continue;
        if (out && n < cap) out[n] = m->mods[i];
        n++;
    }
    free(seen);
    return n;
}

hp_module_t *hp_model_unit_module(hp_model_t m, int unit) {
    if (unit < m->u0 || unit >= m->u1) return NULL;
    return m->units[unit].module;
}

void hp_model_unit_params(hp_model_t m, int unit, int *first, int *count) {
    HP_ASSERT_MSG(unit >= 0 && unit < m->n_units_total, "hp_model_unit_params: unit %d outside [0, %d)", unit,
                  m->n_units_total);
    if (first) *first = m->units[unit].first;
    if (count) *count = m->units[unit].count;
}

size_t hp_model_param_offset(hp_model_t m, int i) {
    HP_ASSERT(i >= 0 && i < m->n_params);
    return m->param_off[i];
}

int hp_model_max_seq_len(hp_model_t m) { return m->max_seq_len; }

void hp_model_unit_span(hp_model_t m, int unit, size_t *offset, size_t *floats) {
    int f, n;
    hp_model_unit_params(m, unit, &f, &n);
    if (n == 0) {
        if (offset) *offset = 0;
        if (floats) *floats = 0;
        return;
    }
    size_t end = f + n < m->n_params ? m->param_off[f + n] : m->param_floats;
    if (offset) *offset = m->param_off[f];
    if (floats) *floats = end - m->param_off[f];
}

/* ---- creation ----------------------------------------------------------------------------- */

static void param_desc(hp_param_t *p, const hp_param_decl_t *d, float *value, float *grad) {
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s", d->name);
    p->frozen = d->frozen;
    hp_tensor_init(&p->value.local, HP_F32, d->ndim, d->shape, value);
    hp_tensor_init(&p->grad.local, HP_F32, d->ndim, d->shape, grad);
    for (int i = 0; i < d->ndim; i++) p->value.global_shape[i] = p->grad.global_shape[i] = d->shape[i];
}

void hp_model_destroy(hp_model_t m) {
    if (!m) return;
    hp_model_ctx_destroy(m->dflt);
    hp_free_aligned(m->param_data);
    hp_free_aligned(m->grad_data);
    hp_arena_free(&m->tables);
    for (int i = 0; i < m->n_owned; i++) free(m->mods[i]);
    free(m->mods);
    free(m);
}

/* The family's builder comes with the config (the registry, models.h, sets it). */
static hp_status_t check_arch(const hp_model_config_t *c) {
    if (c->arch) return HP_OK;
    return hp_error(HP_ERR_INVALID_ARG, "model config '%s/%s' has no architecture (hp_model_config_t.arch is NULL); "
                    "expected a config resolved by the model registry; hint: start from hp_model_flavor(name, flavor, "
                    "&cfg) or hp_hf_read_config (models.h) and change its fields", c->name, c->flavor);
}

static hp_status_t create_range(const hp_model_config_t *cfg_in, int u0, int u1, int max_batch, int max_seq_len,
                                int empty, hp_model_t *out);

static hp_status_t create_whole(const hp_model_config_t *cfg, int max_batch, int max_seq_len, int empty,
                                hp_model_t *out) {
    if (!cfg || !out) return hp_error(HP_ERR_INVALID_ARG, "hp_model_create: cfg and out must be non-NULL");
    hp_model_config_t c = *cfg;
    HP_TRY(hp_model_config_validate(&c));
    HP_TRY(check_arch(&c));
    return create_range(&c, 0, c.arch->n_units(&c), max_batch, max_seq_len, empty, out);
}

hp_status_t hp_model_create(const hp_model_config_t *cfg, int max_batch, int max_seq_len, hp_model_t *out) {
    return create_whole(cfg, max_batch, max_seq_len, 0, out);
}

hp_status_t hp_model_create_empty(const hp_model_config_t *cfg, int max_batch, int max_seq_len, hp_model_t *out) {
    return create_whole(cfg, max_batch, max_seq_len, 1, out);
}

hp_status_t hp_model_create_range(const hp_model_config_t *cfg, int u0, int u1, int max_batch, int max_seq_len,
                                  hp_model_t *out) {
    return create_range(cfg, u0, u1, max_batch, max_seq_len, 0, out);
}

hp_status_t hp_model_create_range_empty(const hp_model_config_t *cfg, int u0, int u1, int max_batch, int max_seq_len,
                                        hp_model_t *out) {
    return create_range(cfg, u0, u1, max_batch, max_seq_len, 1, out);
}

int hp_model_describe_params(const hp_model_config_t *cfg_in, int u0, int u1, hp_model_param_desc_t *out, int cap) {
    hp_model_config_t cfg = *cfg_in;
    if (hp_model_config_validate(&cfg) != HP_OK || check_arch(&cfg) != HP_OK) return -1;
    const hp_model_arch_t *arch = cfg.arch;
    const int nu = arch->n_units(&cfg);
    if (u0 < 0 || u1 > nu || u0 >= u1) {
        hp_error(HP_ERR_INVALID_ARG, "hp_model_describe_params: units [%d, %d) outside [0, %d)", u0, u1, nu);
        return -1;
    }
    int n = 0;
    hp_param_decl_t tmp[HP_MODEL_MAX_UNIT_PARAMS];
    for (int u = u0; u < u1; u++) {
        int k = arch->declare(&cfg, u, u0 == 0, tmp);
        for (int i = 0; i < k; i++, n++) {
            if (n >= cap) continue;
            memcpy(out[n].name, tmp[i].name, sizeof out[n].name);   // both HP_PARAM_NAME_MAX, NUL-terminated
            out[n].name[sizeof out[n].name - 1] = '\0';
            out[n].ndim = tmp[i].ndim;
            out[n].frozen = tmp[i].frozen;
            memcpy(out[n].shape, tmp[i].shape, sizeof out[n].shape);
        }
    }
    return n;
}

/* The storage layout over the entries' current local sizes (the creation rule: units
 * contiguous in table order, a group's members adjacent in declared order so a fused GEMM reads
 * them as one stacked matrix, 16-float alignment after each group or lone parameter). At
 * creation the entries are the declarations; an empty model re-lays them out after a
 * parallelism shrank their local shapes. */
static void layout_units(hp_model_t m) {
    size_t off = 0;
    for (int u = m->u0; u < m->u1; u++) {
        const nn_unit_t *U = &m->units[u];
        unsigned char placed[HP_MODEL_MAX_UNIT_PARAMS] = {0};
        for (int i = 0; i < U->count; i++) {
            if (placed[i]) continue;
            const hp_param_decl_t *d = &m->decl[U->first + i];
            for (int j = i; j < U->count; j++) {
                const hp_param_decl_t *e = &m->decl[U->first + j];
                if (j != i && (d->group == 0 || e->group != d->group)) continue;
                m->param_off[U->first + j] = off;
                off += (size_t)hp_tensor_numel(&m->params[U->first + j].value.local);
                placed[j] = 1;
            }
            off = ROUND16(off);
        }
    }
    m->param_floats = off;
}

static hp_status_t create_range(const hp_model_config_t *cfg_in, int u0, int u1, int max_batch, int max_seq_len,
                                int empty, hp_model_t *out) {
    if (!cfg_in || !out) return hp_error(HP_ERR_INVALID_ARG, "hp_model_create_range: cfg and out must be non-NULL");
    *out = NULL;
    hp_model_config_t cfg = *cfg_in;
    HP_TRY(hp_model_config_validate(&cfg));
    HP_TRY(check_arch(&cfg));
    const hp_model_arch_t *arch = cfg.arch;
    const int nu = arch->n_units(&cfg);
    if (u0 < 0 || u1 > nu || u0 >= u1)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_create_range: units [%d, %d) of model '%s/%s', expected "
                        "0 <= u0 < u1 <= %d (embedding, %d blocks, head)", u0, u1, cfg.name, cfg.flavor, nu,
                        cfg.n_layers);
    if (max_batch <= 0 || max_seq_len <= 0)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_create: max_batch %d and max_seq_len %d must be > 0",
                        max_batch, max_seq_len);
    if (max_seq_len > cfg.max_seq_len)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_create: max_seq_len %d exceeds the model's "
                        "max_seq_len %d (%s/%s)", max_seq_len, cfg.max_seq_len, cfg.name, cfg.flavor);
    hp_model_t m = hp_calloc(1, sizeof(*m));
    if (!m) return HP_ERR_OOM;
    *m = (struct hp_model){.cfg = cfg, .arch = arch, .max_batch = max_batch, .max_seq_len = max_seq_len,
                           .n_units_total = nu, .u0 = u0, .u1 = u1, .be = hp_backend_default()};
    const hp_model_config_t *c = &m->cfg;
    hp_status_t st = HP_OK;
    const int hd = c->head_dim;

    // 1. the parameter table, declared unit by unit (sizes first)
    int np = 0;
    hp_param_decl_t tmp[HP_MODEL_MAX_UNIT_PARAMS];
    for (int u = u0; u < u1; u++) np += arch->declare(c, u, u0 == 0, tmp);
    // the tables of the model's lifetime in one arena, sized first: units, parameter entries,
    // declarations, offsets and the RoPE cos / sin tables
    const size_t npt = (size_t)(np ? np : 1);
    const int rd = c->mla ? c->qk_rope_head_dim : hd;   // the rotated channels per head
    const size_t rope_bytes = sizeof(float) * (size_t)max_seq_len * (rd / 2);
    const size_t table_bytes[6] = {(size_t)nu * sizeof(nn_unit_t), npt * sizeof(hp_param_t),
                                   npt * sizeof(hp_param_decl_t), npt * sizeof(size_t), rope_bytes, rope_bytes};
    void *const tables[6] = {&m->units, &m->params, &m->decl, &m->param_off, &m->cos_t, &m->sin_t};
    st = hp_arena_init_tables(&m->tables, "model tables", 6, table_bytes, tables);
    if (st != HP_OK) goto fail;
    // 2. the entries (the declarations' shapes, no storage yet), then the storage layout:
    // units contiguous, a group's members adjacent (one stacked GEMM)
    int pi = 0;
    for (int u = u0; u < u1; u++) {
        nn_unit_t *U = &m->units[u];
        U->kind = arch->unit_kind(c, u);
        U->first = pi;
        U->count = arch->declare(c, u, u0 == 0, m->decl + pi);
        HP_ASSERT(U->count <= HP_MODEL_MAX_UNIT_PARAMS);
        pi += U->count;
    }
    m->n_params = np;
    for (int i = 0; i < np; i++) param_desc(&m->params[i], &m->decl[i], NULL, NULL);
    layout_units(m);
    m->empty = 1;
    if (!empty) {   // the whole range's storage now (an empty model allocates its local shards later)
        st = hp_model_materialize(m);
        if (st != HP_OK) goto fail;
    }

    // 3. RoPE tables (positions [0, max_seq_len))
    hp_rope_scaling_t sc = {c->rope_scaling, c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                            c->rope_original_max_pos, hp_model_mla_yarn(c), c->rope_beta_fast, c->rope_beta_slow};
    hp_rope_table(m->cos_t, m->sin_t, max_seq_len, rd, c->rope_theta, &sc);

    // 4. the module trees, unit by unit; blocks get their checkpoint wrapper up front
    for (int u = u0; u < u1; u++) {
        nn_unit_t *U = &m->units[u];
        hp_param_t *P[HP_MODEL_MAX_UNIT_PARAMS];
        for (int i = 0; i < U->count; i++) P[i] = &m->params[U->first + i];
        st = arch->build(m, u, P, U->count, &U->inner);
        if (st == HP_OK && U->kind == HP_MODEL_UNIT_BLOCK) st = nn_checkpoint_new(m, U->inner, &U->ac);
        if (st != HP_OK) goto fail;
        U->module = U->inner;
        U->inner->unit = u;
    }
    for (int i = 0; i < m->n_mods; i++) m->mods[i]->id = i;
    m->n_owned = m->n_mods;

    // 5. the model's own context for (max_batch, max_seq_len); an empty model's at its first use
    // (its modules change with the parallelisms before that)
    m->ctx_batch = max_batch;
    m->ctx_seq_len = max_seq_len;
    if (!empty) st = hp_model_ctx_create(m, max_batch, max_seq_len, 0, &m->dflt);
    if (st != HP_OK) goto fail;
    *out = m;
    return HP_OK;
fail:
    hp_model_destroy(m);
    return st;
}

/* Whether p's value lives in the storage the model owns. */
static int in_storage(hp_model_t m, const hp_param_t *p) {
    const float *v = p->value.local.data;
    return m->param_data && v >= m->param_data && v < m->param_data + m->store_floats;
}

int hp_model_is_empty(hp_model_t m) { return m->empty; }
size_t hp_model_storage_floats(hp_model_t m) { return m->param_floats; }

hp_status_t hp_model_materialize(hp_model_t m) {
    if (!m) return hp_error(HP_ERR_INVALID_ARG, "hp_model_materialize: model is NULL");
    if (!m->empty) return HP_OK;
    layout_units(m);   // the local sizes the parallelisms left
    const size_t n = m->param_floats;
    float *v = hp_aligned_alloc(sizeof(float) * (n ? n : 16)), *g = hp_aligned_alloc(sizeof(float) * (n ? n : 16));
    if (!v || !g) {
        hp_free_aligned(v);
        hp_free_aligned(g);
        return hp_error(HP_ERR_OOM, "hp_model_materialize: %s/%s needs %.2f GiB on this rank for its parameters and "
                        "as much for their gradients; hint: shard it (parallelism.data_parallel_shard_degree, "
                        "tensor_parallel_degree; docs/memory.md)", m->cfg.name, m->cfg.flavor,
                        (double)n * 4 / (1 << 30));
    }
    memset(v, 0, sizeof(float) * n);
    memset(g, 0, sizeof(float) * n);
    for (int i = 0; i < m->n_params; i++) {
        hp_param_t *p = &m->params[i];
        p->value.local.data = v + m->param_off[i];
        p->grad.local.data = g + m->param_off[i];
    }
    m->param_data = v;
    m->grad_data = g;
    m->store_floats = n;
    m->empty = 0;
    return HP_OK;
}

hp_status_t hp_model_release_storage(hp_model_t m) {
    if (!m) return hp_error(HP_ERR_INVALID_ARG, "hp_model_release_storage: model is NULL");
    for (int i = 0; i < m->n_params; i++)
        if (in_storage(m, &m->params[i]))
            return hp_error(HP_ERR_STATE, "hp_model_release_storage: parameter '%s' still points into the model's "
                            "storage; hint: re-point every entry at the new owner's storage first", m->params[i].name);
    m->empty = 0;
    return hp_model_compact_storage(m);
}

/* One parameter drawn (TorchTitan's init rule of its declaration) into `p`, a table entry of
 * the same parameter in any layout: each local element gets the value the whole tensor has at
 * its global index (the DTensor layout maps local to global indices, _StridedShard included). */
static hp_status_t init_param(const hp_param_decl_t *d, hp_param_t *p, uint64_t seed) {
    hp_tensor_t *t = &p->value.local;
    const int64_t n = hp_tensor_numel(t);
    if (n == 0) return HP_OK;   // an empty piece (a trailing FSDP rank of a short dim)
    if (!t->data)
        return hp_error(HP_ERR_STATE, "hp_model_init_weights: parameter '%s' has no storage on this rank; hint: "
                        "hp_model_materialize it (or initialise the table of its owner: FSDP's hp_fsdp_params)",
                        p->name);
    if (d->init == HP_PARAM_INIT_ONES) return hp_tensor_fill(t, 1.0);
    if (d->init == HP_PARAM_INIT_ZEROS) return hp_tensor_fill(t, 0.0);
    const hp_rng_key_t key = hp_rng_key(seed, p->name);
    if (!p->value.mesh) return hp_rng_fill(t, key, &d->rng, NULL, NULL);
    hp_dtensor_mem_t mem = {NULL, t->data, sizeof(float) * (size_t)n};
    hp_dtensor_t drawn;
    HP_TRY(hp_dtensor_rand(&drawn, &mem, HP_F32, t->ndim, p->value.global_shape, p->value.mesh, p->value.mesh_ndim,
                           p->value.placements, key, &d->rng));
    int same = drawn.local.ndim == t->ndim && drawn.local.data == t->data;
    for (int a = 0; same && a < t->ndim; a++) same = drawn.local.shape[a] == t->shape[a];
    int64_t expect = 1;
    for (int a = t->ndim - 1; same && a >= 0; a--) {   // the drawn piece is contiguous: so must t be
        same = t->shape[a] <= 1 || t->stride[a] == expect;
        expect *= t->shape[a];
    }
    if (!same)
        return hp_error(HP_ERR_STATE, "hp_model_init_weights: parameter '%s': its local tensor does not match the "
                        "piece its DTensor layout gives this rank (or is not contiguous)", p->name);
    return HP_OK;
}

hp_status_t hp_model_init_params(hp_model_t m, hp_param_t *params, uint64_t seed) {
    if (!m || !params) return hp_error(HP_ERR_INVALID_ARG, "hp_model_init_params: model and params are required");
    for (int i = 0; i < m->n_params; i++) {
        if (strcmp(params[i].name, m->params[i].name) != 0)
            return hp_error(HP_ERR_INVALID_ARG, "hp_model_init_params: entry %d is '%s', the model's is '%s'; expected "
                            "a table in the model's parameter order (hp_fsdp_params keeps it)", i, params[i].name,
                            m->params[i].name);
        HP_TRY(init_param(&m->decl[i], &params[i], seed));
    }
    return HP_OK;
}

hp_status_t hp_model_init_weights(hp_model_t m, uint64_t seed) {
    if (m->empty)
        return hp_error(HP_ERR_STATE, "hp_model_init_weights: the model was created empty and has no storage yet; "
                        "hint: hp_model_materialize it first, or let the composition draw it (hp_parallel_init_weights)");
    for (int i = 0; i < m->n_params; i++)
        if (!in_storage(m, &m->params[i]) && hp_tensor_numel(&m->params[i].value.local) > 0)
            return hp_error(HP_ERR_STATE, "hp_model_init_weights: parameter '%s' does not live in the model's storage "
                            "(an external owner such as FSDP holds it); hint: initialise the owner's table "
                            "(hp_model_init_params with hp_fsdp_params, as hp_parallel_init_weights does)",
                            m->params[i].name);
    return hp_model_init_params(m, m->params, seed);
}

hp_status_t hp_model_zero_grad(hp_model_t m) {
    if (m->grad_data) memset(m->grad_data, 0, sizeof(float) * m->store_floats);   // other owners zero theirs
    return HP_OK;
}

hp_status_t hp_model_compact_storage(hp_model_t m) {
    if (!m) return hp_error(HP_ERR_INVALID_ARG, "hp_model_compact_storage: model is NULL");
    if (m->empty) {   // nothing to move: the layout follows the entries' new local sizes
        layout_units(m);
        return HP_OK;
    }
    const int np = m->n_params;
    int *order = hp_calloc((size_t)(np ? np : 1), sizeof(int));
    size_t *off = hp_calloc((size_t)(np ? np : 1), sizeof(size_t));
    if (!order || !off) { free(order); free(off); return HP_ERR_OOM; }
    hp_param_t *P = m->params;
    // the entries in the model's storage, each storage once (a tied entry shares), by address
    int n = 0;
    for (int i = 0; i < np; i++) {
        if (!in_storage(m, &P[i])) continue;
        int dup = 0;
        for (int j = 0; j < n; j++) dup |= P[order[j]].value.local.data == P[i].value.local.data;
        if (dup) continue;
        int k = n++;
        while (k > 0 && (const float *)P[order[k - 1]].value.local.data > (const float *)P[i].value.local.data) {
            order[k] = order[k - 1];
            k--;
        }
        order[k] = i;
    }
    // new offsets: an entry that ended where the next begins (stacked GEMM members) stays
    // adjacent, the others start 16-float aligned (the creation layout's rule)
    size_t cur = 0;
    const float *prev_end = NULL;
    for (int k = 0; k < n; k++) {
        const hp_param_t *p = &P[order[k]];
        const float *d = p->value.local.data;
        off[order[k]] = d == prev_end ? cur : ROUND16(cur);
        cur = off[order[k]] + (size_t)hp_tensor_numel(&p->value.local);
        prev_end = d + hp_tensor_numel(&p->value.local);
    }
    const size_t total = ROUND16(cur);
    float *nv = NULL, *ng = NULL;
    if (n > 0) {
        nv = hp_aligned_alloc(sizeof(float) * (total ? total : 16));
        ng = hp_aligned_alloc(sizeof(float) * (total ? total : 16));
        if (!nv || !ng) {
            hp_free_aligned(nv);
            hp_free_aligned(ng);
            free(order);
            free(off);
            return hp_error(HP_ERR_OOM, "hp_model_compact_storage: %zu bytes for the local parameters and gradients",
                            2 * sizeof(float) * total);
        }
        memset(nv, 0, sizeof(float) * total);
        memset(ng, 0, sizeof(float) * total);
        for (int k = 0; k < n; k++) {
            const hp_param_t *p = &P[order[k]];
            const size_t cnt = (size_t)hp_tensor_numel(&p->value.local);
            memcpy(nv + off[order[k]], p->value.local.data, sizeof(float) * cnt);
            memcpy(ng + off[order[k]], p->grad.local.data, sizeof(float) * cnt);
        }
    }
    // re-point the entries that were in the old storage (a tied duplicate follows its first
    // occurrence); the layout (param offsets, unit spans) follows them while the model keeps
    // storage, and stays the creation layout once another owner holds every entry
    int *src = hp_calloc((size_t)(np ? np : 1), sizeof(int));
    if (!src) { hp_free_aligned(nv); hp_free_aligned(ng); free(order); free(off); return HP_ERR_OOM; }
    for (int i = 0; i < np; i++) {   // decided on the old pointers first, then moved
        src[i] = -1;
        for (int k = 0; k < n && in_storage(m, &P[i]); k++)
            if (P[order[k]].value.local.data == P[i].value.local.data) src[i] = order[k];
    }
    for (int i = 0; i < np; i++) {
        if (src[i] < 0) continue;
        P[i].value.local.data = nv + off[src[i]];
        P[i].grad.local.data = ng + off[src[i]];
        m->param_off[i] = off[src[i]];
    }
    free(src);
    if (n > 0) m->param_floats = total;
    hp_free_aligned(m->param_data);
    hp_free_aligned(m->grad_data);
    m->param_data = nv;
    m->grad_data = ng;
    m->store_floats = n > 0 ? total : 0;
    free(order);
    free(off);
    return HP_OK;
}

/* ---- activation checkpointing -------------------------------------------------------------- */

/* TorchTitan's layer-level rule: with every_k = k, block l is checkpointed when (l + 1) % k == 0. */
static int ac_checkpointed(int every_k, int l) { return every_k > 0 && (l + 1) % every_k == 0; }

static int ctx_pending(hp_model_ctx_t c);
static hp_status_t tree_changed(hp_model_t m);

hp_status_t hp_model_set_activation_checkpoint(hp_model_t m, int every_k) {
    if (every_k < 0)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_set_activation_checkpoint: every_k = %d, expected 0 (off), "
                        "1 (every block) or k > 1 (every k-th block)", every_k);
    hp_ac_options_t o = hp_ac_default_options();
    o.every_k = every_k;
    return hp_model_set_activation_checkpoint_options(m, &o);
}

hp_status_t hp_model_set_activation_checkpoint_options(hp_model_t m, const hp_ac_options_t *o) {
    if (!m) return hp_error(HP_ERR_INVALID_ARG, "hp_model_set_activation_checkpoint_options: model is NULL");
    HP_TRY(hp_ac_options_check(o, "hp_model_set_activation_checkpoint_options"));
    if (ctx_pending(m->dflt))
        return hp_error(HP_ERR_STATE, "hp_model_set_activation_checkpoint: a forward is waiting for its "
                        "backward; hint: change checkpointing between steps");
    for (int u = m->u0; u < m->u1; u++) {
        nn_unit_t *U = &m->units[u];
        if (U->kind != HP_MODEL_UNIT_BLOCK) continue;
        U->ac->children[0] = U->inner;   // the block as it is now (a parallelism may have replaced it)
        hp_module_t *want = ac_checkpointed(o->every_k, u - 1) ? U->ac : U->inner;
        if (want == U->module) continue;
        HP_TRY(hp_module_move_hooks(want, U->module));   // the unit's hooks stay on its outer module
        U->module->unit = -1;
        want->unit = u;
        U->module = want;
    }
    m->ac = *o;
    return tree_changed(m);
}

int hp_model_activation_checkpoint(hp_model_t m) { return m->ac.every_k; }
void hp_model_activation_checkpoint_options(hp_model_t m, hp_ac_options_t *o) { *o = m->ac; }

/* The checkpointed blocks' decisions for (B, T) under o into keep (n_mods x HP_SAVE_SLOTS, NULL:
 * a scratch table), their costs summed, and the context's arena bytes: each unit's state, for a
 * checkpointed block its kept items; the regions: one per block (split) or the largest. */
typedef struct ac_sizes {
    size_t arena, region_max, region_sum, none;
    double recompute, forward;
    int n;
} ac_sizes_t;

static hp_status_t ac_size(hp_model_t m, const hp_ac_options_t *o, int B, int T, unsigned char *keep,
                           size_t *region_of_unit, size_t *kept_of_unit, ac_sizes_t *z) {
    memset(z, 0, sizeof(*z));
    unsigned char *own = NULL;
    if (!keep && !(keep = own = hp_calloc((size_t)m->n_mods * HP_SAVE_SLOTS, 1))) return HP_ERR_OOM;
    hp_status_t st = HP_OK;
    for (int u = m->u0; u < m->u1 && st == HP_OK; u++) {
        const nn_unit_t *U = &m->units[u];
        hp_module_t *inner = hp_module_is_checkpoint(U->module) ? U->module->children[0] : U->module;
        if (U->kind == HP_MODEL_UNIT_BLOCK) U->ac->children[0] = inner;   // o may differ from the installed AC
        z->none += inner->ops->act_bytes(inner, B, T);
        if (U->kind != HP_MODEL_UNIT_BLOCK || !ac_checkpointed(o->every_k, u - 1)) {
            z->arena += inner->ops->act_bytes(inner, B, T);
            continue;
        }
        hp_ac_stats_t s;
        st = hp_ac_decide(U->ac, o, B, T, keep, m->n_mods, &s);
        if (st != HP_OK) break;
        z->arena += s.kept_bytes;
        z->region_sum += s.region_bytes;
        if (s.region_bytes > z->region_max) z->region_max = s.region_bytes;
        z->recompute += s.recompute_flops;
        z->forward += s.forward_flops;
        z->n++;
        if (region_of_unit) region_of_unit[u] = s.region_bytes;
        if (kept_of_unit) kept_of_unit[u] = s.kept_bytes;
    }
    free(own);
    return st;
}

hp_status_t hp_model_activation_checkpoint_estimate(hp_model_t m, const hp_ac_options_t *o, int B, int T,
                                                    int split_backward, hp_ac_estimate_t *out) {
    if (!m || !out)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_activation_checkpoint_estimate: model and out are required");
    HP_TRY(hp_ac_options_check(o, "hp_model_activation_checkpoint_estimate"));
    if (B <= 0 || T <= 0)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_activation_checkpoint_estimate: (B, T) = (%d, %d), expected "
                        "positive", B, T);
    ac_sizes_t z;
    HP_TRY(ac_size(m, o, B, T, NULL, NULL, NULL, &z));
    const size_t region = split_backward ? z.region_sum : z.region_max;
    *out = (hp_ac_estimate_t){.act_bytes = z.arena + region, .kept_bytes = z.arena, .region_bytes = region,
                              .none_bytes = z.none, .recompute_flops = z.recompute, .checkpointed_flops = z.forward,
                              .n_checkpointed = z.n};
    return HP_OK;
}

/* The model's tree changed: old contexts are refused, the model's own is re-created at its next
 * use (a parallelism replacing many modules re-sizes it once). */
static hp_status_t tree_changed(hp_model_t m) {
    m->ac_generation++;
    hp_model_ctx_destroy(m->dflt);
    m->dflt = NULL;
    return HP_OK;
}

/* The model's own context, created for its limits when missing. */
static hp_status_t own_ctx(hp_model_t m, hp_model_ctx_t *out) {
    if (!m->dflt) HP_TRY(hp_model_ctx_create(m, m->ctx_batch, m->ctx_seq_len, 0, &m->dflt));
    *out = m->dflt;
    return HP_OK;
}

hp_status_t hp_model_set_compute_dtype(hp_model_t m, hp_dtype_t dtype) {
    if (!m) return hp_error(HP_ERR_INVALID_ARG, "hp_model_set_compute_dtype: model is NULL");
    if (dtype != HP_F32 && dtype != HP_BF16)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_set_compute_dtype: dtype %s; expected float32 or bfloat16 "
                        "(training.dtype)", hp_dtype_name(dtype));
    if (dtype == m->compute_dtype) return HP_OK;
    if (dtype == HP_BF16) {
        if (!hp_backend_has_gemm_bf16(m->be))
            return hp_error(HP_ERR_UNSUPPORTED, "training.dtype=bfloat16: backend '%s' has no gemm_bf16 slot; hint: "
                            "set training.dtype=float32", m->be->name);
        // the MoE layers' experts and router call the backend's f32 GEMMs directly (moe.c)
        if (m->cfg.moe_experts > 0)
            return hp_error(HP_ERR_UNSUPPORTED, "training.dtype=bfloat16 with the MoE model %s is not implemented "
                            "(its experts' grouped GEMMs are float32 only); hint: set training.dtype=float32",
                            m->cfg.name);
        for (int i = 0; i < m->n_mods; i++) {
            const hp_module_t *mod = m->mods[i];
            if (hp_linear_bf16_ws_bytes(mod, 1) && ((const hp_linear_impl_t *)mod->impl)->has_bias)
                return hp_error(HP_ERR_UNSUPPORTED, "training.dtype=bfloat16: linear '%s' has a bias, which bf16 "
                                "compute does not implement; hint: set training.dtype=float32", mod->name);
        }
    }
    if (ctx_pending(m->dflt))
        return hp_error(HP_ERR_STATE, "hp_model_set_compute_dtype: a forward is waiting for its backward");
    m->compute_dtype = dtype;
    return tree_changed(m);   // contexts made before lack (or needlessly hold) the bf16 workspace
}
hp_dtype_t hp_model_compute_dtype(hp_model_t m) { return m ? m->compute_dtype : HP_F32; }

hp_status_t hp_model_refresh_contexts(hp_model_t m) {
    if (!m) return hp_error(HP_ERR_INVALID_ARG, "hp_model_refresh_contexts: model is NULL");
    if (ctx_pending(m->dflt))
        return hp_error(HP_ERR_STATE, "hp_model_refresh_contexts: a forward is waiting for its backward");
    return tree_changed(m);
}
hp_status_t hp_model_set_context_limits(hp_model_t m, int max_batch, int max_seq_len) {
    if (!m) return hp_error(HP_ERR_INVALID_ARG, "hp_model_set_context_limits: model is NULL");
    const int B = max_batch > 0 ? max_batch : m->ctx_batch, T = max_seq_len > 0 ? max_seq_len : m->ctx_seq_len;
    if (B > m->max_batch || T > m->max_seq_len)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_set_context_limits: (B, T) = (%d, %d) outside the model's "
                        "(max_batch %d, max_seq_len %d); hint: create the model with larger limits", B, T,
                        m->max_batch, m->max_seq_len);
    if (ctx_pending(m->dflt))
        return hp_error(HP_ERR_STATE, "hp_model_set_context_limits: a forward is waiting for its backward");
    if (B == m->ctx_batch && T == m->ctx_seq_len) return HP_OK;
    m->ctx_batch = B;
    m->ctx_seq_len = T;
    hp_model_ctx_destroy(m->dflt);
    m->dflt = NULL;
    return HP_OK;
}

hp_status_t hp_model_replace_module(hp_model_t m, hp_module_t *parent, hp_module_t *old, hp_module_t *repl) {
    if (!m || !old || !repl)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_replace_module: model, old and replacement are required");
    if (ctx_pending(m->dflt))
        return hp_error(HP_ERR_STATE, "hp_model_replace_module: a forward is waiting for its backward");
    if (parent) {
        HP_TRY(hp_module_replace_child(parent, old, repl));
    } else {
        int u = old->unit;
        if (u < m->u0 || u >= m->u1 || m->units[u].module != old)
            return hp_error(HP_ERR_INVALID_ARG, "hp_model_replace_module: '%s' has no parent and is not a unit's "
                            "module", old->name);
        HP_TRY(hp_module_move_hooks(repl, old));
        old->unit = -1;
        repl->unit = u;
        m->units[u].module = repl;
        if (m->units[u].inner == old) m->units[u].inner = repl;
    }
    if (repl->id < 0 || repl->id >= m->n_mods || m->mods[repl->id] != repl) {
        repl->id = m->n_mods;
        HP_TRY(mods_push(m, repl));
    }
    return tree_changed(m);
}

/* ---- micro-batch contexts -------------------------------------------------------------------- */

/* Unit boundaries a context holds: x[u] for u in [lo, hi] (inputs of units lo.. and the
 * range's output; unit 0's input is the tokens). */
static void ctx_bounds(hp_model_t m, int *lo, int *hi) {
    *lo = m->u0 > 0 ? m->u0 : 1;
    *hi = m->u1 < m->n_units_total ? m->u1 : m->n_units_total - 1;
}

static int has_head(hp_model_t m) { return m->u1 == m->n_units_total; }

void hp_model_ctx_destroy(hp_model_ctx_t c) {
    if (!c) return;
    hp_act_free(&c->act);
    for (int i = 0; i < c->ckpt.n_regions; i++) hp_arena_free(&c->ckpt.regions[i]);
    free(c->ckpt_mem);
    c->m->be->free(c->m->be->ctx, c->mem);
    free(c);   // and its per-unit tables (hp_model_ctx_create)
}

/* The activation memory of a context: its arena and its recompute regions. */
static size_t ctx_act_bytes(hp_model_ctx_t c) {
    size_t n = c->act.arena.capacity;
    for (int i = 0; i < c->ckpt.n_regions; i++) n += c->ckpt.regions[i].capacity;
    return n;
}

size_t hp_model_ctx_bytes(hp_model_ctx_t c) { return c ? ctx_act_bytes(c) + c->mem_bytes : 0; }

/* The context's checkpointing tables (decisions, kept addresses, regions) when blocks are
 * checkpointed: decisions for (max_B, max_T); one region per block in a split context (its
 * replay's state stays until the weight pass), else one for all. Returns the arena bytes. */
static hp_status_t ctx_ckpt(hp_model_t m, hp_model_ctx_t c, int split, size_t *arena) {
    *arena = 0;
    int n_ck = 0;
    for (int u = m->u0; u < m->u1; u++) n_ck += hp_module_is_checkpoint(m->units[u].module);
    const size_t nm = (size_t)m->n_mods, nu = (size_t)m->n_units_total;
    const int n_reg = n_ck == 0 ? 0 : split ? n_ck : 1;
    if (n_ck == 0) {
        ac_sizes_t z;
        HP_TRY(ac_size(m, &m->ac, c->max_B, c->max_T, NULL, NULL, NULL, &z));
        *arena = z.arena;
        return HP_OK;
    }
    // one allocation: regions, kept addresses, kept bytes, per-unit sizes, region indices, decisions
    const size_t bytes = sizeof(hp_arena_t) * (size_t)n_reg + sizeof(void *) * nm * HP_SAVE_SLOTS +
                         sizeof(size_t) * (nm + 2 * nu) + sizeof(int) * nm + nm * HP_SAVE_SLOTS;
    char *p = c->ckpt_mem = hp_calloc(1, bytes);
    if (!p) return HP_ERR_OOM;
    hp_arena_t *regions = (hp_arena_t *)p; p += sizeof(hp_arena_t) * (size_t)n_reg;
    void **kept = (void **)p; p += sizeof(void *) * nm * HP_SAVE_SLOTS;
    size_t *kept_of = (size_t *)p; p += sizeof(size_t) * nm;
    size_t *reg_u = (size_t *)p; p += sizeof(size_t) * nu;
    size_t *kept_u = (size_t *)p; p += sizeof(size_t) * nu;
    int *region_of = (int *)p; p += sizeof(int) * nm;
    unsigned char *keep = (unsigned char *)p;
    ac_sizes_t z;
    HP_TRY(ac_size(m, &m->ac, c->max_B, c->max_T, keep, reg_u, kept_u, &z));
    c->ckpt = (hp_act_ckpt_t){.keep = keep, .kept = kept, .regions = regions, .n_regions = 0,
                              .region_of = region_of, .kept_of = kept_of};
    for (int u = m->u0, r = 0; u < m->u1; u++) {
        const hp_module_t *w = m->units[u].module;
        if (!hp_module_is_checkpoint(w)) continue;
        region_of[w->id] = split ? r : 0;
        kept_of[w->id] = kept_u[u];
        if (split || r == 0) {
            HP_TRY(hp_arena_init(&regions[r], "recompute region", split ? reg_u[u] : z.region_max));
            c->ckpt.n_regions = r + 1;
        }
        r++;
    }
    *arena = z.arena;
    return HP_OK;
}

/* bf16 compute: the largest bf16 workspace of the model's linears for N rows (a tensor-parallel
 * linear that gathers sequence-sharded rows runs at most the micro-batch's N), 0 under f32. */
static size_t bf16_ws_bytes(hp_model_t m, size_t N) {
    size_t mx = 0;
    if (m->compute_dtype != HP_BF16) return 0;
    for (int i = 0; i < m->n_mods; i++) {
        const size_t b = hp_linear_bf16_ws_bytes(m->mods[i], (int64_t)N);
        if (b > mx) mx = b;
    }
    return mx;
}

/* A context's workspace for (max_B, max_T) in floats (tokens, targets, unit boundaries, logits
 * and their gradient, activation gradients, backward scratch); the arena is sized by ac_size. */
static void ctx_sizes(hp_model_t m, int max_B, int max_T, int split, size_t *ws_out, size_t *scratch_max_out) {
    const size_t N = (size_t)max_B * max_T, d = m->cfg.dim, V = m->cfg.vocab_size;
    size_t scratch_max = 0, scratch_sum = 0;
    for (int u = m->u0; u < m->u1; u++) {
        const hp_module_t *mod = m->units[u].module;
        size_t s = mod->ops->grad_scratch_floats ? mod->ops->grad_scratch_floats(mod, max_B, max_T) : 0;
        s = ROUND16(s);
        if (s > scratch_max) scratch_max = s;
        scratch_sum += s;
    }
    int lo, hi;
    ctx_bounds(m, &lo, &hi);
    const int nb = hi >= lo ? hi - lo + 1 : 0;
    const size_t xN = ROUND16(N * d), iN = ROUND16(N);
    size_t ws = 2 * iN + (size_t)nb * xN;                           // tokens, targets (int32 in float slots), x
    ws += has_head(m) ? 2 * ROUND16(N * V) : 0;                      // logits, dlogits
    ws += split ? (size_t)nb * xN : 2 * xN;                         // activation gradients
    ws += split ? scratch_sum : scratch_max;
    ws += ROUND16(bf16_ws_bytes(m, N) / sizeof(float) + 1);
    *ws_out = ws;
    *scratch_max_out = scratch_max;
}

/* What hp_model_ctx_create would reserve, without reserving it: the arena (each unit's saved
 * state, a checkpointed block's kept items) and the recompute regions (one per checkpointed block
 * in a split context, else the largest), each rounded as hp_arena_init rounds it. */
void hp_model_ctx_size(hp_model_t m, int max_B, int max_T, unsigned flags, size_t *arena_bytes, size_t *work_bytes) {
    const int split = (flags & HP_MODEL_CTX_SPLIT_BACKWARD) != 0;
    size_t ws, sm, act = 0;
    ctx_sizes(m, max_B, max_T, split, &ws, &sm);
    size_t *reg_u = hp_calloc((size_t)m->n_units_total + 1, sizeof(size_t));
    ac_sizes_t z;
    if (reg_u && ac_size(m, &m->ac, max_B, max_T, NULL, reg_u, NULL, &z) == HP_OK) {
        act = hp_arena_round(z.arena);
        if (!split) act += hp_arena_round(z.region_max);
        for (int u = m->u0; split && u < m->u1; u++)
            if (hp_module_is_checkpoint(m->units[u].module)) act += hp_arena_round(reg_u[u]);
    }
    free(reg_u);
    if (arena_bytes) *arena_bytes = act;
    if (work_bytes) *work_bytes = sizeof(float) * ws;
}

hp_status_t hp_model_ctx_create(hp_model_t m, int max_B, int max_T, unsigned flags, hp_model_ctx_t *out) {
    if (!m || !out) return hp_error(HP_ERR_INVALID_ARG, "hp_model_ctx_create: model and out must be non-NULL");
    *out = NULL;
    if (max_B <= 0 || max_B > m->max_batch || max_T <= 0 || max_T > m->max_seq_len)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_ctx_create: (B, T) = (%d, %d) outside the model's (max_batch "
                        "%d, max_seq_len %d); hint: create the model with larger limits", max_B, max_T,
                        m->max_batch, m->max_seq_len);
    if (flags & ~HP_MODEL_CTX_SPLIT_BACKWARD)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_ctx_create: unknown flags 0x%x", flags & ~HP_MODEL_CTX_SPLIT_BACKWARD);
    const int split = (flags & HP_MODEL_CTX_SPLIT_BACKWARD) != 0, nu = m->n_units_total;
    size_t ws, scratch_max;
    ctx_sizes(m, max_B, max_T, split, &ws, &scratch_max);
    int lo, hi;
    ctx_bounds(m, &lo, &hi);
    const size_t N = (size_t)max_B * max_T, d = m->cfg.dim, V = m->cfg.vocab_size;
    const size_t xN = ROUND16(N * d), iN = ROUND16(N);
    // the context and its per-unit tables (x, g, scratch, scratch_n, state: nu + 1 entries
    // each, widest element first) in one allocation
    const size_t nt = (size_t)nu + 1;
    hp_model_ctx_t c = hp_calloc(1, sizeof(*c) + nt * (3 * sizeof(float *) + sizeof(size_t) + 1));
    if (!c) return HP_ERR_OOM;
    *c = (struct hp_model_ctx){.m = m, .flags = flags, .max_B = max_B, .max_T = max_T,
                               .ac_generation = m->ac_generation};
    c->x = (float **)(c + 1);
    c->g = c->x + nt;
    c->scratch = c->g + nt;
    c->scratch_n = (size_t *)(c->scratch + nt);
    c->state = (unsigned char *)(c->scratch_n + nt);
    size_t arena = 0;
    hp_status_t st = ctx_ckpt(m, c, split, &arena);
    if (st == HP_OK) st = hp_act_init(&c->act, m->n_mods > 0 ? m->n_mods : 1, arena);
    if (st == HP_OK) {
        c->mem = m->be->alloc(m->be->ctx, sizeof(float) * ws);
        if (!c->mem)
            st = hp_error(HP_ERR_OOM, "hp_model_ctx_create: %.1f MiB of workspace for (B, T) = (%d, %d); hint: "
                          "use smaller micro-batches", (double)ws * 4 / (1 << 20), max_B, max_T);
    }
    if (st != HP_OK) {
        hp_model_ctx_destroy(c);
        return st;
    }
    c->act.be = m->be;
    c->act.keep_recompute = split;
    c->act.ckpt = c->ckpt.n_regions > 0 ? &c->ckpt : NULL;
    float *p = c->mem;
    c->tokens = (int32_t *)p; p += iN;
    c->targets = (int32_t *)p; p += iN;
    for (int u = lo; u <= hi; u++) { c->x[u] = p; p += xN; }
    if (has_head(m)) {
        c->logits = p; p += ROUND16(N * V);
        c->dlogits = p; p += ROUND16(N * V);
    }
    if (split) {
        for (int u = lo; u <= hi; u++) { c->g[u] = p; p += xN; }
        for (int u = m->u0; u < m->u1; u++) {
            const hp_module_t *mod = m->units[u].module;
            size_t s = mod->ops->grad_scratch_floats ? ROUND16(mod->ops->grad_scratch_floats(mod, max_B, max_T)) : 0;
            c->scratch[u] = p;
            c->scratch_n[u] = s;
            p += s;
        }
    } else {
        c->gbuf[0] = p; p += xN;
        c->gbuf[1] = p; p += xN;
        for (int u = m->u0; u < m->u1; u++) { c->scratch[u] = p; c->scratch_n[u] = scratch_max; }
        p += scratch_max;
    }
    c->act.compute_dtype = m->compute_dtype;
    if (m->compute_dtype == HP_BF16) {
        c->act.bf16_ws = p;
        c->act.bf16_ws_bytes = bf16_ws_bytes(m, N);
        p += ROUND16(c->act.bf16_ws_bytes / sizeof(float) + 1);
    }
    HP_ASSERT((size_t)(p - (float *)c->mem) <= ws);
    c->mem_bytes = sizeof(float) * ws;
    *out = c;
    return HP_OK;
}

static int ctx_pending(hp_model_ctx_t c) { return c && c->pending; }

hp_act_t *hp_model_ctx_act(hp_model_ctx_t c) { return c ? &c->act : NULL; }
const float *hp_model_ctx_logits(hp_model_ctx_t c) { return c && c->state[c->m->n_units_total - 1] ? c->logits : NULL; }
double hp_model_ctx_loss_sum(hp_model_ctx_t c) { return c ? c->loss_sum : 0.0; }
int64_t hp_model_ctx_valid_tokens(hp_model_ctx_t c) { return c ? c->n_valid : 0; }

/* How the units' modules split the activations (nn.h, act_split): the residual stream's sequence
 * split (unit 0's output, or the first unit's input for a stage without it) and the logits'
 * column split (the head's output); 1 where no module decides. */
static hp_status_t model_splits(hp_model_t m, int *seq, int *cols, const char *who) {
    hp_act_split_t r = {1, 1}, h = {1, 1};
    const int first = m->u0, head = m->n_units_total - 1;
    (void)hp_module_act_split(m->units[first].module, first == 0, &r);
    if (has_head(m)) (void)hp_module_act_split(m->units[head].module, 1, &h);
    if (r.seq < 1 || r.cols != 1 || h.seq != 1 || h.cols < 1 || m->cfg.vocab_size % h.cols != 0)
        return hp_error(HP_ERR_UNSUPPORTED, "%s: the residual stream is split %d x %d (sequence x features) and the "
                        "logits %d x %d; expected whole features between units, whole logits rows and columns "
                        "dividing the vocabulary %d; hint: check the parallel plan's layouts", who, r.seq, r.cols,
                        h.seq, h.cols, m->cfg.vocab_size);
    *seq = r.seq;
    *cols = h.cols;
    return HP_OK;
}

static hp_status_t check_ctx(hp_model_t m, hp_model_ctx_t c, const char *who) {
    if (!m || !c) return hp_error(HP_ERR_INVALID_ARG, "%s: model and context must be non-NULL", who);
    if (c->m != m)
        return hp_error(HP_ERR_INVALID_ARG, "%s: the context was created for another model; hint: create one per "
                        "model (hp_model_ctx_create)", who);
    if (c->ac_generation != m->ac_generation)
        return hp_error(HP_ERR_STATE, "%s: the context was sized before activation checkpointing changed; hint: "
                        "re-create it (hp_model_ctx_create)", who);
    return HP_OK;
}

hp_status_t hp_model_ctx_begin(hp_model_ctx_t c, const int32_t *tokens, const int32_t *targets, int B, int T,
                               float loss_divisor) {
    if (!c) return hp_error(HP_ERR_INVALID_ARG, "hp_model_ctx_begin: context is NULL");
    hp_model_t m = c->m;
    const char *who = "hp_model_forward";
    HP_TRY(check_ctx(m, c, who));
    if (B <= 0 || B > c->max_B || T <= 0 || T > c->max_T)
        return hp_error(HP_ERR_INVALID_ARG, "%s: (B, T) = (%d, %d) outside the created (max_batch %d, max_seq_len "
                        "%d); hint: create the model with larger limits", who, B, T, c->max_B, c->max_T);
    if (m->u0 == 0 && !tokens) return hp_error(HP_ERR_INVALID_ARG, "%s: tokens is NULL", who);
    if (targets && !(loss_divisor > 0.0f))
        return hp_error(HP_ERR_INVALID_ARG, "%s: loss_divisor %g must be > 0 (the global number of valid target "
                        "tokens)", who, loss_divisor);
    const int N = B * T, V = m->cfg.vocab_size;
    int ks = 1, vs = 1;
    HP_TRY(model_splits(m, &ks, &vs, who));
    if (T % ks != 0)
        return hp_error(HP_ERR_INVALID_ARG, "%s: sequence length %d is not divisible by the sequence-parallel "
                        "degree %d; hint: use a multiple of %d", who, T, ks, ks);
    if (targets)
        for (int n = 0; n < N; n++)
            if (targets[n] != HP_IGNORE_INDEX && (targets[n] < 0 || targets[n] >= V))
                return hp_error(HP_ERR_INVALID_ARG, "%s: target %d at position %d outside [0, %d) and not the "
                                "ignore index -100", who, targets[n], n, V);
    if (m->empty)
        return hp_error(HP_ERR_STATE, "%s: the model was created empty (hp_model_create_empty) and its parameters have "
                        "no storage yet; hint: hp_model_materialize it and draw its weights (hp_model_init_weights), or "
                        "let the composition do both (hp_parallel_init_weights)", who);
    hp_act_reset(&c->act);
    c->act.B = B;
    c->act.T = T / ks;
    c->act.pos0 = 0;   // a parallelism's hooks may move the rows (context parallel's position segments)
    c->act.n_pos_segs = 0;
    c->act.pos_segs = NULL;
    c->act.targets = targets ? c->targets : NULL;
    memset(c->prof, 0, sizeof(c->prof));
    c->act.prof = c->prof;
    c->B = B;
    c->T = T;
    c->N = N;
    c->Nr = N / ks;
    c->Vc = V / vs;
    if (tokens) memcpy(c->tokens, tokens, sizeof(int32_t) * (size_t)N);
    c->has_targets = targets != NULL;
    if (targets) memcpy(c->targets, targets, sizeof(int32_t) * (size_t)N);
    c->loss_divisor = loss_divisor;
    c->loss_sum = 0.0;
    c->n_valid = 0;
    c->pending = 0;
    memset(c->state, 0, (size_t)m->n_units_total + 1);
    return HP_OK;
}

static hp_status_t check_range(hp_model_t m, int u0, int u1, const char *who) {
    if (u0 < m->u0 || u1 > m->u1 || u0 >= u1)
        return hp_error(HP_ERR_INVALID_ARG, "%s: units [%d, %d) outside the model's units [%d, %d) (or empty)", who,
                        u0, u1, m->u0, m->u1);
    return HP_OK;
}

/* The head's loss module (its child "loss", or what replaced it). */
static hp_module_t *loss_module(hp_model_t m) { return nn_head_loss(m->units[m->n_units_total - 1].module); }

/* The loss over the context's logits: the loss module's forward (cross-entropy, or what a
 * parallelism put in its place: loss_parallel), summed over the valid rows in row order. */
static hp_status_t head_loss(hp_model_t m, hp_model_ctx_t c) {
    if (!c->has_targets) return HP_OK;
    hp_module_t *loss = loss_module(m);
    if (!loss) return hp_error(HP_ERR_STATE, "hp_model_forward: the head has no loss module");
    hp_tensor_t t_lg;
    hp_tensor_view2(&t_lg, c->logits, c->N, c->Vc);
    HP_TRY(hp_module_forward(loss, &c->act, &t_lg, NULL));
    const hp_loss_saved_t *r = hp_loss_result(&c->act, loss);
    const double sum = r->sum;
    c->n_valid = r->n_valid;
    c->loss_sum = sum;
    c->pending = 1;
    float l = (float)(sum / (double)c->loss_divisor);
    if (!isfinite(l))
        return hp_error(HP_ERR_NUMERIC, "hp_model_forward: loss is %g (sum %g over %lld valid targets); "
                        "hint: lower the learning rate or check the inputs", l, sum, (long long)c->n_valid);
    return HP_OK;
}

hp_status_t hp_model_forward_range(hp_model_t m, hp_model_ctx_t c, int u0, int u1, const float *in, float *out) {
    const char *who = "hp_model_forward_range";
    HP_TRY(check_ctx(m, c, who));
    HP_TRY(check_range(m, u0, u1, who));
    if (c->N == 0) return hp_error(HP_ERR_STATE, "%s: no micro-batch; call hp_model_ctx_begin first", who);
    const int d = m->cfg.dim, nu = m->n_units_total;
    if (u0 > 0) {
        if (in) m->be->copy_rows(m->be->ctx, c->x[u0], d, in, d, c->Nr, d);
        else if (!(u0 - 1 >= m->u0 && c->state[u0 - 1]))
            return hp_error(HP_ERR_INVALID_ARG, "%s: unit %d needs its input activation (B, T, %d); in is NULL and "
                            "unit %d has not run in this context", who, u0, d, u0 - 1);
    }
    hp_act_t *act = &c->act;
    for (int u = u0; u < u1; u++) {
        nn_unit_t *U = &m->units[u];
        hp_tensor_t t_in, t_out;
        if (U->kind == HP_MODEL_UNIT_EMBEDDING) {
            const int64_t shape[2] = {c->B, c->T};
            HP_TRY(hp_tensor_init(&t_in, HP_I32, 2, shape, c->tokens));
        } else {
            hp_tensor_view2(&t_in, c->x[u], c->Nr, d);
        }
        if (U->kind == HP_MODEL_UNIT_HEAD) hp_tensor_view2(&t_out, c->logits, c->N, c->Vc);
        else hp_tensor_view2(&t_out, c->x[u + 1], c->Nr, d);
        HP_TRY(hp_module_forward(U->module, act, &t_in, &t_out));
        c->state[u] = 1;
        if (U->kind == HP_MODEL_UNIT_HEAD) HP_TRY(head_loss(m, c));
    }
    if (out && u1 < nu) m->be->copy_rows(m->be->ctx, out, d, c->x[u1], d, c->Nr, d);
    return HP_OK;
}

enum { BW_BOTH = 0, BW_INPUT = 1, BW_WEIGHT = 2 };

static hp_status_t backward(hp_model_t m, hp_model_ctx_t c, int u0, int u1, const float *dout, float *din, int mode,
                            const char *who) {
    HP_TRY(check_ctx(m, c, who));
    HP_TRY(check_range(m, u0, u1, who));
    const int split = (c->flags & HP_MODEL_CTX_SPLIT_BACKWARD) != 0, d = m->cfg.dim, nu = m->n_units_total;
    if (mode != BW_BOTH && !split)
        return hp_error(HP_ERR_STATE, "%s: the context was created without HP_MODEL_CTX_SPLIT_BACKWARD, so input "
                        "and weight passes run together; hint: use hp_model_backward_range or create the context "
                        "with the flag", who);
    hp_act_t *act = &c->act;
    if (mode == BW_WEIGHT) {
        for (int u = u1 - 1; u >= u0; u--) {
            if (c->state[u] != 2)
                return hp_error(HP_ERR_STATE, "%s: unit %d has no pending weight pass (its backward_input has not "
                                "run since its forward)", who, u);
            HP_TRY(hp_module_backward_weight(m->units[u].module, act));
            c->state[u] = 3;
        }
        return HP_OK;
    }
    for (int u = u0; u < u1; u++)
        if (c->state[u] != 1)
            return hp_error(HP_ERR_STATE, "%s: no forward to differentiate for unit %d in this context (call "
                            "hp_model_forward with targets first; each forward allows one backward)", who, u);
    // the gradient of the range's output
    float *g_out;
    int cur = 0;
    if (u1 == nu) {
        if (!c->has_targets || !c->pending)
            return hp_error(HP_ERR_STATE, "hp_model_backward: no forward with targets to differentiate (call "
                            "hp_model_forward with targets first; each forward allows one backward)");
        float dloss = 1.0f / c->loss_divisor;   // d (sum / divisor) / d sum
        const int64_t one = 1;
        hp_tensor_t t_dl, t_dlg;
        HP_TRY(hp_tensor_init(&t_dl, HP_F32, 1, &one, &dloss));
        hp_tensor_view2(&t_dlg, c->dlogits, c->N, c->Vc);
        HP_TRY(hp_module_backward_input(loss_module(m), act, &t_dl, &t_dlg));
        g_out = c->dlogits;
    } else {
        g_out = split ? c->g[u1] : c->gbuf[0];
        if (dout) m->be->copy_rows(m->be->ctx, g_out, d, dout, d, c->Nr, d);
        else if (!(split && u1 < m->u1 && c->state[u1] >= 2))
            return hp_error(HP_ERR_INVALID_ARG, "%s: dout (the gradient of unit %d's output) is NULL", who, u1 - 1);
    }
    for (int u = u1 - 1; u >= u0; u--) {
        nn_unit_t *U = &m->units[u];
        hp_tensor_t t_dy, t_dx;
        if (U->kind == HP_MODEL_UNIT_HEAD) hp_tensor_view2(&t_dy, c->dlogits, c->N, c->Vc);
        else hp_tensor_view2(&t_dy, g_out, c->Nr, d);
        float *g_in = NULL;
        if (U->kind != HP_MODEL_UNIT_EMBEDDING) {
            g_in = split ? c->g[u] : c->gbuf[U->kind == HP_MODEL_UNIT_HEAD ? cur : 1 - cur];
            hp_tensor_view2(&t_dx, g_in, c->Nr, d);
        }
        act->grad_scratch = c->scratch[u];
        act->grad_scratch_floats = c->scratch_n[u];
        HP_TRY(hp_module_backward_input(U->module, act, &t_dy, g_in ? &t_dx : NULL));
        c->state[u] = 2;
        if (mode == BW_BOTH) {
            HP_TRY(hp_module_backward_weight(U->module, act));
            c->state[u] = 3;
        }
        if (U->kind != HP_MODEL_UNIT_HEAD) cur = 1 - cur;
        g_out = g_in;
    }
    if (u1 == nu) c->pending = 0;
    if (din && u0 > 0) m->be->copy_rows(m->be->ctx, din, d, g_out, d, c->Nr, d);
    return HP_OK;
}

hp_status_t hp_model_backward_range(hp_model_t m, hp_model_ctx_t c, int u0, int u1, const float *dout, float *din) {
    return backward(m, c, u0, u1, dout, din, BW_BOTH, "hp_model_backward_range");
}
hp_status_t hp_model_backward_input_range(hp_model_t m, hp_model_ctx_t c, int u0, int u1, const float *dout,
                                          float *din) {
    return backward(m, c, u0, u1, dout, din, BW_INPUT, "hp_model_backward_input_range");
}
hp_status_t hp_model_backward_weight_range(hp_model_t m, hp_model_ctx_t c, int u0, int u1) {
    return backward(m, c, u0, u1, NULL, NULL, BW_WEIGHT, "hp_model_backward_weight_range");
}

hp_status_t hp_model_forward_ctx(hp_model_t m, hp_model_ctx_t c, const int32_t *tokens, const int32_t *targets,
                                 int B, int T, float loss_divisor, float *loss) {
    if (!m) return hp_error(HP_ERR_INVALID_ARG, "hp_model_forward: model is NULL");
    if (m->u0 != 0 || m->u1 != m->n_units_total)
        return hp_error(HP_ERR_STATE, "hp_model_forward: the model holds units [%d, %d) only; hint: drive a stage "
                        "with hp_model_forward_range", m->u0, m->u1);
    if (loss) *loss = 0.0f;
    HP_TRY(hp_model_ctx_begin(c, tokens, targets, B, T, loss_divisor));
    hp_status_t st = hp_model_forward_range(m, c, 0, m->n_units_total, NULL, NULL);
    if (loss && c->has_targets && c->state[m->n_units_total - 1])
        *loss = (float)(c->loss_sum / (double)c->loss_divisor);
    return st;
}

hp_status_t hp_model_backward_ctx(hp_model_t m, hp_model_ctx_t c) {
    if (c && !c->pending)
        return hp_error(HP_ERR_STATE, "hp_model_backward: no forward with targets to differentiate (call "
                        "hp_model_forward with targets first; each forward allows one backward)");
    return backward(m, c, 0, m->n_units_total, NULL, NULL, BW_BOTH, "hp_model_backward");
}

/* ---- the whole-model calls on the model's own context -------------------------------------- */

hp_status_t hp_model_forward(hp_model_t m, const int32_t *tokens, const int32_t *targets, int B, int T,
                             float loss_divisor, float *loss) {
    if (!m) return hp_error(HP_ERR_INVALID_ARG, "hp_model_forward: model is NULL");
    if (!tokens) return hp_error(HP_ERR_INVALID_ARG, "hp_model_forward: tokens is NULL");
    hp_model_ctx_t c;
    HP_TRY(own_ctx(m, &c));
    return hp_model_forward_ctx(m, c, tokens, targets, B, T, loss_divisor, loss);
}

hp_status_t hp_model_backward(hp_model_t m) {
    if (!m->dflt)
        return hp_error(HP_ERR_STATE, "hp_model_backward: no forward with targets to differentiate (call "
                        "hp_model_forward with targets first; each forward allows one backward)");
    return hp_model_backward_ctx(m, m->dflt);
}
const float *hp_model_logits(hp_model_t m) { return m->dflt ? hp_model_ctx_logits(m->dflt) : NULL; }
int64_t hp_model_valid_tokens(hp_model_t m) { return m->dflt ? m->dflt->n_valid : 0; }
double hp_model_loss_sum(hp_model_t m) { return m->dflt ? m->dflt->loss_sum : 0.0; }

int hp_model_profile(hp_model_t m, const char ***names, const double **seconds) {
    static const double none[HP_NN_OP_COUNT];
    if (names) *names = (const char **)hp_nn_op_names;
    if (seconds) *seconds = m->dflt ? m->dflt->prof : none;
    return HP_NN_OP_COUNT;
}

void hp_model_memory(hp_model_t m, size_t *param_bytes, size_t *grad_bytes, size_t *act_bytes, size_t *work_bytes) {
    const size_t own = sizeof(float) * m->store_floats;
    if (param_bytes) *param_bytes = own;
    if (grad_bytes) *grad_bytes = own;
    // the model's own context, or what it will take at its first use (a pipeline stage's
    // model never makes one: the runtime's contexts hold its micro-batches)
    size_t ab = 0, wb = 0;
    if (m->dflt) {
        ab = ctx_act_bytes(m->dflt);
        wb = m->dflt->mem_bytes;
    } else {
        hp_model_ctx_size(m, m->ctx_batch, m->ctx_seq_len, 0, &ab, &wb);
    }
    if (act_bytes) *act_bytes = ab;
    if (work_bytes) *work_bytes = wb;
}
