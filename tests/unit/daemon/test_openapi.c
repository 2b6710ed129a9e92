/* test_openapi.c: keeps docs/openapi.json (compiled into gpurentd as
 * embedded_openapi_json) true to the code. Every route in daemon_routes must
 * be documented under its exact pattern and method, with its {name} path
 * parameters and its auth level; every operation the document describes must
 * be a route; every error code the document names must exist in the
 * api_error table, with the HTTP status it is listed under (example error
 * bodies included); every tag an operation names must be declared; every
 * local $ref must resolve. A failure names each route or code at fault. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "gpurent/api_error.h"
#include "gpurentd.h"
#include "embedded.h"

static json_t *doc; /* the parsed document, owned by the group */

/* Prints one problem; tests count them and fail once, after listing all. */
static void problem(int *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(int *n, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "docs/openapi.json: %s\n", line);
    (*n)++;
}

static int setup(void **state)
{
    json_error_t err;
    doc = json_loads(embedded_openapi_json, JSON_REJECT_DUPLICATES, &err);
    if (!doc) {
        fprintf(stderr, "docs/openapi.json: not valid JSON at line %d column %d: %s\n", err.line, err.column,
                err.text);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    json_decref(doc);
    doc = NULL;
    return 0;
}

static const char *const http_methods[] = {"get", "put", "post", "delete", "options", "head", "patch", "trace", NULL};

static int is_http_method(const char *key)
{
    for (const char *const *m = http_methods; *m; m++)
        if (strcmp(*m, key) == 0)
            return 1;
    return 0;
}

static void lower(const char *in, char *out, size_t outlen)
{
    size_t i = 0;
    for (; in[i] && i + 1 < outlen; i++)
        out[i] = (char)tolower((unsigned char)in[i]);
    out[i] = '\0';
}

static const char *auth_name(enum http_auth a)
{
    switch (a) {
    case AUTH_NONE: return "none";
    case AUTH_USER: return "user";
    case AUTH_ADMIN: return "admin";
    case AUTH_SIGNED: return "signed";
    }
    return "?";
}

/* Resolves a local reference "#/a/b~1c" in the document; NULL if it does not
 * resolve. Borrowed. */
static json_t *resolve_pointer(const char *ref)
{
    if (strncmp(ref, "#/", 2) != 0)
        return NULL;
    json_t *node = doc;
    const char *p = ref + 2;
    while (node && *p) {
        char seg[256];
        size_t o = 0;
        for (; *p && *p != '/'; p++) {
            char c = *p;
            if (c == '~' && (p[1] == '0' || p[1] == '1'))
                c = *++p == '0' ? '~' : '/';
            if (o + 1 >= sizeof seg)
                return NULL;
            seg[o++] = c;
        }
        seg[o] = '\0';
        if (*p == '/')
            p++;
        node = json_is_object(node) ? json_object_get(node, seg) : NULL;
    }
    return node;
}

/* Follows $ref (several hops if need be). Borrowed; NULL if a hop breaks. */
static json_t *deref(json_t *node)
{
    for (int hops = 0; node && hops < 16; hops++) {
        json_t *ref = json_object_get(node, "$ref");
        if (!json_is_string(ref))
            return node;
        node = resolve_pointer(json_string_value(ref));
    }
    return NULL;
}

static const struct api_error_info *find_error(const char *code)
{
    for (int e = 0; e < ERR_COUNT; e++) {
        const struct api_error_info *info = api_error_info((enum api_error)e);
        if (strcmp(info->code, code) == 0)
            return info;
    }
    return NULL;
}

/* The route an operation documents. The HTTP layer answers HEAD with the
 * GET route and OPTIONS (the CORS preflight) on every path that has a
 * route, so those two stand for the path's GET route and its first one. */
static const struct http_route *find_route(const char *pattern, const char *method_lower)
{
    const char *want = strcmp(method_lower, "head") == 0 ? "get" : method_lower;
    for (const struct http_route *r = daemon_routes; r->method; r++) {
        char m[16];
        lower(r->method, m, sizeof m);
        if (strcmp(r->pattern, pattern) == 0 && (strcmp(m, want) == 0 || strcmp(method_lower, "options") == 0))
            return r;
    }
    return NULL;
}

/* Whether the parameter list (path-item or operation level) declares path
 * parameter name as required. */
static int declares_path_param(json_t *params, const char *name)
{
    size_t i;
    json_t *p;
    json_array_foreach(params, i, p) {
        json_t *d = deref(p);
        if (d && json_is_string(json_object_get(d, "in")) &&
            strcmp(json_string_value(json_object_get(d, "in")), "path") == 0 &&
            json_is_string(json_object_get(d, "name")) &&
            strcmp(json_string_value(json_object_get(d, "name")), name) == 0 &&
            json_is_true(json_object_get(d, "required")))
            return 1;
    }
    return 0;
}

/* Whether pattern has a {name} segment. */
static int pattern_has_param(const char *pattern, const char *name)
{
    char want[160];
    snprintf(want, sizeof want, "{%s}", name);
    return strstr(pattern, want) != NULL;
}

static void check_route(const struct http_route *r, int *n)
{
    char m[16];
    lower(r->method, m, sizeof m);
    json_t *item = json_object_get(json_object_get(doc, "paths"), r->pattern);
    json_t *op = item ? json_object_get(item, m) : NULL;
    if (!json_is_object(op)) {
        problem(n, "route %s %s (src/gpurentd/http/routes.c) is not documented: add paths[\"%s\"].%s", r->method,
                r->pattern, r->pattern, m);
        return;
    }

    /* Every {name} of the pattern is a required path parameter. */
    for (const char *p = strchr(r->pattern, '{'); p; p = strchr(p + 1, '{')) {
        const char *close = strchr(p, '}');
        if (!close)
            break;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(close - p - 1), p + 1);
        if (!declares_path_param(json_object_get(op, "parameters"), name) &&
            !declares_path_param(json_object_get(item, "parameters"), name))
            problem(n, "route %s %s: path parameter '%s' is not declared (in: path, required: true)", r->method,
                    r->pattern, name);
    }
    /* ... and no path parameter is declared that the pattern lacks. */
    json_t *lists[2] = {json_object_get(op, "parameters"), json_object_get(item, "parameters")};
    for (int k = 0; k < 2; k++) {
        size_t i;
        json_t *p;
        json_array_foreach(lists[k], i, p) {
            json_t *d = deref(p);
            const char *in = d ? json_string_value(json_object_get(d, "in")) : NULL;
            const char *name = d ? json_string_value(json_object_get(d, "name")) : NULL;
            if (in && name && strcmp(in, "path") == 0 && !pattern_has_param(r->pattern, name))
                problem(n, "route %s %s: declares path parameter '%s', which the pattern does not have", r->method,
                        r->pattern, name);
        }
    }

    /* The auth level is stated, and the security requirement agrees. */
    const char *auth = json_string_value(json_object_get(op, "x-gpurent-auth"));
    if (!auth || strcmp(auth, auth_name(r->auth)) != 0)
        problem(n, "route %s %s: x-gpurent-auth is \"%s\" but the route table says \"%s\"", r->method, r->pattern,
                auth ? auth : "(missing)", auth_name(r->auth));
    json_t *security = json_object_get(op, "security");
    if (!security)
        security = json_object_get(doc, "security");
    int open = !json_is_array(security) || json_array_size(security) == 0;
    /* A route that takes a key without needing one (the marketplace's
     * ?mine) lists the empty requirement {} beside bearerAuth. */
    int optional = 0;
    size_t i;
    json_t *req;
    json_array_foreach(json_is_array(security) ? security : NULL, i, req) optional |= json_object_size(req) == 0;
    if (r->auth == AUTH_NONE && !open && !optional)
        problem(n, "route %s %s needs no API key: give it \"security\": [] (or [{}, {\"bearerAuth\": []}])",
                r->method, r->pattern);
    if (r->auth != AUTH_NONE && open)
        problem(n, "route %s %s needs an API key: its security must name bearerAuth", r->method, r->pattern);
    /* The gateways' signed routes (issue 17) name their own scheme. */
    if (r->auth == AUTH_SIGNED && !open && !json_object_get(json_array_get(security, 0), "gatewaySignature"))
        problem(n, "route %s %s: its security requirement is not gatewaySignature", r->method, r->pattern);
    if (r->auth != AUTH_NONE && r->auth != AUTH_SIGNED && !open &&
        !json_object_get(json_array_get(security, 0), "bearerAuth"))
        problem(n, "route %s %s: its security requirement is not bearerAuth", r->method, r->pattern);

    /* At least one success reply is described (a redirect is the whole
     * answer of GET /, which sends browsers to the console; for the web
     * terminal's WebSocket, the protocol switch: 101). */
    int success = 0;
    const char *status;
    json_t *resp;
    json_object_foreach(json_object_get(op, "responses"), status, resp)
        if (status[0] == '2' || strcmp(status, "101") == 0 || (status[0] == '3' && strcmp(status, "304") != 0))
            success = 1;
    if (!success)
        problem(n, "route %s %s documents no 2xx response", r->method, r->pattern);
}

