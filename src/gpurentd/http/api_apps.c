/* api_apps.c: the app marketplace (issue 17). /v1/apps: publish an app,
 * the public list for anyone, and the publisher's own view, changes,
 * removal and daily stats under /v1/apps/{slug}. /internal/gateway: what
 * gpurent-gateway learns (apps, ready replicas, key hashes, funds) and
 * where it reports demand and usage, signed with gateway_secret_file's
 * key as the agent protocol is (gpurent/sign.h). */
#include "domain/apps.h"
#include "domain/ledger.h"
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "http/api.h"
#include "store/store.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define APPS_PAGE_MAX 100
#define GATEWAY_BATCH_MAX 1000 /* usage records in one report */
#define MONEY_HOLD_MAX 1000000000000000LL /* one hold: a billion yuan */
/* How long the state lists a gateway's last committed report (gateway_reports,
 * 0047) after it was made: a gateway reports every second or so. */
#define GATEWAY_REPORTED_KEEP_S 86400

/* The fields a publish takes; PATCH takes the same but slug. */
#define APP_FIELDS                                           \
    {"name",                       JSON_KIND_STRING,  0, 80  }, \
    {"description",                JSON_KIND_STRING,  0, 2000}, \
    {"image",                      JSON_KIND_STRING,  0, 255 }, \
    {"command",                    JSON_KIND_ARRAY,   0, 0   }, \
    {"env",                        JSON_KIND_ARRAY,   0, 0   }, \
    {"port",                       JSON_KIND_INTEGER, 0, 0   }, \
    {"gpu_type",                   JSON_KIND_STRING,  0, 32  }, \
    {"cards_per_replica",          JSON_KIND_INTEGER, 0, 0   }, \
    {"min_replicas",               JSON_KIND_INTEGER, 0, 0   }, \
    {"max_replicas",               JSON_KIND_INTEGER, 0, 0   }, \
    {"concurrency_target",         JSON_KIND_INTEGER, 0, 0   }, \
    {"idle_seconds",               JSON_KIND_INTEGER, 0, 0   }, \
    {"visibility",                 JSON_KIND_STRING,  0, 16  }, \
    {"allowed_users",              JSON_KIND_ARRAY,   0, 0   }, \
    {"price_per_request",          JSON_KIND_STRING,  0, 32  }, \
    {"price_per_1k_input_tokens",  JSON_KIND_STRING,  0, 32  }, \
    {"price_per_1k_output_tokens", JSON_KIND_STRING,  0, 32  }, \
    {"price_per_second",           JSON_KIND_STRING,  0, 32  }, \
    {"rate_limit_per_key",         JSON_KIND_INTEGER, 0, 0   }, \
    {"rate_limit_per_app",         JSON_KIND_INTEGER, 0, 0   }, \
    {"health_path",                JSON_KIND_STRING,  0, 255 }

static void reply_outcome(struct http_request *req, struct op_outcome *o)
{
    http_error_ext(req, o->error, o->field[0] ? o->field : NULL, o->extra, "%s", o->message);
    o->extra = NULL;
}

struct publish_ctx {
    struct app a;
    const json_t *allowed;
    struct op_outcome o;
    json_t *answer;
    int taken; /* the slug is someone's already */
};

static int set_access(struct store *s, const struct app *a, const json_t *allowed)
{
    int rc = store_app_access_clear(s, a->id);
    size_t i;
    const json_t *u;
    json_array_foreach(allowed, i, u) if (rc == STORE_OK) rc = store_app_access_add(s, a->id, json_string_value(u));
    return rc;
}

