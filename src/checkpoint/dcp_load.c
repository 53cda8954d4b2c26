/* Distributed checkpoint load by box intersection: reads from each saved chunk only the dim-0
 * rows that intersect this rank's target box (any mesh, placements or world size). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "hyperparallel/safetensors.h"
#include "dcp-impl.h"

/* ---- box copy -------------------------------------------------------------------------- */

void hp_dcp_copy_box(hp_tensor_t *dst, const int64_t *dst_off, const void *src, hp_dtype_t sdt,
                     const int64_t *csz, const int64_t *src_off, const int64_t *len, int ndim) {
    size_t ses = hp_dtype_size(sdt), des = hp_dtype_size(dst->dtype);
    if (ndim == 0) {
        hp_convert(dst->data, dst->dtype, src, sdt, 1);
        return;
    }
    for (int d = 0; d < ndim; d++)
        if (len[d] == 0) return;
    int64_t idx[HP_MAX_DIMS] = {0};
    int64_t sstride[HP_MAX_DIMS];
    sstride[ndim - 1] = 1;
    for (int d = ndim - 2; d >= 0; d--) sstride[d] = sstride[d + 1] * csz[d + 1];
    int64_t inner = len[ndim - 1];
    for (;;) {
        int64_t so = 0, dof = 0;
        for (int d = 0; d < ndim; d++) {
            so += (src_off[d] + idx[d]) * sstride[d];
            dof += (dst_off[d] + idx[d]) * dst->stride[d];
        }
        const unsigned char *sp = (const unsigned char *)src + (size_t)so * ses;
        unsigned char *dp = (unsigned char *)dst->data + (size_t)dof * des;
        if (dst->stride[ndim - 1] == 1) {
            hp_convert(dp, dst->dtype, sp, sdt, (size_t)inner);
        } else {
            for (int64_t k = 0; k < inner; k++)
                hp_convert(dp + (size_t)(k * dst->stride[ndim - 1]) * des, dst->dtype, sp + (size_t)k * ses, sdt, 1);
        }
        int d = ndim - 2;
        for (; d >= 0; d--) {
            if (++idx[d] < len[d]) break;
            idx[d] = 0;
        }
        if (d < 0) break;
    }
}

/* ---- load ---------------------------------------------------------------------------------- */

typedef struct open_file {
    char name[256];
    hp_safetensors_t st;
    int fd;
    uint64_t data_base;
} open_file_t;

typedef struct loader {
    const char *dir;
    int verify;          /* check each chunk's recorded XXH3-64 (reads the chunk whole) */
    open_file_t files[64];
    int n_files, next_evict;
    unsigned char *scratch;
    size_t scratch_cap;
} loader_t;

static void loader_close(loader_t *L) {
    for (int i = 0; i < L->n_files; i++) {
        hp_safetensors_close(L->files[i].st);
        if (L->files[i].fd >= 0) close(L->files[i].fd);
    }
    free(L->scratch);
}

static hp_status_t loader_file(loader_t *L, const char *name, open_file_t **out) {
    for (int i = 0; i < L->n_files; i++)
        if (!strcmp(L->files[i].name, name)) {
            *out = &L->files[i];
            return HP_OK;
        }
    int slot;
    if (L->n_files < 64) {
        slot = L->n_files++;
    } else {
        slot = L->next_evict++ % 64;
        hp_safetensors_close(L->files[slot].st);
        close(L->files[slot].fd);
    }
    open_file_t *f = &L->files[slot];
    memset(f, 0, sizeof *f);
    f->fd = -1;
    snprintf(f->name, sizeof f->name, "%s", name);
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", L->dir, name);
    hp_status_t s = hp_safetensors_open(path, &f->st);
    if (s != HP_OK) {
        f->name[0] = '\0';
        if (slot == L->n_files - 1) L->n_files--;
        return s;   /* the reader's message names the file */
    }
    f->fd = open(path, O_RDONLY);
    unsigned char h[8];
    if (f->fd < 0 || pread(f->fd, h, 8, 0) != 8) return hp_error(HP_ERR_IO, "%s: cannot reopen: %s", path, strerror(errno));
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | h[i];
    f->data_base = 8 + hl;
    *out = f;
    return HP_OK;
}

static hp_status_t read_rows(loader_t *L, open_file_t *f, const hp_st_info_t *info, uint64_t byte_off, size_t nbytes) {
    if (nbytes > L->scratch_cap) {
        free(L->scratch);
        L->scratch = hp_malloc(nbytes);
        L->scratch_cap = L->scratch ? nbytes : 0;
        if (!L->scratch) return HP_ERR_OOM;
    }
    uint64_t at = f->data_base + info->begin + byte_off;
    size_t done = 0;
    while (done < nbytes) {
        ssize_t r = pread(f->fd, L->scratch + done, nbytes - done, (off_t)(at + done));
        if (r <= 0)
            return hp_error(HP_ERR_IO, "checkpoint %s/%s: reading '%s' failed: %s (truncated file?)", L->dir, f->name,
                            info->name, r == 0 ? "end of file" : strerror(errno));
        done += (size_t)r;
    }
    return HP_OK;
}

