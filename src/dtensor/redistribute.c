/* DTensor executors: distribute_tensor (scatter / broadcast per mesh dim, or a local split),
 * from_local, full_tensor and redistribute (planner steps run one mesh dim at a time with
 * PyTorch's transitions: S->R all_gather, S(i)->S(j) all_to_all, R->S local chunk, P->R
 * all_reduce, P->S reduce_scatter, R->P local; uneven shards are padded to ceil(n/k)). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor-impl.h"

/* ---- storage ----------------------------------------------------------------------------- */

void hp_dmem_begin(hp_dmem_t *d, const hp_dtensor_mem_t *mem) {
    memset(d, 0, sizeof(*d));
    d->mem = mem;
}

hp_status_t hp_dmem_result(hp_dmem_t *d, size_t bytes, void **data, void **owned) {
    *owned = NULL;
    const hp_dtensor_mem_t *m = d->mem;
    if (m && m->out_data) {
        if (m->out_bytes < bytes)
            return hp_error(HP_ERR_INVALID_ARG, "dtensor: out_data holds %zu bytes but the result "
                            "needs %zu; size it with hp_dtensor_compute_local_shape_and_offset",
                            m->out_bytes, bytes);
        *data = m->out_data;
    } else if (m && m->arena) {
        /* An empty result (ranks outside the mesh, empty pieces) takes no arena bytes, as
         * dtensor.h promises (result = hp_arena_round(bytes) = 0): a non-NULL address that
         * nothing reads or writes. */
        static max_align_t empty_result;
        *data = bytes ? hp_arena_alloc(m->arena, bytes) : (void *)&empty_result;
        if (!*data) return HP_ERR_OOM;
    } else {
        *data = hp_calloc(1, bytes ? bytes : 1);
        if (!*data) return HP_ERR_OOM;
        *owned = *data;
    }
    if (m && m->arena && !d->marked) {
        d->mark = hp_arena_mark(m->arena);
        d->marked = 1;
    }
    return HP_OK;
}

void *hp_dmem_scratch(hp_dmem_t *d, size_t bytes) {
    const hp_dtensor_mem_t *m = d->mem;
    if (m && m->arena) {
        if (!d->marked) {
            d->mark = hp_arena_mark(m->arena);
            d->marked = 1;
        }
        return hp_arena_alloc(m->arena, bytes ? bytes : 1);
    }
    if (d->nheap == HP_DMEM_MAX_SCRATCH) {
        hp_error(HP_ERR_OOM, "dtensor: more than %d scratch blocks in one call", HP_DMEM_MAX_SCRATCH);
        return NULL;
    }
    void *p = hp_calloc(1, bytes ? bytes : 1);
    if (p) d->heap[d->nheap++] = p;
    return p;
}

void hp_dmem_end(hp_dmem_t *d) {
    for (int i = 0; i < d->nheap; i++) free(d->heap[i]);
    d->nheap = 0;
    if (d->marked && d->mem && d->mem->arena) hp_arena_reset_to(d->mem->arena, d->mark);
    d->marked = 0;
}

void hp_dtensor_free(hp_dtensor_t *t) {
    if (!t) return;
    free(t->owned);
    t->owned = NULL;
}

/* ---- box copy ------------------------------------------------------------------------------ */

void hp_box_copy(void *dst, const int64_t *dshape, const int64_t *doff, const void *src,
                 const int64_t *sshape, const int64_t *soff, const int64_t *box, int nd, size_t es) {
    for (int i = 0; i < nd; i++)
        if (box[i] == 0) return;
    /* Merge trailing dims that the box covers completely in both tensors into one run. */
    int t = nd - 1;
    while (t > 0 && box[t] == dshape[t] && box[t] == sshape[t]) t--;
    size_t run = es;
    for (int i = t; i < nd; i++) run *= (size_t)box[i];
    if (nd == 0) {
        memcpy(dst, src, es);
        return;
    }
    int64_t dstr[HP_MAX_DIMS], sstr[HP_MAX_DIMS];
    dstr[nd - 1] = sstr[nd - 1] = 1;
    for (int i = nd - 2; i >= 0; i--) {
        dstr[i] = dstr[i + 1] * dshape[i + 1];
        sstr[i] = sstr[i + 1] * sshape[i + 1];
    }
    int64_t dbase = 0, sbase = 0;
    for (int i = 0; i < nd; i++) {
        dbase += doff[i] * dstr[i];
        sbase += soff[i] * sstr[i];
    }
    int64_t outer = hp_prod_(t, box);
    int64_t idx[HP_MAX_DIMS] = {0};
    for (int64_t o = 0; o < outer; o++) {
        int64_t dp = dbase, sp = sbase;
        for (int i = 0; i < t; i++) {
            dp += idx[i] * dstr[i];
            sp += idx[i] * sstr[i];
        }
        memcpy((char *)dst + (size_t)dp * es, (const char *)src + (size_t)sp * es, run);
        for (int i = t - 1; i >= 0; i--) {
            if (++idx[i] < box[i]) break;
            idx[i] = 0;
        }
    }
}

/* ---- one mesh-dim step ------------------------------------------------------------------- */

typedef struct step_ctx {
    hp_dmem_t *mem;
    hp_dtype_t dt;
    size_t es;
    int nd;
    hp_comm_t comm;
    int k, r;        /* mesh dim size and this rank's coordinate on it */
} step_ctx_t;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static void chunk(int64_t n, int k, int r, int64_t *sz, int64_t *off) {
    hp_shard_size_and_offset(n, k, r, sz, off);
}

