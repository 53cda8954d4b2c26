/* safetensors reader and writer. The reader validates the whole header before anything is
 * used: header length against the file size and a 100 MB cap, strict JSON (json-c), every
 * entry's dtype, shape (overflow-checked element and byte counts) and data_offsets, and that
 * the tensors tile the data section exactly (no overlap, no hole, nothing past the end). */
#include "hyperparallel/safetensors.h"
#include "hyperparallel/file.h"

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (the format stores little-endian data)"
#endif

/* ---- dtypes ------------------------------------------------------------------------ */

static const struct {
    const char *name;
    size_t size;
} st_dtypes[HP_ST_DTYPE_COUNT] = {
    [HP_ST_BOOL] = {"BOOL", 1},       [HP_ST_U8] = {"U8", 1},     [HP_ST_I8] = {"I8", 1},
    [HP_ST_F8_E5M2] = {"F8_E5M2", 1}, [HP_ST_F8_E4M3] = {"F8_E4M3", 1},
    [HP_ST_F8_E8M0] = {"F8_E8M0", 1}, [HP_ST_I16] = {"I16", 2},   [HP_ST_U16] = {"U16", 2},
    [HP_ST_F16] = {"F16", 2},         [HP_ST_BF16] = {"BF16", 2}, [HP_ST_I32] = {"I32", 4},
    [HP_ST_U32] = {"U32", 4},         [HP_ST_F32] = {"F32", 4},   [HP_ST_F64] = {"F64", 8},
    [HP_ST_I64] = {"I64", 8},         [HP_ST_U64] = {"U64", 8},   [HP_ST_C64] = {"C64", 8},
};

const char *hp_st_dtype_name(hp_st_dtype_t dt) {
    return (dt >= 0 && dt < HP_ST_DTYPE_COUNT) ? st_dtypes[dt].name : "?";
}

size_t hp_st_dtype_size(hp_st_dtype_t dt) {
    return (dt >= 0 && dt < HP_ST_DTYPE_COUNT) ? st_dtypes[dt].size : 0;
}

hp_status_t hp_st_dtype_from_name(const char *name, hp_st_dtype_t *out) {
    for (int i = 0; i < HP_ST_DTYPE_COUNT; i++) {
        if (strcmp(name, st_dtypes[i].name) == 0) {
            *out = (hp_st_dtype_t)i;
            return HP_OK;
        }
    }
    if (strcmp(name, "F4") == 0 || strcmp(name, "F6_E2M3") == 0 || strcmp(name, "F6_E3M2") == 0)
        return hp_error(HP_ERR_UNSUPPORTED,
                        "dtype '%s' packs several elements per byte; this reader supports only "
                        "whole-byte dtypes (BOOL U8 I8 F8_* I16 U16 F16 BF16 I32 U32 F32 F64 I64 U64 C64)",
                        name);
    return hp_error(HP_ERR_FORMAT,
                    "unknown dtype '%.32s'; expected one of BOOL U8 I8 F8_E5M2 F8_E4M3 F8_E8M0 "
                    "I16 U16 F16 BF16 I32 U32 F32 F64 I64 U64 C64",
                    name);
}

hp_st_dtype_t hp_st_dtype_from_hp(hp_dtype_t dt) {
    switch (dt) {
    case HP_F32: return HP_ST_F32;
    case HP_BF16: return HP_ST_BF16;
    case HP_F16: return HP_ST_F16;
    case HP_I32: return HP_ST_I32;
    case HP_I64: return HP_ST_I64;
    case HP_U8: return HP_ST_U8;
    default: return HP_ST_AUTO;
    }
}

/* The hp dtype that holds a safetensors dtype exactly, or -1. */
static int st_to_hp(hp_st_dtype_t dt) {
    switch (dt) {
    case HP_ST_F32: return HP_F32;
    case HP_ST_BF16: return HP_BF16;
    case HP_ST_F16: return HP_F16;
    case HP_ST_I32: return HP_I32;
    case HP_ST_I64: return HP_I64;
    case HP_ST_U8: return HP_U8;
    default: return -1;
    }
}

/* ---- the open file ------------------------------------------------------------------- */

struct hp_safetensors {
    char *what;             /* path or caller's label, for messages */
    int fd;                 /* -1 for in-memory images */
    unsigned char *mem;     /* whole image (memory mode) */
    uint64_t data_start;    /* 8 + header length */
    uint64_t data_size;     /* bytes of the data section */
    int n;
    hp_st_info_t *infos;    /* sorted by begin */
    const hp_st_info_t **by_name;   /* into infos, sorted by name */
    int n_meta;
    char **meta;            /* 2 * n_meta strings */
    char *names;            /* storage for every name */
};

void hp_safetensors_close(hp_safetensors_t st) {
    if (!st) return;
    if (st->fd >= 0) close(st->fd);
    free(st->mem);
    free(st->what);
    free(st->infos);
    free(st->by_name);
    for (int i = 0; i < 2 * st->n_meta; i++) free(st->meta[i]);
    free(st->meta);
    free(st->names);
    free(st);
}

