/* discovery.c: turns amd-smi, rocm-smi and nvidia-smi output into struct
 * gpu_facts, maps marketing names to catalog codes, and runs the tools with a
 * time limit and an output cap. See include/discovery.h for the commands.
 *
 * Everything read from a tool is treated as hostile: JSON goes through
 * jansson, text is only ever read through (pointer, length) spans, numbers
 * are parsed digit by digit with overflow checks, and every string lands in a
 * fixed buffer through copy_text(), which truncates and replaces anything that
 * is not printable ASCII (the strings end up in JSON replies and logs). */
#include "discovery.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpurent/log.h"

#define GIB (UINT64_C(1) << 30)
/* Larger than any card sold; a bigger figure means a misread unit. */
#define MAX_CARD_GB 65536
/* GPU indices above this are not something a tool prints. */
#define MAX_GPU_INDEX 9999

/* ---- small helpers ------------------------------------------------------ */

/* A piece of the tool's output: not NUL-terminated. */
struct span {
    const char *p;  /* first byte */
    size_t n;       /* length in bytes */
};

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...)
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
static void copy_text(char *dst, size_t cap, const char *src, size_t n)
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

static void copy_str(char *dst, size_t cap, const char *src)
{
    copy_text(dst, cap, src, strlen(src));
}

static struct span span_trim(struct span s)
{
    while (s.n > 0 && isspace((unsigned char)s.p[0])) {
        s.p++;
        s.n--;
    }
    while (s.n > 0 && isspace((unsigned char)s.p[s.n - 1]))
        s.n--;
    return s;
}

static int span_eq(struct span s, const char *lit)
{
    size_t n = strlen(lit);

    return s.n == n && strncasecmp(s.p, lit, n) == 0;
}

/* Whole span must be decimal digits: no sign, no spaces, no overflow.
 * strtoull would accept "-1" and leading blanks, so it is not used here. */
static int parse_u64(struct span s, uint64_t *out)
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

static int is_na(const char *s)
{
    return strcasecmp(s, "N/A") == 0 || strcasecmp(s, "NA") == 0;
}

/* Bytes for a size unit as the tools print it; amd-smi's "MB" means MiB
 * (an MI300X reports 196592 MB = 192 GiB). 0 for an unknown unit. */
static uint64_t unit_bytes(struct span u)
{
    if (span_eq(u, "B"))
        return 1;
    if (span_eq(u, "KB") || span_eq(u, "KiB"))
        return UINT64_C(1) << 10;
    if (span_eq(u, "MB") || span_eq(u, "MiB"))
        return UINT64_C(1) << 20;
    if (span_eq(u, "GB") || span_eq(u, "GiB"))
        return UINT64_C(1) << 30;
    return 0;
}

/* Rounds to the nearest GiB: tools report a little less than the nominal
 * size (81559 MiB for an 80 GB H100), and the catalog speaks nominal GB. */
static int to_gb(uint64_t value, uint64_t unit, int *gb)
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

static void facts_reset(struct gpu_facts *f, const char *vendor, const char *stack)
{
    memset(f, 0, sizeof *f);
    copy_str(f->vendor, sizeof f->vendor, vendor);
    copy_str(f->stack, sizeof f->stack, stack);
}

static void mark_failed(struct gpu_card *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Marks the card failed and adds the reason, once, after any earlier one. */
static void mark_failed(struct gpu_card *c, const char *fmt, ...)
{
    char why[96];
    size_t used;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    c->healthy = 0;
    if (strstr(c->health_reason, why) != NULL)
        return;
    used = strlen(c->health_reason);
    if (used == 0) {
        copy_str(c->health_reason, sizeof c->health_reason, why);
    } else if (used + 3 < sizeof c->health_reason) {
        memcpy(c->health_reason + used, "; ", 2);
        copy_str(c->health_reason + used + 2, sizeof c->health_reason - used - 2, why);
    }
}

static void card_set_name(struct gpu_card *c, const char *name, size_t n)
{
    const char *code;

    copy_text(c->name, sizeof c->name, name, n);
    code = discovery_model_code(c->name);
    copy_str(c->model, sizeof c->model, code ? code : "");
}

/* Index -1 (a card the tool could not number) goes last. */
static int card_cmp(const void *a, const void *b)
{
    const struct gpu_card *x = a, *y = b;
    unsigned ux = (unsigned)x->index, uy = (unsigned)y->index;

    return ux < uy ? -1 : ux > uy;
}

static void facts_sort(struct gpu_facts *f)
{
    qsort(f->cards, f->n_cards, sizeof f->cards[0], card_cmp);
}

static struct gpu_card *card_find(struct gpu_facts *f, int index)
{
    for (size_t i = 0; i < f->n_cards; i++)
        if (f->cards[i].index == index)
            return &f->cards[i];
    return NULL;
}

static struct gpu_card *card_add(struct gpu_facts *f, int index)
{
    struct gpu_card *c;

    if (f->n_cards >= DISCOVERY_MAX_CARDS)
        return NULL;
    c = &f->cards[f->n_cards++];
    memset(c, 0, sizeof *c);
    c->index = index;
    c->healthy = 1;
    return c;
}

/* ---- model names --------------------------------------------------------- */

#define MAX_TOKENS 16
#define TOKEN_LEN 16

struct tokens {
    size_t n;                       /* words in t */
    char t[MAX_TOKENS][TOKEN_LEN];  /* upper-cased words, NUL-terminated */
};

/* Splits a name into upper-case alphanumeric words, so "AMD Instinct
 * MI250X/MI250" and "[Instinct MI250X/MI250]" both yield MI250X and MI250,
 * and "MI300X" never matches inside "MI300XL". Over-long words are dropped. */
static void tokenize(const char *name, struct tokens *tk)
{
    size_t len = 0;
    int overlong = 0;

    tk->n = 0;
    for (const char *p = name;; p++) {
        if (*p != '\0' && isalnum((unsigned char)*p)) {
            if (len + 1 < TOKEN_LEN && tk->n < MAX_TOKENS)
                tk->t[tk->n][len++] = (char)toupper((unsigned char)*p);
            else
                overlong = 1;
            continue;
        }
        if (len > 0 && !overlong && tk->n < MAX_TOKENS) {
            tk->t[tk->n][len] = '\0';
            tk->n++;
        }
        len = 0;
        overlong = 0;
        if (*p == '\0')
            break;
    }
}

static long token_at(const struct tokens *tk, const char *word)
{
    for (size_t i = 0; i < tk->n; i++)
        if (strcmp(tk->t[i], word) == 0)
            return (long)i;
    return -1;
}

static int has_token(const struct tokens *tk, const char *word)
{
    return token_at(tk, word) >= 0;
}

const char *discovery_model_code(const char *name)
{
    struct tokens tk;
    long rtx;

    if (name == NULL)
        return NULL;
    tokenize(name, &tk);
    if (has_token(&tk, "MI450") || has_token(&tk, "MI450X"))
        return "MI450";
    if (has_token(&tk, "MI300X"))
        return "MI300X";
    if (has_token(&tk, "MI250") || has_token(&tk, "MI250X"))
        return "MI250";
    /* Older amdgpu FRU names call the MI250 OAM "MI200 (MCM) OAM ..."; the
     * single-die MI210 is a PCIe card and never says MCM. */
    if (has_token(&tk, "MI200") && has_token(&tk, "MCM"))
        return "MI250";
    if (has_token(&tk, "H100")) {
        /* "NVIDIA H100 80GB HBM3" is the SXM5 board; PCIe and NVL are
         * different products with their own price. */
        if (has_token(&tk, "PCIE") || has_token(&tk, "NVL"))
            return NULL;
        if (has_token(&tk, "HBM3") || has_token(&tk, "SXM") || has_token(&tk, "SXM5"))
            return "H100-SXM";
        return NULL;
    }
    /* "RTX 4090 D" (the cut-down China model) and laptop parts add words
     * after 4090, so the 4090 must end the name. */
    rtx = token_at(&tk, "RTX");
    if (rtx >= 0 && (size_t)rtx + 2 == tk.n && strcmp(tk.t[rtx + 1], "4090") == 0)
        return "RTX4090";
    return NULL;
}

/* ---- JSON documents ------------------------------------------------------ */

/* Some amd-smi and rocm-smi versions print "WARNING: ..." or Python warnings
 * on stdout around the JSON; skips whitespace and any line that does not
 * start a JSON array or object. */
static size_t skip_noise(const char *text, size_t len, size_t pos)
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
static json_t *load_doc(const char *tool, const char *text, size_t len, size_t *pos,
                        char *err, size_t errlen)
{
    json_error_t je;
    json_t *doc;

    doc = json_loadb(text + *pos, len - *pos, JSON_DISABLE_EOF_CHECK | JSON_REJECT_DUPLICATES,
                     &je);
    if (doc == NULL) {
        char why[80];

        copy_str(why, sizeof why, je.text);
        set_err(err, errlen, "%s output: invalid JSON at line %d: %s", tool,
                line_of(text, *pos) + (je.line > 0 ? je.line - 1 : 0), why);
        return NULL;
    }
    /* With JSON_DISABLE_EOF_CHECK jansson reports the bytes it read. */
    if (je.position <= 0 || (size_t)je.position > len - *pos) {
        json_decref(doc);
        set_err(err, errlen, "%s output: JSON parser lost its place", tool);
        return NULL;
    }
    *pos += (size_t)je.position;
    return doc;
}

/* Reads a JSON integer or a string of digits (the tools use both). */
static int json_u64(const json_t *v, uint64_t *out)
{
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);

        if (i < 0)
            return -1;
        *out = (uint64_t)i;
        return 0;
    }
    if (json_is_string(v)) {
        struct span s = { json_string_value(v), json_string_length(v) };
        return parse_u64(span_trim(s), out);
    }
    return -1;
}