/* Global indices (within a level of size L) that StridedShard piece r holds. */
static int64_t strided_idx(int64_t L, hp_placement_t p, int k, int r, int64_t *idx) {
    int64_t ms = k;
    hp_placement_t one = p;
    one.dim = 0;
    return hp_layout_dim_indices(L, 0, 1, &ms, &r, &one, idx);
}

#define ALLOC(ptr, bytes)                                       \
    do {                                                        \
        (ptr) = hp_dmem_scratch(c->mem, (bytes));               \
        if (!(ptr)) return HP_ERR_OOM;                          \
    } while (0)

/* The local block s padded to `piece` along d (pb: the padded shape, *blk its elements),
 * all_gathered into *recv (k blocks in rank order); *res allocated at the gathered shape o
 * (s with o[d] = L). The first half of Shard / _StridedShard -> Replicate. */
static hp_status_t gather_padded(const step_ctx_t *c, const void *in, const int64_t *s, int d, int64_t piece,
                                 int64_t L, int64_t *pb, int64_t *o, int64_t *blk, void **recv, void **res) {
    int64_t zero[HP_MAX_DIMS] = {0};
    void *send;
    memcpy(pb, s, sizeof(int64_t) * HP_MAX_DIMS);
    pb[d] = piece;
    *blk = hp_prod_(c->nd, pb);
    ALLOC(send, (size_t)*blk * c->es);
    hp_box_copy(send, pb, zero, in, s, zero, s, c->nd, c->es);
    ALLOC(*recv, (size_t)(*blk * c->k) * c->es);
    HP_TRY(hp_all_gather(send, *recv, (size_t)*blk, c->dt, c->comm, NULL));
    memcpy(o, s, sizeof(int64_t) * HP_MAX_DIMS);
    o[d] = L;
    ALLOC(*res, (size_t)hp_prod_(c->nd, o) * c->es);
    return HP_OK;
}

/* *send: k blocks of shape pb (blk elements), block j = chunk j along d (size L) of `in`
 * (shape s), padded. The packing before a reduce_scatter or all_to_all. */
static hp_status_t pack_chunks(const step_ctx_t *c, void **send, const int64_t *pb, int64_t blk, const void *in,
                               const int64_t *s, int d, int64_t L) {
    int64_t zero[HP_MAX_DIMS] = {0};
    ALLOC(*send, (size_t)(blk * c->k) * c->es);
    for (int j = 0; j < c->k; j++) {
        int64_t box[HP_MAX_DIMS], soff[HP_MAX_DIMS] = {0};
        memcpy(box, s, sizeof(box));
        chunk(L, c->k, j, &box[d], &soff[d]);
        hp_box_copy((char *)*send + (size_t)(j * blk) * c->es, pb, zero, in, s, soff, box, c->nd, c->es);
    }
    return HP_OK;
}

/* o = s with o[d] this rank's chunk of s[d] (the local shape after a step to Shard(d)). */
static void my_chunk_shape(const step_ctx_t *c, int64_t *o, const int64_t *s, int d) {
    int64_t off;
    memcpy(o, s, sizeof(int64_t) * HP_MAX_DIMS);
    chunk(s[d], c->k, c->r, &o[d], &off);
}

/* The inverse: res (shape o) chunk j along d (size L) = the unpadded block j of recv. */
static void unpack_chunks(const step_ctx_t *c, void *res, const int64_t *o, const void *recv, const int64_t *pb,
                          int64_t blk, int d, int64_t L) {
    int64_t zero[HP_MAX_DIMS] = {0};
    for (int j = 0; j < c->k; j++) {
        int64_t box[HP_MAX_DIMS], doff[HP_MAX_DIMS] = {0};
        memcpy(box, o, sizeof(box));
        chunk(L, c->k, j, &box[d], &doff[d]);
        hp_box_copy(res, o, doff, (const char *)recv + (size_t)(j * blk) * c->es, pb, zero, box, c->nd, c->es);
    }
}

/* Shard(d) -> Replicate: pad to ceil(L/k), all_gather, unpad. */
static hp_status_t shard_to_replicate(const step_ctx_t *c, const void *in, int64_t *s, int d,
                                      int64_t L, void **out) {
    int64_t pb[HP_MAX_DIMS], o[HP_MAX_DIMS], blk;
    void *recv, *res;
    HP_TRY(gather_padded(c, in, s, d, ceil_div(L, c->k), L, pb, o, &blk, &recv, &res));
    unpack_chunks(c, res, o, recv, pb, blk, d, L);
    memcpy(s, o, sizeof(o));
    *out = res;
    return HP_OK;
}

/* _StridedShard(d, sf) -> Replicate: pad to the largest piece, all_gather, scatter rows back
 * to their global indices. */
static hp_status_t strided_to_replicate(const step_ctx_t *c, const void *in, int64_t *s,
                                        hp_placement_t p, int64_t L, void **out) {
    int d = p.dim;
    int64_t *idx = hp_dmem_scratch(c->mem, (size_t)(L ? L : 1) * sizeof(int64_t));
    if (!idx) return HP_ERR_OOM;
    int64_t cmax = 0;
    for (int j = 0; j < c->k; j++) {
        int64_t n = strided_idx(L, p, c->k, j, idx);
        if (n > cmax) cmax = n;
    }
    int64_t pb[HP_MAX_DIMS], o[HP_MAX_DIMS], blk;
    void *recv, *res;
    HP_TRY(gather_padded(c, in, s, d, cmax, L, pb, o, &blk, &recv, &res));
    for (int j = 0; j < c->k; j++) {
        int64_t n = strided_idx(L, p, c->k, j, idx);
        for (int64_t t = 0; t < n; t++) {
            int64_t box[HP_MAX_DIMS], doff[HP_MAX_DIMS] = {0}, soff[HP_MAX_DIMS] = {0};
            memcpy(box, o, sizeof(box));
            box[d] = 1;
            doff[d] = idx[t];
            soff[d] = t;
            hp_box_copy(res, o, doff, (char *)recv + (size_t)(j * blk) * c->es, pb, soff, box,
                        c->nd, c->es);
        }
    }
    memcpy(s, o, sizeof(o));
    *out = res;
    return HP_OK;
}

