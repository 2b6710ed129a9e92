/* json_body.h: request bodies checked against a declared list of fields:
 * size and nesting are bounded, the text must be UTF-8 and one JSON object
 * without duplicate keys, every field must be known and of its declared
 * type, and required fields must be present. Used by http_json_body(). */
#ifndef GPURENT_JSON_BODY_H
#define GPURENT_JSON_BODY_H

#include <jansson.h>
#include <stddef.h>

#include "gpurent/api_error.h"

enum json_kind { JSON_KIND_STRING, JSON_KIND_INTEGER, JSON_KIND_BOOLEAN, JSON_KIND_OBJECT, JSON_KIND_ARRAY };

/* One field a JSON body may carry. */
struct json_field {
    const char *name;    /* key */
    enum json_kind kind; /* required JSON type */
    int required;        /* absent is an error */
    size_t max_len;      /* strings: longest accepted in bytes (0 = 256) */
};

/* Why a body was refused. */
struct json_body_error {
    enum api_error code; /* e.g. ERR_UNKNOWN_FIELD */
    char field[80];      /* the field at fault, or "" */
    char message[256];   /* a sentence for the client */
};

/* Whether a request's Content-Type value says its body is JSON:
 * application/json or a structured application/...+json type, in any case,
 * with parameters, of which a charset must be UTF-8. NULL (no Content-Type)
 * is not: RFC 9110 8.3 lets a recipient take such content for
 * application/octet-stream, and guessing could read a form as JSON. */
int json_body_media_type_ok(const char *content_type);

/* Parses text (len bytes; empty means {}) against fields, which ends with a
 * {NULL} row. Returns a new reference, or NULL with e filled in. An explicit
 * null counts as absent and is removed from the result. */
json_t *json_body_parse(const char *text, size_t len, const struct json_field *fields, int max_depth,
                        struct json_body_error *e);

#endif