static int excluded(const hp_dcp_load_options_t *o, const char *name) {
    for (int i = 0; o && i < o->n_exclude; i++) {
        size_t n = strlen(o->exclude[i]);
        if (!strncmp(name, o->exclude[i], n) && (name[n] == '\0' || name[n] == '.')) return 1;
    }
    return 0;
}

/* Reads a whole chunk into L->scratch and checks it against its recorded checksum. */
static hp_status_t read_verified(loader_t *L, open_file_t *f, const hp_st_info_t *info, const hp_dcp_chunk_t *ch,
                                 const char *name) {
    size_t n = (size_t)(info->end - info->begin);
    HP_TRY(read_rows(L, f, info, 0, n));
    uint64_t h = XXH3_64bits(n ? (const void *)L->scratch : "", n);
    if (h != ch->xxh3) return hp_dcp_checksum_error(L->dir, f->name, name, ch->key, ch->xxh3, h);
    return HP_OK;
}

static hp_status_t load_tensor(loader_t *L, const hp_dcp_entry_t *e, hp_dcp_tensor_t *x, int allow_convert) {
    hp_tensor_t *lt = &x->t->local;
    const int64_t *gshape = x->t->mesh ? x->t->global_shape : lt->shape;
    int nd = lt->ndim;
    int same = e->ndim == nd;
    for (int d = 0; same && d < nd; d++) same = e->shape[d] == gshape[d];
    if (!same) {
        char a[128] = "", b[128] = "";
        for (int d = 0; d < e->ndim; d++) snprintf(a + strlen(a), sizeof a - strlen(a), "%s%lld", d ? ", " : "", (long long)e->shape[d]);
        for (int d = 0; d < nd; d++) snprintf(b + strlen(b), sizeof b - strlen(b), "%s%lld", d ? ", " : "", (long long)gshape[d]);
        return hp_error(HP_ERR_INVALID_ARG, "checkpoint %s: tensor '%s' has global shape (%s) in the checkpoint but (%s) "
                        "in the model (a different model config?)", L->dir, x->name, a, b);
    }
    if (e->dtype != lt->dtype && !(allow_convert && hp_dtype_is_float(e->dtype) && hp_dtype_is_float(lt->dtype)))
        return hp_error(HP_ERR_INVALID_ARG, "checkpoint %s: tensor '%s' is %s in the checkpoint but %s in the model%s",
                        L->dir, x->name, hp_dtype_name(e->dtype), hp_dtype_name(lt->dtype),
                        hp_dtype_is_float(e->dtype) && hp_dtype_is_float(lt->dtype) ? " (enable dtype conversion to cast)" : "");
    hp_dcp_box_t *boxes = NULL;
    int nbox = 0;
    HP_TRY(hp_dcp_local_boxes(x->t, &boxes, &nbox));
    int64_t need = hp_tensor_numel(lt), got = 0;
    size_t es = hp_dtype_size(e->dtype);
    hp_status_t s = HP_OK;
    for (int t = 0; t < nbox && s == HP_OK; t++) {
        const hp_dcp_box_t *tb = &boxes[t];
        for (int c = 0; c < e->n_chunks && s == HP_OK; c++) {
            const hp_dcp_chunk_t *ch = &e->chunks[c];
            int64_t lo[HP_MAX_DIMS], len[HP_MAX_DIMS], vol = 1;
            for (int d = 0; d < nd; d++) {
                int64_t a = tb->g[d] > ch->offsets[d] ? tb->g[d] : ch->offsets[d];
                int64_t b0 = tb->g[d] + tb->s[d], b1 = ch->offsets[d] + ch->sizes[d];
                int64_t b = b0 < b1 ? b0 : b1;
                lo[d] = a;
                len[d] = b > a ? b - a : 0;
                vol *= len[d];
            }
            if (vol == 0) continue;
            open_file_t *f;
            s = loader_file(L, ch->file, &f);
            if (s != HP_OK) break;
            const hp_st_info_t *info;
            if (hp_safetensors_find(f->st, ch->key, &info) != HP_OK) {
                s = hp_error(HP_ERR_FORMAT, "checkpoint %s: metadata lists '%s' in %s but the file does not hold it "
                             "(mismatched or corrupted checkpoint)", L->dir, ch->key, ch->file);
                break;
            }
            int ok = info->ndim == nd && hp_st_dtype_size(info->dtype) == es &&
                     hp_st_dtype_from_hp(e->dtype) == info->dtype;
            for (int d = 0; ok && d < nd; d++) ok = info->shape[d] == ch->sizes[d];
            if (!ok) {
                s = hp_error(HP_ERR_FORMAT, "checkpoint %s: '%s' in %s has dtype %s / %d dims, which does not match the "
                             "metadata chunk (%s); the checkpoint is corrupted or mixed from different saves",
                             L->dir, ch->key, ch->file, hp_st_dtype_name(info->dtype), info->ndim,
                             hp_dtype_name(e->dtype));
                break;
            }
            /* read only the dim-0 rows of the chunk that intersect */
            int64_t row = 1;
            for (int d = 1; d < nd; d++) row *= ch->sizes[d];
            int64_t r0 = nd ? lo[0] - ch->offsets[0] : 0, nr = nd ? len[0] : 1;
            int whole = L->verify && ch->has_xxh3;   /* verified: the chunk is read whole */
            if (whole) s = read_verified(L, f, info, ch, x->name);
            else s = read_rows(L, f, info, (uint64_t)(r0 * row) * es, (size_t)(nr * row) * es);
            if (s != HP_OK) break;
            int64_t csz[HP_MAX_DIMS], soff[HP_MAX_DIMS], doff[HP_MAX_DIMS];
            for (int d = 0; d < nd; d++) {
                csz[d] = ch->sizes[d];
                soff[d] = lo[d] - ch->offsets[d];
                doff[d] = lo[d] - tb->g[d] + tb->l[d];
            }
            if (nd && !whole) {
                csz[0] = nr;
                soff[0] = 0;
            }
            hp_dcp_copy_box(lt, doff, L->scratch, e->dtype, csz, soff, len, nd);
            got += vol;
        }
    }
    free(boxes);
    HP_TRY(s);
    if (got != need)
        return hp_error(HP_ERR_FORMAT, "checkpoint %s: tensor '%s': the saved chunks cover %lld of the %lld elements this "
                        "rank needs (incomplete checkpoint)", L->dir, x->name, (long long)got, (long long)need);
    return HP_OK;
}

