// Activation checkpointing of the transformer blocks (hp_model_set_activation_checkpoint):
// with AC full (every block), selective k = 2 and k = 3 (TorchTitan's layer-level rule:
// blocks l with (l + 1) % k == 0) the losses and every gradient of 3 AdamW steps on the
// llama3 debugmodel (4 layers, T 32) are bitwise equal to AC off, the activation arena is
// strictly smaller with AC full and k = 2 (k = 3 checkpoints one block: no saving), and bad arguments and a change between forward and backward are
// refused.
// hp-test: ranks 1 timeout 120 coretype 1
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/optim.h"
#include "hp_test.h"

enum { STEPS = 3, B = 2, T = 32, LAYERS = 4 };

typedef struct run {
    float losses[STEPS];
    float *grads;     // every gradient of every step, concatenated
    float *weights;   // final weights
    size_t n;         // floats per step
    size_t act_bytes;
} run_t;

static size_t total_floats(hp_model_t m) {
    size_t n = 0;
    for (int i = 0; i < hp_model_num_params(m); i++) n += (size_t)hp_tensor_numel(&hp_model_params(m)[i].grad.local);
    return n;
}

static void train(const hp_model_config_t *cfg, int every_k, run_t *r) {
    hp_model_t m = NULL;
    HP_ASSERT(hp_model_create(cfg, B, T, &m) == HP_OK);
    HP_ASSERT(hp_model_init_weights(m, 7) == HP_OK);
    HP_CHECK_OK(hp_model_set_activation_checkpoint(m, every_k));
    HP_CHECK(hp_model_activation_checkpoint(m) == every_k, "every_k read back");
    hp_model_memory(m, NULL, NULL, &r->act_bytes, NULL);
    r->n = total_floats(m);
    r->grads = malloc(sizeof(float) * r->n * STEPS);
    r->weights = malloc(sizeof(float) * r->n);
    HP_ASSERT(r->grads && r->weights);
    int32_t tok[B * T + 1], tgt[B * T];
    uint32_t x = 4242;
    for (int i = 0; i < B * T + 1; i++) {
        x = x * 1664525u + 1013904223u;
        tok[i] = (int32_t)((x >> 8) % (uint32_t)cfg->vocab_size);
    }
    for (int i = 0; i < B * T; i++) tgt[i] = tok[i + 1];
    tgt[3] = -100;
    hp_optim_config_t oc = hp_optim_default(HP_OPTIM_ADAMW);
    oc.lr = 3e-3;
    hp_optim_t opt = NULL;
    HP_ASSERT(hp_optim_create(&oc, hp_model_params(m), hp_model_num_params(m), &opt) == HP_OK);
    for (int s = 0; s < STEPS; s++) {
        HP_CHECK_OK(hp_model_zero_grad(m));
        HP_CHECK_OK(hp_model_forward(m, tok, tgt, B, T, 63.0f,
                                     &r->losses[s]));
        if (s == 0) {   // refused between a forward and its backward
            HP_CHECK_ERR(hp_model_set_activation_checkpoint(m, 1), HP_ERR_STATE, "between steps");
        }
        HP_CHECK_OK(hp_model_backward(m));
        size_t off = 0;
        for (int i = 0; i < hp_model_num_params(m); i++) {
            const hp_tensor_t *g = &hp_model_params(m)[i].grad.local;
            size_t k = (size_t)hp_tensor_numel(g);
            memcpy(r->grads + (size_t)s * r->n + off, g->data, sizeof(float) * k);
            off += k;
        }
        HP_CHECK_OK(hp_optim_step(opt, 1.0));
    }
    size_t off = 0;
    for (int i = 0; i < hp_model_num_params(m); i++) {
        const hp_tensor_t *v = &hp_model_params(m)[i].value.local;
        size_t k = (size_t)hp_tensor_numel(v);
        memcpy(r->weights + off, v->data, sizeof(float) * k);
        off += k;
    }
    HP_CHECK_ERR(hp_model_set_activation_checkpoint(m, -1), HP_ERR_INVALID_ARG, "every_k");
    hp_optim_free(opt);
    hp_model_destroy(m);
}

int main(void) {
    hp_model_config_t cfg;
    HP_ASSERT(hp_model_flavor("llama3", "debugmodel", &cfg) == HP_OK);
    cfg.n_layers = LAYERS;
    HP_ASSERT(hp_model_config_validate(&cfg) == HP_OK);
    run_t off;
    train(&cfg, 0, &off);
    const int ks[] = {1, 2, 3};
    for (int i = 0; i < 3; i++) {
        run_t ac;
        train(&cfg, ks[i], &ac);
        HP_CHECK(ac.n == off.n, "same parameter count");
        HP_CHECK(memcmp(ac.losses, off.losses, sizeof(off.losses)) == 0,
                 "k=%d: losses %.9g %.9g %.9g vs off %.9g %.9g %.9g", ks[i], ac.losses[0], ac.losses[1],
                 ac.losses[2], off.losses[0], off.losses[1], off.losses[2]);
        HP_CHECK(memcmp(ac.grads, off.grads, sizeof(float) * off.n * STEPS) == 0,
                 "k=%d: gradients bitwise equal to AC off over %d steps", ks[i], STEPS);
        HP_CHECK(memcmp(ac.weights, off.weights, sizeof(float) * off.n) == 0, "k=%d: final weights", ks[i]);
        /* one checkpointed block (k = 3 of 4 layers) saves nothing: the bump arena keeps the
         * other blocks' state through backward, and the recompute region is one block */
        if (ks[i] < 3)
            HP_CHECK(ac.act_bytes < off.act_bytes, "k=%d: activations %zu bytes < %zu without AC", ks[i],
                     ac.act_bytes, off.act_bytes);
        else
            HP_CHECK(ac.act_bytes == off.act_bytes, "k=%d: activations %zu bytes == %zu without AC", ks[i],
                     ac.act_bytes, off.act_bytes);
        printf("activation checkpointing every %d: activations %zu bytes (%.3f MiB), off %zu bytes (%.3f MiB)\n",
               ks[i], ac.act_bytes, ac.act_bytes / 1048576.0, off.act_bytes, off.act_bytes / 1048576.0);
        free(ac.grads);
        free(ac.weights);
    }
    // turning it off again restores the full arena
    hp_model_t m = NULL;
    HP_ASSERT(hp_model_create(&cfg, B, T, &m) == HP_OK);
    size_t a0, a1, a2;
    hp_model_memory(m, NULL, NULL, &a0, NULL);
    HP_CHECK_OK(hp_model_set_activation_checkpoint(m, 1));
    hp_model_memory(m, NULL, NULL, &a1, NULL);
    HP_CHECK_OK(hp_model_set_activation_checkpoint(m, 0));
    hp_model_memory(m, NULL, NULL, &a2, NULL);
    HP_CHECK(a1 < a0 && a2 == a0, "arena %zu -> %zu (full) -> %zu (off)", a0, a1, a2);
    hp_model_destroy(m);
    free(off.grads);
    free(off.weights);
    return hp_test_finish("test_model_ac");
}
