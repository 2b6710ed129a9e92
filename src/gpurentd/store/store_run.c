/* store_run.c: SQL for what an instance runs (0017): its command, env and
 * working directory, and its image, which may change while it is stopped;
 * and its name, which may change at any time before it is terminated. */
#include "store/store_sql.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SQL_SET_COMMAND[] = "UPDATE instances SET command = ?2 WHERE id = ?1";
static const char SQL_SET_ENV[] = "UPDATE instances SET env = ?2 WHERE id = ?1";
static const char SQL_SET_WORKING_DIR[] = "UPDATE instances SET working_dir = ?2 WHERE id = ?1";
static const char SQL_SET_IMAGE[] = "UPDATE instances SET image = ?2 WHERE id = ?1";
static const char SQL_SET_NAME[] = "UPDATE instances SET name = ?2 WHERE id = ?1";
static const char SQL_GET_RUN[] = "SELECT command, env, working_dir FROM instances WHERE id = ?";

static int set_text(struct store *s, const char *sql, const char *id, const char *value, const char *what)
{
    sqlite3_stmt *st = store_stmt(s, sql);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    if (value)
        sqlite3_bind_text(st, 2, value, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 2);
    return store_step_change(s, st, what);
}

int store_instance_set_command(struct store *s, const char *instance_id, const char *command_json)
{
    return set_text(s, SQL_SET_COMMAND, instance_id, command_json, "instance command");
}

int store_instance_set_env(struct store *s, const char *instance_id, const char *env_json)
{
    return set_text(s, SQL_SET_ENV, instance_id, env_json ? env_json : "[]", "instance env");
}

int store_instance_set_working_dir(struct store *s, const char *instance_id, const char *dir)
{
    return set_text(s, SQL_SET_WORKING_DIR, instance_id, dir ? dir : "", "instance working_dir");
}

int store_instance_set_image(struct store *s, const char *instance_id, const char *ref)
{
    return set_text(s, SQL_SET_IMAGE, instance_id, ref, "instance image");
}

int store_instance_set_name(struct store *s, const char *instance_id, const char *name)
{
    return set_text(s, SQL_SET_NAME, instance_id, name, "instance name");
}

int store_instance_run(struct store *s, const char *instance_id, struct instance_run *out)
{
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st = store_stmt(s, SQL_GET_RUN);
    if (!st)
        return STORE_ERROR;
    sqlite3_bind_text(st, 1, instance_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        const char *cmd = (const char *)sqlite3_column_text(st, 0);
        const char *env = (const char *)sqlite3_column_text(st, 1);
        out->command = cmd ? strdup(cmd) : NULL;
        out->env = strdup(env ? env : "[]");
        store_column_text(out->working_dir, sizeof out->working_dir, st, 2);
        rc = (!cmd || out->command) && out->env ? STORE_OK : STORE_ERROR;
    } else {
        rc = rc == SQLITE_DONE ? STORE_NOT_FOUND : store_rc_from_sqlite(s, rc, "instance run");
    }
    sqlite3_reset(st);
    if (rc != STORE_OK)
        store_instance_run_free(out);
    return rc;
}

void store_instance_run_free(struct instance_run *r)
{
    free(r->command);
    free(r->env);
    r->command = r->env = NULL;
}
