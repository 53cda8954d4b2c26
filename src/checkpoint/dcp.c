/* Distributed checkpoint save/load: per-rank safetensors files plus a JSON metadata file
 * (written last by rank 0), atomic commit by directory rename, dedup of replicated chunks to
 * the lowest rank, async save through a staging buffer and a writer thread (file I/O only;
 * every collective stays on the calling thread), load by box intersection (resharding). */
#define _GNU_SOURCE
#include "hyperparallel/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hyperparallel/safetensors.h"
#include "dcp-impl.h"

/* ---- small helpers ---------------------------------------------------------------------- */

static int crank(hp_comm_t c) { return c ? hp_comm_rank(c) : 0; }
static int csize(hp_comm_t c) { return c ? hp_comm_size(c) : 1; }

/* Every rank returns the same status: a failing rank's own message, naming its file, reaches
 * every rank as "rank R: <message>" (hp_comm_agree), so rank 0 prints it. `what` stands in
 * for a failure that recorded no message. */
hp_status_t hp_dcp_agree(hp_comm_t comm, hp_status_t s, const char *what) {
    if (s != HP_OK && !hp_last_error()[0]) hp_error(s, "%s failed (%s)", what, hp_status_string(s));
    if (!comm) return s;
    return hp_comm_agree(comm, s, NULL);
}

hp_status_t hp_dcp_purge(const char *folder, int64_t keep) {
    if (keep <= 0) return HP_OK;
    int64_t steps[4096];
    int n = 0;
    HP_TRY(hp_dcp_list_steps(folder, steps, 4096, &n));
    if (n > 4096) n = 4096;
    for (int i = 0; i + keep < n; i++) {
        char d[4096];
        snprintf(d, sizeof d, "%s/step-%lld", folder, (long long)steps[i]);
        hp_log(HP_LOG_INFO, "checkpoint: removing %s (keep_latest_k = %lld)", d, (long long)keep);
        if (hp_file_rmtree(d) != HP_OK) hp_log(HP_LOG_WARN, "checkpoint purge: %s", hp_last_error());
    }
    return HP_OK;
}

/* ---- state helpers ------------------------------------------------------------------------ */

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static int tensor_ndim(const hp_dcp_tensor_t *x) { return x->t->local.ndim; }
static const int64_t *tensor_gshape(const hp_dcp_tensor_t *x) {
    return x->t->mesh ? x->t->global_shape : x->t->local.shape;
}
static hp_dtype_t tensor_store_dtype(const hp_dcp_tensor_t *x) {
    return x->store_dtype >= 0 ? (hp_dtype_t)x->store_dtype : x->t->local.dtype;
}

static hp_status_t check_state(const hp_dcp_state_t *st) {
    for (int i = 0; i < st->n_tensors; i++) {
        const hp_dcp_tensor_t *x = &st->tensors[i];
        if (!x->name || !x->name[0] || !x->t)
            return hp_error(HP_ERR_INVALID_ARG, "checkpoint state tensor %d has no name or no DTensor", i);
        if (strlen(x->name) >= HP_ST_MAX_NAME)
            return hp_error(HP_ERR_INVALID_ARG, "checkpoint tensor name '%.40s...' is longer than %d bytes",
                            x->name, HP_ST_MAX_NAME - 1);
        for (int d = 0; d < x->t->mesh_ndim && x->t->mesh; d++) {
            hp_placement_t p = x->t->placements[d];
            if (p.kind == HP_PARTIAL)
                return hp_error(HP_ERR_INVALID_ARG,
                                "tensor '%s': a DTensor with a Partial placement (mesh dim %d) cannot be "
                                "checkpointed; redistribute it to Replicate or Shard first", x->name, d);
        }
        int sdt = x->store_dtype;
        if (sdt >= 0 && sdt != (int)x->t->local.dtype &&
            !(hp_dtype_is_float((hp_dtype_t)sdt) && hp_dtype_is_float(x->t->local.dtype)))
            return hp_error(HP_ERR_INVALID_ARG, "tensor '%s': cannot store %s as %s (only float -> float casts)",
                            x->name, hp_dtype_name(x->t->local.dtype), hp_dtype_name((hp_dtype_t)sdt));
        for (int j = 0; j < i; j++)
            if (!strcmp(st->tensors[j].name, x->name))
                return hp_error(HP_ERR_INVALID_ARG, "checkpoint state has the name '%s' twice", x->name);
    }
    for (int i = 0; i < st->n_blobs; i++) {
        const hp_dcp_blob_t *b = &st->blobs[i];
        if (!b->name || !b->name[0] || (b->size && !b->data))
            return hp_error(HP_ERR_INVALID_ARG, "checkpoint blob %d has no name or no data", i);
        for (int j = 0; j < st->n_tensors; j++)
            if (!strcmp(st->tensors[j].name, b->name))
                return hp_error(HP_ERR_INVALID_ARG, "checkpoint state has the name '%s' twice", b->name);
        for (int j = 0; j < i; j++)
            if (!strcmp(st->blobs[j].name, b->name))
                return hp_error(HP_ERR_INVALID_ARG, "checkpoint state has the name '%s' twice", b->name);
    }
    return HP_OK;
}

