/* Whole-file reads, atomic file replacement, folders with parents, recursive removal and the
 * directory commit: the file-system steps every reader and writer of the library shares
 * (checkpoints, safetensors, configs, tokenizers, schedules, the trainer's output probe). */
#include "hyperparallel/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- reading -------------------------------------------------------------------------- */

static hp_status_t too_large(const char *name, const char *what, size_t max_bytes) {
    return hp_error(HP_ERR_FORMAT, "%s: larger than %zu bytes, the most a %s may have; hint: check the path", name,
                    max_bytes, what);
}

/* Reads f to its end; `hint` = the size fstat saw (0 for a pipe): one allocation with room
 * for the NUL and one byte more, so the read that finds the end needs no second one. */
static hp_status_t read_to_end(FILE *f, const char *name, const char *what, size_t max_bytes, size_t hint,
                               char **data, size_t *len) {
    size_t cap = hint ? hint + 2 : 65536, n = 0;
    char *buf = malloc(cap);
    if (!buf) return hp_error(HP_ERR_OOM, "%s: cannot allocate %zu bytes to read the %s", name, cap, what);
    for (;;) {
        if (n + 1 == cap) {   // full: a pipe, or a file that grew since fstat
            if (n > max_bytes) {
                free(buf);
                return too_large(name, what, max_bytes);
            }
            size_t ncap = cap <= SIZE_MAX / 2 ? cap * 2 : SIZE_MAX;
            if (max_bytes < SIZE_MAX - 2 && ncap > max_bytes + 2) ncap = max_bytes + 2;   // one byte past the cap
            char *p = realloc(buf, ncap);
            if (!p) {
                free(buf);
                return hp_error(HP_ERR_OOM, "%s: cannot allocate %zu bytes to read the %s", name, ncap, what);
            }
            buf = p;
            cap = ncap;
        }
        size_t k = fread(buf + n, 1, cap - 1 - n, f);
        n += k;
        if (k == 0) break;
    }
    if (ferror(f)) {
        int e = errno;
        free(buf);
        return hp_error(HP_ERR_IO, "%s: cannot read the %s: %s", name, what, strerror(e));
    }
    if (n > max_bytes) {
        free(buf);
        return too_large(name, what, max_bytes);
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return HP_OK;
}

hp_status_t hp_file_read_stream(FILE *f, const char *name, const char *what, size_t max_bytes, char **data,
                                size_t *len) {
    if (!f || !data || !len) return hp_error(HP_ERR_INVALID_ARG, "hp_file_read_stream: NULL argument");
    *data = NULL;
    *len = 0;
    return read_to_end(f, name ? name : "(stream)", what, max_bytes, 0, data, len);
}

hp_status_t hp_file_read_all(const char *path, const char *what, size_t max_bytes, char **data, size_t *len) {
    if (!path || !what || !data || !len) return hp_error(HP_ERR_INVALID_ARG, "hp_file_read_all: NULL argument");
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return hp_error(HP_ERR_IO, "%s: cannot open the %s: %s", path, what, strerror(errno));
    struct stat sb;
    hp_status_t s = HP_OK;
    size_t hint = 0;
    if (fstat(fileno(f), &sb) != 0) {
        s = hp_error(HP_ERR_IO, "%s: cannot stat the %s: %s", path, what, strerror(errno));
    } else if (S_ISDIR(sb.st_mode)) {
        s = hp_error(HP_ERR_IO, "%s: cannot read the %s: %s", path, what, strerror(EISDIR));
    } else if (S_ISREG(sb.st_mode)) {
        if ((unsigned long long)sb.st_size > max_bytes) s = too_large(path, what, max_bytes);
        hint = (size_t)sb.st_size;
    }
    if (s == HP_OK) s = read_to_end(f, path, what, max_bytes, hint, data, len);
    fclose(f);
    return s;
}

/* ---- atomic writes -------------------------------------------------------------------- */

hp_status_t hp_file_fsync(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return hp_error(HP_ERR_IO, "%s: cannot open for fsync: %s", path, strerror(errno));
    int r = fsync(fd);
    int e = errno;
    close(fd);
    if (r != 0) return hp_error(HP_ERR_IO, "%s: fsync failed: %s", path, strerror(e));
    return HP_OK;
}

char *hp_file_parent(const char *path, char *out, size_t n) {
    snprintf(out, n, "%s", path);
    size_t l = strlen(out);
    while (l > 1 && out[l - 1] == '/') out[--l] = '\0';
    char *slash = strrchr(out, '/');
    if (!slash) snprintf(out, n, ".");
    else if (slash == out) out[1] = '\0';
    else *slash = '\0';
    return out;
}

static hp_status_t fsync_parent(const char *path) {
    char parent[4096];
    return hp_file_fsync(hp_file_parent(path, parent, sizeof parent));
}

hp_status_t hp_file_atomic_begin(const char *path, FILE **f, char **tmp) {
    if (!path || !f || !tmp) return hp_error(HP_ERR_INVALID_ARG, "hp_file_atomic_begin: NULL argument");
    *f = NULL;
    size_t plen = strlen(path) + 16;
    *tmp = malloc(plen);
    if (!*tmp) return hp_error(HP_ERR_OOM, "%s: no memory for the temporary file's name", path);
    snprintf(*tmp, plen, "%s.tmpXXXXXX", path);
    int fd = mkstemp(*tmp);
    if (fd < 0) {
        hp_status_t s = hp_error(HP_ERR_IO, "%s: cannot create a temporary file beside it: %s", path, strerror(errno));
        free(*tmp);
        *tmp = NULL;
        return s;
    }
    (void)fchmod(fd, 0644);   // mkstemp makes 0600; the result is an ordinary output file
    *f = fdopen(fd, "wb");
    if (!*f) {
        hp_status_t s = hp_error(HP_ERR_IO, "%s: fdopen failed: %s", *tmp, strerror(errno));
        close(fd);
        unlink(*tmp);
        free(*tmp);
        *tmp = NULL;
        return s;
    }
    return HP_OK;
}

void hp_file_atomic_cancel(FILE *f, char *tmp) {
    if (f) fclose(f);
    if (tmp) unlink(tmp);
    free(tmp);
}

hp_status_t hp_file_atomic_commit(const char *path, FILE *f, char *tmp) {
    hp_status_t s = HP_OK;
    if (ferror(f) || fflush(f) != 0)
        s = hp_error(HP_ERR_IO, "%s: write failed: %s (disk full?)", tmp, strerror(errno));
    else if (fsync(fileno(f)) != 0)
        s = hp_error(HP_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    if (fclose(f) != 0 && s == HP_OK) s = hp_error(HP_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    if (s == HP_OK && rename(tmp, path) != 0)
        s = hp_error(HP_ERR_IO, "%s: rename from %s failed: %s", path, tmp, strerror(errno));
    if (s != HP_OK) unlink(tmp);
    free(tmp);
    return s == HP_OK ? fsync_parent(path) : s;
}

hp_status_t hp_file_write_atomic(const char *path, const void *data, size_t len) {
    FILE *f;
    char *tmp;
    HP_TRY(hp_file_atomic_begin(path, &f, &tmp));
    if (len && fwrite(data, 1, len, f) != len) {
        hp_status_t s = hp_error(HP_ERR_IO, "%s: write failed: %s (disk full?)", tmp, strerror(errno));
        hp_file_atomic_cancel(f, tmp);
        return s;
    }
    return hp_file_atomic_commit(path, f, tmp);
}

/* ---- folders -------------------------------------------------------------------------- */

hp_status_t hp_file_mkdirs(const char *path) {
    char buf[4096];
    size_t n = path ? strlen(path) : 0;
    if (n == 0 || n >= sizeof buf)
        return hp_error(HP_ERR_INVALID_ARG, "folder path '%s' is empty or longer than %zu bytes", path ? path : "",
                        sizeof buf - 1);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return hp_error(HP_ERR_IO, "cannot create folder '%s': %s", buf, strerror(errno));
        buf[i] = c;
    }
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return hp_error(HP_ERR_IO, "'%s' exists and is not a folder", path);
    return HP_OK;
}

hp_status_t hp_file_rmtree(const char *path) {
    DIR *d = opendir(path);
    if (!d) {
        if (errno == ENOENT) return HP_OK;
        if (unlink(path) == 0) return HP_OK;
        return hp_error(HP_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
    }
    struct dirent *e;
    hp_status_t s = HP_OK;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        struct stat sb;
        if (lstat(sub, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            hp_status_t r = hp_file_rmtree(sub);
            if (s == HP_OK) s = r;
        } else if (unlink(sub) != 0 && s == HP_OK) {
            s = hp_error(HP_ERR_IO, "cannot remove %s: %s", sub, strerror(errno));
        }
    }
    closedir(d);
    if (rmdir(path) != 0 && s == HP_OK) s = hp_error(HP_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
    return s;
}

hp_status_t hp_file_replace_dir(const char *tmp, const char *dir) {
    struct stat sb;
    char old[4200] = "";
    if (stat(dir, &sb) == 0) {
        snprintf(old, sizeof old, "%s.old-%ld", dir, (long)getpid());
        (void)hp_file_rmtree(old);   // a leftover of a crashed earlier replace by a process of this id
        if (rename(dir, old) != 0)
            return hp_error(HP_ERR_IO, "cannot move the existing %s aside: %s", dir, strerror(errno));
    }
    if (rename(tmp, dir) != 0) {
        hp_status_t s = hp_error(HP_ERR_IO, "cannot rename %s to %s: %s", tmp, dir, strerror(errno));
        if (old[0]) (void)rename(old, dir);
        return s;
    }
    HP_TRY(fsync_parent(dir));
    return old[0] ? hp_file_rmtree(old) : HP_OK;
}

/* ---- output probes -------------------------------------------------------------------- */

hp_status_t hp_file_probe_writable_dir(const char *dir, int tag) {
    struct stat sb;
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) return hp_error(HP_ERR_IO, "'%s' exists and is not a folder", dir);
    HP_TRY(hp_file_mkdirs(dir));
    char probe[4096 + 64];
    snprintf(probe, sizeof probe, "%s/.hp-write-probe.%ld.%d", dir, (long)getpid(), tag);
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return hp_error(HP_ERR_IO, "cannot create a file in '%s' (%s)", dir, strerror(errno));
    close(fd);
    unlink(probe);
    return HP_OK;
}

hp_status_t hp_file_probe_writable_file(const char *path, int tag) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return hp_error(HP_ERR_IO, "'%s' is a folder; expected a file path", path);
    char dir[4096];
    return hp_file_probe_writable_dir(hp_file_parent(path, dir, sizeof dir), tag);
}
