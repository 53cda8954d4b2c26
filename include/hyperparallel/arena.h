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
/* Bytes that a sequence of allocations of the given sizes will take (for sizing tables). */
size_t hp_arena_round(size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
