/* Hash of the loss, the logits and every gradient of one forward + backward (the debugmodel of
 * each family: llama3, qwen3, deepseek_v3, qwen3_moe; 3 layers, B 2, T 64) through the
 * whole-model API: two builds of different commits give the same hashes when their results are
 * bitwise equal. tools/layout_fingerprint.sh builds and runs it. Not built by CMake:
 *   gcc -O2 -fopenmp -I include tests/support/model_grad_hash.c -o /tmp/gh -Lbuild -lhyperparallel -Wl,-rpath,$PWD/build
 *   OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 /tmp/gh
 * (docs/testing.md: the redesign of issue 12 against its parent commit). */
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
static uint64_t fnv(uint64_t h, const void *p, size_t n) { const unsigned char *c = p; for (size_t i = 0; i < n; i++) { h ^= c[i]; h *= 1099511628211ull; } return h; }
int main(void) {
    const char *names[4] = {"llama3", "qwen3", "deepseek_v3", "qwen3_moe"};
    for (int k = 0; k < 4; k++) {
        hp_model_config_t c; hp_model_flavor(names[k], "debugmodel", &c); c.n_layers = 3; hp_model_config_validate(&c);
        hp_model_t m; if (hp_model_create(&c, 2, 64, &m) != HP_OK) return 1;
        hp_model_init_weights(m, 7);
        int32_t tok[128], tgt[128]; uint32_t x = 1;
        for (int i = 0; i < 128; i++) { x = x * 1664525u + 1013904223u; tok[i] = (x >> 8) % c.vocab_size; x = x * 1664525u + 1013904223u; tgt[i] = (x >> 8) % c.vocab_size; }
        float loss; hp_model_zero_grad(m); hp_model_forward(m, tok, tgt, 2, 64, 100.0f, &loss); hp_model_backward(m);
        uint64_t h = fnv(1469598103934665603ull, &loss, 4);
        for (int i = 0; i < hp_model_num_params(m); i++) { hp_param_t *p = &hp_model_params(m)[i]; h = fnv(h, p->grad.local.data, hp_tensor_nbytes(&p->grad.local)); }
        h = fnv(h, hp_model_logits(m), sizeof(float) * 128 * c.vocab_size);
        printf("%s loss %.9g hash %016llx\n", names[k], loss, (unsigned long long)h);
        hp_model_destroy(m);
    }
    return 0;
}
