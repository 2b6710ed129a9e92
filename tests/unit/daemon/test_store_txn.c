/* test_store_txn.c: the transaction runner's group commit. Callbacks that
 * queue behind a running transaction join it (or share the next commit),
 * yet each keeps its own outcome: a refusal or a constraint failure undoes
 * only that callback's work, later callbacks see earlier ones' writes, and
 * each caller gets its own result. Runs on a real SQLite file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <signal.h>
#include <sys/wait.h>
#include "gpurent/assert.h"
#include "gpurentd.h"
#include "store/store_sql.h" /* a test of the store itself */

static char dir[64], db_path[128];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/gpurent-txn-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    snprintf(db_path, sizeof db_path, "%s/t.db", dir);
    char err[256];
    struct store *s = store_open(db_path, err, sizeof err);
    if (!s)
        return -1;
    int rc = sqlite3_exec(store_db(s),
                          "CREATE TABLE counter (n INTEGER NOT NULL);"
                          "INSERT INTO counter VALUES (0);"
                          "CREATE TABLE items (k TEXT PRIMARY KEY, by_thread INTEGER NOT NULL) STRICT;",
                          NULL, NULL, NULL);
    store_close(s);
    store_set_path(db_path);
    return rc == SQLITE_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    store_close_threads();
    char p[160];
    const char *suffixes[] = {"", "-wal", "-shm"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s%s", db_path, suffixes[i]);
        unlink(p);
    }
    rmdir(dir);
    return 0;
}

