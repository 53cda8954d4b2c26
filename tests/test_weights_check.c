/* Loading weights checks the values: a NaN / inf in any tensor fails naming the file, the
 * tensor and the count (hp_model_load_weights for hp-generate, hp_hf_import for hp-ckpt
 * from-hf), and a tensor the model does not have is ignored with a warning naming it. */
// hp-test: ranks 1 timeout 60
#define _GNU_SOURCE
#include <fcntl.h>
#include <json-c/json.h>
#include <math.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <unistd.h>

#include "hp_test.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/safetensors.h"

static char ROOT[] = "/tmp/hp_test_weights_check_XXXXXX";
static char errlog[300];
static int saved_fd = -1;

/* stderr (where hp_log puts warnings) into a file while a call runs */
static void capture_begin(void) {
    fflush(stderr);
    saved_fd = dup(2);
    int fd = open(errlog, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    close(fd);
}

static char *capture_end(void) {
    fflush(stderr);
    dup2(saved_fd, 2);
    close(saved_fd);
    static char buf[16384];
    FILE *f = fopen(errlog, "rb");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    return buf;
}

static hp_model_t make_model(hp_model_config_t *mc) {
    HP_CHECK_OK(hp_model_flavor("llama3", "debugmodel", mc));
    mc->vocab_size = 64;
    mc->max_seq_len = 16;
    HP_CHECK_OK(hp_model_config_validate(mc));
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(mc, 1, 16, &m));
    if (m) HP_CHECK_OK(hp_model_init_weights(m, 3));
    return m;
}

/* hp_model_save_weights / hp_model_load_weights (hp-generate) */
static void check_weights_file(void) {
    hp_model_config_t mc;
    hp_model_t m = make_model(&mc);
    if (!m) return;
    hp_param_t *p = hp_model_params(m);
    int np = hp_model_num_params(m);
    char path[400];
    snprintf(path, sizeof path, "%s/weights.safetensors", ROOT);
    HP_CHECK_OK(hp_model_save_weights(m, path));
    hp_model_t back = NULL;
    HP_CHECK_OK(hp_model_load_weights(path, 1, 0, &back));
    hp_model_destroy(back);

    /* an extra tensor: loads, with a warning naming it */
    hp_safetensors_t st = NULL;
    HP_CHECK_OK(hp_safetensors_open(path, &st));
    if (st) {
        int nm = hp_safetensors_metadata_count(st);
        const char **meta = calloc((size_t)nm * 2, sizeof(char *));
        for (int i = 0; i < nm; i++) hp_safetensors_metadata_at(st, i, &meta[2 * i], &meta[2 * i + 1]);
        hp_st_entry_t *e = calloc((size_t)np + 1, sizeof *e);
        for (int i = 0; i < np; i++) e[i] = (hp_st_entry_t){.name = p[i].name, .tensor = &p[i].value.local, .dtype = HP_ST_AUTO};
        e[np] = (hp_st_entry_t){.name = "layers.0.attention.extra_bias", .tensor = &p[np - 1].value.local, .dtype = HP_ST_AUTO};
        char path2[400];
        snprintf(path2, sizeof path2, "%s/weights_extra.safetensors", ROOT);
        HP_CHECK_OK(hp_safetensors_write(path2, e, np + 1, meta, nm));
        capture_begin();
        hp_status_t s = hp_model_load_weights(path2, 1, 0, &back);
        char *log = capture_end();
        HP_CHECK(s == HP_OK && strstr(log, "warning") && strstr(log, "'layers.0.attention.extra_bias'") &&
                     strstr(log, "weights_extra.safetensors") && strstr(log, "ignored"),
                 "extra tensor: %s, log '%s'", hp_status_string(s), log);
        hp_model_destroy(back);
        free(e);
        free(meta);
        hp_safetensors_close(st);
    }

    /* NaN and inf in one tensor: refused, naming file, tensor and count */
    int k = np / 2;
    float *w = p[k].value.local.data;
    float keep0 = w[0], keep5 = w[5];
    w[0] = NAN;
    w[5] = -INFINITY;
    HP_CHECK_OK(hp_model_save_weights(m, path));
    back = (hp_model_t)1;
    hp_clear_error();
    hp_status_t s = hp_model_load_weights(path, 1, 0, &back);
    char want[300];
    snprintf(want, sizeof want, "tensor '%s' has 2 non-finite value(s)", p[k].name);
    HP_CHECK(s == HP_ERR_FORMAT && strstr(hp_last_error(), want) && strstr(hp_last_error(), path) &&
                 strstr(hp_last_error(), "first at flat index 0") && back == NULL,
             "NaN weights: %s '%s', expected '%s' and the file", hp_status_string(s), hp_last_error(), want);
    w[0] = keep0, w[5] = keep5;
    hp_model_destroy(m);
}

