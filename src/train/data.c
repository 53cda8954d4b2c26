/* Datasets (text, JSONL, pre-tokenized binary, SFT conversations; files memory-mapped and
 * indexed by document at open) and the per-rank dataloader: for pretraining it packs BOS +
 * document + EOS into a token buffer and cuts seq_len + 1 windows from it; for SFT it renders
 * each conversation with the chat template, masks all but the assistant tokens and packs whole
 * samples into rows; a state blob resumes exactly. */
#include "hyperparallel/data.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyperparallel/chat_template.h"
#include "tokenizer-impl.h"   /* hp_tok_utf8_check: name the data file and line of bad text */

enum fmt { FMT_TEXT = 0, FMT_JSONL, FMT_BIN, FMT_CHAT };
enum sep { SEP_BLANK = 0, SEP_PERCENT, SEP_LINE };
static const char *fmt_names_[] = {"text", "jsonl", "bin", "chat"};

typedef struct doc {
    const char *ptr;   /* text: the document; jsonl: the line */
    size_t len;
    int32_t file;
    int64_t line;      /* 1-based line of the document's start (messages) */
} doc_t;

typedef struct mapped_file {
    char *path;
    const char *data;
    size_t size;
} mapped_file_t;

struct hp_dataset {
    enum fmt fmt;
    enum sep sep;
    char field[HP_CONFIG_STR_MAX];
    int bin_width;           /* 2 or 4 */
    mapped_file_t *files;
    int nfiles;
    doc_t *docs;             /* text/jsonl */
    int64_t n;               /* documents, or tokens for bin */
    int64_t n_val;           /* the last n_val of them are the validation split */
    char *scratch;           /* decoded JSONL document */
    size_t scratch_cap;
};

struct hp_dataloader {
    hp_dataset_t ds;
    hp_text_encoder_t enc;
    hp_dataloader_options_t o;
    hp_sft_options_t sft;    /* chat data */
    int64_t n_split;         /* documents (tokens) of the split, recorded in the state */
    int64_t begin, end;      /* this rank's shard, absolute indices into docs (tokens) */
    int64_t pos;             /* next document (token) */
    int64_t epoch;
    int64_t samples;
    int64_t epoch_tokens;    /* tokens added during the current epoch (loop guard) */
    int32_t *buf;            /* token buffer, live part [start, end_) */
    size_t start, end_, cap;
    /* After a resume with another dp degree (hp_dataloader_state_reshard): the unread ranges
     * of the old ranks' interrupted passes, read before this rank's own shard; pos walks
     * carry[carry_i]. carry_n == 0 otherwise. */
    int64_t (*carry)[2];     /* absolute [begin, end) of documents (tokens for bin) */
    int carry_n, carry_i;
    /* SFT (chat format): the sample read but not yet placed in a row (it did not fit) */
    hp_chat_sample_t smp;
    hp_chat_render_t rnd;
    int32_t *s_ids;          /* (s_n,) the rendered conversation's ids */
    uint8_t *s_mask;         /* (s_n,) 1 = assistant token */
    size_t s_n, s_cap;
    bool pending;
    int64_t pending_doc;     /* its document index */
    int32_t *p_in, *p_lab;   /* (p_n,) its (input, label) pairs */
    size_t p_n, p_cap;
};

/* The range the loader reads now: the current carried range, or its shard. */
static int64_t cur_end(const struct hp_dataloader *dl) {
    return dl->carry_i < dl->carry_n ? dl->carry[dl->carry_i][1] : dl->end;
}

/* The current range is exhausted: the next carried range, the start of a fresh pass over the
 * shard after the last one, or (not looping) the end. Returns false at the end. */
static bool next_range(struct hp_dataloader *dl) {
    if (dl->carry_i < dl->carry_n) {
        if (++dl->carry_i < dl->carry_n) {
            dl->pos = dl->carry[dl->carry_i][0];
            return true;
        }
        free(dl->carry);
        dl->carry = NULL;
        dl->carry_n = dl->carry_i = 0;
        if (!dl->o.loop) {   /* stay at the end: pos must not fall back into the shard */
            dl->pos = dl->end;
            return false;
        }
    }
    if (!dl->o.loop) return false;
    dl->pos = dl->begin;
    dl->epoch++;
    dl->epoch_tokens = 0;
    return true;
}

/* ---- encoders ------------------------------------------------------------------------- */

static hp_status_t encode_bytes(void *ctx, const char *text, size_t len, int32_t *ids, size_t cap, size_t *n_ids) {
    for (size_t i = 0; i < len && i < cap; i++) ids[i] = (unsigned char)text[i];
    *n_ids = len;
    return HP_OK;
}

hp_text_encoder_t hp_text_encoder_bytes(void) {
    return (hp_text_encoder_t){encode_bytes, NULL, 256, 257};
}

/* ---- files ---------------------------------------------------------------------------- */

static hp_status_t map_file(const char *path, mapped_file_t *f) {
    f->path = strdup(path);
    f->data = NULL;
    f->size = 0;
    if (!f->path) return hp_error(HP_ERR_OOM, "data: out of memory for the path '%s'", path);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return hp_error(HP_ERR_IO, "data file '%s': cannot open (%s); hint: check data.path", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return hp_error(HP_ERR_IO, "data file '%s': cannot stat (%s)", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return hp_error(HP_ERR_IO, "data file '%s': not a regular file", path);
    }
    f->size = (size_t)st.st_size;
    if (f->size > 0) {
        void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return hp_error(HP_ERR_IO, "data file '%s': mmap of %zu bytes failed (%s)", path, f->size, strerror(e));
        }
        f->data = p;
    }
    close(fd);
    return HP_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Regular files directly in `dir` (symlinks, hidden names and fortune's *.dat index files
 * skipped), in byte order of their names. */
static hp_status_t list_dir(const char *dir, char ***names, int *count) {
    DIR *d = opendir(dir);
    if (!d) return hp_error(HP_ERR_IO, "data directory '%s': cannot open (%s)", dir, strerror(errno));
    char **v = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    hp_status_t st = HP_OK;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || (len > 4 && strcmp(e->d_name + len - 4, ".dat") == 0)) continue;
        char *full = hp_malloc(strlen(dir) + len + 2);
        if (!full) { st = hp_error(HP_ERR_OOM, "data: out of memory listing '%s'", dir); break; }
        sprintf(full, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(full, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            free(full);
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) { free(full); st = hp_error(HP_ERR_OOM, "data: out of memory listing '%s'", dir); break; }
            v = nv;
        }
        v[n++] = full;
    }
    closedir(d);
    if (st != HP_OK) {
        for (int i = 0; i < n; i++) free(v[i]);
        free(v);
        return st;
    }
    if (n == 0) {
        free(v);
        return hp_error(HP_ERR_IO, "data directory '%s' holds no data files (regular, not hidden, not *.dat)", dir);
    }
    qsort(v, (size_t)n, sizeof *v, cmp_str);
    *names = v;
    *count = n;
    return HP_OK;
}

