/* json_body.c: checks a request body against an endpoint's declared fields
 * (see json_body.h); pure, so it is unit-tested without a server. */
#include "gpurent/json_body.h"
#include "gpurent/utf8.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Deepest nesting of arrays and objects, skipping strings; scanned before
 * parsing so a hostile body cannot make the parser recurse deeply. */
static int json_depth(const char *s, size_t n, int cap)
{
    int depth = 0, max = 0, in_string = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = 0;
        } else if (c == '"') {
            in_string = 1;
        } else if (c == '{' || c == '[') {
            if (++depth > max)
                max = depth;
            if (max > cap)
                return max;
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    return max;
}

static const char *kind_name(enum json_kind k)
{
    switch (k) {
    case JSON_KIND_STRING: return "a string";
    case JSON_KIND_INTEGER: return "an integer";
    case JSON_KIND_BOOLEAN: return "true or false";
    case JSON_KIND_OBJECT: return "an object";
    case JSON_KIND_ARRAY: return "an array";
    }
    return "?";
}

static int kind_matches(json_t *v, enum json_kind k)
{
    switch (k) {
    case JSON_KIND_STRING: return json_is_string(v);
    case JSON_KIND_INTEGER: return json_is_integer(v);
    case JSON_KIND_BOOLEAN: return json_is_boolean(v);
    case JSON_KIND_OBJECT: return json_is_object(v);
    case JSON_KIND_ARRAY: return json_is_array(v);
    }
    return 0;
}

static json_t *fail(struct json_body_error *e, json_t *root, enum api_error code, const char *field,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Records the error, frees root, and returns NULL for the caller to pass on. */
static json_t *fail(struct json_body_error *e, json_t *root, enum api_error code, const char *field,
                    const char *fmt, ...)
{
    e->code = code;
    snprintf(e->field, sizeof e->field, "%s", field ? field : "");
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->message, sizeof e->message, fmt, ap);
        va_end(ap);
    } else {
        snprintf(e->message, sizeof e->message, "%s", api_error_info(code)->message);
    }
    json_decref(root);
    return NULL;
}

/* jansson reports a duplicate as "duplicate object key near '"KEY"'": the
 * token is the key as JSON, decoded here so the error can name the field. */
static int duplicate_key_name(const char *text, char *out, size_t n)
{
    const char *tok = strstr(text, "near '");
    if (!tok)
        return -1;
    tok += 6;
    size_t len = strlen(tok);
    if (len < 3 || tok[len - 1] != '\'')
        return -1;
    json_t *k = json_loadb(tok, len - 1, JSON_DECODE_ANY, NULL);
    int ok = json_is_string(k) && json_string_length(k) < n;
    if (ok)
        snprintf(out, n, "%s", json_string_value(k));
    json_decref(k);
    return ok ? 0 : -1;
}

/* Length of the token (RFC 9110 5.6.2) at s; 0 if none is there. */
static size_t token_len(const char *s)
{
    return strspn(s, "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz");
}

int json_body_media_type_ok(const char *content_type)
{
    if (!content_type)
        return 0;
    const char *p = content_type + strspn(content_type, " \t");
    if (token_len(p) != 11 || strncasecmp(p, "application/", 12) != 0)
        return 0;
    p += 12;
    size_t n = token_len(p);
    int json = (n == 4 && strncasecmp(p, "json", 4) == 0) || (n > 5 && strncasecmp(p + n - 5, "+json", 5) == 0);
    if (!json)
        return 0;
    /* parameters = *( OWS ";" OWS [ name "=" ( token / quoted-string ) ] ) */
    for (p += n;;) {
        p += strspn(p, " \t");
        if (!*p)
            return 1;
        if (*p++ != ';')
            return 0;
        p += strspn(p, " \t");
        if (!*p || *p == ';')
            continue;
        const char *name = p;
        size_t name_len = token_len(p);
        if (name_len == 0 || p[name_len] != '=')
            return 0;
        p += name_len + 1;
        const char *value = p;
        size_t value_len;
        if (*p == '"') {
            value = ++p;
            while (*p && *p != '"')
                p += p[0] == '\\' && p[1] ? 2 : 1;
            if (*p != '"')
                return 0;
            value_len = (size_t)(p++ - value);
        } else {
            value_len = token_len(p);
            if (value_len == 0)
                return 0;
            p += value_len;
        }
        /* JSON is UTF-8 (RFC 8259 8.1): a body that says it is not is not
         * read as if it were. */
        if (name_len == 7 && strncasecmp(name, "charset", 7) == 0 &&
            !(value_len == 5 && strncasecmp(value, "utf-8", 5) == 0))
            return 0;
    }
}

json_t *json_body_parse(const char *text, size_t len, const struct json_field *fields, int max_depth,
                        struct json_body_error *e)
{
    json_t *root;
    if (len == 0) {
        root = json_object();
    } else {
        if (!utf8_valid(text, len))
            return fail(e, NULL, ERR_INVALID_ENCODING, NULL, NULL);
        if (json_depth(text, len, max_depth) > max_depth)
            return fail(e, NULL, ERR_TOO_DEEP, NULL, "the request body is nested deeper than %d levels", max_depth);
        json_error_t jerr;
        /* DECODE_ANY so that a bare 42 or "x" is reported as valid JSON that
         * is not an object, rather than as malformed. */
        root = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
        if (!root && json_error_code(&jerr) == json_error_duplicate_key) {
            char key[80];
            int named = duplicate_key_name(jerr.text, key, sizeof key) == 0;
            return fail(e, NULL, ERR_DUPLICATE_KEY, named ? key : NULL, "key '%.64s' appears twice in an object",
                        named ? key : "?");
        }
        if (!root)
            return fail(e, NULL, ERR_MALFORMED_JSON, NULL, "malformed JSON at line %d column %d: %s", jerr.line,
                        jerr.column, jerr.text);
    }
    if (!json_is_object(root))
        return fail(e, root, ERR_NOT_AN_OBJECT, NULL, NULL);
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        const struct json_field *f = fields;
        while (f->name && strcmp(f->name, key) != 0)
            f++;
        if (!f->name)
            return fail(e, root, ERR_UNKNOWN_FIELD, key, "unknown field '%.64s'", key);
    }
    for (const struct json_field *f = fields; f->name; f++) {
        json_t *v = json_object_get(root, f->name);
        if (!v || json_is_null(v)) {
            if (f->required)
                return fail(e, root, ERR_MISSING_FIELD, f->name, "field '%s' is required", f->name);
            if (v) /* an explicit null is the same as absent */
                json_object_del(root, f->name);
            continue;
        }
        if (!kind_matches(v, f->kind))
            return fail(e, root, ERR_INVALID_FIELD, f->name, "field '%s' must be %s", f->name, kind_name(f->kind));
        size_t max_len = f->max_len ? f->max_len : 256;
        if (f->kind == JSON_KIND_STRING && json_string_length(v) > max_len)
            return fail(e, root, ERR_INVALID_FIELD, f->name, "field '%s' is longer than %zu bytes", f->name, max_len);
    }
    return root;
}
