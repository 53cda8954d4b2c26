/* hp_comm: NCCL-shaped collectives and point-to-point over a backend table (MPI now, NCCL
 * later). Nothing here exposes MPI types. Buffers are (sendbuf, recvbuf, count, dtype);
 * in-place is allowed where noted (sendbuf == recvbuf, or the NCCL in-place position).
 * Every collective takes a final `hp_work_t *work`: NULL runs it to completion (blocking);
 * non-NULL starts it and returns a handle to wait on (asynchronous). */
#ifndef HYPERPARALLEL_COMM_H
#define HYPERPARALLEL_COMM_H

#include <stddef.h>
#include <stdint.h>
#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_comm *hp_comm_t;
typedef struct hp_work *hp_work_t;

/* Reduction ops. PREMUL_SUM multiplies each input by a scalar before summing; create one
 * with hp_redop_create_premul_sum (as ncclRedOpCreatePreMulSum). AVG = SUM / size. */
typedef enum hp_redop {
    HP_SUM = 0,
    HP_PROD,
    HP_MAX,
    HP_MIN,
    HP_AVG,
    HP_REDOP_BUILTIN_COUNT
} hp_redop_t;
const char *hp_redop_name(hp_redop_t op);
hp_status_t hp_redop_create_premul_sum(double scalar, hp_comm_t comm, hp_redop_t *op);
hp_status_t hp_redop_destroy(hp_redop_t op, hp_comm_t comm);

/* --- lifetime ---------------------------------------------------------------------- */
/* Initialises the distributed runtime (MPI_Init_thread under the MPI backend) if needed and
 * returns the world communicator. Installs the abort hook and sets the log rank. Safe to
 * call without mpirun (a world of one rank). A second call returns the same world. */
hp_status_t hp_comm_init(int *argc, char ***argv, hp_comm_t *world);
/* Finalises the runtime; every communicator must be destroyed first. */
hp_status_t hp_comm_finalize(void);
int hp_comm_rank(hp_comm_t comm);
int hp_comm_size(hp_comm_t comm);
/* Rank of this process in the world communicator. */
int hp_comm_world_rank(hp_comm_t comm);
/* The host a world rank runs on (the launcher's name for it: MPI_Get_processor_name), gathered
 * at hp_comm_init; "?" out of range or before init. Timeouts name hosts with it. */
const char *hp_comm_host(int world_rank);
/* Ranks with equal color form a new communicator, ordered by (key, old rank). color < 0
 * returns *out = NULL (the caller is in no group). Collective over `comm`. */
hp_status_t hp_comm_split(hp_comm_t comm, int color, int key, hp_comm_t *out);
hp_status_t hp_comm_dup(hp_comm_t comm, hp_comm_t *out);
/* Frees a split/dup result (NULL is fine). The world communicator belongs to the runtime:
 * destroying it is a no-op and hp_comm_finalize frees it. */
hp_status_t hp_comm_destroy(hp_comm_t comm);
/* Timeout (seconds) for every blocking call and hp_work_wait; on expiry the job is aborted
 * with a message naming the op and the communicator. Default 300; env HP_COMM_TIMEOUT. */
void hp_comm_set_timeout(double seconds);
double hp_comm_get_timeout(void);
/* How asynchronous work advances while the caller computes (docs/comm.md): "poll" (default:
 * non-blocking backend calls tested by a progress thread), "thread" (a communication thread
 * runs queued collectives with blocking calls), "none" (advanced only inside hp_work_test /
 * hp_work_wait). Env HP_COMM_PROGRESS sets it at init; changing it needs no async work in
 * flight. */
hp_status_t hp_comm_set_progress(const char *mode);
const char *hp_comm_get_progress(void);
/* Agreement on failure, collective over `comm`: every rank passes its local status and
 * returns the same agreed one. If any rank failed, the lowest failing rank's status and its
 * hp_last_error() text reach every rank, whose message becomes "rank R: <that message>" (R
 * its world rank), so rank 0 can print what another rank found. Call it before a collective
 * that a failed rank would skip. One MIN all-reduce when every rank is fine, plus one
 * broadcast when one failed. A message that came out of an earlier agreement is kept as is
 * (no second prefix). *failed_rank (may be NULL): that world rank, or -1. A world of one
 * rank returns `status` unchanged. */
hp_status_t hp_comm_agree(hp_comm_t comm, hp_status_t status, int *failed_rank);
/* 1 when the backend can keep a job running after one of its ranks is lost (an MPI with
 * ULFM: MPIX_Comm_shrink / MPIX_Comm_revoke, as Open MPI 5 built with --with-ft=ulfm), the
 * premise of TorchFT-style continuation; 0 otherwise (Open MPI 4.1). `desc` (may be NULL)
 * receives the backend library's version line. Callable before hp_comm_init. */
int hp_comm_survives_failures(char *desc, size_t cap);
/* Aborts the whole job (all ranks) with a message. */
_Noreturn void hp_comm_abort(hp_comm_t comm, int code, const char *message);

/* --- collectives --------------------------------------------------------------------- */
/* recvbuf[count] = op over ranks of sendbuf[count]. In place: sendbuf == recvbuf. */
hp_status_t hp_all_reduce(const void *sendbuf, void *recvbuf, size_t count, hp_dtype_t dt,
                          hp_redop_t op, hp_comm_t comm, hp_work_t *work);
/* buf[count] from `root` to all. */
hp_status_t hp_broadcast(void *buf, size_t count, hp_dtype_t dt, int root, hp_comm_t comm,
                         hp_work_t *work);
