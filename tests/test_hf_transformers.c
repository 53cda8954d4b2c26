/* An exported llama3 and qwen3 checkpoint loads in HF transformers and its logits match
 * ours (tools/golden/hf_logits_check.py). Needs Python with transformers (HP_PYTHON, else
 * /opt/torchvenv/bin/python, else python3); prints "SKIP: ..." and exits 0 without it. */
// hp-test: ranks 1 timeout 120
#define _GNU_SOURCE
#include <libgen.h>
#include <stdlib.h>
#include <unistd.h>

#include "hp_test.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"

static char ROOT[] = "/tmp/hp_test_hf_transformers_XXXXXX";

static void check(const char *py, const char *script, const char *name) {
    hp_model_config_t mc;
    HP_CHECK_OK(hp_model_flavor(name, "debugmodel", &mc));
    mc.vocab_size = 96;
    mc.max_seq_len = 32;
    HP_CHECK_OK(hp_model_config_validate(&mc));
    hp_model_t m = NULL;
    enum { T = 12 };
    HP_CHECK_OK(hp_model_create(&mc, 1, T, &m));
    if (!m) return;
    HP_CHECK_OK(hp_model_init_weights(m, 11));
    char dir[200], path[300];
    snprintf(dir, sizeof dir, "%s/%s", ROOT, name);
    HP_CHECK_OK(hp_hf_export(dir, hp_model_hf_adapter(&mc), &mc, hp_model_params(m), hp_model_num_params(m), NULL,
                             HP_F32, 0));
    int32_t toks[T];
    for (int i = 0; i < T; i++) toks[i] = (i * 37 + 5) % mc.vocab_size;
    float loss;
    HP_CHECK_OK(hp_model_forward(m, toks, NULL, 1, T, 1.0f, &loss));
    snprintf(path, sizeof path, "%s/logits.bin", dir);
    FILE *f = fopen(path, "wb");
    HP_ASSERT(f);
    fwrite(hp_model_logits(m), sizeof(float), (size_t)T * (size_t)mc.vocab_size, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/tokens.txt", dir);
    f = fopen(path, "w");
    HP_ASSERT(f);
    for (int i = 0; i < T; i++) fprintf(f, "%d ", toks[i]);
    fclose(f);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' 2>&1", py, script, dir);
    FILE *p = popen(cmd, "r");
    char out[8192] = "";
    size_t len = 0;
    char line[1024];
    while (p && fgets(line, sizeof line, p))
        if (len + strlen(line) + 1 < sizeof out) {
            memcpy(out + len, line, strlen(line) + 1);
            len += strlen(line);
        }
    int rc = p ? pclose(p) : -1;
    printf("%s: %s", name, out + (len > 400 ? len - 400 : 0));
    HP_CHECK(rc == 0 && strstr(out, "-> OK"), "%s: transformers logits differ from ours (exit %d):\n%s", name, rc, out);
    hp_model_destroy(m);
}

int main(void) {
    const char *py = getenv("HP_PYTHON");
    if (!py || !*py) py = access("/opt/torchvenv/bin/python", X_OK) == 0 ? "/opt/torchvenv/bin/python" : "python3";
    char cmd[600];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import transformers, torch' >/dev/null 2>&1", py);
    if (system(cmd) != 0) {
        printf("SKIP: %s cannot import transformers and torch (pip install transformers to run this check)\n", py);
        return 0;
    }
    char script[1024];
    const char *src = getenv("HP_SOURCE_DIR");
    if (src && *src) {
        snprintf(script, sizeof script, "%s/tools/golden/hf_logits_check.py", src);
    } else {
        char here[900];
        snprintf(here, sizeof here, "%s", __FILE__);
        snprintf(script, sizeof script, "%s/../tools/golden/hf_logits_check.py", dirname(here));
    }
    if (access(script, R_OK) != 0) {
        printf("SKIP: %s not found (set HP_SOURCE_DIR to the source tree)\n", script);
        return 0;
    }
    HP_ASSERT(mkdtemp(ROOT));
    check(py, script, "llama3");
    check(py, script, "qwen3");
    snprintf(cmd, sizeof cmd, "rm -rf %s", ROOT);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", ROOT);
    return hp_test_finish("test_hf_transformers");
}
