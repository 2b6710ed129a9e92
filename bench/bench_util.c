/* bench_util.c: what the C benchmarks share (see bench_util.h). */
#include "bench_util.h"
#include "gpurent/clock.h"
#include "gpurentd.h"
#include "store/store_sql.h" /* benchmarks fill the database directly */
#include "gpurent/log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define OVERRIDES_MAX 16

static char clock_path[1200];

int bench_workdir(const char *dir_arg, char *dir, size_t dirlen)
{
    if (dir_arg) {
        snprintf(dir, dirlen, "%s", dir_arg);
        if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
            fprintf(stderr, "bench: cannot make %s: %s\n", dir, strerror(errno));
            return -1;
        }
        return 0;
    }
    snprintf(dir, dirlen, "/tmp/gpurent-bench-XXXXXX");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "bench: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

void bench_set_clock(int64_t t)
{
    char tmp[1300];
    snprintf(tmp, sizeof tmp, "%s.tmp", clock_path);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%" PRId64 "\n", t) < 0 || fclose(f) != 0 || rename(tmp, clock_path) != 0) {
        fprintf(stderr, "bench: cannot write %s: %s\n", clock_path, strerror(errno));
        exit(1);
    }
}

int bench_daemon_config(const char *dir, char **overrides, int n_overrides)
{
    snprintf(clock_path, sizeof clock_path, "%s/clock", dir);
    bench_set_clock(BENCH_T0);
    char clock_opt[1300], db_opt[1200], log_opt[] = "log_level=warn";
    snprintf(clock_opt, sizeof clock_opt, "clock_file=%s", clock_path);
    /* Each bench opens its own databases; this one is never created. */
    snprintf(db_opt, sizeof db_opt, "database=%s/unused.db", dir);
    char *all[OVERRIDES_MAX] = {db_opt, clock_opt, log_opt};
    int n = 3;
    for (int i = 0; i < n_overrides && n < OVERRIDES_MAX; i++)
        all[n++] = overrides[i];
    static struct daemon_conf conf;
    if (daemon_load_config(&conf, NULL, all, n) < 0)
        return -1;
    daemon_config = &conf;
    log_set_level(LOG_LVL_WARN);
    if (clock_use_file(clock_path) < 0) {
        fprintf(stderr, "bench: cannot use the clock file %s\n", clock_path);
        return -1;
    }
    return 0;
}

void bench_remove_db(const char *db_path)
{
    char p[1300];
    const char *suffixes[] = {"", "-wal", "-shm"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s%s", db_path, suffixes[i]);
        unlink(p);
    }
}

void bench_remove_workdir(const char *dir)
{
    unlink(clock_path);
    rmdir(dir);
}

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void bench_exec(struct store *s, const char *sql)
{
    char *err = NULL;
    if (sqlite3_exec(store_db(s), sql, NULL, NULL, &err) != SQLITE_OK) {
        fprintf(stderr, "bench: %s: %s\n", sql, err ? err : "?");
        exit(1);
    }
}

int64_t bench_int(struct store *s, const char *sql)
{
    sqlite3_stmt *st = NULL;
    int64_t v = -1;
    if (sqlite3_prepare_v2(store_db(s), sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

struct stmt_time {
    char *sql; /* a copy: statements prepared per call are gone by the print */
    int64_t ns, runs;
};
static struct stmt_time stmt_times[256];
static size_t n_stmt_times;

int bench_profile_trace(unsigned type, void *ctx, void *stmt, void *ns)
{
    (void)ctx;
    if (type != SQLITE_TRACE_PROFILE)
        return 0;
    const char *sql = sqlite3_sql(stmt);
    size_t i = 0;
    while (i < n_stmt_times && strcmp(stmt_times[i].sql, sql) != 0)
        i++;
    if (i == n_stmt_times && n_stmt_times < 256 && (stmt_times[i].sql = strdup(sql)))
        n_stmt_times++;
    if (i < n_stmt_times) {
        stmt_times[i].ns += *(sqlite3_int64 *)ns;
        stmt_times[i].runs++;
    }
    return 0;
}

static int by_time(const void *a, const void *b)
{
    const struct stmt_time *x = a, *y = b;
    return (x->ns < y->ns) - (x->ns > y->ns);
}

void bench_profile_print(void)
{
    qsort(stmt_times, n_stmt_times, sizeof stmt_times[0], by_time);
    for (size_t i = 0; i < n_stmt_times && i < 15; i++)
        printf("    %8.3f s %8" PRId64 " runs  %.110s\n", (double)stmt_times[i].ns / 1e9, stmt_times[i].runs,
               stmt_times[i].sql);
    for (size_t i = 0; i < n_stmt_times; i++)
        free(stmt_times[i].sql);
    memset(stmt_times, 0, sizeof stmt_times);
    n_stmt_times = 0;
}
