/* SIGTERM / SIGINT to hp-train (the built tool, through HP_BUILD_DIR): the run stops after the
 * current step with one message on rank 0 saying at which step it stopped, whether a save was
 * cut short and which checkpoint is the last complete one; it exits 128 + signal; no
 * step-N.tmp-* directory remains; the named checkpoint verifies and the next run resumes from
 * it. Cases: a signal mid-run (1 rank); a signal during a save (the HP_DCP_TEST_SIGNAL_STEP
 * hook raises it between writing and committing: the complete save is still committed);
 * SIGINT to both ranks under mpirun. */
// hp-test: ranks 1 timeout 180
#define _GNU_SOURCE
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hp_test.h"
#include "hp_test_tokenizer.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/tokenizer.h"

static char ROOT[] = "/tmp/hp_test_train_signal_XXXXXX";
static char TRAIN[1024], CFG[600];
static char OUT[1 << 18];

/* Runs argv with stdout+stderr captured into OUT. When `trigger` is set, sends `sig` (to the
 * process, or with to_children to its children: the ranks under mpirun) once that text shows. */
static int run(char *const argv[], const char *trigger, int sig, int to_children) {
    int pfd[2];
    HP_ASSERT(pipe(pfd) == 0);
    pid_t pid = fork();
    HP_ASSERT(pid >= 0);
    if (pid == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        close(pfd[1]);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(pfd[1]);
    size_t len = 0;
    int sent = 0;
    FILE *f = fdopen(pfd[0], "r");
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        size_t l = strlen(line);
        if (len + l + 1 < sizeof OUT) {
            memcpy(OUT + len, line, l + 1);
            len += l;
        }
        if (trigger && !sent && strstr(line, trigger)) {
            sent = 1;
            if (!to_children) {
                kill(pid, sig);
            } else {
                char p[64], kids[512] = "";
                snprintf(p, sizeof p, "/proc/%d/task/%d/children", (int)pid, (int)pid);
                FILE *k = fopen(p, "r");
                if (k) {
                    if (!fgets(kids, sizeof kids, k)) kids[0] = '\0';
                    fclose(k);
                }
                int nk = 0;
                for (char *tok = strtok(kids, " \n"); tok; tok = strtok(NULL, " \n"), nk++) kill((pid_t)atoi(tok), sig);
                HP_CHECK(nk > 0, "no child processes of %d found in %s", (int)pid, p);
                if (nk == 0) kill(pid, SIGKILL);   /* do not leave the run going */
            }
        }
    }
    fclose(f);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 256 + WTERMSIG(st);
}

static int count_tmp(const char *folder) {
    DIR *d = opendir(folder);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) n += strstr(e->d_name, ".tmp") != NULL;
    if (d) closedir(d);
    return n;
}

static long long last_complete(void) {
    const char *p = strstr(OUT, "the last complete checkpoint is step-");
    return p ? atoll(p + strlen("the last complete checkpoint is step-")) : -1;
}

static void resume_check(const char *dump, long long k, const char *what) {
    char folder[700], dir[800], steps[64], df[720];
    snprintf(folder, sizeof folder, "%s/checkpoint", dump);
    snprintf(dir, sizeof dir, "%s/step-%lld", folder, k);
    HP_CHECK(hp_dcp_verify(dir, 1) == HP_OK, "%s: step-%lld does not verify: %s", what, k, hp_last_error());
    snprintf(steps, sizeof steps, "--training.steps=%lld", k + 1);
    snprintf(df, sizeof df, "--job.dump_folder=%s", dump);
    char *argv[] = {TRAIN, "--config", CFG, df, steps, NULL};
    int rc = run(argv, NULL, 0, 0);
    char want[900];
    snprintf(want, sizeof want, "resumed from %s", dir);
    HP_CHECK(rc == 0 && strstr(OUT, want), "%s: the rerun did not resume from step-%lld (exit %d):\n%.3000s", what, k, rc,
             OUT);
}

