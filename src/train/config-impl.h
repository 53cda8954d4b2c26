/* Private to the configuration files (config_keys.c: the key table and value parsing;
 * config_yaml.c; config_args.c; config_print.c; config.c: validation and the model keys):
 * the table and the helpers they share, so a value from a file, the command line or the
 * defaults obeys the same rules and produces the same messages. */
#ifndef HP_CONFIG_IMPL_H
#define HP_CONFIG_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyperparallel/config.h"

#define I32 INT32_MAX
#define I64 INT64_MAX
#define DEG (1 << 24)   /* parallel degrees (parallel_dims.c narrows them to int) */

/* Every key, in schema order (hp_config_schema returns the same table). */
extern const hp_config_key_t hp_cfg_keys[];
extern const size_t hp_cfg_n_keys;
#define HP_CFG_MAX_KEYS 512   /* at least hp_cfg_n_keys (checked where the table is defined) */

/* "an integer", "a string", ... for messages. */
const char *hp_cfg_type_words(hp_config_type_t type);
/* "unknown key 'x'; did you mean 'y'?" or a list of the section's keys. */
hp_status_t hp_cfg_unknown_key_error(const char *origin, const char *dotted, const char *prefix);
bool hp_cfg_parse_bool(const char *s, bool *out);
bool hp_cfg_parse_int(const char *s, int64_t *out);
bool hp_cfg_parse_float(const char *s, double *out);
/* Writes `s` into a string field, or fails when too long. */
hp_status_t hp_cfg_copy_str(char *dst, const char *s, const char *origin, const hp_config_key_t *k);
/* Why an integer key has its range, for the error message (NULL: no reason to give). */
const char *hp_cfg_range_hint(const hp_config_key_t *k);
/* Parses `text` as key k's value into cfg: the one path of every value. */
hp_status_t hp_cfg_set_from_text(hp_config_t *cfg, const hp_config_key_t *k, const char *text,
                                 const char *origin);
/* Key k's value in cfg as YAML text (config_print.c). */
void hp_cfg_format_value(const hp_config_t *cfg, const hp_config_key_t *k, char *buf, size_t n);

#endif
