/* hp_dtensor: a tensor laid out over a device mesh by one placement per mesh dim
 * (Shard(d) / Replicate / Partial(op)), with torch.chunk shard math, distribute_tensor,
 * from_local, full_tensor and redistribute as PyTorch's torch.distributed.tensor. */
#ifndef HYPERPARALLEL_DTENSOR_H
#define HYPERPARALLEL_DTENSOR_H

#include <stdint.h>
#include "tensor.h"
#include "mesh.h"
#include "arena.h"
#include "rng.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hp_placement_kind {
    HP_REPLICATE = 0,
    HP_SHARD,
    HP_PARTIAL,
    HP_STRIDED_SHARD    /* _StridedShard(dim, split_factor): FSDP2 + TP layout */
} hp_placement_kind_t;

typedef struct hp_placement {
    hp_placement_kind_t kind;
    int dim;              /* Shard / StridedShard: tensor dim (normalised >= 0) */
    hp_redop_t reduce_op; /* Partial: HP_SUM, HP_AVG, HP_PROD, HP_MAX, HP_MIN */
    int split_factor;     /* StridedShard */
} hp_placement_t;

static inline hp_placement_t hp_shard(int dim) { hp_placement_t p = {HP_SHARD, dim, HP_SUM, 1}; return p; }
static inline hp_placement_t hp_replicate(void) { hp_placement_t p = {HP_REPLICATE, 0, HP_SUM, 1}; return p; }
static inline hp_placement_t hp_partial(hp_redop_t op) { hp_placement_t p = {HP_PARTIAL, 0, op, 1}; return p; }
static inline hp_placement_t hp_strided_shard(int dim, int split_factor) {
    hp_placement_t p = {HP_STRIDED_SHARD, dim, HP_SUM, split_factor}; return p;
}

/* A DTensor descriptor. `local` is this rank's piece; its shape is the local shape.
 * mesh == NULL means not distributed: mesh_ndim 0, global shape == local shape.
 * Storage: `local.data` is either borrowed (from_local, caller-provided output, arena) or
 * heap memory owned by the descriptor, recorded in `owned`; hp_dtensor_free releases it. */
typedef struct hp_dtensor {
    hp_tensor_t local;
    hp_mesh_t mesh;
    int mesh_ndim;
    hp_placement_t placements[HP_MESH_MAX_DIMS];
    int64_t global_shape[HP_MAX_DIMS];      /* local.ndim entries */
    void *owned;                            /* heap block to free, or NULL */
} hp_dtensor_t;

/* Where a function's result storage comes from (outputs-first: pass it right after `out`).
 *   mem == NULL or all fields zero: the result's local data is heap-allocated and owned by
 *     the result (out->owned); release it with hp_dtensor_free. Scratch is heap too.
 *   arena != NULL: the result and the scratch come from the arena (no malloc: the step-loop
 *     mode); scratch is rewound before returning, the result stays until the arena is reset.
 *   out_data != NULL: the result is written there (capacity out_bytes, at least
 *     hp_dtensor_local_nbytes of the result layout); scratch from `arena` or the heap.
 * Results never alias the input, except hp_dtensor_from_local (a view by definition). */
typedef struct hp_dtensor_mem {
    hp_arena_t *arena;
    void *out_data;
    size_t out_bytes;
} hp_dtensor_mem_t;

void hp_dtensor_free(hp_dtensor_t *t);

/* --- placements -------------------------------------------------------------------------- */
/* Exact equality (kind, dim, reduce op for Partial, split factor for StridedShard). Note:
 * PyTorch's _StridedShard == Shard compares only the dim; here they differ. */
int hp_placement_equal(hp_placement_t a, hp_placement_t b);
/* "S(0)", "R", "P(sum)", "_S(0, 2)" (PyTorch's str forms). */
const char *hp_placement_str(hp_placement_t p, char *buf, size_t n);
/* "[S(0), R]". */
const char *hp_placements_str(int n, const hp_placement_t *p, char *buf, size_t size);
/* Normalises a negative Shard dim to dim + tensor_ndim and checks the range and the
 * Partial op; the error names the placement and the tensor rank. */
hp_status_t hp_placement_normalize(hp_placement_t *out, hp_placement_t in, int tensor_ndim);

/* --- layout math (pure, no communication) ----------------------------------------------- */
/* Shard.local_shard_size_and_offset: torch.chunk of `size` into k, piece r. Uneven: chunk
 * c = ceil(size/k), piece r = [r*c, min(size,(r+1)*c)); trailing pieces may be empty, their
 * offset is clamped to size. */
void hp_shard_size_and_offset(int64_t size, int64_t k, int64_t r, int64_t *local_size,
                              int64_t *offset);
