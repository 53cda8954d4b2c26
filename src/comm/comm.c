/* hp_comm front end: argument checks, counters, dtype and op lowering (BF16/F16 widened to
 * F32, AVG = SUM then divide, PREMUL_SUM = scale then SUM), in-place rules, the pool of work
 * handles, asynchronous progress, group batching of point-to-point, and the timeout watchdog.
 * The backend table (comm-impl.h) does the moving; MPI is the only backend today. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyperparallel/parse.h"
#include "comm/comm-impl.h"

/* ---- process-wide state ---------------------------------------------------------------- */

enum { HP_PROGRESS_POLL = 0, HP_PROGRESS_THREAD, HP_PROGRESS_NONE };
static const char *const k_progress_names[] = {"poll", "thread", "none"};

#define HP_WD_SLOTS 16

typedef struct wd_slot {
    volatile int in_use;
    uint64_t seq;                   /* odd while a call is in flight; atomic access */
    volatile int kind;
    volatile int comm_size;
    uint64_t seen_seq;              /* watchdog thread only: last odd seq observed ... */
    double seen_at;                 /* ... and when it was first observed */
} wd_slot_t;

static struct {
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
} g = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .work_cv = PTHREAD_COND_INITIALIZER,
    .done_cv = PTHREAD_COND_INITIALIZER,
    .wd_lock = PTHREAD_MUTEX_INITIALIZER,
    .wd_cv = PTHREAD_COND_INITIALIZER,
    .timeout = 300.0,
};

static uint64_t g_allocs;   /* allocations made for collectives (pool, workspaces, storage) */

uint64_t hp_comm_debug_allocs(void) { return __atomic_load_n(&g_allocs, __ATOMIC_RELAXED); }
#define COUNT_ALLOC() __atomic_fetch_add(&g_allocs, 1, __ATOMIC_RELAXED)

static uint64_t g_calls[HP_COMM_OP_COUNT];
static uint64_t g_bytes[HP_COMM_OP_COUNT];

static __thread wd_slot_t *t_slot;
static __thread int t_group_depth;
static __thread hp_work_t t_group_work;

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

static void count_op(hp_comm_op_t op, size_t bytes) {
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
               "keeping %g", seconds, g.timeout);
        return;
    }
    g.timeout = seconds;
    pthread_cond_signal(&g.wd_cv);   /* re-evaluate the check interval */
}

double hp_comm_get_timeout(void) { return g.timeout; }

static _Noreturn void timeout_abort(int kind, int comm_size, double elapsed) {
    fprintf(stderr, "[rank %d] hp_comm: timeout: %s on a communicator of %d ranks did not "
            "complete after %.1f s (timeout %.1f s, set by HP_COMM_TIMEOUT or "
            "hp_comm_set_timeout); another rank probably failed or skipped this call. "
            "Aborting the job.\n", hp_log_get_rank(), hp_comm_op_name((hp_comm_op_t)kind),
            comm_size, elapsed, g.timeout);
    fflush(stderr);
    g.be->abort_job(NULL, 3);
}

static wd_slot_t *my_slot(void) {
    if (t_slot) return t_slot;
    for (int i = 0; i < HP_WD_SLOTS; i++) {
        if (__sync_bool_compare_and_swap(&g.slots[i].in_use, 0, 1)) {
            t_slot = &g.slots[i];
            return t_slot;
        }
    }
    return NULL;   /* more threads than slots: those calls run unwatched (documented) */
}

/* Two stores per call and no clock read: the watchdog notices a sequence number that stays
 * odd (in flight) across ticks and measures from when it first saw it. */
static void wd_begin(int kind, int comm_size) {
    wd_slot_t *s = my_slot();
    if (!s) return;
    s->kind = kind;
    s->comm_size = comm_size;
    __atomic_store_n(&s->seq, s->seq + 1, __ATOMIC_RELEASE);
}

static void wd_end(void) {
    if (t_slot) __atomic_store_n(&t_slot->seq, t_slot->seq + 1, __ATOMIC_RELEASE);
}

static void *wd_main(void *arg) {
    pthread_mutex_lock(&g.wd_lock);
    while (!g.wd_stop) {
        double interval = g.timeout / 20;
        if (interval > 0.25) interval = 0.25;
        if (interval < 0.01) interval = 0.01;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + interval;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&g.wd_cv, &g.wd_lock, &ts);
        if (g.wd_stop) break;
        double now = hp_clock_now_seconds();
        for (int i = 0; i < HP_WD_SLOTS; i++) {
            wd_slot_t *s = &g.slots[i];
            uint64_t seq = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
            if (!(seq & 1)) continue;
            if (seq != s->seen_seq) {
                s->seen_seq = seq;
                s->seen_at = now;
            } else if (now - s->seen_at > g.timeout) {
                timeout_abort(s->kind, s->comm_size, now - s->seen_at);
            }
        }
    }
    pthread_mutex_unlock(&g.wd_lock);
    return NULL;
}

/* ---- work pool ------------------------------------------------------------------------- */

hp_status_t hp_breq_reserve(hp_breq_t *req, size_t bytes, size_t scratch_bytes) {
    if (bytes > req->h_cap) {
        COUNT_ALLOC();
        void *p = realloc(req->h, bytes);
        if (!p) return hp_error(HP_ERR_OOM, "hp_comm: cannot grow request storage to %zu bytes", bytes);
        req->h = p;
        req->h_cap = bytes;
    }
    if (scratch_bytes > req->scratch_cap) {
        COUNT_ALLOC();
        void *p = realloc(req->scratch, scratch_bytes);
        if (!p) return hp_error(HP_ERR_OOM, "hp_comm: cannot grow request scratch to %zu bytes",
                                scratch_bytes);
        req->scratch = p;
        req->scratch_cap = scratch_bytes;
    }
    return HP_OK;
}

static hp_status_t ws_reserve(hp_work_t w, size_t bytes) {
    if (bytes <= w->ws_cap) return HP_OK;
    hp_free_aligned(w->ws);
    COUNT_ALLOC();
    w->ws = hp_aligned_alloc(bytes);
    w->ws_cap = w->ws ? bytes : 0;
    if (!w->ws) return hp_error(HP_ERR_OOM, "hp_comm: cannot allocate a %zu-byte workspace", bytes);
    return HP_OK;
}

/* One-slot per-thread cache in front of the pool, for blocking calls only: a thread issuing
 * blocking calls reuses the same work (and its workspace) without taking the pool lock, and
 * asynchronous calls take pool works in LIFO order, so a program that repeats the same
 * sequence of calls gets the same work objects every step and stops allocating after the
 * first step. */
static __thread hp_work_t t_cached_work;

static hp_status_t work_get(hp_comm_t comm, int blocking, hp_work_t *out) {
    hp_work_t w = blocking ? t_cached_work : NULL;
    if (w) {
        t_cached_work = NULL;
    } else {
        pthread_mutex_lock(&g.lock);
        w = g.free_list;
        if (w) g.free_list = w->next;
        pthread_mutex_unlock(&g.lock);
    }
    if (!w) {
        COUNT_ALLOC();
        w = hp_calloc(1, sizeof *w);
        if (!w) return HP_ERR_OOM;
        pthread_mutex_lock(&g.lock);
        g.n_works++;
        pthread_mutex_unlock(&g.lock);
    }
    w->next = NULL;
    w->comm = comm;
    w->async = 0;
    w->started = 0;
    w->done = 0;
    w->status = HP_OK;
    w->errmsg[0] = '\0';
    w->req.n = 0;
    w->req.machine = 0;
    w->post = 0;
    w->p2p_n = 0;
    *out = w;
    return HP_OK;
}

