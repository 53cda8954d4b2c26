/* MPI backend of hp_comm: maps the backend table onto MPI-3 blocking and non-blocking
 * calls. Communicators return errors (MPI_ERRORS_RETURN) which become HP_ERR_COMM with
 * MPI's message. The fast path (F32 SUM and friends) is one direct MPI call, no copies. */
#include <limits.h>
#include <mpi.h>
#if defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>   /* Open MPI's extensions: ULFM's MPIX_ names where it was built in */
#endif
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyperparallel/parse.h"
#include "comm/comm-impl.h"

static int g_we_initialised = 0;
static size_t g_ring_chunk = (size_t)256 << 10;   /* bytes per ring chunk (HP_COMM_RING_CHUNK_KB) */
/* all_reduce / reduce_scatter (send side) up to this size on power-of-two communicators:
 * halving-doubling (HP_COMM_HD_MAX_KB); all_reduce measured ahead of the ring at 1-2 MiB,
 * even from 4 MiB up */
static size_t g_hd_max_bytes = (size_t)4 << 20;

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

/* A communicator context: the MPI communicator and the sequence number of the ring
 * reductions started on it (their tags). */
typedef struct hp_mpi_ctx {
    MPI_Comm comm;
    unsigned ring_seq;
} hp_mpi_ctx_t;

static MPI_Comm C(void *ctx) { return ((hp_mpi_ctx_t *)ctx)->comm; }

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
    hp_mpi_ctx_t *p = hp_malloc(sizeof *p);
    if (p) p->comm = c, p->ring_seq = 0;
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
    const char *env = getenv("HP_COMM_RING_CHUNK_KB");   /* tuning; same on every rank */
    if (env && *env) {
        int64_t kb;
        HP_TRY(hp_parse_i64("environment variable HP_COMM_RING_CHUNK_KB", env, 1, 1 << 20,
                            "KiB per ring chunk; default 256", &kb));
        g_ring_chunk = (size_t)kb << 10;
    }
    env = getenv("HP_COMM_HD_MAX_KB");   /* tuning; same on every rank */
    if (env && *env) {
        int64_t kb;
        HP_TRY(hp_parse_i64("environment variable HP_COMM_HD_MAX_KB", env, 0, 1 << 30,
                            "KiB; all_reduce and reduce_scatter up to this size on power-of-two "
                            "communicators use halving-doubling; default 4096", &kb));
        g_hd_max_bytes = (size_t)kb << 10;
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

static hp_status_t mpi_host_names(void *world_ctx, char *out, int stride) {
    char name[MPI_MAX_PROCESSOR_NAME + 1] = "";
    int len = 0;
    MPI_CHECK(MPI_Get_processor_name(name, &len));
    char *mine = hp_calloc(1, (size_t)stride);
    if (!mine) return HP_ERR_OOM;
    snprintf(mine, (size_t)stride, "%s", name);
    int rc = MPI_Allgather(mine, stride, MPI_CHAR, out, stride, MPI_CHAR, C(world_ctx));
    free(mine);
    MPI_CHECK(rc);
    return HP_OK;
}

static hp_status_t mpi_world_ranks(void *ctx, int size, int *out) {
    MPI_Group g, wg;
    MPI_CHECK(MPI_Comm_group(C(ctx), &g));
    MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &wg));
    int *in = hp_malloc((size_t)size * sizeof *in);
    if (!in) return HP_ERR_OOM;
    for (int i = 0; i < size; i++) in[i] = i;
    int rc = MPI_Group_translate_ranks(g, size, in, wg, out);
    free(in);
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    MPI_CHECK(rc);
    return HP_OK;
}

int hp_comm_survives_failures(char *desc, size_t cap) {
    if (desc && cap) {
        char v[MPI_MAX_LIBRARY_VERSION_STRING] = "";
        int len = 0;
        if (MPI_Get_library_version(v, &len) != MPI_SUCCESS) snprintf(v, sizeof v, "unknown MPI");
        v[strcspn(v, "\n,")] = '\0';
        snprintf(desc, cap, "%s", v);
    }
#if defined(MPIX_ERR_PROC_FAILED)
    return 1;
#else
    return 0;
#endif
}

static _Noreturn void mpi_abort_job(void *ctx, int code) {
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (inited && !fin) MPI_Abort(MPI_COMM_WORLD, code ? code : 1);
    _exit(code ? code : 1);
}

/* The start of a collective over one block of n elements per rank: n and the whole buffer
 * (n * size) as MPI counts, the request slot (NULL: blocking), this rank and the size. */
