/* Context parallel (torch.distributed.tensor.experimental.context_parallel, HyperParallel's
 * ContextParallel(ulysses_degree)): sequence sharding with the head-tail load balancer and its
 * restore, and an attention core that replaces the model's causal SDPA core ("sdpa") with
 * ring attention over the cp dim (rotate method allgather or alltoall, log-sum-exp merge in
 * f32), Ulysses (all-to-all sequence <-> heads) or the hybrid cp = ulysses x ring. The
 * parameters are not sharded: only activations are (each rank holds T/cp rows of every
 * sequence). See docs/cp.md. */
#ifndef HYPERPARALLEL_CP_H
#define HYPERPARALLEL_CP_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"
#include "comm.h"
#include "nn.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hp_cp_rotate {
    HP_CP_ROTATE_ALLGATHER = 0,   /* K/V all-gathered once; backward reduce-scatters dK/dV */
    HP_CP_ROTATE_ALLTOALL = 1     /* K/V passed round the ring point-to-point, next block in flight */
} hp_cp_rotate_t;

typedef enum hp_cp_balancer {
    HP_CP_BALANCE_NONE = 0,       /* rank r holds rows [r T/cp, (r+1) T/cp) */
    HP_CP_BALANCE_HEADTAIL = 1    /* 2 cp chunks; rank r holds chunk r then chunk 2 cp - 1 - r */
} hp_cp_balancer_t;

/* "allgather" | "alltoall", "headtail" | "none"; `key` names the input in the error. */
hp_status_t hp_cp_rotate_parse(const char *s, const char *key, hp_cp_rotate_t *out);
hp_status_t hp_cp_balancer_parse(const char *s, const char *key, hp_cp_balancer_t *out);

/* ---- sequence sharding (pure index maths; no communication) ------------------------------ */
/* Rearrange indices (T): rank r's local row t is global position idx[r * T/cp + t]
 * (PyTorch's _HeadTailLoadBalancer: T=8, cp=2 -> 0 1 6 7 | 2 3 4 5). Named errors when T is
 * not divisible by cp (none) or 2 cp (headtail). */
hp_status_t hp_cp_shard_indices(int T, int cp, hp_cp_balancer_t lb, int32_t *idx);
/* The per-document variant (_PerDocumentHeadTailLoadBalancer): documents of doc_lens (each
 * divisible by 2 cp, summing to T) balanced one by one, laid out rank-major. */
hp_status_t hp_cp_shard_indices_docs(const int *doc_lens, int n_docs, int cp, int32_t *idx);
/* restore (T) = argsort(idx): global position p is row restore[p] of the rank-major layout. */
void hp_cp_restore_indices(const int32_t *idx, int T, int32_t *restore);
/* local (B, T/cp, row) = this rank's rows of global (B, T, row), row_bytes each. */
hp_status_t hp_cp_shard_rows(void *local, const void *global, size_t row_bytes, int B, int T, int cp, int rank,
                             hp_cp_balancer_t lb);
/* global (B, T, row) from every rank's local rows gathered rank-major (cp, B, T/cp, row). */
hp_status_t hp_cp_unshard_rows(void *global, const void *gathered, size_t row_bytes, int B, int T, int cp,
                               hp_cp_balancer_t lb);

/* ---- context-parallel attention --------------------------------------------------------- */
typedef struct hp_cp_options {
    hp_cp_rotate_t rotate;
    hp_cp_balancer_t balancer;
    int ulysses_degree;   /* 1: ring only; cp: Ulysses only; else hybrid (ring degree cp / ulysses) */
    /* AsyncContextParallel: hp_cp_apply hooks each attention's q|k|v projection (post-forward;
     * the module in the projection's place at each forward) to start the collective on its raw
     * rows there, and the core waits for it: Ulysses'
     * all-to-all of q, k, v (hybrid: only that; the ring stays synchronous, as HyperParallel),
     * else allgather's K/V all-gather or alltoall's first ring transfer. The core applies qk-norm
     * and RoPE to the received rows itself (hp_attention_prepare_rows), so results are bitwise
     * those of the synchronous core. A core called without its attention (hp_cp_core_new) runs
     * synchronously. */
    int async;
} hp_cp_options_t;
hp_cp_options_t hp_cp_options_default(void);   /* allgather, headtail, ulysses 1, synchronous */

typedef struct hp_cp *hp_cp_t;
/* cp_comm: the cp mesh dim (its size is the degree; rank w = ring index * ulysses + ulysses
 * index). T: the global sequence length; n_heads / n_kv_heads: the attention's local heads
 * (after tensor parallelism); max_B: the micro-batch size. Named errors for T not divisible
 * by cp (2 cp under headtail), ulysses_degree not dividing cp, heads or kv heads. Allocates
 * the communication workspace (hp_cp_workspace_bytes) once. */
hp_status_t hp_cp_create(hp_comm_t cp_comm, const hp_cp_options_t *opt, int max_B, int T, int n_heads,
                         int n_kv_heads, int head_dim, hp_cp_t *out);
void hp_cp_destroy(hp_cp_t cp);
int hp_cp_degree(hp_cp_t cp);
int hp_cp_rank(hp_cp_t cp);
int hp_cp_local_seq_len(hp_cp_t cp);   /* T / cp */
size_t hp_cp_workspace_bytes(hp_cp_t cp);
/* A new core module (owned by cp) for an attention with these local heads. */
hp_status_t hp_cp_core_new(hp_cp_t cp, const char *name, int n_heads, int n_kv_heads, hp_module_t **out);
/* Replaces every attention's core ("sdpa") by a CP core of the heads cp was created with,
 * through the module protocol (hp_model_replace_module of the attention's core child; a
 * pre-forward and a pre-backward hook on each attention put its rows at this rank's global
 * positions, hp_cp_set_positions), and sizes the model's own context for T/cp rows
 * (hp_model_set_context_limits). Feed hp_model_forward the rank's hp_cp_shard_tokens. Tensor
 * parallel may be applied before or after (the async core finds the attention's q|k|v
 * projection, or the wrapper that took its place, at each forward). cp must outlive the
 * model's last use. */
hp_status_t hp_cp_apply(hp_cp_t cp, hp_model_t model);
/* Points act's RoPE positions at this rank's global positions (pos0 / pos_segs, nn.h). */
void hp_cp_set_positions(hp_cp_t cp, hp_act_t *act);
/* This rank's tokens (B, T/cp) of a global batch (B, T) (hp_cp_shard_rows on int32). */
hp_status_t hp_cp_shard_tokens(hp_cp_t cp, int32_t *local, const int32_t *global, int B);
/* The lse a CP core saved in its last forward in act: (B, n_heads, rows), heads from head0
 * of the attention's local heads, rows = the local rows of cp ranks row_rank0,
 * row_rank0 + 1, ... (rows / (T/cp) of them) in order (Ulysses gathers its group's rows). */
hp_status_t hp_cp_core_lse(hp_module_t *core, hp_act_t *act, const float **lse, int *n_heads, int *head0, int *rows,
                           int *row_rank0);
/* Seconds this rank spent in ring block compute and blocked waiting for K/V (or dK/dV)
 * transfers since the last reset (the bench's overlap measure). */
void hp_cp_timers(hp_cp_t cp, double *compute_s, double *wait_s, int reset);
/* Asynchronous variant: how many collectives projection hooks started and cores waited for
 * since hp_cp_create (one per attention forward; 0 when opt.async is off). */
long hp_cp_async_count(hp_cp_t cp);

#ifdef __cplusplus
}
#endif
#endif
