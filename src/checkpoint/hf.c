/* HF interop, family-free: the name map through a family's state-dict adapter (its per-layer
 * pairs, HF's common top-level and routed-expert names, the q/k row permutation between
 * TorchTitan's interleaved RoPE and HF's rotate_half when the adapter asks for it), export to
 * HF shards + index + config.json (the adapter's text) and import of HF weights into any
 * layout, refused when the directory's config.json describes another model (the adapter's
 * read_config and config_diff). The families' adapters are in src/models/<family>/. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyperparallel/checkpoint.h"
#include "hyperparallel/model.h"
#include "hyperparallel/safetensors.h"
#include "dcp-impl.h"

/* HF's decoder names outside the layers (every LlamaForCausalLM-style model has them). */
static const hp_hf_name_pair_t top_map[] = {
    {"tok_embeddings.weight", "model.embed_tokens.weight", 0},
    {"norm.weight", "model.norm.weight", 0},
    {"output.weight", "lm_head.weight", 0},
};

/* The trainer checkpoints each MoE layer's expert_bias as "layers.N.moe.expert_bias"; a family
 * whose HF model keeps it (DeepSeek-V3: mlp.gate.e_score_correction_bias) maps the name, the
 * others skip it both ways (hp_hf_skips). */
static int is_expert_bias(const char *name) {
    const size_t n = strlen(name), k = strlen(".moe.expert_bias");
    return n > k && !strcmp(name + n - k, ".moe.expert_bias");
}

static int parse_layer(const char *name, const char *prefix, int *layer, int *used);

/* The routed experts: TorchTitan's 3-D layers.N.moe.experts.w1 / w2 / w3 (E, ., .) are HF's E
 * tensors model.layers.N.mlp.experts.e.gate_proj / down_proj / up_proj.weight. 1 when fqn is
 * one (out: expert e's HF name). */
static int expert_hf_name(const char *fqn, int e, char *out, size_t n) {
    int layer, used;
    if (!parse_layer(fqn, "layers.", &layer, &used)) return 0;
    const char *w = fqn + used, *proj = !strcmp(w, "moe.experts.w1")   ? "gate_proj"
                                        : !strcmp(w, "moe.experts.w2") ? "down_proj"
                                        : !strcmp(w, "moe.experts.w3") ? "up_proj"
                                                                       : NULL;
    if (!proj) return 0;
    snprintf(out, n, "model.layers.%d.mlp.experts.%d.%s.weight", layer, e, proj);
    return 1;
}
int hp_hf_expert_name(const char *fqn, int e, char *out, size_t n) { return expert_hf_name(fqn, e, out, n); }
int hp_hf_is_expert_bias(const char *name) { return is_expert_bias(name); }

/* "<prefix><layer>." with a decimal layer below HP_MODEL_MAX_LAYERS (names come from files:
 * sscanf's %d would overflow on a long digit string and accept a sign). *used = bytes consumed. */
static int parse_layer(const char *name, const char *prefix, int *layer, int *used) {
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0) return 0;
    const char *p = name + n;
    long v = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 8) v = v * 10 + (*p++ - '0'), digits++;
    if (digits == 0 || *p != '.' || v >= HP_MODEL_MAX_LAYERS) return 0;
    *layer = (int)v;
    *used = (int)(p + 1 - name);
    return 1;
}

/* The name map, quietly: 1 and out / *permute when `name` has a mapping in `direction`. Each
 * pair is read from the side the name is on: to HF the TorchTitan side is matched and the HF
 * side written, from HF the other way round. */
static int map_name(const hp_hf_adapter_t *a, hp_hf_direction_t direction, const char *name, char *out, size_t n,
                    int *permute) {
    const int to_hf = direction == HP_HF_TO_HF;
    *permute = 0;
    for (size_t i = 0; i < sizeof top_map / sizeof top_map[0]; i++)
        if (!strcmp(name, to_hf ? top_map[i].tt : top_map[i].hf)) {
            snprintf(out, n, "%s", to_hf ? top_map[i].hf : top_map[i].tt);
            return 1;
        }
    int layer, used = 0;
    if (!parse_layer(name, to_hf ? "layers." : "model.layers.", &layer, &used)) return 0;
    for (const hp_hf_name_pair_t *const *t = a->layer_names; t && *t; t++)
        for (const hp_hf_name_pair_t *p = *t; p->tt; p++)
            if (!strcmp(name + used, to_hf ? p->tt : p->hf)) {
                snprintf(out, n, to_hf ? "model.layers.%d.%s" : "layers.%d.%s", layer, to_hf ? p->hf : p->tt);
                *permute = a->permute_qk && p->qk;
                return 1;
            }
    return 0;
}

hp_status_t hp_hf_map_name(const hp_hf_adapter_t *a, hp_hf_direction_t direction, const char *name, char *out,
                           size_t n, int *permute) {
    *permute = 0;
    if (!a)
        return hp_error(HP_ERR_INVALID_ARG, "HF name map of '%s': no state-dict adapter (NULL); hint: pass the "
                        "family's, hp_model_hf_adapter (models.h)", name);
    if (map_name(a, direction, name, out, n, permute)) return HP_OK;
    char tmp[160];
    if (direction == HP_HF_TO_HF && expert_hf_name(name, 0, tmp, sizeof tmp))   /* a routed expert's parameter */
        return hp_error(HP_ERR_NOT_FOUND, "%s state-dict adapter: '%s' is one HF tensor per expert (%s, ...), not one "
                        "name", a->family, name, tmp);
    if (direction == HP_HF_TO_HF)
        return hp_error(HP_ERR_NOT_FOUND, "%s state-dict adapter: no HF name for '%s'", a->family, name);
    return hp_error(HP_ERR_NOT_FOUND, "%s state-dict adapter: no TorchTitan name for HF '%s'", a->family, name);
}

