/* test_agent_logs.c: unit tests for workload log files (logs.c): lines
 * read back with their time, stream and text (escapes and bad UTF-8
 * included, a long line cut between characters), tail and since, cursors that follow new lines across a
 * rotation, the size cap with one old file kept, files that outlive the
 * process (read back from disk alone), removal, and malformed cursors. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"

static char dir[64];

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "/tmp/gpurent-logs-test-XXXXXX");
    assert_non_null(mkdtemp(dir));
    return 0;
}

static int teardown(void **state)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf -- '%s'", dir);
    assert_int_equal(system(cmd), 0);
    return 0;
}

static void append(const char *id, int64_t max, int64_t t, char stream, const char *text)
{
    assert_int_equal(wl_log_append(dir, id, max, t, stream, text, strlen(text)), 0);
}

static json_t *read_q(const char *id, int64_t tail, int64_t since_ms, const char *after, char cursor[WL_LOG_CURSOR_MAX],
                      int *at_end)
{
    struct wl_log_query q = {.tail = tail, .since_ms = since_ms, .after = after};
    char err[128];
    json_t *lines = wl_log_read(dir, id, &q, cursor, at_end, err, sizeof err);
    assert_non_null(lines);
    return lines;
}

static const char *text_at(json_t *lines, size_t i)
{
    return json_string_value(json_object_get(json_array_get(lines, i), "text"));
}

static void test_lines_round_trip(void **state)
{
    append("wl-a", 1 << 20, 1000, 'o', "hello");
    append("wl-a", 1 << 20, 2000, 'e', "two\nlines \\ and\r\xff");
    char cursor[WL_LOG_CURSOR_MAX];
    int at_end = 0;
    json_t *lines = read_q("wl-a", 0, 0, NULL, cursor, &at_end);
    assert_int_equal(json_array_size(lines), 2);
    json_t *l1 = json_array_get(lines, 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(lines, 0), "t")), 1000);
    assert_string_equal(json_string_value(json_object_get(json_array_get(lines, 0), "stream")), "stdout");
    assert_string_equal(text_at(lines, 0), "hello");
    assert_string_equal(json_string_value(json_object_get(l1, "stream")), "stderr");
    assert_string_equal(text_at(lines, 1), "two\nlines \\ and\r?");
    assert_true(at_end);
    assert_true(wl_log_cursor_valid(cursor));
    json_decref(lines);

    /* A NUL is stored as '?': a JSON reader (gpurentd's jansson) refuses a
     * string holding \u0000, and the logs would break with it. */
    assert_int_equal(wl_log_append(dir, "wl-n", 1 << 20, 3000, 'o', "a\0b", 3), 0);
    lines = read_q("wl-n", 0, 0, NULL, cursor, &at_end);
    assert_string_equal(text_at(lines, 0), "a?b");
    char *text = json_dumps(lines, 0);
    json_t *back = json_loads(text, 0, NULL);
    assert_non_null(back);
    json_decref(back);
    free(text);
    json_decref(lines);

    /* One stored line per output line. */
    char path[256];
    snprintf(path, sizeof path, "%s/logs/wl-a.log", dir);
    size_t len = 0;
    char *raw = state_read_file(path, 4096, &len);
    assert_non_null(raw);
    int newlines = 0;
    for (size_t i = 0; i < len; i++)
        newlines += raw[i] == '\n';
    assert_int_equal(newlines, 3); /* the header and two lines */
    free(raw);

    /* A line over WL_LOG_TEXT_MAX is cut before the character the cut
     * would split, not through it (which left '?' for each half). */
    char *wide = malloc(3 * WL_LOG_TEXT_MAX + 1);
    assert_non_null(wide);
    for (size_t i = 0; i < WL_LOG_TEXT_MAX; i++)
        memcpy(wide + 3 * i, "\xe6\x96\x87", 3); /* 文 */
    wide[3 * WL_LOG_TEXT_MAX] = '\0';
    append("wl-w", 1 << 20, 4000, 'o', wide);
    lines = read_q("wl-w", 0, 0, NULL, cursor, &at_end);
    size_t kept = WL_LOG_TEXT_MAX / 3 * 3;
    assert_int_equal(strlen(text_at(lines, 0)), kept);
    assert_memory_equal(text_at(lines, 0), wide, kept);
    json_decref(lines);
    free(wide);

    /* A workload without output reads empty, its cursor at the start. */
    lines = read_q("wl-none", 0, 0, NULL, cursor, &at_end);
    assert_int_equal(json_array_size(lines), 0);
    assert_string_equal(cursor, "0-0");
    json_decref(lines);
}

