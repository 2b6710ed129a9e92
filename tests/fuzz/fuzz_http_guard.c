/* fuzz_http_guard.c: fuzz target for the request guard in front of
 * libmicrohttpd (http_guard_scan): a client's bytes arrive in whatever
 * pieces the network makes, so the guard must reach the same verdict, with
 * the same answer, however the stream is split, and stop the library's
 * reading exactly where the refused request began (or where the refusing
 * read began, when that request started in an earlier one). */
#include "gpurent/http_guard.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The first bytes of an input choose the split; the rest is the stream. */
#define SPLIT_SEED_BYTES 4

struct outcome {
    int refused, status;
    const char *code;
    char message[160];
    size_t passed;      /* bytes handed to the library before the refusal (or all) */
    size_t refusing_at; /* where the read that refused began */
};

static void check_refusal(const struct http_guard *g)
{
    if (!g->refused)
        return;
    /* Every refusal is an API error the client can read. */
    if (g->status < 400 || g->status > 599 || !g->code || !g->code[0] || !g->message[0])
        abort();
}

/* Feeds stream[0, n) in pieces whose lengths come from seed (all at once
 * when seed is 0). */
static void run(const char *stream, size_t n, uint32_t seed, struct outcome *out)
{
    struct http_guard g;
    memset(&g, 0, sizeof g);
    size_t off = 0;
    out->passed = out->refusing_at = 0;
    do {
        size_t piece = n - off;
        if (seed) {
            /* xorshift32: small pieces mostly, the odd large one */
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            size_t want = (seed & 0x100) ? (seed >> 9) % 4096 : (seed & 0xff) % 8;
            piece = want < piece ? want : piece;
        }
        size_t pass = http_guard_scan(&g, stream + off, piece);
        if (pass > piece)
            abort();
        check_refusal(&g);
        if (g.refused) {
            /* The pieces before were passed whole: the library has them. */
            out->passed = off + pass;
            out->refusing_at = off;
            break;
        }
        if (pass != piece)
            abort(); /* no refusal: every byte goes to the library */
        off += piece;
        out->passed = off;
    } while (off < n);
    out->refused = g.refused;
    out->status = g.status;
    out->code = g.code;
    memcpy(out->message, g.message, sizeof out->message);
    http_guard_release(&g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < SPLIT_SEED_BYTES)
        return 0;
    uint32_t seed = (uint32_t)data[0] << 24 | (uint32_t)data[1] << 16 | (uint32_t)data[2] << 8 | data[3];
    const char *stream = (const char *)data + SPLIT_SEED_BYTES;
    size_t n = size - SPLIT_SEED_BYTES;

    struct outcome whole, pieces;
    run(stream, n, 0, &whole);
    run(stream, n, seed | 1, &pieces);
    if (whole.refused != pieces.refused)
        abort();
    if (!whole.refused)
        return 0;
    if (whole.status != pieces.status || strcmp(whole.code, pieces.code) != 0 ||
        strcmp(whole.message, pieces.message) != 0)
        abort();
    /* Read whole, the library gets exactly the bytes before the refused
     * request; read in pieces, the same, unless that request began in an
     * earlier piece: the library already has those, and gets no more. */
    size_t expected = whole.passed > pieces.refusing_at ? whole.passed : pieces.refusing_at;
    if (pieces.passed != expected)
        abort();
    return 0;
}