static int cmp_begin(const void *a, const void *b) {
    const hp_st_info_t *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_name_ptr(const void *a, const void *b) {
    return strcmp((*(const hp_st_info_t *const *)a)->name, (*(const hp_st_info_t *const *)b)->name);
}

/* Reads an integer JSON value that must be in [0, max]. */
static hp_status_t json_uint(const struct json_object *v, uint64_t max, uint64_t *out) {
    if (!json_object_is_type(v, json_type_int)) return HP_ERR_FORMAT;
    int64_t s = json_object_get_int64(v);
    if (s < 0) return HP_ERR_FORMAT;
    if (s == INT64_MAX) {
        /* json-c saturates; an exact INT64_MAX or anything larger is out of every range here */
        return HP_ERR_FORMAT;
    }
    if ((uint64_t)s > max) return HP_ERR_FORMAT;
    *out = (uint64_t)s;
    return HP_OK;
}

static hp_status_t parse_entry(hp_safetensors_t st, const char *name, struct json_object *v,
                               hp_st_info_t *info) {
    const char *w = st->what;
    if (!json_object_is_type(v, json_type_object))
        return hp_error(HP_ERR_FORMAT, "%s: header entry '%s' is not an object; expected "
                        "{\"dtype\": ..., \"shape\": [...], \"data_offsets\": [begin, end]}", w, name);
    struct json_object *jd, *js, *jo;
    if (!json_object_object_get_ex(v, "dtype", &jd) || !json_object_is_type(jd, json_type_string))
        return hp_error(HP_ERR_FORMAT, "%s: tensor '%s' has no string \"dtype\" field", w, name);
    if (!json_object_object_get_ex(v, "shape", &js) || !json_object_is_type(js, json_type_array))
        return hp_error(HP_ERR_FORMAT, "%s: tensor '%s' has no array \"shape\" field", w, name);
    if (!json_object_object_get_ex(v, "data_offsets", &jo) ||
        !json_object_is_type(jo, json_type_array) || json_object_array_length(jo) != 2)
        return hp_error(HP_ERR_FORMAT, "%s: tensor '%s' needs \"data_offsets\": [begin, end]", w, name);

    hp_status_t s = hp_st_dtype_from_name(json_object_get_string(jd), &info->dtype);
    if (s != HP_OK) return hp_error_prefix(s, "%s: tensor '%s': ", w, name);
    size_t nd = json_object_array_length(js);
    if (nd > HP_MAX_DIMS)
        return hp_error(HP_ERR_FORMAT, "%s: tensor '%s' has %zu dims; at most %d are supported",
                        w, name, nd, HP_MAX_DIMS);
    info->ndim = (int)nd;
    uint64_t numel = 1;
    for (size_t d = 0; d < nd; d++) {
        uint64_t dim;
        if (json_uint(json_object_array_get_idx(js, d), (uint64_t)INT64_MAX, &dim) != HP_OK)
            return hp_error(HP_ERR_FORMAT, "%s: tensor '%s' shape[%zu] is not a non-negative "
                            "integer below 2^63", w, name, d);
        info->shape[d] = (int64_t)dim;
        if (__builtin_mul_overflow(numel, dim, &numel))
            return hp_error(HP_ERR_FORMAT, "%s: tensor '%s': the element count of its shape "
                            "overflows 64 bits", w, name);
    }
    uint64_t nbytes;
    if (__builtin_mul_overflow(numel, (uint64_t)hp_st_dtype_size(info->dtype), &nbytes))
        return hp_error(HP_ERR_FORMAT, "%s: tensor '%s': its byte size overflows 64 bits", w, name);
    if (json_uint(json_object_array_get_idx(jo, 0), UINT64_MAX, &info->begin) != HP_OK ||
        json_uint(json_object_array_get_idx(jo, 1), UINT64_MAX, &info->end) != HP_OK)
        return hp_error(HP_ERR_FORMAT, "%s: tensor '%s' data_offsets must be two non-negative "
                        "integers", w, name);
    if (info->begin > info->end)
        return hp_error(HP_ERR_FORMAT, "%s: tensor '%s' data_offsets [%llu, %llu] end before "
                        "begin", w, name, (unsigned long long)info->begin,
                        (unsigned long long)info->end);
    if (info->end > st->data_size)
        return hp_error(HP_ERR_FORMAT, "%s: tensor '%s' data_offsets [%llu, %llu] run past the "
                        "data section of %llu bytes (file truncated?)", w, name,
                        (unsigned long long)info->begin, (unsigned long long)info->end,
                        (unsigned long long)st->data_size);
    if (info->end - info->begin != nbytes)
        return hp_error(HP_ERR_FORMAT, "%s: tensor '%s' is %s with %llu elements = %llu bytes, "
                        "but data_offsets [%llu, %llu] span %llu bytes", w, name,
                        hp_st_dtype_name(info->dtype), (unsigned long long)numel,
                        (unsigned long long)nbytes, (unsigned long long)info->begin,
                        (unsigned long long)info->end,
                        (unsigned long long)(info->end - info->begin));
    return HP_OK;
}

static hp_status_t parse_metadata(hp_safetensors_t st, struct json_object *v) {
    if (!json_object_is_type(v, json_type_object))
        return hp_error(HP_ERR_FORMAT, "%s: \"__metadata__\" must be an object of strings", st->what);
    int n = json_object_object_length(v);
    st->meta = calloc((size_t)(2 * n + 1), sizeof(char *));
    if (!st->meta) return hp_error(HP_ERR_OOM, "%s: no memory for %d metadata entries", st->what, n);
    json_object_object_foreach(v, key, val) {
        if (!json_object_is_type(val, json_type_string))
            return hp_error(HP_ERR_FORMAT, "%s: __metadata__ value of '%.64s' is not a string "
                            "(the format allows only string values)", st->what, key);
        st->meta[2 * st->n_meta] = strdup(key);
        st->meta[2 * st->n_meta + 1] = strdup(json_object_get_string(val));
        st->n_meta++;
        if (!st->meta[2 * st->n_meta - 2] || !st->meta[2 * st->n_meta - 1])
            return hp_error(HP_ERR_OOM, "%s: no memory for metadata", st->what);
    }
    return HP_OK;
}

/* Parses and validates `hlen` header bytes; st->data_size is already set. */
static hp_status_t parse_header(hp_safetensors_t st, const char *hdr, uint64_t hlen) {
    const char *w = st->what;
    if (hlen < 2 || hdr[0] != '{')
        return hp_error(HP_ERR_FORMAT, "%s: header does not start with '{' (not a safetensors "
                        "file, or a corrupted header length)", w);
    struct json_tokener *tok = json_tokener_new_ex(64);
    if (!tok) return hp_error(HP_ERR_OOM, "%s: cannot create a JSON tokenizer", w);
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    struct json_object *root = json_tokener_parse_ex(tok, hdr, (int)hlen);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (!root || jerr != json_tokener_success) {
        json_object_put(root);
        return hp_error(HP_ERR_FORMAT, "%s: header is not valid JSON (%s, near byte %zu of %llu)",
                        w, jerr == json_tokener_continue ? "unexpected end of header"
                                                         : json_tokener_error_desc(jerr),
                        end, (unsigned long long)hlen);
    }
    for (size_t i = end; i < hlen; i++) {
        if (hdr[i] != ' ' && hdr[i] != '\t' && hdr[i] != '\n' && hdr[i] != '\r') {
            json_object_put(root);
            return hp_error(HP_ERR_FORMAT, "%s: trailing bytes after the JSON header at byte "
                            "%zu (only space padding is allowed)", w, i);
        }
    }
    if (!json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        return hp_error(HP_ERR_FORMAT, "%s: header JSON is not an object", w);
    }

    hp_status_t s = HP_OK;
    int cap = json_object_object_length(root);
    size_t names_bytes = 0;
    json_object_object_foreach(root, k0, v0) {
        (void)v0;
        names_bytes += strlen(k0) + 1;
    }
    st->infos = calloc((size_t)cap + 1, sizeof(hp_st_info_t));
    st->names = malloc(names_bytes + 1);
    if (!st->infos || !st->names) {
        json_object_put(root);
        return hp_error(HP_ERR_OOM, "%s: no memory for %d header entries", w, cap);
    }
    size_t name_off = 0;
    json_object_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (st->meta) {
                s = hp_error(HP_ERR_FORMAT, "%s: more than one __metadata__ entry", w);
                break;
            }
            s = parse_metadata(st, val);
            if (s != HP_OK) break;
            continue;
        }
        size_t len = strlen(key);
        if (len == 0 || len > HP_ST_MAX_NAME) {
            s = hp_error(HP_ERR_FORMAT, "%s: tensor name of %zu bytes (must be 1..%d)", w, len,
                         HP_ST_MAX_NAME);
            break;
        }
        hp_st_info_t *info = &st->infos[st->n];
        memcpy(st->names + name_off, key, len + 1);
        info->name = st->names + name_off;
        name_off += len + 1;
        s = parse_entry(st, info->name, val, info);
        if (s != HP_OK) break;
        st->n++;
    }
    json_object_put(root);
    if (s != HP_OK) return s;

    /* The tensors must tile the data section: sorted by offset, each begins where the
     * previous ended, and the last ends at the end of the file. */
    qsort(st->infos, (size_t)st->n, sizeof(hp_st_info_t), cmp_begin);
    uint64_t pos = 0;
    for (int i = 0; i < st->n; i++) {
        const hp_st_info_t *t = &st->infos[i];
        if (t->begin < pos)
            return hp_error(HP_ERR_FORMAT, "%s: tensor '%s' bytes [%llu, %llu) overlap tensor "
                            "'%s' ending at %llu", w, t->name, (unsigned long long)t->begin,
                            (unsigned long long)t->end, st->infos[i - 1].name,
                            (unsigned long long)pos);
        if (t->begin > pos)
            return hp_error(HP_ERR_FORMAT, "%s: %llu unused bytes before tensor '%s' at offset "
                            "%llu (tensors must be stored back to back)", w,
                            (unsigned long long)(t->begin - pos), t->name,
                            (unsigned long long)t->begin);
        pos = t->end;
    }
    if (pos != st->data_size)
        return hp_error(HP_ERR_FORMAT, "%s: tensors cover %llu bytes but the data section has "
                        "%llu (trailing garbage or a truncated header)", w,
                        (unsigned long long)pos, (unsigned long long)st->data_size);

    st->by_name = malloc(sizeof(*st->by_name) * ((size_t)st->n + 1));
    if (!st->by_name) return hp_error(HP_ERR_OOM, "%s: no memory for the name index", w);
    for (int i = 0; i < st->n; i++) st->by_name[i] = &st->infos[i];
    qsort(st->by_name, (size_t)st->n, sizeof(*st->by_name), cmp_name_ptr);
    for (int i = 1; i < st->n; i++) {
        if (strcmp(st->by_name[i]->name, st->by_name[i - 1]->name) == 0)
            return hp_error(HP_ERR_FORMAT, "%s: tensor '%s' appears twice", w, st->by_name[i]->name);
    }
    return HP_OK;
}

