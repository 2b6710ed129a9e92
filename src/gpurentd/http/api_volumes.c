/* api_volumes.c: /v1/volumes — a user's persistent storage, mounted at
 * /shared on every node of their instances. A volume outlives instances;
 * deleting one that an instance still uses is refused. */
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "http/api.h"
#include "store/store.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VOLUMES_PAGE_MAX 100

static json_t *volume_json(const struct volume *v)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:I, s:b, s:o}", "id", v->id, "name", v->name, "size_gb",
                     (json_int_t)v->size_gb, "region", v->region[0] ? v->region : "global", "mount_path", "/shared",
                     "instances", (json_int_t)v->instances, "in_use", v->mounted > 0, "created_at",
                     json_time(v->created_at, 0));
}

static int name_valid(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 63 || !isalnum((unsigned char)name[0]))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!islower((unsigned char)name[i]) && !isdigit((unsigned char)name[i]) && name[i] != '-' && name[i] != '_')
            return 0;
    return 1;
}

struct create_ctx {
    const char *user_id, *name; /* whose, what */
    int64_t size_gb;            /* quota, and what storage is billed for */
    const char *region;         /* storage region, "" global */
    int unknown_region;         /* out: no node and no storage price has it */
    char why[256];              /* out: which volume bound it would break */
    struct volume v;            /* out */
};

static int create_txn(struct store *s, void *vctx)
{
    struct create_ctx *ctx = vctx;
    ctx->unknown_region = 0;
    if (ctx->region[0]) {
        int known = store_region_known(s, ctx->region);
        if (known < 0)
            return known;
        if (!known) {
            ctx->unknown_region = 1;
            return STORE_NOT_FOUND;
        }
    }
    int rc = volume_create_in(s, ctx->user_id, ctx->name, ctx->size_gb, ctx->region, &ctx->v);
    if (rc == VOLUME_OVER_LIMIT)
        volume_limit_check(s, ctx->user_id, ctx->size_gb, ctx->why, sizeof ctx->why);
    return rc;
}

void api_volumes_create(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"name",    JSON_KIND_STRING,  1, 63},
        {"size_gb", JSON_KIND_INTEGER, 0, 0 },
        {"region",  JSON_KIND_STRING,  0, 63},
        {NULL,      0,                 0, 0 },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    struct create_ctx ctx = {.user_id = req->user_id, .name = json_string_value(json_object_get(body, "name"))};
    json_t *size = json_object_get(body, "size_gb");
    ctx.size_gb = size ? json_integer_value(size) : daemon_config->volume_default_size_gb;
    const char *region = json_string_value(json_object_get(body, "region"));
    /* The region only chooses the storage price: "global" (or none) is the
     * global price; another must be a live node's region or one with a
     * storage price of its own. */
    ctx.region = !region || !region[0] || strcmp(region, "global") == 0 ? "" : region;
    struct store *s = store_thread();
    int rc;
    if (!name_valid(ctx.name))
        http_error(req, ERR_INVALID_FIELD, "name", "name must be 1 to 63 lower-case letters, digits, '-' or '_'");
    else if (ctx.size_gb < 1 || ctx.size_gb > daemon_config->max_volume_size_gb)
        http_error(req, ERR_INVALID_FIELD, "size_gb", "size_gb must be from 1 to %lld (max_volume_size_gb)",
                   (long long)daemon_config->max_volume_size_gb);
    else if (ctx.region[0] && !storage_region_valid(ctx.region))
        http_error(req, ERR_INVALID_FIELD, "region", "region must be global or letters, digits, '.', '_' or '-'");
    else if ((rc = s ? store_txn(s, create_txn, &ctx) : STORE_ERROR) == STORE_NOT_FOUND && ctx.unknown_region)
        http_error(req, ERR_INVALID_FIELD, "region",
                   "no node and no storage price is in region %s; leave region out for the global price", ctx.region);
    else if (rc == STORE_CONFLICT)
        http_error(req, ERR_NAME_TAKEN, "name", "you already have a volume named %s", ctx.name);
    else if (rc == VOLUME_OVER_LIMIT)
        http_error(req, ERR_QUOTA_EXCEEDED, "size_gb", "%s", ctx.why);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else {
        char location[64];
        snprintf(location, sizeof location, "/v1/volumes/%s", ctx.v.id);
        http_add_header(req, "Location", location);
        http_reply_json(req, 201, volume_json(&ctx.v));
    }
    json_decref(body);
}

void api_volumes_list(struct http_request *req)
{
    static const char *const allowed[] = {"limit", "cursor", NULL};
    struct page pg;
    if (http_query_allow(req, allowed) < 0 || page_begin(req, VOLUMES_PAGE_MAX, 50, &pg) < 0)
        return;
    struct volume *list = malloc(sizeof *list * (size_t)(pg.limit + 1));
    size_t n = 0;
    struct store *s = store_thread();
    if (!list || !s ||
        store_volume_list(s, req->user_id, pg.after_t, pg.after_id, list, (size_t)pg.limit + 1, &n) != STORE_OK) {
        free(list);
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    size_t shown = page_shown(&pg, n);
    json_t *data = json_array();
    for (size_t i = 0; i < shown; i++)
        json_array_append_new(data, volume_json(&list[i]));
    json_t *next = n > shown ? page_cursor(list[shown - 1].created_at, list[shown - 1].id) : json_null();
    free(list);
    http_reply_json(req, 200, json_pack("{s:o, s:o}", "data", data, "next_cursor", next));
}

void api_volumes_get(struct http_request *req)
{
    struct store *s = store_thread();
    struct volume v;
    int rc = !s                                ? STORE_ERROR
             : id_valid("vol", req->params[0]) ? store_volume_get(s, req->user_id, req->params[0], &v)
                                               : STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND)
        http_error(req, ERR_NOT_FOUND, NULL, "no volume %.32s", req->params[0]);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else
        http_reply_json(req, 200, volume_json(&v));
}

struct delete_ctx {
    const char *user_id, *id; /* whose, which */
};

static int delete_txn(struct store *s, void *vctx)
{
    struct delete_ctx *ctx = vctx;
    return store_volume_delete(s, ctx->user_id, ctx->id, clock_now());
}

void api_volumes_delete(struct http_request *req)
{
    struct store *s = store_thread();
    struct delete_ctx ctx = {req->user_id, req->params[0]};
    int rc = !s ? STORE_ERROR : id_valid("vol", ctx.id) ? store_txn(s, delete_txn, &ctx) : STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND)
        http_error(req, ERR_NOT_FOUND, NULL, "no volume %.32s", req->params[0]);
    else if (rc == STORE_CONFLICT)
        http_error(req, ERR_VOLUME_IN_USE, NULL,
                   "volume %s is used by instances that are not terminated; terminate them first", ctx.id);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else
        http_reply_json(req, 204, NULL);
}
