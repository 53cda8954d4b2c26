/* hp_mesh: an N-d device mesh with named dims and one communicator per dim, following
 * PyTorch's DeviceMesh: layout arange(world).view(shape) (row-major); the group of dim d
 * holding rank x is the row of mesh.swapdims(-1, d).reshape(-1, size(d)) containing x. */
#ifndef HYPERPARALLEL_MESH_H
#define HYPERPARALLEL_MESH_H

#include <stdint.h>
#include "comm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_MESH_MAX_DIMS 8
#define HP_MESH_NAME_MAX 32

typedef struct hp_mesh *hp_mesh_t;

/* Mesh over the first prod(shape) ranks of `comm` (collective over comm: every rank of comm
 * calls it; ranks >= prod(shape) get a mesh they are not in). dim_names may be NULL (dims
 * are then unnamed) or hold ndim unique names. Ranks in the mesh are ranks of `comm` (the
 * mesh's base communicator; for the world communicator they are global ranks). Errors (same
 * on every rank, before any communication): ndim outside 1..HP_MESH_MAX_DIMS, a size < 1,
 * prod(shape) > size of comm, duplicate or empty names. */
hp_status_t hp_mesh_create(hp_comm_t comm, int ndim, const int64_t *shape,
                           const char *const *dim_names, hp_mesh_t *out);
/* As hp_mesh_create with an explicit name count (init_device_mesh's mesh_shape and
 * mesh_dim_names are two sequences): nnames must be 0 (unnamed) or ndim. */
hp_status_t hp_mesh_create_n(hp_comm_t comm, int ndim, const int64_t *shape, int nnames,
                             const char *const *dim_names, hp_mesh_t *out);
/* 1-D mesh over every rank of an existing communicator (DeviceMesh.from_group). */
hp_status_t hp_mesh_from_comm(hp_comm_t comm, const char *dim_name, hp_mesh_t *out);
/* Frees the mesh and the communicators it created (hp_mesh_create's per-dim ones, a
 * flatten's new one). Slices share their parent's communicators: destroy slices first or at
 * least stop using them once the parent is destroyed. NULL is ignored. */
void hp_mesh_destroy(hp_mesh_t mesh);

int hp_mesh_ndim(hp_mesh_t mesh);
/* Size of one dim, or the number of ranks in the mesh when dim < 0. */
int64_t hp_mesh_size(hp_mesh_t mesh, int dim);
const char *hp_mesh_dim_name(hp_mesh_t mesh, int dim);   /* NULL when unnamed */
/* Dim index of a name; HP_ERR_NOT_FOUND (message lists the valid names) otherwise. */
hp_status_t hp_mesh_dim_index(hp_mesh_t mesh, const char *name, int *dim);
/* Communicator of one mesh dim (NULL when this rank is not in the mesh). */
hp_comm_t hp_mesh_get_comm(hp_mesh_t mesh, int dim);
/* This rank's coordinate (ndim entries); returns 0 when the rank is not in the mesh. */
int hp_mesh_get_coordinate(hp_mesh_t mesh, int *coord);
/* Group-local rank on one dim (= coordinate[dim]); -1 when not in the mesh. */
int hp_mesh_get_local_rank(hp_mesh_t mesh, int dim);
/* Base-communicator rank at a coordinate; -1 if the coordinate is out of range. */
int hp_mesh_rank_at(hp_mesh_t mesh, const int *coord);
/* Whether this rank is in the mesh (get_coordinate() is not None). */
int hp_mesh_contains_self(hp_mesh_t mesh);
/* The base-communicator ranks of this rank's group on `dim`, in group-rank order
 * (size(dim) entries; PyTorch's row of mesh.swapdims(-1, dim).reshape(-1, size(dim))).
 * Returns the count, or 0 when this rank is not in the mesh. */
int hp_mesh_group_ranks(hp_mesh_t mesh, int dim, int *ranks);
/* The mesh's base communicator (not owned by the mesh). */
hp_comm_t hp_mesh_base_comm(hp_mesh_t mesh);
/* 1 when two meshes have the same shape, names and rank layout (DeviceMesh.__eq__). */
int hp_mesh_equal(hp_mesh_t a, hp_mesh_t b);
/* Sub-mesh of the named dims, in the given order, sharing the parent's communicators
 * (mesh["dp", "tp"]): this rank's slice, i.e. the other dims fixed at its coordinate.
 * No communication. Errors: unnamed mesh, unknown name (the message lists the valid ones),
 * a name given twice. */
hp_status_t hp_mesh_slice(hp_mesh_t mesh, int n, const char *const *names, hp_mesh_t *out);
/* One dim made of the named dims (mesh["dp","cp"]._flatten("dp_cp")), row-major over the
 * names in the given order. new_name NULL = the names joined by "_". Creates a new
 * communicator (owned by the result) by splitting the base communicator: collective over
 * every rank of the base communicator, including ranks outside this slice or mesh. */
hp_status_t hp_mesh_flatten(hp_mesh_t mesh, int n, const char *const *names,
                            const char *new_name, hp_mesh_t *out);
/* The dims of `a` followed by the dims of `b` as one mesh (DeviceMesh._concatenate, the SPMD
 * mesh of an FSDP-over-TP parameter: mesh["dp_shard"] + mesh["tp"]), sharing their
 * communicators. Both must be slices of one mesh (same base communicator and root shape)
 * over disjoint root dims, both named or both unnamed. No communication. */
hp_status_t hp_mesh_concat(hp_mesh_t a, hp_mesh_t b, hp_mesh_t *out);
/* Writes the mesh as text ("DeviceMesh((dp=2, tp=2), ranks [[0,1],[2,3]])"); returns buf
 * (truncated to n bytes). */
const char *hp_mesh_str(hp_mesh_t mesh, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