int hp_hf_skips(const hp_hf_adapter_t *a, const char *fqn) {
    char tmp[160];
    int pm;
    return is_expert_bias(fqn) && !map_name(a, HP_HF_TO_HF, fqn, tmp, sizeof tmp, &pm);
}

/* The model has an HF architecture: the family has an adapter, and the adapter takes the
 * config (hp_hf_export / import, hp-ckpt to-hf / from-hf). */
hp_status_t hp_hf_check(const hp_hf_adapter_t *a, const hp_model_config_t *mc, const char *what) {
    if (!a)
        return hp_error(HP_ERR_UNSUPPORTED, "HF %s: the model '%s' has no HF state-dict adapter (its family has no "
                        "HF architecture); hint: use the DCP checkpoint or weights.safetensors (TorchTitan names)",
                        what, mc->name);
    return a->check(mc, what);
}

/* convert_llama_weights_to_hf's view(nh, hd/2, 2, dim).transpose(1, 2), and its inverse. */
void hp_hf_permute_rows(void *dst, const void *src, int64_t rows, size_t row_bytes, int hd, int to_hf) {
    int64_t nh = rows / hd, half = hd / 2;
    for (int64_t h = 0; h < nh; h++)
        for (int64_t i = 0; i < half; i++)
            for (int p = 0; p < 2; p++) {
                int64_t tt = h * hd + 2 * i + p, hfr = h * hd + p * half + i;
                int64_t d = to_hf ? hfr : tt, s = to_hf ? tt : hfr;
                memcpy((unsigned char *)dst + (size_t)d * row_bytes, (const unsigned char *)src + (size_t)s * row_bytes,
                       row_bytes);
            }
}

int hp_hf_is_hf_dir(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    if (access(p, R_OK) == 0) return 1;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    return access(p, R_OK) == 0;
}


hp_status_t hp_hf_write_config(const char *dir, const hp_hf_adapter_t *a, const hp_model_config_t *mc,
                               hp_dtype_t dtype) {
    if (!a) return hp_hf_check(a, mc, "config.json");
    char *text = a->config_json(mc, dtype);
    if (!text)
        return hp_error(HP_ERR_OOM, "HF config.json of the %s model: out of memory (or its family has no config.json "
                        "mapping)", mc->name);
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    hp_status_t s = hp_file_write_atomic(path, text, strlen(text));
    free(text);
    return s;
}

hp_status_t hp_hf_export_check(const hp_hf_adapter_t *a, const hp_model_config_t *mc, hp_dtype_t dtype,
                               size_t *max_shard_bytes) {
    HP_TRY(hp_hf_check(a, mc, "export"));
    if (dtype != HP_F32 && dtype != HP_BF16)
        return hp_error(HP_ERR_INVALID_ARG, "HF export: dtype %s; expected f32 or bf16", hp_dtype_name(dtype));
    if (!*max_shard_bytes) *max_shard_bytes = (size_t)5 << 30;
    return HP_OK;
}

int hp_hf_next_shard(size_t nb, size_t max_shard_bytes, size_t *cur, size_t *total, int *nfiles) {
    if (*cur > 0 && *cur + nb > max_shard_bytes) {
        (*nfiles)++;
        *cur = 0;
    }
    *cur += nb;
    *total += nb;
    return *nfiles;
}

void hp_hf_shard_name(char *fn, size_t fn_n, char *path, size_t path_n, const char *dir, int f, int nfiles) {
    snprintf(fn, fn_n, "model-%05d-of-%05d.safetensors", f, nfiles);
    if (path) snprintf(path, path_n, "%s/%s", dir, fn);
}

hp_status_t hp_hf_write_index(const char *dir, json_object *weight_map, size_t total, const hp_hf_adapter_t *a,
                              const hp_model_config_t *mc, hp_dtype_t dtype) {
    json_object *idx = json_object_new_object(), *md = json_object_new_object();
    json_object_object_add(md, "total_size", json_object_new_int64((int64_t)total));
    json_object_object_add(idx, "metadata", md);
    json_object_object_add(idx, "weight_map", weight_map);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    hp_status_t s = hp_dcp_write_json(path, idx);
    json_object_put(idx);
    if (s == HP_OK) s = hp_hf_write_config(dir, a, mc, dtype);
    if (s == HP_OK) s = hp_file_fsync(dir);
    return s;
}

/* One parameter as a full f32 tensor (gathered when sharded; collective over the mesh). */
static hp_status_t full_of(const hp_param_t *p, hp_tensor_t *out, void **owned) {
    *owned = NULL;
    if (!p->value.mesh) {
        *out = p->value.local;
        return HP_OK;
    }
    return hp_dtensor_full_tensor(out, owned, NULL, &p->value);
}

