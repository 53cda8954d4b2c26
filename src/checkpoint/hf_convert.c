/* Streaming HF <-> DCP conversion (hp-ckpt from-hf / to-hf): one tensor in memory at a time,
 * no model, no gradients. The parameter list comes from the model config (the same names and
 * shapes as hp_model_params); under several ranks each converts its share of the tensors
 * (from-hf: balanced by bytes, one rank file each) or of the HF shards (to-hf). */
#define _GNU_SOURCE
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyperparallel/checkpoint.h"
#include "hyperparallel/model.h"
#include "hyperparallel/safetensors.h"
#include "dcp-impl.h"

/* A model parameter (hp_model_describe_params: the same names, order and shapes as
 * hp_model_params) and its HF tensors: one, or E for a routed expert's (E, A, B) parameter
 * (HF's E tensors (A, B)). */
typedef struct {
    char name[HP_PARAM_NAME_MAX];
    int ndim;
    int64_t shape[3];
    int n_hf;
    int bias;                 /* an MoE layer's expert_bias, not a parameter (model_specs) */
} spec_t;

/* One HF tensor: expert e (-1: the whole parameter) of spec `spec`, its name and 2-D shape. */
typedef struct {
    int spec, e;
    char hf[160];
    char file[256];
    hp_dtype_t dt;
    int ndim;
    int64_t shape[2];
} hf_ent_t;

/* The parameters, then each MoE layer's expert_bias (the trainer checkpoints it as
 * "layers.N.moe.expert_bias" and its initial load asks for it): DeepSeek-V3's HF
 * mlp.gate.e_score_correction_bias (n_hf 1), none in Qwen3-MoE (n_hf 0: from-hf writes zeros,
 * the value training starts from; to-hf leaves it out). */
static int model_specs(const hp_hf_adapter_t *a, const hp_model_config_t *mc, spec_t **out) {
    *out = NULL;
    const int nu = mc->n_layers + 2;   /* embedding, blocks, head */
    int n = hp_model_describe_params(mc, 0, nu, NULL, 0);
    if (n < 0) return -1;
    int nb = 0;
    for (int l = 0; l < mc->n_layers; l++) nb += hp_model_layer_is_moe(mc, l);
    hp_model_param_desc_t *d = calloc((size_t)n + 1, sizeof *d);
    spec_t *sp = calloc((size_t)(n + nb) + 1, sizeof *sp);
    if (!d || !sp) {
        free(d);
        free(sp);
        hp_error(HP_ERR_OOM, "HF conversion: no memory for %d parameter descriptions", n);
        return -1;
    }
    hp_model_describe_params(mc, 0, nu, d, n);
    for (int i = 0; i < n; i++) {
        char tmp[160];
        memcpy(sp[i].name, d[i].name, sizeof sp[i].name);
        sp[i].ndim = d[i].ndim;
        memcpy(sp[i].shape, d[i].shape, sizeof sp[i].shape);
        sp[i].n_hf = hp_hf_expert_name(sp[i].name, 0, tmp, sizeof tmp) ? (int)sp[i].shape[0] : 1;
    }
    free(d);
    for (int l = 0; l < mc->n_layers; l++) {
        if (!hp_model_layer_is_moe(mc, l)) continue;
        spec_t *b = &sp[n++];
        snprintf(b->name, sizeof b->name, "layers.%d.moe.expert_bias", l);
        b->ndim = 1;
        b->shape[0] = mc->moe_experts;
        b->n_hf = !hp_hf_skips(a, b->name);
        b->bias = 1;
    }
    *out = sp;
    return n;
}

/* The HF tensors of the specs, in order (*out: calloc'ed, names and shapes filled). */
static int hf_entries(const hp_hf_adapter_t *a, const spec_t *spec, int n, hf_ent_t **out) {
    int m = 0;
    for (int i = 0; i < n; i++) m += spec[i].n_hf;
    hf_ent_t *h = calloc((size_t)m + 1, sizeof *h);
    *out = h;
    if (!h) {
        hp_error(HP_ERR_OOM, "HF conversion: no memory for %d HF tensor names", m);
        return -1;
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        char tmp[160];
        if (spec[i].n_hf == 0) continue;   /* no HF tensor */
        if (!hp_hf_expert_name(spec[i].name, 0, tmp, sizeof tmp)) {
            int pm;
            h[k] = (hf_ent_t){.spec = i, .e = -1, .ndim = spec[i].ndim, .shape = {spec[i].shape[0], spec[i].shape[1]}};
            if (hp_hf_map_name(a, HP_HF_TO_HF, spec[i].name, h[k].hf, sizeof h[k].hf, &pm) != HP_OK) return -1;
            k++;
            continue;
        }
        for (int e = 0; e < spec[i].n_hf; e++, k++) {
            h[k] = (hf_ent_t){.spec = i, .e = e, .ndim = 2, .shape = {spec[i].shape[1], spec[i].shape[2]}};
            hp_hf_expert_name(spec[i].name, e, h[k].hf, sizeof h[k].hf);
        }
    }
    return m;
}

