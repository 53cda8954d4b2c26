/* The supervising launcher (launch.h, docs/multihost.md): runs mpirun as a child in its own
 * process group and watches three things at once:
 *   - the ranks' heartbeats (UDP, comm_health.c): who is alive, on which host, with which pid;
 *     it answers each heartbeat with the ranks it has not heard from, so that a rank whose
 *     collective times out can name the silent host;
 *   - the ranks' failure reports (a timeout, a fatal error) and mpirun's own messages (a rank
 *     that died, a daemon that was lost), relayed to stderr line by line;
 *   - mpirun itself.
 * At the first sign of failure it looks at the silent hosts (through mpirun's rsh agent: are
 * the ranks there stopped, running, gone?) and gives mpirun a grace period to end the job; then
 * it kills mpirun's process group and sweeps every host for the job's processes (found by the
 * HP_LAUNCH_TAG in their environment, or the orted of the job by its job id), so that a job
 * ends on every surviving host within the comm timeout plus the grace, and nothing is left.
 * Why not leave it to mpirun: with a link cut, Open MPI 4.1's mpirun waits for the lost
 * host's daemon forever ("abort is already in progress"), and that daemon stays. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hyperparallel/launch.h"

#define SILENT_REPLY_S 1.0       /* ranks silent this long are listed in the answer to a heartbeat */
#define LOST_SILENCE_S 1.5       /* silent this long before the failure: lost (6 heartbeats) */
#define AGENT_TIMEOUT_S 10.0     /* a probe or sweep through the rsh agent */
#define START_EXTRA_S 60.0       /* every rank must have sent a heartbeat by comm timeout + this */

typedef struct rank_info {
    int seen;
    double last;                 /* launcher clock */
    int pid;
    char host[HP_LAUNCH_HOST_MAX];
    char state;                  /* from the probe: 'T' stopped, 'R'/'S'/'D' running, 0 gone/unknown */
    int died_signal;             /* mpirun said: exited on this signal */
} rank_info_t;

typedef struct sup {
    const hp_launch_options_t *o;
    hp_launch_result_t *res;
    int nproc;
    hp_launch_host_t hosts[HP_LAUNCH_MAX_HOSTS];
    int n_hosts;
    char agent[512];             /* the rsh agent's command line (first alternative) */
    char tag[48];
    char jobid[32];              /* mpirun's job family, from --report-uri, for the orted sweep */
    char uri_path[160];
    rank_info_t *ranks;
    int udp;
    double t0, t_fail, comm_timeout, grace;
    char lost_daemon_host[HP_LAUNCH_HOST_MAX];
    char peer_host[HP_LAUNCH_HOST_MAX];    /* "Peer host: X": a rank lost its MPI connection to X */
    double max_last;                       /* the latest heartbeat of any rank */
    int probed;
    int host_procs[HP_LAUNCH_MAX_HOSTS];   /* the job's processes on each host at the probe */
    int local_procs;                       /* ... here, for a job without a hostfile */
} sup_t;

/* The hostfile's index of a host name as a rank reports it (MPI_Get_processor_name: "node1"
 * for "node1.cluster" or the reverse), or -1. */
static int host_of(const sup_t *s, const char *name) {
    for (int i = 0; i < s->n_hosts; i++)
        if (!strcmp(s->hosts[i].name, name)) return i;
    size_t ln = strcspn(name, ".");
    for (int i = 0; i < s->n_hosts; i++)
        if (strcspn(s->hosts[i].name, ".") == ln && !strncmp(s->hosts[i].name, name, ln)) return i;
    return -1;
}