static void test_tail_since(void **state)
{
    char text[32];
    for (int i = 1; i <= 20; i++) {
        snprintf(text, sizeof text, "line %d", i);
        append("wl-t", 1 << 20, (int64_t)i * 1000, 'o', text);
    }
    char cursor[WL_LOG_CURSOR_MAX];
    int at_end;
    json_t *lines = read_q("wl-t", 3, 0, NULL, cursor, &at_end);
    assert_int_equal(json_array_size(lines), 3);
    assert_string_equal(text_at(lines, 0), "line 18");
    assert_string_equal(text_at(lines, 2), "line 20");
    json_decref(lines);

    lines = read_q("wl-t", 0, 15000, NULL, cursor, &at_end);
    assert_int_equal(json_array_size(lines), 6);
    assert_string_equal(text_at(lines, 0), "line 15");
    json_decref(lines);

    /* since and tail together: the last lines of those since. */
    lines = read_q("wl-t", 100, 19000, NULL, cursor, &at_end);
    assert_int_equal(json_array_size(lines), 2);
    assert_string_equal(text_at(lines, 0), "line 19");
    json_decref(lines);
}

static void test_cursor_follows(void **state)
{
    append("wl-c", 1 << 20, 1, 'o', "first");
    char cursor[WL_LOG_CURSOR_MAX], next[WL_LOG_CURSOR_MAX];
    int at_end;
    json_t *lines = read_q("wl-c", 0, 0, NULL, cursor, &at_end);
    assert_int_equal(json_array_size(lines), 1);
    json_decref(lines);
    /* Nothing new: the same cursor back. */
    lines = read_q("wl-c", 0, 0, cursor, next, &at_end);
    assert_int_equal(json_array_size(lines), 0);
    assert_string_equal(next, cursor);
    json_decref(lines);
    append("wl-c", 1 << 20, 2, 'o', "second");
    append("wl-c", 1 << 20, 3, 'o', "third");
    lines = read_q("wl-c", 0, 0, cursor, next, &at_end);
    assert_int_equal(json_array_size(lines), 2);
    assert_string_equal(text_at(lines, 0), "second");
    assert_true(at_end);
    json_decref(lines);
}

static void test_rotation_cap(void **state)
{
    /* Each stored line is about 110 bytes; a 4096-byte cap rotates every
     * 37 lines or so, and only one old file is kept. */
    char text[128], cursor[WL_LOG_CURSOR_MAX], next[WL_LOG_CURSOR_MAX];
    int at_end;
    memset(text, 'x', 100);
    text[100] = 0;
    append("wl-r", 4096, 1, 'o', "start");
    json_t *lines = read_q("wl-r", 0, 0, NULL, cursor, &at_end);
    json_decref(lines);
    for (int i = 0; i < 30; i++)
        append("wl-r", 4096, 2 + i, 'o', text);
    /* The cursor was taken before the rotation: it reads the rest of the
     * old file and on into the new one, nothing lost, nothing twice. */
    for (int i = 0; i < 30; i++)
        append("wl-r", 4096, 100 + i, 'e', text);
    lines = read_q("wl-r", 0, 0, cursor, next, &at_end);
    assert_int_equal(json_array_size(lines), 60);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(lines, 0), "t")), 2);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(lines, 59), "t")), 129);
    json_decref(lines);

    for (int i = 0; i < 500; i++)
        append("wl-r", 4096, 1000 + i, 'o', text);
    char cur[256], old[256], older[256];
    snprintf(cur, sizeof cur, "%s/logs/wl-r.log", dir);
    snprintf(old, sizeof old, "%s/logs/wl-r.log.1", dir);
    snprintf(older, sizeof older, "%s/logs/wl-r.log.2", dir);
    struct stat st;
    assert_int_equal(stat(cur, &st), 0);
    assert_true(st.st_size <= 4096);
    assert_int_equal(stat(old, &st), 0);
    assert_true(st.st_size <= 4096);
    assert_int_not_equal(stat(older, &st), 0);
    /* What is kept is the newest output, ending with the last line. */
    lines = read_q("wl-r", 0, 0, NULL, cursor, &at_end);
    size_t n = json_array_size(lines);
    assert_true(n > 30 && n < 80);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(lines, n - 1), "t")), 1499);
    json_decref(lines);
    /* The generation came from the files alone (a restarted agent reads
     * the same): one per rotation, well past the first. */
    assert_true(strtoll(cursor, NULL, 10) > 10);
    /* A cursor whose file rotated away starts at the oldest line kept. */
    lines = read_q("wl-r", 0, 0, next, cursor, &at_end);
    assert_int_equal(json_array_size(lines), n);
    json_decref(lines);
}