/* ---- indexing ------------------------------------------------------------------------- */

static hp_status_t add_doc(hp_dataset_t ds, int64_t *cap, const char *p, size_t len, int file, int64_t line) {
    if (ds->n == *cap) {
        *cap = *cap ? 2 * *cap : 1024;
        doc_t *nd = realloc(ds->docs, (size_t)*cap * sizeof *nd);
        if (!nd) return hp_error(HP_ERR_OOM, "data: out of memory indexing documents");
        ds->docs = nd;
    }
    ds->docs[ds->n++] = (doc_t){p, len, file, line};
    return HP_OK;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/* Closes a text document [s, e): trims surrounding whitespace lines; empty ones are dropped. */
static hp_status_t close_text_doc(hp_dataset_t ds, int64_t *cap, const char *s, const char *e, int file,
                                  int64_t line) {
    while (s < e && (*s == '\n' || *s == '\r')) s++;
    while (e > s && is_space(e[-1])) e--;
    if (e == s) return HP_OK;
    return add_doc(ds, cap, s, (size_t)(e - s), file, line);
}

static hp_status_t index_text(hp_dataset_t ds, int64_t *cap, int fi) {
    const mapped_file_t *f = &ds->files[fi];
    if (f->size == 0) return HP_OK;
    const char *nul = memchr(f->data, 0, f->size);
    if (nul)
        return hp_error(HP_ERR_FORMAT,
                        "data file '%s': NUL byte at offset %zu: not a text file; hint: pre-tokenized files need "
                        "data.format=bin",
                        f->path, (size_t)(nul - f->data));
    const char *p = f->data, *end = f->data + f->size;
    const char *doc_start = p;
    int64_t line = 1, doc_line = 1;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        const char *next = nl ? nl + 1 : end;
        size_t ll = (size_t)(le - p);
        if (ll > 0 && p[ll - 1] == '\r') ll--;
        bool sep = false;
        if (ds->sep == SEP_PERCENT) {
            sep = ll == 1 && p[0] == '%';
        } else if (ds->sep == SEP_BLANK) {
            sep = true;
            for (size_t i = 0; i < ll; i++) sep &= p[i] == ' ' || p[i] == '\t';
        }
        if (ds->sep == SEP_LINE) {
            HP_TRY(close_text_doc(ds, cap, p, p + ll, fi, line));
        } else if (sep) {
            HP_TRY(close_text_doc(ds, cap, doc_start, p, fi, doc_line));
            doc_start = next;
            doc_line = line + 1;
        }
        p = next;
        line++;
    }
    if (ds->sep != SEP_LINE) HP_TRY(close_text_doc(ds, cap, doc_start, end, fi, doc_line));
    return HP_OK;
}

/* Parses one JSONL line; on success *obj holds the document object (caller puts it). */
static hp_status_t parse_jsonl_line(hp_dataset_t ds, const doc_t *d, json_object **obj, const char **text,
                                    size_t *len) {
    const char *path = ds->files[d->file].path;
    struct json_tokener *tok = json_tokener_new();
    if (!tok) return hp_error(HP_ERR_OOM, "data: out of memory for the JSON parser");
    json_object *o = json_tokener_parse_ex(tok, d->ptr, (int)d->len);
    enum json_tokener_error je = json_tokener_get_error(tok);
    size_t used = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (je == json_tokener_continue || (je == json_tokener_success && !o && d->len > 0)) {
        json_object_put(o);
        return hp_error(HP_ERR_FORMAT, "%s:%lld: incomplete JSON (a JSONL file holds one JSON object per line)", path,
                        (long long)d->line);
    }
    if (je != json_tokener_success) {
        json_object_put(o);
        return hp_error(HP_ERR_FORMAT, "%s:%lld: invalid JSON: %s", path, (long long)d->line,
                        json_tokener_error_desc(je));
    }
    for (size_t i = used; i < d->len; i++)
        if (!is_space(d->ptr[i])) {
            json_object_put(o);
            return hp_error(HP_ERR_FORMAT, "%s:%lld: unexpected text after the JSON value at column %zu", path,
                            (long long)d->line, used + 1);
        }
    json_object *v = NULL;
    if (!json_object_is_type(o, json_type_object) || !json_object_object_get_ex(o, ds->field, &v) ||
        !json_object_is_type(v, json_type_string)) {
        const char *why = !json_object_is_type(o, json_type_object) ? "the line is not a JSON object"
                          : !v ? "the field is missing"
                               : "the field is not a string";
        json_object_put(o);
        return hp_error(HP_ERR_FORMAT, "%s:%lld: expected a string field '%s' (%s); hint: set data.jsonl_field", path,
                        (long long)d->line, ds->field, why);
    }
    *obj = o;
    *text = json_object_get_string(v);
    *len = (size_t)json_object_get_string_len(v);
    return HP_OK;
}

static hp_status_t index_jsonl(hp_dataset_t ds, int64_t *cap, int fi) {
    const mapped_file_t *f = &ds->files[fi];
    const char *p = f->data, *end = f->data + f->size;
    int64_t line = 1;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        bool blank = true;
        for (const char *q = p; q < le; q++) blank &= is_space(*q);
        if (!blank) {
            HP_TRY(add_doc(ds, cap, p, (size_t)(le - p), fi, line));
            json_object *o;
            const char *t;
            size_t l;
            HP_TRY(parse_jsonl_line(ds, &ds->docs[ds->n - 1], &o, &t, &l));
            json_object_put(o);
        }
        p = nl ? nl + 1 : end;
        line++;
    }
    return HP_OK;
}

/* SFT lines: every line is parsed and checked at open (roles, contents, an answer to train on). */
static hp_status_t index_chat(hp_dataset_t ds, int64_t *cap, int fi) {
    const mapped_file_t *f = &ds->files[fi];
    const char *p = f->data, *end = f->data + f->size;
    int64_t line = 1;
    hp_chat_sample_t s = {0};
    hp_status_t st = HP_OK;
    while (p < end && st == HP_OK) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        bool blank = true;
        for (const char *q = p; q < le; q++) blank &= is_space(*q);
        if (!blank) {
            char where[HP_CONFIG_STR_MAX + 64];
            snprintf(where, sizeof where, "%s:%lld: ", f->path, (long long)line);
            st = hp_chat_sample_parse(p, (size_t)(le - p), where, true, &s);
            if (st == HP_OK) st = add_doc(ds, cap, p, (size_t)(le - p), fi, line);
        }
        p = nl ? nl + 1 : end;
        line++;
    }
    hp_chat_sample_free(&s);
    return st;
}

