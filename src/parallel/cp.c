/* Context parallel: sequence sharding (none / head-tail, per document), and the CP attention
 * core that replaces an attention's "sdpa" child (hp_model_replace_module; hooks on the
 * attention put the rows at their global positions): Ulysses all-to-all (sequence <-> heads)
 * inside groups of ulysses_degree ranks, then ring attention over the ring_degree groups with
 * the rotate method allgather or alltoall, block results merged by log-sum-exp in f32.
 * Every rank's rows are chunks of the global sequence with known chunk indices, so the causal
 * rule of a (query chunk, key chunk) pair is: later chunk -> full, same -> causal, earlier ->
 * skip; under head-tail balancing this is the reference's causal / partial / skip table. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "hyperparallel/cp.h"
#include "hyperparallel/attention_block.h"
#include "hyperparallel/backend.h"

/* ---- options ----------------------------------------------------------------------------- */

hp_status_t hp_cp_rotate_parse(const char *s, const char *key, hp_cp_rotate_t *out) {
    if (s && strcmp(s, "allgather") == 0) { *out = HP_CP_ROTATE_ALLGATHER; return HP_OK; }
    if (s && strcmp(s, "alltoall") == 0) { *out = HP_CP_ROTATE_ALLTOALL; return HP_OK; }
    return hp_error(HP_ERR_INVALID_ARG, "%s = '%s', expected allgather or alltoall; hint: --%s=allgather",
                    key, s ? s : "(null)", key);
}

hp_status_t hp_cp_balancer_parse(const char *s, const char *key, hp_cp_balancer_t *out) {
    if (s && strcmp(s, "headtail") == 0) { *out = HP_CP_BALANCE_HEADTAIL; return HP_OK; }
    if (s && strcmp(s, "none") == 0) { *out = HP_CP_BALANCE_NONE; return HP_OK; }
    return hp_error(HP_ERR_INVALID_ARG, "%s = '%s', expected headtail or none; hint: --%s=headtail",
                    key, s ? s : "(null)", key);
}

hp_cp_options_t hp_cp_options_default(void) {
    return (hp_cp_options_t){.rotate = HP_CP_ROTATE_ALLGATHER, .balancer = HP_CP_BALANCE_HEADTAIL, .ulysses_degree = 1,
                             .async = 0};
}

/* ---- sharding ---------------------------------------------------------------------------- */

static hp_status_t check_seq(int T, int cp, hp_cp_balancer_t lb, const char *fn) {
    if (cp <= 0 || T <= 0) return hp_error(HP_ERR_INVALID_ARG, "%s: T=%d, cp=%d, expected both > 0", fn, T, cp);
    const int d = lb == HP_CP_BALANCE_HEADTAIL ? 2 * cp : cp;
    if (T % d != 0)
        return hp_error(HP_ERR_INVALID_ARG,
                        "%s: sequence length %d is not divisible by %s = %d (context parallel degree %d%s); hint: "
                        "set training.seq_len to a multiple of %d%s", fn, T,
                        lb == HP_CP_BALANCE_HEADTAIL ? "2 x cp" : "cp", d, cp,
                        lb == HP_CP_BALANCE_HEADTAIL ? ", head-tail load balancing" : "", d,
                        lb == HP_CP_BALANCE_HEADTAIL ? " or parallelism.context_parallel_load_balancer=none" : "");
    return HP_OK;
}

hp_status_t hp_cp_shard_indices(int T, int cp, hp_cp_balancer_t lb, int32_t *idx) {
    HP_TRY(check_seq(T, cp, lb, "hp_cp_shard_indices"));
    if (lb == HP_CP_BALANCE_NONE) {
        for (int i = 0; i < T; i++) idx[i] = i;
        return HP_OK;
    }
    const int c = T / (2 * cp);
    int n = 0;
    for (int r = 0; r < cp; r++) {
        for (int i = 0; i < c; i++) idx[n++] = r * c + i;
        for (int i = 0; i < c; i++) idx[n++] = (2 * cp - 1 - r) * c + i;
    }
    return HP_OK;
}

hp_status_t hp_cp_shard_indices_docs(const int *doc_lens, int n_docs, int cp, int32_t *idx) {
    int T = 0;
    for (int d = 0; d < n_docs; d++) {
        if (doc_lens[d] <= 0 || doc_lens[d] % (2 * cp) != 0)
            return hp_error(HP_ERR_INVALID_ARG, "hp_cp_shard_indices_docs: document %d has length %d, expected a "
                            "positive multiple of 2 x cp = %d (per-document head-tail balancing); hint: pad the "
                            "documents or use parallelism.context_parallel_load_balancer=headtail", d, doc_lens[d],
                            2 * cp);
        T += doc_lens[d];
    }
    int n = 0;
    for (int r = 0; r < cp; r++)   // rank-major: each rank's chunks of every document in order
        for (int d = 0, start = 0; d < n_docs; start += doc_lens[d], d++) {
            const int c = doc_lens[d] / (2 * cp);
            for (int i = 0; i < c; i++) idx[n++] = start + r * c + i;
            for (int i = 0; i < c; i++) idx[n++] = start + (2 * cp - 1 - r) * c + i;
        }
    HP_ASSERT(n == T);
    return HP_OK;
}

void hp_cp_restore_indices(const int32_t *idx, int T, int32_t *restore) {
    for (int i = 0; i < T; i++) restore[idx[i]] = i;
}

/* Global position of row t of rank r (closed form of hp_cp_shard_indices). */
static int global_pos(int T, int cp, hp_cp_balancer_t lb, int r, int t) {
    const int Tl = T / cp;
    if (lb == HP_CP_BALANCE_NONE) return r * Tl + t;
    const int c = Tl / 2;
    return t < c ? r * c + t : (2 * cp - 1 - r) * c + (t - c);
}

hp_status_t hp_cp_shard_rows(void *local, const void *global, size_t row_bytes, int B, int T, int cp, int rank,
                             hp_cp_balancer_t lb) {
    HP_TRY(check_seq(T, cp, lb, "hp_cp_shard_rows"));
    const int Tl = T / cp;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tl; t++)
            memcpy((char *)local + ((size_t)b * Tl + t) * row_bytes,
                   (const char *)global + ((size_t)b * T + global_pos(T, cp, lb, rank, t)) * row_bytes, row_bytes);
    return HP_OK;
}

