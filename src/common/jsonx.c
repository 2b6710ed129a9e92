/* jsonx.c: RFC 3339 times and pagination cursors (see jsonx.h). */
#include "gpurent/jsonx.h"
#include "gpurent/money.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

json_t *json_time(int64_t t, int zero_is_null)
{
    if (zero_is_null && t <= 0)
        return json_null();
    time_t tt = (time_t)t;
    struct tm tm;
    char buf[32];
    /* RFC 3339 has four digits of year, always: strftime's %Y would write
     * year 999 as "999". Outside 0000-9999 there is no such string. */
    if (!gmtime_r(&tt, &tm) || tm.tm_year < -1900 || tm.tm_year > 9999 - 1900)
        return json_null();
    snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
             tm.tm_hour, tm.tm_min, tm.tm_sec);
    return json_string(buf);
}

/* Epoch seconds of the date and time in s's first 19 characters
 * ("dddd-dd-ddTdd:dd:dd", 'T' or 't'), read as UTC; -1 if they are not
 * one (31 February included). */
static int time_fields(const char *s, int64_t *out)
{
    static const char shape[] = "dddd-dd-ddTdd:dd:dd";
    for (size_t i = 0; shape[i]; i++)
        if (shape[i] == 'd'   ? (s[i] < '0' || s[i] > '9')
            : shape[i] == 'T' ? (s[i] != 'T' && s[i] != 't')
                              : s[i] != shape[i])
            return -1;
    struct tm tm = {0};
    tm.tm_year = atoi(s) - 1900;
    tm.tm_mon = atoi(s + 5) - 1;
    tm.tm_mday = atoi(s + 8);
    tm.tm_hour = atoi(s + 11);
    tm.tm_min = atoi(s + 14);
    tm.tm_sec = atoi(s + 17);
    if (tm.tm_mon < 0 || tm.tm_mon > 11 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 || tm.tm_min > 59 ||
        tm.tm_sec > 60)
        return -1;
    struct tm check = tm;
    time_t t = timegm(&tm);
    /* timegm normalises 31 February into March: refuse such dates. */
    if (t == (time_t)-1 || tm.tm_mday != check.tm_mday || tm.tm_mon != check.tm_mon)
        return -1;
    *out = (int64_t)t;
    return 0;
}

int json_time_parse(const char *s, int64_t *out)
{
    if (strlen(s) != 20 || s[10] != 'T' || s[19] != 'Z')
        return -1;
    return time_fields(s, out);
}

int json_time_parse_rfc3339(const char *s, int64_t *out, int *fraction)
{
    *fraction = 0;
    int64_t t;
    if (strnlen(s, 20) < 20 || time_fields(s, &t) < 0)
        return -1;
    const char *p = s + 19;
    if (*p == '.') {
        const char *digits = ++p;
        while (*p >= '0' && *p <= '9') {
            *fraction |= *p != '0';
            p++;
        }
        if (p == digits)
            return -1;
    }
    /* The offset is the local time's distance ahead of UTC. */
    int64_t offset = 0;
    if ((*p == 'Z' || *p == 'z') && p[1] == 0) {
        /* UTC */
    } else if ((*p == '+' || *p == '-') && strlen(p) == 6 && p[1] >= '0' && p[1] <= '2' && p[2] >= '0' && p[2] <= '9' &&
               p[3] == ':' && p[4] >= '0' && p[4] <= '5' && p[5] >= '0' && p[5] <= '9') {
        int hh = (p[1] - '0') * 10 + (p[2] - '0'), mm = (p[4] - '0') * 10 + (p[5] - '0');
        if (hh > 23)
            return -1;
        offset = (*p == '-' ? -1 : 1) * (int64_t)(hh * 3600 + mm * 60);
    } else {
        return -1;
    }
    *out = t - offset;
    return 0;
}

json_t *json_money(int64_t micro)
{
    char buf[MONEY_FMT_LEN];
    return json_string(money_format(micro, buf));
}

int json_money_value(json_t *v, int64_t *out)
{
    if (!json_is_string(v))
        return -1;
    return money_parse_n(json_string_value(v), json_string_length(v), out) == MONEY_OK ? 0 : -1;
}

static const char b64url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

void cursor_encode(int64_t t, const char *id, char out[CURSOR_MAX])
{
    char raw[64];
    int n = snprintf(raw, sizeof raw, "%lld.%s", (long long)t, id);
    if (n < 0 || (size_t)n >= sizeof raw)
        n = 0;
    size_t o = 0;
    unsigned bits = 0, acc = 0;
    for (int i = 0; i < n; i++) {
        acc = (acc << 8) | (unsigned char)raw[i];
        bits += 8;
        while (bits >= 6) {
            bits -= 6;
            out[o++] = b64url[(acc >> bits) & 63];
        }
    }
    if (bits)
        out[o++] = b64url[(acc << (6 - bits)) & 63];
    out[o] = '\0';
}

int cursor_decode(const char *cursor, int64_t *t, char *id, size_t idlen)
{
    char raw[64];
    size_t o = 0;
    unsigned bits = 0, acc = 0;
    size_t len = strlen(cursor);
    if (len == 0 || len > 84)
        return -1;
    for (size_t i = 0; i < len; i++) {
        const char *p = strchr(b64url, cursor[i]);
        if (!p || !cursor[i])
            return -1;
        acc = (acc << 6) | (unsigned)(p - b64url);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o + 1 >= sizeof raw)
                return -1;
            raw[o++] = (char)((acc >> bits) & 0xff);
        }
    }
    raw[o] = '\0';
    char *dot = strchr(raw, '.');
    if (!dot || dot == raw)
        return -1;
    long long v = 0;
    for (char *p = raw; p < dot; p++) {
        if (*p < '0' || *p > '9' || v > (INT64_MAX - (*p - '0')) / 10)
            return -1;
        v = v * 10 + (*p - '0');
    }
    const char *rest = dot + 1;
    size_t rlen = strlen(rest);
    if (rlen == 0 || rlen >= idlen)
        return -1;
    /* The characters of ids (lower case, digits, '_') and of invite codes
     * (upper case, digits, '-'): a key of anything else was not ours. */
    for (const char *p = rest; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' ||
              *p == '-'))
            return -1;
    /* Only the spelling cursor_encode writes: no leading zeros, no stray
     * bits in the last character, nothing (not even NULs) after the id. */
    char again[CURSOR_MAX];
    cursor_encode(v, rest, again);
    if (strcmp(again, cursor) != 0)
        return -1;
    *t = v;
    memcpy(id, rest, rlen + 1);
    return 0;
}
