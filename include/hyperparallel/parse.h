/* hp_parse: the one place numbers and flags enter the program. Every integer and float from a
 * config file, a command-line flag, a JSON field or file metadata is parsed here with a range
 * check against the type that will hold it, and every tool rejects an unknown flag with a
 * did-you-mean suggestion. Messages name the input (`what`), the value, the expected range
 * and a hint. docs/config.md ("Numbers and flags"). */
#ifndef HYPERPARALLEL_PARSE_H
#define HYPERPARALLEL_PARSE_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parses a base-10 integer (optional sign, surrounding spaces allowed) into [min, max].
 * `what` names the input as the message should ("--vocab", "command line: key
 * 'training.seq_len'", "config.json 'vocab_size' (dir/config.json)"); `hint` (may be NULL) is
 * appended as "; hint: ...". Errors are HP_ERR_INVALID_ARG:
 *   "<what> expects an integer, got 'lots'; hint: ..."
 *   "<what> expects an integer in [1, 2147483647], got '4294967312'; hint: ..."  */
hp_status_t hp_parse_i64(const char *what, const char *text, int64_t min, int64_t max, const char *hint,
                         int64_t *out);
hp_status_t hp_parse_i32(const char *what, const char *text, int32_t min, int32_t max, const char *hint,
                         int32_t *out);
/* Non-negative integer up to max (a '-' sign is refused rather than wrapped). */
hp_status_t hp_parse_u64(const char *what, const char *text, uint64_t max, const char *hint, uint64_t *out);
/* Finite number in [min, max]; nan, inf and values that over- or underflow a double are refused. */
hp_status_t hp_parse_f64(const char *what, const char *text, double min, double max, const char *hint,
                         double *out);
/* As hp_parse_f64, then hp_check_f32: for values that are used in float32. */
hp_status_t hp_parse_f32(const char *what, const char *text, double min, double max, const char *hint,
                         float *out);

/* Range check of a value that is already a number (a JSON field, a struct member). */
hp_status_t hp_check_i64(const char *what, int64_t v, int64_t min, int64_t max, const char *hint);
/* A value used in float32 must be finite there and, unless 0, a normal float32
 * (FLT_MIN <= |v| <= FLT_MAX): 1e-300 would silently become 0 and 1e39 infinity. */
hp_status_t hp_check_f32(const char *what, double v);

/* Levenshtein distance, ASCII case-insensitive (used for "did you mean" suggestions). */
size_t hp_edit_distance(const char *a, const char *b);
/* The candidate nearest to `s` by edit distance, or NULL when none is within
 * max(3, strlen(s) / 3). */
const char *hp_nearest_name(const char *s, const char *const *candidates, size_t n);

/* The error of a tool for an argument it does not know:
 *   "hp-ckpt: unknown option '--dtyp'; did you mean '--dtype'? (options: --model, ...)"
 * `known` lists the tool's flags with their dashes. For "--name=value" only the name is
 * compared. Returns HP_ERR_INVALID_ARG. */
hp_status_t hp_flag_unknown_error(const char *tool, const char *arg, const char *const *known, size_t n);

/* Matches argv[*i] against a flag that takes a value, "--name VALUE" or "--name=VALUE":
 * returns 1 and sets *value (advancing *i past a separate value) on a match, 0 when argv[*i]
 * is another argument, and -1 with an hp_error naming the tool and the flag when the value is
 * missing. */
int hp_flag_value(const char *tool, int argc, char **argv, int *i, const char *name, const char **value);

#ifdef __cplusplus
}
#endif
#endif
