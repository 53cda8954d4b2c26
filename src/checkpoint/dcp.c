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

/* Every rank returns the worst status; a failing rank's message is kept there, the others
 * get a message saying which rank failed. */
hp_status_t hp_dcp_agree(hp_comm_t comm, hp_status_t s, const char *what) {
    if (!comm || csize(comm) == 1) return s;
    int64_t v[2] = {(int64_t)s, s != HP_OK ? (int64_t)crank(comm) : INT64_MAX};
    int64_t mx = v[0], mn = v[1];
    hp_status_t cs = hp_all_reduce(&v[0], &mx, 1, HP_I64, HP_MAX, comm, NULL);
    if (cs == HP_OK) cs = hp_all_reduce(&v[1], &mn, 1, HP_I64, HP_MIN, comm, NULL);
    if (cs != HP_OK) return cs;
    if (s != HP_OK) return s;
    if (mx != HP_OK)
        return hp_error((hp_status_t)mx, "%s failed on rank %lld (see that rank's log)", what, (long long)mn);
    return HP_OK;
}

hp_status_t hp_dcp_fsync_path(const char *path, int is_dir) {
    int fd = open(path, is_dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
    if (fd < 0) return hp_error(HP_ERR_IO, "%s: cannot open for fsync: %s", path, strerror(errno));
    int r = fsync(fd);
    int e = errno;
    close(fd);
    if (r != 0) return hp_error(HP_ERR_IO, "%s: fsync failed: %s", path, strerror(e));
    return HP_OK;
}

hp_status_t hp_dcp_mkdirs(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return hp_error(HP_ERR_INVALID_ARG, "directory path '%s' is empty or too long", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return hp_error(HP_ERR_IO, "cannot create directory %s: %s (check permissions and the path)",
                                buf, strerror(errno));
            buf[i] = c;
        }
    }
    return HP_OK;
}

