/* Prints the OpenBLAS kernel family chosen at start-up (honours OPENBLAS_CORETYPE in a
 * DYNAMIC_ARCH build, as Debian's is): tests/support/other_blas_core.sh runs a test under
 * another kernel family than the machine's default (docs/testing.md, "Portability"). */
#include <cblas.h>
#include <stdio.h>

int main(void) {
    const char *c = openblas_get_corename();
    printf("%s\n", c ? c : "unknown");
    return 0;
}
