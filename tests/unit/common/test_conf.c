/* test_conf.c: unit tests for the configuration table engine (conf.c). A
 * small table of its own exercises each option type, bounds, validators,
 * overrides and files; the daemon's real table is then checked row by row:
 * every default passes its own rules, bad values of each type are refused
 * (with the list validators for CORS origins and trusted proxies), the
 * money limits keep to their caps and to each other, and conf/-style files
 * written to a temporary directory load or fail with FILE:LINE. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpurent/conf.h"
#include "gpurentd.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* The test program's own configuration struct and table. */
struct tconf {
    int64_t count;   /* CONF_INT in -5..100 */
    int64_t even;    /* CONF_INT with a validator: must be even */
    int verbose;     /* CONF_BOOL */
    int checked;     /* CONF_BOOL with a validator: must be false */
    char name[8];    /* CONF_STRING, at most 7 bytes */
    char addr[64];   /* CONF_STRING validated as host:port */
    char note[300];  /* CONF_STRING, long, no validator */
};

static int validate_even(const void *field, char *err, size_t errlen)
{
    int64_t v;
    memcpy(&v, field, sizeof v);
    if (v % 2 != 0) {
        snprintf(err, errlen, "even: %" PRId64 " is odd", v);
        return -1;
    }
    return 0;
}

static int validate_false(const void *field, char *err, size_t errlen)
{
    int v;
    memcpy(&v, field, sizeof v);
    if (v) {
        snprintf(err, errlen, "checked: may only be false");
        return -1;
    }
    return 0;
}

static int validate_addr(const void *field, char *err, size_t errlen)
{
    char host[64];
    int port;
    if (conf_parse_hostport(field, host, sizeof host, &port) < 0) {
        snprintf(err, errlen, "addr: '%s' is not HOST:PORT", (const char *)field);
        return -1;
    }
    return 0;
}

#define T_INT(n, lo, hi, d, v) {#n, CONF_INT, lo, hi, d, offsetof(struct tconf, n), sizeof(int64_t), v, "help " #n}
#define T_BOOL(n, d, v) {#n, CONF_BOOL, 0, 0, d, offsetof(struct tconf, n), sizeof(int), v, "help " #n}
#define T_STR(n, d, v) {#n, CONF_STRING, 0, 0, d, offsetof(struct tconf, n), sizeof(((struct tconf *)0)->n), v, "help " #n}

static const struct conf_option test_options[] = {
    T_INT(count, -5, 100, "7", NULL),
    T_INT(even, INT64_MIN, INT64_MAX, "2", validate_even),
    T_BOOL(verbose, "off", NULL),
    T_BOOL(checked, "false", validate_false),
    T_STR(name, "abc", NULL),
    T_STR(addr, "127.0.0.1:80", validate_addr),
    T_STR(note, "", NULL),
    {NULL, 0, 0, 0, NULL, 0, 0, NULL, NULL},
};

static struct tconf defaults(void)
{
    struct tconf c;
    char err[256] = "";
    memset(&c, 0x5a, sizeof c);
    if (conf_set_defaults(test_options, &c, err, sizeof err) < 0)
        fail_msg("defaults refused: %s", err);
    return c;
}

/* A temporary directory for config files, removed by teardown. */
static char tmpdir[64];