/* Replicate -> Shard(d) / _StridedShard: local selection, no communication. */
static hp_status_t replicate_to_shard(const step_ctx_t *c, const void *in, int64_t *s,
                                      hp_placement_t p, void **out) {
    int d = p.dim;
    int64_t o[HP_MAX_DIMS], zero[HP_MAX_DIMS] = {0}, soff[HP_MAX_DIMS] = {0};
    memcpy(o, s, sizeof(o));
    void *res;
    if (p.kind == HP_SHARD) {
        int64_t sz;
        chunk(s[d], c->k, c->r, &sz, &soff[d]);
        o[d] = sz;
        ALLOC(res, (size_t)hp_prod_(c->nd, o) * c->es);
        hp_box_copy(res, o, zero, in, s, soff, o, c->nd, c->es);
    } else {
        int64_t *idx = hp_dmem_scratch(c->mem, (size_t)(s[d] ? s[d] : 1) * sizeof(int64_t));
        if (!idx) return HP_ERR_OOM;
        int64_t n = strided_idx(s[d], p, c->k, c->r, idx);
        o[d] = n;
        ALLOC(res, (size_t)hp_prod_(c->nd, o) * c->es);
        for (int64_t t = 0; t < n; t++) {
            int64_t box[HP_MAX_DIMS], doff[HP_MAX_DIMS] = {0};
            memcpy(box, o, sizeof(box));
            box[d] = 1;
            doff[d] = t;
            soff[d] = idx[t];
            hp_box_copy(res, o, doff, in, s, soff, box, c->nd, c->es);
        }
    }
    memcpy(s, o, sizeof(o));
    *out = res;
    return HP_OK;
}

/* Partial -> Replicate: all_reduce. */
static hp_status_t partial_to_replicate(const step_ctx_t *c, const void *in, const int64_t *s,
                                        hp_redop_t op, void **out) {
    int64_t n = hp_prod_(c->nd, s);
    void *res;
    ALLOC(res, (size_t)n * c->es);
    HP_TRY(hp_all_reduce(in, res, (size_t)n, c->dt, op, c->comm, NULL));
    *out = res;
    return HP_OK;
}

/* Partial -> Shard(d): pack padded chunks, reduce_scatter, unpad. */
static hp_status_t partial_to_shard(const step_ctx_t *c, const void *in, int64_t *s, int d,
                                    hp_redop_t op, void **out) {
    int64_t L = s[d], cpad = ceil_div(L, c->k);
    int64_t pb[HP_MAX_DIMS], zero[HP_MAX_DIMS] = {0}, o[HP_MAX_DIMS];
    memcpy(pb, s, sizeof(pb));
    pb[d] = cpad;
    int64_t blk = hp_prod_(c->nd, pb);
    void *send, *recv, *res;
    HP_TRY(pack_chunks(c, &send, pb, blk, in, s, d, L));
    ALLOC(recv, (size_t)blk * c->es);
    HP_TRY(hp_reduce_scatter(send, recv, (size_t)blk, c->dt, op, c->comm, NULL));
    my_chunk_shape(c, o, s, d);
    ALLOC(res, (size_t)hp_prod_(c->nd, o) * c->es);
    hp_box_copy(res, o, zero, recv, pb, zero, o, c->nd, c->es);
    memcpy(s, o, sizeof(o));
    *out = res;
    return HP_OK;
}

/* Shard(i) -> Shard(j): pad dim i to ceil(L_i/k) and dim j to k*ceil(L_j/k), all_to_all,
 * unpad both. */
static hp_status_t shard_to_shard(const step_ctx_t *c, const void *in, int64_t *s, int i, int j,
                                  int64_t Li, void **out) {
    int64_t Lj = s[j], ci = ceil_div(Li, c->k), cj = ceil_div(Lj, c->k);
    int64_t pb[HP_MAX_DIMS], o[HP_MAX_DIMS];
    memcpy(pb, s, sizeof(pb));
    pb[i] = ci;
    pb[j] = cj;
    int64_t blk = hp_prod_(c->nd, pb);
    void *send, *recv, *res;
    HP_TRY(pack_chunks(c, &send, pb, blk, in, s, j, Lj));
    my_chunk_shape(c, o, s, j);   // the result: dim j this rank's chunk, dim i whole
    o[i] = Li;
    ALLOC(recv, (size_t)(blk * c->k) * c->es);
    HP_TRY(hp_all_to_all(send, recv, (size_t)blk, c->dt, c->comm, NULL));
    ALLOC(res, (size_t)hp_prod_(c->nd, o) * c->es);
    unpack_chunks(c, res, o, recv, pb, blk, i, Li);
    memcpy(s, o, sizeof(o));
    *out = res;
    return HP_OK;
}

