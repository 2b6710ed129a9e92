/* test_json_body.c: unit tests for the declared-field JSON body checker
 * (json_body.c). One table of bodies, each with the error code and field it
 * must be refused with (or none), over one set of declared fields; then the
 * edges that want a closer look: the depth cap, UTF-8 and the shape of what
 * an accepted body returns. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpurent/json_body.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define OK (-1) /* "no error expected" in the tables below */

/* A sign-up-like endpoint: every kind once, one field required. */
static const struct json_field fields[] = {
    {"email", JSON_KIND_STRING, 1, 0},
    {"name", JSON_KIND_STRING, 0, 8},
    {"count", JSON_KIND_INTEGER, 0, 0},
    {"admin", JSON_KIND_BOOLEAN, 0, 0},
    {"labels", JSON_KIND_OBJECT, 0, 0},
    {"gpus", JSON_KIND_ARRAY, 0, 0},
    {NULL, 0, 0, 0},
};

/* Nothing required: what the empty body and {} must satisfy. */
static const struct json_field optional_fields[] = {
    {"note", JSON_KIND_STRING, 0, 0},
    {NULL, 0, 0, 0},
};

struct body_case {
    const char *label;
    const char *text;  /* the body */
    size_t len;        /* 0: strlen(text) */
    int code;          /* an enum api_error, or OK */
    const char *field; /* expected e.field */
};

/* Runs one case through json_body_parse with depth cap depth. */
static void check_case(const struct body_case *c, const struct json_field *f, int depth)
{
    struct json_body_error e;
    memset(&e, 0x5a, sizeof e);
    size_t len = c->len ? c->len : strlen(c->text);
    json_t *root = json_body_parse(c->text, len, f, depth, &e);
    if (c->code == OK) {
        if (!root)
            fail_msg("%s: refused with %d field '%s': %s", c->label, e.code, e.field, e.message);
        if (!json_is_object(root))
            fail_msg("%s: result is not an object", c->label);
        json_decref(root);
        return;
    }
    if (root) {
        json_decref(root);
        fail_msg("%s: accepted, want code %d field '%s'", c->label, c->code, c->field);
    }
    if ((int)e.code != c->code || strcmp(e.field, c->field) != 0)
        fail_msg("%s: code %d field '%s' (%s), want code %d field '%s'", c->label, e.code, e.field, e.message,
                 c->code, c->field);
    if (!memchr(e.message, '\0', sizeof e.message) || !e.message[0])
        fail_msg("%s: no message", c->label);
}