static void work_put(hp_work_t w) {
    if (!w->async && !t_cached_work) {
        t_cached_work = w;
        return;
    }
    pthread_mutex_lock(&g.lock);
    w->next = g.free_list;
    g.free_list = w;
    pthread_mutex_unlock(&g.lock);
}

static void work_free(hp_work_t w) {
    free(w->req.h);
    free(w->req.scratch);
    hp_free_aligned(w->ws);
    free(w->vcounts);
    free(w->p2p);
    free(w);
}

/* ---- lowering helpers ------------------------------------------------------------------ */

static int is_half(hp_dtype_t dt) { return dt == HP_BF16 || dt == HP_F16; }

static hp_status_t host_scale(void *dst, const void *src, size_t n, hp_dtype_t dt, double s) {
    switch (dt) {
    case HP_F32: {
        float *d = dst;
        const float *x = src;
        float f = (float)s;
        for (size_t i = 0; i < n; i++) d[i] = x[i] * f;
        return HP_OK;
    }
    case HP_I32: case HP_I64: case HP_U8: {
        if (s != floor(s))
            return hp_error(HP_ERR_INVALID_ARG, "PREMUL_SUM scalar %g on integer dtype %s: "
                            "expected an integral scalar (hint: use a float dtype)", s,
                            hp_dtype_name(dt));
        if (dt == HP_I32) {
            int32_t *d = dst, f = (int32_t)s;
            const int32_t *x = src;
            for (size_t i = 0; i < n; i++) d[i] = (int32_t)((uint32_t)x[i] * (uint32_t)f);
        } else if (dt == HP_I64) {
            int64_t *d = dst, f = (int64_t)s;
            const int64_t *x = src;
            for (size_t i = 0; i < n; i++) d[i] = (int64_t)((uint64_t)x[i] * (uint64_t)f);
        } else {
            uint8_t *d = dst, f = (uint8_t)(int64_t)s;
            const uint8_t *x = src;
            for (size_t i = 0; i < n; i++) d[i] = (uint8_t)(x[i] * f);
        }
        return HP_OK;
    }
    default:
        return hp_error(HP_ERR_UNSUPPORTED, "PREMUL_SUM on dtype %s", hp_dtype_name(dt));
    }
}

static void divide(void *buf, size_t n, hp_dtype_t dt, int size) {
    switch (dt) {
    case HP_F32: {
        float *b = buf;
        float f = (float)size;
        for (size_t i = 0; i < n; i++) b[i] /= f;
        break;
    }
    case HP_I32: { int32_t *b = buf; for (size_t i = 0; i < n; i++) b[i] /= size; break; }
    case HP_I64: { int64_t *b = buf; for (size_t i = 0; i < n; i++) b[i] /= size; break; }
    case HP_U8: { uint8_t *b = buf; for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(b[i] / size); break; }
    default: break;
    }
}

/* Runs in the thread that completes the work (waiter, or caller of a blocking op). */
/* The backend's convert / scale slots, or the host ones. */
static void be_convert(hp_comm_t c, void *dst, hp_dtype_t dd, const void *src, hp_dtype_t sd, size_t n) {
    if (c->be->convert) c->be->convert(dst, dd, src, sd, n);
    else hp_convert(dst, dd, src, sd, n);
}
static hp_status_t be_scale(hp_comm_t c, void *dst, const void *src, size_t n, hp_dtype_t dt, double s) {
    return c->be->scale ? c->be->scale(dst, src, n, dt, s) : host_scale(dst, src, n, dt, s);
}

static void post_process(hp_work_t w) {
    if (w->post & HP_POST_MOVE)
        memmove(w->post_dst, w->post_src, w->post_n * hp_dtype_size(w->post_dt));
    if (w->post & HP_POST_DIV) divide(w->post_buf, w->post_n, w->post_dt, w->comm->size);
    if (w->post & HP_POST_NARROW)
        be_convert(w->comm, w->post_dst, w->d.dt, w->post_src, HP_F32, w->post_n);
    w->post = 0;
}

static int use_ring(const hp_work_t w);

