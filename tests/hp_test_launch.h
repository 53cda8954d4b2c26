/* Helpers of the tests that run hp-train under its launcher and break it (test_launch.c, the
 * multihost tests): a job whose output is read as it comes (to act when a line shows), the
 * live processes of a job found by a text on their command line, a small corpus with its
 * tokenizer and config, and bitwise comparison of two runs (losses, norms, final weights). */
#ifndef HP_TEST_LAUNCH_H
#define HP_TEST_LAUNCH_H

#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hp_test.h"
#include "hp_test_tokenizer.h"
#include "hyperparallel/file.h"

typedef struct hp_test_job {
    pid_t pid;
    int fd;
    char out[1 << 18];
    size_t len;
    double t0, t_end;
    int status;   /* exit code, 256 + signal, -1 while running */
} hp_test_job_t;

/* Starts argv with stdout and stderr into the job's buffer, in a process group of its own. */
static inline void hp_test_job_start(hp_test_job_t *j, char *const argv[]) {
    int p[2];
    HP_ASSERT(pipe(p) == 0);
    j->len = 0;
    j->out[0] = '\0';
    j->status = -1;
    j->t0 = hp_clock_now_seconds();
    j->pid = fork();
    HP_ASSERT(j->pid >= 0);
    if (j->pid == 0) {
        setpgid(0, 0);
        dup2(p[1], 1);
        dup2(p[1], 2);
        close(p[0]);
        close(p[1]);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    j->fd = p[0];
}

/* Reads output for up to `secs`; stops early when `text` (may be NULL) shows. Returns 1 when
 * the text showed, 0 otherwise. */
static inline int hp_test_job_read(hp_test_job_t *j, const char *text, double secs) {
    double end = hp_clock_now_seconds() + secs;
    for (;;) {
        if (text && strstr(j->out, text)) return 1;
        double left = end - hp_clock_now_seconds();
        if (left <= 0 || j->fd < 0) return 0;
        struct pollfd pf = {j->fd, POLLIN, 0};
        if (poll(&pf, 1, (int)(left * 1000) + 1) <= 0) continue;
        char buf[4096];
        ssize_t r = read(j->fd, buf, sizeof buf);
        if (r <= 0) {
            close(j->fd);
            j->fd = -1;
            continue;
        }
        size_t n = (size_t)r;
        if (j->len + n + 1 >= sizeof j->out) {   /* keep the tail: the messages come last */
            size_t drop = j->len + n + 1 - sizeof j->out + sizeof j->out / 4;
            if (drop > j->len) drop = j->len;
            memmove(j->out, j->out + drop, j->len - drop);
            j->len -= drop;
        }
        memcpy(j->out + j->len, buf, n);
        j->len += n;
        j->out[j->len] = '\0';
    }
}

/* Reads to the end and reaps the job (SIGKILL to its group after `secs`); returns its status. */
static inline int hp_test_job_finish(hp_test_job_t *j, double secs) {
    double end = hp_clock_now_seconds() + secs;
    hp_test_job_read(j, NULL, secs);
    int st = 0;
    pid_t w;
    /* the output ends (EOF) a moment before the process does */
    while ((w = waitpid(j->pid, &st, WNOHANG)) == 0 && hp_clock_now_seconds() < end) usleep(20 * 1000);
    if (w == 0) {
        kill(-j->pid, SIGKILL);
        HP_CHECK(0, "the job did not end within %.0f s; killed", secs);
        waitpid(j->pid, &st, 0);
    }
    if (j->fd >= 0) close(j->fd);
    j->fd = -1;
    j->t_end = hp_clock_now_seconds();
    j->status = WIFEXITED(st) ? WEXITSTATUS(st) : 256 + WTERMSIG(st);
    return j->status;
}

/* The last n bytes of a job's output, for failure messages. */
static inline const char *hp_test_job_tail(const hp_test_job_t *j, size_t n) {
    return j->len > n ? j->out + j->len - n : j->out;
}

/* Live (not zombie) processes whose command line contains `needle`; with env_rank >= 0 only
 * the MPI rank env_rank (OMPI_COMM_WORLD_RANK). Fills pids[cap], returns the count. */
static inline int hp_test_procs(const char *needle, int env_rank, pid_t *pids, int cap) {
    DIR *d = opendir("/proc");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0 || pid == getpid()) continue;
        char path[64], buf[8192];
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t r = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[r] = '\0';
        const char *close_paren = strrchr(buf, ')');
        if (!close_paren || close_paren[2] == 'Z' || close_paren[2] == 'X') continue;
        snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
        f = fopen(path, "r");
        if (!f) continue;
        r = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        for (size_t i = 0; i < r; i++)
            if (!buf[i]) buf[i] = ' ';
        buf[r] = '\0';
        if (!strstr(buf, needle)) continue;
        if (env_rank >= 0) {
            snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
            f = fopen(path, "r");
            if (!f) continue;
            r = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[r] = '\0';
            char want[64];
            int wl = snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", env_rank), hit = 0;
            for (size_t i = 0; i + (size_t)wl <= r && !hit; i += strlen(buf + i) + 1)
                hit = !strcmp(buf + i, want);
            if (!hit) continue;
        }
        if (n < cap) pids[n] = pid;
        n++;
    }
    if (d) closedir(d);
    return n;
}