static int publish_txn(struct store *s, void *vctx)
{
    struct publish_ctx *ctx = vctx;
    json_decref(ctx->answer);
    ctx->answer = NULL;
    ctx->taken = 0;
    struct app twin;
    int rc = store_app_get(s, ctx->a.slug, &twin);
    store_app_free(&twin);
    if (rc == STORE_OK) {
        ctx->taken = 1;
        return STORE_CONFLICT;
    }
    if (rc != STORE_NOT_FOUND || (rc = app_check_refs(s, &ctx->a, ctx->allowed, &ctx->o)) != STORE_OK)
        return rc;
    /* Every app is in the marketplace's pages and in every gateway's copy,
     * refreshed each second: a publisher's count is bounded. */
    int64_t published = store_app_count_by_publisher(s, ctx->a.publisher_id);
    if (published < 0)
        return (int)published;
    if (published >= daemon_config->max_apps_per_user)
        return op_refuse(&ctx->o, ERR_QUOTA_EXCEEDED, NULL,
                         json_pack("{s:I}", "limit", (json_int_t)daemon_config->max_apps_per_user),
                         "an account may publish at most %lld apps (max_apps_per_user); delete one first",
                         (long long)daemon_config->max_apps_per_user);
    if ((rc = store_app_insert(s, &ctx->a)) != STORE_OK || (rc = set_access(s, &ctx->a, ctx->allowed)) != STORE_OK ||
        (rc = store_app_event(s, ctx->a.id, ctx->a.created_at, "published", ctx->a.slug)) != STORE_OK)
        return rc == STORE_CONFLICT ? (ctx->taken = 1, rc) : rc;
    ctx->answer = app_json(s, &ctx->a, 1);
    return ctx->answer ? STORE_OK : STORE_ERROR;
}

void api_apps_create(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"slug", JSON_KIND_STRING, 1, 40},
        APP_FIELDS,
        {NULL,   0,                0, 0 },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    static const char *const required[] = {"name", "image", "port", "gpu_type", NULL};
    for (int i = 0; required[i]; i++)
        if (!json_object_get(body, required[i])) {
            http_error(req, ERR_MISSING_FIELD, required[i], "%s is required", required[i]);
            json_decref(body);
            return;
        }
    struct publish_ctx ctx = {0};
    int64_t now = clock_now();
    ctx.a.created_at = ctx.a.updated_at = now;
    snprintf(ctx.a.publisher_id, sizeof ctx.a.publisher_id, "%s", req->user_id);
    if (app_from_body(body, 0, &ctx.a, &ctx.allowed, &ctx.o) < 0) {
        reply_outcome(req, &ctx.o);
    } else if (id_new("app", ctx.a.id) < 0) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
    } else {
        struct store *s = store_thread();
        int rc = s ? store_txn(s, publish_txn, &ctx) : STORE_ERROR;
        if (rc == STORE_OK) {
            log_info("apps: %s published %s (%s)", req->user_id, ctx.a.slug, ctx.a.id);
            char location[80];
            snprintf(location, sizeof location, "/v1/apps/%s", ctx.a.slug);
            http_add_header(req, "Location", location);
            http_reply_json(req, 201, ctx.answer);
            ctx.answer = NULL;
            app_scaler_wake();
        } else if (rc == REFUSED) {
            reply_outcome(req, &ctx.o);
        } else if (ctx.taken) {
            http_error(req, ERR_NAME_TAKEN, "slug", "the slug %s is taken; choose another", ctx.a.slug);
        } else {
            http_error(req, ERR_INTERNAL, NULL, NULL);
        }
    }
    json_decref(ctx.answer);
    json_decref(ctx.o.extra);
    store_app_free(&ctx.a);
    json_decref(body);
}

/* GET /v1/apps: the public marketplace, to anyone; ?mine=1 with a key
 * lists the caller's own apps instead (public and private). The route is
 * open, so mine=1 authenticates here: a missing or bad key is the 401 any
 * keyed route gives. */
