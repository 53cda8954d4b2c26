/* Memory per rank vs ranks, layout and activation checkpointing, predicted beside measured
 * (issue 26; docs/memory.md, docs/performance.md "Memory per rank (bench/memory)"). Each row is
 * one hp-train run of its own processes (a fresh peak resident set per rank): the memory plan's
 * prediction (made before the model exists) and, per rank, the measured peak RSS (VmHWM) and
 * the peak of the library's allocations, from hp-train's end-of-run "memory rank" lines. The
 * model: llama3 with dim 1024, 16 layers, 16 heads, 8 KV heads (~200 M parameters), seq 64,
 * global batch 4, 2 steps, 1 thread per rank. Rows: FSDP 1 / 2 / 4, TP 2 x FSDP 2, PP 2 x FSDP 2,
 * each with AC none / full / selective 2, FSDP 4 also with op-level SAC and memory_budget 0.5, and FSDP 4 starting from a DCP checkpoint and from an
 * HF folder (checkpoint.initial_load_path: each rank reads its shards from the files).
 *   build/bench_memory --tokenizer TOKENIZER.json [--corpus FILE] [--build build] [--rows all|quick]
 *       [--work DIR]
 * Prints a markdown table. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hyperparallel/tokenizer.h"

typedef struct row {
    const char *layout;
    int np, shard, tp, pp;
    const char *ac;    /* none | full | selective (every 2nd block) | op (op-level SAC) | budget (memory_budget 0.5) */
    const char *load;  /* NULL, "dcp" or "hf" */
} row_t;

typedef struct result {
    int ranks;
    double pred, rss, alloc_pred, alloc, worst;   /* GiB; worst: the largest |error| over ranks (%) */
    int ok;
} result_t;

static const char *g_build = "build", *g_tok = NULL, *g_corpus = NULL, *g_work = "/tmp/hp_bench_memory";

#define MODEL_FLAGS "--model.dim=1024 --model.n_layers=16 --model.n_heads=16 --model.n_kv_heads=8"

static int run_cmd(const char *cmd) {
    fprintf(stderr, "$ %s\n", cmd);
    return system(cmd);
}

/* One row: hp-train, its "memory rank" lines parsed. */
static result_t run_row(const row_t *r) {
    result_t res = {0};
    char cmd[4096], extra[1024] = "";
    if (r->load) {
        snprintf(extra, sizeof extra, " --checkpoint.enable=true --checkpoint.folder=%s/ckpt_run "
                 "--checkpoint.interval=1000 --checkpoint.initial_load_path=%s/%s", g_work, g_work,
                 !strcmp(r->load, "dcp") ? "seed" : "hf");
        snprintf(cmd, sizeof cmd, "rm -rf %s/ckpt_run", g_work);
        run_cmd(cmd);
    }
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 %s/hp-train --nproc %d --config examples/llama3_debug.yaml "
             MODEL_FLAGS " --training.seq_len=64 --training.global_batch_size=4 --training.local_batch_size=%d "
             "--training.steps=2 --parallelism.data_parallel_replicate_degree=1 "
             "--parallelism.data_parallel_shard_degree=%d --parallelism.tensor_parallel_degree=%d "
             "--parallelism.pipeline_parallel_degree=%d --parallelism.pipeline_parallel_microbatch_size=1 "
             "--activation_checkpoint.mode=%s --activation_checkpoint.selective_ac_option=%s "
             "--activation_checkpoint.memory_budget=0.5 "
             "--tokenizer.path=%s --data.path=%s --validation.enable=false --metrics.log_freq=1 "
             "--metrics.enable_tensorboard=false --checkpoint.enable=false --job.dump_folder= "
             "--job.print_config=false%s 2>&1",
             g_build, r->np, 4 / (r->shard), r->shard, r->tp, r->pp,
             !strcmp(r->ac, "op") ? "selective" : !strcmp(r->ac, "budget") ? "memory_budget" : r->ac,
             !strcmp(r->ac, "op") ? "op" : "2", g_tok, g_corpus, extra);
    fprintf(stderr, "$ %s\n", cmd);
    FILE *p = popen(cmd, "r");
    if (!p) return res;
    char line[4096];
    while (fgets(line, sizeof line, p)) {
        const char *m = strstr(line, "memory rank ");
        int rank;
        double pred, rss, e, ap, am, ae;
        if (m && sscanf(m, "memory rank %d: predicted peak %lf GiB, measured peak RSS %lf GiB (prediction %lf%%); "
                           "library allocations: predicted %lf GiB, measured peak %lf GiB (%lf%%)",
                        &rank, &pred, &rss, &e, &ap, &am, &ae) == 7) {
            res.ranks++;
            res.pred = fmax(res.pred, pred);
            res.rss = fmax(res.rss, rss);
            res.alloc_pred = fmax(res.alloc_pred, ap);
            res.alloc = fmax(res.alloc, am);
            if (fabs(e) > fabs(res.worst)) res.worst = e;
        }
        if (strstr(line, "error")) fputs(line, stderr);
    }
    res.ok = pclose(p) == 0 && res.ranks == r->np;
    return res;
}

/* The checkpoints the load rows start from: a DCP seed checkpoint and its HF export (one rank,
 * hp-ckpt, the tools' one-rank path). */
