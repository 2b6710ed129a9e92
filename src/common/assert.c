/* assert.c: what a broken invariant does (see assert.h): one log line with
 * where and what, then abort() for a core dump and systemd's restart. */
#include "gpurent/assert.h"
#include "gpurent/log.h"

#include <stdlib.h>

static _Thread_local int held; /* locks this thread holds, by the wrappers that note them */

void lock_note_acquired(void) { held++; }

void lock_note_released(void)
{
    ASSERT(held > 0);
    held--;
}

int locks_held(void) { return held; }

_Noreturn void assert_fail(const char *file, int line, const char *func, const char *cond)
{
    log_error("assertion failed: %s (%s:%d, in %s); aborting", cond, file, line, func);
    abort();
}
