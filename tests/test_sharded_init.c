/* Sharded initialization (issue 26, docs/memory.md): every layout composed on an empty model
 * (hp_model_create_empty, the meta device) by the library's parallelize draws on each rank only
 * the elements it holds, and the whole model gathered afterwards is bitwise the single rank's
 * hp_model_create + hp_model_init_weights (layout-independent init: FSDP, TP, FSDP over TP's
 * _StridedShard, HSDP, DDP, PP, PP x FSDP, EP, EP with expert FSDP). Tolerance: none (the
 * counter RNG's value depends on (seed, name, global index) only). And no rank ever holds more
 * of the model than it owns: the peak of the library's allocations while composing equals what
 * the rank holds afterwards (within the small tables), where the old path (whole model created,
 * drawn, then sharded) peaks at the whole model; that negative case must fail the check. 4 ranks. */
// hp-test: ranks 4 timeout 600
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hyperparallel/comm.h"
#include "hyperparallel/model_parallelize.h"
#include "hyperparallel/models.h"
#include "hyperparallel/parallelize.h"

enum { B = 4, T = 16, SEED = 7 };

typedef struct layout {
    const char *what, *model;
    int rep, shard, cp, tp, pp, ep;
    int holds_whole;   /* every rank holds the whole model (replicated): the peak check is moot */
} layout_t;

/* Bytes of the library's allocations alive now / at their peak since the last reset. */
static size_t live_now(void) {
    size_t live = 0;
    hp_memory_tracked(&live, NULL);
    return live;
}

/* Composes layout l on an empty model (or, old_path, on a whole model drawn first: the negative
 * case), checks the peak, gathers the whole model and compares it with ref on rank 0. */
