/* hp_comm front end (docs/comm.md), the communicators: the process-wide state, op names,
 * per-op counters, the timeout watchdog, and init / finalize / split / dup / destroy with the
 * PREMUL_SUM ops. The backend table (comm-impl.h) does the moving; MPI is the only backend
 * today. Work handles and progress: comm_work.c; the calls: comm_ops.c; agreement:
 * comm_agree.c. */
#include <errno.h>
#include <stdint.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hyperparallel/parse.h"
#include "comm/comm-front.h"

/* ---- process-wide state ---------------------------------------------------------------- */

static const char *const k_progress_names[] = {"poll", "thread", "none"};

hp_comm_front_t hp_comm_g = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .work_cv = PTHREAD_COND_INITIALIZER,
    .done_cv = PTHREAD_COND_INITIALIZER,
    .wd_lock = PTHREAD_MUTEX_INITIALIZER,
    .wd_cv = PTHREAD_COND_INITIALIZER,
    .timeout = 300.0,
};

uint64_t hp_comm_allocs;   /* allocations made for collectives (pool, workspaces, storage) */

uint64_t hp_comm_debug_allocs(void) { return __atomic_load_n(&hp_comm_allocs, __ATOMIC_RELAXED); }

static uint64_t g_calls[HP_COMM_OP_COUNT];
static uint64_t g_bytes[HP_COMM_OP_COUNT];

static __thread wd_slot_t *t_slot;

static const char *const k_op_names[HP_COMM_OP_COUNT] = {
    "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all",
    "all_to_all_v", "gather", "scatter", "send", "recv", "barrier",
};

const char *hp_comm_op_name(hp_comm_op_t op) {
    return (op >= 0 && op < HP_COMM_OP_COUNT) ? k_op_names[op] : "unknown";
}

const char *hp_redop_name(hp_redop_t op) {
    switch (op) {
    case HP_SUM: return "sum";
    case HP_PROD: return "prod";
    case HP_MAX: return "max";
    case HP_MIN: return "min";
    case HP_AVG: return "avg";
    default: return (op >= HP_REDOP_BUILTIN_COUNT) ? "premul_sum" : "unknown";
    }
}

/* ---- counters --------------------------------------------------------------------------- */

void hp_comm_count_op(hp_comm_op_t op, size_t bytes) {
    __atomic_fetch_add(&g_calls[op], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&g_bytes[op], (uint64_t)bytes, __ATOMIC_RELAXED);
}

void hp_comm_counts_get(hp_comm_counts_t *out) {
    for (int i = 0; i < HP_COMM_OP_COUNT; i++) {
        out->calls[i] = __atomic_load_n(&g_calls[i], __ATOMIC_RELAXED);
        out->bytes[i] = __atomic_load_n(&g_bytes[i], __ATOMIC_RELAXED);
    }
}

void hp_comm_counts_reset(void) {
    for (int i = 0; i < HP_COMM_OP_COUNT; i++) {
        __atomic_store_n(&g_calls[i], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&g_bytes[i], 0, __ATOMIC_RELAXED);
    }
}

uint64_t hp_comm_count(hp_comm_op_t op) {
    if (op < 0 || op >= HP_COMM_OP_COUNT) return 0;
    return __atomic_load_n(&g_calls[op], __ATOMIC_RELAXED);
}

uint64_t hp_comm_count_total(void) {
    uint64_t t = 0;
    for (int i = 0; i < HP_COMM_OP_COUNT; i++) t += __atomic_load_n(&g_calls[i], __ATOMIC_RELAXED);
    return t;
}

/* ---- timeout and watchdog --------------------------------------------------------------- */

void hp_comm_set_timeout(double seconds) {
    if (!(seconds > 0)) {
        hp_log(HP_LOG_WARN, "hp_comm_set_timeout(%g): expected a positive number of seconds; "
               "keeping %g", seconds, hp_comm_g.timeout);
        return;
    }
    hp_comm_g.timeout = seconds;
    pthread_cond_signal(&hp_comm_g.wd_cv);   /* re-evaluate the check interval */
}

