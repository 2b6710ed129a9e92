/* instance_run.c: what an instance runs, in the database: command, env and
 * working_dir stored at create and shown (secret values never), the image
 * policy that decides which images may run, and PATCH /v1/instances/{id},
 * which changes such fields only while the instance is stopped (its name,
 * a label, at any time before it is terminated), driven by a table of
 * fields that later fields join as rows. */
#include "domain/domain.h"
#include "gpurent/clock.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int instance_image_resolve(struct store *s, const char *image, const struct gpu_type *t, char ref_out[256],
                           struct op_outcome *o)
{
    struct image img;
    int rc = store_image_find(s, image, &img);
    if (rc == STORE_OK) {
        if (strcmp(img.stack, t->stack) != 0)
            return op_refuse(o, ERR_STACK_MISMATCH, "image", NULL, "%s is a %s image but %s cards run %s", img.ref,
                          img.stack, t->code, t->stack);
        snprintf(ref_out, 256, "%s", img.ref);
        return STORE_OK;
    }
    if (rc != STORE_NOT_FOUND)
        return rc;
    if (strcmp(daemon_config->image_policy, "registries") != 0)
        return op_refuse(o, ERR_INVALID_FIELD, "image", NULL, "no image %.64s; see GET /v1/images", image);
    char registry[256];
    const char *why;
    if (image_ref_parse(image, registry, sizeof registry, &why) < 0)
        return op_refuse(o, ERR_INVALID_FIELD, "image", NULL,
                      "image %.64s is not in the catalog and not a valid reference: it %s", image, why);
    if (!image_registry_listed(registry, daemon_config->image_registries))
        return op_refuse(o, ERR_INVALID_FIELD, "image", json_pack("{s:s}", "registry", registry),
                      "image %.64s is from registry %s, which is not allowed here (allowed: %.120s)", image, registry,
                      daemon_config->image_registries);
    /* A user's own image runs the cards' stack: nothing else could. */
    snprintf(ref_out, 256, "%s", image);
    return STORE_OK;
}

int instance_run_store(struct store *s, const char *instance_id, const json_t *command, const json_t *env,
                       const char *working_dir)
{
    int rc = STORE_OK;
    if (command && json_array_size(command) > 0) {
        char *text = json_dumps(command, JSON_COMPACT);
        rc = text ? store_instance_set_command(s, instance_id, text) : STORE_ERROR;
        free(text);
    }
    if (rc == STORE_OK && env && json_array_size(env) > 0) {
        char *text = json_dumps(env, JSON_COMPACT);
        rc = text ? store_instance_set_env(s, instance_id, text) : STORE_ERROR;
        free(text);
    }
    if (rc == STORE_OK && working_dir && working_dir[0])
        rc = store_instance_set_working_dir(s, instance_id, working_dir);
    return rc;
}

void instance_run_json(const struct instance_run *r, json_t *j)
{
    json_t *command = NULL, *env = NULL;
    if (r) {
        command = r->command ? json_loads(r->command, 0, NULL) : NULL;
        json_t *stored = r->env ? json_loads(r->env, 0, NULL) : NULL;
        env = run_env_public(stored);
        json_decref(stored);
    }
    json_object_set_new(j, "command", command ? command : json_null());
    json_object_set_new(j, "env", env ? env : json_array());
    json_object_set_new(j, "working_dir", json_string(r && r->working_dir[0] ? r->working_dir : ""));
}

/* ------------------------------------------------------------ PATCH rows */

static int check_image(const json_t *v, struct op_outcome *o)
{
    return 0; /* the policy needs the store: apply decides */
}

static int apply_image(struct store *s, const struct instance *in, const json_t *v, struct op_outcome *o)
{
    struct gpu_type t;
    char ref[256];
    int rc = store_gpu_type_row(s, in->gpu_model, &t);
    if (rc != STORE_OK)
        return rc;
    if ((rc = instance_image_resolve(s, json_string_value(v), &t, ref, o)) != STORE_OK)
        return rc;
    return store_instance_set_image(s, in->id, ref);
}

static int check_command(const json_t *v, struct op_outcome *o)
{
    return run_command_check(v, o);
}

