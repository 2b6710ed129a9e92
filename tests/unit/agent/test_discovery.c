/* test_discovery.c: the GPU discovery parsers on recorded amd-smi, rocm-smi
 * and nvidia-smi output (tests/data/discovery/), the driver and ROCm/CUDA
 * versions they record, hostile input, the catalog models (names to codes,
 * codes to defaults), and discovery_run against small stand-in scripts.
 * Run from the repository root. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "discovery/discovery.h"

#define DATA "tests/data/discovery/"

typedef int (*parser_fn)(const char *, size_t, struct gpu_facts *, char *, size_t);

/* Exactly len bytes and no terminating NUL, so AddressSanitizer catches a
 * parser that reads past the end. */
static char *load(const char *name, size_t *len)
{
    char path[256];
    FILE *f;
    char *buf;
    long n;

    snprintf(path, sizeof path, DATA "%s", name);
    f = fopen(path, "rb");
    if (f == NULL)
        fail_msg("cannot open %s: %s (run from the repository root)", path, strerror(errno));
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    buf = malloc(n > 0 ? (size_t)n : 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Copies a C string into an exact-size heap buffer (no NUL) for the same
 * reason as load(). */
static char *exact(const char *s, size_t *len)
{
    char *buf;

    *len = strlen(s);
    buf = malloc(*len ? *len : 1);
    assert_non_null(buf);
    memcpy(buf, s, *len);
    return buf;
}

static void assert_contains(const char *hay, const char *needle)
{
    if (strstr(hay, needle) == NULL)
        fail_msg("\"%s\" does not contain \"%s\"", hay, needle);
}

/* Two recordings one after the other, as discovery_run concatenates the
 * stdout of its commands; exact size, like load(). */
static char *load_two(const char *first, const char *second, size_t *len)
{
    size_t n1, n2;
    char *a = load(first, &n1), *b = load(second, &n2);
    char *buf = malloc(n1 + n2 ? n1 + n2 : 1);

    assert_non_null(buf);
    memcpy(buf, a, n1);
    memcpy(buf + n1, b, n2);
    free(a);
    free(b);
    *len = n1 + n2;
    return buf;
}

static struct gpu_facts *parse_file_ok(parser_fn parse, const char *name)
{
    struct gpu_facts *f = calloc(1, sizeof *f);
    char err[256] = "";
    size_t len;
    char *text = load(name, &len);

    assert_non_null(f);
    if (parse(text, len, f, err, sizeof err) != 0)
        fail_msg("%s: %s", name, err);
    free(text);
    return f;
}

/* Parses and expects failure with a message containing want; checks the
 * output was zeroed so a half-filled struct can't be used by accident. */
static void expect_fail_text(parser_fn parse, const char *text, size_t len, const char *want)
{
    struct gpu_facts *f = calloc(1, sizeof *f);
    char err[256] = "";

    assert_non_null(f);
    assert_int_equal(parse(text, len, f, err, sizeof err), -1);
    assert_true(err[0] != '\0');
    assert_null(strchr(err, '\n'));
    if (want != NULL)
        assert_contains(err, want);
    assert_int_equal(f->n_cards, 0);
    assert_string_equal(f->vendor, "");
    free(f);
}

static void expect_fail_file(parser_fn parse, const char *name, const char *want)
{
    size_t len;
    char *text = load(name, &len);

    expect_fail_text(parse, text, len, want);
    free(text);
}

static void expect_fail_str(parser_fn parse, const char *s, const char *want)
{
    size_t len;
    char *text = exact(s, &len);

    expect_fail_text(parse, text, len, want);
    free(text);
}

static struct gpu_facts *parse_str_ok(parser_fn parse, const char *s)
{
    struct gpu_facts *f = calloc(1, sizeof *f);
    char err[256] = "";
    size_t len;
    char *text = exact(s, &len);

    assert_non_null(f);
    if (parse(text, len, f, err, sizeof err) != 0)
        fail_msg("%s", err);
    free(text);
    return f;
}

static void assert_all_cards(const struct gpu_facts *f, size_t n, const char *model, int gb)
{
    assert_int_equal(f->n_cards, n);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(f->cards[i].index, (int)i);
        assert_string_equal(f->cards[i].model, model);
        assert_int_equal(f->cards[i].memory_gb, gb);
    }
}

static size_t count_healthy(const struct gpu_facts *f)
{
    size_t n = 0;

    for (size_t i = 0; i < f->n_cards; i++)
        n += f->cards[i].healthy == 1;
    return n;
}

/* ---- model codes --------------------------------------------------------- */

static void test_model_codes(void **state)
{
    static const struct {
        const char *name, *code;
    } cases[] = {
        { "AMD Instinct MI300X", "MI300X" },
        { "AMD Instinct MI300X VF", "MI300X" },
        { "AMD Instinct MI450", "MI450" },
        { "AMD Instinct MI450X", "MI450" },
        { "AMD Instinct MI250X/MI250", "MI250" },
        { "AMD Instinct MI250X / MI250", "MI250" },
        { "Aldebaran/MI200 [Instinct MI250X/MI250]", "MI250" },
        { "AMD INSTINCT MI250 (MCM) OAM AC MBA", "MI250" },
        { "AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2", "MI250" },
        { "NVIDIA H100 80GB HBM3", "H100-SXM" },
        { "NVIDIA H100 SXM5 80GB", "H100-SXM" },
        { "NVIDIA GeForce RTX 4090", "RTX4090" },
        { "nvidia geforce rtx 4090", "RTX4090" },
        { "NVIDIA H100 PCIe", NULL },
        { "NVIDIA H100 NVL", NULL },
        { "NVIDIA GeForce RTX 4090 D", NULL },
        { "NVIDIA GeForce RTX 4090 Laptop GPU", NULL },
        { "NVIDIA GeForce RTX 4080", NULL },
        { "AMD Instinct MI300A", NULL },
        { "AMD Instinct MI325X", NULL },
        { "AMD Instinct MI210", NULL },
        { "AMD Instinct MI300XL", NULL },
        { "0x74a1", NULL },
        { "", NULL },
        { "N/A", NULL },
    };
    char longname[600];

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = discovery_model_code(cases[i].name);

        if (cases[i].code == NULL && got != NULL)
            fail_msg("\"%s\" -> %s, want NULL", cases[i].name, got);
        if (cases[i].code != NULL && (got == NULL || strcmp(got, cases[i].code) != 0))
            fail_msg("\"%s\" -> %s, want %s", cases[i].name, got ? got : "NULL",
                     cases[i].code);
    }
    assert_null(discovery_model_code(NULL));
    /* Many words and very long words must not overflow the tokenizer. */
    memset(longname, 'M', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    assert_null(discovery_model_code(longname));
    for (size_t i = 0; i + 1 < sizeof longname; i++)
        longname[i] = (i % 3 == 2) ? ' ' : 'A';
    assert_null(discovery_model_code(longname));
}

/* Every model the agent knows has defaults whose name maps back to it. */
static void test_model_defaults(void **state)
{
    static const char *const codes[] = { "MI450", "MI300X", "MI250", "H100-SXM", "RTX4090" };
    const char *vendor, *stack, *name;
    int mem;

    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        assert_int_equal(discovery_model_defaults(codes[i], &mem, &vendor, &stack, &name), 0);
        assert_true(mem > 0);
        assert_string_equal(stack, strcmp(vendor, "AMD") == 0 ? "ROCm" : "CUDA");
        assert_string_equal(discovery_model_code(name), codes[i]);
    }
    assert_int_equal(discovery_model_defaults("MI325X", &mem, &vendor, &stack, &name), -1);
}

