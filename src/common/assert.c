/* assert.c: what a broken invariant does (see assert.h): one log line with
 * where and what, then abort() for a core dump and systemd's restart. */
#include "gpurent/assert.h"
#include "gpurent/log.h"

#include <stdlib.h>

_Noreturn void assert_fail(const char *file, int line, const char *func, const char *cond)
{
    log_error("assertion failed: %s (%s:%d, in %s); aborting", cond, file, line, func);
    abort();
}
