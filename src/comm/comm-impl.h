/* Private comm structures: the backend table (function pointers plus a context, so an NCCL
 * backend can plug in beside MPI), the bodies of hp_comm and hp_work, and the front end's
 * helpers shared by comm.c and the backends. Nothing here is public API. */
#ifndef HP_COMM_IMPL_H
#define HP_COMM_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include "hyperparallel/comm.h"

/* Backend request storage owned by one hp_work: the backend keeps its native handles (e.g.
 * MPI_Request) in `h` and per-operation scratch (e.g. int count arrays) in `scratch`. Both
 * grow only when a bigger size is first seen (hp_breq_reserve), so steady state does not
 * allocate. */
typedef struct hp_breq {
    void *h;              /* backend handles, n of them in use */
    int n;
    size_t h_cap;         /* bytes */
    void *scratch;
    size_t scratch_cap;   /* bytes */
    int machine;          /* nonzero: scratch holds a backend state machine (the ring
                             reductions) that test advances and wait drives; the front end
                             clears it before every start */
} hp_breq_t;
/* Ensures req->h holds `bytes` and req->scratch holds `scratch_bytes`. */
hp_status_t hp_breq_reserve(hp_breq_t *req, size_t bytes, size_t scratch_bytes);

/* One point-to-point operation of a group (or a lone send/recv). */
typedef struct hp_p2p {
    int is_send;
    void *buf;            /* (count) elements of dt */
    size_t count;
    hp_dtype_t dt;
    int peer;
    void *ctx;            /* backend communicator context */
    int tag;              /* 0: the untagged channel; 1..HP_P2P_MAX_TAG: hp_send_tag / hp_recv_tag */
} hp_p2p_t;

/* The backend table. Every collective slot gets the work's request storage `req` (never
 * NULL; scratch for count arrays lives there). With async = 0 the operation completes before
 * the call returns; with async = 1 it is started, its handles stored in *req, and completed by
 * `test`. The front end only asks for reductions the backend declares native:
 * SUM/PROD/MAX/MIN on F32, I32, I64, U8 always, and on BF16/F16 when `native_half_reduce` is
 * set (otherwise the front end widens to an F32 workspace). AVG and PREMUL_SUM are always
 * lowered by the front end to SUM plus a scale. In-place calls arrive in the public header's
 * in-place positions except all_to_all, which the front end always makes out-of-place.
 * Optional slots: all_reduce_ring and reduce_scatter_ring (NULL: the front end uses
 * all_reduce and reduce_scatter for every size); a future NCCL backend sets
 * native_half_reduce. */
typedef struct hp_comm_backend {
    const char *name;
    int native_half_reduce;

    hp_status_t (*init)(int *argc, char ***argv, void **world_ctx, int *rank, int *size);
    hp_status_t (*finalize)(void);
    hp_status_t (*split)(void *ctx, int color, int key, void **out_ctx, int *rank, int *size);
    hp_status_t (*dup)(void *ctx, void **out_ctx, int *rank, int *size);
    void (*free_ctx)(void *ctx);
    int (*world_rank)(void);
    /* Every world rank's host name, out[r * stride], cut to stride - 1 bytes (collective
     * over the world). */
    hp_status_t (*host_names)(void *world_ctx, char *out, int stride);
    /* The world rank of each of the communicator's members, out[size]. */
    hp_status_t (*world_ranks)(void *ctx, int size, int *out);
    /* Ends every process of the job; never returns. */
    void (*abort_job)(void *ctx, int code) __attribute__((noreturn));

    hp_status_t (*all_reduce)(void *ctx, const void *s, void *r, size_t n, hp_dtype_t dt,
                              hp_redop_t op, hp_breq_t *req, int async);
    hp_status_t (*broadcast)(void *ctx, void *buf, size_t n, hp_dtype_t dt, int root,
                             hp_breq_t *req, int async);
    hp_status_t (*reduce)(void *ctx, const void *s, void *r, size_t n, hp_dtype_t dt,
                          hp_redop_t op, int root, hp_breq_t *req, int async);
    hp_status_t (*all_gather)(void *ctx, const void *s, void *r, size_t n, hp_dtype_t dt,
                              hp_breq_t *req, int async);
    hp_status_t (*reduce_scatter)(void *ctx, const void *s, void *r, size_t n, hp_dtype_t dt,
                                  hp_redop_t op, hp_breq_t *req, int async);
    hp_status_t (*all_to_all)(void *ctx, const void *s, void *r, size_t n, hp_dtype_t dt,
                              hp_breq_t *req, int async);
    hp_status_t (*all_to_all_v)(void *ctx, const void *s, const size_t *sc, const size_t *sd,
                                void *r, const size_t *rc, const size_t *rd, hp_dtype_t dt,
                                hp_breq_t *req, int async);
    hp_status_t (*gather)(void *ctx, const void *s, void *r, size_t n, hp_dtype_t dt, int root,
                          hp_breq_t *req, int async);
    hp_status_t (*scatter)(void *ctx, const void *s, void *r, size_t n, hp_dtype_t dt, int root,
                           hp_breq_t *req, int async);
    hp_status_t (*barrier)(void *ctx, hp_breq_t *req, int async);
    /* Optional. Deterministic reductions over point-to-point (a ring reduce-scatter, or
     * halving-doubling where the backend picks it; all_reduce adds the all-gather): the reduction order of every element depends only on
     * (n, communicator size), never on timing or on how the request is completed, so start +
     * wait, start + repeated test, and async = 0 all give the same bits. reduce_scatter_ring
     * writes an in-place result (r == s + rank*n) at r itself, not at the start of the
     * buffer, and may overwrite the other blocks of an in-place s. Same ops and dtypes as
     * all_reduce / reduce_scatter. */
    hp_status_t (*all_reduce_ring)(void *ctx, const void *s, void *r, size_t n, hp_dtype_t dt,
                                   hp_redop_t op, hp_breq_t *req, int async);
    hp_status_t (*reduce_scatter_ring)(void *ctx, const void *s, void *r, size_t n,
                                       hp_dtype_t dt, hp_redop_t op, hp_breq_t *req, int async);
    /* Posts all of ops[n] together (they may span communicators). */
    hp_status_t (*p2p)(const hp_p2p_t *ops, int n, hp_breq_t *req, int async);

    /* Completion check of a started request; *done = 1 when every handle finished. */
    hp_status_t (*test)(hp_breq_t *req, int *done);
    /* Blocks until a started request finished (the blocking path of reductions). */
    hp_status_t (*wait)(hp_breq_t *req);

    /* Optional: the front end's own arithmetic on the backend's buffers (widening half
     * precision to an F32 workspace and narrowing back, PREMUL_SUM / AVG scaling). NULL:
     * the host implementations (hp_convert, a host loop); a device backend (NCCL) points
     * them at its kernels so buffers never cross to the host. */
    void (*convert)(void *dst, hp_dtype_t dst_dt, const void *src, hp_dtype_t src_dt, size_t n);
    hp_status_t (*scale)(void *dst, const void *src, size_t n, hp_dtype_t dt, double s);
} hp_comm_backend_t;

