/* Private to the hp_comm front end (comm.c: state, counters, watchdog, communicators;
 * comm_work.c: work handles, lowering, progress; comm_ops.c: collectives and point-to-point;
 * comm_agree.c): the process-wide state and the calls these files make into each other. */
#ifndef HP_COMM_FRONT_H
#define HP_COMM_FRONT_H

#include <pthread.h>
#include <stdint.h>

#include "comm/comm-impl.h"

enum { HP_PROGRESS_POLL = 0, HP_PROGRESS_THREAD, HP_PROGRESS_NONE };

#define HP_WD_SLOTS 16

typedef struct wd_slot {
    volatile int in_use;
    uint64_t seq;                   /* odd while a call is in flight; atomic access */
    volatile int kind;
    hp_comm_t volatile comm;        /* the call's communicator (members and hosts for the message) */
    uint64_t seen_seq;              /* watchdog thread only: last odd seq observed ... */
    double seen_at;                 /* ... and when it was first observed */
} wd_slot_t;

/* The front end's process-wide state (one per process; comm.c defines it). */
typedef struct hp_comm_front {
    int initialised;
    const hp_comm_backend_t *be;
    hp_comm_t world;
    int live_comms;                 /* communicators other than world not yet destroyed */
    double timeout;
    int progress;
    int inflight;                   /* async works started, not yet finished */
    double poll_interval_s;

    pthread_mutex_t lock;           /* pool, progress list, pending counts */
    pthread_cond_t work_cv;         /* progress thread: new work or stop */
    pthread_cond_t done_cv;         /* waiters: some work finished */
    hp_work_t free_list;
    hp_work_t active_head, active_tail;
    int n_works;                    /* allocated work objects (pool size) */
    int progress_started, progress_stop;
    pthread_t progress_thread;

    pthread_mutex_t wd_lock;
    pthread_cond_t wd_cv;
    int wd_started, wd_stop;
    pthread_t wd_thread;
    wd_slot_t slots[HP_WD_SLOTS];
} hp_comm_front_t;

extern hp_comm_front_t hp_comm_g;

/* allocations made for collectives (pool, workspaces, storage): hp_comm_debug_allocs */
extern uint64_t hp_comm_allocs;
#define COUNT_ALLOC() __atomic_fetch_add(&hp_comm_allocs, 1, __ATOMIC_RELAXED)

/* comm.c */
void hp_comm_count_op(hp_comm_op_t op, size_t bytes);
/* Ends the job: `kind` on `comm` ran past the timeout. */
_Noreturn void hp_comm_timeout_abort(int kind, hp_comm_t comm, double elapsed);
/* Marks this thread's call in flight (begin) and done (end) for the watchdog. */
void hp_comm_wd_begin(int kind, hp_comm_t comm);
void hp_comm_wd_end(void);
/* A usable communicator, or an error naming `fn`. */
hp_status_t hp_comm_check(hp_comm_t comm, const char *fn);

/* comm_health.c: host names, the launcher's heartbeat channel (docs/multihost.md) */
/* Gathers every world rank's host name (collective over the world) and opens the channel to
 * HP_LAUNCH_ADDR when set. */
hp_status_t hp_comm_health_init(const hp_comm_backend_t *be, void *world_ctx, int rank, int size);
void hp_comm_health_fini(void);
/* Watchdog thread, every tick: sends a heartbeat when due, reads the launcher's answers. */
void hp_comm_health_tick(double now);
/* "on hosts h0, h1": the hosts of comm's members. */
void hp_comm_health_describe(hp_comm_t comm, char *buf, size_t cap);
/* 1 and "no heartbeat for 3.1 s from ranks 2, 3 on host h1" when the launcher reported
 * members of comm silent; 0 (buf empty) otherwise. */
int hp_comm_health_lost(hp_comm_t comm, double now, char *buf, size_t cap);
/* Tells the launcher that this rank is ending the job, and why. */
void hp_comm_health_report(const char *text);

/* comm_work.c */
/* A reset work from this thread's cache (blocking) or the pool. */
hp_status_t hp_comm_work_get(hp_comm_t comm, int blocking, hp_work_t *out);
void hp_comm_work_put(hp_work_t w);
/* Completes (blocking, out = NULL) or starts (async: *out receives it) a filled-in work. */
hp_status_t hp_comm_dispatch(hp_work_t w, hp_work_t *out);
void hp_comm_work_pool_drain(void);

#endif
