/* hp-pp-timeline: draw a pipeline schedule's per-rank timeline as SVG (and PNG where a converter
 * is installed): the actions a real run recorded (bench_pp --timeline DIR writes one file per
 * schedule) above the simulator's unit-cost timeline of the same compute order, one colour per
 * action type, each panel with its bubble fraction (docs/pp.md "Timelines").
 *   hp-pp-timeline RUN.csv [-o OUT.svg] [--png]
 *   hp-pp-timeline --schedule NAME --pp P --microbatches N [--stages-per-rank L] [-o OUT.svg] [--png]
 * RUN.csv, as bench_pp writes it:
 *   # hp-pp timeline: schedule=ZBVZeroBubble pp=4 stages=8 microbatches=8
 *   rank,action,start_ms,end_ms
 *   0,0F0,0.000,1.250
 *   ...
 * Every action of each rank's lowered list (communication and FSDP actions included) in list
 * order. The simulated panel takes each rank's compute actions in that order and times them with
 * hp_pp_timing_actions (F = I = W = 1, B = 2, communication free). Exit 0; 1 for an unreadable
 * or malformed input (the file, line and what was expected named); 2 for bad arguments. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hyperparallel/parse.h>
#include <hyperparallel/pp_schedule.h>

#include "pp-cli.h"

#define TOOL "hp-pp-timeline"
#define MAX_RANKS 256

typedef struct { hp_pp_action_t a; double t0, t1; } ev_t;
typedef struct { ev_t *e; int n, cap; } track_t;

static int usage(void) {
    fprintf(stderr,
            "usage: " TOOL " RUN.csv [-o OUT.svg] [--png]\n"
            "       " TOOL " --schedule NAME --pp P --microbatches N [--stages-per-rank L] [-o OUT.svg] [--png]\n"
            "  RUN.csv  a recorded run (bench_pp --timeline DIR): '# hp-pp timeline: schedule=NAME pp=P stages=S\n"
            "           microbatches=N', then 'rank,action,start_ms,end_ms' rows; drawn above the simulator's\n"
            "           unit-cost timeline of the same compute order\n"
            "  --schedule ...  the simulator's timeline of a generated schedule alone (names as hp-pp-schedule)\n"
            "  -o OUT.svg      output (default: RUN.svg next to the input, or NAME.svg)\n"
            "  --png           also write OUT.png (rsvg-convert, or ImageMagick's convert; an error if neither)\n");
    return 2;
}

static int bad_args(void) {
    fprintf(stderr, "%s\n", hp_last_error());
    usage();
    return 2;
}

static int push(track_t *t, const ev_t *e) {
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 64;
        ev_t *p = realloc(t->e, (size_t)cap * sizeof *p);
        if (!p) return -1;
        t->e = p;
        t->cap = cap;
    }
    t->e[t->n++] = *e;
    return 0;
}

/* ---- reading a recorded run ---------------------------------------------------------------- */
typedef struct {
    char schedule[64];
    int pp, stages, n_mb;
    track_t rank[MAX_RANKS];
} run_t;

