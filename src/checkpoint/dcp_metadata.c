/* The DCP metadata document: the hardened JSON parser (bounds, overlaps, coverage, safe file
 * names; fuzz target tests/fuzz/fuzz_dcp_metadata.c) and the listing of committed steps
 * (partial directories skipped with a warning). Depends only on core and json-c. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyperparallel/safetensors.h"
#include "dcp-impl.h"

struct hp_dcp_metadata {
    int world;
    int64_t step;
    int n;
    hp_dcp_entry_t *entries;
};

void hp_dcp_metadata_free(hp_dcp_metadata_t md) {
    if (!md) return;
    for (int i = 0; i < md->n; i++) {
        hp_dcp_entry_t *e = &md->entries[i];
        free((char *)e->name);
        for (int c = 0; c < e->n_chunks; c++) {
            free((char *)e->chunks[c].file);
            free((char *)e->chunks[c].key);
        }
        free((hp_dcp_chunk_t *)e->chunks);
    }
    free(md->entries);
    free(md);
}

int hp_dcp_metadata_count(hp_dcp_metadata_t md) { return md->n; }
const hp_dcp_entry_t *hp_dcp_metadata_entry(hp_dcp_metadata_t md, int i) {
    return i >= 0 && i < md->n ? &md->entries[i] : NULL;
}
const hp_dcp_entry_t *hp_dcp_metadata_find(hp_dcp_metadata_t md, const char *name) {
    for (int i = 0; i < md->n; i++)
        if (!strcmp(md->entries[i].name, name)) return &md->entries[i];
    return NULL;
}
int hp_dcp_metadata_world_size(hp_dcp_metadata_t md) { return md->world; }
int64_t hp_dcp_metadata_step(hp_dcp_metadata_t md) { return md->step; }

/* ---- parser ------------------------------------------------------------------------------ */

#define MAX_CHUNKS 4096          /* per entry; the overlap check is quadratic */
#define MAX_DIM_SIZE (INT64_C(1) << 40)

static hp_status_t get_int(json_object *o, const char *key, int64_t lo, int64_t hi, int64_t *out,
                           const char *what, const char *ctx) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_int))
        return hp_error(HP_ERR_FORMAT, "%s: %s: \"%s\" is missing or not an integer", what, ctx, key);
    errno = 0;
    int64_t x = json_object_get_int64(v);
    if (errno != 0 || x < lo || x > hi)
        return hp_error(HP_ERR_FORMAT, "%s: %s: \"%s\" = %lld is outside [%lld, %lld]", what, ctx, key, (long long)x,
                        (long long)lo, (long long)hi);
    *out = x;
    return HP_OK;
}

static hp_status_t get_str(json_object *o, const char *key, const char **out, const char *what, const char *ctx) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
        return hp_error(HP_ERR_FORMAT, "%s: %s: \"%s\" is missing or not a string", what, ctx, key);
    *out = json_object_get_string(v);
    return HP_OK;
}

static hp_status_t get_ints(json_object *o, const char *key, int n, int64_t *out, const char *what, const char *ctx) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_array))
        return hp_error(HP_ERR_FORMAT, "%s: %s: \"%s\" is missing or not an array", what, ctx, key);
    if ((int)json_object_array_length(v) != n)
        return hp_error(HP_ERR_FORMAT, "%s: %s: \"%s\" has %d entries, expected %d (the tensor's ndim)", what, ctx,
                        key, (int)json_object_array_length(v), n);
    for (int i = 0; i < n; i++) {
        json_object *x = json_object_array_get_idx(v, (size_t)i);
        errno = 0;
        if (!json_object_is_type(x, json_type_int))
            return hp_error(HP_ERR_FORMAT, "%s: %s: \"%s\"[%d] is not an integer", what, ctx, key, i);
        int64_t y = json_object_get_int64(x);
        if (errno != 0 || y < 0 || y > MAX_DIM_SIZE)
            return hp_error(HP_ERR_FORMAT, "%s: %s: \"%s\"[%d] = %lld is negative or too large", what, ctx, key, i,
                            (long long)y);
        out[i] = y;
    }
    return HP_OK;
}

