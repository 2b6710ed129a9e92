/* bench/sqlite_txn.c: the reference for every write figure of `make bench`
 * (issue 15): plain SQLite doing the daemon's durable single-row
 * transaction (WAL, synchronous=FULL, BEGIN IMMEDIATE, one INSERT, COMMIT)
 * in a loop for --seconds on one connection, nothing else. What a create
 * through HTTP costs above this is the daemon's. Prints one table row.
 *
 *   build/bench/sqlite_txn [--seconds S] [--dir DIR]
 */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void must(sqlite3 *db, int rc, const char *what)
{
    if (rc != SQLITE_OK && rc != SQLITE_DONE) {
        fprintf(stderr, "sqlite_txn: %s: %s\n", what, sqlite3_errmsg(db));
        exit(1);
    }
}

int main(int argc, char **argv)
{
    double seconds = 3;
    const char *dir = "/tmp";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--seconds") == 0)
            seconds = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--dir") == 0)
            dir = argv[i + 1];
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/gpurent-bench-sqlite-%d.db", dir, (int)getpid());
    sqlite3 *db;
    must(NULL, sqlite3_open(path, &db), "open");
    must(db, sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                              "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL, at INTEGER NOT NULL)",
                          NULL, NULL, NULL),
         "schema");
    sqlite3_stmt *begin, *ins, *commit;
    must(db, sqlite3_prepare_v2(db, "BEGIN IMMEDIATE", -1, &begin, NULL), "prepare");
    must(db, sqlite3_prepare_v2(db, "INSERT INTO t (v, at) VALUES ('ins_0123456789abcdefghij', ?)", -1, &ins, NULL),
         "prepare");
    must(db, sqlite3_prepare_v2(db, "COMMIT", -1, &commit, NULL), "prepare");
    long n = 0;
    double t0 = now_s(), t;
    do {
        must(db, sqlite3_step(begin), "begin");
        sqlite3_reset(begin);
        sqlite3_bind_int64(ins, 1, n);
        must(db, sqlite3_step(ins), "insert");
        sqlite3_reset(ins);
        must(db, sqlite3_step(commit), "commit");
        sqlite3_reset(commit);
        n++;
        t = now_s();
    } while (t - t0 < seconds);
    sqlite3_finalize(begin);
    sqlite3_finalize(ins);
    sqlite3_finalize(commit);
    sqlite3_close(db);
    char side[4200];
    unlink(path);
    snprintf(side, sizeof side, "%s-wal", path);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", path);
    unlink(side);
    double load = 0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &load) != 1)
            load = 0;
        fclose(f);
    }
    time_t wall = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M", gmtime(&wall));
    printf("| durable single-row transaction, plain SQLite (the write reference) | — | %.0f txn/s (%.1f µs each) | — "
           "| %.2f | `build/bench/sqlite_txn --seconds %g` | %s |\n",
           (double)n / (t - t0), (t - t0) / (double)n * 1e6, load, seconds, date);
    return 0;
}
