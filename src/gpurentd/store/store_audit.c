/* store_audit.c: SQL for admin_actions, the record of what admins did with
 * money (migration 0013): one row written in the transaction of each change,
 * read back newest first. */
#include "store/store_sql.h"

#include <stdio.h>
#include <string.h>

static const char SQL_ACTION_INSERT[] =
    "INSERT INTO admin_actions (at, admin_user_id, api_key_id, action, target, amount, detail, reason)"
    " VALUES (?, ?, ?, ?, nullif(?, ''), ?, ?, ?)";
/* ?5 is the cursor: the id of the last row already shown (newest first). */
static const char SQL_ACTIONS[] =
    "SELECT id, at, admin_user_id, api_key_id, action, coalesce(target, ''), coalesce(amount, -1), detail, reason"
    " FROM admin_actions WHERE (?1 IS NULL OR action = ?1) AND (?2 IS NULL OR target = ?2)"
    " AND (?3 IS NULL OR admin_user_id = ?3) AND id < ?4 ORDER BY id DESC LIMIT ?5";

int store_admin_action_insert(struct store *s, const struct admin_action *a)
{
    sqlite3_stmt *st = store_stmt(s, SQL_ACTION_INSERT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_int64(st, 1, a->at);
    sqlite3_bind_text(st, 2, a->admin_user_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, a->api_key_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, a->action, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, a->target, -1, SQLITE_STATIC);
    if (a->amount >= 0)
        sqlite3_bind_int64(st, 6, a->amount);
    sqlite3_bind_text(st, 7, a->detail, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 8, a->reason, -1, SQLITE_STATIC);
    return store_step_write(s, st, "insert admin action");
}

static void read_action(sqlite3_stmt *st, void *row)
{
    struct admin_action *a = row;
    a->id = sqlite3_column_int64(st, 0);
    a->at = sqlite3_column_int64(st, 1);
    store_column_text(a->admin_user_id, sizeof a->admin_user_id, st, 2);
    store_column_text(a->api_key_id, sizeof a->api_key_id, st, 3);
    store_column_text(a->action, sizeof a->action, st, 4);
    store_column_text(a->target, sizeof a->target, st, 5);
    a->amount = sqlite3_column_int64(st, 6);
    store_column_text(a->detail, sizeof a->detail, st, 7);
    store_column_text(a->reason, sizeof a->reason, st, 8);
}

int store_admin_actions(struct store *s, const struct admin_action_filter *f, struct admin_action *out, size_t max,
                        size_t *n)
{
    *n = 0;
    sqlite3_stmt *st = store_stmt(s, SQL_ACTIONS);
    if (!st)
        return STORE_ERROR;
    if (f->action)
        sqlite3_bind_text(st, 1, f->action, -1, SQLITE_STATIC);
    if (f->target)
        sqlite3_bind_text(st, 2, f->target, -1, SQLITE_STATIC);
    if (f->admin_user_id)
        sqlite3_bind_text(st, 3, f->admin_user_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, f->before_id);
    sqlite3_bind_int64(st, 5, (sqlite3_int64)max);
    return store_read_rows(s, st, out, sizeof *out, max, n, read_action, "admin actions");
}
