/* hp-train: train a model from a YAML config with dotted command-line overrides.
 *   hp-train --config FILE.yaml [--section.key=value ...] [--nproc N | --hostfile FILE] ...
 * Run it under mpirun/srun, or give --nproc N / --hostfile FILE and it starts the ranks itself
 * under a supervising launcher (launch.h; elastic restarts with --max-restarts). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hyperparallel/checkpoint.h>
#include <hyperparallel/comm.h>
#include <hyperparallel/config.h>
#include <hyperparallel/launch.h>
#include <hyperparallel/parallel_config.h>
#include <hyperparallel/parse.h>
#include <hyperparallel/trainer.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: hp-train --config FILE.yaml [--section.key=value ...] [--nproc N | --hostfile FILE]\n"
            "                [--mca KEY VALUE ...] [--max-restarts N [--min-nodes M]]\n"
            "  --config FILE     YAML config (docs/config.md lists every key)\n"
            "  --section.key=V   override one key, e.g. --training.steps=20 (also '--training.steps 20')\n"
            "  --nproc N         start N MPI ranks (on this machine, or over the hostfile's hosts)\n"
            "  --hostfile FILE   Open MPI hostfile ('node1 slots=4' lines): the ranks run on those hosts\n"
            "  --mca KEY VALUE   an Open MPI parameter for mpirun, e.g. --mca btl tcp,self\n"
            "  --max-restarts N  after a failure, restart up to N times from the last complete checkpoint\n"
            "                    (torchrun's --max-restarts); the world is the hosts that are left\n"
            "  --min-nodes M     restart only while at least M hosts are left (default: every host)\n"
            "  --help            this text\n"
            "Without --nproc / --hostfile, run it under mpirun or srun (docs/multihost.md).\n");
}

/* The launcher's flags, taken out of the command line before the ranks see it. */
typedef struct launch_args {
    int nproc, max_restarts, min_nodes;
    const char *hostfile;
    hp_launch_options_t lo;
} launch_args_t;

/* The checkpoint the next run would resume from, for the failure message. */
static void last_checkpoint(const hp_config_t *cfg, char *out, size_t cap) {
    if (!cfg->checkpoint.enable) {
        snprintf(out, cap, "checkpoint.enable is false, so a rerun starts from step 0");
        return;
    }
    char folder[2 * HP_CONFIG_STR_MAX + 2];
    const char *f = cfg->checkpoint.folder;
    if (f[0] == '/' || !cfg->job.dump_folder[0]) snprintf(folder, sizeof folder, "%s", f);
    else snprintf(folder, sizeof folder, "%s/%s", cfg->job.dump_folder, f);
    int64_t step = -1;
    int n_bad = 0;
    if (hp_dcp_latest_complete(folder, &step, &n_bad) != HP_OK || step < 0)
        snprintf(out, cap, "there is no complete checkpoint in %s, so a rerun starts from step 0", folder);
    else
        snprintf(out, cap, "the last complete checkpoint is %s/step-%lld (a rerun resumes from it)%s", folder,
                 (long long)step, n_bad ? "; a newer, incomplete one is left on disk" : "");
}

/* A lost host's name as the hostfile spells it (the ranks report MPI_Get_processor_name:
 * "node1" for "node1.cluster" or the reverse), or -1. */
static int host_index(const hp_launch_host_t *hosts, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(hosts[i].name, name)) return i;
    size_t ln = strcspn(name, ".");
    for (int i = 0; i < n; i++) {
        size_t lh = strcspn(hosts[i].name, ".");
        if (lh == ln && !strncmp(hosts[i].name, name, ln)) return i;
    }
    return -1;
}

/* Runs the job under the supervising launcher, restarting it after a failure up to
 * --max-restarts times on the hosts that are left (docs/multihost.md, "Elastic restart"). */