hp_status_t hp_dcp_rmtree(const char *path) {
    DIR *d = opendir(path);
    if (!d) {
        if (errno == ENOENT) return HP_OK;
        if (unlink(path) == 0) return HP_OK;
        return hp_error(HP_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
    }
    struct dirent *e;
    hp_status_t s = HP_OK;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        struct stat sb;
        if (lstat(sub, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            hp_status_t r = hp_dcp_rmtree(sub);
            if (s == HP_OK) s = r;
        } else if (unlink(sub) != 0 && s == HP_OK) {
            s = hp_error(HP_ERR_IO, "cannot remove %s: %s", sub, strerror(errno));
        }
    }
    closedir(d);
    if (rmdir(path) != 0 && s == HP_OK) s = hp_error(HP_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
    return s;
}

static void parent_of(const char *path, char *out, size_t n) {
    snprintf(out, n, "%s", path);
    size_t l = strlen(out);
    while (l > 1 && out[l - 1] == '/') out[--l] = '\0';
    char *slash = strrchr(out, '/');
    if (!slash) snprintf(out, n, ".");
    else if (slash == out) out[1] = '\0';
    else *slash = '\0';
}

/* ---- the save plan ------------------------------------------------------------------------
 * Each rank describes, per tensor, the box it holds (flag, offsets, sizes) and, per blob, its
 * size. The vectors have the same length on every rank (checked), so one all-gather gives
 * every rank every plan; the dedup rule (lowest rank holding an identical box writes it) is
 * then evaluated identically everywhere and rank 0 has the whole metadata. */

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
        if (x->t->mesh) {
            int64_t ms[HP_MESH_MAX_DIMS];
            for (int d = 0; d < x->t->mesh_ndim; d++) ms[d] = hp_mesh_size(x->t->mesh, d);
            if (!hp_layout_is_box(x->t->mesh_ndim, ms, x->t->placements))
                return hp_error(HP_ERR_UNSUPPORTED,
                                "tensor '%s': its layout (StridedShard with split factor > 1) is not one box "
                                "per rank; redistribute to Shard/Replicate placements before saving", x->name);
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

static size_t plan_len(const hp_dcp_state_t *st) {
    size_t n = 1;
    for (int i = 0; i < st->n_tensors; i++) n += 1 + 2 * (size_t)tensor_ndim(&st->tensors[i]);
    return n + (size_t)st->n_blobs;
}

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

static void local_plan(const hp_dcp_state_t *st, int64_t *v) {
    size_t k = 0;
    v[k++] = (int64_t)(state_hash(st) & 0x7fffffffffffffffull);
    for (int i = 0; i < st->n_tensors; i++) {
        const hp_dcp_tensor_t *x = &st->tensors[i];
        int nd = tensor_ndim(x);
        int64_t off[HP_MAX_DIMS];
        int in = 1;
        if (x->t->mesh) {
            in = hp_mesh_contains_self(x->t->mesh);
            if (in) hp_dtensor_global_offset(x->t, off);
        } else {
            for (int d = 0; d < nd; d++) off[d] = 0;
        }
        int64_t numel = hp_tensor_numel(&x->t->local);
        v[k++] = (in && numel > 0) ? 1 : 0;
        for (int d = 0; d < nd; d++) v[k++] = in ? off[d] : 0;
        for (int d = 0; d < nd; d++) v[k++] = in ? x->t->local.shape[d] : 0;
    }
    for (int i = 0; i < st->n_blobs; i++) v[k++] = (int64_t)st->blobs[i].size;
}

typedef struct plan {
    int world, rank;
    size_t len;
    int64_t *all;     /* world * len */
    /* per tensor: owner of this rank's box (1 = this rank writes it) */
    unsigned char *write_tensor;
} plan_t;

static void plan_free(plan_t *p) {
    free(p->all);
    free(p->write_tensor);
    memset(p, 0, sizeof *p);
}

static const int64_t *plan_tensor(const plan_t *p, const hp_dcp_state_t *st, int r, int i) {
    const int64_t *v = p->all + (size_t)r * p->len + 1;
    for (int j = 0; j < i; j++) v += 1 + 2 * tensor_ndim(&st->tensors[j]);
    return v;
}

/* The lowest rank whose box for tensor i equals rank r's. */
static int box_owner(const plan_t *p, const hp_dcp_state_t *st, int i, int r) {
    int nd = tensor_ndim(&st->tensors[i]);
    const int64_t *b = plan_tensor(p, st, r, i);
    for (int q = 0; q < r; q++) {
        const int64_t *c = plan_tensor(p, st, q, i);
        if (c[0] && !memcmp(b, c, sizeof(int64_t) * (size_t)(1 + 2 * nd))) return q;
    }
    return r;
}

static hp_status_t make_plan(const hp_dcp_state_t *st, hp_comm_t comm, plan_t *p) {
    memset(p, 0, sizeof *p);
    p->world = csize(comm);
    p->rank = crank(comm);
    p->len = plan_len(st);
    int64_t *mine = hp_malloc(sizeof(int64_t) * p->len);
    p->all = hp_malloc(sizeof(int64_t) * p->len * (size_t)p->world);
    p->write_tensor = hp_calloc((size_t)st->n_tensors + 1, 1);
    if (!mine || !p->all || !p->write_tensor) {
        free(mine);
        plan_free(p);
        return HP_ERR_OOM;
    }
    local_plan(st, mine);
    if (comm && p->world > 1) {
        int64_t chk[2] = {mine[0], (int64_t)p->len}, mn[2], mx[2];
        hp_status_t s = hp_all_reduce(chk, mn, 2, HP_I64, HP_MIN, comm, NULL);
        if (s == HP_OK) s = hp_all_reduce(chk, mx, 2, HP_I64, HP_MAX, comm, NULL);
        if (s == HP_OK && (mn[0] != mx[0] || mn[1] != mx[1]))
            s = hp_error(HP_ERR_INVALID_ARG, "checkpoint save: the state (names, global shapes, dtypes, blob "
                         "names) differs between ranks; every rank must pass the same entries in the same order");
        if (s == HP_OK) s = hp_all_gather(mine, p->all, p->len, HP_I64, comm, NULL);
        free(mine);
        if (s != HP_OK) {
            plan_free(p);
            return s;
        }
    } else {
        memcpy(p->all, mine, sizeof(int64_t) * p->len);
        free(mine);
    }
    for (int i = 0; i < st->n_tensors; i++) {
        const int64_t *b = plan_tensor(p, st, p->rank, i);
        p->write_tensor[i] = b[0] && box_owner(p, st, i, p->rank) == p->rank;
    }
    return HP_OK;
}

static void rank_file(char *buf, size_t n, int r) { snprintf(buf, n, "__%d_0.safetensors", r); }

/* Metadata JSON built on rank 0 from the gathered plans. */
static hp_status_t build_metadata(const hp_dcp_state_t *st, const plan_t *p, int64_t step, char **out) {
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
            const int64_t *b = plan_tensor(p, st, r, i);
            if (!b[0] || box_owner(p, st, i, r) != r) continue;
            json_object *c = json_object_new_object();
            json_object *o = json_object_new_array(), *s = json_object_new_array();
            for (int d = 0; d < nd; d++) {
                json_object_array_add(o, json_object_new_int64(b[1 + d]));
                json_object_array_add(s, json_object_new_int64(b[1 + nd + d]));
            }
            json_object_object_add(c, "offsets", o);
            json_object_object_add(c, "sizes", s);
            char fn[64];
            rank_file(fn, sizeof fn, r);
            json_object_object_add(c, "file", json_object_new_string(fn));
            json_object_object_add(c, "key", json_object_new_string(x->name));
            json_object_object_add(c, "rank", json_object_new_int(r));
            json_object_array_add(chunks, c);
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
            json_object_object_add(c, "size", json_object_new_int64(p->all[(size_t)r * p->len + p->len - (size_t)st->n_blobs + (size_t)i]));
            json_object_array_add(chunks, c);
        }
        json_object_object_add(e, "chunks", chunks);
        json_object_object_add(blobs, b->name, e);
    }
    json_object_object_add(root, "blobs", blobs);
    const char *txt = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE);
    *out = txt ? strdup(txt) : NULL;
    json_object_put(root);
    return *out ? HP_OK : hp_error(HP_ERR_OOM, "checkpoint metadata: out of memory");
}