hp_dataset_options_t hp_dataset_options_from_config(const hp_config_t *cfg) {
    return (hp_dataset_options_t){cfg->data.path, cfg->data.format, cfg->data.text_separator, cfg->data.jsonl_field,
                                  cfg->data.bin_dtype, cfg->data.validation_fraction};
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

hp_status_t hp_dataset_open(const hp_dataset_options_t *o, hp_dataset_t *out) {
    if (!o || !out) return hp_error(HP_ERR_INVALID_ARG, "hp_dataset_open: NULL argument");
    *out = NULL;
    if (!o->path || !*o->path)
        return hp_error(HP_ERR_INVALID_ARG, "data: no data path given; hint: set data.path to a text, JSONL or .bin file");
    if (!(o->validation_fraction >= 0 && o->validation_fraction < 1))
        return hp_error(HP_ERR_INVALID_ARG, "data: validation_fraction must be in [0, 1), got %g", o->validation_fraction);
    hp_dataset_t ds = hp_calloc(1, sizeof *ds);
    if (!ds) return hp_error(HP_ERR_OOM, "data: out of memory");
    hp_status_t st = HP_OK;
    const char *format = o->format && *o->format ? o->format : "auto";
    const char *sep = o->text_separator && *o->text_separator ? o->text_separator : "blank_line";
    const char *dtype = o->bin_dtype && *o->bin_dtype ? o->bin_dtype : "uint16";
    snprintf(ds->field, sizeof ds->field, "%s", o->jsonl_field && *o->jsonl_field ? o->jsonl_field : "text");
    struct stat sb;
    bool is_dir = stat(o->path, &sb) == 0 && S_ISDIR(sb.st_mode);
    if (strcmp(format, "auto") == 0) {
        ds->fmt = ends_with(o->path, ".jsonl") || ends_with(o->path, ".json") ? FMT_JSONL
                  : ends_with(o->path, ".bin")                               ? FMT_BIN
                                                                              : FMT_TEXT;
    } else if (strcmp(format, "text") == 0) {
        ds->fmt = FMT_TEXT;
    } else if (strcmp(format, "jsonl") == 0) {
        ds->fmt = FMT_JSONL;
    } else if (strcmp(format, "bin") == 0) {
        ds->fmt = FMT_BIN;
    } else if (strcmp(format, "chat") == 0 || strcmp(format, "sft") == 0) {
        ds->fmt = FMT_CHAT;
    } else {
        st = hp_error(HP_ERR_INVALID_ARG, "data: format '%s' is not one of auto|text|jsonl|bin|chat", format);
        goto fail;
    }
    if (strcmp(sep, "blank_line") == 0) ds->sep = SEP_BLANK;
    else if (strcmp(sep, "percent") == 0) ds->sep = SEP_PERCENT;
    else if (strcmp(sep, "line") == 0) ds->sep = SEP_LINE;
    else {
        st = hp_error(HP_ERR_INVALID_ARG, "data: text_separator '%s' is not one of blank_line|percent|line", sep);
        goto fail;
    }
    if (strcmp(dtype, "uint16") == 0) ds->bin_width = 2;
    else if (strcmp(dtype, "uint32") == 0) ds->bin_width = 4;
    else {
        st = hp_error(HP_ERR_INVALID_ARG, "data: bin_dtype '%s' is not one of uint16|uint32", dtype);
        goto fail;
    }

    char **names = NULL;
    int nnames = 0;
    if (is_dir) {
        if (ds->fmt == FMT_BIN) {
            st = hp_error(HP_ERR_INVALID_ARG, "data: '%s' is a directory; the bin format reads one file", o->path);
            goto fail;
        }
        st = list_dir(o->path, &names, &nnames);
        if (st != HP_OK) goto fail;
    } else {
        names = hp_malloc(sizeof *names);
        if (names) names[0] = strdup(o->path);
        if (!names || !names[0]) {
            free(names);
            st = hp_error(HP_ERR_OOM, "data: out of memory");
            goto fail;
        }
        nnames = 1;
    }
    ds->files = hp_calloc((size_t)nnames, sizeof *ds->files);
    if (!ds->files) st = hp_error(HP_ERR_OOM, "data: out of memory");
    for (int i = 0; i < nnames && st == HP_OK; i++) {
        st = map_file(names[i], &ds->files[i]);
        ds->nfiles = i + 1;
    }
    for (int i = 0; i < nnames; i++) free(names[i]);
    free(names);
    if (st != HP_OK) goto fail;

    int64_t cap = 0;
    if (ds->fmt == FMT_BIN) {
        const mapped_file_t *f = &ds->files[0];
        if (f->size % (size_t)ds->bin_width != 0) {
            st = hp_error(HP_ERR_FORMAT,
                          "data file '%s': %zu bytes is not a multiple of %d (data.bin_dtype=%s); hint: check the "
                          "dtype the file was written with",
                          f->path, f->size, ds->bin_width, dtype);
            goto fail;
        }
        ds->n = (int64_t)(f->size / (size_t)ds->bin_width);
    } else {
        for (int i = 0; i < ds->nfiles && st == HP_OK; i++)
            st = ds->fmt == FMT_TEXT    ? index_text(ds, &cap, i)
                 : ds->fmt == FMT_CHAT ? index_chat(ds, &cap, i)
                                       : index_jsonl(ds, &cap, i);
        if (st != HP_OK) goto fail;
    }
    if (ds->n == 0) {
        st = hp_error(HP_ERR_FORMAT, "data '%s': no %s found (format %s)", o->path,
                      ds->fmt == FMT_BIN ? "tokens" : "documents", fmt_names_[ds->fmt]);
        goto fail;
    }
    if (o->validation_fraction > 0) {
        double v = o->validation_fraction * (double)ds->n;
        ds->n_val = (int64_t)v;
        if ((double)ds->n_val < v) ds->n_val++;   /* ceil */
        if (ds->n_val >= ds->n) {
            st = hp_error(HP_ERR_INVALID_ARG,
                          "data '%s': validation_fraction %g of %lld %s leaves no training data", o->path,
                          o->validation_fraction, (long long)ds->n, ds->fmt == FMT_BIN ? "tokens" : "documents");
            goto fail;
        }
    }
    *out = ds;
    return HP_OK;
fail:
    hp_dataset_close(ds);
    return st;
}

void hp_dataset_close(hp_dataset_t ds) {
    if (!ds) return;
    for (int i = 0; i < ds->nfiles; i++) {
        if (ds->files[i].data) munmap((void *)ds->files[i].data, ds->files[i].size);
        free(ds->files[i].path);
    }
    free(ds->files);
    free(ds->docs);
    free(ds->scratch);
    free(ds);
}

int64_t hp_dataset_num_documents(hp_dataset_t ds, hp_data_split_t split) {
    return split == HP_SPLIT_TRAIN ? ds->n - ds->n_val : ds->n_val;
}

int hp_dataset_num_files(hp_dataset_t ds) { return ds->nfiles; }

const char *hp_dataset_format(hp_dataset_t ds) { return fmt_names_[ds->fmt]; }

/* Document at an absolute index. */
static hp_status_t doc_text(hp_dataset_t ds, int64_t idx, const char **text, size_t *len) {
    const doc_t *d = &ds->docs[idx];
    if (ds->fmt == FMT_TEXT || ds->fmt == FMT_CHAT) {   /* a chat document is its JSONL line */
        *text = d->ptr;
        *len = d->len;
        return HP_OK;
    }
    json_object *o;
    const char *t;
    size_t l;
    HP_TRY(parse_jsonl_line(ds, d, &o, &t, &l));
    if (l + 1 > ds->scratch_cap) {
        size_t nc = (l + 1) * 2;
        char *ns = realloc(ds->scratch, nc);
        if (!ns) {
            json_object_put(o);
            return hp_error(HP_ERR_OOM, "data: out of memory for a %zu-byte document", l);
        }
        ds->scratch = ns;
        ds->scratch_cap = nc;
    }
    memcpy(ds->scratch, t, l);
    ds->scratch[l] = '\0';
    json_object_put(o);
    *text = ds->scratch;
    *len = l;
    return HP_OK;
}

hp_status_t hp_dataset_document(hp_dataset_t ds, hp_data_split_t split, int64_t i, const char **text, size_t *len) {
    if (ds->fmt == FMT_BIN)
        return hp_error(HP_ERR_INVALID_ARG, "hp_dataset_document: a bin dataset has tokens, not documents");
    int64_t n = hp_dataset_num_documents(ds, split);
    if (i < 0 || i >= n)
        return hp_error(HP_ERR_INVALID_ARG, "hp_dataset_document: index %lld outside the %lld documents of the split",
                        (long long)i, (long long)n);
    return doc_text(ds, (split == HP_SPLIT_TRAIN ? 0 : ds->n - ds->n_val) + i, text, len);
}

/* ---- loader --------------------------------------------------------------------------- */

hp_status_t hp_dataloader_create(hp_dataset_t ds, const hp_text_encoder_t *enc, const hp_dataloader_options_t *o,
                                 hp_dataloader_t *out) {
    return hp_dataloader_create_sft(ds, enc, o, NULL, out);
}

hp_status_t hp_dataloader_create_sft(hp_dataset_t ds, const hp_text_encoder_t *enc, const hp_dataloader_options_t *o,
                                     const hp_sft_options_t *sft_opts, hp_dataloader_t *out) {
    const hp_sft_options_t sft = sft_opts ? *sft_opts : (hp_sft_options_t){0};
    if (!ds || !o || !out) return hp_error(HP_ERR_INVALID_ARG, "hp_dataloader_create: NULL argument");
    *out = NULL;
    if (o->seq_len < 1 || o->batch_size < 1)
        return hp_error(HP_ERR_INVALID_ARG, "dataloader: seq_len (%lld) and batch_size (%lld) must be >= 1",
                        (long long)o->seq_len, (long long)o->batch_size);
    if (o->dp_world < 1 || o->dp_rank < 0 || o->dp_rank >= o->dp_world)
        return hp_error(HP_ERR_INVALID_ARG, "dataloader: dp_rank %d must be in [0, dp_world=%d)", o->dp_rank,
                        o->dp_world);
    if (ds->fmt != FMT_BIN && (!enc || !enc->encode))
        return hp_error(HP_ERR_INVALID_ARG, "dataloader: %s data needs a text encoder (tokenizer)", fmt_names_[ds->fmt]);
    if (ds->fmt == FMT_CHAT && !sft.chat_template)
        return hp_error(HP_ERR_INVALID_ARG, "dataloader: chat (SFT) data needs a chat template (the tokenizer "
                                            "folder's or data.chat_template)");
    if (ds->fmt == FMT_CHAT && (sft.pad_id < 0 || (o->vocab_size > 0 && sft.pad_id >= o->vocab_size)))
        return hp_error(HP_ERR_INVALID_ARG, "dataloader: pad id %d is outside the vocabulary [0, %lld)", sft.pad_id,
                        (long long)o->vocab_size);
    int64_t n = hp_dataset_num_documents(ds, o->split);
    const char *split = o->split == HP_SPLIT_TRAIN ? "train" : "validation";
    const char *unit = ds->fmt == FMT_BIN ? "tokens" : "documents";
    if (n < o->dp_world)
        return hp_error(HP_ERR_INVALID_ARG,
                        "dataloader: the %s split has %lld %s, fewer than the %d data-parallel ranks%s", split,
                        (long long)n, unit, o->dp_world,
                        o->split == HP_SPLIT_VALIDATION ? "; hint: raise data.validation_fraction" : "");
    hp_dataloader_t dl = hp_calloc(1, sizeof *dl);
    if (!dl) return hp_error(HP_ERR_OOM, "dataloader: out of memory");
    dl->ds = ds;
    if (enc) dl->enc = *enc;
    dl->o = *o;
    dl->sft = sft;
    dl->n_split = n;
    /* Contiguous shards as HF datasets' shard(contiguous=True): the first n % W ranks get one more. */
    int64_t div = n / o->dp_world, mod = n % o->dp_world, r = o->dp_rank;
    int64_t base = o->split == HP_SPLIT_TRAIN ? 0 : ds->n - ds->n_val;
    dl->begin = base + div * r + (r < mod ? r : mod);
    dl->end = dl->begin + div + (r < mod ? 1 : 0);
    if (ds->fmt == FMT_BIN && dl->end - dl->begin < o->seq_len + 1) {
        int64_t have = dl->end - dl->begin;
        free(dl);
        return hp_error(HP_ERR_INVALID_ARG,
                        "dataloader: rank %d's shard of the %s split has %lld tokens, fewer than seq_len + 1 = %lld",
                        o->dp_rank, split, (long long)have, (long long)(o->seq_len + 1));
    }
    dl->cap = (size_t)(4 * (o->seq_len + 1) + 4096);
    dl->buf = hp_malloc(dl->cap * sizeof *dl->buf);
    if (!dl->buf) {
        free(dl);
        return hp_error(HP_ERR_OOM, "dataloader: out of memory for the token buffer");
    }
    hp_dataloader_reset(dl);
    *out = dl;
    return HP_OK;
}

void hp_dataloader_destroy(hp_dataloader_t dl) {
    if (!dl) return;
    free(dl->carry);
    hp_chat_sample_free(&dl->smp);
    hp_chat_render_free(&dl->rnd);
    free(dl->s_ids);
    free(dl->s_mask);
    free(dl->p_in);
    free(dl->p_lab);
    free(dl->buf);
    free(dl);
}

void hp_dataloader_reset(hp_dataloader_t dl) {
    free(dl->carry);
    dl->carry = NULL;
    dl->carry_n = dl->carry_i = 0;
    dl->pos = dl->begin;
    dl->epoch = 0;
    dl->samples = 0;
    dl->epoch_tokens = 0;
    dl->start = dl->end_ = 0;
    dl->pending = false;
}

int64_t hp_dataloader_epoch(hp_dataloader_t dl) { return dl->epoch; }
int64_t hp_dataloader_samples(hp_dataloader_t dl) { return dl->samples; }
int64_t hp_dataloader_shard_documents(hp_dataloader_t dl) { return dl->end - dl->begin; }

/* Room for `need` more tokens at the end of the live buffer (compacting first). */
static hp_status_t reserve(hp_dataloader_t dl, size_t need) {
    if (dl->start > 0) {
        memmove(dl->buf, dl->buf + dl->start, (dl->end_ - dl->start) * sizeof *dl->buf);
        dl->end_ -= dl->start;
        dl->start = 0;
    }
    if (dl->end_ + need <= dl->cap) return HP_OK;
    size_t nc = dl->cap;
    while (nc < dl->end_ + need) nc *= 2;
    int32_t *nb = realloc(dl->buf, nc * sizeof *nb);
    if (!nb) return hp_error(HP_ERR_OOM, "dataloader: out of memory growing the token buffer to %zu", nc);
    dl->buf = nb;
    dl->cap = nc;
    return HP_OK;
}

static hp_status_t check_ids(hp_dataloader_t dl, const int32_t *ids, size_t n, int64_t doc) {
    if (dl->o.vocab_size <= 0) return HP_OK;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= dl->o.vocab_size) {
            const doc_t *d = &dl->ds->docs[doc];
            return hp_error(HP_ERR_INVALID_ARG,
                            "dataloader: the encoder gave id %d, outside the vocabulary [0, %lld), for the document "
                            "at %s:%lld; hint: the tokenizer and model vocab_size disagree",
                            ids[i], (long long)dl->o.vocab_size, dl->ds->files[d->file].path, (long long)d->line);
        }
    return HP_OK;
}