static hp_status_t check_header_len(const char *what, uint64_t hlen, uint64_t total) {
    if (hlen > HP_ST_MAX_HEADER_BYTES)
        return hp_error(HP_ERR_FORMAT, "%s: header length %llu exceeds the 100 MB limit of the "
                        "format (not a safetensors file, or a corrupted first 8 bytes)", what,
                        (unsigned long long)hlen);
    if (hlen > total - 8)
        return hp_error(HP_ERR_FORMAT, "%s: header length %llu but only %llu bytes follow the "
                        "8-byte length (file truncated?)", what, (unsigned long long)hlen,
                        (unsigned long long)(total - 8));
    return HP_OK;
}

static uint64_t load_le64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

static hp_safetensors_t st_new(const char *what) {
    hp_safetensors_t st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->fd = -1;
    st->what = strdup(what ? what : "(memory)");
    if (!st->what) {
        free(st);
        return NULL;
    }
    return st;
}

hp_status_t hp_safetensors_open_memory(const void *bytes, size_t len, const char *what,
                                       hp_safetensors_t *out) {
    *out = NULL;
    hp_safetensors_t st = st_new(what);
    if (!st) return hp_error(HP_ERR_OOM, "no memory to open a safetensors image");
    if (len < 8) {
        hp_status_t s = hp_error(HP_ERR_FORMAT, "%s: %zu bytes is too short for a safetensors "
                                 "file (needs at least the 8-byte header length)", st->what, len);
        hp_safetensors_close(st);
        return s;
    }
    uint64_t hlen = load_le64(bytes);
    hp_status_t s = check_header_len(st->what, hlen, len);
    if (s == HP_OK) {
        st->mem = malloc(len);
        if (!st->mem) s = hp_error(HP_ERR_OOM, "%s: no memory for %zu bytes", st->what, len);
    }
    if (s == HP_OK) {
        memcpy(st->mem, bytes, len);
        st->data_start = 8 + hlen;
        st->data_size = len - st->data_start;
        s = parse_header(st, (const char *)st->mem + 8, hlen);
    }
    if (s != HP_OK) {
        hp_safetensors_close(st);
        return s;
    }
    *out = st;
    return HP_OK;
}

