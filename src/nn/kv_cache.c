/* Inference with a KV cache: prefill and decode run the same block modules as training on a
 * (1, chunk) context whose act.kv points at the cache, so the attention modules append each
 * chunk's keys and values and the core attends to the cached positions; RoPE uses the
 * chunk's global positions (act.pos0). Only the last row goes through the head. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "nn/nn-model.h"

enum { HP_KV_CHUNK = 64 };   // rows per prefill chunk: bounds the per-row buffers

/* The cache computes with the full weights of one rank: a tensor-parallel model holds head
 * and vocab shards, an FSDP model gathers its weights only inside its forward. */
static hp_status_t kv_check_model(hp_model_t m, const char *who) {
    const hp_model_config_t *c = &m->cfg;
    int hooked = 0;
    for (int u = m->u0; u < m->u1 && !hooked; u++) {
        const hp_module_t *mod = m->units[u].module;
        hooked = mod->n_hooks[HP_HOOK_PRE_FORWARD] || mod->n_hooks[HP_HOOK_POST_FORWARD];
    }
    int external = 0;   // a parameter whose storage another owner (FSDP) holds
    for (int i = 0; i < m->n_params && !external; i++) {
        const float *v = m->params[i].value.local.data;
        external = !m->param_data || v < m->param_data || v >= m->param_data + m->store_floats;
    }
    if (external || hooked)
        return hp_error(HP_ERR_STATE, "%s: model '%s/%s' is FSDP-wrapped (its parameters are shards, gathered "
                        "only inside hp_model_forward); expected an unwrapped single-rank model; hint: save the "
                        "full weights (hp_model_save_weights) and load them with hp_model_load_weights for "
                        "inference", who, c->name, c->flavor);
    if (m->u0 != 0 || m->u1 != m->n_units_total)
        return hp_error(HP_ERR_STATE, "%s: model '%s/%s' holds units [%d, %d) only (a pipeline stage); expected the "
                        "whole model", who, c->name, c->flavor, m->u0, m->u1);
    int tp = 0;   // a sharded parameter (a DTensor, or a local shard smaller than the declared shape)
    for (int i = 0; i < m->n_params && !tp; i++) {
        const hp_param_t *p = &m->params[i];
        tp = p->value.mesh != NULL;
        for (int k = 0; k < p->value.local.ndim && !tp; k++) tp = p->value.local.shape[k] != p->value.global_shape[k];
    }
    if (tp)
        return hp_error(HP_ERR_STATE, "%s: model '%s/%s' is tensor-parallel (its heads, FFN and vocab are "
                        "sharded across ranks); expected an unwrapped single-rank model; hint: save the full "
                        "weights (hp_model_save_weights) and load them with hp_model_load_weights for inference",
                        who, c->name, c->flavor);
    return HP_OK;
}

hp_status_t hp_model_kv_cache_create(hp_model_t m, int max_len, hp_model_kv_cache_t *out) {
    if (!m || !out) return hp_error(HP_ERR_INVALID_ARG, "hp_model_kv_cache_create: model and out must be non-NULL");
    *out = NULL;
    HP_TRY(kv_check_model(m, "hp_model_kv_cache_create"));
    if (max_len <= 0 || max_len > m->max_seq_len)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_kv_cache_create: max_len %d, expected 1 .. %d (the "
                        "max_seq_len the model was created with: its RoPE table); hint: create or load the "
                        "model with a larger max_seq_len", max_len, m->max_seq_len);
    const hp_model_config_t *c = &m->cfg;
    const size_t kd = (size_t)c->n_kv_heads * c->head_dim, V = c->vocab_size, L = c->n_layers;
    const int chunk = max_len < HP_KV_CHUNK ? max_len : HP_KV_CHUNK, n_threads = omp_get_max_threads();
    const size_t sizes[] = {L * max_len * kd, L * max_len * kd, V, (size_t)n_threads * max_len};
    enum { NB = sizeof(sizes) / sizeof(sizes[0]) };
    size_t off[NB], total = 0;
    for (int i = 0; i < NB; i++) { off[i] = total; total += (sizes[i] + 15) & ~(size_t)15; }
    hp_model_kv_cache_t kc = hp_calloc(1, sizeof(*kc));
    if (!kc) return HP_ERR_OOM;
    kc->mem = hp_aligned_alloc(sizeof(float) * total);
    hp_status_t st = kc->mem ? HP_OK : hp_error(HP_ERR_OOM, "hp_model_kv_cache_create: %.2f MiB for max_len %d; "
                                                 "hint: use a smaller max_len", (double)total * 4 / (1 << 20), max_len);
    if (st == HP_OK) st = hp_model_ctx_create(m, 1, chunk, 0, &kc->ctx);
    if (st != HP_OK) {
        hp_model_kv_cache_destroy(kc);
        return st;
    }
    memset(kc->mem, 0, sizeof(float) * total);
    float **ptr[NB] = {&kc->k, &kc->v, &kc->logits, &kc->scores};
    for (int i = 0; i < NB; i++) *ptr[i] = kc->mem + off[i];
    kc->m = m;
    kc->max_len = max_len;
    kc->chunk = chunk;
    kc->n_threads = n_threads;
    *out = kc;
    return HP_OK;
}