hp_status_t hp_hf_export(const char *dir, const hp_hf_adapter_t *a, const hp_model_config_t *mc,
                         const hp_param_t *params, int n_params, hp_comm_t comm, hp_dtype_t dtype,
                         size_t max_shard_bytes) {
    int rank = comm ? hp_comm_rank(comm) : 0;
    HP_TRY(hp_hf_export_check(a, mc, dtype, &max_shard_bytes));
    hp_status_t s = HP_OK;
    if (rank == 0) s = hp_file_mkdirs(dir);
    HP_TRY(hp_dcp_agree(comm, s, "HF export: creating the directory"));
    /* every rank takes part in the gathers; rank 0 keeps the data. Entries: one per
     * parameter, E per routed-expert parameter (views of its expert slices) */
    char tmpn[160];
    int n_ent = 0;
    for (int i = 0; i < n_params; i++)
        n_ent += expert_hf_name(params[i].name, 0, tmpn, sizeof tmpn) ? mc->moe_experts
                 : hp_hf_skips(a, params[i].name) ? 0 : 1;
    hp_tensor_t *full = hp_calloc((size_t)n_params + 1, sizeof *full), *ent_t = hp_calloc((size_t)n_ent + 1, sizeof *ent_t);
    void **owned = hp_calloc((size_t)n_params + 1, sizeof *owned);
    float **perm = hp_calloc((size_t)n_params + 1, sizeof *perm);
    char (*names)[160] = hp_calloc((size_t)n_ent + 1, sizeof *names);
    int *file_of = hp_calloc((size_t)n_ent + 1, sizeof *file_of);
    if (!full || !ent_t || !owned || !perm || !names || !file_of) s = HP_ERR_OOM;
    size_t esz = hp_dtype_size(dtype), cur = 0, total = 0;
    int nfiles = 1, k_ent = 0;
    for (int i = 0; s == HP_OK && i < n_params; i++) {
        int pm = 0;
        if (hp_hf_skips(a, params[i].name)) continue;   /* no HF tensor */
        const int expert = expert_hf_name(params[i].name, 0, tmpn, sizeof tmpn);
        if (!expert) s = hp_hf_map_name(a, HP_HF_TO_HF, params[i].name, names[k_ent], sizeof names[k_ent], &pm);
        if (s == HP_OK) s = full_of(&params[i], &full[i], &owned[i]);
        if (s == HP_OK && expert) {   /* E contiguous (A, B) slices of the (E, A, B) tensor */
            if (full[i].ndim != 3 || full[i].shape[0] != mc->moe_experts || !hp_tensor_is_contiguous(&full[i])) {
                s = hp_error(HP_ERR_INVALID_ARG, "HF export: '%s' is not a contiguous (%d, ., .) expert tensor",
                             params[i].name, mc->moe_experts);
                break;
            }
            const int64_t A = full[i].shape[1], Bc = full[i].shape[2];
            for (int e = 0; e < mc->moe_experts; e++, k_ent++) {
                expert_hf_name(params[i].name, e, names[k_ent], sizeof names[k_ent]);
                hp_tensor_t *v = &ent_t[k_ent];
                *v = full[i];
                v->ndim = 2;
                v->shape[0] = A;
                v->shape[1] = Bc;
                v->stride[0] = Bc;
                v->stride[1] = 1;
                v->data = (float *)full[i].data + (size_t)e * (size_t)(A * Bc);
                file_of[k_ent] = hp_hf_next_shard((size_t)(A * Bc) * esz, max_shard_bytes, &cur, &total, &nfiles);
            }
            continue;
        }
        if (s == HP_OK && pm) {
            int64_t rows = full[i].shape[0], cols = full[i].ndim > 1 ? full[i].shape[1] : 1;
            if (full[i].ndim != 2 || rows % mc->head_dim || !hp_tensor_is_contiguous(&full[i])) {
                s = hp_error(HP_ERR_INVALID_ARG, "HF export: '%s' is not a contiguous (heads*%d, dim) weight",
                             params[i].name, mc->head_dim);
                break;
            }
            perm[i] = hp_malloc(sizeof(float) * (size_t)(rows * cols));
            if (!perm[i]) {
                s = HP_ERR_OOM;
                break;
            }
            hp_hf_permute_rows(perm[i], full[i].data, rows, sizeof(float) * (size_t)cols, mc->head_dim, 1);
            full[i].data = perm[i];
        }
        if (s != HP_OK) break;
        ent_t[k_ent] = full[i];
        file_of[k_ent++] =
            hp_hf_next_shard((size_t)hp_tensor_numel(&full[i]) * esz, max_shard_bytes, &cur, &total, &nfiles);
    }
    if (s == HP_OK && rank == 0) {
        json_object *wm = json_object_new_object();
        hp_st_entry_t *ents = hp_calloc((size_t)n_ent + 1, sizeof *ents);
        if (!ents) s = HP_ERR_OOM;
        for (int f = 1; s == HP_OK && f <= nfiles; f++) {
            char fn[64], path[4200];
            hp_hf_shard_name(fn, sizeof fn, path, sizeof path, dir, f, nfiles);
            int k = 0;
            for (int i = 0; i < n_ent; i++)
                if (file_of[i] == f) {
                    ents[k++] = (hp_st_entry_t){names[i], &ent_t[i], hp_st_dtype_from_hp(dtype), NULL, 0, NULL};
                    json_object_object_add(wm, names[i], json_object_new_string(fn));
                }
            const char *meta[2] = {"format", "pt"};
            s = hp_safetensors_write(path, ents, k, meta, 1);
        }
        free(ents);
        if (s == HP_OK) s = hp_hf_write_index(dir, wm, total, a, mc, dtype);
        else json_object_put(wm);
    }
    for (int i = 0; full && i < n_params; i++) {
        free(owned[i]);
        free(perm[i]);
    }
    free(full);
    free(ent_t);
    free(owned);
    free(perm);
    free(names);
    free(file_of);
    return hp_dcp_agree(comm, s, "HF export");
}

/* ---- import ------------------------------------------------------------------------------- */

static int is_extra(const char *tn, char (*want)[160], int nw, int tied) {
    if (tied && !strcmp(tn, "model.embed_tokens.weight")) return 0;
    for (int i = 0; i < nw; i++)
        if (!strcmp(tn, want[i])) return 0;
    return 1;
}

/* Warns about each tensor of the checkpoint that no parameter maps to (it is ignored):
 * the names of the index's weight_map, or of the single file's tensors. */