/* An encoder failure on document `doc`, blamed on the data file and line (not the tokenizer
 * file): invalid UTF-8 is located to its own line and column; any other failure keeps the
 * encoder's words after the document's place. */
static hp_status_t encode_error(hp_dataloader_t dl, hp_status_t st, int64_t doc, const char *text, size_t len) {
    const doc_t *d = &dl->ds->docs[doc];
    const char *path = dl->ds->files[d->file].path;
    size_t bad = hp_tok_utf8_check(text, len);
    if (bad < len) {
        int64_t line = d->line;
        size_t col = 1;
        if (dl->ds->fmt == FMT_TEXT)   /* a JSONL document is one line; text documents span several */
            for (size_t i = 0; i < bad; i++) {
                if (text[i] == '\n') line++, col = 1;
                else col++;
            }
        return hp_error(st == HP_OK ? HP_ERR_FORMAT : st,
                        "data file '%s': line %lld: invalid UTF-8 (byte 0x%02x%s%zu); expected UTF-8 text; hint: "
                        "re-encode the file (e.g. iconv -t UTF-8) or drop that line",
                        path, (long long)line, (unsigned char)text[bad],
                        dl->ds->fmt == FMT_TEXT ? " at column " : " at byte ", dl->ds->fmt == FMT_TEXT ? col : bad + 1);
    }
    return hp_error_prefix(st, "data file '%s': line %lld: cannot encode the document: ", path, (long long)d->line);
}

