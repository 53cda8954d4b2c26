/* Bump arenas: one per lifetime (parameters, gradients, optimizer state, activations,
 * workspace). Sizes are computed first, then the arena is created once; hp_arena_alloc never
 * calls malloc, so the step loop does not allocate. */
#ifndef HYPERPARALLEL_ARENA_H
#define HYPERPARALLEL_ARENA_H

#include <stddef.h>
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_arena {
    char *base;        /* 64-byte aligned */
    size_t capacity;   /* bytes */
    size_t used;       /* bytes */
    size_t peak;       /* high-water mark of used */
    const char *name;  /* for error messages ("activations") */
} hp_arena_t;

hp_status_t hp_arena_init(hp_arena_t *a, const char *name, size_t capacity);
void hp_arena_free(hp_arena_t *a);
/* Returns 64-byte aligned, zero-filled memory or NULL (with hp_last_error set) when full. */
void *hp_arena_alloc(hp_arena_t *a, size_t bytes);
/* Rewind to a mark taken with hp_arena_mark (frees everything allocated after it). */
size_t hp_arena_mark(const hp_arena_t *a);
void hp_arena_reset_to(hp_arena_t *a, size_t mark);
void hp_arena_reset(hp_arena_t *a);
/* Bytes that an allocation of `bytes` takes in an arena (64-byte rounding), and that n
 * allocations of sizes[i] take: the capacity of an arena sized from a table first. */
size_t hp_arena_round(size_t bytes);
size_t hp_arena_bytes(int n, const size_t *sizes);
/* One arena for the n tables of one lifetime, sized from the table first: table i has bytes[i]
 * (64-byte aligned, zeroed) and its address goes to the pointer at dst[i] (the address of a
 * pointer of any object type: &m->params). hp_arena_free releases them all. */
hp_status_t hp_arena_init_tables(hp_arena_t *a, const char *name, int n, const size_t *bytes, void *const *dst);

#ifdef __cplusplus
}
#endif
#endif