static hp_status_t load_blob(loader_t *L, hp_dcp_metadata_t md, const hp_dcp_entry_t *e, hp_dcp_blob_t *b,
                             int rank, int world) {
    if (e->per_rank != b->per_rank)
        return hp_error(HP_ERR_INVALID_ARG, "checkpoint %s: blob '%s' is %s in the checkpoint but %s here", L->dir,
                        b->name, e->per_rank ? "per-rank" : "shared", b->per_rank ? "per-rank" : "shared");
    if (e->per_rank && hp_dcp_metadata_world_size(md) != world)
        return hp_error(HP_ERR_INVALID_ARG, "checkpoint %s: blob '%s' was saved per rank by %d ranks but %d ranks load "
                        "it (this state cannot be resharded; add it to checkpoint.exclude_from_loading)", L->dir,
                        b->name, hp_dcp_metadata_world_size(md), world);
    const hp_dcp_chunk_t *ch = &e->chunks[e->per_rank ? rank : 0];
    size_t n = (size_t)ch->sizes[0];
    if (n > b->capacity)
        return hp_error(HP_ERR_INVALID_ARG, "checkpoint %s: blob '%s' holds %zu bytes, more than the %zu expected",
                        L->dir, b->name, n, b->capacity);
    open_file_t *f;
    HP_TRY(loader_file(L, ch->file, &f));
    const hp_st_info_t *info;
    if (hp_safetensors_find(f->st, ch->key, &info) != HP_OK || info->dtype != HP_ST_U8 || info->end - info->begin != n)
        return hp_error(HP_ERR_FORMAT, "checkpoint %s: blob '%s' is missing from %s or has the wrong size", L->dir,
                        b->name, ch->file);
    if (L->verify && ch->has_xxh3) HP_TRY(read_verified(L, f, info, ch, b->name));
    else HP_TRY(read_rows(L, f, info, 0, n));
    if (n) memcpy(b->data, L->scratch, n);
    b->size = n;
    b->loaded = 1;
    return HP_OK;
}

static void append_name(char *buf, size_t cap, int *count, const char *name) {
    size_t l = strlen(buf);
    if (*count < 8) snprintf(buf + l, cap - l, "%s'%s'", *count ? ", " : "", name);
    else if (*count == 8) snprintf(buf + l, cap - l, ", ...");
    (*count)++;
}

