/* test_gateway_usage.c: unit tests for how the gateway reads a stream of
 * server-sent events from a replica (usage.c) by the standard's grammar,
 * whose line ends are "\r\n", '\n' or a lone '\r': the events the hold
 * counts, the usage read and its bounds, and the filter that hides the
 * usage event the client did not ask for, alike for every kind of line end
 * and however the stream is cut into pieces. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway.h"

/* The events gw_sse_event_end ends in text, fed to it from *state. */
static int events_in(const char *text, int *state)
{
    int events = 0;
    for (const char *p = text; *p; p++)
        events += gw_sse_event_end(state, *p);
    return events;
}

/* Each line end of the standard, and two in a row of any kinds, end an
 * event; a "\r\n" is one line end, not two. Before, a '\r' counted for
 * nothing: a replica ending its lines with a lone '\r' had no event
 * counted, so its usage was never read and the hold took its whole stream
 * for one event. */
static void test_every_line_end_of_the_standard_ends_events(void **state)
{
    static const struct {
        const char *text;
        int events, boundary;
    } cases[] = {
        {"data: a\n\n", 1, 1},
        {"data: a\r\n\r\n", 1, 1},
        {"data: a\r\r", 1, 1},
        {"data: a\r\n\r", 1, 1},
        {"data: a\n\r", 1, 1},
        {"data: a\r\n\n", 1, 1},
        {"data: a\r\r\n", 1, 1},   /* a lone '\r', then a "\r\n" */
        {"data: a\r\n", 0, 0},     /* one line end */
        {"data: a\n", 0, 0},
        {"data: a\r", 0, 0},
        {"data: a\rdata: b\r\r", 1, 1}, /* two lines of one event */
        {"data: a\r\r\r", 1, 1},   /* an empty line after the event */
        {"data: a\r\r\r\r", 2, 1}, /* and a second blank line */
        {"data: a\r\n\r\ndata: b", 1, 0},
        {"data: a\r\rdata: b\n\ndata: c\r\n\r\n", 3, 1},
        {"\r\r", 1, 1}, /* a blank line at the stream's start, as "\n\n" there */
        {"", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int sse = 0;
        int events = events_in(cases[i].text, &sse);
        if (events != cases[i].events || gw_sse_event_boundary(sse) != cases[i].boundary)
            fail_msg("case %zu: %d events (want %d), boundary %d (want %d)", i, events, cases[i].events,
                     gw_sse_event_boundary(sse), cases[i].boundary);
    }
}

/* proxy.c's upstream thread carries the state from piece to piece: a
 * "\r\n" cut between its '\r' and its '\n' is still one line end, so a
 * line ending so and the next line make no event, and the event ends at
 * the second line end's '\r' whichever piece its '\n' comes in. */
static void test_a_crlf_cut_between_pieces_is_one_line_end(void **state)
{
    int sse = 0;
    assert_int_equal(events_in("data: a\r", &sse), 0);
    assert_int_equal(events_in("\n", &sse), 0);
    assert_int_equal(events_in("data: b\r", &sse), 0);
    assert_false(gw_sse_event_boundary(sse));
    assert_int_equal(events_in("\n", &sse), 0);
    assert_int_equal(events_in("\r", &sse), 1);
    assert_true(gw_sse_event_boundary(sse));
    assert_int_equal(events_in("\n", &sse), 0);
    assert_true(gw_sse_event_boundary(sse));
    assert_int_equal(events_in("data: c", &sse), 0);
    assert_false(gw_sse_event_boundary(sse));
}

static const char content[] = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}";
static const char usage_line[] = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3}}";
static const char done[] = "data: [DONE]";

/* An OpenAI-style stream (a content event, the usage event, [DONE]) with
 * the line ends first, second and third, into out; the bytes through the
 * usage event's end (gw_sse_event_end's: at the first byte of its second
 * line end) into *through_usage. */
static void stream_of(const char *first, const char *second, const char *third, char *out, size_t cap,
                      size_t *through_usage)
{
    int n = snprintf(out, cap, "%s%s%s%s", content, first, first, usage_line);
    assert_true(n > 0 && (size_t)n < cap);
    *through_usage = (size_t)n + strlen(second) + 1;
    n = snprintf(out + n, cap - (size_t)n, "%s%s%s%s%s", second, second, done, third, third);
    assert_true(n > 0);
}

struct reading {
    int64_t in, out, events, slack, base;
};

/* What gw_usage_scan reads of len bytes of text delivered in pieces of
 * piece bytes (len: whole). */
static struct reading scan(const char *text, size_t len, size_t piece, int asked)
{
    struct gw_usage u = {.streamed = 1, .usage_asked = asked};
    for (size_t off = 0; off < len; off += piece)
        gw_usage_scan(&u, text + off, len - off < piece ? len - off : piece);
    struct reading r = {u.input_tokens, u.output_tokens, u.scanned_events, atomic_load(&u.slack),
                        atomic_load(&u.base)};
    gw_usage_free(&u);
    return r;
}

static void assert_reading(struct reading r, size_t through_usage, const char *what)
{
    /* Three events; 3 tokens reported in the second: the hold's estimate
     * is those less the events through it (base), its byte bound the
     * tokens less the replica's bytes through it (slack). */
    if (r.in != 5 || r.out != 3 || r.events != 3 || r.base != 3 - 2 || r.slack != 3 - (int64_t)through_usage)
        fail_msg("%s: in %lld out %lld events %lld base %lld slack %lld (want 5 3 3 1 %lld)", what, (long long)r.in,
                 (long long)r.out, (long long)r.events, (long long)r.base, (long long)r.slack,
                 3 - (long long)through_usage);
}