/* ---- amd-smi ------------------------------------------------------------- */

static void test_amd_mi300x_x8(void **state)
{
    struct gpu_facts *f = parse_file_ok(discovery_parse_amd_smi, "amd-smi-mi300x-x8.txt");

    assert_string_equal(f->vendor, "AMD");
    assert_string_equal(f->stack, "ROCm");
    assert_string_equal(f->driver_version, "6.8.5");
    assert_string_equal(f->stack_version, "6.2.4");
    assert_all_cards(f, 8, "MI300X", 192);
    assert_int_equal(count_healthy(f), 8);
    assert_string_equal(f->cards[0].name, "AMD Instinct MI300X");
    assert_string_equal(f->cards[0].bus_id, "0000:05:00.0");
    assert_string_equal(f->cards[7].bus_id, "0000:e5:00.0");
    /* The board serial wins over the ASIC serial. */
    assert_string_equal(f->cards[0].serial, "692328000101");
    assert_string_equal(f->cards[0].health_reason, "");
    free(f);
}

static void test_amd_mi450_x8(void **state)
{
    struct gpu_facts *f = parse_file_ok(discovery_parse_amd_smi, "amd-smi-mi450-x8.txt");

    assert_string_equal(f->driver_version, "6.16.6");
    assert_string_equal(f->stack_version, "7.2.0");
    assert_all_cards(f, 8, "MI450", 192);
    assert_int_equal(count_healthy(f), 8);
    assert_string_equal(f->cards[3].name, "AMD Instinct MI450");
    assert_string_equal(f->cards[3].bus_id, "0000:65:00.0");
    free(f);
}

static void test_amd_ecc_failed_card(void **state)
{
    struct gpu_facts *f =
        parse_file_ok(discovery_parse_amd_smi, "amd-smi-mi300x-x8-ecc-failed.txt");

    assert_all_cards(f, 8, "MI300X", 192);
    assert_int_equal(count_healthy(f), 7);
    assert_int_equal(f->cards[5].healthy, 0);
    assert_string_equal(f->cards[5].health_reason, "2 uncorrectable ECC errors");
    free(f);
}

static void test_amd_static_only_old_format(void **state)
{
    struct gpu_facts *f =
        parse_file_ok(discovery_parse_amd_smi, "amd-smi-mi300x-x2-static-only.txt");

    assert_all_cards(f, 2, "MI300X", 192);
    assert_int_equal(count_healthy(f), 2);
    assert_string_equal(f->driver_version, "6.7.0");
    assert_string_equal(f->stack_version, "");
    free(f);
}

static void test_amd_malformed_recordings(void **state)
{
    expect_fail_file(discovery_parse_amd_smi, "amd-smi-no-vram.json", "card 3 has no vram size");
    expect_fail_file(discovery_parse_amd_smi, "amd-smi-truncated.json", "invalid JSON");
    expect_fail_file(discovery_parse_amd_smi, "amd-smi-wrong-types.json",
                     "\"gpu\" is not a GPU index");
    expect_fail_file(discovery_parse_amd_smi, "amd-smi-wrong-vram-type.json",
                     "card 1: vram size has the wrong type");
    expect_fail_file(discovery_parse_amd_smi, "empty.txt", "empty");
    expect_fail_file(discovery_parse_amd_smi, "garbage.bin", NULL);
    /* The other tools' output is not amd-smi output. */
    expect_fail_file(discovery_parse_amd_smi, "nvidia-smi-h100-x8.csv", NULL);
    expect_fail_file(discovery_parse_amd_smi, "rocm-smi-mi250-x8.json", NULL);
}

#define CARD(idx, name, size)                                                          \
    "{\"gpu\": " idx ", \"asic\": {\"market_name\": \"" name "\"}, \"vram\": {\"size\": " \
    size "}}"
#define MB(n) "{\"value\": " n ", \"unit\": \"MB\"}"