/* ---- boxes -------------------------------------------------------------------------------
 * A rank's piece of a tensor is the product over dims of the global indices it holds on each
 * dim (hp_layout_dim_indices); each dim's list splits into contiguous runs, so the piece is a
 * set of boxes (one for Shard/Replicate layouts, several for StridedShard). */

hp_status_t hp_dcp_local_boxes(const hp_dtensor_t *t, hp_dcp_box_t **out, int *n) {
    *out = NULL;
    *n = 0;
    int nd = t->local.ndim;
    if (t->mesh && !hp_mesh_contains_self(t->mesh)) return HP_OK;
    if (hp_tensor_numel(&t->local) == 0) return HP_OK;
    const int64_t *gs = t->mesh ? t->global_shape : t->local.shape;
    int64_t *runs[HP_MAX_DIMS] = {0};   /* per dim: (global start, local start, length) triples */
    int nruns[HP_MAX_DIMS];
    int64_t total = 1;
    hp_status_t s = HP_OK;
    int64_t ms[HP_MESH_MAX_DIMS];
    int coord[HP_MESH_MAX_DIMS];
    if (t->mesh) {
        for (int m = 0; m < t->mesh_ndim; m++) ms[m] = hp_mesh_size(t->mesh, m);
        hp_mesh_get_coordinate(t->mesh, coord);
    }
    for (int d = 0; d < nd && s == HP_OK; d++) {
        int64_t *idx = hp_malloc(sizeof(int64_t) * (size_t)(gs[d] ? gs[d] : 1));
        runs[d] = hp_malloc(sizeof(int64_t) * 3 * (size_t)(gs[d] ? gs[d] : 1));
        if (!idx || !runs[d]) {
            free(idx);
            s = HP_ERR_OOM;
            break;
        }
        int64_t cnt = gs[d];
        if (t->mesh) cnt = hp_layout_dim_indices(gs[d], d, t->mesh_ndim, ms, coord, t->placements, idx);
        else
            for (int64_t i = 0; i < cnt; i++) idx[i] = i;
        if (cnt != t->local.shape[d])
            s = hp_error(HP_ERR_INVALID_ARG, "DTensor: local size %lld on dim %d does not match its layout (%lld)",
                         (long long)t->local.shape[d], d, (long long)cnt);
        nruns[d] = 0;
        for (int64_t i = 0; i < cnt && s == HP_OK; i++) {
            int64_t *r = runs[d] + 3 * nruns[d];
            if (i > 0 && idx[i] == idx[i - 1] + 1) {
                runs[d][3 * (nruns[d] - 1) + 2]++;
            } else {
                r[0] = idx[i];
                r[1] = i;
                r[2] = 1;
                nruns[d]++;
            }
        }
        total *= nruns[d];
        free(idx);
    }
    if (s == HP_OK && total > (1 << 20))
        s = hp_error(HP_ERR_UNSUPPORTED, "DTensor layout splits into %lld boxes (at most 2^20 supported)", (long long)total);
    hp_dcp_box_t *b = s == HP_OK ? hp_calloc((size_t)total, sizeof *b) : NULL;
    if (s == HP_OK && !b) s = HP_ERR_OOM;
    for (int64_t k = 0; s == HP_OK && k < total; k++) {
        int64_t rem = k;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t j = rem % nruns[d];
            rem /= nruns[d];
            b[k].g[d] = runs[d][3 * j];
            b[k].l[d] = runs[d][3 * j + 1];
            b[k].s[d] = runs[d][3 * j + 2];
        }
    }
    for (int d = 0; d < nd; d++) free(runs[d]);
    if (s != HP_OK) {
        free(b);
        return s;
    }
    *out = b;
    *n = (int)total;
    return HP_OK;
}

/* ---- the save plan ------------------------------------------------------------------------
 * Each rank describes, per tensor, the boxes it holds (count, then offsets and sizes) and, per
 * blob, its size. The vectors are padded to the longest and all-gathered, so every rank has
 * every plan; the dedup rule (a box is written by the lowest rank holding an identical box) is
 * then evaluated identically everywhere and rank 0 has the whole metadata. */

static uint64_t state_hash(const hp_dcp_state_t *st) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < st->n_tensors; i++) {
        const hp_dcp_tensor_t *x = &st->tensors[i];
        h = fnv(h, x->name, strlen(x->name) + 1);
        int nd = tensor_ndim(x);
        h = fnv(h, &nd, sizeof nd);
        h = fnv(h, tensor_gshape(x), sizeof(int64_t) * (size_t)nd);
        hp_dtype_t dt = tensor_store_dtype(x);
        h = fnv(h, &dt, sizeof dt);
    }
    for (int i = 0; i < st->n_blobs; i++) {
        h = fnv(h, st->blobs[i].name, strlen(st->blobs[i].name) + 1);
        h = fnv(h, &st->blobs[i].per_rank, sizeof(int));
    }
    return h;
}

typedef struct plan {
    int world, rank, nt;
    size_t len;          /* padded per-rank length */
    int64_t *all;        /* world * len */
    size_t *pos;         /* world * nt: index of tensor i's block in rank r's plan */
    hp_dcp_box_t **mine; /* per tensor: this rank's boxes (with local offsets) */
    int *n_mine;
} plan_t;

