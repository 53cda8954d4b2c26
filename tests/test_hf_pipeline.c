/* Export for transformers users (issue 18 item 5): `hp-ckpt to-hf --tokenizer` writes sharded
 * weights with model.safetensors.index.json, config.json with bos/eos/pad ids and
 * torch_dtype / dtype, generation_config.json, tokenizer.json, tokenizer_config.json and a
 * README.md; hp-generate runs on the folder itself; and, with Python transformers
 * (HP_PYTHON, else /opt/torchvenv/bin/python, else python3), pipeline("text-generation")
 * generates the same greedy ids as hp-generate (tools/golden/hf_pipeline_check.py). Without
 * transformers that last part prints "SKIP part" and the rest still runs. */
// hp-test: ranks 1 timeout 120
#define _GNU_SOURCE
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hp_test.h"
#include "hp_test_tokenizer.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"

static char ROOT[] = "/tmp/hp_test_hf_pipeline_XXXXXX";
static char BDIR[1024], SRC[1024];
static char OUT[1 << 16];

static int run(const char *cmd) {
    char full[4096];
    snprintf(full, sizeof full, "cd %s && %s 2>&1", ROOT, cmd);
    return hp_test_run_capture(full, OUT, sizeof OUT);
}

static json_object *read_json(const char *name) {
    char p[700];
    snprintf(p, sizeof p, "%s/hf/%s", ROOT, name);
    json_object *o = json_object_from_file(p);
    HP_CHECK(o != NULL, "%s parses", p);
    return o;
}

static int64_t get_int(json_object *o, const char *k) {
    json_object *v;
    return o && json_object_object_get_ex(o, k, &v) && json_object_is_type(v, json_type_int) ? json_object_get_int64(v)
                                                                                            : -1;
}

static const char *get_str(json_object *o, const char *k) {
    json_object *v;
    return o && json_object_object_get_ex(o, k, &v) && json_object_is_type(v, json_type_string) ? json_object_get_string(v)
                                                                                               : "";
}