static void warn_extra_tensors(const char *dir, const hp_hf_adapter_t *a, const hp_model_config_t *mc,
                               hp_param_t *params, int n_params, hp_hf_index_t wm, hp_safetensors_t single) {
    char tmp[160];
    size_t cap = 1;
    for (int i = 0; i < n_params; i++)
        cap += expert_hf_name(params[i].name, 0, tmp, sizeof tmp) ? (size_t)mc->moe_experts : 1;
    char (*want)[160] = hp_calloc(cap, sizeof *want);
    if (!want) return;
    int nw = 0;
    for (int i = 0; i < n_params; i++) {
        int pm;
        if (expert_hf_name(params[i].name, 0, tmp, sizeof tmp)) {   /* one HF tensor per expert */
            for (int e = 0; e < mc->moe_experts; e++) expert_hf_name(params[i].name, e, want[nw++], sizeof want[0]);
            continue;
        }
        if (map_name(a, HP_HF_TO_HF, params[i].name, want[nw], sizeof want[nw], &pm)) nw++;
    }
    int tied = 1;   /* tied embeddings: lm_head.weight is read from model.embed_tokens.weight */
    for (int i = 0; i < nw; i++) tied &= strcmp(want[i], "lm_head.weight") != 0;
    int extra = 0;
    if (wm) {
        for (int k = 0; k < hp_hf_index_count(wm); k++) {
            const char *key = NULL, *file = NULL;
            hp_hf_index_at(wm, k, &key, &file);
            if (is_extra(key, want, nw, tied) && extra++ < 20)
                hp_log(HP_LOG_WARN, "HF checkpoint %s: tensor '%s' is not a parameter of the %s model; ignored", dir,
                       key, mc->name);
        }
    } else if (single) {
        for (int k = 0; k < hp_safetensors_count(single); k++) {
            const char *tn = hp_safetensors_info(single, k)->name;
            if (is_extra(tn, want, nw, tied) && extra++ < 20)
                hp_log(HP_LOG_WARN, "HF checkpoint %s: tensor '%s' is not a parameter of the %s model; ignored", dir,
                       tn, mc->name);
        }
    }
    if (extra > 20)
        hp_log(HP_LOG_WARN, "HF checkpoint %s: %d more tensors the %s model does not have; ignored", dir, extra - 20,
               mc->name);
    free(want);
}

/* DIR/config.json, when present, must describe the model exactly (the adapter's read_config, then
 * every field that changes the numerics): shapes alone would let extra layers or an untied
 * lm_head be dropped, and rope_theta, rope_scaling or eps would import silently wrong. */
static hp_status_t check_hf_config(const char *dir, const hp_hf_adapter_t *a, const hp_model_config_t *mc) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (access(path, R_OK) != 0) return HP_OK;
    hp_model_config_t hf;
    HP_TRY(a->read_config(dir, &hf));
    char msg[1500], flags[700];
    int n = a->config_diff(&hf, mc, msg, sizeof msg, flags, sizeof flags);
    if (n)
        return hp_error(HP_ERR_INVALID_ARG, "HF checkpoint %s: config.json disagrees with the %s/%s model in %d field(s): "
                        "%s; hint: describe the checkpoint's model with those model.* keys (hp-ckpt from-hf: %s), or "
                        "take the model from config.json (hp-ckpt from-hf without --flavor; hp-train with "
                        "model.flavor = hf)", dir, mc->name, mc->flavor, n, msg, flags);
    return HP_OK;
}

/* The HF row of TorchTitan q/k row r (hp_hf_permute_rows: TT row h*hd + 2i + p = HF row h*hd + p*hd/2 + i). */
static int64_t hf_row(int64_t r, int hd) {
    int64_t h = r / hd, w = r % hd;
    return h * hd + (w % 2) * (hd / 2) + w / 2;
}

static hp_hf_import_counts_t hf_counts_;   /* process-wide, as hp_comm_counts */

void hp_hf_import_counts_get(hp_hf_import_counts_t *out) { *out = hf_counts_; }
void hp_hf_import_counts_reset(void) { memset(&hf_counts_, 0, sizeof hf_counts_); }

/* Index k of file fname among the open safetensors files (opened when not; the oldest of 32
 * closed to make room). */
static hp_status_t open_file(const char *dir, const char *fname, hp_safetensors_t *open_st, char (*open_name)[256],
                             int *n_open, int *kout) {
    int k = 0;
    for (; k < *n_open; k++)
        if (!strcmp(open_name[k], fname)) break;
    if (k == *n_open) {
        if (*n_open == 32) {
            hp_safetensors_close(open_st[0]);
            memmove(open_st, open_st + 1, sizeof open_st[0] * 31);
            memmove(open_name, open_name + 1, sizeof open_name[0] * 31);
            (*n_open)--;
            k = *n_open;
        }
        char fp[4400];
        snprintf(fp, sizeof fp, "%s/%s", dir, fname);
        HP_TRY(hp_safetensors_open(fp, &open_st[k]));
        snprintf(open_name[k], sizeof open_name[k], "%s", fname);
        (*n_open)++;
    }
    *kout = k;
    return HP_OK;
}

static hp_status_t stored_dtype(const char *dir, const char *file, const char *hf, const hp_st_info_t *info,
                                hp_dtype_t *sdt) {
    if (info->dtype == HP_ST_F32) *sdt = HP_F32;
    else if (info->dtype == HP_ST_BF16) *sdt = HP_BF16;
    else if (info->dtype == HP_ST_F16) *sdt = HP_F16;
    else
        return hp_error(HP_ERR_UNSUPPORTED, "HF checkpoint %s: %s: tensor '%s' is %s; expected F32, BF16 or F16 "
                        "weights", dir, file, hf, hp_st_dtype_name(info->dtype));
    return HP_OK;
}

/* A routed-expert parameter (E, A, B) from HF's E tensors (A, B): only this rank's boxes (its
 * experts, and under Shard(1) / TP its rows / columns), each expert's rows read as column
 * segments. */