static void plan_free(plan_t *p) {
    for (int i = 0; p->mine && i < p->nt; i++) free(p->mine[i]);
    free(p->mine);
    free(p->n_mine);
    free(p->all);
    free(p->pos);
    memset(p, 0, sizeof *p);
}

/* Rank r's boxes of tensor i: *n boxes of 2*nd int64 (offsets then sizes). */
static const int64_t *plan_boxes(const plan_t *p, int r, int i, int *n) {
    const int64_t *v = p->all + (size_t)r * p->len + p->pos[(size_t)r * (size_t)p->nt + (size_t)i];
    *n = (int)v[0];
    return v + 1;
}

static int64_t plan_blob_size(const plan_t *p, const hp_dcp_state_t *st, int r, int b) {
    size_t k = 2;
    if (st->n_tensors > 0) {
        int last = st->n_tensors - 1, nb;
        plan_boxes(p, r, last, &nb);
        k = p->pos[(size_t)r * (size_t)p->nt + (size_t)last] + 1 + (size_t)nb * 2 * (size_t)tensor_ndim(&st->tensors[last]);
    }
    return p->all[(size_t)r * p->len + k + (size_t)b];
}

/* The lowest rank holding a box identical to rank r's box b of tensor i. */
static int box_owner(const plan_t *p, int nd, int i, int r, int b) {
    int n;
    const int64_t *mine = plan_boxes(p, r, i, &n) + (size_t)b * 2 * (size_t)nd;
    for (int q = 0; q < r; q++) {
        int m;
        const int64_t *o = plan_boxes(p, q, i, &m);
        for (int k = 0; k < m; k++)
            if (!memcmp(o + (size_t)k * 2 * (size_t)nd, mine, sizeof(int64_t) * 2 * (size_t)nd)) return q;
    }
    return r;
}

static hp_status_t make_plan(const hp_dcp_state_t *st, hp_comm_t comm, plan_t *p) {
    memset(p, 0, sizeof *p);
    p->world = csize(comm);
    p->rank = crank(comm);
    p->nt = st->n_tensors;
    p->mine = hp_calloc((size_t)p->nt + 1, sizeof *p->mine);
    p->n_mine = hp_calloc((size_t)p->nt + 1, sizeof *p->n_mine);
    if (!p->mine || !p->n_mine) {
        plan_free(p);
        return HP_ERR_OOM;
    }
    hp_status_t s = HP_OK;
    size_t len = 2;
    for (int i = 0; i < p->nt && s == HP_OK; i++) {
        s = hp_dcp_local_boxes(st->tensors[i].t, &p->mine[i], &p->n_mine[i]);
        if (s != HP_OK) s = hp_error_prefix(s, "tensor '%s': ", st->tensors[i].name);
        len += 1 + (size_t)p->n_mine[i] * 2 * (size_t)tensor_ndim(&st->tensors[i]);
    }
    len += (size_t)st->n_blobs;
    s = hp_dcp_agree(comm, s, "checkpoint save: computing the boxes");
    int64_t *mine = NULL;
    if (s == HP_OK) {
        mine = hp_calloc(len, sizeof *mine);
        if (!mine) s = HP_ERR_OOM;
    }
    if (s == HP_OK) {
        size_t k = 0;
        mine[k++] = (int64_t)(state_hash(st) & 0x7fffffffffffffffull);
        mine[k++] = (int64_t)len;
        for (int i = 0; i < p->nt; i++) {
            int nd = tensor_ndim(&st->tensors[i]);
            mine[k++] = p->n_mine[i];
            for (int b = 0; b < p->n_mine[i]; b++) {
                for (int d = 0; d < nd; d++) mine[k++] = p->mine[i][b].g[d];
                for (int d = 0; d < nd; d++) mine[k++] = p->mine[i][b].s[d];
            }
        }
        for (int i = 0; i < st->n_blobs; i++) mine[k++] = (int64_t)st->blobs[i].size;
    }
    int64_t maxlen = (int64_t)len;
    if (s == HP_OK && comm && p->world > 1) {
        int64_t chk[2] = {mine[0], -mine[0]}, mx[2];
        s = hp_all_reduce(chk, mx, 2, HP_I64, HP_MAX, comm, NULL);
        if (s == HP_OK && mx[0] != -mx[1])
            s = hp_error(HP_ERR_INVALID_ARG, "checkpoint save: the state (names, global shapes, dtypes, blob "
                         "names) differs between ranks; every rank must pass the same entries in the same order");
        if (s == HP_OK) s = hp_all_reduce(&maxlen, &maxlen, 1, HP_I64, HP_MAX, comm, NULL);
    }
    if (s == HP_OK) {
        p->len = (size_t)maxlen;
        p->all = hp_calloc(p->len * (size_t)p->world, sizeof *p->all);
        p->pos = hp_calloc((size_t)p->world * (size_t)p->nt + 1, sizeof *p->pos);
        int64_t *padded = hp_calloc(p->len, sizeof *padded);
        if (!p->all || !p->pos || !padded) s = HP_ERR_OOM;
        if (s == HP_OK) {
            memcpy(padded, mine, len * sizeof *mine);
            if (comm && p->world > 1) s = hp_all_gather(padded, p->all, p->len, HP_I64, comm, NULL);
            else memcpy(p->all, padded, p->len * sizeof *padded);
        }
        free(padded);
    }
    free(mine);
    for (int r = 0; s == HP_OK && r < p->world; r++) {
        size_t k = 2;
        for (int i = 0; i < p->nt; i++) {
            p->pos[(size_t)r * (size_t)p->nt + (size_t)i] = k;
            int64_t nb = p->all[(size_t)r * p->len + k];
            k += 1 + (size_t)nb * 2 * (size_t)tensor_ndim(&st->tensors[i]);
            if (nb < 0 || k > p->len) s = hp_error(HP_ERR_COMM, "checkpoint save: rank %d sent a malformed plan", r);
        }
    }
    if (s != HP_OK) plan_free(p);
    return s;
}