static void test_amd_inline(void **state)
{
    struct gpu_facts *f;
    char *big;
    size_t off = 0;

    /* Mixed models are the control plane's business, not an error. */
    f = parse_str_ok(discovery_parse_amd_smi,
                     "[" CARD("1", "AMD Instinct MI250X/MI250", MB("65520")) ", "
                     CARD("0", "AMD Instinct MI300X", MB("196592")) "]");
    assert_int_equal(f->n_cards, 2);
    assert_int_equal(f->cards[0].index, 0); /* sorted */
    assert_string_equal(f->cards[0].model, "MI300X");
    assert_string_equal(f->cards[1].model, "MI250");
    assert_int_equal(f->cards[1].memory_gb, 64);
    free(f);

    /* Units: bytes, GB, numeric strings. */
    f = parse_str_ok(discovery_parse_amd_smi,
                     "[" CARD("0", "x", "{\"value\": 206141652992, \"unit\": \"B\"}") ","
                     CARD("1", "x", "{\"value\": \"192\", \"unit\": \"GB\"}") ","
                     CARD("2", "x", "\"24560 MB\"") "," CARD("3", "x", "24560") "]");
    assert_int_equal(f->cards[0].memory_gb, 192);
    assert_int_equal(f->cards[1].memory_gb, 192);
    assert_int_equal(f->cards[2].memory_gb, 24);
    assert_int_equal(f->cards[3].memory_gb, 24);
    assert_string_equal(f->cards[0].model, "");
    free(f);

    /* Failed cards: N/A where a value must be, RAS threshold, whole section N/A. */
    f = parse_str_ok(discovery_parse_amd_smi,
                     "[" CARD("0", "N/A", MB("196592")) ","
                     CARD("1", "AMD Instinct MI300X", "{\"value\": \"N/A\", \"unit\": \"MB\"}") ","
                     "{\"gpu\": 2, \"asic\": {\"market_name\": \"AMD Instinct MI300X\"},"
                     " \"vram\": {\"size\": " MB("196592") "},"
                     " \"ras\": {\"bad_page_threshold_exceeded\": \"True\"}},"
                     "{\"gpu\": 3, \"asic\": \"N/A\", \"vram\": \"N/A\"},"
                     CARD("4", "AMD Instinct MI300X", MB("0")) "]");
    assert_int_equal(f->n_cards, 5);
    assert_int_equal(count_healthy(f), 0);
    assert_contains(f->cards[0].health_reason, "model name");
    assert_contains(f->cards[1].health_reason, "VRAM size");
    assert_contains(f->cards[2].health_reason, "bad page threshold");
    assert_contains(f->cards[3].health_reason, "model name");
    assert_contains(f->cards[3].health_reason, "; ");
    assert_contains(f->cards[4].health_reason, "no VRAM");
    free(f);

    /* A hostile name is cut to size and made printable. */
    f = parse_str_ok(discovery_parse_amd_smi,
                     "[" CARD("0", "AMD Instinct MI300X \\u0001\\n\\u00e9 "
                                   "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
                                   "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
                                   "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
                                   "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
                              MB("196592")) "]");
    assert_int_equal(strlen(f->cards[0].name), sizeof f->cards[0].name - 1);
    assert_string_equal(f->cards[0].model, "MI300X");
    for (const char *p = f->cards[0].name; *p; p++)
        assert_true(*p >= 0x20 && *p < 0x7f);
    free(f);

    /* Metrics for a card static did not list. */
    expect_fail_str(discovery_parse_amd_smi,
                    "[" CARD("0", "AMD Instinct MI300X", MB("196592")) "]"
                    "[{\"gpu\": 1, \"ecc\": {\"total_uncorrectable_count\": 0}}]",
                    "card 1 has no static data");
    expect_fail_str(discovery_parse_amd_smi,
                    "[{\"gpu\": 0, \"ecc\": {\"total_uncorrectable_count\": 0}}]",
                    "no static data");
    expect_fail_str(discovery_parse_amd_smi,
                    "[" CARD("0", "x", MB("1")) "][{\"gpu\": 0, \"ecc\": "
                    "{\"total_uncorrectable_count\": \"lots\"}}]",
                    "total_uncorrectable_count is not a number");
    expect_fail_str(discovery_parse_amd_smi,
                    "[" CARD("0", "x", MB("1")) "," CARD("0", "x", MB("1")) "]",
                    "card 0 is listed twice");
    expect_fail_str(discovery_parse_amd_smi,
                    "[" CARD("0", "x", MB("1")) "][" CARD("0", "x", MB("1")) "]",
                    "two static descriptions");
    expect_fail_str(discovery_parse_amd_smi, "[" CARD("-1", "x", MB("1")) "]",
                    "not a GPU index");
    expect_fail_str(discovery_parse_amd_smi, "[" CARD("99999999999999999999", "x", MB("1")) "]",
                    "invalid JSON");
    expect_fail_str(discovery_parse_amd_smi, "[" CARD("1.5", "x", MB("1")) "]",
                    "not a GPU index");
    expect_fail_str(discovery_parse_amd_smi, "[" CARD("0", "x", MB("-5")) "]",
                    "not a number");
    expect_fail_str(discovery_parse_amd_smi,
                    "[" CARD("0", "x", "{\"value\": 9223372036854775807, \"unit\": \"GB\"}") "]",
                    "implausibly large");
    expect_fail_str(discovery_parse_amd_smi,
                    "[" CARD("0", "x", "{\"value\": 5, \"unit\": \"furlongs\"}") "]",
                    "unknown vram unit \"furlongs\"");
    expect_fail_str(discovery_parse_amd_smi, "[" CARD("0", "x", "\"5 parsecs\"") "]",
                    "unknown vram unit");
    expect_fail_str(discovery_parse_amd_smi, "[" CARD("0", "x", "\"MB\"") "]", "not a number");
    expect_fail_str(discovery_parse_amd_smi, "[" CARD("0", "x", "{\"value\": 5}") "]", "no unit");
    expect_fail_str(discovery_parse_amd_smi, "[" CARD("0", "x", "{\"unit\": \"MB\"}") "]",
                    "card 0 has no vram size");
    expect_fail_str(discovery_parse_amd_smi,
                    "[{\"gpu\": 0, \"asic\": {\"market_name\": 7}, \"vram\": {\"size\": 1}}]",
                    "market_name is not a string");
    expect_fail_str(discovery_parse_amd_smi, "[{\"gpu\": 0, \"asic\": {}, \"vram\": {}}]",
                    "no market_name");
    expect_fail_str(discovery_parse_amd_smi, "[{\"gpu\": 0, \"vram\": {\"size\": 1}}]",
                    "card 0 has no asic section");
    expect_fail_str(discovery_parse_amd_smi,
                    "[{\"gpu\": 0, \"asic\": {\"market_name\": \"x\"}, \"vram\": [1]}]",
                    "vram is not an object");
    expect_fail_str(discovery_parse_amd_smi, "{\"gpu_data\": {\"gpu\": 0}}", "not a list");
    expect_fail_str(discovery_parse_amd_smi, "[1, 2]", "entry 0 is not an object");
    expect_fail_str(discovery_parse_amd_smi, "[{\"hello\": 1}]", "no \"gpu\" index");
    expect_fail_str(discovery_parse_amd_smi, "{\"gpu_data\": []}", "no GPUs listed");
    expect_fail_str(discovery_parse_amd_smi, "[]", "no GPUs listed");
    expect_fail_str(discovery_parse_amd_smi, "{\"a\": 1, \"a\": 2}", "invalid JSON");
    expect_fail_str(discovery_parse_amd_smi, "42", "no JSON found");
    expect_fail_str(discovery_parse_amd_smi, "WARNING: no GPUs\n", "no JSON found");
    expect_fail_str(discovery_parse_amd_smi, "[" CARD("0", "x", MB("1")) "] [1", "invalid JSON");
    expect_fail_text(discovery_parse_amd_smi, "", 0, "empty");
    expect_fail_text(discovery_parse_amd_smi, NULL, 0, "empty");
    expect_fail_text(discovery_parse_amd_smi, "[\0]", 3, "invalid JSON");

    /* 65 cards is more than a struct holds. */
    big = malloc(65 * 128 + 16);
    assert_non_null(big);
    big[off++] = '[';
    for (int i = 0; i < 65; i++)
        off += (size_t)sprintf(big + off, "%s{\"gpu\": %d, \"asic\": {\"market_name\": \"x\"}, "
                                          "\"vram\": {\"size\": 1}}", i ? "," : "", i);
    big[off++] = ']';
    expect_fail_text(discovery_parse_amd_smi, big, off, "more than 64 cards");
    free(big);

    /* Deep nesting is refused by jansson, not by the stack. */
    big = malloc(200000);
    assert_non_null(big);
    memset(big, '[', 100000);
    memset(big + 100000, ']', 100000);
    expect_fail_text(discovery_parse_amd_smi, big, 200000, "invalid JSON");
    free(big);
}