static int64_t one_int(struct store *s, const char *sql)
{
    sqlite3_stmt *st = NULL;
    int64_t v = -1;
    if (sqlite3_prepare_v2(store_db(s), sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

/* What a callback does, chosen by the test. */
enum outcome { COMMIT, REFUSE, DUPLICATE };

struct job {
    enum outcome outcome;
    int thread;              /* who asked */
    char key[32];            /* the item it inserts */
    int hold_for;            /* 0, or: wait in the callback until this many others queue */
    atomic_int entered;      /* set when a holding callback starts */
    atomic_int *asked;       /* or: wait until this counter reaches hold_for */
    int result;              /* what store_txn returned */
};

/* Adds one to the counter and inserts its item, then commits, refuses, or
 * inserts a key that exists; returns the counter as it saw it. */
static int job_txn(struct store *s, void *vctx)
{
    struct job *j = vctx;
    if (j->hold_for) {
        atomic_store(&j->entered, 1);
        struct store_txn_stats st;
        for (store_txn_stats(&st); j->asked ? atomic_load(j->asked) < j->hold_for : st.waiting < j->hold_for;
             store_txn_stats(&st))
            sched_yield();
    }
    sqlite3 *db = store_db(s);
    if (sqlite3_exec(db, "UPDATE counter SET n = n + 1", NULL, NULL, NULL) != SQLITE_OK)
        return STORE_ERROR;
    sqlite3_stmt *st = NULL;
    sqlite3_prepare_v2(db, "INSERT INTO items (k, by_thread) VALUES (?1, ?2)", -1, &st, NULL);
    sqlite3_bind_text(st, 1, j->key, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, j->thread);
    int rc = store_rc_from_sqlite(s, sqlite3_step(st), "insert item");
    sqlite3_finalize(st);
    if (rc != STORE_OK)
        return rc;
    if (j->outcome == REFUSE)
        return REFUSED;
    if (j->outcome == DUPLICATE) {
        rc = sqlite3_exec(db, "INSERT INTO items (k, by_thread) VALUES ('taken', -1)", NULL, NULL, NULL);
        return store_rc_from_sqlite(s, rc, "insert duplicate");
    }
    return (int)one_int(s, "SELECT n FROM counter");
}

static void *run_job(void *arg)
{
    struct job *j = arg;
    struct store *s = store_thread();
    j->result = s ? store_txn(s, job_txn, j) : STORE_ERROR;
    return NULL;
}

static void reset_tables(struct store *s)
{
    assert_int_equal(sqlite3_exec(store_db(s), "UPDATE counter SET n = 0; DELETE FROM items;"
                                                "INSERT INTO items VALUES ('taken', 0)", NULL, NULL, NULL),
                     SQLITE_OK);
}

static int nothing(struct store *s, void *ctx)
{
    (void)s;
    (void)ctx;
    return STORE_OK;
}

static int nest_txn(struct store *s, void *ctx)
{
    return store_txn(s, nothing, ctx);
}

/* Starting a transaction while holding a lock breaks the lock order (a
 * batch's leader may need that lock), and one started inside a callback
 * would wait for its own batch: both abort (ASSERT). */
static void expect_txn_aborts(int hold_lock, int nest)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        fclose(stderr); /* the assertion's log line is expected */
        struct store *s = store_thread();
        if (hold_lock)
            lock_note_acquired();
        if (nest)
            store_txn(s, nest_txn, NULL);
        else
            store_txn(s, nothing, NULL);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

static void test_a_transaction_under_a_lock_or_inside_another_aborts(void **state)
{
    (void)state;
    expect_txn_aborts(1, 0);
    expect_txn_aborts(0, 1);
    assert_int_equal(store_txn(store_thread(), nothing, NULL), STORE_OK); /* and the parent's are fine */
}

static void test_one_caller_gets_its_result_or_rolls_back(void **state)
{
    (void)state;
    struct store *s = store_thread();
    assert_non_null(s);
    reset_tables(s);
    struct job ok = {.outcome = COMMIT, .key = "a"}, no = {.outcome = REFUSE, .key = "b"},
               dup = {.outcome = DUPLICATE, .key = "c"};
    assert_int_equal(store_txn(s, job_txn, &ok), 1);
    assert_int_equal(store_txn(s, job_txn, &no), REFUSED);
    assert_int_equal(store_txn(s, job_txn, &dup), STORE_CONFLICT);
    assert_int_equal(one_int(s, "SELECT n FROM counter"), 1);
    assert_int_equal(one_int(s, "SELECT count(*) FROM items WHERE k IN ('a', 'b', 'c')"), 1);
}

/* One caller holds the transaction open until all the others have queued, so
 * the others make exactly one batch: one commit for all of them. */
#define QUEUED 24

/* A holder's callback waits until QUEUED others queue behind it; they join
 * its transaction, or, if the holder (alone in its batch, without a
 * savepoint) refuses and rolls back, share the next one. */
static void queue_behind_holder(enum outcome holder)
{
    struct store *s = store_thread();
    assert_non_null(s);
    reset_tables(s);
    struct store_txn_stats before, after;
    store_txn_stats(&before);

    struct job jobs[QUEUED + 1];
    pthread_t threads[QUEUED + 1];
    for (int i = 0; i <= QUEUED; i++) {
        jobs[i] = (struct job){.outcome = i % 3 == 1 ? REFUSE : i % 5 == 2 ? DUPLICATE : COMMIT, .thread = i};
        snprintf(jobs[i].key, sizeof jobs[i].key, "job-%d", i);
    }
    jobs[0].outcome = holder;
    jobs[0].hold_for = QUEUED;
    assert_int_equal(pthread_create(&threads[0], NULL, run_job, &jobs[0]), 0);
    /* The holder must be running its callback before the others queue. */
    while (!atomic_load(&jobs[0].entered))
        sched_yield();
    for (int i = 1; i <= QUEUED; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, run_job, &jobs[i]), 0);
    for (int i = 0; i <= QUEUED; i++)
        pthread_join(threads[i], NULL);
    store_txn_stats(&after);

    /* Every caller got its own outcome; the committed ones saw the counter
     * rise one by one, each seeing its predecessors' work and none of the
     * refused or failed ones'. */
    int committed = 0, seen[QUEUED + 2] = {0};
    for (int i = 0; i <= QUEUED; i++) {
        switch (jobs[i].outcome) {
        case REFUSE: assert_int_equal(jobs[i].result, REFUSED); break;
        case DUPLICATE: assert_int_equal(jobs[i].result, STORE_CONFLICT); break;
        case COMMIT:
            assert_in_range(jobs[i].result, 1, QUEUED + 1);
            assert_int_equal(seen[jobs[i].result], 0);
            seen[jobs[i].result] = 1;
            committed++;
            break;
        }
    }
    if (holder == COMMIT)
        assert_int_equal(jobs[0].result, 1);
    for (int v = 1; v <= committed; v++)
        assert_int_equal(seen[v], 1);
    assert_int_equal(one_int(s, "SELECT n FROM counter"), committed);
    assert_int_equal(one_int(s, "SELECT count(*) FROM items WHERE k LIKE 'job-%'"), committed);
    assert_int_equal(one_int(s, "SELECT count(*) FROM items WHERE k LIKE 'job-%' AND (by_thread % 3 = 1"
                                " OR by_thread % 5 = 2) AND by_thread <> 0"),
                     0);
    /* Those who queued while the holder's callback ran joined its
     * transaction: one commit for all. A holder that refused rolled the
     * transaction back before anyone joined; they share the next. */
    assert_int_equal(after.commits - before.commits, 1);
    assert_int_equal(after.transactions - before.transactions, committed);
    assert_int_equal(after.waiting, 0);
}

static void test_queued_callers_share_one_commit_and_keep_their_outcomes(void **state)
{
    (void)state;
    queue_behind_holder(COMMIT);
}

static void test_callers_queued_behind_a_refusal_still_commit_together(void **state)
{
    (void)state;
    queue_behind_holder(REFUSE);
}

/* Requests on unnamed databases (in memory) never share a batch: two of
 * them queued behind the same holder each run on their own database. */
struct memory_job {
    struct store *s;          /* its own in-memory database */
    int result;
};

static int memory_txn(struct store *s, void *vctx)
{
    (void)vctx;
    return sqlite3_exec(store_db(s), "INSERT INTO mine VALUES (1)", NULL, NULL, NULL) == SQLITE_OK ? STORE_OK
                                                                                                 : STORE_ERROR;
}

static void *run_memory_job(void *arg)
{
    struct memory_job *m = arg;
    m->result = store_txn(m->s, memory_txn, m);
    return NULL;
}

static void test_memory_databases_never_share_a_batch(void **state)
{
    (void)state;
    struct store *s = store_thread();
    assert_non_null(s);
    reset_tables(s);
    char err[256];
    struct memory_job mem[2];
    for (int i = 0; i < 2; i++) {
        mem[i].s = store_open(":memory:", err, sizeof err);
        assert_non_null(mem[i].s);
        assert_int_equal(sqlite3_exec(store_db(mem[i].s), "CREATE TABLE mine (x INTEGER)", NULL, NULL, NULL),
                         SQLITE_OK);
    }
    struct job holder = {.outcome = COMMIT, .key = "holder", .hold_for = 2};
    pthread_t h, t[2];
    assert_int_equal(pthread_create(&h, NULL, run_job, &holder), 0);
    while (!atomic_load(&holder.entered))
        sched_yield();
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, run_memory_job, &mem[i]), 0);
    pthread_join(h, NULL);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(holder.result, 1);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(mem[i].result, STORE_OK);
        assert_int_equal(one_int(mem[i].s, "SELECT count(*) FROM mine"), 1);
        store_close(mem[i].s);
    }
}