hp_status_t hp_cp_unshard_rows(void *global, const void *gathered, size_t row_bytes, int B, int T, int cp,
                               hp_cp_balancer_t lb) {
    HP_TRY(check_seq(T, cp, lb, "hp_cp_unshard_rows"));
    const int Tl = T / cp;
    for (int r = 0; r < cp; r++)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < Tl; t++)
                memcpy((char *)global + ((size_t)b * T + global_pos(T, cp, lb, r, t)) * row_bytes,
                       (const char *)gathered + (((size_t)r * B + b) * Tl + t) * row_bytes, row_bytes);
    return HP_OK;
}

/* ---- the CP handle ----------------------------------------------------------------------- */

typedef struct cp_core {
    hp_module_t mod;
    struct hp_cp *cp;
    int Hq, Hkv;        // the attention's local heads (this rank, before Ulysses)
    hp_module_t *attn;  // async: the attention whose projection hook starts the collective
    hp_module_t *proj;  // async: the module that hook is on (the attention's q|k|v child as last seen)
    struct cp_core *next;
} cp_core_t;

typedef struct cp_saved {
    const float *x;     // (B, Tl, qd + 2 kd) the parent's q | k | v rows
    float *xr;          // (B, Tr, qkvd_r) Ulysses layout (== x without Ulysses)
    float *out_r;       // (B, Tr, qd_r) core output in Ulysses layout (== out without)
    float *lse;         // (B, Hq_r, Tr) merged
    int B;
} cp_saved_t;

struct hp_cp {
    hp_comm_t comm, uly_comm, ring_comm;   // cp dim; Ulysses group; ring (one rank per group)
    hp_cp_options_t o;
    int W, w, U, u, R, g;                  // degree, rank; Ulysses size / index; ring size / index
    int T, Tl, Tr, max_B, hd, Hq_max, Hkv_max;
    int nc, c;                             // chunks per ring participant and their length
    int pos_segs[2];
    float *ws;                             // the workspace (one allocation, carved below)
    size_t ws_floats;
    float *kv_own, *kv_buf, *dkv_buf, *blk_out, *blk_lse, *attn_scratch, *a2a_send, *a2a_recv, *uly_dout, *uly_dx;
    cp_core_t *cores;
    float *kv_raw, *rstd;                  // async: send buffer of the raw K|V rows; qk-norm scratch
    hp_work_t pend[2];                     // async: the collective a projection hook started ...
    cp_core_t *pend_core;                  // ... for this core (NULL: none in flight)
    int pend_B;
    long n_async;                          // collectives started by a hook and consumed by a core
    double wait_s, comp_s;                 // seconds blocked in K/V waits, in block compute (hp_cp_timers)
};

/* Global chunk index of chunk j of ring participant gi. */
static int chunk_id(const struct hp_cp *cp, int gi, int j) {
    if (cp->o.balancer == HP_CP_BALANCE_NONE) return gi * cp->U + j;
    const int w = gi * cp->U + j / 2;
    return (j % 2 == 0) ? w : 2 * cp->W - 1 - w;
}

static hp_attn_mask_t chunk_mask(int qa, int kb) {
    return qa > kb ? HP_ATTN_MASK_FULL : qa == kb ? HP_ATTN_MASK_CAUSAL : HP_ATTN_MASK_SKIP;
}

int hp_cp_degree(hp_cp_t cp) { return cp->W; }
int hp_cp_rank(hp_cp_t cp) { return cp->w; }
int hp_cp_local_seq_len(hp_cp_t cp) { return cp->Tl; }
size_t hp_cp_workspace_bytes(hp_cp_t cp) { return cp->ws_floats * sizeof(float); }

static hp_status_t check_heads(const struct hp_cp *cp, int Hq, int Hkv, const char *fn) {
    if (Hq <= 0 || Hkv <= 0 || Hq % Hkv != 0)
        return hp_error(HP_ERR_INVALID_ARG, "%s: %d heads and %d kv heads, expected > 0 with heads a multiple of kv "
                        "heads", fn, Hq, Hkv);
    if (Hq % cp->U != 0 || Hkv % cp->U != 0)
        return hp_error(HP_ERR_INVALID_ARG,
                        "%s: parallelism.context_parallel_ulysses_degree = %d does not divide the %d (local) query "
                        "heads and %d kv heads; hint: choose a Ulysses degree that divides both (with tensor "
                        "parallelism the heads per TP rank), e.g. 1 (ring attention only)", fn, cp->U, Hq, Hkv);
    return HP_OK;
}

