/* apps.c: the app marketplace's rules (apps.h): a published app's fields
 * and their bounds, its JSON, what a call costs and its settlement on the
 * ledger, and the scaler's decision, carried out with the instance code
 * (replicas are instances of the publisher, placed and driven as any). */
#include "domain/apps.h"
#include "domain/ledger.h"
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "gpurent/money.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Slugs are URL path segments: a-z, 0-9 and '-', 3 to 40, starting with a
 * letter or digit, so /apps/{slug}/ never needs encoding. */
static int slug_valid(const char *s)
{
    size_t n = strlen(s);
    if (n < 3 || n > 40 || s[0] == '-')
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
            return 0;
    return 1;
}

static int text_valid(const char *s, size_t min, size_t max, int newlines)
{
    size_t n = strlen(s);
    if (n < min || n > max)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c < 0x20 && !(newlines && (c == '\n' || c == '\t'))) || c == 0x7f)
            return 0;
    }
    return 1;
}

/* An integer field within [min, max] if present. */
static int int_field(const json_t *body, const char *name, int64_t min, int64_t max, int64_t *out,
                     struct op_outcome *o)
{
    const json_t *v = json_object_get(body, name);
    if (!v)
        return 0;
    json_int_t x = json_integer_value(v);
    if (x < min || x > max) {
        op_refuse(o, ERR_INVALID_FIELD, name, NULL, "%s must be an integer from %lld to %lld", name, (long long)min,
                  (long long)max);
        return -1;
    }
    *out = x;
    return 0;
}

/* A price in micro-yuan, written like every amount ("0.002"), at most
 * max_app_price so that tokens x price stays far inside 64 bits. */
static int price_field(const json_t *body, const char *name, int64_t *out, struct op_outcome *o)
{
    json_t *v = json_object_get(body, name);
    if (!v)
        return 0;
    int64_t x;
    if (json_money_value(v, &x) < 0) {
        op_refuse(o, ERR_INVALID_FIELD, name, NULL, "%s must be an amount like \"0.002\" (up to 6 decimals, no sign)",
                  name);
        return -1;
    }
    if (x > daemon_config->max_app_price_micro) {
        char a[MONEY_FMT_LEN];
        op_refuse(o, ERR_INVALID_FIELD, name, NULL, "%s %s is over max_app_price %s %s", name, money_format(x, a),
                  daemon_config->max_app_price, daemon_config->currency);
        return -1;
    }
    *out = x;
    return 0;
}

static int text_field(const json_t *body, const char *name, size_t min, size_t max, int newlines, char *out,
                      size_t outlen, struct op_outcome *o)
{
    const char *v = json_string_value(json_object_get(body, name));
    if (!v)
        return 0;
    if (!text_valid(v, min, max, newlines)) {
        op_refuse(o, ERR_INVALID_FIELD, name, NULL, "%s must be %zu to %zu bytes without control characters", name,
                  min, max);
        return -1;
    }
    snprintf(out, outlen, "%s", v);
    return 0;
}

/* health_path: what a replica's agent GETs on the app's port (0027); it
 * goes on an HTTP request line, so printable ASCII without blanks. */
static int health_path_field(const json_t *body, struct app *a, struct op_outcome *o)
{
    json_t *v = json_object_get(body, "health_path");
    if (!v)
        return 0;
    const char *p = json_string_value(v);
    size_t len = p ? strlen(p) : 0;
    int ok = p && len >= 1 && len <= 255 && len == json_string_length(v) && p[0] == '/';
    for (size_t i = 0; ok && i < len; i++)
        ok = p[i] > ' ' && p[i] <= '~';
    if (!ok)
        return op_refuse(o, ERR_INVALID_FIELD, "health_path", NULL,
                         "health_path must start with / and be at most 255 printable characters without blanks"),
               -1;
    snprintf(a->health_path, sizeof a->health_path, "%s", p);
    return 0;
}

static int defaults_for_publish(const json_t *body, struct app *a, struct op_outcome *o)
{
    const char *slug = json_string_value(json_object_get(body, "slug"));
    if (!slug || !slug_valid(slug))
        return op_refuse(o, ERR_INVALID_FIELD, "slug", NULL,
                         "slug must be 3 to 40 of a-z, 0-9 and '-', not starting with '-'"),
               -1;
    snprintf(a->slug, sizeof a->slug, "%s", slug);
    a->cards_per_replica = 1;
    a->min_replicas = 0;
    a->max_replicas = 1;
    a->concurrency_target = 4;
    a->idle_seconds = 300;
    snprintf(a->visibility, sizeof a->visibility, "public");
    snprintf(a->health_path, sizeof a->health_path, "/health");
    return 0;
}

