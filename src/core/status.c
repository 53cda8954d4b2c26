/* Status words, per-thread error messages, rank-prefixed logging, the always-on assert with
 * its abort hook, checked allocation, and the one monotonic clock. */
#include "hyperparallel/status.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const status_words[HP_STATUS_COUNT] = {
    [HP_OK] = "ok",
    [HP_ERR_INVALID_ARG] = "invalid argument",
    [HP_ERR_OOM] = "out of memory",
    [HP_ERR_IO] = "I/O error",
    [HP_ERR_FORMAT] = "malformed input",
    [HP_ERR_COMM] = "communication error",
    [HP_ERR_TIMEOUT] = "timed out",
    [HP_ERR_UNSUPPORTED] = "unsupported",
    [HP_ERR_STATE] = "invalid state",
    [HP_ERR_NOT_FOUND] = "not found",
    [HP_ERR_NUMERIC] = "non-finite value",
};

const char *hp_status_string(hp_status_t status) {
    if ((int)status < 0 || status >= HP_STATUS_COUNT) return "unknown status";
    return status_words[status];
}

double hp_clock_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static _Thread_local char last_error[2048];

/* Formats into a temporary first: an argument may be hp_last_error() itself (the buffer being
 * written), which vsnprintf straight into last_error would overwrite while reading it. */
hp_status_t hp_verror(hp_status_t status, const char *fmt, va_list ap) {
    char msg[sizeof last_error];
    vsnprintf(msg, sizeof msg, fmt, ap);
    memcpy(last_error, msg, sizeof msg);
    return status;
}

hp_status_t hp_error(hp_status_t status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    hp_verror(status, fmt, ap);
    va_end(ap);
    return status;
}

hp_status_t hp_error_prefix(hp_status_t status, const char *fmt, ...) {
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n < sizeof msg) snprintf(msg + n, sizeof msg - (size_t)n, "%s", last_error[0] ? last_error : hp_status_string(status));
    memcpy(last_error, msg, sizeof msg);
    return status;
}

const char *hp_last_error(void) { return last_error; }
void hp_clear_error(void) { last_error[0] = '\0'; }

/* ---- logging ------------------------------------------------------------------------- */
static int log_rank = -1;
static hp_log_level_t log_level = HP_LOG_INFO;

void hp_log_set_rank(int rank) { log_rank = rank; }
int hp_log_get_rank(void) { return log_rank; }
void hp_log_set_level(hp_log_level_t level) { log_level = level; }

void hp_log(hp_log_level_t level, const char *fmt, ...) {
    if (level < log_level) return;
    static const char *const tags[] = {"debug", "info", "warning", "error"};
    char line[4096];
    int n = 0;
    if (log_rank >= 0) n = snprintf(line, sizeof line, "[rank %d] ", log_rank);
    if (level != HP_LOG_INFO) n += snprintf(line + n, sizeof line - (size_t)n, "%s: ", tags[level]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    FILE *out = level >= HP_LOG_WARN ? stderr : stdout;
    fprintf(out, "%s\n", line);
    fflush(out);
}

/* ---- assert and abort hook ------------------------------------------------------------ */
static hp_abort_hook_t abort_hook = NULL;
static void *abort_ctx = NULL;

void hp_set_abort_hook(hp_abort_hook_t hook, void *ctx) {
    abort_hook = hook;
    abort_ctx = ctx;
}

_Noreturn void hp_abort(const char *file, int line, const char *fmt, ...) {
    char msg[2048];
    int n = 0;
    if (log_rank >= 0) n = snprintf(msg, sizeof msg, "[rank %d] ", log_rank);
    n += snprintf(msg + n, sizeof msg - (size_t)n, "fatal: %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", msg);
    fflush(stderr);
    fflush(stdout);
    if (abort_hook) {
        hp_abort_hook_t hook = abort_hook;
        abort_hook = NULL;   /* a failing hook must not recurse */
        hook(msg, abort_ctx);
    }
    abort();
}

/* ---- checked allocation --------------------------------------------------------------- */
void *hp_malloc_checked(size_t bytes, const char *file, int line) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) hp_error(HP_ERR_OOM, "%s:%d: malloc of %zu bytes failed; reduce the model, batch or sequence size", file, line, bytes);
    return p;
}

void *hp_calloc_checked(size_t n, size_t size, const char *file, int line) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) hp_error(HP_ERR_OOM, "%s:%d: calloc of %zu x %zu bytes failed; reduce the model, batch or sequence size", file, line, n, size);
    return p;
}

/* Live and peak bytes of the aligned allocations (the library's tensors, arenas and buffers:
 * parameters, gradients, optimizer state, activations, collective buffers), as malloc reports
 * each block's usable size; the memory plan's prediction is checked against them. */
static size_t g_live_bytes, g_peak_bytes;

void *hp_aligned_alloc_checked(size_t bytes, const char *file, int line) {
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = NULL;
    if (posix_memalign(&p, 64, rounded ? rounded : 64) != 0) {
        hp_error(HP_ERR_OOM, "%s:%d: aligned allocation of %zu bytes failed; reduce the model, batch or sequence size", file, line, bytes);
        return NULL;
    }
    const size_t live = __atomic_add_fetch(&g_live_bytes, malloc_usable_size(p), __ATOMIC_RELAXED);
    size_t peak = __atomic_load_n(&g_peak_bytes, __ATOMIC_RELAXED);
    while (live > peak && !__atomic_compare_exchange_n(&g_peak_bytes, &peak, live, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return p;
}

void hp_free_aligned(void *p) {
    if (!p) return;
    __atomic_sub_fetch(&g_live_bytes, malloc_usable_size(p), __ATOMIC_RELAXED);
    free(p);
}

void hp_memory_tracked(size_t *live, size_t *peak) {
    if (live) *live = __atomic_load_n(&g_live_bytes, __ATOMIC_RELAXED);
    if (peak) *peak = __atomic_load_n(&g_peak_bytes, __ATOMIC_RELAXED);
}

void hp_memory_tracked_reset_peak(void) {
    __atomic_store_n(&g_peak_bytes, __atomic_load_n(&g_live_bytes, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}