/* Replicate -> Partial (internal): sum divides by k; avg, max and min keep the value. */
static hp_status_t replicate_to_partial(const step_ctx_t *c, const void *in, const int64_t *s,
                                        hp_redop_t op, void **out) {
    if (op == HP_PROD)
        return hp_error(HP_ERR_UNSUPPORTED, "redistribute Replicate -> Partial(product) is not "
                        "supported (only sum, avg, max, min)");
    if (op == HP_SUM && !hp_dtype_is_float(c->dt))
        return hp_error(HP_ERR_UNSUPPORTED, "redistribute Replicate -> Partial(sum) divides by "
                        "the mesh dim size and needs a float dtype, got %s", hp_dtype_name(c->dt));
    int64_t n = hp_prod_(c->nd, s);
    void *res;
    ALLOC(res, (size_t)n * c->es);
    memcpy(res, in, (size_t)n * c->es);
    if (op == HP_SUM) {
        hp_tensor_t t;
        HP_TRY(hp_tensor_init(&t, c->dt, 1, &n, res));
        for (int64_t e = 0; e < n; e++) hp_tensor_set_flat(&t, e, hp_tensor_get_flat(&t, e) / c->k);
    }
    *out = res;
    return HP_OK;
}

static hp_status_t run_step(const step_ctx_t *c, const hp_transform_t *st, const void *in,
                            int64_t *s, void **out) {
    hp_placement_t a = st->src, b = st->dst;
    char x[32], y[32];
    int md = st->mesh_dim;
    if (a.kind == HP_SHARD && b.kind == HP_REPLICATE)
        return shard_to_replicate(c, in, s, a.dim, st->logical_shape[a.dim], out);
    if (a.kind == HP_STRIDED_SHARD && b.kind == HP_REPLICATE)
        return strided_to_replicate(c, in, s, a, st->logical_shape[a.dim], out);
    if (a.kind == HP_REPLICATE && (b.kind == HP_SHARD || b.kind == HP_STRIDED_SHARD))
        return replicate_to_shard(c, in, s, b, out);
    if (a.kind == HP_PARTIAL && b.kind == HP_REPLICATE)
        return partial_to_replicate(c, in, s, a.reduce_op, out);
    if (a.kind == HP_PARTIAL && b.kind == HP_SHARD)
        return partial_to_shard(c, in, s, b.dim, a.reduce_op, out);
    if (a.kind == HP_SHARD && b.kind == HP_SHARD)
        return shard_to_shard(c, in, s, a.dim, b.dim, st->logical_shape[a.dim], out);
    if (a.kind == HP_REPLICATE && b.kind == HP_PARTIAL)
        return replicate_to_partial(c, in, s, b.reduce_op, out);
    if (a.kind == HP_PARTIAL && b.kind == HP_PARTIAL)
        return hp_error(HP_ERR_INVALID_ARG, "redistribute from %s to %s on mesh dim %d: Partial "
                        "reduce ops differ; go through Replicate", hp_placement_str(a, x, sizeof(x)),
                        hp_placement_str(b, y, sizeof(y)), md);
    return hp_error(HP_ERR_UNSUPPORTED, "redistribute from %s to %s on mesh dim %d not supported "
                    "yet; go through Replicate", hp_placement_str(a, x, sizeof(x)),
                    hp_placement_str(b, y, sizeof(y)), md);
}

/* ---- scratch sizing (mirrors the allocations of the step functions above) ----------------- */

static size_t rnd_(size_t bytes) { return hp_arena_round(bytes ? bytes : 1); }

static int64_t strided_max(int64_t L, hp_placement_t p, int k, int64_t *idx, int64_t *mine, int r) {
    int64_t cmax = 0;
    for (int j = 0; j < k; j++) {
        int64_t n = strided_idx(L, p, k, j, idx);
        if (n > cmax) cmax = n;
        if (j == r) *mine = n;
    }
    return cmax;
}