static int run_fields(const json_t *body, struct app *a, struct op_outcome *o)
{
    json_t *cmd = json_object_get(body, "command"), *env = json_object_get(body, "env");
    if (cmd) {
        if (run_command_check(cmd, o) < 0)
            return -1;
        free(a->command);
        a->command = json_dumps(cmd, JSON_COMPACT);
    }
    if (env) {
        json_t *norm = NULL;
        if (run_env_check(env, &norm, o) < 0)
            return -1;
        free(a->env);
        a->env = json_dumps(norm, JSON_COMPACT);
        json_decref(norm);
    }
    return (cmd && !a->command) || (env && !a->env) ? -1 : 0;
}

int app_from_body(const json_t *body, int is_patch, struct app *a, const json_t **allowed, struct op_outcome *o)
{
    *allowed = NULL;
    if (!is_patch && defaults_for_publish(body, a, o) < 0)
        return -1;
    const char *vis = json_string_value(json_object_get(body, "visibility"));
    if (vis && strcmp(vis, "public") != 0 && strcmp(vis, "private") != 0)
        return op_refuse(o, ERR_INVALID_FIELD, "visibility", NULL, "visibility must be public or private"), -1;
    if (vis)
        snprintf(a->visibility, sizeof a->visibility, "%s", vis);
    if (text_field(body, "name", 1, 80, 0, a->name, sizeof a->name, o) < 0 ||
        text_field(body, "description", 0, 2000, 1, a->description, sizeof a->description, o) < 0 ||
        text_field(body, "image", 1, 255, 0, a->image, sizeof a->image, o) < 0 ||
        text_field(body, "gpu_type", 1, 32, 0, a->gpu_type, sizeof a->gpu_type, o) < 0 ||
        int_field(body, "port", 1, 65535, &a->port, o) < 0 ||
        int_field(body, "cards_per_replica", 1, 64, &a->cards_per_replica, o) < 0 ||
        int_field(body, "min_replicas", 0, 64, &a->min_replicas, o) < 0 ||
        int_field(body, "max_replicas", 1, 64, &a->max_replicas, o) < 0 ||
        int_field(body, "concurrency_target", 1, 10000, &a->concurrency_target, o) < 0 ||
        int_field(body, "idle_seconds", 10, 86400, &a->idle_seconds, o) < 0 ||
        int_field(body, "rate_limit_per_key", 0, 100000, &a->rate_per_key, o) < 0 ||
        int_field(body, "rate_limit_per_app", 0, 1000000, &a->rate_per_app, o) < 0 ||
        price_field(body, "price_per_request", &a->price_request, o) < 0 ||
        price_field(body, "price_per_1k_input_tokens", &a->price_input_1k, o) < 0 ||
        price_field(body, "price_per_1k_output_tokens", &a->price_output_1k, o) < 0 ||
        price_field(body, "price_per_second", &a->price_second, o) < 0 || run_fields(body, a, o) < 0 ||
        health_path_field(body, a, o) < 0)
        return -1;
    if (a->min_replicas > a->max_replicas)
        return op_refuse(o, ERR_INVALID_FIELD, "min_replicas", NULL, "min_replicas %lld is over max_replicas %lld",
                         (long long)a->min_replicas, (long long)a->max_replicas),
               -1;
    const json_t *users = json_object_get(body, "allowed_users");
    if (users) {
        size_t i;
        const json_t *u;
        if (json_array_size(users) > APP_MAX_ALLOWED)
            return op_refuse(o, ERR_INVALID_FIELD, "allowed_users", NULL, "allowed_users lists at most %d accounts",
                             APP_MAX_ALLOWED),
                   -1;
        json_array_foreach(users, i, u) if (!json_is_string(u) || !id_valid("usr", json_string_value(u))) return op_refuse(
            o, ERR_INVALID_FIELD, "allowed_users", NULL, "allowed_users[%zu] must be a user id (usr_…)", i),
                                                                                                         -1;
        *allowed = users;
    }
    return 0;
}

