/* Private helpers shared by the checkpoint files (dcp.c, dcp_load.c, dcp_metadata.c, hf.c, ...). */
#ifndef HP_DCP_IMPL_H
#define HP_DCP_IMPL_H
#include <json-c/json.h>
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/file.h"

hp_status_t hp_dcp_agree(hp_comm_t comm, hp_status_t s, const char *what);
/* Copies box `len` starting at src_off inside a contiguous chunk (sizes csz, dtype sdt) to
 * dst (any strides, dtype of dst) at dst_off. */
void hp_dcp_copy_box(hp_tensor_t *dst, const int64_t *dst_off, const void *src, hp_dtype_t sdt,
                     const int64_t *csz, const int64_t *src_off, const int64_t *len, int ndim);
/* This rank's piece of a DTensor as boxes: global offset g, size s, local offset l per dim
 * (one box for Shard/Replicate layouts, several for StridedShard). *boxes is heap (free);
 * none when the rank is outside the mesh or holds nothing. */
typedef struct hp_dcp_box {
    int64_t g[HP_MAX_DIMS], s[HP_MAX_DIMS], l[HP_MAX_DIMS];
} hp_dcp_box_t;
hp_status_t hp_dcp_local_boxes(const hp_dtensor_t *t, hp_dcp_box_t **boxes, int *n);
/* Writes o as indented JSON (json-c's pretty, spaced form, '/' unescaped) to path, atomically
 * (hp_file_write_atomic): HF's config.json, index files and the converter's own records. */
hp_status_t hp_dcp_write_json(const char *path, json_object *o);
/* Strict JSON (UTF-8 checked, one value, only white space after it) of at most max_bytes;
 * `kind` names the document in messages, `hint` ends a parse error's message. */
hp_status_t hp_dcp_json_parse(const char *json, size_t len, size_t max_bytes, const char *what, const char *kind,
                              const char *hint, json_object **out);

/* The message of a chunk whose XXH3-64 does not match metadata.json (file, tensor, how to skip). */
hp_status_t hp_dcp_checksum_error(const char *dir, const char *file, const char *name, const char *key,
                                  uint64_t stored, uint64_t computed);
/* HF interop internals shared by hf.c and hf_convert.c: the HF name of expert e of a routed-expert
 * parameter (1 when fqn is one); whether fqn is the trainer's expert_bias entry
 * ("layers.N.moe.expert_bias"), and one the adapter has no HF tensor for (skipped both ways);
 * whether the model has an HF architecture (an adapter that takes its config). */
struct hp_model_config;
int hp_hf_expert_name(const char *fqn, int e, char *out, size_t n);
int hp_hf_is_expert_bias(const char *name);
int hp_hf_skips(const hp_hf_adapter_t *a, const char *fqn);
hp_status_t hp_hf_check(const hp_hf_adapter_t *a, const struct hp_model_config *mc, const char *what);
/* Rows of a (heads*hd, cols) q/k weight, row_bytes each: to_hf moves TorchTitan row
 * h*hd + 2i + p to HF row h*hd + p*hd/2 + i (the interleaved to rotate_half RoPE order), else back. */
void hp_hf_permute_rows(void *dst, const void *src, int64_t rows, size_t row_bytes, int hd, int to_hf);
/* The checks of an HF export (an adapter for the model, dtype f32 or bf16) and its default
 * shard size (5 GiB, HF's) when *max_shard_bytes is 0. */
hp_status_t hp_hf_export_check(const hp_hf_adapter_t *a, const struct hp_model_config *mc, hp_dtype_t dtype,
                               size_t *max_shard_bytes);
/* The HF shard (1-based) of the next tensor of nb bytes: tensors fill shards in order, a new one
 * starting when the current one has data and would grow past max_shard_bytes (HF's rule);
 * *cur bytes in the current shard, *total in all, *nfiles shards so far (start: 0, 0, 1). */
int hp_hf_next_shard(size_t nb, size_t max_shard_bytes, size_t *cur, size_t *total, int *nfiles);
/* Shard f's file name, "model-0000f-of-0000n.safetensors", and (path non-NULL) its path in dir. */
void hp_hf_shard_name(char *fn, size_t fn_n, char *path, size_t path_n, const char *dir, int f, int nfiles);
/* The end of an HF export (rank 0): model.safetensors.index.json from weight_map (HF name ->
 * shard file; taken over) and the total size, config.json by the adapter, then the folder synced. */
hp_status_t hp_hf_write_index(const char *dir, json_object *weight_map, size_t total, const hp_hf_adapter_t *a,
                              const struct hp_model_config *mc, hp_dtype_t dtype);
/* Non-finite values among n raw F32 / BF16 / F16 values; *first = the first index (hf_convert.c). */
int64_t hp_hf_count_nonfinite_raw(const void *p, int64_t n, hp_dtype_t dt, int64_t *first);

#endif