static void rank_file(char *buf, size_t n, int r) { snprintf(buf, n, "__%d_0.safetensors", r); }
/* Key of a rank's box b of `nbox` in its file: the name, or name#b when it holds several. */
static void box_key(char *buf, size_t n, const char *name, int b, int nbox) {
    if (nbox == 1) snprintf(buf, n, "%s", name);
    else snprintf(buf, n, "%s#%d", name, b);
}

/* The metadata document on rank 0: the JSON tree plus, per chunk, which rank's file entry it
 * is (rank, index in that rank's entry order), so the checksums the writers compute can be
 * filled in at the commit, after every rank has written. */
typedef struct meta_ref {
    json_object *chunk;
    int rank, idx;
} meta_ref_t;
typedef struct meta_doc {
    json_object *root;
    meta_ref_t *refs;
    int n_refs;
} meta_doc_t;

static void meta_doc_free(meta_doc_t *d) {
    if (!d) return;
    json_object_put(d->root);
    free(d->refs);
    free(d);
}

/* Adds "xxh3" (16 hex digits) to every chunk from the gathered hashes (world rows of len:
 * the rank's count, then its hashes) and serialises the document. */
static hp_status_t meta_doc_finish(const meta_doc_t *d, const int64_t *all, size_t len, int world, char **out) {
    for (int i = 0; i < d->n_refs; i++) {
        const meta_ref_t *r = &d->refs[i];
        const int64_t sent = r->rank < world ? all[(size_t)r->rank * len] : 0;
        if (r->rank >= world || r->idx < 0 || r->idx >= sent)
            return hp_error(HP_ERR_COMM, "checkpoint commit: rank %d sent %lld checksums, chunk %d needs entry %d",
                            r->rank, (long long)sent, i, r->idx);
        char hex[24];
        snprintf(hex, sizeof hex, "%016llx",
                 (unsigned long long)(uint64_t)all[(size_t)r->rank * len + 1 + (size_t)r->idx]);
        json_object_object_add(r->chunk, "xxh3", json_object_new_string(hex));
    }
    const char *txt = json_object_to_json_string_ext(d->root, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
                                                                 JSON_C_TO_STRING_NOSLASHESCAPE);
    *out = txt ? strdup(txt) : NULL;
    return *out ? HP_OK : hp_error(HP_ERR_OOM, "checkpoint metadata: out of memory");
}

static void meta_ref_add(meta_doc_t *d, int cap, json_object *c, int rank, int *counter) {
    HP_ASSERT(d->n_refs < cap);
    d->refs[d->n_refs++] = (meta_ref_t){c, rank, counter[rank]++};
}