static hp_status_t import_experts(const char *dir, const hp_model_config_t *mc, hp_param_t *p, hp_hf_index_t wm,
                                  hp_safetensors_t *open_st, char (*open_name)[256], int *n_open, float **buf,
                                  size_t *buf_cap) {
    hp_dtensor_t *v = &p->value;
    const int64_t *gs = v->mesh ? v->global_shape : v->local.shape;
    if (v->local.ndim != 3 || gs[0] != mc->moe_experts)
        return hp_error(HP_ERR_INVALID_ARG, "HF import: '%s' is not a (%d, ., .) expert tensor", p->name, mc->moe_experts);
    hp_dcp_box_t *boxes = NULL;
    int nbox = 0;
    hp_status_t s = hp_dcp_local_boxes(v, &boxes, &nbox);
    for (int b = 0; s == HP_OK && b < nbox; b++) {
        const int64_t r0 = boxes[b].g[1], nr = boxes[b].s[1], c0 = boxes[b].g[2], nc = boxes[b].s[2];
        for (int64_t e = boxes[b].g[0]; s == HP_OK && e < boxes[b].g[0] + boxes[b].s[0]; e++) {
            char hf[160];
            expert_hf_name(p->name, (int)e, hf, sizeof hf);
            const char *fname = "model.safetensors";
            if (wm && !(fname = hp_hf_index_find(wm, hf))) {
                s = hp_error(HP_ERR_NOT_FOUND, "HF checkpoint %s lacks '%s' (expert %lld of the %s model's '%s')", dir,
                             hf, (long long)e, mc->name, p->name);
                break;
            }
            int k = 0;
            const hp_st_info_t *info;
            s = open_file(dir, fname, open_st, open_name, n_open, &k);
            if (s == HP_OK && hp_safetensors_find(open_st[k], hf, &info) != HP_OK)
                s = hp_error(HP_ERR_NOT_FOUND, "HF checkpoint %s: %s lacks '%s' (expert %lld of '%s')", dir, fname, hf,
                             (long long)e, p->name);
            if (s != HP_OK) break;
            if (info->ndim != 2 || info->shape[0] != gs[1] || info->shape[1] != gs[2]) {
                s = hp_error(HP_ERR_INVALID_ARG, "HF checkpoint %s: '%s' has shape (%lld, %lld), but expert %lld of the "
                             "%s/%s model's '%s' is (%lld, %lld); hint: a different model: describe it with the "
                             "model.moe_* keys, or take it from the checkpoint's config.json", dir, hf,
                             info->ndim > 0 ? (long long)info->shape[0] : 0LL,
                             info->ndim > 1 ? (long long)info->shape[1] : 0LL, (long long)e, mc->name, mc->flavor,
                             p->name, (long long)gs[1], (long long)gs[2]);
                break;
            }
            hp_dtype_t sdt = HP_F32;
            s = stored_dtype(dir, fname, hf, info, &sdt);
            if (s != HP_OK) break;
            const int64_t esz = (int64_t)hp_dtype_size(sdt);
            hf_counts_.bytes_total += (uint64_t)(gs[1] * gs[2] * esz);
            if ((size_t)(nr * nc * esz) > *buf_cap * sizeof(float)) {
                free(*buf);
                *buf_cap = (size_t)(nr * nc * esz + 3) / sizeof(float);
                *buf = hp_malloc(sizeof(float) * *buf_cap);
                if (!*buf) {
                    s = HP_ERR_OOM;
                    break;
                }
            }
            unsigned char *dst = (unsigned char *)*buf;
            if (nc == gs[2]) {   // whole rows: one read
                s = hp_safetensors_read_bytes(open_st[k], hf, (uint64_t)(r0 * gs[2] * esz), dst, (size_t)(nr * nc * esz));
            } else {
                for (int64_t r = 0; s == HP_OK && r < nr; r++)
                    s = hp_safetensors_read_bytes(open_st[k], hf, (uint64_t)(((r0 + r) * gs[2] + c0) * esz),
                                                  dst + r * nc * esz, (size_t)(nc * esz));
            }
            hf_counts_.bytes_read += (uint64_t)(nr * nc * esz);
            if (s != HP_OK) break;
            int64_t first, bad = hp_hf_count_nonfinite_raw(*buf, nr * nc, sdt, &first);
            if (bad) {
                s = hp_error(HP_ERR_FORMAT, "HF checkpoint %s: %s: tensor '%s' has %lld non-finite value(s) (NaN or "
                             "inf); expected finite weights (re-download or re-export the checkpoint)", dir, fname, hf,
                             (long long)bad);
                break;
            }
            int64_t csz[HP_MAX_DIMS] = {1, nr, nc}, off[HP_MAX_DIMS] = {0, 0, 0}, len[HP_MAX_DIMS] = {1, nr, nc};
            int64_t loff[HP_MAX_DIMS] = {boxes[b].l[0] + (e - boxes[b].g[0]), boxes[b].l[1], boxes[b].l[2]};
            hp_dcp_copy_box(&v->local, loff, *buf, sdt, csz, off, len, 3);
        }
    }
    free(boxes);
    return s;
}

int hp_hf_is_lora_param(const char *fqn) {
    size_t n = strlen(fqn);
    return n > 14 && (!strcmp(fqn + n - 14, ".lora_a.weight") || !strcmp(fqn + n - 14, ".lora_b.weight"));
}

/* "layers.L.attention.wq.lora_a.weight" -> PEFT's "base_model.model.model.layers.L.self_attn.q_proj.lora_A.weight";
 * *permute: lora_b of a weight the adapter permutes (its rows are that weight's rows). */
static hp_status_t lora_hf_name(const hp_hf_adapter_t *a, const char *fqn, char *out, size_t n, int *permute) {
    char base[HP_PARAM_NAME_MAX], hf[160];
    const size_t len = strlen(fqn);
    const int is_b = fqn[len - 8] == 'b';   /* ".lora_b.weight": the 'b' before ".weight" */
    snprintf(base, sizeof base, "%.*s.weight", (int)(len - 14), fqn);
    int pm = 0;
    HP_TRY(hp_hf_map_name(a, HP_HF_TO_HF, base, hf, sizeof hf, &pm));
    const size_t hl = strlen(hf);
    if (hl < 7 || strcmp(hf + hl - 7, ".weight") != 0)
        return hp_error(HP_ERR_INVALID_ARG, "LoRA: HF name '%s' of '%s' does not end in .weight", hf, base);
    snprintf(out, n, "base_model.model.%.*s.lora_%c.weight", (int)(hl - 7), hf, is_b ? 'B' : 'A');
    *permute = is_b && pm;
    return HP_OK;
}

