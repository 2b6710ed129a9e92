/* jsonx.h: small JSON helpers shared by handlers: times as RFC 3339 strings
 * and opaque pagination cursors. */
#ifndef GPURENT_JSONX_H
#define GPURENT_JSONX_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* "2026-11-29T18:22:00Z" for epoch seconds t; JSON null for t <= 0 when
 * zero_is_null is set. New reference. */
json_t *json_time(int64_t t, int zero_is_null);

/* Parses "2026-11-29T18:22:00Z" (UTC, seconds, 'Z' only) into epoch
 * seconds; -1 if it is anything else. */
int json_time_parse(const char *s, int64_t *out);
/* Parses any RFC 3339 date-time: 'T' or 't', a fraction of a second,
 * and 'Z', 'z' or an offset ("2026-11-30T02:22:00+08:00" is the time
 * above), into epoch seconds, the fraction dropped; *fraction is 1 when it
 * was not zero. -1 if s is not one. */
int json_time_parse_rfc3339(const char *s, int64_t *out, int *fraction);

/* An amount of micro-units as a decimal string ("9.60"). New reference. */
json_t *json_money(int64_t micro);
/* Reads a JSON string holding a non-negative amount ("10", "9.60"): 0, or
 * -1 if it is not a string or not an amount (more than 6 decimals, a sign,
 * an exponent, spaces, overflow). */
int json_money_value(json_t *v, int64_t *out);

/* A cursor names the last item of a page by its sort key (a time and an id)
 * and is opaque to clients: base64url of "TIME.ID". */
#define CURSOR_MAX 96
void cursor_encode(int64_t t, const char *id, char out[CURSOR_MAX]);
/* Parses a cursor; -1 if it is not one we made. id gets at most idlen-1 bytes. */
int cursor_decode(const char *cursor, int64_t *t, char *id, size_t idlen);

#endif