/* A stream whose lines end with a lone '\r' (or any mix of the standard's
 * line ends) is read as one with '\n': its three events counted and its
 * usage taken at the event that reports it, however it is cut. Before,
 * only '\n' ended a line: a lone-'\r' stream had no usage read (its
 * consumer paid no token) and no event counted. */
static void test_usage_is_read_whatever_the_line_ends_and_the_cut(void **state)
{
    static const char *const ends[][3] = {
        {"\n", "\n", "\n"},       {"\r\n", "\r\n", "\r\n"}, {"\r", "\r", "\r"},
        {"\r", "\r\n", "\n"},     {"\r\n", "\r", "\n"},     {"\n", "\r", "\r\n"},
    };
    char text[512], what[64];
    for (size_t e = 0; e < sizeof ends / sizeof ends[0]; e++) {
        size_t through;
        stream_of(ends[e][0], ends[e][1], ends[e][2], text, sizeof text, &through);
        size_t len = strlen(text);
        for (size_t piece = 1; piece <= len; piece++) {
            snprintf(what, sizeof what, "line ends %zu, pieces of %zu", e, piece);
            assert_reading(scan(text, len, piece, 0), through, what);
        }
    }
}

struct buf {
    char p[1024];
    size_t len;
};

static int emit(void *vb, const char *p, size_t n)
{
    struct buf *b = vb;
    assert_true(b->len + n < sizeof b->p);
    memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

/* The client's bytes of a stream whose usage the gateway asked for, cut
 * after byte cut and at each of the cuts after (0: none). */
static void hide(const char *text, size_t len, size_t cut, struct buf *out)
{
    struct gw_usage u = {.streamed = 1, .usage_asked = 1};
    out->len = 0;
    size_t off = 0;
    if (cut) {
        for (; off + cut < len; off += cut)
            assert_int_equal(gw_usage_hide(&u, text + off, cut, emit, out), 0);
    }
    assert_int_equal(gw_usage_hide(&u, text + off, len - off, emit, out), 0);
    assert_int_equal(gw_usage_flush_line(&u, emit, out), 0);
    assert_int_equal(u.line_len, 0);
    gw_usage_free(&u);
}

/* The usage event the client did not ask for becomes a comment when its
 * lines end with a lone '\r' too (before, the whole stream was one line,
 * passed on as it came, and a client read the usage as an event with no
 * choices), the ':' goes at the start of its line and never between a '\r'
 * and its '\n', and the client's bytes are the same however the stream is
 * cut, a "\r\n" cut between its two bytes included. What the hold reads in
 * them is what the client that asked for the usage would get: the same
 * usage, events and bytes of the replica's (not the gateway's ':'). */
static void test_the_usage_event_is_hidden_whatever_the_line_ends_and_the_cut(void **state)
{
    static const char *const ends[] = {"\n", "\r\n", "\r"};
    char text[512], want[512];
    for (size_t e = 0; e < sizeof ends / sizeof ends[0]; e++) {
        size_t through;
        stream_of(ends[e], ends[e], ends[e], text, sizeof text, &through);
        size_t len = strlen(text);
        snprintf(want, sizeof want, "%s%s%s:%s%s%s%s%s%s", content, ends[e], ends[e], usage_line, ends[e], ends[e],
                 done, ends[e], ends[e]);
        struct buf whole;
        hide(text, len, 0, &whole);
        assert_int_equal(whole.len, strlen(want));
        assert_memory_equal(whole.p, want, whole.len);
        for (size_t cut = 1; cut < len; cut++) {
            struct buf pieces;
            hide(text, len, cut, &pieces);
            if (pieces.len != whole.len || memcmp(pieces.p, whole.p, whole.len) != 0)
                fail_msg("line end %zu, cut every %zu bytes: other bytes for the client", e, cut);
        }
        for (size_t piece = 1; piece <= whole.len; piece++)
            assert_reading(scan(whole.p, whole.len, piece, 1), through, "hidden");
        assert_reading(scan(text, len, len, 0), through, "shown");
    }
}

/* A "\r\n" cut between its '\r' (the blank line ending the content event)
 * and its '\n', the usage event next: its ':' comes after the '\n', at the
 * start of its line. */
static void test_a_crlf_cut_before_the_usage_line_puts_the_colon_after_it(void **state)
{
    char text[512];
    snprintf(text, sizeof text, "%s\r\n\r\n%s\r\n\r\n", content, usage_line);
    size_t at = strlen(content) + 3; /* the second '\r' and the piece ends */
    struct gw_usage u = {.streamed = 1, .usage_asked = 1};
    struct buf out = {.len = 0};
    assert_int_equal(gw_usage_hide(&u, text, at, emit, &out), 0);
    assert_int_equal(gw_usage_hide(&u, text + at, strlen(text) - at, emit, &out), 0);
    gw_usage_free(&u);
    char want[512];
    snprintf(want, sizeof want, "%s\r\n\r\n:%s\r\n\r\n", content, usage_line);
    assert_int_equal(out.len, strlen(want));
    assert_memory_equal(out.p, want, out.len);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_line_end_of_the_standard_ends_events),
        cmocka_unit_test(test_a_crlf_cut_between_pieces_is_one_line_end),
        cmocka_unit_test(test_usage_is_read_whatever_the_line_ends_and_the_cut),
        cmocka_unit_test(test_the_usage_event_is_hidden_whatever_the_line_ends_and_the_cut),
        cmocka_unit_test(test_a_crlf_cut_before_the_usage_line_puts_the_colon_after_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
