/* Failure behaviour: when one rank skips a collective, hits an assert, or dies mid-collective,
 * every rank ends with a clear message in bounded time. This program is the driver (run as one
 * process) and, with a scenario argument, the 2-rank helper it launches under mpirun. */
// hp-test: ranks 1 timeout 180
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hp_test.h"
#include "hyperparallel/comm.h"

/* ---- helper side (under mpirun -np 2) ---------------------------------------------------- */

static int helper(const char *scenario, int argc, char **argv) {
    hp_comm_t w;
    if (hp_comm_init(&argc, &argv, &w) != HP_OK) {
        fprintf(stderr, "hp_comm_init: %s\n", hp_last_error());
        return 2;
    }
    int rank = hp_comm_rank(w);
    float x[1024] = {0};
    if (!strcmp(scenario, "skip")) {
        /* rank 1 skips the collective; rank 0's blocking all_reduce must time out */
        hp_comm_set_timeout(3);
        if (rank == 1) sleep(60);
        else hp_all_reduce(x, x, 1024, HP_F32, HP_SUM, w, NULL);
    } else if (!strcmp(scenario, "skip_async")) {
        /* the wait on an asynchronous all_gather must time out */
        hp_comm_set_timeout(3);
        static float y[2048];
        hp_work_t wk = NULL;
        if (rank == 1) sleep(60);
        else if (hp_all_gather(x, y, 1024, HP_F32, w, &wk) == HP_OK) hp_work_wait(&wk);
    } else if (!strcmp(scenario, "abort")) {
        /* rank 1 dies from a signal while rank 0 is inside the collective (default timeout) */
        if (rank == 1) {
            usleep(200 * 1000);
            abort();
        }
        hp_all_reduce(x, x, 1024, HP_F32, HP_SUM, w, NULL);
    } else if (!strcmp(scenario, "assert")) {
        /* an always-on assert on rank 1 must end the whole job through the abort hook */
        if (rank == 1) HP_ASSERT_MSG(rank == 0, "scenario assert: rank %d is not allowed here", rank);
        hp_all_reduce(x, x, 1024, HP_F32, HP_SUM, w, NULL);
    } else {
        fprintf(stderr, "unknown scenario '%s'\n", scenario);
    }
    /* Reaching here means the failure was not detected: exit 0 so the driver sees it. */
    hp_comm_finalize();
    return 0;
}

/* ---- driver side ------------------------------------------------------------------------- */

static const char *mpirun_path(void) {
    const char *e = getenv("HP_MPIEXEC");
    if (e && *e) return e;
    return access("/usr/bin/mpirun", X_OK) == 0 ? "/usr/bin/mpirun" : "mpirun";
}

/* Runs a scenario; returns its exit status, output in out (truncated), seconds in *secs. */
static int run_scenario(const char *self, const char *scenario, char *out, size_t cap, double *secs) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s --oversubscribe %s -np 2 '%s' %s 2>&1", mpirun_path(),
             geteuid() == 0 ? "--allow-run-as-root" : "", self, scenario);
    double t0 = hp_clock_now_seconds();
    const int rc = hp_test_run_capture(cmd, out, cap);
    *secs = hp_clock_now_seconds() - t0;
    return rc;
}

static void expect(const char *self, const char *scenario, const char *needle1, const char *needle2,
                   double min_s, double max_s) {
    static char out[1 << 16];
    double secs = 0;
    int rc = run_scenario(self, scenario, out, sizeof out, &secs);
    int ok = rc != 0 && strstr(out, needle1) && (!needle2 || strstr(out, needle2)) &&
             secs >= min_s && secs <= max_s;
    HP_CHECK(ok, "scenario %s: exit %d after %.1f s (expected non-zero within [%.0f, %.0f] s) "
             "with '%s'%s%s in the output:\n%s", scenario, rc, secs, min_s, max_s, needle1,
             needle2 ? " and " : "", needle2 ? needle2 : "", out);
    printf("scenario %-10s exit %d after %.1f s\n", scenario, rc, secs);
}

int main(int argc, char **argv) {
    if (argc > 1 && strncmp(argv[1], "-", 1) != 0) return helper(argv[1], argc, argv);
    const char *self = argv[0];
    char abs[4096];
    if (self[0] != '/' && realpath(self, abs)) self = abs;
    expect(self, "skip", "hp_comm: timeout: all_reduce on a communicator of 2 ranks", "after 3.", 2.9, 30);
    expect(self, "skip_async", "hp_comm: timeout: all_gather on a communicator of 2 ranks", NULL, 2.9, 30);
    expect(self, "abort", "exited on signal 6", NULL, 0, 30);
    expect(self, "assert", "scenario assert: rank 1 is not allowed here", "ending every rank of the job with MPI_Abort", 0, 30);
    return hp_test_finish("test_comm_failure");
}
