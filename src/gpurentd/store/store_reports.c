/* store_reports.c: runs the billing team's report views (migration
 * 0005_reports.sql and later ones) for `gpurentd report`, filtered by day,
 * and the online backup for `gpurentd backup`. */
#include "gpurent/log.h"
#include "store/store_sql.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Report names as operators type them, and the view behind each. Only
 * these views can be read: the name never reaches SQL as text. */
static const struct {
    const char *name;
    const char *sql;
} reports[] = {
    {"daily-revenue",    "SELECT * FROM report_daily_revenue WHERE (?1 IS NULL OR day >= ?1) AND (?2 IS NULL OR day < ?2)"
                      " ORDER BY day, gpu_type"                                                         },
    {"usage",            "SELECT * FROM report_usage WHERE (?1 IS NULL OR day >= ?1) AND (?2 IS NULL OR day < ?2)"
              " ORDER BY day, user_id, instance_id"                                                             },
    {"utilisation",      "SELECT * FROM report_utilisation WHERE (?1 IS NULL OR day >= ?1) AND (?2 IS NULL OR day < ?2)"
                    " ORDER BY day, gpu_type"                                                             },
    {"credit-liability", "SELECT * FROM report_credit_liability WHERE (?1 IS NULL OR day >= ?1)"
                         " AND (?2 IS NULL OR day < ?2) ORDER BY day IS NULL, day, user_id, grant_id"},
    {"topups",           "SELECT * FROM report_topups WHERE (?1 IS NULL OR day >= ?1) AND (?2 IS NULL OR day < ?2)"
               " ORDER BY day, user_id, topup_id"                                                              },
    {"admin-actions",    "SELECT * FROM report_admin_actions WHERE (?1 IS NULL OR day >= ?1) AND (?2 IS NULL OR day < ?2)"
                      " ORDER BY day, action_id"                                                        },
    {"storage",          "SELECT * FROM report_storage WHERE (?1 IS NULL OR day >= ?1) AND (?2 IS NULL OR day < ?2)"
                " ORDER BY day, user_id, volume_id"                                                        },
    {"reservation-revenue", "SELECT * FROM report_reservation_revenue WHERE (?1 IS NULL OR day >= ?1)"
                            " AND (?2 IS NULL OR day < ?2) ORDER BY day, gpu_model"},
    {"reservation-utilisation", "SELECT * FROM report_reservation_utilisation WHERE (?1 IS NULL OR day >= ?1)"
                                " AND (?2 IS NULL OR day < ?2) ORDER BY day, reservation_id"},
    {"reservation-refunds", "SELECT * FROM report_reservation_refunds WHERE (?1 IS NULL OR day >= ?1)"
                            " AND (?2 IS NULL OR day < ?2) ORDER BY day, kind, reservation_id"},
    {"account-events", "SELECT * FROM report_account_events WHERE (?1 IS NULL OR day >= ?1)"
                       " AND (?2 IS NULL OR day < ?2) ORDER BY day, event_id"},
};

/* Columns named *_micro hold money, which must come out as integers. SQLite
 * raises an error when sum() overflows, but plain arithmetic that overflows
 * (a product, a negated sum) quietly becomes a REAL: printed as an amount
 * that would be a wrong number, so the report fails instead. */
static int money_column(const char *name)
{
    size_t n = strlen(name);
    return n > 6 && strcmp(name + n - 6, "_micro") == 0;
}

const char *store_report_name(size_t i)
{
    return i < sizeof reports / sizeof reports[0] ? reports[i].name : NULL;
}

