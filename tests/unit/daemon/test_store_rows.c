/* test_store_rows.c: store_rows(?), the table through which one statement
 * reads an array held in C. A statement sees the array's rows in order with
 * their types; without an array bound through store_bind_rows (nothing, or
 * a text or a blob in its place) it sees no rows; views and triggers cannot
 * name it. Runs on a real SQLite file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpurentd.h"
#include "store/store_sql.h" /* a test of the store itself */

static char dir[64], db_path[128];
static struct store *store;

struct pair {
    int64_t number;
    const char *text; /* NULL reads as NULL */
};

static void pair_column(const void *array, size_t i, int col, sqlite3_context *ctx)
{
    const struct pair *p = (const struct pair *)array + i;
    if (col == 0)
        sqlite3_result_int64(ctx, p->number);
    else if (col == 1 && p->text)
        sqlite3_result_text(ctx, p->text, -1, SQLITE_STATIC);
    else
        sqlite3_result_null(ctx);
}

static const struct pair pairs[] = {
    {7,         "seven"},
    {-1,        NULL   },
    {INT64_MAX, "max"  }
};
static const struct store_rows rows = {pairs, 3, pair_column};

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/gpurent-rows-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    snprintf(db_path, sizeof db_path, "%s/t.db", dir);
    char err[256];
    store = store_open(db_path, err, sizeof err);
    if (!store)
        return -1;
    return sqlite3_exec(store_db(store), "CREATE TABLE t (n INTEGER NOT NULL, s TEXT) STRICT", NULL, NULL, NULL);
}

static int teardown(void **state)
{
    (void)state;
    store_close(store);
    char path[160];
    const char *suffixes[] = {"", "-wal", "-shm"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s%s", db_path, suffixes[i]);
        unlink(path);
    }
    rmdir(dir);
    return 0;
}

static sqlite3_stmt *prepare(const char *sql)
{
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(store_db(store), sql, -1, &st, NULL), SQLITE_OK);
    return st;
}

static int count_rows(sqlite3_stmt *st)
{
    int n = 0, rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        n++;
    assert_int_equal(rc, SQLITE_DONE);
    return n;
}

static void test_a_statement_reads_the_array_in_order_with_its_types(void **state)
{
    (void)state;
    sqlite3_stmt *st = prepare("SELECT c0, c1, typeof(c1), c2 FROM store_rows(?1)");
    store_bind_rows(st, 1, &rows);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(sqlite3_step(st), SQLITE_ROW);
        assert_true(sqlite3_column_int64(st, 0) == pairs[i].number);
        if (pairs[i].text)
            assert_string_equal((const char *)sqlite3_column_text(st, 1), pairs[i].text);
        else
            assert_string_equal((const char *)sqlite3_column_text(st, 2), "null");
        assert_int_equal(sqlite3_column_type(st, 3), SQLITE_NULL); /* a column the array does not fill */
    }
    assert_int_equal(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
}

static void test_one_insert_writes_every_row_and_an_update_joins_on_them(void **state)
{
    (void)state;
    sqlite3_stmt *st = prepare("INSERT INTO t (n, s) SELECT c0, c1 FROM store_rows(?1)");
    store_bind_rows(st, 1, &rows);
    assert_int_equal(sqlite3_step(st), SQLITE_DONE);
    assert_int_equal(sqlite3_changes(store_db(store)), 3);
    sqlite3_finalize(st);

    const struct pair renamed[] = {
        {7,         "sept"},
        {INT64_MAX, "plus"}
    };
    st = prepare("UPDATE t SET s = r.c1 FROM store_rows(?1) r WHERE t.n = r.c0");
    store_bind_rows(st, 1, &(struct store_rows){renamed, 2, pair_column});
    assert_int_equal(sqlite3_step(st), SQLITE_DONE);
    assert_int_equal(sqlite3_changes(store_db(store)), 2);
    sqlite3_finalize(st);

    st = prepare("SELECT group_concat(coalesce(s, '-'), ',') FROM (SELECT s FROM t ORDER BY n)");
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(st, 0), "-,sept,plus");
    sqlite3_finalize(st);
}

static void test_without_an_array_bound_there_are_no_rows(void **state)
{
    (void)state;
    sqlite3_stmt *st = prepare("SELECT c0 FROM store_rows(?1)");
    assert_int_equal(count_rows(st), 0); /* nothing bound */
    sqlite3_reset(st);
    sqlite3_bind_text(st, 1, "0x7fff0000", -1, SQLITE_STATIC); /* SQL cannot make a pointer up */
    assert_int_equal(count_rows(st), 0);
    sqlite3_reset(st);
    sqlite3_bind_blob(st, 1, &rows, sizeof rows, SQLITE_STATIC);
    assert_int_equal(count_rows(st), 0);
    sqlite3_reset(st);
    sqlite3_bind_pointer(st, 1, (void *)(uintptr_t)&rows, "another_type", NULL);
    assert_int_equal(count_rows(st), 0);
    sqlite3_finalize(st);

    st = prepare("SELECT count(*) FROM store_rows"); /* without its argument */
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(st, 0), 0);
    sqlite3_finalize(st);
}

static void test_views_and_triggers_cannot_use_it(void **state)
{
    (void)state;
    sqlite3 *db = store_db(store);
    assert_int_equal(sqlite3_exec(db, "CREATE VIEW v AS SELECT c0 FROM store_rows", NULL, NULL, NULL), SQLITE_OK);
    assert_int_not_equal(sqlite3_exec(db, "SELECT * FROM v", NULL, NULL, NULL), SQLITE_OK);
    assert_non_null(strstr(sqlite3_errmsg(db), "unsafe use of virtual table"));
    assert_int_equal(sqlite3_exec(db, "DROP VIEW v", NULL, NULL, NULL), SQLITE_OK);
    /* Nor can the schema hold a table of it: it has no xCreate. */
    assert_int_not_equal(sqlite3_exec(db, "CREATE VIRTUAL TABLE x USING store_rows", NULL, NULL, NULL), SQLITE_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_statement_reads_the_array_in_order_with_its_types),
        cmocka_unit_test(test_one_insert_writes_every_row_and_an_update_joins_on_them),
        cmocka_unit_test(test_without_an_array_bound_there_are_no_rows),
        cmocka_unit_test(test_views_and_triggers_cannot_use_it),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
