// Memory per rank under context parallelism (acceptance 3 of issue 16): a llama3 model (1
// layer, dim 64, 4 heads / 2 kv heads) at T = 4096, B = 1, for cp = 1, 2, 4 (the first cp ranks
// of the world): the activation arena (hp_model_memory, sized from the module size table before
// any allocation) falls as 1/cp (every activation is sequence-proportional), and one forward +
// backward of the rank's T/cp rows runs inside it (the arena asserts on overflow) with a finite
// loss. The CP workspace (K/V buffers) is reported per rotate method: allgather holds every
// rank's K/V (R blocks), alltoall two blocks in flight plus the dK/dV accumulators.
// hp-test: ranks 4 timeout 300
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/cp.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hp_test_mpi.h"

enum { T = 4096, B = 1 };

int main(int argc, char **argv) {
    int rank, ws;
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &rank, &ws);
    HP_CHECK(ws == 4, "run on 4 ranks (got %d)", ws);
    hp_model_config_t mc;
    HP_CHECK_OK(hp_model_flavor("llama3", "debugmodel", &mc));
    mc.n_layers = 1;
    mc.dim = 64;
    mc.n_heads = 4;
    mc.n_kv_heads = 2;
    mc.head_dim = 16;
    mc.max_seq_len = T;
    size_t act[3] = {0}, wsb[3][2] = {{0}};
    for (int k = 0; k < 3; k++) {
        const int cp = 1 << k;
        hp_comm_t comm = NULL;
        HP_CHECK_OK(hp_comm_split(world, rank < cp ? 0 : -1, rank, &comm));
        if (rank < cp) {
            hp_model_t m = NULL;
            hp_cp_t c = NULL, c2 = NULL;
            HP_CHECK_OK(hp_model_create(&mc, B, T, &m));
            if (m && cp > 1) {
                hp_cp_options_t o = hp_cp_options_default();
                HP_CHECK_OK(hp_cp_create(comm, &o, B, T, mc.n_heads, mc.n_kv_heads, 16, &c));
                o.rotate = HP_CP_ROTATE_ALLTOALL;
                HP_CHECK_OK(hp_cp_create(comm, &o, B, T, mc.n_heads, mc.n_kv_heads, 16, &c2));
                if (c) HP_CHECK_OK(hp_cp_apply(c, m));
                if (c && c2) {
                    wsb[k][0] = hp_cp_workspace_bytes(c);
                    wsb[k][1] = hp_cp_workspace_bytes(c2);
                }
            }
            if (m) {
                HP_CHECK_OK(hp_model_init_weights(m, 7));
                size_t pb, gb, wb;
                hp_model_memory(m, &pb, &gb, &act[k], &wb);
                const int Tl = T / cp;
                int32_t *tok = malloc(sizeof(int32_t) * T), *tgt = malloc(sizeof(int32_t) * T);
                int32_t *lt = malloc(sizeof(int32_t) * Tl), *lg = malloc(sizeof(int32_t) * Tl);
                for (int t = 0; t < T; t++) {
                    tok[t] = (t * 7919) % mc.vocab_size;
                    tgt[t] = (t * 104729 + 3) % mc.vocab_size;
                }
                if (c) {
                    HP_CHECK_OK(hp_cp_shard_tokens(c, lt, tok, B));
                    HP_CHECK_OK(hp_cp_shard_tokens(c, lg, tgt, B));
                } else {
                    memcpy(lt, tok, sizeof(int32_t) * T);
                    memcpy(lg, tgt, sizeof(int32_t) * T);
                }
                float loss = 0.0f;
                HP_CHECK_OK(hp_model_forward(m, lt, lg, B, Tl, (float)T, &loss));
                HP_CHECK_OK(hp_model_backward(m));
                HP_CHECK(isfinite(loss) && loss > 0.0f, "cp %d: loss %g", cp, loss);
                free(tok); free(tgt); free(lt); free(lg);
            }
            hp_model_destroy(m);
            hp_cp_destroy(c);
            hp_cp_destroy(c2);
            hp_comm_destroy(comm);
        }
    }
    if (rank == 0) {
        printf("T = %d, B = %d, llama3 1 layer dim 64: activation arena per rank\n", T, B);
        for (int k = 0; k < 3; k++)
            printf("  cp %d: activations %.2f MiB (%.3f of cp 1), CP workspace allgather %.2f MiB, alltoall %.2f MiB\n",
                   1 << k, act[k] / 1048576.0, (double)act[k] / (double)act[0], wsb[k][0] / 1048576.0,
                   wsb[k][1] / 1048576.0);
        /* the arena is a sum of sequence-proportional tensors (rounded to 64 B each): 1/cp
         * within 1% */
        for (int k = 1; k < 3; k++)
            HP_CHECK(act[k] <= act[0] / (1 << k) * 1.01 && act[k] >= act[0] / (1 << k) * 0.99,
                     "cp %d: activations %zu bytes, expected %zu / %d within 1%%", 1 << k, act[k], act[0], 1 << k);
        HP_CHECK(wsb[2][1] < wsb[2][0], "alltoall workspace %zu not below allgather's %zu at cp 4", wsb[2][1], wsb[2][0]);
    }
    int rc = hp_test_finish("test_cp_memory");
    hp_comm_finalize();
    return rc;
}
