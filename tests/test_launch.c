/* hp-train's supervising launcher on one host (--nproc 2, src/comm/launch_run.c): a rank
 * killed with SIGKILL ends the whole job with one message that names the lost rank and what
 * a rerun resumes from, and leaves no process behind (no hang); with --max-restarts the job
 * restarts from the last complete checkpoint and ends with the weights of a run that was never
 * interrupted (bitwise: the same steps on the same data, docs/multihost.md). */
// hp-test: ranks 1 timeout 300
#include "hp_test_launch.h"

static char root_[] = "/tmp/hp_test_launch_XXXXXX";
static char hp_train_[600], cfg_[700];

/* Starts hp-train --nproc 2 on the config with dump folder root/name and `extra` arguments. */
static void start(hp_test_job_t *j, const char *name, int steps, const char *const *extra) {
    static char dump[800], st[64];
    snprintf(dump, sizeof dump, "--job.dump_folder=%s/%s", root_, name);
    snprintf(st, sizeof st, "--training.steps=%d", steps);
    const char *argv[32] = {hp_train_, "--nproc", "2", "--config", cfg_, dump, st};
    int n = 7;
    for (int i = 0; extra && extra[i]; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    hp_test_job_start(j, (char *const *)argv);
}

/* SIGKILL to MPI rank 1 of the job whose dump folder is root/name. */
static void kill_rank1(const char *name) {
    char needle[800];
    snprintf(needle, sizeof needle, "--job.dump_folder=%s/%s", root_, name);
    pid_t pids[4];
    int n = hp_test_procs(needle, 1, pids, 4);
    HP_CHECK(n == 1, "%s: %d processes of rank 1 found", name, n);
    if (n == 1) kill(pids[0], SIGKILL);
}

static int count(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

int main(void) {
    HP_ASSERT(mkdtemp(root_));
    const char *bd = getenv("HP_BUILD_DIR");
    snprintf(hp_train_, sizeof hp_train_, "%s/hp-train", bd ? bd : ".");
    hp_test_launch_setup(root_, "checkpoint:\n  enable: true\n  interval: 4\n  last_save_model_only: false\n", cfg_,
                         sizeof cfg_);
    static hp_test_job_t j;

    /* the reference: 12 steps, never interrupted */
    start(&j, "ref", 12, NULL);
    int st = hp_test_job_finish(&j, 120);
    HP_CHECK(st == 0, "reference run: status %d\n%s", st, hp_test_job_tail(&j, 2000));

    /* a rank killed, no restarts: one message naming the rank and the checkpoint, no process left */
    start(&j, "fail", 400, NULL);
    HP_CHECK(hp_test_job_read(&j, "checkpoint: saved", 90), "no checkpoint saved:\n%s", hp_test_job_tail(&j, 2000));
    kill_rank1("fail");
    st = hp_test_job_finish(&j, 60);
    char needle[800];
    snprintf(needle, sizeof needle, "--job.dump_folder=%s/fail", root_);
    HP_CHECK(hp_test_procs_gone(needle, 10) == 0, "processes of the failed job are still running");
    HP_CHECK(st != 0 && count(j.out, "hp-train: error:") == 1 && strstr(j.out, "(rank 1)") &&
                 strstr(j.out, "signal 9") && strstr(j.out, "the last complete checkpoint is"),
             "killed rank: status %d, expected one 'hp-train: error:' naming rank 1, signal 9 and the checkpoint:\n%s",
             st, hp_test_job_tail(&j, 3000));
    printf("a killed rank ended the job in %.1f s with one message\n", j.t_end - j.t0);

    /* a rank killed after the step-4 checkpoint, --max-restarts 1: the job resumes and ends as
     * the reference did */
    const char *restart[] = {"--max-restarts", "1", NULL};
    start(&j, "restart", 12, restart);
    HP_CHECK(hp_test_job_read(&j, "step-4", 90), "no step-4 checkpoint:\n%s", hp_test_job_tail(&j, 2000));
    kill_rank1("restart");
    st = hp_test_job_finish(&j, 150);
    HP_CHECK(st == 0 && strstr(j.out, "restart 1 of 1") && strstr(j.out, "resumed from"),
             "restart: status %d, expected 'restart 1 of 1' and a resume:\n%s", st, hp_test_job_tail(&j, 3000));
    /* metrics.jsonl starts again at the resume, so the restarted run's steps are the tail of
     * the reference's */
    char pa[900], pb[900];
    static char la[1 << 14], lb[1 << 14];
    snprintf(pa, sizeof pa, "%s/ref/metrics.jsonl", root_);
    snprintf(pb, sizeof pb, "%s/restart/metrics.jsonl", root_);
    hp_test_losses(pa, la, sizeof la);
    hp_test_losses(pb, lb, sizeof lb);
    size_t na = strlen(la), nb = strlen(lb);
    HP_CHECK(nb > 0 && nb < na && !strcmp(la + na - nb, lb) && la[na - nb - 1] == '\n',
             "restart: its steps are not the reference's last ones:\n%s\nvs\n%s", lb, la);
    snprintf(pa, sizeof pa, "%s/ref/weights.safetensors", root_);
    snprintf(pb, sizeof pb, "%s/restart/weights.safetensors", root_);
    size_t wa_n = 0, wb_n = 0;
    char *wa = hp_test_slurp(pa, &wa_n), *wb = hp_test_slurp(pb, &wb_n);
    HP_CHECK(wa && wb && wa_n == wb_n && !memcmp(wa, wb, wa_n), "restart: final weights differ from the reference's");
    free(wa);
    free(wb);
    printf("a killed rank with --max-restarts 1: resumed from the last checkpoint, final weights bitwise the "
           "reference's\n");
    if (hp_test_failures_ == 0) hp_test_remove_dir(root_);   /* kept for a look when it failed */
    return hp_test_finish("test_launch");
}