/* ---- writing one rank's file ------------------------------------------------------------- */

typedef struct write_job {
    char path[4096];
    hp_st_entry_t *entries;
    int n;
    int64_t (*shapes)[HP_MAX_DIMS];
    char **names;
} write_job_t;

static void job_free(write_job_t *j) {
    free(j->entries);
    free(j->shapes);
    if (j->names)
        for (int i = 0; i < j->n; i++) free(j->names[i]);
    free(j->names);
    memset(j, 0, sizeof *j);
}

/* Entries for the chunks this rank owns. staging == NULL: entries point at the live tensors
 * (sync save); otherwise the data is copied (and cast) into staging, which must hold
 * staged_bytes(). */
static size_t staged_bytes(const hp_dcp_state_t *st, const plan_t *p) {
    size_t n = 0;
    for (int i = 0; i < st->n_tensors; i++)
        if (p->write_tensor[i])
            n += (size_t)hp_tensor_numel(&st->tensors[i].t->local) * hp_dtype_size(tensor_store_dtype(&st->tensors[i])) + 64;
    for (int i = 0; i < st->n_blobs; i++)
        if (st->blobs[i].per_rank || p->rank == 0) n += st->blobs[i].size + 64;
    return n;
}

static hp_status_t build_job(const hp_dcp_state_t *st, const plan_t *p, const char *tmpdir, unsigned char *staging,
                             write_job_t *j) {
    memset(j, 0, sizeof *j);
    char fn[64];
    rank_file(fn, sizeof fn, p->rank);
    snprintf(j->path, sizeof j->path, "%s/%s", tmpdir, fn);
    int cap = st->n_tensors + st->n_blobs + 1;
    j->entries = hp_calloc((size_t)cap, sizeof *j->entries);
    j->shapes = hp_calloc((size_t)cap, sizeof *j->shapes);
    j->names = hp_calloc((size_t)cap, sizeof *j->names);
    if (!j->entries || !j->shapes || !j->names) {
        job_free(j);
        return HP_ERR_OOM;
    }
    size_t off = 0;
    for (int i = 0; i < st->n_tensors; i++) {
        if (!p->write_tensor[i]) continue;
        const hp_dcp_tensor_t *x = &st->tensors[i];
        hp_st_entry_t *e = &j->entries[j->n];
        j->names[j->n] = strdup(x->name);
        e->name = j->names[j->n];
        hp_dtype_t sdt = tensor_store_dtype(x);
        if (!staging) {
            e->tensor = &x->t->local;
            e->dtype = hp_st_dtype_from_hp(sdt);
        } else {
            hp_tensor_t dst;
            HP_TRY(hp_tensor_init(&dst, sdt, x->t->local.ndim, x->t->local.shape, staging + off));
            if (sdt == x->t->local.dtype) {
                HP_TRY(hp_tensor_copy(&dst, &x->t->local));
            } else {
                /* cast through a contiguous view when possible (the master weights are) */
                HP_ASSERT_MSG(hp_tensor_is_contiguous(&x->t->local), "tensor '%s': casting save needs a contiguous "
                              "local tensor", x->name);
                hp_convert(dst.data, sdt, x->t->local.data, x->t->local.dtype, (size_t)hp_tensor_numel(&dst));
            }
            e->tensor = NULL;
            e->raw = staging + off;
            e->dtype = hp_st_dtype_from_hp(sdt);
            e->ndim = x->t->local.ndim;
            memcpy(j->shapes[j->n], x->t->local.shape, sizeof(int64_t) * (size_t)e->ndim);
            e->shape = j->shapes[j->n];
            off += ((size_t)hp_tensor_numel(&dst) * hp_dtype_size(sdt) + 63) & ~(size_t)63;
        }
        j->n++;
    }
    for (int i = 0; i < st->n_blobs; i++) {
        const hp_dcp_blob_t *b = &st->blobs[i];
        if (!b->per_rank && p->rank != 0) continue;
        hp_st_entry_t *e = &j->entries[j->n];
        j->names[j->n] = strdup(b->name);
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
    for (int i = 0; i < j->n; i++)
        if (!j->names[i]) {
            job_free(j);
            return HP_ERR_OOM;
        }
    return HP_OK;
}

static hp_status_t run_job(const write_job_t *j) {
    const char *meta[4] = {"format", "hyperparallel-dcp", "dcp_version", "1"};
    return hp_safetensors_write(j->path, j->entries, j->n, meta, 2);
}

/* ---- commit ------------------------------------------------------------------------------- */

/* Rank 0: metadata last, fsync, rename tmp -> dir (replacing an older dir of the same name),
 * fsync the parent. */
static hp_status_t commit_rank0(const char *tmpdir, const char *dir, const char *meta) {
    char path[4400], tpath[4500];
    snprintf(path, sizeof path, "%s/%s", tmpdir, HP_DCP_METADATA_FILE);
    snprintf(tpath, sizeof tpath, "%s.tmp", path);
    FILE *f = fopen(tpath, "wb");
    if (!f) return hp_error(HP_ERR_IO, "%s: cannot create: %s", tpath, strerror(errno));
    size_t n = strlen(meta);
    int ok = fwrite(meta, 1, n, f) == n && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    if (fclose(f) != 0) ok = 0;
    if (!ok) return hp_error(HP_ERR_IO, "%s: write failed: %s (disk full?)", tpath, strerror(e));
    if (rename(tpath, path) != 0) return hp_error(HP_ERR_IO, "%s: rename failed: %s", path, strerror(errno));
    HP_TRY(hp_dcp_fsync_path(tmpdir, 1));
    struct stat sb;
    char old[4200] = "";
    if (stat(dir, &sb) == 0) {
        /* re-saving a step: move the old one aside first, drop it after the new one is in */
        snprintf(old, sizeof old, "%s.old-%ld", dir, (long)getpid());
        if (rename(dir, old) != 0) return hp_error(HP_ERR_IO, "cannot move the existing %s aside: %s", dir, strerror(errno));
    }
    if (rename(tmpdir, dir) != 0) return hp_error(HP_ERR_IO, "cannot rename %s to %s: %s", tmpdir, dir, strerror(errno));
    char parent[4096];
    parent_of(dir, parent, sizeof parent);
    HP_TRY(hp_dcp_fsync_path(parent, 1));
    if (old[0]) HP_TRY(hp_dcp_rmtree(old));
    return HP_OK;
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
    if (crank(comm) == 0) s = hp_dcp_mkdirs(tmpdir);
    s = hp_dcp_agree(comm, s, "checkpoint: creating the temporary directory");
    return s;
}

/* Collective after every rank has written (local status s): agree, commit on rank 0, agree. */
static hp_status_t finish_save(const char *tmpdir, const char *dir, const char *meta, hp_comm_t comm, hp_status_t s) {
    s = hp_dcp_agree(comm, s, "checkpoint: writing the rank files");
    if (s != HP_OK) {
        if (crank(comm) == 0) hp_log(HP_LOG_WARN, "checkpoint %s not committed; leaving partial %s", dir, tmpdir);
        return s;
    }
    hp_status_t c = HP_OK;
    if (crank(comm) == 0) c = commit_rank0(tmpdir, dir, meta);
    return hp_dcp_agree(comm, c, "checkpoint: committing the metadata");
}

hp_status_t hp_dcp_save(const char *dir, const hp_dcp_state_t *st, hp_comm_t comm) {
    hp_status_t s = hp_dcp_agree(comm, check_state(st), "checkpoint save: checking the state");
    HP_TRY(s);
    plan_t p;
    HP_TRY(make_plan(st, comm, &p));
    char tmpdir[4200];
    s = prepare_tmpdir(dir, comm, tmpdir, sizeof tmpdir);
    char *meta = NULL;
    if (s == HP_OK) {
        hp_status_t w = HP_OK;
        if (p.rank == 0) w = build_metadata(st, &p, step_of_dir(dir), &meta);
        write_job_t j;
        if (w == HP_OK) w = build_job(st, &p, tmpdir, NULL, &j);
        if (w == HP_OK) {
            w = run_job(&j);
            job_free(&j);
        }
        s = finish_save(tmpdir, dir, meta, comm, w);
    }
    free(meta);
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
    char *meta;
};

hp_status_t hp_dcp_saver_create(hp_comm_t comm, hp_dcp_saver_t **out) {
    hp_dcp_saver_t *s = hp_calloc(1, sizeof *s);
    if (!s) return HP_ERR_OOM;
    s->comm = comm;
    *out = s;
    return HP_OK;
}

int hp_dcp_saver_pending(const hp_dcp_saver_t *s) { return s->pending; }
size_t hp_dcp_saver_staging_bytes(const hp_dcp_saver_t *s) { return s->staging_cap; }

static void *writer_main(void *arg) {
    hp_dcp_saver_t *s = arg;
    s->status = run_job(&s->job);
    if (s->status != HP_OK) snprintf(s->message, sizeof s->message, "%s", hp_last_error());
    atomic_store(&s->done, 1);
    return NULL;
}

static hp_status_t saver_complete(hp_dcp_saver_t *s) {
    if (s->threaded) pthread_join(s->thread, NULL);
    hp_status_t w = s->status;
    if (w != HP_OK) w = hp_error(w, "async checkpoint %s: %s", s->dir, s->message);
    hp_status_t r = finish_save(s->tmpdir, s->dir, s->meta, s->comm, w);
    job_free(&s->job);
    free(s->meta);
    s->meta = NULL;
    s->pending = 0;
    return r;
}

hp_status_t hp_dcp_saver_poll(hp_dcp_saver_t *s, int *committed) {
    if (committed) *committed = 0;
    /* every rank must take the same decision: one all-reduce (max) of (pending, not done) */
    int64_t v[2] = {s->pending, s->pending && !atomic_load(&s->done)}, r[2] = {v[0], v[1]};
    if (s->comm && csize(s->comm) > 1) HP_TRY(hp_all_reduce(v, r, 2, HP_I64, HP_MAX, s->comm, NULL));
    if (!r[0] || r[1]) return HP_OK;
    hp_status_t st = saver_complete(s);
    if (st == HP_OK && committed) *committed = 1;
    return st;
}

hp_status_t hp_dcp_saver_wait(hp_dcp_saver_t *s) {
    int64_t pend = s->pending, anyp = pend;
    if (s->comm && csize(s->comm) > 1) HP_TRY(hp_all_reduce(&pend, &anyp, 1, HP_I64, HP_MAX, s->comm, NULL));
    if (!anyp) return HP_OK;
    return saver_complete(s);
}

hp_status_t hp_dcp_saver_save(hp_dcp_saver_t *s, const char *dir, const hp_dcp_state_t *st) {
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
            free(s->meta);
            s->meta = NULL;
        }
        r = w;
    }
    plan_free(&p);
    return r;
}

hp_status_t hp_dcp_saver_destroy(hp_dcp_saver_t *s) {
    if (!s) return HP_OK;
    hp_status_t r = hp_dcp_saver_wait(s);
    hp_free_aligned(s->staging);
    free(s);
    return r;
}