static void test_document_shape(void **state)
{
    assert_string_equal(json_string_value(json_object_get(doc, "openapi")), "3.0.3");
    assert_true(json_is_object(json_object_get(doc, "info")));
    assert_true(json_is_object(json_object_get(doc, "paths")));
    json_t *bearer = resolve_pointer("#/components/securitySchemes/bearerAuth");
    assert_non_null(bearer);
    assert_string_equal(json_string_value(json_object_get(bearer, "type")), "http");
    assert_string_equal(json_string_value(json_object_get(bearer, "scheme")), "bearer");
    assert_non_null(resolve_pointer("#/components/schemas/Error/properties/error/properties/code"));
}

static void test_every_route_is_documented(void **state)
{
    int n = 0, routes = 0;
    for (const struct http_route *r = daemon_routes; r->method; r++, routes++)
        check_route(r, &n);
    assert_true(routes > 0);
    if (n)
        fail_msg("%d problem(s) between src/gpurentd/http/routes.c and docs/openapi.json (listed above)", n);
}

static void test_every_operation_is_a_route(void **state)
{
    int n = 0;
    const char *path;
    json_t *item;
    json_object_foreach(json_object_get(doc, "paths"), path, item) {
        const char *key;
        json_t *op;
        int ops = 0;
        json_object_foreach(item, key, op) {
            if (!is_http_method(key))
                continue;
            ops++;
            if (!find_route(path, key))
                problem(&n, "documents %s %s, which is not in daemon_routes (src/gpurentd/http/routes.c): remove it or "
                            "add the route", key, path);
        }
        if (!ops)
            problem(&n, "paths[\"%s\"] has no operation", path);
    }
    if (n)
        fail_msg("%d stale operation(s) in docs/openapi.json (listed above)", n);
}