static int read_run(const char *path, run_t *run) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, TOOL ": cannot open the timeline '%s'; hint: bench_pp --timeline DIR writes DIR/NAME.csv\n",
                path);
        return 1;
    }
    char line[512];
    int ln = 0, rc = 0, header = 0;
    while (fgets(line, sizeof line, f)) {
        ln++;
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0]) continue;
        if (line[0] == '#') {
            const char *h = strstr(line, "hp-pp timeline:");
            if (h && sscanf(h, "hp-pp timeline: schedule=%63s pp=%d stages=%d microbatches=%d", run->schedule, &run->pp,
                            &run->stages, &run->n_mb) == 4)
                header = 1;
            continue;
        }
        if (!strcmp(line, "rank,action,start_ms,end_ms")) continue;
        int r = -1, used = 0;
        char act[64];
        double t0, t1;
        if (sscanf(line, "%d,%63[^,],%lf,%lf%n", &r, act, &t0, &t1, &used) != 4 || line[used] != 0) {
            fprintf(stderr, TOOL ": %s:%d: '%s' is not 'rank,action,start_ms,end_ms' (e.g. '0,1F3,2.500,3.125')\n",
                    path, ln, line);
            rc = 1;
            break;
        }
        ev_t e = {.t0 = t0, .t1 = t1};
        char what[96];
        snprintf(what, sizeof what, "%s:%d", path, ln);
        if (hp_pp_action_parse(act, what, &e.a, NULL) != HP_OK) {
            fprintf(stderr, TOOL ": %s\n", hp_last_error());
            rc = 1;
            break;
        }
        if (r < 0 || r >= MAX_RANKS || !(t1 >= t0) || !isfinite(t0) || !isfinite(t1)) {
            fprintf(stderr, TOOL ": %s:%d: rank %d must be in [0, %d) and start %.3f <= end %.3f (finite)\n", path, ln, r,
                    MAX_RANKS, t0, t1);
            rc = 1;
            break;
        }
        if (push(&run->rank[r], &e) < 0) {
            fprintf(stderr, TOOL ": out of memory reading %s\n", path);
            rc = 1;
            break;
        }
    }
    fclose(f);
    if (rc == 0 && !header) {
        fprintf(stderr, TOOL ": %s: no '# hp-pp timeline: schedule=NAME pp=P stages=S microbatches=N' line; hint: "
                "write the file with bench_pp --timeline DIR\n", path);
        rc = 1;
    }
    if (rc == 0 && (run->pp < 1 || run->pp > MAX_RANKS || run->stages < run->pp || run->n_mb < 1)) {
        fprintf(stderr, TOOL ": %s: header pp=%d stages=%d microbatches=%d: expected 1 <= pp <= %d <= ..., stages >= "
                "pp, microbatches >= 1\n", path, run->pp, run->stages, run->n_mb, MAX_RANKS);
        rc = 1;
    }
    for (int r = 0; rc == 0 && r < MAX_RANKS; r++)
        if (run->rank[r].n && r >= run->pp) {
            fprintf(stderr, TOOL ": %s: actions of rank %d, but the header says pp=%d\n", path, r, run->pp);
            rc = 1;
        }
    return rc;
}

/* The compute-only order of each rank (the simulator's input) from the recorded lists. */
static hp_status_t compute_order(const run_t *run, hp_pp_schedule_t **out) {
    HP_TRY(hp_pp_schedule_create(run->pp, out));
    for (int r = 0; r < run->pp; r++)
        for (int i = 0; i < run->rank[r].n; i++)
            if (hp_pp_type_is_compute(run->rank[r].e[i].a.type)) HP_TRY(hp_pp_schedule_append(*out, r, &run->rank[r].e[i].a));
    return HP_OK;
}

/* Simulated tracks: unit-cost times of the compute order. */
static int simulate(const hp_pp_schedule_t *c, int stages, run_t *sim, double *bubble) {
    hp_pp_timing_t tm;
    int64_t *ts = NULL, *te = NULL;
    if (hp_pp_timing_actions(c, stages, &tm, &ts, &te) != HP_OK) {
        fprintf(stderr, TOOL ": the simulator cannot time this order: %s\n", hp_last_error());
        return 1;
    }
    size_t at = 0;
    for (int r = 0; r < hp_pp_schedule_n_ranks(c); r++)
        for (int i = 0; i < hp_pp_schedule_len(c, r); i++, at++) {
            const hp_pp_action_t *a = hp_pp_schedule_at(c, r, i);
            if (!a || ts[at] < 0) continue;
            ev_t e = {*a, (double)ts[at], (double)te[at]};
            if (push(&sim->rank[r], &e) < 0) {
                free(ts);
                free(te);
                return 1;
            }
        }
    free(ts);
    free(te);
    *bubble = tm.bubble_fraction;
    return 0;
}

/* Measured bubble: 1 - time in compute actions / (ranks x span). */
static double measured_bubble(const run_t *run, double *t_lo, double *t_hi) {
    double lo = INFINITY, hi = -INFINITY, busy = 0;
    for (int r = 0; r < run->pp; r++)
        for (int i = 0; i < run->rank[r].n; i++) {
            const ev_t *e = &run->rank[r].e[i];
            lo = e->t0 < lo ? e->t0 : lo;
            hi = e->t1 > hi ? e->t1 : hi;
            if (hp_pp_type_is_compute(e->a.type)) busy += e->t1 - e->t0;
        }
    *t_lo = lo;
    *t_hi = hi;
    return hi > lo ? 1.0 - busy / (run->pp * (hi - lo)) : 0.0;
}