double hp_comm_get_timeout(void) { return hp_comm_g.timeout; }

/* After the job was told to end (MPI_Abort), a rank must not outlive it: MPI_Abort can wait
 * for a launcher that cannot reach a lost host ("abort is already in progress"), so a helper
 * thread ends this process HP_ABORT_GRACE_S later whatever MPI does. */
#define HP_ABORT_GRACE_S 5

static void *hard_exit_main(void *arg) {
    struct timespec ts = {HP_ABORT_GRACE_S, 0};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    _exit((int)(intptr_t)arg);
}

static _Noreturn void end_job(void *ctx, int code) {
    pthread_t t;
    if (pthread_create(&t, NULL, hard_exit_main, (void *)(intptr_t)code) == 0) pthread_detach(t);
    hp_comm_g.be->abort_job(ctx, code);
}

_Noreturn void hp_comm_timeout_abort(int kind, hp_comm_t comm, double elapsed) {
    char hosts[256] = "", lost[512] = "", msg[1200];
    hp_comm_health_describe(comm, hosts, sizeof hosts);
    int have_lost = hp_comm_health_lost(comm, hp_clock_now_seconds(), lost, sizeof lost);
    snprintf(msg, sizeof msg, "timeout: %s on a communicator of %d ranks%s%s%s did not complete after %.1f s "
             "(timeout %.1f s, set by HP_COMM_TIMEOUT or hp_comm_set_timeout); %s%s",
             hp_comm_op_name((hp_comm_op_t)kind), comm ? comm->size : 0, hosts[0] ? " (" : "", hosts,
             hosts[0] ? ")" : "", elapsed, hp_comm_g.timeout, have_lost ? lost : "",
             have_lost ? ": that host is probably lost (dead, frozen or cut off)"
                       : "another rank probably failed or skipped this call");
    fprintf(stderr, "[rank %d] hp_comm: %s. Aborting the job.\n", hp_log_get_rank(), msg);
    fflush(stderr);
    hp_comm_health_report(msg);
    end_job(NULL, 3);
}

static wd_slot_t *my_slot(void) {
    if (t_slot) return t_slot;
    for (int i = 0; i < HP_WD_SLOTS; i++) {
        if (__sync_bool_compare_and_swap(&hp_comm_g.slots[i].in_use, 0, 1)) {
            t_slot = &hp_comm_g.slots[i];
            return t_slot;
        }
    }
    return NULL;   /* more threads than slots: those calls run unwatched (documented) */
}

/* Two stores per call and no clock read: the watchdog notices a sequence number that stays
 * odd (in flight) across ticks and measures from when it first saw it. */
void hp_comm_wd_begin(int kind, hp_comm_t comm) {
    wd_slot_t *s = my_slot();
    if (!s) return;
    s->kind = kind;
    s->comm = comm;
    __atomic_store_n(&s->seq, s->seq + 1, __ATOMIC_RELEASE);
}

void hp_comm_wd_end(void) {
    if (t_slot) __atomic_store_n(&t_slot->seq, t_slot->seq + 1, __ATOMIC_RELEASE);
}

static void *wd_main(void *arg) {
    pthread_mutex_lock(&hp_comm_g.wd_lock);
    while (!hp_comm_g.wd_stop) {
        double interval = hp_comm_g.timeout / 20;
        if (interval > 0.25) interval = 0.25;   /* also the heartbeat period (comm_health.c) */
        if (interval < 0.01) interval = 0.01;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + interval;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&hp_comm_g.wd_cv, &hp_comm_g.wd_lock, &ts);
        if (hp_comm_g.wd_stop) break;
        double now = hp_clock_now_seconds();
        hp_comm_health_tick(now);
        for (int i = 0; i < HP_WD_SLOTS; i++) {
            wd_slot_t *s = &hp_comm_g.slots[i];
            uint64_t seq = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
            if (!(seq & 1)) continue;
            if (seq != s->seen_seq) {
                s->seen_seq = seq;
                s->seen_at = now;
            } else if (now - s->seen_at > hp_comm_g.timeout) {
                hp_comm_timeout_abort(s->kind, s->comm, now - s->seen_at);
            }
        }
    }
    pthread_mutex_unlock(&hp_comm_g.wd_lock);
    return NULL;
}