void api_apps_list(struct http_request *req)
{
    static const char *const allowed[] = {"limit", "cursor", "mine", NULL};
    struct page pg;
    int64_t mine;
    if (http_query_allow(req, allowed) < 0 || http_query_int(req, "mine", 0, 1, 0, &mine) < 0 ||
        page_begin(req, APPS_PAGE_MAX, 50, &pg) < 0)
        return;
    if (mine && auth_authenticate(req, AUTH_USER) < 0)
        return;
    struct store *s = store_thread();
    struct app *apps;
    size_t n;
    if (!s || store_app_list(s, mine ? req->user_id : NULL, pg.after_t, pg.after_id, (size_t)pg.limit + 1, &apps,
                             &n) != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    json_t *data = json_array();
    size_t shown = page_shown(&pg, n);
    for (size_t i = 0; i < shown; i++)
        json_array_append_new(data, app_json(s, &apps[i], 0));
    json_t *next = n > shown ? page_cursor(apps[shown - 1].created_at, apps[shown - 1].id) : json_null();
    for (size_t i = 0; i < n; i++)
        store_app_free(&apps[i]);
    free(apps);
    http_reply_json(req, 200, json_pack("{s:o, s:o}", "data", data, "next_cursor", next));
}

/* Loads the app of the path that the caller publishes; 404 for any other,
 * so private slugs cannot be probed. */
static int load_own(struct http_request *req, struct store *s, struct app *a)
{
    int rc = store_app_get(s, req->params[0], a);
    if (rc == STORE_OK && strcmp(a->publisher_id, req->user_id) != 0) {
        store_app_free(a);
        rc = STORE_NOT_FOUND;
    }
    if (rc == STORE_NOT_FOUND)
        http_error(req, ERR_NOT_FOUND, NULL, "you publish no app %.40s", req->params[0]);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    return rc;
}

/* Whether the caller may see (and call) a: public, or theirs, or listed. */
static int may_see(struct store *s, const struct app *a, const char *user_id)
{
    if (strcmp(a->visibility, "public") == 0 || strcmp(a->publisher_id, user_id) == 0)
        return 1;
    char *text = NULL, needle[ID_MAX + 2];
    snprintf(needle, sizeof needle, "\"%s\"", user_id);
    int yes = store_app_access_json(s, a->id, &text) == STORE_OK && strstr(text, needle);
    free(text);
    return yes;
}

void api_apps_get(struct http_request *req)
{
    struct store *s = store_thread();
    static _Thread_local struct app a;
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return;
    }
    int rc = store_app_get(s, req->params[0], &a);
    if (rc == STORE_OK && !may_see(s, &a, req->user_id))
        rc = STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND)
        http_error(req, ERR_NOT_FOUND, NULL, "no app %.40s", req->params[0]);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else
        http_reply_json(req, 200, app_json(s, &a, strcmp(a.publisher_id, req->user_id) == 0));
    store_app_free(&a);
}

struct patch_ctx {
    const char *slug, *user_id;
    struct app a;
    const json_t *body;
    struct op_outcome o;
    json_t *answer;
};

static int patch_txn(struct store *s, void *vctx)
{
    struct patch_ctx *ctx = vctx;
    json_decref(ctx->answer);
    ctx->answer = NULL;
    const json_t *allowed = NULL;
    /* Read in the transaction that writes it back whole: the scaler
     * writes the same row (replicas wanted, the last call), another PATCH
     * may have changed other fields, a DELETE may have come first. */
    store_app_free(&ctx->a);
    int rc = store_app_get(s, ctx->slug, &ctx->a);
    if (rc == STORE_OK && strcmp(ctx->a.publisher_id, ctx->user_id) != 0)
        rc = STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND)
        return op_refuse(&ctx->o, ERR_NOT_FOUND, NULL, NULL, "you publish no app %.40s", ctx->slug);
    if (rc != STORE_OK)
        return rc;
    if (app_from_body(ctx->body, 1, &ctx->a, &allowed, &ctx->o) < 0)
        return REFUSED;
    ctx->a.updated_at = clock_now();
    if ((rc = app_check_refs(s, &ctx->a, allowed, &ctx->o)) != STORE_OK || (rc = store_app_update(s, &ctx->a)) != STORE_OK ||
        (allowed && (rc = set_access(s, &ctx->a, allowed)) != STORE_OK) ||
        (rc = store_app_event(s, ctx->a.id, ctx->a.updated_at, "updated", "")) != STORE_OK)
        return rc;
    ctx->answer = app_json(s, &ctx->a, 1);
    return ctx->answer ? STORE_OK : STORE_ERROR;
}

/* PATCH changes what new replicas run and the scaling bounds at once;
 * replicas running keep their command until the scaler replaces them. */
void api_apps_patch(struct http_request *req)
{
    static const struct json_field fields[] = {
        APP_FIELDS,
        {NULL, 0, 0, 0},
    };
    struct store *s = store_thread();
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    if (json_object_size(body) == 0) { /* as the other PATCHes: a change that changes nothing is a mistake */
        http_error(req, ERR_MISSING_FIELD, NULL, "the body names no field to change");
        json_decref(body);
        return;
    }
    struct patch_ctx ctx = {.slug = req->params[0], .user_id = req->user_id, .body = body};
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
    } else {
        int rc = store_txn(s, patch_txn, &ctx);
        if (rc == STORE_OK) {
            http_reply_json(req, 200, ctx.answer);
            ctx.answer = NULL;
            app_scaler_wake();
        } else if (rc == REFUSED) {
            reply_outcome(req, &ctx.o);
        } else {
            http_error(req, ERR_INTERNAL, NULL, NULL);
        }
    }
    json_decref(ctx.answer);
    json_decref(ctx.o.extra);
    store_app_free(&ctx.a);
    json_decref(body);
}

