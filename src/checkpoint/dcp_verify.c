/* Integrity of committed checkpoints: every shard a step's metadata names exists, is as long as
 * its safetensors header says, holds each chunk with the expected byte size and (optionally)
 * matches the chunk's XXH3-64 checksum; and the newest complete step of a folder (incomplete
 * newer steps are warned about and kept). Local: no communication. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "hyperparallel/safetensors.h"
#include "dcp-impl.h"

static uint64_t le64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

/* Bytes a chunk occupies in its file, from the metadata. */
static uint64_t chunk_bytes(const hp_dcp_entry_t *e, const hp_dcp_chunk_t *c) {
    if (e->is_blob) return (uint64_t)c->sizes[0];
    uint64_t n = hp_dtype_size(e->dtype);
    for (int d = 0; d < e->ndim; d++) n *= (uint64_t)c->sizes[d];
    return n;
}

/* The first chunk that names `file` (for the message). */
static const char *tensor_of(hp_dcp_metadata_t md, const char *file) {
    for (int i = 0; i < hp_dcp_metadata_count(md); i++) {
        const hp_dcp_entry_t *e = hp_dcp_metadata_entry(md, i);
        for (int c = 0; c < e->n_chunks; c++)
            if (!strcmp(e->chunks[c].file, file)) return e->name;
    }
    return "?";
}

/* The file's size against its header: 8 + header length + the largest data offset. */
static hp_status_t check_size(const char *dir, const char *file, hp_dcp_metadata_t md) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return hp_error(errno == ENOENT ? HP_ERR_FORMAT : HP_ERR_IO,
                        "checkpoint %s: shard %s is %s (metadata.json lists it for '%s'); the checkpoint is "
                        "incomplete", dir, file, errno == ENOENT ? "missing" : strerror(errno), tensor_of(md, file));
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 8)
        return hp_error(HP_ERR_FORMAT, "checkpoint %s: shard %s is truncated: %" PRIu64 " bytes, expected at least 8 "
                        "(the header length)", dir, file, size);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return hp_error(HP_ERR_IO, "checkpoint %s: cannot open shard %s: %s", dir, file, strerror(errno));
    unsigned char b[8];
    hp_status_t s = HP_OK;
    char *hdr = NULL;
    uint64_t hlen = 0;
    if (pread(fd, b, 8, 0) != 8) s = hp_error(HP_ERR_IO, "checkpoint %s: cannot read shard %s", dir, file);
    if (s == HP_OK) {
        hlen = le64(b);
        if (hlen > HP_ST_MAX_HEADER_BYTES)
            s = hp_error(HP_ERR_FORMAT, "checkpoint %s: shard %s: header length %" PRIu64 " exceeds %u bytes (corrupted "
                         "first 8 bytes)", dir, file, hlen, HP_ST_MAX_HEADER_BYTES);
        else if (size < 8 + hlen)
            s = hp_error(HP_ERR_FORMAT, "checkpoint %s: shard %s is truncated: %" PRIu64 " bytes, expected at least %"
                         PRIu64 " (8 + a %" PRIu64 "-byte header) before any data", dir, file, size, 8 + hlen, hlen);
    }
    if (s == HP_OK) {
        hdr = hp_malloc(hlen + 1);
        if (!hdr) s = HP_ERR_OOM;
        else if (pread(fd, hdr, hlen, 8) != (ssize_t)hlen)
            s = hp_error(HP_ERR_IO, "checkpoint %s: cannot read the header of shard %s", dir, file);
    }
    close(fd);
    uint64_t data_end = 0;
    if (s == HP_OK) {
        json_object *root = NULL;
        if (hp_dcp_json_parse(hdr, hlen, hlen, file, "safetensors header", "", &root) != HP_OK ||
            !json_object_is_type(root, json_type_object)) {
            s = hp_error(HP_ERR_FORMAT, "checkpoint %s: shard %s: the header is not a JSON object (corrupted)", dir, file);
        } else {
            json_object_object_foreach(root, k, v) {
                if (!strcmp(k, "__metadata__")) continue;
                json_object *o, *e1;
                if (!json_object_is_type(v, json_type_object) || !json_object_object_get_ex(v, "data_offsets", &o) ||
                    !json_object_is_type(o, json_type_array) || json_object_array_length(o) != 2 ||
                    !json_object_is_type((e1 = json_object_array_get_idx(o, 1)), json_type_int) ||
                    json_object_get_int64(e1) < 0) {
                    s = hp_error(HP_ERR_FORMAT, "checkpoint %s: shard %s: header entry '%.200s' has no valid "
                                 "\"data_offsets\" (corrupted)", dir, file, k);
                    break;
                }
                uint64_t end = (uint64_t)json_object_get_int64(e1);
                if (end > data_end) data_end = end;
            }
        }
        json_object_put(root);
    }
    free(hdr);
    if (s == HP_OK && size != 8 + hlen + data_end)
        s = hp_error(HP_ERR_FORMAT, "checkpoint %s: shard %s is %s: %" PRIu64 " bytes, expected %" PRIu64 " (8 + header %"
                     PRIu64 " + data %" PRIu64 ")", dir, file, size < 8 + hlen + data_end ? "truncated" : "too long",
                     size, 8 + hlen + data_end, hlen, data_end);
    return s;
}