int main(void) {
    const char *bd = getenv("HP_BUILD_DIR"), *src = getenv("HP_SOURCE_DIR");
    if (!realpath(bd && *bd ? bd : ".", BDIR)) snprintf(BDIR, sizeof BDIR, ".");
    if (!realpath(src && *src ? src : "..", SRC)) snprintf(SRC, sizeof SRC, "..");
    char tp[1200];
    snprintf(tp, sizeof tp, "%s/hp-generate", BDIR);
    if (access(tp, X_OK) != 0) {
        printf("SKIP: %s not built\n", tp);
        return 0;
    }
    HP_ASSERT(mkdtemp(ROOT));
    /* a 320-token tokenizer (BOS <|begin_of_text|> = 0, EOS <|end_of_text|> = 1) */
    static char text[1 << 15];
    size_t n = 0;
    for (int i = 0; i < 300; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "the quick brown fox %d jumps over the lazy dog.\n%%\n", i % 17);
    char p[700];
    snprintf(p, sizeof p, "%s/tok.json", ROOT);
    hp_test_train_tokenizer_vocab(text, n, 320, p);
    /* a small llama3 with its TorchTitan init, saved as a DCP checkpoint */
    hp_model_config_t mc;
    HP_CHECK_OK(hp_model_flavor("llama3", "debugmodel", &mc));
    mc.dim = 64, mc.n_layers = 2, mc.n_heads = 4, mc.n_kv_heads = 2, mc.head_dim = 16, mc.hidden_dim = 128;
    mc.vocab_size = 320, mc.max_seq_len = 64, mc.multiple_of = 0, mc.rope_scaling = 0;
    HP_CHECK_OK(hp_model_config_validate(&mc));
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(&mc, 1, 1, &m));
    if (!m) return hp_test_finish("test_hf_pipeline");
    HP_CHECK_OK(hp_model_init_weights(m, 4));
    int np = hp_model_num_params(m);
    hp_dcp_tensor_t *ts = calloc((size_t)np, sizeof *ts);
    for (int i = 0; i < np; i++) ts[i] = (hp_dcp_tensor_t){hp_model_params(m)[i].name, &hp_model_params(m)[i].value, -1, 0};
    hp_dcp_state_t st = {ts, np, NULL, 0};
    snprintf(p, sizeof p, "%s/dcp", ROOT);
    HP_CHECK_OK(hp_dcp_save(p, &st, NULL));
    free(ts);
    hp_model_destroy(m);
    char cmd[3000];
    snprintf(cmd, sizeof cmd, "'%s/hp-ckpt' to-hf dcp hf --model llama3 --flavor debugmodel --model.dim 64 "
             "--model.n_layers 2 --model.n_heads 4 --model.n_kv_heads 2 --model.head_dim 16 --model.hidden_dim 128 "
             "--model.rope_scaling false --model.max_seq_len 64 --max-shard-bytes 200000 --tokenizer tok.json", BDIR);
    int rc = run(cmd);
    HP_CHECK(rc == 0 && strstr(OUT, "wrote HF checkpoint hf"), "to-hf --tokenizer: exit %d\n%s", rc, OUT);
    /* the files transformers reads */
    const char *files[] = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                           "model.safetensors.index.json", "model-00001-of-00003.safetensors",
                           "model-00003-of-00003.safetensors", "README.md"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/hf/%s", ROOT, files[i]);
        HP_CHECK(access(p, R_OK) == 0, "the export has %s", files[i]);
    }
    json_object *cj = read_json("config.json"), *gc = read_json("generation_config.json"),
                *tc = read_json("tokenizer_config.json"), *tj = read_json("tokenizer.json");
    HP_CHECK(get_int(cj, "bos_token_id") == 0 && get_int(cj, "eos_token_id") == 1 && get_int(cj, "pad_token_id") == 1,
             "config.json bos/eos/pad %lld %lld %lld", (long long)get_int(cj, "bos_token_id"),
             (long long)get_int(cj, "eos_token_id"), (long long)get_int(cj, "pad_token_id"));
    HP_CHECK(!strcmp(get_str(cj, "torch_dtype"), "float32") && !strcmp(get_str(cj, "dtype"), "float32"), "dtype keys");
    HP_CHECK(get_int(gc, "bos_token_id") == 0 && get_int(gc, "eos_token_id") == 1, "generation_config.json ids");
    HP_CHECK(!strcmp(get_str(tc, "bos_token"), "<|begin_of_text|>") && !strcmp(get_str(tc, "eos_token"), "<|end_of_text|>"),
             "tokenizer_config.json bos '%s' eos '%s'", get_str(tc, "bos_token"), get_str(tc, "eos_token"));
    json_object *pp = NULL;
    HP_CHECK(tj && json_object_object_get_ex(tj, "post_processor", &pp) && pp &&
                 !strcmp(get_str(pp, "type"), "TemplateProcessing"),
             "tokenizer.json gets a BOS template");
    json_object_put(cj);
    json_object_put(gc);
    json_object_put(tc);
    json_object_put(tj);
    /* hp-generate on the folder itself, greedy */
    const char *prompt = "the quick brown";
    const int max_new = 12;
    snprintf(cmd, sizeof cmd, "'%s/hp-generate' --weights hf --tokenizer hf/tokenizer.json --prompt '%s' "
             "--max-new-tokens %d --temperature 0 --print-ids", BDIR, prompt, max_new);
    rc = run(cmd);
    const char *ids = strstr(OUT, "ids: ");
    HP_CHECK(rc == 0 && ids, "hp-generate on the HF folder: exit %d\n%s", rc, OUT);
    char idline[2048] = "";
    if (ids) {
        snprintf(idline, sizeof idline, "%s", ids + 5);
        idline[strcspn(idline, "\n")] = 0;
    }
    int nid = 0;
    for (char *q = idline; *q; q++) nid += (q == idline || q[-1] == ' ') && *q != ' ';
    HP_CHECK(!strncmp(idline, "0 ", 2) && nid > 3, "the ids start with BOS 0 and hold the prompt: '%s'", idline);
    /* transformers' pipeline, when there */
    const char *py = getenv("HP_PYTHON");
    if (!py || !*py) py = access("/opt/torchvenv/bin/python", X_OK) == 0 ? "/opt/torchvenv/bin/python" : "python3";
    snprintf(cmd, sizeof cmd, "'%s' -c 'import transformers, torch' >/dev/null 2>&1", py);
    if (system(cmd) != 0) {
        printf("SKIP part: %s cannot import transformers and torch (the pipeline comparison)\n", py);
    } else {
        snprintf(cmd, sizeof cmd, "'%s' '%s/tools/golden/hf_pipeline_check.py' hf '%s' %d '%s'", py, SRC, prompt, max_new,
                 idline);
        rc = run(cmd);
        printf("%s", OUT);
        HP_CHECK(rc == 0 && strstr(OUT, "-> OK"), "pipeline greedy ids differ from hp-generate's (exit %d):\n%s", rc, OUT);
        /* negative control: another id list is a mismatch */
        snprintf(cmd, sizeof cmd, "'%s' '%s/tools/golden/hf_pipeline_check.py' hf '%s' %d '%s 5'", py, SRC, prompt,
                 max_new, idline);
        rc = run(cmd);
        HP_CHECK(rc == 1 && strstr(OUT, "MISMATCH"), "the checker accepted a wrong id list (exit %d)\n%s", rc, OUT);
    }
    if (!getenv("HP_KEEP")) {
        snprintf(cmd, sizeof cmd, "rm -rf %s", ROOT);
        if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", ROOT);
    }
    return hp_test_finish("test_hf_pipeline");
}