/* A file name inside the checkpoint directory: no path separators, not hidden, not empty. */
static int safe_file(const char *f) {
    size_t n = strlen(f);
    return n > 0 && n < 256 && f[0] != '.' && !strchr(f, '/') && !strchr(f, '\\');
}

static hp_status_t map_dtype(const char *name, hp_dtype_t *out, const char *what, const char *ctx) {
    static const struct { const char *n; hp_dtype_t d; } m[] = {
        {"F32", HP_F32}, {"BF16", HP_BF16}, {"F16", HP_F16}, {"I32", HP_I32}, {"I64", HP_I64}, {"U8", HP_U8}};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
        if (!strcmp(name, m[i].n)) {
            *out = m[i].d;
            return HP_OK;
        }
    return hp_error(HP_ERR_FORMAT, "%s: %s: dtype \"%.32s\" is not one of F32, BF16, F16, I32, I64, U8", what, ctx, name);
}

static hp_status_t parse_chunks(json_object *e, hp_dcp_entry_t *out, const char *what, const char *ctx) {
    json_object *arr;
    if (!json_object_object_get_ex(e, "chunks", &arr) || !json_object_is_type(arr, json_type_array))
        return hp_error(HP_ERR_FORMAT, "%s: %s: \"chunks\" is missing or not an array", what, ctx);
    size_t n = json_object_array_length(arr);
    if (n > MAX_CHUNKS)
        return hp_error(HP_ERR_FORMAT, "%s: %s: %zu chunks (at most %d supported)", what, ctx, n, MAX_CHUNKS);
    hp_dcp_chunk_t *ch = hp_calloc(n ? n : 1, sizeof *ch);
    if (!ch) return HP_ERR_OOM;
    out->chunks = ch;
    for (size_t i = 0; i < n; i++) {
        json_object *c = json_object_array_get_idx(arr, i);
        char cctx[700];
        snprintf(cctx, sizeof cctx, "%s chunk %zu", ctx, i);
        if (!json_object_is_type(c, json_type_object))
            return hp_error(HP_ERR_FORMAT, "%s: %s is not an object", what, cctx);
        const char *file, *key;
        int64_t rank = 0;
        HP_TRY(get_str(c, "file", &file, what, cctx));
        HP_TRY(get_str(c, "key", &key, what, cctx));
        if (!safe_file(file))
            return hp_error(HP_ERR_FORMAT, "%s: %s: file \"%.64s\" is not a plain file name inside the checkpoint",
                            what, cctx, file);
        if (!key[0] || strlen(key) >= HP_ST_MAX_NAME)
            return hp_error(HP_ERR_FORMAT, "%s: %s: key is empty or too long", what, cctx);
        HP_TRY(get_int(c, "rank", 0, INT_MAX, &rank, what, cctx));
        if (out->is_blob) {
            HP_TRY(get_int(c, "size", 0, MAX_DIM_SIZE, &ch[i].sizes[0], what, cctx));
        } else {
            HP_TRY(get_ints(c, "offsets", out->ndim, ch[i].offsets, what, cctx));
            HP_TRY(get_ints(c, "sizes", out->ndim, ch[i].sizes, what, cctx));
            for (int d = 0; d < out->ndim; d++)
                if (ch[i].offsets[d] + ch[i].sizes[d] > out->shape[d])
                    return hp_error(HP_ERR_FORMAT, "%s: %s: box [%lld, %lld) on dim %d exceeds the global size %lld",
                                    what, cctx, (long long)ch[i].offsets[d], (long long)(ch[i].offsets[d] + ch[i].sizes[d]),
                                    d, (long long)out->shape[d]);
        }
        json_object *xv;
        if (json_object_object_get_ex(c, "xxh3", &xv)) {   /* optional: older checkpoints have none */
            const char *hx = json_object_is_type(xv, json_type_string) ? json_object_get_string(xv) : NULL;
            int okx = hx && strlen(hx) == 16;
            uint64_t h = 0;
            for (int k = 0; okx && k < 16; k++) {
                char ch_ = hx[k];
                int dv = ch_ >= '0' && ch_ <= '9' ? ch_ - '0' : ch_ >= 'a' && ch_ <= 'f' ? ch_ - 'a' + 10 : -1;
                if (dv < 0) okx = 0;
                h = (h << 4) | (uint64_t)(dv < 0 ? 0 : dv);
            }
            if (!okx)
                return hp_error(HP_ERR_FORMAT, "%s: %s: \"xxh3\" is not a string of 16 lowercase hex digits", what,
                                cctx);
            ch[i].has_xxh3 = 1;
            ch[i].xxh3 = h;
        }
        ch[i].rank = (int)rank;
        ch[i].file = strdup(file);
        ch[i].key = strdup(key);
        out->n_chunks = (int)i + 1;
        if (!ch[i].file || !ch[i].key) return HP_ERR_OOM;
    }
    if (out->is_blob) return HP_OK;
    /* chunks must not overlap and must cover the tensor */
    int64_t numel = 1, vol = 0;
    for (int d = 0; d < out->ndim; d++) numel *= out->shape[d];
    for (int i = 0; i < out->n_chunks; i++) {
        int64_t v = 1;
        for (int d = 0; d < out->ndim; d++) v *= ch[i].sizes[d];
        if (v == 0) continue;
        vol += v;
        for (int j = 0; j < i; j++) {
            int overlap = 1, empty = 0;
            for (int d = 0; d < out->ndim; d++) {
                if (ch[j].sizes[d] == 0) empty = 1;
                if (ch[i].offsets[d] >= ch[j].offsets[d] + ch[j].sizes[d] ||
                    ch[j].offsets[d] >= ch[i].offsets[d] + ch[i].sizes[d])
                    overlap = 0;
            }
            if (overlap && !empty)
                return hp_error(HP_ERR_FORMAT, "%s: %s: chunks %d and %d overlap", what, ctx, j, i);
        }
    }
    if (vol != numel)
        return hp_error(HP_ERR_FORMAT, "%s: %s: the chunks hold %lld elements but the tensor has %lld (incomplete "
                        "checkpoint)", what, ctx, (long long)vol, (long long)numel);
    return HP_OK;
}