hp_status_t hp_cp_create(hp_comm_t cp_comm, const hp_cp_options_t *opt, int max_B, int T, int n_heads,
                         int n_kv_heads, int head_dim, hp_cp_t *out) {
    *out = NULL;
    const hp_cp_options_t o = opt ? *opt : hp_cp_options_default();
    const int W = hp_comm_size(cp_comm);
    if (o.rotate != HP_CP_ROTATE_ALLGATHER && o.rotate != HP_CP_ROTATE_ALLTOALL)
        return hp_error(HP_ERR_INVALID_ARG, "hp_cp_create: rotate method %d, expected allgather or alltoall", o.rotate);
    if (o.balancer != HP_CP_BALANCE_NONE && o.balancer != HP_CP_BALANCE_HEADTAIL)
        return hp_error(HP_ERR_INVALID_ARG, "hp_cp_create: balancer %d, expected headtail or none", o.balancer);
    if (o.ulysses_degree <= 0 || W % o.ulysses_degree != 0)
        return hp_error(HP_ERR_INVALID_ARG,
                        "hp_cp_create: parallelism.context_parallel_ulysses_degree = %d does not divide "
                        "parallelism.context_parallel_degree = %d; hint: cp = ulysses_degree x ring_degree, e.g. "
                        "ulysses_degree 1 (ring only) or %d (Ulysses only)", o.ulysses_degree, W, W);
    HP_TRY(check_seq(T, W, o.balancer, "hp_cp_create"));
    if (max_B <= 0 || head_dim <= 0)
        return hp_error(HP_ERR_INVALID_ARG, "hp_cp_create: max_B=%d, head_dim=%d, expected > 0", max_B, head_dim);
    struct hp_cp *cp = hp_calloc(1, sizeof(*cp));
    if (!cp) return HP_ERR_OOM;
    cp->comm = cp_comm;
    cp->o = o;
    cp->W = W;
    cp->w = hp_comm_rank(cp_comm);
    cp->U = o.ulysses_degree;
    cp->R = W / cp->U;
    cp->u = cp->w % cp->U;
    cp->g = cp->w / cp->U;
    cp->T = T;
    cp->Tl = T / W;
    cp->Tr = cp->Tl * cp->U;
    cp->max_B = max_B;
    cp->hd = head_dim;
    cp->Hq_max = n_heads;
    cp->Hkv_max = n_kv_heads;
    cp->nc = o.balancer == HP_CP_BALANCE_HEADTAIL ? 2 * cp->U : cp->U;
    cp->c = cp->Tr / cp->nc;
    if (o.balancer == HP_CP_BALANCE_HEADTAIL) {
        cp->pos_segs[0] = cp->w * (cp->Tl / 2);
        cp->pos_segs[1] = (2 * W - 1 - cp->w) * (cp->Tl / 2);
    } else {
        cp->pos_segs[0] = cp->w * cp->Tl;
    }
    hp_status_t st = check_heads(cp, n_heads, n_kv_heads, "hp_cp_create");
    if (st == HP_OK) st = hp_comm_split(cp_comm, cp->g, cp->u, &cp->uly_comm);
    if (st == HP_OK) st = hp_comm_split(cp_comm, cp->u, cp->g, &cp->ring_comm);
    if (st != HP_OK) {
        hp_cp_destroy(cp);
        return st;
    }
    /* workspace sizes (floats), from the largest heads */
    const size_t B = (size_t)max_B, R = (size_t)cp->R, hd = (size_t)head_dim;
    const size_t qd = (size_t)n_heads * hd, kd = (size_t)n_kv_heads * hd, qkvd = qd + 2 * kd;
    const size_t qd_r = qd / cp->U, kd_r = kd / cp->U, kv = B * cp->Tr * 2 * kd_r;
    const size_t n_kv_buf = o.rotate == HP_CP_ROTATE_ALLGATHER ? R : 2;
    const size_t n_dkv = o.rotate == HP_CP_ROTATE_ALLGATHER ? R + 1 : 3;   // + own (allgather) / contrib x2 + in
    const size_t sizes[] = {
        kv,                                                                   // kv_own
        n_kv_buf * kv,                                                        // kv_buf
        n_dkv * kv,                                                           // dkv_buf
        (size_t)cp->c * qd_r,                                                 // blk_out
        (size_t)(n_heads / cp->U) * cp->c,                                    // blk_lse
        hp_attn_block_scratch_floats(cp->c, cp->c),                           // attn_scratch
        cp->U > 1 ? B * cp->Tl * qkvd : 0,                                    // a2a_send
        cp->U > 1 ? B * cp->Tl * qkvd : 0,                                    // a2a_recv
        cp->U > 1 ? B * cp->Tr * qd_r : 0,                                    // uly_dout
        cp->U > 1 ? B * cp->Tr * (qd_r + 2 * kd_r) : 0,                       // uly_dx
        o.async && cp->U == 1 ? kv : 0,                                       // kv_raw
        o.async ? (size_t)cp->Tr * n_heads : 0,                               // rstd
    };
    float **ptrs[] = {&cp->kv_own, &cp->kv_buf, &cp->dkv_buf, &cp->blk_out, &cp->blk_lse, &cp->attn_scratch,
                      &cp->a2a_send, &cp->a2a_recv, &cp->uly_dout, &cp->uly_dx, &cp->kv_raw, &cp->rstd};
    size_t total = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) total += (sizes[i] + 15) & ~(size_t)15;
    cp->ws = hp_calloc(total ? total : 1, sizeof(float));
    if (!cp->ws) {
        hp_cp_destroy(cp);
        return HP_ERR_OOM;
    }
    cp->ws_floats = total;
    size_t off = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        *ptrs[i] = cp->ws + off;
        off += (sizes[i] + 15) & ~(size_t)15;
    }
    *out = cp;
    return HP_OK;
}

