/* usage.c: reading a call's usage out of the answer its replica sent (see
 * gateway.h): the `usage` of the last server-sent event delivered, or of a
 * whole JSON body (of its end only, for one too big to keep), the events
 * delivered that the hold counts, and the stream filter that turns the
 * usage event the client did not ask for into a comment. Replicas are
 * untrusted, so every byte here is theirs; proxy.c feeds it what it
 * delivers, under the call's lock, and tests/fuzz/fuzz_sse_usage.c
 * whatever a replica might send. */
#include "gateway.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* 1 when j carries a usage in range, now the call's. */
static int take_usage(struct gw_usage *u, json_t *j)
{
    json_t *usage = json_object_get(j, "usage");
    if (!json_is_object(usage))
        return 0;
    json_int_t in = json_integer_value(json_object_get(usage, "prompt_tokens"));
    json_int_t out = json_integer_value(json_object_get(usage, "completion_tokens"));
    if (in < 0 || in > GW_USAGE_TOKENS_MAX || out < 0 || out > GW_USAGE_TOKENS_MAX)
        return 0;
    u->input_tokens = in;
    u->output_tokens = out;
    return 1;
}

/* Keeps the last GW_TAIL_KEEP bytes of a non-streamed answer too big to
 * keep whole, with the n more at p: its usage is then read from its end
 * (usage_from_tail), where OpenAI-style answers put it. Skipping the
 * pieces that did not fit, as before, left a hole and no usage at all. */
static void keep_tail(struct gw_usage *u, const char *p, size_t n)
{
    if (!u->keep_tail) {
        u->keep_tail = 1;
        if (u->keep_len > GW_TAIL_KEEP) {
            memmove(u->keep, u->keep + u->keep_len - GW_TAIL_KEEP, GW_TAIL_KEEP);
            u->keep_len = GW_TAIL_KEEP;
        }
        char *fit = realloc(u->keep, GW_TAIL_KEEP + 1);
        if (!fit) {
            free(u->keep); /* no usage then: charged no tokens (gw_usage_finish) */
            u->keep = NULL;
            u->keep_len = 0;
            return;
        }
        u->keep = fit;
    }
    if (!u->keep)
        return;
    if (n >= GW_TAIL_KEEP) {
        memcpy(u->keep, p + n - GW_TAIL_KEEP, GW_TAIL_KEEP);
        u->keep_len = GW_TAIL_KEEP;
    } else {
        size_t room = GW_TAIL_KEEP - n;
        if (u->keep_len > room) {
            memmove(u->keep, u->keep + u->keep_len - room, room);
            u->keep_len = room;
        }
        memcpy(u->keep + u->keep_len, p, n);
        u->keep_len += n;
    }
    u->keep[u->keep_len] = '\0';
}

/* The usage of an answer of which only its end is kept: the last
 * `"usage": {...}` there that is a key of the JSON (its quote not escaped,
 * so not text inside a string) and parses. */