static volatile sig_atomic_t g_signal, g_signal_count;
static void on_signal(int sig) {
    g_signal = sig;
    g_signal_count++;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double env_seconds(const char *name, double dflt) {
    const char *e = getenv(name);
    if (!e || !*e) return dflt;
    char *end = NULL;
    double v = strtod(e, &end);
    return (end != e && !*end && v > 0 && isfinite(v)) ? v : dflt;
}

static void fail_at(sup_t *s, const char *why) {
    if (s->t_fail >= 0) return;
    s->t_fail = now_s();
    s->res->failed = 1;
    if (why && !s->res->first_report[0]) snprintf(s->res->first_report, sizeof s->res->first_report, "%s", why);
}

/* ---- addresses -------------------------------------------------------------------------- */

/* The local IPv4 address inside a.b.c.d/n, or "" */
static void addr_in_cidr(const char *cidr, char *out, size_t cap) {
    out[0] = '\0';
    char net[64];
    int bits = 32;
    const char *slash = strchr(cidr, '/');
    size_t l = slash ? (size_t)(slash - cidr) : strlen(cidr);
    if (l >= sizeof net) return;
    memcpy(net, cidr, l);
    net[l] = '\0';
    if (slash) bits = atoi(slash + 1);
    struct in_addr na;
    if (inet_pton(AF_INET, net, &na) != 1 || bits < 0 || bits > 32) return;
    uint32_t mask = bits ? htonl(~0u << (32 - bits)) : 0;
    struct ifaddrs *ifs = NULL, *i;
    if (getifaddrs(&ifs) != 0) return;
    for (i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        struct in_addr a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr;
        if ((a.s_addr & mask) == (na.s_addr & mask)) {
            inet_ntop(AF_INET, &a, out, (socklen_t)cap);
            break;
        }
    }
    freeifaddrs(ifs);
}

/* The address the ranks reach the launcher at: HP_LAUNCH_HOST; else an address of this
 * machine inside the network given to mpirun (oob/btl_tcp_if_include a.b.c.d/n); else the one
 * this machine would use toward the first host; else 127.0.0.1 (every rank here). */
static void pick_address(sup_t *s, char *out, size_t cap) {
    const char *e = getenv("HP_LAUNCH_HOST");
    if (e && *e) {
        snprintf(out, cap, "%s", e);
        return;
    }
    for (int i = 0; i < s->o->n_mca; i++)
        if ((!strcmp(s->o->mca[i][0], "oob_tcp_if_include") || !strcmp(s->o->mca[i][0], "btl_tcp_if_include")) &&
            strchr(s->o->mca[i][1], '/')) {
            char first[128];
            snprintf(first, sizeof first, "%s", s->o->mca[i][1]);
            first[strcspn(first, ",")] = '\0';
            addr_in_cidr(first, out, cap);
            if (out[0]) return;
        }
    snprintf(out, cap, "127.0.0.1");
    if (!s->o->hostfile) return;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *ai = NULL;
    for (int h = 0; h < s->n_hosts; h++) {
        if (getaddrinfo(s->hosts[h].name, "9", &hints, &ai) != 0 || !ai) continue;
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in me;
        socklen_t ml = sizeof me;
        if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 && getsockname(fd, (struct sockaddr *)&me, &ml) == 0 &&
            me.sin_addr.s_addr != htonl(INADDR_LOOPBACK)) {
            inet_ntop(AF_INET, &me.sin_addr, out, (socklen_t)cap);
            close(fd);
            freeaddrinfo(ai);
            return;
        }
        if (fd >= 0) close(fd);
        freeaddrinfo(ai);
    }
}

/* ---- running small scripts on a host ----------------------------------------------------- */

/* Runs `sh -c script` on `host` (NULL: here) through the rsh agent, its stdout into out;
 * ends it after AGENT_TIMEOUT_S (an unreachable host). */