/* Starts (async = 1) or runs to completion (async = 0) the backend part of w. */
static hp_status_t run_op(hp_work_t w, int async) {
    const hp_op_desc_t *d = &w->d;
    hp_comm_t c = w->comm;
    const hp_comm_backend_t *be = c->be;
    size_t n = d->count, es = hp_dtype_size(d->dt);
    int avg = d->op == HP_AVG;
    hp_redop_t op = (avg || d->is_premul) ? HP_SUM : d->op;
    int widen = is_half(d->dt) && !be->native_half_reduce;
    int ring = use_ring(w);   /* large all_reduce / reduce_scatter on >= 3 ranks */
    w->req.n = 0;
    w->req.machine = 0;
    w->post = 0;
    w->post_n = n;
    switch (d->kind) {
    case HP_COMM_ALL_REDUCE:
        if (widen) {
            HP_TRY(ws_reserve(w, n * sizeof(float)));
            float *ws = w->ws;   // (n) f32 accumulation buffer
            be_convert(c, ws, HP_F32, d->sendbuf, d->dt, n);
            if (d->is_premul) HP_TRY(be_scale(c, ws, ws, n, HP_F32, d->premul));
            w->post = HP_POST_NARROW | (avg ? HP_POST_DIV : 0);
            w->post_buf = ws, w->post_src = ws, w->post_dst = d->recvbuf, w->post_dt = HP_F32;
            if (ring) return be->all_reduce_ring(c->ctx, ws, ws, n, HP_F32, op, &w->req, async);
            return be->all_reduce(c->ctx, ws, ws, n, HP_F32, op, &w->req, async);
        } else {
            const void *s = d->sendbuf;
            if (d->is_premul) {   /* scaled copy in recvbuf, then reduce in place */
                HP_TRY(be_scale(c, d->recvbuf, d->sendbuf, n, d->dt, d->premul));
                s = d->recvbuf;
            }
            if (avg) w->post = HP_POST_DIV, w->post_buf = d->recvbuf, w->post_dt = d->dt;
            if (ring) return be->all_reduce_ring(c->ctx, s, d->recvbuf, n, d->dt, op, &w->req, async);
            return be->all_reduce(c->ctx, s, d->recvbuf, n, d->dt, op, &w->req, async);
        }
    case HP_COMM_REDUCE: {
        int root = c->rank == d->root;
        if (widen) {
            HP_TRY(ws_reserve(w, n * sizeof(float)));
            float *ws = w->ws;   // (n) f32
            be_convert(c, ws, HP_F32, d->sendbuf, d->dt, n);
            if (d->is_premul) HP_TRY(be_scale(c, ws, ws, n, HP_F32, d->premul));
            if (root) {
                w->post = HP_POST_NARROW | (avg ? HP_POST_DIV : 0);
                w->post_buf = ws, w->post_src = ws, w->post_dst = d->recvbuf, w->post_dt = HP_F32;
            }
            return be->reduce(c->ctx, ws, ws, n, HP_F32, op, d->root, &w->req, async);
        }
        const void *s = d->sendbuf;
        if (d->is_premul) {
            void *dst = d->recvbuf;
            if (!root) {
                HP_TRY(ws_reserve(w, n * es));
                dst = w->ws;
            }
            HP_TRY(be_scale(c, dst, d->sendbuf, n, d->dt, d->premul));
            s = dst;
        }
        if (root && avg) w->post = HP_POST_DIV, w->post_buf = d->recvbuf, w->post_dt = d->dt;
        /* Non-root: recvbuf is not significant; pass the send buffer so no NULL reaches MPI. */
        void *r = root ? d->recvbuf : (void *)s;
        return be->reduce(c->ctx, s, r, n, d->dt, op, d->root, &w->req, async);
    }
    case HP_COMM_REDUCE_SCATTER: {
        size_t total = n * (size_t)c->size;
        if (widen) {
            HP_TRY(ws_reserve(w, (total + n) * sizeof(float)));
            float *ws = w->ws;          // (size*n) f32 input
            /* (n) f32 result; the ring reduces in place in the widened copy (no
             * accumulation workspace), leaving it in this rank's block */
            float *out = ring ? ws + (size_t)c->rank * n : ws + total;
            be_convert(c, ws, HP_F32, d->sendbuf, d->dt, total);
            if (d->is_premul) HP_TRY(be_scale(c, ws, ws, total, HP_F32, d->premul));
            w->post = HP_POST_NARROW | (avg ? HP_POST_DIV : 0);
            w->post_buf = out, w->post_src = out, w->post_dst = d->recvbuf, w->post_dt = HP_F32;
            if (ring) return be->reduce_scatter_ring(c->ctx, ws, out, n, HP_F32, op, &w->req, async);
            return be->reduce_scatter(c->ctx, ws, out, n, HP_F32, op, &w->req, async);
        }
        int inplace = (const char *)d->recvbuf == (const char *)d->sendbuf + (size_t)c->rank * n * es;
        const void *s = d->sendbuf;
        void *r = d->recvbuf;
        if (d->is_premul) {
            if (inplace) {
                HP_TRY(be_scale(c, (void *)d->sendbuf, d->sendbuf, total, d->dt, d->premul));
            } else {
                HP_TRY(ws_reserve(w, total * es));
                HP_TRY(be_scale(c, w->ws, d->sendbuf, total, d->dt, d->premul));
                s = w->ws;
            }
        }
        if (inplace && n > 0 && !ring) {
            /* The backend leaves an in-place result at the start of the buffer (the ring
             * writes it at recvbuf). */
            if (c->rank != 0) {
                w->post |= HP_POST_MOVE;
                w->post_src = s, w->post_dst = r, w->post_dt = d->dt;
            }
        }
        if (avg) w->post |= HP_POST_DIV, w->post_buf = r, w->post_dt = d->dt;
        if (ring) return be->reduce_scatter_ring(c->ctx, s, r, n, d->dt, op, &w->req, async);
        return be->reduce_scatter(c->ctx, s, r, n, d->dt, op, &w->req, async);
    }
    case HP_COMM_BROADCAST:
        return be->broadcast(c->ctx, d->recvbuf, n, d->dt, d->root, &w->req, async);
    case HP_COMM_ALL_GATHER:
        return be->all_gather(c->ctx, d->sendbuf, d->recvbuf, n, d->dt, &w->req, async);
    case HP_COMM_ALL_TO_ALL: {
        const void *s = d->sendbuf;
        if (s == d->recvbuf && n > 0) {   /* in place: send from a copy */
            size_t bytes = n * (size_t)c->size * es;
            HP_TRY(ws_reserve(w, bytes));
            memcpy(w->ws, s, bytes);
            s = w->ws;
        }
        return be->all_to_all(c->ctx, s, d->recvbuf, n, d->dt, &w->req, async);
    }
    case HP_COMM_ALL_TO_ALL_V: {
        const void *s = d->sendbuf;
        if (s == d->recvbuf && s) {
            size_t extent = 0;
            for (int i = 0; i < c->size; i++)
                if (d->sd[i] + d->sc[i] > extent) extent = d->sd[i] + d->sc[i];
            HP_TRY(ws_reserve(w, extent * es));
            memcpy(w->ws, s, extent * es);
            s = w->ws;
        }
        return be->all_to_all_v(c->ctx, s, d->sc, d->sd, d->recvbuf, d->rc, d->rd, d->dt,
                                &w->req, async);
    }
    case HP_COMM_GATHER:
        return be->gather(c->ctx, d->sendbuf, d->recvbuf, n, d->dt, d->root, &w->req, async);
    case HP_COMM_SCATTER:
        return be->scatter(c->ctx, d->sendbuf, d->recvbuf, n, d->dt, d->root, &w->req, async);
    case HP_COMM_BARRIER:
        return be->barrier(c->ctx, &w->req, async);
    case HP_COMM_SEND:
    case HP_COMM_RECV:
        return be->p2p(w->p2p, w->p2p_n, &w->req, async);
    default:
        return hp_error(HP_ERR_STATE, "hp_comm: unknown op kind %d", (int)d->kind);
    }
}

/* Reductions up to this many send-side bytes use the blocking MPI call everywhere (an
 * asynchronous one completes inside the call); larger ones use the non-blocking call
 * everywhere. See run_to_completion. */
#define HP_SMALL_REDUCTION_BYTES ((size_t)256 << 10)

static int g_force_ring;   /* tests: every all_reduce / reduce_scatter is "large" */

void hp_comm_debug_force_ring(int on) { g_force_ring = on; }

/* 0: not a reduction; 1: small reduction (blocking algorithm); 2: large (the ring on 3 or
 * more ranks, else the non-blocking MPI call). */
static int reduction_class(const hp_work_t w) {
    hp_comm_op_t k = w->d.kind;
    if (k != HP_COMM_ALL_REDUCE && k != HP_COMM_REDUCE && k != HP_COMM_REDUCE_SCATTER) return 0;
    if (g_force_ring && k != HP_COMM_REDUCE) return 2;
    size_t bytes = w->d.count * hp_dtype_size(w->d.dt);
    if (k == HP_COMM_REDUCE_SCATTER) bytes *= (size_t)w->comm->size;
    return bytes <= HP_SMALL_REDUCTION_BYTES ? 1 : 2;
}

/* Large all_reduce and reduce_scatter on 3 or more ranks run the backend's ring (a
 * deterministic reduce-scatter over point-to-point, plus an all-gather for all_reduce):
 * bandwidth-optimal, the same bits however it is completed, and faster than Open MPI's
 * non-blocking algorithms (docs/comm.md "Determinism", docs/performance.md). reduce (to a
 * root) keeps the non-blocking MPI call. */
static int use_ring(const hp_work_t w) {
    const hp_comm_backend_t *be = w->comm->be;
    hp_comm_op_t k = w->d.kind;
    if (w->comm->size < 3 || reduction_class(w) != 2) return 0;
    return (k == HP_COMM_ALL_REDUCE && be->all_reduce_ring) ||
           (k == HP_COMM_REDUCE_SCATTER && be->reduce_scatter_ring);
}

/* Runs w to completion in the calling thread. Open MPI's blocking and non-blocking
 * collectives pick different algorithms, so their float sums can differ in the last bits; a
 * result must not depend on whether the caller passed a work handle or on the progress
 * mode. So the algorithm is a function of the size only: large reductions always run the
 * started form (the ring, or for reduce the non-blocking call; blocking = start, then the
 * backend's wait), small ones always the blocking call (libnbc costs 2-3x there). Data
 * movement is exact either way. */
static hp_status_t run_to_completion(hp_work_t w) {
    /* Two ranks: every element is a op b on both sides and IEEE +, *, max, min are
     * commutative, so the blocking algorithm gives the same bits as the non-blocking one
     * while being faster at 1-16 MiB (bench/collectives, docs/performance.md). */
    if (reduction_class(w) != 2 || w->comm->size <= 2) return run_op(w, 0);
    HP_TRY(run_op(w, 1));
    return w->comm->be->wait(&w->req);   /* the watchdog slot of the caller covers this */
}

/* ---- progress ---------------------------------------------------------------------------- */

