/* FSDP step time broken into compute and exposed communication (time spent waiting in
 * collectives), overlap on and off, and per-rank memory of parameters, gradients and
 * optimizer state against the single-rank run. llama3 debugmodel, AdamW.
 *   mpirun -np 2 build/bench_fsdp [B T steps]
 * Prints a markdown table (docs/performance.md, "FSDP (bench/fsdp)"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/comm.h"
#include "hyperparallel/fsdp.h"
#include "hyperparallel/mesh.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/optim.h"

#define CHECK(x)                                                                        \
    do {                                                                                \
        hp_status_t s_ = (x);                                                           \
        if (s_ != HP_OK) {                                                              \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, hp_last_error()); \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

int main(int argc, char **argv) {
    hp_comm_t world;
    CHECK(hp_comm_init(&argc, &argv, &world));
    const int rank = hp_comm_rank(world), W = hp_comm_size(world);
    const int B = argc > 1 ? atoi(argv[1]) : 2, T = argc > 2 ? atoi(argv[2]) : 64, steps = argc > 3 ? atoi(argv[3]) : 5;
    hp_model_config_t cfg;
    CHECK(hp_model_flavor("llama3", "debugmodel", &cfg));
    const int V = cfg.vocab_size;
    int32_t *tok = malloc(sizeof(int32_t) * B * T), *tgt = malloc(sizeof(int32_t) * B * T);
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)((i * 7919 + rank * 104729) % V);
        tgt[i] = (int32_t)((i * 6151 + rank * 7) % V);
    }
    hp_mesh_t mesh;
    CHECK(hp_mesh_from_comm(world, "dp_shard", &mesh));
    hp_optim_config_t oc = hp_optim_default(HP_OPTIM_ADAMW);

    // single-rank memory: the model's full parameters and gradients, AdamW state
    size_t full_p = 0, full_g = 0, full_o = 0;
    {
        hp_model_t m;
        CHECK(hp_model_create(&cfg, B, T, &m));
        hp_optim_t o;
        CHECK(hp_optim_create(&oc, hp_model_params(m), hp_model_num_params(m), &o));
        hp_model_memory(m, &full_p, &full_g, NULL, NULL);
        full_o = hp_optim_state_bytes(o);
        hp_optim_free(o);
        hp_model_destroy(m);
    }
    if (rank == 0) {
        printf("llama3 debugmodel, %d ranks, B=%d T=%d per rank, AdamW, %d timed steps after 2 warm-up, "
               "progress mode %s, OMP threads %s\n\n", W, B, T, steps, hp_comm_get_progress(),
               getenv("OMP_NUM_THREADS") ? getenv("OMP_NUM_THREADS") : "default");
        printf("| mode | step (ms) | compute (ms) | exposed comm (ms) | all-gathers / reduce-scatters per step |\n");
        printf("|---|---:|---:|---:|---:|\n");
    }
    size_t sp = 0, sg = 0, sw = 0, so = 0;
    for (int overlap = 1; overlap >= 0; overlap--) {
        hp_model_t m;
        CHECK(hp_model_create(&cfg, B, T, &m));
        CHECK(hp_model_init_weights(m, 1));
        hp_fsdp_options_t fo = hp_fsdp_default_options();
        fo.overlap = overlap;
        fo.gradient_divide_factor = 1.0;
        hp_fsdp_t f;
        CHECK(hp_fully_shard(m, mesh, &fo, &f));
        hp_optim_t o;
        CHECK(hp_optim_create(&oc, hp_fsdp_params(f), hp_fsdp_num_params(f), &o));
        double total = 0.0, wait = 0.0;
        uint64_t ag = 0, rs = 0;
        for (int s = 0; s < steps + 2; s++) {
            CHECK(hp_barrier(world, NULL));
            hp_fsdp_reset_timers(f);
            hp_comm_counts_reset();
            double t0 = hp_clock_now_seconds();
            CHECK(hp_fsdp_zero_grad(f));
            float l;
            CHECK(hp_model_forward(m, tok, tgt, B, T, (float)(B * T * W), &l));
            CHECK(hp_model_backward(m));
            CHECK(hp_optim_step(o, 1.0));
            double dt = hp_clock_now_seconds() - t0;
            if (s >= 2) {
                total += dt;
                wait += hp_fsdp_comm_wait_seconds(f);
                ag = hp_comm_count(HP_COMM_ALL_GATHER);
                rs = hp_comm_count(HP_COMM_REDUCE_SCATTER);
            }
        }
        // the slowest rank's numbers
        float lf[2] = {(float)(total / steps), (float)(wait / steps)}, gf[2];
        CHECK(hp_all_reduce(lf, gf, 2, HP_F32, HP_MAX, world, NULL));
        if (rank == 0)
            printf("| FSDP overlap %s | %.1f | %.1f | %.1f | %llu / %llu |\n", overlap ? "on" : "off", 1e3 * gf[0],
                   1e3 * (gf[0] - gf[1]), 1e3 * gf[1], (unsigned long long)ag, (unsigned long long)rs);
        hp_fsdp_memory(f, &sp, &sg, &sw);
        so = hp_optim_state_bytes(o);
        hp_optim_free(o);
        hp_fsdp_destroy(f);
        hp_model_destroy(m);
    }
    if (rank == 0) {
        const double Mi = 1048576.0;
        printf("\n| memory per rank | single rank (MiB) | FSDP %d ranks (MiB) | ratio |\n|---|---:|---:|---:|\n", W);
        printf("| parameters | %.2f | %.2f | %.3f |\n", full_p / Mi, sp / Mi, (double)sp / full_p);
        printf("| gradients | %.2f | %.2f | %.3f |\n", full_g / Mi, sg / Mi, (double)sg / full_g);
        printf("| optimizer state | %.2f | %.2f | %.3f |\n", full_o / Mi, so / Mi, (double)so / full_o);
        printf("| transient gather/reduce workspace | - | %.2f | - |\n", sw / Mi);
    }
    hp_mesh_destroy(mesh);
    free(tok);
    free(tgt);
    hp_comm_finalize();
    return 0;
}