static void test_operation_ids_are_unique(void **state)
{
    int n = 0;
    json_t *seen = json_object();
    const char *path;
    json_t *item;
    json_object_foreach(json_object_get(doc, "paths"), path, item) {
        const char *key;
        json_t *op;
        json_object_foreach(item, key, op) {
            if (!is_http_method(key))
                continue;
            const char *id = json_string_value(json_object_get(op, "operationId"));
            if (!id)
                problem(&n, "%s %s has no operationId", key, path);
            else if (json_object_get(seen, id))
                problem(&n, "operationId %s is used twice (again by %s %s)", id, key, path);
            else
                json_object_set_new(seen, id, json_true());
        }
    }
    json_decref(seen);
    if (n)
        fail_msg("%d operationId problem(s) (listed above)", n);
}

/* The ErrorCode enum lists exactly the api_error table. */
static void test_error_code_enum_matches_table(void **state)
{
    int n = 0;
    json_t *codes = resolve_pointer("#/components/schemas/ErrorCode/enum");
    if (!json_is_array(codes))
        fail_msg("components.schemas.ErrorCode.enum is missing");
    size_t i;
    json_t *c;
    json_array_foreach(codes, i, c) {
        if (!json_is_string(c) || !find_error(json_string_value(c)))
            problem(&n, "error code \"%s\" is listed in ErrorCode but not in src/common/api_error.c",
                    json_is_string(c) ? json_string_value(c) : "(not a string)");
    }
    for (int e = 0; e < ERR_COUNT; e++) {
        const char *code = api_error_info((enum api_error)e)->code;
        int found = 0;
        json_array_foreach(codes, i, c)
            if (json_is_string(c) && strcmp(json_string_value(c), code) == 0)
                found = 1;
        if (!found)
            problem(&n, "error code \"%s\" (src/common/api_error.c) is missing from ErrorCode.enum", code);
    }
    /* The Error schema's code is that enum. */
    json_t *code_schema = deref(resolve_pointer("#/components/schemas/Error/properties/error/properties/code"));
    if (code_schema != resolve_pointer("#/components/schemas/ErrorCode"))
        problem(&n, "Error.error.code must be {\"$ref\": \"#/components/schemas/ErrorCode\"}");
    if (n)
        fail_msg("%d error code problem(s) (listed above)", n);
}