/* pread until n bytes or error. */
static hp_status_t read_at(hp_safetensors_t st, void *buf, size_t n, uint64_t off) {
    if (n == 0) return HP_OK;   /* empty tensors may have a NULL buffer */
    if (st->fd < 0) {
        memcpy(buf, st->mem + off, n);
        return HP_OK;
    }
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = pread(st->fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return hp_error(HP_ERR_IO, "%s: read of %zu bytes at offset %llu failed: %s", st->what,
                            n, (unsigned long long)off, r < 0 ? strerror(errno) : "unexpected end of file");
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return HP_OK;
}

hp_status_t hp_safetensors_open(const char *path, hp_safetensors_t *out) {
    *out = NULL;
    hp_safetensors_t st = st_new(path);
    if (!st) return hp_error(HP_ERR_OOM, "no memory to open '%s'", path);
    hp_status_t s = HP_OK;
    char *hdr = NULL;
    st->fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (st->fd < 0) {
        s = hp_error(HP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    } else if (fstat(st->fd, &sb) != 0) {
        s = hp_error(HP_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        s = hp_error(HP_ERR_IO, "%s: not a regular file", path);
    } else if (sb.st_size < 8) {
        s = hp_error(HP_ERR_FORMAT, "%s: %lld bytes is too short for a safetensors file (needs "
                     "at least the 8-byte header length)", path, (long long)sb.st_size);
    }
    uint64_t hlen = 0;
    if (s == HP_OK) {
        unsigned char b[8];
        s = read_at(st, b, 8, 0);
        if (s == HP_OK) {
            hlen = load_le64(b);
            s = check_header_len(path, hlen, (uint64_t)sb.st_size);
        }
    }
    if (s == HP_OK) {
        hdr = malloc(hlen + 1);
        if (!hdr) s = hp_error(HP_ERR_OOM, "%s: no memory for a %llu-byte header", path,
                               (unsigned long long)hlen);
    }
    if (s == HP_OK) s = read_at(st, hdr, hlen, 8);
    if (s == HP_OK) {
        st->data_start = 8 + hlen;
        st->data_size = (uint64_t)sb.st_size - st->data_start;
        s = parse_header(st, hdr, hlen);
    }
    free(hdr);
    if (s != HP_OK) {
        hp_safetensors_close(st);
        return s;
    }
    *out = st;
    return HP_OK;
}

/* ---- queries ------------------------------------------------------------------------ */

int hp_safetensors_count(hp_safetensors_t st) { return st->n; }

const hp_st_info_t *hp_safetensors_info(hp_safetensors_t st, int i) {
    HP_ASSERT(i >= 0 && i < st->n);
    return &st->infos[i];
}

hp_status_t hp_safetensors_find(hp_safetensors_t st, const char *name,
                                const hp_st_info_t **info) {
    int lo = 0, hi = st->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int c = strcmp(name, st->by_name[mid]->name);
        if (c == 0) {
            *info = st->by_name[mid];
            return HP_OK;
        }
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    /* Hint: the names that sort next to the missing one. */
    const char *a = lo - 1 >= 0 && lo - 1 < st->n ? st->by_name[lo - 1]->name : "";
    const char *b = lo < st->n ? st->by_name[lo]->name : "";
    return hp_error(HP_ERR_NOT_FOUND, "%s: no tensor named '%s' among %d (nearest names: '%s', "
                    "'%s')", st->what, name, st->n, a, b);
}

int hp_safetensors_metadata_count(hp_safetensors_t st) { return st->n_meta; }

void hp_safetensors_metadata_at(hp_safetensors_t st, int i, const char **key,
                                const char **value) {
    HP_ASSERT(i >= 0 && i < st->n_meta);
    *key = st->meta[2 * i];
    *value = st->meta[2 * i + 1];
}

const char *hp_safetensors_metadata(hp_safetensors_t st, const char *key) {
    for (int i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta[2 * i], key) == 0) return st->meta[2 * i + 1];
    return NULL;
}

hp_status_t hp_safetensors_read_raw(hp_safetensors_t st, const char *name, void *buf,
                                    size_t nbytes) {
    const hp_st_info_t *info;
    HP_TRY(hp_safetensors_find(st, name, &info));
    if (nbytes != info->end - info->begin)
        return hp_error(HP_ERR_INVALID_ARG, "%s: tensor '%s' holds %llu bytes, buffer has %zu",
                        st->what, name, (unsigned long long)(info->end - info->begin), nbytes);
    return read_at(st, buf, nbytes, st->data_start + info->begin);
}

hp_status_t hp_safetensors_read_bytes(hp_safetensors_t st, const char *name, uint64_t offset, void *buf,
                                      size_t nbytes) {
    const hp_st_info_t *info;
    HP_TRY(hp_safetensors_find(st, name, &info));
    uint64_t len = info->end - info->begin;
    if (offset > len || nbytes > len - offset)
        return hp_error(HP_ERR_INVALID_ARG, "%s: tensor '%s' holds %llu bytes; a read of %zu at %llu is outside it",
                        st->what, name, (unsigned long long)len, nbytes, (unsigned long long)offset);
    return read_at(st, buf, nbytes, st->data_start + info->begin + offset);
}

/* ---- conversions ---------------------------------------------------------------------- */

static int st_is_float(hp_st_dtype_t d) {
    return d == HP_ST_F64 || d == HP_ST_F32 || d == HP_ST_BF16 || d == HP_ST_F16;
}
static int st_is_int(hp_st_dtype_t d) {
    return d == HP_ST_BOOL || d == HP_ST_U8 || d == HP_ST_I8 || d == HP_ST_I16 || d == HP_ST_U16 ||
           d == HP_ST_I32 || d == HP_ST_U32 || d == HP_ST_I64 || d == HP_ST_U64;
}

static double load_float(const unsigned char *p, hp_st_dtype_t d) {
    switch (d) {
    case HP_ST_F64: { double v; memcpy(&v, p, 8); return v; }
    case HP_ST_F32: { float v; memcpy(&v, p, 4); return v; }
    case HP_ST_BF16: { uint16_t v; memcpy(&v, p, 2); return hp_bf16_to_f32(v); }
    default: { uint16_t v; memcpy(&v, p, 2); return hp_f16_to_f32(v); }
    }
}

/* Integer value of an element; *neg set for negative values, magnitude in *mag. */
static void load_int(const unsigned char *p, hp_st_dtype_t d, int *neg, uint64_t *mag) {
    int64_t s = 0;
    uint64_t u = 0;
    int is_signed = 1;
    switch (d) {
    case HP_ST_BOOL: case HP_ST_U8: u = p[0]; is_signed = 0; break;
    case HP_ST_I8: { int8_t v; memcpy(&v, p, 1); s = v; break; }
    case HP_ST_I16: { int16_t v; memcpy(&v, p, 2); s = v; break; }
    case HP_ST_U16: { uint16_t v; memcpy(&v, p, 2); u = v; is_signed = 0; break; }
    case HP_ST_I32: { int32_t v; memcpy(&v, p, 4); s = v; break; }
    case HP_ST_U32: { uint32_t v; memcpy(&v, p, 4); u = v; is_signed = 0; break; }
    case HP_ST_I64: { int64_t v; memcpy(&v, p, 8); s = v; break; }
    default: { memcpy(&u, p, 8); is_signed = 0; break; }
    }
    if (is_signed) {
        *neg = s < 0;
        *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    } else {
        *neg = 0;
        *mag = u;
    }
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, n, "(");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (k < n) snprintf(buf + k, n - k, ")");
}

hp_status_t hp_safetensors_read(hp_safetensors_t st, const char *name, hp_tensor_t *dst,
                                int convert) {
    const hp_st_info_t *info;
    HP_TRY(hp_safetensors_find(st, name, &info));
    char b1[128], b2[128];
    int same = info->ndim == dst->ndim;
    for (int d = 0; same && d < dst->ndim; d++) same = info->shape[d] == dst->shape[d];
    if (!same) {
        shape_str(b1, sizeof b1, info->ndim, info->shape);
        shape_str(b2, sizeof b2, dst->ndim, dst->shape);
        return hp_error(HP_ERR_INVALID_ARG, "%s: tensor '%s' has shape %s (%s) in the file but the "
                        "destination has shape %s (%s)", st->what, name, b1,
                        hp_st_dtype_name(info->dtype), b2, hp_dtype_name(dst->dtype));
    }
    hp_st_dtype_t want = hp_st_dtype_from_hp(dst->dtype);
    if (want != info->dtype) {
        int ok = convert && ((st_is_float(info->dtype) && hp_dtype_is_float(dst->dtype)) ||
                             (st_is_int(info->dtype) && !hp_dtype_is_float(dst->dtype)));
        if (!ok)
            return hp_error(HP_ERR_INVALID_ARG, "%s: tensor '%s' is %s in the file, destination "
                            "is %s (%s; conversion needs convert=1 and float->float or "
                            "int->int)", st->what, name, hp_st_dtype_name(info->dtype),
                            hp_dtype_name(dst->dtype), convert ? "not convertible" : "convert=0");
    }
    size_t nbytes = (size_t)(info->end - info->begin);
    int64_t numel = hp_tensor_numel(dst);
    if (want == info->dtype && hp_tensor_is_contiguous(dst))
        return read_at(st, dst->data, nbytes, st->data_start + info->begin);

    unsigned char *raw = malloc(nbytes ? nbytes : 1);
    size_t esz = hp_dtype_size(dst->dtype);
    unsigned char *conv = malloc(numel ? (size_t)numel * esz : 1);
    hp_status_t s = (raw && conv) ? HP_OK
                                  : hp_error(HP_ERR_OOM, "%s: no memory to convert tensor '%s'",
                                             st->what, name);
    if (s == HP_OK) s = read_at(st, raw, nbytes, st->data_start + info->begin);
    size_t ssz = hp_st_dtype_size(info->dtype);
    for (int64_t i = 0; s == HP_OK && i < numel && want != info->dtype; i++) {
        const unsigned char *p = raw + (size_t)i * ssz;
        unsigned char *q = conv + (size_t)i * esz;
        if (hp_dtype_is_float(dst->dtype)) {
            float f = (float)load_float(p, info->dtype);
            if (dst->dtype == HP_F32) memcpy(q, &f, 4);
            else {
                uint16_t h = dst->dtype == HP_BF16 ? hp_f32_to_bf16(f) : hp_f32_to_f16(f);
                memcpy(q, &h, 2);
            }
        } else {
            int neg;
            uint64_t mag;
            load_int(p, info->dtype, &neg, &mag);
            int fits;
            switch (dst->dtype) {
            case HP_U8: fits = !neg && mag <= 255; break;
            case HP_I32: fits = neg ? mag <= 2147483648u : mag <= 2147483647u; break;
            default: fits = neg ? mag <= (uint64_t)INT64_MAX + 1 : mag <= (uint64_t)INT64_MAX; break;
            }
            if (!fits) {
                s = hp_error(HP_ERR_INVALID_ARG, "%s: tensor '%s' element %lld (%s%llu) does not "
                             "fit in %s", st->what, name, (long long)i, neg ? "-" : "",
                             (unsigned long long)mag, hp_dtype_name(dst->dtype));
                break;
            }
            int64_t v = neg ? (int64_t)(0 - mag) : (int64_t)mag;
            if (dst->dtype == HP_U8) q[0] = (unsigned char)v;
            else if (dst->dtype == HP_I32) { int32_t x = (int32_t)v; memcpy(q, &x, 4); }
            else memcpy(q, &v, 8);
        }
    }
    if (s == HP_OK) {
        hp_tensor_t src;
        s = hp_tensor_init(&src, dst->dtype, dst->ndim, dst->shape,
                           want == info->dtype ? (void *)raw : (void *)conv);
        if (s == HP_OK) s = hp_tensor_copy(dst, &src);
    }
    free(raw);
    free(conv);
    return s;
}

/* ---- writer --------------------------------------------------------------------------- */

typedef struct {
    hp_st_dtype_t dtype;
    int ndim;
    int64_t shape[HP_MAX_DIMS];
    uint64_t nbytes;
} entry_plan_t;

/* streaming: an entry without data is filled when it is written */
static hp_status_t plan_entry(const hp_st_entry_t *e, entry_plan_t *p, const char *path, int streaming) {
    if (!e->name || !e->name[0] || strlen(e->name) > HP_ST_MAX_NAME ||
        strcmp(e->name, "__metadata__") == 0)
        return hp_error(HP_ERR_INVALID_ARG, "%s: tensor name '%s' is empty, too long or reserved",
                        path, e->name ? e->name : "(null)");
    uint64_t numel = 1;
    if (e->tensor) {
        p->dtype = e->dtype == HP_ST_AUTO ? hp_st_dtype_from_hp(e->tensor->dtype) : e->dtype;
        if (p->dtype == HP_ST_AUTO || st_to_hp(p->dtype) < 0 ||
            (st_to_hp(p->dtype) != (int)e->tensor->dtype &&
             !(hp_dtype_is_float(e->tensor->dtype) && st_is_float(p->dtype))))
            return hp_error(HP_ERR_INVALID_ARG, "%s: tensor '%s' (%s) cannot be stored as %s; an "
                            "hp tensor is stored in its own dtype or, for floats, F32/BF16/F16",
                            path, e->name, hp_dtype_name(e->tensor->dtype),
                            hp_st_dtype_name(p->dtype));
        p->ndim = e->tensor->ndim;
        for (int d = 0; d < p->ndim; d++) p->shape[d] = e->tensor->shape[d];
    } else {
        if (e->dtype < 0 || e->dtype >= HP_ST_DTYPE_COUNT || e->ndim < 0 || e->ndim > HP_MAX_DIMS ||
            (e->ndim > 0 && !e->shape))
            return hp_error(HP_ERR_INVALID_ARG, "%s: raw tensor '%s' needs a dtype, 0..%d dims "
                            "and a shape", path, e->name, HP_MAX_DIMS);
        p->dtype = e->dtype;
        p->ndim = e->ndim;
        for (int d = 0; d < p->ndim; d++) p->shape[d] = e->shape[d];
    }
    for (int d = 0; d < p->ndim; d++) {
        if (p->shape[d] < 0 || __builtin_mul_overflow(numel, (uint64_t)p->shape[d], &numel))
            return hp_error(HP_ERR_INVALID_ARG, "%s: tensor '%s' has a negative or overflowing "
                            "shape", path, e->name);
    }
    if (__builtin_mul_overflow(numel, (uint64_t)hp_st_dtype_size(p->dtype), &p->nbytes))
        return hp_error(HP_ERR_INVALID_ARG, "%s: tensor '%s' size overflows", path, e->name);
    if (!e->tensor && p->nbytes > 0 && !e->raw && !streaming)
        return hp_error(HP_ERR_INVALID_ARG, "%s: raw tensor '%s' has no data", path, e->name);
    return HP_OK;
}

static hp_status_t write_all(FILE *f, const void *p, size_t n, const char *path) {
    if (n && fwrite(p, 1, n, f) != n)
        return hp_error(HP_ERR_IO, "%s: write of %zu bytes failed: %s (disk full?)", path, n,
                        strerror(errno));
    return HP_OK;
}

/* Writes the bytes and, when hash != NULL, stores their XXH3-64 (the checkpoint checksum). */
static hp_status_t write_bytes(FILE *f, const void *p, size_t n, const char *path, uint64_t *hash) {
    if (hash) *hash = XXH3_64bits(n ? p : "", n);
    return write_all(f, p, n, path);
}

static hp_status_t write_entry_data(FILE *f, const hp_st_entry_t *e, const entry_plan_t *p,
                                    const char *path, uint64_t *hash, hp_st_fill_fn fill, void *ctx, int i) {
    const hp_tensor_t *t = e->tensor;
    if (!t && !e->raw && fill) {   /* streaming: the caller produces the tensor now */
        HP_TRY(fill(ctx, i, &t));
        int same = t && t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++) same = t->shape[d] == p->shape[d];
        if (!same || (st_to_hp(p->dtype) != (int)t->dtype && !(hp_dtype_is_float(t->dtype) && st_is_float(p->dtype))))
            return hp_error(HP_ERR_INVALID_ARG, "%s: the tensor produced for '%s' does not have the declared shape "
                            "and a dtype storable as %s", path, e->name, hp_st_dtype_name(p->dtype));
    }
    if (!t) return write_bytes(f, e->raw, (size_t)p->nbytes, path, hash);
    if (st_to_hp(p->dtype) == (int)t->dtype && hp_tensor_is_contiguous(t))
        return write_bytes(f, t->data, (size_t)p->nbytes, path, hash);
    hp_tensor_t tmp;
    HP_TRY(hp_tensor_malloc(&tmp, (hp_dtype_t)st_to_hp(p->dtype), t->ndim, t->shape));
    hp_status_t s = hp_tensor_copy(&tmp, t);
    if (s == HP_OK) s = write_bytes(f, tmp.data, (size_t)p->nbytes, path, hash);
    hp_tensor_free_data(&tmp);
    return s;
}