int store_report(struct store *s, const char *name, const char *from_day, const char *to_day, store_report_row_fn row,
                 void *ctx)
{
    const char *sql = NULL;
    for (size_t i = 0; i < sizeof reports / sizeof reports[0]; i++)
        if (strcmp(reports[i].name, name) == 0)
            sql = reports[i].sql;
    if (!sql)
        return STORE_NOT_FOUND;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(store_db(s), sql, -1, &st, NULL) != SQLITE_OK) {
        log_error("report %s: %s (is the database migrated?)", name, sqlite3_errmsg(store_db(s)));
        return STORE_ERROR;
    }
    if (from_day)
        sqlite3_bind_text(st, 1, from_day, -1, SQLITE_STATIC);
    if (to_day)
        sqlite3_bind_text(st, 2, to_day, -1, SQLITE_STATIC);
    int n = sqlite3_column_count(st), rc;
    const char *names[32], *values[32];
    int is_int[32];
    if (n > 32)
        n = 32;
    for (int c = 0; c < n; c++)
        names[c] = sqlite3_column_name(st, c);
    row(ctx, n, names, NULL, NULL); /* the header */
    int bad = -1;
    while (bad < 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        for (int c = 0; c < n; c++) {
            int type = sqlite3_column_type(st, c);
            values[c] = (const char *)sqlite3_column_text(st, c);
            is_int[c] = type == SQLITE_INTEGER;
            if (type != SQLITE_INTEGER && type != SQLITE_NULL && money_column(names[c]))
                bad = c;
        }
        if (bad < 0)
            row(ctx, n, names, values, is_int);
    }
    if (bad >= 0) {
        log_error("report %s: column %s holds %s, not an integer: a sum overflows 64-bit integers", name, names[bad],
                  values[bad] ? values[bad] : "?");
        sqlite3_finalize(st);
        return STORE_ERROR;
    }
    /* A step that failed (sum() overflowing among them) is logged with
     * SQLite's message before the statement goes. */
    int result = rc == SQLITE_DONE ? STORE_OK : store_rc_from_sqlite(s, rc, "report");
    sqlite3_finalize(st);
    return result;
}

int store_backup(struct store *s, const char *dest, char *err, size_t errlen)
{
    /* Named for this process: two backups to one file at once (an
     * overlapping cron run) each write their own copy, and the last to
     * finish is the file. */
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.%ld.partial", dest, (long)getpid());
    unlink(tmp);
    /* A copy of every password hash and payment: 0600 whatever the umask,
     * made before SQLite opens it (it keeps an existing file's mode). */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 || fchmod(fd, 0600) < 0) {
        snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    sqlite3 *out = NULL;
    if (sqlite3_open_v2(tmp, &out, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "cannot create %s: %s", tmp, out ? sqlite3_errmsg(out) : "out of memory");
        sqlite3_close(out);
        return -1;
    }
    sqlite3_backup *b = sqlite3_backup_init(out, "main", store_db(s), "main");
    if (!b) {
        snprintf(err, errlen, "cannot start the backup: %s", sqlite3_errmsg(out));
        sqlite3_close(out);
        unlink(tmp);
        return -1;
    }
    /* The whole copy in one step, inside one read transaction: the result is
     * one consistent snapshot. The database is in WAL mode, so that reader
     * never holds up the daemon's writers. (Copying in small steps instead
     * restarts the copy after every write the daemon makes between steps:
     * under a steady write load a database of more than a few steps never
     * finished backing up.) Only a momentary lock is retried. */
    int rc;
    while ((rc = sqlite3_backup_step(b, -1)) == SQLITE_OK || rc == SQLITE_BUSY || rc == SQLITE_LOCKED)
        sqlite3_sleep(5);
    sqlite3_backup_finish(b);
    if (rc != SQLITE_DONE) {
        snprintf(err, errlen, "backup failed: %s", sqlite3_errstr(rc));
        sqlite3_close(out);
        unlink(tmp);
        return -1;
    }
    char *msg = NULL;
    if (sqlite3_exec(out, "PRAGMA journal_mode=DELETE", NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(err, errlen, "backup: %s", msg ? msg : "?");
        sqlite3_free(msg);
        sqlite3_close(out);
        unlink(tmp);
        return -1;
    }
    sqlite3_close(out);
    fd = open(tmp, O_RDONLY);
    if (fd < 0 || fsync(fd) != 0 || rename(tmp, dest) != 0) {
        snprintf(err, errlen, "cannot finish %s: %s", dest, strerror(errno));
        if (fd >= 0)
            close(fd);
        unlink(tmp);
        return -1;
    }
    close(fd);
    return 0;
}