/* Walks every value of the document, calling fn on each object. */
static void walk(json_t *node, void (*fn)(json_t *obj, int *n), int *n)
{
    if (json_is_object(node)) {
        fn(node, n);
        const char *k;
        json_t *v;
        json_object_foreach(node, k, v)
            walk(v, fn, n);
    } else if (json_is_array(node)) {
        size_t i;
        json_t *v;
        json_array_foreach(node, i, v)
            walk(v, fn, n);
    }
}

/* x-error-codes lists and {"error": {"code": ...}} examples name real codes. */
static void check_codes_in(json_t *obj, int *n)
{
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(obj, "x-error-codes"), i, c) {
        if (!json_is_string(c) || !find_error(json_string_value(c)))
            problem(n, "x-error-codes names \"%s\", which src/common/api_error.c does not have",
                    json_is_string(c) ? json_string_value(c) : "(not a string)");
    }
    json_t *err = json_object_get(obj, "error");
    json_t *code = json_is_object(err) ? json_object_get(err, "code") : NULL;
    if (json_is_string(code) && !find_error(json_string_value(code)))
        problem(n, "an example error has code \"%s\", which src/common/api_error.c does not have",
                json_string_value(code));
}

static void test_error_codes_exist(void **state)
{
    int n = 0;
    walk(doc, check_codes_in, &n);
    if (n)
        fail_msg("%d unknown error code(s) in docs/openapi.json (listed above)", n);
}

/* An error response documented under status S lists only codes whose
 * status is S, so a client can trust the pairing. */
static void test_error_codes_match_status(void **state)
{
    int n = 0;
    const char *path;
    json_t *item;
    json_object_foreach(json_object_get(doc, "paths"), path, item) {
        const char *method;
        json_t *op;
        json_object_foreach(item, method, op) {
            if (!is_http_method(method))
                continue;
            const char *status;
            json_t *resp;
            json_object_foreach(json_object_get(op, "responses"), status, resp) {
                json_t *d = deref(resp);
                char *end;
                long st = strtol(status, &end, 10);
                if (!d || *end)
                    continue; /* "default", or a broken $ref reported elsewhere */
                size_t i;
                json_t *c;
                json_array_foreach(json_object_get(d, "x-error-codes"), i, c) {
                    const struct api_error_info *info = find_error(json_string_value(c) ? json_string_value(c) : "");
                    if (info && (long)info->status != st)
                        problem(&n, "%s %s lists \"%s\" under %ld, but that code is sent with status %u", method,
                                path, info->code, st, info->status);
                }
            }
        }
    }
    if (n)
        fail_msg("%d error code(s) under the wrong status (listed above)", n);
}

/* Whether an x-error-codes array lists code. */
static int lists_code(json_t *codes, const char *code)
{
    size_t i;
    json_t *c;
    json_array_foreach(codes, i, c)
        if (json_is_string(c) && strcmp(json_string_value(c), code) == 0)
            return 1;
    return 0;
}

/* What the HTTP layer refuses before any route runs (a NUL byte in the target,
 * a header that may be given once given twice: src/common/http_guard.c and
 * http.c) is 400 bad_request on every operation, so a 400 that lists its
 * codes lists that one too: a client that trusts the list must not meet a
 * code it was not told of. */
static void test_every_400_lists_bad_request(void **state)
{
    int n = 0;
    const char *path;
    json_t *item;
    json_object_foreach(json_object_get(doc, "paths"), path, item) {
        const char *method;
        json_t *op;
        json_object_foreach(item, method, op) {
            if (!is_http_method(method))
                continue;
            json_t *d = deref(json_object_get(json_object_get(op, "responses"), "400"));
            json_t *codes = d ? json_object_get(d, "x-error-codes") : NULL;
            if (!json_is_array(codes))
                continue;
            if (!lists_code(codes, "bad_request"))
                problem(&n, "%s %s: its 400 lists codes but not bad_request, which any route may answer", method,
                        path);
        }
    }
    if (n)
        fail_msg("%d operation(s) whose 400 leaves out bad_request (listed above)", n);
}

