/* fuzz_sse_usage.c: fuzz target for how the gateway reads a call's usage
 * from its replica's answer (usage.c), the bytes a seller's replica sends.
 * The first byte says whether the answer is a stream and whether the
 * gateway asked for its usage, the second how it is cut into pieces, the
 * rest is the answer. Whatever the cut, the usage read is the same, in
 * range, and so are the events counted, both those the upstream thread
 * counts as they come and those read as delivered, which the hold takes
 * for the same events; the stream filter's output is the same and is the
 * answer with only a ':' put before some `data:` lines; and a stream's
 * usage, and the hold's reading of it, is the same whether the gateway
 * asked for it (and hid it as a comment) or the client did (and got it as
 * data), and whichever of the standard's line ends ("\r\n", '\n', a lone
 * '\r') its lines end with; the events are those the standard's grammar
 * names (a reference of it here, apart from usage.c's). */
#include "gateway.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct buf {
    char *p;
    size_t len;
};

static int emit(void *vb, const char *p, size_t n)
{
    struct buf *b = vb;
    char *grown = realloc(b->p, b->len + n + 1);
    if (!grown)
        abort();
    memcpy(grown + b->len, p, n);
    b->p = grown;
    b->len += n;
    return 0;
}

/* The k-th piece's size for a cut: 1 to 23 bytes, varied by cut. */
static size_t piece(unsigned cut, size_t k)
{
    return 1 + (size_t)((cut * 31u + 7u) * (unsigned)(k + 1) % 23u);
}

/* The next piece of len bytes from off, for a cut (0: all the rest). */
static size_t next_piece(unsigned cut, size_t k, size_t off, size_t len)
{
    size_t n = cut ? piece(cut, k) : len - off;
    return n > len - off ? len - off : n;
}

struct reading {
    int64_t in, out, slack, base, scanned, events;
    int finish;
};

/* Delivers text to a fresh reader, whole (cut 0) or in pieces. */
static void read_usage(const char *text, size_t len, int streamed, int asked, unsigned cut, struct reading *r)
{
    struct gw_usage u = {.streamed = streamed, .usage_asked = asked};
    memset(r, 0, sizeof *r); /* compared with memcmp, padding included */
    for (size_t off = 0, k = 0, n; off < len; off += n, k++) {
        n = next_piece(cut, k, off, len);
        gw_usage_scan(&u, text + off, n);
    }
    r->finish = gw_usage_finish(&u);
    r->in = u.input_tokens;
    r->out = u.output_tokens;
    r->slack = atomic_load(&u.slack);
    r->base = atomic_load(&u.base);
    r->scanned = u.scanned_bytes;
    r->events = u.scanned_events;
    if (r->in < 0 || r->in > GW_USAGE_TOKENS_MAX || r->out < 0 || r->out > GW_USAGE_TOKENS_MAX || r->slack > 0)
        abort();
    if (u.event_len >= GW_EVENT_MAX)
        abort();
    gw_usage_free(&u);
}

/* The events the upstream thread counts in text as it comes in pieces
 * (proxy.c, up_body: gw_sse_event_end's state carried between them), and
 * whether it ends with a whole event (gw_sse_event_boundary, by which a
 * stream cut for its funds gets a last event saying why). */
static int64_t count_events(const char *text, size_t len, unsigned cut, int *boundary)
{
    int sse = 0;
    int64_t events = 0;
    for (size_t off = 0, k = 0, n; off < len; off += n, k++) {
        n = next_piece(cut, k, off, len);
        for (size_t i = 0; i < n; i++)
            events += gw_sse_event_end(&sse, text[off + i]);
    }
    *boundary = gw_sse_event_boundary(sse);
    return events;
}

/* The stream filter's output for text, fed in pieces (cut 0: whole). */
static void hide(const char *text, size_t len, unsigned cut, struct buf *out)
{
    struct gw_usage u = {.streamed = 1, .usage_asked = 1};
    for (size_t off = 0, k = 0, n; off < len; off += n, k++) {
        n = next_piece(cut, k, off, len);
        if (gw_usage_hide(&u, text + off, n, emit, out) < 0)
            abort();
    }
    if (gw_usage_flush_line(&u, emit, out) < 0 || u.line_len != 0)
        abort();
    gw_usage_free(&u);
}

/* Whether out is in with a ':' put at the start of some lines that begin
 * "data:" (after a '\r' or a '\n': never between the two of a "\r\n",
 * as no line starts "\ndata:"), and nothing else changed. */
static int only_colons_added(const char *in, size_t in_len, const char *out, size_t out_len)
{
    size_t i = 0, o = 0;
    while (i < in_len) {
        int line_start = i == 0 || in[i - 1] == '\n' || in[i - 1] == '\r';
        if (line_start && o < out_len && out[o] == ':' && in[i] != ':') {
            if (in_len - i < 5 || memcmp(in + i, "data:", 5) != 0)
                return 0;
            o++;
        }
        if (o >= out_len || out[o] != in[i])
            return 0;
        i++;
        o++;
    }
    return o == out_len;
}