static int apply_command(struct store *s, const struct instance *in, const json_t *v, struct op_outcome *o)
{
    if (json_array_size(v) == 0)
        return store_instance_set_command(s, in->id, NULL); /* back to the image's own */
    char *text = json_dumps(v, JSON_COMPACT);
    int rc = text ? store_instance_set_command(s, in->id, text) : STORE_ERROR;
    free(text);
    return rc;
}

static int check_env(const json_t *v, struct op_outcome *o)
{
    json_t *norm = NULL;
    int rc = run_env_check(v, &norm, o);
    json_decref(norm);
    return rc;
}

/* The whole env is replaced: a secret entry must be given again with its
 * value, since no client can read it back to merge. */
static int apply_env(struct store *s, const struct instance *in, const json_t *v, struct op_outcome *o)
{
    json_t *norm = NULL;
    if (run_env_check(v, &norm, o) < 0)
        return REFUSED;
    char *text = json_dumps(norm, JSON_COMPACT);
    json_decref(norm);
    int rc = text ? store_instance_set_env(s, in->id, text) : STORE_ERROR;
    free(text);
    return rc;
}

static int check_working_dir(const json_t *v, struct op_outcome *o)
{
    return run_working_dir_check(json_string_value(v), o);
}

static int apply_working_dir(struct store *s, const struct instance *in, const json_t *v, struct op_outcome *o)
{
    return store_instance_set_working_dir(s, in->id, json_string_value(v));
}

static int check_restart_policy(const json_t *v, struct op_outcome *o)
{
    if (instance_restart_policy_valid(json_string_value(v)))
        return 0;
    op_refuse(o, ERR_INVALID_FIELD, "restart_policy", NULL, "restart_policy must be never, on_failure or always");
    return -1;
}

/* The two job fields share one setter; each reads the other as it is now,
 * so a PATCH naming both keeps both. */
static int apply_restart_policy(struct store *s, const struct instance *in, const json_t *v, struct op_outcome *o)
{
    struct instance now;
    int rc = store_instance_get(s, NULL, in->id, &now);
    return rc != STORE_OK ? rc : store_instance_set_job(s, in->id, json_string_value(v), now.max_runtime_minutes);
}

static int check_max_runtime(const json_t *v, struct op_outcome *o)
{
    /* 0 takes the bound away (an explicit null reads as absent here, as
     * [] and "" give command and working_dir back to the image). */
    json_int_t m = json_integer_value(v);
    if (json_is_integer(v) && m >= 0 && m <= INSTANCE_MAX_RUNTIME_MINUTES)
        return 0;
    op_refuse(o, ERR_INVALID_FIELD, "max_runtime_minutes", NULL,
           "max_runtime_minutes must be an integer from 1 to %d (30 days), or 0 for no bound",
           INSTANCE_MAX_RUNTIME_MINUTES);
    return -1;
}

static int apply_max_runtime(struct store *s, const struct instance *in, const json_t *v, struct op_outcome *o)
{
    struct instance now;
    int rc = store_instance_get(s, NULL, in->id, &now);
    return rc != STORE_OK ? rc
                          : store_instance_set_job(s, in->id, now.restart_policy[0] ? now.restart_policy : "never",
                                                   json_integer_value(v));
}

static int check_rendezvous(const json_t *v, struct op_outcome *o)
{
    json_int_t t = json_integer_value(v);
    if (json_is_integer(v) && t >= 30 && t <= 3600)
        return 0;
    op_refuse(o, ERR_INVALID_FIELD, "rendezvous_timeout_s", NULL,
           "rendezvous_timeout_s must be an integer number of seconds from 30 to 3600");
    return -1;
}

static int apply_rendezvous(struct store *s, const struct instance *in, const json_t *v, struct op_outcome *o)
{
    return store_instance_set_rendezvous_timeout(s, in->id, json_integer_value(v));
}

/* The name is the owner's label (at most 63 bytes, "" for none, as at
 * create): nothing the instance runs reads it, so it may change while it
 * runs. */
static int check_name(const json_t *v, struct op_outcome *o)
{
    return 0;
}

