/* ws_frames.h: follows the frame boundaries of a WebSocket client's byte
 * stream (RFC 6455, section 5.2) to find the frame headers the protocol
 * forbids before the frame parser sees them. wslay answers those with a
 * close frame that carries no status code; a relay that stops the stream at
 * such a header can close with 1002 and say why. */
#ifndef GPURENT_WS_FRAMES_H
#define GPURENT_WS_FRAMES_H

#include <stddef.h>
#include <stdint.h>

struct ws_frames {
    uint8_t head[14];      /* the header being read: 2 bytes, 0/2/8 of length, 0/4 of mask */
    size_t head_len;
    uint64_t payload_left; /* of the frame whose header is complete */
};

/* Follows n more bytes of the stream. Returns n when every header in them is
 * allowed so far; otherwise the offset in buf where the first bad header's
 * remaining bytes begin (its first bytes may have come in an earlier call),
 * and *why says what is wrong with it. A bad header is one of: a control
 * frame fragmented or with more than 125 bytes, a close frame of 1 byte
 * (a status code cut short), a length not in its shortest form or with the
 * top bit set. */
size_t ws_frames_follow(struct ws_frames *f, const uint8_t *buf, size_t n, const char **why);

#endif