/* hp_hf_import (hp-ckpt from-hf): index and single-file checkpoints */
static void check_hf(void) {
    hp_model_config_t mc;
    hp_model_t m = make_model(&mc);
    if (!m) return;
    hp_param_t *p = hp_model_params(m);
    int np = hp_model_num_params(m);
    hp_model_t m2 = NULL;
    HP_CHECK_OK(hp_model_create(&mc, 1, 16, &m2));
    if (!m2) return;
    hp_param_t *p2 = hp_model_params(m2);
    char dir[400], path[500];

    /* an extra name in the index's weight_map: imports, with a warning */
    snprintf(dir, sizeof dir, "%s/hf_extra", ROOT);
    HP_CHECK_OK(hp_hf_export(dir, hp_model_hf_adapter(&mc), &mc, p, np, NULL, HP_F32, 0));
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_object *idx = json_object_from_file(path), *wm = NULL;
    HP_CHECK(idx && json_object_object_get_ex(idx, "weight_map", &wm), "index json");
    if (wm) {
        json_object_object_add(wm, "model.vision_tower.proj.weight",
                               json_object_new_string("model-00001-of-00001.safetensors"));
        json_object_to_file(path, idx);
    }
    json_object_put(idx);
    capture_begin();
    hp_status_t s = hp_hf_import(dir, hp_model_hf_adapter(&mc), &mc, p2, np, NULL);
    char *log = capture_end();
    HP_CHECK(s == HP_OK && strstr(log, "tensor 'model.vision_tower.proj.weight' is not a parameter") &&
                 strstr(log, dir),
             "HF extra (index): %s, log '%s'", hp_status_string(s), log);

    /* a single model.safetensors without an index, with an extra tensor */
    snprintf(dir, sizeof dir, "%s/hf_single", ROOT);
    mkdir(dir, 0755);
    hp_st_entry_t *e = calloc((size_t)np + 1, sizeof *e);
    char (*names)[160] = calloc((size_t)np, sizeof *names);
    for (int i = 0; i < np; i++) {
        int pm;
        HP_CHECK_OK(hp_hf_map_name(hp_model_hf_adapter(&mc), HP_HF_TO_HF, p[i].name, names[i], sizeof names[i], &pm));
        e[i] = (hp_st_entry_t){.name = names[i], .tensor = &p[i].value.local, .dtype = HP_ST_AUTO};
    }
    e[np] = (hp_st_entry_t){.name = "model.layers.0.mlp.gate.bias", .tensor = &p[np - 1].value.local, .dtype = HP_ST_AUTO};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    HP_CHECK_OK(hp_safetensors_write(path, e, np + 1, NULL, 0));
    capture_begin();
    s = hp_hf_import(dir, hp_model_hf_adapter(&mc), &mc, p2, np, NULL);
    log = capture_end();
    HP_CHECK(s == HP_OK && strstr(log, "tensor 'model.layers.0.mlp.gate.bias' is not a parameter"),
             "HF extra (single file): %s, log '%s'", hp_status_string(s), log);
    HP_CHECK(!strstr(log, "model.embed_tokens.weight") && !strstr(log, "lm_head"),
             "HF: a known tensor was reported as extra: '%s'", log);

    /* inf in one tensor: refused naming the directory, file, tensor and count */
    int k = 1;
    float *w = p[k].value.local.data;
    float keep = w[3];
    w[3] = INFINITY;
    HP_CHECK_OK(hp_safetensors_write(path, e, np, NULL, 0));
    hp_clear_error();
    s = hp_hf_import(dir, hp_model_hf_adapter(&mc), &mc, p2, np, NULL);
    char want[300];
    snprintf(want, sizeof want, "model.safetensors: tensor '%s' has 1 non-finite value(s)", names[k]);
    HP_CHECK(s == HP_ERR_FORMAT && strstr(hp_last_error(), want) && strstr(hp_last_error(), dir),
             "HF inf: %s '%s', expected '%s'", hp_status_string(s), hp_last_error(), want);
    w[3] = keep;
    free(e);
    free(names);
    hp_model_destroy(m2);
    hp_model_destroy(m);
}

int main(void) {
    HP_ASSERT(mkdtemp(ROOT));
    snprintf(errlog, sizeof errlog, "%s/stderr.txt", ROOT);
    check_weights_file();
    check_hf();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", ROOT);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", ROOT);
    return hp_test_finish("test_weights_check");
}
