/* store.c: SQLite connections, the per-connection statement cache, the
 * per-thread connection registry and the transaction runner (see store.h). */
#include "gpurent/assert.h"
#include "gpurent/log.h"
#include "store/store_sql.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define STMT_SLOTS 512 /* power of two; more than the statements we have */

struct store {
    sqlite3 *db; /* the connection */
    struct {
        const char *sql;    /* key: the SQL text's address */
        sqlite3_stmt *stmt; /* prepared once, reused */
    } stmts[STMT_SLOTS];
    struct store *next_thread; /* registry of store_thread() connections */
    bool is_thread;            /* opened by store_thread(): its database is thread_db_path */
    int catalog_dirty;         /* this transaction bumped catalog_generation (see catalog_hooks) */
    int auth_dirty;            /* this transaction changed api_keys or users (the key cache's sources) */
};

/* --- catalog generation (migration 0026) ---
 * Triggers bump catalog_generation.gen in every transaction that changes
 * what GET /v1/gpu-types shows. The update hook notices that row change on
 * this connection; the WAL hook runs once the commit is done and visible to
 * other connections, and only then moves the process-wide number, so a
 * reader that sees the new number also sees the committed change. A rolled
 * back transaction moves nothing. */
static _Atomic uint64_t catalog_gen = 1;
/* The same for what authenticates a request: auth_generation's row, which
 * the triggers of migration 0042 bump in every transaction that revokes a
 * key, changes its expiry, secret or owner, or changes a user's status or
 * role (not a key's last use, a new key or a new user). */
static _Atomic uint64_t auth_gen = 1;

/* Moves after every commit of this process (the WAL hook runs on each). */
static _Atomic uint64_t commit_gen = 1;

uint64_t store_commit_generation(void)
{
    return atomic_load_explicit(&commit_gen, memory_order_acquire);
}

uint64_t store_auth_generation(void)
{
    return atomic_load_explicit(&auth_gen, memory_order_acquire);
}

void store_global_init(void)
{
    sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
}

uint64_t store_catalog_generation(void)
{
    return atomic_load_explicit(&catalog_gen, memory_order_acquire);
}

/* A generation row as the database holds it (other processes' changes
 * too), by the one-row SELECT sql. */
static int generation_row(struct store *s, const char *sql, const char *what, int64_t *gen)
{
    sqlite3_stmt *st = store_stmt(s, sql);
    if (!st)
        return STORE_ERROR;
    int rc = sqlite3_step(st);
    *gen = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_reset(st);
    return rc == SQLITE_ROW ? STORE_OK : store_rc_from_sqlite(s, rc, what);
}

int store_catalog_generation_db(struct store *s, int64_t *gen)
{
    static const char sql[] = "SELECT gen FROM catalog_generation WHERE id = 1";
    return generation_row(s, sql, "read catalog generation", gen);
}

int store_auth_generation_db(struct store *s, int64_t *gen)
{
    static const char sql[] = "SELECT gen FROM auth_generation WHERE id = 1";
    return generation_row(s, sql, "read auth generation", gen);
}

static void catalog_update_hook(void *ctx, int op, const char *db, const char *table, sqlite3_int64 rowid)
{
    (void)op, (void)db, (void)rowid;
    struct store *s = ctx;
    if (strcmp(table, "catalog_generation") == 0)
        s->catalog_dirty = 1;
    else if (strcmp(table, "auth_generation") == 0)
        s->auth_dirty = 1;
}

static void catalog_rollback_hook(void *ctx)
{
    ((struct store *)ctx)->catalog_dirty = 0;
    ((struct store *)ctx)->auth_dirty = 0;
}

/* Replaces SQLite's default WAL hook, so it also checkpoints as that one
 * does (passive, once the log holds 1 000 pages). */
static int catalog_wal_hook(void *ctx, sqlite3 *db, const char *name, int pages)
{
    struct store *s = ctx;
    atomic_fetch_add_explicit(&commit_gen, 1, memory_order_release);
    if (s->catalog_dirty) {
        s->catalog_dirty = 0;
        atomic_fetch_add_explicit(&catalog_gen, 1, memory_order_release);
    }
    if (s->auth_dirty) {
        s->auth_dirty = 0;
        atomic_fetch_add_explicit(&auth_gen, 1, memory_order_release);
    }
    if (pages >= 1000)
        sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
    return SQLITE_OK;
}

