/* fuzz_utf8.c: fuzz target for the strict UTF-8 checks (utf8.h): the
 * verdict must match the well-formed byte sequences of the Unicode
 * standard's table 3-7, a scrubbed string must be valid and keep its length
 * (and a valid one its bytes), and text cut where utf8_cut_tail says must
 * stay valid. */
#include "gpurent/utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Unicode 15, table 3-7: each well-formed sequence by its first byte, with
 * the range its second byte must fall in. */
static size_t table_sequence(const uint8_t *s, size_t n)
{
    uint8_t c = s[0], lo = 0x80, hi = 0xBF;
    size_t len;
    if (c <= 0x7F)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t k = 2; k < len; k++)
        if (s[k] < 0x80 || s[k] > 0xBF)
            return 0;
    return len;
}

static int table_valid(const uint8_t *s, size_t n)
{
    for (size_t i = 0, len; i < n; i += len)
        if (!(len = table_sequence(s + i, n - i)))
            return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int valid = utf8_valid((const char *)data, size);
    if (valid != table_valid(data, size))
        abort();
    for (size_t i = 0; i < size && i < 64; i++)
        if (utf8_sequence(data + i, size - i) != table_sequence(data + i, size - i))
            abort();

    /* Scrubbing works on a C string: up to the first NUL. */
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    size_t len = strlen(text);
    int was_valid = utf8_valid(text, len);
    utf8_scrub(text);
    if (strlen(text) != len || !utf8_valid(text, len) || (was_valid && memcmp(text, data, len) != 0))
        abort();
    free(text);

    for (size_t n = 0; n <= size && n <= 1024; n++) {
        size_t cut = utf8_cut_tail(data, n);
        if (cut > 3 || cut > n)
            abort();
        /* A valid text cut anywhere, then trimmed as told, stays valid. */
        if (valid && !utf8_valid((const char *)data, n - cut))
            abort();
    }
    return 0;
}