static hp_status_t blocks_begin(void *ctx, size_t n, hp_breq_t *req, int async, int *cnt, MPI_Request **rq,
                                int *rank, int *size) {
    HP_TRY(icount(n, cnt));
    HP_TRY(req_one(req, async, rq));
    MPI_CHECK(MPI_Comm_rank(C(ctx), rank));
    MPI_CHECK(MPI_Comm_size(C(ctx), size));
    return icount(n * (size_t)*size, &(int){0});
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
    HP_TRY(blocks_begin(ctx, n, req, async, &cnt, &rq, &rank, &size));
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
    HP_TRY(blocks_begin(ctx, n, req, async, &cnt, &rq, &rank, &size));
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

/* Gather (scatter = 0) and scatter: the root's own block of the whole buffer (r of a gather,
 * s of a scatter) passed as its block too goes as MPI_IN_PLACE (MPI forbids the aliasing). */
static hp_status_t rooted_blocks(void *ctx, const void *s, void *r, size_t n, hp_dtype_t dt, int root,
                                 hp_breq_t *req, int async, int scatter) {
    int cnt = 0, rank, size;
    MPI_Request *rq;
    HP_TRY(blocks_begin(ctx, n, req, async, &cnt, &rq, &rank, &size));
    const char *whole = scatter ? s : r;
    const void *mine = scatter ? (const void *)r : s;
    const int in_place = rank == root && mine == whole + (size_t)rank * n * hp_dtype_size(dt);
    const MPI_Datatype t = mpi_type(dt);
    if (scatter) {
        void *rb = in_place ? MPI_IN_PLACE : r;
        if (rq) MPI_CHECK(MPI_Iscatter(s, cnt, t, rb, cnt, t, root, C(ctx), rq));
        else MPI_CHECK(MPI_Scatter(s, cnt, t, rb, cnt, t, root, C(ctx)));
    } else {
        const void *sb = in_place ? MPI_IN_PLACE : s;
        if (rq) MPI_CHECK(MPI_Igather(sb, cnt, t, r, cnt, t, root, C(ctx), rq));
        else MPI_CHECK(MPI_Gather(sb, cnt, t, r, cnt, t, root, C(ctx)));
    }
    return HP_OK;
}

static hp_status_t mpi_gather(void *ctx, const void *s, void *r, size_t n, hp_dtype_t dt, int root, hp_breq_t *req,
                              int async) {
    return rooted_blocks(ctx, s, r, n, dt, root, req, async, 0);
}

static hp_status_t mpi_scatter(void *ctx, const void *s, void *r, size_t n, hp_dtype_t dt, int root, hp_breq_t *req,
                               int async) {
    return rooted_blocks(ctx, s, r, n, dt, root, req, async, 1);
}

static hp_status_t mpi_barrier(void *ctx, hp_breq_t *req, int async) {
    MPI_Request *rq;
    HP_TRY(req_one(req, async, &rq));
    if (rq) MPI_CHECK(MPI_Ibarrier(C(ctx), rq));
    else MPI_CHECK(MPI_Barrier(C(ctx)));
    return HP_OK;
}

#define HP_P2P_TAG 7001
/* Tagged point-to-point (hp_send_tag) uses MPI tags above the ring reductions' range. */
#define HP_P2P_TAG_BASE 32768
static int p2p_mpi_tag(const hp_p2p_t *op) { return op->tag ? HP_P2P_TAG_BASE + op->tag : HP_P2P_TAG; }

static hp_status_t mpi_p2p(const hp_p2p_t *ops, int n, hp_breq_t *req, int async) {
    if (!async && n == 1) {   /* a lone blocking send or receive */
        int cnt = 0;
        HP_TRY(icount(ops[0].count, &cnt));
        if (ops[0].is_send)
            MPI_CHECK(MPI_Send(ops[0].buf, cnt, mpi_type(ops[0].dt), ops[0].peer, p2p_mpi_tag(&ops[0]),
                               C(ops[0].ctx)));
        else
            MPI_CHECK(MPI_Recv(ops[0].buf, cnt, mpi_type(ops[0].dt), ops[0].peer, p2p_mpi_tag(&ops[0]),
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
                rc = MPI_Isend(ops[i].buf, cnt, mpi_type(ops[i].dt), ops[i].peer, p2p_mpi_tag(&ops[i]),
                               C(ops[i].ctx), &rq[st->n]);
            else
                rc = MPI_Irecv(ops[i].buf, cnt, mpi_type(ops[i].dt), ops[i].peer, p2p_mpi_tag(&ops[i]),
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

/* ---- deterministic ring reductions ------------------------------------------------------
 *
 * Ring reduce-scatter over P ranks, block b of the result on rank b. In step g (0..P-2) rank
 * r sends block (r-g-1) to its right neighbour and receives block (r-g-2) from its left one,
 * reducing it with its own contribution; so block b is folded in the fixed order
 * ((x[b+1] op x[b+2]) op ...) op x[b], whatever the timing. all_reduce appends the ring
 * all-gather: in step P-1+t rank r forwards block (r-t) and receives block (r-t-1) straight
 * into recvbuf. Each block is cut into K chunks of ring_chunk bytes so that the receive of
 * chunk c+1 overlaps the reduction of chunk c; a unit u = g*K + c is one chunk of one step.
 * At most RING_WINDOW receives and sends are in flight. The state lives in the request
 * scratch; test() advances it without blocking, wait() drives it with MPI_Waitany, and both
 * run the same per-unit code, so results are bitwise equal either way. all_reduce and
 * reduce_scatter up to g_hd_max_bytes on a power-of-two communicator of 4+ ranks run
 * halving-doubling instead (fewer steps; see hd_plan), through the same machinery. */

#define RING_TAG 10000          /* tags RING_TAG + (sequence % RING_TAGS); p2p uses 7001 */
#define RING_TAGS 16384
#define RING_WINDOW 4           /* receive slots and sends in flight */
#define HD_MAX_STEPS 62         /* 2 log2(P) steps of halving-doubling */

typedef struct ring {
    MPI_Comm comm;
    MPI_Datatype type;
    int tag, P, rank, left, right;
    int is_ar;                  /* all_reduce: reduce-scatter then all-gather */
    hp_dtype_t dt;
    hp_redop_t op;
    size_t es;
    const char *src;            /* the caller's send buffer */
    char *dst;                  /* recvbuf */
    char *mut;                  /* in-place reduce_scatter: src, written */
    char *acc;                  /* out-of-place reduce_scatter: (2, n) intermediate blocks */
    char *tmp;                  /* RING_WINDOW receive slots of `chunk` elements */
    size_t n;                   /* all_reduce: total elements; reduce_scatter: per block */
    size_t chunk;               /* elements per chunk */
    long K, U, ag0;             /* chunks per block, units, first all-gather unit */
    long recv_posted, recv_done, send_posted, send_done;
    int arrived;                /* oldest posted receive completed, not yet reduced */
    MPI_Request rr[RING_WINDOW], sr[RING_WINDOW];
    /* halving-doubling all_reduce (hd = 1): per step the partner, the element ranges sent
     * and received, and the first unit; steps 0..L-1 halve (reduce), L..2L-1 double */
    int hd, hd_steps, hd_L;
    int hd_peer[HD_MAX_STEPS];
    size_t hd_soff[HD_MAX_STEPS], hd_slen[HD_MAX_STEPS];
    size_t hd_roff[HD_MAX_STEPS], hd_rlen[HD_MAX_STEPS];
    long hd_u0[HD_MAX_STEPS + 1];
} ring_t;

/* Element range of block b: all_reduce splits n as torch.chunk-like even blocks (the first
 * n % P one longer); reduce_scatter blocks are n each. */
static void ring_block(const ring_t *g, int b, size_t *off, size_t *len) {
    if (!g->is_ar) {
        *off = (size_t)b * g->n, *len = g->n;
        return;
    }
    size_t base = g->n / (size_t)g->P, rem = g->n % (size_t)g->P, ub = (size_t)b;
    *off = ub * base + (ub < rem ? ub : rem);
    *len = base + (ub < rem);
}

static int ring_mod(const ring_t *g, long x) { return (int)(((x % g->P) + g->P) % g->P); }

/* Block received (is_send = 0) or sent in step s. */
static int ring_blk(const ring_t *g, long s, int is_send) {
    if (s < g->P - 1) return ring_mod(g, (long)g->rank - s - (is_send ? 1 : 2));
    long t = s - (g->P - 1);
    return ring_mod(g, (long)g->rank - t - (is_send ? 0 : 1));
}

/* Elements of chunk c in a block of len elements, and its offset in the block. */
static size_t ring_clen(const ring_t *g, size_t len, long c, size_t *coff) {
    *coff = (size_t)c * g->chunk;
    return len > *coff ? (len - *coff < g->chunk ? len - *coff : g->chunk) : 0;
}

/* Where reduce-scatter step s leaves its partial result for chunk c of block b. */
static char *ring_acc(const ring_t *g, long s, int b, size_t boff, size_t coff) {
    if (g->is_ar) return g->dst + (boff + coff) * g->es;
    if (g->mut) return g->mut + (boff + coff) * g->es;
    /* out of place: the last step (s = P-2) lands in recvbuf, earlier ones alternate between
     * two workspace blocks (one block would make step s wait for the send of step s-2's
     * result, a stall visible at 1 MiB on 4 ranks) */
    if (s == g->P - 2) return g->dst + coff * g->es;
    return g->acc + ((size_t)(s % 2) * g->n + coff) * g->es;
}

/* d = a op b elementwise, a the partial from the left neighbour, b this rank's block; d may
 * be b (in place). Integer sums and products wrap like MPI's. `omp simd` because -O2 does not
 * vectorise loops of unknown length (elementwise, so the bits do not change). */
#define RING_KERNEL(NAME, T, EXPR)                                                      \
    static void NAME##_3(T *restrict d, const T *restrict a, const T *restrict b,       \
                         size_t n) {                                                    \
        _Pragma("omp simd")                                                             \
        for (size_t i = 0; i < n; i++) {                                                \
            T x = a[i], y = b[i];                                                       \
            d[i] = (EXPR);                                                              \
        }                                                                               \
    }                                                                                   \
    static void NAME##_2(T *restrict d, const T *restrict a, size_t n) {                \
        _Pragma("omp simd")                                                             \
        for (size_t i = 0; i < n; i++) {                                                \
            T x = a[i], y = d[i];                                                       \
            d[i] = (EXPR);                                                              \
        }                                                                               \
    }

#define RING_KERNELS(P, T, U)                                                           \
    RING_KERNEL(P##_sum, T, (T)((U)x + (U)y))                                           \
    RING_KERNEL(P##_prod, T, (T)((U)x * (U)y))                                          \
    RING_KERNEL(P##_max, T, x > y ? x : y)                                              \
    RING_KERNEL(P##_min, T, x < y ? x : y)

RING_KERNEL(f32_sum, float, x + y)
RING_KERNEL(f32_prod, float, x * y)
RING_KERNEL(f32_max, float, x > y ? x : y)
RING_KERNEL(f32_min, float, x < y ? x : y)
RING_KERNELS(i32, int32_t, uint32_t)
RING_KERNELS(i64, int64_t, uint64_t)
RING_KERNELS(u8, uint8_t, unsigned)

typedef void (*ring_k3_t)(void *restrict, const void *restrict, const void *restrict, size_t);
typedef void (*ring_k2_t)(void *restrict, const void *restrict, size_t);

#define RING_CASE(P)                                                                    \
    switch (op) {                                                                       \
    case HP_SUM: *k3 = (ring_k3_t)P##_sum_3, *k2 = (ring_k2_t)P##_sum_2; return 1;      \
    case HP_PROD: *k3 = (ring_k3_t)P##_prod_3, *k2 = (ring_k2_t)P##_prod_2; return 1;   \
    case HP_MAX: *k3 = (ring_k3_t)P##_max_3, *k2 = (ring_k2_t)P##_max_2; return 1;      \
    case HP_MIN: *k3 = (ring_k3_t)P##_min_3, *k2 = (ring_k2_t)P##_min_2; return 1;      \
    default: return 0;                                                                  \
    }

static int ring_kernel(hp_dtype_t dt, hp_redop_t op, ring_k3_t *k3, ring_k2_t *k2) {
    switch (dt) {
    case HP_F32: RING_CASE(f32)
    case HP_I32: RING_CASE(i32)
    case HP_I64: RING_CASE(i64)
    case HP_U8: RING_CASE(u8)
    default: return 0;
    }
}

static void ring_reduce(const ring_t *g, void *d, const void *a, const void *b, size_t n) {
    ring_k3_t k3 = NULL;
    ring_k2_t k2 = NULL;
    ring_kernel(g->dt, g->op, &k3, &k2);   /* checked at start */
    if (d == b) k2(d, a, n);
    else k3(d, a, b, n);
}

static hp_status_t hd_post_recv(ring_t *g, long u);
static hp_status_t hd_post_send(ring_t *g, long u);
static void hd_process(ring_t *g, long u);
static int hd_recv_ready(const ring_t *g, long u);
static int hd_send_ready(const ring_t *g, long u);

static hp_status_t ring_post_recv(ring_t *g, long u) {
    if (g->hd) return hd_post_recv(g, u);
    long s = u / g->K, c = u % g->K;
    size_t boff, blen, coff;
    ring_block(g, ring_blk(g, s, 0), &boff, &blen);
    size_t cl = ring_clen(g, blen, c, &coff);
    char *buf = s < g->P - 1 ? g->tmp + (size_t)(u % RING_WINDOW) * g->chunk * g->es
                             : g->dst + (boff + coff) * g->es;
    MPI_CHECK(MPI_Irecv(buf, (int)cl, g->type, g->left, g->tag, g->comm, &g->rr[u % RING_WINDOW]));
    return HP_OK;
}

static hp_status_t ring_post_send(ring_t *g, long u) {
    if (g->hd) return hd_post_send(g, u);
    long s = u / g->K, c = u % g->K;
    int b = ring_blk(g, s, 1);
    size_t boff, blen, coff;
    ring_block(g, b, &boff, &blen);
    size_t cl = ring_clen(g, blen, c, &coff);
    const char *buf;
    if (s == 0) buf = g->src + (boff + coff) * g->es;                /* own data */
    else if (s < g->P - 1) buf = ring_acc(g, s - 1, b, boff, coff);  /* partial of step s-1 */
    else buf = g->dst + (boff + coff) * g->es;                       /* reduced block */
    MPI_CHECK(MPI_Isend(buf, (int)cl, g->type, g->right, g->tag, g->comm, &g->sr[u % RING_WINDOW]));
    return HP_OK;
}

/* Reduces the received chunk of unit u (reduce-scatter steps only). */
static void ring_process(ring_t *g, long u) {
    if (g->hd) {
        hd_process(g, u);
        return;
    }
    long s = u / g->K, c = u % g->K;
    if (s >= g->P - 1) return;
    int b = ring_blk(g, s, 0);
    size_t boff, blen, coff;
    ring_block(g, b, &boff, &blen);
    size_t cl = ring_clen(g, blen, c, &coff);
    if (!cl) return;
    const char *own = g->src + (boff + coff) * g->es;
    ring_reduce(g, ring_acc(g, s, b, boff, coff), g->tmp + (size_t)(u % RING_WINDOW) * g->chunk * g->es,
                own, cl);
}

/* Dependencies (all on units of this rank):
 * - receive u: its slot is free (u < recv_done + W); an all-gather receive overwrites a block
 *   of recvbuf that the send of unit u - (P-1)K read, so that send must be done;
 * - reduce u: out-of-place reduce_scatter, steps 2..P-3, reuses the workspace block of unit
 *   u - 2K, sent as unit u - K;
 * - send u (step >= 1): unit u - K is reduced (or received, in the all-gather). */
static int ring_recv_ready(const ring_t *g, long u) {
    if (u >= g->recv_done + RING_WINDOW) return 0;
    if (g->hd) return hd_recv_ready(g, u);
    if (u >= g->ag0 && g->send_done <= u - (long)(g->P - 1) * g->K) return 0;
    return 1;
}

static int ring_process_ready(const ring_t *g, long u) {
    long s = u / g->K;
    if (g->hd) return 1;   /* its reductions write ranges no pending send reads */
    if (g->is_ar || g->mut || s < 2 || s >= g->P - 2) return 1;
    return g->send_done > u - g->K;
}

static int ring_send_ready(const ring_t *g, long u) {
    if (u >= g->send_done + RING_WINDOW) return 0;
    if (g->hd) return hd_send_ready(g, u);
    return u < g->K || g->recv_done > u - g->K;
}

/* Halving-doubling (Rabenseifner's; power-of-two P): recursive-halving reduce-scatter, in
 * step j exchanging half of the current block range with rank r ^ P/2^(j+1) and reducing the
 * half kept (the one holding block r); all_reduce then runs the recursive-doubling
 * all-gather in the reverse order. reduce_scatter uses the halving steps alone (the pattern
 * of Open MPI's own reduce_scatter_block at these sizes). 2 log2(P) steps instead of the ring's 2(P-1), the same bytes per rank;
 * each element is reduced on one rank only (fixed tree order) and copied to the rest, so
 * every rank gets the same bits for any op. Steps are not pipelined into each other: a step's
 * sends wait for every receive of the step before; within a step chunks are. */
static int hd_step(const ring_t *g, long u) {
    int j = 0;
    while (u >= g->hd_u0[j + 1]) j++;
    return j;
}

static size_t hd_chunk(const ring_t *g, size_t len, long c, size_t *coff) {
    return ring_clen(g, len, c, coff);
}

static hp_status_t hd_post_recv(ring_t *g, long u) {
    int j = hd_step(g, u);
    long c = u - g->hd_u0[j];
    size_t coff, cl = hd_chunk(g, g->hd_rlen[j], c, &coff);
    char *buf = j < g->hd_L ? g->tmp + (size_t)(u % RING_WINDOW) * g->chunk * g->es
                            : g->dst + (g->hd_roff[j] + coff) * g->es;
    MPI_CHECK(MPI_Irecv(buf, (int)cl, g->type, g->hd_peer[j], g->tag, g->comm, &g->rr[u % RING_WINDOW]));
    return HP_OK;
}

/* Where halving step j leaves its reduced value of element e (an index into the full
 * vector): all_reduce in recvbuf, in-place reduce_scatter in the send buffer, out-of-place
 * reduce_scatter in the workspace (laid out as step 0's kept range) and, at the last step,
 * in recvbuf. */
static char *hd_acc(const ring_t *g, int j, size_t e) {
    if (g->is_ar) return g->dst + e * g->es;
    if (g->mut) return g->mut + e * g->es;
    if (j == g->hd_L - 1) return g->dst + (e - (size_t)g->rank * g->n) * g->es;
    return g->acc + (e - g->hd_roff[0]) * g->es;
}

static hp_status_t hd_post_send(ring_t *g, long u) {
    int j = hd_step(g, u);
    long c = u - g->hd_u0[j];
    size_t coff, cl = hd_chunk(g, g->hd_slen[j], c, &coff), e = g->hd_soff[j] + coff;
    const char *buf = j == 0 ? g->src + e * g->es : j < g->hd_L ? hd_acc(g, j - 1, e)
                                                               : g->dst + e * g->es;
    MPI_CHECK(MPI_Isend(buf, (int)cl, g->type, g->hd_peer[j], g->tag, g->comm, &g->sr[u % RING_WINDOW]));
    return HP_OK;
}

static void hd_process(ring_t *g, long u) {
    int j = hd_step(g, u);
    if (j >= g->hd_L) return;
    long c = u - g->hd_u0[j];
    size_t coff, cl = hd_chunk(g, g->hd_rlen[j], c, &coff);
    if (!cl) return;
    size_t e = g->hd_roff[j] + coff;
    ring_reduce(g, hd_acc(g, j, e), g->tmp + (size_t)(u % RING_WINDOW) * g->chunk * g->es,
                j == 0 ? g->src + e * g->es : hd_acc(g, j - 1, e), cl);
}

/* All-gather receives overwrite recvbuf ranges that reduce-scatter sends read: they wait for
 * every reduce-scatter send. */
static int hd_recv_ready(const ring_t *g, long u) {
    return u < g->hd_u0[g->hd_L] || g->send_done >= g->hd_u0[g->hd_L];
}

/* A step's sends read what the previous steps reduced or received. */
static int hd_send_ready(const ring_t *g, long u) {
    return g->recv_done >= g->hd_u0[hd_step(g, u)];
}

/* Lays out the steps; block ranges [lo, hi) map to elements through ring_block. */
static void hd_plan(ring_t *g) {
    int L = 0;
    while ((1 << L) < g->P) L++;
    g->hd_L = L, g->hd_steps = g->is_ar ? 2 * L : L;   /* reduce_scatter: halving only */
    int lo = 0, hi = g->P, r = g->rank;
    size_t o1, l1, o2, l2;
#define HD_RANGE(a, b, off, len)                                       \
    do {                                                               \
        ring_block(g, (a), &o1, &l1);                                  \
        ring_block(g, (b) - 1, &o2, &l2);                              \
        (off) = o1, (len) = o2 + l2 - o1;                              \
    } while (0)
    g->hd_u0[0] = 0;
    for (int j = 0; j < g->hd_steps; j++) {
        int slo, shi, rlo, rhi;
        if (j < L) {   /* halve: keep the half holding block r */
            int d = g->P >> (j + 1), mid = lo + (hi - lo) / 2;
            g->hd_peer[j] = r ^ d;
            if (!(r & d)) rlo = lo, rhi = mid, slo = mid, shi = hi;
            else rlo = mid, rhi = hi, slo = lo, shi = mid;
            lo = rlo, hi = rhi;
        } else {       /* double: swap ranges with the partner, in reverse order */
            int d = 1 << (j - L), w = hi - lo;
            g->hd_peer[j] = r ^ d;
            slo = lo, shi = hi;
            if (!(r & d)) rlo = hi, rhi = hi + w, hi += w;
            else rlo = lo - w, rhi = lo, lo -= w;
        }
        HD_RANGE(slo, shi, g->hd_soff[j], g->hd_slen[j]);
        HD_RANGE(rlo, rhi, g->hd_roff[j], g->hd_rlen[j]);
        size_t m = g->hd_slen[j] > g->hd_rlen[j] ? g->hd_slen[j] : g->hd_rlen[j];
        g->hd_u0[j + 1] = g->hd_u0[j] + (long)((m + g->chunk - 1) / g->chunk);
    }
#undef HD_RANGE
    g->U = g->hd_u0[g->hd_steps];
    g->ag0 = g->hd_u0[L];
}

/* Posts and completes everything possible without blocking. With test = 0 it only posts and
 * reduces what earlier completions allow (ring_wait learns completions from MPI_Waitany;
 * each MPI_Test runs MPI's progress engine, which yields the core when oversubscribed). */
static hp_status_t ring_advance(ring_t *g, int *done, int test) {
    for (;;) {
        int moved = 0;
        while (g->recv_posted < g->U && ring_recv_ready(g, g->recv_posted)) {
            HP_TRY(ring_post_recv(g, g->recv_posted));
            g->recv_posted++, moved = 1;
        }
        while (g->send_posted < g->U && ring_send_ready(g, g->send_posted)) {
            HP_TRY(ring_post_send(g, g->send_posted));
            g->send_posted++, moved = 1;
        }
        while (g->recv_done < g->recv_posted) {
            long u = g->recv_done;
            if (!g->arrived) {
                int f = 0;
                if (test) MPI_CHECK(MPI_Test(&g->rr[u % RING_WINDOW], &f, MPI_STATUS_IGNORE));
                if (!f) break;
                g->arrived = 1;
            }
            if (!ring_process_ready(g, u)) break;
            ring_process(g, u);
            g->arrived = 0, g->recv_done++, moved = 1;
        }
        while (g->send_done < g->send_posted) {
            int f = 0;
            if (test) MPI_CHECK(MPI_Test(&g->sr[g->send_done % RING_WINDOW], &f, MPI_STATUS_IGNORE));
            if (!f) break;
            g->send_done++, moved = 1;
        }
        if (!moved) break;
    }
    *done = g->recv_done == g->U && g->send_done == g->U;
    return HP_OK;
}

/* Advances, then blocks in MPI_Waitany on the oldest pending receive and send (every stall
 * waits on one of them) until the ring is done. */
static hp_status_t ring_wait(ring_t *g) {
    for (;;) {
        int done = 0;
        HP_TRY(ring_advance(g, &done, 0));
        if (done) return HP_OK;
        MPI_Request q[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        MPI_Request *src[2] = {NULL, NULL};
        if (g->recv_done < g->recv_posted && !g->arrived)
            src[0] = &g->rr[g->recv_done % RING_WINDOW], q[0] = *src[0];
        if (g->send_done < g->send_posted)
            src[1] = &g->sr[g->send_done % RING_WINDOW], q[1] = *src[1];
        if (!src[0] && !src[1])
            return hp_error(HP_ERR_STATE, "hp_comm ring: no request to wait on (recv %ld/%ld, "
                            "send %ld/%ld of %ld units)", g->recv_done, g->recv_posted,
                            g->send_done, g->send_posted, g->U);
        int idx = MPI_UNDEFINED;
        MPI_CHECK(MPI_Waitany(2, q, &idx, MPI_STATUS_IGNORE));
        if (idx == 0) *src[0] = MPI_REQUEST_NULL, g->arrived = 1;
        else if (idx == 1) *src[1] = MPI_REQUEST_NULL, g->send_done++;
    }
}

static hp_status_t ring_start(void *ctx, const void *s, void *r, size_t n, hp_dtype_t dt,
                              hp_redop_t op, hp_breq_t *req, int async, int is_ar) {
    hp_mpi_ctx_t *cx = ctx;
    ring_k3_t k3;
    ring_k2_t k2;
    if (!ring_kernel(dt, op, &k3, &k2))
        return hp_error(HP_ERR_UNSUPPORTED, "hp_comm ring reduction: dtype %s with op %d is not "
                        "reduced natively (hint: the front end widens bf16/f16 and lowers "
                        "avg/premul first)", hp_dtype_name(dt), (int)op);
    int rank, size;
    MPI_CHECK(MPI_Comm_rank(cx->comm, &rank));
    MPI_CHECK(MPI_Comm_size(cx->comm, &size));
    size_t es = hp_dtype_size(dt);
    size_t chunk = g_ring_chunk / es;
    if (chunk < 1) chunk = 1;
    if (chunk > (size_t)INT_MAX) chunk = (size_t)INT_MAX;
    int inplace_rs = !is_ar && r == (const char *)s + (size_t)rank * n * es;
    int pow2 = size >= 4 && !(size & (size - 1));
    int hd = pow2 && (is_ar ? n : n * (size_t)size) * es <= g_hd_max_bytes;
    /* out-of-place reduce_scatter: the ring alternates two blocks, halving keeps P/2 */
    size_t acc_blocks = hd ? (size_t)size / 2 : 2;
    size_t acc_bytes = (!is_ar && !inplace_rs && size > 2) ? acc_blocks * n * es : 0;
    size_t head = (sizeof(ring_t) + 63) & ~(size_t)63;
    size_t tmp_bytes = ((RING_WINDOW * chunk * es) + 63) & ~(size_t)63;
    HP_TRY(icount(is_ar ? n : n * (size_t)size, &(int){0}));
    HP_TRY(hp_breq_reserve(req, sizeof(MPI_Request), head + tmp_bytes + acc_bytes));
    ring_t *g = req->scratch;
    memset(g, 0, sizeof *g);
    g->comm = cx->comm;
    g->type = mpi_type(dt);
    /* Every rank starts the collectives of a communicator in the same order, so the sequence
     * numbers agree; distinct tags keep two rings in flight on one communicator apart. */
    g->tag = RING_TAG + (int)(__atomic_fetch_add(&cx->ring_seq, 1, __ATOMIC_RELAXED) % RING_TAGS);
    g->P = size, g->rank = rank;
    g->left = (rank + size - 1) % size, g->right = (rank + 1) % size;
    g->is_ar = is_ar, g->dt = dt, g->op = op, g->es = es;
    g->src = s, g->dst = r;
    g->mut = inplace_rs ? (char *)s : NULL;
    g->tmp = (char *)req->scratch + head;
    g->acc = acc_bytes ? g->tmp + tmp_bytes : NULL;
    g->n = n, g->chunk = chunk;
    size_t maxlen = is_ar ? (n + (size_t)size - 1) / (size_t)size : n;
    g->K = (long)((maxlen + chunk - 1) / chunk);
    long steps = is_ar ? 2L * (size - 1) : (long)(size - 1);
    g->U = steps * g->K;
    g->ag0 = (long)(size - 1) * g->K;
    g->hd = hd;
    if (g->hd) hd_plan(g);
    if (!is_ar && !inplace_rs && size == 1 && n > 0) memcpy(r, s, n * es);   /* no steps */
    if (is_ar && s != r && size == 1 && n > 0) memcpy(r, s, n * es);
    req->n = 0;
    req->machine = 1;
    if (!async) return ring_wait(g);
    int done;
    return ring_advance(g, &done, 1);
}

void hp_comm_mpi_set_ring_chunk(size_t bytes) { g_ring_chunk = bytes ? bytes : 1; }
void hp_comm_mpi_set_hd_max(size_t bytes) { g_hd_max_bytes = bytes; }

static hp_status_t mpi_all_reduce_ring(void *ctx, const void *s, void *r, size_t n,
                                       hp_dtype_t dt, hp_redop_t op, hp_breq_t *req, int async) {
    return ring_start(ctx, s, r, n, dt, op, req, async, 1);
}

static hp_status_t mpi_reduce_scatter_ring(void *ctx, const void *s, void *r, size_t n,
                                           hp_dtype_t dt, hp_redop_t op, hp_breq_t *req,
                                           int async) {
    return ring_start(ctx, s, r, n, dt, op, req, async, 0);
}

static hp_status_t mpi_test(hp_breq_t *req, int *done) {
    if (req->machine) return ring_advance(req->scratch, done, 1);
    int flag = 1;
    if (req->n > 0) MPI_CHECK(MPI_Testall(req->n, (MPI_Request *)req->h, &flag, MPI_STATUSES_IGNORE));
    *done = flag;
    return HP_OK;
}

static hp_status_t mpi_wait(hp_breq_t *req) {
    if (req->machine) return ring_wait(req->scratch);
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
    .host_names = mpi_host_names,
    .world_ranks = mpi_world_ranks,
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
    .all_reduce_ring = mpi_all_reduce_ring,
    .reduce_scatter_ring = mpi_reduce_scatter_ring,
    .p2p = mpi_p2p,
    .test = mpi_test,
    .wait = mpi_wait,
};