/* Appends BOS + encode(document pos) + EOS to the buffer. */
static hp_status_t append_document(hp_dataloader_t dl) {
    const char *text;
    size_t len;
    HP_TRY(doc_text(dl->ds, dl->pos, &text, &len));
    size_t guess = len + 2;
    HP_TRY(reserve(dl, guess));
    size_t n0 = dl->end_;
    if (dl->enc.bos_id >= 0) dl->buf[dl->end_++] = dl->enc.bos_id;
    size_t n_ids = 0, room = dl->cap - dl->end_ - 1;
    hp_status_t es = dl->enc.encode(dl->enc.ctx, text, len, dl->buf + dl->end_, room, &n_ids);
    if (es != HP_OK) return encode_error(dl, es, dl->pos, text, len);
    if (n_ids > room) {
        HP_TRY(reserve(dl, n_ids + 2 + (dl->end_ - n0)));
        room = dl->cap - dl->end_ - 1;
        es = dl->enc.encode(dl->enc.ctx, text, len, dl->buf + dl->end_, room, &n_ids);
        if (es != HP_OK) return encode_error(dl, es, dl->pos, text, len);
        if (n_ids > room)
            return hp_error(HP_ERR_STATE, "dataloader: the encoder returned %zu ids, then more on a second call", n_ids);
    }
    dl->end_ += n_ids;
    if (dl->enc.eos_id >= 0) dl->buf[dl->end_++] = dl->enc.eos_id;
    HP_TRY(check_ids(dl, dl->buf + n0, dl->end_ - n0, dl->pos));
    dl->epoch_tokens += (int64_t)(dl->end_ - n0);
    dl->pos++;
    return HP_OK;
}

/* Token i of a bin file; ids above INT32_MAX are returned as is (the caller refuses them). */
static int64_t bin_token(hp_dataset_t ds, int64_t i) {
    const unsigned char *p = (const unsigned char *)ds->files[0].data + (size_t)i * (size_t)ds->bin_width;
    if (ds->bin_width == 2) return (int64_t)(p[0] | (p[1] << 8));
    return (int64_t)((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24));
}

/* ---- SFT samples ---------------------------------------------------------------------- */

/* Reads document pos as an SFT sample: rendered, encoded, masked, as (input, label) pairs
 * (input = ids[:-1], label = ids[1:] where the target is an assistant token, else -100), cut
 * to seq_len by data.sft_truncation. A sample is kept as pending unless dropped (too long with
 * `drop`, or no assistant token left within seq_len). */
