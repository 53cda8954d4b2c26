/* Starting and supervising a multi-rank job from a plain command (the torchrun convenience):
 * `hp-train --nproc 4 ...` or `hp-train --hostfile hosts ...` runs the comm backend's launcher
 * (mpirun for MPI) as a child and watches it: every rank sends it heartbeats
 * (HP_LAUNCH_ADDR, src/comm/comm_health.c), so when a host dies, freezes or is cut off the
 * launcher can name it, end the job on every host within a grace period even where mpirun
 * itself cannot ("abort is already in progress"), and leave no process behind. Part of the
 * comm layer, so no tool needs to know which launcher the backend uses. docs/multihost.md. */
#ifndef HYPERPARALLEL_LAUNCH_H
#define HYPERPARALLEL_LAUNCH_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_LAUNCH_HOST_MAX 128    /* bytes of a host name, with the NUL */
#define HP_LAUNCH_MAX_HOSTS 256
#define HP_LAUNCH_MAX_MCA 32

/* Nonzero when this process was started by a launcher (mpirun, srun, ...). */
int hp_launch_under_launcher(void);

/* One line of an Open MPI hostfile: "name [slots=N] [max_slots=M]" (slots default 1; '#'
 * starts a comment). */
typedef struct hp_launch_host {
    char name[HP_LAUNCH_HOST_MAX];
    int slots;
} hp_launch_host_t;

/* Reads a hostfile; errors name the file, the line and what was expected. A host listed twice
 * is one host with the slots added (as mpirun). */
hp_status_t hp_launch_hostfile_read(const char *path, hp_launch_host_t *hosts, int cap, int *n);
/* Writes hosts[n] as a hostfile (the surviving hosts of an elastic restart). */
hp_status_t hp_launch_hostfile_write(const char *path, const hp_launch_host_t *hosts, int n);

typedef struct hp_launch_options {
    int nproc;                    /* ranks; 0 = the hostfile's slots */
    const char *hostfile;         /* NULL: every rank on this machine */
    int n_mca;                    /* `--mca key value` pairs passed to mpirun */
    const char *mca[HP_LAUNCH_MAX_MCA][2];
    /* After the first sign of failure (a rank's timeout report, a rank that died, a rank
     * silent longer than the comm timeout): how long mpirun gets to end the job itself before
     * the launcher kills it and every process of the job on every host. <= 0: env
     * HP_LAUNCH_GRACE, default 5 s. */
    double grace_s;
} hp_launch_options_t;

/* What became of a job. */
typedef struct hp_launch_result {
    int exit_code;                /* mpirun's exit status, 128 + signal when it was killed */
    int failed;                   /* some rank failed: died, timed out, was lost (restartable) */
    int interrupted;              /* the launcher received SIGINT / SIGTERM (forwarded) */
    int killed;                   /* mpirun did not end within the grace: the launcher ended it */
    int n_ranks_seen;             /* ranks that sent at least one heartbeat */
    int n_lost_hosts;             /* hosts with a lost rank (died, stopped, silent) */
    char lost_hosts[16][HP_LAUNCH_HOST_MAX];
    /* "lost host h1 (ranks 2, 3): stopped (SIGSTOP); no heartbeat for 4.0 s" ... or "" */
    char lost[2048];
    char first_report[1024];      /* the first rank's own failure message ("rank 0 on h0: ...") */
    double seconds;               /* from start to the end of the last process */
    int stray;                    /* processes of the job the final sweep had to kill */
} hp_launch_result_t;

/* Runs `mpirun ... argv[0..argc-1]` with the options and supervises it (above) until every
 * process of the job has ended. The ranks inherit HP_LAUNCH_ADDR (the heartbeat address) and
 * HP_LAUNCH_TAG (the job's tag, by which the final sweep finds its processes on every host);
 * HP_*, OMP_* and OPENBLAS_* variables are forwarded to remote hosts. Remote hosts are
 * reached for the sweep with mpirun's rsh agent (`--mca plm_rsh_agent`, default ssh).
 * Returns an error only when the job could not be started. */
hp_status_t hp_launch_run(const hp_launch_options_t *o, int argc, char **argv, hp_launch_result_t *res);

#ifdef __cplusplus
}
#endif
#endif
