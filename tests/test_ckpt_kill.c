/* A rank killed with SIGKILL during a save: the previous checkpoint stays loadable and the
 * partial one is ignored with a warning. This program is the driver (one process) and, with a
 * scenario argument, the 2-rank helper it launches under mpirun: the helper commits step-1,
 * starts an async save of step-2 and rank 1 kills itself while the writer thread runs. */
// hp-test: ranks 1 timeout 120
#define _GNU_SOURCE
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hp_test.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/comm.h"

enum { ROWS = 512, COLS = 2048 };   /* 4 MiB per rank: the write is still running at the kill */

static float value(int64_t i, int version) { return (float)(i % 1000) + 0.5f * (float)version; }

static void fill(hp_dtensor_t *d, int version) {
    int64_t off[2];
    HP_CHECK_OK(hp_dtensor_global_offset(d, off));
    float *p = d->local.data;
    for (int64_t r = 0; r < d->local.shape[0]; r++)
        for (int64_t c = 0; c < COLS; c++) p[r * COLS + c] = value((off[0] + r) * COLS + c, version);
}

static int helper(const char *folder, int argc, char **argv) {
    hp_comm_t w;
    if (hp_comm_init(&argc, &argv, &w) != HP_OK) return 2;
    hp_comm_set_timeout(20);
    int rank = hp_comm_rank(w);
    hp_mesh_t m;
    HP_ASSERT(hp_mesh_from_comm(w, "dp", &m) == HP_OK);
    int64_t sh[2] = {ROWS, COLS};
    hp_tensor_t full;
    HP_ASSERT(hp_tensor_malloc(&full, HP_F32, 2, sh) == HP_OK);
    hp_placement_t s0 = hp_shard(0);
    hp_dtensor_t d;
    HP_ASSERT(hp_dtensor_distribute(&d, NULL, &full, m, 1, &s0, -1) == HP_OK);
    fill(&d, 1);
    hp_dcp_tensor_t ts[1] = {{"w", &d, -1, 0}};
    hp_dcp_state_t st = {ts, 1, NULL, 0};
    char dir[600];
    snprintf(dir, sizeof dir, "%s/step-1", folder);
    HP_ASSERT(hp_dcp_save(dir, &st, w) == HP_OK);
    fill(&d, 2);
    hp_dcp_saver_t sv;
    HP_ASSERT(hp_dcp_saver_create(w, &sv) == HP_OK);
    snprintf(dir, sizeof dir, "%s/step-2", folder);
    HP_ASSERT(hp_dcp_saver_save(sv, dir, &st) == HP_OK);
    if (rank == 1) raise(SIGKILL);   /* mid-save: the writer thread is running, nothing committed */
    hp_dcp_saver_wait(sv);           /* rank 0 never gets rank 1's agreement */
    fprintf(stderr, "helper: the save completed although rank 1 was killed\n");
    return 0;
}

static int run(const char *cmd, char *out, size_t cap) {
    const int rc = hp_test_run_capture(cmd, out, cap);
    return rc > 128 ? 128 : rc;
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "save")) return helper(argv[2], argc, argv);
    if (argc > 2 && !strcmp(argv[1], "list")) {
        int64_t steps[8];
        int n = 0;
        hp_status_t s = hp_dcp_list_steps(argv[2], steps, 8, &n);
        printf("steps %d first %lld status %d\n", n, n ? (long long)steps[0] : -1LL, (int)s);
        return 0;
    }
    const char *self = argv[0];
    char abs[4096];
    if (self[0] != '/' && realpath(self, abs)) self = abs;
    char folder[] = "/tmp/hp_test_ckpt_kill_XXXXXX";
    HP_ASSERT(mkdtemp(folder));
    const char *mpirun = getenv("HP_MPIEXEC");
    if (!mpirun || !*mpirun) mpirun = access("/usr/bin/mpirun", X_OK) == 0 ? "/usr/bin/mpirun" : "mpirun";
    static char out[1 << 16];
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s --oversubscribe %s -np 2 '%s' save %s 2>&1", mpirun,
             geteuid() == 0 ? "--allow-run-as-root" : "", self, folder);
    int rc = run(cmd, out, sizeof out);
    HP_CHECK(rc != 0 && !strstr(out, "the save completed"), "helper exit %d; output:\n%s", rc, out);
    /* the partial directory exists and is not a checkpoint */
    DIR *dd = opendir(folder);
    int partial = 0, committed2 = 0;
    struct dirent *e;
    while (dd && (e = readdir(dd)) != NULL) {
        if (!strncmp(e->d_name, "step-2.tmp-", 11)) partial++;
        if (!strcmp(e->d_name, "step-2")) committed2++;
    }
    if (dd) closedir(dd);
    HP_CHECK(partial == 1 && committed2 == 0, "after the kill: %d partial step-2.tmp-* dirs, %d step-2 dirs", partial,
             committed2);
    snprintf(cmd, sizeof cmd, "'%s' list %s 2>&1", self, folder);
    run(cmd, out, sizeof out);
    HP_CHECK(strstr(out, "steps 1 first 1 status 0") && strstr(out, "ignoring partial checkpoint") &&
             strstr(out, "step-2.tmp-"), "listing after the kill:\n%s", out);
    /* step-1 loads, on one rank, with its values */
    int64_t sh[2] = {ROWS, COLS};
    hp_dtensor_t d = {0};   // a plain local tensor: the whole of w
    HP_ASSERT(hp_tensor_malloc(&d.local, HP_F32, 2, sh) == HP_OK);
    hp_dcp_tensor_t ts[1] = {{"w", &d, -1, 0}};
    hp_dcp_state_t st = {ts, 1, NULL, 0};
    char dir[600];
    snprintf(dir, sizeof dir, "%s/step-1", folder);
    HP_CHECK_OK(hp_dcp_load(dir, &st, NULL, NULL));
    int bad = 0;
    for (int64_t i = 0; i < (int64_t)ROWS * COLS; i++) bad += ((float *)d.local.data)[i] != value(i, 1);
    HP_CHECK(bad == 0, "step-1 after the kill: %d wrong values", bad);
    hp_tensor_free_data(&d.local);
    hp_test_remove_dir(folder);
    return hp_test_finish("test_ckpt_kill");
}