/* Deleting an app removes it from every gateway's next copy and
 * terminates its replicas; its calls and ledger rows stay. */
static int delete_txn(struct store *s, void *vctx)
{
    struct app *a = vctx;
    int64_t now = clock_now();
    struct app_replica *r;
    size_t n;
    int rc = store_app_delete(s, a->id, now);
    if (rc != STORE_OK || (rc = store_app_replicas(s, a->id, &r, &n)) != STORE_OK)
        return rc;
    for (size_t i = 0; i < n && rc == STORE_OK; i++) {
        struct op_outcome o = {0};
        rc = instance_terminate(s, a->publisher_id, r[i].instance_id, &o);
        json_decref(o.extra);
    }
    free(r);
    return rc == STORE_OK ? store_app_event(s, a->id, now, "deleted", "") : rc;
}

void api_apps_delete(struct http_request *req)
{
    struct store *s = store_thread();
    static _Thread_local struct app a;
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return;
    }
    if (load_own(req, s, &a) != STORE_OK)
        return;
    int rc = store_txn(s, delete_txn, &a);
    if (rc == STORE_OK) {
        log_info("apps: %s deleted %s", req->user_id, a.slug);
        reconciler_wake();
        http_reply_json(req, 204, NULL);
    } else if (rc == STORE_NOT_FOUND) {
        http_error(req, ERR_NOT_FOUND, NULL, "you publish no app %.40s", a.slug);
    } else {
        http_error(req, ERR_INTERNAL, NULL, NULL);
    }
    store_app_free(&a);
}

/* GET /v1/apps/{slug}/stats?days=N: the publisher's calls, tokens,
 * earnings, error rate, latency p50/p99 and cold starts per UTC day. */
void api_apps_stats(struct http_request *req)
{
    static const char *const allowed[] = {"days", NULL};
    int64_t days;
    struct store *s = store_thread();
    static _Thread_local struct app a;
    if (http_query_allow(req, allowed) < 0 || http_query_int(req, "days", 1, 366, 30, &days) < 0)
        return;
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return;
    }
    if (load_own(req, s, &a) != STORE_OK)
        return;
    int64_t now = clock_now(), from = (now / 86400 - days + 1) * 86400;
    char *text = NULL;
    if (store_app_stats_json(s, a.id, from, now + 1, &text) != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
    } else {
        json_t *days_j = json_loads(text, 0, NULL);
        http_reply_json(req, 200, json_pack("{s:s, s:o}", "app_id", a.id, "days", days_j ? days_j : json_array()));
    }
    free(text);
    store_app_free(&a);
}

/* --- the gateways' internal API --- */

/* Replaces each replica's node fields with the URL a gateway calls. */
static void resolve_replicas(json_t *apps)
{
    size_t i, j;
    json_t *app, *r;
    json_array_foreach(apps, i, app)
    {
        json_t *out = json_array();
        json_array_foreach(json_object_get(app, "replicas"), j, r)
        {
            json_int_t port = json_integer_value(json_object_get(r, "host_port"));
            const char *ph = json_string_value(json_object_get(r, "public_host"));
            const char *au = json_string_value(json_object_get(r, "agent_url"));
            char host[254], url[300];
            node_connect_host(ph ? ph : "", au ? au : "", host, sizeof host);
            if (port <= 0 || !host[0])
                continue;
            snprintf(url, sizeof url, strchr(host, ':') ? "http://[%s]:%lld" : "http://%s:%lld", host, (long long)port);
            json_array_append_new(out, json_pack("{s:O, s:s}", "instance_id", json_object_get(r, "instance_id"), "url",
                                                 url));
        }
        json_object_set_new(app, "replicas", out);
    }
}

/* What each gateway's calls in flight hold of their consumers' funds, as
 * its last report said: the state lists them, and each gateway takes the
 * others' holds off the funds in its copy, so that calls through two
 * gateways cannot each spend the same funds (give or take what was held
 * since the last report and sync). In memory only: a hold lasts a call,
 * and a report older than app_demand_stale_s no longer counts. */