/* Text of an optional informational field, or NULL when it is absent, not a
 * string, empty or N/A. Being lenient here keeps discovery working when a
 * tool release changes a serial number into an integer. */
static const char *opt_text(const json_t *obj, const char *key)
{
    const json_t *v = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    const char *s;

    if (!json_is_string(v))
        return NULL;
    s = json_string_value(v);
    if (s[0] == '\0' || is_na(s))
        return NULL;
    return s;
}

/* rocm-smi has written both "Card series" and "Card Series". */
static json_t *get_ci(json_t *obj, const char *key)
{
    const char *k;
    json_t *v = json_object_get(obj, key);

    if (v != NULL)
        return v;
    json_object_foreach(obj, k, v) {
        if (strcasecmp(k, key) == 0)
            return v;
    }
    return NULL;
}

/* ---- amd-smi ------------------------------------------------------------- */

#define AMD_MSG "amd-smi output"

/* Reads the "size" of the vram section: {"value": 196592, "unit": "MB"}
 * (ROCm 6.1+), "196592 MB" (older), or a bare number of MB. Sets *na when
 * the tool printed N/A. */
static int amd_vram_size(const json_t *size, int idx, int *gb, int *na,
                         char *err, size_t errlen)
{
    uint64_t value, unit;
    char shown[24];

    *na = 0;
    if (json_is_object(size)) {
        const json_t *v = json_object_get(size, "value");
        const json_t *u = json_object_get(size, "unit");

        if (v == NULL) {
            set_err(err, errlen, AMD_MSG ": card %d has no vram size", idx);
            return -1;
        }
        if (json_is_string(v) && is_na(json_string_value(v))) {
            *na = 1;
            return 0;
        }
        if (json_u64(v, &value) != 0) {
            set_err(err, errlen, AMD_MSG ": card %d: vram size value is not a number", idx);
            return -1;
        }
        if (!json_is_string(u)) {
            set_err(err, errlen, AMD_MSG ": card %d: vram size has no unit", idx);
            return -1;
        }
        unit = unit_bytes((struct span){ json_string_value(u), json_string_length(u) });
        if (unit == 0) {
            copy_str(shown, sizeof shown, json_string_value(u));
            set_err(err, errlen, AMD_MSG ": card %d: unknown vram unit \"%s\"", idx, shown);
            return -1;
        }
    } else if (json_is_string(size)) {
        struct span s = span_trim((struct span){ json_string_value(size),
                                                 json_string_length(size) });
        size_t d = 0;

        if (span_eq(s, "N/A")) {
            *na = 1;
            return 0;
        }
        while (d < s.n && s.p[d] >= '0' && s.p[d] <= '9')
            d++;
        if (parse_u64((struct span){ s.p, d }, &value) != 0) {
            set_err(err, errlen, AMD_MSG ": card %d: vram size is not a number", idx);
            return -1;
        }
        s = span_trim((struct span){ s.p + d, s.n - d });
        unit = s.n == 0 ? UINT64_C(1) << 20 : unit_bytes(s);
        if (unit == 0) {
            copy_text(shown, sizeof shown, s.p, s.n);
            set_err(err, errlen, AMD_MSG ": card %d: unknown vram unit \"%s\"", idx, shown);
            return -1;
        }
    } else if (json_is_integer(size)) {
        if (json_u64(size, &value) != 0) {
            set_err(err, errlen, AMD_MSG ": card %d: vram size is negative", idx);
            return -1;
        }
        unit = UINT64_C(1) << 20;
    } else {
        set_err(err, errlen, AMD_MSG ": card %d: vram size has the wrong type", idx);
        return -1;
    }
    if (to_gb(value, unit, gb) != 0) {
        set_err(err, errlen, AMD_MSG ": card %d: vram size is implausibly large", idx);
        return -1;
    }
    return 0;
}