static hp_status_t parse_root(json_object *root, hp_dcp_metadata_t md, const char *what) {
    if (!json_object_is_type(root, json_type_object))
        return hp_error(HP_ERR_FORMAT, "%s: the metadata is not a JSON object", what);
    const char *magic;
    if (get_str(root, "magic", &magic, what, "top level") != HP_OK || strcmp(magic, HP_DCP_MAGIC) != 0)
        return hp_error(HP_ERR_FORMAT, "%s: \"magic\" is not \"%s\" (not a hyperparallel checkpoint)", what, HP_DCP_MAGIC);
    int64_t ver, world, step = -1;
    HP_TRY(get_int(root, "version", 0, INT_MAX, &ver, what, "top level"));
    if (ver != HP_DCP_VERSION)
        return hp_error(HP_ERR_UNSUPPORTED, "%s: checkpoint format version %lld; this build reads version %d", what,
                        (long long)ver, HP_DCP_VERSION);
    HP_TRY(get_int(root, "world_size", 1, 1 << 24, &world, what, "top level"));
    json_object *sv;
    if (json_object_object_get_ex(root, "step", &sv)) HP_TRY(get_int(root, "step", -1, INT64_MAX, &step, what, "top level"));
    md->world = (int)world;
    md->step = step;
    json_object *tens = NULL, *blobs = NULL;
    if (!json_object_object_get_ex(root, "tensors", &tens) || !json_object_is_type(tens, json_type_object))
        return hp_error(HP_ERR_FORMAT, "%s: \"tensors\" is missing or not an object", what);
    if (json_object_object_get_ex(root, "blobs", &blobs) && !json_object_is_type(blobs, json_type_object))
        return hp_error(HP_ERR_FORMAT, "%s: \"blobs\" is not an object", what);
    int cap = json_object_object_length(tens) + (blobs ? json_object_object_length(blobs) : 0);
    md->entries = hp_calloc((size_t)(cap ? cap : 1), sizeof *md->entries);
    if (!md->entries) return HP_ERR_OOM;
    for (int pass = 0; pass < 2; pass++) {
        json_object *obj = pass == 0 ? tens : blobs;
        if (!obj) continue;
        json_object_object_foreach(obj, name, e) {
            hp_dcp_entry_t *x = &md->entries[md->n];
            char ctx[600];
            snprintf(ctx, sizeof ctx, "%s '%.500s'", pass ? "blob" : "tensor", name);
            if (!name[0] || strlen(name) >= HP_ST_MAX_NAME)
                return hp_error(HP_ERR_FORMAT, "%s: an entry name is empty or longer than %d bytes", what, HP_ST_MAX_NAME - 1);
            if (!json_object_is_type(e, json_type_object))
                return hp_error(HP_ERR_FORMAT, "%s: %s is not an object", what, ctx);
            if (pass == 1 && hp_dcp_metadata_find(md, name))
                return hp_error(HP_ERR_FORMAT, "%s: '%s' is both a tensor and a blob", what, name);
            x->name = strdup(name);
            md->n++;
            if (!x->name) return HP_ERR_OOM;
            x->is_blob = pass;
            if (pass == 0) {
                const char *dt;
                HP_TRY(get_str(e, "dtype", &dt, what, ctx));
                HP_TRY(map_dtype(dt, &x->dtype, what, ctx));
                json_object *sh;
                if (!json_object_object_get_ex(e, "shape", &sh) || !json_object_is_type(sh, json_type_array))
                    return hp_error(HP_ERR_FORMAT, "%s: %s: \"shape\" is missing or not an array", what, ctx);
                int nd = (int)json_object_array_length(sh);
                if (nd > HP_MAX_DIMS)
                    return hp_error(HP_ERR_FORMAT, "%s: %s: %d dims (at most %d)", what, ctx, nd, HP_MAX_DIMS);
                x->ndim = nd;
                HP_TRY(get_ints(e, "shape", nd, x->shape, what, ctx));
                int64_t numel = 1;
                for (int d = 0; d < nd; d++) {
                    if (x->shape[d] && numel > (INT64_C(1) << 50) / x->shape[d])
                        return hp_error(HP_ERR_FORMAT, "%s: %s: the shape has too many elements", what, ctx);
                    numel *= x->shape[d];
                }
            } else {
                json_object *pr;
                if (!json_object_object_get_ex(e, "per_rank", &pr) || !json_object_is_type(pr, json_type_boolean))
                    return hp_error(HP_ERR_FORMAT, "%s: %s: \"per_rank\" is missing or not a boolean", what, ctx);
                x->per_rank = json_object_get_boolean(pr);
                x->dtype = HP_U8;
                x->ndim = 1;
            }
            HP_TRY(parse_chunks(e, x, what, ctx));
            if (x->is_blob) {
                int64_t t = 0;
                for (int c = 0; c < x->n_chunks; c++) t += x->chunks[c].sizes[0];
                x->shape[0] = t;
                if (x->n_chunks != (x->per_rank ? md->world : 1))
                    return hp_error(HP_ERR_FORMAT, "%s: %s: %d chunks, expected %d", what, ctx, x->n_chunks,
                                    x->per_rank ? md->world : 1);
            }
        }
    }
    return HP_OK;
}