/* The specs and their HF tensors (*spec and *ent calloc'ed), or an error naming `what`. */
static hp_status_t plan_tensors(const hp_hf_adapter_t *a, const hp_model_config_t *mc, const char *what,
                                spec_t **spec, int *n, hf_ent_t **ent, int *m) {
    *ent = NULL;
    *n = model_specs(a, mc, spec);
    *m = *n < 0 ? -1 : hf_entries(a, *spec, *n, ent);
    if (*n >= 0 && *m >= 0) return HP_OK;
    hp_status_t e = hp_error_prefix(HP_ERR_INVALID_ARG, "%s: ", what);
    free(*spec);
    free(*ent);
    *spec = NULL;
    *ent = NULL;
    return e;
}

static void shape_str(char *out, size_t n, int ndim, const int64_t *shape) {
    size_t l = 0;
    out[0] = 0;
    for (int d = 0; d < ndim && l < n; d++) l += (size_t)snprintf(out + l, n - l, "%s%lld", d ? ", " : "", (long long)shape[d]);
}

static int64_t spec_numel(const spec_t *s) {
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->shape[d];
    return n;
}
static int64_t ent_numel(const hf_ent_t *h) { return h->shape[0] * (h->ndim > 1 ? h->shape[1] : 1); }

/* non-finite elements of n raw values (F32 / BF16 / F16); *first = the first index */
int64_t hp_hf_count_nonfinite_raw(const void *p, int64_t n, hp_dtype_t dt, int64_t *first) {
    int64_t bad = 0;
    *first = -1;
    for (int64_t i = 0; i < n; i++) {
        int nf;
        if (dt == HP_F32) {
            uint32_t u;
            memcpy(&u, (const char *)p + 4 * i, 4);
            nf = (u & 0x7f800000u) == 0x7f800000u;
        } else {
            uint16_t h;
            memcpy(&h, (const char *)p + 2 * i, 2);
            nf = dt == HP_BF16 ? (h & 0x7f80u) == 0x7f80u : (h & 0x7c00u) == 0x7c00u;
        }
        if (nf && bad++ == 0) *first = i;
    }
    return bad;
}

static hp_status_t grow(void **buf, size_t *cap, size_t n) {
    if (n <= *cap) return HP_OK;
    free(*buf);
    *buf = malloc(n ? n : 1);
    *cap = *buf ? n : 0;
    if (!*buf) return hp_error(HP_ERR_OOM, "HF conversion: no memory for a tensor of %zu bytes", n);
    return HP_OK;
}

/* ---- from-hf -------------------------------------------------------------------------------- */

typedef struct {
    const char *dir;
    const hp_hf_adapter_t *a;
    const hp_model_config_t *mc;
    const spec_t *spec;
    const hf_ent_t *ent;      /* the HF tensors (tied lm_head -> embed_tokens) */
    const int *first;         /* first HF tensor of each spec */
    const hp_dtype_t *dt;     /* stored dtype per spec */
    const int *mine;          /* spec index of this rank's entry k */
    hp_safetensors_t st;      /* the open shard */
    char st_name[256];
    void *buf, *perm;
    size_t cap, pcap;
    hp_tensor_t t;
    hp_hf_convert_stats_t *stats;
} to_dcp_t;

static hp_status_t open_shard(const char *dir, const char *fname, hp_safetensors_t *st, char *cur, size_t cn) {
    if (*st && !strcmp(cur, fname)) return HP_OK;
    hp_safetensors_close(*st);
    *st = NULL;
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, fname);
    HP_TRY(hp_safetensors_open(p, st));
    snprintf(cur, cn, "%s", fname);
    return HP_OK;
}

