/* Liveness across hosts (docs/multihost.md): the host name of every world rank (so that a
 * timeout names hosts, not only ranks), the heartbeat channel to the supervising launcher
 * (hp-train started with --nproc / --hostfile, src/comm/launch_run.c) and the report a rank
 * sends it before ending the job.
 *
 * The channel is UDP to HP_LAUNCH_ADDR ("ip:port", set by the launcher for every rank): the
 * watchdog thread sends "HPHB1 rank size pid host" every HP_HEARTBEAT_S, and the launcher
 * answers with the ranks it has not heard from for a while ("HPSL1 n rank:age_ms ..."). A
 * rank whose collective times out can then say which host went silent: with MPI alone it
 * only knows that its own call did not complete. UDP because a heartbeat must never block
 * the watchdog (a lost datagram is replaced a quarter second later) and because the
 * launcher must hear from ranks whose MPI connections are broken. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/comm-front.h"

#define HP_HOST_NAME_MAX 64   /* bytes per name in the gathered table (longer names are cut) */
#define HP_HEARTBEAT_S 0.25   /* also the watchdog's longest tick */
#define HP_SILENT_REPORT_S 1.0   /* a rank silent this long is reported by the launcher */

static char *g_hosts;            /* world size x HP_HOST_NAME_MAX */
static int g_world = 0;
static int g_sock = -1;          /* connected UDP socket to the launcher, or -1 */
static double g_last_beat = -1;
/* the launcher's latest answer: the silent ranks and how long (watchdog thread only) */
#define MAX_SILENT 64
static int g_n_silent = -1;      /* -1: no answer yet */
static int g_silent_rank[MAX_SILENT];
static double g_silent_age[MAX_SILENT];
static double g_silent_at;       /* when that answer came */

const char *hp_comm_host(int world_rank) {
    if (!g_hosts || world_rank < 0 || world_rank >= g_world) return "?";
    return g_hosts + (size_t)world_rank * HP_HOST_NAME_MAX;
}

hp_status_t hp_comm_health_init(const hp_comm_backend_t *be, void *world_ctx, int rank, int size) {
    g_world = size;
    g_hosts = hp_calloc((size_t)size, HP_HOST_NAME_MAX);
    if (!g_hosts) return hp_error(HP_ERR_OOM, "hp_comm_init: out of memory for the host name table");
    HP_TRY(be->host_names(world_ctx, g_hosts, HP_HOST_NAME_MAX));
    const char *addr = getenv("HP_LAUNCH_ADDR");
    if (!addr || !*addr) return HP_OK;
    char ip[64];
    int port = 0;
    const char *colon = strrchr(addr, ':');
    if (!colon || (size_t)(colon - addr) >= sizeof ip || sscanf(colon + 1, "%d", &port) != 1 || port <= 0 ||
        port > 65535)
        return hp_error(HP_ERR_INVALID_ARG, "HP_LAUNCH_ADDR='%s': expected IPv4:port of the launcher (set by "
                        "hp-train --nproc / --hostfile; unset it to run without one)", addr);
    memcpy(ip, addr, (size_t)(colon - addr));
    ip[colon - addr] = '\0';
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1)
        return hp_error(HP_ERR_INVALID_ARG, "HP_LAUNCH_ADDR='%s': '%s' is not an IPv4 address", addr, ip);
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
        /* no route to the launcher: run unsupervised rather than refuse to start */
        hp_log(HP_LOG_WARN, "hp_comm: cannot reach the launcher at %s (%s); no heartbeats", addr, strerror(errno));
        if (s >= 0) close(s);
        return HP_OK;
    }
    g_sock = s;
    (void)rank;
    return HP_OK;
}

void hp_comm_health_fini(void) {
    if (g_sock >= 0) close(g_sock);
    g_sock = -1;
    free(g_hosts);
    g_hosts = NULL;
    g_world = 0;
    g_n_silent = -1;
    g_last_beat = -1;
}

/* "HPSL1 n r:ms r:ms ..." */
static void parse_silent(const char *m, double now) {
    int n = 0, off = 0;
    if (sscanf(m, "HPSL1 %d%n", &n, &off) != 1 || n < 0) return;
    int k = 0;
    const char *p = m + off;
    for (int i = 0; i < n && k < MAX_SILENT; i++) {
        int r, used = 0;
        long ms;
        if (sscanf(p, " %d:%ld%n", &r, &ms, &used) != 2) break;
        p += used;
        g_silent_rank[k] = r;
        g_silent_age[k] = (double)ms * 1e-3;
        k++;
    }
    g_n_silent = k;
    g_silent_at = now;
}