static int make_checkpoints(void) {
    char cmd[2048];
    struct stat sb;
    snprintf(cmd, sizeof cmd, "%s/hf/config.json", g_work);
    if (stat(cmd, &sb) == 0) return 0;
    hp_tokenizer_t tok = NULL;   // the model's vocabulary follows the tokenizer, as in hp-train
    if (hp_tokenizer_load(&tok, g_tok) != HP_OK) {
        fprintf(stderr, "bench_memory: %s\n", hp_last_error());
        return 1;
    }
    const int vocab = hp_tokenizer_vocab_size(tok);
    hp_tokenizer_free(tok);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && rm -rf %s/seed %s/hf && %s/hp-ckpt seed %s/seed --model llama3 --flavor "
             "debugmodel --vocab %d --seed 0 --model.dim 1024 --model.n_layers 16 --model.n_heads 16 "
             "--model.n_kv_heads 8 > /dev/null && %s/hp-ckpt to-hf %s/seed %s/hf --model llama3 --flavor "
             "debugmodel --model.dim 1024 --model.n_layers 16 --model.n_heads 16 --model.n_kv_heads 8 > /dev/null",
             g_work, g_work, g_work, g_build, g_work, vocab, g_build, g_work, g_work);
    return run_cmd(cmd);
}

int main(int argc, char **argv) {
    const char *rows_sel = "all";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--build")) g_build = argv[i + 1];
        else if (!strcmp(argv[i], "--tokenizer")) g_tok = argv[i + 1];
        else if (!strcmp(argv[i], "--corpus")) g_corpus = argv[i + 1];
        else if (!strcmp(argv[i], "--rows")) rows_sel = argv[i + 1];
        else if (!strcmp(argv[i], "--work")) g_work = argv[i + 1];
        else {
            fprintf(stderr, "unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (!g_tok) {
        fprintf(stderr, "usage: bench_memory --tokenizer TOKENIZER.json [--corpus FILE] [--build build] "
                        "[--rows all|quick] [--work DIR]\n");
        return 2;
    }
    if (!g_corpus) g_corpus = "/usr/share/games/fortunes";
    static const row_t all[] = {
        {"FSDP 1 (1 rank)", 1, 1, 1, 1, "none", NULL},   {"FSDP 1 (1 rank)", 1, 1, 1, 1, "full", NULL},
        {"FSDP 1 (1 rank)", 1, 1, 1, 1, "selective", NULL}, {"FSDP 2", 2, 2, 1, 1, "none", NULL},
        {"FSDP 2", 2, 2, 1, 1, "full", NULL},             {"FSDP 2", 2, 2, 1, 1, "selective", NULL},
        {"FSDP 4", 4, 4, 1, 1, "none", NULL},             {"FSDP 4", 4, 4, 1, 1, "full", NULL},
        {"FSDP 4", 4, 4, 1, 1, "selective", NULL},        {"FSDP 4", 4, 4, 1, 1, "op", NULL},
        {"FSDP 4", 4, 4, 1, 1, "budget", NULL},           {"TP 2 x FSDP 2", 4, 2, 2, 1, "none", NULL},
        {"TP 2 x FSDP 2", 4, 2, 2, 1, "full", NULL},      {"TP 2 x FSDP 2", 4, 2, 2, 1, "selective", NULL},
        {"PP 2 x FSDP 2", 4, 2, 1, 2, "none", NULL},      {"PP 2 x FSDP 2", 4, 2, 1, 2, "full", NULL},
        {"PP 2 x FSDP 2", 4, 2, 1, 2, "selective", NULL}, {"FSDP 4, load DCP", 4, 4, 1, 1, "none", "dcp"},
        {"FSDP 4, load HF", 4, 4, 1, 1, "none", "hf"},
    };
    const int quick = !strcmp(rows_sel, "quick");
    const int n = (int)(sizeof all / sizeof all[0]);
    if (!quick && make_checkpoints() != 0) {
        fprintf(stderr, "bench_memory: making the checkpoints failed\n");
        return 1;
    }
    printf("| layout | AC | ranks | predicted peak (GiB) | measured peak RSS (GiB, max over ranks) | worst error | "
           "library allocations predicted / measured (GiB) | vs 1 rank, AC none |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    double one = 0.0;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (quick && (strcmp(all[i].ac, "none") || all[i].load)) continue;
        const result_t r = run_row(&all[i]);
        if (i == 0) one = r.rss;
        if (!r.ok) bad++;
        const char *ac = !strcmp(all[i].ac, "selective") ? "selective 2"
                         : !strcmp(all[i].ac, "op")     ? "selective op"
                         : !strcmp(all[i].ac, "budget") ? "memory_budget 0.5"
                                                        : all[i].ac;
        printf("| %s | %s | %d | %.3f | %.3f | %+.1f%% | %.3f / %.3f | %.3fx |%s\n", all[i].layout, ac, all[i].np,
               r.pred, r.rss, r.worst, r.alloc_pred, r.alloc, one > 0 ? r.rss / one : 0.0, r.ok ? "" : " (run failed)");
        fflush(stdout);
    }
    return bad ? 1 : 0;
}