static int apply_name(struct store *s, const struct instance *in, const json_t *v, struct op_outcome *o)
{
    return store_instance_set_name(s, in->id, json_string_value(v));
}

const struct instance_patch_field instance_patch_fields[] = {
    {"name",                 JSON_KIND_STRING,  63,   check_name,           apply_name,           1},
    {"image",                JSON_KIND_STRING,  255,  check_image,          apply_image,          0},
    {"command",              JSON_KIND_ARRAY,   0,    check_command,        apply_command,        0},
    {"env",                  JSON_KIND_ARRAY,   0,    check_env,            apply_env,            0},
    {"working_dir",          JSON_KIND_STRING,  4096, check_working_dir,    apply_working_dir,    0},
    {"restart_policy",       JSON_KIND_STRING,  16,   check_restart_policy, apply_restart_policy, 0},
    {"max_runtime_minutes",  JSON_KIND_INTEGER, 0,    check_max_runtime,    apply_max_runtime,    0},
    {"rendezvous_timeout_s", JSON_KIND_INTEGER, 0,    check_rendezvous,     apply_rendezvous,     0},
    {NULL,                   0,                 0,    NULL,                 NULL,                 0},
};

/* The body's first field that the instance's state does not let change,
 * or NULL: any once it is terminated or on its way there (gone), a field
 * other than a label while something may run. A running job reads its
 * spec once, at start: a change now would show what does not run. Settled
 * states (stopped, a job's succeeded or failed, and lost, which a stop
 * refuses) are where nothing runs and the next start reads it: a job lost
 * with its node is resumed from a checkpoint by changing its command and
 * starting it again. */
static const char *field_held(const struct instance *in, int gone, const json_t *body)
{
    int settled = strcmp(in->state, "stopped") == 0 || strcmp(in->state, "succeeded") == 0 ||
                  strcmp(in->state, "failed") == 0 || strcmp(in->state, "lost") == 0;
    for (const struct instance_patch_field *f = instance_patch_fields; f->name; f++)
        if (json_object_get(body, f->name) && (gone || (!f->any_state && !settled)))
            return f->name;
    return NULL;
}

int instance_patch(struct store *s, const char *user_id, const char *id, const json_t *body, struct op_outcome *o)
{
    struct instance in;
    int rc = id_valid("ins", id) ? store_instance_get(s, user_id, id, &in) : STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND)
        return op_refuse(o, ERR_NOT_FOUND, NULL, NULL, "no instance %.32s", id);
    if (rc != STORE_OK)
        return rc;
    int gone = strcmp(in.state, "terminated") == 0 || strcmp(in.desired, "terminated") == 0;
    const char *held = field_held(&in, gone, body);
    if (held && gone)
        return op_refuse(o, ERR_INVALID_STATE, NULL, json_pack("{s:s}", "state", in.state),
                         "instance %s is %s; it can no longer be changed", in.id,
                         strcmp(in.state, "terminated") == 0 ? "terminated" : "being terminated");
    if (held)
        return op_refuse(o, ERR_INVALID_STATE, NULL, json_pack("{s:s}", "state", in.state),
                         "instance %s is %s; %s can be changed only while it is stopped, succeeded, failed or lost "
                         "(POST /v1/instances/%s/stop); its name at any time",
                         in.id, in.state, held, in.id);
    /* The event names the fields, never a value: env may hold secrets. */
    char reason[256] = "changed by the user:";
    size_t len = strlen(reason);
    for (const struct instance_patch_field *f = instance_patch_fields; f->name; f++) {
        json_t *v = json_object_get(body, f->name);
        if (!v)
            continue;
        if ((rc = f->apply(s, &in, v, o)) != STORE_OK)
            return rc;
        int n = snprintf(reason + len, sizeof reason - len, "%s %s", len > 20 ? "," : "", f->name);
        if (n > 0 && len + (size_t)n < sizeof reason)
            len += (size_t)n;
    }
    int64_t now = clock_now();
    if ((rc = store_instance_set_desired(s, in.id, in.desired, now)) != STORE_OK)
        return rc;
    return store_instance_event(s, in.id, now, in.state, len > 20 ? reason : "changed by the user: nothing");
}