int app_check_refs(struct store *s, const struct app *a, const json_t *allowed, struct op_outcome *o)
{
    struct gpu_type t;
    int rc = store_gpu_type_row(s, a->gpu_type, &t);
    if (rc == STORE_NOT_FOUND)
        return op_refuse(o, ERR_INVALID_FIELD, "gpu_type", NULL, "no GPU type %s; see GET /v1/gpu-types", a->gpu_type);
    if (rc != STORE_OK)
        return rc;
    char ref[256];
    if ((rc = instance_image_resolve(s, a->image, &t, ref, o)) != STORE_OK)
        return rc;
    size_t i;
    const json_t *u;
    json_array_foreach(allowed, i, u)
    {
        struct user who;
        rc = store_user_get(s, json_string_value(u), &who);
        if (rc == STORE_NOT_FOUND)
            return op_refuse(o, ERR_INVALID_FIELD, "allowed_users", NULL, "allowed_users[%zu]: no account %.32s", i,
                             json_string_value(u));
        if (rc != STORE_OK)
            return rc;
    }
    return STORE_OK;
}

static json_t *parsed(const char *text)
{
    json_t *j = text ? json_loads(text, 0, NULL) : NULL;
    return j ? j : json_array();
}

/* The URL consumers call slug at (new reference):
 * "<gateway_public_url>/apps/<slug>/", or JSON null when that option is
 * unset (gpurentd then does not know where its gateways are reached). */
static json_t *app_gateway_url(const char *slug)
{
    const char *base = daemon_config ? daemon_config->gateway_public_url : "";
    size_t n = strlen(base);
    while (n > 0 && base[n - 1] == '/') /* "https://gw/" and "https://gw" both give one slash */
        n--;
    if (n == 0)
        return json_null();
    char url[400];
    snprintf(url, sizeof url, "%.*s/apps/%s/", (int)n, base, slug);
    return json_string(url);
}

json_t *app_json(struct store *s, const struct app *a, int full)
{
    char b[4][MONEY_FMT_LEN];
    json_t *j = json_pack(
        "{s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:s, s:I, s:I, s:I, s:I, s:I, s:s, s:{s:s, s:s, s:s, s:s}, s:I, s:I,"
        " s:o, s:o}",
        "id", a->id, "slug", a->slug, "name", a->name, "description", a->description, "publisher_id", a->publisher_id,
        "gpu_type", a->gpu_type, "cards_per_replica", (json_int_t)a->cards_per_replica, "image", a->image, "port",
        (json_int_t)a->port, "min_replicas", (json_int_t)a->min_replicas, "max_replicas", (json_int_t)a->max_replicas,
        "concurrency_target", (json_int_t)a->concurrency_target, "idle_seconds", (json_int_t)a->idle_seconds,
        "visibility", a->visibility, "prices", "per_request", money_format(a->price_request, b[0]),
        "per_1k_input_tokens", money_format(a->price_input_1k, b[1]), "per_1k_output_tokens",
        money_format(a->price_output_1k, b[2]), "per_second", money_format(a->price_second, b[3]),
        "rate_limit_per_key", (json_int_t)a->rate_per_key, "rate_limit_per_app", (json_int_t)a->rate_per_app,
        "created_at", json_time(a->created_at, 0), "updated_at", json_time(a->updated_at, 0));
    if (j) {
        json_object_set_new(j, "health_path", json_string(a->health_path[0] ? a->health_path : "/health"));
        json_object_set_new(j, "gateway_url", app_gateway_url(a->slug));
    }
    if (!j || !full)
        return j;
    json_t *cmd = parsed(a->command), *env = parsed(a->env);
    json_object_set_new(j, "command", cmd);
    json_object_set_new(j, "env", run_env_public(env));
    json_decref(env);
    json_object_set_new(j, "desired_replicas", json_integer(a->desired_replicas));
    char *text = NULL;
    if (store_app_access_json(s, a->id, &text) == STORE_OK)
        json_object_set_new(j, "allowed_users", parsed(text));
    free(text);
    text = NULL;
    if (store_app_events_json(s, a->id, 50, &text) == STORE_OK)
        json_object_set_new(j, "events", parsed(text));
    free(text);
    struct app_replica *r;
    size_t n;
    json_t *reps = json_array();
    if (store_app_replicas(s, a->id, &r, &n) == STORE_OK) {
        for (size_t i = 0; i < n; i++)
            json_array_append_new(reps, json_pack("{s:s, s:s, s:o}", "instance_id", r[i].instance_id, "state",
                                                  r[i].state, "health",
                                                  r[i].health[0] ? json_string(r[i].health) : json_null()));
        free(r);
    }
    json_object_set_new(j, "replicas", reps);
    return j;
}

static int64_t lower(int64_t now, int stamped, int64_t at_admission)
{
    return stamped && at_admission < now ? at_admission : now;
}