/* The part of a card that `amd-smi static` prints. */
static int amd_static(json_t *e, struct gpu_card *c, struct gpu_facts *f,
                      char *err, size_t errlen)
{
    json_t *asic = json_object_get(e, "asic");
    json_t *vram = json_object_get(e, "vram");
    json_t *board = json_object_get(e, "board");
    json_t *ras = json_object_get(e, "ras");
    json_t *name, *size, *exceeded;
    const char *s;
    int na;

    /* A card amd-smi cannot talk to may get "N/A" for a whole section. */
    if (json_is_string(asic) && is_na(json_string_value(asic))) {
        copy_str(c->name, sizeof c->name, "N/A");
        mark_failed(c, "amd-smi cannot read the model name");
        asic = NULL;
    } else if (!json_is_object(asic)) {
        set_err(err, errlen, AMD_MSG ": card %d has no asic section", c->index);
        return -1;
    }
    if (asic != NULL) {
        name = json_object_get(asic, "market_name");
        if (name == NULL) {
            set_err(err, errlen, AMD_MSG ": card %d has no market_name", c->index);
            return -1;
        }
        if (!json_is_string(name)) {
            set_err(err, errlen, AMD_MSG ": card %d: market_name is not a string", c->index);
            return -1;
        }
        card_set_name(c, json_string_value(name), json_string_length(name));
        if (c->name[0] == '\0' || is_na(c->name))
            mark_failed(c, "amd-smi cannot read the model name");
    }

    size = json_is_object(vram) ? json_object_get(vram, "size") : NULL;
    if (json_is_string(vram) && is_na(json_string_value(vram))) {
        mark_failed(c, "amd-smi cannot read the VRAM size");
    } else if (vram != NULL && !json_is_object(vram)) {
        set_err(err, errlen, AMD_MSG ": card %d: vram is not an object", c->index);
        return -1;
    } else if (size == NULL) {
        set_err(err, errlen, AMD_MSG ": card %d has no vram size", c->index);
        return -1;
    } else {
        if (amd_vram_size(size, c->index, &c->memory_gb, &na, err, errlen) != 0)
            return -1;
        if (na)
            mark_failed(c, "amd-smi cannot read the VRAM size");
        else if (c->memory_gb == 0)
            mark_failed(c, "amd-smi reports no VRAM");
    }

    if ((s = opt_text(json_object_get(e, "bus"), "bdf")) != NULL)
        copy_str(c->bus_id, sizeof c->bus_id, s);
    /* The board serial is what is printed on the card; the ASIC serial is a
     * fallback for boards without FRU data. */
    if ((s = opt_text(board, "product_serial")) != NULL ||
        (s = opt_text(asic, "asic_serial")) != NULL)
        copy_str(c->serial, sizeof c->serial, s);
    if (f->driver_version[0] == '\0' &&
        (s = opt_text(json_object_get(e, "driver"), "version")) != NULL)
        copy_str(f->driver_version, sizeof f->driver_version, s);

    /* amdgpu retires VRAM pages with uncorrectable errors; past the
     * threshold the card is due for replacement. */
    exceeded = json_is_object(ras) ? json_object_get(ras, "bad_page_threshold_exceeded") : NULL;
    if (json_is_true(exceeded) ||
        (json_is_string(exceeded) && (strcasecmp(json_string_value(exceeded), "true") == 0 ||
                                      strcasecmp(json_string_value(exceeded), "yes") == 0)))
        mark_failed(c, "bad page threshold exceeded");
    return 0;
}

/* The part of a card that `amd-smi metric --ecc` prints. */
static int amd_ecc(json_t *ecc, struct gpu_card *c, char *err, size_t errlen)
{
    json_t *v = json_object_get(ecc, "total_uncorrectable_count");
    uint64_t n;

    if (v == NULL || (json_is_string(v) && is_na(json_string_value(v))))
        return 0;
    if (json_u64(v, &n) != 0) {
        set_err(err, errlen, AMD_MSG ": card %d: total_uncorrectable_count is not a number",
                c->index);
        return -1;
    }
    if (n > 0)
        mark_failed(c, "%llu uncorrectable ECC errors", (unsigned long long)n);
    return 0;
}

static int amd_entry(json_t *e, size_t pos, struct gpu_facts *f, unsigned char *has_static,
                     int *seen, size_t *n_seen, char *err, size_t errlen)
{
    json_t *gpu = json_object_get(e, "gpu");
    json_t *ecc = json_object_get(e, "ecc");
    struct gpu_card *c;
    uint64_t idx;
    int index;

    if (!json_is_object(e)) {
        set_err(err, errlen, AMD_MSG ": entry %zu is not an object", pos);
        return -1;
    }
    if (gpu == NULL) {
        const char *rocm = opt_text(e, "rocm_version");

        /* `amd-smi version --json` has no GPU index, only versions. */
        if (json_object_get(e, "rocm_version") == NULL &&
            json_object_get(e, "amdsmi_library_version") == NULL) {
            set_err(err, errlen, AMD_MSG ": entry %zu has no \"gpu\" index", pos);
            return -1;
        }
        if (rocm != NULL)
            copy_str(f->stack_version, sizeof f->stack_version, rocm);
        return 0;
    }
    if (json_u64(gpu, &idx) != 0 || idx > MAX_GPU_INDEX) {
        set_err(err, errlen, AMD_MSG ": entry %zu: \"gpu\" is not a GPU index", pos);
        return -1;
    }
    index = (int)idx;
    for (size_t i = 0; i < *n_seen; i++) {
        if (seen[i] == index) {
            set_err(err, errlen, AMD_MSG ": card %d is listed twice", index);
            return -1;
        }
    }
    c = card_find(f, index);
    if (c == NULL && (c = card_add(f, index)) == NULL) {
        set_err(err, errlen, AMD_MSG ": more than %d cards", DISCOVERY_MAX_CARDS);
        return -1;
    }
    /* A document lists each card once, so n_seen stays within the cards. */
    seen[(*n_seen)++] = index;

    if (json_object_get(e, "asic") != NULL || json_object_get(e, "vram") != NULL) {
        size_t slot = (size_t)(c - f->cards);

        if (has_static[slot]) {
            set_err(err, errlen, AMD_MSG ": card %d has two static descriptions", index);
            return -1;
        }
        has_static[slot] = 1;
        if (amd_static(e, c, f, err, errlen) != 0)
            return -1;
    }
    if (json_is_object(ecc) && amd_ecc(ecc, c, err, errlen) != 0)
        return -1;
    return 0;
}

