/* bench_util.h: what the C benchmarks share: a working directory, the
 * daemon's configuration on the testing clock, wall time, and one-line SQL
 * helpers that end the benchmark on failure. Not part of the daemon. */
#ifndef GPURENT_BENCH_UTIL_H
#define GPURENT_BENCH_UTIL_H

#include "store/store.h"

#include <stdint.h>

#define BENCH_T0 INT64_C(1800000000) /* the testing clock's start, as in the e2e tests */

/* dir_arg (created if missing) or a new /tmp/gpurent-bench-XXXXXX, in dir. */
int bench_workdir(const char *dir_arg, char *dir, size_t dirlen);
/* Loads the daemon's configuration (defaults, log_level=warn, the testing
 * clock in DIR/clock at BENCH_T0, then overrides) as daemon_config. */
int bench_daemon_config(const char *dir, char **overrides, int n_overrides);
/* Moves the testing clock to t. */
void bench_set_clock(int64_t t);
/* Removes the clock file and then dir, if empty. */
void bench_remove_workdir(const char *dir);
/* Removes a database and its -wal and -shm files. */
void bench_remove_db(const char *db_path);
/* Seconds on the monotonic clock. */
double bench_now(void);
/* Runs sql, or ends the benchmark saying why. */
void bench_exec(struct store *s, const char *sql);
/* The first column of sql's first row, or -1. */
int64_t bench_int(struct store *s, const char *sql);

/* BENCH_PROFILE=1: each statement's time summed by its text. A
 * sqlite3_trace_v2 callback for SQLITE_TRACE_PROFILE events; not thread-safe,
 * so attach it to one connection (a writer's statements are serial). */
int bench_profile_trace(unsigned type, void *ctx, void *stmt, void *ns);
/* Prints the slowest statements since the last print and starts again. */
void bench_profile_print(void);

#endif
