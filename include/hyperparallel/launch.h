/* Starting a multi-rank job from a plain command (the torchrun convenience): `hp-train
 * --nproc 4 ...` re-executes itself under the comm backend's launcher (mpirun for MPI).
 * Part of the comm layer, so no tool needs to know which launcher the backend uses. */
#ifndef HYPERPARALLEL_LAUNCH_H
#define HYPERPARALLEL_LAUNCH_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Nonzero when this process was started by a launcher (mpirun, srun, ...). */
int hp_launch_under_launcher(void);
/* Replaces this process by `launcher -np nproc argv[0] argv[1..argc-1]` (oversubscription
 * allowed so that ranks may exceed cores; --allow-run-as-root when root). Returns only on
 * failure. */
hp_status_t hp_launch_exec(int nproc, int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