/* One document: [ {...}, ... ] (ROCm 6), {"gpu_data": [...]} (ROCm 7), or a
 * single object such as the one `amd-smi version --json` may print. */
static int amd_doc(json_t *doc, struct gpu_facts *f, unsigned char *has_static,
                   char *err, size_t errlen)
{
    int seen[DISCOVERY_MAX_CARDS];
    size_t n_seen = 0, i;
    json_t *list = doc, *e;

    if (json_is_object(doc)) {
        list = json_object_get(doc, "gpu_data");
        if (list == NULL)
            return amd_entry(doc, 0, f, has_static, seen, &n_seen, err, errlen);
        if (!json_is_array(list)) {
            set_err(err, errlen, AMD_MSG ": gpu_data is not a list");
            return -1;
        }
    }
    json_array_foreach(list, i, e) {
        if (n_seen >= DISCOVERY_MAX_CARDS && json_object_get(e, "gpu") != NULL) {
            set_err(err, errlen, AMD_MSG ": more than %d cards", DISCOVERY_MAX_CARDS);
            return -1;
        }
        if (amd_entry(e, i, f, has_static, seen, &n_seen, err, errlen) != 0)
            return -1;
    }
    return 0;
}

int discovery_parse_amd_smi(const char *text, size_t len, struct gpu_facts *out,
                            char *err, size_t errlen)
{
    unsigned char has_static[DISCOVERY_MAX_CARDS] = { 0 };
    size_t pos = 0, n_static = 0;
    int docs = 0;

    facts_reset(out, "AMD", "ROCm");
    if (text == NULL || len == 0) {
        set_err(err, errlen, AMD_MSG ": empty");
        goto fail;
    }
    if (len > DISCOVERY_MAX_OUTPUT) {
        set_err(err, errlen, AMD_MSG ": larger than %u bytes", DISCOVERY_MAX_OUTPUT);
        goto fail;
    }
    for (;;) {
        json_t *doc;
        int rc;

        pos = skip_noise(text, len, pos);
        if (pos >= len)
            break;
        if ((doc = load_doc("amd-smi", text, len, &pos, err, errlen)) == NULL)
            goto fail;
        rc = amd_doc(doc, out, has_static, err, errlen);
        json_decref(doc);
        if (rc != 0)
            goto fail;
        docs++;
    }
    if (docs == 0) {
        set_err(err, errlen, AMD_MSG ": no JSON found");
        goto fail;
    }
    for (size_t i = 0; i < out->n_cards; i++) {
        if (!has_static[i]) {
            set_err(err, errlen, AMD_MSG ": card %d has no static data (asic, vram)",
                    out->cards[i].index);
            goto fail;
        }
        n_static++;
    }
    if (n_static == 0) {
        set_err(err, errlen, AMD_MSG ": no GPUs listed");
        goto fail;
    }
    facts_sort(out);
    return 0;
fail:
    memset(out, 0, sizeof *out);
    return -1;
}

/* ---- rocm-smi ------------------------------------------------------------ */

#define ROCM_MSG "rocm-smi output"

static int rocm_card(json_t *v, int index, struct gpu_facts *f, char *err, size_t errlen)
{
    struct gpu_card *c;
    json_t *series, *vram;
    const char *s;
    uint64_t bytes;

    if (card_find(f, index) != NULL) {
        set_err(err, errlen, ROCM_MSG ": card %d is listed twice", index);
        return -1;
    }
    if ((c = card_add(f, index)) == NULL) {
        set_err(err, errlen, ROCM_MSG ": more than %d cards", DISCOVERY_MAX_CARDS);
        return -1;
    }
    if (!json_is_object(v)) {
        set_err(err, errlen, ROCM_MSG ": card %d is not an object", index);
        return -1;
    }
    series = get_ci(v, "Card Series");
    if (series == NULL) {
        set_err(err, errlen, ROCM_MSG ": card %d has no Card Series (run with --showproductname)",
                index);
        return -1;
    }
    if (!json_is_string(series)) {
        set_err(err, errlen, ROCM_MSG ": card %d: Card Series is not a string", index);
        return -1;
    }
    card_set_name(c, json_string_value(series), json_string_length(series));
    if (c->name[0] == '\0' || is_na(c->name))
        mark_failed(c, "rocm-smi cannot read the model name");

    vram = get_ci(v, "VRAM Total Memory (B)");
    if (vram == NULL) {
        set_err(err, errlen, ROCM_MSG ": card %d has no vram size", index);
        return -1;
    }
    if (json_is_string(vram) && is_na(json_string_value(vram))) {
        mark_failed(c, "rocm-smi cannot read the VRAM size");
    } else if (json_u64(vram, &bytes) != 0) {
        set_err(err, errlen, ROCM_MSG ": card %d: VRAM Total Memory (B) is not a number", index);
        return -1;
    } else if (to_gb(bytes, 1, &c->memory_gb) != 0) {
        set_err(err, errlen, ROCM_MSG ": card %d: vram size is implausibly large", index);
        return -1;
    } else if (c->memory_gb == 0) {
        mark_failed(c, "rocm-smi reports no VRAM");
    }

    if ((s = opt_text(v, "PCI Bus")) != NULL)
        copy_str(c->bus_id, sizeof c->bus_id, s);
    if ((s = opt_text(v, "Serial Number")) != NULL)
        copy_str(c->serial, sizeof c->serial, s);
    return 0;
}

