/* The schedule flags that hp-pp-schedule and hp-pp-timeline share: --schedule NAME, --pp P,
 * --microbatches N, --stages-per-rank L (header-only; tools/ only). */
#ifndef HP_TOOLS_PP_CLI_H
#define HP_TOOLS_PP_CLI_H

#include <stdint.h>
#include <stdio.h>

#include <hyperparallel/parse.h>

typedef struct pp_cli {
    const char *schedule;   /* --schedule NAME */
    int32_t pp, n, L;       /* --pp, --microbatches, --stages-per-rank (0: not given) */
} pp_cli_t;

/* 1 when argv[*i] is one of the four flags (its value consumed into c), 0 when it is none of
 * them, -1 for a missing or bad value (hp_last_error names the flag, the value and the range). */
static inline int pp_cli_flag(const char *tool, int argc, char **argv, int *i, pp_cli_t *c) {
    static const struct { const char *flag; int32_t lo, hi; const char *what; } f[] = {
        {"--pp", 1, 1024, "pipeline ranks (parallelism.pipeline_parallel_degree)"},
        {"--microbatches", 1, 1 << 20, "microbatches per step (n_microbatches)"},
        {"--stages-per-rank", 1, 256, "virtual stages per rank; 1 for GPipe and 1F1B"},
    };
    int32_t *dst[] = {&c->pp, &c->n, &c->L};
    const char *v = NULL;
    int r = hp_flag_value(tool, argc, argv, i, "--schedule", &v);
    if (r) {
        if (r > 0) c->schedule = v;
        return r > 0 ? 1 : -1;
    }
    for (int k = 0; k < 3; k++) {
        if (!(r = hp_flag_value(tool, argc, argv, i, f[k].flag, &v))) continue;
        char name[96];
        snprintf(name, sizeof name, "%s: %s", tool, f[k].flag);
        return r < 0 || hp_parse_i32(name, v, f[k].lo, f[k].hi, f[k].what, dst[k]) != HP_OK ? -1 : 1;
    }
    return 0;
}

#endif