static void catalog_hooks(struct store *s)
{
    sqlite3_update_hook(s->db, catalog_update_hook, s);
    sqlite3_rollback_hook(s->db, catalog_rollback_hook, s);
    sqlite3_wal_hook(s->db, catalog_wal_hook, s);
}

static int exec(sqlite3 *db, const char *sql, char *err, size_t errlen)
{
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(err, errlen, "%s: %s", sql, msg ? msg : sqlite3_errmsg(db));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

/* The database holds password hashes and the ledger: never readable by
 * others, whatever the umask. SQLite gives its -wal and -shm files the
 * database file's own mode, so making that file first, 0640 (the daemon's
 * group may read, for the billing team's reports), covers all three; one
 * found readable by others loses that. */
static int database_file_private(const char *path, char *err, size_t errlen)
{
    if (!path[0] || strcmp(path, ":memory:") == 0 || strncmp(path, "file:", 5) == 0)
        return 0;
    /* Only a file made here is opened and closed: closing a descriptor of
     * a database this process already has open would drop the POSIX locks
     * its connections hold on it. An existing file is changed by name. */
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0640);
    if (fd >= 0) {
        close(fd);
        return 0;
    }
    struct stat st;
    if (errno != EEXIST || stat(path, &st) < 0) {
        snprintf(err, errlen, "cannot open database %s: %s", path, strerror(errno));
        return -1;
    }
    if ((st.st_mode & 0007) && chmod(path, st.st_mode & 0770) == 0)
        log_warn("store: %s was readable by others; now mode %04o", path, (unsigned)(st.st_mode & 0770));
    return 0;
}

static struct store *open_flags(const char *path, int flags, char *err, size_t errlen)
{
    if ((flags & SQLITE_OPEN_CREATE) && database_file_private(path, err, errlen) < 0)
        return NULL;
    struct store *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (sqlite3_open_v2(path, &s->db, flags | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "cannot open database %s: %s", path, s->db ? sqlite3_errmsg(s->db) : "out of memory");
        sqlite3_close(s->db);
        free(s);
        return NULL;
    }
    sqlite3_extended_result_codes(s->db, 1);
    /* Every connection sets these itself: they are per connection, and money
     * that was acknowledged must survive a crash (synchronous=FULL in WAL). */
    sqlite3_busy_timeout(s->db, 5000);
    int readonly = (flags & SQLITE_OPEN_READONLY) != 0;
    if ((!readonly && exec(s->db, "PRAGMA journal_mode=WAL", err, errlen) < 0) ||
        exec(s->db, "PRAGMA synchronous=FULL", err, errlen) < 0 ||
        exec(s->db, "PRAGMA foreign_keys=ON", err, errlen) < 0) {
        store_close(s);
        return NULL;
    }
    if (store_rows_register(s->db) != SQLITE_OK) {
        snprintf(err, errlen, "cannot register store_rows: %s", sqlite3_errmsg(s->db));
        store_close(s);
        return NULL;
    }
    catalog_hooks(s);
    return s;
}

struct store *store_open(const char *path, char *err, size_t errlen)
{
    struct store *s = open_flags(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, err, errlen);
    /* SQLite opens a file it may not write read-only, without a word: every
     * write would then fail, one request at a time. */
    if (s && sqlite3_db_readonly(s->db, "main") == 1) {
        snprintf(err, errlen, "database %s is read-only to this process (its file, or the directory of its WAL,"
                 " is not writable): nothing could be recorded", path);
        store_close(s);
        return NULL;
    }
    return s;
}

struct store *store_open_readonly(const char *path, char *err, size_t errlen)
{
    return open_flags(path, SQLITE_OPEN_READONLY, err, errlen);
}

void store_close(struct store *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < STMT_SLOTS; i++)
        sqlite3_finalize(s->stmts[i].stmt);
    sqlite3_close(s->db);
    free(s);
}

sqlite3 *store_db(struct store *s)
{
    return s->db;
}

void store_column_text(char *dst, size_t n, sqlite3_stmt *st, int col)
{
    const unsigned char *t = sqlite3_column_text(st, col);
    snprintf(dst, n, "%s", t ? (const char *)t : "");
}

