/* HF export layout (llama3 and qwen3 debug models): shard files model-0000i-of-0000n, the
 * index json (total_size, weight_map covering every HF name, each name in the file it says),
 * shapes, config.json fields, Llama's q/k rotary row permutation (and none for qwen3, whose
 * RoPE is already rotate_half), bf16 export, import round trip bitwise, and the name maps. */
// hp-test: ranks 1 timeout 60
#define _GNU_SOURCE
#include <json-c/json.h>
#include <stdlib.h>
#include <unistd.h>

#include "hp_test.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/safetensors.h"

static char ROOT[] = "/tmp/hp_test_hf_export_XXXXXX";

static void check_model(const char *name) {
    hp_model_config_t mc;
    HP_CHECK_OK(hp_model_flavor(name, "debugmodel", &mc));
    mc.vocab_size = 64;
    mc.max_seq_len = 16;
    HP_CHECK_OK(hp_model_config_validate(&mc));
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(&mc, 1, 16, &m));
    if (!m) return;
    HP_CHECK_OK(hp_model_init_weights(m, 7));
    hp_param_t *p = hp_model_params(m);
    int np = hp_model_num_params(m);
    char dir[200];
    snprintf(dir, sizeof dir, "%s/%s", ROOT, name);
    HP_CHECK_OK(hp_hf_export(dir, hp_model_hf_adapter(&mc), &mc, p, np, NULL, HP_F32, 1024 * 1024));
    HP_CHECK(hp_hf_is_hf_dir(dir), "%s: recognised as an HF dir", name);
    /* index */
    char path[400];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_object *idx = json_object_from_file(path), *wm = NULL, *md = NULL, *ts = NULL;
    HP_CHECK(idx && json_object_object_get_ex(idx, "weight_map", &wm) && json_object_object_get_ex(idx, "metadata", &md) &&
             json_object_object_get_ex(md, "total_size", &ts), "%s: index json has metadata.total_size and weight_map", name);
    if (!wm) return;
    HP_CHECK(json_object_object_length(wm) == np, "%s: weight_map has %d names, model %d params", name,
             json_object_object_length(wm), np);
    int64_t total = 0;
    int nfiles = 0;
    for (int i = 0; i < np; i++) {
        char hf[160];
        int pm;
        HP_CHECK_OK(hp_hf_map_name(hp_model_hf_adapter(&mc), HP_HF_TO_HF, p[i].name, hf, sizeof hf, &pm));
        char back[160];
        int pm2;
        HP_CHECK_OK(hp_hf_map_name(hp_model_hf_adapter(&mc), HP_HF_FROM_HF, hf, back, sizeof back, &pm2));
        HP_CHECK(!strcmp(back, p[i].name) && pm == pm2, "name map round trip %s -> %s -> %s", p[i].name, hf, back);
        int is_qk = strstr(p[i].name, ".wq.") || strstr(p[i].name, ".wk.");
        HP_CHECK(pm == (is_qk && !strcmp(name, "llama3")), "%s: %s permuted = %d", name, p[i].name, pm);
        json_object *f;
        HP_CHECK(json_object_object_get_ex(wm, hf, &f), "%s: weight_map lacks %s", name, hf);
        if (!f) continue;
        const char *fn = json_object_get_string(f);
        int a, b;
        HP_CHECK(sscanf(fn, "model-%05d-of-%05d.safetensors", &a, &b) == 2 && a >= 1 && a <= b, "file name %s", fn);
        if (b > nfiles) nfiles = b;
        snprintf(path, sizeof path, "%s/%s", dir, fn);
        hp_safetensors_t st = NULL;
        HP_CHECK_OK(hp_safetensors_open(path, &st));
        if (!st) continue;
        const hp_st_info_t *info;
        HP_CHECK_OK(hp_safetensors_find(st, hf, &info));
        int same = info && info->ndim == p[i].value.local.ndim && info->dtype == HP_ST_F32;
        for (int d = 0; same && d < info->ndim; d++) same = info->shape[d] == p[i].value.local.shape[d];
        HP_CHECK(same, "%s: %s shape/dtype", name, hf);
        if (same) {
            total += (int64_t)(info->end - info->begin);
            hp_tensor_t t;
            hp_tensor_malloc(&t, HP_F32, info->ndim, info->shape);
            HP_CHECK_OK(hp_safetensors_read(st, hf, &t, 0));
            const float *src = p[i].value.local.data, *dst = t.data;
            int64_t rows = info->shape[0], cols = info->ndim > 1 ? info->shape[1] : 1, bad = 0;
            int hd = mc.head_dim, half = hd / 2;
            for (int64_t r = 0; r < rows; r++) {
                int64_t tr = r;
                if (pm) {   /* HF row h*hd + q*half + i holds TorchTitan row h*hd + 2i + q */
                    int64_t h = r / hd, w = r % hd, q = w / half, ii = w % half;
                    tr = h * hd + 2 * ii + q;
                }
                bad += memcmp(dst + r * cols, src + tr * cols, sizeof(float) * (size_t)cols) != 0;
            }
            HP_CHECK(bad == 0, "%s: %s: %lld rows differ from the %s layout", name, hf, (long long)bad,
                     pm ? "permuted" : "unpermuted");
            hp_tensor_free_data(&t);
        }
        hp_safetensors_close(st);
    }
    HP_CHECK(nfiles > 1, "%s: small max_shard_bytes gives several shards (%d)", name, nfiles);
    HP_CHECK(ts && json_object_get_int64(ts) == total, "%s: total_size %lld vs %lld", name,
             (long long)(ts ? json_object_get_int64(ts) : -1), (long long)total);
    json_object_put(idx);
    /* config.json */
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_object *cj = json_object_from_file(path), *v;
    HP_CHECK(cj != NULL, "%s: config.json parses", name);
    if (cj) {
        HP_CHECK(json_object_object_get_ex(cj, "model_type", &v) &&
                 !strcmp(json_object_get_string(v), !strcmp(name, "llama3") ? "llama" : "qwen3"), "%s: model_type", name);
        HP_CHECK(json_object_object_get_ex(cj, "hidden_size", &v) && json_object_get_int(v) == mc.dim, "hidden_size");
        HP_CHECK(json_object_object_get_ex(cj, "intermediate_size", &v) && json_object_get_int(v) == mc.hidden_dim, "ffn");
        HP_CHECK(json_object_object_get_ex(cj, "num_key_value_heads", &v) && json_object_get_int(v) == mc.n_kv_heads, "kv");
        HP_CHECK(json_object_object_get_ex(cj, "head_dim", &v) && json_object_get_int(v) == mc.head_dim, "head_dim");
        HP_CHECK(json_object_object_get_ex(cj, "tie_word_embeddings", &v) && json_object_get_boolean(v) == mc.tie_embeddings,
                 "tie_word_embeddings");
        json_object_put(cj);
    }
    /* import round trip (un-permutes) */
    hp_model_t m2 = NULL;
    HP_CHECK_OK(hp_model_create(&mc, 1, 16, &m2));
    if (m2) {
        HP_CHECK_OK(hp_hf_import(dir, hp_model_hf_adapter(&mc), &mc, hp_model_params(m2), np, NULL));
        int bad = 0;
        for (int i = 0; i < np; i++)
            bad += memcmp(p[i].value.local.data, hp_model_params(m2)[i].value.local.data,
                          hp_tensor_nbytes(&p[i].value.local)) != 0;
        HP_CHECK(bad == 0, "%s: import round trip: %d params differ", name, bad);
        hp_model_destroy(m2);
    }
    /* bf16 export: one shard, BF16 tensors, import rounds */
    char dir2[300];
    snprintf(dir2, sizeof dir2, "%s/%s_bf16", ROOT, name);
    HP_CHECK_OK(hp_hf_export(dir2, hp_model_hf_adapter(&mc), &mc, p, np, NULL, HP_BF16, 0));
    snprintf(path, sizeof path, "%s/model-00001-of-00001.safetensors", dir2);
    hp_safetensors_t st = NULL;
    HP_CHECK_OK(hp_safetensors_open(path, &st));
    if (st) {
        HP_CHECK(hp_safetensors_count(st) == np && hp_safetensors_info(st, 0)->dtype == HP_ST_BF16, "bf16 single shard");
        hp_safetensors_close(st);
    }
    /* a mismatched model (another vocab) is refused naming the tensor */
    hp_model_config_t mc2 = mc;
    mc2.vocab_size = 80;
    hp_model_t m3 = NULL;
    HP_CHECK_OK(hp_model_create(&mc2, 1, 16, &m3));
    const hp_hf_adapter_t *a = hp_model_hf_adapter(&mc2);
    if (m3) {
        /* config.json says so first; without it, the tensor's shape */
        HP_CHECK_ERR(hp_hf_import(dir, a, &mc2, hp_model_params(m3), hp_model_num_params(m3), NULL), HP_ERR_INVALID_ARG,
                     "config.json 'vocab_size' = 64 (model.vocab_size = ");
        char cj[400], moved[420];
        snprintf(cj, sizeof cj, "%s/config.json", dir);
        snprintf(moved, sizeof moved, "%s.moved", cj);
        HP_CHECK(rename(cj, moved) == 0, "rename %s", cj);
        HP_CHECK_ERR(hp_hf_import(dir, a, &mc2, hp_model_params(m3), hp_model_num_params(m3), NULL), HP_ERR_INVALID_ARG,
                     "model.embed_tokens.weight");
        HP_CHECK(rename(moved, cj) == 0, "rename %s back", moved);
        hp_model_destroy(m3);
    }
    hp_model_destroy(m);
}

int main(void) {
    HP_ASSERT(mkdtemp(ROOT));
    check_model("llama3");
    check_model("qwen3");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", ROOT);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", ROOT);
    return hp_test_finish("test_hf_export");
}