static void usage_from_tail(struct gw_usage *u)
{
    json_t *found = NULL;
    for (char *at = u->keep; (at = strstr(at, "\"usage\"")) != NULL; at++) {
        size_t slashes = 0;
        while (at - (ptrdiff_t)slashes > u->keep && at[-1 - (ptrdiff_t)slashes] == '\\')
            slashes++;
        if (slashes % 2)
            continue;
        const char *v = at + 7;
        v += strspn(v, " \t\r\n");
        if (*v++ != ':')
            continue;
        v += strspn(v, " \t\r\n");
        json_t *obj = *v == '{' ? json_loads(v, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
        if (json_is_object(obj)) {
            json_decref(found);
            found = obj;
        } else {
            json_decref(obj);
        }
    }
    if (found) {
        json_t *wrap = json_pack("{s:o}", "usage", found);
        take_usage(u, wrap);
        json_decref(wrap);
    }
}

/* gw_sse_event_end's state: what the bytes read so far end with. */
enum {
    SSE_LINE_ENDED = 1,  /* a line end: one more ends the event */
    SSE_AFTER_CR = 2,    /* a '\r', counted as a line end: a '\n' next is its "\r\n" pair's */
    SSE_EVENT_ENDED = 4, /* a whole event, and nothing since but line ends */
};

int gw_sse_event_end(int *state, char b)
{
    int s = *state;
    if (b == '\n' && (s & SSE_AFTER_CR)) {
        *state = s & ~SSE_AFTER_CR; /* the '\n' of a "\r\n", which ended its line at the '\r' */
        return 0;
    }
    if (b != '\n' && b != '\r') {
        *state = 0;
        return 0;
    }
    /* A line end is counted at its first byte, a "\r\n" at its '\r':
     * a lone '\r' is a whole line end, and whether a '\n' follows may be
     * known only with the next piece, or never (the stream's last byte). */
    int cr = b == '\r' ? SSE_AFTER_CR : 0;
    if (!(s & SSE_LINE_ENDED)) {
        *state = (s & SSE_EVENT_ENDED) | SSE_LINE_ENDED | cr;
        return 0;
    }
    *state = SSE_EVENT_ENDED | cr;
    return 1;
}

int gw_sse_event_boundary(int state)
{
    return (state & SSE_EVENT_ENDED) != 0;
}

/* Counts, byte b by byte, the ':' of each line that starts ":data:" (of a
 * stream whose usage the gateway asked for): the ':' gw_usage_hide put
 * before the usage event, which the client got and the replica never sent
 * (one such line the replica sent itself reads the same: its usage is
 * read as the hidden event's, and its ':' is not counted either). Byte by
 * byte, so that an event skipped or cut short still counts its lines. A
 * line starts after a '\r' or a '\n' (the '\n' of a "\r\n" starts an
 * empty line, which cannot start ":data:"), as gw_usage_hide's lines do. */
static void count_comment_colon(struct gw_usage *u, char b)
{
    static const char comment[] = ":data:";
    if (u->comment_match >= 0 && u->comment_match < 6 && b == comment[u->comment_match]) {
        if (++u->comment_match == 6)
            u->comment_colons++;
    } else {
        u->comment_match = -1;
    }
    if (b == '\n' || b == '\r')
        u->comment_match = 0;
}

void gw_usage_scan(struct gw_usage *u, const char *p, size_t n)
{
    if (n == 0)
        return; /* nothing delivered (a HEAD, a 304): p may be NULL */
    if (!u->streamed) {
        if (!u->keep_tail && u->keep_len + n <= GW_KEEP_MAX) {
            char *grown = realloc(u->keep, u->keep_len + n + 1);
            if (grown) {
                memcpy(grown + u->keep_len, p, n);
                u->keep = grown;
                u->keep_len += n;
                u->keep[u->keep_len] = '\0';
                return;
            }
        }
        keep_tail(u, p, n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (u->event_len + 2 > GW_EVENT_MAX)
            u->event_len = 0; /* an event too big to be usage; skip it */
        char *grown = u->event_len % 4096 == 0 ? realloc(u->event, u->event_len + 4097) : u->event;
        if (!grown)
            return;
        u->event = grown;
        u->event[u->event_len++] = p[i];
        u->event[u->event_len] = '\0';
        if (u->usage_asked)
            count_comment_colon(u, p[i]);
        /* An event ends at a blank line, by the rule the hold counts
         * events with (gw_sse_event_end: the standard's line ends, "\r\n",
         * '\n' or a lone '\r'). (Its own test before, "\n\n" or "\n\r\n"
         * at the event's end, missed the usage of an event ending
         * "\n\r\r\n", which the hold counted and the client read.) */
        if (gw_sse_event_end(&u->scan_sse_state, p[i])) {
            u->scanned_events++;
            /* Its lines end at each '\r' or '\n': a "\r\n" read so
             * leaves an empty line between the two, as the '\n' the
             * event may start with (its last line end's, when that was a
             * "\r\n": the event ended at the '\r'), and an empty line
             * says nothing of usage. */
            for (char *line = u->event; line && *line;) {
                char *next = strpbrk(line, "\r\n");
                if (next)
                    *next++ = '\0';
                /* The usage event the client did not ask for went out as
                 * a comment (gw_usage_hide). */
                if (u->usage_asked && strncmp(line, ":data:", 6) == 0)
                    line++;
                if (strncmp(line, "data:", 5) == 0) {
                    json_t *j = json_loads(line + 5 + (line[5] == ' '), 0, NULL);
                    /* The replica's bytes read so far, this event's
                     * included, bound what is still to be reported (see
                     * slack): those the hold counts as received, so not
                     * the ':' the gateway put before its usage events. */
                    int64_t through = u->scanned_bytes + (int64_t)i + 1 - u->comment_colons;
                    if (take_usage(u, j)) {
                        atomic_store(&u->slack, u->output_tokens < through ? u->output_tokens - through : 0);
                        atomic_store(&u->base, u->output_tokens - u->scanned_events);
                    }
                    json_decref(j);
                }
                line = next;
            }
            u->event_len = 0;
        }
    }
    u->scanned_bytes += (int64_t)n;
}

int gw_usage_finish(struct gw_usage *u)
{
    if (u->streamed)
        return 0;
    if (u->keep && !u->keep_tail) {
        json_t *j = json_loads(u->keep, 0, NULL);
        take_usage(u, j);
        json_decref(j);
        return 0;
    }
    if (u->keep_tail && u->keep)
        usage_from_tail(u);
    /* No usage in its end: no tokens charged (never an estimate). */
    return u->keep_tail && u->input_tokens == 0 && u->output_tokens == 0 ? -1 : 0;
}

/* Whether a whole line of the stream is the usage event the client did
 * not ask for. */
static int is_usage_event(const char *line, size_t n)
{
    if (n < 5 || strncmp(line, "data:", 5) != 0 || !memmem(line, n, "\"usage\"", 7))
        return 0;
    json_t *j = json_loadb(line + 5, n - 5, 0, NULL);
    json_t *choices = json_object_get(j, "choices");
    int usage = json_is_array(choices) && json_array_size(choices) == 0 && json_is_object(json_object_get(j, "usage"));
    json_decref(j);
    return usage;
}

int gw_usage_flush_line(struct gw_usage *u, gw_usage_emit emit, void *ctx)
{
    if (u->line_len && emit(ctx, u->line, u->line_len) < 0)
        return -1;
    u->line_len = 0;
    return 0;
}

/* The length of the line at p, of n bytes, through its line end (its
 * first '\r' or '\n'); 0 when it has none there. (memchr, not a loop of
 * its own: every byte of every stream whose usage the gateway asked for
 * passes here.) */
static size_t line_with_end(const char *p, size_t n)
{
    const char *lf = memchr(p, '\n', n);
    const char *cr = memchr(p, '\r', lf ? (size_t)(lf - p) : n);
    const char *end = cr ? cr : lf;
    return end ? (size_t)(end - p) + 1 : 0;
}

int gw_usage_hide(struct gw_usage *u, const char *p, size_t n, gw_usage_emit emit, void *ctx)
{
    while (n) {
        if (u->hide_after_cr) {
            u->hide_after_cr = 0;
            /* The '\n' of a "\r\n": the end of the line gone on at its
             * '\r', not an empty line of its own. */
            if (*p == '\n') {
                if (emit(ctx, p, 1) < 0)
                    return -1;
                p++;
                n--;
                continue;
            }
        }
        size_t ended = line_with_end(p, n);
        size_t take = ended ? ended : n;
        /* A line ends at its '\r' whether or not a '\n' follows, so that
         * it is read alike however the stream is cut. */
        u->hide_after_cr = ended && p[ended - 1] == '\r';
        if (u->line_passing || u->line_len + take > GW_EVENT_MAX) {
            if (gw_usage_flush_line(u, emit, ctx) < 0)
                return -1;
            if (emit(ctx, p, take) < 0)
                return -1;
            u->line_passing = !ended;
        } else {
            char *grown = realloc(u->line, u->line_len + take);
            if (!grown)
                return -1;
            u->line = grown;
            memcpy(u->line + u->line_len, p, take);
            u->line_len += take;
            if (ended) {
                if (is_usage_event(u->line, u->line_len) && emit(ctx, ":", 1) < 0)
                    return -1;
                if (emit(ctx, u->line, u->line_len) < 0)
                    return -1;
                u->line_len = 0;
            }
        }
        p += take;
        n -= take;
    }
    return 0;
}

void gw_usage_free(struct gw_usage *u)
{
    if (!u)
        return;
    free(u->event);
    free(u->line);
    free(u->keep);
    u->event = u->line = u->keep = NULL;
    u->event_len = u->line_len = u->keep_len = 0;
}