int main(void) {
    if (!hp_test_built_program(TRAIN, sizeof TRAIN, "hp-train")) return 0;
    HP_ASSERT(mkdtemp(ROOT));
    /* a small corpus, its tokenizer and a config that saves every 2 steps */
    char corpus[700], tok[700];
    hp_test_short_corpus(ROOT, corpus, tok, sizeof corpus);
    snprintf(CFG, sizeof CFG, "%s/cfg.yaml", ROOT);
    FILE *f = fopen(CFG, "w");
    HP_ASSERT(f);
    fprintf(f, "job:\n  print_config: false\nmodel:\n  name: llama3\n  flavor: debugmodel\n"
               "training:\n  steps: 100000\n  seq_len: 32\n  local_batch_size: 2\n  seed: 1\n"
               "lr_scheduler:\n  warmup_steps: 2\ncheckpoint:\n  enable: true\n  interval: 2\n  keep_latest_k: 0\n"
               "metrics:\n  log_freq: 1\n  peak_flops: -1\n"
               "data:\n  path: %s\n  format: text\n  text_separator: percent\n  loop: true\n"
               "tokenizer:\n  path: %s\n", corpus, tok);
    fclose(f);
    char dump[700], df[720], folder[800];

    /* 1. SIGTERM mid-run, once step-4 is saved */
    snprintf(dump, sizeof dump, "%s/a", ROOT);
    snprintf(df, sizeof df, "--job.dump_folder=%s", dump);
    snprintf(folder, sizeof folder, "%s/checkpoint", dump);
    {
        char *argv[] = {TRAIN, "--config", CFG, df, NULL};
        int rc = run(argv, "checkpoint/step-4", SIGTERM, 0);
        long long k = last_complete();
        HP_CHECK(rc == 143 && strstr(OUT, "interrupted by SIGTERM (signal 15) after step") && k >= 4,
                 "mid-run SIGTERM: exit %d, last complete %lld\n%.3000s", rc, k, OUT + (strlen(OUT) > 3000 ? strlen(OUT) - 3000 : 0));
        HP_CHECK(count_tmp(folder) == 0, "mid-run SIGTERM left %d step-*.tmp dirs", count_tmp(folder));
        if (k >= 0) resume_check(dump, k, "mid-run SIGTERM");
    }

    /* 2. SIGTERM during the save of step 4 (raised after rank 0 wrote its file): the files
     * are complete, so the save is still committed and the run stops after step 4 */
    snprintf(dump, sizeof dump, "%s/b", ROOT);
    snprintf(df, sizeof df, "--job.dump_folder=%s", dump);
    snprintf(folder, sizeof folder, "%s/checkpoint", dump);
    {
        setenv("HP_DCP_TEST_SIGNAL_STEP", "4", 1);
        char *argv[] = {TRAIN, "--config", CFG, df, NULL};
        int rc = run(argv, NULL, 0, 0);
        unsetenv("HP_DCP_TEST_SIGNAL_STEP");
        long long k = last_complete();
        HP_CHECK(rc == 143 && strstr(OUT, "interrupted by SIGTERM (signal 15) after step 4 ") && k == 4,
                 "SIGTERM during a save: exit %d, last complete %lld\n%.3000s", rc, k, OUT);
        char s4[900];
        snprintf(s4, sizeof s4, "%s/step-4", folder);
        HP_CHECK(count_tmp(folder) == 0 && access(s4, F_OK) == 0, "during a save: %d tmp dirs left, step-4 %s",
                 count_tmp(folder), access(s4, F_OK) == 0 ? "exists" : "absent");
        if (k == 4) resume_check(dump, k, "SIGTERM during a save");
    }

    /* 3. SIGINT to both ranks under mpirun: rank 0 alone reports, exit 130 */
    const char *mpirun = getenv("HP_MPIEXEC");
    if (!mpirun || !*mpirun) mpirun = access("/usr/bin/mpirun", X_OK) == 0 ? "/usr/bin/mpirun" : "mpirun";
    snprintf(dump, sizeof dump, "%s/c", ROOT);
    snprintf(df, sizeof df, "--job.dump_folder=%s", dump);
    snprintf(folder, sizeof folder, "%s/checkpoint", dump);
    {
        char *argv[12];
        int a = 0;
        argv[a++] = (char *)mpirun;
        argv[a++] = "--oversubscribe";
        if (geteuid() == 0) argv[a++] = "--allow-run-as-root";
        argv[a++] = "-np";
        argv[a++] = "2";
        argv[a++] = TRAIN;
        argv[a++] = "--config";
        argv[a++] = CFG;
        argv[a++] = df;
        argv[a++] = "--parallelism.data_parallel_shard_degree=2";
        argv[a] = NULL;
        int rc = run(argv, "checkpoint/step-2", SIGINT, 1);
        const char *m1 = strstr(OUT, "interrupted by SIGINT (signal 2)");
        long long k = last_complete();
        HP_CHECK(rc == 130 && m1 && !strstr(m1 + 1, "interrupted by SIGINT") && k >= 2,
                 "2 ranks, SIGINT: exit %d, last complete %lld\n%.3000s", rc, k, OUT + (strlen(OUT) > 3000 ? strlen(OUT) - 3000 : 0));
        HP_CHECK(count_tmp(folder) == 0, "2 ranks: %d step-*.tmp dirs left", count_tmp(folder));
    }
    if (!getenv("HP_KEEP")) hp_test_remove_dir(ROOT);
    return hp_test_finish("test_train_signal");
}
