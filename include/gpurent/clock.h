/* clock.h: the one source of "now" for everything that bills, expires or
 * times out. Normally the system clock; with a clock file (a testing aid) the
 * time is whatever epoch seconds the file holds, so tests can move an hour
 * forward without sleeping. */
#ifndef GPURENT_CLOCK_H
#define GPURENT_CLOCK_H

#include <stdint.h>

/* Switches to the clock file at path (NULL or "" returns to the system
 * clock). Returns -1 if the file cannot be read now. Call before threads start. */
int clock_use_file(const char *path);
/* Whether the testing clock is on. */
int clock_is_testing(void);
/* Current time in epoch seconds. On the testing clock, a file that cannot be
 * read or parsed keeps the last good value (and logs once), so time never
 * jumps backwards by accident. */
int64_t clock_now(void);
/* Real wall-clock epoch seconds, whatever the testing clock says: for
 * timestamps exchanged with other machines (agent request signatures), which
 * check them against their own clocks. Never for billing. */
int64_t clock_wall(void);
/* The same in milliseconds, for wall-clock instants finer than a second. */
int64_t clock_wall_ms(void);
/* Monotonic milliseconds for measuring durations (never the testing clock). */
int64_t clock_mono_ms(void);
/* Monotonic microseconds, for latency histograms. */
int64_t clock_mono_us(void);
/* The CLOCK_MONOTONIC instant ms milliseconds from now, for
 * pthread_cond_timedwait on a condition made with that clock. */
struct timespec;
void clock_mono_deadline(int64_t ms, struct timespec *out);

#endif