#define GATEWAY_HOLDS_MAX 16384 /* entries over all gateways */
#define GATEWAY_HOLDS_REPORT 4096 /* in one report: a gateway's calls in flight at most */
static pthread_mutex_t holds_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gateway_hold {
    char gateway_id[65];
    char user_id[ID_MAX];
    int64_t held; /* micro-yuan */
    int64_t at;   /* when reported */
} gateway_holds[GATEWAY_HOLDS_MAX];
static size_t n_gateway_holds;

/* A gateway's report of its holds ([{user_id, held}]) replaces its last. */
static void holds_put(const char *gateway_id, const json_t *list, int64_t now)
{
    pthread_mutex_lock(&holds_lock);
    size_t kept = 0;
    for (size_t i = 0; i < n_gateway_holds; i++)
        if (strcmp(gateway_holds[i].gateway_id, gateway_id) != 0 &&
            now - gateway_holds[i].at <= daemon_config->app_demand_stale_s)
            gateway_holds[kept++] = gateway_holds[i];
    n_gateway_holds = kept;
    size_t i;
    const json_t *h;
    json_array_foreach(list, i, h)
    {
        if (n_gateway_holds >= GATEWAY_HOLDS_MAX)
            break;
        struct gateway_hold *g = &gateway_holds[n_gateway_holds++];
        snprintf(g->gateway_id, sizeof g->gateway_id, "%s", gateway_id);
        snprintf(g->user_id, sizeof g->user_id, "%s", json_string_value(json_object_get(h, "user_id")));
        g->held = json_integer_value(json_object_get(h, "held"));
        g->at = now;
    }
    pthread_mutex_unlock(&holds_lock);
}

/* The holds reported within app_demand_stale_s: [{gateway_id, user_id, held}]. */
static json_t *holds_json(int64_t now)
{
    json_t *list = json_array();
    pthread_mutex_lock(&holds_lock);
    for (size_t i = 0; i < n_gateway_holds; i++)
        if (now - gateway_holds[i].at <= daemon_config->app_demand_stale_s)
            json_array_append_new(list, json_pack("{s:s, s:s, s:I}", "gateway_id", gateway_holds[i].gateway_id,
                                                  "user_id", gateway_holds[i].user_id,
                                                  "held", (json_int_t)gateway_holds[i].held));
    pthread_mutex_unlock(&holds_lock);
    return list;
}

static int holds_valid(const json_t *holds)
{
    size_t i;
    const json_t *h;
    if (!holds)
        return 1;
    if (json_array_size(holds) > GATEWAY_HOLDS_REPORT)
        return 0;
    json_array_foreach(holds, i, h)
    {
        const json_t *held = json_object_get(h, "held");
        if (!json_is_object(h) || json_object_size(h) != 2 || !json_is_string(json_object_get(h, "user_id")) ||
            !id_valid("usr", json_string_value(json_object_get(h, "user_id"))) || !json_is_integer(held) ||
            json_integer_value(held) < 0 || json_integer_value(held) > MONEY_HOLD_MAX)
            return 0;
    }
    return 1;
}

void api_gateway_state(struct http_request *req)
{
    req->routine = 1; /* every gateway, every second */
    struct store *s = store_thread();
    char *apps_text = NULL, *keys_text = NULL, *calls_text = NULL, *reported_text = NULL;
    char (*users)[ID_MAX] = NULL;
    size_t n = 0;
    int64_t now = clock_now();
    /* Calls of this minute and the last (settled, so dated on this clock,
     * which the gateways count their minutes in from `at`): each gateway
     * counts the others' calls against a limit that holds across all. */
    int64_t since = (now / 60 - 1) * 60;
    /* One snapshot: the funds show exactly the records of the reports that
     * `reported` says were committed, no more and no fewer, so a gateway
     * counts each of its records once, either in the funds or beside them. */
    if (!s || store_read_begin(s) != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        goto done;
    }
    int rc = store_gateway_apps_json(s, &apps_text);
    if (rc == STORE_OK)
        rc = store_gateway_keys_json(s, now, &keys_text);
    if (rc == STORE_OK)
        rc = store_gateway_recent_calls_json(s, since, &calls_text);
    if (rc == STORE_OK)
        rc = store_gateway_reported_json(s, now - GATEWAY_REPORTED_KEEP_S, &reported_text);
    if (rc == STORE_OK)
        rc = store_gateway_key_users(s, &users, &n);
    json_t *funds = json_object();
    /* What each consumer may spend now, for the 402 before any work. */
    for (size_t i = 0; rc == STORE_OK && i < n; i++) {
        struct funds f;
        if (ledger_funds_now(s, users[i], now, &f) == STORE_OK)
            json_object_set_new(funds, users[i], json_integer(f.available));
    }
    store_read_end(s);
    if (rc != STORE_OK) {
        json_decref(funds);
        http_error(req, ERR_INTERNAL, NULL, NULL);
        goto done;
    }
    json_t *apps = json_loads(apps_text, 0, NULL), *keys = json_loads(keys_text, 0, NULL);
    json_t *calls = json_loads(calls_text, 0, NULL), *reported = json_loads(reported_text, 0, NULL);
    resolve_replicas(apps);
    http_reply_json(req, 200, json_pack("{s:I, s:o, s:o, s:o, s:o, s:o, s:o}", "at", (json_int_t)now, "apps",
                                        apps ? apps : json_array(), "keys", keys ? keys : json_array(), "funds", funds,
                                        "recent_calls", calls ? calls : json_array(), "holds", holds_json(now),
                                        "reported", reported ? reported : json_array()));
done:
    free(apps_text);
    free(keys_text);
    free(calls_text);
    free(reported_text);
    free(users);
}