/* ---- rocm-smi ------------------------------------------------------------ */

static void test_rocm_mi250_x8(void **state)
{
    struct gpu_facts *f = parse_file_ok(discovery_parse_rocm_smi, "rocm-smi-mi250-x8.json");

    assert_string_equal(f->vendor, "AMD");
    assert_string_equal(f->stack, "ROCm");
    assert_string_equal(f->driver_version, "6.3.6");
    assert_string_equal(f->stack_version, "");
    assert_all_cards(f, 8, "MI250", 64);
    assert_int_equal(count_healthy(f), 8);
    assert_string_equal(f->cards[0].name, "AMD INSTINCT MI250 (MCM) OAM AC MBA");
    assert_string_equal(f->cards[0].bus_id, "0000:29:00.0");
    assert_string_equal(f->cards[4].bus_id, "0000:AD:00.0");
    assert_true(f->cards[0].serial[0] != '\0');
    free(f);
}

/* rocm-smi on a node where one card stopped answering: N/A where its VRAM
 * size and serial should be. */
static void test_rocm_failed_card(void **state)
{
    struct gpu_facts *f = parse_file_ok(discovery_parse_rocm_smi, "rocm-smi-mi250-x8-vram-na.json");

    assert_string_equal(f->driver_version, "6.3.6");
    assert_int_equal(f->n_cards, 8);
    assert_int_equal(count_healthy(f), 7);
    for (size_t i = 0; i < 8; i++) {
        assert_int_equal(f->cards[i].index, (int)i);
        assert_string_equal(f->cards[i].model, "MI250");
        assert_int_equal(f->cards[i].memory_gb, i == 5 ? 0 : 64);
        assert_int_equal(f->cards[i].healthy, i != 5);
    }
    assert_string_equal(f->cards[5].health_reason, "rocm-smi cannot read the VRAM size");
    assert_string_equal(f->cards[5].serial, "");
    assert_string_equal(f->cards[5].bus_id, "0000:B0:00.0");
    free(f);
}

static void test_rocm_version_file(void **state)
{
    char out[48];
    size_t len;
    char *text = load("rocm-info-version.txt", &len);

    assert_int_equal(discovery_parse_rocm_version(text, len, out, sizeof out), 0);
    assert_string_equal(out, "6.0.2");
    free(text);
    assert_int_equal(discovery_parse_rocm_version("7.0.2", 5, out, sizeof out), 0);
    assert_string_equal(out, "7.0.2");
    assert_int_equal(discovery_parse_rocm_version("  6.4.1\n", 8, out, sizeof out), 0);
    assert_string_equal(out, "6.4.1");
    /* Only len bytes are read. */
    assert_int_equal(discovery_parse_rocm_version("6.2.41", 3, out, sizeof out), 0);
    assert_string_equal(out, "6.2");
    assert_int_equal(discovery_parse_rocm_version("", 0, out, sizeof out), -1);
    assert_string_equal(out, "");
    assert_int_equal(discovery_parse_rocm_version("rocm-6.2.0\n", 11, out, sizeof out), -1);
    assert_int_equal(discovery_parse_rocm_version(".5\n", 3, out, sizeof out), -1);
    assert_int_equal(discovery_parse_rocm_version("\n6.2.0\n", 7, out, sizeof out), -1);
    assert_int_equal(discovery_parse_rocm_version("6.2.0", 5, out, 5), -1);
    assert_string_equal(out, "");
    assert_int_equal(discovery_parse_rocm_version("6.2.0", 5, out, 6), 0);
}

