/* Private helpers shared by the dtensor sources: placement checks, result and scratch
 * storage (heap, arena or caller buffer, see hp_dtensor_mem_t) and the box copy that every
 * pad / unpad / pack / unpack is made of. */
#ifndef HP_DTENSOR_IMPL_H
#define HP_DTENSOR_IMPL_H

#include "hyperparallel/dtensor.h"

/* Checks the count against the mesh ndim and normalises each placement into out[]. */
hp_status_t hp_dtensor_check_placements_(hp_placement_t *out, int tensor_ndim, hp_mesh_t mesh,
                                         int nplacements, const hp_placement_t *placements,
                                         const char *what);

/* Storage for one call: the result block comes first, then scratch; scratch is released
 * (heap) or rewound (arena) by hp_dmem_end. */
#define HP_DMEM_MAX_SCRATCH 32
typedef struct hp_dmem {
    const hp_dtensor_mem_t *mem;
    size_t mark;
    int marked;
    void *heap[HP_DMEM_MAX_SCRATCH];
    int nheap;
} hp_dmem_t;

void hp_dmem_begin(hp_dmem_t *d, const hp_dtensor_mem_t *mem);
/* Result storage of `bytes`; *owned gets the heap block (NULL otherwise). */
hp_status_t hp_dmem_result(hp_dmem_t *d, size_t bytes, void **data, void **owned);
/* Zeroed scratch of `bytes` (NULL with a status on failure). */
void *hp_dmem_scratch(hp_dmem_t *d, size_t bytes);
void hp_dmem_end(hp_dmem_t *d);

/* Copies a box of extent `box` from src (contiguous, shape sshape) at soff to dst
 * (contiguous, shape dshape) at doff; nd dims, es bytes per element. */
void hp_box_copy(void *dst, const int64_t *dshape, const int64_t *doff, const void *src,
                 const int64_t *sshape, const int64_t *soff, const int64_t *box, int nd, size_t es);

static inline int64_t hp_prod_(int n, const int64_t *s) {
    int64_t p = 1;
    for (int i = 0; i < n; i++) p *= s[i];
    return p;
}

/* Redistribute with the internal flag (allows targets that are Partial). */
hp_status_t hp_dtensor_redistribute_(hp_dtensor_t *out, const hp_dtensor_mem_t *mem,
                                     const hp_dtensor_t *in, int nplacements,
                                     const hp_placement_t *placements, int internal);

/* A result descriptor for (dtype, global shape, mesh, normalised placements) with its local
 * storage taken from dm (hp_dmem_result). */
hp_status_t hp_dtensor_make_result_(hp_dtensor_t *out, hp_dmem_t *dm, hp_dtype_t dt, int nd,
                                    const int64_t *gshape, hp_mesh_t mesh, const hp_placement_t *pl);

/* The end of a call that made res with hp_dtensor_make_result_: the scratch released (dm),
 * then on success *out = *res, else res's heap storage freed; returns st. */
hp_status_t hp_dtensor_finish_(hp_dmem_t *dm, hp_dtensor_t *res, hp_status_t st, hp_dtensor_t *out);

/* The first Partial among n placements, or -1: a tensor made from values (distribute, rand)
 * holds them, it cannot be a pending reduction. */
int hp_placements_first_partial_(const hp_placement_t *pl, int n);

#endif