static hp_status_t load_local(const char *dir, hp_dcp_state_t *st, int rank, int world, const hp_dcp_load_options_t *o) {
    hp_dcp_metadata_t md;
    HP_TRY(hp_dcp_metadata_read(dir, &md));
    int strict = o ? o->strict : 1, conv = o ? o->allow_convert : 0;
    char missing[1024] = "", unexpected[1024] = "";
    int nmiss = 0, nunexp = 0;
    for (int i = 0; i < st->n_tensors; i++) {
        st->tensors[i].loaded = 0;
        if (excluded(o, st->tensors[i].name)) continue;
        const hp_dcp_entry_t *e = hp_dcp_metadata_find(md, st->tensors[i].name);
        if (!e || e->is_blob) append_name(missing, sizeof missing, &nmiss, st->tensors[i].name);
    }
    for (int i = 0; i < st->n_blobs; i++) {
        st->blobs[i].loaded = 0;
        if (excluded(o, st->blobs[i].name)) continue;
        const hp_dcp_entry_t *e = hp_dcp_metadata_find(md, st->blobs[i].name);
        if (!e || !e->is_blob) append_name(missing, sizeof missing, &nmiss, st->blobs[i].name);
    }
    for (int i = 0; i < hp_dcp_metadata_count(md); i++) {
        const char *nm = hp_dcp_metadata_entry(md, i)->name;
        if (excluded(o, nm)) continue;
        int found = 0;
        for (int j = 0; j < st->n_tensors && !found; j++) found = !strcmp(st->tensors[j].name, nm);
        for (int j = 0; j < st->n_blobs && !found; j++) found = !strcmp(st->blobs[j].name, nm);
        if (!found) append_name(unexpected, sizeof unexpected, &nunexp, nm);
    }
    hp_status_t s = HP_OK;
    if (strict && (nmiss || nunexp)) {
        s = hp_error(HP_ERR_NOT_FOUND, "checkpoint %s does not match the state (strict): %d missing key(s)%s%s; %d "
                     "unexpected key(s)%s%s. Hint: load non-strictly or exclude the keys", dir, nmiss,
                     nmiss ? ": " : "", missing, nunexp, nunexp ? ": " : "", unexpected);
    }
    loader_t L;
    memset(&L, 0, sizeof L);
    L.dir = dir;
    L.verify = !(o && o->skip_checksums);
    for (int i = 0; s == HP_OK && i < st->n_tensors; i++) {
        hp_dcp_tensor_t *x = &st->tensors[i];
        if (excluded(o, x->name)) continue;
        const hp_dcp_entry_t *e = hp_dcp_metadata_find(md, x->name);
        if (!e || e->is_blob) continue;
        s = load_tensor(&L, e, x, conv);
        if (s == HP_OK) x->loaded = 1;
    }
    for (int i = 0; s == HP_OK && i < st->n_blobs; i++) {
        hp_dcp_blob_t *b = &st->blobs[i];
        if (excluded(o, b->name)) continue;
        const hp_dcp_entry_t *e = hp_dcp_metadata_find(md, b->name);
        if (!e || !e->is_blob) continue;
        s = load_blob(&L, md, e, b, rank, world);
    }
    loader_close(&L);
    hp_dcp_metadata_free(md);
    return s;
}

hp_status_t hp_dcp_load_rank_blob(const char *dir, const char *name, int saved_rank, void *buf, size_t cap, size_t *size,
                                  int verify) {
    *size = 0;
    hp_dcp_metadata_t md;
    HP_TRY(hp_dcp_metadata_read(dir, &md));
    const hp_dcp_entry_t *e = hp_dcp_metadata_find(md, name);
    int world = hp_dcp_metadata_world_size(md);
    hp_status_t s = HP_OK;
    if (!e || !e->is_blob || !e->per_rank)
        s = hp_error(HP_ERR_NOT_FOUND, "checkpoint %s has no per-rank blob '%s'", dir, name);
    else if (saved_rank < 0 || saved_rank >= world)
        s = hp_error(HP_ERR_INVALID_ARG, "checkpoint %s: blob '%s': rank %d of a checkpoint saved by %d ranks", dir,
                     name, saved_rank, world);
    if (s == HP_OK) {
        loader_t L;
        memset(&L, 0, sizeof L);
        L.dir = dir;
        L.verify = verify;
        hp_dcp_blob_t b = {name, buf, 0, cap, 1, 0};
        s = load_blob(&L, md, e, &b, saved_rank, world);
        loader_close(&L);
        if (s == HP_OK) *size = b.size;
    }
    hp_dcp_metadata_free(md);
    return s;
}

hp_status_t hp_dcp_load(const char *dir, hp_dcp_state_t *st, hp_comm_t comm, const hp_dcp_load_options_t *opt) {
    int rank = comm ? hp_comm_rank(comm) : 0, world = comm ? hp_comm_size(comm) : 1;
    hp_status_t s = load_local(dir, st, rank, world, opt);
    return hp_dcp_agree(comm, s, "checkpoint load");
}
