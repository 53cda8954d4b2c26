/* Sharded loading straight from HF safetensors (issue 18 item 4): hp-train's initial load of
 * an HF folder under FSDP 4 (model.flavor = hf) reads on each rank only the rows of its shards
 * (hp_hf_import_counts: the ranks' reads add up to the weights' bytes exactly, a quarter each
 * within one row per tensor), and trains to the same losses, bitwise, as the run that loads the
 * converted DCP checkpoint (hp_hf_convert_to_dcp on the same 4 ranks): the same f32 weights
 * in the same layout give the same arithmetic, so the tolerance is 0. */
// hp-test: ranks 4 timeout 120
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hp_test_tokenizer.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/config.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/trainer.h"

#define STEPS 4
static char ROOT[600], SRC[1024], HF[1300];
static hp_comm_t WORLD;
static int RANK, SIZE;

static void base(hp_config_t *c, const char *run) {
    hp_config_defaults(c);
    snprintf(c->model.name, sizeof c->model.name, "llama3");
    HP_ASSERT(snprintf(c->tokenizer.path, sizeof c->tokenizer.path, "%s/tok.json", ROOT) < (int)sizeof c->tokenizer.path);
    HP_ASSERT(snprintf(c->data.path, sizeof c->data.path, "%s/corpus.txt", ROOT) < (int)sizeof c->data.path);
    snprintf(c->data.format, sizeof c->data.format, "text");
    snprintf(c->data.text_separator, sizeof c->data.text_separator, "percent");
    HP_ASSERT(snprintf(c->job.dump_folder, sizeof c->job.dump_folder, "%s/%s", ROOT, run) < (int)sizeof c->job.dump_folder);
    c->checkpoint.enable = 1;
    c->training.seq_len = 12;
    c->training.local_batch_size = 2;
    c->training.steps = STEPS;
    c->training.seed = 3;
    c->optimizer.lr = 3e-3;
    c->lr_scheduler.warmup_steps = 1;
    c->parallelism.data_parallel_shard_degree = SIZE;
    c->parallelism.data_parallel_replicate_degree = 1;
    c->metrics.peak_flops = -1;
    c->metrics.log_freq = 1000;
}

static void train(hp_config_t *c, double *loss) {
    hp_trainer_t t = NULL;
    HP_CHECK_OK(hp_trainer_create(c, WORLD, &t));
    for (int s = 0; t && s < STEPS; s++) {
        hp_step_stats_t st;
        HP_CHECK_OK(hp_trainer_step(t, &st));
        loss[s] = st.loss;
    }
    hp_trainer_destroy(t);
}