/* The standard's grammar (WHATWG HTML, server-sent events), apart from
 * usage.c's: text with each of its line ends ("\r\n", a lone '\r', '\n')
 * made end, into out. */
static void with_line_ends(const char *text, size_t len, const char *end, struct buf *out)
{
    for (size_t i = 0; i < len; i++) {
        if (text[i] != '\r' && text[i] != '\n') {
            emit(out, text + i, 1);
            continue;
        }
        if (text[i] == '\r' && i + 1 < len && text[i + 1] == '\n')
            i++; /* one line end of two bytes */
        emit(out, end, strlen(end));
    }
}

/* The events of a text whose line ends are all '\n' (with_line_ends), by
 * the rule the hold counts them with: two line ends in a row end an
 * event, and the count starts again after it, so a run of k line ends
 * ends k / 2 events; and whether it ends with a whole event (a last run
 * of two or more). */
static int64_t reference_events(const char *lf_text, size_t len, int *boundary)
{
    int64_t events = 0;
    size_t run = 0;
    for (size_t i = 0; i < len; i++) {
        if (lf_text[i] == '\n') {
            run++;
            continue;
        }
        events += (int64_t)(run / 2);
        run = 0;
    }
    *boundary = run >= 2;
    return events + (int64_t)(run / 2);
}

/* Whether some line of text starts ":data:" (a comment the replica sent
 * itself, which a stream whose usage the gateway asked for reads as the
 * hidden usage event). */
static int has_data_comment(const char *text, size_t len)
{
    for (size_t i = 0; i + 6 <= len; i++)
        if ((i == 0 || text[i - 1] == '\n' || text[i - 1] == '\r') && memcmp(text + i, ":data:", 6) == 0)
            return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int streamed = data[0] & 1, asked = (data[0] >> 1) & 1;
    unsigned cut = data[1] ? data[1] : 1;
    const char *text = (const char *)data + 2;
    size_t len = size - 2;

    struct reading whole, pieces;
    read_usage(text, len, streamed, asked, 0, &whole);
    read_usage(text, len, streamed, asked, cut, &pieces);
    if (memcmp(&whole, &pieces, sizeof whole) != 0)
        abort(); /* the usage read, or the events, depend on how the bytes arrived */
    if (!streamed)
        return 0;

    /* The events the hold counts as they come name those read as
     * delivered: the same count, however either arrived, and the count the
     * standard's grammar gives. */
    int boundary, cut_boundary, reference_boundary;
    int64_t came = count_events(text, len, 0, &boundary);
    if (count_events(text, len, cut, &cut_boundary) != came || cut_boundary != boundary)
        abort();
    if (whole.events != came)
        abort();
    struct buf lf = {0};
    with_line_ends(text, len, "\n", &lf);
    if (reference_events(lf.p, lf.len, &reference_boundary) != came || reference_boundary != boundary)
        abort();

    struct buf a = {0}, b = {0};
    hide(text, len, 0, &a);
    hide(text, len, cut, &b);
    if (a.len != b.len || (a.len && memcmp(a.p, b.p, a.len) != 0))
        abort(); /* the client's bytes depend on how they arrived */
    if (!only_colons_added(text, len, a.p, a.len))
        abort();
    /* What the upstream thread counted in what came (text) is what is
     * read in what the filter delivered. */
    struct reading hidden;
    read_usage(a.p, a.len, 1, 1, cut, &hidden);
    if (hidden.events != came)
        abort();
    /* Asked by the gateway and hidden, or asked by the client and shown:
     * the same usage, and the same bounds for the hold: its events, and
     * its bytes (those the replica sent, not the gateway's ':'). */
    if (!has_data_comment(text, len)) {
        struct reading shown;
        read_usage(text, len, 1, 0, 0, &shown);
        if (shown.in != hidden.in || shown.out != hidden.out || shown.base != hidden.base ||
            shown.slack != hidden.slack)
            abort();
    }
    free(a.p);
    free(b.p);

    /* A line end is one whichever of the standard's it is: with all
     * '\n', all '\r' or all "\r\n", the stream has the same events, so
     * the same usage and events are read, and the hold's estimate. */
    struct buf cr = {0}, crlf = {0};
    with_line_ends(text, len, "\r", &cr);
    with_line_ends(text, len, "\r\n", &crlf);
    const struct buf *same_events[] = {&lf, &cr, &crlf};
    struct reading mixed;
    read_usage(text, len, 1, asked, 0, &mixed);
    for (size_t e = 0; e < sizeof same_events / sizeof same_events[0]; e++) {
        struct reading other;
        read_usage(same_events[e]->p, same_events[e]->len, 1, asked, cut, &other);
        if (other.in != mixed.in || other.out != mixed.out || other.events != mixed.events || other.base != mixed.base)
            abort();
    }
    free(lf.p);
    free(cr.p);
    free(crlf.p);
    return 0;
}
