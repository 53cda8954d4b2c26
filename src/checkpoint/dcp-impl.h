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
/* Non-finite values among n raw F32 / BF16 / F16 values; *first = the first index (hf_convert.c). */
int64_t hp_hf_count_nonfinite_raw(const void *p, int64_t n, hp_dtype_t dt, int64_t *first);

#endif