static hp_status_t load_sample(hp_dataloader_t dl) {
    const int64_t doc = dl->pos++;
    const doc_t *d = &dl->ds->docs[doc];
    const char *path = dl->ds->files[d->file].path;
    char where[HP_CONFIG_STR_MAX + 64];
    snprintf(where, sizeof where, "%s:%lld: ", path, (long long)d->line);
    HP_TRY(hp_chat_sample_parse(d->ptr, d->len, where, true, &dl->smp));
    hp_status_t st = hp_chat_template_render(dl->sft.chat_template, dl->smp.m, dl->smp.n, dl->smp.first_trained,
                                             false, &dl->rnd);
    if (st != HP_OK) return hp_error_prefix(st, "%s", where);
    st = hp_chat_tokenize(&dl->rnd, &dl->enc, &dl->s_ids, &dl->s_mask, &dl->s_n, &dl->s_cap);
    if (st != HP_OK) return encode_error(dl, st, doc, dl->rnd.text, dl->rnd.len);
    HP_TRY(check_ids(dl, dl->s_ids, dl->s_n, doc));
    size_t n = dl->s_n > 0 ? dl->s_n - 1 : 0;
    const size_t T = (size_t)dl->o.seq_len;
    if (n > T) {
        if (dl->sft.truncation == HP_SFT_ERROR)
            return hp_error(HP_ERR_INVALID_ARG,
                            "%sthe conversation has %zu tokens, more than training.seq_len + 1 = %zu; hint: set "
                            "data.sft_truncation=truncate (keep the first seq_len + 1 tokens) or drop (skip such "
                            "samples), or raise training.seq_len",
                            where, dl->s_n, T + 1);
        if (dl->sft.truncation == HP_SFT_DROP) return HP_OK;
        n = T;
    }
    if (n > dl->p_cap) {
        int32_t *a = realloc(dl->p_in, n * sizeof *a), *b = a ? realloc(dl->p_lab, n * sizeof *b) : NULL;
        if (a) dl->p_in = a;
        if (b) dl->p_lab = b;
        if (!a || !b) return hp_error(HP_ERR_OOM, "dataloader: out of memory for a %zu-token sample", n);
        dl->p_cap = n;
    }
    size_t trained = 0;
    for (size_t j = 0; j < n; j++) {
        dl->p_in[j] = dl->s_ids[j];
        dl->p_lab[j] = dl->s_mask[j + 1] ? dl->s_ids[j + 1] : HP_SFT_IGNORE;
        trained += dl->s_mask[j + 1];
    }
    if (trained == 0) return HP_OK;   /* all its answer lies beyond seq_len */
    dl->p_n = n;
    dl->pending = true;
    dl->pending_doc = doc;
    return HP_OK;
}

/* One (B, T) batch of SFT rows: whole samples in order, several per row with data.pack, the
 * rest of a row padded (pad_id, label -100); positions restart at 0 with each sample (and
 * with the padding), marking the document boundaries. */
static hp_status_t next_chat(hp_dataloader_t dl, int32_t *inputs, int32_t *labels, int32_t *positions, bool *got) {
    const int64_t T = dl->o.seq_len;
    for (int64_t b = 0; b < dl->o.batch_size; b++) {
        int32_t *in = inputs + b * T, *lab = labels + b * T;   // (T,) each
        int32_t *pos = positions ? positions + b * T : NULL;   // (T,)
        int64_t used = 0;
        for (;;) {
            if (!dl->pending) {
                if (dl->pos >= cur_end(dl)) {
                    bool carried = dl->carry_i < dl->carry_n;
                    if (!carried && dl->o.loop && dl->epoch_tokens == 0)
                        return hp_error(HP_ERR_STATE,
                                        "dataloader: a full pass over rank %d's shard gave no sample with an assistant "
                                        "token within training.seq_len = %lld; hint: raise training.seq_len or set "
                                        "data.sft_truncation=truncate",
                                        dl->o.dp_rank, (long long)T);
                    if (!next_range(dl)) {
                        if (used == 0) return HP_OK;
                        break;
                    }
                    continue;
                }
                HP_TRY(load_sample(dl));
                continue;
            }
            const int64_t n = (int64_t)dl->p_n;
            if (used > 0 && used + n > T) break;   /* starts the next row */
            memcpy(in + used, dl->p_in, (size_t)n * sizeof *in);
            memcpy(lab + used, dl->p_lab, (size_t)n * sizeof *lab);
            for (int64_t j = 0; pos && j < n; j++) pos[used + j] = (int32_t)j;
            used += n;
            dl->pending = false;
            dl->epoch_tokens += n;
            if (!dl->sft.pack || used == T) break;
        }
        for (int64_t t = used; t < T; t++) {
            in[t] = dl->sft.pad_id;
            lab[t] = HP_SFT_IGNORE;
            if (pos) pos[t] = (int32_t)(t - used);
        }
        dl->samples++;
    }
    *got = true;
    return HP_OK;
}

hp_status_t hp_dataloader_next(hp_dataloader_t dl, int32_t *inputs, int32_t *labels, bool *got) {
    return hp_dataloader_next_docs(dl, inputs, labels, NULL, got);
}

hp_status_t hp_dataloader_next_docs(hp_dataloader_t dl, int32_t *inputs, int32_t *labels, int32_t *positions,
                                    bool *got) {
    const int64_t T = dl->o.seq_len, W = T + 1;
    *got = false;
    if (dl->ds->fmt == FMT_CHAT) return next_chat(dl, inputs, labels, positions, got);
    if (positions)
        return hp_error(HP_ERR_UNSUPPORTED, "dataloader: %s windows carry no document boundaries (TorchTitan v0.2.2 "
                                            "packing); only chat (SFT) data records them",
                        fmt_names_[dl->ds->fmt]);
    for (int64_t b = 0; b < dl->o.batch_size; b++) {
        int32_t *in = inputs + b * T;   // (T,)
        int32_t *lab = labels + b * T;  // (T,)
        if (dl->ds->fmt == FMT_BIN) {
            while (dl->pos + W > cur_end(dl)) {   /* a range's tail shorter than a window is skipped */
                bool carried = dl->carry_i < dl->carry_n;
                if (!next_range(dl)) return HP_OK;
                if (!carried && dl->pos + W > dl->end)
                    return hp_error(HP_ERR_STATE, "dataloader: rank %d's shard holds no full window", dl->o.dp_rank);
            }
            for (int64_t t = 0; t < W; t++) {
                int64_t id = bin_token(dl->ds, dl->pos + t);
                if (id > INT32_MAX || (dl->o.vocab_size > 0 && id >= dl->o.vocab_size))
                    return hp_error(HP_ERR_FORMAT,
                                    "data file '%s': token %lld has id %lld, outside the vocabulary [0, %lld); hint: "
                                    "check data.bin_dtype and the tokenizer",
                                    dl->ds->files[0].path, (long long)(dl->pos + t), (long long)id,
                                    (long long)(dl->o.vocab_size > 0 ? dl->o.vocab_size : (int64_t)INT32_MAX + 1));
                if (t < T) in[t] = (int32_t)id;
                if (t > 0) lab[t - 1] = (int32_t)id;
            }
            dl->pos += W;
        } else {
            while ((int64_t)(dl->end_ - dl->start) < W) {
                if (dl->pos >= cur_end(dl)) {
                    bool carried = dl->carry_i < dl->carry_n;
                    if (!carried && dl->o.loop && dl->epoch_tokens == 0)
                        return hp_error(HP_ERR_STATE, "dataloader: a full pass over rank %d's shard gave no tokens",
                                        dl->o.dp_rank);
                    if (!next_range(dl)) return HP_OK;
                    continue;
                }
                HP_TRY(append_document(dl));
            }
            const int32_t *w = dl->buf + dl->start;   // (T+1,)
            memcpy(in, w, (size_t)T * sizeof *w);
            memcpy(lab, w + 1, (size_t)T * sizeof *w);
            dl->start += (size_t)W;
        }
        dl->samples++;
    }
    *got = true;
    return HP_OK;
}