/* Strict JSON (UTF-8 checked, one value, only white space after it) of at most max_bytes;
 * `kind` names the document in messages, `hint` ends a parse error's message. */
hp_status_t hp_dcp_write_json(const char *path, json_object *o) {
    const char *txt = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
                                                            JSON_C_TO_STRING_NOSLASHESCAPE);
    return hp_file_write_atomic(path, txt, strlen(txt));
}

hp_status_t hp_dcp_json_parse(const char *json, size_t len, size_t max_bytes, const char *what, const char *kind,
                              const char *hint, json_object **out) {
    *out = NULL;
    if (len > max_bytes)
        return hp_error(HP_ERR_FORMAT, "%s: %s of %zu bytes is larger than %zu MiB", what, kind, len, max_bytes >> 20);
    struct json_tokener *tok = json_tokener_new_ex(64);
    if (!tok) return HP_ERR_OOM;
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    json_object *root = json_tokener_parse_ex(tok, json, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (!root || jerr != json_tokener_success) {
        json_object_put(root);
        return hp_error(HP_ERR_FORMAT, "%s: %s is not valid JSON (%s near byte %zu of %zu)%s", what, kind,
                        jerr == json_tokener_continue ? "unexpected end" : json_tokener_error_desc(jerr), end, len,
                        hint);
    }
    for (size_t i = end; i < len; i++)
        if (json[i] != ' ' && json[i] != '\n' && json[i] != '\t' && json[i] != '\r') {
            json_object_put(root);
            return hp_error(HP_ERR_FORMAT, "%s: trailing bytes after the %s JSON at byte %zu", what, kind, i);
        }
    *out = root;
    return HP_OK;
}

hp_status_t hp_dcp_metadata_parse(const char *json, size_t len, const char *what, hp_dcp_metadata_t *out) {
    *out = NULL;
    json_object *root = NULL;
    HP_TRY(hp_dcp_json_parse(json, len, (size_t)256 << 20, what, "metadata",
                             "; the checkpoint is corrupted or truncated", &root));
    hp_dcp_metadata_t md = hp_calloc(1, sizeof *md);
    if (!md) {
        json_object_put(root);
        return HP_ERR_OOM;
    }
    hp_status_t s = parse_root(root, md, what);
    json_object_put(root);
    if (s != HP_OK) {
        hp_dcp_metadata_free(md);
        return s;
    }
    *out = md;
    return HP_OK;
}

hp_status_t hp_dcp_metadata_read(const char *dir, hp_dcp_metadata_t *out) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, HP_DCP_METADATA_FILE);
    char *buf;
    size_t n;
    hp_status_t s = hp_file_read_all(path, "checkpoint metadata", (size_t)256 << 20, &buf, &n);
    if (s == HP_ERR_IO)   // a missing file: not a checkpoint (yet), which callers tell from a failed read
        return hp_error(access(path, F_OK) != 0 && errno == ENOENT ? HP_ERR_NOT_FOUND : s,
                        "%s (not a committed checkpoint directory?)", hp_last_error());
    HP_TRY(s);
    s = hp_dcp_metadata_parse(buf, n, path, out);
    free(buf);
    return s;
}