static void test_rocm_malformed(void **state)
{
    struct gpu_facts *f;

    expect_fail_file(discovery_parse_rocm_smi, "rocm-smi-truncated.json", "invalid JSON");
    expect_fail_file(discovery_parse_rocm_smi, "rocm-smi-wrong-types.json",
                     "card 1: VRAM Total Memory (B) is not a number");
    expect_fail_file(discovery_parse_rocm_smi, "empty.txt", "empty");
    expect_fail_file(discovery_parse_rocm_smi, "garbage.bin", NULL);
    expect_fail_file(discovery_parse_rocm_smi, "amd-smi-mi300x-x8.txt", NULL);
    expect_fail_file(discovery_parse_rocm_smi, "nvidia-smi-h100-x8.csv", NULL);

    expect_fail_str(discovery_parse_rocm_smi, "{\"cardX\": {}}", "\"cardX\" is not a card name");
    expect_fail_str(discovery_parse_rocm_smi, "{\"card-1\": {}}", "not a card name");
    expect_fail_str(discovery_parse_rocm_smi, "{\"card0\": 5}", "card 0 is not an object");
    expect_fail_str(discovery_parse_rocm_smi, "{\"card0\": {\"VRAM Total Memory (B)\": \"1\"}}",
                    "card 0 has no Card Series");
    expect_fail_str(discovery_parse_rocm_smi, "{\"card0\": {\"Card Series\": \"x\"}}",
                    "card 0 has no vram size");
    expect_fail_str(discovery_parse_rocm_smi,
                    "{\"card0\": {\"Card Series\": [], \"VRAM Total Memory (B)\": \"1\"}}",
                    "Card Series is not a string");
    expect_fail_str(discovery_parse_rocm_smi,
                    "{\"card0\": {\"Card Series\": \"x\", \"VRAM Total Memory (B)\": \"-1\"}}",
                    "is not a number");
    expect_fail_str(discovery_parse_rocm_smi,
                    "{\"card0\": {\"Card Series\": \"x\", \"VRAM Total Memory (B)\": \"1\"},"
                    " \"card00\": {\"Card Series\": \"x\", \"VRAM Total Memory (B)\": \"1\"}}",
                    "card 0 is listed twice");
    expect_fail_str(discovery_parse_rocm_smi, "{\"system\": {\"Driver version\": \"6.3.6\"}}",
                    "no GPUs listed");
    expect_fail_str(discovery_parse_rocm_smi, "[]", "top level is not an object");
    expect_fail_str(discovery_parse_rocm_smi, "{} {}", "more than one JSON document");
    expect_fail_str(discovery_parse_rocm_smi, "WARNING: No JSON data to report\n", "no JSON found");

    /* Older rocm-smi spelled it "Card series"; N/A VRAM marks a failed card. */
    f = parse_str_ok(discovery_parse_rocm_smi,
                     "WARNING: AMD GPU device(s) is/are in a low-power state.\n"
                     "{\"card1\": {\"Card series\": \"Aldebaran/MI200 [Instinct MI250X/MI250]\","
                     " \"VRAM Total Memory (B)\": \"N/A\"},"
                     " \"card0\": {\"Card series\": \"0x740c\","
                     " \"VRAM Total Memory (B)\": 68702699520}}");
    assert_int_equal(f->n_cards, 2);
    assert_int_equal(f->cards[0].index, 0);
    assert_string_equal(f->cards[0].model, "");
    assert_int_equal(f->cards[0].memory_gb, 64);
    assert_int_equal(f->cards[0].healthy, 1);
    assert_string_equal(f->cards[1].model, "MI250");
    assert_int_equal(f->cards[1].healthy, 0);
    assert_contains(f->cards[1].health_reason, "VRAM size");
    free(f);
}

/* ---- nvidia-smi ---------------------------------------------------------- */

static void test_nvidia_h100_x8(void **state)
{
    struct gpu_facts *f =
        parse_file_ok(discovery_parse_nvidia_smi_csv, "nvidia-smi-h100-x8.csv");

    assert_string_equal(f->vendor, "NVIDIA");
    assert_string_equal(f->stack, "CUDA");
    assert_string_equal(f->driver_version, "550.90.07");
    assert_string_equal(f->stack_version, "");
    assert_all_cards(f, 8, "H100-SXM", 80);
    assert_int_equal(count_healthy(f), 8);
    assert_string_equal(f->cards[0].name, "NVIDIA H100 80GB HBM3");
    assert_string_equal(f->cards[0].serial, "1652223015011");
    assert_string_equal(f->cards[3].bus_id, "00000000:5D:00.0");
    free(f);
}

/* The CSV followed by `nvidia-smi -q -d COMPUTE`, as discovery_run
 * gathers them: the CUDA version comes from -q's header. */