/* Scratch bytes one step takes from an arena; updates the local shape s like the step. */
static hp_status_t step_scratch(const step_ctx_t *c, const hp_transform_t *st, int64_t *s, size_t *bytes) {
    hp_placement_t a = st->src, b = st->dst;
    int nd = c->nd;
    size_t es = c->es;
    int64_t o[HP_MAX_DIMS], pb[HP_MAX_DIMS], tmp;
    memcpy(o, s, sizeof(o));
    memcpy(pb, s, sizeof(pb));
    size_t sum = 0;
    int64_t *idx = NULL;
    int need_idx = a.kind == HP_STRIDED_SHARD || b.kind == HP_STRIDED_SHARD;
    int64_t Lmax = 1;
    for (int d = 0; d < nd; d++) Lmax = st->logical_shape[d] > Lmax ? st->logical_shape[d] : Lmax;
    for (int d = 0; d < nd; d++) Lmax = s[d] > Lmax ? s[d] : Lmax;
    if (need_idx && !(idx = hp_malloc((size_t)(Lmax + 1) * sizeof(int64_t)))) return HP_ERR_OOM;
    if (a.kind == HP_SHARD && b.kind == HP_REPLICATE) {
        int d = a.dim;
        int64_t L = st->logical_shape[d];
        pb[d] = ceil_div(L, c->k);
        int64_t blk = hp_prod_(nd, pb);
        o[d] = L;
        sum = rnd_((size_t)blk * es) + rnd_((size_t)(blk * c->k) * es) + rnd_((size_t)hp_prod_(nd, o) * es);
    } else if (a.kind == HP_STRIDED_SHARD && b.kind == HP_REPLICATE) {
        int d = a.dim;
        int64_t L = st->logical_shape[d];
        pb[d] = strided_max(L, a, c->k, idx, &tmp, c->r);
        int64_t blk = hp_prod_(nd, pb);
        o[d] = L;
        sum = rnd_((size_t)L * sizeof(int64_t)) + rnd_((size_t)blk * es) + rnd_((size_t)(blk * c->k) * es) +
              rnd_((size_t)hp_prod_(nd, o) * es);
    } else if (a.kind == HP_REPLICATE && b.kind == HP_SHARD) {
        chunk(s[b.dim], c->k, c->r, &o[b.dim], &tmp);
        sum = rnd_((size_t)hp_prod_(nd, o) * es);
    } else if (a.kind == HP_REPLICATE && b.kind == HP_STRIDED_SHARD) {
        o[b.dim] = strided_idx(s[b.dim], b, c->k, c->r, idx);
        sum = rnd_((size_t)s[b.dim] * sizeof(int64_t)) + rnd_((size_t)hp_prod_(nd, o) * es);
    } else if (a.kind == HP_PARTIAL && b.kind == HP_REPLICATE) {
        sum = rnd_((size_t)hp_prod_(nd, s) * es);
    } else if (a.kind == HP_PARTIAL && b.kind == HP_SHARD) {
        int d = b.dim;
        pb[d] = ceil_div(s[d], c->k);
        int64_t blk = hp_prod_(nd, pb);
        chunk(s[d], c->k, c->r, &o[d], &tmp);
        sum = rnd_((size_t)(blk * c->k) * es) + rnd_((size_t)blk * es) + rnd_((size_t)hp_prod_(nd, o) * es);
    } else if (a.kind == HP_SHARD && b.kind == HP_SHARD) {
        int i = a.dim, j = b.dim;
        pb[i] = ceil_div(st->logical_shape[i], c->k);
        pb[j] = ceil_div(s[j], c->k);
        int64_t blk = hp_prod_(nd, pb);
        o[i] = st->logical_shape[i];
        chunk(s[j], c->k, c->r, &o[j], &tmp);
        sum = 2 * rnd_((size_t)(blk * c->k) * es) + rnd_((size_t)hp_prod_(nd, o) * es);
    } else if (a.kind == HP_REPLICATE && b.kind == HP_PARTIAL) {
        sum = rnd_((size_t)hp_prod_(nd, s) * es);
    } else {
        free(idx);
        char x[32], y[32];
        return hp_error(HP_ERR_UNSUPPORTED, "redistribute from %s to %s on mesh dim %d not supported",
                        hp_placement_str(a, x, sizeof(x)), hp_placement_str(b, y, sizeof(y)), st->mesh_dim);
    }
    free(idx);
    memcpy(s, o, sizeof(o));
    *bytes += sum;
    return HP_OK;
}

hp_status_t hp_dtensor_redistribute_scratch(size_t *bytes, const hp_dtensor_t *in, int nplacements,
                                            const hp_placement_t *placements) {
    *bytes = 0;
    if (!in || !in->mesh || !placements)
        return hp_error(HP_ERR_INVALID_ARG, "hp_dtensor_redistribute_scratch: needs a DTensor and placements");
    int nd = in->local.ndim, mnd = in->mesh_ndim;
    hp_placement_t tgt[HP_MESH_MAX_DIMS];
    HP_TRY(hp_dtensor_check_placements_(tgt, nd, in->mesh, nplacements, placements, "redistribute"));
    int coord[HP_MESH_MAX_DIMS];
    if (!hp_mesh_get_coordinate(in->mesh, coord)) return HP_OK;
    int64_t ms[HP_MESH_MAX_DIMS];
    for (int i = 0; i < mnd; i++) ms[i] = hp_mesh_size(in->mesh, i);
    hp_transform_t steps[2 * HP_MESH_MAX_DIMS];
    int nsteps = 0;
    HP_TRY(hp_redistribute_plan(steps, 2 * HP_MESH_MAX_DIMS, &nsteps, nd, in->global_shape, mnd, ms, coord,
                                in->placements, tgt));
    if (!hp_tensor_is_contiguous(&in->local)) *bytes += rnd_(hp_tensor_nbytes(&in->local));
    int64_t s[HP_MAX_DIMS] = {0};
    memcpy(s, in->local.shape, (size_t)nd * sizeof(int64_t));
    step_ctx_t c = {NULL, in->local.dtype, hp_dtype_size(in->local.dtype), nd, NULL, 0, 0};
    for (int t = 0; t < nsteps; t++) {
        int md = steps[t].mesh_dim;
        if (hp_placement_equal(steps[t].src, steps[t].dst) || ms[md] == 1) continue;
        c.k = (int)ms[md];
        c.r = coord[md];
        HP_TRY(step_scratch(&c, &steps[t], s, bytes));
    }
    return HP_OK;
}

/* ---- public entry points ------------------------------------------------------------------ */

static void mesh_shape(hp_mesh_t mesh, int64_t *ms) {
    for (int i = 0; i < hp_mesh_ndim(mesh); i++) ms[i] = hp_mesh_size(mesh, i);
}

/* Fills out's descriptor (placements, global shape, local shape) and its result storage. */
hp_status_t hp_dtensor_finish_(hp_dmem_t *dm, hp_dtensor_t *res, hp_status_t st, hp_dtensor_t *out) {
    hp_dmem_end(dm);
    if (st != HP_OK) {
        free(res->owned);
        return st;
    }
    *out = *res;
    return HP_OK;
}

