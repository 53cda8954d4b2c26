/* Files and folders as the library reads and writes them: a whole file into memory (with a
 * size cap), an atomic replace of a file (temporary + fsync + rename + fsync of the folder),
 * folders with their parents, and the steps a directory commit needs. Every failure returns
 * a status whose message names the path. */
#ifndef HYPERPARALLEL_FILE_H
#define HYPERPARALLEL_FILE_H

#include <stddef.h>
#include <stdio.h>

#include "hyperparallel/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reads the file at `path` whole into *data (malloc'ed, a NUL after the last byte, so text
 * parsers may treat it as a string) and its length into *len (the NUL not counted). `what`
 * names the file in messages ("schedule CSV", "tokenizer file"). A file of more than
 * max_bytes fails before it is read. HP_ERR_IO: it cannot be opened (a missing file too, as
 * every reader of the library reports it) or read (a folder: "Is a directory"); HP_ERR_FORMAT: larger than max_bytes. On failure *data is
 * NULL. Pipes and character devices are read to their end. */
hp_status_t hp_file_read_all(const char *path, const char *what, size_t max_bytes, char **data, size_t *len);

/* The same from an open stream (stdin), to its end; `name` stands for the stream's path in
 * messages. The stream stays open. */
hp_status_t hp_file_read_stream(FILE *f, const char *name, const char *what, size_t max_bytes, char **data,
                                size_t *len);

/* Replaces `path` with `len` bytes atomically: they go to a new temporary file beside it
 * (path.tmpXXXXXX, mode 0644), which is flushed, fsync'ed, renamed over `path`, and the folder
 * is fsync'ed; after a crash `path` holds the old bytes or the new ones, never a mix. */
hp_status_t hp_file_write_atomic(const char *path, const void *data, size_t len);

/* The same for a writer that streams its bytes: hp_file_atomic_begin opens the temporary
 * (*f; *tmp is its malloc'ed name); the caller writes to *f; hp_file_atomic_commit checks the
 * stream's error flag, flushes, fsyncs, closes, renames it over `path` and fsyncs the folder;
 * hp_file_atomic_cancel closes and removes it. Both end with *tmp freed, and a failed commit
 * also removes the temporary, so `path` is never touched by a failed write. */
hp_status_t hp_file_atomic_begin(const char *path, FILE **f, char **tmp);
hp_status_t hp_file_atomic_commit(const char *path, FILE *f, char *tmp);
void hp_file_atomic_cancel(FILE *f, char *tmp);

/* Creates the folder `path` and its missing parents (mode 0755); an existing folder is fine,
 * an existing file of that name is an error ("'%s' exists and is not a folder"). */
hp_status_t hp_file_mkdirs(const char *path);

/* The folder that holds `path` into out: "a/b/c" -> "a/b", "c" -> ".", "/c" -> "/" (trailing
 * slashes ignored). Returns out. */
char *hp_file_parent(const char *path, char *out, size_t n);

/* fsync of a file or a folder by name (a folder's fsync makes a rename in it durable). */
hp_status_t hp_file_fsync(const char *path);

/* Removes a file, or a folder with everything in it; a missing path is fine. Symbolic links
 * are removed, never followed. */
hp_status_t hp_file_rmtree(const char *path);

/* Renames the complete folder `tmp` to `dir`: an existing `dir` is moved aside first
 * (dir.old-<pid>; put back if the rename fails) and removed once the new one is in, and the
 * parent folder is fsync'ed, so a crash leaves the old folder or the new one under `dir`. */
hp_status_t hp_file_replace_dir(const char *tmp, const char *dir);

/* Output paths checked before a long run writes them: the folder (created with its parents)
 * or a file's folder must take a new file, proven by creating and removing
 * .hp-write-probe.<pid>.<tag> in it (`tag` keeps processes sharing the folder apart, e.g.
 * their rank). A file path that is a folder fails too. Messages name the path and the
 * problem ("exists and is not a folder", "cannot create folder", "cannot create a file in");
 * callers add which setting named it. */
hp_status_t hp_file_probe_writable_dir(const char *dir, int tag);
hp_status_t hp_file_probe_writable_file(const char *path, int tag);

#ifdef __cplusplus
}
#endif
#endif