/* lora 0: the model's parameters from an HF folder (LoRA adapters skipped: they keep their
 * init); lora 1: only the adapters, from a PEFT folder's adapter_model.safetensors. */
static hp_status_t import_local(const char *dir, const hp_hf_adapter_t *a, const hp_model_config_t *mc,
                                hp_param_t *params, int n_params, int warn, int lora) {
    if (!lora) HP_TRY(check_hf_config(dir, a, mc));
    char path[4200];
    hp_hf_index_t wm = NULL;   /* hardened parser: every type checked, plain file names */
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (!lora && access(path, R_OK) == 0) HP_TRY(hp_hf_index_read(path, &wm));
    hp_safetensors_t open_st[32] = {0};
    char open_name[32][256];
    int n_open = 0;
    hp_status_t s = HP_OK;
    char missing[512] = "";
    int nmiss = 0;
    float *buf = NULL;
    size_t buf_cap = 0;
    for (int i = 0; s == HP_OK && i < n_params; i++) {
        char hf[160];
        int pm;
        if (expert_hf_name(params[i].name, 0, hf, sizeof hf)) {   /* a routed expert's E HF tensors */
            s = import_experts(dir, mc, &params[i], wm, open_st, open_name, &n_open, &buf, &buf_cap);
            continue;
        }
        if (hp_hf_skips(a, params[i].name)) continue;   /* no HF tensor (Qwen3-MoE): kept */
        if (hp_hf_is_lora_param(params[i].name) != lora) continue;
        s = lora ? lora_hf_name(a, params[i].name, hf, sizeof hf, &pm)
                 : hp_hf_map_name(a, HP_HF_TO_HF, params[i].name, hf, sizeof hf, &pm);
        if (s != HP_OK) break;
        const char *fname = lora ? "adapter_model.safetensors" : "model.safetensors";
        if (wm) {
            const char *v = hp_hf_index_find(wm, hf);
            if (!v && !strcmp(hf, "lm_head.weight") && (v = hp_hf_index_find(wm, "model.embed_tokens.weight")))
                snprintf(hf, sizeof hf, "model.embed_tokens.weight");   /* tied embeddings */
            if (!v) {
                if (nmiss < 6) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s'%s'", nmiss ? ", " : "", hf);
                nmiss++;
                continue;
            }
            fname = v;
        }
        int k = 0;
        s = open_file(dir, fname, open_st, open_name, &n_open, &k);
        if (s != HP_OK) break;
        const hp_st_info_t *info;
        if (hp_safetensors_find(open_st[k], hf, &info) != HP_OK) {
            if (!strcmp(hf, "lm_head.weight") && hp_safetensors_find(open_st[k], "model.embed_tokens.weight", &info) == HP_OK) {
                snprintf(hf, sizeof hf, "model.embed_tokens.weight");
            } else {
                if (nmiss < 6) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s'%s'", nmiss ? ", " : "", hf);
                nmiss++;
                continue;
            }
        }
        hp_dtensor_t *v = &params[i].value;
        const int64_t *gs = v->mesh ? v->global_shape : v->local.shape;
        int nd = v->local.ndim, same = info->ndim == nd;
        for (int d = 0; same && d < nd; d++) same = info->shape[d] == gs[d];
        if (!same) {
            char hs[160], ms[160];
            size_t l = 0;
            for (int d = 0; d < info->ndim && l < sizeof hs; d++)
                l += (size_t)snprintf(hs + l, sizeof hs - l, "%s%lld", d ? ", " : "", (long long)info->shape[d]);
            if (!info->ndim) hs[0] = 0;
            l = 0;
            for (int d = 0; d < nd && l < sizeof ms; d++)
                l += (size_t)snprintf(ms + l, sizeof ms - l, "%s%lld", d ? ", " : "", (long long)gs[d]);
            if (!nd) ms[0] = 0;
            s = hp_error(HP_ERR_INVALID_ARG, "HF checkpoint %s: '%s' has shape (%s), but the %s/%s model's '%s' has shape "
                         "(%s); hint: a different model: describe it with the model.* keys, or take it from the "
                         "checkpoint's config.json", dir, hf, hs, mc->name, mc->flavor, params[i].name, ms);
            break;
        }
        /* only this rank's boxes (PyTorch DCP's HuggingFaceStorageReader): each box's rows (q/k
         * rows mapped through the permutation) and columns, in the stored dtype, then cast into
         * the local tensor */
        hp_dtype_t sdt = HP_F32;
        s = stored_dtype(dir, open_name[k], hf, info, &sdt);
        if (s != HP_OK) break;
        const int64_t cols = nd > 1 ? gs[1] : 1, esz = (int64_t)hp_dtype_size(sdt);
        int64_t numel = 1;
        for (int d = 0; d < nd; d++) numel *= gs[d];
        hf_counts_.bytes_total += (uint64_t)(numel * esz);
        hp_dcp_box_t *boxes = NULL;
        int nbox = 0;
        s = hp_dcp_local_boxes(v, &boxes, &nbox);   /* this rank's piece, any layout */
        for (int b = 0; s == HP_OK && b < nbox; b++) {
            /* a box of whole rows is read by runs of rows; a column box (Shard(1)) by one read of
             * its column segment per row, so no rank reads or holds more than its box */
            const int64_t r0 = boxes[b].g[0], nr = boxes[b].s[0];
            const int64_t c0 = nd > 1 ? boxes[b].g[1] : 0, nc = nd > 1 ? boxes[b].s[1] : 1;
            const int whole = nc == cols;
            if ((size_t)(nr * nc * esz) > buf_cap * sizeof(float)) {
                free(buf);
                buf_cap = (size_t)(nr * nc * esz + 3) / sizeof(float);
                buf = hp_malloc(sizeof(float) * buf_cap);
                if (!buf) {
                    s = HP_ERR_OOM;
                    break;
                }
            }
            unsigned char *dst = (unsigned char *)buf;
            for (int64_t r = 0; s == HP_OK && r < nr;) {
                int64_t hr = pm ? hf_row(r0 + r, mc->head_dim) : r0 + r, run = 1;
                while (whole && r + run < nr && (pm ? hf_row(r0 + r + run, mc->head_dim) : r0 + r + run) == hr + run)
                    run++;
                s = hp_safetensors_read_bytes(open_st[k], hf, (uint64_t)((hr * cols + c0) * esz),
                                              dst + r * nc * esz, (size_t)(run * nc * esz));
                hf_counts_.bytes_read += (uint64_t)(run * nc * esz);
                r += run;
            }
            if (s != HP_OK) break;
            int64_t first, bad = hp_hf_count_nonfinite_raw(buf, nr * nc, sdt, &first);
            if (bad) {   /* damaged weights would convert and generate garbage with exit 0 */
                s = hp_error(HP_ERR_FORMAT, "HF checkpoint %s: %s: tensor '%s' has %lld non-finite value(s) (NaN or "
                             "inf) in rows %lld..%lld, the first at row %lld; expected finite weights (re-download "
                             "or re-export the checkpoint)", dir, open_name[k], hf, (long long)bad, (long long)r0,
                             (long long)(r0 + nr - 1), (long long)(r0 + first / nc));
                break;
            }
            int64_t csz[HP_MAX_DIMS] = {nr, nc}, off[HP_MAX_DIMS] = {0, 0};
            hp_dcp_copy_box(&v->local, boxes[b].l, buf, sdt, csz, off, boxes[b].s, nd);
        }
        free(boxes);
    }
    if (s == HP_OK && nmiss)
        s = hp_error(HP_ERR_NOT_FOUND, "HF checkpoint %s lacks %d tensor(s) the %s model needs: %s%s", dir, nmiss, mc->name,
                     missing, nmiss > 6 ? ", ..." : "");
    if (s == HP_OK && warn && !lora) warn_extra_tensors(dir, a, mc, params, n_params, wm, wm ? NULL : open_st[0]);
    for (int k = 0; k < n_open; k++) hp_safetensors_close(open_st[k]);
    free(buf);
    hp_hf_index_free(wm);
    return s;
}