/* One DCP tensor: its HF tensor, or a routed expert's E HF tensors one after the other. */
static hp_status_t to_dcp_fill(void *ctx, int k, const hp_tensor_t **out) {
    to_dcp_t *c = ctx;
    int i = c->mine[k];
    const spec_t *sp = &c->spec[i];
    size_t esz = hp_dtype_size(c->dt[i]), nb = (size_t)spec_numel(sp) * esz;
    HP_TRY(grow(&c->buf, &c->cap, nb));
    if (sp->n_hf == 0) memset(c->buf, 0, nb);   /* expert_bias without an HF tensor: training starts at 0 */
    size_t off = 0;
    for (int j = c->first[i]; j < c->first[i] + sp->n_hf; j++) {
        const hf_ent_t *h = &c->ent[j];
        int64_t numel = ent_numel(h);
        HP_TRY(open_shard(c->dir, h->file, &c->st, c->st_name, sizeof c->st_name));
        HP_TRY(hp_safetensors_read_raw(c->st, h->hf, (char *)c->buf + off, (size_t)numel * esz));
        if (c->stats) c->stats->bytes_read += (int64_t)((size_t)numel * esz);
        int64_t first, bad = hp_hf_count_nonfinite_raw((char *)c->buf + off, numel, c->dt[i], &first);
        if (bad)   /* damaged weights would convert and generate garbage with exit 0 */
            return hp_error(HP_ERR_FORMAT, "HF checkpoint %s: %s: tensor '%s' has %lld non-finite value(s) (NaN or inf) "
                            "of %lld, the first at flat index %lld; expected finite weights (re-download or re-export "
                            "the checkpoint)", c->dir, h->file, h->hf, (long long)bad, (long long)numel,
                            (long long)first);
        off += (size_t)numel * esz;
    }
    void *data = c->buf;
    char tmp[160];
    int pm = 0;
    if (sp->n_hf > 0 && c->ent[c->first[i]].e < 0)
        HP_TRY(hp_hf_map_name(c->a, HP_HF_TO_HF, sp->name, tmp, sizeof tmp, &pm));
    if (pm) {
        HP_TRY(grow(&c->perm, &c->pcap, nb));
        hp_hf_permute_rows(c->perm, c->buf, sp->shape[0], (size_t)sp->shape[1] * esz, c->mc->head_dim, 0);
        data = c->perm;
    }
    HP_TRY(hp_tensor_init(&c->t, c->dt[i], sp->ndim, sp->shape, data));
    *out = &c->t;
    return HP_OK;
}