void hp_model_kv_cache_destroy(hp_model_kv_cache_t c) {
    if (!c) return;
    hp_model_ctx_destroy(c->ctx);
    hp_free_aligned(c->mem);
    free(c);
}

void hp_model_kv_cache_reset(hp_model_kv_cache_t c) { if (c) c->pos = 0; }
int hp_model_kv_cache_pos(hp_model_kv_cache_t c) { return c ? c->pos : 0; }
int hp_model_kv_cache_max_len(hp_model_kv_cache_t c) { return c ? c->max_len : 0; }

/* n <= chunk tokens at positions [pos, pos + n) through the embedding and the blocks (keys
 * and values appended to the cache), then the head for the last row when `last`. */
static hp_status_t kv_forward_rows(hp_model_t m, hp_model_kv_cache_t kc, const int32_t *tokens, int n, int last) {
    hp_model_ctx_t c = kc->ctx;
    const int nu = m->n_units_total, d = m->cfg.dim;
    if (m->ac_generation != c->ac_generation) {   // checkpointing changed since the cache was made
        hp_model_ctx_t fresh;
        HP_TRY(hp_model_ctx_create(m, 1, kc->chunk, 0, &fresh));
        hp_model_ctx_destroy(c);
        kc->ctx = c = fresh;
    }
    HP_TRY(hp_model_ctx_begin(c, tokens, NULL, 1, n, 1.0f));
    c->act.kv = kc;
    c->act.pos0 = kc->pos;
    hp_status_t st = hp_model_forward_range(m, c, 0, nu - 1, NULL, NULL);
    if (st == HP_OK && last) {
        // the head on the last row only: a (1, 1) view of the context
        hp_act_t *act = &c->act;
        act->B = 1;
        act->T = 1;
        hp_tensor_t t_in, t_out;
        hp_tensor_view2(&t_in, c->x[nu - 1] + (size_t)(n - 1) * d, 1, d);
        hp_tensor_view2(&t_out, kc->logits, 1, m->cfg.vocab_size);
        st = hp_module_forward(m->units[nu - 1].module, act, &t_in, &t_out);
    }
    c->act.kv = NULL;
    c->act.pos0 = 0;
    if (st == HP_OK) kc->pos += n;
    return st;
}

static hp_status_t kv_append(hp_model_t m, hp_model_kv_cache_t c, const int32_t *tokens, int n,
                             const float **logits, const char *who) {
    if (!m || !c) return hp_error(HP_ERR_INVALID_ARG, "%s: model and cache must be non-NULL", who);
    if (c->m != m)
        return hp_error(HP_ERR_INVALID_ARG, "%s: the KV cache was created for another model; hint: create "
                        "one cache per model (hp_model_kv_cache_create)", who);
    HP_TRY(kv_check_model(m, who));
    if (!tokens || n <= 0)
        return hp_error(HP_ERR_INVALID_ARG, "%s: n = %d tokens (%s), expected n >= 1 and a non-NULL token "
                        "array", who, n, tokens ? "non-NULL" : "NULL");
    if (n > c->max_len - c->pos)
        return hp_error(HP_ERR_INVALID_ARG, "%s: KV cache full: %d token(s) at position %d need positions up "
                        "to %d, the cache's max_len is %d; hint: create the cache with a larger max_len (up "
                        "to the model's max_seq_len %d), or reset it and prefill the last window", who, n,
                        c->pos, c->pos + n, c->max_len, m->max_seq_len);
    const int V = m->cfg.vocab_size;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return hp_error(HP_ERR_INVALID_ARG, "%s: token id %d at index %d is outside [0, %d) (vocab_size "
                            "of '%s/%s'); hint: use the tokenizer the model was trained with", who,
                            (int)tokens[i], i, V, m->cfg.name, m->cfg.flavor);
    for (int i = 0; i < n; i += c->chunk) {
        const int k = n - i < c->chunk ? n - i : c->chunk;
        HP_TRY(kv_forward_rows(m, c, tokens + i, k, i + k == n));
    }
    if (logits) *logits = c->logits;
    return HP_OK;
}

hp_status_t hp_model_prefill(hp_model_t m, hp_model_kv_cache_t c, const int32_t *tokens, int n,
                             const float **logits) {
    return kv_append(m, c, tokens, n, logits, "hp_model_prefill");
}

hp_status_t hp_model_decode(hp_model_t m, hp_model_kv_cache_t c, int32_t token, const float **logits) {
    return kv_append(m, c, &token, 1, logits, "hp_model_decode");
}