int discovery_parse_rocm_smi(const char *text, size_t len, struct gpu_facts *out,
                             char *err, size_t errlen)
{
    json_t *doc = NULL, *v;
    const char *key;
    size_t pos = 0;

    facts_reset(out, "AMD", "ROCm");
    if (text == NULL || len == 0) {
        set_err(err, errlen, ROCM_MSG ": empty");
        goto fail;
    }
    if (len > DISCOVERY_MAX_OUTPUT) {
        set_err(err, errlen, ROCM_MSG ": larger than %u bytes", DISCOVERY_MAX_OUTPUT);
        goto fail;
    }
    pos = skip_noise(text, len, pos);
    if (pos >= len) {
        set_err(err, errlen, ROCM_MSG ": no JSON found");
        goto fail;
    }
    if ((doc = load_doc("rocm-smi", text, len, &pos, err, errlen)) == NULL)
        goto fail;
    if (skip_noise(text, len, pos) < len) {
        set_err(err, errlen, ROCM_MSG ": more than one JSON document");
        goto fail;
    }
    if (!json_is_object(doc)) {
        set_err(err, errlen, ROCM_MSG ": top level is not an object");
        goto fail;
    }
    json_object_foreach(doc, key, v) {
        if (strcmp(key, "system") == 0) {
            const char *s = json_is_object(v) ? opt_text(v, "Driver version") : NULL;

            if (s != NULL)
                copy_str(out->driver_version, sizeof out->driver_version, s);
        } else if (strncmp(key, "card", 4) == 0) {
            struct span num = { key + 4, strlen(key + 4) };
            uint64_t idx;

            if (parse_u64(num, &idx) != 0 || idx > MAX_GPU_INDEX) {
                char shown[24];

                copy_str(shown, sizeof shown, key);
                set_err(err, errlen, ROCM_MSG ": \"%s\" is not a card name", shown);
                goto fail;
            }
            if (rocm_card(v, (int)idx, out, err, errlen) != 0)
                goto fail;
        }
        /* Other keys are sections this command does not ask for. */
    }
    if (out->n_cards == 0) {
        set_err(err, errlen, ROCM_MSG ": no GPUs listed");
        goto fail;
    }
    json_decref(doc);
    facts_sort(out);
    return 0;
fail:
    json_decref(doc);
    memset(out, 0, sizeof *out);
    return -1;
}

/* ---- nvidia-smi ---------------------------------------------------------- */

#define NV_MSG "nvidia-smi output"

enum nv_field { NV_INDEX, NV_NAME, NV_MEMORY, NV_DRIVER, NV_SERIAL, NV_UUID, NV_BUS,
                NV_ECC, NV_RETIRED, NV_NFIELDS };

static const char *const nv_field_names[NV_NFIELDS] = {
    "index", "name", "memory.total", "driver_version", "serial", "uuid", "pci.bus_id",
    "ecc.errors.uncorrected.volatile.total", "retired_pages.pending",
};

enum nv_kind {
    NV_PLAIN,   /* a real value */
    NV_ABSENT,  /* the card or driver does not offer this field */
    NV_FAILED,  /* the driver could not read the card */
};

/* nvidia-smi puts anything that is not a value in brackets. "[N/A]" and
 * "[Not Supported]" are normal (a GeForce has no ECC); anything else, like
 * "[GPU requires reset]" or "[Unknown Error]", means the card is in trouble. */
static enum nv_kind nv_kind(struct span v)
{
    struct span in;

    if (span_eq(v, "N/A") || v.n == 0)
        return NV_ABSENT;
    if (v.n < 2 || v.p[0] != '[' || v.p[v.n - 1] != ']')
        return NV_PLAIN;
    in = (struct span){ v.p + 1, v.n - 2 };
    if (span_eq(in, "N/A") || span_eq(in, "Not Supported") ||
        span_eq(in, "Insufficient Permissions") || span_eq(in, "Not Available"))
        return NV_ABSENT;
    return NV_FAILED;
}

#define LOST_PREFIX "Unable to determine the device handle for GPU"

/* A card that fell off the bus is not a row but a message:
 * "Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error". */
static int nv_lost_card(struct span line, struct gpu_facts *f, int lineno,
                        char *err, size_t errlen)
{
    struct span rest = span_trim((struct span){ line.p + strlen(LOST_PREFIX),
                                                line.n - strlen(LOST_PREFIX) });
    struct span bus = rest, why = { "", 0 };
    struct gpu_card *c;
    char reason[64];

    for (size_t i = rest.n; i >= 2; i--) {
        if (rest.p[i - 2] == ':' && rest.p[i - 1] == ' ') {
            bus = (struct span){ rest.p, i - 2 };
            why = span_trim((struct span){ rest.p + i, rest.n - i });
            break;
        }
    }
    if ((c = card_add(f, -1)) == NULL) {
        set_err(err, errlen, NV_MSG ": more than %d cards (line %d)", DISCOVERY_MAX_CARDS, lineno);
        return -1;
    }
    copy_text(c->bus_id, sizeof c->bus_id, bus.p, bus.n);
    copy_text(reason, sizeof reason, why.p, why.n);
    mark_failed(c, "nvidia-smi cannot reach it: %s", reason[0] ? reason : "no reason given");
    return 0;
}

