/* text.c: the text helpers the discovery parsers read tool output with:
 * spans, digit-by-digit numbers, size units, copies that keep only
 * printable ASCII, error messages, and the JSON documents amd-smi and
 * rocm-smi print among their warnings (see private.h for the rules). */
#include "discovery/private.h"

#include <ctype.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define GIB (UINT64_C(1) << 30)
/* Larger than any card sold; a bigger figure means a misread unit. */
#define MAX_CARD_GB 65536

void text_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Copies at most n bytes of src (stopping at a NUL) into dst of size cap,
 * always terminating. Bytes outside printable ASCII become '?', so a name
 * can neither break a log line nor be invalid UTF-8 for jansson later. */
void text_copy(char *dst, size_t cap, const char *src, size_t n)
{
    size_t i;

    if (cap == 0)
        return;
    for (i = 0; i < n && i + 1 < cap && src[i] != '\0'; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    dst[i] = '\0';
}

void text_copy_str(char *dst, size_t cap, const char *src)
{
    text_copy(dst, cap, src, strlen(src));
}

struct span text_trim(struct span s)
{
    while (s.n > 0 && isspace((unsigned char)s.p[0])) {
        s.p++;
        s.n--;
    }
    while (s.n > 0 && isspace((unsigned char)s.p[s.n - 1]))
        s.n--;
    return s;
}

int text_eq(struct span s, const char *lit)
{
    size_t n = strlen(lit);

    return s.n == n && strncasecmp(s.p, lit, n) == 0;
}

/* Whole span must be decimal digits: no sign, no spaces, no overflow.
 * strtoull would accept "-1" and leading blanks, so it is not used here. */
int text_u64(struct span s, uint64_t *out)
{
    uint64_t v = 0;

    if (s.n == 0)
        return -1;
    for (size_t i = 0; i < s.n; i++) {
        unsigned d;

        if (s.p[i] < '0' || s.p[i] > '9')
            return -1;
        d = (unsigned)(s.p[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

int text_is_na(const char *s)
{
    return strcasecmp(s, "N/A") == 0 || strcasecmp(s, "NA") == 0;
}

/* Bytes for a size unit as the tools print it; amd-smi's "MB" means MiB
 * (an MI300X reports 196592 MB = 192 GiB). 0 for an unknown unit. */
uint64_t text_unit_bytes(struct span u)
{
    if (text_eq(u, "B"))
        return 1;
    if (text_eq(u, "KB") || text_eq(u, "KiB"))
        return UINT64_C(1) << 10;
    if (text_eq(u, "MB") || text_eq(u, "MiB"))
        return UINT64_C(1) << 20;
    if (text_eq(u, "GB") || text_eq(u, "GiB"))
        return UINT64_C(1) << 30;
    return 0;
}

/* Rounds to the nearest GiB: tools report a little less than the nominal
 * size (81559 MiB for an 80 GB H100), and the catalog speaks nominal GB. */
int text_to_gb(uint64_t value, uint64_t unit, int *gb)
{
    uint64_t bytes, g;

    if (unit == 0 || value > UINT64_MAX / unit)
        return -1;
    bytes = value * unit;
    g = bytes / GIB + (bytes % GIB >= GIB / 2 ? 1 : 0);
    if (g > MAX_CARD_GB)
        return -1;
    *gb = (int)g;
    return 0;
}

/* ---- JSON documents, as amd-smi and rocm-smi print them ---------------------- */

/* Some amd-smi and rocm-smi versions print "WARNING: ..." or Python warnings
 * on stdout around the JSON; skips whitespace and any line that does not
 * start a JSON array or object. */
size_t text_skip_noise(const char *text, size_t len, size_t pos)
{
    while (pos < len) {
        size_t eol;

        while (pos < len && isspace((unsigned char)text[pos]))
            pos++;
        if (pos >= len || text[pos] == '{' || text[pos] == '[')
            return pos;
        eol = pos;
        while (eol < len && text[eol] != '\n')
            eol++;
        pos = eol;
    }
    return pos;
}

static int line_of(const char *text, size_t pos)
{
    int line = 1;

    for (size_t i = 0; i < pos; i++)
        if (text[i] == '\n' && line < INT_MAX)
            line++;
    return line;
}

/* Loads the JSON document starting at *pos and moves *pos past it. Returns
 * NULL with err set when it is not valid JSON. */
json_t *text_json_load(const char *tool, const char *text, size_t len, size_t *pos, char *err, size_t errlen)
{
    json_error_t je;
    json_t *doc;

    doc = json_loadb(text + *pos, len - *pos, JSON_DISABLE_EOF_CHECK | JSON_REJECT_DUPLICATES, &je);
    if (doc == NULL) {
        char why[80];

        text_copy_str(why, sizeof why, je.text);
        text_err(err, errlen, "%s output: invalid JSON at line %d: %s", tool,
                 line_of(text, *pos) + (je.line > 0 ? je.line - 1 : 0), why);
        return NULL;
    }
    /* With JSON_DISABLE_EOF_CHECK jansson reports the bytes it read. */
    if (je.position <= 0 || (size_t)je.position > len - *pos) {
        json_decref(doc);
        text_err(err, errlen, "%s output: JSON parser lost its place", tool);
        return NULL;
    }
    *pos += (size_t)je.position;
    return doc;
}

/* Reads a JSON integer or a string of digits (the tools use both). */
int text_json_u64(const json_t *v, uint64_t *out)
{
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);

        if (i < 0)
            return -1;
        *out = (uint64_t)i;
        return 0;
    }
    if (json_is_string(v)) {
        struct span s = {json_string_value(v), json_string_length(v)};
        return text_u64(text_trim(s), out);
    }
    return -1;
}

/* Text of an optional informational field, or NULL when it is absent, not a
 * string, empty or N/A. Being lenient here keeps discovery working when a
 * tool release changes a serial number into an integer. */
const char *text_json_opt(const json_t *obj, const char *key)
{
    const json_t *v = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    const char *s;

    if (!json_is_string(v))
        return NULL;
    s = json_string_value(v);
    if (s[0] == '\0' || text_is_na(s))
        return NULL;
    return s;
}

/* rocm-smi has written both "Card series" and "Card Series". */
json_t *text_json_get_ci(json_t *obj, const char *key)
{
    const char *k;
    json_t *v = json_object_get(obj, key);

    if (v != NULL)
        return v;
    json_object_foreach(obj, k, v)
    {
        if (strcasecmp(k, key) == 0)
            return v;
    }
    return NULL;
}
