/* assert.h: ASSERT(cond) for invariants that must never break: when one
 * does, the program logs the file, line, function and the condition and
 * aborts, in every build (NDEBUG changes nothing), instead of carrying on
 * with wrong money or a broken protocol. Not for bad input or a failing
 * database: those are errors the caller handles. */
#ifndef GPURENT_ASSERT_H
#define GPURENT_ASSERT_H

_Noreturn void assert_fail(const char *file, int line, const char *func, const char *cond);

#define ASSERT(cond) ((cond) ? (void)0 : assert_fail(__FILE__, __LINE__, __func__, #cond))

/* The lock order, as far as it matters here: no thread starts a database
 * transaction while it holds a lock of its own (a loop's), since a
 * transaction may wait for a whole batch of other threads' work, which may
 * want that lock. Lock wrappers count what this thread holds; store_txn
 * ASSERTs locks_held() == 0. */
void lock_note_acquired(void);
void lock_note_released(void);
int locks_held(void);

#endif
