/* fuzz_runspec.c: fuzz target for what a client says an instance runs
 * (runspec.c): a JSON object whose command, env, working_dir and image go
 * through the checks POST /v1/instances makes. A refusal names its field
 * and says why; an env taken comes back normalised (each secret a boolean)
 * and its public view holds no secret's value; a working_dir taken is an
 * absolute path with no '..' segment; an image reference taken names a
 * registry that is itself a valid registry entry, in lower case. */
#include "domain/domain.h"

#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_refusal(const struct op_outcome *o, const char *field)
{
    if (!o->failed || strcmp(o->field, field) != 0 || !o->message[0])
        abort();
}

static void check_env(const json_t *env)
{
    struct op_outcome o;
    memset(&o, 0, sizeof o);
    json_t *norm = NULL;
    if (run_env_check(env, &norm, &o) < 0) {
        check_refusal(&o, "env");
        if (norm)
            abort();
        return;
    }
    if (!env)
        return;
    if (!json_is_array(norm) || json_array_size(norm) != json_array_size(env))
        abort();
    size_t i;
    json_t *e;
    json_array_foreach(norm, i, e)
    {
        const char *why;
        const char *name = json_string_value(json_object_get(e, "name"));
        if (!name || !run_env_name_valid(name, strlen(name), &why) || !json_is_boolean(json_object_get(e, "secret")) ||
            !json_is_string(json_object_get(e, "value")))
            abort();
    }
    json_t *pub = run_env_public(norm);
    json_array_foreach(pub, i, e)
    {
        int secret = json_is_true(json_object_get(e, "secret"));
        if (secret && json_object_get(e, "value"))
            abort(); /* a secret's value never leaves */
        if (!secret && !json_equal(json_object_get(e, "value"), json_object_get(json_array_get(norm, i), "value")))
            abort();
    }
    json_decref(pub);
    /* Normalised, it passes again unchanged. */
    json_t *again = NULL;
    if (run_env_check(norm, &again, &o) < 0 || !json_equal(again, norm))
        abort();
    json_decref(again);
    json_decref(norm);
}

static void check_working_dir(const char *dir)
{
    struct op_outcome o;
    memset(&o, 0, sizeof o);
    if (run_working_dir_check(dir, &o) < 0) {
        check_refusal(&o, "working_dir");
        return;
    }
    if (!dir[0])
        return;
    if (dir[0] != '/' || strlen(dir) > RUN_WORKING_DIR_MAX)
        abort();
    for (const char *seg = dir; seg; seg = strchr(seg + 1, '/'))
        if (strncmp(seg, "/..", 3) == 0 && (seg[3] == '/' || seg[3] == '\0'))
            abort();
}

static void check_image(const char *ref)
{
    char registry[256];
    const char *why = NULL;
    if (image_ref_parse(ref, registry, sizeof registry, &why) < 0) {
        if (!why || !why[0])
            abort();
        return;
    }
    char bad[256];
    if (!registry[0] || !image_registries_valid(registry, bad, sizeof bad) ||
        !image_registry_listed(registry, registry))
        abort();
    for (const char *p = registry; *p; p++)
        if (isupper((unsigned char)*p))
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* As the API reads bodies: jansson, duplicates refused. */
    json_t *spec = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, NULL);
    if (!json_is_object(spec)) {
        json_decref(spec);
        return 0;
    }
    struct op_outcome o;
    memset(&o, 0, sizeof o);
    if (run_command_check(json_object_get(spec, "command"), &o) < 0)
        check_refusal(&o, "command");
    check_env(json_object_get(spec, "env"));
    const char *dir = json_string_value(json_object_get(spec, "working_dir"));
    if (dir)
        check_working_dir(dir);
    const char *image = json_string_value(json_object_get(spec, "image"));
    if (image)
        check_image(image);
    json_decref(spec);
    return 0;
}