static void test_nvidia_h100_x8_versions(void **state)
{
    struct gpu_facts *f = calloc(1, sizeof *f);
    char err[256] = "";
    size_t len;
    char *text = load_two("nvidia-smi-h100-x8.csv", "nvidia-smi-h100-x8-q-compute.txt", &len);

    assert_non_null(f);
    if (discovery_parse_nvidia_smi_csv(text, len, f, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_string_equal(f->driver_version, "550.90.07");
    assert_string_equal(f->stack_version, "12.4");
    assert_all_cards(f, 8, "H100-SXM", 80);
    assert_int_equal(count_healthy(f), 8);
    free(text);
    free(f);

    /* The driver from -q when the rows had none; N/A and non-versions are
     * not versions; after the banner no line is taken for a card. */
    f = parse_str_ok(discovery_parse_nvidia_smi_csv,
                     "0, NVIDIA H100 80GB HBM3, 81559, [N/A], 1, GPU-a, 00000000:18:00.0, 0, No\n"
                     "==============NVSMI LOG==============\n"
                     "Driver Version                            : 560.35.03\n"
                     "CUDA Version                              : N/A\n"
                     "1, NVIDIA H100 80GB HBM3, 81559, 550.90.07, 2, GPU-b, 00000000:2A:00.0, 0, No\n"
                     "GPU 00000000:18:00.0\n"
                     "    Compute Mode                          : Default");
    assert_int_equal(f->n_cards, 1);
    assert_string_equal(f->driver_version, "560.35.03");
    assert_string_equal(f->stack_version, "");
    free(f);
    f = parse_str_ok(discovery_parse_nvidia_smi_csv,
                     "0, NVIDIA H100 80GB HBM3, 81559, 550.90.07, 1, GPU-a, 00000000:18:00.0, 0, No\n"
                     "==============NVSMI LOG==============\n"
                     "Driver Version : 999\n"
                     "CUDA Version:12.8\n");
    assert_string_equal(f->driver_version, "550.90.07");
    assert_string_equal(f->stack_version, "12.8");
    free(f);
    f = parse_str_ok(discovery_parse_nvidia_smi_csv,
                     "0, NVIDIA H100 80GB HBM3, 81559, 550.90.07, 1, GPU-a, 00000000:18:00.0, 0, No\n"
                     "==============NVSMI LOG==============\n"
                     "CUDA Version : \x01\x7f bad\n");
    assert_string_equal(f->stack_version, "");
    free(f);
    expect_fail_file(discovery_parse_nvidia_smi_csv, "nvidia-smi-h100-x8-q-compute.txt", "no GPU rows");
}

static void test_nvidia_rtx4090_x4(void **state)
{
    struct gpu_facts *f =
        parse_file_ok(discovery_parse_nvidia_smi_csv, "nvidia-smi-rtx4090-x4.csv");

    assert_string_equal(f->driver_version, "550.127.05");
    assert_all_cards(f, 4, "RTX4090", 24);
    assert_int_equal(count_healthy(f), 4);
    /* No ECC on GeForce is not a failure; no serial, so the UUID stands in. */
    assert_int_equal(strncmp(f->cards[2].serial, "GPU-", 4), 0);
    free(f);
}

static void test_nvidia_failed_card(void **state)
{
    struct gpu_facts *f =
        parse_file_ok(discovery_parse_nvidia_smi_csv, "nvidia-smi-h100-x8-reset-failed.csv");

    assert_int_equal(f->n_cards, 8);
    assert_int_equal(count_healthy(f), 7);
    assert_int_equal(f->cards[3].healthy, 0);
    assert_int_equal(f->cards[3].memory_gb, 0);
    assert_string_equal(f->cards[3].model, "H100-SXM");
    assert_string_equal(f->cards[3].health_reason, "nvidia-smi: GPU requires reset");
    assert_string_equal(f->cards[3].bus_id, "00000000:5D:00.0");
    free(f);
}

static void test_nvidia_lost_card(void **state)
{
    struct gpu_facts *f =
        parse_file_ok(discovery_parse_nvidia_smi_csv, "nvidia-smi-h100-x8-lost-card.csv");

    assert_int_equal(f->n_cards, 8);
    assert_int_equal(count_healthy(f), 7);
    for (int i = 0; i < 7; i++)
        assert_int_equal(f->cards[i].index, i);
    assert_int_equal(f->cards[7].index, -1);
    assert_int_equal(f->cards[7].healthy, 0);
    assert_string_equal(f->cards[7].bus_id, "0000:9A:00.0");
    assert_string_equal(f->cards[7].health_reason, "nvidia-smi cannot reach it: Unknown Error");
    free(f);
}

static void test_nvidia_inline(void **state)
{
    struct gpu_facts *f;
    char *big;
    size_t off = 0;

    f = parse_str_ok(discovery_parse_nvidia_smi_csv,
                     "0, NVIDIA H100 80GB HBM3, 81559, 550.90.07, 1, GPU-a, "
                     "00000000:18:00.0, 3, No\r\n"
                     "\r\n"
                     "1, NVIDIA H100 80GB HBM3, 81559 MiB, 550.90.07, 2, GPU-b, "
                     "00000000:2A:00.0, 0, Yes\n"
                     "2, NVIDIA H100 PCIe, 81559, 550.90.07, [Not Supported], GPU-c, "
                     "00000000:3A:00.0, N/A, [N/A]\n"
                     "3, [Unknown Error], [Unknown Error], 550.90.07, [Unknown Error], "
                     "[Unknown Error], 00000000:5D:00.0, [Unknown Error], [Unknown Error]\n"
                     "4, NVIDIA H100 80GB HBM3, [N/A], 550.90.07, 5, GPU-e, "
                     "00000000:9A:00.0, 0, No");
    assert_int_equal(f->n_cards, 5);
    assert_string_equal(f->cards[0].health_reason, "3 uncorrected ECC errors");
    assert_int_equal(f->cards[1].memory_gb, 80);
    assert_contains(f->cards[1].health_reason, "pending retirement");
    assert_int_equal(f->cards[2].healthy, 1);
    assert_string_equal(f->cards[2].model, "");
    assert_string_equal(f->cards[2].serial, "GPU-c");
    assert_int_equal(f->cards[3].healthy, 0);
    assert_string_equal(f->cards[3].health_reason, "nvidia-smi: Unknown Error");
    assert_string_equal(f->cards[3].model, "");
    assert_contains(f->cards[4].health_reason, "no memory size");
    free(f);

    expect_fail_file(discovery_parse_nvidia_smi_csv, "nvidia-smi-short-row.csv",
                     "line 2: expected 9 fields, got 5");
    expect_fail_file(discovery_parse_nvidia_smi_csv, "nvidia-smi-bad-number.csv",
                     "line 2: memory.total is not a number");
    expect_fail_file(discovery_parse_nvidia_smi_csv, "nvidia-smi-driver-down.txt",
                     "line 1: NVIDIA-SMI has failed");
    expect_fail_file(discovery_parse_nvidia_smi_csv, "empty.txt", "empty");
    expect_fail_file(discovery_parse_nvidia_smi_csv, "garbage.bin", NULL);
    expect_fail_file(discovery_parse_nvidia_smi_csv, "amd-smi-mi300x-x8.txt", NULL);
    expect_fail_str(discovery_parse_nvidia_smi_csv, "No devices were found\n",
                    "No devices were found");
    expect_fail_str(discovery_parse_nvidia_smi_csv, "\n\n  \n", "no GPU rows");
    expect_fail_str(discovery_parse_nvidia_smi_csv, "x, a, 1, d, s, u, b, 0, No", "index");
    expect_fail_str(discovery_parse_nvidia_smi_csv, "-1, a, 1, d, s, u, b, 0, No", "index");
    expect_fail_str(discovery_parse_nvidia_smi_csv,
                    "0, a, 1, d, s, u, b, 0, No\n0, a, 1, d, s, u, b, 0, No",
                    "card 0 is listed twice");
    expect_fail_str(discovery_parse_nvidia_smi_csv, "0, a, 99999999999999999999, d, s, u, b, 0, No",
                    "memory.total is not a number");
    expect_fail_str(discovery_parse_nvidia_smi_csv, "0, a, 18446744073709551615, d, s, u, b, 0, No",
                    "implausibly large");
    expect_fail_str(discovery_parse_nvidia_smi_csv, "0, a, 1, d, s, u, b, many, No",
                    "ecc.errors.uncorrected.volatile.total is not a number");
    expect_fail_str(discovery_parse_nvidia_smi_csv, "0, a, 1, d, s, u, b, 0, Maybe",
                    "neither Yes nor No");
    expect_fail_str(discovery_parse_nvidia_smi_csv, "0, a, 1, d, s, u, b, 0, No, extra",
                    "expected 9 fields, got 10");
    expect_fail_text(discovery_parse_nvidia_smi_csv, "0, a\0, 1", 8, "NUL");

    big = malloc(70 * 64);
    assert_non_null(big);
    for (int i = 0; i < 65; i++)
        off += (size_t)sprintf(big + off, "%d, x, 1024, d, s, u, b, 0, No\n", i);
    expect_fail_text(discovery_parse_nvidia_smi_csv, big, off, "more than 64 cards");
    free(big);
}

/* ---- every prefix and byte flip of every recording ----------------------- */

/* Cutting a recording anywhere, or corrupting any byte, must give either a
 * result or a message, never a crash or an over-read (ASan watches). */
static void mutate_text(parser_fn parse, const char *text, size_t len)
{
    struct gpu_facts *f = malloc(sizeof *f);
    char err[256];
    uint32_t rnd = 2463534242u;

    assert_non_null(f);
    for (size_t cut = 0; cut <= len; cut += 1 + cut / 64) {
        char *piece = malloc(cut ? cut : 1);

        assert_non_null(piece);
        memcpy(piece, text, cut);
        err[0] = '\0';
        if (parse(piece, cut, f, err, sizeof err) != 0)
            assert_true(err[0] != '\0');
        free(piece);
    }
    for (int round = 0; round < 300 && len > 0; round++) {
        char *copy = malloc(len);
        size_t at;

        assert_non_null(copy);
        memcpy(copy, text, len);
        rnd ^= rnd << 13;
        rnd ^= rnd >> 17;
        rnd ^= rnd << 5;
        at = rnd % len;
        copy[at] = (char)(rnd >> 8);
        err[0] = '\0';
        if (parse(copy, len, f, err, sizeof err) != 0)
            assert_true(err[0] != '\0');
        else
            assert_true(f->n_cards >= 1 && f->n_cards <= DISCOVERY_MAX_CARDS);
        free(copy);
    }
    free(f);
}

static void mutate_one(parser_fn parse, const char *name)
{
    size_t len;
    char *text = load(name, &len);

    mutate_text(parse, text, len);
    free(text);
}

static void test_mutations(void **state)
{
    size_t len;
    char *text;

    mutate_one(discovery_parse_amd_smi, "amd-smi-mi300x-x8-ecc-failed.txt");
    mutate_one(discovery_parse_amd_smi, "amd-smi-mi450-x8.txt");
    mutate_one(discovery_parse_amd_smi, "amd-smi-mi300x-x2-static-only.txt");
    mutate_one(discovery_parse_rocm_smi, "rocm-smi-mi250-x8.json");
    mutate_one(discovery_parse_rocm_smi, "rocm-smi-mi250-x8-vram-na.json");
    mutate_one(discovery_parse_nvidia_smi_csv, "nvidia-smi-h100-x8-reset-failed.csv");
    mutate_one(discovery_parse_nvidia_smi_csv, "nvidia-smi-h100-x8-lost-card.csv");
    mutate_one(discovery_parse_nvidia_smi_csv, "nvidia-smi-rtx4090-x4.csv");
    text = load_two("nvidia-smi-h100-x8.csv", "nvidia-smi-h100-x8-q-compute.txt", &len);
    mutate_text(discovery_parse_nvidia_smi_csv, text, len);
    free(text);
}

static void test_tiny_error_buffers(void **state)
{
    struct gpu_facts *f = malloc(sizeof *f);
    char err[4];
    size_t len;
    char *text = load("amd-smi-no-vram.json", &len);

    assert_non_null(f);
    assert_int_equal(discovery_parse_amd_smi(text, len, f, err, sizeof err), -1);
    assert_int_equal(strlen(err), 3);
    assert_int_equal(discovery_parse_amd_smi(text, len, f, NULL, 0), -1);
    free(text);
    free(f);
}

/* ---- discovery_run ------------------------------------------------------- */

static char tmpdir[64];

static void write_script(const char *name, const char *body)
{
    char path[128];
    FILE *f;

    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "#!/bin/sh\n%s\n", body);
    fclose(f);
    assert_int_equal(chmod(path, 0755), 0);
}

static int run_setup(void **state)
{
    char path[128];
    FILE *f;

    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_discovery.XXXXXX");
    if (mkdtemp(tmpdir) == NULL)
        return -1;
    write_script("cat-file", "exec cat \"$1\"");
    write_script("slow", "sleep 30");
    write_script("fail", "echo 'partial output'\necho 'amd-smi: no AMD GPUs found' >&2\nexit 3");
    write_script("flood", "exec yes '[{\"gpu\": 0}]'");
    write_script("silent-exit", "exit 0");
    /* Stand-ins with the real names, for the default commands. */
    /* Prints only the static document (the second) of the MI300X recording,
     * as `amd-smi static ...` would. */
    write_script("amd-smi",
                 "case \"$*\" in\n"
                 "'version --json')\n"
                 "  echo '[{\"tool\": \"AMDSMI Tool\", \"rocm_version\": \"6.2.4\"}]' ;;\n"
                 "'static --asic --bus --vram --driver --board --ras --json')\n"
                 "  exec awk '/^\\[/ { n++ } n == 2 { print } n == 2 && /^]/ { exit }' "
                 "tests/data/discovery/amd-smi-mi300x-x8.txt ;;\n"
                 "'metric --ecc --json') echo 'metric unsupported in this build' >&2; exit 2 ;;\n"
                 "*) echo \"unexpected: $*\" >&2; exit 9 ;;\n"
                 "esac");
    write_script("nvidia-smi",
                 "case \"$*\" in\n"
                 "'--query-gpu=" DISCOVERY_NVIDIA_SMI_FIELDS " --format=csv,noheader,nounits')\n"
                 "  exec cat tests/data/discovery/nvidia-smi-h100-x8.csv ;;\n"
                 "'-q -d COMPUTE') exec cat tests/data/discovery/nvidia-smi-h100-x8-q-compute.txt ;;\n"
                 "*) echo \"bad args: $*\" >&2; exit 9 ;;\n"
                 "esac");
    write_script("rocm-smi",
                 "[ \"$*\" = '--showproductname --showmeminfo vram --showdriverversion "
                 "--showserial --showbus --json' ] || { echo \"bad args: $*\" >&2; exit 9; }\n"
                 "exec cat tests/data/discovery/rocm-smi-mi250-x8.json");
    /* A ROCm install prefix for $ROCM_PATH, with its version file. */
    snprintf(path, sizeof path, "%s/.info", tmpdir);
    if (mkdir(path, 0700) != 0)
        return -1;
    snprintf(path, sizeof path, "%s/.info/version", tmpdir);
    f = fopen(path, "w");
    if (f == NULL)
        return -1;
    fputs("6.0.2-115\n", f);
    fclose(f);
    return 0;
}

static int run_teardown(void **state)
{
    static const char *const names[] = { "cat-file", "slow", "fail", "flood", "silent-exit",
                                         "amd-smi", "nvidia-smi", "rocm-smi" };
    char path[128];

    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", tmpdir, names[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/.info/version", tmpdir);
    unlink(path);
    snprintf(path, sizeof path, "%s/.info", tmpdir);
    rmdir(path);
    rmdir(tmpdir);
    return 0;
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t1;

    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) / 1e9;
}

