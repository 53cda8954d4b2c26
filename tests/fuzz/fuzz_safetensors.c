/* libFuzzer target for the safetensors parser: any byte string is offered to
 * hp_safetensors_open_memory; an accepted file must then read every tensor (raw, and
 * converted into an f32 / i64 destination of its shape) without touching memory out of
 * bounds. Not a ctest program (no test_ prefix); docs/safetensors.md gives the clang
 * -fsanitize=fuzzer build line and the documented run. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hp_safetensors_t st = NULL;
    if (hp_safetensors_open_memory(data, size, "fuzz", &st) != HP_OK) {
        /* every failure carries a message */
        if (hp_last_error()[0] == '\0') abort();
        return 0;
    }
    for (int i = 0; i < hp_safetensors_metadata_count(st); i++) {
        const char *k, *v;
        hp_safetensors_metadata_at(st, i, &k, &v);
        if (!k || !v || hp_safetensors_metadata(st, k) == NULL) abort();
    }
    for (int i = 0; i < hp_safetensors_count(st); i++) {
        const hp_st_info_t *info = hp_safetensors_info(st, i);
        const hp_st_info_t *found = NULL;
        if (hp_safetensors_find(st, info->name, &found) != HP_OK || found != info) abort();
        size_t nbytes = (size_t)(info->end - info->begin);
        if (nbytes > size) abort();   /* validated offsets lie inside the input */
        void *buf = malloc(nbytes ? nbytes : 1);
        if (hp_safetensors_read_raw(st, info->name, buf, nbytes) != HP_OK) abort();
        free(buf);
        /* typed reads into a destination of the stored shape (skip huge element counts of
         * zero-byte tensors, which cannot be allocated) */
        int64_t numel = 1;
        for (int d = 0; d < info->ndim; d++) numel *= info->shape[d];
        if (numel > (1 << 20)) continue;
        hp_tensor_t t;
        hp_dtype_t dt = (info->dtype == HP_ST_F64 || info->dtype == HP_ST_F32 || info->dtype == HP_ST_BF16 ||
                         info->dtype == HP_ST_F16) ? HP_F32 : HP_I64;
        if (hp_tensor_malloc(&t, dt, info->ndim, info->shape) != HP_OK) continue;
        (void)hp_safetensors_read(st, info->name, &t, 1);
        hp_tensor_free_data(&t);
    }
    hp_safetensors_close(st);
    return 0;
}
