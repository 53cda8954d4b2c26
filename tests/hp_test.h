/* Minimal test harness shared by every test program: checks count failures instead of
 * aborting, so one run reports every broken case. A program returns hp_test_finish(). */
#ifndef HP_TEST_H
#define HP_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int hp_test_failures_ = 0;
static int hp_test_checks_ = 0;
static int hp_test_rank_ = 0;

#define HP_CHECK(cond, ...)                                                        \
    do {                                                                           \
        hp_test_checks_++;                                                         \
        if (!(cond)) {                                                             \
            hp_test_failures_++;                                                   \
            fprintf(stderr, "[rank %d] FAIL %s:%d: %s: ", hp_test_rank_, __FILE__, \
                    __LINE__, #cond);                                              \
            fprintf(stderr, __VA_ARGS__);                                          \
            fprintf(stderr, "\n");                                                 \
        }                                                                          \
    } while (0)

#define HP_CHECK_OK(expr)                                                          \
    do {                                                                           \
        hp_status_t s_ = (expr);                                                   \
        HP_CHECK(s_ == HP_OK, "%s -> %s: %s", #expr, hp_status_string(s_),       \
                 hp_last_error());                                                 \
    } while (0)

/* Expects a failing status whose message contains `needle`. */
#define HP_CHECK_ERR(expr, expected_status, needle)                                \
    do {                                                                           \
        hp_clear_error();                                                          \
        hp_status_t s_ = (expr);                                                   \
        HP_CHECK(s_ == (expected_status) && strstr(hp_last_error(), (needle)),    \
                 "%s -> %s '%s', expected %s containing '%s'", #expr,             \
                 hp_status_string(s_), hp_last_error(),                            \
                 hp_status_string(expected_status), (needle));                     \
    } while (0)

#define HP_CHECK_CLOSE(a, b, rtol, atol)                                           \
    do {                                                                           \
        double a_ = (double)(a), b_ = (double)(b);                                 \
        HP_CHECK(fabs(a_ - b_) <= (atol) + (rtol) * fabs(b_), "%s=%.9g vs %s=%.9g", \
                 #a, a_, #b, b_);                                                  \
    } while (0)

static inline void hp_test_set_rank(int rank) { hp_test_rank_ = rank; }

/* Runs a shell command, its output (as the command redirects it) into out (cut at cap);
 * returns its exit code, 128 + N for a command killed by signal N, -1 when it cannot start. */
static inline int hp_test_run_capture(const char *cmd, char *out, size_t cap) {
    out[0] = '\0';
    FILE *p = popen(cmd, "r");
    if (!p) {
        snprintf(out, cap, "popen failed");
        return -1;
    }
    size_t len = 0;
    char line[2048];
    while (fgets(line, sizeof line, p)) {
        size_t l = strlen(line);
        if (len + l + 1 < cap) {
            memcpy(out + len, line, l);
            len += l;
        }
    }
    out[len] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* The path of `rel` in the source tree: $HP_SOURCE_DIR (ctest sets it), else "..". */
static inline void hp_test_source_path(char *out, size_t cap, const char *rel) {
    const char *src = getenv("HP_SOURCE_DIR");
    snprintf(out, cap, "%s/%s", src ? src : "..", rel);
}

/* The path of the built program `name` ($HP_BUILD_DIR, else "."); prints the SKIP line and
 * returns 0 when it is not built. */
static inline int hp_test_built_program(char *out, size_t cap, const char *name) {
    const char *bd = getenv("HP_BUILD_DIR");
    snprintf(out, cap, "%s/%s", bd && *bd ? bd : ".", name);
    if (access(out, X_OK) == 0) return 1;
    printf("SKIP: %s not built (set HP_BUILD_DIR)\n", out);
    return 0;
}

/* Removes a test's scratch directory (rm -rf; a failure is reported, not counted). */
static inline void hp_test_remove_dir(const char *dir) {
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%.1024s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* Prints a summary line and returns the exit code. */
static inline int hp_test_finish(const char *name) {
    if (hp_test_rank_ == 0 || hp_test_failures_)
        printf("[rank %d] %s: %d checks, %d failed\n", hp_test_rank_, name, hp_test_checks_,
               hp_test_failures_);
    return hp_test_failures_ ? 1 : 0;
}

#endif