/* recvbuf (significant at root only) = op over sendbuf. In place: sendbuf == recvbuf. */
hp_status_t hp_reduce(const void *sendbuf, void *recvbuf, size_t count, hp_dtype_t dt,
                      hp_redop_t op, int root, hp_comm_t comm, hp_work_t *work);
/* recvbuf[size * sendcount]: rank r's sendbuf lands at recvbuf + r*sendcount. In place:
 * sendbuf == recvbuf + rank*sendcount. */
hp_status_t hp_all_gather(const void *sendbuf, void *recvbuf, size_t sendcount, hp_dtype_t dt,
                          hp_comm_t comm, hp_work_t *work);
/* sendbuf[size * recvcount]; rank r gets op over ranks of block r. In place:
 * recvbuf == sendbuf + rank*recvcount. */
hp_status_t hp_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount, hp_dtype_t dt,
                              hp_redop_t op, hp_comm_t comm, hp_work_t *work);
/* sendbuf[size * count]: block j goes to rank j; recvbuf[size * count]: block j from rank j. */
hp_status_t hp_all_to_all(const void *sendbuf, void *recvbuf, size_t count, hp_dtype_t dt,
                          hp_comm_t comm, hp_work_t *work);
/* Variable all-to-all; counts and displacements in elements, one per rank. */
hp_status_t hp_all_to_all_v(const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                            void *recvbuf, const size_t *recvcounts, const size_t *rdispls,
                            hp_dtype_t dt, hp_comm_t comm, hp_work_t *work);
/* recvbuf[size * count] at root gets every rank's sendbuf[count]. */
hp_status_t hp_gather(const void *sendbuf, void *recvbuf, size_t count, hp_dtype_t dt, int root,
                      hp_comm_t comm, hp_work_t *work);
/* root's sendbuf[size * count]: block r to rank r's recvbuf[count]. */
hp_status_t hp_scatter(const void *sendbuf, void *recvbuf, size_t count, hp_dtype_t dt, int root,
                       hp_comm_t comm, hp_work_t *work);
hp_status_t hp_barrier(hp_comm_t comm, hp_work_t *work);

/* --- point-to-point ------------------------------------------------------------------ */
/* Blocking unless inside hp_group_start/hp_group_end, where sends and receives are queued
 * and all posted together at hp_group_end (which waits for them), as NCCL group calls. */
hp_status_t hp_send(const void *buf, size_t count, hp_dtype_t dt, int peer, hp_comm_t comm,
                    hp_work_t *work);
hp_status_t hp_recv(void *buf, size_t count, hp_dtype_t dt, int peer, hp_comm_t comm,
                    hp_work_t *work);
/* The same on a tagged channel: messages between two ranks match by (peer, tag), so several
 * in flight (pipeline activations and gradients of different stages and micro-batches) cannot
 * be confused whatever order they are posted in. tag in [1, HP_P2P_MAX_TAG]. */
#define HP_P2P_MAX_TAG (1 << 20)
hp_status_t hp_send_tag(const void *buf, size_t count, hp_dtype_t dt, int peer, int tag, hp_comm_t comm,
                        hp_work_t *work);
hp_status_t hp_recv_tag(void *buf, size_t count, hp_dtype_t dt, int peer, int tag, hp_comm_t comm,
                        hp_work_t *work);
hp_status_t hp_group_start(void);
hp_status_t hp_group_end(void);
/* hp_group_end that does not wait: the queued sends and receives are posted together and
 * *work completes them all (hp_work_wait / hp_work_test); work NULL is hp_group_end. Closes
 * the outermost group only. (A coalesced p2p pair: PyTorch's batch_isend_irecv.) */
hp_status_t hp_group_end_work(hp_work_t *work);

/* --- asynchronous work ---------------------------------------------------------------- */
/* Waits (with the comm timeout) and releases the handle; *work is set to NULL. */
hp_status_t hp_work_wait(hp_work_t *work);
/* Non-blocking completion check; on completion releases the handle and sets *work NULL. */
hp_status_t hp_work_test(hp_work_t *work, int *done);

/* --- counters (CommDebugMode analog) --------------------------------------------------- */
typedef enum hp_comm_op {
    HP_COMM_ALL_REDUCE = 0,
    HP_COMM_BROADCAST,
    HP_COMM_REDUCE,
    HP_COMM_ALL_GATHER,
    HP_COMM_REDUCE_SCATTER,
    HP_COMM_ALL_TO_ALL,
    HP_COMM_ALL_TO_ALL_V,
    HP_COMM_GATHER,
    HP_COMM_SCATTER,
    HP_COMM_SEND,
    HP_COMM_RECV,
    HP_COMM_BARRIER,
    HP_COMM_OP_COUNT
} hp_comm_op_t;
typedef struct hp_comm_counts {
    uint64_t calls[HP_COMM_OP_COUNT];
    uint64_t bytes[HP_COMM_OP_COUNT];   /* bytes this rank contributed (send side) */
} hp_comm_counts_t;
/* Process-wide counts over every communicator since the last reset. */
void hp_comm_counts_get(hp_comm_counts_t *out);
void hp_comm_counts_reset(void);
uint64_t hp_comm_count(hp_comm_op_t op);
uint64_t hp_comm_count_total(void);
const char *hp_comm_op_name(hp_comm_op_t op);

#ifdef __cplusplus
}
#endif
#endif
