/* The HF sharded-checkpoint index (model.safetensors.index.json): a hardened parser that checks
 * every json-c type before use (fuzz target tests/fuzz/fuzz_hf_index.c) and gives the
 * weight_map as (tensor name, file) pairs plus the distinct shard files. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyperparallel/safetensors.h"
#include "dcp-impl.h"

struct hp_hf_index {
    int n, n_files;
    char **names, **file_of;   /* n each; file_of[i] points into files */
    char **files;              /* n_files distinct, first-seen order */
};

void hp_hf_index_free(hp_hf_index_t ix) {
    if (!ix) return;
    for (int i = 0; i < ix->n; i++) free(ix->names[i]);
    for (int i = 0; i < ix->n_files; i++) free(ix->files[i]);
    free(ix->names);
    free(ix->file_of);
    free(ix->files);
    free(ix);
}

int hp_hf_index_count(hp_hf_index_t ix) { return ix->n; }
void hp_hf_index_at(hp_hf_index_t ix, int i, const char **name, const char **file) {
    HP_ASSERT(i >= 0 && i < ix->n);
    *name = ix->names[i];
    *file = ix->file_of[i];
}
int hp_hf_index_n_files(hp_hf_index_t ix) { return ix->n_files; }
const char *hp_hf_index_file(hp_hf_index_t ix, int i) {
    HP_ASSERT(i >= 0 && i < ix->n_files);
    return ix->files[i];
}
const char *hp_hf_index_find(hp_hf_index_t ix, const char *name) {
    for (int i = 0; i < ix->n; i++)
        if (!strcmp(ix->names[i], name)) return ix->file_of[i];
    return NULL;
}

static const char *type_name(json_object *v) { return v ? json_type_to_name(json_object_get_type(v)) : "null"; }

static hp_status_t parse_root(json_object *root, const char *what, hp_hf_index_t ix) {
    if (!json_object_is_type(root, json_type_object))
        return hp_error(HP_ERR_FORMAT, "%s: the index is a JSON %s, expected an object with a \"weight_map\"", what,
                        type_name(root));
    json_object *md, *wm;
    if (json_object_object_get_ex(root, "metadata", &md) && md && !json_object_is_type(md, json_type_object))
        return hp_error(HP_ERR_FORMAT, "%s: \"metadata\" is a JSON %s, expected an object", what, type_name(md));
    if (!json_object_object_get_ex(root, "weight_map", &wm))
        return hp_error(HP_ERR_FORMAT, "%s: no \"weight_map\" key; expected {\"weight_map\": {\"tensor name\": "
                        "\"model-00001-of-0000N.safetensors\", ...}}", what);
    if (!json_object_is_type(wm, json_type_object))
        return hp_error(HP_ERR_FORMAT, "%s: \"weight_map\" is a JSON %s, expected an object mapping tensor names to "
                        "shard file names", what, type_name(wm));
    int cap = json_object_object_length(wm);
    ix->names = hp_calloc((size_t)cap + 1, sizeof *ix->names);
    ix->file_of = hp_calloc((size_t)cap + 1, sizeof *ix->file_of);
    ix->files = hp_calloc((size_t)cap + 1, sizeof *ix->files);
    if (!ix->names || !ix->file_of || !ix->files) return HP_ERR_OOM;
    json_object_object_foreach(wm, k, v) {
        if (!k[0] || strlen(k) >= HP_ST_MAX_NAME)
            return hp_error(HP_ERR_FORMAT, "%s: weight_map has an empty tensor name or one longer than %d bytes", what,
                            HP_ST_MAX_NAME - 1);
        if (!json_object_is_type(v, json_type_string))
            return hp_error(HP_ERR_FORMAT, "%s: weight_map[\"%.200s\"] is a JSON %s, expected a shard file name string",
                            what, k, type_name(v));
        const char *f = json_object_get_string(v);
        size_t fl = strlen(f);
        if (fl == 0 || fl >= 256 || f[0] == '.' || strchr(f, '/') || strchr(f, '\\') ||
            (size_t)json_object_get_string_len(v) != fl)
            return hp_error(HP_ERR_FORMAT, "%s: weight_map[\"%.200s\"] = \"%.100s\" is not a plain file name inside the "
                            "checkpoint directory", what, k, f);
        int fi = 0;
        while (fi < ix->n_files && strcmp(ix->files[fi], f)) fi++;
        if (fi == ix->n_files) {
            ix->files[fi] = strdup(f);
            if (!ix->files[fi]) return HP_ERR_OOM;
            ix->n_files++;
        }
        ix->names[ix->n] = strdup(k);
        if (!ix->names[ix->n]) return HP_ERR_OOM;
        ix->file_of[ix->n++] = ix->files[fi];
    }
    if (ix->n == 0) return hp_error(HP_ERR_FORMAT, "%s: \"weight_map\" is empty (no tensors)", what);
    return HP_OK;
}

hp_status_t hp_hf_index_parse(const char *json, size_t len, const char *what, hp_hf_index_t *out) {
    *out = NULL;
    json_object *root = NULL;
    HP_TRY(hp_dcp_json_parse(json, len, (size_t)64 << 20, what, "index", "", &root));
    hp_hf_index_t ix = hp_calloc(1, sizeof *ix);
    hp_status_t s = ix ? parse_root(root, what, ix) : HP_ERR_OOM;
    json_object_put(root);
    if (s != HP_OK) {
        hp_hf_index_free(ix);
        return s;
    }
    *out = ix;
    return HP_OK;
}

hp_status_t hp_hf_index_read(const char *path, hp_hf_index_t *out) {
    *out = NULL;
    char *buf;
    size_t n;
    hp_status_t s = hp_file_read_all(path, "safetensors index", (size_t)64 << 20, &buf, &n);
    if (s != HP_OK)   // a missing index is HP_ERR_NOT_FOUND, as before the shared reader
        return access(path, F_OK) != 0 && errno == ENOENT ? hp_error(HP_ERR_NOT_FOUND, "%s", hp_last_error()) : s;
    s = hp_hf_index_parse(buf, n, path, out);
    free(buf);
    return s;
}