static void run_on_host(sup_t *s, const char *host, const char *script, char *out, size_t cap) {
    out[0] = '\0';
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) return;
    char *argv[40];
    int k = 0;
    char agent[512];
    snprintf(agent, sizeof agent, "%s", s->agent);
    if (host) {
        for (char *save = NULL, *w = strtok_r(agent, " \t", &save); w && k < 30; w = strtok_r(NULL, " \t", &save))
            argv[k++] = w;
        argv[k++] = (char *)host;
        argv[k++] = (char *)script;
    } else {
        argv[k++] = "sh";
        argv[k++] = "-c";
        argv[k++] = (char *)script;
    }
    argv[k] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        int devnull = open("/dev/null", O_RDWR);
        if (devnull >= 0) dup2(devnull, 0), dup2(devnull, 2);
        setpgid(0, 0);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(pfd[1]);
    if (pid < 0) {
        close(pfd[0]);
        return;
    }
    size_t len = 0;
    double end = now_s() + AGENT_TIMEOUT_S;
    for (;;) {
        int ms = (int)((end - now_s()) * 1000);
        if (ms <= 0) break;
        struct pollfd p = {pfd[0], POLLIN, 0};
        if (poll(&p, 1, ms) <= 0) continue;
        ssize_t r = read(pfd[0], out + len, cap - 1 - len);
        if (r <= 0) break;
        len += (size_t)r;
        if (len + 1 >= cap) break;
    }
    out[len] = '\0';
    close(pfd[0]);
    if (waitpid(pid, NULL, WNOHANG) == 0) {
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
}

/* The job's processes on a host: those with HP_LAUNCH_TAG=tag in their environment (ranks,
 * and daemons started by an agent that passes the environment), and the orted of mpirun's
 * job id (ssh passes no environment). probe: print "P pid rank state"; sweep: SIGKILL each
 * and print "K pid". */
static void job_script(sup_t *s, int sweep, char *out, size_t cap) {
    /* one grep over every process's environment (GNU grep: -z reads NUL-separated entries) */
    snprintf(out, cap,
             "me=$$; pids=$(grep -l -z -x 'HP_LAUNCH_TAG=%s' /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); "
             "job='%s'; if [ -n \"$job\" ]; then "
             "for f in $(grep -l -z -x \"$job\" /proc/[0-9]*/cmdline 2>/dev/null); do p=$(echo $f | cut -d/ -f3); "
             "[ \"$(cat /proc/$p/comm 2>/dev/null)\" = orted ] && pids=\"$pids $p\"; done; fi; "
             "for p in $pids; do [ \"$p\" = \"$me\" ] && continue; %s done; true",
             s->tag, s->jobid,
             sweep ? "kill -9 $p 2>/dev/null && echo K $p;"
                   /* a probe counts what runs on this host: where hosts share a kernel (the test
                    * rig's network namespaces), the processes in this shell's network namespace */
                   : "[ \"$(readlink /proc/$p/ns/net)\" = \"$(readlink /proc/$me/ns/net)\" ] || continue; "
                     "r=$(grep -a -z '^OMPI_COMM_WORLD_RANK=' /proc/$p/environ 2>/dev/null | tr -d '\\000' | cut -d= -f2); "
                     "st=$(cut -d')' -f2 /proc/$p/stat 2>/dev/null | cut -d' ' -f2); echo P $p ${r:--1} ${st:-X};");
}

/* Probes every host once, at the first sign of failure: which of the job's ranks are still
 * there, and are they stopped? (A host whose processes are all gone died; a stopped rank is
 * a frozen host; a rank that runs but sends no heartbeat is cut off.) */