/* ---- lifetime ---------------------------------------------------------------------------- */

static void abort_hook(const char *message, void *ctx) {
    fprintf(stderr, "[rank %d] hp_comm: fatal error, ending every rank of the job with MPI_Abort\n",
            hp_log_get_rank());
    fflush(stderr);
    hp_comm_health_report(message ? message : "fatal error");
    if (hp_comm_g.be) end_job(NULL, 1);
}

/* A communicator over the backend context ctx (freed when the allocation fails). */
static hp_status_t comm_new(const hp_comm_backend_t *be, void *ctx, int rank, int size, int world_rank,
                            hp_comm_t *out) {
    hp_comm_t c = hp_calloc(1, sizeof *c);
    if (!c) {
        be->free_ctx(ctx);
        return HP_ERR_OOM;
    }
    c->be = be;
    c->ctx = ctx;
    c->rank = rank;
    c->size = size;
    c->world_rank = world_rank;
    if (hp_comm_g.initialised) {   /* not the world itself: its members are the identity */
        hp_status_t st = HP_ERR_OOM;
        c->members = hp_malloc((size_t)size * sizeof *c->members);
        if (!c->members || (st = be->world_ranks(ctx, size, c->members)) != HP_OK) {
            free(c->members);
            be->free_ctx(ctx);
            free(c);
            return st;
        }
    }
    *out = c;
    return HP_OK;
}

hp_status_t hp_comm_init(int *argc, char ***argv, hp_comm_t *world) {
    if (!world) return hp_error(HP_ERR_INVALID_ARG, "hp_comm_init: world must not be NULL");
    if (hp_comm_g.initialised) {
        *world = hp_comm_g.world;
        return HP_OK;
    }
    const char *env = getenv("HP_COMM_TIMEOUT");
    if (env && *env) {
        char *end = NULL;
        double t = strtod(env, &end);
        if (end == env || *end || !(t > 0))
            return hp_error(HP_ERR_INVALID_ARG, "HP_COMM_TIMEOUT='%s': expected a positive "
                            "number of seconds (e.g. 300)", env);
        hp_comm_g.timeout = t;
    }
    hp_comm_g.progress = HP_PROGRESS_POLL;
    env = getenv("HP_COMM_PROGRESS");
    if (env && *env) {
        int found = 0;
        for (int i = 0; i < 3; i++)
            if (!strcmp(env, k_progress_names[i])) hp_comm_g.progress = i, found = 1;
        if (!found)
            return hp_error(HP_ERR_INVALID_ARG, "HP_COMM_PROGRESS='%s': expected poll, thread "
                            "or none", env);
    }
    hp_comm_g.poll_interval_s = 20e-6;
    env = getenv("HP_COMM_POLL_US");
    if (env && *env) {
        double us;
        HP_TRY(hp_parse_f64("environment variable HP_COMM_POLL_US", env, 0.0, 1e6,
                            "microseconds between progress polls; default 20", &us));
        hp_comm_g.poll_interval_s = us * 1e-6;
    }

    const hp_comm_backend_t *be = &hp_comm_backend_mpi;
    void *ctx = NULL;
    int rank = 0, size = 1;
    HP_TRY(be->init(argc, argv, &ctx, &rank, &size));
    hp_comm_t w;
    HP_TRY(comm_new(be, ctx, rank, size, rank, &w));
    w->is_world = 1;
    hp_comm_g.be = be;
    hp_comm_g.world = w;
    hp_comm_g.live_comms = 0;
    hp_log_set_rank(rank);
    HP_TRY(hp_comm_health_init(be, ctx, rank, size));
    hp_set_abort_hook(abort_hook, NULL);
    hp_comm_g.wd_stop = 0;
    if (pthread_create(&hp_comm_g.wd_thread, NULL, wd_main, NULL) != 0)
        return hp_error(HP_ERR_STATE, "hp_comm_init: cannot start the watchdog thread");
    hp_comm_g.wd_started = 1;
    hp_comm_g.initialised = 1;
    *world = w;
    return HP_OK;
}

