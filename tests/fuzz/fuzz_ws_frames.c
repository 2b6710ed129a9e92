/* fuzz_ws_frames.c: fuzz target for the WebSocket frame-header check
 * (ws_frames_follow): a client's frames arrive in any pieces, so the first
 * bad header and the reason given for it must not depend on the split, and
 * the offset returned must stay within the piece and point at that
 * header's first byte or, when the header began in an earlier piece, at the
 * piece's start. A stream a reference reading of RFC 6455 5.2 finds whole
 * and well-formed must pass. */
#include "gpurent/ws_frames.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SPLIT_SEED_BYTES 4

struct outcome {
    const char *why; /* NULL when every header passed */
    size_t stop;     /* absolute offset returned at the bad header */
    size_t piece_at; /* where the piece that found it began */
};

static void run(const uint8_t *stream, size_t n, uint32_t seed, struct outcome *out)
{
    struct ws_frames f;
    memset(&f, 0, sizeof f);
    memset(out, 0, sizeof *out);
    size_t off = 0;
    while (off < n) {
        size_t piece = n - off;
        if (seed) {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            size_t want = (seed & 0x100) ? (seed >> 9) % 512 : (seed & 0xff) % 6;
            piece = want < piece ? want : piece;
        }
        const char *why = NULL;
        size_t got = ws_frames_follow(&f, stream + off, piece, &why);
        if (got > piece)
            abort();
        if (got < piece) {
            if (!why || !why[0])
                abort(); /* a stop always says why */
            out->why = why;
            out->stop = off + got;
            out->piece_at = off;
            return;
        }
        off += piece;
    }
}

/* The first bad header's offset by a plain reading of RFC 6455 5.2 over the
 * whole stream, or n when there is none. */
static size_t reference(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (n - i < 2)
            return n;
        uint8_t b0 = s[i], b1 = s[i + 1];
        size_t hs = 2 + ((b1 & 0x7f) == 126 ? 2 : (b1 & 0x7f) == 127 ? 8 : 0) + ((b1 & 0x80) ? 4 : 0);
        if (n - i < hs)
            return n;
        uint64_t len = b1 & 0x7f;
        if (len == 126) {
            len = (uint64_t)s[i + 2] << 8 | s[i + 3];
            if (len < 126)
                return i;
        } else if (len == 127) {
            len = 0;
            for (size_t k = 0; k < 8; k++)
                len = len << 8 | s[i + 2 + k];
            if ((len & (UINT64_C(1) << 63)) || len < 65536)
                return i;
        }
        int opcode = b0 & 0x0f, fin = b0 & 0x80;
        if (opcode >= 8 && (!fin || len > 125 || (opcode == 8 && len == 1)))
            return i;
        if (len >= n - i - hs)
            return n; /* the payload runs to (or past) the end */
        i += hs + (size_t)len;
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < SPLIT_SEED_BYTES)
        return 0;
    uint32_t seed = (uint32_t)data[0] << 24 | (uint32_t)data[1] << 16 | (uint32_t)data[2] << 8 | data[3];
    const uint8_t *stream = data + SPLIT_SEED_BYTES;
    size_t n = size - SPLIT_SEED_BYTES;

    struct outcome whole, pieces;
    run(stream, n, 0, &whole);
    run(stream, n, seed | 1, &pieces);
    size_t ref = reference(stream, n);
    if ((whole.why != NULL) != (ref < n) || (whole.why && whole.stop != ref))
        abort();
    if ((whole.why != NULL) != (pieces.why != NULL))
        abort();
    if (!whole.why)
        return 0;
    if (strcmp(whole.why, pieces.why) != 0)
        abort();
    size_t expected = whole.stop > pieces.piece_at ? whole.stop : pieces.piece_at;
    if (pieces.stop != expected)
        abort();
    return 0;
}