/* Waits up to `secs` for no live process with `needle` on its command line; returns how many
 * are left. */
static inline int hp_test_procs_gone(const char *needle, double secs) {
    pid_t pids[64];
    double end = hp_clock_now_seconds() + secs;
    int n;
    while ((n = hp_test_procs(needle, -1, pids, 64)) > 0 && hp_clock_now_seconds() < end) usleep(100 * 1000);
    return n;
}

/* A corpus of 300 short documents, its 320-token tokenizer and a tiny llama3 config under
 * root: root/corpus.txt, root/tokenizer.json, root/cfg.yaml. extra: more YAML (sections after
 * the ones written here, e.g. "checkpoint:\n  enable: true\n"). */
static inline void hp_test_launch_setup(const char *root, const char *extra, char *cfg, size_t cap) {
    char corpus[700], tok[700];
    hp_test_short_corpus(root, corpus, tok, sizeof corpus);
    snprintf(cfg, cap, "%s/cfg.yaml", root);
    FILE *f = fopen(cfg, "w");
    HP_ASSERT(f);
    fprintf(f, "job:\n  print_config: false\nmodel:\n  name: llama3\n  flavor: debugmodel\n  dim: 64\n  n_layers: 2\n"
               "  n_heads: 4\n  n_kv_heads: 2\ntraining:\n  seq_len: 32\n  local_batch_size: 2\n  seed: 1\n"
               "lr_scheduler:\n  warmup_steps: 2\nmetrics:\n  log_freq: 1\n  peak_flops: -1\n  jsonl_file: metrics.jsonl\n"
               "data:\n  path: %s\n  format: text\n  text_separator: percent\n  loop: true\n"
               "tokenizer:\n  path: %s\n%s", corpus, tok, extra ? extra : "");
    fclose(f);
}

/* A whole file (NUL-terminated, *n bytes) through the library's reader, or NULL. */
static inline char *hp_test_slurp(const char *path, size_t *n) {
    char *b = NULL;
    return hp_file_read_all(path, "test file", (size_t)1 << 30, &b, n) == HP_OK ? b : NULL;
}

/* The "step", "loss" and "grad_norm" fields of a metrics JSONL, one line per step, into out. */
static inline void hp_test_losses(const char *jsonl, char *out, size_t cap) {
    size_t n = 0;
    out[0] = '\0';
    char *t = hp_test_slurp(jsonl, &n);
    if (!t) return;
    size_t l = 0;
    for (char *line = strtok(t, "\n"); line && l + 200 < cap; line = strtok(NULL, "\n")) {
        const char *s = strstr(line, "\"step\": "), *lo = strstr(line, "\"loss\": "), *g = strstr(line, "\"grad_norm\": ");
        if (!s || !lo || !g) continue;
        l += (size_t)snprintf(out + l, cap - l, "%.*s %.*s %.*s\n", (int)strcspn(s + 8, ","), s + 8,
                              (int)strcspn(lo + 8, ","), lo + 8, (int)strcspn(g + 13, ","), g + 13);
    }
    free(t);
}

/* Bitwise the same run: the losses and norms of every logged step and the final weights file
 * of two dump folders. */
static inline void hp_test_same_run(const char *a, const char *b, const char *what) {
    char pa[800], pb[800];
    static char la[1 << 14], lb[1 << 14];
    snprintf(pa, sizeof pa, "%s/metrics.jsonl", a);
    snprintf(pb, sizeof pb, "%s/metrics.jsonl", b);
    hp_test_losses(pa, la, sizeof la);
    hp_test_losses(pb, lb, sizeof lb);
    HP_CHECK(la[0] && !strcmp(la, lb), "%s: losses differ:\n%s\nvs\n%s", what, la, lb);
    snprintf(pa, sizeof pa, "%s/weights.safetensors", a);
    snprintf(pb, sizeof pb, "%s/weights.safetensors", b);
    size_t na = 0, nb = 0;
    char *wa = hp_test_slurp(pa, &na), *wb = hp_test_slurp(pb, &nb);
    HP_CHECK(wa && wb && na == nb && !memcmp(wa, wb, na), "%s: final weights %s and %s differ (%zu vs %zu bytes)", what,
             pa, pb, na, nb);
    free(wa);
    free(wb);
}

#endif