hp_status_t hp_dtensor_make_result_(hp_dtensor_t *out, hp_dmem_t *dm, hp_dtype_t dt, int nd,
                               const int64_t *gshape, hp_mesh_t mesh, const hp_placement_t *pl) {
    int64_t ls[HP_MAX_DIMS], off[HP_MAX_DIMS];
    int mnd = hp_mesh_ndim(mesh);
    HP_TRY(hp_dtensor_compute_local_shape_and_offset(ls, off, nd, gshape, mesh, mnd, pl));
    memset(out, 0, sizeof(*out));
    out->mesh = mesh;
    out->mesh_ndim = mnd;
    memcpy(out->placements, pl, (size_t)mnd * sizeof(hp_placement_t));
    memcpy(out->global_shape, gshape, (size_t)nd * sizeof(int64_t));
    int64_t n = hp_prod_(nd, ls);
    void *data;
    HP_TRY(hp_dmem_result(dm, (size_t)n * hp_dtype_size(dt), &data, &out->owned));
    return hp_tensor_init(&out->local, dt, nd, ls, data);
}

/* Contiguous copy of a possibly strided tensor into scratch (or the tensor itself). */
static hp_status_t contiguous_of(hp_dmem_t *dm, const hp_tensor_t *t, const void **data) {
    if (hp_tensor_is_contiguous(t)) {
        *data = t->data;
        return HP_OK;
    }
    hp_tensor_t c;
    void *p = hp_dmem_scratch(dm, hp_tensor_nbytes(t));
    if (!p) return HP_ERR_OOM;
    HP_TRY(hp_tensor_init(&c, t->dtype, t->ndim, t->shape, p));
    HP_TRY(hp_tensor_copy(&c, t));
    *data = p;
    return HP_OK;
}

hp_status_t hp_dtensor_redistribute_(hp_dtensor_t *out, const hp_dtensor_mem_t *mem,
                                     const hp_dtensor_t *in, int nplacements,
                                     const hp_placement_t *placements, int internal) {
    char x[96], y[96];
    if (!in || !in->mesh)
        return hp_error(HP_ERR_INVALID_ARG, "redistribute: input is not a DTensor (mesh is NULL)");
    if (!placements) return hp_error(HP_ERR_INVALID_ARG, "placements is needed for redistribute!");
    int nd = in->local.ndim, mnd = in->mesh_ndim;
    hp_placement_t tgt[HP_MESH_MAX_DIMS];
    HP_TRY(hp_dtensor_check_placements_(tgt, nd, in->mesh, nplacements, placements, "redistribute"));
    for (int i = 0; i < mnd && !internal; i++)
        if (tgt[i].kind == HP_PARTIAL && !hp_placement_equal(in->placements[i], tgt[i]))
            return hp_error(HP_ERR_INVALID_ARG, "Can not redistribute from %s to %s, redistributing "
                            "to Partial is for internal use only! (mesh dim %d)",
                            hp_placement_str(in->placements[i], x, sizeof(x)),
                            hp_placement_str(tgt[i], y, sizeof(y)), i);
    {   /* the input's piece must be the one its placements say (a hand-made descriptor may not be) */
        int64_t ls[HP_MAX_DIMS], off[HP_MAX_DIMS];
        HP_TRY(hp_dtensor_compute_local_shape_and_offset(ls, off, nd, in->global_shape, in->mesh, mnd,
                                                         in->placements));
        for (int d = 0; d < nd; d++)
            if (ls[d] != in->local.shape[d])
                return hp_error(HP_ERR_INVALID_ARG, "redistribute: input local dim %d is %lld but "
                                "placements %s of global dim %lld give %lld on this rank; build the "
                                "DTensor with hp_dtensor_from_local or hp_dtensor_distribute", d,
                                (long long)in->local.shape[d],
                                hp_placements_str(mnd, in->placements, x, sizeof(x)),
                                (long long)in->global_shape[d], (long long)ls[d]);
    }
    hp_dmem_t dm;
    hp_dmem_begin(&dm, mem);
    hp_dtensor_t res;
    memset(&res, 0, sizeof(res));
    hp_status_t st = hp_dtensor_make_result_(&res, &dm, in->local.dtype, nd, in->global_shape, in->mesh, tgt);
    if (st != HP_OK) goto end;
    int coord[HP_MESH_MAX_DIMS];
    if (!hp_mesh_get_coordinate(in->mesh, coord)) goto end;

    int64_t ms[HP_MESH_MAX_DIMS];
    mesh_shape(in->mesh, ms);
    hp_transform_t steps[2 * HP_MESH_MAX_DIMS];
    int nsteps = 0;
    st = hp_redistribute_plan(steps, 2 * HP_MESH_MAX_DIMS, &nsteps, nd, in->global_shape, mnd, ms,
                              coord, in->placements, tgt);
    if (st != HP_OK) goto end;
    const void *cur;
    st = contiguous_of(&dm, &in->local, &cur);
    if (st != HP_OK) goto end;
    int64_t s[HP_MAX_DIMS] = {0};
    memcpy(s, in->local.shape, (size_t)nd * sizeof(int64_t));
    step_ctx_t c = {&dm, in->local.dtype, hp_dtype_size(in->local.dtype), nd, NULL, 0, 0};
    for (int t = 0; t < nsteps; t++) {
        int md = steps[t].mesh_dim;
        if (hp_placement_equal(steps[t].src, steps[t].dst) || ms[md] == 1) continue;
        c.comm = hp_mesh_get_comm(in->mesh, md);
        c.k = (int)ms[md];
        c.r = coord[md];
        void *next = NULL;
        st = run_step(&c, &steps[t], cur, s, &next);
        if (st != HP_OK) goto end;
        cur = next;
    }
    for (int d = 0; d < nd; d++)
        HP_ASSERT_MSG(s[d] == res.local.shape[d], "redistribute %s -> %s: local dim %d is %lld after "
                      "the plan, layout says %lld",
                      hp_placements_str(mnd, in->placements, x, sizeof(x)),
                      hp_placements_str(mnd, tgt, y, sizeof(y)), d, (long long)s[d],
                      (long long)res.local.shape[d]);
    if (hp_tensor_nbytes(&res.local)) memcpy(res.local.data, cur, hp_tensor_nbytes(&res.local));
end:   /* also a rank outside the mesh: an empty piece, no communication */
    return hp_dtensor_finish_(&dm, &res, st, out);
}

