/* Errors raised on a rank other than 0 reach the user's terminal, and ranks agree on failure
 * before the next collective: hp-train under mpirun (2 ranks) with rank 1's checkpoint shard
 * truncated, a token id >= vocab in rank 1's slice of a .bin file, invalid UTF-8 in rank 1's
 * half of a text corpus; each run must end quickly (HP_COMM_TIMEOUT is 20 s here, so a hang
 * fails rather than waits 300 s) with rank 1's own message, naming the file, on stderr. Also
 * (1 rank): unusable output paths stop the run before the first step naming the config key,
 * and the start-up line names the MFU peak (the configured figure is used). This program is
 * the driver; it launches build/hp-train. */
// hp-test: ranks 1 timeout 300
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hp_test.h"
#include "hp_test_tokenizer.h"
#include "hyperparallel/tokenizer.h"

static char dir_[256], corpus_[320], tok_[320], train_[512], mpirun_[512];
static char out_[1 << 17];

static const char *const sentences_[] = {
    "the quick brown fox jumps over the lazy dog",
    "a journey of a thousand miles begins with a single step",
    "all that glitters is not gold",
    "the early bird catches the worm",
};

/* Runs cmd (stdout and stderr together) into out_; returns the exit code, *secs the time. */
static int run(const char *cmd, double *secs) {
    double t0 = hp_clock_now_seconds();
    int rc = hp_test_run_capture(cmd, out_, sizeof out_);
    if (secs) *secs = hp_clock_now_seconds() - t0;
    return rc > 128 ? 128 : rc;
}

/* hp-train on np ranks with the shared small-model flags plus `extra`. */
static int train(int np, const char *extra, double *secs) {
    char cmd[8192];
    const char *base = "--job.print_config=false --model.name=llama3 --model.flavor=debugmodel --training.seq_len=32 "
                       "--training.local_batch_size=2 --training.seed=3 --metrics.log_freq=1";
    if (np > 1)
        snprintf(cmd, sizeof cmd, "HP_COMM_TIMEOUT=20 %s --oversubscribe --bind-to none %s -x HP_COMM_TIMEOUT -np %d "
                 "'%s' %s --parallelism.data_parallel_replicate_degree=%d --tokenizer.path=%s %s 2>&1",
                 mpirun_, geteuid() == 0 ? "--allow-run-as-root" : "", np, train_, base, np, tok_, extra);
    else
        snprintf(cmd, sizeof cmd, "HP_COMM_TIMEOUT=20 '%s' %s --tokenizer.path=%s %s 2>&1", train_, base, tok_, extra);
    return run(cmd, secs);
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    HP_CHECK(f && fwrite(data, 1, n, f) == n, "cannot write %s", path);
    if (f) fclose(f);
}

/* 400 '%'-separated documents, two lines each; document `bad_doc` (if >= 0) gets a 0xff byte. */
static size_t make_corpus(const char *path, int bad_doc, int64_t *bad_line) {
    static char text[1 << 16];
    size_t n = 0;
    int64_t line = 1;
    for (int d = 0; d < 400; d++) {
        const char *s1 = sentences_[(d * d + d / 3) % 4], *s2 = sentences_[(d + 1) % 4];
        if (d == bad_doc) {
            n += (size_t)snprintf(text + n, sizeof text - n, "%s\n%s \xff.\n%%\n", s1, s2);
            *bad_line = line + 1;
        } else {
            n += (size_t)snprintf(text + n, sizeof text - n, "%s\n%s.\n%%\n", s1, s2);
        }
        line += 3;
    }
    write_file(path, text, n);
    return n;
}

/* 1. rank 1's checkpoint shard truncated or missing: an explicit checkpoint.load_step fails
 * at once with a message naming the file, and nothing saved is touched; the default resume
 * falls back to the newest complete step with a warning naming the file */