static int make_tmpdir(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_conf.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_tmpdir(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Writes text to tmpdir/name and returns its path (static buffer). */
static const char *write_file(const char *name, const char *text)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
    return path;
}

/* ---- the engine, on the test table ---- */

static void test_defaults(void **state)
{
    (void)state;
    struct tconf c = defaults();
    assert_int_equal(c.count, 7);
    assert_int_equal(c.even, 2);
    assert_int_equal(c.verbose, 0);
    assert_int_equal(c.checked, 0);
    assert_string_equal(c.name, "abc");
    assert_string_equal(c.addr, "127.0.0.1:80");
    assert_string_equal(c.note, "");
}

static void test_bad_default_is_refused(void **state)
{
    (void)state;
    static const struct conf_option bad[] = {
        T_INT(count, 0, 10, "11", NULL),
        {NULL, 0, 0, 0, NULL, 0, 0, NULL, NULL},
    };
    static const struct conf_option bad_validator[] = {
        T_INT(even, 0, 10, "3", validate_even),
        {NULL, 0, 0, 0, NULL, 0, 0, NULL, NULL},
    };
    struct tconf c;
    char err[256] = "";
    memset(&c, 0, sizeof c);
    assert_int_equal(conf_set_defaults(bad, &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "count"));
    err[0] = '\0';
    assert_int_equal(conf_set_defaults(bad_validator, &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "odd"));
}

static void test_int_values(void **state)
{
    (void)state;
    static const struct { const char *value; int ok; int64_t want; } cases[] = {
        {"0", 1, 0},
        {"100", 1, 100},
        {"-5", 1, -5},
        {"-0", 1, 0},
        {"007", 1, 7},
        {"101", 0, 0},
        {"-6", 0, 0},
        {"", 0, 0},
        {"-", 0, 0},
        {"+5", 0, 0},
        {" 5", 0, 0},
        {"5 ", 0, 0},
        {"5x", 0, 0},
        {"0x10", 0, 0},
        {"1.5", 0, 0},
        {"1e2", 0, 0},
        {"--5", 0, 0},
        {"99999999999999999999", 0, 0},
        {"-99999999999999999999", 0, 0},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct tconf c = defaults();
        char err[256] = "";
        int rc = conf_set(test_options, &c, "count", cases[i].value, err, sizeof err);
        if (cases[i].ok) {
            if (rc != 0 || c.count != cases[i].want)
                fail_msg("count='%s': rc %d value %" PRId64 " err '%s'", cases[i].value, rc, c.count, err);
        } else {
            if (rc != -1 || c.count != 7)
                fail_msg("count='%s': rc %d value %" PRId64 ", want refused and unchanged", cases[i].value, rc,
                         c.count);
            if (!strstr(err, "count"))
                fail_msg("count='%s': error '%s' does not name the option", cases[i].value, err);
        }
    }
}

static void test_int_extremes(void **state)
{
    (void)state;
    struct tconf c = defaults();
    char err[256];
    assert_int_equal(conf_set(test_options, &c, "even", "9223372036854775806", err, sizeof err), 0);
    assert_true(c.even == INT64_C(9223372036854775806));
    assert_int_equal(conf_set(test_options, &c, "even", "-9223372036854775808", err, sizeof err), 0);
    assert_true(c.even == INT64_MIN);
    assert_int_equal(conf_set(test_options, &c, "even", "9223372036854775808", err, sizeof err), -1);
    assert_true(c.even == INT64_MIN);
}

static void test_int_validator(void **state)
{
    (void)state;
    struct tconf c = defaults();
    char err[256] = "";
    assert_int_equal(conf_set(test_options, &c, "even", "40", err, sizeof err), 0);
    assert_int_equal(c.even, 40);
    assert_int_equal(conf_set(test_options, &c, "even", "41", err, sizeof err), -1);
    assert_string_equal(err, "even: 41 is odd");
    assert_int_equal(c.even, 40);
}

static void test_bool_values(void **state)
{
    (void)state;
    static const struct { const char *value; int want; } cases[] = {
        {"true", 1}, {"yes", 1}, {"on", 1}, {"1", 1}, {"TRUE", 1}, {"Yes", 1}, {"ON", 1},
        {"false", 0}, {"no", 0}, {"off", 0}, {"0", 0}, {"False", 0}, {"NO", 0}, {"Off", 0},
        {"", -1}, {"2", -1}, {"y", -1}, {"n", -1}, {"truee", -1}, {"enable", -1}, {" true", -1},
        {"01", -1}, {"-1", -1},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        for (int start = 0; start <= 1; start++) {
            struct tconf c = defaults();
            c.verbose = start;
            char err[256] = "";
            int rc = conf_set(test_options, &c, "verbose", cases[i].value, err, sizeof err);
            int want = cases[i].want < 0 ? start : cases[i].want;
            if (rc != (cases[i].want < 0 ? -1 : 0) || c.verbose != want)
                fail_msg("verbose='%s' from %d: rc %d value %d", cases[i].value, start, rc, c.verbose);
            if (rc < 0 && !strstr(err, "verbose"))
                fail_msg("verbose='%s': error '%s' does not name the option", cases[i].value, err);
        }
    }
}

/* The validator applies to every type, booleans included. */
static void test_bool_validator(void **state)
{
    (void)state;
    struct tconf c = defaults();
    char err[256] = "";
    assert_int_equal(conf_set(test_options, &c, "checked", "no", err, sizeof err), 0);
    assert_int_equal(c.checked, 0);
    assert_int_equal(conf_set(test_options, &c, "checked", "yes", err, sizeof err), -1);
    assert_string_equal(err, "checked: may only be false");
    assert_int_equal(c.checked, 0);
}

static void test_string_values(void **state)
{
    (void)state;
    struct tconf c = defaults();
    char err[256] = "";
    assert_int_equal(conf_set(test_options, &c, "name", "", err, sizeof err), 0);
    assert_string_equal(c.name, "");
    assert_int_equal(conf_set(test_options, &c, "name", "1234567", err, sizeof err), 0);
    assert_string_equal(c.name, "1234567");
    assert_int_equal(conf_set(test_options, &c, "name", "12345678", err, sizeof err), -1);
    assert_string_equal(err, "name: value longer than 7 bytes");
    assert_string_equal(c.name, "1234567");

    /* A refused string leaves the old value, not a prefix of the new one. */
    assert_int_equal(conf_set(test_options, &c, "addr", "[::1]:8080", err, sizeof err), 0);
    assert_string_equal(c.addr, "[::1]:8080");
    assert_int_equal(conf_set(test_options, &c, "addr", "no port here", err, sizeof err), -1);
    assert_string_equal(err, "addr: 'no port here' is not HOST:PORT");
    assert_string_equal(c.addr, "[::1]:8080");
}

static void test_unknown_option(void **state)
{
    (void)state;
    struct tconf c = defaults();
    struct tconf before = c;
    char err[256] = "";
    static const char *names[] = {"counts", "Count", "", "coun", "count ", "help"};
    for (size_t i = 0; i < ARRAY_LEN(names); i++) {
        assert_int_equal(conf_set(test_options, &c, names[i], "1", err, sizeof err), -1);
        char want[64];
        snprintf(want, sizeof want, "unknown option '%s'", names[i]);
        assert_string_equal(err, want);
    }
    assert_memory_equal(&c, &before, sizeof c);
}

static void test_overrides(void **state)
{
    (void)state;
    struct tconf c = defaults();
    char err[256] = "";
    assert_int_equal(conf_set_override(test_options, &c, "count=42", err, sizeof err), 0);
    assert_int_equal(c.count, 42);
    assert_int_equal(conf_set_override(test_options, &c, "verbose=yes", err, sizeof err), 0);
    assert_int_equal(c.verbose, 1);
    /* Everything after the first '=' is the value, even another '='. */
    assert_int_equal(conf_set_override(test_options, &c, "note=a=b", err, sizeof err), 0);
    assert_string_equal(c.note, "a=b");
    assert_int_equal(conf_set_override(test_options, &c, "note=", err, sizeof err), 0);
    assert_string_equal(c.note, "");

    struct tconf before = c;
    static const struct { const char *arg; const char *err; } bad[] = {
        {"count", "'count': expected KEY=VALUE"},
        {"=5", "'=5': expected KEY=VALUE"},
        {"", "'': expected KEY=VALUE"},
        {"count=abc", "count: 'abc' is not an integer"},
        {"count=1000", "count: 1000 is outside -5..100"},
        {"count =5", "unknown option 'count '"},
        {"nosuch=1", "unknown option 'nosuch'"},
        {"even=3", "even: 3 is odd"},
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        err[0] = '\0';
        assert_int_equal(conf_set_override(test_options, &c, bad[i].arg, err, sizeof err), -1);
        assert_string_equal(err, bad[i].err);
    }
    char longname[200];
    memset(longname, 'k', 150);
    snprintf(longname + 150, sizeof longname - 150, "=1");
    assert_int_equal(conf_set_override(test_options, &c, longname, err, sizeof err), -1);
    assert_non_null(strstr(err, "option name too long"));
    assert_memory_equal(&c, &before, sizeof c);
}

static void test_error_buffer_truncates(void **state)
{
    (void)state;
    struct tconf c = defaults();
    char err[8];
    memset(err, 'x', sizeof err);
    assert_int_equal(conf_set(test_options, &c, "count", "abc", err, sizeof err), -1);
    assert_string_equal(err, "count: ");
}

static void test_hostport(void **state)
{
    (void)state;
    static const struct { const char *s; const char *host; int port; } ok[] = {
        {"127.0.0.1:8080", "127.0.0.1", 8080},
        {"localhost:80", "localhost", 80},
        {"example.com:65535", "example.com", 65535},
        {"0.0.0.0:0", "0.0.0.0", 0},
        {"host:00443", "host", 443},
        {"[::1]:8080", "::1", 8080},
        {"[::]:1", "::", 1},
        {"[fe80::1%eth0]:22", "fe80::1%eth0", 22},
        {"[2001:db8::42]:443", "2001:db8::42", 443},
    };
    for (size_t i = 0; i < ARRAY_LEN(ok); i++) {
        char host[64];
        int port = -1;
        memset(host, 'x', sizeof host);
        if (conf_parse_hostport(ok[i].s, host, sizeof host, &port) != 0)
            fail_msg("'%s' refused", ok[i].s);
        assert_string_equal(host, ok[i].host);
        assert_int_equal(port, ok[i].port);
    }
    static const char *bad[] = {
        "",
        "8080",
        ":8080",
        "host",
        "host:",
        "host:-1",
        "host:-0",
        "host:+80",
        "host:65536",
        "host:99999999999999999999",
        "host:80x",
        "host: 80",
        "host:0x50",
        "[::1]",
        "[::1]8080",
        "[::1]:",
        "[]:80",
        "[::1:80",
        "[::1]]:80",
        "[::1]:80:81",
        "::1:8080",      /* IPv6 without brackets is ambiguous */
        "1:2:3:4::8080",
        "a:b:80",
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        char host[64] = "untouched";
        int port = -7;
        if (conf_parse_hostport(bad[i], host, sizeof host, &port) != -1)
            fail_msg("'%s' accepted as host '%s' port %d", bad[i], host, port);
        assert_string_equal(host, "untouched");
        assert_int_equal(port, -7);
    }
}

static void test_hostport_host_buffer(void **state)
{
    (void)state;
    char host[10];
    int port;
    assert_int_equal(conf_parse_hostport("123456789:1", host, sizeof host, &port), 0);
    assert_string_equal(host, "123456789");
    assert_int_equal(conf_parse_hostport("1234567890:1", host, sizeof host, &port), -1);
    assert_int_equal(conf_parse_hostport("[1:3:5:7:9]:1", host, sizeof host, &port), 0);
    assert_string_equal(host, "1:3:5:7:9");
    assert_int_equal(conf_parse_hostport("[1:3:5:7:9a]:1", host, sizeof host, &port), -1);
}

/* ---- files ---- */

static void test_file_good(void **state)
{
    (void)state;
    const char *path = write_file("good.conf",
                                  "# a comment\n"
                                  "; another comment\n"
                                  "\n"
                                  "count = 12\n"
                                  "   \t\n"
                                  "verbose=yes\n"
                                  "name =   xyz   \n"
                                  "addr = [::1]:9000 ; inline comment\n"
                                  "note = has # no comment\n"
                                  "even = 6\r\n");
    struct tconf c = defaults();
    char err[512] = "";
    if (conf_load_file(test_options, &c, path, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(c.count, 12);
    assert_int_equal(c.verbose, 1);
    assert_string_equal(c.name, "xyz");
    assert_string_equal(c.addr, "[::1]:9000");
    assert_string_equal(c.note, "has # no comment");
    assert_int_equal(c.even, 6);
}

static void test_file_empty(void **state)
{
    (void)state;
    const char *path = write_file("empty.conf", "");
    struct tconf c = defaults(), before = c;
    char err[512] = "";
    assert_int_equal(conf_load_file(test_options, &c, path, err, sizeof err), 0);
    assert_memory_equal(&c, &before, sizeof c);
}

/* Each bad file fails with "PATH:LINE: reason" for its first bad line. */
static void test_file_errors(void **state)
{
    (void)state;
    static const struct { const char *text; int line; const char *reason; } cases[] = {
        {"verbose = yes\ncount = 500\n", 2, "count: 500 is outside -5..100"},
        {"count = x\n", 1, "count: 'x' is not an integer"},
        {"\n\n\nverbose = maybe\n", 4, "verbose: 'maybe' is not true or false"},
        {"# c\nnosuch = 1\n", 2, "unknown option 'nosuch'"},
        {"count = 1\njust words\n", 2, "syntax error (expected key = value)"},
        {"name = far too long\n", 1, "name: value longer than 7 bytes"},
        {"addr = nowhere\n", 1, "addr: 'nowhere' is not HOST:PORT"},
        {"even = 7\n", 1, "even: 7 is odd"},
        {"count = 1\n[daemon]\ncount = 2\n",
         2, "sections are not used ([daemon]); write plain key = value lines"},
        /* A section header alone is refused too, not silently ignored. */
        {"count = 1\n[daemon]\n", 2, "sections are not used ([daemon]); write plain key = value lines"},
        /* Only the first bad line is reported, with its own reason. */
        {"name = a\ncount = x\nverbose = maybe\n", 2, "count: 'x' is not an integer"},
        {"count = 1\njust words\nverbose = maybe\n", 2, "syntax error (expected key = value)"},
        {"nosuch = 1\njust words\n", 1, "unknown option 'nosuch'"},
        {"count = 1\n\n[s]\nverbose = maybe\n", 3,
         "sections are not used ([s]); write plain key = value lines"},
        /* A key written twice: the last line used to win without a word. */
        {"count = 1\nverbose = yes\ncount = 2\n", 3, "'count' is set twice (first on line 1); keep one of the two lines"},
        {"# c\nname = a\n\nname = a\n", 4, "'name' is set twice (first on line 2); keep one of the two lines"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        const char *path = write_file("bad.conf", cases[i].text);
        struct tconf c = defaults();
        char err[512] = "", want[600];
        int rc = conf_load_file(test_options, &c, path, err, sizeof err);
        snprintf(want, sizeof want, "%s:%d: %s", path, cases[i].line, cases[i].reason);
        if (rc != -1 || strcmp(err, want) != 0)
            fail_msg("case %zu: rc %d\n got '%s'\nwant '%s'", i, rc, err, want);
    }
}

/* inih would hand an indented line on as a second value for the key above,
 * replacing its value: such lines are refused. Indented comments and blank
 * lines are fine. */
static void test_file_indented_lines(void **state)
{
    (void)state;
    static const struct { const char *text; int line; } cases[] = {
        {"note = first\n   second part\n", 2},
        {"note = first\n  name = xyz\n", 2},
        {"count = 1\n\tcount = 3\n", 2},
        {"  count = 3\n", 1},
        {"note = a\n\n   b\n", 3},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        const char *path = write_file("indent.conf", cases[i].text);
        struct tconf c = defaults(), before = c;
        char err[512] = "", want[600];
        int rc = conf_load_file(test_options, &c, path, err, sizeof err);
        snprintf(want, sizeof want, "%s:%d: line starts with a blank", path, cases[i].line);
        if (rc != -1 || strncmp(err, want, strlen(want)) != 0)
            fail_msg("case %zu: rc %d err '%s'", i, rc, err);
        /* Nothing from the refused line or after it was applied. */
        assert_string_equal(c.name, before.name);
        assert_true(c.count != 3);
        assert_true(strcmp(c.note, "first") == 0 || strcmp(c.note, "a") == 0 || c.note[0] == '\0');
    }
    const char *path = write_file("indent-ok.conf", "count = 3\n   # indented comment\n  \t \nname = xyz\n");
    struct tconf c = defaults();
    char err[512] = "";
    if (conf_load_file(test_options, &c, path, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(c.count, 3);
    assert_string_equal(c.name, "xyz");
}

/* A line longer than the INI reader's buffer is refused as a whole rather
 * than split into a truncated value and a stray second line (which inih
 * would take as a continuation if it started with a blank). */
static void test_file_long_lines(void **state)
{
    (void)state;
    char text[1200];
    /* note holds 299 bytes; "note = " and these values straddle the limit. */
    static const size_t lens[] = {150, 190, 191, 192, 193, 199, 200, 250, 299};
    int accepted = 0, refused = 0;
    for (size_t i = 0; i < ARRAY_LEN(lens); i++) {
        char value[300];
        memset(value, 'v', lens[i]);
        for (size_t k = 40; k < lens[i] - 1; k += 41)
            value[k] = ' '; /* so a split tail would start with a blank */
        value[lens[i]] = '\0';
        snprintf(text, sizeof text, "count = 1\nnote = %s\nverbose = yes\n", value);
        const char *path = write_file("long.conf", text);
        struct tconf c = defaults();
        char err[512] = "";
        int rc = conf_load_file(test_options, &c, path, err, sizeof err);
        if (rc == 0) {
            /* Accepted: then the whole value, exactly. */
            assert_string_equal(c.note, value);
            assert_true(c.verbose);
            accepted++;
        } else {
            char want[300];
            snprintf(want, sizeof want, "%s:2: line is longer than ", path);
            if (strncmp(err, want, strlen(want)) != 0)
                fail_msg("note of %zu bytes: '%s'", lens[i], err);
            assert_string_equal(c.note, "");
            refused++;
        }
    }
    assert_true(accepted >= 1);
    assert_true(refused >= 1);

    /* A long comment is harmless and skipped. */
    memset(text, '#', 500);
    snprintf(text + 500, sizeof text - 500, "\ncount = 9\n");
    const char *path = write_file("long-comment.conf", text);
    struct tconf c = defaults();
    char err[512] = "";
    if (conf_load_file(test_options, &c, path, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(c.count, 9);
}

static void test_file_odd_bytes(void **state)
{
    (void)state;
    /* A UTF-8 byte order mark is allowed before the first key. */
    const char *path = write_file("bom.conf", "\xEF\xBB\xBF" "count = 4\n");
    struct tconf c = defaults();
    char err[512] = "", want[600];
    if (conf_load_file(test_options, &c, path, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(c.count, 4);

    /* A NUL byte would hide the rest of its line from the parser. */
    snprintf(want, sizeof want, "%s/nul.conf", tmpdir);
    FILE *f = fopen(want, "w");
    assert_non_null(f);
    assert_int_equal(fwrite("count = 5\nnote = a\0b\n", 1, 22, f), 22);
    assert_int_equal(fclose(f), 0);
    c = defaults();
    assert_int_equal(conf_load_file(test_options, &c, want, err, sizeof err), -1);
    strcat(want, ":2: line contains a NUL byte");
    assert_string_equal(err, want);
}

static void test_file_unreadable(void **state)
{
    (void)state;
    struct tconf c = defaults(), before = c;
    char err[512] = "", path[256], want[600];
    snprintf(path, sizeof path, "%s/does-not-exist.conf", tmpdir);
    assert_int_equal(conf_load_file(test_options, &c, path, err, sizeof err), -1);
    snprintf(want, sizeof want, "%s: No such file or directory", path);
    assert_string_equal(err, want);

    /* A directory opens but cannot be read: an error, not an empty file. */
    err[0] = '\0';
    assert_int_equal(conf_load_file(test_options, &c, tmpdir, err, sizeof err), -1);
    assert_non_null(strstr(err, tmpdir));
    assert_memory_equal(&c, &before, sizeof c);
}

static void test_print_help(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    conf_print_help(test_options, f);
    assert_int_equal(fclose(f), 0);
    assert_non_null(strstr(buf, "help count (default 7, -5..100)"));
    assert_non_null(strstr(buf, "help name (default \"abc\")"));
    for (const struct conf_option *o = test_options; o->name; o++)
        assert_non_null(strstr(buf, o->name));
    free(buf);
}

/* ---- the list validators shared through conf.h ---- */

static void test_address_list(void **state)
{
    (void)state;
    char err[512];
    static const char *good[] = {
        "", " ", ",", "127.0.0.1", "10.9.9.9 127.0.0.1", "10.0.0.1,10.0.0.2", " ::1 , 192.168.1.1 ",
        "2001:db8::1", "::ffff:10.0.0.1", "fe80::1 0.0.0.0",
    };
    for (size_t i = 0; i < ARRAY_LEN(good); i++)
        if (conf_check_address_list("proxies", good[i], err, sizeof err) != 0)
            fail_msg("'%s' refused: %s", good[i], err);
    static const struct { const char *value, *needle; } bad[] = {
        {"banana", "proxies: 'banana' is not an IP address"},
        {"127.0.0.1 proxy.example", "'proxy.example' is not an IP address"},
        {"10.0.0.0/8", "'10.0.0.0/8' is a range; ranges (CIDR) are not supported"},
        {"::1 fd00::/64", "'fd00::/64' is a range"},
        {"256.1.1.1", "is not an IP address"},
        {"127.1", "is not an IP address"},
        {"1.2.3.4:80", "is not an IP address"},
        {"[::1]", "is not an IP address"},
        {"fe80::1%eth0", "is not an IP address"},
        {"127.0.0.1\t10.0.0.1", "is not an IP address"},
        /* Addresses http.c's text comparison would never match. */
        {"0:0:0:0:0:0:0:1", "'0:0:0:0:0:0:0:1' would never match a client; write it as '::1'"},
        {"2001:DB8::1", "write it as '2001:db8::1'"},
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        err[0] = '\0';
        if (conf_check_address_list("proxies", bad[i].value, err, sizeof err) != -1 || !strstr(err, bad[i].needle))
            fail_msg("'%s': err '%s', wanted '%s'", bad[i].value, err, bad[i].needle);
    }
}

static void test_origin_list(void **state)
{
    (void)state;
    char err[512];
    static const char *good[] = {
        "", "*", "https://console.example.com", "http://localhost:5173", "https://a.example https://b.example",
        "http://127.0.0.1:8080,http://localhost:8080", "https://[::1]:8443", "http://[2001:db8::1]",
        "https://xn--bcher-kva.example", "http://my_host.internal:1", "https://a.example:65535", "* https://a.example",
        "http://example.com:443", "https://example.com:80",
    };
    for (size_t i = 0; i < ARRAY_LEN(good); i++)
        if (conf_check_origin_list("origins", good[i], err, sizeof err) != 0)
            fail_msg("'%s' refused: %s", good[i], err);
    static const struct { const char *value, *needle; } bad[] = {
        {"console.example.com/", "origins: 'console.example.com/' is not an origin: scheme://host[:port]"},
        {"https://ok.example x", "'x' is not an origin"},
        {"ftp://files.example", "is not an origin"},
        {"https://", "is not an origin"},
        {"https:/console.example", "is not an origin"},
        {"null", "is not an origin"},
        {"**", "is not an origin"},
        {"https://console.example.com/", "has a path or a trailing slash; an origin is scheme://host[:port] alone: "
                                         "'https://console.example.com'"},
        {"https://console.example.com/app", "has a path"},
        {"http://localhost:3000/", "alone: 'http://localhost:3000'"},
        {"https://bad host/", "'host/' is not an origin"},
        {"https://bad!host/", "'https://bad!host/' is not an origin"},
        {"https://Console.example.com", "has upper-case letters; browsers send origins in lower case"},
        {"HTTPS://console.example.com", "has upper-case letters"},
        {"https://console.example.com:443", "names the default port, which browsers leave out: "
                                            "'https://console.example.com'"},
        {"http://localhost:80", "names the default port"},
        {"https://a.example:0", "has a bad port"},
        {"https://a.example:65536", "has a bad port"},
        {"https://a.example:08080", "has a bad port"},
        {"https://a.example:", "has a bad port"},
        {"https://a.example:x", "has a bad port"},
        {"https://a.example?x=1", "is not an origin"},
        {"https://a.example#top", "is not an origin"},
        {"https://user@a.example", "is not an origin"},
        {"https://.example", "is not an origin"},
        {"https://a..example", "is not an origin"},
        {"https://a.example.", "is not an origin"},
        {"http://999.1.1.1", "is not an origin"},
        {"http://127.1", "is not an origin"},
        {"http://[::1", "is not an origin"},
        {"http://[banana]", "is not an origin"},
        {"http://::1", "is not an origin"},
        {"http://[0:0::1]:8080", "would never match; browsers send the address as [::1]"},
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        err[0] = '\0';
        if (conf_check_origin_list("origins", bad[i].value, err, sizeof err) != -1 || !strstr(err, bad[i].needle))
            fail_msg("'%s': err '%s', wanted '%s'", bad[i].value, err, bad[i].needle);
    }
    /* A long word is quoted whole or cut at the buffer, never overrun. */
    char small[24];
    assert_int_equal(conf_check_origin_list("origins", "https://a-rather-long-host.example/", small, sizeof small), -1);
    assert_int_equal(strlen(small), sizeof small - 1);
}

/* ---- the daemon's real table ---- */

static void test_daemon_defaults(void **state)
{
    (void)state;
    struct daemon_conf c;
    char err[1024] = "";
    memset(&c, 0, sizeof c);
    if (conf_set_defaults(daemon_options, &c, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_string_equal(c.listen, "127.0.0.1:8080");
    assert_string_equal(c.log_level, "info");
    assert_int_equal(c.threads, 4);
    assert_int_equal(c.max_json_depth, 16);
    assert_int_equal(c.password_iterations, 600000);
    assert_string_equal(c.tls_cert, "");

    size_t n = 0;
    for (const struct conf_option *o = daemon_options; o->name; o++, n++) {
        /* Each default passes its own option's parse, bounds and validator. */
        assert_non_null(o->def);
        assert_non_null(o->help);
        if (conf_set(daemon_options, &c, o->name, o->def, err, sizeof err) != 0)
            fail_msg("default of %s refused: %s", o->name, err);
        if (o->type == CONF_INT) {
            assert_true(o->min <= o->max);
            assert_int_equal(o->size, sizeof(int64_t));
        } else if (o->type == CONF_STRING) {
            assert_true(strlen(o->def) < o->size);
        }
        assert_true(o->offset + o->size <= sizeof c);
        /* Names are unique, or the second row could never be set. */
        for (const struct conf_option *p = daemon_options; p < o; p++)
            assert_string_not_equal(p->name, o->name);
    }
    assert_true(n >= 18);
}

static void test_daemon_bad_values(void **state)
{
    (void)state;
    struct daemon_conf c, before;
    char err[1024], v[64];
    memset(&c, 0, sizeof c);
    assert_int_equal(conf_set_defaults(daemon_options, &c, err, sizeof err), 0);
    before = c;
    for (const struct conf_option *o = daemon_options; o->name; o++) {
        if (o->type == CONF_INT) {
            static const char *junk[] = {"", "ten", "1.0", "12abc", " 1", "0x1f", "99999999999999999999"};
            for (size_t i = 0; i < ARRAY_LEN(junk); i++)
                if (conf_set(daemon_options, &c, o->name, junk[i], err, sizeof err) != -1)
                    fail_msg("%s='%s' accepted", o->name, junk[i]);
            snprintf(v, sizeof v, "%" PRId64, o->min - 1);
            if (conf_set(daemon_options, &c, o->name, v, err, sizeof err) != -1)
                fail_msg("%s=%s (below min) accepted", o->name, v);
            snprintf(v, sizeof v, "%" PRId64, o->max + 1);
            if (conf_set(daemon_options, &c, o->name, v, err, sizeof err) != -1)
                fail_msg("%s=%s (above max) accepted", o->name, v);
            assert_memory_equal(&c, &before, sizeof c);
            /* The bounds themselves are accepted. */
            snprintf(v, sizeof v, "%" PRId64, o->min);
            assert_int_equal(conf_set(daemon_options, &c, o->name, v, err, sizeof err), 0);
            snprintf(v, sizeof v, "%" PRId64, o->max);
            assert_int_equal(conf_set(daemon_options, &c, o->name, v, err, sizeof err), 0);
            int64_t got;
            memcpy(&got, (char *)&c + o->offset, sizeof got);
            assert_true(got == o->max);
        } else if (o->type == CONF_STRING) {
            char *big = malloc(o->size + 1);
            assert_non_null(big);
            memset(big, 'a', o->size);
            big[o->size] = '\0';
            if (conf_set(daemon_options, &c, o->name, big, err, sizeof err) != -1)
                fail_msg("%s: %zu-byte value accepted", o->name, o->size);
            assert_non_null(strstr(err, "longer than"));
            free(big);
        }
        c = before;
    }

    static const struct { const char *name, *value; } bad[] = {
        {"listen", ""},
        {"listen", "8080"},
        {"listen", "localhost"},
        {"listen", "127.0.0.1:"},
        {"listen", "127.0.0.1:65536"},
        {"listen", "::1:8080"},
        {"listen", "[::1]"},
        {"listen", "localhost:0"}, /* a name: the servers bind numeric addresses only */
        {"listen", "999.1.1.1:8080"},
        {"log_level", ""},
        {"log_level", "verbose"},
        {"log_level", "warning"},
        {"log_level", "trace"},
        {"database", ""},
        {"bootstrap_admin_email", ""},
        {"trusted_proxies", "banana"},
        {"trusted_proxies", "10.0.0.0/8"},
        {"trusted_proxies", "127.0.0.1 proxy.example"},
        {"cors_origins", "console.example.com/ x"},
        {"cors_origins", "https://console.example.com/"},
        {"cors_origins", "https://ok.example ftp://bad.example"},
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        err[0] = '\0';
        if (conf_set(daemon_options, &c, bad[i].name, bad[i].value, err, sizeof err) != -1)
            fail_msg("%s='%s' accepted", bad[i].name, bad[i].value);
        assert_true(err[0] != '\0');
        assert_memory_equal(&c, &before, sizeof c);
    }
    static const struct { const char *name, *value; } good[] = {
        {"listen", "0.0.0.0:80"},
        {"listen", "[::]:8443"},
        {"listen", "127.0.0.1:0"},
        {"log_level", "error"},
        {"log_level", "warn"},
        {"log_level", "debug"},
        {"cors_origins", ""},
        {"cors_origins", "https://console.example https://other.example"},
        {"cors_origins", "*"},
        {"trusted_proxies", ""},
        {"trusted_proxies", "10.9.9.9 127.0.0.1 ::1"},
        {"tls_cert", "/etc/gpurent/cert.pem"},
    };
    for (size_t i = 0; i < ARRAY_LEN(good); i++)
        if (conf_set(daemon_options, &c, good[i].name, good[i].value, err, sizeof err) != 0)
            fail_msg("%s='%s' refused: %s", good[i].name, good[i].value, err);
}

static void test_daemon_sample_file(void **state)
{
    (void)state;
    const char *path = write_file("gpurentd.conf",
                                  "# gpurentd configuration\n"
                                  "# Every option is listed with its default; see gpurentd --help-config.\n"
                                  "\n"
                                  "listen = [::1]:9090\n"
                                  "database = /var/lib/gpurent/test.db\n"
                                  "log_level = debug\n"
                                  "threads = 8\n"
                                  "max_connections = 2048\n"
                                  "max_connections_per_client = 32\n"
                                  "connection_timeout_s = 60\n"
                                  "max_body_bytes = 65536\n"
                                  "max_json_depth = 8\n"
                                  "cors_origins = https://console.example.com http://localhost:5173\n"
                                  "tls_cert =\n"
                                  "tls_key =\n"
                                  "password_iterations = 1000\n"
                                  "login_max_failures = 3\n"
                                  "login_lockout_s = 60\n"
                                  "bootstrap_admin_email = ops@example.com\n"
                                  "drain_timeout_s = 5\n"
                                  "clock_file =\n");
    struct daemon_conf c;
    char err[1024] = "";
    memset(&c, 0, sizeof c);
    assert_int_equal(conf_set_defaults(daemon_options, &c, err, sizeof err), 0);
    if (conf_load_file(daemon_options, &c, path, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_string_equal(c.listen, "[::1]:9090");
    assert_string_equal(c.database, "/var/lib/gpurent/test.db");
    assert_string_equal(c.log_level, "debug");
    assert_int_equal(c.threads, 8);
    assert_int_equal(c.max_connections, 2048);
    assert_int_equal(c.max_connections_per_client, 32);
    assert_int_equal(c.connection_timeout_s, 60);
    assert_int_equal(c.max_body_bytes, 65536);
    assert_int_equal(c.max_json_depth, 8);
    assert_string_equal(c.cors_origins, "https://console.example.com http://localhost:5173");
    assert_string_equal(c.tls_cert, "");
    assert_int_equal(c.password_iterations, 1000);
    assert_int_equal(c.login_max_failures, 3);
    assert_int_equal(c.login_lockout_s, 60);
    assert_string_equal(c.bootstrap_admin_email, "ops@example.com");
    assert_int_equal(c.drain_timeout_s, 5);
    assert_string_equal(c.clock_file, "");

    /* The same file through the daemon's loader, then an override on top. */
    char o1[] = "threads=2", o2[] = "log_level=warn";
    char *overrides[] = {o1, o2};
    memset(&c, 0, sizeof c);
    assert_int_equal(daemon_load_config(&c, path, overrides, 2), 0);
    assert_int_equal(c.threads, 2);
    assert_string_equal(c.log_level, "warn");
    assert_string_equal(c.listen, "[::1]:9090");
}

/* The sample shipped in conf/ lists every option at its default, so loading
 * it must succeed and change nothing. */
static void test_daemon_shipped_sample(void **state)
{
    (void)state;
    static const char path[] = "conf/gpurentd.conf";
    if (access(path, R_OK) != 0)
        skip();
    struct daemon_conf c, def;
    char err[1024] = "";
    memset(&def, 0, sizeof def);
    assert_int_equal(conf_set_defaults(daemon_options, &def, err, sizeof err), 0);
    c = def;
    if (conf_load_file(daemon_options, &c, path, err, sizeof err) != 0)
        fail_msg("%s", err);
    for (const struct conf_option *o = daemon_options; o->name; o++)
        if (memcmp((char *)&c + o->offset, (char *)&def + o->offset, o->size) != 0)
            fail_msg("%s: %s differs from its default", path, o->name);
}

static void test_daemon_bad_files(void **state)
{
    (void)state;
    static const struct { const char *text; int line; const char *needle; } cases[] = {
        {"listen = 127.0.0.1:8080\nthreads = 0\n", 2, "threads: 0 is outside 1..256"},
        {"threads = 4\nmax_json_depth = 65\n", 2, "max_json_depth: 65 is outside 2..64"},
        {"log_level = loud\n", 1, "log_level: 'loud' is not error, warn, info or debug"},
        {"\nlisten = 8080\n", 2, "listen: '8080' is not HOST:PORT"},
        {"database =\n", 1, "value must not be empty"},
        {"max_body_bytes = 1MB\n", 1, "max_body_bytes: '1MB' is not an integer"},
        {"[gpurentd]\nthreads = 4\n", 1, "sections are not used ([gpurentd])"},
        {"threads = 4\nworkers = 4\n", 2, "unknown option 'workers'"},
        {"password_iterations = 999\n", 1, "password_iterations: 999 is outside 1000..100000000"},
        {"threads = 4\ntrusted_proxies = banana\n", 2, "trusted_proxies: 'banana' is not an IP address"},
        {"\n\ncors_origins = https://ok.example https://console.example.com/\n", 3,
         "cors_origins: 'https://console.example.com/' has a path or a trailing slash"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        const char *path = write_file("bad-daemon.conf", cases[i].text);
        struct daemon_conf c;
        char err[1024] = "", prefix[300];
        memset(&c, 0, sizeof c);
        assert_int_equal(conf_set_defaults(daemon_options, &c, err, sizeof err), 0);
        int rc = conf_load_file(daemon_options, &c, path, err, sizeof err);
        snprintf(prefix, sizeof prefix, "%s:%d: ", path, cases[i].line);
        if (rc != -1 || strncmp(err, prefix, strlen(prefix)) != 0 || !strstr(err, cases[i].needle))
            fail_msg("case %zu: rc %d err '%s'", i, rc, err);
    }
    /* tls_cert without tls_key is refused by the daemon's loader. */
    const char *path = write_file("tls.conf", "tls_cert = /etc/gpurent/cert.pem\n");
    struct daemon_conf c;
    assert_int_equal(daemon_load_config(&c, path, NULL, 0), -1);
}

/* The money limits: their defaults in micro-units, the caps on the options
 * themselves, and the trial credit fitting max_grant and max_balance, all
 * through the daemon's loader, which is what fills the micro-unit fields. */
static void test_daemon_money_limits(void **state)
{
    (void)state;
    struct daemon_conf c;
    char err[1024] = "";
    if (daemon_read_config(&c, NULL, NULL, 0, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_true(c.max_price_micro == INT64_C(10000000000));
    assert_true(c.max_topup_micro == INT64_C(1000000000000));
    assert_true(c.max_grant_micro == INT64_C(100000000000));
    assert_true(c.max_balance_micro == INT64_C(10000000000000));

    static const struct { const char *set[3]; const char *needle; } bad[] = {
        {{"max_balance=1000000000000.000001"}, "max_balance: 1000000000000.000001 is over 1000000000000.00"},
        {{"max_topup=9223372036854.775807"}, "max_topup: 9223372036854.775807 is over 1000000000000.00"},
        {{"max_grant=99999999999999999999"}, "max_grant: '99999999999999999999' is not an amount"},
        {{"max_price_per_card_hour=1000000.01"}, "max_price_per_card_hour: 1000000.01 is over 1000000.00"},
        {{"max_topup=1.0000001"}, "max_topup: '1.0000001' is not an amount"},
        {{"max_topup="}, "max_topup: '' is not an amount"},
        {{"signup_credit=-1"}, "signup_credit: '-1' is not an amount"},
        {{"max_grant=9.999999"}, "signup_credit 10.00 is over max_grant 9.999999"},
        {{"max_balance=1"}, "signup_credit 10.00 is over max_balance 1"},
        {{"signup_credit=200.00", "max_grant=500.00", "max_balance=199.99"}, "signup_credit 200.00 is over max_balance"},
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        char *set[3];
        int n = 0;
        for (; n < 3 && bad[i].set[n]; n++)
            set[n] = strdup(bad[i].set[n]);
        err[0] = '\0';
        int rc = daemon_read_config(&c, NULL, set, n, err, sizeof err);
        for (int k = 0; k < n; k++)
            free(set[k]);
        if (rc != -1 || !strstr(err, bad[i].needle))
            fail_msg("case %zu: rc %d err '%s', wanted '%s'", i, rc, err, bad[i].needle);
    }

    /* The caps themselves, and a trial credit exactly at both limits. */
    char o1[] = "max_topup=1000000000000", o2[] = "max_grant=20.00", o3[] = "max_balance=20",
         o4[] = "max_price_per_card_hour=1000000.00", o5[] = "signup_credit=20.000000";
    char *good[] = {o1, o2, o3, o4, o5};
    if (daemon_read_config(&c, NULL, good, 5, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_true(c.max_topup_micro == INT64_C(1000000000000000000));
    assert_true(c.max_grant_micro == 20 * INT64_C(1000000) && c.max_balance_micro == c.max_grant_micro);
    assert_true(c.max_price_micro == INT64_C(1000000000000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_bad_default_is_refused),
        cmocka_unit_test(test_int_values),
        cmocka_unit_test(test_int_extremes),
        cmocka_unit_test(test_int_validator),
        cmocka_unit_test(test_bool_values),
        cmocka_unit_test(test_bool_validator),
        cmocka_unit_test(test_string_values),
        cmocka_unit_test(test_unknown_option),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_error_buffer_truncates),
        cmocka_unit_test(test_hostport),
        cmocka_unit_test(test_hostport_host_buffer),
        cmocka_unit_test(test_file_good),
        cmocka_unit_test(test_file_empty),
        cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_file_indented_lines),
        cmocka_unit_test(test_file_long_lines),
        cmocka_unit_test(test_file_odd_bytes),
        cmocka_unit_test(test_file_unreadable),
        cmocka_unit_test(test_print_help),
        cmocka_unit_test(test_address_list),
        cmocka_unit_test(test_origin_list),
        cmocka_unit_test(test_daemon_defaults),
        cmocka_unit_test(test_daemon_bad_values),
        cmocka_unit_test(test_daemon_sample_file),
        cmocka_unit_test(test_daemon_shipped_sample),
        cmocka_unit_test(test_daemon_bad_files),
        cmocka_unit_test(test_daemon_money_limits),
    };
    return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