hp_status_t hp_dtensor_redistribute(hp_dtensor_t *out, const hp_dtensor_mem_t *mem,
                                    const hp_dtensor_t *in, int nplacements,
                                    const hp_placement_t *placements) {
    return hp_dtensor_redistribute_(out, mem, in, nplacements, placements, 0);
}

hp_status_t hp_dtensor_redistribute_internal(hp_dtensor_t *out, const hp_dtensor_mem_t *mem,
                                             const hp_dtensor_t *in, int nplacements,
                                             const hp_placement_t *placements) {
    return hp_dtensor_redistribute_(out, mem, in, nplacements, placements, 1);
}

hp_status_t hp_dtensor_full_tensor(hp_tensor_t *out, void **out_owned, const hp_dtensor_mem_t *mem,
                                   const hp_dtensor_t *in) {
    if (out_owned) *out_owned = NULL;
    if (!in || !in->mesh) return hp_error(HP_ERR_INVALID_ARG, "full_tensor: input is not a DTensor");
    if (!out_owned && !(mem && (mem->arena || mem->out_data)))
        return hp_error(HP_ERR_INVALID_ARG, "full_tensor: heap storage needs out_owned to hand "
                        "the block back; pass out_owned or an arena / out_data");
    hp_placement_t r[HP_MESH_MAX_DIMS];
    for (int i = 0; i < in->mesh_ndim; i++) r[i] = hp_replicate();
    hp_dtensor_t res;
    HP_TRY(hp_dtensor_redistribute_(&res, mem, in, in->mesh_ndim, r, 1));
    *out = res.local;
    if (out_owned) *out_owned = res.owned;
    return HP_OK;
}

hp_status_t hp_dtensor_from_local(hp_dtensor_t *out, const hp_tensor_t *local, hp_mesh_t mesh,
                                  int nplacements, const hp_placement_t *placements,
                                  const int64_t *global_shape) {
    if (!local || !mesh) return hp_error(HP_ERR_INVALID_ARG, "from_local: local tensor and mesh are required");
    int nd = local->ndim;
    hp_placement_t pl[HP_MESH_MAX_DIMS];
    HP_TRY(hp_dtensor_check_placements_(pl, nd, mesh, nplacements, placements, "from_local"));
    int64_t g[HP_MAX_DIMS] = {0};
    if (global_shape) {
        memcpy(g, global_shape, (size_t)nd * sizeof(int64_t));
        for (int d = 0; d < nd; d++)
            if (g[d] < 0)
                return hp_error(HP_ERR_INVALID_ARG, "from_local: shape[%d] = %lld is negative", d,
                                (long long)g[d]);
        int64_t ls[HP_MAX_DIMS], off[HP_MAX_DIMS];
        HP_TRY(hp_dtensor_compute_local_shape_and_offset(ls, off, nd, g, mesh, nplacements, pl));
        if (hp_mesh_contains_self(mesh))
            for (int d = 0; d < nd; d++)
                if (ls[d] != local->shape[d]) {
                    char a[64], b[96];
                    return hp_error(HP_ERR_INVALID_ARG, "from_local: local tensor %s does not match "
                                    "the piece of global shape given with placements %s on this "
                                    "rank (dim %d should be %lld)", hp_tensor_shape_str(local, a, sizeof(a)),
                                    hp_placements_str(nplacements, pl, b, sizeof(b)), d,
                                    (long long)ls[d]);
                }
    } else {
        memcpy(g, local->shape, (size_t)nd * sizeof(int64_t));
        for (int i = 0; i < nplacements; i++)
            if (pl[i].kind == HP_SHARD || pl[i].kind == HP_STRIDED_SHARD) g[pl[i].dim] *= hp_mesh_size(mesh, i);
    }
    memset(out, 0, sizeof(*out));
    out->local = *local;
    out->mesh = mesh;
    out->mesh_ndim = nplacements;
    memcpy(out->placements, pl, (size_t)nplacements * sizeof(hp_placement_t));
    memcpy(out->global_shape, g, sizeof(g));
    return HP_OK;
}