static void run(hp_comm_t world, const layout_t *l, const hp_model_config_t *cfg, hp_model_t ref, int old_path) {
    const int rank = hp_comm_rank(world);
    hp_parallel_dims_t pd;
    HP_CHECK_OK(hp_parallel_dims_init(&pd, l->rep, l->shard, l->cp, l->tp, l->pp, l->ep, 1, hp_comm_size(world)));
    hp_parallel_meshes_t meshes;
    HP_CHECK_OK(hp_parallel_dims_build_mesh(&pd, world, &meshes));
    hp_parallelize_options_t o = hp_parallelize_default_options();
    o.seed = SEED;
    o.pp.microbatch_size = 1;
    const size_t before = live_now();
    hp_memory_tracked_reset_peak();
    hp_parallel_t par = NULL;
    hp_model_t model = NULL;
    if (l->pp > 1) {
        HP_CHECK_OK(hp_parallelize_pipeline(cfg, &pd, &meshes, world, B, T, &o, &par));
    } else {
        if (old_path) {   // the whole model first (PyTorch without the meta device)
            HP_CHECK_OK(hp_model_create(cfg, B, T, &model));
            HP_CHECK_OK(hp_model_init_weights(model, SEED));
        } else {
            HP_CHECK_OK(hp_model_create_empty(cfg, B, T, &model));
        }
        HP_CHECK_OK(hp_parallel_create(model, B, T, &par));
        HP_CHECK_OK(hp_parallelize(par, &pd, &meshes, &o));
    }
    if (!par) {   // reported above
        hp_model_destroy(model);
        hp_parallel_meshes_destroy(&meshes);
        return;
    }
    size_t peak = 0, after = 0;
    hp_memory_tracked(&after, &peak);
    /* what the rank holds now is all it ever held (the model's tables and the modules are
     * calloc'd, not counted; the slack covers the RoPE tables and a context's tables) */
    const size_t held = after - before, most = peak - before, slack = 256 * 1024;
    const int ok = most <= held + slack;
    if (!l->holds_whole) {
        if (old_path)
            HP_CHECK(!ok, "%s (negative: the whole model drawn before sharding): the peak %.2f MiB must exceed what "
                     "the rank holds, %.2f MiB", l->what, most / 1048576.0, held / 1048576.0);
        else
            HP_CHECK(ok, "%s: the library's allocations peaked at %.2f MiB while composing, the rank holds %.2f MiB "
                     "(a transient copy of more than it owns)", l->what, most / 1048576.0, held / 1048576.0);
    }
    /* the whole model gathered: bitwise the single rank's init */
    hp_model_t full = NULL;
    int owned = 0;
    HP_CHECK_OK(hp_parallel_gather_full_model(par, world, T, &full, &owned));
    if (rank == 0 && full) {
        int same = 1;
        for (int i = 0; i < hp_model_num_params(ref); i++) {
            const hp_param_t *a = &hp_model_params(ref)[i], *b = &hp_model_params(full)[i];
            const size_t n = (size_t)hp_tensor_numel(&a->value.local);
            const int eq = strcmp(a->name, b->name) == 0 &&
                           memcmp(a->value.local.data, b->value.local.data, sizeof(float) * n) == 0;
            HP_CHECK(eq, "%s: %s differs from the single rank's init", l->what, a->name);
            same &= eq;
        }
        printf("%s%s: weights %s the single rank's bitwise; library allocations peaked at %.2f MiB, the rank holds "
               "%.2f MiB\n", l->what, old_path ? " (old path)" : "", same ? "equal" : "DIFFER FROM", most / 1048576.0,
               held / 1048576.0);
    }
    if (owned) hp_model_destroy(full);
    hp_parallel_destroy(par);
    hp_model_destroy(model);
    hp_parallel_meshes_destroy(&meshes);
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &rank, &ws);
    if (ws != 4) {
        if (rank == 0) printf("SKIP: needs 4 ranks\n");
        hp_comm_finalize();
        return 0;
    }
    static const layout_t layouts[] = {
        {"FSDP 4", "llama3", 1, 4, 1, 1, 1, 1, 0},
        {"TP 4", "llama3", 1, 1, 1, 4, 1, 1, 0},
        {"FSDP 2 x TP 2 (_StridedShard)", "llama3", 1, 2, 1, 2, 1, 1, 0},
        {"HSDP 2 x 2", "llama3", 2, 2, 1, 1, 1, 1, 0},
        {"DDP 4", "llama3", 4, 1, 1, 1, 1, 1, 1},
        {"PP 4", "llama3", 1, 1, 1, 1, 4, 1, 0},
        {"PP 2 x FSDP 2", "llama3", 1, 2, 1, 1, 2, 1, 0},
        {"PP 2 x TP 2", "llama3", 1, 1, 1, 2, 2, 1, 0},
        {"CP 2 x FSDP 2", "llama3", 1, 2, 2, 1, 1, 1, 0},
        {"tied qwen3 FSDP 2 x TP 2", "qwen3", 1, 2, 1, 2, 1, 1, 0},
        {"EP 4 (qwen3_moe)", "qwen3_moe", 1, 4, 1, 1, 1, 4, 0},
        {"EP 2 x expert FSDP 2 (qwen3_moe)", "qwen3_moe", 1, 4, 1, 1, 1, 2, 0},
    };
    const int n = (int)(sizeof layouts / sizeof layouts[0]);
    for (int i = 0; i <= n; i++) {
        const layout_t *l = &layouts[i < n ? i : 0];   // the last run: the negative case of FSDP 4
        hp_model_config_t cfg;
        HP_CHECK_OK(hp_model_flavor(l->model, "debugmodel", &cfg));
        hp_model_t ref = NULL;   // the single rank's init, compared on rank 0
        if (rank == 0) {
            HP_CHECK_OK(hp_model_create(&cfg, B, T, &ref));
            HP_CHECK_OK(hp_model_init_weights(ref, SEED));
        }
        run(world, l, &cfg, ref, i == n);
        hp_model_destroy(ref);
    }
    /* library use: an empty model refuses to run before its weights exist */
    {
        hp_model_config_t cfg;
        HP_CHECK_OK(hp_model_flavor("llama3", "debugmodel", &cfg));
        hp_model_t m = NULL;
        HP_CHECK_OK(hp_model_create_empty(&cfg, B, T, &m));
        int32_t tok[B * T] = {0};
        float loss = 0;
        HP_CHECK_ERR(hp_model_forward(m, tok, tok, B, T, 1.0f, &loss), HP_ERR_STATE, "created empty");
        HP_CHECK_ERR(hp_model_init_weights(m, SEED), HP_ERR_STATE, "hp_model_materialize");
        HP_CHECK_OK(hp_model_materialize(m));
        HP_CHECK_OK(hp_model_init_weights(m, SEED));
        HP_CHECK_OK(hp_model_forward(m, tok, tok, B, T, (float)(B * T), &loss));
        hp_model_destroy(m);
    }
    return hp_test_mpi_finish("test_sharded_init");
}