/* The prices a gateway admitted a call at: {"request", "input_1k",
 * "output_1k", "second"}, integer micro-yuan. 0, or -1 with why. */
static int record_prices(const json_t *p, struct app_call *c, const char **why)
{
    static const char *const names[] = {"request", "input_1k", "output_1k", "second", NULL};
    int64_t *out[] = {&c->price_request, &c->price_input_1k, &c->price_output_1k, &c->price_second};
    if (!json_is_object(p) || json_object_size(p) != 4)
        return *why = "prices is an object of exactly request, input_1k, output_1k and second", -1;
    for (int i = 0; names[i]; i++) {
        json_t *v = json_object_get(p, names[i]);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > daemon_config->max_app_price_micro)
            return *why = "prices must be integers from 0 to max_app_price, in micro-yuan", -1;
        *out[i] = json_integer_value(v);
    }
    c->has_prices = 1;
    return 0;
}

/* One usage record, checked field by field: 0, or -1 with why. "prices"
 * is there from gateways that stamp the prices a call was admitted at;
 * records journaled by an older gateway have none. */
static int record_read(const json_t *r, const char *gateway_id, struct app_call *c, const char **why)
{
    static const char *const ints[] = {"at", "status", "input_tokens", "output_tokens", "duration_ms", "cold_start",
                                       "completed", NULL};
    static const int64_t max[] = {INT32_MAX * 4LL, 599, APP_MAX_TOKENS, APP_MAX_TOKENS, INT64_MAX, 1, 1};
    int64_t *out[] = {&c->at, &c->status, &c->input_tokens, &c->output_tokens, &c->duration_ms, &c->cold_start,
                      &c->completed};
    memset(c, 0, sizeof *c);
    const char *id = json_string_value(json_object_get(r, "id"));
    const char *app = json_string_value(json_object_get(r, "app_id"));
    const char *user = json_string_value(json_object_get(r, "user_id"));
    const char *key = json_string_value(json_object_get(r, "key_id"));
    json_t *prices = json_object_get(r, "prices");
    if (!json_is_object(r) || json_object_size(r) != 11 + (prices != NULL))
        return *why = "a record is an object of exactly id, app_id, user_id, key_id, at, status, input_tokens,"
                      " output_tokens, duration_ms, cold_start and completed, and prices from a gateway that stamps them",
               -1;
    if (prices && record_prices(prices, c, why) < 0)
        return -1;
    if (!id || strlen(id) < 8 || strlen(id) > 64 || strspn(id, "abcdefghijklmnopqrstuvwxyz0123456789_-") != strlen(id))
        return *why = "id must be 8 to 64 of a-z, 0-9, '_' and '-'", -1;
    if (!app || !id_valid("app", app) || !user || !id_valid("usr", user) || !key || !id_valid("key", key))
        return *why = "app_id, user_id and key_id must be ids", -1;
    for (int i = 0; ints[i]; i++) {
        json_t *v = json_object_get(r, ints[i]);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max[i])
            return *why = "at, status, tokens, duration_ms, cold_start and completed must be integers in range", -1;
        *out[i] = json_integer_value(v);
    }
    /* A call longer than a day is charged for its first day, not refused:
     * a refused record is dropped by the gateway, and the call with it. */
    if (c->duration_ms > APP_MAX_DURATION_MS)
        c->duration_ms = APP_MAX_DURATION_MS;
    snprintf(c->id, sizeof c->id, "%s", id);
    snprintf(c->app_id, sizeof c->app_id, "%s", app);
    snprintf(c->consumer_id, sizeof c->consumer_id, "%s", user);
    snprintf(c->key_id, sizeof c->key_id, "%s", key);
    snprintf(c->gateway_id, sizeof c->gateway_id, "%s", gateway_id);
    return 0;
}