/* compute_local_shape_and_global_offset over an explicit mesh shape and coordinate (so it
 * can be evaluated for any rank): walks mesh dims 0..mesh_ndim-1; Shard(d) on mesh dim i
 * replaces local[d] by the chunk of the current local[d] at coord[i] and adds the offset;
 * an empty piece's offset is the global size of its dim (PyTorch 2.15). StridedShard: local shape exact; the offset is the first global index owned (the piece
 * is not one box then; use hp_layout_dim_indices). Placements must be normalised. */
void hp_layout_local_shape_and_offset(int ndim, const int64_t *global_shape, int mesh_ndim,
                                      const int64_t *mesh_shape, const int *coord,
                                      const hp_placement_t *placements, int64_t *local_shape,
                                      int64_t *global_offset);
/* The global indices (ascending order of local position) that the rank at `coord` holds on
 * tensor dim `dim` of size n; writes them to idx (capacity n) and returns how many. Handles
 * Shard, StridedShard (split into split_factor pieces, each piece into k, shard i =
 * concat of piece j's chunk i) and nesting. */
int64_t hp_layout_dim_indices(int64_t n, int dim, int mesh_ndim, const int64_t *mesh_shape,
                              const int *coord, const hp_placement_t *placements, int64_t *idx);
/* 1 when the layout keeps every rank's piece one box (no StridedShard with a split factor
 * > 1 on a mesh dim of size > 1). */
int hp_layout_is_box(int mesh_ndim, const int64_t *mesh_shape, const hp_placement_t *placements);

/* The same for this rank of a mesh; a rank outside the mesh gets an empty local shape (all
 * zeros) and offset zeros. Checks placements (count == mesh ndim, dims in range). */
hp_status_t hp_dtensor_compute_local_shape_and_offset(int64_t *local_shape, int64_t *global_offset,
                                                      int ndim, const int64_t *global_shape,
                                                      hp_mesh_t mesh, int nplacements,
                                                      const hp_placement_t *placements);
int64_t hp_dtensor_local_numel(const hp_dtensor_t *t);
/* Global offset of this rank's piece (box layouts); zeros for a plain tensor (no mesh) and on
 * a rank outside the mesh. A descriptor whose placements do not fit its mesh or dims is
 * HP_ERR_INVALID_ARG with the reason. */
hp_status_t hp_dtensor_global_offset(const hp_dtensor_t *t, int64_t *offset);

/* --- the redistribute planner ---------------------------------------------------------- */
typedef struct hp_transform {
    int mesh_dim;
    hp_placement_t src, dst;
    int64_t logical_shape[HP_MAX_DIMS];   /* tensor shape seen at this mesh dim */
} hp_transform_t;
/* PyTorch's greedy _gen_transform_infos for this rank (coord = its mesh coordinate). Writes
 * up to max_steps steps; *nsteps = the number. 1-D mesh: one step, none when src == dst. */
hp_status_t hp_redistribute_plan(hp_transform_t *steps, int max_steps, int *nsteps, int ndim,
                                 const int64_t *global_shape, int mesh_ndim,
                                 const int64_t *mesh_shape, const int *coord,
                                 const hp_placement_t *src, const hp_placement_t *dst);

/* --- construction ---------------------------------------------------------------------- */
/* distribute_tensor: `full` has the global shape on every rank; its data is read only on
 * the source rank (group rank src_data_rank on every mesh dim), or on every rank when
 * src_data_rank = -1 (PyTorch's None: local split, no communication). Per mesh dim: Shard
 * scatters padded torch.chunk pieces, Replicate broadcasts (also on mesh dims of size 1,
 * as PyTorch). Errors: placements count != mesh ndim, Partial placements, dims out of range,
 * src_data_rank out of range. Ranks not in the mesh get an empty local tensor, no comm. */
hp_status_t hp_dtensor_distribute(hp_dtensor_t *out, const hp_dtensor_mem_t *mem,
                                  const hp_tensor_t *full, hp_mesh_t mesh, int nplacements,
                                  const hp_placement_t *placements, int src_data_rank);
/* DTensor.from_local: no communication, no copy (out->local views `local`, which must stay
 * alive). global_shape NULL: inferred assuming even sharding (local * mesh size on sharded
 * dims); given: checked against the local shape this rank should hold. */
hp_status_t hp_dtensor_from_local(hp_dtensor_t *out, const hp_tensor_t *local, hp_mesh_t mesh,
                                  int nplacements, const hp_placement_t *placements,
                                  const int64_t *global_shape);
/* Factories (torch.distributed.tensor.zeros/ones/full/rand/randn): allocate and fill only
 * this rank's piece of a global_shape tensor; no communication. hp_dtensor_full sets every
 * local element to `value` (so with a Partial(sum) placement the global value is value times
 * the mesh dim size, as in PyTorch). hp_dtensor_rand draws from the counter-based RNG at the
 * piece's global indices: the result equals the slice of the same tensor drawn whole on one
 * rank, for every layout (initialisation does not depend on the layout; replicas hold identical
 * values). Partial
 * placements are refused by hp_dtensor_rand. */