static void test_run_scripts(void **state)
{
    struct gpu_facts *f = malloc(sizeof *f);
    char err[256], prog[128], arg[128];
    char *av[3] = { prog, arg, NULL };
    struct timespec t0;

    assert_non_null(f);
    snprintf(prog, sizeof prog, "%s/cat-file", tmpdir);
    snprintf(arg, sizeof arg, DATA "nvidia-smi-h100-x8.csv");
    assert_int_equal(discovery_run("nvidia-smi", av, 5, f, err, sizeof err), 0);
    assert_all_cards(f, 8, "H100-SXM", 80);

    snprintf(arg, sizeof arg, DATA "amd-smi-mi450-x8.txt");
    assert_int_equal(discovery_run("amd-smi", av, 5, f, err, sizeof err), 0);
    assert_all_cards(f, 8, "MI450", 192);

    /* The tool ran fine but printed something the parser refuses. */
    snprintf(arg, sizeof arg, DATA "amd-smi-no-vram.json");
    assert_int_equal(discovery_run("amd-smi", av, 5, f, err, sizeof err), -1);
    assert_contains(err, "card 3 has no vram size");

    av[1] = NULL;
    snprintf(prog, sizeof prog, "%s/slow", tmpdir);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(discovery_run("nvidia-smi", av, 1, f, err, sizeof err), -1);
    assert_true(seconds_since(&t0) < 5.0);
    assert_contains(err, "in time");
    assert_int_equal(f->n_cards, 0);

    snprintf(prog, sizeof prog, "%s/fail", tmpdir);
    assert_int_equal(discovery_run("amd-smi", av, 5, f, err, sizeof err), -1);
    assert_contains(err, "exited with status 3: amd-smi: no AMD GPUs found");

    snprintf(prog, sizeof prog, "%s/flood", tmpdir);
    assert_int_equal(discovery_run("amd-smi", av, 10, f, err, sizeof err), -1);
    assert_contains(err, "more than");

    snprintf(prog, sizeof prog, "%s/silent-exit", tmpdir);
    assert_int_equal(discovery_run("rocm-smi", av, 5, f, err, sizeof err), -1);
    assert_contains(err, "rocm-smi output: empty");

    snprintf(prog, sizeof prog, "%s/no-such-tool", tmpdir);
    assert_int_equal(discovery_run("nvidia-smi", av, 5, f, err, sizeof err), -1);
    assert_contains(err, "not found");

    snprintf(prog, sizeof prog, "definitely-not-a-gpu-tool-%d", (int)getpid());
    assert_int_equal(discovery_run("nvidia-smi", av, 5, f, err, sizeof err), -1);
    assert_contains(err, "not found in PATH");

    assert_int_equal(discovery_run("lspci", NULL, 5, f, err, sizeof err), -1);
    assert_contains(err, "unknown tool \"lspci\"");
    assert_int_equal(discovery_run("nvidia-smi", av, 0, f, err, sizeof err), -1);
    assert_contains(err, "timeout");
    free(f);
}