void hp_cp_destroy(hp_cp_t cp) {
    if (!cp) return;
    for (int i = 0; i < 2; i++)
        if (cp->pend[i]) (void)hp_work_wait(&cp->pend[i]);   // a collective a failed forward left in flight
    for (cp_core_t *c = cp->cores, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    if (cp->uly_comm) hp_comm_destroy(cp->uly_comm);
    if (cp->ring_comm) hp_comm_destroy(cp->ring_comm);
    free(cp->ws);
    free(cp);
}

static int n_segs(const struct hp_cp *cp) { return cp->o.balancer == HP_CP_BALANCE_HEADTAIL ? 2 : 1; }

void hp_cp_set_positions(hp_cp_t cp, hp_act_t *act) {
    act->pos0 = cp->pos_segs[0];
    act->n_pos_segs = n_segs(cp);
    act->pos_segs = cp->pos_segs;
}

hp_status_t hp_cp_shard_tokens(hp_cp_t cp, int32_t *local, const int32_t *global, int B) {
    return hp_cp_shard_rows(local, global, sizeof(int32_t), B, cp->T, cp->W, cp->w, cp->o.balancer);
}

/* ---- Ulysses: sequence-sharded <-> head-sharded ----------------------------------------- */

/* Column segments of a row that are split over the Ulysses group by heads: (offset in the
 * full row, width per Ulysses rank). */
typedef struct segs {
    int n, off[3], w;
    int wr[3];
} segs_t;

/* A row's width per Ulysses rank: the sum of its segments' widths. */
static int segs_width(const segs_t *S) {
    int wr = 0;
    for (int i = 0; i < S->n; i++) wr += S->wr[i];
    return wr;
}

/* seq -> heads: src (B, Tl, ld) -> dst (B, U Tl, sum wr) through an all-to-all, in two
 * halves: pack + start (work NULL: blocking), and unpack once it has arrived. */
static hp_status_t uly_seq2head_start(struct hp_cp *cp, const float *src, int ld, const segs_t *S, int B,
                                      hp_work_t *work) {
    const int U = cp->U, Tl = cp->Tl, wr = segs_width(S);
    const size_t blk = (size_t)B * Tl * wr;
    for (int d = 0; d < U; d++)
        for (int r = 0; r < B * Tl; r++) {
            float *o = cp->a2a_send + d * blk + (size_t)r * wr;
            for (int i = 0; i < S->n; i++, o += S->wr[i - 1])
                memcpy(o, src + (size_t)r * ld + S->off[i] + (size_t)d * S->wr[i], sizeof(float) * S->wr[i]);
        }
    return hp_all_to_all(cp->a2a_send, cp->a2a_recv, blk, HP_F32, cp->uly_comm, work);
}

static void uly_seq2head_finish(struct hp_cp *cp, float *dst, const segs_t *S, int B) {
    const int U = cp->U, Tl = cp->Tl, wr = segs_width(S);
    const size_t blk = (size_t)B * Tl * wr;
    for (int s = 0; s < U; s++)
        for (int b = 0; b < B; b++)
            memcpy(dst + ((size_t)b * cp->Tr + (size_t)s * Tl) * wr, cp->a2a_recv + s * blk + (size_t)b * Tl * wr,
                   sizeof(float) * Tl * wr);
}

static hp_status_t uly_seq2head(struct hp_cp *cp, float *dst, const float *src, int ld, const segs_t *S, int B) {
    HP_TRY(uly_seq2head_start(cp, src, ld, S, B, NULL));
    uly_seq2head_finish(cp, dst, S, B);
    return HP_OK;
}

/* heads -> seq: src (B, U Tl, sum wr) -> dst (B, Tl, ld) (=), the inverse of uly_seq2head. */
static hp_status_t uly_head2seq(struct hp_cp *cp, float *dst, int ld, const float *src, const segs_t *S, int B) {
    const int U = cp->U, Tl = cp->Tl, wr = segs_width(S);
    const size_t blk = (size_t)B * Tl * wr;
    for (int d = 0; d < U; d++)
        for (int b = 0; b < B; b++)
            memcpy(cp->a2a_send + d * blk + (size_t)b * Tl * wr, src + ((size_t)b * cp->Tr + (size_t)d * Tl) * wr,
                   sizeof(float) * Tl * wr);
    HP_TRY(hp_all_to_all(cp->a2a_send, cp->a2a_recv, blk, HP_F32, cp->uly_comm, NULL));
    for (int s = 0; s < U; s++)
        for (int r = 0; r < B * Tl; r++) {
            const float *i0 = cp->a2a_recv + s * blk + (size_t)r * wr;
            for (int i = 0; i < S->n; i++, i0 += S->wr[i - 1])
                memcpy(dst + (size_t)r * ld + S->off[i] + (size_t)s * S->wr[i], i0, sizeof(float) * S->wr[i]);
        }
    return HP_OK;
}

static segs_t qkv_segs(const cp_core_t *C) {
    const int hd = C->cp->hd, U = C->cp->U, qd = C->Hq * hd, kd = C->Hkv * hd;
    return (segs_t){.n = 3, .off = {0, qd, qd + kd}, .wr = {qd / U, kd / U, kd / U}};
}
static segs_t q_segs(const cp_core_t *C) {
    return (segs_t){.n = 1, .off = {0}, .wr = {C->Hq * C->cp->hd / C->cp->U}};
}

/* ---- ring attention ---------------------------------------------------------------------- */

typedef struct ring_dims {
    int Hq, Hkv, hd, qd, kd, ld;   // Ulysses-local heads; q | k | v row width ld
    size_t kv;                     // floats of one participant's packed [k | v] (B, Tr, 2 kd)
} ring_dims_t;

static ring_dims_t ring_dims(const cp_core_t *C, int B) {
    const struct hp_cp *cp = C->cp;
    ring_dims_t d = {.Hq = C->Hq / cp->U, .Hkv = C->Hkv / cp->U, .hd = cp->hd};
    d.qd = d.Hq * d.hd;
    d.kd = d.Hkv * d.hd;
    d.ld = d.qd + 2 * d.kd;
    d.kv = (size_t)B * cp->Tr * 2 * d.kd;
    return d;
}

static void pack_kv(float *kv, const float *x, const ring_dims_t *d, int rows) {
    for (int r = 0; r < rows; r++)
        memcpy(kv + (size_t)r * 2 * d->kd, x + (size_t)r * d->ld + d->qd, sizeof(float) * 2 * d->kd);
}

/* One block of a ring step: a query chunk of this participant against a key chunk of the
 * source participant, with the rows where each starts and the causal mask between them. */
typedef struct {
    size_t qr, kr;       // first row of the query chunk (rows of x), of the key chunk (packed K/V rows)
    size_t lse;          // the query chunk's first entry of lse (B, Hq, Tr)
    hp_attn_mask_t mk;
} ring_block_t;

/* The blocks against source participant s in order (batch, query chunk, key chunk), those the
 * mask skips left out: *it the position (from 0), 0 returned past the last. The forward and
 * the backward visit the same blocks in the same order through it. */
static int ring_next(const struct hp_cp *cp, const ring_dims_t *d, int s, int B, int *it, ring_block_t *k) {
    const int nc = cp->nc, c = cp->c, Tr = cp->Tr;
    for (; *it < B * nc * nc; (*it)++) {
        const int b = *it / (nc * nc), a = *it / nc % nc, j = *it % nc;
        const hp_attn_mask_t mk = chunk_mask(chunk_id(cp, cp->g, a), chunk_id(cp, s, j));
        if (mk == HP_ATTN_MASK_SKIP) continue;
        (*it)++;
        *k = (ring_block_t){(size_t)b * Tr + (size_t)a * c, (size_t)b * Tr + (size_t)j * c,
                            (size_t)b * d->Hq * Tr + (size_t)a * c, mk};
        return 1;
    }
    return 0;
}

/* Forward of this participant's query chunks against source participant s's K/V. */
static void ring_fwd_step(struct hp_cp *cp, const hp_backend_t *be, const ring_dims_t *d, const float *xr,
                          const float *kv, int s, float *out, float *lse, int B) {
    const int c = cp->c, ldkv = 2 * d->kd;
    ring_block_t k;
    for (int it = 0; ring_next(cp, d, s, B, &it, &k);) {
        const float *kb = kv + k.kr * ldkv;
        be->attn_block_forward(be->ctx, cp->blk_out, d->qd, cp->blk_lse, c, xr + k.qr * d->ld, d->ld, kb, ldkv,
                               kb + d->kd, ldkv, c, c, d->Hq, d->Hkv, d->hd, k.mk, cp->attn_scratch);
        be->attn_block_merge(be->ctx, out + k.qr * d->qd, d->qd, lse + k.lse, cp->Tr, cp->blk_out, d->qd, cp->blk_lse,
                             c, c, d->Hq, d->hd);
    }
}

/* Backward of the same blocks: dq (rows of dx, q columns) +=, dkv (source's packed rows) +=. */
static void ring_bwd_step(struct hp_cp *cp, const hp_backend_t *be, const ring_dims_t *d, const float *xr,
                          const float *kv, int s, const float *out, const float *lse, const float *dout, float *dx,
                          float *dkv, int B) {
    const int c = cp->c, ldkv = 2 * d->kd;
    ring_block_t k;
    for (int it = 0; ring_next(cp, d, s, B, &it, &k);) {
        const float *kb = kv + k.kr * ldkv;
        float *dk = dkv + k.kr * ldkv;
        be->attn_block_backward(be->ctx, dx + k.qr * d->ld, d->ld, dk, ldkv, dk + d->kd, ldkv, dout + k.qr * d->qd,
                                d->qd, out + k.qr * d->qd, d->qd, lse + k.lse, cp->Tr, xr + k.qr * d->ld, d->ld, kb,
                                ldkv, kb + d->kd, ldkv, c, c, d->Hq, d->Hkv, d->hd, k.mk, cp->attn_scratch);
    }
}

static hp_status_t wait_timed(struct hp_cp *cp, hp_work_t *w) {
    if (!*w) return HP_OK;
    double t0 = omp_get_wtime();
    hp_status_t st = hp_work_wait(w);
    cp->wait_s += omp_get_wtime() - t0;
    return st;
}

/* Async: the ring's K/V of participant s arrived raw (before qk-norm and RoPE); k-norm and
 * RoPE are applied to its K columns chunk by chunk at their global positions (U == 1). */
static hp_status_t prepare_remote_kv(struct hp_cp *cp, const cp_core_t *C, hp_act_t *act, const ring_dims_t *d,
                                     float *kv, int s, int B) {
    for (int b = 0; b < B; b++)
        for (int j = 0; j < cp->nc; j++)
            HP_TRY(hp_attention_prepare_rows(C->attn, act, kv + ((size_t)b * cp->Tr + (size_t)j * cp->c) * 2 * d->kd,
                                             2 * d->kd, cp->c, 0, d->Hkv, chunk_id(cp, s, j) * cp->c, cp->rstd));
    return HP_OK;
}

/* act != NULL: the projection hook started the K/V collective (cp->pend); it is waited here. */
static hp_status_t ring_forward(struct hp_cp *cp, const hp_backend_t *be, const cp_core_t *C, hp_act_t *act,
                                const ring_dims_t *d, const float *xr, float *out, float *lse, int B) {
    const int rows = B * cp->Tr, R = cp->R, nxt = (cp->g + 1) % R, prv = (cp->g - 1 + R) % R;
    for (size_t i = 0; i < (size_t)rows * d->qd; i++) out[i] = 0.0f;
    for (size_t i = 0; i < (size_t)B * d->Hq * cp->Tr; i++) lse[i] = -INFINITY;
    float *own = cp->o.rotate == HP_CP_ROTATE_ALLGATHER ? cp->kv_own : cp->kv_buf;
    pack_kv(own, xr, d, rows);
    hp_work_t ag = NULL;
    if (cp->o.rotate == HP_CP_ROTATE_ALLGATHER && R > 1) {   // in flight during the local block
        if (act) {
            ag = cp->pend[0];
            cp->pend[0] = NULL;
        } else {
            HP_TRY(hp_all_gather(own, cp->kv_buf, d->kv, HP_F32, cp->ring_comm, &ag));
        }
    }
    for (int i = 0; i < R; i++) {
        const int s = (cp->g - i + R) % R;
        const float *kv;
        hp_work_t sw = NULL, rw = NULL;
        double t0 = omp_get_wtime();
        if (cp->o.rotate == HP_CP_ROTATE_ALLGATHER) {
            if (i == 1) {
                HP_TRY(wait_timed(cp, &ag));
                t0 = omp_get_wtime();
                for (int p = 0; act && p < R; p++)
                    if (p != cp->g) HP_TRY(prepare_remote_kv(cp, C, act, d, cp->kv_buf + (size_t)p * d->kv, p, B));
            }
            kv = i == 0 ? own : cp->kv_buf + (size_t)s * d->kv;
        } else {
            float *cur = cp->kv_buf + (size_t)(i % 2) * d->kv, *next = cp->kv_buf + (size_t)((i + 1) % 2) * d->kv;
            kv = cur;
            if (act && i == 0) {   // the first transfer (raw rows) was posted by the projection hook
                rw = cp->pend[0];
                sw = cp->pend[1];
                cp->pend[0] = cp->pend[1] = NULL;
            } else {
                if (act && i == 1) HP_TRY(prepare_remote_kv(cp, C, act, d, cur, s, B));
                if (i < R - 1) {   // the next block's transfer runs while this block computes
                    HP_TRY(hp_recv(next, d->kv, HP_F32, prv, cp->ring_comm, &rw));
                    HP_TRY(hp_send(cur, d->kv, HP_F32, nxt, cp->ring_comm, &sw));
                }
            }
        }
        ring_fwd_step(cp, be, d, xr, kv, s, out, lse, B);
        cp->comp_s += omp_get_wtime() - t0;
        HP_TRY(wait_timed(cp, &sw));
        HP_TRY(wait_timed(cp, &rw));
    }
    return HP_OK;
}

/* dx (B, Tr, ld) (=) from dout (B, Tr, qd). */
static hp_status_t ring_backward(struct hp_cp *cp, const hp_backend_t *be, const ring_dims_t *d, const float *xr,
                                 const float *out, const float *lse, const float *dout, float *dx, int B) {
    const int rows = B * cp->Tr, R = cp->R, nxt = (cp->g + 1) % R, prv = (cp->g - 1 + R) % R;
    memset(dx, 0, sizeof(float) * (size_t)rows * d->ld);
    float *own = cp->o.rotate == HP_CP_ROTATE_ALLGATHER ? cp->kv_own : cp->kv_buf;
    pack_kv(own, xr, d, rows);
    float *dkv_final = NULL;
    if (cp->o.rotate == HP_CP_ROTATE_ALLGATHER) {
        hp_work_t ag = NULL;
        float *dall = cp->dkv_buf;   // (R, B, Tr, 2 kd), then this participant's sum
        memset(dall, 0, sizeof(float) * R * d->kv);
        if (R > 1) HP_TRY(hp_all_gather(own, cp->kv_buf, d->kv, HP_F32, cp->ring_comm, &ag));
        for (int i = 0; i < R; i++) {
            const int s = (cp->g - i + R) % R;
            if (i == 1) HP_TRY(wait_timed(cp, &ag));
            double t0 = omp_get_wtime();
            ring_bwd_step(cp, be, d, xr, i == 0 ? own : cp->kv_buf + (size_t)s * d->kv, s, out, lse, dout, dx,
                          dall + (size_t)s * d->kv, B);
            cp->comp_s += omp_get_wtime() - t0;
        }
        dkv_final = dall + (size_t)R * d->kv;
        if (R > 1) {
            double t0 = omp_get_wtime();
            HP_TRY(hp_reduce_scatter(dall, dkv_final, d->kv, HP_F32, HP_SUM, cp->ring_comm, NULL));
            cp->wait_s += omp_get_wtime() - t0;
        } else {
            memcpy(dkv_final, dall, sizeof(float) * d->kv);
        }
    } else {
        /* dK/dV accumulators travel with the K/V: at step i this participant adds its part for
         * source s = g - i to the sum received from g - 1 and passes it on; after R steps every
         * sum has reached its owner. */
        float *contrib[2] = {cp->dkv_buf, cp->dkv_buf + d->kv}, *in = cp->dkv_buf + 2 * d->kv;
        hp_work_t in_w = NULL, out_w = NULL;
        for (int i = 0; i < R; i++) {
            const int s = (cp->g - i + R) % R;
            float *cur = cp->kv_buf + (size_t)(i % 2) * d->kv, *next = cp->kv_buf + (size_t)((i + 1) % 2) * d->kv;
            hp_work_t sw = NULL, rw = NULL;
            if (i < R - 1) {
                HP_TRY(hp_recv(next, d->kv, HP_F32, prv, cp->ring_comm, &rw));
                HP_TRY(hp_send(cur, d->kv, HP_F32, nxt, cp->ring_comm, &sw));
            }
            float *ct = contrib[i % 2];   // its last send (step i - 2) was waited in step i - 1
            double t0 = omp_get_wtime();
            memset(ct, 0, sizeof(float) * d->kv);
            ring_bwd_step(cp, be, d, xr, cur, s, out, lse, dout, dx, ct, B);
            cp->comp_s += omp_get_wtime() - t0;
            if (i > 0) {
                HP_TRY(wait_timed(cp, &in_w));
                for (size_t e = 0; e < d->kv; e++) ct[e] += in[e];
            }
            HP_TRY(wait_timed(cp, &out_w));
            if (R > 1) {
                HP_TRY(hp_recv(in, d->kv, HP_F32, prv, cp->ring_comm, &in_w));
                HP_TRY(hp_send(ct, d->kv, HP_F32, nxt, cp->ring_comm, &out_w));
            }
            HP_TRY(wait_timed(cp, &sw));
            HP_TRY(wait_timed(cp, &rw));
        }
        HP_TRY(wait_timed(cp, &out_w));
        if (R > 1) {
            HP_TRY(wait_timed(cp, &in_w));
            dkv_final = in;
        } else {
            dkv_final = contrib[0];
        }
    }
    for (int r = 0; r < rows; r++)   // dK | dV into their columns of dx
        memcpy(dx + (size_t)r * d->ld + d->qd, dkv_final + (size_t)r * 2 * d->kd, sizeof(float) * 2 * d->kd);
    return HP_OK;
}

/* ---- the core module --------------------------------------------------------------------- */

static size_t core_act_bytes(const hp_module_t *m, int B, int T) {
    const cp_core_t *C = m->impl;
    const size_t N = (size_t)B * T, hd = (size_t)C->cp->hd;
    const size_t qd = C->Hq * hd, qkvd = qd + 2 * C->Hkv * hd;
    size_t s = hp_arena_round(sizeof(cp_saved_t)) + hp_arena_round(sizeof(float) * N * C->Hq);   // lse
    if (C->cp->U > 1) s += hp_arena_round(sizeof(float) * N * qkvd) + hp_arena_round(sizeof(float) * N * qd);
    return s;
}

static hp_status_t check_call(const cp_core_t *C, const hp_act_t *act, int64_t width, const char *what) {
    if (act->kv)
        return hp_error(HP_ERR_UNSUPPORTED, "%s '%s': KV-cache decode under context parallelism is not "
                        "implemented; hint: generate with a model without CP", what, C->mod.name);
    if (act->T != C->cp->Tl || act->B > C->cp->max_B)
        return hp_error(HP_ERR_INVALID_ARG, "%s '%s': micro-batch (B=%d, T=%d), expected T = %d local rows "
                        "(seq_len %d / cp %d) and B <= %d; hint: shard the batch with hp_cp_shard_tokens", what,
                        C->mod.name, act->B, act->T, C->cp->Tl, C->cp->T, C->cp->W, C->cp->max_B);
    const int64_t want = (int64_t)(C->Hq + 2 * C->Hkv) * C->cp->hd;
    if (width != want)
        return hp_error(HP_ERR_INVALID_ARG, "%s '%s': [q | k | v] rows of width %lld, expected %lld (%d heads and "
                        "%d kv heads of %d, the local heads cp was created with); hint: pass hp_cp_create the heads "
                        "per tensor-parallel rank", what, C->mod.name, (long long)width, (long long)want, C->Hq,
                        C->Hkv, C->cp->hd);
    return HP_OK;
}

static hp_status_t core_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    cp_core_t *C = m->impl;
    struct hp_cp *cp = C->cp;
    HP_TRY(check_call(C, act, in->shape[in->ndim - 1], "cp attention forward"));
    const int B = act->B;
    const ring_dims_t d = ring_dims(C, B);
    double t0 = omp_get_wtime();
    cp_saved_t *s = hp_act_slot_new(act, m, sizeof(*s));
    s->B = B;
    s->x = in->data;
    s->lse = hp_act_alloc(act, sizeof(float) * (size_t)B * d.Hq * cp->Tr);
    const int async_on = cp->pend_core == C && cp->pend_B == B;   // the projection hook started it
    cp->pend_core = NULL;
    if (C->attn && !async_on && (cp->U > 1 || cp->R > 1))   // never a silent fall-back to the synchronous core
        return hp_error(HP_ERR_STATE, "cp attention '%s' (async): no K/V collective was started by the projection hook "
                        "of '%s' for this forward (the projection did not run through hp_module_forward, or another "
                        "core's collective was pending)", C->mod.name, C->attn->name);
    cp->n_async += async_on;
    if (cp->U > 1) {
        const segs_t S = qkv_segs(C);
        s->xr = hp_act_alloc(act, sizeof(float) * (size_t)B * cp->Tr * d.ld);
        s->out_r = hp_act_alloc(act, sizeof(float) * (size_t)B * cp->Tr * d.qd);
        if (async_on) {   // raw rows arrived: qk-norm and RoPE at each group rank's positions
            HP_TRY(wait_timed(cp, &cp->pend[0]));
            uly_seq2head_finish(cp, s->xr, &S, B);
            const int L = cp->Tl / n_segs(cp);
            for (int b = 0; b < B; b++)
                for (int v = 0; v < cp->U; v++)
                    for (int g = 0; g < n_segs(cp); g++)
                        HP_TRY(hp_attention_prepare_rows(C->attn, act, s->xr + ((size_t)b * cp->Tr + (size_t)v * cp->Tl +
                                                                                (size_t)g * L) * d.ld,
                                                         d.ld, L, d.Hq, d.Hkv,
                                                         global_pos(cp->T, cp->W, cp->o.balancer, cp->g * cp->U + v,
                                                                    g * L),
                                                         cp->rstd));
        } else {
            HP_TRY(uly_seq2head(cp, s->xr, s->x, C->Hq * cp->hd + 2 * C->Hkv * cp->hd, &S, B));
        }
    } else {
        s->xr = (float *)s->x;
        s->out_r = out->data;
    }
    HP_TRY(ring_forward(cp, act->be, C, async_on && cp->U == 1 ? act : NULL, &d, s->xr, s->out_r, s->lse, B));
    if (cp->U > 1) {
        const segs_t S = q_segs(C);
        HP_TRY(uly_head2seq(cp, out->data, C->Hq * cp->hd, s->out_r, &S, B));
    }
    if (act->prof) act->prof[HP_NN_OP_ATTENTION_FWD] += omp_get_wtime() - t0;
    return HP_OK;
}