int64_t app_call_price(const struct app *a, const struct app_call *c)
{
    /* Each price is the lower of the app's now and the one the gateway
     * admitted the call at: a publisher who raises a price before the
     * call's record arrives does not get it for calls already made. Only
     * an answer that was not an error is charged at all: the replica's
     * token counts for a failed call are its own word. */
    if (c->status <= 0 || c->status >= 400)
        return 0;
    int64_t input_1k = lower(a->price_input_1k, c->has_prices, c->price_input_1k);
    int64_t output_1k = lower(a->price_output_1k, c->has_prices, c->price_output_1k);
    int64_t request = lower(a->price_request, c->has_prices, c->price_request);
    int64_t second = lower(a->price_second, c->has_prices, c->price_second);
    __int128 tokens = (__int128)c->input_tokens * input_1k + (__int128)c->output_tokens * output_1k;
    __int128 price = tokens / 1000 + request + (__int128)c->duration_ms * second / 1000;
    /* Bounded inputs (max_app_price, APP_MAX_TOKENS, a day of duration)
     * keep this far below INT64_MAX; clamp anyway rather than wrap. */
    return price > INT64_MAX ? INT64_MAX : (int64_t)price;
}

int app_call_settle(struct store *s, struct app_call *c, int64_t now, int *duplicate)
{
    *duplicate = 0;
    int rc = store_app_call_exists(s, c->id);
    if (rc == STORE_OK) {
        *duplicate = 1;
        return STORE_OK;
    }
    if (rc != STORE_NOT_FOUND)
        return rc;
    /* Dated on the daemon's clock, as every ledger row is: the stats'
     * days and the statements then agree whatever the gateway's clock. */
    c->at = now;
    struct app a;
    if ((rc = store_app_get_by_id(s, c->app_id, &a)) != STORE_OK)
        return rc;
    int64_t price = app_call_price(&a, c);
    struct funds f;
    if ((rc = ledger_funds(s, c->consumer_id, now, &f)) != STORE_OK) {
        store_app_free(&a);
        return rc;
    }
    /* The gateway holds funds for each call in flight and cuts a call its
     * holds cannot cover; what a call still costs beyond them (funds spent
     * elsewhere since the gateway's copy, or through several gateways at
     * once) is recorded as unpaid, never drawn below zero. */
    c->charge = price < f.available ? price : f.available;
    c->unpaid = price - c->charge;
    c->fee = (int64_t)((__int128)c->charge * daemon_config->app_platform_fee_ppm / 1000000);
    c->earning = c->charge - c->fee;
    char reason[200];
    snprintf(reason, sizeof reason, "app %s: %lld in / %lld out tokens, status %lld", a.slug,
             (long long)c->input_tokens, (long long)c->output_tokens, (long long)c->status);
    if (c->charge > 0)
        rc = ledger_charge_app_call(s, c->consumer_id, a.publisher_id, c->charge, c->fee, now, c->id, reason);
    if (rc == STORE_OK)
        rc = store_app_call_insert(s, c, now);
    store_app_free(&a);
    return rc;
}

int64_t app_scale_target(const struct app *a, int64_t demand, int64_t current, int64_t now, int64_t window_s)
{
    int64_t want = (demand + a->concurrency_target - 1) / a->concurrency_target;
    if (demand == 0 && now - a->last_call_at < a->idle_seconds)
        want = current; /* quiet, but not idle long enough: keep what runs */
    if (want < a->min_replicas)
        want = a->min_replicas;
    if (want > a->max_replicas)
        want = a->max_replicas;
    if (want >= current || demand == 0)
        return want;
    /* Demand fits fewer replicas: only after the stabilisation window. */
    return a->below_since && now - a->below_since >= window_s ? want : current;
}

/* Creates one replica: an instance of the publisher running the app. */
static int add_replica(struct store *s, struct app *a, struct op_outcome *o)
{
    /* The publisher pays for and owns the replica, so it waits on what a
     * launch of theirs would: an account in good standing and a verified
     * address. Suspending a publisher stops their replicas; without this
     * the next pass would start them again. */
    struct user u;
    int rc = store_user_get(s, a->publisher_id, &u);
    if (rc != STORE_OK)
        return rc;
    if (!u.active)
        return op_refuse(o, ERR_ACCOUNT_DISABLED, NULL, NULL, "the publisher's account is suspended");
    if (!u.email_verified_at)
        return op_refuse(o, ERR_EMAIL_NOT_VERIFIED, NULL, NULL, "the publisher's e-mail address is not verified");
    json_t *cmd = parsed(a->command), *env = parsed(a->env), *ports = json_pack("[I]", (json_int_t)a->port);
    char name[64];
    snprintf(name, sizeof name, "app-%.40s", a->slug);
    struct instance_create req = {.user_id = a->publisher_id,
                                  .name = name,
                                  .gpu_type = a->gpu_type,
                                  .card_count = a->cards_per_replica,
                                  .image = a->image,
                                  .ports = ports,
                                  .command = json_array_size(cmd) ? cmd : NULL,
                                  .env = json_array_size(env) ? env : NULL,
                                  .restart_policy = "on_failure"};
    char id[ID_MAX];
    rc = instance_create(s, &req, id, NULL, o);
    if (rc == STORE_OK)
        rc = store_instance_set_app(s, id, a->id);
    json_decref(cmd);
    json_decref(env);
    json_decref(ports);
    return rc;
}

