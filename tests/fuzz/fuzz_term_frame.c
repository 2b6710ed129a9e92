/* fuzz_term_frame.c: fuzz target for the web terminal's frame codec
 * (term_frame.h): frames the input describes are appended one after the
 * other into a growing buffer and read back by the rule both ends follow
 * (type, 4-byte big-endian length, payload), which must give the same
 * frames, none of them spilling past the buffer. */
#include "gpurent/term_frame.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FRAMES_MAX 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The input: frames of a type byte, a 2-byte length, then up to that
     * many payload bytes (fewer at the end of the input). */
    const uint8_t *type_at[FRAMES_MAX], *payload_at[FRAMES_MAX];
    size_t payload_len[FRAMES_MAX], frames = 0;
    unsigned char *buf = NULL;
    size_t len = 0, cap = 0;
    for (size_t i = 0; i + 3 <= size && frames < FRAMES_MAX; frames++) {
        size_t want = (size_t)data[i + 1] << 8 | data[i + 2];
        size_t have = size - i - 3 < want ? size - i - 3 : want;
        type_at[frames] = data + i;
        payload_at[frames] = data + i + 3;
        payload_len[frames] = have;
        size_t before = len;
        if (term_frame_append(&buf, &len, &cap, (char)data[i], data + i + 3, have) < 0)
            abort();
        if (len != before + TERM_FRAME_HEAD + have || len > cap)
            abort();
        i += 3 + have;
    }
    size_t at = 0;
    for (size_t f = 0; f < frames; f++) {
        if (len - at < TERM_FRAME_HEAD)
            abort();
        uint32_t n = term_get_be32(buf + at + 1);
        if (buf[at] != *type_at[f] || n != payload_len[f] || n > TERM_FRAME_MAX || len - at - TERM_FRAME_HEAD < n ||
            (n && memcmp(buf + at + TERM_FRAME_HEAD, payload_at[f], n) != 0))
            abort();
        at += TERM_FRAME_HEAD + n;
    }
    if (at != len)
        abort();
    unsigned char be[4];
    term_put_be32(be, (uint32_t)size);
    if (term_get_be32(be) != (uint32_t)size)
        abort();
    free(buf);
    return 0;
}