hp_status_t hp_hf_import(const char *dir, const hp_hf_adapter_t *a, const hp_model_config_t *mc,
                         hp_param_t *params, int n_params, hp_comm_t comm) {
    int warn = !comm || hp_comm_rank(comm) == 0;   /* one warning per job, not per rank */
    HP_TRY(hp_hf_check(a, mc, "import"));   /* the same on every rank */
    return hp_dcp_agree(comm, import_local(dir, a, mc, params, n_params, warn, 0), "HF import");
}

/* ---- LoRA adapters in PEFT's format (docs/finetune.md "LoRA") ---------------------------- */

/* PEFT's adapter_config.json must describe the model's adapters: r, lora_alpha, the target
 * modules, plain LoRA (no rslora, DoRA or bias). */
static hp_status_t check_peft_config(const char *dir, const hp_model_config_t *mc) {
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *txt = NULL;
    size_t len = 0;
    HP_TRY(hp_file_read_all(path, "PEFT adapter config", (size_t)1 << 20, &txt, &len));
    json_object *o = json_tokener_parse(txt);
    free(txt);
    if (!o || !json_object_is_type(o, json_type_object)) {
        if (o) json_object_put(o);
        return hp_error(HP_ERR_FORMAT, "%s: not a JSON object; expected PEFT's adapter_config.json", path);
    }
    hp_status_t s = HP_OK;
    json_object *v;
    const char *pt = json_object_object_get_ex(o, "peft_type", &v) ? json_object_get_string(v) : "";
    int r = json_object_object_get_ex(o, "r", &v) ? json_object_get_int(v) : -1;
    double al = json_object_object_get_ex(o, "lora_alpha", &v) ? json_object_get_double(v) : -1;
    int rs = json_object_object_get_ex(o, "use_rslora", &v) && json_object_get_boolean(v);
    int dora = json_object_object_get_ex(o, "use_dora", &v) && json_object_get_boolean(v);
    const char *bias = json_object_object_get_ex(o, "bias", &v) && v ? json_object_get_string(v) : "none";
    int targets = 0, bad_target = 0;
    char badname[64] = "";
    if (json_object_object_get_ex(o, "target_modules", &v) && json_object_is_type(v, json_type_array)) {
        for (size_t k = 0; k < json_object_array_length(v); k++) {
            const char *tn = json_object_get_string(json_object_array_get_idx(v, k));
            int b = tn ? hp_lora_target_bit(tn) : 0;
            if (!b && !bad_target++) snprintf(badname, sizeof badname, "%s", tn ? tn : "(null)");
            targets |= b;
        }
    } else {
        bad_target = 1;
        snprintf(badname, sizeof badname, "(target_modules is not a list)");
    }
    if (strcmp(pt, "LORA") != 0 || rs || dora || strcmp(bias, "none") != 0)
        s = hp_error(HP_ERR_UNSUPPORTED, "%s: peft_type '%s', use_rslora %d, use_dora %d, bias '%s'; expected plain LoRA "
                     "(peft_type LORA, no rslora / DoRA, bias none)", path, pt, rs, dora, bias);
    else if (bad_target)
        s = hp_error(HP_ERR_UNSUPPORTED, "%s: target module '%s' is none of q_proj, k_proj, v_proj, o_proj, gate_proj, "
                     "up_proj, down_proj", path, badname);
    else if (r != mc->lora_rank || (float)al != mc->lora_alpha || targets != mc->lora_targets)
        s = hp_error(HP_ERR_INVALID_ARG, "%s: r %d, lora_alpha %g, target_modules 0x%x, but the model's LoRA has "
                     "lora.rank %d, lora.alpha %g, lora.target_modules 0x%x; hint: set the lora.* keys to the adapter's",
                     path, r, al, (unsigned)targets, mc->lora_rank, (double)mc->lora_alpha, (unsigned)mc->lora_targets);
    json_object_put(o);
    return s;
}