static void test_table(void **state)
{
    (void)state;
    static const struct body_case cases[] = {
        {"minimal", "{\"email\":\"a@b.c\"}", 0, OK, ""},
        {"every field", "{\"email\":\"a@b.c\",\"name\":\"ann\",\"count\":3,\"admin\":true,"
                        "\"labels\":{\"k\":\"v\"},\"gpus\":[0,1]}", 0, OK, ""},
        {"whitespace around", " \r\n\t{ \"email\" : \"a@b.c\" }\n ", 0, OK, ""},
        {"negative and zero", "{\"email\":\"x\",\"count\":-9223372036854775808,\"admin\":false}", 0, OK, ""},
        {"empty string", "{\"email\":\"\"}", 0, OK, ""},
        {"nested values", "{\"email\":\"x\",\"labels\":{\"a\":[1,{\"b\":null}]},\"gpus\":[]}", 0, OK, ""},
        {"escaped key", "{\"em\\u0061il\":\"x\"}", 0, OK, ""},

        /* the body as a whole */
        {"empty body, field required", "", 0, ERR_MISSING_FIELD, "email"},
        {"empty object", "{}", 0, ERR_MISSING_FIELD, "email"},
        {"only whitespace", "   ", 0, ERR_MALFORMED_JSON, ""},
        {"array", "[{\"email\":\"x\"}]", 0, ERR_NOT_AN_OBJECT, ""},
        {"empty array", "[]", 0, ERR_NOT_AN_OBJECT, ""},
        {"string", "\"email\"", 0, ERR_NOT_AN_OBJECT, ""},
        {"number", "42", 0, ERR_NOT_AN_OBJECT, ""},
        {"true", "true", 0, ERR_NOT_AN_OBJECT, ""},
        {"null", "null", 0, ERR_NOT_AN_OBJECT, ""},

        /* malformed */
        {"truncated", "{\"email\":\"x\"", 0, ERR_MALFORMED_JSON, ""},
        {"trailing comma", "{\"email\":\"x\",}", 0, ERR_MALFORMED_JSON, ""},
        {"single quotes", "{'email':'x'}", 0, ERR_MALFORMED_JSON, ""},
        {"bare key", "{email:\"x\"}", 0, ERR_MALFORMED_JSON, ""},
        {"two objects", "{\"email\":\"x\"}{}", 0, ERR_MALFORMED_JSON, ""},
        {"trailing garbage", "{\"email\":\"x\"} x", 0, ERR_MALFORMED_JSON, ""},
        {"comment", "{\"email\":\"x\"} // hi", 0, ERR_MALFORMED_JSON, ""},
        {"unclosed string", "{\"email\":\"x}", 0, ERR_MALFORMED_JSON, ""},
        {"raw control char", "{\"email\":\"a\tb\"}", 0, ERR_MALFORMED_JSON, ""},
        {"bad escape", "{\"email\":\"\\x41\"}", 0, ERR_MALFORMED_JSON, ""},
        {"escaped NUL", "{\"email\":\"a\\u0000b\"}", 0, ERR_MALFORMED_JSON, ""},
        {"escaped lone surrogate", "{\"email\":\"\\ud800\"}", 0, ERR_MALFORMED_JSON, ""},
        {"NaN", "{\"email\":\"x\",\"count\":NaN}", 0, ERR_MALFORMED_JSON, ""},
        {"integer too big", "{\"email\":\"x\",\"count\":9223372036854775808}", 0, ERR_MALFORMED_JSON, ""},
        {"NUL byte after object", "{\"email\":\"x\"}\0", 14, ERR_MALFORMED_JSON, ""},
        {"NUL byte in string", "{\"email\":\"a\0b\"}", 15, ERR_MALFORMED_JSON, ""},
        {"lone NUL", "\0", 1, ERR_MALFORMED_JSON, ""},
        {"byte order mark", "\xEF\xBB\xBF{\"email\":\"x\"}", 0, ERR_MALFORMED_JSON, ""},

        /* duplicates, decoded keys included */
        {"duplicate key", "{\"email\":\"x\",\"email\":\"y\"}", 0, ERR_DUPLICATE_KEY, "email"},
        {"duplicate via escape", "{\"email\":\"x\",\"\\u0065mail\":\"y\"}", 0, ERR_DUPLICATE_KEY, "email"},
        {"duplicate nested", "{\"email\":\"x\",\"labels\":{\"a\":1,\"a\":2}}", 0, ERR_DUPLICATE_KEY, "a"},
        {"duplicate unknown", "{\"zz\":1,\"zz\":2}", 0, ERR_DUPLICATE_KEY, "zz"},

        /* unknown fields */
        {"unknown field", "{\"email\":\"x\",\"role\":\"admin\"}", 0, ERR_UNKNOWN_FIELD, "role"},
        {"unknown null field", "{\"email\":\"x\",\"role\":null}", 0, ERR_UNKNOWN_FIELD, "role"},
        {"case matters", "{\"Email\":\"x\"}", 0, ERR_UNKNOWN_FIELD, "Email"},
        {"empty key", "{\"\":1,\"email\":\"x\"}", 0, ERR_UNKNOWN_FIELD, ""},
        {"unknown only", "{\"role\":1}", 0, ERR_UNKNOWN_FIELD, "role"},

        /* missing and null */
        {"required null", "{\"email\":null}", 0, ERR_MISSING_FIELD, "email"},
        {"required absent", "{\"name\":\"ann\"}", 0, ERR_MISSING_FIELD, "email"},
        {"optional nulls", "{\"email\":\"x\",\"name\":null,\"count\":null,\"admin\":null,\"labels\":null,"
                           "\"gpus\":null}", 0, OK, ""},

        /* wrong types, each kind against each other value */
        {"string as number", "{\"email\":1}", 0, ERR_INVALID_FIELD, "email"},
        {"string as bool", "{\"email\":true}", 0, ERR_INVALID_FIELD, "email"},
        {"string as array", "{\"email\":[\"x\"]}", 0, ERR_INVALID_FIELD, "email"},
        {"string as object", "{\"email\":{}}", 0, ERR_INVALID_FIELD, "email"},
        {"integer as real", "{\"email\":\"x\",\"count\":1.0}", 0, ERR_INVALID_FIELD, "count"},
        {"integer as exponent", "{\"email\":\"x\",\"count\":1e3}", 0, ERR_INVALID_FIELD, "count"},
        {"integer as string", "{\"email\":\"x\",\"count\":\"1\"}", 0, ERR_INVALID_FIELD, "count"},
        {"integer as bool", "{\"email\":\"x\",\"count\":true}", 0, ERR_INVALID_FIELD, "count"},
        {"bool as 0", "{\"email\":\"x\",\"admin\":0}", 0, ERR_INVALID_FIELD, "admin"},
        {"bool as string", "{\"email\":\"x\",\"admin\":\"true\"}", 0, ERR_INVALID_FIELD, "admin"},
        {"object as array", "{\"email\":\"x\",\"labels\":[]}", 0, ERR_INVALID_FIELD, "labels"},
        {"array as object", "{\"email\":\"x\",\"gpus\":{}}", 0, ERR_INVALID_FIELD, "gpus"},
        {"array as string", "{\"email\":\"x\",\"gpus\":\"0,1\"}", 0, ERR_INVALID_FIELD, "gpus"},

        /* string lengths are counted in bytes: name takes 8, email the default 256 */
        {"name at cap", "{\"email\":\"x\",\"name\":\"12345678\"}", 0, OK, ""},
        {"name over cap", "{\"email\":\"x\",\"name\":\"123456789\"}", 0, ERR_INVALID_FIELD, "name"},
        {"name multibyte at cap", "{\"email\":\"x\",\"name\":\"\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9\"}", 0, OK, ""},
        {"name multibyte over cap", "{\"email\":\"x\",\"name\":\"\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9" "a\"}", 0,
         ERR_INVALID_FIELD, "name"},
        {"name escapes over cap", "{\"email\":\"x\",\"name\":\"\\u00e9\\u00e9\\u00e9\\u00e9\\u00e9\"}", 0,
         ERR_INVALID_FIELD, "name"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++)
        check_case(&cases[i], fields, 16);
}

static void test_empty_body(void **state)
{
    (void)state;
    struct json_body_error e;
    /* An empty body is {}: fine when nothing is required, even with NULL text. */
    json_t *root = json_body_parse("", 0, optional_fields, 16, &e);
    assert_non_null(root);
    assert_true(json_is_object(root));
    assert_int_equal(json_object_size(root), 0);
    json_decref(root);
    root = json_body_parse(NULL, 0, optional_fields, 16, &e);
    assert_non_null(root);
    assert_int_equal(json_object_size(root), 0);
    json_decref(root);

    /* And with no fields declared at all, {} passes and any key is unknown. */
    static const struct json_field none[] = {{NULL, 0, 0, 0}};
    root = json_body_parse("{}", 2, none, 16, &e);
    assert_non_null(root);
    json_decref(root);
    assert_null(json_body_parse("{\"a\":1}", 7, none, 16, &e));
    assert_int_equal(e.code, ERR_UNKNOWN_FIELD);
    assert_string_equal(e.field, "a");
}

/* The length given is the body; bytes after it are never read. */
static void test_length_is_respected(void **state)
{
    (void)state;
    static const char text[] = "{\"email\":\"x\"}GARBAGE";
    struct json_body_error e;
    json_t *root = json_body_parse(text, 13, fields, 16, &e);
    assert_non_null(root);
    json_decref(root);
    assert_null(json_body_parse(text, 12, fields, 16, &e));
    assert_int_equal(e.code, ERR_MALFORMED_JSON);
    /* Not NUL-terminated: a heap copy with nothing after the body. */
    char *copy = malloc(13);
    assert_non_null(copy);
    memcpy(copy, text, 13);
    root = json_body_parse(copy, 13, fields, 16, &e);
    assert_non_null(root);
    json_decref(root);
    free(copy);
}

static void test_result(void **state)
{
    (void)state;
    static const char text[] = "{\"email\":\"a@b.c\",\"name\":null,\"count\":5,\"gpus\":null}";
    struct json_body_error e;
    json_t *root = json_body_parse(text, strlen(text), fields, 16, &e);
    assert_non_null(root);
    /* Explicit nulls are removed: absent and null read the same. */
    assert_int_equal(json_object_size(root), 2);
    assert_null(json_object_get(root, "name"));
    assert_null(json_object_get(root, "gpus"));
    assert_string_equal(json_string_value(json_object_get(root, "email")), "a@b.c");
    assert_int_equal(json_integer_value(json_object_get(root, "count")), 5);
    /* The caller owns the one reference. */
    assert_int_equal(root->refcount, 1);
    json_decref(root);
}

/* The depth counts nested objects and arrays; the top object is level 1. */
static void test_depth(void **state)
{
    (void)state;
    static const struct json_field any[] = {
        {"a", JSON_KIND_ARRAY, 0, 0},
        {"o", JSON_KIND_OBJECT, 0, 0},
        {"s", JSON_KIND_STRING, 0, 0},
        {NULL, 0, 0, 0},
    };
    static const struct { const char *text; int depth; } cases[] = {
        {"{}", 1},
        {"{\"a\":[]}", 2},
        {"{\"o\":{}}", 2},
        {"{\"a\":[1,[2]]}", 3},
        {"{\"a\":[[],[],[]]}", 3},
        {"{\"a\":[[[[]]]]}", 5},
        {"{\"o\":{\"x\":{\"y\":[{}]}}}", 5},
        {"{\"a\":[], \"o\":{}, \"s\":\"x\"}", 2},
        /* brackets inside strings do not count, escaped quotes included */
        {"{\"s\":\"[[[[[[[[[[{{{{{{{{{{\"}", 1},
        {"{\"s\":\"\\\"[[[[[[[[\"}", 1},
        {"{\"s\":\"\\\\\",\"a\":[[]]}", 3},
        {"{\"s\":\"\\\\\\\"[[[[[[\"}", 1},
        {"{\"[[[[[[\":1}", 1},
        {"{\"o\":{\"]]]]]]\":{}}}", 3},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        for (int cap = 1; cap <= 6; cap++) {
            struct json_body_error e;
            memset(&e, 0, sizeof e);
            json_t *root = json_body_parse(cases[i].text, strlen(cases[i].text), any, cap, &e);
            if (cases[i].depth <= cap) {
                /* Within the cap: not refused for depth (the field check may still refuse). */
                if (!root && e.code == ERR_TOO_DEEP)
                    fail_msg("'%s' (depth %d) refused at cap %d", cases[i].text, cases[i].depth, cap);
            } else {
                if (root || e.code != ERR_TOO_DEEP)
                    fail_msg("'%s' (depth %d) not refused at cap %d", cases[i].text, cases[i].depth, cap);
                assert_string_equal(e.field, "");
            }
            json_decref(root);
        }
    }
}

/* Far deeper than any cap, and deeper than jansson itself allows: refused
 * for depth by the pre-scan, before the parser recurses. */
static void test_depth_hostile(void **state)
{
    (void)state;
    size_t n = 100000;
    char *text = malloc(2 * n + 16);
    assert_non_null(text);
    size_t o = 0;
    text[o++] = '{';
    memcpy(text + o, "\"a\":", 4);
    o += 4;
    memset(text + o, '[', n);
    o += n;
    memset(text + o, ']', n);
    o += n;
    text[o++] = '}';
    struct json_body_error e;
    assert_null(json_body_parse(text, o, fields, 64, &e));
    assert_int_equal(e.code, ERR_TOO_DEEP);
    assert_non_null(strstr(e.message, "64"));
    /* Unbalanced closers and openers are still only malformed. */
    assert_null(json_body_parse("]]]]{}", 6, fields, 2, &e));
    assert_int_equal(e.code, ERR_MALFORMED_JSON);
    assert_null(json_body_parse(text, n / 2, fields, 64, &e));
    assert_int_equal(e.code, ERR_TOO_DEEP);
    free(text);
}

/* Raw bytes that are not UTF-8, inside a string value where jansson would
 * see them. Each is wrapped in {"email":"…"}. */
static void test_utf8(void **state)
{
    (void)state;
    static const struct { const char *bytes; int ok; } cases[] = {
        {"plain", 1},
        {"\xC2\x80", 1},                 /* U+0080, smallest 2-byte */
        {"\xDF\xBF", 1},                 /* U+07FF */
        {"\xE0\xA0\x80", 1},             /* U+0800, smallest 3-byte */
        {"\xED\x9F\xBF", 1},             /* U+D7FF, just below the surrogates */
        {"\xEE\x80\x80", 1},             /* U+E000, just above them */
        {"\xEF\xBF\xBD", 1},             /* U+FFFD */
        {"\xEF\xBF\xBF", 1},             /* U+FFFF */
        {"\xF0\x90\x80\x80", 1},         /* U+10000, smallest 4-byte */
        {"\xF0\x9F\x98\x80", 1},         /* an emoji */
        {"\xF4\x8F\xBF\xBF", 1},         /* U+10FFFF, the last */
        {"\x80", 0},                     /* lone continuation byte */
        {"\xBF", 0},
        {"a\xC3", 0},                    /* truncated 2-byte */
        {"\xE2\x82", 0},                 /* truncated 3-byte */
        {"\xF0\x9F\x98", 0},             /* truncated 4-byte */
        {"\xC3\x28", 0},                 /* bad continuation */
        {"\xE2\x28\xA1", 0},
        {"\xF0\x9F\x28\x80", 0},
        {"\xC0\x80", 0},                 /* overlong NUL */
        {"\xC0\xAF", 0},                 /* overlong '/' */
        {"\xC1\xBF", 0},                 /* overlong U+007F */
        {"\xE0\x80\xAF", 0},             /* overlong '/' in 3 bytes */
        {"\xE0\x9F\xBF", 0},             /* overlong U+07FF */
        {"\xF0\x80\x80\xAF", 0},         /* overlong '/' in 4 bytes */
        {"\xF0\x8F\xBF\xBF", 0},         /* overlong U+FFFF */
        {"\xED\xA0\x80", 0},             /* U+D800, high surrogate */
        {"\xED\xAD\xBF", 0},             /* U+DB7F */
        {"\xED\xB0\x80", 0},             /* U+DC00, low surrogate */
        {"\xED\xBF\xBF", 0},             /* U+DFFF */
        {"\xED\xA0\xBD\xED\xB8\x80", 0}, /* a surrogate pair in CESU-8 */
        {"\xF4\x90\x80\x80", 0},         /* U+110000, past the end */
        {"\xF5\x80\x80\x80", 0},
        {"\xF7\xBF\xBF\xBF", 0},
        {"\xF8\x88\x80\x80\x80", 0},     /* 5-byte form */
        {"\xFC\x84\x80\x80\x80\x80", 0}, /* 6-byte form */
        {"\xFE", 0},
        {"\xFF", 0},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char text[64];
        int n = snprintf(text, sizeof text, "{\"email\":\"%s\"}", cases[i].bytes);
        struct json_body_error e;
        memset(&e, 0, sizeof e);
        json_t *root = json_body_parse(text, (size_t)n, fields, 16, &e);
        if (cases[i].ok) {
            if (!root)
                fail_msg("case %zu refused: %s", i, e.message);
            assert_string_equal(json_string_value(json_object_get(root, "email")), cases[i].bytes);
            json_decref(root);
        } else {
            if (root || e.code != ERR_INVALID_ENCODING)
                fail_msg("case %zu: %s, code %d", i, root ? "accepted" : "refused", e.code);
            assert_string_equal(e.field, "");
            json_decref(root);
        }
        /* The same bytes in a key, and outside any string, are refused too. */
        if (!cases[i].ok) {
            n = snprintf(text, sizeof text, "{\"%s\":1}", cases[i].bytes);
            assert_null(json_body_parse(text, (size_t)n, fields, 16, &e));
            assert_int_equal(e.code, ERR_INVALID_ENCODING);
            n = snprintf(text, sizeof text, "{}%s", cases[i].bytes);
            assert_null(json_body_parse(text, (size_t)n, fields, 16, &e));
            assert_int_equal(e.code, ERR_INVALID_ENCODING);
        }
    }
}

/* Encoding is checked before depth and syntax, so the error names the
 * first problem a client must fix. */
static void test_error_precedence(void **state)
{
    (void)state;
    struct json_body_error e;
    assert_null(json_body_parse("[[[[\xFF", 5, fields, 2, &e));
    assert_int_equal(e.code, ERR_INVALID_ENCODING);
    assert_null(json_body_parse("[[[[ x", 6, fields, 2, &e));
    assert_int_equal(e.code, ERR_TOO_DEEP);
    /* Unknown fields are reported before missing ones. */
    assert_null(json_body_parse("{\"zz\":1}", 8, fields, 2, &e));
    assert_int_equal(e.code, ERR_UNKNOWN_FIELD);
    assert_string_equal(e.field, "zz");
}

/* A long unknown key is cut to fit e.field and the message stays a string. */
static void test_long_unknown_key(void **state)
{
    (void)state;
    char key[300], text[400];
    memset(key, 'k', sizeof key - 1);
    key[sizeof key - 1] = '\0';
    int n = snprintf(text, sizeof text, "{\"%s\":1}", key);
    struct json_body_error e;
    assert_null(json_body_parse(text, (size_t)n, fields, 16, &e));
    assert_int_equal(e.code, ERR_UNKNOWN_FIELD);
    assert_int_equal(strlen(e.field), sizeof e.field - 1);
    assert_memory_equal(e.field, key, sizeof e.field - 1);
    assert_true(strlen(e.message) < sizeof e.message);
}

/* Default string cap: 256 bytes when max_len is 0. */
static void test_default_string_cap(void **state)
{
    (void)state;
    for (size_t len = 250; len <= 260; len++) {
        char text[400];
        char value[300];
        memset(value, 'v', len);
        value[len] = '\0';
        int n = snprintf(text, sizeof text, "{\"email\":\"%s\"}", value);
        struct json_body_error e;
        json_t *root = json_body_parse(text, (size_t)n, fields, 16, &e);
        if (len <= 256) {
            assert_non_null(root);
        } else {
            assert_null(root);
            assert_int_equal(e.code, ERR_INVALID_FIELD);
            assert_string_equal(e.field, "email");
            assert_non_null(strstr(e.message, "256"));
        }
        json_decref(root);
    }
}

/* What Content-Type a body may come with: JSON by any spelling the media
 * type rules allow (RFC 9110 8.3.1: case-insensitive names, parameters,
 * quoted values), and nothing else, no type at all included. */
static void test_media_type(void **state)
{
    (void)state;
    static const char *const json[] = {
        "application/json",
        "Application/JSON",
        "application/json; charset=utf-8",
        "application/json;charset=UTF-8",
        "application/json ; charset=\"utf-8\"",
        "application/json; charset=utf-8;",
        "application/merge-patch+json",
        "application/vnd.gpurent.v1+json; profile=x",
        " application/json",
    };
    static const char *const other[] = {
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "text/plain",
        "text/plain; charset=utf-8",
        "text/json",
        "application/jsonx",
        "application/json-seq",
        "application/+json",
        "application/xml",
        "application/json; charset=iso-8859-1",
        "application/json; charset=\"utf-16\"",
        "application/json; charset",
        "application/json; charset=\"utf-8",
        "application/json, text/plain",
        "application/json garbage",
        "application",
        "",
        "*/*",
    };
    for (size_t i = 0; i < ARRAY_LEN(json); i++)
        if (!json_body_media_type_ok(json[i]))
            fail_msg("refused '%s'", json[i]);
    for (size_t i = 0; i < ARRAY_LEN(other); i++)
        if (json_body_media_type_ok(other[i]))
            fail_msg("took '%s'", other[i]);
    assert_false(json_body_media_type_ok(NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_empty_body),
        cmocka_unit_test(test_length_is_respected),
        cmocka_unit_test(test_result),
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_depth_hostile),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_error_precedence),
        cmocka_unit_test(test_long_unknown_key),
        cmocka_unit_test(test_default_string_cap),
        cmocka_unit_test(test_media_type),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
