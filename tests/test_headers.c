/* The umbrella header includes every public header (and they compile together). */
// hp-test: ranks 1 timeout 30
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hyperparallel/hyperparallel.h>

#include "hp_test.h"

int main(void) {
    const char *src = getenv("HP_SOURCE_DIR");
    if (!src) {
        printf("SKIP: HP_SOURCE_DIR not set (ctest sets it)\n");
        return 0;
    }
    char dir[1024], umbrella[1200];
    snprintf(dir, sizeof dir, "%s/include/hyperparallel", src);
    snprintf(umbrella, sizeof umbrella, "%s/hyperparallel.h", dir);
    FILE *f = fopen(umbrella, "r");
    HP_CHECK(f != NULL, "cannot open %s", umbrella);
    static char text[65536];
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = '\0';
    if (f) fclose(f);
    DIR *d = opendir(dir);
    HP_CHECK(d != NULL, "cannot open %s", dir);
    int headers = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 3 || strcmp(e->d_name + len - 2, ".h") || !strcmp(e->d_name, "hyperparallel.h")) continue;
        char inc[300];
        snprintf(inc, sizeof inc, "#include \"%s\"", e->d_name);
        HP_CHECK(strstr(text, inc) != NULL, "hyperparallel.h does not include %s", e->d_name);
        headers++;
    }
    if (d) closedir(d);
    HP_CHECK(headers >= 20, "only %d headers found", headers);
    HP_CHECK(strcmp(hp_status_string(HP_OK), "ok") == 0, "linked");
    return hp_test_finish("test_headers");
}
