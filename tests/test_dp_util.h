/* Shared harness of the data-parallel tests (test_fsdp*, test_ddp*, test_zero*): the llama3
 * debug model with short sequences, deterministic token data, a single-rank reference run of
 * the whole global batch in the same program, and comparisons of losses, gradients and
 * weights. */
#ifndef HP_TEST_DP_UTIL_H
#define HP_TEST_DP_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hyperparallel/model.h"
#include "hyperparallel/optim.h"

#define DP_T 8        /* sequence length */
#define DP_B 1        /* sequences per rank per micro-batch */
#define DP_SEED 1234

static inline uint32_t dp_hash(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
    return x;
}

/* Tokens and targets of global sequence `seq` of micro-batch `a` of step `step`; every 5th
 * target is ignored (-100) so the valid count differs per rank. */
static inline void dp_sequence(int step, int a, int seq, int V, int32_t *tok, int32_t *tgt) {
    for (int t = 0; t < DP_T; t++) {
        uint32_t h = dp_hash((uint32_t)(step * 1000003 + a * 10007 + seq * 101 + t));
        tok[t] = (int32_t)(h % (uint32_t)V);
        tgt[t] = (t + seq + step) % 5 == 4 ? -100 : (int32_t)(dp_hash(h) % (uint32_t)V);
    }
}

static inline int64_t dp_valid(int step, int accum, int n_seqs, int V) {
    int32_t tok[DP_T], tgt[DP_T];
    int64_t n = 0;
    for (int a = 0; a < accum; a++)
        for (int s = 0; s < n_seqs; s++) {
            dp_sequence(step, a, s, V, tok, tgt);
            for (int t = 0; t < DP_T; t++) n += tgt[t] != -100;
        }
    return n;
}

static inline hp_model_config_t dp_config(int n_layers) {
    hp_model_config_t c;
    hp_status_t s = hp_model_flavor("llama3", "debugmodel", &c);
    HP_ASSERT(s == HP_OK);
    if (n_layers > 0) c.n_layers = n_layers;
    c.max_seq_len = 64;
    return c;
}

static inline hp_optim_config_t dp_optim(void) {
    hp_optim_config_t o = hp_optim_default(HP_OPTIM_ADAMW);
    o.lr = 1e-3; o.beta1 = 0.9; o.beta2 = 0.95; o.weight_decay = 0.1;
    return o;
}

/* max |a - b| / max |b| */
static inline double dp_rel_err(const float *a, const float *b, int64_t n) {
    double d = 0.0, m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (e > d) d = e;
        if (fabs((double)b[i]) > m) m = fabs((double)b[i]);
    }
    return m > 0 ? d / m : d;
}

/* One forward + backward of the reference model over `n_seqs` global sequences of micro-batch a. */
static inline float dp_ref_microbatch(hp_model_t ref, int step, int a, int n_seqs, float divisor, int32_t *tok, int32_t *tgt) {
    const int V = hp_model_config(ref)->vocab_size;
    for (int s = 0; s < n_seqs; s++) dp_sequence(step, a, s, V, tok + s * DP_T, tgt + s * DP_T);
    float loss = 0.0f;
    hp_status_t st = hp_model_forward(ref, tok, tgt, n_seqs, DP_T, divisor, &loss);
    HP_ASSERT_MSG(st == HP_OK, "reference forward: %s", hp_last_error());
    st = hp_model_backward(ref);
    HP_ASSERT_MSG(st == HP_OK, "reference backward: %s", hp_last_error());
    return loss;
}

#endif
