/* hp_comm calls: argument checks and in-place rules, the collectives, point-to-point (tagged
 * and untagged) and group batching of point-to-point; each fills a work and hands it to
 * hp_comm_dispatch (comm_work.c). */
#include <stdlib.h>
#include <string.h>

#include "comm/comm-front.h"

static __thread int t_group_depth;
static __thread hp_work_t t_group_work;

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

/* Both buffers of a call (neither may be NULL when count > 0). */
static hp_status_t check_bufs(const void *sendbuf, const void *recvbuf, size_t count, const char *fn) {
    HP_TRY(check_buf(sendbuf, count, "sendbuf", fn));
    return check_buf(recvbuf, count, "recvbuf", fn);
}

/* A reduction's buffers and its op, resolved into d. */
static hp_status_t check_reduction(hp_comm_t c, const void *sendbuf, const void *recvbuf, size_t count, hp_redop_t op,
                                   hp_op_desc_t *d, const char *fn) {
    HP_TRY(check_bufs(sendbuf, recvbuf, count, fn));
    return check_op(c, op, d, fn);
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
    HP_TRY(hp_comm_check((comm_), fn_));                                              \
    HP_TRY(check_dt((dt_), fn_));                                                  \
    HP_TRY(check_group(work, fn_));                                                \
    hp_op_desc_t d = {0};                                                          \
    d.dt = (dt_);                                                                  \
    size_t es = hp_dtype_size(dt_);                                                \
    (void)es

static hp_status_t launch(hp_comm_t comm, const hp_op_desc_t *d, size_t bytes, hp_work_t *work) {
    hp_work_t w;
    HP_TRY(hp_comm_work_get(comm, work == NULL, &w));
    w->d = *d;
    hp_comm_count_op(d->kind, bytes);
    return hp_comm_dispatch(w, work);
}

/* ---- collectives ------------------------------------------------------------------------ */

hp_status_t hp_all_reduce(const void *sendbuf, void *recvbuf, size_t count, hp_dtype_t dt,
                          hp_redop_t op, hp_comm_t comm, hp_work_t *work) {
    BEGIN("hp_all_reduce", comm, dt);
    HP_TRY(check_reduction(comm, sendbuf, recvbuf, count, op, &d, "hp_all_reduce"));
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
    HP_TRY(check_bufs(sendbuf, recvbuf, sendcount, "hp_all_gather"));
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
    HP_TRY(check_reduction(comm, sendbuf, recvbuf, recvcount, op, &d, "hp_reduce_scatter"));
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
    HP_TRY(check_bufs(sendbuf, recvbuf, count, "hp_all_to_all"));
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
    HP_TRY(hp_comm_work_get(comm, work == NULL, &w));
    size_t need = 4 * (size_t)comm->size;
    if (need > w->vcap) {   /* grows only when a larger communicator is first seen */
        COUNT_ALLOC();
        size_t *p = realloc(w->vcounts, need * sizeof *p);
        if (!p) {
            hp_comm_work_put(w);
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
    hp_comm_count_op(HP_COMM_ALL_TO_ALL_V, sent * es);
    return hp_comm_dispatch(w, work);
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
    HP_TRY(hp_comm_check(comm, fn));
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
        hp_comm_count_op(kind, is_send ? count * es : 0);
        return HP_OK;
    }
    hp_work_t w;
    HP_TRY(hp_comm_work_get(comm, work == NULL, &w));
    hp_status_t st = p2p_push(w, is_send, buf, count, dt, peer, tag, comm);
    if (st != HP_OK) {
        hp_comm_work_put(w);
        return st;
    }
    w->d = (hp_op_desc_t){.kind = kind, .dt = dt, .count = count};
    hp_comm_count_op(kind, is_send ? count * es : 0);
    return hp_comm_dispatch(w, work);
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
    if (!hp_comm_g.initialised) return hp_error(HP_ERR_STATE, "hp_group_start: hp_comm is not initialised");
    if (t_group_depth++ == 0) {
        hp_status_t st = hp_comm_work_get(hp_comm_g.world, 1, &t_group_work);
        if (st != HP_OK) {
            t_group_depth = 0;
            return st;
        }
    }
    return HP_OK;
}

/* Takes the closed group's work from this thread: NULL when the group posted nothing. */
static hp_work_t group_take(void) {
    hp_work_t w = t_group_work;
    t_group_work = NULL;
    if (w->p2p_n == 0) {
        hp_comm_work_put(w);
        return NULL;
    }
    w->d = (hp_op_desc_t){.kind = w->p2p[0].is_send ? HP_COMM_SEND : HP_COMM_RECV};
    return w;
}

hp_status_t hp_group_end(void) {
    if (t_group_depth <= 0)
        return hp_error(HP_ERR_STATE, "hp_group_end without a matching hp_group_start");
    if (--t_group_depth > 0) return HP_OK;
    hp_work_t w = group_take();
    if (!w) return HP_OK;
    hp_comm_wd_begin(w->d.kind, hp_comm_g.world);
    hp_status_t st = hp_comm_g.be->p2p(w->p2p, w->p2p_n, &w->req, 0);
    hp_comm_wd_end();
    hp_comm_work_put(w);
    return st;
}

hp_status_t hp_group_end_work(hp_work_t *work) {
    if (!work) return hp_group_end();
    *work = NULL;
    if (t_group_depth != 1)
        return hp_error(HP_ERR_STATE, "hp_group_end_work: needs the outermost hp_group_start (depth %d); hint: "
                        "close inner groups with hp_group_end", t_group_depth);
    t_group_depth = 0;
    hp_work_t w = group_take();
    return w ? hp_comm_dispatch(w, work) : HP_OK;   // one handle for the whole group, progressed as a p2p work
}
