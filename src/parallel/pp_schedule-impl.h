/* Private to the pipeline schedule files (pp_schedule.c: action IR, rows, CSV and grid;
 * pp_generate.c; pp_lower.c; pp_simulate.c): the schedule's body, growing strings, the action
 * map and the few helpers they share. */
#ifndef HP_PP_SCHEDULE_IMPL_H
#define HP_PP_SCHEDULE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "hyperparallel/pp_schedule.h"

#define PP_BUBBLE HP_PP_TYPE_COUNT   /* type of a slot that holds no action */
#define PP_MAX_RANKS (1 << 20)
#define PP_MAX_COMPUTE (1 << 24)     /* generator limit on compute actions in all */

/* One rank's slots (bubbles included) and the schedule: one row per rank. */
typedef struct { hp_pp_action_t *a; int len, cap; } pp_row_t;
struct hp_pp_schedule { int n_ranks; pp_row_t *rows; };

static inline int is_bubble(const hp_pp_action_t *a) { return a->type == PP_BUBBLE; }
/* MPIPE_F / MPIPE_SEND_F name stage 0 but run on a helping rank's replica: they own no stage. */
static inline int on_replica(hp_pp_type_t t) { return t == HP_PP_MPIPE_F || t == HP_PP_MPIPE_SEND_F; }

/* Appends without checks (actions already valid; NULL: a bubble). */
hp_status_t hp_pps_row_push(pp_row_t *row, const hp_pp_action_t *a);
hp_status_t hp_pps_push(hp_pp_schedule_t *s, int rank, int32_t stage, hp_pp_type_t type, int32_t mb);
/* hp_pp_action_leaves with TRANSPOSE_F / TRANSPOSE_B read as F / B. */
int hp_pps_base_leaves(const hp_pp_action_t *a, hp_pp_action_t out[2]);
/* hp_pp_action_format into buf, returned for use inside a message. */
const char *hp_pps_act_str(const hp_pp_action_t *a, char *buf, size_t cap);
hp_status_t hp_pps_oom(const char *what);
/* An hp_error message: `head`, then the grid (or the rows around error_step). */
hp_status_t hp_pps_error_with_grid(const hp_pp_schedule_t *s, int error_step, const char *head);
/* Every action's stage < num_stages and every stage mapped to a rank of s. */
hp_status_t hp_pps_check_mapping(const hp_pp_schedule_t *s, const int *stage_to_rank, int num_stages,
                                 const char *what);

/* ---- growing strings (an out-of-memory flag instead of a status per call) ---------------- */
typedef struct { char *p; size_t n, cap; int oom; } sb_t;
void hp_pps_sb_putn(sb_t *b, const char *s, size_t n);
void hp_pps_sb_puts(sb_t *b, const char *s);
void hp_pps_sb_printf(sb_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hands the text to the caller (never NULL on success). */
hp_status_t hp_pps_sb_finish(sb_t *b, char **out);
/* What a blocked action waits for, for messages. */
void hp_pps_describe_wait(sb_t *b, const hp_pp_action_t *a, int num_stages, const int *s2r);
/* A stuck schedule for messages: "rank R <before> ACTION <after> <what it waits for>" for the
 * first 8 ranks not at the end of their row (pos[r]), "; " between, and "; ..." after them
 * when `ellipsis` is set and more ranks wait. */
void hp_pps_describe_blocked(sb_t *b, const hp_pp_schedule_t *s, const int *pos, int num_stages, const int *s2r,
                             const char *before, const char *after, int ellipsis);

/* ---- a set / map of actions: open addressing over a packed 60-bit key -------------------- */
typedef struct { uint64_t *keys; int64_t *vals; uint8_t *used; size_t cap, n; } amap_t;
static inline uint64_t akey(int32_t stage, int type, int32_t mb) {
    return ((uint64_t)(uint32_t)stage << 36) | ((uint64_t)(unsigned)type << 32) | (uint32_t)(mb + 1);
}
void hp_pps_amap_free(amap_t *m);
/* Sets key -> val; returns 1 when the key is new, 0 when it was there, -1 out of memory. */
int hp_pps_amap_put(amap_t *m, uint64_t k, int64_t val);
int hp_pps_amap_get(const amap_t *m, uint64_t k, int64_t *val);
int hp_pps_amap_has(const amap_t *m, int32_t stage, int type, int32_t mb);

#endif
