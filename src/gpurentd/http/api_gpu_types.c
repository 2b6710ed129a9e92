/* api_gpu_types.c: GET /v1/gpu-types (public: the console shows it before
 * login) and the admin's PUT/DELETE /v1/admin/gpu-types/{code}. */
#include "domain/ledger.h"
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "http/api.h"
#include "store/store.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* The type with its live card counts and, when it has one, its current
 * price per card-hour and per GB of GPU memory per hour. */
static json_t *type_json(struct store *s, const struct gpu_type *t)
{
    int64_t price = ledger_price_at(s, t->code, clock_now());
    json_t *features = json_loads(t->features, 0, NULL);
    json_t *j =
        json_pack("{s:s, s:s, s:I, s:s, s:s, s:b, s:o, s:s, s:I, s:I, s:I}", "code", t->code, "vendor", t->vendor,
                  "memory_gb", (json_int_t)t->memory_gb, "memory_type", t->memory_type, "stack", t->stack,
                  "reservation_required", t->reservation_required, "features", features ? features : json_array(),
                  "description", t->description, "cards_total", (json_int_t)t->cards_total, "cards_free",
                  (json_int_t)t->cards_free, "cards_in_use", (json_int_t)t->cards_in_use);
    /* On-demand and reserved capacity apart (0024): cards_free is what an
     * instance can take now, cards_reservable what reservations are sold
     * from. A reservation-required type has no on-demand cards. */
    json_object_set_new(j, "cards_reservable", json_integer(t->cards_reservable));
    /* Free cards may lie in pieces no one create can take at once. */
    int64_t launchable = t->reservation_required ? 0 : store_gpu_type_launchable(s, t->code);
    json_object_set_new(j, "cards_launchable", json_integer(launchable > 0 ? launchable : 0));
    int64_t rprice = -1;
    if (store_reservation_price(s, t->code, &rprice) != STORE_OK)
        rprice = price;
    json_object_set_new(j, "reservation_price_per_card_hour", rprice >= 0 ? json_money(rprice) : json_null());
    json_object_set_new(j, "price_per_card_hour", price >= 0 ? json_money(price) : json_null());
    json_object_set_new(j, "price_per_gb_hour", price >= 0 ? json_money(price / t->memory_gb) : json_null());
    json_object_set_new(j, "currency", json_string(daemon_config->currency));
    return j;
}

/* The rendered catalog, one per HTTP thread so that serving it takes no
 * lock: it is rendered again when the catalog generation moved (a committed
 * change to cards, nodes, types or prices, see migration 0026), when a
 * scheduled price took effect, when the currency was reloaded, and when the
 * database's own generation row says another process changed it (checked at
 * most once a second). Threads render at most once per change each. */
struct catalog_cache {
    uint64_t gen;        /* store_catalog_generation() read before rendering */
    int64_t db_gen;      /* catalog_generation.gen read before rendering */
    int64_t checked_ms;  /* monotonic time db_gen was last compared */
    int64_t rendered_at; /* clock_now() at rendering */
    int64_t valid_until; /* the next scheduled price start */
    char currency[16];   /* daemon_config->currency at rendering */
    char *body;          /* the JSON reply, malloc'd */
    size_t len;          /* its length */
    char etag[24];       /* strong: "<FNV-1a 64 of body>" */
};

static _Thread_local struct catalog_cache cache;
/* Frees a thread's rendered body when the thread ends (server stop). */
static pthread_key_t body_key;
static pthread_once_t body_once = PTHREAD_ONCE_INIT;

static void body_key_init(void)
{
    pthread_key_create(&body_key, free);
}

