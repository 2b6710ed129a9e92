/* fuzz_jsonx.c: fuzz target for what clients send back that jsonx.h reads:
 * pagination cursors (opaque, but a client may send anything) and RFC 3339
 * times. A cursor that decodes must be the one spelling cursor_encode
 * writes for what it decoded to, and fit the id buffer; a time that parses
 * must be a real date that json_time writes back the same way (up to the
 * letters' case, a fraction, an offset and a leap second, which carry no
 * second of their own). */
#include "gpurent/jsonx.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_cursor(const char *s)
{
    int64_t t = -1;
    char id[40];
    memset(id, 'Z', sizeof id);
    if (cursor_decode(s, &t, id, 33) < 0)
        return;
    if (t < 0 || memchr(id, '\0', 33) == NULL || id[33] != 'Z')
        abort();
    char again[CURSOR_MAX];
    cursor_encode(t, id, again);
    if (strcmp(again, s) != 0)
        abort();
}

static void check_time(const char *s)
{
    int64_t t = 0, t3339 = 0;
    int fraction = 0;
    int strict = json_time_parse(s, &t);
    int loose = json_time_parse_rfc3339(s, &t3339, &fraction);
    /* The strict form is one spelling of the loose one. */
    if (strict == 0 && (loose != 0 || t3339 != t || fraction))
        abort();
    if (strict != 0)
        return;
    json_t *back = json_time(t, 0);
    if (!json_is_string(back))
        abort();
    /* Second 60 (a leap second) is read as the next minute's 0. */
    if (strcmp(json_string_value(back), s) != 0 && !(s[17] == '6' && s[18] == '0'))
        abort();
    int64_t again = 0;
    if (json_time_parse(json_string_value(back), &again) != 0 || again != t)
        abort();
    json_decref(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    check_cursor(s);
    check_time(s);
    /* Every cursor_encode writes is read back (ids up to 32 bytes). */
    if (size >= 8) {
        int64_t t = 0;
        for (int k = 0; k < 8; k++)
            t = (int64_t)((uint64_t)t << 8 | data[k]);
        if (t < 0)
            t = -(t + 1);
        char id[33];
        size_t n = 0;
        for (size_t k = 8; k < size && n < 32; k++)
            if ((data[k] >= 'a' && data[k] <= 'z') || (data[k] >= '0' && data[k] <= '9') || data[k] == '_')
                id[n++] = (char)data[k];
        id[n] = '\0';
        if (n > 0) {
            char c[CURSOR_MAX];
            cursor_encode(t, id, c);
            int64_t t2;
            char id2[33];
            if (cursor_decode(c, &t2, id2, sizeof id2) != 0 || t2 != t || strcmp(id2, id) != 0)
                abort();
        }
    }
    free(s);
    return 0;
}
