/* fuzz_json_body.c: fuzz target for request bodies (json_body_parse) and
 * the Content-Type test in front of them: whatever the bytes, a body is
 * either a JSON object of the declared fields or a refusal with a message. */
#include "gpurent/json_body.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const struct json_field fields[] = {
    {"name", JSON_KIND_STRING, 1, 64},
    {"cards", JSON_KIND_INTEGER, 0, 0},
    {"spot", JSON_KIND_BOOLEAN, 0, 0},
    {"env", JSON_KIND_OBJECT, 0, 0},
    {"ports", JSON_KIND_ARRAY, 0, 0},
    {NULL, 0, 0, 0},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct json_body_error e;
    json_t *body = json_body_parse((const char *)data, size, fields, 4, &e);
    if (body) {
        if (!json_is_object(body) || !json_is_string(json_object_get(body, "name")))
            abort();
        json_decref(body);
    } else if (!e.message[0]) {
        abort(); /* every refusal says why */
    }
    /* The same bytes as a Content-Type value (a C string: up to a NUL). */
    char type[256];
    size_t n = size < sizeof type - 1 ? size : sizeof type - 1;
    memcpy(type, data, n);
    type[n] = '\0';
    (void)json_body_media_type_ok(type);
    return 0;
}
