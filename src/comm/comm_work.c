/* hp_comm work handles: the pool (with a per-thread cache for blocking calls), dtype and op
 * lowering (BF16/F16 widened to F32, AVG = SUM then divide, PREMUL_SUM = scale then SUM), the
 * choice of the deterministic ring reductions, the progress modes (poll, thread, none) and
 * hp_work_wait / hp_work_test. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm-front.h"

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

hp_status_t hp_comm_work_get(hp_comm_t comm, int blocking, hp_work_t *out) {
    hp_work_t w = blocking ? t_cached_work : NULL;
    if (w) {
        t_cached_work = NULL;
    } else {
        pthread_mutex_lock(&hp_comm_g.lock);
        w = hp_comm_g.free_list;
        if (w) hp_comm_g.free_list = w->next;
        pthread_mutex_unlock(&hp_comm_g.lock);
    }
    if (!w) {
        COUNT_ALLOC();
        w = hp_calloc(1, sizeof *w);
        if (!w) return HP_ERR_OOM;
        pthread_mutex_lock(&hp_comm_g.lock);
        hp_comm_g.n_works++;
        pthread_mutex_unlock(&hp_comm_g.lock);
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

void hp_comm_work_put(hp_work_t w) {
    if (!w->async && !t_cached_work) {
        t_cached_work = w;
        return;
    }
    pthread_mutex_lock(&hp_comm_g.lock);
    w->next = hp_comm_g.free_list;
    hp_comm_g.free_list = w;
    pthread_mutex_unlock(&hp_comm_g.lock);
}

static void work_free(hp_work_t w) {
    free(w->req.h);
    free(w->req.scratch);
    hp_free_aligned(w->ws);
    free(w->vcounts);
    free(w->p2p);
    free(w);
}

/* Frees every pooled work and this thread's cached one (hp_comm_finalize, after the progress
 * thread stopped). */
