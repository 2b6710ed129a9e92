/* fuzz_logs.c: fuzz target for a workload's log (logs.c): the lines a
 * renter's container prints, any bytes, appended and read back as
 * GET /v1/workloads/{id}/logs does, and a cursor as a client sends it.
 * Input: a byte of flags (bit 0: rotate often), then lines as a 2-byte
 * big-endian length, a stream byte and the text, up to a byte 0xFF line
 * count; what follows is a cursor for `after`. What is read back is a
 * suffix of what was written, each text as written (cut to
 * WL_LOG_TEXT_MAX between characters, bytes that are not UTF-8 and NULs as
 * '?'), the whole of it without rotation; the cursor given after the
 * first half reads exactly the second half; a tail is the last lines; and
 * any cursor is refused with a reason or read from with a valid cursor
 * back. */
#include "agent.h"
#include "gpurent/utf8.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ID "wl_fuzz"
#define MAX_LINES 64

static char node_dir[64];

static void remove_logs(void)
{
    char p[128];
    snprintf(p, sizeof p, "%s/logs/" ID ".log", node_dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/logs/" ID ".log.1", node_dir);
    unlink(p);
}

static void remove_all(void)
{
    char p[128];
    remove_logs();
    snprintf(p, sizeof p, "%s/logs", node_dir);
    rmdir(p);
    rmdir(node_dir);
}

/* The text as the log keeps it, by the rule agent.h states. */
static char *expected_text(const uint8_t *s, size_t len, size_t *out_len)
{
    if (len > WL_LOG_TEXT_MAX)
        len = WL_LOG_TEXT_MAX - utf8_cut_tail(s, WL_LOG_TEXT_MAX);
    char *out = malloc(len + 1);
    if (!out)
        abort();
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_sequence(s + i, len - i);
        if (k == 0 || s[i] == 0) {
            out[o++] = '?';
            i++;
        } else {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        }
    }
    out[o] = '\0';
    *out_len = o;
    return out;
}

struct written {
    char *text;
    size_t len;
    char stream;
};

/* Whether lines (a reply's array) are the written[from..to) in order. */
static int lines_are(const json_t *lines, const struct written *w, size_t from, size_t to)
{
    if (json_array_size(lines) != to - from)
        return 0;
    for (size_t i = from; i < to; i++) {
        json_t *l = json_array_get(lines, i - from);
        const char *stream = json_string_value(json_object_get(l, "stream"));
        json_t *text = json_object_get(l, "text");
        if (!stream || strcmp(stream, w[i].stream == 'e' ? "stderr" : "stdout") != 0 ||
            json_integer_value(json_object_get(l, "t")) != (json_int_t)(i + 1) || !json_is_string(text) ||
            json_string_length(text) != w[i].len || memcmp(json_string_value(text), w[i].text, w[i].len) != 0)
            return 0;
    }
    return 1;
}

static json_t *read_log(const char *after, int64_t tail, char cursor[WL_LOG_CURSOR_MAX], int *at_end)
{
    struct wl_log_query q = {.after = after, .tail = tail};
    char err[128] = "";
    json_t *lines = wl_log_read(node_dir, ID, &q, cursor, at_end, err, sizeof err);
    if (!lines || !wl_log_cursor_valid(cursor))
        abort();
    return lines;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!node_dir[0]) {
        snprintf(node_dir, sizeof node_dir, "%s", "/tmp/fuzz-logs-XXXXXX");
        if (!mkdtemp(node_dir))
            abort();
        atexit(remove_all);
    }
    if (size < 1)
        return 0;
    int64_t max_bytes = (data[0] & 1) ? 300 : INT64_MAX;
    size_t off = 1, n = 0;
    struct written w[MAX_LINES];
    while (n < MAX_LINES && size - off >= 3 && data[off] != 0xFF) {
        size_t len = (size_t)data[off] << 8 | data[off + 1];
        char stream = data[off + 2] & 1 ? 'e' : 'o';
        off += 3;
        if (len > size - off)
            len = size - off;
        w[n].stream = stream;
        w[n].text = expected_text(data + off, len, &w[n].len);
        if (wl_log_append(node_dir, ID, max_bytes, (int64_t)n + 1, stream, (const char *)data + off, len) != 0)
            abort();
        off += len;
        n++;
        /* Half way: a cursor to the end, which must read exactly the rest. */
        if (n == MAX_LINES / 2)
            break;
    }
    size_t half = n;
    char half_cursor[WL_LOG_CURSOR_MAX], cursor[WL_LOG_CURSOR_MAX];
    int at_end;
    json_t *first = read_log(NULL, 0, half_cursor, &at_end);
    json_decref(first);
    while (n < MAX_LINES && size - off >= 3 && data[off] != 0xFF) {
        size_t len = (size_t)data[off] << 8 | data[off + 1];
        char stream = data[off + 2] & 1 ? 'e' : 'o';
        off += 3;
        if (len > size - off)
            len = size - off;
        w[n].stream = stream;
        w[n].text = expected_text(data + off, len, &w[n].len);
        if (wl_log_append(node_dir, ID, max_bytes, (int64_t)n + 1, stream, (const char *)data + off, len) != 0)
            abort();
        off += len;
        n++;
    }

    /* Everything still on disk: a suffix, the whole without rotation. */
    json_t *all = read_log(NULL, 0, cursor, &at_end);
    size_t kept = json_array_size(all);
    if (kept > n || !lines_are(all, w, n - kept, n) || (max_bytes == INT64_MAX && kept != n) || !at_end)
        abort();
    /* The second half after the first half's cursor (its file rotated
     * away at most once, so still there), unless rotation dropped it. */
    json_t *rest = read_log(half_cursor, 0, cursor, &at_end);
    if (max_bytes == INT64_MAX && !lines_are(rest, w, half, n))
        abort();
    /* A tail is the last lines. */
    json_t *tail = read_log(NULL, 3, cursor, &at_end);
    size_t t = kept < 3 ? kept : 3;
    if (!lines_are(tail, w, n - t, n))
        abort();
    json_decref(all);
    json_decref(rest);
    json_decref(tail);

    /* The rest of the input as a client's cursor. */
    if (off < size) {
        char after[64];
        size_t len = size - off - (data[off] == 0xFF);
        if (len > sizeof after - 1)
            len = sizeof after - 1;
        memcpy(after, data + size - len, len);
        after[len] = '\0';
        struct wl_log_query q = {.after = after};
        char err[128] = "";
        json_t *lines = wl_log_read(node_dir, ID, &q, cursor, &at_end, err, sizeof err);
        if (lines ? !wl_log_cursor_valid(cursor) : !err[0])
            abort();
        json_decref(lines);
    }
    for (size_t i = 0; i < n; i++)
        free(w[i].text);
    remove_logs();
    return 0;
}