static int run_launcher(launch_args_t *la, const hp_config_t *cfg, int nargs, char **args) {
    hp_launch_host_t hosts[HP_LAUNCH_MAX_HOSTS];
    int n_hosts = 0;
    if (la->hostfile && hp_launch_hostfile_read(la->hostfile, hosts, HP_LAUNCH_MAX_HOSTS, &n_hosts) != HP_OK) {
        fprintf(stderr, "hp-train: error: %s\n", hp_last_error());
        return 2;
    }
    int min_nodes = la->min_nodes > 0 ? la->min_nodes : (n_hosts ? n_hosts : 1);
    if (la->hostfile && min_nodes > n_hosts) {
        fprintf(stderr, "hp-train: error: --min-nodes %d but the hostfile '%s' lists %d host(s)\n", min_nodes,
                la->hostfile, n_hosts);
        return 2;
    }
    char restart_hostfile[64] = "";
    int rc = 1;
    for (int attempt = 0;; attempt++) {
        hp_launch_result_t res;
        la->lo.hostfile = restart_hostfile[0] ? restart_hostfile : la->hostfile;
        hp_status_t s = hp_launch_run(&la->lo, nargs, args, &res);
        if (s != HP_OK) {
            fprintf(stderr, "hp-train: error: %s\n", hp_last_error());
            rc = 2;
            break;
        }
        rc = res.exit_code;
        if (!res.failed || res.interrupted) break;
        if (rc == 0) rc = 1;
        char ckpt[3 * HP_CONFIG_STR_MAX], strays[128] = "";
        last_checkpoint(cfg, ckpt, sizeof ckpt);
        if (res.stray)
            snprintf(strays, sizeof strays, " The launcher ended %d leftover process(es) of the job.", res.stray);
        fprintf(stderr, "hp-train: error: the job failed after %.1f s%s%s%s%s; %s.%s\n", res.seconds,
                res.lost[0] ? ": " : "", res.lost, res.first_report[0] ? ". First report: " : "", res.first_report,
                ckpt, strays);
        if (attempt >= la->max_restarts) break;
        if (rc == 2) {   /* a usage or config error does not go away by restarting */
            fprintf(stderr, "hp-train: not restarting: the ranks refused the command line or the config\n");
            break;
        }
        /* the hosts that are left */
        hp_launch_host_t left[HP_LAUNCH_MAX_HOSTS];
        int n_left = 0, world = la->nproc;
        if (n_hosts) {
            int drop[HP_LAUNCH_MAX_HOSTS] = {0}, unknown = -1;
            for (int i = 0; i < res.n_lost_hosts; i++) {
                int h = host_index(hosts, n_hosts, res.lost_hosts[i]);
                if (h >= 0) drop[h] = 1;
                else unknown = i;
            }
            if (unknown >= 0) {
                fprintf(stderr, "hp-train: not restarting: the lost host '%s' is not in the hostfile '%s' (hint: list "
                        "the hosts by the names they report, `hostname`)\n", res.lost_hosts[unknown], la->hostfile);
                break;
            }
            world = 0;
            for (int h = 0; h < n_hosts; h++)
                if (!drop[h]) left[n_left++] = hosts[h], world += hosts[h].slots;
            if (n_left < min_nodes) {
                fprintf(stderr, "hp-train: not restarting: %d of %d host(s) left, fewer than --min-nodes %d\n", n_left,
                        n_hosts, min_nodes);
                break;
            }
        }
        if (world < 1) world = 1;
        /* the layout on the new world, refused by name before anything starts */
        hp_parallel_dims_t pd;
        int64_t accum = 0;
        /* parallelism.auto: the restarted job plans its layout for the new world itself */
        s = cfg->parallelism.auto_layout ? HP_OK : hp_parallel_dims_from_config(cfg, world, &pd);
        if (s == HP_OK && !cfg->parallelism.auto_layout)
            s = hp_config_grad_accum_steps(cfg, hp_parallel_dims_dp(&pd), &accum);
        if (s != HP_OK) {
            fprintf(stderr, "hp-train: not restarting: on the %d rank(s) left, %s\n", world, hp_last_error());
            break;
        }
        if (n_hosts) {
            snprintf(restart_hostfile, sizeof restart_hostfile, "/tmp/hp_train_hosts_%d", (int)getpid());
            if (hp_launch_hostfile_write(restart_hostfile, left, n_left) != HP_OK) {
                fprintf(stderr, "hp-train: not restarting: %s\n", hp_last_error());
                break;
            }
            memcpy(hosts, left, sizeof left[0] * (size_t)n_left);
            n_hosts = n_left;
        }
        la->nproc = world;
        la->lo.nproc = world;
        char names[1024] = "";
        size_t nl = 0;
        for (int h = 0; h < n_hosts && nl + HP_LAUNCH_HOST_MAX + 3 < sizeof names; h++)
            nl += (size_t)snprintf(names + nl, sizeof names - nl, "%s%.127s", h ? ", " : "", hosts[h].name);
        fprintf(stderr, "hp-train: restart %d of %d: %d rank(s)%s%s (dp_shard %d, tp %d, pp %d, cp %d), from the last "
                "complete checkpoint\n", attempt + 1, la->max_restarts, world, n_hosts ? " on " : "", names,
                pd.dp_shard, pd.tp, pd.pp, pd.cp);
    }
    if (restart_hostfile[0]) unlink(restart_hostfile);
    return rc;
}

