/* hp-ckpt (the built tool, found through HP_BUILD_DIR): inspect lists tensors, chunks and
 * blobs and verifies shard sizes and checksums (a flipped byte, a truncated shard fail);
 * list skips a partial dir and marks a step with a truncated or missing shard; malformed HF
 * indexes give a clear error naming the file and key; consolidate writes one safetensors file with every
 * value; to-hf then from-hf round-trips a llama3 model bitwise; errors exit non-zero with a
 * message. */
// hp-test: ranks 1 timeout 60
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hp_test.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/safetensors.h"

static char ROOT[] = "/tmp/hp_test_ckpt_tool_XXXXXX";
static char TOOL[1024];
static char OUT[1 << 16];

static int run(const char *fmt, const char *a, const char *b) {
    char args[2048], cmd[4096];
    snprintf(args, sizeof args, fmt, a, b);
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", TOOL, args);
    const int rc = hp_test_run_capture(cmd, OUT, sizeof OUT);
    return rc > 128 ? 128 : rc;
}

/* How many parameters of a model of mc loaded from the DCP checkpoint in dir differ from p's
 * (bitwise); -1 when no model was made. */
static int params_differ(const hp_model_config_t *mc, const char *dir, const hp_param_t *p) {
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(mc, 1, 4, &m));
    if (!m) return -1;
    const int np = hp_model_num_params(m);
    hp_param_t *q = hp_model_params(m);
    hp_dcp_tensor_t *ts = calloc((size_t)np, sizeof *ts);
    for (int i = 0; i < np; i++) ts[i] = (hp_dcp_tensor_t){q[i].name, &q[i].value, -1, 0};
    hp_dcp_state_t st = {ts, np, NULL, 0};
    HP_CHECK_OK(hp_dcp_load(dir, &st, NULL, NULL));
    int bad = 0;
    for (int i = 0; i < np; i++)
        bad += memcmp(p[i].value.local.data, q[i].value.local.data, hp_tensor_nbytes(&p[i].value.local)) != 0;
    if (bad) fprintf(stderr, "%s: %d parameters differ\n", dir, bad);
    free(ts);
    hp_model_destroy(m);
    return bad;
}