void hp_comm_health_tick(double now) {
    if (g_sock < 0) return;
    char buf[512];
    ssize_t got;
    while ((got = recv(g_sock, buf, sizeof buf - 1, 0)) > 0) {
        buf[got] = '\0';
        parse_silent(buf, now);
    }
    if (g_last_beat >= 0 && now - g_last_beat < HP_HEARTBEAT_S) return;
    g_last_beat = now;
    int r = hp_log_get_rank();
    int n = snprintf(buf, sizeof buf, "HPHB1 %d %d %d %s", r, g_world, (int)getpid(), hp_comm_host(r));
    (void)!send(g_sock, buf, (size_t)n, MSG_DONTWAIT);
}

void hp_comm_health_report(const char *text) {
    if (g_sock < 0) return;
    char buf[1400];
    int r = hp_log_get_rank();
    int n = snprintf(buf, sizeof buf, "HPFL1 %d %s %s", r, hp_comm_host(r), text);
    if (n >= (int)sizeof buf) n = (int)sizeof buf - 1;
    for (int i = 0; i < 3; i++) (void)!send(g_sock, buf, (size_t)n, MSG_DONTWAIT);   /* UDP: say it thrice */
}

/* Appends "rank a, rank b on host X; rank c on host Y" for the world ranks in[n]. */
static void append_ranks_by_host(char *buf, size_t cap, const int *in, int n) {
    int done[MAX_SILENT] = {0};
    size_t l = strlen(buf);
    int first_host = 1;
    for (int i = 0; i < n && l < cap; i++) {
        if (done[i]) continue;
        const char *h = hp_comm_host(in[i]);
        l += (size_t)snprintf(buf + l, cap - l, "%s", first_host ? "" : "; ");
        first_host = 0;
        int cnt = 0;
        for (int j = i; j < n && l < cap; j++) {
            if (done[j] || strcmp(hp_comm_host(in[j]), h)) continue;
            done[j] = 1;
            l += (size_t)snprintf(buf + l, cap - l, "%s%d", cnt++ ? ", " : (n > 1 ? "ranks " : "rank "), in[j]);
        }
        if (l < cap) l += (size_t)snprintf(buf + l, cap - l, " on host %s", h);
    }
}

void hp_comm_health_describe(hp_comm_t comm, char *buf, size_t cap) {
    buf[0] = '\0';
    if (!comm || !g_hosts || comm->size < 1) return;
    /* the distinct hosts of the communicator's members, in rank order (at most 8 named) */
    int nh = 0;
    const char *hosts[8] = {"?"};
    int more = 0;
    for (int i = 0; i < comm->size; i++) {
        int wr = comm->members ? comm->members[i] : i;
        const char *h = hp_comm_host(wr);
        int seen = 0;
        for (int k = 0; k < nh; k++) seen |= !strcmp(hosts[k], h);
        if (seen) continue;
        if (nh < 8) hosts[nh++] = h;
        else more = 1;
    }
    size_t l = (size_t)snprintf(buf, cap, "%s %s", nh > 1 ? "on hosts" : "on host", hosts[0]);
    for (int k = 1; k < nh && l < cap; k++) l += (size_t)snprintf(buf + l, cap - l, ", %s", hosts[k]);
    if (more && l < cap) snprintf(buf + l, cap - l, ", ...");
}

int hp_comm_health_lost(hp_comm_t comm, double now, char *buf, size_t cap) {
    buf[0] = '\0';
    /* an answer older than a few heartbeats is stale: the launcher itself may be gone */
    if (g_n_silent <= 0 || now - g_silent_at > 8 * HP_HEARTBEAT_S) return 0;
    int in[MAX_SILENT], n = 0;
    double age = 0;
    for (int i = 0; i < g_n_silent; i++) {
        int r = g_silent_rank[i];
        int member = !comm || !comm->members;
        for (int k = 0; comm && comm->members && k < comm->size && !member; k++) member = comm->members[k] == r;
        if (!member || g_silent_age[i] < HP_SILENT_REPORT_S) continue;
        in[n++] = r;
        if (g_silent_age[i] > age) age = g_silent_age[i];
    }
    if (!n) return 0;
    snprintf(buf, cap, "no heartbeat for %.1f s from ", age);
    append_ranks_by_host(buf, cap, in, n);
    return 1;
}
