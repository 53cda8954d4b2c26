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

/* Mesh over the first prod(shape) ranks of `comm` (collective over comm). dim_names may be
 * NULL (dims are then unnamed) or hold ndim unique names. */
hp_status_t hp_mesh_create(hp_comm_t comm, int ndim, const int64_t *shape,
                           const char *const *dim_names, hp_mesh_t *out);
/* 1-D mesh over every rank of an existing communicator (DeviceMesh.from_group). */
hp_status_t hp_mesh_from_comm(hp_comm_t comm, const char *dim_name, hp_mesh_t *out);
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
/* Global (world) rank at a coordinate. */
int hp_mesh_rank_at(hp_mesh_t mesh, const int *coord);
/* Sub-mesh of the named dims, in the given order, sharing the parent's communicators
 * (mesh["dp", "tp"]). */
hp_status_t hp_mesh_slice(hp_mesh_t mesh, int n, const char *const *names, hp_mesh_t *out);
/* One dim made of the named dims (mesh["dp","cp"]._flatten("dp_cp")). */
hp_status_t hp_mesh_flatten(hp_mesh_t mesh, int n, const char *const *names,
                            const char *new_name, hp_mesh_t *out);
/* Writes the mesh as text ("DeviceMesh((dp=2, tp=2), ranks [[0,1],[2,3]])"). */
const char *hp_mesh_str(hp_mesh_t mesh, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