sqlite3_stmt *store_stmt(struct store *s, const char *sql)
{
    size_t h = ((uintptr_t)sql >> 3) * 2654435761u;
    for (size_t i = 0; i < STMT_SLOTS; i++) {
        size_t slot = (h + i) & (STMT_SLOTS - 1);
        if (s->stmts[slot].sql == sql) {
            sqlite3_stmt *st = s->stmts[slot].stmt;
            sqlite3_reset(st);
            sqlite3_clear_bindings(st);
            return st;
        }
        if (!s->stmts[slot].sql) {
            sqlite3_stmt *st = NULL;
            if (sqlite3_prepare_v3(s->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL) != SQLITE_OK) {
                log_error("store: cannot prepare [%s]: %s", sql, sqlite3_errmsg(s->db));
                return NULL;
            }
            s->stmts[slot].sql = sql;
            s->stmts[slot].stmt = st;
            return st;
        }
    }
    log_error("store: statement cache full");
    return NULL;
}

int store_step_write(struct store *s, sqlite3_stmt *st, const char *what)
{
    int rc = store_rc_from_sqlite(s, sqlite3_step(st), what);
    sqlite3_reset(st);
    return rc;
}

int store_step_change(struct store *s, sqlite3_stmt *st, const char *what)
{
    int rc = store_step_write(s, st, what);
    if (rc == STORE_OK && sqlite3_changes(s->db) == 0)
        return STORE_NOT_FOUND;
    return rc;
}

int store_read_one(struct store *s, sqlite3_stmt *st, void *out, void (*read)(sqlite3_stmt *st, void *row),
                   const char *what)
{
    int rc = sqlite3_step(st), result;
    if (rc == SQLITE_ROW) {
        read(st, out);
        result = STORE_OK;
    } else {
        result = rc == SQLITE_DONE ? STORE_NOT_FOUND : store_rc_from_sqlite(s, rc, what);
    }
    sqlite3_reset(st);
    return result;
}

int store_read_rows(struct store *s, sqlite3_stmt *st, void *out, size_t size, size_t max, size_t *n,
                    void (*read)(sqlite3_stmt *st, void *row), const char *what)
{
    *n = 0;
    int rc = SQLITE_DONE;
    while (*n < max && (rc = sqlite3_step(st)) == SQLITE_ROW)
        read(st, (char *)out + (*n)++ * size);
    int result = *n == max || rc == SQLITE_DONE ? STORE_OK : store_rc_from_sqlite(s, rc, what);
    sqlite3_reset(st);
    return result;
}

int store_collect(struct store *s, sqlite3_stmt *st, size_t size, void **out, size_t *n,
                  void (*read)(sqlite3_stmt *st, void *row), const char *what)
{
    *out = NULL;
    *n = 0;
    size_t cap = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 64;
            void *grown = realloc(*out, cap * size);
            if (!grown) {
                sqlite3_reset(st);
                free(*out);
                *out = NULL;
                *n = 0;
                return STORE_ERROR;
            }
            *out = grown;
        }
        read(st, (char *)*out + (*n)++ * size);
    }
    int result = rc == SQLITE_DONE ? STORE_OK : store_rc_from_sqlite(s, rc, what);
    sqlite3_reset(st);
    if (result != STORE_OK) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return result;
}

void store_read_id(sqlite3_stmt *st, void *row)
{
    store_column_text(row, ID_MAX, st, 0);
}

char *store_ids_json(const char (*ids)[ID_MAX], size_t n)
{
    /* Ids are [a-z0-9_] (ids.c): they need no JSON escaping. */
    char *list = malloc(n * (ID_MAX + 3) + 3), *p = list;
    if (!list)
        return NULL;
    *p++ = '[';
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "%s\"%.*s\"", i ? "," : "", ID_MAX - 1, ids[i]);
    *p++ = ']';
    *p = '\0';
    return list;
}

/* ---------------------------------------------------------------- a full disk */

/* Set while writes fail for want of space (SQLITE_FULL, or an I/O error
 * whose errno is ENOSPC), so the API answers 503 rather than 500 and
 * /readyz fails; cleared by a commit DISK_FULL_LATELY_MS after the last
 * such failure, or once the file system has room again. Logged once per
 * change, not once per failed write. */
