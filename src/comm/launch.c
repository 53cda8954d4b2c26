/* Self-launch under mpirun for `--nproc N` (the only place outside comm-mpi.c that knows the
 * MPI launcher). */
#define _GNU_SOURCE
#include "hyperparallel/launch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int hp_launch_under_launcher(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", NULL};
    for (int i = 0; vars[i]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

hp_status_t hp_launch_exec(int nproc, int argc, char **argv) {
    if (nproc < 1) return hp_error(HP_ERR_INVALID_ARG, "--nproc %d: expected a rank count >= 1", nproc);
    const char *launcher = getenv("HP_MPIRUN") ? getenv("HP_MPIRUN") : "mpirun";
    char np[32];
    snprintf(np, sizeof np, "%d", nproc);
    char **args = calloc((size_t)argc + 12, sizeof(char *));
    if (!args) return hp_error(HP_ERR_OOM, "launch: out of memory");
    int k = 0;
    args[k++] = (char *)launcher;
    args[k++] = "-np";
    args[k++] = np;
    args[k++] = "--oversubscribe";
    args[k++] = "--bind-to";
    args[k++] = "none";
    if (geteuid() == 0) args[k++] = "--allow-run-as-root";
    for (int i = 0; i < argc; i++) args[k++] = argv[i];
    args[k] = NULL;
    fflush(stdout);
    fflush(stderr);
    execvp(launcher, args);
    hp_status_t s = hp_error(HP_ERR_IO, "cannot start '%s' for --nproc %d: %s; install openmpi-bin (make deps) or "
                                        "start the job with your launcher", launcher, nproc, strerror(errno));
    free(args);
    return s;
}
