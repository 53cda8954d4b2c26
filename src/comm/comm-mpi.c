/* MPI backend of hp_comm: maps the backend table onto MPI-3 blocking and non-blocking
 * calls. Communicators return errors (MPI_ERRORS_RETURN) which become HP_ERR_COMM with
 * MPI's message. The fast path (F32 SUM and friends) is one direct MPI call, no copies. */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm-impl.h"

static int g_we_initialised = 0;

/* Every MPI call goes through this: failure becomes a status naming the call and site. */
#define MPI_CHECK(call)                                                                  \
    do {                                                                                 \
        int mpi_rc_ = (call);                                                            \
        if (mpi_rc_ != MPI_SUCCESS) return mpi_fail(mpi_rc_, #call, __FILE__, __LINE__); \
    } while (0)

static hp_status_t mpi_fail(int rc, const char *call, const char *file, int line) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", rc);
    return hp_error(HP_ERR_COMM, "%s failed at %s:%d: %s (hint: check that every rank calls the "
                    "same collectives in the same order with matching counts)", call, file, line, msg);
}

static MPI_Comm C(void *ctx) { return *(MPI_Comm *)ctx; }

static MPI_Datatype mpi_type(hp_dtype_t dt) {
    switch (dt) {
    case HP_F32: return MPI_FLOAT;
    case HP_I32: return MPI_INT32_T;
    case HP_I64: return MPI_INT64_T;
    case HP_U8: return MPI_UINT8_T;
    case HP_BF16:
    case HP_F16: return MPI_UINT16_T;   /* moved as bits; reductions are widened first */
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(hp_redop_t op) {
    switch (op) {
    case HP_SUM: return MPI_SUM;
    case HP_PROD: return MPI_PROD;
    case HP_MAX: return MPI_MAX;
    case HP_MIN: return MPI_MIN;
    default: return MPI_OP_NULL;
    }
}

static hp_status_t icount(size_t n, int *out) {
    if (n > (size_t)INT_MAX)
        return hp_error(HP_ERR_UNSUPPORTED, "count %zu exceeds the MPI backend's limit of "
                        "INT_MAX elements per call (hint: split the buffer)", n);
    *out = (int)n;
    return HP_OK;
}

/* Returns the request slot to start into: NULL for a blocking call. */
static hp_status_t req_one(hp_breq_t *req, int async, MPI_Request **out) {
    if (!async) {
        *out = NULL;
        return HP_OK;
    }
    HP_TRY(hp_breq_reserve(req, sizeof(MPI_Request), 0));
    req->n = 1;
    *out = (MPI_Request *)req->h;
    return HP_OK;
}

static void *wrap_comm(MPI_Comm c) {
    MPI_Comm *p = hp_malloc(sizeof *p);
    if (p) *p = c;
    return p;
}

static hp_status_t mpi_init(int *argc, char ***argv, void **world_ctx, int *rank, int *size) {
    int inited = 0;
    MPI_CHECK(MPI_Initialized(&inited));
    if (!inited) {
        int provided = 0;
        MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
        g_we_initialised = 1;
        if (provided < MPI_THREAD_MULTIPLE)
            hp_log(HP_LOG_WARN, "MPI provides thread level %d < MPI_THREAD_MULTIPLE; the "
                   "progress and watchdog threads may be unsafe", provided);
    }
    MPI_Comm w;
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &w));
    MPI_CHECK(MPI_Comm_set_errhandler(w, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(w, rank));
    MPI_CHECK(MPI_Comm_size(w, size));
    *world_ctx = wrap_comm(w);
    if (!*world_ctx) return HP_ERR_OOM;
    return HP_OK;
}

static hp_status_t mpi_finalize(void) {
    if (g_we_initialised) {
        int fin = 0;
        MPI_CHECK(MPI_Finalized(&fin));
        if (!fin) MPI_CHECK(MPI_Finalize());
        g_we_initialised = 0;
    }
    return HP_OK;
}

static hp_status_t mpi_split(void *ctx, int color, int key, void **out, int *rank, int *size) {
    MPI_Comm n;
    MPI_CHECK(MPI_Comm_split(C(ctx), color < 0 ? MPI_UNDEFINED : color, key, &n));
    if (n == MPI_COMM_NULL) {
        *out = NULL;
        return HP_OK;
    }
    MPI_CHECK(MPI_Comm_set_errhandler(n, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(n, rank));
    MPI_CHECK(MPI_Comm_size(n, size));
    *out = wrap_comm(n);
    return *out ? HP_OK : HP_ERR_OOM;
}

static hp_status_t mpi_dup(void *ctx, void **out, int *rank, int *size) {
    MPI_Comm n;
    MPI_CHECK(MPI_Comm_dup(C(ctx), &n));
    MPI_CHECK(MPI_Comm_set_errhandler(n, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(n, rank));
    MPI_CHECK(MPI_Comm_size(n, size));
    *out = wrap_comm(n);
    return *out ? HP_OK : HP_ERR_OOM;
}

static void mpi_free_ctx(void *ctx) {
    if (!ctx) return;
    MPI_Comm c = C(ctx);
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && c != MPI_COMM_NULL) MPI_Comm_free(&c);
    free(ctx);
}

static int mpi_world_rank(void) {
    int inited = 0, fin = 0, r = -1;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (inited && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

static _Noreturn void mpi_abort_job(void *ctx, int code) {
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (inited && !fin) MPI_Abort(MPI_COMM_WORLD, code ? code : 1);
    _exit(code ? code : 1);
}

static hp_status_t mpi_all_reduce(void *ctx, const void *s, void *r, size_t n, hp_dtype_t dt,
                                  hp_redop_t op, hp_breq_t *req, int async) {
    int cnt = 0;
    MPI_Request *rq;
    HP_TRY(icount(n, &cnt));
    HP_TRY(req_one(req, async, &rq));
    const void *sb = (s == r) ? MPI_IN_PLACE : s;
    if (rq) MPI_CHECK(MPI_Iallreduce(sb, r, cnt, mpi_type(dt), mpi_op(op), C(ctx), rq));
    else MPI_CHECK(MPI_Allreduce(sb, r, cnt, mpi_type(dt), mpi_op(op), C(ctx)));
    return HP_OK;
}

static hp_status_t mpi_broadcast(void *ctx, void *buf, size_t n, hp_dtype_t dt, int root,
                                 hp_breq_t *req, int async) {
    int cnt = 0;
    MPI_Request *rq;
    HP_TRY(icount(n, &cnt));
    HP_TRY(req_one(req, async, &rq));
    if (rq) MPI_CHECK(MPI_Ibcast(buf, cnt, mpi_type(dt), root, C(ctx), rq));
    else MPI_CHECK(MPI_Bcast(buf, cnt, mpi_type(dt), root, C(ctx)));
    return HP_OK;
}

static hp_status_t mpi_reduce(void *ctx, const void *s, void *r, size_t n, hp_dtype_t dt,
                              hp_redop_t op, int root, hp_breq_t *req, int async) {
    int cnt = 0, rank;
    MPI_Request *rq;
    HP_TRY(icount(n, &cnt));
    HP_TRY(req_one(req, async, &rq));
    MPI_CHECK(MPI_Comm_rank(C(ctx), &rank));
    const void *sb = (rank == root && s == r) ? MPI_IN_PLACE : s;
    if (rq) MPI_CHECK(MPI_Ireduce(sb, r, cnt, mpi_type(dt), mpi_op(op), root, C(ctx), rq));
    else MPI_CHECK(MPI_Reduce(sb, r, cnt, mpi_type(dt), mpi_op(op), root, C(ctx)));
    return HP_OK;
}

static hp_status_t mpi_all_gather(void *ctx, const void *s, void *r, size_t n, hp_dtype_t dt,
                                  hp_breq_t *req, int async) {
    int cnt = 0, rank, size;
    MPI_Request *rq;
    HP_TRY(icount(n, &cnt));
    HP_TRY(req_one(req, async, &rq));
    MPI_CHECK(MPI_Comm_rank(C(ctx), &rank));
    MPI_CHECK(MPI_Comm_size(C(ctx), &size));
    HP_TRY(icount(n * (size_t)size, &(int){0}));
    const void *sb = (s == (const char *)r + (size_t)rank * n * hp_dtype_size(dt)) ? MPI_IN_PLACE : s;
    if (rq) MPI_CHECK(MPI_Iallgather(sb, cnt, mpi_type(dt), r, cnt, mpi_type(dt), C(ctx), rq));
    else MPI_CHECK(MPI_Allgather(sb, cnt, mpi_type(dt), r, cnt, mpi_type(dt), C(ctx)));
    return HP_OK;
}

/* In place (r == s + rank*n): MPI leaves the result at the start of the buffer; the front
 * end moves it to the rank's block afterwards. */
static hp_status_t mpi_reduce_scatter(void *ctx, const void *s, void *r, size_t n,
                                      hp_dtype_t dt, hp_redop_t op, hp_breq_t *req, int async) {
    int cnt = 0, rank, size;
    MPI_Request *rq;
    HP_TRY(icount(n, &cnt));
    HP_TRY(req_one(req, async, &rq));
    MPI_CHECK(MPI_Comm_rank(C(ctx), &rank));
    MPI_CHECK(MPI_Comm_size(C(ctx), &size));
    HP_TRY(icount(n * (size_t)size, &(int){0}));
    int inplace = (r == (const char *)s + (size_t)rank * n * hp_dtype_size(dt));
    const void *sb = inplace ? MPI_IN_PLACE : s;
    void *rb = inplace ? (void *)s : r;
    if (rq) MPI_CHECK(MPI_Ireduce_scatter_block(sb, rb, cnt, mpi_type(dt), mpi_op(op), C(ctx), rq));
    else MPI_CHECK(MPI_Reduce_scatter_block(sb, rb, cnt, mpi_type(dt), mpi_op(op), C(ctx)));
    return HP_OK;
}

static hp_status_t mpi_all_to_all(void *ctx, const void *s, void *r, size_t n, hp_dtype_t dt,
                                  hp_breq_t *req, int async) {
    int cnt = 0, size;
    MPI_Request *rq;
    HP_TRY(icount(n, &cnt));
    HP_TRY(req_one(req, async, &rq));
    MPI_CHECK(MPI_Comm_size(C(ctx), &size));
    HP_TRY(icount(n * (size_t)size, &(int){0}));
    if (rq) MPI_CHECK(MPI_Ialltoall(s, cnt, mpi_type(dt), r, cnt, mpi_type(dt), C(ctx), rq));
    else MPI_CHECK(MPI_Alltoall(s, cnt, mpi_type(dt), r, cnt, mpi_type(dt), C(ctx)));
    return HP_OK;
}

static hp_status_t mpi_all_to_all_v(void *ctx, const void *s, const size_t *sc, const size_t *sd,
                                    void *r, const size_t *rc, const size_t *rd, hp_dtype_t dt,
                                    hp_breq_t *req, int async) {
    int size;
    MPI_CHECK(MPI_Comm_size(C(ctx), &size));
    /* int copies of the four arrays live in the request scratch: MPI reads them until the
     * non-blocking call completes. */
    hp_breq_t *st = req;
    HP_TRY(hp_breq_reserve(st, sizeof(MPI_Request), 4 * (size_t)size * sizeof(int)));
    int *a = (int *)st->scratch;
    int *isc = a, *isd = a + size, *irc = a + 2 * size, *ird = a + 3 * size;
    hp_status_t status = HP_OK;
    for (int i = 0; i < size && status == HP_OK; i++) {
        status = icount(sc[i], &isc[i]);
        if (status == HP_OK) status = icount(sd[i], &isd[i]);
        if (status == HP_OK) status = icount(rc[i], &irc[i]);
        if (status == HP_OK) status = icount(rd[i], &ird[i]);
    }
    int rc_mpi = MPI_SUCCESS;
    if (status == HP_OK) {
        if (async) {
            req->n = 1;
            rc_mpi = MPI_Ialltoallv(s, isc, isd, mpi_type(dt), r, irc, ird, mpi_type(dt), C(ctx),
                                    (MPI_Request *)req->h);
        } else {
            rc_mpi = MPI_Alltoallv(s, isc, isd, mpi_type(dt), r, irc, ird, mpi_type(dt), C(ctx));
        }
    }
    if (status != HP_OK) return status;
    MPI_CHECK(rc_mpi);
    return HP_OK;
}

static hp_status_t mpi_gather(void *ctx, const void *s, void *r, size_t n, hp_dtype_t dt,
                              int root, hp_breq_t *req, int async) {
    int cnt = 0, rank, size;
    MPI_Request *rq;
    HP_TRY(icount(n, &cnt));
    HP_TRY(req_one(req, async, &rq));
    MPI_CHECK(MPI_Comm_rank(C(ctx), &rank));
    MPI_CHECK(MPI_Comm_size(C(ctx), &size));
    HP_TRY(icount(n * (size_t)size, &(int){0}));
    const void *sb = s;
    if (rank == root && s == (const char *)r + (size_t)rank * n * hp_dtype_size(dt)) sb = MPI_IN_PLACE;
    if (rq) MPI_CHECK(MPI_Igather(sb, cnt, mpi_type(dt), r, cnt, mpi_type(dt), root, C(ctx), rq));
    else MPI_CHECK(MPI_Gather(sb, cnt, mpi_type(dt), r, cnt, mpi_type(dt), root, C(ctx)));
    return HP_OK;
}

static hp_status_t mpi_scatter(void *ctx, const void *s, void *r, size_t n, hp_dtype_t dt,
                               int root, hp_breq_t *req, int async) {
    int cnt = 0, rank, size;
    MPI_Request *rq;
    HP_TRY(icount(n, &cnt));
    HP_TRY(req_one(req, async, &rq));
    MPI_CHECK(MPI_Comm_rank(C(ctx), &rank));
    MPI_CHECK(MPI_Comm_size(C(ctx), &size));
    HP_TRY(icount(n * (size_t)size, &(int){0}));
    void *rb = r;
    if (rank == root && r == (const char *)s + (size_t)rank * n * hp_dtype_size(dt)) rb = MPI_IN_PLACE;
    if (rq) MPI_CHECK(MPI_Iscatter(s, cnt, mpi_type(dt), rb, cnt, mpi_type(dt), root, C(ctx), rq));
    else MPI_CHECK(MPI_Scatter(s, cnt, mpi_type(dt), rb, cnt, mpi_type(dt), root, C(ctx)));
    return HP_OK;
}

static hp_status_t mpi_barrier(void *ctx, hp_breq_t *req, int async) {
    MPI_Request *rq;
    HP_TRY(req_one(req, async, &rq));
    if (rq) MPI_CHECK(MPI_Ibarrier(C(ctx), rq));
    else MPI_CHECK(MPI_Barrier(C(ctx)));
    return HP_OK;
}

#define HP_P2P_TAG 7001

static hp_status_t mpi_p2p(const hp_p2p_t *ops, int n, hp_breq_t *req, int async) {
    if (!async && n == 1) {   /* a lone blocking send or receive */
        int cnt = 0;
        HP_TRY(icount(ops[0].count, &cnt));
        if (ops[0].is_send)
            MPI_CHECK(MPI_Send(ops[0].buf, cnt, mpi_type(ops[0].dt), ops[0].peer, HP_P2P_TAG,
                               C(ops[0].ctx)));
        else
            MPI_CHECK(MPI_Recv(ops[0].buf, cnt, mpi_type(ops[0].dt), ops[0].peer, HP_P2P_TAG,
                               C(ops[0].ctx), MPI_STATUS_IGNORE));
        return HP_OK;
    }
    hp_breq_t *st = req;
    HP_TRY(hp_breq_reserve(st, (size_t)n * sizeof(MPI_Request), 0));
    MPI_Request *rq = (MPI_Request *)st->h;
    st->n = 0;
    hp_status_t status = HP_OK;
    /* Receives first, so that matching sends find them posted. */
    for (int pass = 0; pass < 2 && status == HP_OK; pass++) {
        for (int i = 0; i < n && status == HP_OK; i++) {
            if (ops[i].is_send != pass) continue;
            int cnt = 0, rc;
            status = icount(ops[i].count, &cnt);
            if (status != HP_OK) break;
            if (ops[i].is_send)
                rc = MPI_Isend(ops[i].buf, cnt, mpi_type(ops[i].dt), ops[i].peer, HP_P2P_TAG,
                               C(ops[i].ctx), &rq[st->n]);
            else
                rc = MPI_Irecv(ops[i].buf, cnt, mpi_type(ops[i].dt), ops[i].peer, HP_P2P_TAG,
                               C(ops[i].ctx), &rq[st->n]);
            if (rc != MPI_SUCCESS) status = mpi_fail(rc, ops[i].is_send ? "MPI_Isend" : "MPI_Irecv",
                                                     __FILE__, __LINE__);
            else st->n++;
        }
    }
    if (!async && status == HP_OK && st->n > 0) {
        int rc = MPI_Waitall(st->n, rq, MPI_STATUSES_IGNORE);
        st->n = 0;
        if (rc != MPI_SUCCESS) status = mpi_fail(rc, "MPI_Waitall", __FILE__, __LINE__);
    }
    return status;
}

static hp_status_t mpi_test(hp_breq_t *req, int *done) {
    int flag = 1;
    if (req->n > 0) MPI_CHECK(MPI_Testall(req->n, (MPI_Request *)req->h, &flag, MPI_STATUSES_IGNORE));
    *done = flag;
    return HP_OK;
}

static hp_status_t mpi_wait(hp_breq_t *req) {
    if (req->n > 0) MPI_CHECK(MPI_Waitall(req->n, (MPI_Request *)req->h, MPI_STATUSES_IGNORE));
    return HP_OK;
}

const hp_comm_backend_t hp_comm_backend_mpi = {
    .name = "mpi",
    .native_half_reduce = 0,
    .init = mpi_init,
    .finalize = mpi_finalize,
    .split = mpi_split,
    .dup = mpi_dup,
    .free_ctx = mpi_free_ctx,
    .world_rank = mpi_world_rank,
    .abort_job = mpi_abort_job,
    .all_reduce = mpi_all_reduce,
    .broadcast = mpi_broadcast,
    .reduce = mpi_reduce,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .all_to_all = mpi_all_to_all,
    .all_to_all_v = mpi_all_to_all_v,
    .gather = mpi_gather,
    .scatter = mpi_scatter,
    .barrier = mpi_barrier,
    .p2p = mpi_p2p,
    .test = mpi_test,
    .wait = mpi_wait,
};
