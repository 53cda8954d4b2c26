/* hp-tokenizer decode input: every id is parsed in full and range-checked against the
 * tokenizer's vocabulary; bad text is named with its argument or stdin line, exit non-zero. */
// hp-test: ranks 1 timeout 60
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hp_test.h"
#include "hyperparallel/status.h"

static char tool[1200], tok[1200], errf[256], outf[256];

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return strdup("");
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = 0;
    fclose(f);
    return strdup(buf);
}

/* Runs `hp-tokenizer decode --tokenizer ours.json ARGS` (stdin from STDIN_TEXT when given);
 * returns the exit status; *err gets stderr, *out stdout. */
static int run(const char *args, const char *stdin_text, char **out, char **err) {
    char cmd[4096];
    if (stdin_text)
        snprintf(cmd, sizeof(cmd), "printf '%s' | %s decode --tokenizer %s %s >%s 2>%s",
                 stdin_text, tool, tok, args, outf, errf);
    else
        snprintf(cmd, sizeof(cmd), "%s decode --tokenizer %s %s </dev/null >%s 2>%s", tool, tok,
                 args, outf, errf);
    int rc = system(cmd);
    *out = slurp(outf);
    *err = slurp(errf);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static void expect_fail(const char *args, const char *stdin_text, const char *needle) {
    char *out, *err;
    int rc = run(args, stdin_text, &out, &err);
    HP_CHECK(rc != 0 && strstr(err, needle) && out[0] == 0,
             "decode %s (stdin '%s'): exit %d, stderr '%s', stdout '%s'; expected a failure "
             "naming '%s' and no output", args, stdin_text ? stdin_text : "-", rc, err, out, needle);
    free(out);
    free(err);
}

int main(void) {
    const char *src = getenv("HP_SOURCE_DIR"), *bld = getenv("HP_BUILD_DIR");
    snprintf(tool, sizeof(tool), "%s/hp-tokenizer", bld ? bld : ".");
    snprintf(tok, sizeof(tok), "%s/tests/data/tokenizer/ours.json", src ? src : "..");
    snprintf(errf, sizeof(errf), "test_tokenizer_tool_%ld.err", (long)getpid());
    snprintf(outf, sizeof(outf), "test_tokenizer_tool_%ld.out", (long)getpid());
    if (access(tool, X_OK) != 0) {
        printf("SKIP: %s is not built\n", tool);
        return 0;
    }
    /* Valid ids decode, from arguments and from stdin over several lines. */
    char *out, *err;
    int rc = run("72 101", NULL, &out, &err);
    HP_CHECK(rc == 0 && out[0] != 0, "decode 72 101: exit %d, stderr '%s'", rc, err);
    char *want = strdup(out);
    free(out), free(err);
    rc = run("", "72\\n  101\\n", &out, &err);
    HP_CHECK(rc == 0 && !strcmp(out, want), "stdin 72 101: exit %d, '%s' vs '%s', stderr '%s'",
             rc, out, want, err);
    free(out), free(err), free(want);

    /* 2^32 + 1 used to decode as id 1; now it is out of the vocabulary. */
    expect_fail("4294967297", NULL, "argument 4: id 4294967297 is outside the vocabulary of");
    expect_fail("5 -1", NULL, "argument 5: id -1 is outside the vocabulary");
    expect_fail("99999999999999999999", NULL, "argument 4: id '99999999999999999999' is out of range");
    expect_fail("5 12abc", NULL, "argument 5: '12abc' is not an id");
    expect_fail("", "1 2\\n3 x7 4\\n", "stdin line 2: 'x7' is not an id");
    expect_fail("", "1\\n\\n4294967297\\n", "stdin line 3: id 4294967297 is outside");
    expect_fail("", "1 2,3\\n", "stdin line 1: '2,3' is not an id");
    remove(errf);
    remove(outf);
    return hp_test_finish("test_tokenizer_tool");
}