static hp_status_t st_to_hp_dtype(hp_st_dtype_t d, hp_dtype_t *out) {
    switch (d) {
    case HP_ST_F32: *out = HP_F32; return HP_OK;
    case HP_ST_BF16: *out = HP_BF16; return HP_OK;
    case HP_ST_F16: *out = HP_F16; return HP_OK;
    default: return HP_ERR_UNSUPPORTED;
    }
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Finds every HF tensor (file, dtype), checking shapes; missing ones are listed. dt: the dtype of
 * each spec (a routed expert's E tensors must agree). */
static hp_status_t locate(const char *dir, const hp_model_config_t *mc, const spec_t *spec, hf_ent_t *ent, int m,
                          hp_dtype_t *dt, int warn) {
    char path[4200];
    hp_hf_index_t wm = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, R_OK) == 0) HP_TRY(hp_hf_index_read(path, &wm));
    hp_safetensors_t st = NULL;
    char cur[256] = "";
    hp_status_t s = HP_OK;
    char missing[512] = "";
    int nmiss = 0;
    for (int j = 0; s == HP_OK && j < m; j++) {
        hf_ent_t *h = &ent[j];
        const spec_t *sp = &spec[h->spec];
        const char *fname = "model.safetensors";
        if (wm) {
            const char *v = hp_hf_index_find(wm, h->hf);
            if (!v && !strcmp(h->hf, "lm_head.weight") && (v = hp_hf_index_find(wm, "model.embed_tokens.weight")))
                snprintf(h->hf, sizeof h->hf, "model.embed_tokens.weight");   /* tied in the file */
            if (!v) {
                if (nmiss < 6) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s'%s'", nmiss ? ", " : "", h->hf);
                nmiss++;
                continue;
            }
            fname = v;
        }
        snprintf(h->file, sizeof h->file, "%s", fname);
        s = open_shard(dir, fname, &st, cur, sizeof cur);
        if (s != HP_OK) break;
        const hp_st_info_t *info;
        if (hp_safetensors_find(st, h->hf, &info) != HP_OK) {
            if (!strcmp(h->hf, "lm_head.weight") && hp_safetensors_find(st, "model.embed_tokens.weight", &info) == HP_OK) {
                snprintf(h->hf, sizeof h->hf, "model.embed_tokens.weight");
            } else {
                if (nmiss < 6) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s'%s'", nmiss ? ", " : "", h->hf);
                nmiss++;
                continue;
            }
        }
        int same = info->ndim == h->ndim;
        for (int d = 0; same && d < h->ndim; d++) same = info->shape[d] == h->shape[d];
        if (!same) {
            char hs[160], ms[160];
            shape_str(hs, sizeof hs, info->ndim, info->shape);
            shape_str(ms, sizeof ms, h->ndim, h->shape);
            char which[64] = "";
            if (h->e >= 0) snprintf(which, sizeof which, "expert %d of ", h->e);
            s = hp_error(HP_ERR_INVALID_ARG, "HF checkpoint %s: '%s' has shape (%s), but %sthe %s/%s model's '%s' has "
                         "shape (%s); hint: a different model: take it from config.json", dir, h->hf, hs, which,
                         mc->name, mc->flavor, sp->name, ms);
            break;
        }
        if (st_to_hp_dtype(info->dtype, &h->dt) != HP_OK) {
            s = hp_error(HP_ERR_UNSUPPORTED, "HF checkpoint %s: %s: tensor '%s' is %s; expected F32, BF16 or F16 weights",
                         dir, fname, h->hf, hp_st_dtype_name(info->dtype));
            break;
        }
        if (h->e <= 0) dt[h->spec] = h->dt;
        else if (h->dt != dt[h->spec])   /* one DCP tensor holds the E experts */
            s = hp_error(HP_ERR_UNSUPPORTED, "HF checkpoint %s: tensor '%s' is %s but expert 0 of '%s' is %s; expected one "
                         "dtype for a layer's experts (re-export the checkpoint in one dtype)", dir, h->hf,
                         hp_dtype_name(h->dt), sp->name, hp_dtype_name(dt[h->spec]));
    }
    if (s == HP_OK && nmiss)
        s = hp_error(HP_ERR_NOT_FOUND, "HF checkpoint %s lacks %d tensor(s) the %s model needs: %s%s", dir, nmiss,
                     mc->name, missing, nmiss > 6 ? ", ..." : "");
    /* a tensor no parameter maps to (a vision tower, a bias the model lacks) is not converted,
     * but not silently */
    int extra = 0, total = 0;
    if (s == HP_OK && warn) {
        if (!wm) s = open_shard(dir, "model.safetensors", &st, cur, sizeof cur);
        total = wm ? hp_hf_index_count(wm) : (s == HP_OK ? hp_safetensors_count(st) : 0);
    }
    const char **names = total ? malloc((size_t)m * sizeof *names) : NULL;   /* sorted, for bsearch */
    if (total && !names) s = hp_error(HP_ERR_OOM, "HF conversion: no memory for %d names", m);
    for (int j = 0; names && j < m; j++) names[j] = ent[j].hf;
    if (names) qsort(names, (size_t)m, sizeof *names, cmp_name);
    for (int k = 0; s == HP_OK && k < total; k++) {
        const char *key = NULL, *f = NULL;
        if (wm) hp_hf_index_at(wm, k, &key, &f);
        else key = hp_safetensors_info(st, k)->name;
        int known = bsearch(&key, names, (size_t)m, sizeof *names, cmp_name) != NULL;
        if (!known && extra++ < 20)
            hp_log(HP_LOG_WARN, "HF checkpoint %s: tensor '%s' is not a parameter of the %s model; not converted", dir,
                   key, mc->name);
    }
    if (extra > 20)
        hp_log(HP_LOG_WARN, "HF checkpoint %s: %d more tensors the %s model does not have; not converted", dir,
               extra - 20, mc->name);
    free(names);
    hp_safetensors_close(st);
    hp_hf_index_free(wm);
    return s;
}

/* owner[i]: greedy by bytes, the largest tensor first to the least-loaded rank (the same on
 * every rank: it depends only on the shapes) */
static void balance(const int64_t *bytes, int n, int world, int *owner) {
    int64_t *load = calloc((size_t)world, sizeof *load);
    char *done = calloc((size_t)n + 1, 1);
    for (int k = 0; k < n; k++) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (!done[i] && (best < 0 || bytes[i] > bytes[best])) best = i;
        int r = 0;
        for (int q = 1; q < world; q++)
            if (load[q] < load[r]) r = q;
        owner[best] = r;
        load[r] += bytes[best];
        done[best] = 1;
    }
    free(load);
    free(done);
}

static hp_status_t check_config(const char *dir, const hp_hf_adapter_t *a, const hp_model_config_t *mc) {
    hp_model_config_t hf;
    HP_TRY(a->read_config(dir, &hf));
    char msg[1500], flags[700];
    if (a->config_diff(&hf, mc, msg, sizeof msg, flags, sizeof flags))
        return hp_error(HP_ERR_INVALID_ARG, "HF checkpoint %s: config.json disagrees with the %s/%s model: %s; hint: "
                        "describe it with %s, or take the model from config.json", dir, mc->name, mc->flavor, msg, flags);
    return HP_OK;
}