extern const hp_comm_backend_t hp_comm_backend_mpi;

#define HP_COMM_MAX_PREMUL 64

struct hp_comm {
    const hp_comm_backend_t *be;
    void *ctx;
    int rank, size, world_rank;
    int *members;                           /* world rank of each member (NULL for the world) */
    int is_world;
    int pending;                            /* async works not yet completed (progress lock) */
    double premul[HP_COMM_MAX_PREMUL];      /* scalars of PREMUL_SUM ops, id = BUILTIN + i */
    unsigned char premul_used[HP_COMM_MAX_PREMUL];
};

/* What the front end does after the backend finished (in the waiting thread). */
enum {
    HP_POST_NONE = 0,
    HP_POST_DIV = 1,       /* divide post_buf (post_n elems of post_dt) by the comm size */
    HP_POST_NARROW = 2,    /* convert F32 workspace post_src -> post_dst (BF16/F16) */
    HP_POST_MOVE = 4,      /* memmove post_src -> post_dst (post_n elems of post_dt) */
};

/* Arguments of one call, captured so that a communication thread can run it later. */
typedef struct hp_op_desc {
    hp_comm_op_t kind;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    hp_dtype_t dt;
    hp_redop_t op;         /* builtin after lowering */
    double premul;         /* scalar for PREMUL_SUM (op = SUM with is_premul) */
    int is_premul;
    int root;
    const size_t *sc, *sd, *rc, *rd;   /* all_to_all_v: copies owned by the work */
} hp_op_desc_t;

struct hp_work {
    struct hp_work *next;          /* free list or progress list */
    hp_comm_t comm;
    hp_op_desc_t d;
    int async;                     /* started through the non-blocking path */
    int started;                   /* backend request started (else queued for the thread) */
    volatile int done;             /* set (progress lock) when the backend finished */
    hp_status_t status;            /* of the backend part */
    char errmsg[512];              /* message of a failure in a helper thread */
    double t_start;
    hp_breq_t req;
    int post;                      /* HP_POST_* flags */
    void *post_buf;
    const void *post_src;
    void *post_dst;
    hp_dtype_t post_dt;
    size_t post_n;
    void *ws;                      /* workspace, grown when a bigger size is first seen */
    size_t ws_cap;
    size_t *vcounts;               /* all_to_all_v copies: 4*size */
    size_t vcap;
    hp_p2p_t *p2p;                 /* group of point-to-point ops */
    int p2p_n, p2p_cap;
};

/* Allocations the front end made for collectives since start (work pool, workspaces,
 * request storage); tests assert it stays flat in steady state. */
uint64_t hp_comm_debug_allocs(void);

/* Tests only: nonzero makes every all_reduce and reduce_scatter take the large-reduction
 * path (the ring on 3 or more ranks) whatever its size, so small and odd counts exercise it.
 * Call it on every rank at the same point, with no asynchronous work in flight. */
void hp_comm_debug_force_ring(int on);

/* Tests and tuning: bytes per chunk of the MPI backend's ring reductions (default 256 KiB,
 * or HP_COMM_RING_CHUNK_KB). Same value on every rank, no ring in flight. */
void hp_comm_mpi_set_ring_chunk(size_t bytes);
/* Tests and tuning: all_reduce_ring / reduce_scatter_ring of at most this many bytes (send
 * side) on a power-of-two communicator of 4 or more ranks run halving-doubling (default 4 MiB, or
 * HP_COMM_HD_MAX_KB; 0 = never). Same value on every rank, no ring in flight. */
void hp_comm_mpi_set_hd_max(size_t bytes);

#endif