/* Stops a helper thread (progress, watchdog): sets *stop under its lock, wakes it, joins it. */
static void stop_thread(pthread_mutex_t *lock, pthread_cond_t *cv, int *stop, int *started, pthread_t thread) {
    pthread_mutex_lock(lock);
    *stop = 1;
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(lock);
    if (*started) pthread_join(thread, NULL);
    *started = 0;
}

hp_status_t hp_comm_finalize(void) {
    if (!hp_comm_g.initialised) return hp_error(HP_ERR_STATE, "hp_comm_finalize: not initialised "
                                        "(hint: call hp_comm_init first)");
    hp_status_t st = HP_OK;
    if (hp_comm_g.live_comms > 0)
        st = hp_error(HP_ERR_STATE, "hp_comm_finalize: %d communicator(s) were not destroyed "
                      "(hint: hp_comm_destroy every split/dup result first)", hp_comm_g.live_comms);
    if (hp_comm_g.world->pending > 0)
        st = hp_error(HP_ERR_STATE, "hp_comm_finalize: %d asynchronous operation(s) on the world "
                      "communicator were never waited", hp_comm_g.world->pending);
    stop_thread(&hp_comm_g.lock, &hp_comm_g.work_cv, &hp_comm_g.progress_stop, &hp_comm_g.progress_started,
                hp_comm_g.progress_thread);
    stop_thread(&hp_comm_g.wd_lock, &hp_comm_g.wd_cv, &hp_comm_g.wd_stop, &hp_comm_g.wd_started, hp_comm_g.wd_thread);
    hp_comm_work_pool_drain();
    hp_comm_health_fini();
    hp_comm_g.be->free_ctx(hp_comm_g.world->ctx);
    free(hp_comm_g.world);
    hp_comm_g.world = NULL;
    hp_status_t fs = hp_comm_g.be->finalize();
    if (st == HP_OK) st = fs;
    hp_set_abort_hook(NULL, NULL);
    hp_comm_g.initialised = 0;
    return st;
}

hp_status_t hp_comm_set_progress(const char *mode) {
    int m = -1;
    for (int i = 0; i < 3 && mode; i++)
        if (!strcmp(mode, k_progress_names[i])) m = i;
    if (m < 0)
        return hp_error(HP_ERR_INVALID_ARG, "hp_comm_set_progress('%s'): expected poll, thread or "
                        "none", mode ? mode : "(null)");
    pthread_mutex_lock(&hp_comm_g.lock);
    int busy = hp_comm_g.active_head != NULL || __atomic_load_n(&hp_comm_g.inflight, __ATOMIC_RELAXED) > 0;
    if (!busy) hp_comm_g.progress = m;
    pthread_mutex_unlock(&hp_comm_g.lock);
    if (busy)
        return hp_error(HP_ERR_STATE, "hp_comm_set_progress('%s'): asynchronous work is in flight "
                        "(hint: wait for it first)", mode);
    return HP_OK;
}

const char *hp_comm_get_progress(void) { return k_progress_names[hp_comm_g.progress]; }

hp_status_t hp_comm_check(hp_comm_t comm, const char *fn) {
    if (!comm) return hp_error(HP_ERR_INVALID_ARG, "%s: communicator is NULL (hint: a split with "
                               "color < 0 returns NULL on ranks outside every group)", fn);
    if (!hp_comm_g.initialised) return hp_error(HP_ERR_STATE, "%s: hp_comm is not initialised", fn);
    return HP_OK;
}

int hp_comm_rank(hp_comm_t comm) { return comm ? comm->rank : -1; }
int hp_comm_size(hp_comm_t comm) { return comm ? comm->size : 0; }
int hp_comm_world_rank(hp_comm_t comm) { return comm ? comm->world_rank : -1; }