static void test_reply_bounds(void **state)
{
    for (int i = 0; i < WL_LOG_REPLY_LINES + 10; i++)
        append("wl-b", 1 << 24, i, 'o', "x");
    char cursor[WL_LOG_CURSOR_MAX], next[WL_LOG_CURSOR_MAX];
    int at_end;
    json_t *lines = read_q("wl-b", 0, 0, NULL, cursor, &at_end);
    assert_int_equal(json_array_size(lines), WL_LOG_REPLY_LINES);
    assert_false(at_end);
    json_decref(lines);
    /* The cursor picks up where the full reply stopped. */
    lines = read_q("wl-b", 0, 0, cursor, next, &at_end);
    assert_int_equal(json_array_size(lines), 10);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(lines, 0), "t")), WL_LOG_REPLY_LINES);
    assert_true(at_end);
    json_decref(lines);
}

static void test_remove_and_bad_cursor(void **state)
{
    append("wl-d", 4096, 1, 'o', "bye");
    wl_log_retire(dir, "wl-d", 0, 0); /* nothing kept: removed */
    char path[256];
    snprintf(path, sizeof path, "%s/logs/wl-d.log", dir);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_false(wl_log_kept(dir, "wl-d"));
    wl_log_retire(dir, "wl-d", 0, 0); /* already gone: fine */
    /* The directory is made when the first line finds it missing, and
     * again if it went away since. */
    char logs[128];
    snprintf(logs, sizeof logs, "%s/logs", dir);
    assert_int_equal(rmdir(logs), 0);
    append("wl-d", 4096, 2, 'o', "again");
    assert_int_equal(access(path, F_OK), 0);
    wl_log_retire(dir, "wl-d", 0, 0);

    const char *bad[] = {"", "-", "1", "1-", "-1", "a-1", "1-2x", "1-2-3", "99999999999999999999999-1",
                         "1-9223372036854775808", "1-18446744073709551615"}; /* offsets past an off_t */
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_false(wl_log_cursor_valid(bad[i]));
        struct wl_log_query q = {.after = bad[i]};
        char cursor[WL_LOG_CURSOR_MAX], err[128];
        int at_end;
        assert_null(wl_log_read(dir, "wl-d", &q, cursor, &at_end, err, sizeof err));
    }
    assert_true(wl_log_cursor_valid("12-0"));
    assert_true(wl_log_cursor_valid("1-9223372036854775807"));
    /* Ids that are not ids never name a path. */
    assert_int_equal(wl_log_append(dir, "../x", 4096, 1, 'o', "x", 1), -1);
}

/* A removed workload's output is moved where it is kept, read whole from
 * there, and swept once no more may be kept. */
static void test_retired_output_is_kept_then_swept(void **state)
{
    append("wl-k", 4096, 1, 'o', "kept");
    wl_log_retire(dir, "wl-k", 3600, 10);
    assert_true(wl_log_kept(dir, "wl-k"));
    char cursor[WL_LOG_CURSOR_MAX], err[128];
    int at_end = 0;
    struct wl_log_query kept = {.ended = 1};
    json_t *got = wl_log_read(dir, "wl-k", &kept, cursor, &at_end, err, sizeof err);
    assert_non_null(got);
    assert_string_equal(json_string_value(json_object_get(json_array_get(got, 0), "text")), "kept");
    assert_true(at_end);
    json_decref(got);
    wl_log_retire(dir, "wl-k", 3600, 0); /* none may be kept: swept */
    assert_false(wl_log_kept(dir, "wl-k"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lines_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tail_since, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cursor_follows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rotation_cap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reply_bounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_and_bad_cursor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retired_output_is_kept_then_swept, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
