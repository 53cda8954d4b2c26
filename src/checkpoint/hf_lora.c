/* Merging a PEFT LoRA adapter into an HF folder (PEFT's merge_and_unload): every adapted weight
 * becomes W + (lora_alpha / r) B A in W's stored dtype, everything else is copied. It works on
 * HF names only (no model, no family), one shard file in memory at a time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "hyperparallel/backend.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/file.h"
#include "hyperparallel/safetensors.h"
#include "dcp-impl.h"

/* r and lora_alpha of DIR/adapter_config.json (plain LoRA only, as hp_hf_import_lora). */
static hp_status_t read_scale(const char *dir, double *scale) {
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *txt = NULL;
    size_t len = 0;
    HP_TRY(hp_file_read_all(path, "PEFT adapter config", (size_t)1 << 20, &txt, &len));
    json_object *o = json_tokener_parse(txt), *v;
    free(txt);
    if (!o || !json_object_is_type(o, json_type_object)) {
        if (o) json_object_put(o);
        return hp_error(HP_ERR_FORMAT, "%s: not a JSON object; expected PEFT's adapter_config.json", path);
    }
    const int r = json_object_object_get_ex(o, "r", &v) ? json_object_get_int(v) : 0;
    const double al = json_object_object_get_ex(o, "lora_alpha", &v) ? json_object_get_double(v) : 0;
    const int rs = json_object_object_get_ex(o, "use_rslora", &v) && json_object_get_boolean(v);
    const int dora = json_object_object_get_ex(o, "use_dora", &v) && json_object_get_boolean(v);
    json_object_put(o);
    if (r <= 0 || !(al > 0) || rs || dora)
        return hp_error(HP_ERR_UNSUPPORTED, "%s: r %d, lora_alpha %g, use_rslora %d, use_dora %d; expected plain LoRA "
                        "with r > 0 and lora_alpha > 0", path, r, al, rs, dora);
    *scale = al / r;   /* PEFT's scaling without rslora */
    return HP_OK;
}

/* The adapter's A and B names for HF weight `hf` ("model.layers.0.self_attn.q_proj.weight"). */
static void adapter_names(const char *hf, char *a, char *b, size_t n) {
    const size_t l = strlen(hf) - 7;   /* without ".weight" */
    snprintf(a, n, "base_model.model.%.*s.lora_A.weight", (int)l, hf);
    snprintf(b, n, "base_model.model.%.*s.lora_B.weight", (int)l, hf);
}

static hp_status_t copy_file(const char *from, const char *to) {
    char *data = NULL;
    size_t len = 0;
    HP_TRY(hp_file_read_all(from, "HF folder file", (size_t)1 << 30, &data, &len));
    hp_status_t s = hp_file_write_atomic(to, data, len);
    free(data);
    return s;
}

/* One shard: each tensor read whole, the adapted ones merged, written under the same name. */
static hp_status_t merge_file(const char *base_dir, const char *fname, hp_safetensors_t ad, double scale,
                              const char *out_dir, int *merged) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", base_dir, fname);
    hp_safetensors_t st;
    HP_TRY(hp_safetensors_open(path, &st));
    const int n = hp_safetensors_count(st);
    hp_st_entry_t *ents = hp_calloc((size_t)n + 1, sizeof *ents);
    void **raw = hp_calloc((size_t)n + 1, sizeof *raw);
    hp_status_t s = ents && raw ? HP_OK : HP_ERR_OOM;
    const hp_backend_t *be = hp_backend_default();
    for (int i = 0; s == HP_OK && i < n; i++) {
        const hp_st_info_t *info = hp_safetensors_info(st, i);
        const size_t nb = (size_t)(info->end - info->begin);
        raw[i] = hp_malloc(nb + 1);
        if (!raw[i]) {
            s = HP_ERR_OOM;
            break;
        }
        s = hp_safetensors_read_raw(st, info->name, raw[i], nb);
        ents[i] = (hp_st_entry_t){info->name, NULL, info->dtype, raw[i], info->ndim, info->shape};
        char an[256], bn[256];
        const hp_st_info_t *ai, *bi;
        const size_t l = strlen(info->name);
        if (s != HP_OK || l < 8 || strcmp(info->name + l - 7, ".weight") != 0) continue;
        adapter_names(info->name, an, bn, sizeof an);
        if (hp_safetensors_find(ad, an, &ai) != HP_OK) continue;
        if (hp_safetensors_find(ad, bn, &bi) != HP_OK) {
            s = hp_error(HP_ERR_FORMAT, "LoRA merge: the adapter has '%s' but not '%s'", an, bn);
            break;
        }
        /* A (r, in), B (out, r), W (out, in) */
        if (info->ndim != 2 || ai->ndim != 2 || bi->ndim != 2 || ai->shape[1] != info->shape[1] ||
            bi->shape[0] != info->shape[0] || ai->shape[0] != bi->shape[1] ||
            (info->dtype != HP_ST_F32 && info->dtype != HP_ST_BF16 && info->dtype != HP_ST_F16)) {
            s = hp_error(HP_ERR_INVALID_ARG, "LoRA merge: '%s' (%s, %d-D) does not take the adapter's A (%lld, %lld) and "
                         "B (%lld, %lld); expected a 2-D float weight (out, in) with A (r, in), B (out, r)", info->name,
                         hp_st_dtype_name(info->dtype), info->ndim, (long long)ai->shape[0], (long long)ai->shape[1],
                         (long long)bi->shape[0], (long long)bi->shape[1]);
            break;
        }
        const int64_t O = info->shape[0], I = info->shape[1], r = ai->shape[0];
        hp_tensor_t ta, tb, tw;
        float *fa = hp_malloc(sizeof(float) * (size_t)(r * I)), *fb = hp_malloc(sizeof(float) * (size_t)(O * r)),
              *fw = hp_malloc(sizeof(float) * (size_t)(O * I)), *fd = hp_malloc(sizeof(float) * (size_t)(O * I));
        if (!fa || !fb || !fw || !fd) s = HP_ERR_OOM;
        const int64_t sa[2] = {r, I}, sb[2] = {O, r}, sw[2] = {O, I};
        if (s == HP_OK) s = hp_tensor_init(&ta, HP_F32, 2, sa, fa);
        if (s == HP_OK) s = hp_tensor_init(&tb, HP_F32, 2, sb, fb);
        if (s == HP_OK) s = hp_tensor_init(&tw, HP_F32, 2, sw, fw);
        if (s == HP_OK) s = hp_safetensors_read(ad, an, &ta, 1);
        if (s == HP_OK) s = hp_safetensors_read(ad, bn, &tb, 1);
        if (s == HP_OK) s = hp_safetensors_read(st, info->name, &tw, 1);
        if (s == HP_OK) {
            /* PEFT: delta = (B @ A) * scaling in float32, then W += delta */
            be->gemm(be->ctx, fd, (int)I, fb, (int)r, fa, (int)I, (int)O, (int)I, (int)r, 0, 0, 1.0f, 0.0f);
            for (int64_t k = 0; k < O * I; k++) fw[k] += fd[k] * (float)scale;
            hp_dtype_t dt = info->dtype == HP_ST_F32 ? HP_F32 : info->dtype == HP_ST_BF16 ? HP_BF16 : HP_F16;
            be->convert(be->ctx, raw[i], dt, fw, HP_F32, O * I);   /* back to W's dtype (round to nearest even) */
            (*merged)++;
        }
        free(fa);
        free(fb);
        free(fw);
        free(fd);
    }
    if (s == HP_OK) {
        snprintf(path, sizeof path, "%s/%s", out_dir, fname);
        const char *meta[2] = {"format", "pt"};
        s = hp_safetensors_write(path, ents, n, meta, 1);
    }
    for (int i = 0; raw && i < n; i++) free(raw[i]);
    free(raw);
    free(ents);
    hp_safetensors_close(st);
    return s;
}