void hp_comm_work_pool_drain(void) {
    pthread_mutex_lock(&hp_comm_g.lock);
    if (t_cached_work) {   /* this thread's cached work goes back to be freed */
        t_cached_work->next = hp_comm_g.free_list;
        hp_comm_g.free_list = t_cached_work;
        t_cached_work = NULL;
    }
    while (hp_comm_g.free_list) {
        hp_work_t w = hp_comm_g.free_list;
        hp_comm_g.free_list = w->next;
        work_free(w);
        hp_comm_g.n_works--;
    }
    hp_comm_g.active_head = hp_comm_g.active_tail = NULL;
    pthread_mutex_unlock(&hp_comm_g.lock);
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

/* The widening path of a half-precision reduction: the first n elements of the send buffer as
 * F32 (PREMUL_SUM's scalar applied) at the start of the work's workspace, which holds `floats`. */
static hp_status_t widen_send(hp_work_t w, size_t n, size_t floats, float **ws) {
    const hp_op_desc_t *d = &w->d;
    HP_TRY(ws_reserve(w, floats * sizeof(float)));
    *ws = w->ws;
    be_convert(w->comm, *ws, HP_F32, d->sendbuf, d->dt, n);
    if (d->is_premul) HP_TRY(be_scale(w->comm, *ws, *ws, n, HP_F32, d->premul));
    return HP_OK;
}

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
            float *ws;   // (n) f32 accumulation buffer
            HP_TRY(widen_send(w, n, n, &ws));
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
            float *ws;   // (n) f32
            HP_TRY(widen_send(w, n, n, &ws));
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
            float *ws;   // (size*n) f32 input, then room for the (n) result
            HP_TRY(widen_send(w, total, total + n, &ws));
            /* (n) f32 result; the ring reduces in place in the widened copy (no
             * accumulation workspace), leaving it in this rank's block */
            float *out = ring ? ws + (size_t)c->rank * n : ws + total;
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

static void list_push(hp_work_t w) {   /* hp_comm_g.lock held */
    w->next = NULL;
    if (hp_comm_g.active_tail) hp_comm_g.active_tail->next = w;
    else hp_comm_g.active_head = w;
    hp_comm_g.active_tail = w;
}

static void finish_in_helper(hp_work_t w, hp_status_t st) {   /* hp_comm_g.lock held */
    w->status = st;
    if (st != HP_OK) snprintf(w->errmsg, sizeof w->errmsg, "%s", hp_last_error());
    w->done = 1;
    w->comm->pending--, __atomic_fetch_sub(&hp_comm_g.inflight, 1, __ATOMIC_RELAXED);
}

/* Tests every started request on the list; returns how many completed. hp_comm_g.lock held. */
static int test_started(void) {
    int completed = 0;
    hp_work_t prev = NULL, w = hp_comm_g.active_head;
    while (w) {
        hp_work_t next = w->next;
        int done = 0;
        hp_status_t st = HP_OK;
        if (w->started) st = w->comm->be->test(&w->req, &done);
        if (w->started && (st != HP_OK || done)) {
            if (prev) prev->next = next;
            else hp_comm_g.active_head = next;
            if (hp_comm_g.active_tail == w) hp_comm_g.active_tail = prev;
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
    pthread_mutex_lock(&hp_comm_g.lock);
    for (;;) {
        while (!hp_comm_g.progress_stop && !hp_comm_g.active_head) pthread_cond_wait(&hp_comm_g.work_cv, &hp_comm_g.lock);
        if (hp_comm_g.progress_stop) break;
        int completed = test_started();
        hp_work_t prev = NULL, q = hp_comm_g.active_head;
        while (q && q->started) prev = q, q = q->next;
        if (q) {
            if (prev) prev->next = q->next;
            else hp_comm_g.active_head = q->next;
            if (hp_comm_g.active_tail == q) hp_comm_g.active_tail = prev;
            pthread_mutex_unlock(&hp_comm_g.lock);
            hp_comm_wd_begin(q->d.kind, q->comm);
            hp_status_t st = run_to_completion(q);
            hp_comm_wd_end();
            pthread_mutex_lock(&hp_comm_g.lock);
            finish_in_helper(q, st);
            completed++;
        }
        if (completed) pthread_cond_broadcast(&hp_comm_g.done_cv);
        if (!q && hp_comm_g.active_head) {
            pthread_mutex_unlock(&hp_comm_g.lock);
            if (hp_comm_g.poll_interval_s > 0) {
                struct timespec ts = {0, (long)(hp_comm_g.poll_interval_s * 1e9)};
                nanosleep(&ts, NULL);
            } else {
                sched_yield();
            }
            pthread_mutex_lock(&hp_comm_g.lock);
        }
    }
    pthread_mutex_unlock(&hp_comm_g.lock);
    return NULL;
}

static hp_status_t progress_ensure(void) {   /* hp_comm_g.lock held */
    if (hp_comm_g.progress == HP_PROGRESS_NONE || hp_comm_g.progress_started) return HP_OK;
    hp_comm_g.progress_stop = 0;
    if (pthread_create(&hp_comm_g.progress_thread, NULL, progress_main, NULL) != 0)
        return hp_error(HP_ERR_STATE, "hp_comm: cannot start the progress thread (errno %d)", errno);
    hp_comm_g.progress_started = 1;
    return HP_OK;
}

/* Completes (blocking) or starts (async) a filled-in work. On the blocking path the work is
 * released here; on the async path *out receives it. */
hp_status_t hp_comm_dispatch(hp_work_t w, hp_work_t *out) {
    hp_comm_t c = w->comm;
    int must_queue = 0;
    if (hp_comm_g.progress == HP_PROGRESS_THREAD && !out) {
        /* The communication thread may be inside a collective on this communicator: queue
         * behind it so the order of calls is the program order on every rank. */
        pthread_mutex_lock(&hp_comm_g.lock);
        must_queue = c->pending > 0;
        pthread_mutex_unlock(&hp_comm_g.lock);
    }
    if (!out && !must_queue) {
        hp_comm_wd_begin(w->d.kind, c);
        hp_status_t st = run_to_completion(w);
        hp_comm_wd_end();
        if (st == HP_OK) post_process(w);
        hp_comm_work_put(w);
        return st;
    }
    w->async = 1;
    w->t_start = hp_clock_now_seconds();   /* deadline of hp_work_wait / hp_work_test */
    pthread_mutex_lock(&hp_comm_g.lock);
    hp_status_t st = progress_ensure();
    if (st != HP_OK) {
        pthread_mutex_unlock(&hp_comm_g.lock);
        hp_comm_work_put(w);
        return st;
    }
    int is_p2p = w->d.kind == HP_COMM_SEND || w->d.kind == HP_COMM_RECV;
    if (hp_comm_g.progress == HP_PROGRESS_THREAD && !is_p2p) {
        c->pending++, __atomic_fetch_add(&hp_comm_g.inflight, 1, __ATOMIC_RELAXED);
        list_push(w);
        pthread_cond_signal(&hp_comm_g.work_cv);
        pthread_mutex_unlock(&hp_comm_g.lock);
    } else if (reduction_class(w) == 1) {
        /* small reduction: the blocking algorithm, completed here (see run_to_completion) */
        pthread_mutex_unlock(&hp_comm_g.lock);
        hp_comm_wd_begin(w->d.kind, c);
        st = run_op(w, 0);
        hp_comm_wd_end();
        if (st != HP_OK) {
            hp_comm_work_put(w);
            return st;
        }
        w->started = 1;
        w->done = 1;
    } else {
        pthread_mutex_unlock(&hp_comm_g.lock);
        st = run_op(w, 1);
        if (st != HP_OK) {
            hp_comm_work_put(w);
            return st;
        }
        w->started = 1;
        if (hp_comm_g.progress != HP_PROGRESS_NONE) {
            pthread_mutex_lock(&hp_comm_g.lock);
            c->pending++, __atomic_fetch_add(&hp_comm_g.inflight, 1, __ATOMIC_RELAXED);
            list_push(w);
            pthread_cond_signal(&hp_comm_g.work_cv);
            pthread_mutex_unlock(&hp_comm_g.lock);
        } else {
            c->pending++, __atomic_fetch_add(&hp_comm_g.inflight, 1, __ATOMIC_RELAXED);
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
    pthread_mutex_lock(&hp_comm_g.lock);
    if (!w->done && w->started && test_started() > 0) pthread_cond_broadcast(&hp_comm_g.done_cv);
    int done = w->done;
    pthread_mutex_unlock(&hp_comm_g.lock);
    return done;
}

/* Checks completion without blocking; aborts the job past the timeout. */
static hp_status_t work_poll(hp_work_t w, int *done) {
    if (hp_comm_g.progress == HP_PROGRESS_NONE) {
        if (!w->done) {
            int d = 0;
            hp_status_t st = w->comm->be->test(&w->req, &d);
            if (st != HP_OK || d) {
                w->done = 1;
                w->status = st;
                if (st != HP_OK) snprintf(w->errmsg, sizeof w->errmsg, "%s", hp_last_error());
                w->comm->pending--, __atomic_fetch_sub(&hp_comm_g.inflight, 1, __ATOMIC_RELAXED);
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
        if (el > hp_comm_g.timeout) hp_comm_timeout_abort(w->d.kind, w->comm, el);
    }
    return HP_OK;
}

static hp_status_t work_complete(hp_work_t *work) {
    hp_work_t w = *work;
    hp_status_t st = w->status;
    if (st == HP_OK) post_process(w);
    else hp_error(st, "%s", w->errmsg);
    *work = NULL;
    hp_comm_work_put(w);
    return st;
}

hp_status_t hp_work_wait(hp_work_t *work) {
    if (!work || !*work) return hp_error(HP_ERR_INVALID_ARG, "hp_work_wait: NULL work handle "
                                         "(hint: a handle is released by the wait that completes it)");
    hp_work_t w = *work;
    if (hp_comm_g.progress == HP_PROGRESS_NONE || w->started) {
        /* Started requests: the waiter drives progress itself, as MPI_Wait would. */
        int done = 0;
        for (unsigned spins = 0;; spins++) {
            HP_TRY(work_poll(w, &done));
            if (done) break;
            if (spins > 1000) sched_yield();
        }
    } else {
        pthread_mutex_lock(&hp_comm_g.lock);
        while (!w->done) {
            double el = hp_clock_now_seconds() - w->t_start;
            if (el > hp_comm_g.timeout) {
                pthread_mutex_unlock(&hp_comm_g.lock);
                hp_comm_timeout_abort(w->d.kind, w->comm, el);
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100 * 1000 * 1000;
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&hp_comm_g.done_cv, &hp_comm_g.lock, &ts);
        }
        pthread_mutex_unlock(&hp_comm_g.lock);
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