static void list_push(hp_work_t w) {   /* g.lock held */
    w->next = NULL;
    if (g.active_tail) g.active_tail->next = w;
    else g.active_head = w;
    g.active_tail = w;
}

static void finish_in_helper(hp_work_t w, hp_status_t st) {   /* g.lock held */
    w->status = st;
    if (st != HP_OK) snprintf(w->errmsg, sizeof w->errmsg, "%s", hp_last_error());
    w->done = 1;
    w->comm->pending--, __atomic_fetch_sub(&g.inflight, 1, __ATOMIC_RELAXED);
}

/* Tests every started request on the list; returns how many completed. g.lock held. */
static int test_started(void) {
    int completed = 0;
    hp_work_t prev = NULL, w = g.active_head;
    while (w) {
        hp_work_t next = w->next;
        int done = 0;
        hp_status_t st = HP_OK;
        if (w->started) st = w->comm->be->test(&w->req, &done);
        if (w->started && (st != HP_OK || done)) {
            if (prev) prev->next = next;
            else g.active_head = next;
            if (g.active_tail == w) g.active_tail = prev;
            finish_in_helper(w, st);
            completed++;
        } else {
            prev = w;
        }
        w = next;
    }
    return completed;
}

/* POLL: tests every started request, sleeping poll_interval between rounds.
 * THREAD: runs queued collectives one at a time with blocking backend calls, in call order;
 * point-to-point (started non-blocking by the caller, so a pending receive cannot block a
 * later send) is tested between them as in POLL. */
static void *progress_main(void *arg) {
    pthread_mutex_lock(&g.lock);
    for (;;) {
        while (!g.progress_stop && !g.active_head) pthread_cond_wait(&g.work_cv, &g.lock);
        if (g.progress_stop) break;
        int completed = test_started();
        hp_work_t prev = NULL, q = g.active_head;
        while (q && q->started) prev = q, q = q->next;
        if (q) {
            if (prev) prev->next = q->next;
            else g.active_head = q->next;
            if (g.active_tail == q) g.active_tail = prev;
            pthread_mutex_unlock(&g.lock);
            wd_begin(q->d.kind, q->comm->size);
            hp_status_t st = run_to_completion(q);
            wd_end();
            pthread_mutex_lock(&g.lock);
            finish_in_helper(q, st);
            completed++;
        }
        if (completed) pthread_cond_broadcast(&g.done_cv);
        if (!q && g.active_head) {
            pthread_mutex_unlock(&g.lock);
            if (g.poll_interval_s > 0) {
                struct timespec ts = {0, (long)(g.poll_interval_s * 1e9)};
                nanosleep(&ts, NULL);
            } else {
                sched_yield();
            }
            pthread_mutex_lock(&g.lock);
        }
    }
    pthread_mutex_unlock(&g.lock);
    return NULL;
}

static hp_status_t progress_ensure(void) {   /* g.lock held */
    if (g.progress == HP_PROGRESS_NONE || g.progress_started) return HP_OK;
    g.progress_stop = 0;
    if (pthread_create(&g.progress_thread, NULL, progress_main, NULL) != 0)
        return hp_error(HP_ERR_STATE, "hp_comm: cannot start the progress thread (errno %d)", errno);
    g.progress_started = 1;
    return HP_OK;
}

/* Completes (blocking) or starts (async) a filled-in work. On the blocking path the work is
 * released here; on the async path *out receives it. */
static hp_status_t dispatch(hp_work_t w, hp_work_t *out) {
    hp_comm_t c = w->comm;
    int must_queue = 0;
    if (g.progress == HP_PROGRESS_THREAD && !out) {
        /* The communication thread may be inside a collective on this communicator: queue
         * behind it so the order of calls is the program order on every rank. */
        pthread_mutex_lock(&g.lock);
        must_queue = c->pending > 0;
        pthread_mutex_unlock(&g.lock);
    }
    if (!out && !must_queue) {
        wd_begin(w->d.kind, c->size);
        hp_status_t st = run_to_completion(w);
        wd_end();
        if (st == HP_OK) post_process(w);
        work_put(w);
        return st;
    }
    w->async = 1;
    w->t_start = hp_clock_now_seconds();   /* deadline of hp_work_wait / hp_work_test */
    pthread_mutex_lock(&g.lock);
    hp_status_t st = progress_ensure();
    if (st != HP_OK) {
        pthread_mutex_unlock(&g.lock);
        work_put(w);
        return st;
    }
    int is_p2p = w->d.kind == HP_COMM_SEND || w->d.kind == HP_COMM_RECV;
    if (g.progress == HP_PROGRESS_THREAD && !is_p2p) {
        c->pending++, __atomic_fetch_add(&g.inflight, 1, __ATOMIC_RELAXED);
        list_push(w);
        pthread_cond_signal(&g.work_cv);
        pthread_mutex_unlock(&g.lock);
    } else if (reduction_class(w) == 1) {
        /* small reduction: the blocking algorithm, completed here (see run_to_completion) */
        pthread_mutex_unlock(&g.lock);
        wd_begin(w->d.kind, c->size);
        st = run_op(w, 0);
        wd_end();
        if (st != HP_OK) {
            work_put(w);
            return st;
        }
        w->started = 1;
        w->done = 1;
    } else {
        pthread_mutex_unlock(&g.lock);
        st = run_op(w, 1);
        if (st != HP_OK) {
            work_put(w);
            return st;
        }
        w->started = 1;
        if (g.progress != HP_PROGRESS_NONE) {
            pthread_mutex_lock(&g.lock);
            c->pending++, __atomic_fetch_add(&g.inflight, 1, __ATOMIC_RELAXED);
            list_push(w);
            pthread_cond_signal(&g.work_cv);
            pthread_mutex_unlock(&g.lock);
        } else {
            c->pending++, __atomic_fetch_add(&g.inflight, 1, __ATOMIC_RELAXED);
        }
    }
    if (out) {
        *out = w;
        return HP_OK;
    }
    return hp_work_wait(&w);
}

/* One progress round from the caller's thread: tests the started requests under the lock
 * (so never concurrently with the progress thread) and reports whether w is done. */
static int caller_round(hp_work_t w) {
    pthread_mutex_lock(&g.lock);
    if (!w->done && w->started && test_started() > 0) pthread_cond_broadcast(&g.done_cv);
    int done = w->done;
    pthread_mutex_unlock(&g.lock);
    return done;
}

/* Checks completion without blocking; aborts the job past the timeout. */
static hp_status_t work_poll(hp_work_t w, int *done) {
    if (g.progress == HP_PROGRESS_NONE) {
        if (!w->done) {
            int d = 0;
            hp_status_t st = w->comm->be->test(&w->req, &d);
            if (st != HP_OK || d) {
                w->done = 1;
                w->status = st;
                if (st != HP_OK) snprintf(w->errmsg, sizeof w->errmsg, "%s", hp_last_error());
                w->comm->pending--, __atomic_fetch_sub(&g.inflight, 1, __ATOMIC_RELAXED);
            }
        }
        *done = w->done;
    } else {
        *done = caller_round(w);
        /* A queued collective needs the communication thread: a caller spinning on
         * hp_work_test must not starve it of the core. */
        if (!*done && !w->started) sched_yield();
    }
    if (!*done) {
        double el = hp_clock_now_seconds() - w->t_start;
        if (el > g.timeout) timeout_abort(w->d.kind, w->comm->size, el);
    }
    return HP_OK;
}

static hp_status_t work_complete(hp_work_t *work) {
    hp_work_t w = *work;
    hp_status_t st = w->status;
    if (st == HP_OK) post_process(w);
    else hp_error(st, "%s", w->errmsg);
    *work = NULL;
    work_put(w);
    return st;
}