hp_status_t hp_hf_merge_lora(const char *base_dir, const char *adapter_dir, const char *out_dir) {
    if (!base_dir || !adapter_dir || !out_dir)
        return hp_error(HP_ERR_INVALID_ARG, "hp_hf_merge_lora: base_dir, adapter_dir and out_dir are required");
    if (!strcmp(base_dir, out_dir))
        return hp_error(HP_ERR_INVALID_ARG, "LoRA merge: the output folder '%s' is the base folder; hint: write the "
                        "merged model to a new folder", out_dir);
    double scale = 0;
    HP_TRY(read_scale(adapter_dir, &scale));
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", adapter_dir);
    hp_safetensors_t ad;
    HP_TRY(hp_safetensors_open(path, &ad));
    hp_status_t s = hp_file_mkdirs(out_dir);
    /* the shard files: the index's, or the single model.safetensors */
    const char *files[256];
    int nf = 0;
    hp_hf_index_t wm = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", base_dir);
    if (s == HP_OK && access(path, R_OK) == 0) {
        s = hp_hf_index_read(path, &wm);
        for (int k = 0; s == HP_OK && k < hp_hf_index_count(wm); k++) {
            const char *key, *file;
            hp_hf_index_at(wm, k, &key, &file);
            int seen = 0;
            for (int j = 0; j < nf; j++) seen |= !strcmp(files[j], file);
            if (!seen && nf == 256) s = hp_error(HP_ERR_UNSUPPORTED, "LoRA merge: %s names more than 256 files", path);
            else if (!seen) files[nf++] = file;
        }
    } else if (s == HP_OK) {
        files[nf++] = "model.safetensors";
    }
    int merged = 0;
    for (int f = 0; s == HP_OK && f < nf; f++) s = merge_file(base_dir, files[f], ad, scale, out_dir, &merged);
    int n_adapted = 0;
    for (int k = 0; k < hp_safetensors_count(ad); k++) n_adapted += strstr(hp_safetensors_info(ad, k)->name, ".lora_A.") != NULL;
    if (s == HP_OK && merged != n_adapted)
        s = hp_error(HP_ERR_NOT_FOUND, "LoRA merge: the adapter %s adapts %d weights but %d of them are in %s; hint: "
                     "the adapter was trained on another model", adapter_dir, n_adapted, merged, base_dir);
    /* config, tokenizer and index files as they are (the names and shapes did not change) */
    static const char *other[] = {"config.json", "generation_config.json", "model.safetensors.index.json",
                                  "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                  "chat_template.jinja", "vocab.json", "merges.txt"};
    for (size_t k = 0; s == HP_OK && k < sizeof other / sizeof other[0]; k++) {
        char from[4200], to[4200];
        snprintf(from, sizeof from, "%s/%s", base_dir, other[k]);
        snprintf(to, sizeof to, "%s/%s", out_dir, other[k]);
        if (access(from, R_OK) == 0) s = copy_file(from, to);
    }
    if (s == HP_OK) s = hp_file_fsync(out_dir);
    hp_hf_index_free(wm);
    hp_safetensors_close(ad);
    return s;
}
