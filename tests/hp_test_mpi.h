/* The MPI prologue of the multi-rank test programs: hp_comm_init (on failure the message is
 * printed and the program exits 1), this rank and the world size, and the rank prefix of
 * the check messages (hp_test_set_rank). */
#ifndef HP_TEST_MPI_H
#define HP_TEST_MPI_H

#include <stdio.h>
#include <stdlib.h>

#include "hp_test.h"
#include "hyperparallel/comm.h"

/* Returns the world communicator; *rank and *size (each may be NULL) receive its rank and size. */
static inline hp_comm_t hp_test_mpi_init(int *argc, char ***argv, int *rank, int *size) {
    hp_comm_t w = NULL;
    if (hp_comm_init(argc, argv, &w) != HP_OK) {
        fprintf(stderr, "hp_comm_init: %s\n", hp_last_error());
        exit(1);
    }
    int r = hp_comm_rank(w), n = hp_comm_size(w);
    hp_test_set_rank(r);
    if (rank) *rank = r;
    if (size) *size = n;
    return w;
}

/* The end of a multi-rank test's main: the summary line (hp_test_finish), then hp_comm_finalize,
 * whose failure (a communicator not destroyed, an operation never waited) is printed but, coming
 * after the summary, does not change the exit code. Returns the exit code. */
static inline int hp_test_mpi_finish(const char *name) {
    const int rc = hp_test_finish(name);
    if (hp_comm_finalize() != HP_OK)
        fprintf(stderr, "[rank %d] hp_comm_finalize: %s\n", hp_test_rank_, hp_last_error());
    return rc;
}

#endif