/* ---- state ---------------------------------------------------------------------------- */

#define STATE_MAGIC "HPDL"
#define STATE_VERSION 1u         /* no carried ranges: the blob of every ordinary run */
#define STATE_VERSION_CARRY 2u   /* + the carried ranges after the buffer (a resharded resume) */
#define STATE_HEADER (4 + 4 * 4 + 8 * 7)

static void put_u32(unsigned char **p, uint32_t v) {
    for (int i = 0; i < 4; i++) *(*p)++ = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char **p, uint64_t v) {
    for (int i = 0; i < 8; i++) *(*p)++ = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char **p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)*(*p)++ << (8 * i);
    return v;
}
static uint64_t get_u64(const unsigned char **p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)*(*p)++ << (8 * i);
    return v;
}

static size_t carry_left(hp_dataloader_t dl) { return dl->carry_n > dl->carry_i ? (size_t)(dl->carry_n - dl->carry_i) : 0; }

size_t hp_dataloader_state_size(hp_dataloader_t dl) {
    size_t nc = carry_left(dl);
    return STATE_HEADER + 4 * (dl->end_ - dl->start) + (nc ? 8 + 16 * nc : 0);
}

hp_status_t hp_dataloader_state_save(hp_dataloader_t dl, void *buf, size_t cap, size_t *n) {
    size_t need = hp_dataloader_state_size(dl), nc = carry_left(dl);
    if (n) *n = need;
    if (cap < need)
        return hp_error(HP_ERR_INVALID_ARG, "dataloader state: buffer of %zu bytes, need %zu (hp_dataloader_state_size)",
                        cap, need);
    unsigned char *p = buf;
    memcpy(p, STATE_MAGIC, 4);
    p += 4;
    put_u32(&p, nc ? STATE_VERSION_CARRY : STATE_VERSION);
    put_u32(&p, (uint32_t)dl->o.split);
    put_u32(&p, (uint32_t)dl->o.dp_rank);
    put_u32(&p, (uint32_t)dl->o.dp_world);
    put_u64(&p, (uint64_t)dl->o.seq_len);
    put_u64(&p, (uint64_t)dl->n_split);
    /* Carrying, pos walks the current carried range (written below as that range's begin);
     * else the offset in the shard. An SFT sample read but not yet placed is read again on
     * load: its document lies in the current range (a range is left only with no sample
     * pending), so the position written is that document. */
    const int64_t at = dl->pending ? dl->pending_doc : dl->pos;
    put_u64(&p, nc ? 0 : (uint64_t)(at - dl->begin));
    put_u64(&p, (uint64_t)dl->epoch);
    put_u64(&p, (uint64_t)dl->samples);
    put_u64(&p, (uint64_t)dl->epoch_tokens);
    put_u64(&p, (uint64_t)(dl->end_ - dl->start));
    for (size_t i = dl->start; i < dl->end_; i++) put_u32(&p, (uint32_t)dl->buf[i]);
    if (nc) {
        put_u64(&p, (uint64_t)nc);
        for (int i = dl->carry_i; i < dl->carry_n; i++) {
            put_u64(&p, (uint64_t)(i == dl->carry_i ? at : dl->carry[i][0]));
            put_u64(&p, (uint64_t)dl->carry[i][1]);
        }
    }
    return HP_OK;
}

/* A parsed state blob (pointers into it). */
typedef struct dl_state {
    uint32_t split, rank, world;
    uint64_t seq_len, n_split, pos, epoch, samples, epoch_tokens, nbuf, ncarry;
    const unsigned char *tokens, *carry;   /* nbuf u32; ncarry (u64 begin, u64 end) */
} dl_state_t;

/* Parses and checks a blob against this loader's split, seq_len and data size. */
static hp_status_t parse_state(hp_dataloader_t dl, const void *buf, size_t n, dl_state_t *st) {
    const unsigned char *p = buf;
    if (n < STATE_HEADER || memcmp(p, STATE_MAGIC, 4) != 0)
        return hp_error(HP_ERR_FORMAT, "dataloader state: not a dataloader state blob (%zu bytes, magic missing)", n);
    p += 4;
    uint32_t version = get_u32(&p);
    if (version != STATE_VERSION && version != STATE_VERSION_CARRY)
        return hp_error(HP_ERR_FORMAT, "dataloader state: version %u, this build reads versions %u and %u", version,
                        STATE_VERSION, STATE_VERSION_CARRY);
    st->split = get_u32(&p);
    st->rank = get_u32(&p);
    st->world = get_u32(&p);
    st->seq_len = get_u64(&p);
    st->n_split = get_u64(&p);
    st->pos = get_u64(&p);
    st->epoch = get_u64(&p);
    st->samples = get_u64(&p);
    st->epoch_tokens = get_u64(&p);
    st->nbuf = get_u64(&p);
    st->tokens = p;
    st->ncarry = 0;
    st->carry = NULL;
    if (st->split != (uint32_t)dl->o.split || st->seq_len != (uint64_t)dl->o.seq_len)
        return hp_error(HP_ERR_INVALID_ARG, "dataloader state: saved for split %u with seq_len %llu, this loader has "
                                            "split %d with seq_len %lld",
                        st->split, (unsigned long long)st->seq_len, (int)dl->o.split, (long long)dl->o.seq_len);
    if (st->n_split != (uint64_t)dl->n_split)
        return hp_error(HP_ERR_INVALID_ARG,
                        "dataloader state: saved for a split of %llu documents, the data now has %lld; the data "
                        "changed since the checkpoint",
                        (unsigned long long)st->n_split, (long long)dl->n_split);
    size_t body = STATE_HEADER + 4 * (size_t)st->nbuf;
    if (st->nbuf > n / 4 || st->world < 1 || st->rank >= st->world ||
        (version == STATE_VERSION ? n != body : n < body + 8))
        return hp_error(HP_ERR_FORMAT, "dataloader state: corrupt (dp rank %u of %u, %llu buffered tokens in %zu bytes)",
                        st->rank, st->world, (unsigned long long)st->nbuf, n);
    if (version == STATE_VERSION_CARRY) {
        const unsigned char *q = (const unsigned char *)buf + body;
        st->ncarry = get_u64(&q);
        st->carry = q;
        if (st->ncarry < 1 || st->ncarry > (n - body - 8) / 16 || n != body + 8 + 16 * st->ncarry)
            return hp_error(HP_ERR_FORMAT, "dataloader state: corrupt carried ranges (%llu in %zu bytes)",
                            (unsigned long long)st->ncarry, n);
        const unsigned char *c = st->carry;
        int64_t base = dl->o.split == HP_SPLIT_TRAIN ? 0 : dl->ds->n - dl->ds->n_val;
        for (uint64_t i = 0; i < st->ncarry; i++) {
            uint64_t b = get_u64(&c), e = get_u64(&c);
            if (b > e || (int64_t)b < base || (int64_t)e > base + dl->n_split)
                return hp_error(HP_ERR_FORMAT, "dataloader state: carried range [%llu, %llu) outside the split",
                                (unsigned long long)b, (unsigned long long)e);
        }
    }
    return HP_OK;
}