hp_status_t hp_comm_split(hp_comm_t comm, int color, int key, hp_comm_t *out) {
    HP_TRY(hp_comm_check(comm, "hp_comm_split"));
    if (!out) return hp_error(HP_ERR_INVALID_ARG, "hp_comm_split: out must not be NULL");
    *out = NULL;
    void *ctx = NULL;
    int rank = -1, size = 0;
    hp_comm_wd_begin(HP_COMM_BARRIER, comm);
    hp_status_t st = comm->be->split(comm->ctx, color, key, &ctx, &rank, &size);
    hp_comm_wd_end();
    HP_TRY(st);
    if (!ctx) return HP_OK;
    HP_TRY(comm_new(comm->be, ctx, rank, size, comm->world_rank, out));
    hp_comm_g.live_comms++;
    return HP_OK;
}

hp_status_t hp_comm_dup(hp_comm_t comm, hp_comm_t *out) {
    HP_TRY(hp_comm_check(comm, "hp_comm_dup"));
    if (!out) return hp_error(HP_ERR_INVALID_ARG, "hp_comm_dup: out must not be NULL");
    void *ctx = NULL;
    int rank = -1, size = 0;
    hp_comm_wd_begin(HP_COMM_BARRIER, comm);
    hp_status_t st = comm->be->dup(comm->ctx, &ctx, &rank, &size);
    hp_comm_wd_end();
    HP_TRY(st);
    HP_TRY(comm_new(comm->be, ctx, rank, size, comm->world_rank, out));
    hp_comm_g.live_comms++;
    return HP_OK;
}

/* The world communicator belongs to the runtime: destroying it is a no-op and
 * hp_comm_finalize frees it. */
hp_status_t hp_comm_destroy(hp_comm_t comm) {
    if (!comm || comm->is_world) return HP_OK;
    if (comm->pending > 0)
        return hp_error(HP_ERR_STATE, "hp_comm_destroy: %d asynchronous operation(s) on this "
                        "communicator (size %d) were not waited (hint: hp_work_wait them first)",
                        comm->pending, comm->size);
    comm->be->free_ctx(comm->ctx);
    free(comm->members);
    free(comm);
    hp_comm_g.live_comms--;
    return HP_OK;
}

_Noreturn void hp_comm_abort(hp_comm_t comm, int code, const char *message) {
    fprintf(stderr, "[rank %d] hp_comm_abort (code %d): %s\n", hp_log_get_rank(), code,
            message ? message : "");
    fflush(stderr);
    hp_comm_health_report(message ? message : "hp_comm_abort");
    if (hp_comm_g.be) end_job(comm ? comm->ctx : NULL, code);
    exit(code ? code : 1);
}

hp_status_t hp_redop_create_premul_sum(double scalar, hp_comm_t comm, hp_redop_t *op) {
    HP_TRY(hp_comm_check(comm, "hp_redop_create_premul_sum"));
    if (!op) return hp_error(HP_ERR_INVALID_ARG, "hp_redop_create_premul_sum: op must not be NULL");
    if (!isfinite(scalar))
        return hp_error(HP_ERR_INVALID_ARG, "hp_redop_create_premul_sum: scalar %g is not finite",
                        scalar);
    for (int i = 0; i < HP_COMM_MAX_PREMUL; i++) {
        if (!comm->premul_used[i]) {
            comm->premul_used[i] = 1;
            comm->premul[i] = scalar;
            *op = (hp_redop_t)(HP_REDOP_BUILTIN_COUNT + i);
            return HP_OK;
        }
    }
    return hp_error(HP_ERR_OOM, "hp_redop_create_premul_sum: %d PREMUL_SUM ops already exist on "
                    "this communicator (hint: hp_redop_destroy unused ones)", HP_COMM_MAX_PREMUL);
}

hp_status_t hp_redop_destroy(hp_redop_t op, hp_comm_t comm) {
    HP_TRY(hp_comm_check(comm, "hp_redop_destroy"));
    int i = (int)op - HP_REDOP_BUILTIN_COUNT;
    if (i < 0 || i >= HP_COMM_MAX_PREMUL || !comm->premul_used[i])
        return hp_error(HP_ERR_INVALID_ARG, "hp_redop_destroy: op %d is not a PREMUL_SUM op "
                        "created on this communicator", (int)op);
    comm->premul_used[i] = 0;
    return HP_OK;
}
