/* Dotted command-line overrides (--section.key=value, --section.key value), applied after
 * the config file through the same value parser. */
#include "hyperparallel/config.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "train/config-impl.h"

/* ---- command line -------------------------------------------------------------------- */

hp_status_t hp_config_parse_args(hp_config_t *cfg, int argc, char **argv, char **rest, int *nrest) {
    if (!cfg) return hp_error(HP_ERR_INVALID_ARG, "hp_config_parse_args: NULL config");
    if (nrest) *nrest = 0;
    hp_config_defaults(cfg);
    /* The file first (wherever --config appears), so the command line overrides it. */
    const char *file = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--config") == 0 || strcmp(a, "--job.config_file") == 0) {
            if (i + 1 >= argc)
                return hp_error(HP_ERR_INVALID_ARG, "command line: %s needs a file name (--config FILE.yaml)", a);
            file = argv[++i];
        } else if (strncmp(a, "--config=", 9) == 0) {
            file = a + 9;
        } else if (strncmp(a, "--job.config_file=", 18) == 0) {
            file = a + 18;
        }
    }
    if (file) HP_TRY(hp_config_load_file(cfg, file));
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--config") == 0 || strcmp(a, "--job.config_file") == 0) {
            i++;
            continue;
        }
        if (strncmp(a, "--config=", 9) == 0 || strncmp(a, "--job.config_file=", 18) == 0) continue;
        const char *eq = strchr(a, '=');
        size_t namelen = eq ? (size_t)(eq - a) : strlen(a);
        bool dotted = strncmp(a, "--", 2) == 0 && memchr(a + 2, '.', namelen - 2) != NULL;
        if (!dotted) {
            if (rest) rest[*nrest] = argv[i];
            if (nrest) (*nrest)++;
            continue;
        }
        char name[256];
        if (namelen - 2 >= sizeof name)
            return hp_error(HP_ERR_INVALID_ARG, "command line: option '%.40s...' is too long", a);
        memcpy(name, a + 2, namelen - 2);
        name[namelen - 2] = '\0';
        const hp_config_key_t *k = hp_config_find_key(name);
        if (!k) return hp_cfg_unknown_key_error("command line", name, "--");
        const char *value;
        if (eq) {
            value = eq + 1;
        } else if ((k->type == HP_CONFIG_BOOL || k->type == HP_CONFIG_TRISTATE) &&
                   (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)) {
            value = "true";   /* a bare boolean flag: --checkpoint.enable */
        } else {
            if (i + 1 >= argc)
                return hp_error(HP_ERR_INVALID_ARG, "command line: option '--%s' needs a value (--%s=VALUE)", name,
                                name);
            value = argv[++i];
        }
        HP_TRY(hp_cfg_set_from_text(cfg, k, value, "command line"));
    }
    return HP_OK;
}