/* Metadata JSON built on rank 0 from the gathered plans. */
static hp_status_t build_metadata(const hp_dcp_state_t *st, const plan_t *p, int64_t step, meta_doc_t **out) {
    *out = NULL;
    int cap = st->n_blobs * p->world + 1;
    for (int i = 0; i < st->n_tensors; i++)
        for (int r = 0; r < p->world; r++) {
            int nb;
            plan_boxes(p, r, i, &nb);
            cap += nb;
        }
    meta_doc_t *doc = hp_calloc(1, sizeof *doc);
    int *counter = hp_calloc((size_t)p->world, sizeof *counter);
    if (doc) doc->refs = hp_calloc((size_t)cap, sizeof *doc->refs);
    if (!doc || !counter || !doc->refs) {
        if (doc) free(doc->refs);
        free(doc);
        free(counter);
        return hp_error(HP_ERR_OOM, "checkpoint metadata: out of memory");
    }
    json_object *root = json_object_new_object();
    json_object_object_add(root, "magic", json_object_new_string(HP_DCP_MAGIC));
    json_object_object_add(root, "version", json_object_new_int(HP_DCP_VERSION));
    json_object_object_add(root, "world_size", json_object_new_int(p->world));
    json_object_object_add(root, "step", json_object_new_int64(step));
    json_object *tens = json_object_new_object();
    for (int i = 0; i < st->n_tensors; i++) {
        const hp_dcp_tensor_t *x = &st->tensors[i];
        int nd = tensor_ndim(x);
        json_object *e = json_object_new_object();
        json_object_object_add(e, "dtype", json_object_new_string(hp_st_dtype_name(hp_st_dtype_from_hp(tensor_store_dtype(x)))));
        json_object *shape = json_object_new_array();
        for (int d = 0; d < nd; d++) json_object_array_add(shape, json_object_new_int64(tensor_gshape(x)[d]));
        json_object_object_add(e, "shape", shape);
        json_object *chunks = json_object_new_array();
        for (int r = 0; r < p->world; r++) {
            int nb;
            const int64_t *bx = plan_boxes(p, r, i, &nb);
            for (int b = 0; b < nb; b++) {
                if (box_owner(p, nd, i, r, b) != r) continue;
                const int64_t *v = bx + (size_t)b * 2 * (size_t)nd;
                json_object *c = json_object_new_object();
                json_object *o = json_object_new_array(), *s = json_object_new_array();
                for (int d = 0; d < nd; d++) {
                    json_object_array_add(o, json_object_new_int64(v[d]));
                    json_object_array_add(s, json_object_new_int64(v[nd + d]));
                }
                json_object_object_add(c, "offsets", o);
                json_object_object_add(c, "sizes", s);
                char fn[64], key[HP_ST_MAX_NAME + 16];
                rank_file(fn, sizeof fn, r);
                box_key(key, sizeof key, x->name, b, nb);
                json_object_object_add(c, "file", json_object_new_string(fn));
                json_object_object_add(c, "key", json_object_new_string(key));
                json_object_object_add(c, "rank", json_object_new_int(r));
                json_object_array_add(chunks, c);
                meta_ref_add(doc, cap, c, r, counter);
            }
        }
        json_object_object_add(e, "chunks", chunks);
        json_object_object_add(tens, x->name, e);
    }
    json_object_object_add(root, "tensors", tens);
    json_object *blobs = json_object_new_object();
    for (int i = 0; i < st->n_blobs; i++) {
        const hp_dcp_blob_t *b = &st->blobs[i];
        json_object *e = json_object_new_object();
        json_object_object_add(e, "per_rank", json_object_new_boolean(b->per_rank));
        json_object *chunks = json_object_new_array();
        for (int r = 0; r < (b->per_rank ? p->world : 1); r++) {
            json_object *c = json_object_new_object();
            char fn[64];
            rank_file(fn, sizeof fn, r);
            json_object_object_add(c, "rank", json_object_new_int(r));
            json_object_object_add(c, "file", json_object_new_string(fn));
            json_object_object_add(c, "key", json_object_new_string(b->name));
            json_object_object_add(c, "size", json_object_new_int64(plan_blob_size(p, st, r, i)));
            json_object_array_add(chunks, c);
            meta_ref_add(doc, cap, c, r, counter);
        }
        json_object_object_add(e, "chunks", chunks);
        json_object_object_add(blobs, b->name, e);
    }
    json_object_object_add(root, "blobs", blobs);
    free(counter);
    doc->root = root;
    *out = doc;
    return HP_OK;
}

/* ---- writing one rank's file ------------------------------------------------------------- */

typedef struct write_job {
    char path[4096];
    hp_st_entry_t *entries;
    hp_tensor_t *views;
    int n, cap;
    int64_t (*shapes)[HP_MAX_DIMS];
    char **names;
    uint64_t *hashes;    /* XXH3-64 of each entry's stored bytes, set by run_job */
} write_job_t;

static void job_free(write_job_t *j) {
    free(j->entries);
    free(j->views);
    free(j->shapes);
    free(j->hashes);
    if (j->names)
        for (int i = 0; i < j->n; i++) free(j->names[i]);
    free(j->names);
    memset(j, 0, sizeof *j);
}

/* Whether this rank writes its box b of tensor i. */
static int owns(const plan_t *p, const hp_dcp_state_t *st, int i, int b) {
    return box_owner(p, tensor_ndim(&st->tensors[i]), i, p->rank, b) == p->rank;
}

static size_t staged_bytes(const hp_dcp_state_t *st, const plan_t *p) {
    size_t n = 0;
    for (int i = 0; i < st->n_tensors; i++)
        for (int b = 0; b < p->n_mine[i]; b++) {
            if (!owns(p, st, i, b)) continue;
            int64_t v = 1;
            for (int d = 0; d < tensor_ndim(&st->tensors[i]); d++) v *= p->mine[i][b].s[d];
            n += (size_t)v * hp_dtype_size(tensor_store_dtype(&st->tensors[i])) + 64;
        }
    for (int i = 0; i < st->n_blobs; i++)
        if (st->blobs[i].per_rank || p->rank == 0) n += st->blobs[i].size + 64;
    return n;
}

/* Entries for the boxes this rank owns. staging == NULL: entries are views of the live tensors
 * (sync save; the safetensors writer handles strides and the float cast); otherwise the data
 * is copied (and cast) into staging, which must hold staged_bytes(). */