hp_status_t hp_hf_convert_to_dcp(const char *hf_dir, const hp_hf_adapter_t *a, const hp_model_config_t *mc,
                                 const char *out_dir, hp_comm_t comm, hp_hf_convert_stats_t *stats) {
    int rank = comm ? hp_comm_rank(comm) : 0, world = comm ? hp_comm_size(comm) : 1;
    if (stats) memset(stats, 0, sizeof *stats);
    HP_TRY(hp_hf_check(a, mc, "import"));
    spec_t *spec = NULL;
    hf_ent_t *ent = NULL;
    int n, m;
    HP_TRY(plan_tensors(a, mc, "HF conversion", &spec, &n, &ent, &m));
    hp_dtype_t *dt = calloc((size_t)n + 1, sizeof *dt);
    int64_t *bytes = calloc((size_t)n + 1, sizeof *bytes), *sums = calloc((size_t)n + 1, sizeof *sums);
    int *owner = calloc((size_t)n + 1, sizeof *owner), *mine = calloc((size_t)n + 1, sizeof *mine);
    int *first = calloc((size_t)n + 1, sizeof *first);
    hp_st_entry_t *ents = calloc((size_t)n + 1, sizeof *ents);
    hp_status_t s = dt && bytes && sums && owner && mine && first && ents ? HP_OK : HP_ERR_OOM;
    for (int i = 0, j = 0; s == HP_OK && i < n; j += spec[i].n_hf, i++) {
        first[i] = j;
        dt[i] = HP_F32;   /* located below; an expert_bias without an HF tensor stays f32 zeros */
    }
    /* every rank checks the config and locates the tensors (headers only) */
    if (s == HP_OK) s = check_config(hf_dir, a, mc);
    if (s == HP_OK) s = locate(hf_dir, mc, spec, ent, m, dt, rank == 0);
    HP_TRY(hp_dcp_agree(comm, s, "HF conversion: reading the checkpoint's headers"));
    for (int i = 0; i < n; i++) bytes[i] = spec_numel(&spec[i]) * (int64_t)hp_dtype_size(dt[i]);
    balance(bytes, n, world, owner);
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp-hf", out_dir);
    if (rank == 0) {
        hp_file_rmtree(tmp);
        s = hp_file_mkdirs(tmp);
    }
    HP_TRY(hp_dcp_agree(comm, s, "HF conversion: creating the output directory"));
    int k = 0;
    for (int i = 0; i < n; i++)
        if (owner[i] == rank) {
            mine[k] = i;
            ents[k] = (hp_st_entry_t){spec[i].name, NULL, hp_st_dtype_from_hp(dt[i]), NULL, spec[i].ndim, spec[i].shape};
            k++;
        }
    to_dcp_t c = {.dir = hf_dir, .a = a, .mc = mc, .spec = spec, .ent = ent, .first = first, .dt = dt, .mine = mine,
                  .stats = stats};
    uint64_t *xx = calloc((size_t)k + 1, sizeof *xx);
    char fn[64], path[4400];
    snprintf(fn, sizeof fn, "__%d_0.safetensors", rank);
    snprintf(path, sizeof path, "%s/%s", tmp, fn);
    const char *meta[2] = {"format", "hyperparallel-dcp"};
    if (!xx) s = HP_ERR_OOM;
    if (s == HP_OK && k > 0) s = hp_safetensors_write_stream(path, ents, k, meta, 1, to_dcp_fill, &c, xx);
    for (int j = 0; s == HP_OK && j < k; j++) {
        sums[mine[j]] = (int64_t)xx[j];
        if (stats) {
            stats->tensors++;
            stats->bytes_written += bytes[mine[j]];
            if (bytes[mine[j]] > stats->largest_tensor_bytes) stats->largest_tensor_bytes = bytes[mine[j]];
        }
    }
    hp_safetensors_close(c.st);
    free(c.buf);
    free(c.perm);
    free(xx);
    s = hp_dcp_agree(comm, s, "HF conversion: writing the rank files");
    /* the checksums: every slot is written by one rank, the others hold 0 */
    if (s == HP_OK && comm) s = hp_all_reduce(sums, sums, (size_t)n, HP_I64, HP_SUM, comm, NULL);
    if (s == HP_OK && rank == 0) {
        json_object *root = json_object_new_object(), *tens = json_object_new_object();
        json_object_object_add(root, "magic", json_object_new_string("hyperparallel-dcp"));
        json_object_object_add(root, "version", json_object_new_int(1));
        json_object_object_add(root, "world_size", json_object_new_int(world));
        json_object_object_add(root, "step", json_object_new_int64(0));
        for (int i = 0; i < n; i++) {
            json_object *e = json_object_new_object(), *shape = json_object_new_array(), *ch = json_object_new_array();
            json_object *c1 = json_object_new_object(), *o = json_object_new_array(), *z = json_object_new_array();
            json_object_object_add(e, "dtype", json_object_new_string(hp_st_dtype_name(hp_st_dtype_from_hp(dt[i]))));
            for (int d = 0; d < spec[i].ndim; d++) {
                json_object_array_add(shape, json_object_new_int64(spec[i].shape[d]));
                json_object_array_add(o, json_object_new_int64(0));
                json_object_array_add(z, json_object_new_int64(spec[i].shape[d]));
            }
            json_object_object_add(e, "shape", shape);
            char f2[64], hex[24];
            snprintf(f2, sizeof f2, "__%d_0.safetensors", owner[i]);
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)(uint64_t)sums[i]);
            json_object_object_add(c1, "offsets", o);
            json_object_object_add(c1, "sizes", z);
            json_object_object_add(c1, "file", json_object_new_string(f2));
            json_object_object_add(c1, "key", json_object_new_string(spec[i].name));
            json_object_object_add(c1, "rank", json_object_new_int(owner[i]));
            json_object_object_add(c1, "xxh3", json_object_new_string(hex));
            json_object_array_add(ch, c1);
            json_object_object_add(e, "chunks", ch);
            json_object_object_add(tens, spec[i].name, e);
        }
        json_object_object_add(root, "tensors", tens);
        json_object_object_add(root, "blobs", json_object_new_object());
        snprintf(path, sizeof path, "%s/metadata.json", tmp);
        s = hp_dcp_write_json(path, root);
        json_object_put(root);
        if (s == HP_OK) s = hp_file_fsync(tmp);
        if (s == HP_OK) s = hp_file_replace_dir(tmp, out_dir);
        if (s != HP_OK) hp_file_rmtree(tmp);
    }
    free(spec);
    free(ent);
    free(first);
    free(dt);
    free(bytes);
    free(sums);
    free(owner);
    free(mine);
    free(ents);
    return hp_dcp_agree(comm, s, "HF conversion");
}