hp_status_t hp_dcp_verify(const char *dir, int checksums) {
    hp_dcp_metadata_t md;
    HP_TRY(hp_dcp_metadata_read(dir, &md));
    hp_status_t s = HP_OK;
    /* each distinct file once */
    const char **files = NULL;
    int nf = 0, capf = 0;
    for (int i = 0; s == HP_OK && i < hp_dcp_metadata_count(md); i++) {
        const hp_dcp_entry_t *e = hp_dcp_metadata_entry(md, i);
        for (int c = 0; s == HP_OK && c < e->n_chunks; c++) {
            int seen = 0;
            for (int f = 0; f < nf && !seen; f++) seen = !strcmp(files[f], e->chunks[c].file);
            if (seen) continue;
            if (nf == capf) {
                capf = capf ? 2 * capf : 16;
                const char **nfp = realloc(files, sizeof *files * (size_t)capf);
                if (!nfp) {
                    s = HP_ERR_OOM;
                    break;
                }
                files = nfp;
            }
            files[nf++] = e->chunks[c].file;
        }
    }
    unsigned char *buf = NULL;
    size_t cap = 0;
    for (int f = 0; s == HP_OK && f < nf; f++) {
        s = check_size(dir, files[f], md);
        if (s != HP_OK) break;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, files[f]);
        hp_safetensors_t st;
        s = hp_safetensors_open(path, &st);   /* the reader's message names the file */
        if (s != HP_OK) break;
        for (int i = 0; s == HP_OK && i < hp_dcp_metadata_count(md); i++) {
            const hp_dcp_entry_t *e = hp_dcp_metadata_entry(md, i);
            for (int c = 0; s == HP_OK && c < e->n_chunks; c++) {
                const hp_dcp_chunk_t *ch = &e->chunks[c];
                if (strcmp(ch->file, files[f])) continue;
                const hp_st_info_t *info;
                uint64_t want = chunk_bytes(e, ch);
                if (hp_safetensors_find(st, ch->key, &info) != HP_OK) {
                    s = hp_error(HP_ERR_FORMAT, "checkpoint %s: shard %s lacks '%s' (%s '%s'), which metadata.json lists "
                                 "in it", dir, files[f], ch->key, e->is_blob ? "blob" : "tensor", e->name);
                    break;
                }
                if (info->end - info->begin != want) {
                    s = hp_error(HP_ERR_FORMAT, "checkpoint %s: shard %s: '%s' holds %" PRIu64 " bytes, metadata.json "
                                 "expects %" PRIu64 " (mixed from different saves?)", dir, files[f], ch->key,
                                 info->end - info->begin, want);
                    break;
                }
                if (!checksums || !ch->has_xxh3) continue;
                if (want > cap) {
                    free(buf);
                    buf = hp_malloc(want ? want : 1);
                    cap = buf ? want : 0;
                    if (!buf) {
                        s = HP_ERR_OOM;
                        break;
                    }
                }
                s = hp_safetensors_read_raw(st, ch->key, buf, (size_t)want);
                if (s != HP_OK) break;
                uint64_t h = XXH3_64bits(want ? (const void *)buf : "", (size_t)want);
                if (h != ch->xxh3)
                    s = hp_dcp_checksum_error(dir, files[f], e->name, ch->key, ch->xxh3, h);
            }
        }
        hp_safetensors_close(st);
    }
    free(buf);
    free(files);
    hp_dcp_metadata_free(md);
    return s;
}

hp_status_t hp_dcp_checksum_error(const char *dir, const char *file, const char *name, const char *key,
                                  uint64_t stored, uint64_t computed) {
    return hp_error(HP_ERR_FORMAT, "checkpoint %s: shard %s: the data of '%s'%s%s%s fails its checksum (xxh3 %016" PRIx64
                    " in metadata.json, %016" PRIx64 " computed): the file is corrupted. Hint: resume from an older "
                    "step, or skip the check with checkpoint.verify_checksums = false", dir, file, name,
                    strcmp(name, key) ? " (key '" : "", strcmp(name, key) ? key : "", strcmp(name, key) ? "')" : "",
                    stored, computed);
}

hp_status_t hp_dcp_latest_complete(const char *folder, int64_t *step, int *n_bad) {
    *step = -1;
    if (n_bad) *n_bad = 0;
    int64_t *steps = hp_malloc(sizeof *steps * 4096);
    if (!steps) return HP_ERR_OOM;
    int n = 0;
    hp_status_t s = hp_dcp_list_steps(folder, steps, 4096, &n);
    if (n > 4096) n = 4096;
    for (int i = n - 1; s == HP_OK && i >= 0; i--) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/step-%lld", folder, (long long)steps[i]);
        if (hp_dcp_verify(dir, 0) == HP_OK) {
            *step = steps[i];
            break;
        }
        hp_log(HP_LOG_WARN, "skipping incomplete checkpoint %s (kept on disk): %s", dir, hp_last_error());
        if (n_bad) (*n_bad)++;
    }
    free(steps);
    return s;
}