static void probe(sup_t *s) {
    if (s->probed) return;
    s->probed = 1;
    char script[2048], out[8192];
    job_script(s, 0, script, sizeof script);
    for (int h = s->o->hostfile ? 0 : -1; h < (s->o->hostfile ? s->n_hosts : 0); h++) {
        run_on_host(s, h < 0 ? NULL : s->hosts[h].name, script, out, sizeof out);
        for (char *save = NULL, *l = strtok_r(out, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
            int pid, rank;
            char st = 0;
            if (sscanf(l, "P %d %d %c", &pid, &rank, &st) != 3) continue;
            if (h >= 0) s->host_procs[h]++;
            else s->local_procs++;
            if (rank >= 0 && rank < s->nproc) s->ranks[rank].state = st;
        }
    }
}

static int sweep(sup_t *s) {
    char script[2048], out[8192];
    job_script(s, 1, script, sizeof script);
    int killed = 0;
    for (int h = -1; h < (s->o->hostfile ? s->n_hosts : 0); h++) {
        run_on_host(s, h < 0 ? NULL : s->hosts[h].name, script, out, sizeof out);
        for (char *p = out; (p = strstr(p, "K ")) != NULL; p += 2) killed++;
    }
    return killed;
}

/* ---- the messages ------------------------------------------------------------------------- */

static void on_stderr_line(sup_t *s, const char *line) {
    int rank, pid, sig;
    char node[HP_LAUNCH_HOST_MAX];
    const char *p = strstr(line, "process rank ");
    if (p && sscanf(p, "process rank %d with PID %d on node %127s exited on signal %d", &rank, &pid, node, &sig) == 4) {
        if (rank >= 0 && rank < s->nproc) {
            s->ranks[rank].died_signal = sig;
            if (!s->ranks[rank].host[0]) snprintf(s->ranks[rank].host, sizeof s->ranks[rank].host, "%s", node);
        }
        char why[256];
        snprintf(why, sizeof why, "rank %d on %s died from signal %d", rank, node, sig);
        fail_at(s, why);
    }
    p = strstr(line, "Remote daemon: ");
    if (p) {
        const char *on = strstr(p, " on node ");
        if (on && sscanf(on, " on node %127s", node) == 1) {
            snprintf(s->lost_daemon_host, sizeof s->lost_daemon_host, "%s", node);
            char why[256];
            snprintf(why, sizeof why, "mpirun lost its daemon on host %s", node);
            fail_at(s, why);
        }
    }
    p = strstr(line, "Peer host:");
    if (p && !s->peer_host[0] && sscanf(p, "Peer host: %127s", node) == 1)
        snprintf(s->peer_host, sizeof s->peer_host, "%s", node);
    if (strstr(line, "hp_comm: timeout:") || strstr(line, "hp_comm: fatal error") ||
        strstr(line, "peer process has unexpectedly disconnected") ||
        strstr(line, "unable to reliably start one or more daemons"))
        fail_at(s, NULL);
}

static void on_datagram(sup_t *s, char *m, const struct sockaddr_in *from, socklen_t fl, double now) {
    int rank, size, pid, used = 0;
    char host[HP_LAUNCH_HOST_MAX];
    if (sscanf(m, "HPHB1 %d %d %d %127s", &rank, &size, &pid, host) == 4) {
        if (rank < 0 || rank >= s->nproc) return;
        rank_info_t *ri = &s->ranks[rank];
        if (!ri->seen) s->res->n_ranks_seen++;
        ri->seen = 1;
        ri->last = now;
        if (now > s->max_last) s->max_last = now;
        ri->pid = pid;
        snprintf(ri->host, sizeof ri->host, "%s", host);
        char reply[1024];
        int n = 0, len = 0;
        char body[1000] = "";
        for (int r = 0; r < s->nproc && len < (int)sizeof body - 24; r++)
            if (s->ranks[r].seen && now - s->ranks[r].last >= SILENT_REPLY_S) {
                len += snprintf(body + len, sizeof body - (size_t)len, " %d:%ld", r,
                                (long)((now - s->ranks[r].last) * 1000));
                n++;
            }
        int rl = snprintf(reply, sizeof reply, "HPSL1 %d%s", n, body);
        (void)!sendto(s->udp, reply, (size_t)rl, MSG_DONTWAIT, (const struct sockaddr *)from, fl);
        return;
    }
    if (sscanf(m, "HPFL1 %d %127s %n", &rank, host, &used) >= 2 && used > 0) {
        char why[1024];
        snprintf(why, sizeof why, "rank %d on %s: %s", rank, host, m + used);
        fail_at(s, why);
    }
}

/* Whether rank r was lost: it died (mpirun says), it was stopped at the probe, it had been
 * silent for LOST_SILENCE_S when the failure showed or stopped beating that long before the
 * last rank that beat, or every rank of its host was gone at the probe while another host's
 * were there. */
static int is_lost(const sup_t *s, int r, double t_ref) {
    const rank_info_t *ri = &s->ranks[r];
    if (ri->died_signal) return 1;
    if (s->probed && (ri->state == 'T' || ri->state == 't')) return 1;
    if (ri->seen && (t_ref - ri->last > LOST_SILENCE_S || s->max_last - ri->last > LOST_SILENCE_S)) return 1;
    if (!s->probed || ri->state || !ri->seen || !s->o->hostfile) return 0;
    int h = host_of(s, ri->host), elsewhere = 0;
    for (int k = 0; k < s->n_hosts; k++) elsewhere += k != h && s->host_procs[k] > 0;
    return h >= 0 && s->host_procs[h] == 0 && elsewhere;
}

/* "lost host h1 (ranks 2, 3): stopped (SIGSTOP: the host hangs); no heartbeat for 4.0 s" for
 * every host with a lost rank. */
static void summarize(sup_t *s, double t_ref, double t_end) {
    hp_launch_result_t *res = s->res;
    size_t l = 0;
    res->lost[0] = '\0';
    char *lost = calloc((size_t)s->nproc, 1), *done = calloc((size_t)s->nproc, 1);
    if (!lost || !done) {
        free(lost);
        free(done);
        return;
    }
    for (int r = 0; r < s->nproc; r++) lost[r] = (char)is_lost(s, r, t_ref);
    for (int r = 0; r < s->nproc; r++) {
        rank_info_t *ri = &s->ranks[r];
        if (!lost[r] || done[r]) continue;
        const char *h = ri->host[0] ? ri->host : "?";
        char list[512] = "", why[256] = "";
        int nl = 0, stopped = 0, running = 0, sig = 0, hi = host_of(s, h);
        int host_alive = s->probed && (hi >= 0 ? s->host_procs[hi] > 0 : s->local_procs > 0);
        double silent = 0;
        for (int q = r; q < s->nproc; q++) {
            rank_info_t *qi = &s->ranks[q];
            if (!lost[q] || strcmp(qi->host[0] ? qi->host : "?", h)) continue;
            done[q] = 1;
            if (strlen(list) + 16 < sizeof list)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", nl ? ", " : "", q);
            nl++;
            if (qi->died_signal) sig = qi->died_signal;
            else if (qi->state == 'T' || qi->state == 't') stopped++;
            else if (qi->state) running++;
            if (qi->seen && t_end - qi->last > silent) silent = t_end - qi->last;
        }
        if (sig) snprintf(why, sizeof why, "killed by signal %d", sig);
        else if (stopped) snprintf(why, sizeof why, "stopped (SIGSTOP: the host hangs)");
        else if (running || host_alive)
            snprintf(why, sizeof why, "silent while the job's processes there still ran (cut off from the network)");
        else if (s->probed) snprintf(why, sizeof why, "every process of the job there was gone (the host died)");
        else snprintf(why, sizeof why, "silent");
        if (res->n_lost_hosts < 16) {
            int dup = 0;
            for (int k = 0; k < res->n_lost_hosts; k++) dup |= !strcmp(res->lost_hosts[k], h);
            if (!dup) snprintf(res->lost_hosts[res->n_lost_hosts++], HP_LAUNCH_HOST_MAX, "%s", h);
        }
        if (l < sizeof res->lost)
            l += (size_t)snprintf(res->lost + l, sizeof res->lost - l, "%slost host %s (rank%s %s): %s; no heartbeat for "
                                  "%.1f s", l ? "; " : "", h, nl > 1 ? "s" : "", list, why, silent);
    }
    free(lost);
    free(done);
    if (!res->lost[0] && (s->lost_daemon_host[0] || s->peer_host[0])) {
        const char *h = s->lost_daemon_host[0] ? s->lost_daemon_host : s->peer_host;
        snprintf(res->lost, sizeof res->lost, "lost host %s: %s", h,
                 s->lost_daemon_host[0] ? "mpirun lost its daemon there" : "the other ranks lost their connections to it");
        snprintf(res->lost_hosts[0], HP_LAUNCH_HOST_MAX, "%s", h);
        res->n_lost_hosts = 1;
    }
}

/* ---- the run ------------------------------------------------------------------------------- */

static void read_jobid(sup_t *s) {
    if (s->jobid[0]) return;
    FILE *f = fopen(s->uri_path, "r");
    if (!f) return;
    char line[512];
    if (fgets(line, sizeof line, f)) {
        long long id = 0;
        if (sscanf(line, "%lld.", &id) == 1 && id > 0) snprintf(s->jobid, sizeof s->jobid, "%lld", id);
    }
    fclose(f);
}

hp_status_t hp_launch_run(const hp_launch_options_t *o, int argc, char **argv, hp_launch_result_t *res) {
    memset(res, 0, sizeof *res);
    sup_t sv, *s = &sv;
    memset(s, 0, sizeof sv);
    s->o = o;
    s->res = res;
    s->udp = -1;
    s->t_fail = -1;
    s->grace = o->grace_s > 0 ? o->grace_s : env_seconds("HP_LAUNCH_GRACE", 5.0);
    s->comm_timeout = env_seconds("HP_COMM_TIMEOUT", 300.0);
    if (o->hostfile) HP_TRY(hp_launch_hostfile_read(o->hostfile, s->hosts, HP_LAUNCH_MAX_HOSTS, &s->n_hosts));
    s->nproc = o->nproc;
    if (s->nproc <= 0)
        for (int h = 0; h < s->n_hosts; h++) s->nproc += s->hosts[h].slots;
    if (s->nproc < 1) return hp_error(HP_ERR_INVALID_ARG, "launch: expected --nproc N >= 1 or a hostfile");
    const char *agent = getenv("OMPI_MCA_plm_rsh_agent");
    for (int i = 0; i < o->n_mca; i++)
        if (!strcmp(o->mca[i][0], "plm_rsh_agent")) agent = o->mca[i][1];
    snprintf(s->agent, sizeof s->agent, "%s", agent && *agent ? agent : "ssh");
    s->agent[strcspn(s->agent, ":")] = '\0';   /* "ssh : rsh": the first alternative */
    s->ranks = calloc((size_t)s->nproc, sizeof *s->ranks);
    if (!s->ranks) return hp_error(HP_ERR_OOM, "launch: out of memory");

    /* the heartbeat socket */
    char addr[64];
    pick_address(s, addr, sizeof addr);
    s->udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t sl = sizeof sa;
    if (s->udp < 0 || bind(s->udp, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        getsockname(s->udp, (struct sockaddr *)&sa, &sl) != 0) {
        hp_status_t st = hp_error(HP_ERR_IO, "launch: cannot open the heartbeat socket: %s", strerror(errno));
        if (s->udp >= 0) close(s->udp);
        free(s->ranks);
        return st;
    }
    char hb[96];
    snprintf(hb, sizeof hb, "%s:%d", addr, ntohs(sa.sin_port));
    snprintf(s->tag, sizeof s->tag, "%d-%ld-%d", (int)getpid(), (long)time(NULL), ntohs(sa.sin_port));
    snprintf(s->uri_path, sizeof s->uri_path, "/tmp/hp_launch_uri_%.47s", s->tag);

    /* mpirun's command line */
    const char *launcher = getenv("HP_MPIRUN") ? getenv("HP_MPIRUN") : "mpirun";
    char np[32];
    snprintf(np, sizeof np, "%d", s->nproc);
    extern char **environ;
    int n_env = 0;
    for (char **e = environ; *e; e++) n_env++;
    char **args = calloc((size_t)(argc + 3 * o->n_mca + 2 * n_env + 32), sizeof(char *));
    char **xnames = calloc((size_t)n_env + 1, sizeof(char *));
    if (!args || !xnames) {
        free(args);
        free(xnames);
        close(s->udp);
        free(s->ranks);
        return hp_error(HP_ERR_OOM, "launch: out of memory");
    }
    int k = 0, nx = 0;
    args[k++] = (char *)launcher;
    args[k++] = "-np";
    args[k++] = np;
    if (o->hostfile) {
        args[k++] = "--hostfile";
        args[k++] = (char *)o->hostfile;
    }
    args[k++] = "--oversubscribe";
    args[k++] = "--bind-to";
    args[k++] = "none";
    args[k++] = "--report-uri";
    args[k++] = s->uri_path;
    if (geteuid() == 0) args[k++] = "--allow-run-as-root";
    for (int i = 0; i < o->n_mca; i++) {
        args[k++] = "--mca";
        args[k++] = (char *)o->mca[i][0];
        args[k++] = (char *)o->mca[i][1];
    }
    /* remote ranks get only what -x names: the job's tag, the heartbeat address and the
     * variables this project and its libraries read */
    args[k++] = "-x";
    args[k++] = "HP_LAUNCH_ADDR";
    args[k++] = "-x";
    args[k++] = "HP_LAUNCH_TAG";
    for (char **e = environ; *e; e++) {
        if (strncmp(*e, "HP_", 3) && strncmp(*e, "OMP_", 4) && strncmp(*e, "OPENBLAS_", 9)) continue;
        if (!strncmp(*e, "HP_LAUNCH_", 10)) continue;
        size_t nl = strcspn(*e, "=");
        char *nm = strndup(*e, nl);
        if (!nm) continue;
        xnames[nx++] = nm;
        args[k++] = "-x";
        args[k++] = nm;
    }
    for (int i = 0; i < argc; i++) args[k++] = argv[i];
    args[k] = NULL;

    int epipe[2];
    if (pipe2(epipe, O_CLOEXEC) != 0) {
        for (int i = 0; i < nx; i++) free(xnames[i]);
        free(xnames);
        free(args);
        close(s->udp);
        free(s->ranks);
        return hp_error(HP_ERR_IO, "launch: pipe: %s", strerror(errno));
    }
    struct sigaction sa_new, sa_int, sa_term;
    memset(&sa_new, 0, sizeof sa_new);
    sa_new.sa_handler = on_signal;
    sigemptyset(&sa_new.sa_mask);
    g_signal = 0;
    g_signal_count = 0;
    sigaction(SIGINT, &sa_new, &sa_int);
    sigaction(SIGTERM, &sa_new, &sa_term);
    fflush(stdout);
    fflush(stderr);
    s->t0 = now_s();
    pid_t child = fork();
    if (child == 0) {
        setpgid(0, 0);
        dup2(epipe[1], 2);
        setenv("HP_LAUNCH_ADDR", hb, 1);
        setenv("HP_LAUNCH_TAG", s->tag, 1);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        execvp(launcher, args);
        fprintf(stderr, "cannot start '%s': %s; install openmpi-bin (make deps) or start the job with your "
                        "launcher\n", launcher, strerror(errno));
        _exit(127);
    }
    close(epipe[1]);
    for (int i = 0; i < nx; i++) free(xnames[i]);
    free(xnames);
    free(args);
    if (child < 0) {
        close(epipe[0]);
        close(s->udp);
        free(s->ranks);
        sigaction(SIGINT, &sa_int, NULL);
        sigaction(SIGTERM, &sa_term, NULL);
        return hp_error(HP_ERR_IO, "launch: fork: %s", strerror(errno));
    }
    setpgid(child, child);

    char line[4096];
    size_t ll = 0;
    int pipe_open = 1, status = 0, exited = 0, forwarded = 0;
    double t_kill = -1, t_exit = -1;
    while (!exited || pipe_open) {
        struct pollfd pf[2] = {{pipe_open ? epipe[0] : -1, POLLIN, 0}, {s->udp, POLLIN, 0}};
        poll(pf, 2, 100);
        double now = now_s();
        if (pipe_open && (pf[0].revents & (POLLIN | POLLHUP))) {
            char buf[4096];
            ssize_t r = read(epipe[0], buf, sizeof buf);
            if (r <= 0) {
                pipe_open = 0;
            } else {
                (void)!write(2, buf, (size_t)r);
                for (ssize_t i = 0; i < r; i++) {
                    if (buf[i] == '\n' || ll + 1 >= sizeof line) {
                        line[ll] = '\0';
                        on_stderr_line(s, line);
                        ll = 0;
                    } else {
                        line[ll++] = buf[i];
                    }
                }
            }
        }
        if (pf[1].revents & POLLIN) {
            char m[1500];
            struct sockaddr_in from;
            socklen_t fl = sizeof from;
            ssize_t r;
            while ((r = recvfrom(s->udp, m, sizeof m - 1, 0, (struct sockaddr *)&from, &fl)) > 0) {
                m[r] = '\0';
                on_datagram(s, m, &from, fl, now);
                fl = sizeof from;
            }
        }
        if (!exited) {
            pid_t w = waitpid(child, &status, WNOHANG);
            if (w == child) {
                exited = 1;
                t_exit = now;
            }
        } else if (now - t_exit > 0.3) {
            break;   /* the agents of mpirun may hold the pipe open: the sweep ends them, then we drain */
        }
        if (exited) continue;
        read_jobid(s);
        if (g_signal && !forwarded) {
            forwarded = 1;
            res->interrupted = 1;
            kill(-child, g_signal);
        }
        if (g_signal_count > 1 && t_kill < 0) {   /* a second signal: end everything now */
            kill(-child, SIGKILL);
            t_kill = now;
            res->killed = 1;
        }
        /* a rank silent for longer than the comm timeout: its peers would have timed out by
         * now if they were waiting for it; the launcher does not wait for them */
        for (int r = 0; r < s->nproc && s->t_fail < 0; r++)
            if (s->ranks[r].seen && now - s->ranks[r].last > s->comm_timeout + s->grace) {
                char why[256];
                snprintf(why, sizeof why, "rank %d on %s sent no heartbeat for %.1f s", r, s->ranks[r].host,
                         now - s->ranks[r].last);
                fail_at(s, why);
            }
        if (s->t_fail < 0 && res->n_ranks_seen < s->nproc && now - s->t0 > s->comm_timeout + START_EXTRA_S) {
            char why[256];
            snprintf(why, sizeof why, "only %d of %d ranks started within %.0f s", res->n_ranks_seen, s->nproc,
                     now - s->t0);
            fail_at(s, why);
        }
        if (s->t_fail >= 0) probe(s);
        if (s->t_fail >= 0 && t_kill < 0 && now - s->t_fail > s->grace && !res->interrupted) {
            kill(-child, SIGKILL);
            t_kill = now;
            res->killed = 1;
        }
    }
    sigaction(SIGINT, &sa_int, NULL);
    sigaction(SIGTERM, &sa_term, NULL);
    if (WIFEXITED(status)) res->exit_code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status)) res->exit_code = 128 + WTERMSIG(status);
    if (res->exit_code != 0 && !res->interrupted) res->failed = 1;
    /* who was lost: judged at the first sign of failure, or when mpirun ended */
    double t_ref = s->t_fail >= 0 ? s->t_fail : t_exit;
    /* the final sweep: after a failure, every host; a clean end leaves nothing to find */
    if (res->failed || res->killed || res->interrupted) res->stray = sweep(s);
    /* what is left in the pipe (its writers are gone now) */
    for (double t_drain = now_s(); pipe_open && now_s() - t_drain < 1.0;) {
        struct pollfd pf = {epipe[0], POLLIN, 0};
        if (poll(&pf, 1, 100) <= 0) continue;
        char buf[4096];
        ssize_t r = read(epipe[0], buf, sizeof buf);
        if (r <= 0) break;
        (void)!write(2, buf, (size_t)r);
    }
    close(epipe[0]);
    double t_end = now_s();
    summarize(s, t_ref, t_end);
    res->seconds = t_end - s->t0;
    unlink(s->uri_path);
    close(s->udp);
    free(s->ranks);
    return HP_OK;
}