/* ---- to-hf ---------------------------------------------------------------------------------- */

typedef struct {
    const char *dcp_dir;
    const hp_hf_adapter_t *a;
    const hp_model_config_t *mc;
    const spec_t *spec;
    const hf_ent_t *ent;
    const int *idx;           /* HF tensor index of this file's entry k */
    int loaded;               /* the spec held in buf (-1: none): a routed expert's E tensors read it once */
    const unsigned char *has; /* the checkpoint holds spec i (an expert_bias may be absent: zeros) */
    float *buf, *perm;
    size_t cap, pcap;
    hp_dtensor_t dt;
    hp_tensor_t view;
    hp_hf_convert_stats_t *stats;
} from_dcp_t;

static hp_status_t from_dcp_fill(void *ctx, int k, const hp_tensor_t **out) {
    from_dcp_t *c = ctx;
    const hf_ent_t *h = &c->ent[c->idx[k]];
    const spec_t *sp = &c->spec[h->spec];
    int64_t numel = spec_numel(sp);
    size_t nb = (size_t)numel * sizeof(float);
    if (c->loaded != h->spec) {
        c->loaded = -1;
        void *b = c->buf;
        HP_TRY(grow(&b, &c->cap, nb));
        c->buf = b;
        memset(&c->dt, 0, sizeof c->dt);
        HP_TRY(hp_tensor_init(&c->dt.local, HP_F32, sp->ndim, sp->shape, c->buf));
        hp_dcp_tensor_t t1 = {sp->name, &c->dt, -1, 0};
        hp_dcp_state_t st = {&t1, 1, NULL, 0};
        hp_dcp_load_options_t o = {0, 1, NULL, 0, 0};
        if (sp->bias && !c->has[h->spec]) memset(c->buf, 0, nb);   /* a checkpoint of the parameters only */
        else HP_TRY(hp_dcp_load(c->dcp_dir, &st, NULL, &o));
        if (!t1.loaded && !(sp->bias && !c->has[h->spec]))
            return hp_error(HP_ERR_NOT_FOUND, "%s lacks '%s' (another model or flavor?)", c->dcp_dir, sp->name);
        if (c->stats) c->stats->bytes_read += (int64_t)nb;
        c->loaded = h->spec;
    }
    float *data = c->buf;
    if (h->e >= 0) {   /* expert e's (A, B) slice of the (E, A, B) tensor */
        data = c->buf + (size_t)h->e * (size_t)ent_numel(h);
    } else {
        char hf[160];
        int pm = 0;
        HP_TRY(hp_hf_map_name(c->a, HP_HF_TO_HF, sp->name, hf, sizeof hf, &pm));
        if (pm) {
            void *p = c->perm;
            HP_TRY(grow(&p, &c->pcap, nb));
            c->perm = p;
            hp_hf_permute_rows(c->perm, c->buf, sp->shape[0], (size_t)sp->shape[1] * sizeof(float), c->mc->head_dim,
                               1);
            data = c->perm;
        }
    }
    HP_TRY(hp_tensor_init(&c->view, HP_F32, h->ndim, h->shape, data));
    *out = &c->view;
    return HP_OK;
}