struct report_ctx {
    const char *gateway_id;
    const char *run; /* the gateway's run and its number for this report; NULL from an older gateway */
    int64_t seq;
    const json_t *demand, *usage;
    json_t *accepted, *duplicates, *rejected; /* ids */
};

static int settle_one(struct store *s, void *vctx)
{
    struct app_call *c = vctx;
    int dup = 0;
    int rc = app_call_settle(s, c, clock_now(), &dup);
    return rc == STORE_OK && dup ? 1 : rc;
}

static int report_txn(struct store *s, void *vctx)
{
    struct report_ctx *ctx = vctx;
    json_array_clear(ctx->accepted);
    json_array_clear(ctx->duplicates);
    json_array_clear(ctx->rejected);
    int64_t now = clock_now();
    size_t i;
    const json_t *d;
    json_array_foreach(ctx->demand, i, d)
    {
        const char *app = json_string_value(json_object_get(d, "app_id"));
        struct app a;
        if (!app || store_app_get_by_id(s, app, &a) != STORE_OK)
            continue; /* an app deleted since the gateway's copy */
        store_app_free(&a);
        char *busy = json_object_get(d, "busy") ? json_dumps(json_object_get(d, "busy"), JSON_COMPACT) : NULL;
        int rc = store_app_demand_put(s, app, ctx->gateway_id, json_integer_value(json_object_get(d, "in_flight")),
                                      json_integer_value(json_object_get(d, "queued")), busy, now);
        free(busy);
        if (rc != STORE_OK)
            return rc;
    }
    const json_t *r;
    json_array_foreach(ctx->usage, i, r)
    {
        static _Thread_local struct app_call c;
        const char *why;
        if (record_read(r, ctx->gateway_id, &c, &why) < 0) {
            json_array_append_new(ctx->rejected, json_pack("{s:s?, s:s}", "id",
                                                           json_string_value(json_object_get(r, "id")), "why", why));
            continue;
        }
        int result;
        if (store_part(s, settle_one, &c, &result) < 0)
            return STORE_ERROR;
        if (result == 1)
            json_array_append_new(ctx->duplicates, json_string(c.id));
        else if (result == STORE_OK)
            json_array_append_new(ctx->accepted, json_string(c.id));
        else if (result == STORE_NOT_FOUND || result == STORE_CONFLICT)
            json_array_append_new(ctx->rejected, json_pack("{s:s, s:s}", "id", c.id, "why", "unknown app or user"));
        else
            return result;
    }
    /* Committed with the records it settles: a gateway whose answer is lost
     * learns from its next copy that the funds there show them. */
    if (ctx->run)
        return store_gateway_report_put(s, ctx->gateway_id, ctx->run, ctx->seq, now, now - GATEWAY_REPORTED_KEEP_S);
    return STORE_OK;
}

/* "busy": at most 64 instance ids. */
static int busy_valid(const json_t *busy)
{
    if (!busy)
        return 1;
    size_t i;
    const json_t *b;
    if (!json_is_array(busy) || json_array_size(busy) > 64)
        return 0;
    json_array_foreach(busy, i, b) if (!json_is_string(b) || !id_valid("ins", json_string_value(b))) return 0;
    return 1;
}

static int demand_valid(const json_t *demand)
{
    size_t i;
    const json_t *d;
    json_array_foreach(demand, i, d)
    {
        const json_t *f = json_object_get(d, "in_flight"), *q = json_object_get(d, "queued");
        const json_t *busy = json_object_get(d, "busy");
        if (!json_is_object(d) || json_object_size(d) != 3u + (busy != NULL) || !busy_valid(busy) ||
            !json_is_string(json_object_get(d, "app_id")) ||
            !json_is_integer(f) || !json_is_integer(q) || json_integer_value(f) < 0 ||
            json_integer_value(f) > 1000000 || json_integer_value(q) < 0 || json_integer_value(q) > 1000000)
            return 0;
    }
    return 1;
}