/* An example error body under a documented status has a code sent with that
 * status, and one the response lists in x-error-codes when it lists any. */
static void check_example_error(const char *method, const char *path, long st, json_t *codes, json_t *value, int *n)
{
    json_t *err = json_is_object(value) ? json_object_get(value, "error") : NULL;
    const char *code = json_is_object(err) ? json_string_value(json_object_get(err, "code")) : NULL;
    if (!code)
        return;
    const struct api_error_info *info = find_error(code);
    if (info && (long)info->status != st)
        problem(n, "%s %s: an example under %ld has code \"%s\", which is sent with status %u", method, path, st, code,
                info->status);
    if (json_is_array(codes) && !lists_code(codes, code))
        problem(n, "%s %s: an example under %ld has code \"%s\", which its x-error-codes does not list", method, path,
                st, code);
}

static void test_error_examples_match_status(void **state)
{
    int n = 0;
    const char *path;
    json_t *item;
    json_object_foreach(json_object_get(doc, "paths"), path, item) {
        const char *method;
        json_t *op;
        json_object_foreach(item, method, op) {
            if (!is_http_method(method))
                continue;
            const char *status;
            json_t *resp;
            json_object_foreach(json_object_get(op, "responses"), status, resp) {
                json_t *d = deref(resp);
                char *end;
                long st = strtol(status, &end, 10);
                if (!d || *end)
                    continue;
                json_t *codes = json_object_get(d, "x-error-codes");
                const char *type;
                json_t *media;
                json_object_foreach(json_object_get(d, "content"), type, media) {
                    check_example_error(method, path, st, codes, json_object_get(media, "example"), &n);
                    const char *name;
                    json_t *ex;
                    json_object_foreach(json_object_get(media, "examples"), name, ex)
                        check_example_error(method, path, st, codes, json_object_get(deref(ex), "value"), &n);
                }
            }
        }
    }
    if (n)
        fail_msg("%d example error(s) under the wrong status (listed above)", n);
}

/* Every tag an operation names is declared in the document's tags, where
 * its description lives. */
static void test_operation_tags_are_declared(void **state)
{
    int n = 0;
    json_t *declared = json_object();
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(doc, "tags"), i, t) {
        const char *name = json_string_value(json_object_get(t, "name"));
        if (name)
            json_object_set_new(declared, name, json_true());
    }
    const char *path;
    json_t *item;
    json_object_foreach(json_object_get(doc, "paths"), path, item) {
        const char *method;
        json_t *op;
        json_object_foreach(item, method, op) {
            if (!is_http_method(method))
                continue;
            json_array_foreach(json_object_get(op, "tags"), i, t) {
                if (!json_is_string(t) || !json_object_get(declared, json_string_value(t)))
                    problem(&n, "%s %s has tag \"%s\", which the document's tags do not declare", method, path,
                            json_is_string(t) ? json_string_value(t) : "(not a string)");
            }
        }
    }
    json_decref(declared);
    if (n)
        fail_msg("%d undeclared tag(s) (listed above)", n);
}

static void check_ref(json_t *obj, int *n)
{
    json_t *ref = json_object_get(obj, "$ref");
    if (ref && (!json_is_string(ref) || !resolve_pointer(json_string_value(ref))))
        problem(n, "$ref \"%s\" does not resolve inside the document",
                json_is_string(ref) ? json_string_value(ref) : "(not a string)");
}

static void test_refs_resolve(void **state)
{
    int n = 0;
    walk(doc, check_ref, &n);
    if (n)
        fail_msg("%d broken $ref(s) (listed above)", n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_document_shape),
        cmocka_unit_test(test_every_route_is_documented),
        cmocka_unit_test(test_every_operation_is_a_route),
        cmocka_unit_test(test_operation_ids_are_unique),
        cmocka_unit_test(test_error_code_enum_matches_table),
        cmocka_unit_test(test_error_codes_exist),
        cmocka_unit_test(test_error_codes_match_status),
        cmocka_unit_test(test_error_examples_match_status),
        cmocka_unit_test(test_every_400_lists_bad_request),
        cmocka_unit_test(test_operation_tags_are_declared),
        cmocka_unit_test(test_refs_resolve),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