static int catalog_render(struct store *s, struct catalog_cache *c, int64_t now)
{
    struct gpu_type *types = NULL;
    size_t n;
    uint64_t gen = store_catalog_generation(); /* before reading: a change after it moves it again */
    int64_t db_gen, until;
    if (store_catalog_generation_db(s, &db_gen) != STORE_OK || store_gpu_type_list(s, &types, &n) != STORE_OK ||
        store_next_price_change(s, now, &until) != STORE_OK) {
        free(types);
        return -1;
    }
    json_t *data = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(data, type_json(s, &types[i]));
    free(types);
    json_t *doc = json_pack("{s:o}", "data", data);
    char *body = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    if (!body)
        return -1;
    free(c->body);
    c->body = body;
    pthread_once(&body_once, body_key_init);
    pthread_setspecific(body_key, body);
    c->len = strlen(body);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < c->len; i++)
        h = (h ^ (unsigned char)body[i]) * 1099511628211ull;
    snprintf(c->etag, sizeof c->etag, "\"%016llx\"", (unsigned long long)h);
    c->gen = gen;
    c->db_gen = db_gen;
    c->checked_ms = clock_mono_ms();
    c->rendered_at = now;
    c->valid_until = until;
    snprintf(c->currency, sizeof c->currency, "%s", daemon_config->currency);
    return 0;
}

static int catalog_stale(struct store *s, struct catalog_cache *c, int64_t now)
{
    if (!c->body || c->gen != store_catalog_generation() || now >= c->valid_until || now < c->rendered_at ||
        strcmp(c->currency, daemon_config->currency) != 0)
        return 1;
    int64_t mono = clock_mono_ms();
    if (mono - c->checked_ms < 1000)
        return 0;
    int64_t db_gen;
    c->checked_ms = mono;
    return store_catalog_generation_db(s, &db_gen) != STORE_OK || db_gen != c->db_gen;
}

void api_gpu_types_list(struct http_request *req)
{
    struct store *s = store_thread();
    int64_t now = clock_now();
    if (!s || (catalog_stale(s, &cache, now) && catalog_render(s, &cache, now) < 0)) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    http_add_header(req, "ETag", cache.etag);
    /* Clients may keep it but must ask again: counts change by the second. */
    http_add_header(req, "Cache-Control", "no-cache");
    if (http_etag_matches(http_header(req, "If-None-Match"), cache.etag))
        http_reply_not_modified(req, cache.len);
    else
        http_reply_raw(req, 200, "application/json", cache.body, cache.len);
}

/* Catalog codes: upper-case letters, digits and '-', like "H100-SXM". */
static int code_valid(const char *c)
{
    size_t n = strlen(c);
    if (n == 0 || n > 32)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isupper((unsigned char)c[i]) && !isdigit((unsigned char)c[i]) && c[i] != '-')
            return 0;
    return 1;
}

struct put_ctx {
    struct gpu_type *t; /* the new description */
    int64_t now;        /* change time */
    int created;        /* out: it was new */
};

static int put_txn(struct store *s, void *vctx)
{
    struct put_ctx *ctx = vctx;
    return store_gpu_type_put(s, ctx->t, ctx->now, &ctx->created);
}

