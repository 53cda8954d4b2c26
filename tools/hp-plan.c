/* hp-plan: the auto-parallel planner (docs/planner.md). Reads hp-train's config (YAML and dotted
 * overrides), enumerates the layouts of --world ranks, drops those the trainer refuses or whose
 * memory plan exceeds the limit, and prints the fastest by a step time predicted from this
 * machine's calibration (`hp-plan --calibrate`, run under mpirun to measure the collectives). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hyperparallel/comm.h>
#include <hyperparallel/config.h>
#include <hyperparallel/metrics.h>
#include <hyperparallel/parse.h>
#include <hyperparallel/planner.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: hp-plan --config FILE.yaml [--section.key=value ...] --world N [--memory-limit-gib G]\n"
            "               [--top K] [--ranks-per-host R] [--calibration FILE]\n"
            "       mpirun -np 8 hp-plan --calibrate [--quick] [--calibration FILE]\n"
            "  --world N              ranks to plan for\n"
            "  --memory-limit-gib G   each rank's memory (default: training.memory_limit_gib when > 0, else none)\n"
            "  --top K                layouts to print (default 10)\n"
            "  --ranks-per-host R     ranks sharing this host's cores (default: N)\n"
            "  --calibration FILE     the calibration (default $HP_PLAN_CALIBRATION or\n"
            "                         ~/.cache/hyperparallel/calibration.txt)\n"
            "  --calibrate            measure this machine's rates and write the calibration\n"
            "  --quick                shorter measurements (seconds; noisier)\n"
            "  --breakdown            each layout's compute by part and its communication seconds\n");
}

static int int_arg(const char *flag, const char *v, int *out) {
    int32_t x = 0;
    if (hp_parse_i32(flag, v ? v : "", 1, 1 << 20, "e.g. --world 4", &x) != HP_OK) {
        fprintf(stderr, "hp-plan: error: %s\n", hp_last_error());
        return 0;
    }
    *out = x;
    return 1;
}

int main(int argc, char **argv) {
    int world_n = 0, top = 10, per_host = 0, calibrate = 0, quick = 0, breakdown = 0;
    double limit_gib = 0;
    const char *calib_path = NULL;
    char default_path[1024];
    hp_plan_calib_default_path(default_path, sizeof default_path);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return 0; }

    hp_config_t *cfg = calloc(1, sizeof *cfg);
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int nrest = 0;
    if (!cfg || !rest) return 1;
    hp_status_t s = hp_config_parse_args(cfg, argc, argv, rest, &nrest);
    if (s != HP_OK) {
        fprintf(stderr, "hp-plan: error: %s\n", hp_last_error());
        return 2;
    }
    for (int i = 0; i < nrest; i++) {
        const char *a = rest[i], *v = i + 1 < nrest ? rest[i + 1] : NULL;
        if (!strcmp(a, "--world")) { if (!int_arg(a, v, &world_n)) return 2; i++; }
        else if (!strcmp(a, "--top")) { if (!int_arg(a, v, &top)) return 2; i++; }
        else if (!strcmp(a, "--ranks-per-host")) { if (!int_arg(a, v, &per_host)) return 2; i++; }
        else if (!strcmp(a, "--calibration") && v) { calib_path = v; i++; }
        else if (!strcmp(a, "--memory-limit-gib") && v) {
            char *end = NULL;
            limit_gib = strtod(v, &end);
            if (!end || *end || limit_gib <= 0) {
                fprintf(stderr, "hp-plan: error: --memory-limit-gib '%s': expected a positive number of GiB\n", v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--calibrate")) calibrate = 1;
        else if (!strcmp(a, "--quick")) quick = 1;
        else if (!strcmp(a, "--breakdown")) breakdown = 1;
        else {
            fprintf(stderr, "hp-plan: error: unknown argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!calib_path) calib_path = default_path;

    if (calibrate) {
        hp_comm_t world = NULL;
        if (hp_comm_init(&argc, &argv, &world) != HP_OK) {
            fprintf(stderr, "hp-plan: error: %s\n", hp_last_error());
            return 1;
        }
        hp_plan_calib_t c;
        s = hp_plan_calibrate(world, quick, &c);
        const int rank = hp_comm_rank(world);
        if (s == HP_OK && rank == 0) s = hp_plan_calib_save(&c, calib_path);
        if (rank == 0) {
            if (s != HP_OK) fprintf(stderr, "hp-plan: error: %s\n", hp_last_error());
            else {
                printf("calibration written to %s\ncpu %s, %d cores, %d thread(s) per kernel\n", calib_path, c.cpu,
                       c.cores, c.threads);
                printf("sgemm (256, 1024, 256) %.1f GFLOP/s, (1024, 4096, 1024) %.1f GFLOP/s; attention T 512 %.3g "
                       "B T^2 H hd/s; row kernels %.2f GB/s\n", hp_plan_gemm_rate(&c, 256, 1024, 256) / 1e9,
                       hp_plan_gemm_rate(&c, 1024, 4096, 1024) / 1e9, c.attn_flops[2], c.row_bytes_per_s / 1e9);
                for (int i = 0; i < HP_PLAN_COLL_SIZES && c.coll_ranks[i]; i++)
                    printf("%d ranks: all_reduce %.1f us + %.3f GB/s, all_gather %.1f us + %.3f GB/s, reduce_scatter "
                           "%.1f us + %.3f GB/s\n", c.coll_ranks[i], c.alpha[0][i] * 1e6, 1e-9 / c.beta[0][i],
                           c.alpha[1][i] * 1e6, 1e-9 / c.beta[1][i], c.alpha[2][i] * 1e6, 1e-9 / c.beta[2][i]);
            }
        }
        hp_comm_finalize();
        free(cfg);
        free(rest);
        return s == HP_OK ? 0 : 1;
    }

    if (world_n < 1) {
        fprintf(stderr, "hp-plan: error: --world N is required (the ranks to plan for)\n");
        usage(stderr);
        return 2;
    }
    hp_plan_calib_t cal;
    hp_model_config_t mc;
    if (hp_plan_calib_load(calib_path, &cal) != HP_OK || hp_config_validate(cfg) != HP_OK ||
        hp_plan_resolve_model(cfg, &mc) != HP_OK) {
        fprintf(stderr, "hp-plan: error: %s\n", hp_last_error());
        return 2;
    }
    if (limit_gib <= 0 && cfg->training.memory_limit_gib > 0) limit_gib = cfg->training.memory_limit_gib;
    int64_t rss = 0;
    (void)hp_memory_rss(&rss, NULL);
    hp_plan_options_t o = {world_n, limit_gib * 1073741824.0, (size_t)rss, per_host, &cal};
    hp_plan_result_t r;
    const double t0 = hp_clock_now_seconds();
    s = hp_plan_search(cfg, &mc, &o, &r);
    if (s != HP_OK) {
        fprintf(stderr, "hp-plan: error: %s\n", hp_last_error());
        return 1;
    }
    printf("hp-plan: model %s %s, seq %lld, local batch %lld, world %d, calibration %s (%s, %d cores, %d thread(s))\n",
           mc.name, mc.flavor, (long long)cfg->training.seq_len, (long long)cfg->training.local_batch_size, world_n,
           calib_path, cal.cpu, cal.cores, cal.threads);
    printf("%d layouts enumerated, %d refused by the trainer's rules, %d over the memory limit (%s), %d fit; %.2f s\n",
           r.n_enumerated, r.n_refused, r.n_over_memory, limit_gib > 0 ? "set" : "none", r.n,
           hp_clock_now_seconds() - t0);
    if (r.n == 0) {
        fprintf(stderr, "hp-plan: error: no layout of %d ranks fits %.2f GiB per rank; the smallest predicted peak is "
                "%.2f GiB (%s); hint: more ranks, a smaller training.local_batch_size or training.seq_len\n", world_n,
                limit_gib, r.smallest_peak / 1073741824.0, r.smallest_what);
        hp_plan_result_free(&r);
        return 3;
    }
    printf("%-4s %9s %10s %9s %9s %9s %9s  %s\n", "rank", "step ms", "tokens/s", "peak GiB", "compute", "comm", "bubble",
           "overrides");
    for (int i = 0; i < r.n && i < top; i++) {
        const hp_plan_layout_t *l = &r.layouts[i];
        char ov[1024];
        printf("%-4d %9.2f %10.0f %9.3f %9.2f %9.2f %9.2f  %s\n", i + 1, l->step_s * 1e3, l->tokens_per_s,
               l->mem.peak / 1073741824.0, l->compute_s * 1e3, l->exposed_comm_s * 1e3, l->bubble_s * 1e3,
               hp_plan_overrides(l, ov, sizeof ov));
        if (breakdown)
            printf("     compute %.2f ms = GEMM %.2f + attention %.2f + row kernels %.2f + AC recompute %.2f + optimizer "
                   "%.2f; communication per step: overlappable %.2f ms, blocking %.2f ms\n", l->compute_s * 1e3,
                   l->gemm_s * 1e3, l->attn_s * 1e3, l->row_s * 1e3, l->recompute_s * 1e3, l->optim_s * 1e3,
                   l->comm.overlappable_s * 1e3, l->comm.blocking_s * 1e3);
    }
    hp_plan_result_free(&r);
    free(cfg);
    free(rest);
    return 0;
}