/* The shard of dp rank r of w over the split (as hp_dataloader_create). */
static void shard_of(hp_dataloader_t dl, int64_t r, int64_t w, int64_t *b, int64_t *e) {
    int64_t n = dl->n_split, div = n / w, mod = n % w;
    int64_t base = dl->o.split == HP_SPLIT_TRAIN ? 0 : dl->ds->n - dl->ds->n_val;
    *b = base + div * r + (r < mod ? r : mod);
    *e = *b + div + (r < mod ? 1 : 0);
}

/* Appends a state's carried ranges and buffered tokens to this loader's. */
static hp_status_t absorb(hp_dataloader_t dl, const dl_state_t *st, int64_t (**carry)[2], int *nc, int *cap) {
    HP_TRY(reserve(dl, (size_t)st->nbuf));
    const unsigned char *p = st->tokens;
    for (uint64_t i = 0; i < st->nbuf; i++) dl->buf[dl->end_++] = (int32_t)get_u32(&p);
    int64_t b, e;
    shard_of(dl, st->rank, st->world, &b, &e);
    int add = st->ncarry ? (int)st->ncarry : 1;
    if (*nc + add > *cap) {
        int ncap = 2 * (*nc + add) + 8;
        int64_t(*g)[2] = realloc(*carry, (size_t)ncap * sizeof **carry);
        if (!g) return hp_error(HP_ERR_OOM, "dataloader: out of memory for the carried ranges");
        *carry = g;
        *cap = ncap;
    }
    if (st->ncarry) {   /* it was itself carrying: the rest of its carried ranges is its interrupted pass */
        const unsigned char *c = st->carry;
        for (uint64_t i = 0; i < st->ncarry; i++) {
            (*carry)[*nc][0] = (int64_t)get_u64(&c);
            (*carry)[*nc][1] = (int64_t)get_u64(&c);
            (*nc)++;
        }
    } else {
        if (st->pos > (uint64_t)(e - b))
            return hp_error(HP_ERR_FORMAT, "dataloader state: corrupt (position %llu of a shard of %lld)",
                            (unsigned long long)st->pos, (long long)(e - b));
        (*carry)[*nc][0] = b + (int64_t)st->pos;
        (*carry)[*nc][1] = e;
        (*nc)++;
    }
    return HP_OK;
}

hp_status_t hp_dataloader_state_load(hp_dataloader_t dl, const void *buf, size_t n) {
    dl_state_t st;
    HP_TRY(parse_state(dl, buf, n, &st));
    if (st.world != (uint32_t)dl->o.dp_world || st.rank != (uint32_t)dl->o.dp_rank)
        return hp_error(HP_ERR_INVALID_ARG,
                        "dataloader state was saved by dp rank %u of %u, this loader is dp rank %d of %d; the "
                        "data-parallel degree cannot change across a resume that loads one state as is "
                        "(hp_dataloader_state_reshard takes the states of every old rank)",
                        st.rank, st.world, dl->o.dp_rank, dl->o.dp_world);
    if (!st.ncarry && st.pos > (uint64_t)(dl->end - dl->begin))
        return hp_error(HP_ERR_FORMAT, "dataloader state: corrupt (position %llu of %lld)", (unsigned long long)st.pos,
                        (long long)(dl->end - dl->begin));
    hp_dataloader_reset(dl);
    int cap = 0;
    HP_TRY(absorb(dl, &st, &dl->carry, &dl->carry_n, &cap));   /* the buffer, and the ranges if carrying */
    if (st.ncarry) {
        dl->pos = dl->carry[0][0];
    } else {
        free(dl->carry);   /* an ordinary state: its own shard, not a carried range */
        dl->carry = NULL;
        dl->carry_n = 0;
        dl->pos = dl->begin + (int64_t)st.pos;
    }
    dl->epoch = (int64_t)st.epoch;
    dl->samples = (int64_t)st.samples;
    dl->epoch_tokens = (int64_t)st.epoch_tokens;
    return HP_OK;
}

hp_status_t hp_dataloader_state_peek(const void *buf, size_t n, int *dp_rank, int *dp_world) {
    const unsigned char *p = buf;
    if (n < STATE_HEADER || memcmp(p, STATE_MAGIC, 4) != 0)
        return hp_error(HP_ERR_FORMAT, "dataloader state: not a dataloader state blob (%zu bytes, magic missing)", n);
    p += 8;
    (void)get_u32(&p);
    *dp_rank = (int)get_u32(&p);
    *dp_world = (int)get_u32(&p);
    return HP_OK;
}

hp_status_t hp_dataloader_state_reshard(hp_dataloader_t dl, const void *const *blobs, const size_t *sizes, int n_old) {
    if (n_old < 1 || !blobs || !sizes)
        return hp_error(HP_ERR_INVALID_ARG, "hp_dataloader_state_reshard: expected the states of n_old >= 1 old ranks");
    dl_state_t *st = hp_calloc((size_t)n_old, sizeof *st);
    if (!st) return hp_error(HP_ERR_OOM, "dataloader: out of memory");
    hp_status_t s = HP_OK;
    uint64_t max_epoch = 0;
    for (int r = 0; r < n_old && s == HP_OK; r++) {
        s = parse_state(dl, blobs[r], sizes[r], &st[r]);
        if (s == HP_OK && (st[r].world != (uint32_t)n_old || st[r].rank != (uint32_t)r))
            s = hp_error(HP_ERR_INVALID_ARG, "dataloader state %d of %d was saved by dp rank %u of %u", r, n_old,
                         st[r].rank, st[r].world);
        if (s == HP_OK && st[r].epoch > max_epoch) max_epoch = st[r].epoch;
    }
    if (s == HP_OK) {
        hp_dataloader_reset(dl);
        int cap = 0;
        int64_t samples = 0;
        /* new rank q takes old ranks q, q + Q, q + 2Q, ...: their buffered tokens (in that
         * order, first) and then the unread ranges of their interrupted passes */
        for (int r = dl->o.dp_rank; r < n_old && s == HP_OK; r += dl->o.dp_world) {
            s = absorb(dl, &st[r], &dl->carry, &dl->carry_n, &cap);
            samples += (int64_t)st[r].samples;
        }
        if (s == HP_OK) {
            dl->epoch = (int64_t)max_epoch;   /* the fresh pass after the carried ranges is max_epoch + 1 */
            dl->samples = samples;
            if (dl->carry_n) dl->pos = dl->carry[0][0];
            else dl->epoch++;   /* nothing to carry (a new rank beyond the old ones): a fresh pass */
        } else {
            hp_dataloader_reset(dl);
        }
    }
    free(st);
    return s;
}
