/* Tensor parallel vs FSDP on the same ranks: per-rank memory and step time of one training
 * step (zero_grad, forward, backward, AdamW) of a model.h model under
 *   single: one rank alone (rank 0, the reference),
 *   tp:     TorchTitan's TP plan over all ranks (sequence parallel + loss_parallel unless
 *           --no-sp), every rank on the same batch (global batch B),
 *   fsdp:   fully_shard over all ranks (FSDP2, reshard after forward), every rank on its own
 *           batch (global batch ranks x B).
 * Memory per rank: parameter, gradient and AdamW state bytes (2 x params), activation arena,
 * workspace (model workspace + TP buffers / FSDP gather workspace). Step time: median of
 * --steps after --warmup; tokens/s counts the global batch.
 *   mpirun -np 2 bench_tp [--model llama3] [--flavor debugmodel] [--batch 2] [--seq 256]
 *                         [--steps 5] [--warmup 2] [--threads 1] [--no-sp] */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyperparallel/comm.h"
#include "hyperparallel/fsdp.h"
#include "hyperparallel/mesh.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/optim.h"
#include "hyperparallel/tp.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define CHECK(expr)                                                                            \
    do {                                                                                       \
        hp_status_t s_ = (expr);                                                               \
        if (s_ != HP_OK) {                                                                     \
            fprintf(stderr, "bench_tp: %s: %s\n", #expr, hp_last_error());                     \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

typedef struct result {
    double step_s, loss;
    uint64_t colls;   /* collectives of one step (barrier excluded) */
    double param_mib, grad_mib, optim_mib, act_mib, work_mib;
} result_t;

static const double MiB = 1024.0 * 1024.0;

/* mode 0 single, 1 tp, 2 fsdp; mesh NULL for single. */
static result_t run(int mode, hp_mesh_t mesh, const hp_model_config_t *cfg, int B, int T, int steps, int warmup,
                    int sp, int data_rank) {
    hp_model_t m = NULL;
    CHECK(hp_model_create(cfg, B, T, &m));
    hp_tp_t tp = NULL;
    hp_fsdp_t fsdp = NULL;
    hp_tp_plan_entry_t plan[32];
    if (mode == 1) {
        int n = hp_model_spec_find(cfg->name)->tp_plan(cfg, sp, sp, plan, 32);
        CHECK(hp_tp_parallelize_model(&tp, m, mesh, plan, n));
    }
    CHECK(hp_model_init_weights(m, 1));
    hp_param_t *params = hp_model_params(m);
    int np = hp_model_num_params(m);
    if (mode == 2) {
        hp_fsdp_options_t fo = hp_fsdp_default_options();
        fo.gradient_divide_factor = 1.0;
        CHECK(hp_fully_shard(m, mesh, &fo, &fsdp));
        params = hp_fsdp_params(fsdp);
        np = hp_fsdp_num_params(fsdp);
    }
    hp_optim_config_t oc = hp_optim_default(HP_OPTIM_ADAMW);
    oc.lr = 1e-3;
    hp_optim_t opt = NULL;
    CHECK(hp_optim_create(&oc, params, np, &opt));
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B * T), *tgt = malloc(sizeof(int32_t) * (size_t)B * T);
    uint32_t x = 99u + 7919u * (uint32_t)data_rank;
    for (int i = 0; i < B * T; i++) {
        x = x * 1664525u + 1013904223u;
        tok[i] = (int32_t)((x >> 8) % (uint32_t)cfg->vocab_size);
    }
    for (int i = 0; i < B * T; i++) tgt[i] = tok[(i + 1) % (B * T)];
    double *times = malloc(sizeof(double) * (size_t)(steps > 0 ? steps : 1));
    result_t r;
    memset(&r, 0, sizeof(r));
    const int global_ranks = mode == 2 ? (int)hp_mesh_size(mesh, 0) : 1;
    for (int s = 0; s < warmup + steps; s++) {
        if (mesh) CHECK(hp_barrier(hp_mesh_get_comm(mesh, 0), NULL));
        hp_comm_counts_reset();
        double t0 = hp_clock_now_seconds();
        CHECK(hp_model_zero_grad(m));
        if (fsdp) CHECK(hp_fsdp_zero_grad(fsdp));
        float loss = 0;
        CHECK(hp_model_forward(m, tok, tgt, B, T, (float)(B * T * global_ranks), &loss));
        CHECK(hp_model_backward(m));
        CHECK(hp_optim_step(opt, 1.0));
        double dt = hp_clock_now_seconds() - t0;
        if (s >= warmup) times[s - warmup] = dt;
        r.colls = hp_comm_count_total() - hp_comm_count(HP_COMM_BARRIER);
        r.loss = loss;
    }
    qsort(times, (size_t)steps, sizeof(double), cmp_double);
    r.step_s = times[steps / 2];
    size_t pb = 0, gb = 0, ab = 0, wb = 0;
    hp_model_memory(m, &pb, &gb, &ab, &wb);
    if (fsdp) {
        size_t fw = 0;
        hp_fsdp_memory(fsdp, &pb, &gb, &fw);
        wb += fw;
    }
    if (tp) wb += hp_tp_buffer_bytes(tp);
    size_t local_params = 0;
    for (int i = 0; i < np; i++) local_params += sizeof(float) * (size_t)hp_tensor_numel(&params[i].value.local);
    r.param_mib = (double)pb / MiB;
    r.grad_mib = (double)gb / MiB;
    r.optim_mib = 2.0 * (double)local_params / MiB;
    r.act_mib = (double)ab / MiB;
    r.work_mib = (double)wb / MiB;
    free(times);
    free(tok);
    free(tgt);
    hp_optim_free(opt);
    hp_fsdp_destroy(fsdp);
    hp_tp_destroy(tp);
    hp_model_destroy(m);
    return r;
}

int main(int argc, char **argv) {
    const char *model = "llama3", *flavor = "debugmodel";
    int B = 2, T = 256, steps = 5, warmup = 2, threads = 1, sp = 1;
    hp_comm_t world;
    CHECK(hp_comm_init(&argc, &argv, &world));
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--flavor") && i + 1 < argc) flavor = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seq") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-sp")) sp = 0;
        else {
            fprintf(stderr, "bench_tp: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (steps < 1) steps = 1;
    omp_set_num_threads(threads);
    const int rank = hp_comm_rank(world), W = hp_comm_size(world);
    hp_model_config_t cfg;
    CHECK(hp_model_flavor(model, flavor, &cfg));
    cfg.max_seq_len = T;
    hp_mesh_t mesh = NULL;
    int64_t shape[1] = {W};
    const char *names[1] = {"x"};
    CHECK(hp_mesh_create(world, 1, shape, names, &mesh));
    result_t res[3];
    memset(res, 0, sizeof(res));
    hp_comm_t solo = NULL;
    CHECK(hp_comm_split(world, rank == 0 ? 0 : -1, 0, &solo));
    if (rank == 0) res[0] = run(0, NULL, &cfg, B, T, steps, warmup, sp, 0);
    if (solo) hp_comm_destroy(solo);
    // the other ranks wait sleeping (a spinning MPI barrier would take a core from rank 0)
    hp_work_t bw = NULL;
    CHECK(hp_barrier(world, &bw));
    for (int done = 0; !done;) {
        CHECK(hp_work_test(&bw, &done));
        if (!done) nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    if (W > 1) {
        res[1] = run(1, mesh, &cfg, B, T, steps, warmup, sp, 0);
        res[2] = run(2, mesh, &cfg, B, T, steps, warmup, sp, rank);
    }
    if (rank == 0) {
        printf("bench_tp: %s/%s B=%d T=%d, %d ranks, %d OpenMP thread(s) per rank, median of %d steps "
               "(zero_grad + forward + backward + AdamW)\n", model, flavor, B, T, W, threads, steps);
        printf("%-22s %9s %11s %8s %8s %8s %8s %8s %8s %6s\n", "layout", "step ms", "tokens/s", "params", "grads",
               "adamw", "activ", "work", "total", "colls");
        const char *label[3] = {"single rank", "TP", "FSDP"};
        char lab[64];
        for (int k = 0; k < (W > 1 ? 3 : 1); k++) {
            const result_t *r = &res[k];
            int gb = k == 2 ? W * B : B;
            if (k == 1) snprintf(lab, sizeof lab, "TP%d%s", W, sp ? " (SP, loss_par)" : "");
            else if (k == 2) snprintf(lab, sizeof lab, "FSDP%d", W);
            else snprintf(lab, sizeof lab, "%s", label[k]);
            printf("%-22s %9.1f %11.0f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %6llu\n", lab, 1e3 * r->step_s,
                   (double)gb * T / r->step_s, r->param_mib, r->grad_mib, r->optim_mib, r->act_mib, r->work_mib,
                   r->param_mib + r->grad_mib + r->optim_mib + r->act_mib + r->work_mib, (unsigned long long)r->colls);
        }
        printf("(memory in MiB per rank; tokens/s over the global batch: TP %d x %d, FSDP %d x %d x %d; colls: "
               "collectives per step on this rank)\n", B, T, W, B, T);
    }
    hp_mesh_destroy(mesh);
    hp_comm_finalize();
    return 0;
}