int main(void) {
    if (!hp_test_built_program(TOOL, sizeof TOOL, "hp-ckpt")) return 0;
    HP_ASSERT(mkdtemp(ROOT));
    /* a llama3 debug model (vocab 64) saved as a DCP checkpoint with one blob */
    hp_model_config_t mc;
    HP_CHECK_OK(hp_model_flavor("llama3", "debugmodel", &mc));
    mc.vocab_size = 64;
    HP_CHECK_OK(hp_model_config_validate(&mc));
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(&mc, 1, 4, &m));
    if (!m) return hp_test_finish("test_ckpt_tool");
    HP_CHECK_OK(hp_model_init_weights(m, 5));
    int np = hp_model_num_params(m);
    hp_param_t *p = hp_model_params(m);
    hp_dcp_tensor_t *ts = calloc((size_t)np, sizeof *ts);
    for (int i = 0; i < np; i++) ts[i] = (hp_dcp_tensor_t){p[i].name, &p[i].value, -1, 0};
    int64_t ts_blob[3] = {1, 2, 3};
    hp_dcp_blob_t bl[1] = {{"train_state", ts_blob, sizeof ts_blob, sizeof ts_blob, 0, 0}};
    hp_dcp_state_t st = {ts, np, bl, 1};
    char dir[400], folder[300], out[500];
    snprintf(folder, sizeof folder, "%s/ck", ROOT);
    snprintf(dir, sizeof dir, "%s/step-7", folder);
    HP_CHECK_OK(hp_dcp_save(dir, &st, NULL));
    HP_CHECK(run("inspect %s%s", dir, "") == 0 && strstr(OUT, "step 7, saved by 1 rank(s)") &&
                 strstr(OUT, "layers.0.attention.wq.weight") && strstr(OUT, "offsets (0, 0) sizes (256, 256)") &&
                 strstr(OUT, "train_state") && strstr(OUT, "blob shared, 24 bytes"),
             "inspect:\n%.2000s", OUT);
    snprintf(out, sizeof out, "%s/step-8.tmp-1", folder);
    mkdir(out, 0755);
    HP_CHECK(run("list %s%s", folder, "") == 0 && !strcmp(strstr(OUT, "step-7") ? strstr(OUT, "step-7") : "", "step-7\n") &&
                 strstr(OUT, "ignoring partial checkpoint"), "list:\n%s", OUT);
    /* consolidate: one file, same values */
    snprintf(out, sizeof out, "%s/all.safetensors", ROOT);
    HP_CHECK(run("consolidate %s %s", dir, out) == 0, "consolidate:\n%s", OUT);
    hp_safetensors_t sf = NULL;
    HP_CHECK_OK(hp_safetensors_open(out, &sf));
    if (sf) {
        HP_CHECK(hp_safetensors_count(sf) == np + 1, "consolidated count %d", hp_safetensors_count(sf));
        hp_tensor_t t;
        hp_tensor_malloc(&t, HP_F32, p[3].value.local.ndim, p[3].value.local.shape);
        HP_CHECK_OK(hp_safetensors_read(sf, p[3].name, &t, 0));
        HP_CHECK(!memcmp(t.data, p[3].value.local.data, hp_tensor_nbytes(&t)), "consolidated values");
        hp_tensor_free_data(&t);
        hp_safetensors_close(sf);
    }
    /* to-hf, from-hf: bitwise round trip */
    char hf[400], back[400];
    snprintf(hf, sizeof hf, "%s/hf", ROOT);
    snprintf(back, sizeof back, "%s/back/step-0", ROOT);
    HP_CHECK(run("to-hf %s %s --model llama3 --flavor debugmodel", dir, hf) == 0 && hp_hf_is_hf_dir(hf), "to-hf:\n%s", OUT);
    HP_CHECK(run("from-hf %s %s --model llama3 --flavor debugmodel", hf, back) == 0, "from-hf:\n%s", OUT);
    HP_CHECK(params_differ(&mc, back, p) == 0, "to-hf/from-hf round trip: parameters differ");
    /* seed checkpoint: the model hp_model_init_weights(seed 5) draws, model only */
    char seedd[400];
    snprintf(seedd, sizeof seedd, "%s/seed/step-0", ROOT);
    HP_CHECK(run("seed %s --model llama3 --flavor debugmodel --vocab 64 --seed 5%s", seedd, "") == 0, "seed:\n%s", OUT);
    HP_CHECK(params_differ(&mc, seedd, p) == 0, "seed checkpoint: parameters differ from init(seed 5)");
    HP_CHECK(run("inspect %s%s", dir, "") == 0 && strstr(OUT, "integrity: OK (shard sizes and"), "inspect ok:\n%.3000s",
             OUT + (strlen(OUT) > 3000 ? strlen(OUT) - 3000 : 0));
    /* a bad step: inspect and list flag it (a copy of step-7 as step-9, then damaged) */
    {
        char cmd[1400], bad[400], shard[500];
        snprintf(bad, sizeof bad, "%s/step-9", folder);
        snprintf(cmd, sizeof cmd, "cp -r %s %s", dir, bad);
        HP_ASSERT(system(cmd) == 0);
        snprintf(shard, sizeof shard, "%s/__0_0.safetensors", bad);
        /* flipped byte in the data area: sizes fine, the checksum names the tensor */
        FILE *f = fopen(shard, "r+b");
        HP_ASSERT(f && fseek(f, -1000, SEEK_END) == 0);
        int ch = fgetc(f);
        fseek(f, -1000, SEEK_END);
        fputc(ch ^ 0xff, f);
        fclose(f);
        HP_CHECK(run("inspect %s%s", bad, "") == 1 && strstr(OUT, "integrity: FAILED") && strstr(OUT, "__0_0.safetensors") &&
                     strstr(OUT, "fails its checksum") && strstr(OUT, "verify_checksums"), "inspect flipped:\n%.1500s",
                 strstr(OUT, "integrity") ? strstr(OUT, "integrity") : OUT);
        struct stat sb;
        HP_ASSERT(stat(shard, &sb) == 0 && truncate(shard, sb.st_size - 10) == 0);
        HP_CHECK(run("inspect %s%s", bad, "") == 1 && strstr(OUT, "__0_0.safetensors is truncated") &&
                     strstr(OUT, "expected"), "inspect truncated:\n%.1500s", strstr(OUT, "integrity") ? strstr(OUT, "integrity") : OUT);
        HP_CHECK(run("list %s%s", folder, "") == 1 && strstr(OUT, "step-7\n") && strstr(OUT, "step-9 INCOMPLETE") &&
                     strstr(OUT, "truncated"), "list with a truncated step:\n%s", OUT);
        unlink(shard);
        HP_CHECK(run("list %s%s", folder, "") == 1 && strstr(OUT, "step-9 INCOMPLETE") && strstr(OUT, "is missing"),
                 "list with a missing shard:\n%s", OUT);
        snprintf(cmd, sizeof cmd, "rm -rf %s", bad);
        HP_ASSERT(system(cmd) == 0);
    }
    /* malformed HF indexes: a clear error naming the file and key, never a crash */
    {
        static const char *const idx[][2] = {
            {"{\"weight_map\": [1]}", "\"weight_map\" is a JSON array"},
            {"{\"weight_map\": {\"model.norm.weight\": null}}", "weight_map[\"model.norm.weight\"] is a JSON null"},
            {"{\"weight_map\": {\"model.norm.weight\": 7}}", "weight_map[\"model.norm.weight\"] is a JSON int"},
            {"{\"weight_map\": {\"model.norm.weight\": \"/etc/passwd\"}}", "not a plain file name"},
            {"not json", "not valid JSON"},
        };
        char hd[400], ip[500];
        snprintf(hd, sizeof hd, "%s/badhf", ROOT);
        mkdir(hd, 0755);
        snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", hd);
        for (size_t i = 0; i < sizeof idx / sizeof idx[0]; i++) {
            FILE *f = fopen(ip, "wb");
            HP_ASSERT(f);
            fputs(idx[i][0], f);
            fclose(f);
            int rc = run("inspect %s%s", hd, "");
            HP_CHECK(rc == 1 && strstr(OUT, "model.safetensors.index.json") && strstr(OUT, idx[i][1]),
                     "inspect HF index %s: exit %d\n%s", idx[i][0], rc, OUT);
            rc = run("from-hf %s %s/y --model llama3 --flavor debugmodel", hd, ROOT);
            HP_CHECK(rc != 0 && rc < 128, "from-hf HF index %s: exit %d\n%s", idx[i][0], rc, OUT);
        }
    }
    /* errors */
    HP_CHECK(run("inspect %s%s", ROOT, "") != 0 && strstr(OUT, "not a committed checkpoint"), "inspect error:\n%s", OUT);
    HP_CHECK(run("to-hf %s %s/x --model qwen3 --flavor debugmodel", dir, ROOT) != 0 && strstr(OUT, "global shape"),
             "to-hf wrong model:\n%s", OUT);
    HP_CHECK(run("to-hf %s %s/x", dir, ROOT) == 2 && strstr(OUT, "--model and --flavor are required"), "usage:\n%s", OUT);
    free(ts);
    hp_model_destroy(m);
    hp_test_remove_dir(ROOT);
    return hp_test_finish("test_ckpt_tool");
}