void api_gpu_types_put(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"vendor",               JSON_KIND_STRING,  1, 8  },
        {"memory_gb",            JSON_KIND_INTEGER, 1, 0  },
        {"memory_type",          JSON_KIND_STRING,  1, 32 },
        {"stack",                JSON_KIND_STRING,  1, 8  },
        {"reservation_required", JSON_KIND_BOOLEAN, 0, 0  },
        {"features",             JSON_KIND_ARRAY,   0, 0  },
        {"description",          JSON_KIND_STRING,  0, 512},
        {NULL,                   0,                 0, 0  },
    };
    const char *code = req->params[0];
    if (!code_valid(code)) {
        http_error(req, ERR_INVALID_FIELD, "code", "a GPU type code is 1 to 32 upper-case letters, digits or '-'");
        return;
    }
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    struct gpu_type t = {0};
    snprintf(t.code, sizeof t.code, "%s", code);
    snprintf(t.vendor, sizeof t.vendor, "%s", json_string_value(json_object_get(body, "vendor")));
    snprintf(t.memory_type, sizeof t.memory_type, "%s", json_string_value(json_object_get(body, "memory_type")));
    snprintf(t.stack, sizeof t.stack, "%s", json_string_value(json_object_get(body, "stack")));
    const char *desc = json_string_value(json_object_get(body, "description"));
    snprintf(t.description, sizeof t.description, "%s", desc ? desc : "");
    t.memory_gb = json_integer_value(json_object_get(body, "memory_gb"));
    t.reservation_required = json_is_true(json_object_get(body, "reservation_required"));
    json_t *features = json_object_get(body, "features");
    size_t i;
    json_t *f;
    int features_ok = 1;
    json_array_foreach(features, i, f)
    {
        if (!json_is_string(f) || json_string_length(f) > 32 || i >= 16)
            features_ok = 0;
    }
    char *ftext = features ? json_dumps(features, JSON_COMPACT) : NULL;
    if (strcmp(t.vendor, "AMD") != 0 && strcmp(t.vendor, "NVIDIA") != 0)
        http_error(req, ERR_INVALID_FIELD, "vendor", "vendor must be AMD or NVIDIA");
    else if (strcmp(t.stack, "ROCm") != 0 && strcmp(t.stack, "CUDA") != 0)
        http_error(req, ERR_INVALID_FIELD, "stack", "stack must be ROCm or CUDA");
    else if (t.memory_gb < 1 || t.memory_gb > 4096)
        http_error(req, ERR_INVALID_FIELD, "memory_gb", "memory_gb must be from 1 to 4096");
    else if (!t.memory_type[0])
        http_error(req, ERR_INVALID_FIELD, "memory_type", "memory_type must not be empty");
    else if (!features_ok || (ftext && strlen(ftext) >= sizeof t.features))
        http_error(req, ERR_INVALID_FIELD, "features", "features must be at most 16 strings of up to 32 bytes");
    else {
        snprintf(t.features, sizeof t.features, "%s", ftext ? ftext : "[]");
        struct put_ctx ctx = {&t, clock_now(), 0};
        struct store *s = store_thread();
        struct gpu_type saved;
        if (!s || store_txn(s, put_txn, &ctx) != STORE_OK || store_gpu_type_get(s, t.code, &saved) != STORE_OK)
            http_error(req, ERR_INTERNAL, NULL, NULL);
        else {
            if (ctx.created)
                http_add_header(req, "Location", "/v1/gpu-types"); /* the catalog it joined */
            http_reply_json(req, ctx.created ? 201 : 200, type_json(s, &saved));
        }
    }
    free(ftext);
    json_decref(body);
}

struct delete_ctx {
    const char *code;
    struct gpu_type_users users;
};

static int delete_txn(struct store *s, void *vctx)
{
    struct delete_ctx *ctx = vctx;
    return store_gpu_type_delete(s, ctx->code, &ctx->users);
}

void api_gpu_types_delete(struct http_request *req)
{
    struct store *s = store_thread();
    struct delete_ctx ctx = {.code = req->params[0]};
    int rc = s ? store_txn(s, delete_txn, &ctx) : STORE_ERROR;
    if (rc == STORE_NOT_FOUND)
        http_error(req, ERR_NOT_FOUND, NULL, "no GPU type %.32s", req->params[0]);
    else if (rc == STORE_CONFLICT)
        http_error_ext(req, ERR_CONFLICT, NULL,
                       json_pack("{s:I, s:I, s:I}", "nodes", (json_int_t)ctx.users.nodes, "prices",
                                 (json_int_t)ctx.users.prices, "instances", (json_int_t)ctx.users.instances),
                       "GPU type %.32s cannot be deleted: %lld nodes (removed ones included), %lld prices and "
                       "%lld instances name it, and what they recorded keeps its type",
                       req->params[0], (long long)ctx.users.nodes, (long long)ctx.users.prices,
                       (long long)ctx.users.instances);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else
        http_reply_json(req, 204, NULL);
}