/* The expert_bias the HF model will not have: a trained (non-zero) one changes the routing. */
static hp_status_t warn_expert_bias(const char *dir, hp_dcp_metadata_t md) {
    for (int j = 0; j < hp_dcp_metadata_count(md); j++) {
        const hp_dcp_entry_t *e = hp_dcp_metadata_entry(md, j);
        if (e->is_blob || !hp_hf_is_expert_bias(e->name) || e->ndim != 1 || e->shape[0] > 4096) continue;
        float b[4096];
        hp_dtensor_t t;
        memset(&t, 0, sizeof t);
        HP_TRY(hp_tensor_init(&t.local, HP_F32, 1, e->shape, b));
        hp_dcp_tensor_t t1 = {e->name, &t, -1, 0};
        hp_dcp_state_t st = {&t1, 1, NULL, 0};
        hp_dcp_load_options_t o = {0, 1, NULL, 0, 0};
        HP_TRY(hp_dcp_load(dir, &st, NULL, &o));
        double mx = 0;
        for (int64_t i = 0; i < e->shape[0]; i++) mx = fmax(mx, fabs((double)b[i]));
        if (mx > 0)
            hp_log(HP_LOG_WARN, "%s: '%s' (load balancing, max |bias| %.3g) is not exported: the HF model has no expert "
                   "bias, so it selects experts by the unbiased scores", dir, e->name, mx);
    }
    return HP_OK;
}

/* Every model tensor is in the checkpoint with its shape, and the checkpoint holds no model
 * tensor the model lacks (more layers, an untied output would be dropped without a word). */
static hp_status_t check_dcp_tensors(const char *dir, const hp_model_config_t *mc, const spec_t *spec, int n,
                                     unsigned char *has) {
    hp_dcp_metadata_t md;
    HP_TRY(hp_dcp_metadata_read(dir, &md));
    hp_status_t s = HP_OK;
    int bias_dropped = 0;
    for (int i = 0; s == HP_OK && i < n; i++) {
        const hp_dcp_entry_t *e = hp_dcp_metadata_find(md, spec[i].name);
        int same = e && !e->is_blob && e->ndim == spec[i].ndim;
        for (int d = 0; same && d < spec[i].ndim; d++) same = e->shape[d] == spec[i].shape[d];
        has[i] = e != NULL;
        bias_dropped |= spec[i].bias && spec[i].n_hf == 0;
        if (!e && spec[i].bias)   /* a checkpoint of the parameters only: the bias training starts from, 0 */
            continue;
        if (!e)
            s = hp_error(HP_ERR_NOT_FOUND, "%s lacks '%s' (another model or flavor?)", dir, spec[i].name);
        else if (!same) {
            char hs[160] = "", ms[160];
            if (!e->is_blob) shape_str(hs, sizeof hs, e->ndim, e->shape);
            shape_str(ms, sizeof ms, spec[i].ndim, spec[i].shape);
            s = hp_error(HP_ERR_INVALID_ARG, "%s: '%s' has global shape (%s) in the checkpoint, but (%s) in the %s/%s "
                         "model; hint: describe the trained model with the model.* keys of its config", dir,
                         spec[i].name, hs, ms, mc->name, mc->flavor);
        }
    }
    for (int j = 0; s == HP_OK && j < hp_dcp_metadata_count(md); j++) {
        const hp_dcp_entry_t *e = hp_dcp_metadata_entry(md, j);
        if (e->is_blob || strncmp(e->name, "optimizer.", 10) == 0 || hp_hf_is_expert_bias(e->name)) continue;
        int found = 0;
        for (int i = 0; !found && i < n; i++) found = !strcmp(spec[i].name, e->name);
        if (!found)
            s = hp_error(HP_ERR_INVALID_ARG, "%s holds model tensor '%s', which the %s/%s model (n_layers %d, "
                         "tie_embeddings %s) lacks; hint: describe the trained model with --model.n_layers / "
                         "--model.tie_embeddings (the model.* keys of its config)", dir, e->name, mc->name, mc->flavor,
                         mc->n_layers, mc->tie_embeddings ? "true" : "false");
    }
    if (s == HP_OK && bias_dropped) s = warn_expert_bias(dir, md);
    hp_dcp_metadata_free(md);
    return s;
}