static int nv_row(struct span line, struct gpu_facts *f, int lineno, char *err, size_t errlen)
{
    struct span v[NV_NFIELDS];
    size_t nf = 0, start = 0;
    struct gpu_card *c;
    uint64_t num;
    int index, gb;

    for (size_t i = 0; i <= line.n; i++) {
        if (i < line.n && line.p[i] != ',')
            continue;
        if (nf < NV_NFIELDS)
            v[nf] = span_trim((struct span){ line.p + start, i - start });
        nf++;
        start = i + 1;
    }
    if (nf == 1) {
        /* Not CSV at all: nvidia-smi telling why it failed, e.g. "NVIDIA-SMI
         * has failed because it couldn't communicate with the NVIDIA driver". */
        char shown[100];

        copy_text(shown, sizeof shown, line.p, line.n);
        set_err(err, errlen, NV_MSG " line %d: %s", lineno, shown);
        return -1;
    }
    if (nf != NV_NFIELDS) {
        set_err(err, errlen, NV_MSG " line %d: expected %d fields, got %zu", lineno,
                NV_NFIELDS, nf);
        return -1;
    }
    if (parse_u64(v[NV_INDEX], &num) != 0 || num > MAX_GPU_INDEX) {
        set_err(err, errlen, NV_MSG " line %d: index is not a number", lineno);
        return -1;
    }
    index = (int)num;
    if (card_find(f, index) != NULL) {
        set_err(err, errlen, NV_MSG " line %d: card %d is listed twice", lineno, index);
        return -1;
    }
    if ((c = card_add(f, index)) == NULL) {
        set_err(err, errlen, NV_MSG ": more than %d cards (line %d)", DISCOVERY_MAX_CARDS, lineno);
        return -1;
    }
    for (int i = 0; i < NV_NFIELDS; i++) {
        if (nv_kind(v[i]) == NV_FAILED) {
            char what[48];

            copy_text(what, sizeof what, v[i].p + 1, v[i].n - 2);
            mark_failed(c, "nvidia-smi: %s", what);
        }
    }

    if (nv_kind(v[NV_NAME]) == NV_PLAIN)
        card_set_name(c, v[NV_NAME].p, v[NV_NAME].n);
    else
        copy_text(c->name, sizeof c->name, v[NV_NAME].p, v[NV_NAME].n);

    switch (nv_kind(v[NV_MEMORY])) {
    case NV_PLAIN: {
        /* "81559", or "81559 MiB" if someone dropped nounits. */
        struct span m = v[NV_MEMORY];
        size_t d = 0;

        while (d < m.n && m.p[d] >= '0' && m.p[d] <= '9')
            d++;
        if (parse_u64((struct span){ m.p, d }, &num) != 0 ||
            !(d == m.n || span_eq(span_trim((struct span){ m.p + d, m.n - d }), "MiB"))) {
            set_err(err, errlen, NV_MSG " line %d: memory.total is not a number of MiB", lineno);
            return -1;
        }
        if (to_gb(num, UINT64_C(1) << 20, &gb) != 0) {
            set_err(err, errlen, NV_MSG " line %d: memory.total is implausibly large", lineno);
            return -1;
        }
        c->memory_gb = gb;
        if (gb == 0)
            mark_failed(c, "nvidia-smi reports no memory");
        break;
    }
    case NV_ABSENT:
        mark_failed(c, "nvidia-smi reports no memory size");
        break;
    case NV_FAILED:
        break;
    }

    if (nv_kind(v[NV_DRIVER]) == NV_PLAIN && f->driver_version[0] == '\0')
        copy_text(f->driver_version, sizeof f->driver_version, v[NV_DRIVER].p, v[NV_DRIVER].n);
    /* GeForce boards have no serial; the UUID still tells cards apart. */
    if (nv_kind(v[NV_SERIAL]) == NV_PLAIN)
        copy_text(c->serial, sizeof c->serial, v[NV_SERIAL].p, v[NV_SERIAL].n);
    else if (nv_kind(v[NV_UUID]) == NV_PLAIN)
        copy_text(c->serial, sizeof c->serial, v[NV_UUID].p, v[NV_UUID].n);
    if (nv_kind(v[NV_BUS]) == NV_PLAIN)
        copy_text(c->bus_id, sizeof c->bus_id, v[NV_BUS].p, v[NV_BUS].n);

    if (nv_kind(v[NV_ECC]) == NV_PLAIN) {
        if (parse_u64(v[NV_ECC], &num) != 0) {
            set_err(err, errlen, NV_MSG " line %d: %s is not a number", lineno,
                    nv_field_names[NV_ECC]);
            return -1;
        }
        /* Uncorrected errors since the driver loaded: the card needs a reset
         * before anyone can trust its memory again. */
        if (num > 0)
            mark_failed(c, "%llu uncorrected ECC errors", (unsigned long long)num);
    }
    if (nv_kind(v[NV_RETIRED]) == NV_PLAIN) {
        if (span_eq(v[NV_RETIRED], "Yes")) {
            mark_failed(c, "memory pages pending retirement");
        } else if (!span_eq(v[NV_RETIRED], "No")) {
            set_err(err, errlen, NV_MSG " line %d: %s is neither Yes nor No", lineno,
                    nv_field_names[NV_RETIRED]);
            return -1;
        }
    }
    return 0;
}

/* Copies a version as a tool printed it ("12.4", "550.90.07", "6.0.2")
 * into dst; 0, or -1 (dst untouched) for "N/A", an empty value or one that
 * does not start with a digit. */
static int copy_version(char *dst, size_t cap, struct span v)
{
    v = span_trim(v);
    if (v.n == 0 || v.p[0] < '0' || v.p[0] > '9')
        return -1;
    copy_text(dst, cap, v.p, v.n);
    return 0;
}

/* One line of `nvidia-smi -q`: only the header's "Driver Version : X" and
 * "CUDA Version : Y" matter; per-GPU sections and anything else are skipped,
 * since -q's layout changes between driver releases. */
static void nv_query_line(struct span line, struct gpu_facts *f)
{
    const char *colon = memchr(line.p, ':', line.n);
    struct span key, value;

    if (colon == NULL)
        return;
    key = span_trim((struct span){ line.p, (size_t)(colon - line.p) });
    value = (struct span){ colon + 1, line.n - (size_t)(colon - line.p) - 1 };
    if (span_eq(key, "CUDA Version"))
        copy_version(f->stack_version, sizeof f->stack_version, value);
    else if (span_eq(key, "Driver Version") && f->driver_version[0] == '\0')
        copy_version(f->driver_version, sizeof f->driver_version, value);
}

int discovery_parse_nvidia_smi_csv(const char *text, size_t len, struct gpu_facts *out,
                                   char *err, size_t errlen)
{
    size_t pos = 0;
    int lineno = 0, query = 0;

    facts_reset(out, "NVIDIA", "CUDA");
    if (text == NULL || len == 0) {
        set_err(err, errlen, NV_MSG ": empty");
        goto fail;
    }
    if (len > DISCOVERY_MAX_OUTPUT) {
        set_err(err, errlen, NV_MSG ": larger than %u bytes", DISCOVERY_MAX_OUTPUT);
        goto fail;
    }
    if (memchr(text, '\0', len) != NULL) {
        set_err(err, errlen, NV_MSG ": contains NUL bytes, not text");
        goto fail;
    }
    while (pos < len) {
        struct span line = { text + pos, 0 };

        while (pos < len && text[pos] != '\n') {
            pos++;
            line.n++;
        }
        pos++; /* the newline */
        lineno++;
        line = span_trim(line);
        if (line.n == 0)
            continue;
        /* `nvidia-smi -q` output follows the CSV rows (discovery_run runs
         * it second); from its banner on, lines are read as -q output. */
        if (!query && line.p[0] == '=' && memmem(line.p, line.n, "NVSMI LOG", 9) != NULL) {
            query = 1;
            continue;
        }
        if (query) {
            nv_query_line(line, out);
            continue;
        }
        if (line.n >= strlen(LOST_PREFIX) &&
            strncmp(line.p, LOST_PREFIX, strlen(LOST_PREFIX)) == 0) {
            if (nv_lost_card(line, out, lineno, err, errlen) != 0)
                goto fail;
        } else if (nv_row(line, out, lineno, err, errlen) != 0) {
            goto fail;
        }
    }
    if (out->n_cards == 0) {
        set_err(err, errlen, NV_MSG ": no GPU rows");
        goto fail;
    }
    facts_sort(out);
    return 0;
fail:
    memset(out, 0, sizeof *out);
    return -1;
}

/* ---- the ROCm version file ------------------------------------------------- */

int discovery_parse_rocm_version(const char *text, size_t len, char *out, size_t cap)
{
    struct span v = { text, 0 };
    size_t n = 0;

    if (cap > 0)
        out[0] = '\0';
    if (text == NULL || cap == 0)
        return -1;
    /* "6.0.2-115": the release, then the build number, which amd-smi leaves
     * out of its rocm_version, so it is left out here too. */
    while (v.n < len && isspace((unsigned char)text[v.n]) && text[v.n] != '\n')
        v.n++;
    v.p += v.n;
    v.n = 0;
    while (v.p + v.n < text + len && ((v.p[v.n] >= '0' && v.p[v.n] <= '9') || v.p[v.n] == '.'))
        v.n++;
    for (size_t i = 0; i < v.n; i++)
        n += v.p[i] >= '0' && v.p[i] <= '9';
    if (n == 0 || v.p[0] == '.' || v.n >= cap)
        return -1;
    copy_text(out, cap, v.p, v.n);
    return 0;
}