static hp_status_t unknown_argument(const char *arg) {
    if (strncmp(arg, "--", 2) == 0) {
        static const char *const flags[] = {"--config", "--nproc", "--hostfile", "--mca", "--max-restarts",
                                            "--min-nodes", "--help"};
        hp_flag_unknown_error("command line", arg, flags, sizeof flags / sizeof flags[0]);
        return hp_error(HP_ERR_INVALID_ARG, "%s; config keys are --section.key=value (see --help)", hp_last_error());
    }
    return hp_error(HP_ERR_INVALID_ARG, "unknown argument '%s'; expected --config FILE, --section.key=value or "
                                        "--nproc N (see --help)", arg);
}

/* SIGTERM / SIGINT: only record the signal (async-signal-safe); the trainer stops after the
 * current step, abandons an unfinished save and says what the last complete checkpoint is.
 * SA_RESETHAND: a second signal ends the process at once. */
static void on_signal(int sig) { hp_dcp_interrupt(sig); }

static void install_signal_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_RESETHAND;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
    /* the launcher's flags (--nproc, --hostfile, --mca, --max-restarts, --min-nodes) come out;
     * everything else goes to the ranks */
    launch_args_t la;
    memset(&la, 0, sizeof la);
    char **args = calloc((size_t)argc + 1, sizeof(char *));
    int nargs = 0;
    if (!args) return 1;
    static const struct {
        const char *flag;
        int32_t lo, hi;
        const char *what;
    } ints[] = {{"--nproc", 1, 1 << 24, "the number of MPI ranks to start, e.g. 4"},
                {"--max-restarts", 0, 1000, "how many times to restart after a failure, e.g. 3"},
                {"--min-nodes", 1, HP_LAUNCH_MAX_HOSTS, "the fewest hosts a restart may use, e.g. 2"}};
    for (int i = 0; i < argc; i++) {
        int matched = 0;
        for (size_t f = 0; i > 0 && f < sizeof ints / sizeof ints[0]; f++) {
            size_t fl = strlen(ints[f].flag);
            if (strcmp(argv[i], ints[f].flag) && !(strncmp(argv[i], ints[f].flag, fl) == 0 && argv[i][fl] == '='))
                continue;
            const char *v = argv[i][fl] == '=' ? argv[i] + fl + 1 : (i + 1 < argc ? argv[++i] : "");
            int32_t x = 0;
            if (hp_parse_i32(ints[f].flag, v, ints[f].lo, ints[f].hi, ints[f].what, &x) != HP_OK) {
                fprintf(stderr, "hp-train: error: %s\n", hp_last_error());
                return 2;
            }
            if (f == 0) la.nproc = x;
            else if (f == 1) la.max_restarts = x;
            else la.min_nodes = x;
            matched = 1;
        }
        if (matched) continue;
        if (i > 0 && (!strcmp(argv[i], "--hostfile") || !strncmp(argv[i], "--hostfile=", 11))) {
            la.hostfile = argv[i][10] == '=' ? argv[i] + 11 : (i + 1 < argc ? argv[++i] : NULL);
            if (!la.hostfile || !*la.hostfile) {
                fprintf(stderr, "hp-train: error: --hostfile expects a file ('node1 slots=4' lines)\n");
                return 2;
            }
            continue;
        }
        if (i > 0 && !strcmp(argv[i], "--mca")) {
            if (i + 2 >= argc || la.lo.n_mca >= HP_LAUNCH_MAX_MCA) {
                fprintf(stderr, "hp-train: error: --mca expects KEY VALUE (at most %d), e.g. --mca btl tcp,self\n",
                        HP_LAUNCH_MAX_MCA);
                return 2;
            }
            la.lo.mca[la.lo.n_mca][0] = argv[i + 1];
            la.lo.mca[la.lo.n_mca][1] = argv[i + 2];
            la.lo.n_mca++;
            i += 2;
            continue;
        }
        args[nargs++] = argv[i];
    }
    int launch = (la.nproc > 1 || la.hostfile) && !hp_launch_under_launcher();
    if (!launch && (la.max_restarts || la.min_nodes || la.lo.n_mca)) {
        fprintf(stderr, "hp-train: error: --max-restarts, --min-nodes and --mca are the launcher's: they need --nproc "
                        "N (N > 1) or --hostfile%s\n", hp_launch_under_launcher() ? ", not a run under mpirun/srun" : "");
        return 2;
    }
    if (launch) {
        /* the config is read here too: its errors come before anything starts, and the
         * failure message names its checkpoint folder */
        hp_config_t *lcfg = calloc(1, sizeof *lcfg);
        char **lrest = calloc((size_t)nargs + 1, sizeof(char *));
        int nlrest = 0;
        hp_status_t s = lcfg && lrest ? hp_config_parse_args(lcfg, nargs, args, lrest, &nlrest) : HP_ERR_OOM;
        if (s == HP_OK && nlrest > 0) s = unknown_argument(lrest[0]);
        if (s == HP_OK) s = hp_config_validate(lcfg);
        int rc = 2;
        if (s != HP_OK) {
            fprintf(stderr, "hp-train: error: %s\n", hp_last_error());
        } else {
            static char self[4096];
            ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
            if (len > 0) {   /* the real path: /proc/self/exe would name the launcher in its children */
                self[len] = '\0';
                args[0] = self;
            }
            la.lo.nproc = la.nproc;
            rc = run_launcher(&la, lcfg, nargs, args);
        }
        free(lcfg);
        free(lrest);
        free(args);
        return rc;
    }

    hp_comm_t world = NULL;
    if (hp_comm_init(&argc, &argv, &world) != HP_OK) {
        fprintf(stderr, "hp-train: error: %s\n", hp_last_error());
        return 1;
    }
    int rank = hp_comm_rank(world);
    install_signal_handlers();
    hp_config_t *cfg = calloc(1, sizeof *cfg);
    char **rest = calloc((size_t)nargs + 1, sizeof(char *));
    int nrest = 0, rc = 0;
    hp_status_t s = cfg && rest ? hp_config_parse_args(cfg, nargs, args, rest, &nrest) : HP_ERR_OOM;
    if (s == HP_OK && nrest > 0) s = unknown_argument(rest[0]);
    if (s == HP_OK) s = hp_config_validate(cfg);
    /* every rank parsed its own copy: all go on or all stop, with the failing rank's message */
    s = hp_comm_agree(world, s, NULL);
    if (s != HP_OK) {
        if (rank == 0) fprintf(stderr, "hp-train: error: %s\n", hp_last_error());
        rc = 2;
    } else {
        if (rank == 0 && cfg->job.print_config) {
            printf("# resolved config\n");
            hp_config_print(cfg, stdout);
            fflush(stdout);
        }
        hp_trainer_t t = NULL;
        s = hp_trainer_create(cfg, world, &t);
        if (s == HP_OK) s = hp_trainer_train(t);
        if (s != HP_OK) {
            if (rank == 0 || s == HP_ERR_NUMERIC) fprintf(stderr, "hp-train: error: %s\n", hp_last_error());
            rc = 1;
            if (hp_dcp_interrupted() > 0) rc = 128 + hp_dcp_interrupted();   /* 143 SIGTERM, 130 SIGINT */
        }
        hp_trainer_destroy(t);
    }
    free(cfg);
    free(rest);
    free(args);
    hp_comm_destroy(world);
    hp_comm_finalize();
    return rc;
}
