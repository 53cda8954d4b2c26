/* Bump arenas: one allocation at creation, then pointer bumps; no malloc afterwards. */
#include "hyperparallel/arena.h"

#include <string.h>

size_t hp_arena_round(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

size_t hp_arena_bytes(int n, const size_t *sizes) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += hp_arena_round(sizes[i]);
    return total;
}

hp_status_t hp_arena_init(hp_arena_t *a, const char *name, size_t capacity) {
    memset(a, 0, sizeof *a);
    a->name = name ? name : "arena";
    capacity = hp_arena_round(capacity);
    if (capacity) {
        a->base = hp_aligned_alloc(capacity);
        if (!a->base)
            return hp_error(HP_ERR_OOM, "arena '%s': cannot reserve %zu bytes; reduce the model, batch or sequence size",
                            a->name, capacity);
        memset(a->base, 0, capacity);
    }
    a->capacity = capacity;
    return HP_OK;
}

hp_status_t hp_arena_init_tables(hp_arena_t *a, const char *name, int n, const size_t *bytes, void *const *dst) {
    HP_TRY(hp_arena_init(a, name, hp_arena_bytes(n, bytes)));
    for (int i = 0; i < n; i++) {
        void *p = hp_arena_alloc(a, bytes[i]);   // cannot fail: the arena is their sum
        memcpy(dst[i], &p, sizeof p);             // dst[i] is a T **; object pointers share one representation
    }
    return HP_OK;
}

void hp_arena_free(hp_arena_t *a) {
    hp_free_aligned(a->base);
    a->base = NULL;
    a->capacity = a->used = a->peak = 0;
}

void *hp_arena_alloc(hp_arena_t *a, size_t bytes) {
    size_t need = hp_arena_round(bytes);
    if (need > a->capacity - a->used) {
        hp_error(HP_ERR_OOM, "arena '%s' exhausted: %zu bytes requested, %zu of %zu used (sizing table too small)",
                 a->name, bytes, a->used, a->capacity);
        return NULL;
    }
    char *p = a->base + a->used;
    a->used += need;
    if (a->used > a->peak) a->peak = a->used;
    memset(p, 0, need);
    return p;
}

size_t hp_arena_mark(const hp_arena_t *a) { return a->used; }
void hp_arena_reset_to(hp_arena_t *a, size_t mark) {
    if (mark <= a->used) a->used = mark;
}
void hp_arena_reset(hp_arena_t *a) { a->used = 0; }
