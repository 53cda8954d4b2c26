/* Status codes, error messages, rank-prefixed logging and the always-on assert.
 * Every fallible public function returns hp_status_t; the detailed message of the most
 * recent failure on this thread is available from hp_last_error(). */
#ifndef HYPERPARALLEL_STATUS_H
#define HYPERPARALLEL_STATUS_H

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hp_status {
    HP_OK = 0,
    HP_ERR_INVALID_ARG,   /* a caller-supplied value is wrong (shape, name, option) */
    HP_ERR_OOM,           /* allocation failed or an arena is exhausted */
    HP_ERR_IO,            /* file system error */
    HP_ERR_FORMAT,        /* malformed file or document (safetensors, JSON, YAML, ...) */
    HP_ERR_COMM,          /* communication backend failure */
    HP_ERR_TIMEOUT,       /* a collective or wait did not complete in time */
    HP_ERR_UNSUPPORTED,   /* valid request that this build does not implement */
    HP_ERR_STATE,         /* call made in the wrong state (e.g. twice, before init) */
    HP_ERR_NOT_FOUND,     /* a named item does not exist */
    HP_ERR_NUMERIC,       /* non-finite loss or norm */
    HP_STATUS_COUNT
} hp_status_t;

/* Short words for a status code ("invalid argument"). Never NULL. */
const char *hp_status_string(hp_status_t status);

/* Records a detailed message for the calling thread and returns `status`, so that library
 * code can write `return hp_error(HP_ERR_INVALID_ARG, "tensor '%s': ...", name);`.
 * Messages should name the input, what was expected, and a hint. */
hp_status_t hp_error(hp_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
hp_status_t hp_verror(hp_status_t status, const char *fmt, va_list ap);

/* Puts context in front of the current message and returns `status`:
 * `return hp_error_prefix(s, "config file '%s': ", path);` turns "line 3: bad key" into
 * "config file 'a.yaml': line 3: bad key". Use it instead of hp_error(s, "...: %s",
 * hp_last_error()) when a callee already recorded the reason. (hp_error is safe with
 * hp_last_error() as an argument too: it formats into a temporary first.) */
hp_status_t hp_error_prefix(hp_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The detailed message of the last hp_error() on this thread ("" if none). */
const char *hp_last_error(void);
void hp_clear_error(void);

/* Logging. Lines are prefixed "[rank R] " once hp_log_set_rank() was called. */
typedef enum hp_log_level { HP_LOG_DEBUG = 0, HP_LOG_INFO, HP_LOG_WARN, HP_LOG_ERROR } hp_log_level_t;
void hp_log_set_rank(int rank);
int hp_log_get_rank(void);              /* -1 before hp_log_set_rank */
void hp_log_set_level(hp_log_level_t level);
void hp_log(hp_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define HP_LOG_INFO_(...) hp_log(HP_LOG_INFO, __VA_ARGS__)

/* Always-on assert. On failure prints file:line and the message, then calls the abort hook
 * (default: abort(); the comm layer installs one that calls MPI_Abort). Never compiled out. */
typedef void (*hp_abort_hook_t)(const char *message, void *ctx);
void hp_set_abort_hook(hp_abort_hook_t hook, void *ctx);
_Noreturn void hp_abort(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define HP_ASSERT(cond)                                                          \
    do {                                                                         \
        if (__builtin_expect(!(cond), 0)) hp_abort(__FILE__, __LINE__, "assertion failed: %s", #cond); \
    } while (0)
#define HP_ASSERT_MSG(cond, ...)                                                 \
    do {                                                                         \
        if (__builtin_expect(!(cond), 0)) hp_abort(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

/* Propagate a failing status. */
#define HP_TRY(expr)                                                             \
    do {                                                                         \
        hp_status_t hp_try_status_ = (expr);                                     \
        if (hp_try_status_ != HP_OK) return hp_try_status_;                     \
    } while (0)

/* Seconds since an arbitrary fixed epoch, from the monotonic clock (CLOCK_MONOTONIC): for
 * durations and deadlines, never for wall-clock timestamps. */
double hp_clock_now_seconds(void);

/* Checked malloc/calloc for library code: on failure records a message naming the call
 * site and returns NULL (callers turn NULL into HP_ERR_OOM). */
void *hp_malloc_checked(size_t bytes, const char *file, int line);
void *hp_calloc_checked(size_t n, size_t size, const char *file, int line);
#define hp_malloc(bytes) hp_malloc_checked((bytes), __FILE__, __LINE__)
#define hp_calloc(n, size) hp_calloc_checked((n), (size), __FILE__, __LINE__)
/* 64-byte aligned allocation (free with hp_free_aligned). */
void *hp_aligned_alloc_checked(size_t bytes, const char *file, int line);
#define hp_aligned_alloc(bytes) hp_aligned_alloc_checked((bytes), __FILE__, __LINE__)
void hp_free_aligned(void *p);
/* Bytes of the aligned allocations alive now and at their peak (process-wide; what the library
 * holds in tensors, arenas and buffers, as the memory plan predicts it: docs/memory.md).
 * reset_peak: the peak restarts from the live bytes. */
void hp_memory_tracked(size_t *live, size_t *peak);
void hp_memory_tracked_reset_peak(void);

#ifdef __cplusplus
}
#endif
#endif