/* "run" and "seq" come together or not at all: a name of 1 to 64 of a-z,
 * 0-9, '_' and '-', and a report number from 1. NULL, or the field at fault. */
static const char *run_fault(const json_t *run, const json_t *seq)
{
    const char *r = json_string_value(run);
    if (!run && !seq)
        return NULL;
    if (!r || !r[0] || strlen(r) > 64 || strspn(r, "abcdefghijklmnopqrstuvwxyz0123456789_-") != strlen(r))
        return "run";
    return json_is_integer(seq) && json_integer_value(seq) >= 1 ? NULL : "seq";
}

/* POST /internal/gateway/reports: demand per app and a batch of usage
 * records. Every record is answered accepted, duplicate (its id was
 * settled before: a resent batch charges once) or rejected with why. With
 * the gateway's run and the report's number, which the state then lists
 * as committed (read with the funds). */
void api_gateway_reports(struct http_request *req)
{
    req->routine = 1;
    static const struct json_field fields[] = {
        {"gateway_id", JSON_KIND_STRING,  1, 64},
        {"demand",     JSON_KIND_ARRAY,   1, 0 },
        {"usage",      JSON_KIND_ARRAY,   1, 0 },
        {"holds",      JSON_KIND_ARRAY,   0, 0 },
        {"run",        JSON_KIND_STRING,  0, 64},
        {"seq",        JSON_KIND_INTEGER, 0, 0 },
        {NULL,         0,                 0, 0 },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    struct report_ctx ctx = {.gateway_id = json_string_value(json_object_get(body, "gateway_id")),
                             .demand = json_object_get(body, "demand"),
                             .usage = json_object_get(body, "usage"),
                             .run = json_string_value(json_object_get(body, "run")),
                             .seq = json_integer_value(json_object_get(body, "seq")),
                             .accepted = json_array(),
                             .duplicates = json_array(),
                             .rejected = json_array()};
    struct store *s = store_thread();
    if (!ctx.gateway_id[0] || strspn(ctx.gateway_id, "abcdefghijklmnopqrstuvwxyz0123456789_-.") != strlen(ctx.gateway_id))
        http_error(req, ERR_INVALID_FIELD, "gateway_id", "gateway_id must be 1 to 64 of a-z, 0-9, '_', '-' and '.'");
    else if (!demand_valid(ctx.demand))
        http_error(req, ERR_INVALID_FIELD, "demand", "demand entries are {app_id, in_flight, queued, busy} with counts 0 to 1000000 and"
                   " busy at most 64 instance ids");
    else if (json_array_size(ctx.usage) > GATEWAY_BATCH_MAX)
        http_error(req, ERR_INVALID_FIELD, "usage", "a report holds at most %d usage records", GATEWAY_BATCH_MAX);
    else if (!holds_valid(json_object_get(body, "holds")))
        http_error(req, ERR_INVALID_FIELD, "holds",
                   "holds are at most %d {user_id, held} with held 0 to %lld micro-yuan", GATEWAY_HOLDS_REPORT,
                   (long long)MONEY_HOLD_MAX);
    else if (run_fault(json_object_get(body, "run"), json_object_get(body, "seq")))
        http_error(req, ERR_INVALID_FIELD, run_fault(json_object_get(body, "run"), json_object_get(body, "seq")),
                   "run (1 to 64 of a-z, 0-9, '_' and '-') and seq (an integer from 1) come together");
    else if (!s || store_txn(s, report_txn, &ctx) != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else {
        /* After the records: a hold the report drops is in their charges. */
        if (json_object_get(body, "holds"))
            holds_put(ctx.gateway_id, json_object_get(body, "holds"), clock_now());
        if (json_array_size(ctx.demand))
            app_scaler_wake();
        http_reply_json(req, 200, json_pack("{s:O, s:O, s:O}", "accepted", ctx.accepted, "duplicates", ctx.duplicates,
                                            "rejected", ctx.rejected));
    }
    json_decref(ctx.accepted);
    json_decref(ctx.duplicates);
    json_decref(ctx.rejected);
    json_decref(body);
}