hp_status_t hp_hf_import_lora(const char *dir, const hp_hf_adapter_t *a, const hp_model_config_t *mc,
                              hp_param_t *params, int n_params, hp_comm_t comm) {
    HP_TRY(hp_hf_check(a, mc, "LoRA import"));
    hp_status_t s = check_peft_config(dir, mc);
    if (s == HP_OK) s = import_local(dir, a, mc, params, n_params, 0, 1);
    return hp_dcp_agree(comm, s, "LoRA adapter import");
}

hp_status_t hp_hf_save_lora(const char *dir, const hp_hf_adapter_t *a, const hp_model_config_t *mc,
                            const hp_param_t *params, int n_params, hp_comm_t comm, const char *base_model) {
    const int rank = comm ? hp_comm_rank(comm) : 0;
    HP_TRY(hp_hf_check(a, mc, "LoRA save"));
    hp_status_t s = rank == 0 ? hp_file_mkdirs(dir) : HP_OK;
    HP_TRY(hp_dcp_agree(comm, s, "LoRA save: creating the folder"));
    int n = 0;
    for (int i = 0; i < n_params; i++) n += hp_hf_is_lora_param(params[i].name);
    hp_tensor_t *full = hp_calloc((size_t)n + 1, sizeof *full);
    void **owned = hp_calloc((size_t)n + 1, sizeof *owned);
    char (*names)[160] = hp_calloc((size_t)n + 1, sizeof *names);
    hp_st_entry_t *ents = hp_calloc((size_t)n + 1, sizeof *ents);
    if (!full || !owned || !names || !ents) s = HP_ERR_OOM;
    for (int i = 0, k = 0; s == HP_OK && i < n_params; i++) {   /* every rank takes part in the gathers */
        if (!hp_hf_is_lora_param(params[i].name)) continue;
        int pm = 0;
        s = lora_hf_name(a, params[i].name, names[k], sizeof names[k], &pm);
        if (s == HP_OK) s = full_of(&params[i], &full[k], &owned[k]);
        if (s == HP_OK && pm) {   /* lora_B of a q / k weight: its rows are the weight's rows */
            const int64_t rows = full[k].shape[0], cols = full[k].shape[1];
            float *pb = hp_malloc(sizeof(float) * (size_t)(rows * cols));
            if (!pb || rows % mc->head_dim || !hp_tensor_is_contiguous(&full[k])) {
                free(pb);
                s = pb ? hp_error(HP_ERR_INVALID_ARG, "LoRA save: '%s' is not a contiguous (heads*%d, r) tensor",
                                  params[i].name, mc->head_dim) : HP_ERR_OOM;
                break;
            }
            hp_hf_permute_rows(pb, full[k].data, rows, sizeof(float) * (size_t)cols, mc->head_dim, 1);
            free(owned[k]);
            owned[k] = pb;
            full[k].data = pb;
        }
        ents[k] = (hp_st_entry_t){names[k], &full[k], HP_ST_F32, NULL, 0, NULL};
        k++;
    }
    if (s == HP_OK && rank == 0) {
        char path[4200];
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
        const char *meta[2] = {"format", "pt"};
        s = hp_safetensors_write(path, ents, n, meta, 1);
        if (s == HP_OK) {   /* PEFT's LoraConfig fields (peft.LoraConfig.from_pretrained reads them) */
            json_object *o = json_object_new_object(), *tm = json_object_new_array();
            for (int t = 0; t < HP_LORA_N_TARGETS; t++)
                if (mc->lora_targets & (1 << t)) json_object_array_add(tm, json_object_new_string(hp_lora_target_peft_name(t)));
            json_object_object_add(o, "peft_type", json_object_new_string("LORA"));
            json_object_object_add(o, "task_type", json_object_new_string("CAUSAL_LM"));
            json_object_object_add(o, "base_model_name_or_path", json_object_new_string(base_model ? base_model : ""));
            json_object_object_add(o, "r", json_object_new_int(mc->lora_rank));
            json_object_object_add(o, "lora_alpha", json_object_new_double((double)mc->lora_alpha));
            json_object_object_add(o, "lora_dropout", json_object_new_double(0.0));
            json_object_object_add(o, "target_modules", tm);
            json_object_object_add(o, "bias", json_object_new_string("none"));
            json_object_object_add(o, "fan_in_fan_out", json_object_new_boolean(0));
            json_object_object_add(o, "use_rslora", json_object_new_boolean(0));
            json_object_object_add(o, "use_dora", json_object_new_boolean(0));
            json_object_object_add(o, "init_lora_weights", json_object_new_boolean(1));
            json_object_object_add(o, "inference_mode", json_object_new_boolean(1));
            json_object_object_add(o, "modules_to_save", NULL);
            const char *txt = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED);
            snprintf(path, sizeof path, "%s/adapter_config.json", dir);
            s = hp_file_write_atomic(path, txt, strlen(txt));
            json_object_put(o);
        }
        if (s == HP_OK) s = hp_file_fsync(dir);
    }
    for (int k = 0; owned && k < n; k++) free(owned[k]);
    free(full);
    free(owned);
    free(names);
    free(ents);
    return hp_dcp_agree(comm, s, "LoRA adapter save");
}