static void test_run_default_commands(void **state)
{
    struct gpu_facts *f = malloc(sizeof *f);
    char err[256], path[4096];
    const char *old = getenv("PATH");
    char *saved = strdup(old ? old : "/usr/bin:/bin");

    assert_non_null(f);
    assert_non_null(saved);
    snprintf(path, sizeof path, "%s:%s", tmpdir, saved);
    assert_int_equal(setenv("PATH", path, 1), 0);

    assert_int_equal(setenv("ROCM_PATH", tmpdir, 1), 0);

    assert_int_equal(discovery_run("nvidia-smi", NULL, 5, f, err, sizeof err), 0);
    assert_all_cards(f, 8, "H100-SXM", 80);
    assert_string_equal(f->driver_version, "550.90.07");
    assert_string_equal(f->stack_version, "12.4");

    assert_int_equal(discovery_run("rocm-smi", NULL, 5, f, err, sizeof err), 0);
    assert_all_cards(f, 8, "MI250", 64);
    assert_string_equal(f->driver_version, "6.3.6");
    assert_string_equal(f->stack_version, "6.0.2"); /* from $ROCM_PATH/.info/version */

    /* version and static succeed, metric fails and is skipped (logged). */
    if (discovery_run("amd-smi", NULL, 5, f, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_string_equal(f->stack_version, "6.2.4"); /* amd-smi's own, not the file's */
    assert_all_cards(f, 8, "MI300X", 192);
    assert_int_equal(count_healthy(f), 8);

    /* amd-smi without its version command: the file fills in; without the
     * file, nothing does. */
    {
        char prog[128], arg[128];
        char *av[3] = { prog, arg, NULL };

        snprintf(prog, sizeof prog, "%s/cat-file", tmpdir);
        snprintf(arg, sizeof arg, DATA "amd-smi-mi300x-x2-static-only.txt");
        assert_int_equal(discovery_run("amd-smi", av, 5, f, err, sizeof err), 0);
        assert_string_equal(f->stack_version, "6.0.2");
        assert_int_equal(setenv("ROCM_PATH", "/nonexistent-rocm", 1), 0);
        assert_int_equal(discovery_run("amd-smi", av, 5, f, err, sizeof err), 0);
        assert_string_equal(f->stack_version, "");
        assert_int_equal(discovery_run("rocm-smi", NULL, 5, f, err, sizeof err), 0);
        assert_string_equal(f->stack_version, "");
    }
    unsetenv("ROCM_PATH");

    assert_int_equal(setenv("PATH", saved, 1), 0);
    free(saved);
    free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_codes),
        cmocka_unit_test(test_model_defaults),
        cmocka_unit_test(test_amd_mi300x_x8),
        cmocka_unit_test(test_amd_mi450_x8),
        cmocka_unit_test(test_amd_ecc_failed_card),
        cmocka_unit_test(test_amd_static_only_old_format),
        cmocka_unit_test(test_amd_malformed_recordings),
        cmocka_unit_test(test_amd_inline),
        cmocka_unit_test(test_rocm_mi250_x8),
        cmocka_unit_test(test_rocm_failed_card),
        cmocka_unit_test(test_rocm_version_file),
        cmocka_unit_test(test_rocm_malformed),
        cmocka_unit_test(test_nvidia_h100_x8),
        cmocka_unit_test(test_nvidia_h100_x8_versions),
        cmocka_unit_test(test_nvidia_rtx4090_x4),
        cmocka_unit_test(test_nvidia_failed_card),
        cmocka_unit_test(test_nvidia_lost_card),
        cmocka_unit_test(test_nvidia_inline),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_tiny_error_buffers),
        cmocka_unit_test_setup_teardown(test_run_scripts, run_setup, run_teardown),
        cmocka_unit_test_setup_teardown(test_run_default_commands, run_setup, run_teardown),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