/* Many threads, many transactions each: totals add up whatever the batching. */
#define THREADS 12
#define PER_THREAD 60

struct worker {
    int thread;
    int committed;
    int bad_results;
};

static void *work(void *arg)
{
    struct worker *w = arg;
    struct store *s = store_thread();
    for (int i = 0; s && i < PER_THREAD; i++) {
        struct job j = {.outcome = (i + w->thread) % 4 == 0 ? REFUSE : (i + w->thread) % 7 == 0 ? DUPLICATE : COMMIT,
                        .thread = w->thread};
        snprintf(j.key, sizeof j.key, "w%d-%d", w->thread, i);
        int rc = store_txn(s, job_txn, &j);
        if (j.outcome == COMMIT && rc >= 1)
            w->committed++;
        else if (!(j.outcome == REFUSE && rc == REFUSED) && !(j.outcome == DUPLICATE && rc == STORE_CONFLICT))
            w->bad_results++;
    }
    return NULL;
}

static void test_concurrent_writers_lose_and_duplicate_nothing(void **state)
{
    (void)state;
    struct store *s = store_thread();
    assert_non_null(s);
    reset_tables(s);
    struct worker w[THREADS];
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (struct worker){.thread = i};
        assert_int_equal(pthread_create(&threads[i], NULL, work, &w[i]), 0);
    }
    int committed = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        assert_int_equal(w[i].bad_results, 0);
        committed += w[i].committed;
    }
    assert_true(committed > 0);
    assert_int_equal(one_int(s, "SELECT n FROM counter"), committed);
    assert_int_equal(one_int(s, "SELECT count(*) FROM items WHERE k LIKE 'w%'"), committed);
}

