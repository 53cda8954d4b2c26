/* hp_comm_agree: every rank returns the lowest failing rank's status with that rank's own
 * message as "rank R: <message>"; all fine gives HP_OK; an agreed message agreed again keeps
 * its text; a world of one rank returns the status unchanged. */
// hp-test: ranks 1 2 timeout 60
#include <stdio.h>
#include <string.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hyperparallel/comm.h"

int main(int argc, char **argv) {
    int rank, size;
    hp_comm_t w = hp_test_mpi_init(&argc, &argv, &rank, &size);
    hp_comm_set_timeout(20);   /* a rank left behind fails fast instead of hanging */
    int who = -2;

    HP_CHECK(hp_comm_agree(w, HP_OK, &who) == HP_OK && who == -1, "all fine: rank %d", who);

    /* the last rank fails naming its file; every rank gets its message */
    const int bad = size - 1;
    hp_status_t s = rank == bad ? hp_error(HP_ERR_IO, "shard '/tmp/x/__%d_0.safetensors': truncated", rank) : HP_OK;
    s = hp_comm_agree(w, s, &who);
    char want[256];
    if (size > 1) snprintf(want, sizeof want, "rank %d: shard '/tmp/x/__%d_0.safetensors': truncated", bad, bad);
    else snprintf(want, sizeof want, "shard '/tmp/x/__0_0.safetensors': truncated");
    HP_CHECK(s == HP_ERR_IO && who == bad && strcmp(hp_last_error(), want) == 0, "one failing: %s (%d) '%s', want '%s'",
             hp_status_string(s), who, hp_last_error(), want);

    /* agreeing the agreed failure again (a caller after a callee) adds no second prefix */
    s = hp_comm_agree(w, s, NULL);
    HP_CHECK(s == HP_ERR_IO && strcmp(hp_last_error(), want) == 0, "re-agreed: '%s'", hp_last_error());

    /* several fail: the lowest rank's status and message win */
    s = hp_error(rank == 0 ? HP_ERR_FORMAT : HP_ERR_NOT_FOUND, "data file 'r%d.txt': line 3: bad", rank);
    s = hp_comm_agree(w, s, &who);
    const char *want0 = size > 1 ? "rank 0: data file 'r0.txt': line 3: bad" : "data file 'r0.txt': line 3: bad";
    HP_CHECK(s == HP_ERR_FORMAT && who == 0 && strcmp(hp_last_error(), want0) == 0, "all failing: %s '%s'",
             hp_status_string(s), hp_last_error());

    /* a failure that recorded no message still names the rank and the status */
    hp_clear_error();
    s = hp_comm_agree(w, rank == bad ? HP_ERR_OOM : HP_OK, NULL);
    HP_CHECK(s == HP_ERR_OOM && (size == 1 || strstr(hp_last_error(), "out of memory (no message recorded)")),
             "bare status: %s '%s'", hp_status_string(s), hp_last_error());

    /* the communicator still works after the failures */
    HP_CHECK(hp_comm_agree(w, HP_OK, NULL) == HP_OK, "after failures");
    HP_CHECK_ERR(hp_comm_agree(NULL, HP_OK, NULL), HP_ERR_INVALID_ARG, "hp_comm_agree");
    return hp_test_mpi_finish("test_comm_agree");
}