static void test_checkpoint_shard(void) {
    char dump[400], extra[2048], shard[600], again[2200];
    snprintf(dump, sizeof dump, "%s/ckpt_run", dir_);
    snprintf(extra, sizeof extra, "--data.path=%s --data.format=text --data.text_separator=percent "
             "--metrics.peak_flops=-1 --job.dump_folder=%s --checkpoint.enable --checkpoint.interval=1 "
             "--checkpoint.last_save_model_only=false --training.steps=2", corpus_, dump);
    double secs;
    int rc = train(2, extra, &secs);
    HP_CHECK(rc == 0, "first run exit %d:\n%s", rc, out_);
    snprintf(shard, sizeof shard, "%s/checkpoint/step-2/__1_0.safetensors", dump);
    struct stat sb;
    HP_CHECK(stat(shard, &sb) == 0 && sb.st_size > 64, "no shard %s", shard);
    HP_CHECK(truncate(shard, sb.st_size / 2) == 0, "truncate %s", shard);
    snprintf(again, sizeof again, "%s --training.steps=3 --checkpoint.load_step=2", extra);
    rc = train(2, again, &secs);
    HP_CHECK(rc != 0 && strstr(out_, "hp-train: error: rank ") && strstr(out_, "step-2") &&
             strstr(out_, "__1_0.safetensors is truncated") && secs < 18,
             "truncated shard: exit %d after %.1f s, expected a message naming %s:\n%s", rc, secs, shard, out_);
    HP_CHECK(!strstr(out_, "timeout"), "truncated shard: the ranks waited for a timeout:\n%s", out_);
    /* nothing else lost: rank 0's shard and the metadata are still there */
    char other[600];
    snprintf(other, sizeof other, "%s/checkpoint/step-2/__0_0.safetensors", dump);
    HP_CHECK(stat(other, &sb) == 0 && sb.st_size > 64, "rank 0's shard %s is gone", other);
    unlink(shard);
    rc = train(2, again, &secs);
    HP_CHECK(rc != 0 && strstr(out_, "hp-train: error: rank ") && strstr(out_, "__1_0.safetensors") && secs < 18,
             "missing shard: exit %d after %.1f s:\n%s", rc, secs, out_);
    /* the default resume: step-2 is incomplete, so it resumes from step-1 and says why */
    snprintf(again, sizeof again, "%s --training.steps=3", extra);
    rc = train(2, again, &secs);
    HP_CHECK(rc == 0 && strstr(out_, "__1_0.safetensors") && strstr(out_, "step-1"),
             "fallback: exit %d, expected a warning naming the missing shard and a resume from step-1:\n%s", rc, out_);
}

/* 2. a token id >= vocab in rank 1's half of a .bin file: found in the first step, agreed */
static void test_bin_token(void) {
    char bin[400], extra[2048], want[600];
    snprintf(bin, sizeof bin, "%s/tokens.bin", dir_);
    enum { N = 2000 };
    uint16_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (uint16_t)(5 + i % 200);
    ids[N / 2 + 10] = 60000;   /* rank 1's shard is [1000, 2000); its first window holds this */
    write_file(bin, ids, sizeof ids);
    snprintf(extra, sizeof extra, "--data.path=%s --data.format=bin --metrics.peak_flops=-1 --job.dump_folder= "
             "--training.steps=3", bin);
    double secs;
    int rc = train(2, extra, &secs);
    snprintf(want, sizeof want, "hp-train: error: rank 1: data file '%s': token %d has id 60000", bin, N / 2 + 10);
    HP_CHECK(rc != 0 && strstr(out_, want) && !strstr(out_, "timeout") && secs < 18,
             "bad token: exit %d after %.1f s, expected '%s':\n%s", rc, secs, want, out_);
}

/* 3. invalid UTF-8 in rank 1's half of a text corpus: names the data file and line, not the tokenizer */
static void test_text_utf8(void) {
    char bad[400], extra[2048], want[700];
    snprintf(bad, sizeof bad, "%s/bad_utf8.txt", dir_);
    int64_t line = 0;
    make_corpus(bad, 200, &line);   /* rank 1's shard starts at document 200 */
    snprintf(extra, sizeof extra, "--data.path=%s --data.format=text --data.text_separator=percent "
             "--metrics.peak_flops=-1 --job.dump_folder= --training.steps=3", bad);
    double secs;
    int rc = train(2, extra, &secs);
    snprintf(want, sizeof want, "hp-train: error: rank 1: data file '%s': line %lld: invalid UTF-8", bad,
             (long long)line);
    HP_CHECK(rc != 0 && strstr(out_, want) && !strstr(out_, "timeout") && secs < 18,
             "bad UTF-8: exit %d after %.1f s, expected '%s':\n%s", rc, secs, want, out_);
    HP_CHECK(!strstr(out_, "tokenizer.json: encode"), "bad UTF-8 blamed on the tokenizer file:\n%s", out_);
}

/* 4. unusable output paths stop the run before the first step, naming the key; the file in the
 * way is untouched */
static void test_output_paths(void) {
    char file[400], extra[2048], want[700];
    snprintf(file, sizeof file, "%s/not_a_folder", dir_);
    write_file(file, "keep me\n", 8);
    struct {
        const char *flags, *key, *problem;
    } cases[] = {
        {"--job.dump_folder=%s", "job.dump_folder = '%s'", "exists and is not a folder"},
        {"--job.dump_folder=%s/ok --checkpoint.enable --checkpoint.folder=%s", "checkpoint.folder = '%s'",
         "exists and is not a folder"},
        {"--job.dump_folder=%s/ok --metrics.enable_tensorboard --metrics.save_tb_folder=%s/tb",
         "metrics.save_tb_folder = '%s/tb'", "cannot create folder"},
        {"--job.dump_folder=%s/ok --metrics.jsonl_file=%s/m.jsonl", "metrics.jsonl_file = '%s/m.jsonl'",
         "exists and is not a folder"},
    };
    for (int i = 0; i < 4; i++) {
        char flags[1200];
        if (i == 0) snprintf(flags, sizeof flags, cases[i].flags, file);
        else snprintf(flags, sizeof flags, cases[i].flags, dir_, file);
        snprintf(extra, sizeof extra, "--data.path=%s --data.format=text --data.text_separator=percent "
                 "--metrics.peak_flops=-1 --training.steps=2 %s", corpus_, flags);
        snprintf(want, sizeof want, cases[i].key, file);
        int np = i == 0 ? 2 : 1;
        double secs;
        int rc = train(np, extra, &secs);
        HP_CHECK(rc != 0 && strstr(out_, want) && strstr(out_, cases[i].problem) && !strstr(out_, "step:") &&
                     !strstr(out_, "timeout"),
                 "case %d (%d ranks): exit %d, expected '%s' ... '%s' before any step:\n%s", i, np, rc, want,
                 cases[i].problem, out_);
    }
    char buf[32] = {0};
    FILE *f = fopen(file, "r");
    HP_CHECK(f && fread(buf, 1, sizeof buf - 1, f) == 8 && !strcmp(buf, "keep me\n"), "the file in the way changed");
    if (f) fclose(f);
}

