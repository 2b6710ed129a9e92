/* term_frame.h: the framing of the web terminal's stream between gpurentd
 * and an agent (docs/AGENT_PROTOCOL.md, "Terminal"), one definition for both
 * ends: 1 byte of type, 4 bytes of big-endian length, then that many bytes,
 * at most TERM_FRAME_MAX. Types: TERM_FRAME_DATA terminal bytes (either
 * way), TERM_FRAME_RESIZE cols and rows (2 bytes each, big-endian; daemon to
 * agent), TERM_FRAME_EXIT the shell's status (4 bytes; agent to daemon). */
#ifndef GPURENT_TERM_FRAME_H
#define GPURENT_TERM_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define TERM_FRAME_MAX 65536 /* largest frame payload either way */
#define TERM_FRAME_HEAD 5    /* type and length */
#define TERM_FRAME_DATA 'd'
#define TERM_FRAME_RESIZE 'r'
#define TERM_FRAME_EXIT 'x'

void term_put_be32(unsigned char *p, uint32_t v);
uint32_t term_get_be32(const unsigned char *p);
/* Appends one frame to the growing buffer *buf (*len used of *cap); -1 out
 * of memory, nothing appended. */
int term_frame_append(unsigned char **buf, size_t *len, size_t *cap, char type, const void *data, size_t n);

#endif