static hp_status_t core_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    cp_core_t *C = m->impl;
    struct hp_cp *cp = C->cp;
    cp_saved_t *s = hp_act_slot(act, m);
    const int B = s->B;
    const ring_dims_t d = ring_dims(C, B);
    double t0 = omp_get_wtime();
    const float *dout_r = dout->data;
    float *dx = din->data;
    if (cp->U > 1) {
        const segs_t S = q_segs(C);
        HP_TRY(uly_seq2head(cp, cp->uly_dout, dout->data, C->Hq * cp->hd, &S, B));
        dout_r = cp->uly_dout;
        dx = cp->uly_dx;
    }
    HP_TRY(ring_backward(cp, act->be, &d, s->xr, s->out_r, s->lse, dout_r, dx, B));
    if (cp->U > 1) {
        const segs_t S = qkv_segs(C);
        HP_TRY(uly_head2seq(cp, din->data, C->Hq * cp->hd + 2 * C->Hkv * cp->hd, cp->uly_dx, &S, B));
    }
    if (act->prof) act->prof[HP_NN_OP_ATTENTION_BWD] += omp_get_wtime() - t0;
    return HP_OK;
}

static const hp_module_ops_t cp_core_ops = {
    "cp_attention", core_act_bytes, NULL, core_forward, core_backward_input, NULL, NULL, NULL,
};

