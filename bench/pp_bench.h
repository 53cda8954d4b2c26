/* The model and data bench_pp and bench_pp_overlap share: llama3 debugmodel resized to
 * (layers, dim, T), and N deterministic token / target ids below its vocabulary. */
#ifndef HP_BENCH_PP_BENCH_H
#define HP_BENCH_PP_BENCH_H

#include <stdint.h>
#include <stdlib.h>

#include "hyperparallel/model.h"
#include "hyperparallel/models.h"

static inline hp_status_t pp_bench_config(int layers, int dim, int T, hp_model_config_t *cfg) {
    HP_TRY(hp_model_flavor("llama3", "debugmodel", cfg));
    cfg->n_layers = layers;
    cfg->dim = dim;
    cfg->head_dim = 0;
    cfg->max_seq_len = T;
    return hp_model_config_validate(cfg);
}

/* malloc'd (free()); NULL on out of memory. */
static inline void pp_bench_tokens(int N, int vocab, int32_t **tok, int32_t **tgt) {
    *tok = malloc(sizeof(int32_t) * (size_t)N);
    *tgt = malloc(sizeof(int32_t) * (size_t)N);
    for (int i = 0; *tok && *tgt && i < N; i++) {
        (*tok)[i] = (int32_t)((i * 2654435761u) % (unsigned)vocab);
        (*tgt)[i] = (int32_t)((i * 40503u + 7) % (unsigned)vocab);
    }
}

#endif