/* The ROCm version from $ROCM_PATH/.info/version (ROCm's install prefix,
 * /opt/rocm by default), for tools that do not print it. Best effort: ""
 * stays when the file is missing or odd. */
static void read_rocm_version(struct gpu_facts *f)
{
    const char *root = getenv("ROCM_PATH");
    char path[PATH_MAX], buf[256];
    struct stat st;
    ssize_t got;
    int fd;

    if (root == NULL || root[0] != '/')
        root = "/opt/rocm";
    if (snprintf(path, sizeof path, "%s/.info/version", root) >= (int)sizeof path)
        return;
    /* O_NONBLOCK: a FIFO planted there must not hang discovery. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        do
            got = read(fd, buf, sizeof buf);
        while (got < 0 && errno == EINTR);
        if (got > 0 &&
            discovery_parse_rocm_version(buf, (size_t)got, f->stack_version,
                                         sizeof f->stack_version) != 0)
            log_warn("discovery: %s does not start with a version; no ROCm version reported", path);
    }
    close(fd);
}

/* ---- running the tools --------------------------------------------------- */

typedef int (*parser_fn)(const char *, size_t, struct gpu_facts *, char *, size_t);

/* Stdout of one or more commands, appended. */
struct capture {
    char *buf;   /* owned; freed by discovery_run */
    size_t len;  /* bytes captured */
    size_t cap;  /* bytes allocated */
};

static int timespec_ms_left(const struct timespec *deadline)
{
    struct timespec now;
    long long ms;

    clock_gettime(CLOCK_MONOTONIC, &now);
    ms = (long long)(deadline->tv_sec - now.tv_sec) * 1000 +
         (deadline->tv_nsec - now.tv_nsec) / 1000000;
    if (ms <= 0)
        return 0;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* Finds argv[0] the way a shell would, adding /opt/rocm/bin, where ROCm
 * installs amd-smi and rocm-smi without putting them in PATH. */
static int find_program(const char *name, char *path, size_t cap)
{
    const char *dirs = getenv("PATH");
    char list[4096];
    char *save = NULL;

    if (name[0] == '\0')
        return -1;
    if (strchr(name, '/') != NULL) {
        snprintf(path, cap, "%s", name);
        return access(path, X_OK);
    }
    snprintf(list, sizeof list, "%s:/opt/rocm/bin",
             dirs && dirs[0] ? dirs : "/usr/local/bin:/usr/bin:/bin");
    for (char *d = strtok_r(list, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        struct stat st;
        int n = snprintf(path, cap, "%s/%s", d, name);

        if (n < 0 || (size_t)n >= cap)
            continue;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0)
            return 0;
    }
    return -1;
}

static void kill_and_reap(pid_t pid)
{
    /* The child leads its own process group, so this also stops whatever it
     * started (a shell wrapper's sleep, amd-smi's Python helpers). */
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
}

/* First line of what the command said, for the error message. */
static void first_line(const char *s, size_t n, char *dst, size_t cap)
{
    size_t i = 0;

    while (i < n && isspace((unsigned char)s[i]))
        i++;
    s += i;
    n -= i;
    for (i = 0; i < n && s[i] != '\n'; i++)
        ;
    copy_text(dst, cap, s, i);
}

static int spawn_piped(const char *path, char *const argv[], int *out_fd, int *err_fd,
                       pid_t *pid)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    sigset_t none, dflt;
    int outp[2], errp[2], rc;

    if (pipe2(outp, O_CLOEXEC) != 0)
        return errno;
    if (pipe2(errp, O_CLOEXEC) != 0) {
        rc = errno;
        close(outp[0]);
        close(outp[1]);
        return rc;
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, outp[1], 1);
    posix_spawn_file_actions_adddup2(&fa, errp[1], 2);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    /* The agent's sockets and database must not leak into the tool. */
    posix_spawn_file_actions_addclosefrom_np(&fa, 3);
#endif
    posix_spawnattr_init(&attr);
    sigemptyset(&none);
    sigemptyset(&dflt);
    /* The agent ignores SIGPIPE and may block signals in its threads; the
     * tool should start with the ordinary defaults. */
    sigaddset(&dflt, SIGPIPE);
    sigaddset(&dflt, SIGINT);
    sigaddset(&dflt, SIGTERM);
    sigaddset(&dflt, SIGHUP);
    sigaddset(&dflt, SIGQUIT);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &dflt);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                        POSIX_SPAWN_SETSIGDEF);
    rc = posix_spawn(pid, path, &fa, &attr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(outp[1]);
    close(errp[1]);
    if (rc != 0) {
        close(outp[0]);
        close(errp[0]);
        return rc;
    }
    *out_fd = outp[0];
    *err_fd = errp[0];
    return 0;
}

/* Runs argv until it exits or the deadline passes, appending its stdout to
 * cap. Returns 0 when it exited with status 0. */