/* AsyncContextParallel: the q|k|v projection's post-forward hook starts the collective on the
 * raw rows (before qk-norm and RoPE, which the core applies to what it receives). */
static hp_status_t async_launch(void *user, hp_module_t *m, hp_act_t *act) {
    (void)m;
    cp_core_t *C = user;
    struct hp_cp *cp = C->cp;
    if (act->kv || act->T != cp->Tl || act->B > cp->max_B) return HP_OK;   // the core names the error
    const float *x = hp_attention_projection_rows(C->attn, act);
    if (!x)
        return hp_error(HP_ERR_STATE, "cp attention '%s' (async): the projection's post-forward hook found no projection "
                        "rows of attention '%s' in this forward", C->mod.name, C->attn->name);
    for (int i = 0; i < 2; i++) HP_TRY(wait_timed(cp, &cp->pend[i]));   // one left by a failed forward
    cp->pend_core = NULL;
    const int B = act->B;
    const ring_dims_t d = ring_dims(C, B);
    if (cp->U > 1) {   // Ulysses / hybrid: the all-to-all of q, k and v
        const segs_t S = qkv_segs(C);
        HP_TRY(uly_seq2head_start(cp, x, C->Hq * cp->hd + 2 * C->Hkv * cp->hd, &S, B, &cp->pend[0]));
    } else if (cp->R > 1) {
        pack_kv(cp->kv_raw, x, &d, B * cp->Tl);   // d.ld is the projection's row width when U == 1
        if (cp->o.rotate == HP_CP_ROTATE_ALLGATHER) {
            HP_TRY(hp_all_gather(cp->kv_raw, cp->kv_buf, d.kv, HP_F32, cp->ring_comm, &cp->pend[0]));
        } else {   // the first ring transfer: into the second K/V buffer, as ring_forward's step 0
            const int R = cp->R;
            HP_TRY(hp_recv(cp->kv_buf + d.kv, d.kv, HP_F32, (cp->g - 1 + R) % R, cp->ring_comm, &cp->pend[0]));
            HP_TRY(hp_send(cp->kv_raw, d.kv, HP_F32, (cp->g + 1) % R, cp->ring_comm, &cp->pend[1]));
        }
    } else {
        return HP_OK;
    }
    cp->pend_core = C;
    cp->pend_B = B;
    return HP_OK;
}