/* Runs f in a savepoint: a refused replica (quota, capacity, funds) rolls
 * back alone and becomes an event, not a failed pass. */
struct scale_step {
    struct app *a;
    const char *instance_id; /* to remove, or NULL to add */
    struct op_outcome o;
};

static int scale_step(struct store *s, void *vctx)
{
    struct scale_step *st = vctx;
    if (!st->instance_id)
        return add_replica(s, st->a, &st->o);
    return instance_terminate(s, st->a->publisher_id, st->instance_id, &st->o);
}

int app_scale(struct store *s, struct app *a, int64_t now, int *changed)
{
    *changed = 0;
    struct app_replica *r;
    size_t n;
    int rc = store_app_replicas(s, a->id, &r, &n);
    if (rc != STORE_OK)
        return rc;
    size_t live = 0;
    for (size_t i = 0; i < n; i++)
        live += strcmp(r[i].desired, "terminated") != 0;
    int64_t demand = store_app_demand(s, a->id, now - daemon_config->app_demand_stale_s);
    if (demand < 0) {
        free(r);
        return (int)demand;
    }
    if (demand > 0)
        a->last_call_at = now;
    int64_t fits = (demand + a->concurrency_target - 1) / a->concurrency_target;
    a->below_since = fits < (int64_t)live ? (a->below_since ? a->below_since : now) : 0;
    int64_t want = app_scale_target(a, demand, (int64_t)live, now, daemon_config->app_scale_down_window_s);
    /* A refused scale-up (quota, capacity, funds) is tried again a minute
     * later, not every pass: one event per try, not a flood. */
    int held = want > (int64_t)live ? store_app_last_event_is(s, a->id, "scale_refused", now - 60) : 0;
    if (held < 0) {
        rc = held;
        goto done;
    }
    if (held)
        want = (int64_t)live;
    char detail[200];
    snprintf(detail, sizeof detail, "demand %lld, replicas %zu -> %lld", (long long)demand, live, (long long)want);
    const char *kind = want > (int64_t)live ? "scale_up" : want == 0 ? "scale_to_zero" : "scale_down";
    if (want != (int64_t)live && (rc = store_app_event(s, a->id, now, kind, detail)) != STORE_OK)
        goto done;
    /* Up: one instance per missing replica. Down: the newest idle ones go. */
    for (int64_t k = (int64_t)live; rc == STORE_OK && k < want; k++) {
        struct scale_step st = {.a = a};
        int result;
        if (store_part(s, scale_step, &st, &result) < 0) {
            rc = STORE_ERROR;
            break;
        }
        if (result == REFUSED) {
            rc = store_app_event(s, a->id, now, "scale_refused", st.o.message);
            json_decref(st.o.extra);
            want = k; /* the decision stands at what could be placed */
            break;
        }
        if ((rc = result) != STORE_OK)
            break;
        *changed = 1;
    }
    /* Down: a replica a gateway reported calls in flight on is kept for
     * now (its calls would be cut); the next pass looks again. */
    for (size_t i = n; rc == STORE_OK && i-- > 0 && (int64_t)live > want;) {
        if (strcmp(r[i].desired, "terminated") == 0)
            continue;
        int busy = store_app_replica_busy(s, a->id, r[i].instance_id, now - daemon_config->app_demand_stale_s);
        if (busy < 0) {
            rc = busy;
            break;
        }
        if (busy)
            continue;
        struct scale_step st = {.a = a, .instance_id = r[i].instance_id};
        int result;
        rc = store_part(s, scale_step, &st, &result) < 0 ? STORE_ERROR : result == REFUSED ? STORE_OK : result;
        json_decref(st.o.extra);
        live--;
        *changed = 1;
    }
    a->desired_replicas = want;
    if (rc == STORE_OK)
        rc = store_app_update(s, a);
done:
    free(r);
    return rc;
}