static int run_one(char *const argv[], const struct timespec *deadline, struct capture *cap,
                   char *err, size_t errlen)
{
    char path[PATH_MAX], prog[64], said[128];
    char errbuf[512];
    size_t errlen_got = 0, start = cap->len;
    int fds[2] = { -1, -1 }, rc, status;
    pid_t pid;

    copy_str(prog, sizeof prog, argv[0]);
    if (find_program(argv[0], path, sizeof path) != 0) {
        set_err(err, errlen, "%s: not found in PATH or /opt/rocm/bin", prog);
        return -1;
    }
    if ((rc = spawn_piped(path, argv, &fds[0], &fds[1], &pid)) != 0) {
        set_err(err, errlen, "%s: cannot start: %s", prog, strerror(rc));
        return -1;
    }
    while (fds[0] >= 0 || fds[1] >= 0) {
        struct pollfd p[2];
        nfds_t np = 0;
        int left = timespec_ms_left(deadline), n;

        if (left == 0) {
            set_err(err, errlen, "%s: no answer in time, killed", prog);
            goto kill;
        }
        for (int i = 0; i < 2; i++) {
            if (fds[i] >= 0)
                p[np++] = (struct pollfd){ .fd = fds[i], .events = POLLIN };
        }
        n = poll(p, np, left);
        if (n < 0 && errno != EINTR) {
            set_err(err, errlen, "%s: poll: %s", prog, strerror(errno));
            goto kill;
        }
        for (nfds_t i = 0; n > 0 && i < np; i++) {
            int which = p[i].fd == fds[0] ? 0 : 1;
            char chunk[8192];
            ssize_t got;

            if (p[i].revents == 0)
                continue;
            got = read(p[i].fd, chunk, sizeof chunk);
            if (got < 0 && (errno == EINTR || errno == EAGAIN))
                continue;
            if (got <= 0) {
                close(fds[which]);
                fds[which] = -1;
                continue;
            }
            if (which == 1) {
                /* Keep the start of stderr for the message; drain the rest. */
                size_t take = sizeof errbuf - errlen_got;

                if ((size_t)got < take)
                    take = (size_t)got;
                memcpy(errbuf + errlen_got, chunk, take);
                errlen_got += take;
                continue;
            }
            if (cap->len + (size_t)got > DISCOVERY_MAX_OUTPUT) {
                set_err(err, errlen, "%s: more than %u bytes of output, killed", prog,
                        DISCOVERY_MAX_OUTPUT);
                goto kill;
            }
            if (cap->len + (size_t)got > cap->cap) {
                size_t want = cap->cap ? cap->cap : 65536;
                char *nb;

                while (want < cap->len + (size_t)got)
                    want *= 2;
                if ((nb = realloc(cap->buf, want)) == NULL) {
                    set_err(err, errlen, "%s: out of memory", prog);
                    goto kill;
                }
                cap->buf = nb;
                cap->cap = want;
            }
            memcpy(cap->buf + cap->len, chunk, (size_t)got);
            cap->len += (size_t)got;
        }
    }
    /* Both pipes are closed; the tool is exiting or already gone. */
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);

        if (w == pid)
            break;
        if (w < 0 && errno != EINTR) {
            set_err(err, errlen, "%s: waitpid: %s", prog, strerror(errno));
            return -1;
        }
        if (timespec_ms_left(deadline) == 0) {
            set_err(err, errlen, "%s: did not exit in time, killed", prog);
            kill_and_reap(pid);
            return -1;
        }
        nanosleep(&(struct timespec){ .tv_nsec = 5 * 1000 * 1000 }, NULL);
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    if (errlen_got > 0)
        first_line(errbuf, errlen_got, said, sizeof said);
    else
        first_line(cap->buf ? cap->buf + start : "", cap->len - start, said, sizeof said);
    if (WIFEXITED(status))
        set_err(err, errlen, "%s exited with status %d%s%s", prog, WEXITSTATUS(status),
                said[0] ? ": " : "", said);
    else
        set_err(err, errlen, "%s killed by signal %d", prog,
                WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    cap->len = start; /* a failed command's output is not parsed */
    return -1;
kill:
    kill_and_reap(pid);
    cap->len = start;
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    return -1;
}

/* The commands discovery_run uses when the caller gives none; words are
 * split on spaces into a private buffer so no string literal is ever passed
 * as a mutable argv. */
struct default_cmd {
    const char *words; /* argv, separated by single spaces */
    int optional;      /* failure is logged and discovery goes on */
};

static const struct default_cmd amd_cmds[] = {
    { "amd-smi version --json", 1 },
    { "amd-smi static --asic --bus --vram --driver --board --ras --json", 0 },
    { "amd-smi metric --ecc --json", 1 },
    { NULL, 0 },
};
static const struct default_cmd rocm_cmds[] = {
    { "rocm-smi --showproductname --showmeminfo vram --showdriverversion --showserial "
      "--showbus --json", 0 },
    { NULL, 0 },
};
static const struct default_cmd nvidia_cmds[] = {
    { "nvidia-smi --query-gpu=" DISCOVERY_NVIDIA_SMI_FIELDS " --format=csv,noheader,nounits", 0 },
    /* No --query-gpu field gives the CUDA version; -q's header does. */
    { "nvidia-smi -q -d COMPUTE", 1 },
    { NULL, 0 },
};

#define MAX_ARGS 16

static void split_words(const char *words, char *store, size_t cap, char *av[MAX_ARGS])
{
    size_t n = 0;
    char *save = NULL;

    snprintf(store, cap, "%s", words);
    for (char *w = strtok_r(store, " ", &save); w && n + 1 < MAX_ARGS;
         w = strtok_r(NULL, " ", &save))
        av[n++] = w;
    av[n] = NULL;
}

int discovery_run(const char *tool, char *const argv[], int timeout_s, struct gpu_facts *out,
                  char *err, size_t errlen)
{
    const struct default_cmd *cmds;
    struct capture cap = { NULL, 0, 0 };
    struct timespec deadline;
    parser_fn parse;
    int rc = -1;

    memset(out, 0, sizeof *out);
    if (tool == NULL) {
        set_err(err, errlen, "discovery: no tool named");
        return -1;
    }
    if (strcmp(tool, "amd-smi") == 0) {
        parse = discovery_parse_amd_smi;
        cmds = amd_cmds;
    } else if (strcmp(tool, "rocm-smi") == 0) {
        parse = discovery_parse_rocm_smi;
        cmds = rocm_cmds;
    } else if (strcmp(tool, "nvidia-smi") == 0) {
        parse = discovery_parse_nvidia_smi_csv;
        cmds = nvidia_cmds;
    } else {
        char shown[32];

        copy_str(shown, sizeof shown, tool);
        set_err(err, errlen, "discovery: unknown tool \"%s\"", shown);
        return -1;
    }
    if (timeout_s <= 0 || timeout_s > 3600) {
        set_err(err, errlen, "discovery: timeout must be 1 to 3600 seconds");
        return -1;
    }
    if (argv != NULL && (argv[0] == NULL || argv[0][0] == '\0')) {
        set_err(err, errlen, "discovery: empty command");
        return -1;
    }
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeout_s;

    if (argv != NULL) {
        if (run_one(argv, &deadline, &cap, err, errlen) != 0)
            goto done;
    } else {
        for (const struct default_cmd *c = cmds; c->words != NULL; c++) {
            char store[512], *av[MAX_ARGS];
            char why[256];

            split_words(c->words, store, sizeof store, av);
            if (run_one(av, &deadline, &cap, why, sizeof why) == 0)
                continue;
            if (!c->optional) {
                set_err(err, errlen, "%s", why);
                goto done;
            }
            log_warn("discovery: skipping `%s`: %s", c->words, why);
        }
    }
    rc = parse(cap.buf ? cap.buf : "", cap.len, out, err, errlen);
    /* rocm-smi never prints the ROCm version, and amd-smi's version command
     * is optional. */
    if (rc == 0 && strcmp(out->stack, "ROCm") == 0 && out->stack_version[0] == '\0')
        read_rocm_version(out);
done:
    free(cap.buf);
    return rc;
}