static hp_status_t build_job(const hp_dcp_state_t *st, const plan_t *p, const char *tmpdir, unsigned char *staging,
                             write_job_t *j) {
    memset(j, 0, sizeof *j);
    char fn[64];
    rank_file(fn, sizeof fn, p->rank);
    snprintf(j->path, sizeof j->path, "%s/%s", tmpdir, fn);
    int cap = st->n_blobs + 1;
    for (int i = 0; i < st->n_tensors; i++) cap += p->n_mine[i];
    j->cap = cap;
    j->entries = hp_calloc((size_t)cap, sizeof *j->entries);
    j->views = hp_calloc((size_t)cap, sizeof *j->views);
    j->shapes = hp_calloc((size_t)cap, sizeof *j->shapes);
    j->names = hp_calloc((size_t)cap, sizeof *j->names);
    j->hashes = hp_calloc((size_t)cap, sizeof *j->hashes);
    if (!j->entries || !j->views || !j->shapes || !j->names || !j->hashes) {
        job_free(j);
        return HP_ERR_OOM;
    }
    size_t off = 0;
    for (int i = 0; i < st->n_tensors; i++) {
        const hp_dcp_tensor_t *x = &st->tensors[i];
        int nd = tensor_ndim(x);
        for (int b = 0; b < p->n_mine[i]; b++) {
            if (!owns(p, st, i, b)) continue;
            const hp_dcp_box_t *bx = &p->mine[i][b];
            hp_tensor_t *v = &j->views[j->n];
            *v = x->t->local;
            for (int d = 0; d < nd; d++) HP_TRY(hp_tensor_narrow(v, v, d, bx->l[d], bx->s[d]));
            hp_st_entry_t *e = &j->entries[j->n];
            char key[HP_ST_MAX_NAME + 16];
            box_key(key, sizeof key, x->name, b, p->n_mine[i]);
            j->names[j->n] = strdup(key);
            if (!j->names[j->n]) return HP_ERR_OOM;
            e->name = j->names[j->n];
            hp_dtype_t sdt = tensor_store_dtype(x);
            e->dtype = hp_st_dtype_from_hp(sdt);
            if (!staging) {
                e->tensor = v;
            } else {
                hp_tensor_t dst;
                HP_TRY(hp_tensor_init(&dst, sdt, nd, v->shape, staging + off));
                HP_TRY(hp_tensor_copy(&dst, v));   /* copies and casts, any strides */
                e->tensor = NULL;
                e->raw = staging + off;
                e->ndim = nd;
                memcpy(j->shapes[j->n], v->shape, sizeof(int64_t) * (size_t)nd);
                e->shape = j->shapes[j->n];
                off += ((size_t)hp_tensor_numel(&dst) * hp_dtype_size(sdt) + 63) & ~(size_t)63;
            }
            j->n++;
        }
    }
    for (int i = 0; i < st->n_blobs; i++) {
        const hp_dcp_blob_t *b = &st->blobs[i];
        if (!b->per_rank && p->rank != 0) continue;
        hp_st_entry_t *e = &j->entries[j->n];
        j->names[j->n] = strdup(b->name);
        if (!j->names[j->n]) return HP_ERR_OOM;
        e->name = j->names[j->n];
        e->dtype = HP_ST_U8;
        e->ndim = 1;
        j->shapes[j->n][0] = (int64_t)b->size;
        e->shape = j->shapes[j->n];
        if (staging) {
            if (b->size) memcpy(staging + off, b->data, b->size);
            e->raw = staging + off;
            off += (b->size + 63) & ~(size_t)63;
        } else {
            e->raw = b->data ? b->data : (const void *)"";
        }
        j->n++;
    }
    return HP_OK;
}

static hp_status_t run_job(const write_job_t *j) {
    const char *meta[4] = {"format", "hyperparallel-dcp", "dcp_version", "1"};
    return hp_safetensors_write_hashed(j->path, j->entries, j->n, meta, 2, j->hashes);
}

/* ---- commit ------------------------------------------------------------------------------- */

/* Rank 0: metadata last (atomic write: fsync of it and of tmpdir), then tmpdir replaces dir (an
 * older dir of the same name, from re-saving a step, is moved aside and dropped after). */
static hp_status_t commit_rank0(const char *tmpdir, const char *dir, const char *meta) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", tmpdir, HP_DCP_METADATA_FILE);
    HP_TRY(hp_file_write_atomic(path, meta, strlen(meta)));
    return hp_file_replace_dir(tmpdir, dir);
}

static int64_t step_of_dir(const char *dir) {
    const char *b = strrchr(dir, '/');
    b = b ? b + 1 : dir;
    long long v;
    char tail;
    if (sscanf(b, "step-%lld%c", &v, &tail) == 1) return v;
    return -1;
}

/* Collective: agrees on a temporary directory name (token from rank 0) and creates it. */
static hp_status_t prepare_tmpdir(const char *dir, hp_comm_t comm, char *tmpdir, size_t n) {
    int64_t token = 0;
    if (crank(comm) == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        token = ((int64_t)getpid() << 20) ^ (int64_t)ts.tv_nsec ^ ((int64_t)ts.tv_sec << 32);
        if (token < 0) token = -token;
    }
    if (comm && csize(comm) > 1) HP_TRY(hp_broadcast(&token, 1, HP_I64, 0, comm, NULL));
    snprintf(tmpdir, n, "%s.tmp-%llx", dir, (unsigned long long)token);
    hp_status_t s = HP_OK;
    if (crank(comm) == 0) s = hp_file_mkdirs(tmpdir);
    s = hp_dcp_agree(comm, s, "checkpoint: creating the temporary directory");
    return s;
}

/* ---- interruption ------------------------------------------------------------------------ */

static volatile sig_atomic_t interrupt_sig;