hp_status_t hp_work_wait(hp_work_t *work) {
    if (!work || !*work) return hp_error(HP_ERR_INVALID_ARG, "hp_work_wait: NULL work handle "
                                         "(hint: a handle is released by the wait that completes it)");
    hp_work_t w = *work;
    if (g.progress == HP_PROGRESS_NONE || w->started) {
        /* Started requests: the waiter drives progress itself, as MPI_Wait would. */
        int done = 0;
        for (unsigned spins = 0;; spins++) {
            HP_TRY(work_poll(w, &done));
            if (done) break;
            if (spins > 1000) sched_yield();
        }
    } else {
        pthread_mutex_lock(&g.lock);
        while (!w->done) {
            double el = hp_clock_now_seconds() - w->t_start;
            if (el > g.timeout) {
                pthread_mutex_unlock(&g.lock);
                timeout_abort(w->d.kind, w->comm->size, el);
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100 * 1000 * 1000;
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&g.done_cv, &g.lock, &ts);
        }
        pthread_mutex_unlock(&g.lock);
    }
    return work_complete(work);
}

hp_status_t hp_work_test(hp_work_t *work, int *done) {
    if (!work || !*work || !done)
        return hp_error(HP_ERR_INVALID_ARG, "hp_work_test: NULL work handle or done pointer");
    HP_TRY(work_poll(*work, done));
    if (!*done) return HP_OK;
    return work_complete(work);
}

/* ---- lifetime ---------------------------------------------------------------------------- */

static void abort_hook(const char *message, void *ctx) {
    fprintf(stderr, "[rank %d] hp_comm: fatal error, ending every rank of the job with MPI_Abort\n",
            hp_log_get_rank());
    fflush(stderr);
    if (g.be) g.be->abort_job(NULL, 1);
}

static hp_status_t comm_new(hp_comm_t parent, void *ctx, int rank, int size, hp_comm_t *out) {
    hp_comm_t c = hp_calloc(1, sizeof *c);
    if (!c) {
        parent->be->free_ctx(ctx);
        return HP_ERR_OOM;
    }
    c->be = parent->be;
    c->ctx = ctx;
    c->rank = rank;
    c->size = size;
    c->world_rank = parent->world_rank;
    *out = c;
    return HP_OK;
}

hp_status_t hp_comm_init(int *argc, char ***argv, hp_comm_t *world) {
    if (!world) return hp_error(HP_ERR_INVALID_ARG, "hp_comm_init: world must not be NULL");
    if (g.initialised) {
        *world = g.world;
        return HP_OK;
    }
    const char *env = getenv("HP_COMM_TIMEOUT");
    if (env && *env) {
        char *end = NULL;
        double t = strtod(env, &end);
        if (end == env || *end || !(t > 0))
            return hp_error(HP_ERR_INVALID_ARG, "HP_COMM_TIMEOUT='%s': expected a positive "
                            "number of seconds (e.g. 300)", env);
        g.timeout = t;
    }
    g.progress = HP_PROGRESS_POLL;
    env = getenv("HP_COMM_PROGRESS");
    if (env && *env) {
        int found = 0;
        for (int i = 0; i < 3; i++)
            if (!strcmp(env, k_progress_names[i])) g.progress = i, found = 1;
        if (!found)
            return hp_error(HP_ERR_INVALID_ARG, "HP_COMM_PROGRESS='%s': expected poll, thread "
                            "or none", env);
    }
    g.poll_interval_s = 20e-6;
    env = getenv("HP_COMM_POLL_US");
    if (env && *env) {
        double us;
        HP_TRY(hp_parse_f64("environment variable HP_COMM_POLL_US", env, 0.0, 1e6,
                            "microseconds between progress polls; default 20", &us));
        g.poll_interval_s = us * 1e-6;
    }

    const hp_comm_backend_t *be = &hp_comm_backend_mpi;
    void *ctx = NULL;
    int rank = 0, size = 1;
    HP_TRY(be->init(argc, argv, &ctx, &rank, &size));
    hp_comm_t w = hp_calloc(1, sizeof *w);
    if (!w) return HP_ERR_OOM;
    w->be = be;
    w->ctx = ctx;
    w->rank = rank;
    w->size = size;
    w->world_rank = rank;
    w->is_world = 1;
    g.be = be;
    g.world = w;
    g.live_comms = 0;
    hp_log_set_rank(rank);
    hp_set_abort_hook(abort_hook, NULL);
    g.wd_stop = 0;
    if (pthread_create(&g.wd_thread, NULL, wd_main, NULL) != 0)
        return hp_error(HP_ERR_STATE, "hp_comm_init: cannot start the watchdog thread");
    g.wd_started = 1;
    g.initialised = 1;
    *world = w;
    return HP_OK;
}

hp_status_t hp_comm_finalize(void) {
    if (!g.initialised) return hp_error(HP_ERR_STATE, "hp_comm_finalize: not initialised "
                                        "(hint: call hp_comm_init first)");
    hp_status_t st = HP_OK;
    if (g.live_comms > 0)
        st = hp_error(HP_ERR_STATE, "hp_comm_finalize: %d communicator(s) were not destroyed "
                      "(hint: hp_comm_destroy every split/dup result first)", g.live_comms);
    if (g.world->pending > 0)
        st = hp_error(HP_ERR_STATE, "hp_comm_finalize: %d asynchronous operation(s) on the world "
                      "communicator were never waited", g.world->pending);
    pthread_mutex_lock(&g.lock);
    g.progress_stop = 1;
    pthread_cond_broadcast(&g.work_cv);
    pthread_mutex_unlock(&g.lock);
    if (g.progress_started) pthread_join(g.progress_thread, NULL);
    g.progress_started = 0;
    pthread_mutex_lock(&g.wd_lock);
    g.wd_stop = 1;
    pthread_cond_broadcast(&g.wd_cv);
    pthread_mutex_unlock(&g.wd_lock);
    if (g.wd_started) pthread_join(g.wd_thread, NULL);
    g.wd_started = 0;
    pthread_mutex_lock(&g.lock);
    if (t_cached_work) {   /* this thread's cached work goes back to be freed */
        t_cached_work->next = g.free_list;
        g.free_list = t_cached_work;
        t_cached_work = NULL;
    }
    while (g.free_list) {
        hp_work_t w = g.free_list;
        g.free_list = w->next;
        work_free(w);
        g.n_works--;
    }
    g.active_head = g.active_tail = NULL;
    pthread_mutex_unlock(&g.lock);
    g.be->free_ctx(g.world->ctx);
    free(g.world);
    g.world = NULL;
    hp_status_t fs = g.be->finalize();
    if (st == HP_OK) st = fs;
    hp_set_abort_hook(NULL, NULL);
    g.initialised = 0;
    return st;
}

hp_status_t hp_comm_set_progress(const char *mode) {
    int m = -1;
    for (int i = 0; i < 3 && mode; i++)
        if (!strcmp(mode, k_progress_names[i])) m = i;
    if (m < 0)
        return hp_error(HP_ERR_INVALID_ARG, "hp_comm_set_progress('%s'): expected poll, thread or "
                        "none", mode ? mode : "(null)");
    pthread_mutex_lock(&g.lock);
    int busy = g.active_head != NULL || __atomic_load_n(&g.inflight, __ATOMIC_RELAXED) > 0;
    if (!busy) g.progress = m;
    pthread_mutex_unlock(&g.lock);
    if (busy)
        return hp_error(HP_ERR_STATE, "hp_comm_set_progress('%s'): asynchronous work is in flight "
                        "(hint: wait for it first)", mode);
    return HP_OK;
}