hp_status_t hp_dtensor_full(hp_dtensor_t *out, const hp_dtensor_mem_t *mem, hp_dtype_t dtype,
                            int ndim, const int64_t *global_shape, hp_mesh_t mesh, int nplacements,
                            const hp_placement_t *placements, double value);
hp_status_t hp_dtensor_rand(hp_dtensor_t *out, const hp_dtensor_mem_t *mem, hp_dtype_t dtype,
                            int ndim, const int64_t *global_shape, hp_mesh_t mesh, int nplacements,
                            const hp_placement_t *placements, hp_rng_key_t key,
                            const hp_rng_spec_t *spec);
/* to_local: the local piece (a view). */
static inline hp_tensor_t hp_dtensor_to_local(const hp_dtensor_t *t) { return t->local; }
/* full_tensor: redistribute to all-Replicate and return the global tensor in `out`. Storage
 * as hp_dtensor_mem_t says; with heap storage *out_owned receives the block to free() (it is
 * set to NULL otherwise; out_owned may be NULL only when mem gives an arena or out_data). */
hp_status_t hp_dtensor_full_tensor(hp_tensor_t *out, void **out_owned, const hp_dtensor_mem_t *mem,
                                   const hp_dtensor_t *in);
/* DTensor.redistribute (public): placements count must equal the mesh ndim; a target
 * Partial that differs from the source placement on its mesh dim fails with "Can not
 * redistribute from X to Y". Same placements: a copy, no comm. */
hp_status_t hp_dtensor_redistribute(hp_dtensor_t *out, const hp_dtensor_mem_t *mem,
                                    const hp_dtensor_t *in, int nplacements,
                                    const hp_placement_t *placements);
/* Scratch bytes a redistribute of `in` to `placements` takes from an arena on this rank,
 * beyond hp_arena_round(result bytes) (no allocation in the step loop: arenas are sized before
 * it). Exact:
 * an arena-mode redistribute peaks at result + this many bytes. An empty result (an empty
 * piece, a rank outside the mesh) takes 0 arena bytes; its data then points at a static
 * placeholder, so an arena sized this way suffices on every rank. */
hp_status_t hp_dtensor_redistribute_scratch(size_t *bytes, const hp_dtensor_t *in, int nplacements,
                                            const hp_placement_t *placements);
/* Internal Redistribute.apply: also allows X -> Partial (Replicate -> Partial(sum) divides
 * by the mesh dim size, avg/max/min keep the value; Shard -> Partial is unsupported). */
hp_status_t hp_dtensor_redistribute_internal(hp_dtensor_t *out, const hp_dtensor_mem_t *mem,
                                             const hp_dtensor_t *in, int nplacements,
                                             const hp_placement_t *placements);

/* --- ops with sharding rules (f32) ----------------------------------------------------- */
/* Each op picks output placements per mesh dim from its rule, redistributes inputs whose
 * placements do not fit (counted like any redistribute), then runs the local kernel.
 * add/mul: same shapes; equal placements stay (add keeps Partial(sum/avg) + same; mul keeps
 * Partial(sum) * Replicate); Shard + Replicate -> Shard (the replicated side is chunked
 * locally); anything else is replicated first. */
hp_status_t hp_dtensor_add(hp_dtensor_t *out, const hp_dtensor_mem_t *mem, const hp_dtensor_t *a,
                           const hp_dtensor_t *b);
hp_status_t hp_dtensor_mul(hp_dtensor_t *out, const hp_dtensor_mem_t *mem, const hp_dtensor_t *a,
                           const hp_dtensor_t *b);
/* (M, K) @ (K, N). Per mesh dim: (S0, R) -> S0; (R, S1) -> S1; (S1, S0) -> Partial(sum);
 * (R, R) -> R; (P(sum), R) and (R, P(sum)) -> P(sum); anything else replicates both. */
hp_status_t hp_dtensor_matmul(hp_dtensor_t *out, const hp_dtensor_mem_t *mem, const hp_dtensor_t *a,
                              const hp_dtensor_t *b);
/* Sum over tensor dim `dim` (removed from the shape; negative counts from the end). Per mesh
 * dim: Shard(dim) -> Partial(sum); Shard(e) -> Shard(e - (e > dim)); R -> R; P(sum) -> P(sum);
 * other Partials are replicated first. */
hp_status_t hp_dtensor_sum(hp_dtensor_t *out, const hp_dtensor_mem_t *mem, const hp_dtensor_t *in,
                           int dim);

#ifdef __cplusplus
}
#endif
#endif