int main(int argc, char **argv) {
    WORLD = hp_test_mpi_init(&argc, &argv, &RANK, &SIZE);
    const char *src = getenv("HP_SOURCE_DIR");
    if (!realpath(src && *src ? src : "..", SRC)) snprintf(SRC, sizeof SRC, "..");
    snprintf(HF, sizeof HF, "%s/tests/data/hf_shapes/llama_kv1_untied", SRC);
    int64_t pid = (int64_t)getpid();
    HP_CHECK_OK(hp_broadcast(&pid, 1, HP_I64, 0, WORLD, NULL));
    snprintf(ROOT, sizeof ROOT, "/tmp/hp_test_hf_sharded_%lld", (long long)pid);
    if (RANK == 0) {
        char cmd[1400];
        snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", ROOT, ROOT);
        HP_ASSERT(system(cmd) == 0);
        static char text[1 << 15];
        size_t n = 0;
        for (int i = 0; i < 200; i++)
            n += (size_t)snprintf(text + n, sizeof text - n, "the quick brown fox %d jumps over the lazy dog.\n%%\n", i);
        char p[700];
        snprintf(p, sizeof p, "%s/corpus.txt", ROOT);
        FILE *f = fopen(p, "w");
        HP_CHECK(f && fwrite(text, 1, n, f) == n, "write %s", p);
        if (f) fclose(f);
        snprintf(p, sizeof p, "%s/tok.json", ROOT);
        hp_test_train_tokenizer_vocab(text, n, 264, p);   /* the folder's vocabulary */
    }
    hp_barrier(WORLD, NULL);

    /* A: straight from the HF folder, the model from its config.json */
    hp_config_t *c = calloc(1, sizeof *c);
    base(c, "run_hf");
    snprintf(c->model.flavor, sizeof c->model.flavor, "hf");
    HP_ASSERT(snprintf(c->checkpoint.initial_load_path, sizeof c->checkpoint.initial_load_path, "%s", HF) < (int)sizeof c->checkpoint.initial_load_path);
    hp_hf_import_counts_t c0, c1;
    hp_hf_import_counts_get(&c0);
    double la[STEPS] = {0}, lb[STEPS] = {0}, lr[STEPS] = {0};
    train(c, la);
    hp_hf_import_counts_get(&c1);
    int64_t mine[2] = {(int64_t)(c1.bytes_read - c0.bytes_read), (int64_t)(c1.bytes_total - c0.bytes_total)}, sum[2];
    HP_CHECK_OK(hp_all_reduce(mine, sum, 2, HP_I64, HP_SUM, WORLD, NULL));
    const int64_t total = mine[1];   /* every rank loads every tensor (its part): the weights' bytes */
    /* the rows of the shards partition every tensor: the reads add up to the bytes exactly;
     * a rank's share is a quarter within one row (of at most 264 x 48 f32) per tensor (20) */
    HP_CHECK(total == 60144 * 4, "bytes of the weights %lld, expected 60144 f32", (long long)total);
    HP_CHECK(sum[0] == total, "the ranks read %lld bytes together, the weights hold %lld", (long long)sum[0],
             (long long)total);
    HP_CHECK(llabs(mine[0] * SIZE - total) <= (int64_t)SIZE * 20 * 48 * 4, "rank %d read %lld of %lld bytes", RANK,
             (long long)mine[0], (long long)total);
    if (RANK == 0) printf("FSDP %d HF initial load: rank 0 read %lld of %lld bytes\n", SIZE, (long long)mine[0], (long long)total);

    /* B: the converted checkpoint (converted on the same ranks), the model by the keys */
    char dcp[800];
    snprintf(dcp, sizeof dcp, "%s/dcp", ROOT);
    hp_model_config_t mc;
    HP_CHECK_OK(hp_hf_read_config(HF, &mc));
    HP_CHECK_OK(hp_hf_convert_to_dcp(HF, hp_model_hf_adapter(&mc), &mc, dcp, WORLD, NULL));
    base(c, "run_dcp");
    snprintf(c->model.flavor, sizeof c->model.flavor, "debugmodel");
    c->model.dim = 48, c->model.n_layers = 2, c->model.n_heads = 4, c->model.n_kv_heads = 1, c->model.head_dim = 12;
    c->model.hidden_dim = 80, c->model.rope_theta = 10000, c->model.rope_scaling = 0, c->model.norm_eps = 1e-6;
    c->model.tie_embeddings = 0;
    HP_ASSERT(snprintf(c->checkpoint.initial_load_path, sizeof c->checkpoint.initial_load_path, "%s", dcp) < (int)sizeof c->checkpoint.initial_load_path);
    train(c, lb);
    for (int s = 0; s < STEPS; s++)
        HP_CHECK(la[s] == lb[s] && isfinite(la[s]), "step %d: loss %.9g from HF, %.9g from the converted DCP", s + 1,
                 la[s], lb[s]);
    /* negative control: without the initial load (random init) the losses differ */
    base(c, "run_rand");
    snprintf(c->model.flavor, sizeof c->model.flavor, "debugmodel");
    c->model.dim = 48, c->model.n_layers = 2, c->model.n_heads = 4, c->model.n_kv_heads = 1, c->model.head_dim = 12;
    c->model.hidden_dim = 80, c->model.rope_theta = 10000, c->model.rope_scaling = 0, c->model.norm_eps = 1e-6;
    c->model.tie_embeddings = 0;
    train(c, lr);
    HP_CHECK(lr[0] != la[0], "a random init gave the HF run's first loss %.9g", la[0]);
    if (RANK == 0) printf("losses HF %.6f %.6f %.6f %.6f, DCP %.6f ..., random init %.6f\n", la[0], la[1], la[2], la[3], lb[0], lr[0]);
    free(c);
    hp_barrier(WORLD, NULL);
    if (RANK == 0 && !getenv("HP_KEEP")) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf %s", ROOT);
        if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", ROOT);
    }
    int rc = hp_test_finish("test_hf_sharded_load");
    hp_comm_finalize();
    return rc;
}