void hp_dcp_interrupt(int sig) { interrupt_sig = sig ? sig : -1; }
int hp_dcp_interrupted(void) { return (int)interrupt_sig; }

/* Collective after every rank has written (local status s, this rank's entry checksums):
 * agree; learn whether any rank was interrupted and the longest checksum list (one
 * all-reduce); gather the checksums; rank 0 completes the metadata and commits; agree. A
 * signal does not cost a save whose files are all written: the commit (a rename) still
 * runs, and every rank learns of the signal so the trainer stops after this step. A save
 * that failed while a signal was pending is abandoned and its temporary directory removed. */
static hp_status_t finish_save(const char *tmpdir, const char *dir, const meta_doc_t *meta, hp_comm_t comm,
                               hp_status_t s, const uint64_t *hashes, int nh) {
    s = hp_dcp_agree(comm, s, "checkpoint: writing the rank files");
    int64_t v[2] = {hp_dcp_interrupted(), nh}, mx[2] = {v[0], v[1]};
    hp_status_t cs = HP_OK;
    if (comm && csize(comm) > 1) cs = hp_all_reduce(v, mx, 2, HP_I64, HP_MAX, comm, NULL);
    if (cs != HP_OK) return cs;
    if (mx[0] != 0) hp_dcp_interrupt((int)mx[0]);   /* every rank learns it, also those the signal has not reached yet */
    if (s != HP_OK && mx[0] != 0) {
        if (crank(comm) == 0) {
            hp_status_t r = hp_file_rmtree(tmpdir);
            hp_log(HP_LOG_WARN, "checkpoint %s abandoned after signal %lld; %s %s", dir, (long long)mx[0],
                   r == HP_OK ? "removed the partial" : "could not remove the partial", tmpdir);
        }
        return hp_error(s, "checkpoint %s: interrupted by signal %lld during a failed save; not committed (the "
                        "previous checkpoint is unchanged): %s", dir, (long long)mx[0], hp_last_error());
    }
    if (s != HP_OK) {
        if (crank(comm) == 0) hp_log(HP_LOG_WARN, "checkpoint %s not committed; leaving partial %s", dir, tmpdir);
        return s;
    }
    size_t len = (size_t)(mx[1] > 0 ? mx[1] : 0) + 1;   /* the count, then the hashes */
    int world = csize(comm);
    int64_t *mine = hp_calloc(len, sizeof *mine), *all = hp_calloc(len * (size_t)world, sizeof *all);
    hp_status_t c = mine && all ? HP_OK : hp_error(HP_ERR_OOM, "checkpoint commit: no memory for the checksums");
    if (c == HP_OK) {
        mine[0] = nh;
        for (int i = 0; i < nh; i++) mine[1 + i] = (int64_t)hashes[i];
        if (comm && world > 1) c = hp_all_gather(mine, all, len, HP_I64, comm, NULL);
        else memcpy(all, mine, len * sizeof *mine);
    }
    c = hp_dcp_agree(comm, c, "checkpoint: gathering the checksums");
    char *txt = NULL;
    if (c == HP_OK && crank(comm) == 0) {
        c = meta_doc_finish(meta, all, len, world, &txt);
        if (c == HP_OK) c = commit_rank0(tmpdir, dir, txt);
    }
    free(txt);
    free(mine);
    free(all);
    return hp_dcp_agree(comm, c, "checkpoint: committing the metadata");
}

/* Test hook: HP_DCP_TEST_SIGNAL_STEP=N makes rank 0 raise SIGTERM after writing its file of
 * step-N, so a test can interrupt a save deterministically (tests/test_train_signal.c). */
static void test_signal_hook(const char *dir, int rank) {
    const char *e = getenv("HP_DCP_TEST_SIGNAL_STEP");
    if (e && *e && rank == 0 && atoll(e) == step_of_dir(dir)) raise(SIGTERM);
}

hp_status_t hp_dcp_save(const char *dir, const hp_dcp_state_t *st, hp_comm_t comm) {
    hp_status_t s = hp_dcp_agree(comm, check_state(st), "checkpoint save: checking the state");
    HP_TRY(s);
    plan_t p;
    HP_TRY(make_plan(st, comm, &p));
    char tmpdir[4200];
    s = prepare_tmpdir(dir, comm, tmpdir, sizeof tmpdir);
    meta_doc_t *meta = NULL;
    if (s == HP_OK) {
        hp_status_t w = HP_OK;
        if (p.rank == 0) w = build_metadata(st, &p, step_of_dir(dir), &meta);
        write_job_t j;
        memset(&j, 0, sizeof j);
        if (w == HP_OK) w = build_job(st, &p, tmpdir, NULL, &j);
        if (w == HP_OK) w = run_job(&j);
        if (w == HP_OK) test_signal_hook(dir, p.rank);
        s = finish_save(tmpdir, dir, meta, comm, w, j.hashes, w == HP_OK ? j.n : 0);
        job_free(&j);
    }
    meta_doc_free(meta);
    plan_free(&p);
    return s;
}

/* ---- async ---------------------------------------------------------------------------------- */