hp_status_t hp_hf_convert_from_dcp(const char *dcp_dir, const hp_hf_adapter_t *a, const hp_model_config_t *mc,
                                   const char *out_dir, hp_dtype_t dtype, size_t max_shard_bytes, hp_comm_t comm,
                                   hp_hf_convert_stats_t *stats) {
    int rank = comm ? hp_comm_rank(comm) : 0, world = comm ? hp_comm_size(comm) : 1;
    if (stats) memset(stats, 0, sizeof *stats);
    HP_TRY(hp_hf_export_check(a, mc, dtype, &max_shard_bytes));
    spec_t *spec = NULL;
    hf_ent_t *ent = NULL;
    int n, m;
    HP_TRY(plan_tensors(a, mc, "HF export", &spec, &n, &ent, &m));
    int *file_of = calloc((size_t)m + 1, sizeof *file_of), *idx = calloc((size_t)m + 1, sizeof *idx);
    hp_st_entry_t *ents = calloc((size_t)m + 1, sizeof *ents);
    hp_status_t s = file_of && idx && ents ? HP_OK : HP_ERR_OOM;
    unsigned char *has = calloc((size_t)n + 1, 1);
    if (s == HP_OK && !has) s = HP_ERR_OOM;
    if (s == HP_OK) s = check_dcp_tensors(dcp_dir, mc, spec, n, has);
    size_t esz = hp_dtype_size(dtype), cur = 0, total = 0;
    int nfiles = 1;
    for (int j = 0; s == HP_OK && j < m; j++) {
        size_t nb = (size_t)ent_numel(&ent[j]) * esz;
        file_of[j] = hp_hf_next_shard(nb, max_shard_bytes, &cur, &total, &nfiles);
        if (stats && (int64_t)nb > stats->largest_tensor_bytes) stats->largest_tensor_bytes = (int64_t)nb;
    }
    if (s == HP_OK && rank == 0) s = hp_file_mkdirs(out_dir);
    HP_TRY(hp_dcp_agree(comm, s, "HF export: creating the directory"));
    from_dcp_t c = {.dcp_dir = dcp_dir, .a = a, .mc = mc, .spec = spec, .ent = ent, .idx = idx, .loaded = -1,
                    .has = has, .stats = stats};
    for (int f = 1; s == HP_OK && f <= nfiles; f++) {
        if ((f - 1) % world != rank) continue;   /* each rank writes its share of the shards */
        char fn[64], path[4400];
        hp_hf_shard_name(fn, sizeof fn, path, sizeof path, out_dir, f, nfiles);
        int k = 0;
        for (int j = 0; j < m; j++)
            if (file_of[j] == f) {
                idx[k] = j;
                ents[k] = (hp_st_entry_t){ent[j].hf, NULL, hp_st_dtype_from_hp(dtype), NULL, ent[j].ndim, ent[j].shape};
                k++;
                if (stats) stats->tensors++, stats->bytes_written += (int64_t)((size_t)ent_numel(&ent[j]) * esz);
            }
        const char *meta[2] = {"format", "pt"};
        s = hp_safetensors_write_stream(path, ents, k, meta, 1, from_dcp_fill, &c, NULL);
    }
    free(c.buf);
    free(c.perm);
    s = hp_dcp_agree(comm, s, "HF export: writing the shards");
    if (s == HP_OK && rank == 0) {
        json_object *wm = json_object_new_object();
        for (int j = 0; j < m; j++) {
            char fn[64];
            hp_hf_shard_name(fn, sizeof fn, NULL, 0, NULL, file_of[j], nfiles);
            json_object_object_add(wm, ent[j].hf, json_object_new_string(fn));
        }
        s = hp_hf_write_index(out_dir, wm, total, a, mc, dtype);
    }
    free(spec);
    free(ent);
    free(has);
    free(file_of);
    free(idx);
    free(ents);
    return hp_dcp_agree(comm, s, "HF export");
}
