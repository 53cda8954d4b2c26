/* Context parallel with MLA attention (deepseek_v3, src/nn/mla.c): the ring (allgather,
 * alltoall) and Ulysses cores (and on 4 ranks the hybrid Ulysses 2 x ring 2) replace MLA's SDPA
 * core over its zero-padded [q | k | v] rows, and MLA's RoPE follows the rank's head-tail
 * position segments (YaRN on), so one forward + backward of each rank's T/cp rows gives the loss
 * of the single-rank model on the whole sequence and, summed over the ranks, its gradients
 * (q_lora 0 and > 0, a dense and an MoE block). The ring's log-sum-exp merges and the split
 * GEMM rows reorder f32 sums: 2e-5 of each parameter's largest gradient bounds the difference;
 * a 1e-4 scaling of one rank's gradient is caught. The asynchronous core is refused by key. */
// hp-test: ranks 2 4 timeout 120
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/comm.h"
#include "hyperparallel/cp.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hp_test_mpi.h"

enum { T = 16, B = 2 };

static hp_comm_t world;
static int rank, ws;

static hp_model_config_t config(int q_lora) {
    hp_model_config_t c;
    HP_CHECK_OK(hp_model_flavor("deepseek_v3", "debugmodel", &c));
    c.dim = 32; c.n_layers = 2; c.n_heads = 4; c.hidden_dim = 48; c.vocab_size = 61;
    c.moe_n_dense_layers = 1; c.moe_experts = 4; c.moe_top_k = 2; c.moe_hidden = 16;
    c.q_lora_rank = q_lora; c.kv_lora_rank = 16; c.qk_nope_head_dim = 8; c.qk_rope_head_dim = 4; c.v_head_dim = 12;
    c.max_seq_len = 64; c.rope_original_max_pos = 16; c.rope_factor = 4.0f;   // YaRN on
    HP_CHECK_OK(hp_model_config_validate(&c));
    return c;
}

static void tokens(int32_t *tok, int32_t *tgt, int V) {
    for (int i = 0; i < B * T; i++) {
        tok[i] = (i * 7919 + 5) % V;
        tgt[i] = (i * 104729 + 3) % V;
    }
}

/* Worst |cp - ref| / max |ref| over the parameters' gradients (cp summed over the ranks). */
static double grad_err(hp_model_t cpm, hp_model_t ref, double inject) {
    double worst = 0;
    for (int i = 0; i < hp_model_num_params(ref); i++) {
        const hp_param_t *r = &hp_model_params(ref)[i], *p = &hp_model_params(cpm)[i];
        const size_t n = (size_t)hp_tensor_numel(&r->grad.local);
        float *sum = malloc(sizeof(float) * n);
        memcpy(sum, p->grad.local.data, sizeof(float) * n);
        if (inject != 0 && rank == 1 && i == 3)
            for (size_t j = 0; j < n; j++) sum[j] *= (float)(1.0 + inject);
        HP_CHECK_OK(hp_all_reduce(sum, sum, n, HP_F32, HP_SUM, world, NULL));
        double mx = 0, d = 0;
        const float *g = r->grad.local.data;
        for (size_t j = 0; j < n; j++) {
            mx = fmax(mx, fabs(g[j]));
            d = fmax(d, fabs((double)sum[j] - g[j]));
        }
        worst = fmax(worst, mx > 0 ? d / mx : d);
        free(sum);
    }
    return worst;
}

static void variant(int q_lora, hp_cp_rotate_t rot, int U, const char *what) {
    hp_model_config_t c = config(q_lora);
    int32_t tok[B * T], tgt[B * T], lt[B * T], lg[B * T];
    tokens(tok, tgt, c.vocab_size);
    hp_model_t ref = NULL, m = NULL;
    HP_CHECK_OK(hp_model_create(&c, B, T, &ref));
    HP_CHECK_OK(hp_model_create(&c, B, T, &m));
    hp_cp_options_t o = hp_cp_options_default();
    o.rotate = rot;
    o.ulysses_degree = U;
    hp_cp_t cp = NULL;
    HP_CHECK_OK(hp_cp_create(world, &o, B, T, c.n_heads, c.n_kv_heads, c.head_dim, &cp));
    if (!ref || !m || !cp) return;
    HP_CHECK_OK(hp_cp_apply(cp, m));
    HP_CHECK_OK(hp_model_init_weights(ref, 9));
    HP_CHECK_OK(hp_model_init_weights(m, 9));
    float lr = 0, lc = 0;
    HP_CHECK_OK(hp_model_zero_grad(ref));
    HP_CHECK_OK(hp_model_forward(ref, tok, tgt, B, T, (float)(B * T), &lr));
    HP_CHECK_OK(hp_model_backward(ref));
    HP_CHECK_OK(hp_cp_shard_tokens(cp, lt, tok, B));
    HP_CHECK_OK(hp_cp_shard_tokens(cp, lg, tgt, B));
    HP_CHECK_OK(hp_model_zero_grad(m));
    HP_CHECK_OK(hp_model_forward(m, lt, lg, B, T / ws, (float)(B * T), &lc));
    HP_CHECK_OK(hp_model_backward(m));
    HP_CHECK_OK(hp_all_reduce(&lc, &lc, 1, HP_F32, HP_SUM, world, NULL));
    const double ge = grad_err(m, ref, 0), gi = grad_err(m, ref, 1e-4);
    HP_CHECK(fabs(lc - lr) <= 2e-5 * fabs(lr) && ge <= 2e-5, "MLA cp %d %s (q_lora %d): loss %.8g vs %.8g, gradients %.2e",
             ws, what, q_lora, lc, lr, ge);
    HP_CHECK(gi > 2e-5, "MLA cp %d %s: a 1e-4 scaling of rank 1's gradient went unnoticed (%.2e)", ws, what, gi);
    if (rank == 0)
        printf("MLA cp %d %s (q_lora %d): loss %.7f vs %.7f, gradients %.2e (injected %.2e)\n", ws, what, q_lora, lc, lr,
               ge, gi);
    hp_model_destroy(m);
    hp_model_destroy(ref);
    hp_cp_destroy(cp);
}

int main(int argc, char **argv) {
    world = hp_test_mpi_init(&argc, &argv, &rank, &ws);
    variant(0, HP_CP_ROTATE_ALLGATHER, 1, "ring allgather");
    variant(8, HP_CP_ROTATE_ALLTOALL, 1, "ring alltoall");
    variant(8, HP_CP_ROTATE_ALLGATHER, ws, "Ulysses");
    if (ws == 4) variant(0, HP_CP_ROTATE_ALLGATHER, 2, "hybrid Ulysses 2 x ring 2");
    // the asynchronous core is refused by key
    hp_model_config_t c = config(0);
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(&c, B, T, &m));
    hp_cp_options_t o = hp_cp_options_default();
    o.async = 1;
    hp_cp_t cp = NULL;
    HP_CHECK_OK(hp_cp_create(world, &o, B, T, c.n_heads, c.n_kv_heads, c.head_dim, &cp));
    if (m && cp) {
        HP_CHECK_ERR(hp_cp_apply(cp, m), HP_ERR_UNSUPPORTED, "parallelism.context_parallel_async");
    }
    hp_cp_destroy(cp);
    hp_model_destroy(m);
    int rc = hp_test_finish("test_cp_mla");
    hp_comm_finalize();
    return rc;
}
