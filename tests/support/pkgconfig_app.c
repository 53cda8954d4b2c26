/* A program built from an install prefix by tests/support/pkgconfig_static.sh: it references
 * the trainer, so a static link pulls in every object of the library and needs every library
 * hyperparallel.pc lists (BLAS, YAML, PCRE2, json-c, xxHash, MPI, OpenMP); it runs only the
 * calls that need no MPI launch. */
#include <hyperparallel/hyperparallel.h>

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    static hp_config_t cfg;
    hp_config_defaults(&cfg);
    hp_status_t s = hp_config_load_file(&cfg, "/nonexistent/config.yaml");
    if (s != HP_ERR_IO || !strstr(hp_last_error(), "/nonexistent/config.yaml")) {
        fprintf(stderr, "pkgconfig_app: unexpected config load result: %s\n", hp_last_error());
        return 1;
    }
    if (argc > 1 && !strcmp(argv[1], "train")) {   // never in the test: links the whole library
        hp_trainer_t t = NULL;
        s = hp_trainer_create(&cfg, NULL, &t);
        if (s == HP_OK) s = hp_trainer_train(t);
        hp_trainer_destroy(t);
    }
    printf("pkgconfig_app: linked and ran (%s)\n", hp_status_string(s));
    return 0;
}
