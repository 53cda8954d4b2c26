/* libFuzzer target for the DCP metadata parser: any byte string is offered to
 * hp_dcp_metadata_parse; a rejected input must carry a message, an accepted one must give
 * entries whose chunks lie inside the global shape, with plain file names, findable by name.
 * Not a ctest program (no test_ prefix); docs/checkpoint.md gives the clang build line. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hp_dcp_metadata_t md = NULL;
    if (hp_dcp_metadata_parse((const char *)data, size, "fuzz", &md) != HP_OK) {
        if (hp_last_error()[0] == '\0') abort();
        return 0;
    }
    if (hp_dcp_metadata_world_size(md) < 1) abort();
    for (int i = 0; i < hp_dcp_metadata_count(md); i++) {
        const hp_dcp_entry_t *e = hp_dcp_metadata_entry(md, i);
        if (!e || hp_dcp_metadata_find(md, e->name) != e) abort();
        if (e->ndim < 0 || e->ndim > HP_MAX_DIMS) abort();
        for (int c = 0; c < e->n_chunks; c++) {
            const hp_dcp_chunk_t *ch = &e->chunks[c];
            if (!ch->file || !ch->key || strchr(ch->file, '/') || ch->file[0] == '.') abort();
            if (e->is_blob) continue;
            for (int d = 0; d < e->ndim; d++)
                if (ch->offsets[d] < 0 || ch->sizes[d] < 0 || ch->offsets[d] + ch->sizes[d] > e->shape[d]) abort();
        }
    }
    hp_dcp_metadata_free(md);
    return 0;
}
