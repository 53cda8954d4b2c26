/* The launcher's plain parts: whether this process runs under one, and hostfiles (Open MPI's
 * format, as mpirun users write them). The supervisor is launch_run.c. */
#define _GNU_SOURCE
#include "hyperparallel/launch.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int hp_launch_under_launcher(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", NULL};
    for (int i = 0; vars[i]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

hp_status_t hp_launch_hostfile_read(const char *path, hp_launch_host_t *hosts, int cap, int *n) {
    *n = 0;
    FILE *f = fopen(path, "r");
    if (!f) return hp_error(HP_ERR_IO, "hostfile '%s': %s", path, strerror(errno));
    char line[1024];
    int ln = 0;
    hp_status_t st = HP_OK;
    while (st == HP_OK && fgets(line, sizeof line, f)) {
        ln++;
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char *save = NULL, *name = strtok_r(line, " \t\r\n", &save);
        if (!name) continue;
        if (strlen(name) >= HP_LAUNCH_HOST_MAX) {
            st = hp_error(HP_ERR_INVALID_ARG, "hostfile '%s': line %d: host name of %zu bytes; at most %d", path, ln,
                          strlen(name), HP_LAUNCH_HOST_MAX - 1);
            break;
        }
        int slots = 1;
        for (char *kv = strtok_r(NULL, " \t\r\n", &save); kv; kv = strtok_r(NULL, " \t\r\n", &save)) {
            char *end = NULL;
            if (!strncmp(kv, "slots=", 6)) {
                long v = strtol(kv + 6, &end, 10);
                if (end == kv + 6 || *end || v < 1 || v > 1 << 20) {
                    st = hp_error(HP_ERR_INVALID_ARG, "hostfile '%s': line %d: '%s': expected slots=N with N >= 1",
                                  path, ln, kv);
                    break;
                }
                slots = (int)v;
            } else if (!strncmp(kv, "max_slots=", 10) || !strncmp(kv, "max-slots=", 10)) {
                long v = strtol(kv + 10, &end, 10);
                if (end == kv + 10 || *end || v < 0) {
                    st = hp_error(HP_ERR_INVALID_ARG, "hostfile '%s': line %d: '%s': expected max_slots=N", path, ln, kv);
                    break;
                }
            } else {
                st = hp_error(HP_ERR_INVALID_ARG, "hostfile '%s': line %d: '%s': expected 'slots=N' or 'max_slots=N' "
                              "after the host name (Open MPI's hostfile format)", path, ln, kv);
                break;
            }
        }
        if (st != HP_OK) break;
        int found = -1;
        for (int i = 0; i < *n; i++)
            if (!strcmp(hosts[i].name, name)) found = i;
        if (found >= 0) {
            hosts[found].slots += slots;
            continue;
        }
        if (*n >= cap) {
            st = hp_error(HP_ERR_INVALID_ARG, "hostfile '%s': more than %d hosts", path, cap);
            break;
        }
        snprintf(hosts[*n].name, sizeof hosts[*n].name, "%s", name);
        hosts[*n].slots = slots;
        (*n)++;
    }
    fclose(f);
    if (st == HP_OK && *n == 0)
        st = hp_error(HP_ERR_INVALID_ARG, "hostfile '%s' names no host; expected lines like 'node1 slots=4'", path);
    return st;
}

hp_status_t hp_launch_hostfile_write(const char *path, const hp_launch_host_t *hosts, int n) {
    FILE *f = fopen(path, "w");
    if (!f) return hp_error(HP_ERR_IO, "cannot write hostfile '%s': %s", path, strerror(errno));
    for (int i = 0; i < n; i++) fprintf(f, "%s slots=%d\n", hosts[i].name, hosts[i].slots);
    if (fclose(f) != 0) return hp_error(HP_ERR_IO, "cannot write hostfile '%s': %s", path, strerror(errno));
    return HP_OK;
}