const char *hp_comm_get_progress(void) { return k_progress_names[g.progress]; }

static hp_status_t check_comm(hp_comm_t comm, const char *fn) {
    if (!comm) return hp_error(HP_ERR_INVALID_ARG, "%s: communicator is NULL (hint: a split with "
                               "color < 0 returns NULL on ranks outside every group)", fn);
    if (!g.initialised) return hp_error(HP_ERR_STATE, "%s: hp_comm is not initialised", fn);
    return HP_OK;
}

int hp_comm_rank(hp_comm_t comm) { return comm ? comm->rank : -1; }
int hp_comm_size(hp_comm_t comm) { return comm ? comm->size : 0; }
int hp_comm_world_rank(hp_comm_t comm) { return comm ? comm->world_rank : -1; }

hp_status_t hp_comm_split(hp_comm_t comm, int color, int key, hp_comm_t *out) {
    HP_TRY(check_comm(comm, "hp_comm_split"));
    if (!out) return hp_error(HP_ERR_INVALID_ARG, "hp_comm_split: out must not be NULL");
    *out = NULL;
    void *ctx = NULL;
    int rank = -1, size = 0;
    wd_begin(HP_COMM_BARRIER, comm->size);
    hp_status_t st = comm->be->split(comm->ctx, color, key, &ctx, &rank, &size);
    wd_end();
    HP_TRY(st);
    if (!ctx) return HP_OK;
    HP_TRY(comm_new(comm, ctx, rank, size, out));
    g.live_comms++;
    return HP_OK;
}

hp_status_t hp_comm_dup(hp_comm_t comm, hp_comm_t *out) {
    HP_TRY(check_comm(comm, "hp_comm_dup"));
    if (!out) return hp_error(HP_ERR_INVALID_ARG, "hp_comm_dup: out must not be NULL");
    void *ctx = NULL;
    int rank = -1, size = 0;
    wd_begin(HP_COMM_BARRIER, comm->size);
    hp_status_t st = comm->be->dup(comm->ctx, &ctx, &rank, &size);
    wd_end();
    HP_TRY(st);
    HP_TRY(comm_new(comm, ctx, rank, size, out));
    g.live_comms++;
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
    free(comm);
    g.live_comms--;
    return HP_OK;
}

_Noreturn void hp_comm_abort(hp_comm_t comm, int code, const char *message) {
    fprintf(stderr, "[rank %d] hp_comm_abort (code %d): %s\n", hp_log_get_rank(), code,
            message ? message : "");
    fflush(stderr);
    if (g.be) g.be->abort_job(comm ? comm->ctx : NULL, code);
    exit(code ? code : 1);
}

hp_status_t hp_redop_create_premul_sum(double scalar, hp_comm_t comm, hp_redop_t *op) {
    HP_TRY(check_comm(comm, "hp_redop_create_premul_sum"));
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
    HP_TRY(check_comm(comm, "hp_redop_destroy"));
    int i = (int)op - HP_REDOP_BUILTIN_COUNT;
    if (i < 0 || i >= HP_COMM_MAX_PREMUL || !comm->premul_used[i])
        return hp_error(HP_ERR_INVALID_ARG, "hp_redop_destroy: op %d is not a PREMUL_SUM op "
                        "created on this communicator", (int)op);
    comm->premul_used[i] = 0;
    return HP_OK;
}

/* ---- argument checks --------------------------------------------------------------------- */

static hp_status_t check_dt(hp_dtype_t dt, const char *fn) {
    if ((int)dt < 0 || dt >= HP_DTYPE_COUNT)
        return hp_error(HP_ERR_INVALID_ARG, "%s: dtype %d is not a valid hp_dtype_t", fn, (int)dt);
    return HP_OK;
}

static hp_status_t check_buf(const void *p, size_t count, const char *what, const char *fn) {
    if (count > 0 && !p)
        return hp_error(HP_ERR_INVALID_ARG, "%s: %s is NULL but count is %zu", fn, what, count);
    return HP_OK;
}

static hp_status_t check_root(hp_comm_t c, int root, const char *fn) {
    if (root < 0 || root >= c->size)
        return hp_error(HP_ERR_INVALID_ARG, "%s: root %d is out of range for a communicator of "
                        "%d ranks (expected 0..%d)", fn, root, c->size, c->size - 1);
    return HP_OK;
}

/* Resolves the op into the descriptor: builtin, or SUM with a premul scalar. */
static hp_status_t check_op(hp_comm_t c, hp_redop_t op, hp_op_desc_t *d, const char *fn) {
    if (op >= 0 && op < HP_REDOP_BUILTIN_COUNT) {
        d->op = op;
        d->is_premul = 0;
        return HP_OK;
    }
    int i = (int)op - HP_REDOP_BUILTIN_COUNT;
    if (i < 0 || i >= HP_COMM_MAX_PREMUL || !c->premul_used[i])
        return hp_error(HP_ERR_INVALID_ARG, "%s: reduction op %d is neither a builtin (sum, prod, "
                        "max, min, avg) nor a PREMUL_SUM op created on this communicator", fn, (int)op);
    d->op = HP_SUM;
    d->is_premul = 1;
    d->premul = c->premul[i];
    return HP_OK;
}

static int overlaps(const void *a, size_t an, const void *b, size_t bn) {
    const char *x = a, *y = b;
    return an && bn && x < y + bn && y < x + an;
}

static hp_status_t check_group(hp_work_t *work, const char *fn) {
    if (t_group_depth > 0)
        return hp_error(HP_ERR_STATE, "%s: collectives cannot be called between hp_group_start "
                        "and hp_group_end (only hp_send/hp_recv are batched)", fn);
    return HP_OK;
}

#define BEGIN(fn_, comm_, dt_)                                                     \
    HP_TRY(check_comm((comm_), fn_));                                              \
    HP_TRY(check_dt((dt_), fn_));                                                  \
    HP_TRY(check_group(work, fn_));                                                \
    hp_op_desc_t d = {0};                                                          \
    d.dt = (dt_);                                                                  \
    size_t es = hp_dtype_size(dt_);                                                \
    (void)es

static hp_status_t launch(hp_comm_t comm, const hp_op_desc_t *d, size_t bytes, hp_work_t *work) {
    hp_work_t w;
    HP_TRY(work_get(comm, work == NULL, &w));
    w->d = *d;
    count_op(d->kind, bytes);
    return dispatch(w, work);
}

/* ---- collectives ------------------------------------------------------------------------ */

hp_status_t hp_all_reduce(const void *sendbuf, void *recvbuf, size_t count, hp_dtype_t dt,
                          hp_redop_t op, hp_comm_t comm, hp_work_t *work) {
    BEGIN("hp_all_reduce", comm, dt);
    HP_TRY(check_buf(sendbuf, count, "sendbuf", "hp_all_reduce"));
    HP_TRY(check_buf(recvbuf, count, "recvbuf", "hp_all_reduce"));
    HP_TRY(check_op(comm, op, &d, "hp_all_reduce"));
    if (sendbuf != recvbuf && overlaps(sendbuf, count * es, recvbuf, count * es))
        return hp_error(HP_ERR_INVALID_ARG, "hp_all_reduce: sendbuf and recvbuf overlap partially "
                        "(expected equal pointers for in place, or disjoint buffers)");
    d.kind = HP_COMM_ALL_REDUCE, d.sendbuf = sendbuf, d.recvbuf = recvbuf, d.count = count;
    return launch(comm, &d, count * es, work);
}