/* 5. the start-up line names the MFU peak (configured, or the measured FMA peak with the sgemm
 * peak beside it) and the GEMM kernels; a configured figure is the one used */
static void test_mfu_figure(void) {
    char extra[2048];
    snprintf(extra, sizeof extra, "--data.path=%s --data.format=text --data.text_separator=percent "
             "--job.dump_folder= --training.steps=1 --metrics.peak_flops=2e12", corpus_);
    double secs;
    int rc = train(1, extra, &secs);
    HP_CHECK(rc == 0 && strstr(out_, "mfu: peak 2e+12 FLOP/s per rank, as configured (metrics.peak_flops)"),
             "configured peak: exit %d:\n%s", rc, out_);
    /* tflops x 1e12 / 2e12 = mfu: the step line divides by the configured figure */
    const char *p = strstr(out_, "tflops:"), *q = strstr(out_, "mfu: ");
    while (q && !strchr("0123456789", q[5])) q = strstr(q + 1, "mfu: ");
    double tf = p ? atof(p + 7) : -1, mfu = q ? atof(q + 5) : -1;
    /* the line prints tflops to 3 decimals (+-0.0005, i.e. +-0.025 points of mfu against 2e12)
     * and mfu to 2 (+-0.005): the bound is their printing error, so a slow (sanitized) build
     * whose tflops has one significant digit passes too */
    HP_CHECK(p && q && mfu >= 0 && fabs(mfu - 100.0 * tf * 1e12 / 2e12) <= 100.0 * 0.0005e12 / 2e12 + 0.005 + 1e-9,
             "step line tflops %g, mfu %g%%: not divided by 2e12:\n%s", tf, mfu, out_);
    snprintf(extra, sizeof extra, "--data.path=%s --data.format=text --data.text_separator=percent "
             "--job.dump_folder= --training.steps=1 --metrics.peak_flops=0", corpus_);
    rc = train(1, extra, &secs);
    HP_CHECK(rc == 0 && strstr(out_, "FLOP/s per rank, the f32 FMA peak of its") && strstr(out_, "the sgemm peak"),
             "measured peak: exit %d:\n%s", rc, out_);
    /* the start-up line names the GEMM kernels; the step line shows the sgemm figure beside MFU */
    HP_CHECK(strstr(out_, "GEMM: ") && strstr(out_, " kernels (") && strstr(out_, "(sgemm "),
             "measured peak: no GEMM line or sgemm figure:\n%s", out_);
    q = strstr(out_, "mfu: ");
    while (q && !strchr("0123456789", q[5])) q = strstr(q + 1, "mfu: ");
    mfu = q ? atof(q + 5) : -1;
    HP_CHECK(q && mfu >= 0 && mfu <= 100, "measured peak: the step line prints mfu %g%%:\n%s", mfu, out_);
}

int main(void) {
    if (!hp_test_built_program(train_, sizeof train_, "hp-train")) return 0;
    const char *m = getenv("HP_MPIEXEC");
    snprintf(mpirun_, sizeof mpirun_, "%s",
             m && *m ? m : access("/usr/bin/mpirun", X_OK) == 0 ? "/usr/bin/mpirun" : "mpirun");
    snprintf(dir_, sizeof dir_, "/tmp/hp_test_rank_errors_XXXXXX");
    HP_ASSERT(mkdtemp(dir_));
    snprintf(corpus_, sizeof corpus_, "%s/corpus.txt", dir_);
    snprintf(tok_, sizeof tok_, "%s/tokenizer.json", dir_);
    int64_t unused = 0;
    make_corpus(corpus_, -1, &unused);
    {
        FILE *f = fopen(corpus_, "rb");
        static char text[1 << 16];
        size_t n = f ? fread(text, 1, sizeof text, f) : 0;
        if (f) fclose(f);
        hp_test_train_tokenizer(text, n, tok_);
    }
    test_checkpoint_shard();
    test_bin_token();
    test_text_utf8();
    test_output_paths();
    test_mfu_figure();
    if (!getenv("HP_KEEP")) hp_test_remove_dir(dir_);
    return hp_test_finish("test_rank_errors");
}