hp_status_t hp_cp_core_new(hp_cp_t cp, const char *name, int n_heads, int n_kv_heads, hp_module_t **out) {
    *out = NULL;
    HP_TRY(check_heads(cp, n_heads, n_kv_heads, "hp_cp_core_new"));
    if (n_heads > cp->Hq_max || n_kv_heads > cp->Hkv_max)
        return hp_error(HP_ERR_INVALID_ARG, "hp_cp_core_new '%s': %d heads / %d kv heads, more than the %d / %d the "
                        "CP workspace was sized for (hp_cp_create)", name, n_heads, n_kv_heads, cp->Hq_max,
                        cp->Hkv_max);
    cp_core_t *C = hp_calloc(1, sizeof(*C));
    if (!C) return HP_ERR_OOM;
    hp_module_base_init(&C->mod, &cp_core_ops, name, NULL);
    C->mod.impl = C;
    C->cp = cp;
    C->Hq = n_heads;
    C->Hkv = n_kv_heads;
    C->next = cp->cores;
    cp->cores = C;
    *out = &C->mod;
    return HP_OK;
}

/* The pre-forward / pre-backward hook on an attention whose core is a CP core: its rows are
 * this rank's chunks, RoPE rotates them at their global positions. Async: the collective starts
 * after the attention's q|k|v projection, whatever module stands there now (a tensor-parallel
 * wrapper may have taken its place since hp_cp_apply): the post-forward hook follows it. */