/* ---- SVG ---------------------------------------------------------------------------------- */
static const char *colour(hp_pp_type_t t) {
    switch (t) {
    case HP_PP_F:
    case HP_PP_TRANSPOSE_F: return "#4c78a8";   /* MPipe's stage-0 F / B read as F / B */
    case HP_PP_MPIPE_F: return "#9ecae9";       /* a helper's replica forward: a lighter F */
    case HP_PP_B:
    case HP_PP_TRANSPOSE_B: return "#54a24b";
    case HP_PP_I: return "#f58518";
    case HP_PP_W: return "#b279a2";
    case HP_PP_SEND_F:
    case HP_PP_RECV_F:
    case HP_PP_SEND_B:
    case HP_PP_RECV_B:
    case HP_PP_MPIPE_SEND_F:
    case HP_PP_MPIPE_RECV_F: return "#9d9d9d";
    default: return "#3d3d3d";   /* UNSHARD, RESHARD, REDUCE_GRAD */
    }
}

#define W_SVG 1280
#define X0 70
#define ROW_H 26
#define PANEL_GAP 64

/* One panel: rank rows from y, time [lo, hi] over the width. */
static void panel(FILE *o, const run_t *run, double lo, double hi, int y, const char *title, const char *unit) {
    const double w = W_SVG - X0 - 20, span = hi > lo ? hi - lo : 1;
    fprintf(o, "<text x=\"%d\" y=\"%d\" class=\"h\">%s</text>\n", X0, y - 10, title);
    for (int r = 0; r < run->pp; r++) {
        const int ry = y + r * ROW_H;
        fprintf(o, "<text x=\"%d\" y=\"%d\" class=\"r\">rank %d</text>\n", X0 - 8, ry + ROW_H / 2 + 4, r);
        fprintf(o, "<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"#f2f2f2\"/>\n", X0, ry + 2, w, ROW_H - 4);
        for (int i = 0; i < run->rank[r].n; i++) {
            const ev_t *e = &run->rank[r].e[i];
            const double x = X0 + (e->t0 - lo) / span * w, ew = fmax((e->t1 - e->t0) / span * w, 0.6);
            char txt[48];
            hp_pp_action_format(&e->a, txt, sizeof txt);
            const int compute = hp_pp_type_is_compute(e->a.type);
            if (e->a.type == HP_PP_OVERLAP_F_B) {   /* top half the F, bottom half the B */
                fprintf(o, "<g><title>%s %.3f-%.3f %s</title><rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" "
                        "fill=\"%s\"/><rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\"/></g>\n",
                        txt, e->t0, e->t1, unit, x, ry + 2, ew, (ROW_H - 4) / 2, colour(HP_PP_F), x,
                        ry + 2 + (ROW_H - 4) / 2, ew, (ROW_H - 4) - (ROW_H - 4) / 2, colour(HP_PP_B));
                snprintf(txt, sizeof txt, "%dF%d+%dB%d", (int)e->a.stage, (int)e->a.mb, (int)e->a.sub_stage,
                         (int)e->a.sub_mb);
            } else if (compute) {
                fprintf(o, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\" stroke=\"#fff\" "
                        "stroke-width=\"0.5\"><title>%s %.3f-%.3f %s</title></rect>\n",
                        x, ry + 2, ew, ROW_H - 4, colour(e->a.type), txt, e->t0, e->t1, unit);
            } else {   /* communication and FSDP actions: a thin bar at the row's foot */
                fprintf(o, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"4\" fill=\"%s\"><title>%s %.3f-%.3f "
                        "%s</title></rect>\n", x, ry + ROW_H - 6, ew, colour(e->a.type), txt, e->t0, e->t1, unit);
            }
            if (compute && ew >= 7.0 * (double)strlen(txt))
                fprintf(o, "<text x=\"%.2f\" y=\"%d\" class=\"a\">%s</text>\n", x + ew / 2, ry + ROW_H / 2 + 4, txt);
        }
    }
    const int ay = y + run->pp * ROW_H + 14;   /* time axis: about 8 ticks at round values */
    double step = pow(10, floor(log10(span / 8)));
    if (span / step > 40) step *= 5;
    else if (span / step > 16) step *= 2;
    for (double t = 0; t <= span + 1e-9; t += step) {
        const double x = X0 + t / span * w;
        fprintf(o, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#999\"/><text x=\"%.1f\" y=\"%d\" "
                "class=\"t\">%g</text>\n", x, ay - 10, x, ay - 6, x, ay + 6, t);
    }
    fprintf(o, "<text x=\"%d\" y=\"%d\" class=\"t\">time (%s)</text>\n", W_SVG - 40, ay + 20, unit);
}

static int write_svg(const char *path, const char *title, const run_t *real, double real_bubble, const run_t *sim,
                     double sim_bubble) {
    FILE *o = fopen(path, "w");
    if (!o) {
        fprintf(stderr, TOOL ": cannot write '%s'\n", path);
        return 1;
    }
    const int P = sim->pp, ph = P * ROW_H + PANEL_GAP, H = 60 + (real ? ph : 0) + ph + 40;
    fprintf(o, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            "font-family=\"sans-serif\">\n<style>.h{font-size:14px;font-weight:bold}.r{font-size:12px;text-anchor:end}"
            ".a{font-size:10px;fill:#fff;text-anchor:middle}.t{font-size:10px;fill:#555;text-anchor:middle}"
            ".l{font-size:11px}</style>\n<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n"
            "<text x=\"%d\" y=\"22\" style=\"font-size:16px;font-weight:bold\">%s</text>\n",
            W_SVG, H, W_SVG, H, X0, title);
    static const struct { hp_pp_type_t t; const char *name; } legend[] = {
        {HP_PP_F, "F forward"}, {HP_PP_B, "B backward"}, {HP_PP_I, "I backward input"}, {HP_PP_W, "W backward weight"},
        {HP_PP_SEND_F, "send / recv"}, {HP_PP_UNSHARD, "unshard / reshard / reduce_grad"}};
    for (int k = 0; k < 6; k++) {
        const int lx = X0 + k * 190;
        fprintf(o, "<rect x=\"%d\" y=\"32\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%d\" y=\"42\" "
                "class=\"l\">%s</text>\n", lx, colour(legend[k].t), lx + 16, legend[k].name);
    }
    int y = 80;
    char head[256];
    if (real) {
        double lo, hi;
        measured_bubble(real, &lo, &hi);
        snprintf(head, sizeof head, "measured run: bubble %.3f (1 - time in F/I/W/B / (ranks x step)), step %.2f ms",
                 real_bubble, hi - lo);
        panel(o, real, lo, hi, y, head, "ms");
        y += ph;
    }
    double hi = 0;
    for (int r = 0; r < P; r++)
        for (int i = 0; i < sim->rank[r].n; i++) hi = sim->rank[r].e[i].t1 > hi ? sim->rank[r].e[i].t1 : hi;
    snprintf(head, sizeof head, "simulator (F = I = W = 1, B = 2, communication free): bubble %.3f, %g units",
             sim_bubble, hi);
    panel(o, sim, 0, hi, y, head, "units");
    fprintf(o, "</svg>\n");
    if (fclose(o) != 0) {
        fprintf(stderr, TOOL ": error writing '%s'\n", path);
        return 1;
    }
    return 0;
}

static int to_png(const char *svg) {
    char png[1100], cmd[2400];
    snprintf(png, sizeof png, "%.*s.png", (int)(strlen(svg) > 4 && !strcmp(svg + strlen(svg) - 4, ".svg")
                                               ? strlen(svg) - 4 : strlen(svg)), svg);
    if (strchr(svg, '\'') || strchr(png, '\'')) {
        fprintf(stderr, TOOL ": --png: the path '%s' holds a quote; give another -o\n", svg);
        return 1;
    }
    snprintf(cmd, sizeof cmd, "command -v rsvg-convert >/dev/null 2>&1 && rsvg-convert -o '%s' '%s' || "
             "{ command -v convert >/dev/null 2>&1 && convert '%s' '%s'; }", png, svg, svg, png);
    if (system(cmd) != 0) {
        fprintf(stderr, TOOL ": --png: neither rsvg-convert (librsvg2-bin) nor ImageMagick's convert could write %s; "
                "the SVG %s is written\n", png, svg);
        return 1;
    }
    printf("wrote %s\n", png);
    return 0;
}

static const char *const flags[] = {"--schedule", "--pp", "--microbatches", "--stages-per-rank", "-o", "--png",
                                    "--help"};

int main(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    pp_cli_t cli = {0};
    int png = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            return 0;
        } else if (!strcmp(a, "--png")) {
            png = 1;
        } else if ((r = pp_cli_flag(TOOL, argc, argv, &i, &cli))) {
            if (r < 0) return bad_args();
        } else if ((r = hp_flag_value(TOOL, argc, argv, &i, "-o", &v))) {
            if (r < 0) return bad_args();
            out = v;
        } else if (a[0] == '-' && a[1]) {
            hp_flag_unknown_error(TOOL, a, flags, sizeof flags / sizeof flags[0]);
            return bad_args();
        } else if (!in) {
            in = a;
        } else {
            fprintf(stderr, TOOL ": unexpected argument '%s' (one timeline file at most)\n", a);
            return usage();
        }
    }
    const char *name = cli.schedule;
    int32_t pp = cli.pp, n = cli.n, L = cli.L;
    if (pp > MAX_RANKS) {
        fprintf(stderr, TOOL ": --pp %d: at most %d ranks are drawn\n", pp, MAX_RANKS);
        return 2;
    }
    if (!!name == !!in) {
        fprintf(stderr, TOOL ": give a recorded timeline RUN.csv or --schedule NAME (one of them)\n");
        return usage();
    }
    static run_t real, sim;
    hp_pp_schedule_t *c = NULL;
    char title[256], outbuf[1024];
    int rc = 0;
    double real_bubble = 0, sim_bubble = 0, lo, hi;
    if (in) {
        if ((rc = read_run(in, &real))) goto done;
        if (compute_order(&real, &c) != HP_OK) {
            fprintf(stderr, TOOL ": %s: %s\n", in, hp_last_error());
            rc = 1;
            goto done;
        }
        real_bubble = measured_bubble(&real, &lo, &hi);
        sim.pp = real.pp;
        if ((rc = simulate(c, real.stages, &sim, &sim_bubble))) goto done;
        snprintf(title, sizeof title, "%s: pp %d, %d stages, %d micro-batches (%s)", real.schedule, real.pp, real.stages,
                 real.n_mb, in);
        if (!out) {
            const size_t k = strlen(in) > 4 && !strcmp(in + strlen(in) - 4, ".csv") ? strlen(in) - 4 : strlen(in);
            snprintf(outbuf, sizeof outbuf, "%.*s.svg", (int)k, in);
            out = outbuf;
        }
    } else {
        hp_pp_kind_t kind;
        if (hp_pp_kind_from_name(name, &kind) != HP_OK) {
            fprintf(stderr, TOOL ": --schedule: %s\n", hp_last_error());
            return 2;
        }
        if (!pp || !n) {
            fprintf(stderr, TOOL ": --schedule needs --pp and --microbatches\n");
            return usage();
        }
        if (!L) L = hp_pp_kind_is_single_stage(kind) ? 1 : 2;
        if (hp_pp_generate(kind, pp, L, n, &c) != HP_OK) {
            fprintf(stderr, TOOL ": %s\n", hp_last_error());
            return 2;
        }
        sim.pp = pp;
        if ((rc = simulate(c, pp * L, &sim, &sim_bubble))) goto done;
        snprintf(title, sizeof title, "%s: pp %d, %d stages, %d micro-batches (simulated)", hp_pp_kind_name(kind), pp,
                 pp * L, n);
        if (!out) {
            snprintf(outbuf, sizeof outbuf, "%s.svg", hp_pp_kind_name(kind));
            out = outbuf;
        }
    }
    if ((rc = write_svg(out, title, in ? &real : NULL, real_bubble, &sim, sim_bubble))) goto done;
    if (in) printf("%s: measured bubble %.3f, simulated %.3f; wrote %s\n", real.schedule, real_bubble, sim_bubble, out);
    else printf("%s: simulated bubble %.3f; wrote %s\n", title, sim_bubble, out);
    if (png) rc = to_png(out);
done:
    hp_pp_schedule_free(c);
    for (int r = 0; r < MAX_RANKS; r++) {
        free(real.rank[r].e);
        free(sim.rank[r].e);
    }
    return rc;
}