hp_status_t hp_safetensors_write(const char *path, const hp_st_entry_t *entries, int n,
                                 const char *const *meta, int n_meta) {
    return hp_safetensors_write_hashed(path, entries, n, meta, n_meta, NULL);
}

static hp_status_t write_impl(const char *path, const hp_st_entry_t *entries, int n, const char *const *meta,
                              int n_meta, uint64_t *xxh3, hp_st_fill_fn fill, void *ctx);

hp_status_t hp_safetensors_write_hashed(const char *path, const hp_st_entry_t *entries, int n,
                                        const char *const *meta, int n_meta, uint64_t *xxh3) {
    return write_impl(path, entries, n, meta, n_meta, xxh3, NULL, NULL);
}

hp_status_t hp_safetensors_write_stream(const char *path, const hp_st_entry_t *entries, int n,
                                        const char *const *meta, int n_meta, hp_st_fill_fn fill,
                                        void *ctx, uint64_t *xxh3) {
    if (!fill) return hp_error(HP_ERR_INVALID_ARG, "%s: hp_safetensors_write_stream needs a fill function", path);
    return write_impl(path, entries, n, meta, n_meta, xxh3, fill, ctx);
}

static hp_status_t write_impl(const char *path, const hp_st_entry_t *entries, int n, const char *const *meta,
                              int n_meta, uint64_t *xxh3, hp_st_fill_fn fill, void *ctx) {
    if (n < 0 || n_meta < 0 || (n > 0 && !entries) || (n_meta > 0 && !meta))
        return hp_error(HP_ERR_INVALID_ARG, "%s: bad entry or metadata count", path);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (entries[i].name && entries[j].name && strcmp(entries[i].name, entries[j].name) == 0)
                return hp_error(HP_ERR_INVALID_ARG, "%s: tensor name '%s' given twice", path,
                                entries[i].name);
    entry_plan_t *plan = calloc((size_t)n + 1, sizeof *plan);
    if (!plan) return hp_error(HP_ERR_OOM, "%s: no memory for %d entries", path, n);
    hp_status_t s = HP_OK;
    struct json_object *root = json_object_new_object();
    if (!root) s = hp_error(HP_ERR_OOM, "%s: no memory for the header", path);
    if (s == HP_OK && n_meta > 0) {
        struct json_object *m = json_object_new_object();
        for (int i = 0; i < n_meta && m; i++) {
            if (!meta[2 * i] || !meta[2 * i + 1]) {
                s = hp_error(HP_ERR_INVALID_ARG, "%s: metadata pair %d has a NULL key or value", path, i);
                break;
            }
            json_object_object_add(m, meta[2 * i], json_object_new_string(meta[2 * i + 1]));
        }
        json_object_object_add(root, "__metadata__", m);
    }
    uint64_t off = 0;
    for (int i = 0; s == HP_OK && i < n; i++) {
        s = plan_entry(&entries[i], &plan[i], path, fill != NULL);
        if (s != HP_OK) break;
        struct json_object *e = json_object_new_object();
        struct json_object *shape = json_object_new_array();
        struct json_object *offs = json_object_new_array();
        for (int d = 0; d < plan[i].ndim; d++)
            json_object_array_add(shape, json_object_new_int64(plan[i].shape[d]));
        json_object_array_add(offs, json_object_new_int64((int64_t)off));
        json_object_array_add(offs, json_object_new_int64((int64_t)(off + plan[i].nbytes)));
        json_object_object_add(e, "dtype", json_object_new_string(hp_st_dtype_name(plan[i].dtype)));
        json_object_object_add(e, "shape", shape);
        json_object_object_add(e, "data_offsets", offs);
        json_object_object_add(root, entries[i].name, e);
        off += plan[i].nbytes;
    }
    if (s == HP_OK) {   // atomic: a temporary beside path, fsync'ed and renamed over it
        const char *js = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PLAIN);
        size_t jl = strlen(js);
        size_t padded = (jl + 7) / 8 * 8;
        char *tmp_path = NULL;
        FILE *f = NULL;
        s = hp_file_atomic_begin(path, &f, &tmp_path);
        if (s == HP_OK) {
            unsigned char lenb[8];
            for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)((uint64_t)padded >> (8 * i));
            s = write_all(f, lenb, 8, path);
            if (s == HP_OK) s = write_all(f, js, jl, path);
            for (size_t i = jl; s == HP_OK && i < padded; i++) s = write_all(f, " ", 1, path);
            for (int i = 0; s == HP_OK && i < n; i++) s = write_entry_data(f, &entries[i], &plan[i], path, xxh3 ? &xxh3[i] : NULL, fill, ctx, i);
            if (s == HP_OK) s = hp_file_atomic_commit(path, f, tmp_path);
            else hp_file_atomic_cancel(f, tmp_path);
        }
    }
    json_object_put(root);
    free(plan);
    return s;
}
