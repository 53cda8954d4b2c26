/* Test data: xorshift64 floats uniform in [-1, 1) from a state the test holds (each test keeps
 * its own seed, so its data stays what it was), and arrays of them. */
#ifndef HP_TEST_RAND_H
#define HP_TEST_RAND_H

#include <stdint.h>
#include <stdlib.h>

static inline float hp_test_frand(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (float)((*s >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* n values of hp_test_frand times scale, malloc'ed (the caller frees). */
static inline float *hp_test_rnd(uint64_t *s, size_t n, float scale) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; p && i < n; i++) p[i] = hp_test_frand(s) * scale;
    return p;
}

#endif