/* Every thread's writes run on one connection, so its page cache stays
 * warm: a connection that begins a transaction after another connection
 * wrote drops its whole cache, and before this each batch ran on whichever
 * thread led it. After the first read of the counter, no write from any
 * thread misses SQLite's page cache reading it again. That connection keeps
 * its temporary storage in memory. */
#define WARM_THREADS 4
#define WARM_WRITES 25

struct warm {
    struct store *ran_on[WARM_WRITES];
    int misses;     /* page cache misses reading the counter, after the first write */
    int temp_store; /* 2: savepoints' sub-journals in memory, not a temporary file per transaction */
    int failed;
};

static int count_txn(struct store *s, void *vctx)
{
    struct warm *w = vctx;
    int n = 0;
    for (; n < WARM_WRITES && w->ran_on[n]; n++)
        ;
    w->ran_on[n] = s;
    int cur, hi;
    sqlite3_db_status(store_db(s), SQLITE_DBSTATUS_CACHE_MISS, &cur, &hi, 1);
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(store_db(s), "UPDATE counter SET n = n + 1", -1, &st, NULL) == SQLITE_OK &&
                     sqlite3_step(st) == SQLITE_DONE
                 ? STORE_OK
                 : STORE_ERROR;
    sqlite3_finalize(st);
    sqlite3_db_status(store_db(s), SQLITE_DBSTATUS_CACHE_MISS, &cur, &hi, 1);
    if (n > 0)
        w->misses += cur;
    if (sqlite3_prepare_v2(store_db(s), "PRAGMA temp_store", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        w->temp_store = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return rc;
}

static void *warm_writer(void *arg)
{
    struct warm *w = arg;
    struct store *s = store_thread();
    for (int i = 0; i < WARM_WRITES; i++)
        w->failed += !s || store_txn(s, count_txn, w) != STORE_OK;
    return NULL;
}

static void test_every_thread_writes_on_one_warm_connection(void **state)
{
    (void)state;
    struct store *s = store_thread();
    assert_non_null(s);
    reset_tables(s);
    struct warm w[WARM_THREADS] = {0};
    pthread_t threads[WARM_THREADS];
    for (int i = 0; i < WARM_THREADS; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, warm_writer, &w[i]), 0);
    for (int i = 0; i < WARM_THREADS; i++)
        pthread_join(threads[i], NULL);
    for (int i = 0; i < WARM_THREADS; i++) {
        assert_int_equal(w[i].failed, 0);
        assert_int_equal(w[i].misses, 0);
        assert_int_equal(w[i].temp_store, 2);
        for (int k = 0; k < WARM_WRITES; k++) {
            assert_ptr_equal(w[i].ran_on[k], w[0].ran_on[0]);
            assert_ptr_not_equal(w[i].ran_on[k], s); /* not the test thread's own connection either */
        }
    }
    assert_int_equal(one_int(s, "SELECT n FROM counter"), WARM_THREADS * WARM_WRITES);
}

/* store_txn_async: one thread queues many transactions without waiting for
 * any; the committer thread leads them, and each is answered once with its
 * own outcome, on another thread. */
#define ASYNC_JOBS 40

struct answer {
    struct job job;
    pthread_t asker;
    int answers;        /* how many times it was answered: exactly once */
    int on_asker;       /* answered on the asking thread */
};

static void answered(void *ctx, int result)
{
    struct answer *a = ctx;
    a->job.result = result;
    a->on_asker += pthread_equal(pthread_self(), a->asker) != 0;
    a->answers++;
}

static void test_queued_without_waiting_each_is_answered_once_in_one_commit(void **state)
{
    (void)state;
    struct store *s = store_thread();
    assert_non_null(s);
    reset_tables(s);
    assert_int_equal(store_committer_start(), 0);
    struct store_txn_stats before, after;
    store_txn_stats(&before);
    static struct answer a[ASYNC_JOBS];
    for (int i = 0; i < ASYNC_JOBS; i++) {
        a[i] = (struct answer){.job = {.outcome = i % 3 == 1 ? REFUSE : i % 5 == 2 ? DUPLICATE : COMMIT, .thread = i},
                               .asker = pthread_self()};
        snprintf(a[i].job.key, sizeof a[i].job.key, "async-%d", i);
    }
    /* The first callback holds its transaction until all have been asked
     * for: only this thread asks, so store_txn_async must have returned
     * without waiting for the first's commit. */
    static atomic_int asked;
    atomic_store(&asked, 0);
    a[0].job.hold_for = ASYNC_JOBS;
    a[0].job.asked = &asked;
    for (int i = 0; i < ASYNC_JOBS; i++) {
        store_txn_async(s, job_txn, &a[i], answered);
        atomic_fetch_add(&asked, 1);
    }
    store_committer_stop(); /* answers everything queued first */
    store_txn_stats(&after);

    int committed = 0, seen[ASYNC_JOBS + 1] = {0};
    for (int i = 0; i < ASYNC_JOBS; i++) {
        assert_int_equal(a[i].answers, 1);
        assert_int_equal(a[i].on_asker, 0);
        switch (a[i].job.outcome) {
        case REFUSE: assert_int_equal(a[i].job.result, REFUSED); break;
        case DUPLICATE: assert_int_equal(a[i].job.result, STORE_CONFLICT); break;
        case COMMIT:
            assert_in_range(a[i].job.result, 1, ASYNC_JOBS);
            assert_int_equal(seen[a[i].job.result], 0);
            seen[a[i].job.result] = 1;
            committed++;
            break;
        }
    }
    assert_int_equal(one_int(s, "SELECT n FROM counter"), committed);
    assert_int_equal(one_int(s, "SELECT count(*) FROM items WHERE k LIKE 'async-%'"), committed);
    /* All of them joined the first one's transaction: one commit. */
    assert_int_equal(after.commits - before.commits, 1);
    assert_int_equal(after.transactions - before.transactions, committed);
    assert_int_equal(after.waiting, 0);
}

static void test_without_the_committer_the_answer_comes_before_returning(void **state)
{
    (void)state;
    struct store *s = store_thread();
    assert_non_null(s);
    reset_tables(s);
    struct answer a = {.job = {.outcome = COMMIT, .key = "inline"}, .asker = pthread_self()};
    store_txn_async(s, job_txn, &a, answered);
    assert_int_equal(a.answers, 1);
    assert_int_equal(a.on_asker, 1);
    assert_int_equal(a.job.result, 1);
    /* A connection of its own (not store_thread's) is never handed to the
     * committer, whose batches run on the thread database's writer. */
    char err[256];
    struct store *own = store_open(db_path, err, sizeof err);
    assert_non_null(own);
    assert_int_equal(store_committer_start(), 0);
    struct answer b = {.job = {.outcome = COMMIT, .key = "own"}, .asker = pthread_self()};
    store_txn_async(own, job_txn, &b, answered);
    assert_int_equal(b.answers, 1);
    assert_int_equal(b.on_asker, 1);
    assert_int_equal(b.job.result, 2);
    store_committer_stop();
    store_close(own);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_transaction_under_a_lock_or_inside_another_aborts),
        cmocka_unit_test(test_one_caller_gets_its_result_or_rolls_back),
        cmocka_unit_test(test_queued_callers_share_one_commit_and_keep_their_outcomes),
        cmocka_unit_test(test_callers_queued_behind_a_refusal_still_commit_together),
        cmocka_unit_test(test_memory_databases_never_share_a_batch),
        cmocka_unit_test(test_concurrent_writers_lose_and_duplicate_nothing),
        cmocka_unit_test(test_every_thread_writes_on_one_warm_connection),
        cmocka_unit_test(test_queued_without_waiting_each_is_answered_once_in_one_commit),
        cmocka_unit_test(test_without_the_committer_the_answer_comes_before_returning),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