hp_status_t hp_broadcast(void *buf, size_t count, hp_dtype_t dt, int root, hp_comm_t comm,
                         hp_work_t *work) {
    BEGIN("hp_broadcast", comm, dt);
    HP_TRY(check_buf(buf, count, "buf", "hp_broadcast"));
    HP_TRY(check_root(comm, root, "hp_broadcast"));
    d.kind = HP_COMM_BROADCAST, d.recvbuf = buf, d.count = count, d.root = root;
    return launch(comm, &d, comm->rank == root ? count * es : 0, work);
}

hp_status_t hp_reduce(const void *sendbuf, void *recvbuf, size_t count, hp_dtype_t dt,
                      hp_redop_t op, int root, hp_comm_t comm, hp_work_t *work) {
    BEGIN("hp_reduce", comm, dt);
    HP_TRY(check_root(comm, root, "hp_reduce"));
    HP_TRY(check_buf(sendbuf, count, "sendbuf", "hp_reduce"));
    if (comm->rank == root) HP_TRY(check_buf(recvbuf, count, "recvbuf (at root)", "hp_reduce"));
    HP_TRY(check_op(comm, op, &d, "hp_reduce"));
    d.kind = HP_COMM_REDUCE, d.sendbuf = sendbuf, d.recvbuf = recvbuf, d.count = count, d.root = root;
    return launch(comm, &d, count * es, work);
}

hp_status_t hp_all_gather(const void *sendbuf, void *recvbuf, size_t sendcount, hp_dtype_t dt,
                          hp_comm_t comm, hp_work_t *work) {
    BEGIN("hp_all_gather", comm, dt);
    HP_TRY(check_buf(sendbuf, sendcount, "sendbuf", "hp_all_gather"));
    HP_TRY(check_buf(recvbuf, sendcount, "recvbuf", "hp_all_gather"));
    size_t total = sendcount * (size_t)comm->size * es;
    const char *slot = recvbuf ? (const char *)recvbuf + (size_t)comm->rank * sendcount * es : NULL;
    if ((const char *)sendbuf != slot && overlaps(sendbuf, sendcount * es, recvbuf, total))
        return hp_error(HP_ERR_INVALID_ARG, "hp_all_gather: sendbuf overlaps recvbuf but is not "
                        "the in-place position recvbuf + rank*sendcount (rank %d)", comm->rank);
    d.kind = HP_COMM_ALL_GATHER, d.sendbuf = sendbuf, d.recvbuf = recvbuf, d.count = sendcount;
    return launch(comm, &d, sendcount * es, work);
}

hp_status_t hp_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount, hp_dtype_t dt,
                              hp_redop_t op, hp_comm_t comm, hp_work_t *work) {
    BEGIN("hp_reduce_scatter", comm, dt);
    HP_TRY(check_buf(sendbuf, recvcount, "sendbuf", "hp_reduce_scatter"));
    HP_TRY(check_buf(recvbuf, recvcount, "recvbuf", "hp_reduce_scatter"));
    HP_TRY(check_op(comm, op, &d, "hp_reduce_scatter"));
    size_t total = recvcount * (size_t)comm->size * es;
    const char *slot = sendbuf ? (const char *)sendbuf + (size_t)comm->rank * recvcount * es : NULL;
    if ((const char *)recvbuf != slot && overlaps(sendbuf, total, recvbuf, recvcount * es))
        return hp_error(HP_ERR_INVALID_ARG, "hp_reduce_scatter: recvbuf overlaps sendbuf but is "
                        "not the in-place position sendbuf + rank*recvcount (rank %d)", comm->rank);
    d.kind = HP_COMM_REDUCE_SCATTER, d.sendbuf = sendbuf, d.recvbuf = recvbuf, d.count = recvcount;
    return launch(comm, &d, total, work);
}

hp_status_t hp_all_to_all(const void *sendbuf, void *recvbuf, size_t count, hp_dtype_t dt,
                          hp_comm_t comm, hp_work_t *work) {
    BEGIN("hp_all_to_all", comm, dt);
    HP_TRY(check_buf(sendbuf, count, "sendbuf", "hp_all_to_all"));
    HP_TRY(check_buf(recvbuf, count, "recvbuf", "hp_all_to_all"));
    size_t total = count * (size_t)comm->size * es;
    if (sendbuf != recvbuf && overlaps(sendbuf, total, recvbuf, total))
        return hp_error(HP_ERR_INVALID_ARG, "hp_all_to_all: sendbuf and recvbuf overlap partially "
                        "(expected equal pointers for in place, or disjoint buffers)");
    d.kind = HP_COMM_ALL_TO_ALL, d.sendbuf = sendbuf, d.recvbuf = recvbuf, d.count = count;
    return launch(comm, &d, total, work);
}

hp_status_t hp_all_to_all_v(const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                            void *recvbuf, const size_t *recvcounts, const size_t *rdispls,
                            hp_dtype_t dt, hp_comm_t comm, hp_work_t *work) {
    BEGIN("hp_all_to_all_v", comm, dt);
    if (!sendcounts || !sdispls || !recvcounts || !rdispls)
        return hp_error(HP_ERR_INVALID_ARG, "hp_all_to_all_v: count and displacement arrays must "
                        "not be NULL (one entry per rank, %d ranks)", comm->size);
    size_t sent = 0, recvd = 0;
    for (int i = 0; i < comm->size; i++) sent += sendcounts[i], recvd += recvcounts[i];
    HP_TRY(check_buf(sendbuf, sent, "sendbuf", "hp_all_to_all_v"));
    HP_TRY(check_buf(recvbuf, recvd, "recvbuf", "hp_all_to_all_v"));
    hp_work_t w;
    HP_TRY(work_get(comm, work == NULL, &w));
    size_t need = 4 * (size_t)comm->size;
    if (need > w->vcap) {   /* grows only when a larger communicator is first seen */
        COUNT_ALLOC();
        size_t *p = realloc(w->vcounts, need * sizeof *p);
        if (!p) {
            work_put(w);
            return hp_error(HP_ERR_OOM, "hp_all_to_all_v: cannot allocate count copies");
        }
        w->vcounts = p;
        w->vcap = need;
    }
    size_t n = (size_t)comm->size;
    memcpy(w->vcounts, sendcounts, n * sizeof(size_t));
    memcpy(w->vcounts + n, sdispls, n * sizeof(size_t));
    memcpy(w->vcounts + 2 * n, recvcounts, n * sizeof(size_t));
    memcpy(w->vcounts + 3 * n, rdispls, n * sizeof(size_t));
    d.kind = HP_COMM_ALL_TO_ALL_V, d.sendbuf = sendbuf, d.recvbuf = recvbuf;
    d.sc = w->vcounts, d.sd = w->vcounts + n, d.rc = w->vcounts + 2 * n, d.rd = w->vcounts + 3 * n;
    w->d = d;
    count_op(HP_COMM_ALL_TO_ALL_V, sent * es);
    return dispatch(w, work);
}

hp_status_t hp_gather(const void *sendbuf, void *recvbuf, size_t count, hp_dtype_t dt, int root,
                      hp_comm_t comm, hp_work_t *work) {
    BEGIN("hp_gather", comm, dt);
    HP_TRY(check_root(comm, root, "hp_gather"));
    HP_TRY(check_buf(sendbuf, count, "sendbuf", "hp_gather"));
    if (comm->rank == root) HP_TRY(check_buf(recvbuf, count, "recvbuf (at root)", "hp_gather"));
    d.kind = HP_COMM_GATHER, d.sendbuf = sendbuf, d.recvbuf = recvbuf, d.count = count, d.root = root;
    return launch(comm, &d, count * es, work);
}

