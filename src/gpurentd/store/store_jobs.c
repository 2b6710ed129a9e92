/* store_jobs.c: SQL for jobs and services (0018): an instance's restart
 * policy and run time bound, the status its job last exited with, its
 * restarts, the start of its current run, and fresh workload ids for a
 * restart on the same cards. */
#include "store/store_sql.h"

#include <stdio.h>

/* Not written when as given: a create sets the defaults a new row has, and
 * max_runtime_minutes is named by the WHERE of instances_attention, whose
 * entry SQLite would rewrite. */
static const char SQL_SET_JOB[] = "UPDATE instances SET restart_policy = ?2, max_runtime_minutes = ?3 WHERE id = ?1"
                                  " AND (restart_policy IS NOT ?2 OR max_runtime_minutes IS NOT ?3)";
static const char SQL_SET_EXIT[] = "UPDATE instances SET exit_code = ?2 WHERE id = ?1";
static const char SQL_SET_RESTARTS[] = "UPDATE instances SET restart_count = ?2, restart_backoff_s = ?3 WHERE id = ?1";
static const char SQL_SET_RUN_CLOCK[] =
    "UPDATE instances SET run_started_at = ?2, runtime_warned_at = ?3 WHERE id = ?1";
static const char SQL_SET_RANKS_EXITED[] = "UPDATE instances SET ranks_exited_at = ?2 WHERE id = ?1";
static const char SQL_NODE_RENEW[] =
    "UPDATE instance_nodes SET workload_id = ?3, phase = '', message = '', put_done = 0"
    " WHERE instance_id = ?1 AND rank = ?2";

void store_read_job_columns(sqlite3_stmt *st, int first, struct instance *in)
{
    store_column_text(in->restart_policy, sizeof in->restart_policy, st, first);
    in->max_runtime_minutes = sqlite3_column_int64(st, first + 1);
    in->restart_count = sqlite3_column_int64(st, first + 2);
    in->restart_backoff_s = sqlite3_column_int64(st, first + 3);
    in->exit_known = sqlite3_column_type(st, first + 4) != SQLITE_NULL;
    in->exit_code = sqlite3_column_int64(st, first + 4);
    in->run_started_at = sqlite3_column_int64(st, first + 5);
    in->runtime_warned_at = sqlite3_column_int64(st, first + 6);
    in->ranks_exited_at = sqlite3_column_int64(st, first + 7);
}

static void bind_or_null(sqlite3_stmt *st, int col, int64_t v)
{
    if (v)
        sqlite3_bind_int64(st, col, v);
    else
        sqlite3_bind_null(st, col);
}

int store_instance_set_job(struct store *s, const char *id, const char *restart_policy, int64_t max_runtime_minutes)
{
    sqlite3_stmt *st = store_stmt(s, SQL_SET_JOB);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, restart_policy, -1, SQLITE_STATIC);
    bind_or_null(st, 3, max_runtime_minutes);
    return store_step_write(s, st, "set instance job");
}

int store_instance_set_exit(struct store *s, const char *id, int known, int64_t code)
{
    sqlite3_stmt *st = store_stmt(s, SQL_SET_EXIT);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    if (known)
        sqlite3_bind_int64(st, 2, code);
    else
        sqlite3_bind_null(st, 2);
    return store_step_change(s, st, "set instance exit code");
}

int store_instance_set_restarts(struct store *s, const char *id, int64_t restart_count, int64_t backoff_s)
{
    sqlite3_stmt *st = store_stmt(s, SQL_SET_RESTARTS);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, restart_count);
    sqlite3_bind_int64(st, 3, backoff_s);
    return store_step_change(s, st, "set instance restarts");
}

int store_instance_set_run_clock(struct store *s, const char *id, int64_t run_started_at, int64_t warned_at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_SET_RUN_CLOCK);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    bind_or_null(st, 2, run_started_at);
    bind_or_null(st, 3, warned_at);
    return store_step_change(s, st, "set instance run clock");
}

int store_instance_node_renew(struct store *s, const char *id, int64_t rank, const char *workload_id)
{
    sqlite3_stmt *st = store_stmt(s, SQL_NODE_RENEW);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, rank);
    sqlite3_bind_text(st, 3, workload_id, -1, SQLITE_STATIC);
    return store_step_change(s, st, "renew workload");
}

int store_instance_set_ranks_exited(struct store *s, const char *id, int64_t at)
{
    sqlite3_stmt *st = store_stmt(s, SQL_SET_RANKS_EXITED);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    bind_or_null(st, 2, at);
    return store_step_change(s, st, "set ranks exited");
}