struct hp_dcp_saver {
    hp_comm_t comm;
    unsigned char *staging;
    size_t staging_cap;
    pthread_t thread;
    int pending, threaded;
    atomic_int done;
    hp_status_t status;
    char message[1024];
    write_job_t job;
    char dir[4096], tmpdir[4200];
    meta_doc_t *meta;
};

hp_status_t hp_dcp_saver_create(hp_comm_t comm, hp_dcp_saver_t *out) {
    hp_dcp_saver_t s = hp_calloc(1, sizeof *s);
    if (!s) return HP_ERR_OOM;
    s->comm = comm;
    *out = s;
    return HP_OK;
}

int hp_dcp_saver_pending(hp_dcp_saver_t s) { return s->pending; }
size_t hp_dcp_saver_staging_bytes(hp_dcp_saver_t s) { return s->staging_cap; }

/* Test hook: HP_DCP_TEST_WRITE_DELAY_MS=D holds every async save in flight D ms before its
 * writer starts, so that a test can fail a host while a save is running
 * (tests/test_multihost_failure.c). */
static void test_write_delay(void) {
    const char *e = getenv("HP_DCP_TEST_WRITE_DELAY_MS");
    long ms = e && *e ? atol(e) : 0;
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {}
    }
}

static void *writer_main(void *arg) {
    hp_dcp_saver_t s = arg;
    test_write_delay();
    s->status = run_job(&s->job);
    if (s->status != HP_OK) snprintf(s->message, sizeof s->message, "%s", hp_last_error());
    atomic_store(&s->done, 1);
    return NULL;
}

static hp_status_t saver_complete(hp_dcp_saver_t s) {
    if (s->threaded) pthread_join(s->thread, NULL);
    hp_status_t w = s->status;
    if (w != HP_OK) w = hp_error(w, "async checkpoint %s: %s", s->dir, s->message);
    hp_status_t r = finish_save(s->tmpdir, s->dir, s->meta, s->comm, w, s->job.hashes, w == HP_OK ? s->job.n : 0);
    job_free(&s->job);
    meta_doc_free(s->meta);
    s->meta = NULL;
    s->pending = 0;
    return r;
}

hp_status_t hp_dcp_saver_poll(hp_dcp_saver_t s, int *committed) {
    if (committed) *committed = 0;
    /* every rank must take the same decision: one all-reduce (max) of (pending, not done) */
    int64_t v[2] = {s->pending, s->pending && !atomic_load(&s->done)}, r[2] = {v[0], v[1]};
    if (s->comm && csize(s->comm) > 1) HP_TRY(hp_all_reduce(v, r, 2, HP_I64, HP_MAX, s->comm, NULL));
    if (!r[0] || r[1]) return HP_OK;
    hp_status_t st = saver_complete(s);
    if (st == HP_OK && committed) *committed = 1;
    return st;
}

hp_status_t hp_dcp_saver_wait(hp_dcp_saver_t s) {
    int64_t pend = s->pending, anyp = pend;
    if (s->comm && csize(s->comm) > 1) HP_TRY(hp_all_reduce(&pend, &anyp, 1, HP_I64, HP_MAX, s->comm, NULL));
    if (!anyp) return HP_OK;
    return saver_complete(s);
}

hp_status_t hp_dcp_saver_save(hp_dcp_saver_t s, const char *dir, const hp_dcp_state_t *st) {
    HP_TRY(hp_dcp_saver_wait(s));
    HP_TRY(hp_dcp_agree(s->comm, check_state(st), "async checkpoint save: checking the state"));
    plan_t p;
    HP_TRY(make_plan(st, s->comm, &p));
    hp_status_t r = prepare_tmpdir(dir, s->comm, s->tmpdir, sizeof s->tmpdir);
    hp_status_t w = HP_OK;
    if (r == HP_OK) {
        size_t need = staged_bytes(st, &p);
        if (need > s->staging_cap) {
            /* grown once to the largest state seen, then reused */
            hp_free_aligned(s->staging);
            s->staging = hp_aligned_alloc(need);
            s->staging_cap = s->staging ? need : 0;
            if (!s->staging) w = hp_error(HP_ERR_OOM, "async checkpoint: cannot allocate %zu staging bytes", need);
        }
        if (w == HP_OK && p.rank == 0) w = build_metadata(st, &p, step_of_dir(dir), &s->meta);
        if (w == HP_OK) w = build_job(st, &p, s->tmpdir, s->staging, &s->job);
        w = hp_dcp_agree(s->comm, w, "async checkpoint: staging");
        if (w == HP_OK) {
            snprintf(s->dir, sizeof s->dir, "%s", dir);
            atomic_store(&s->done, 0);
            s->status = HP_OK;
            s->message[0] = '\0';
            s->threaded = pthread_create(&s->thread, NULL, writer_main, s) == 0;
            if (!s->threaded) writer_main(s);   /* no thread: write here so the save still happens */
            s->pending = 1;
        } else {
            job_free(&s->job);
            meta_doc_free(s->meta);
            s->meta = NULL;
        }
        r = w;
    }
    plan_free(&p);
    return r;
}

hp_status_t hp_dcp_saver_destroy(hp_dcp_saver_t s) {
    if (!s) return HP_OK;
    hp_status_t r = hp_dcp_saver_wait(s);
    hp_free_aligned(s->staging);
    free(s);
    return r;
}