hp_status_t hp_scatter(const void *sendbuf, void *recvbuf, size_t count, hp_dtype_t dt, int root,
                       hp_comm_t comm, hp_work_t *work) {
    BEGIN("hp_scatter", comm, dt);
    HP_TRY(check_root(comm, root, "hp_scatter"));
    if (comm->rank == root) HP_TRY(check_buf(sendbuf, count, "sendbuf (at root)", "hp_scatter"));
    HP_TRY(check_buf(recvbuf, count, "recvbuf", "hp_scatter"));
    d.kind = HP_COMM_SCATTER, d.sendbuf = sendbuf, d.recvbuf = recvbuf, d.count = count, d.root = root;
    return launch(comm, &d, comm->rank == root ? count * (size_t)comm->size * es : 0, work);
}

hp_status_t hp_barrier(hp_comm_t comm, hp_work_t *work) {
    BEGIN("hp_barrier", comm, HP_U8);
    d.kind = HP_COMM_BARRIER;
    return launch(comm, &d, 0, work);
}

/* ---- point-to-point ---------------------------------------------------------------------- */

static hp_status_t p2p_push(hp_work_t w, int is_send, void *buf, size_t count, hp_dtype_t dt,
                            int peer, int tag, hp_comm_t comm) {
    if (w->p2p_n == w->p2p_cap) {
        int cap = w->p2p_cap ? 2 * w->p2p_cap : 8;
        COUNT_ALLOC();
        hp_p2p_t *p = realloc(w->p2p, (size_t)cap * sizeof *p);
        if (!p) return hp_error(HP_ERR_OOM, "hp_comm: cannot grow the point-to-point group");
        w->p2p = p;
        w->p2p_cap = cap;
    }
    w->p2p[w->p2p_n++] = (hp_p2p_t){is_send, buf, count, dt, peer, comm->ctx, tag};
    return HP_OK;
}

static hp_status_t p2p_call(int is_send, void *buf, size_t count, hp_dtype_t dt, int peer, int tag,
                            hp_comm_t comm, hp_work_t *work) {
    const char *fn = is_send ? (tag ? "hp_send_tag" : "hp_send") : (tag ? "hp_recv_tag" : "hp_recv");
    if (tag < 0 || tag > HP_P2P_MAX_TAG)
        return hp_error(HP_ERR_INVALID_ARG, "%s: tag %d outside [1, %d]", fn, tag, HP_P2P_MAX_TAG);
    HP_TRY(check_comm(comm, fn));
    HP_TRY(check_dt(dt, fn));
    HP_TRY(check_buf(buf, count, "buf", fn));
    if (peer < 0 || peer >= comm->size)
        return hp_error(HP_ERR_INVALID_ARG, "%s: peer %d is out of range for a communicator of "
                        "%d ranks", fn, peer, comm->size);
    size_t es = hp_dtype_size(dt);
    hp_comm_op_t kind = is_send ? HP_COMM_SEND : HP_COMM_RECV;
    if (t_group_depth > 0) {
        if (work)
            return hp_error(HP_ERR_INVALID_ARG, "%s: inside hp_group_start/hp_group_end pass "
                            "work = NULL; hp_group_end completes the whole group", fn);
        HP_TRY(p2p_push(t_group_work, is_send, buf, count, dt, peer, tag, comm));
        count_op(kind, is_send ? count * es : 0);
        return HP_OK;
    }
    hp_work_t w;
    HP_TRY(work_get(comm, work == NULL, &w));
    hp_status_t st = p2p_push(w, is_send, buf, count, dt, peer, tag, comm);
    if (st != HP_OK) {
        work_put(w);
        return st;
    }
    w->d = (hp_op_desc_t){.kind = kind, .dt = dt, .count = count};
    count_op(kind, is_send ? count * es : 0);
    return dispatch(w, work);
}

hp_status_t hp_send(const void *buf, size_t count, hp_dtype_t dt, int peer, hp_comm_t comm,
                    hp_work_t *work) {
    return p2p_call(1, (void *)buf, count, dt, peer, 0, comm, work);
}

hp_status_t hp_send_tag(const void *buf, size_t count, hp_dtype_t dt, int peer, int tag, hp_comm_t comm,
                        hp_work_t *work) {
    if (tag == 0) return hp_error(HP_ERR_INVALID_ARG, "hp_send_tag: tag 0 is reserved (untagged hp_send)");
    return p2p_call(1, (void *)buf, count, dt, peer, tag, comm, work);
}

hp_status_t hp_recv(void *buf, size_t count, hp_dtype_t dt, int peer, hp_comm_t comm,
                    hp_work_t *work) {
    return p2p_call(0, buf, count, dt, peer, 0, comm, work);
}

hp_status_t hp_recv_tag(void *buf, size_t count, hp_dtype_t dt, int peer, int tag, hp_comm_t comm,
                        hp_work_t *work) {
    if (tag == 0) return hp_error(HP_ERR_INVALID_ARG, "hp_recv_tag: tag 0 is reserved (untagged hp_recv)");
    return p2p_call(0, buf, count, dt, peer, tag, comm, work);
}

hp_status_t hp_group_start(void) {
    if (!g.initialised) return hp_error(HP_ERR_STATE, "hp_group_start: hp_comm is not initialised");
    if (t_group_depth++ == 0) {
        hp_status_t st = work_get(g.world, 1, &t_group_work);
        if (st != HP_OK) {
            t_group_depth = 0;
            return st;
        }
    }
    return HP_OK;
}

hp_status_t hp_group_end(void) {
    if (t_group_depth <= 0)
        return hp_error(HP_ERR_STATE, "hp_group_end without a matching hp_group_start");
    if (--t_group_depth > 0) return HP_OK;
    hp_work_t w = t_group_work;
    t_group_work = NULL;
    if (w->p2p_n == 0) {
        work_put(w);
        return HP_OK;
    }
    w->d = (hp_op_desc_t){.kind = w->p2p[0].is_send ? HP_COMM_SEND : HP_COMM_RECV};
    wd_begin(w->d.kind, g.world->size);
    hp_status_t st = g.be->p2p(w->p2p, w->p2p_n, &w->req, 0);
    wd_end();
    work_put(w);
    return st;
}

hp_status_t hp_group_end_work(hp_work_t *work) {
    if (!work) return hp_group_end();
    *work = NULL;
    if (t_group_depth != 1)
        return hp_error(HP_ERR_STATE, "hp_group_end_work: needs the outermost hp_group_start (depth %d); hint: "
                        "close inner groups with hp_group_end", t_group_depth);
    t_group_depth = 0;
    hp_work_t w = t_group_work;
    t_group_work = NULL;
    if (w->p2p_n == 0) {
        work_put(w);
        return HP_OK;
    }
    w->d = (hp_op_desc_t){.kind = w->p2p[0].is_send ? HP_COMM_SEND : HP_COMM_RECV};
    return dispatch(w, work);   // one handle for the whole group, progressed as a p2p work
}

/* ---- agreement on failure ---------------------------------------------------------------- */

/* The message this thread's last failed agreement returned: a status that is agreed again
 * (a caller agrees on what a callee already agreed) keeps its text instead of growing a
 * second "rank R: " prefix. */
static _Thread_local char t_agreed[2048];
static _Thread_local int32_t t_agreed_rank;   /* the world rank that t_agreed names */

hp_status_t hp_comm_agree(hp_comm_t comm, hp_status_t status, int *failed_rank) {
    if (failed_rank) *failed_rank = -1;
    HP_TRY(check_comm(comm, "hp_comm_agree"));
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
