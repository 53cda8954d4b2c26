/* Checkpoint integrity (one process): a truncated or missing shard makes hp_dcp_verify fail
 * naming the file with expected and actual sizes; flipped bytes in a shard's data area fail
 * the per-chunk XXH3 checksum on load (file and tensor named, how to skip said) unless
 * skip_checksums; a checkpoint without checksums (written before them) still loads; the
 * manager resumes from the newest complete step with a warning naming what was wrong, keeps
 * the bad steps on disk, honours checkpoint.verify_checksums = false, and errors clearly
 * when no step is complete; the HF index parser rejects malformed weight_maps by name. */
// hp-test: ranks 1 timeout 60
#define _GNU_SOURCE
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hp_test.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/ckpt_manager.h"
#include "hyperparallel/config.h"

enum { R = 64, C = 32 };
static char ROOT[] = "/tmp/hp_test_ckpt_integrity_XXXXXX";
static char LOG[1 << 16];

/* stderr (hp_log) captured around a call */
static int saved_fd = -1;
static char logpath[600];
static void capture_begin(void) {
    fflush(stderr);
    snprintf(logpath, sizeof logpath, "%s/log.txt", ROOT);
    int fd = open(logpath, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    saved_fd = dup(2);
    dup2(fd, 2);
    close(fd);
}
static void capture_end(void) {
    fflush(stderr);
    dup2(saved_fd, 2);
    close(saved_fd);
    FILE *f = fopen(logpath, "rb");
    size_t n = f ? fread(LOG, 1, sizeof LOG - 1, f) : 0;
    LOG[n] = '\0';
    if (f) fclose(f);
}

static void fill(hp_tensor_t *t, float v) {
    float *p = t->data;
    for (int64_t i = 0; i < R * C; i++) p[i] = v + (float)i * 0.25f;
}

static void flip_data_byte(const char *file) {
    /* a byte in the middle of the data area (past the header) */
    int fd = open(file, O_RDWR);
    unsigned char h[8];
    HP_ASSERT(fd >= 0 && pread(fd, h, 8, 0) == 8);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | h[i];
    struct stat sb;
    fstat(fd, &sb);
    off_t at = (off_t)(8 + hl + ((uint64_t)sb.st_size - 8 - hl) / 2);
    unsigned char b;
    HP_ASSERT(pread(fd, &b, 1, at) == 1);
    b ^= 0x5a;
    HP_ASSERT(pwrite(fd, &b, 1, at) == 1);
    close(fd);
}

static void truncate_by(const char *file, off_t by) {
    struct stat sb;
    HP_ASSERT(stat(file, &sb) == 0);
    HP_ASSERT(truncate(file, sb.st_size - by) == 0);
}

static void strip_checksums(const char *dir) {
    char p[700];
    snprintf(p, sizeof p, "%s/metadata.json", dir);
    json_object *root = json_object_from_file(p), *tens;
    HP_ASSERT(root && json_object_object_get_ex(root, "tensors", &tens));
    json_object_object_foreach(tens, k, e) {
        (void)k;
        json_object *ch;
        HP_ASSERT(json_object_object_get_ex(e, "chunks", &ch));
        for (size_t i = 0; i < json_object_array_length(ch); i++) json_object_object_del(json_object_array_get_idx(ch, i), "xxh3");
    }
    HP_ASSERT(json_object_to_file_ext(p, root, JSON_C_TO_STRING_PRETTY) == 0);
    json_object_put(root);
}

static void dcp_cases(void) {
    int64_t sh[2] = {R, C};
    hp_dtensor_t d;
    memset(&d, 0, sizeof d);
    HP_ASSERT(hp_tensor_malloc(&d.local, HP_F32, 2, sh) == HP_OK);
    fill(&d.local, 1.0f);
    hp_dcp_tensor_t ts[1] = {{"layers.0.w", &d, -1, 0}};
    hp_dcp_state_t st = {ts, 1, NULL, 0};
    char dir[600], shard[700];
    snprintf(dir, sizeof dir, "%s/dcp/step-1", ROOT);
    snprintf(shard, sizeof shard, "%s/__0_0.safetensors", dir);
    HP_CHECK_OK(hp_dcp_save(dir, &st, NULL));
    HP_CHECK_OK(hp_dcp_verify(dir, 1));
    hp_dcp_metadata_t md = NULL;
    HP_CHECK_OK(hp_dcp_metadata_read(dir, &md));
    if (md) {
        const hp_dcp_entry_t *e = hp_dcp_metadata_find(md, "layers.0.w");
        HP_CHECK(e && e->n_chunks == 1 && e->chunks[0].has_xxh3, "the chunk records its checksum");
        hp_dcp_metadata_free(md);
    }
    /* flipped bytes: verify and load fail, naming file and tensor; skip loads */
    flip_data_byte(shard);
    HP_CHECK(hp_dcp_verify(dir, 0) == HP_OK, "sizes are still right after a bit flip");
    hp_status_t s = hp_dcp_verify(dir, 1);
    HP_CHECK(s == HP_ERR_FORMAT && strstr(hp_last_error(), "__0_0.safetensors") && strstr(hp_last_error(), "layers.0.w") &&
                 strstr(hp_last_error(), "checksum"), "verify after a flip: %s", hp_last_error());
    fill(&d.local, 0.0f);
    s = hp_dcp_load(dir, &st, NULL, NULL);
    HP_CHECK(s == HP_ERR_FORMAT && strstr(hp_last_error(), "__0_0.safetensors") && strstr(hp_last_error(), "'layers.0.w'") &&
                 strstr(hp_last_error(), "checkpoint.verify_checksums = false"), "load after a flip: %s", hp_last_error());
    hp_dcp_load_options_t skip = {1, 0, NULL, 0, 1};
    HP_CHECK_OK(hp_dcp_load(dir, &st, NULL, &skip));
    HP_CHECK(ts[0].loaded, "skip_checksums loads the tensor");
    /* an old checkpoint (no checksum fields) loads, unverified */
    strip_checksums(dir);
    HP_CHECK_OK(hp_dcp_load(dir, &st, NULL, NULL));
    HP_CHECK_OK(hp_dcp_verify(dir, 1));
    /* truncated and missing shards */
    HP_CHECK_OK(hp_dcp_save(dir, &st, NULL));
    truncate_by(shard, 100);
    s = hp_dcp_verify(dir, 0);
    HP_CHECK(s == HP_ERR_FORMAT && strstr(hp_last_error(), "__0_0.safetensors is truncated") &&
                 strstr(hp_last_error(), "expected"), "truncated: %s", hp_last_error());
    unlink(shard);
    s = hp_dcp_verify(dir, 0);
    HP_CHECK(s == HP_ERR_FORMAT && strstr(hp_last_error(), "__0_0.safetensors is missing") &&
                 strstr(hp_last_error(), "layers.0.w"), "missing: %s", hp_last_error());
    hp_tensor_free_data(&d.local);
}

/* A fresh manager of c loads the latest complete step into st (its log captured in LOG);
 * returns the load's status, or the create's when that failed. */
static hp_status_t fresh_load(const hp_config_t *c, hp_ckpt_train_state_t *st, int64_t *got, int *loaded) {
    hp_ckpt_manager_t m = NULL;
    hp_status_t s = hp_ckpt_manager_create(c, NULL, &m);
    HP_CHECK(s == HP_OK, "hp_ckpt_manager_create: %s", hp_last_error());
    if (!m) return s;
    capture_begin();
    s = hp_ckpt_manager_load(m, st, got, loaded);
    capture_end();
    hp_ckpt_manager_destroy(m);
    return s;
}

static void manager_cases(void) {
    hp_config_t *c = calloc(1, sizeof *c);
    hp_config_defaults(c);
    c->checkpoint.enable = true;
    c->job.dump_folder[0] = '\0';
    snprintf(c->checkpoint.folder, sizeof c->checkpoint.folder, "%s/run", ROOT);
    c->checkpoint.keep_latest_k = 0;
    int64_t sh[2] = {R, C};
    hp_param_t p;
    memset(&p, 0, sizeof p);
    snprintf(p.name, sizeof p.name, "w");
    HP_ASSERT(hp_tensor_malloc(&p.value.local, HP_F32, 2, sh) == HP_OK);
    int64_t step = 0;
    uint64_t seed = 1;
    hp_ckpt_train_state_t st = {&p, 1, NULL, NULL, NULL, &step, &seed, NULL};
    hp_ckpt_manager_t m = NULL;
    HP_CHECK_OK(hp_ckpt_manager_create(c, NULL, &m));
    if (!m) return;
    for (step = 1; step <= 3; step++) {
        fill(&p.value.local, (float)step);
        HP_CHECK_OK(hp_ckpt_manager_save(m, step, 0, &st));
    }
    char s3[700], s2[700], s1[700];
    snprintf(s3, sizeof s3, "%s/step-3/__0_0.safetensors", c->checkpoint.folder);
    snprintf(s2, sizeof s2, "%s/step-2/__0_0.safetensors", c->checkpoint.folder);
    snprintf(s1, sizeof s1, "%s/step-1/__0_0.safetensors", c->checkpoint.folder);
    truncate_by(s3, 64);
    int64_t got = -1;
    int loaded = 0;
    capture_begin();
    hp_status_t s = hp_ckpt_manager_load(m, &st, &got, &loaded);
    capture_end();
    HP_CHECK(s == HP_OK && loaded && got == 2 && step == 2, "fallback from truncated step-3: status %d step %lld\n%s",
             (int)s, (long long)got, LOG);
    HP_CHECK(strstr(LOG, "step-3") && strstr(LOG, "__0_0.safetensors is truncated") && strstr(LOG, "expected") &&
                 strstr(LOG, "kept on disk"), "the warning names the file and sizes:\n%s", LOG);
    HP_CHECK(((float *)p.value.local.data)[5] == 2.0f + 5 * 0.25f, "step-2's values were loaded");
    struct stat sb;
    HP_CHECK(stat(s3, &sb) == 0, "the truncated step-3 is kept on disk");
    /* a bit flip in step-2's data: checksum fails at load, falls back to step-1 */
    flip_data_byte(s2);
    capture_begin();
    s = hp_ckpt_manager_load(m, &st, &got, &loaded);
    capture_end();
    HP_CHECK(s == HP_OK && got == 1, "fallback from corrupt step-2: status %d step %lld\n%s", (int)s, (long long)got, LOG);
    HP_CHECK(strstr(LOG, "step-2") && strstr(LOG, "checksum") && strstr(LOG, "'w'"), "checksum warning:\n%s", LOG);
    HP_CHECK(stat(s2, &sb) == 0, "the corrupt step-2 is kept on disk");
    hp_ckpt_manager_destroy(m);
    /* verify_checksums = false: step-2 (sizes right) loads */
    c->checkpoint.verify_checksums = false;
    HP_CHECK(fresh_load(c, &st, &got, &loaded) == HP_OK && got == 2, "skip checksums: step %lld", (long long)got);
    c->checkpoint.verify_checksums = true;
    /* nothing complete: a clear error */
    unlink(s1);
    s = fresh_load(c, &st, &got, &loaded);
    HP_CHECK(s == HP_ERR_FORMAT && strstr(hp_last_error(), "none is complete") &&
                 strstr(hp_last_error(), c->checkpoint.folder), "no complete step: %s", hp_last_error());
    /* an explicit load_step does not fall back */
    c->checkpoint.load_step = 3;
    s = fresh_load(c, &st, &got, &loaded);
    HP_CHECK(s == HP_ERR_FORMAT && strstr(hp_last_error(), "load_step = 3") && strstr(hp_last_error(), "truncated"),
             "load_step on a truncated step: %s", hp_last_error());
    hp_tensor_free_data(&p.value.local);
    free(c);
}

static void hf_index_cases(void) {
    static const struct { const char *json, *want; } bad[] = {
        {"{\"weight_map\": [1, 2]}", "\"weight_map\" is a JSON array"},
        {"{\"weight_map\": null}", "\"weight_map\" is a JSON null"},
        {"{\"weight_map\": {\"a.weight\": null}}", "weight_map[\"a.weight\"] is a JSON null"},
        {"{\"weight_map\": {\"a.weight\": 3}}", "weight_map[\"a.weight\"] is a JSON int"},
        {"{\"weight_map\": {\"a.weight\": \"../x.safetensors\"}}", "not a plain file name"},
        {"{\"weight_map\": {}}", "empty"},
        {"{\"metadata\": 5, \"weight_map\": {\"a\": \"m.safetensors\"}}", "\"metadata\" is a JSON int"},
        {"[1]", "expected an object"},
        {"{\"weight_map\": {\"a\": \"m.safetensors\"", "not valid JSON"},
        {"{}", "no \"weight_map\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        hp_hf_index_t ix = NULL;
        hp_status_t s = hp_hf_index_parse(bad[i].json, strlen(bad[i].json), "x/model.safetensors.index.json", &ix);
        HP_CHECK(s == HP_ERR_FORMAT && !ix && strstr(hp_last_error(), "x/model.safetensors.index.json") &&
                     strstr(hp_last_error(), bad[i].want), "index %s: %s", bad[i].json, hp_last_error());
    }
    const char *good = "{\"metadata\": {}, \"weight_map\": {\"a\": \"m1.safetensors\", \"b\": \"m2.safetensors\", "
                       "\"c\": \"m1.safetensors\"}}";
    hp_hf_index_t ix = NULL;
    HP_CHECK_OK(hp_hf_index_parse(good, strlen(good), "good", &ix));
    if (ix) {
        HP_CHECK(hp_hf_index_count(ix) == 3 && hp_hf_index_n_files(ix) == 2 &&
                     !strcmp(hp_hf_index_find(ix, "c"), "m1.safetensors") && !hp_hf_index_find(ix, "d"),
                 "good index: %d names, %d files", hp_hf_index_count(ix), hp_hf_index_n_files(ix));
        hp_hf_index_free(ix);
    }
}

int main(void) {
    HP_ASSERT(mkdtemp(ROOT));
    dcp_cases();
    manager_cases();
    hf_index_cases();
    hp_test_remove_dir(ROOT);
    return hp_test_finish("test_ckpt_integrity");
}
