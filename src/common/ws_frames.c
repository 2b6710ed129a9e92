/* ws_frames.c: the frame headers of a WebSocket client's stream, checked as
 * the bytes arrive (see ws_frames.h). Only headers are read: the payload of
 * a well-formed frame is counted past, never looked at. */
#include "gpurent/ws_frames.h"

/* Bytes in a header that starts with b0 b1: 2, the extended length, the mask. */
static size_t head_size(const uint8_t *h)
{
    size_t len7 = h[1] & 0x7f;
    return 2 + (len7 == 126 ? 2 : len7 == 127 ? 8 : 0) + ((h[1] & 0x80) ? 4 : 0);
}

/* NULL when the complete header h is allowed, else why not; sets *payload. */
static const char *judge(const uint8_t *h, uint64_t *payload)
{
    int fin = h[0] & 0x80, control = h[0] & 0x08, close = (h[0] & 0x0f) == 0x8;
    uint64_t len = h[1] & 0x7f;
    if (len == 126) {
        len = (uint64_t)h[2] << 8 | h[3];
        if (len < 126)
            return "a length not in its shortest form";
    } else if (len == 127) {
        len = 0;
        for (int i = 2; i < 10; i++)
            len = len << 8 | h[i];
        if (len >> 63)
            return "a length with its top bit set";
        if (len <= 0xffff)
            return "a length not in its shortest form";
    }
    if (control && !fin)
        return "a fragmented control frame";
    if (control && len > 125)
        return "a control frame over 125 bytes";
    if (close && len == 1)
        return "a close frame with half a status code";
    *payload = len;
    return NULL;
}

size_t ws_frames_follow(struct ws_frames *f, const uint8_t *buf, size_t n, const char **why)
{
    size_t i = 0;
    while (i < n) {
        if (f->payload_left > 0) {
            size_t skip = f->payload_left < n - i ? (size_t)f->payload_left : n - i;
            f->payload_left -= skip;
            i += skip;
            continue;
        }
        size_t head_start = i;
        while (i < n && (f->head_len < 2 || f->head_len < head_size(f->head)))
            f->head[f->head_len++] = buf[i++];
        if (f->head_len < 2 || f->head_len < head_size(f->head))
            break; /* the rest of the header comes later */
        const char *bad = judge(f->head, &f->payload_left);
        if (bad) {
            *why = bad;
            return head_start;
        }
        f->head_len = 0;
    }
    return n;
}