static atomic_int disk_full;
static _Atomic int64_t disk_full_seen_ms; /* CLOCK_MONOTONIC ms of the last write that failed for space */
static char thread_db_path[4096];         /* set once before threads start */

/* How long a write's failure for space explains errors after it. */
#define DISK_FULL_LATELY_MS 5000

static int64_t monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Free space that counts as room again: a commit needs some pages of WAL. */
#define DISK_ROOM_BYTES (1024 * 1024)

static int is_disk_full(struct store *s, int rc)
{
    return (rc & 0xff) == SQLITE_FULL || ((rc & 0xff) == SQLITE_IOERR && sqlite3_system_errno(s->db) == ENOSPC);
}

static void disk_full_set(int full, const char *why)
{
    if (atomic_exchange(&disk_full, full) == full)
        return;
    if (full)
        log_error("store: the database's file system is full (%s); writes are answered 503 until space returns",
                  why);
    else
        log_info("store: the database's file system has room again (%s); writes resume", why);
}

int store_disk_full(void)
{
    if (!atomic_load(&disk_full))
        return 0;
    /* Nothing may write for a while (no requests, no nodes): look at the
     * file system itself, so readiness comes back without a write. */
    char dir[sizeof thread_db_path];
    snprintf(dir, sizeof dir, "%s", thread_db_path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *(slash == dir ? slash + 1 : slash) = '\0';
    struct statvfs fs;
    if (statvfs(slash ? dir : ".", &fs) == 0 && (uint64_t)fs.f_bavail * fs.f_frsize >= DISK_ROOM_BYTES)
        disk_full_set(0, "free space seen");
    return atomic_load(&disk_full);
}

int store_disk_full_lately(void)
{
    int64_t seen = atomic_load(&disk_full_seen_ms);
    return store_disk_full() || (seen && monotonic_ms() - seen < DISK_FULL_LATELY_MS);
}

int64_t store_int64_by_text(struct store *s, const char *sql, const char *arg, const char *what)
{
    sqlite3_stmt *st = store_stmt(s, sql);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, arg, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    int64_t v = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : store_rc_from_sqlite(s, rc, what);
    sqlite3_reset(st);
    return v;
}

int store_rc_from_sqlite(struct store *s, int rc, const char *what)
{
    switch (rc & 0xff) {
    case SQLITE_OK:
    case SQLITE_DONE:
    case SQLITE_ROW:
        return STORE_OK;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return STORE_BUSY;
    case SQLITE_CONSTRAINT:
        if (rc == SQLITE_CONSTRAINT_UNIQUE || rc == SQLITE_CONSTRAINT_PRIMARYKEY)
            return STORE_CONFLICT;
        log_error("store: %s: constraint failed: %s", what, sqlite3_errmsg(s->db));
        return STORE_ERROR;
    default:
        if (is_disk_full(s, rc)) {
            atomic_store(&disk_full_seen_ms, monotonic_ms());
            disk_full_set(1, sqlite3_errmsg(s->db));
            return STORE_ERROR;
        }
        log_error("store: %s: %s", what, sqlite3_errmsg(s->db));
        return STORE_ERROR;
    }
}

/* ---------------------------------------------------------------- per-thread connections */

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct store *registry;    /* every store_thread() connection */
static _Thread_local struct store *this_thread;

void store_set_path(const char *path)
{
    snprintf(thread_db_path, sizeof thread_db_path, "%s", path);
}

struct store *store_thread(void)
{
    if (this_thread)
        return this_thread;
    char err[512];
    struct store *s = store_open(thread_db_path, err, sizeof err);
    if (!s) {
        log_error("store: %s", err);
        return NULL;
    }
    s->is_thread = true;
    pthread_mutex_lock(&registry_lock);
    s->next_thread = registry;
    registry = s;
    pthread_mutex_unlock(&registry_lock);
    this_thread = s;
    return s;
}

/* The connection every batch of the store_thread() database runs on,
 * whichever thread leads it (see run_batch). SQLite drops a connection's
 * whole page cache when it begins a transaction after another connection
 * has written, so batches that ran on whichever thread led found a cold
 * cache each time and read every page again (a pread and a copy each;
 * claims from 4 threads were slower than from one, issue 15). One
 * connection that does all the writing keeps its cache. Used only by the
 * thread leading a batch; opened on first use, closed by
 * store_close_threads. */
static struct store *writer;

static struct store *writer_for(struct store *s, const char *db_file)
{
    if (writer)
        return db_file && strcmp(db_file, sqlite3_db_filename(writer->db, "main")) == 0 ? writer : s;
    if (!s->is_thread)
        return s;
    char err[512];
    if (!(writer = store_open(thread_db_path, err, sizeof err))) {
        log_error("store: the writer connection: %s", err);
        return s;
    }
    /* Each callback of a batch runs in a savepoint, and SQLite keeps the
     * pages a savepoint changes in a sub-journal, by default a temporary
     * file opened, written and closed in every transaction (7 % of a
     * create's CPU in system calls). In memory it is a few pages; the
     * reader connections, whose report queries may sort a lot, keep their
     * temporary files. */
    if (exec(writer->db, "PRAGMA temp_store=MEMORY", err, sizeof err) < 0)
        log_warn("store: the writer connection: %s", err);
    return writer;
}

void store_close_threads(void)
{
    pthread_mutex_lock(&registry_lock);
    struct store *s = registry;
    registry = NULL;
    pthread_mutex_unlock(&registry_lock);
    while (s) {
        struct store *next = s->next_thread;
        store_close(s);
        s = next;
    }
    this_thread = NULL;
    store_close(writer);
    writer = NULL;
}

/* ---------------------------------------------------------------- transactions */

static void backoff(int attempt)
{
    struct timespec ts = {0, (long)(1 + (attempt % 20)) * 2 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

/* Transaction control through the statement cache: parsed once per
 * connection rather than on every transaction. */
static const char SQL_BEGIN[] = "BEGIN IMMEDIATE";
static const char SQL_COMMIT[] = "COMMIT";
static const char SQL_ROLLBACK[] = "ROLLBACK";
static const char SQL_SAVEPOINT[] = "SAVEPOINT request";
static const char SQL_ROLLBACK_TO[] = "ROLLBACK TO request";
static const char SQL_RELEASE[] = "RELEASE request";

static int control(struct store *s, const char *sql)
{
    sqlite3_stmt *st = store_stmt(s, sql);
    return st ? store_step_write(s, st, sql) : STORE_ERROR;
}

/* Set while this thread runs a transaction callback: a callback that
 * called store_txn would wait for the very batch it is part of. */
static _Thread_local int in_callback;

static int run_callback(struct store *s, store_txn_fn fn, void *ctx)
{
    in_callback++;
    int rc = fn(s, ctx);
    in_callback--;
    return rc;
}

static const char SQL_PART[] = "SAVEPOINT part";
static const char SQL_PART_ROLLBACK[] = "ROLLBACK TO part";
static const char SQL_PART_RELEASE[] = "RELEASE part";

int store_part(struct store *s, store_txn_fn fn, void *ctx, int *result)
{
    *result = STORE_ERROR;
    if (control(s, SQL_PART) != STORE_OK)
        return -1;
    ASSERT(in_callback); /* a part of the transaction a callback runs in */
    *result = fn(s, ctx);
    if (sqlite3_get_autocommit(s->db))
        return -1; /* SQLite rolled the whole transaction back itself */
    if (*result < 0 && control(s, SQL_PART_ROLLBACK) != STORE_OK)
        return -1;
    return control(s, SQL_PART_RELEASE) == STORE_OK ? 0 : -1;
}

/* Group commit. With synchronous=FULL every COMMIT waits for an fsync, which
 * costs up to a millisecond on our disks and would cap the daemon at about a
 * thousand writes a second however many threads ask. So writers of this
 * process queue here, and whichever finds no transaction running leads: it
 * runs the callbacks of every writer waiting (its own among them), and of
 * those that queue meanwhile, on the writer connection (writer_for), each
 * inside a savepoint so that one callback's rollback leaves the others'
 * work alone, and commits them with one fsync. Each callback still
 * sees the database exactly as the ones before it left it, as if the writers
 * had taken turns; a caller returns only once its work is durable.
 *
 * The queue also replaces SQLite's busy handler between our own threads: the
 * next batch starts the moment the last one commits, instead of sleeping in
 * the handler's 1, 2, 5 … 100 ms steps. Other processes (the command-line
 * tools, the billing team's readers) still meet the busy timeout. */
#define BATCH_MAX 64 /* callbacks per commit: bounds how long the last waits */

#define ATTEMPTS_MAX 200 /* tries of one callback that meets STORE_BUSY */

struct txn_request {
    store_txn_fn fn;
    void *ctx;
    const char *db_file;  /* the database's file; NULL if it has none */
    int result;
    bool done;            /* a waiting caller's request has its result */
    store_done_fn answer; /* NULL for a waiting caller (store_txn); else store_txn_async's */
    int attempts;         /* of an answered request: batches it ran in */
    struct txn_request *next;
};

static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queue_done = PTHREAD_COND_INITIALIZER;
static pthread_cond_t committer_work = PTHREAD_COND_INITIALIZER;
static struct txn_request *queue;    /* FIFO of waiting requests */
static int queued_answered;          /* of them, store_txn_async's */
static bool leading;                 /* a batch is running */
static bool committing;              /* the committer thread takes store_txn_async's requests */
static pthread_t committer;
static struct store_txn_stats stats; /* guarded by queue_lock */

/* Runs one request's callback in a savepoint of the open transaction, so
 * that its failure undoes its own work only. Returns 0, or -1 when its work
 * could not be undone or kept apart (the savepoint statements failed): the
 * whole transaction must go then. */
static int run_in_savepoint(struct store *s, struct txn_request *r)
{
    if (control(s, SQL_SAVEPOINT) != STORE_OK) {
        r->result = STORE_ERROR;
        return -1;
    }
    r->result = run_callback(s, r->fn, r->ctx);
    if (sqlite3_get_autocommit(s->db))
        return -1; /* SQLite rolled the whole transaction back itself */
    if (r->result < 0 && control(s, SQL_ROLLBACK_TO) != STORE_OK)
        return -1;
    return control(s, SQL_RELEASE) == STORE_OK ? 0 : -1;
}

/* Whether r may share the batch that own's thread leads: only a request on
 * the same database file. A request on an unnamed database (in memory,
 * temporary) shares with nobody: two of them are different databases. */
static bool same_database(const struct txn_request *r, const struct txn_request *own)
{
    if (!r->db_file || !own->db_file)
        return r == own;
    return strcmp(r->db_file, own->db_file) == 0;
}

/* Moves up to max queued requests that may share own's batch out of the
 * queue, in order, and returns them as a list. Called with queue_lock
 * held. */
static struct txn_request *take_batch(const struct txn_request *own, int max)
{
    struct txn_request *batch = NULL, **tail = &batch, **link = &queue;
    int taken = 0;
    while (*link && taken < max) {
        struct txn_request *r = *link;
        if (!same_database(r, own)) {
            link = &r->next;
            continue;
        }
        *link = r->next;
        r->next = NULL;
        stats.waiting--;
        queued_answered -= r->answer != NULL;
        *tail = r;
        tail = &r->next;
        taken++;
    }
    return batch;
}

/* Runs batch (a NULL-terminated list) in one transaction on s, setting each
 * request's result. A batch of one needs no savepoint: its failure rolls
 * the transaction back. Requests of own's database that queue while the
 * callbacks run join the transaction before it commits, up to BATCH_MAX in
 * all, linked at the end of batch: they would otherwise wait for this
 * commit and then pay a sync of their own, and HTTP threads, which reply
 * and read the next request between two transactions, mostly arrive just
 * after a batch was taken (issue 15). */
static void run_batch(struct store *s, struct txn_request *batch, const struct txn_request *own)
{
    int rc = control(s, SQL_BEGIN);
    struct txn_request *r = batch, *last = batch;
    int taken = 1;
    while (last->next)
        last = last->next, taken++;
    if (rc == STORE_OK && !batch->next) {
        batch->result = run_callback(s, batch->fn, batch->ctx);
        rc = batch->result < 0 ? batch->result : STORE_OK;
        r = NULL;
    }
    for (;;) {
        if (!r) {
            if (rc != STORE_OK || taken >= BATCH_MAX)
                break;
            pthread_mutex_lock(&queue_lock);
            struct txn_request *more = take_batch(own, BATCH_MAX - taken);
            pthread_mutex_unlock(&queue_lock);
            if (!more)
                break;
            last->next = more;
            for (r = more; last->next; last = last->next)
                taken++;
        }
        if (rc != STORE_OK) {
            r->result = rc;
        } else if (run_in_savepoint(s, r) < 0) {
            /* Some errors (I/O, disk full) make SQLite roll back the whole
             * transaction, and a savepoint that cannot be rolled back or
             * released leaves this callback's work tangled with the others':
             * either way the whole transaction goes. The earlier callbacks
             * run again (callbacks are written to be retried), this one
             * fails, and the rest, not run yet, try again too. */
            for (struct txn_request *e = batch; e != r; e = e->next)
                e->result = STORE_BUSY;
            if (r->result >= 0)
                r->result = STORE_ERROR;
            rc = STORE_BUSY;
        }
        r = r->next;
    }
    if (rc == STORE_OK && (rc = control(s, SQL_COMMIT)) == STORE_OK) {
        /* A small commit can still find room in the log's pages while
         * larger ones fail: only one with no failure for space near it
         * says the disk has room (no flapping of the flag and the log). */
        if (atomic_load(&disk_full) && monotonic_ms() - atomic_load(&disk_full_seen_ms) >= DISK_FULL_LATELY_MS)
            disk_full_set(0, "a commit succeeded");
        return;
    }
    /* ROLLBACK fails only if SQLite already rolled back; either way the
     * transaction is over and no callback's work was kept. */
    if (!sqlite3_get_autocommit(s->db))
        control(s, SQL_ROLLBACK);
    for (struct txn_request *e = batch; e; e = e->next)
        if (e->result >= 0)
            e->result = rc;
}

/* Appends r to the queue. Called with queue_lock held. */
static void enqueue(struct txn_request *r)
{
    struct txn_request **tail = &queue;
    while (*tail)
        tail = &(*tail)->next;
    r->next = NULL;
    *tail = r;
    stats.waiting++;
    queued_answered += r->answer != NULL;
}

/* Leads one batch: takes own and the requests that may share its
 * transaction, runs them on s's writer and hands each its result. Called
 * with queue_lock held and no batch running; returns with it held. A
 * waiting caller's request is marked done; an answered one that met
 * STORE_BUSY queues again (the sync caller's backoff would hold up the
 * committer; BEGIN already waits out another process's lock), and the rest
 * are answered once the next batch may start, outside the lock. */
static void lead(struct store *s, const struct txn_request *own)
{
    leading = true;
    struct txn_request *batch = take_batch(own, BATCH_MAX);
    const char *db_file = own->db_file; /* own may be answered and freed below */
    pthread_mutex_unlock(&queue_lock);
    run_batch(writer_for(s, db_file), batch, own);
    pthread_mutex_lock(&queue_lock);
    int64_t committed = 0;
    struct txn_request *answered = NULL;
    while (batch) {
        struct txn_request *r = batch;
        batch = r->next;
        committed += r->result >= 0;
        if (!r->answer) {
            r->done = true; /* the waiter may return (and free it) now */
        } else if (r->result == STORE_BUSY && ++r->attempts < ATTEMPTS_MAX) {
            enqueue(r);
        } else {
            r->next = answered;
            answered = r;
        }
    }
    stats.commits += committed > 0;
    stats.transactions += committed;
    leading = false;
    pthread_cond_broadcast(&queue_done);
    if (queued_answered)
        pthread_cond_signal(&committer_work);
    if (!answered)
        return;
    pthread_mutex_unlock(&queue_lock);
    while (answered) {
        struct txn_request *r = answered;
        answered = r->next;
        if (r->result == STORE_BUSY)
            log_error("store: transaction still busy after many retries");
        r->answer(r->ctx, r->result);
        free(r);
    }
    pthread_mutex_lock(&queue_lock);
}

/* One attempt: queues the request and waits until a batch (led by this
 * thread or another) has run it. Returns its result. */
static int txn_once(struct store *s, store_txn_fn fn, void *ctx)
{
    struct txn_request req = {.fn = fn, .ctx = ctx, .db_file = sqlite3_db_filename(s->db, "main")};
    /* An in-memory or temporary database has no name, and two of them are
     * different databases: such a request runs in a batch of its own. */
    if (!req.db_file || !req.db_file[0])
        req.db_file = NULL;
    pthread_mutex_lock(&queue_lock);
    enqueue(&req);
    while (!req.done) {
        if (leading)
            pthread_cond_wait(&queue_done, &queue_lock);
        else
            lead(s, &req);
    }
    pthread_mutex_unlock(&queue_lock);
    return req.result;
}

/* The committer: leads a batch whenever store_txn_async's requests wait and
 * no batch runs, so that they commit without a caller's thread waiting. It
 * stops once asked to and nothing it must answer is queued. */
static struct store *committer_store; /* its handle to the writer (writer_for) */

static void *committer_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&queue_lock);
    for (;;) {
        struct txn_request *first = queue;
        while (first && !first->answer)
            first = first->next;
        if (first && !leading)
            lead(committer_store, first);
        else if (!first && !committing)
            break;
        else
            pthread_cond_wait(&committer_work, &queue_lock);
    }
    pthread_mutex_unlock(&queue_lock);
    return NULL;
}

int store_committer_start(void)
{
    ASSERT(!committer_store);
    char err[512];
    if (!(committer_store = store_open(thread_db_path, err, sizeof err))) {
        log_error("store: the committer's connection: %s", err);
        return -1;
    }
    committer_store->is_thread = true; /* of the store_thread() database: its batches go to the writer */
    pthread_mutex_lock(&queue_lock);
    committing = pthread_create(&committer, NULL, committer_main, NULL) == 0;
    if (committing)
        pthread_setname_np(committer, "committer");
    pthread_mutex_unlock(&queue_lock);
    if (committing)
        return 0;
    log_error("store: cannot start the committer thread");
    store_close(committer_store);
    committer_store = NULL;
    return -1;
}

void store_committer_stop(void)
{
    if (!committer_store)
        return;
    pthread_mutex_lock(&queue_lock);
    committing = false;
    pthread_cond_signal(&committer_work);
    pthread_mutex_unlock(&queue_lock);
    pthread_join(committer, NULL);
    store_close(committer_store);
    committer_store = NULL;
}

void store_txn_async(struct store *s, store_txn_fn fn, void *ctx, store_done_fn answer)
{
    ASSERT(!in_callback);
    ASSERT(locks_held() == 0);
    struct txn_request *r = calloc(1, sizeof *r);
    pthread_mutex_lock(&queue_lock);
    /* The committer's batches run on the store_thread() database's writer:
     * a request on another database (a test's own connection) cannot join
     * them, and without the committer nobody would lead. */
    if (!r || !committing || !s->is_thread) {
        pthread_mutex_unlock(&queue_lock);
        free(r);
        answer(ctx, store_txn(s, fn, ctx));
        return;
    }
    *r = (struct txn_request){.fn = fn, .ctx = ctx, .db_file = sqlite3_db_filename(s->db, "main"), .answer = answer};
    enqueue(r);
    if (!leading)
        pthread_cond_signal(&committer_work);
    pthread_mutex_unlock(&queue_lock);
}

void store_txn_stats(struct store_txn_stats *out)
{
    pthread_mutex_lock(&queue_lock);
    *out = stats;
    pthread_mutex_unlock(&queue_lock);
}

static const char SQL_READ_BEGIN[] = "BEGIN DEFERRED";
static const char SQL_READ_END[] = "COMMIT";

int store_read_begin(struct store *s)
{
    ASSERT(!in_callback);
    sqlite3_stmt *st = store_stmt(s, SQL_READ_BEGIN);
    return st ? store_step_write(s, st, "begin read") : STORE_ERROR;
}

void store_read_end(struct store *s)
{
    sqlite3_stmt *st = store_stmt(s, SQL_READ_END);
    if (!st || store_step_write(s, st, "end read") != STORE_OK)
        sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL); /* never leave the next store_txn inside one */
}

int store_txn(struct store *s, store_txn_fn fn, void *ctx)
{
    ASSERT(!in_callback);     /* never nest store_txn (store.h) */
    ASSERT(locks_held() == 0); /* the lock order: no lock held across a transaction */
    for (int attempt = 0; attempt < 200; attempt++) {
        int result = txn_once(s, fn, ctx);
        if (result != STORE_BUSY)
            return result;
        backoff(attempt);
    }
    log_error("store: transaction still busy after many retries");
    return STORE_BUSY;
}