static hp_status_t cp_attention_hook(void *user, hp_module_t *attn, hp_act_t *act) {
    cp_core_t *C = user;
    hp_cp_set_positions(C->cp, act);
    if (!C->attn) return HP_OK;
    hp_module_t *proj = hp_attention_wqkv(attn);
    if (proj != C->proj) {
        if (C->proj) hp_module_remove_hooks_of(C->proj, C);
        C->proj = NULL;
        HP_TRY(hp_module_add_hook(proj, HP_HOOK_POST_FORWARD, async_launch, C, NULL));
        C->proj = proj;
    }
    return HP_OK;
}

hp_status_t hp_cp_apply(hp_cp_t cp, hp_model_t model) {
    /* Each attention's "sdpa" core is replaced through the module protocol by a CP core of the
     * heads cp was created with (every attention of a model has the same local heads). */
    hp_module_t *mods[4096];
    const int n = hp_model_modules(model, mods, 4096);
    if (n > 4096) return hp_error(HP_ERR_UNSUPPORTED, "hp_cp_apply: model has %d modules, more than 4096", n);
    for (int i = 0; cp->o.async && i < n; i++)   // the async core re-applies RoPE through the GQA attention
        if (strcmp(mods[i]->ops->kind, "mla_attention") == 0)
            return hp_error(HP_ERR_UNSUPPORTED, "hp_cp_apply: parallelism.context_parallel_async with the MLA "
                            "attention of '%s' (model '%s') is not supported; hint: "
                            "parallelism.context_parallel_async=false (the synchronous ring / Ulysses cores run MLA)",
                            mods[i]->name, hp_model_config(model)->name);
    if (cp->T > hp_model_max_seq_len(model))
        return hp_error(HP_ERR_INVALID_ARG, "hp_cp_apply: sequence length %d runs past the model's %d positions (its "
                        "RoPE table); hint: create the model with max_seq_len >= %d", cp->T,
                        hp_model_max_seq_len(model), cp->T);
    int replaced = 0;
    for (int i = 0; i < n; i++) {
        hp_module_t *attn = mods[i];
        for (int k = 0; k < attn->n_children; k++) {
            hp_module_t *core = attn->children[k];
            if (strcmp(core->ops->kind, "sdpa") != 0) continue;
            if (cp->o.async && !hp_attention_wqkv(attn))
                return hp_error(HP_ERR_UNSUPPORTED, "hp_cp_apply: parallelism.context_parallel_async: core '%s' is not "
                                "the child of an attention module (its q|k|v projection starts the collective); hint: "
                                "parallelism.context_parallel_async=false", core->name);
            hp_module_t *c;
            HP_TRY(hp_cp_core_new(cp, core->name, cp->Hq_max, cp->Hkv_max, &c));
            cp_core_t *C = c->impl;
            C->attn = cp->o.async ? attn : NULL;
            HP_TRY(hp_module_add_hook(attn, HP_HOOK_PRE_FORWARD, cp_attention_hook, C, NULL));
            HP_TRY(hp_module_add_hook(attn, HP_HOOK_PRE_BACKWARD, cp_attention_hook, C, NULL));
            HP_TRY(hp_model_replace_module(model, attn, core, c));
            replaced++;
        }
    }
    if (replaced == 0)
        return hp_error(HP_ERR_INVALID_ARG, "hp_cp_apply: the model has no attention module whose core could be "
                        "replaced");
    // each rank is fed T/cp rows of every sequence: its own context needs no more
    return hp_model_set_context_limits(model, 0, cp->Tl);
}

hp_status_t hp_cp_core_lse(hp_module_t *core, hp_act_t *act, const float **lse, int *n_heads, int *head0, int *rows,
                           int *row_rank0) {
    if (!core || core->ops != &cp_core_ops)
        return hp_error(HP_ERR_INVALID_ARG, "hp_cp_core_lse: module '%s' is not a CP attention core",
                        core ? core->name : "(null)");
    cp_core_t *C = core->impl;
    cp_saved_t *s = hp_act_slot(act, core);
    *lse = s->lse;
    *n_heads = C->Hq / C->cp->U;
    *head0 = C->cp->u * *n_heads;
    *rows = C->cp->Tr;
    *row_rank0 = C->cp->g * C->cp->U;
    return HP_OK;
}

void hp_cp_timers(hp_cp_t cp, double *compute_s, double *wait_s, int reset) {
    if (compute_s) *compute_s = cp->comp_s;
    if (wait_s) *wait_s = cp->wait_s;
    if (reset) cp->comp_s = cp->wait_s = 0.0;
}

long hp_cp_async_count(hp_cp_t cp) { return cp->n_async; }
