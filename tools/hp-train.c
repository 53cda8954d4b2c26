/* hp-train: train a model from a YAML config with dotted command-line overrides.
 *   hp-train --config FILE.yaml [--section.key=value ...] [--nproc N]
 * Run it under mpirun/srun, or give --nproc N to start N ranks on this machine. */
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
#include <hyperparallel/parse.h>
#include <hyperparallel/trainer.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: hp-train --config FILE.yaml [--section.key=value ...] [--nproc N]\n"
            "  --config FILE     YAML config (docs/config.md lists every key)\n"
            "  --section.key=V   override one key, e.g. --training.steps=20 (also '--training.steps 20')\n"
            "  --nproc N         start N MPI ranks on this machine (otherwise run under mpirun/srun)\n"
            "  --help            this text\n");
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
    /* --nproc N: re-execute under the launcher, without the flag */
    int nproc = 0;
    char **args = calloc((size_t)argc + 1, sizeof(char *));
    int nargs = 0;
    if (!args) return 1;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && (!strcmp(argv[i], "--nproc") || !strncmp(argv[i], "--nproc=", 8))) {
            const char *v = argv[i][7] == '=' ? argv[i] + 8 : (i + 1 < argc ? argv[++i] : "");
            int32_t np = 0;
            if (hp_parse_i32("--nproc", v, 1, 1 << 24, "the number of MPI ranks to start, e.g. 4", &np) !=
                HP_OK) {
                fprintf(stderr, "hp-train: error: %s\n", hp_last_error());
                return 2;
            }
            nproc = np;
            continue;
        }
        args[nargs++] = argv[i];
    }
    if (nproc > 1 && !hp_launch_under_launcher()) {
        static char self[4096];
        ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
        if (len > 0) {   /* the real path: /proc/self/exe would name the launcher in its children */
            self[len] = '\0';
            args[0] = self;
        }
        hp_status_t s = hp_launch_exec(nproc, nargs, args);
        fprintf(stderr, "hp-train: error: %s\n", s == HP_OK ? "launcher returned" : hp_last_error());
        return 2;
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
    if (s == HP_OK && nrest > 0 && strncmp(rest[0], "--", 2) == 0) {
        static const char *const flags[] = {"--config", "--nproc", "--help"};
        hp_flag_unknown_error("command line", rest[0], flags, sizeof flags / sizeof flags[0]);
        s = hp_error(HP_ERR_INVALID_ARG, "%s; config keys are --section.key=value (see --help)", hp_last_error());
    } else if (s == HP_OK && nrest > 0) {
        s = hp_error(HP_ERR_INVALID_ARG, "unknown argument '%s'; expected --config FILE, --section.key=value or "
                                         "--nproc N (see --help)", rest[0]);
    }
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