/* ---- listing ------------------------------------------------------------------------------ */

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

hp_status_t hp_dcp_list_steps(const char *folder, int64_t *steps, int cap, int *n) {
    *n = 0;
    DIR *d = opendir(folder);
    if (!d) {
        if (errno == ENOENT) return HP_OK;
        return hp_error(HP_ERR_IO, "checkpoint folder %s: cannot list: %s", folder, strerror(errno));
    }
    int64_t *tmp = NULL;
    int cnt = 0, tcap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long long v;
        int used = 0;
        if (sscanf(e->d_name, "step-%lld%n", &v, &used) != 1 || v < 0) continue;
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", folder, e->d_name);
        if (e->d_name[used] != '\0') {
            hp_log(HP_LOG_WARN, "ignoring partial checkpoint %s (an interrupted save; safe to delete)", path);
            continue;
        }
        char mpath[4300];
        snprintf(mpath, sizeof mpath, "%s/%s", path, HP_DCP_METADATA_FILE);
        if (access(mpath, R_OK) != 0) {
            hp_log(HP_LOG_WARN, "ignoring partial checkpoint %s: no %s", path, HP_DCP_METADATA_FILE);
            continue;
        }
        if (cnt == tcap) {
            tcap = tcap ? 2 * tcap : 16;
            int64_t *nt = realloc(tmp, sizeof *tmp * (size_t)tcap);
            if (!nt) {
                free(tmp);
                closedir(d);
                return HP_ERR_OOM;
            }
            tmp = nt;
        }
        tmp[cnt++] = v;
    }
    closedir(d);
    if (cnt) qsort(tmp, (size_t)cnt, sizeof *tmp, cmp_i64);
    const int skip = cnt > cap ? cnt - cap : 0;   /* more than cap: the newest cap steps */
    for (int i = 0; i + skip < cnt; i++) steps[i] = tmp[skip + i];
    *n = cnt;
    free(tmp);
    return HP_OK;
}

