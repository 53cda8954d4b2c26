/* safetensors reader and writer (https://github.com/huggingface/safetensors): an 8-byte
 * little-endian header length N, N bytes of JSON describing every tensor (dtype, shape,
 * data_offsets relative to the data section) plus an optional "__metadata__" string map,
 * then the raw little-endian data. The parser treats the file as hostile: every length,
 * offset and shape is checked before use and a bad file gives HP_ERR_FORMAT with a message
 * naming the file, the tensor and what was expected; it never crashes (see
 * tests/fuzz/fuzz_safetensors.c and docs/safetensors.md). */
#ifndef HYPERPARALLEL_SAFETENSORS_H
#define HYPERPARALLEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every dtype of the format that has a whole number of bytes per element. The sub-byte
 * float types (F4, F6_E2M3, F6_E3M2) are recognised by name and rejected with
 * HP_ERR_UNSUPPORTED. */
typedef enum hp_st_dtype {
    HP_ST_BOOL = 0,
    HP_ST_U8,
    HP_ST_I8,
    HP_ST_F8_E5M2,
    HP_ST_F8_E4M3,
    HP_ST_F8_E8M0,
    HP_ST_I16,
    HP_ST_U16,
    HP_ST_F16,
    HP_ST_BF16,
    HP_ST_I32,
    HP_ST_U32,
    HP_ST_F32,
    HP_ST_F64,
    HP_ST_I64,
    HP_ST_U64,
    HP_ST_C64,
    HP_ST_DTYPE_COUNT,
    HP_ST_AUTO = -1          /* writer: store in the source tensor's own dtype */
} hp_st_dtype_t;

const char *hp_st_dtype_name(hp_st_dtype_t dt);      /* "F32", ...; "?" when out of range */
size_t hp_st_dtype_size(hp_st_dtype_t dt);           /* bytes per element; 0 when out of range */
/* Name -> dtype; HP_ERR_FORMAT for unknown names, HP_ERR_UNSUPPORTED for F4/F6_*. */
hp_status_t hp_st_dtype_from_name(const char *name, hp_st_dtype_t *out);
/* The safetensors dtype that stores an hp dtype exactly (HP_F32 -> HP_ST_F32, HP_U8 -> U8). */
hp_st_dtype_t hp_st_dtype_from_hp(hp_dtype_t dt);

/* Limits of the reader (as the reference implementation: header at most 100 MB). */
#define HP_ST_MAX_HEADER_BYTES (100u * 1024u * 1024u)
#define HP_ST_MAX_NAME 512

typedef struct hp_st_info {
    const char *name;            /* owned by the file handle */
    hp_st_dtype_t dtype;
    int ndim;                    /* 0..HP_MAX_DIMS */
    int64_t shape[HP_MAX_DIMS];
    uint64_t begin, end;         /* byte offsets into the data section, end - begin = nbytes */
} hp_st_info_t;

typedef struct hp_safetensors *hp_safetensors_t;   /* an open, validated file */

/* Opens and validates a file: reads only the header; tensor data is read on request. */
hp_status_t hp_safetensors_open(const char *path, hp_safetensors_t *out);
/* Validates a whole file image held in memory (copied; `what` names it in messages).
 * This is the entry point of the fuzz target. */
hp_status_t hp_safetensors_open_memory(const void *bytes, size_t len, const char *what,
                                       hp_safetensors_t *out);
void hp_safetensors_close(hp_safetensors_t st);

/* Tensors in data-offset order. */
int hp_safetensors_count(hp_safetensors_t st);
const hp_st_info_t *hp_safetensors_info(hp_safetensors_t st, int i);
/* HP_ERR_NOT_FOUND (with the nearest names as a hint) when absent. */
hp_status_t hp_safetensors_find(hp_safetensors_t st, const char *name,
                                const hp_st_info_t **info);
/* "__metadata__": number of entries, i-th key/value, value by key (NULL when absent). */
int hp_safetensors_metadata_count(hp_safetensors_t st);
void hp_safetensors_metadata_at(hp_safetensors_t st, int i, const char **key,
                                const char **value);
const char *hp_safetensors_metadata(hp_safetensors_t st, const char *key);

/* Reads tensor `name` into `dst` (any strides). The shapes must be equal. When the dtypes
 * differ the read fails unless `convert` is nonzero; then float -> float conversions
 * (F64/F32/BF16/F16 into f32/bf16/f16, rounding to nearest even) and integer -> integer
 * conversions that keep every value exact are done; anything else is HP_ERR_INVALID_ARG. */
hp_status_t hp_safetensors_read(hp_safetensors_t st, const char *name, hp_tensor_t *dst,
                                int convert);
/* Copies the raw bytes of a tensor (nbytes must equal end - begin). */
hp_status_t hp_safetensors_read_raw(hp_safetensors_t st, const char *name, void *buf,
                                    size_t nbytes);
/* Copies bytes [offset, offset + nbytes) of a tensor's stored data (one pread; a range outside
 * the tensor is HP_ERR_INVALID_ARG): the rows of a shard, for sharded loading. */
hp_status_t hp_safetensors_read_bytes(hp_safetensors_t st, const char *name, uint64_t offset, void *buf,
                                      size_t nbytes);

/* One tensor to write: either an hp tensor (any strides; f32 may be stored as F32, BF16 or
 * F16 by setting `dtype`, otherwise HP_ST_AUTO) or, when tensor == NULL, `raw` contiguous
 * bytes of `dtype` with `ndim`/`shape`. */
typedef struct hp_st_entry {
    const char *name;
    const hp_tensor_t *tensor;
    hp_st_dtype_t dtype;
    const void *raw;
    int ndim;
    const int64_t *shape;
} hp_st_entry_t;

/* Writes the entries (names unique, not "__metadata__") and `n_meta` key/value string pairs
 * (meta[2k] = key, meta[2k+1] = value; may be NULL when n_meta == 0) to `path`. The file is
 * written to a temporary file in the same directory, flushed and renamed over `path`, so a
 * crash never leaves a half-written file under the final name. Data is stored in entry
 * order; the header is padded with spaces to a multiple of 8 bytes. */
hp_status_t hp_safetensors_write(const char *path, const hp_st_entry_t *entries, int n,
                                 const char *const *meta, int n_meta);
/* As hp_safetensors_write; also stores in xxh3[i] the XXH3-64 checksum of entry i's stored
 * bytes (after any dtype conversion), as the checkpoint metadata records it. */
hp_status_t hp_safetensors_write_hashed(const char *path, const hp_st_entry_t *entries, int n,
                                        const char *const *meta, int n_meta, uint64_t *xxh3);
/* Streaming: as hp_safetensors_write_hashed (xxh3 may be NULL), but for each entry whose
 * tensor and raw are both NULL (dtype, ndim and shape give the stored layout) the writer calls
 * fill(ctx, i, &t) just before it writes entry i, in entry order; *t must have that shape and
 * its dtype (or be f32 stored as BF16 / F16) and stay valid until the next call. A file of many
 * tensors is so written holding one of them in memory (hp-ckpt from-hf / to-hf). */
typedef hp_status_t (*hp_st_fill_fn)(void *ctx, int i, const hp_tensor_t **t);
hp_status_t hp_safetensors_write_stream(const char *path, const hp_st_entry_t *entries, int n,
                                        const char *const *meta, int n_meta, hp_st_fill_fn fill,
                                        void *ctx, uint64_t *xxh3);

#ifdef __cplusplus
}
#endif
#endif
