/* hp_comm_agree: every rank of a communicator returns the same status, and on failure the
 * lowest failing rank's own message ("rank R: ..."), for failures only some ranks see. */
#include <stdio.h>
#include <string.h>

#include "comm/comm-front.h"

/* ---- agreement on failure ---------------------------------------------------------------- */

/* The message this thread's last failed agreement returned: a status that is agreed again
 * (a caller agrees on what a callee already agreed) keeps its text instead of growing a
 * second "rank R: " prefix. */
static _Thread_local char t_agreed[2048];
static _Thread_local int32_t t_agreed_rank;   /* the world rank that t_agreed names */

hp_status_t hp_comm_agree(hp_comm_t comm, hp_status_t status, int *failed_rank) {
    if (failed_rank) *failed_rank = -1;
    HP_TRY(hp_comm_check(comm, "hp_comm_agree"));
    if (status != HP_OK && ((int)status < 0 || status >= HP_STATUS_COUNT)) status = HP_ERR_STATE;
    if (comm->size == 1) {
        if (status != HP_OK && failed_rank) *failed_rank = comm->world_rank;
        return status;
    }
    /* one MIN all-reduce in the common case: the lowest failing rank, or size if none */
    int32_t mine = status != HP_OK ? comm->rank : comm->size, lowest = comm->size;
    HP_TRY(hp_all_reduce(&mine, &lowest, 1, HP_I32, HP_MIN, comm, NULL));
    if (lowest >= comm->size) return HP_OK;
    /* that rank broadcasts (status, world rank, already agreed, message) */
    enum { HDR = 3 * sizeof(int32_t) };
    unsigned char buf[HDR + sizeof t_agreed];
    if (comm->rank == lowest) {
        const char *msg = hp_last_error();
        const int32_t again = t_agreed[0] && strcmp(msg, t_agreed) == 0;   /* keep the first failing rank */
        int32_t h[3] = {(int32_t)status, again ? t_agreed_rank : comm->world_rank, again};
        memcpy(buf, h, HDR);
        if (msg[0]) snprintf((char *)buf + HDR, sizeof t_agreed, "%s", msg);
        else snprintf((char *)buf + HDR, sizeof t_agreed, "%s (no message recorded)", hp_status_string(status));
    }
    HP_TRY(hp_broadcast(buf, sizeof buf, HP_U8, (int)lowest, comm, NULL));
    int32_t h[3];
    memcpy(h, buf, HDR);
    buf[sizeof buf - 1] = '\0';
    hp_status_t agreed = h[0] > HP_OK && h[0] < HP_STATUS_COUNT ? (hp_status_t)h[0] : HP_ERR_STATE;
    if (h[2]) hp_error(agreed, "%s", (const char *)buf + HDR);
    else hp_error(agreed, "rank %d: %s", (int)h[1], (const char *)buf + HDR);
    snprintf(t_agreed, sizeof t_agreed, "%s", hp_last_error());
    t_agreed_rank = h[1];
    if (failed_rank) *failed_rank = h[1];
    return agreed;
}