hp_status_t hp_dtensor_distribute(hp_dtensor_t *out, const hp_dtensor_mem_t *mem,
                                  const hp_tensor_t *full, hp_mesh_t mesh, int nplacements,
                                  const hp_placement_t *placements, int src_data_rank) {
    char x[32];
    if (!full || !mesh) return hp_error(HP_ERR_INVALID_ARG, "distribute_tensor: tensor and mesh are required");
    int nd = full->ndim, mnd = hp_mesh_ndim(mesh);
    hp_placement_t pl[HP_MESH_MAX_DIMS];
    HP_TRY(hp_dtensor_check_placements_(pl, nd, mesh, nplacements, placements, "distribute_tensor"));
    for (int i = 0; i < mnd; i++)
        if (src_data_rank < -1 || src_data_rank >= hp_mesh_size(mesh, i))
            return hp_error(HP_ERR_INVALID_ARG, "distribute_tensor: src_data_rank %d is out of range "
                            "for mesh dim %d of size %lld (expected 0..%lld, or -1 for a local "
                            "split)", src_data_rank, i, (long long)hp_mesh_size(mesh, i),
                            (long long)hp_mesh_size(mesh, i) - 1);
    const int pi = hp_placements_first_partial_(pl, mnd);
    if (pi >= 0)
        return hp_error(HP_ERR_INVALID_ARG, "Trying to distribute tensor with unsupported placements %s on device mesh "
                        "dimension %d! (use Shard or Replicate)", hp_placement_str(pl[pi], x, sizeof(x)), pi);
    hp_dmem_t dm;
    hp_dmem_begin(&dm, mem);
    hp_dtensor_t res;
    memset(&res, 0, sizeof(res));
    hp_status_t st = hp_dtensor_make_result_(&res, &dm, full->dtype, nd, full->shape, mesh, pl);
    if (st != HP_OK) goto end;
    int coord[HP_MESH_MAX_DIMS];
    if (!hp_mesh_get_coordinate(mesh, coord)) goto end;
    const void *cur;
    st = contiguous_of(&dm, full, &cur);
    if (st != HP_OK) goto end;
    int64_t s[HP_MAX_DIMS] = {0};
    memcpy(s, full->shape, (size_t)nd * sizeof(int64_t));
    size_t es = hp_dtype_size(full->dtype);
    step_ctx_t c = {&dm, full->dtype, es, nd, NULL, 0, 0};
    for (int i = 0; i < mnd; i++) {
        int k = (int)hp_mesh_size(mesh, i);
        /* As PyTorch, mesh dims of size 1 still issue their (one-rank) scatter / broadcast,
         * so counts match CommDebugMode's. */
        if (pl[i].kind == HP_REPLICATE) {
            if (src_data_rank < 0) continue;
            /* mesh_broadcast from group rank src_data_rank */
            int64_t n = hp_prod_(nd, s);
            void *b = hp_dmem_scratch(&dm, (size_t)n * es);
            if (!b) { st = HP_ERR_OOM; goto end; }
            if (coord[i] == src_data_rank && n) memcpy(b, cur, (size_t)n * es);
            st = hp_broadcast(b, (size_t)n, full->dtype, src_data_rank, hp_mesh_get_comm(mesh, i), NULL);
            if (st != HP_OK) goto end;
            cur = b;
            continue;
        }
        c.k = k;
        c.r = coord[i];
        c.comm = hp_mesh_get_comm(mesh, i);
        void *next = NULL;
        if (src_data_rank < 0) {
            st = replicate_to_shard(&c, cur, s, pl[i], &next);
            if (st != HP_OK) goto end;
            cur = next;
            continue;
        }
        /* mesh_scatter of padded pieces from group rank src_data_rank, then unpad */
        int d = pl[i].dim;
        int64_t L = s[d], cpad = 0;
        int64_t *idx = hp_dmem_scratch(&dm, (size_t)(L ? L : 1) * sizeof(int64_t));
        if (!idx) { st = HP_ERR_OOM; goto end; }
        for (int j = 0; j < k; j++) {
            int64_t n, off;
            if (pl[i].kind == HP_SHARD) chunk(L, k, j, &n, &off);
            else n = strided_idx(L, pl[i], k, j, idx);
            if (n > cpad) cpad = n;
        }
        int64_t pb[HP_MAX_DIMS], zero[HP_MAX_DIMS] = {0}, o[HP_MAX_DIMS];
        memcpy(pb, s, sizeof(pb));
        pb[d] = cpad;
        int64_t blk = hp_prod_(nd, pb);
        void *send = NULL, *recv;
        if (coord[i] == src_data_rank) {
            send = hp_dmem_scratch(&dm, (size_t)(blk * k) * es);
            if (!send) { st = HP_ERR_OOM; goto end; }
            for (int j = 0; j < k; j++) {
                c.r = j;
                int64_t s2[HP_MAX_DIMS];
                memcpy(s2, s, sizeof(s2));
                st = replicate_to_shard(&c, cur, s2, pl[i], &next);
                if (st != HP_OK) goto end;
                hp_box_copy((char *)send + (size_t)(j * blk) * es, pb, zero, next, s2, zero, s2, nd, es);
            }
            c.r = coord[i];
        }
        recv = hp_dmem_scratch(&dm, (size_t)blk * es);
        if (!recv) { st = HP_ERR_OOM; goto end; }
        st = hp_scatter(send, recv, (size_t)blk, full->dtype, src_data_rank, c.comm, NULL);
        if (st != HP_OK) goto end;
        memcpy(o, s, sizeof(o));
        if (pl[i].kind == HP_SHARD) {
            int64_t off;
            chunk(L, k, coord[i], &o[d], &off);
        } else {
            o[d] = strided_idx(L, pl[i], k, coord[i], idx);
        }
        next = hp_dmem_scratch(&dm, (size_t)hp_prod_(nd, o) * es);
        if (!next) { st = HP_ERR_OOM; goto end; }
        hp_box_copy(next, o, zero, recv, pb, zero, o, nd, es);
        memcpy(s, o, sizeof(o));
        cur = next;
    }
    if (hp_tensor_nbytes(&res.local)) memcpy(res.local.data, cur, hp_tensor_nbytes(&res.local));
end:   /* also a rank outside the mesh: an empty piece, no communication */
    return hp_dtensor_finish_(&dm, &res, st, out);
}
