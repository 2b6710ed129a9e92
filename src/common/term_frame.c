/* term_frame.c: the web terminal's frames between gpurentd and an agent
 * (gpurent/term_frame.h). */
#include "gpurent/term_frame.h"

#include <stdlib.h>
#include <string.h>

void term_put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16), p[2] = (unsigned char)(v >> 8),
    p[3] = (unsigned char)v;
}

uint32_t term_get_be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int term_frame_append(unsigned char **buf, size_t *len, size_t *cap, char type, const void *data, size_t n)
{
    if (*len + TERM_FRAME_HEAD + n > *cap) {
        size_t c = *cap ? *cap : 16384;
        while (c < *len + TERM_FRAME_HEAD + n)
            c *= 2;
        unsigned char *p = realloc(*buf, c);
        if (!p)
            return -1;
        *buf = p;
        *cap = c;
    }
    unsigned char *p = *buf + *len;
    p[0] = (unsigned char)type;
    term_put_be32(p + 1, (uint32_t)n);
    if (n)
        memcpy(p + TERM_FRAME_HEAD, data, n);
    *len += TERM_FRAME_HEAD + n;
    return 0;
}
