/* api_signup.c: what keeps trial credit for people (issue 13): sign-up
 * rate limits per client address and subnet, e-mail verification
 * (POST /v1/verify-email, /resend), the gate that keeps unverified
 * accounts from launching, the admin's look-up, suspension and sign-up
 * list, and the sign-up counters /metrics prints. */
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "http/api.h"
#include "loops/loops.h"
#include "store/store.h"

#include <arpa/inet.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIGNUP_WINDOW_S 3600 /* the rate options are per hour */
#define RESEND_INTERVAL_S 60 /* one resend a minute per account */

/* ---------------------------------------------------------------- counters */

static const char *const refusal_reasons[] = {"rate_address", "rate_subnet", "email_taken", "invite_code"};
#define N_REASONS (sizeof refusal_reasons / sizeof refusal_reasons[0])
static atomic_llong signups, refused[N_REASONS];

void signup_count_refused(const char *reason)
{
    for (size_t i = 0; i < N_REASONS; i++)
        if (strcmp(reason, refusal_reasons[i]) == 0)
            atomic_fetch_add(&refused[i], 1);
}

void signup_count_ok(void)
{
    atomic_fetch_add(&signups, 1);
}

void signup_metrics_write(FILE *f)
{
    fprintf(f,
            "# HELP gpurent_signups_total Accounts created by POST /v1/signup.\n"
            "# TYPE gpurent_signups_total counter\ngpurent_signups_total %lld\n"
            "# HELP gpurent_signups_refused_total Sign-ups refused, by reason (rate limits, a taken address, a bad"
            " invite code).\n"
            "# TYPE gpurent_signups_refused_total counter\n",
            (long long)atomic_load(&signups));
    for (size_t i = 0; i < N_REASONS; i++)
        fprintf(f, "gpurent_signups_refused_total{reason=\"%s\"} %lld\n", refusal_reasons[i],
                (long long)atomic_load(&refused[i]));
    int64_t sent, failures, given_up;
    mailer_counters(&sent, &failures, &given_up);
    fprintf(f,
            "# HELP gpurent_mail_sent_total Mail handed to the SMTP server (or logged, without smtp_url).\n"
            "# TYPE gpurent_mail_sent_total counter\ngpurent_mail_sent_total %lld\n"
            "# HELP gpurent_mail_failures_total Tries to send mail that failed (each is retried later).\n"
            "# TYPE gpurent_mail_failures_total counter\ngpurent_mail_failures_total %lld\n"
            "# HELP gpurent_mail_given_up_total Mail the mailer stopped retrying.\n"
            "# TYPE gpurent_mail_given_up_total counter\ngpurent_mail_given_up_total %lld\n",
            (long long)sent, (long long)failures, (long long)given_up);
}

/* ---------------------------------------------------------------- rate limits */

static void keys(const struct http_request *req, char *addr_key, char *net_key, size_t n)
{
    char net[80];
    throttle_network(req->client_ip, 24, net, sizeof net);
    snprintf(addr_key, n, "signup-addr:%s", req->client_ip);
    snprintf(net_key, n, "signup-net:%s", net);
}

int signup_rate_check(struct http_request *req)
{
    char ak[128], nk[128];
    keys(req, ak, nk, sizeof ak);
    int64_t now = clock_now();
    int64_t wa = daemon_config->signup_rate_per_address ? throttle_wait(ak, now) : 0;
    int64_t wn = daemon_config->signup_rate_per_subnet ? throttle_wait(nk, now) : 0;
    if (wa <= 0 && wn <= 0)
        return 0;
    int64_t wait = wa > wn ? wa : wn;
    char retry[24];
    snprintf(retry, sizeof retry, "%lld", (long long)wait);
    http_add_header(req, "Retry-After", retry);
    signup_count_refused(wa > 0 ? "rate_address" : "rate_subnet");
    http_error(req, ERR_TOO_MANY_REQUESTS, NULL, "too many sign-ups from %s; retry in %lld seconds",
               wa > 0 ? "this address" : "this network", (long long)wait);
    return -1;
}

void signup_rate_count(struct http_request *req)
{
    char ak[128], nk[128];
    keys(req, ak, nk, sizeof ak);
    int64_t now = clock_now(), per_address = daemon_config->signup_rate_per_address,
            per_subnet = daemon_config->signup_rate_per_subnet;
    /* The login throttle's table counts and locks: the limit-th sign-up of
     * an hour starts an hour's lockout. */
    if (per_address)
        throttle_fail(ak, now, per_address, SIGNUP_WINDOW_S);
    if (per_subnet)
        throttle_fail(nk, now, per_subnet, SIGNUP_WINDOW_S);
}

/* ---------------------------------------------------------------- verification */

void api_verify_email(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"token", JSON_KIND_STRING, 1, 64},
        {NULL,    0,                0, 0 },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    const char *token = json_string_value(json_object_get(body, "token"));
    struct store *s = store_thread();
    struct account_verified v;
    int rc = !id_valid("evc", token) ? ACCOUNT_TOKEN_UNKNOWN : s ? account_verify(s, token, &v) : STORE_ERROR;
    json_decref(body);
    if (rc == ACCOUNT_TOKEN_UNKNOWN)
        http_error(req, ERR_INVALID_FIELD, "token", "no such verification code (it looks like evc_ and 20 letters or digits)");
    else if (rc == ACCOUNT_TOKEN_USED)
        http_error(req, ERR_INVALID_FIELD, "token", "this verification code was used already");
    else if (rc == ACCOUNT_TOKEN_EXPIRED)
        http_error(req, ERR_INVALID_FIELD, "token",
                   "this verification code has expired; sign in and ask for another (POST /v1/verify-email/resend)");
    else if (rc == STORE_BUSY)
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else {
        json_t *credit = v.grant_id[0] ? json_pack("{s:s, s:s, s:o, s:s}", "grant_id", v.grant_id, "source", v.source,
                                                   "amount", json_money(v.amount), "currency", daemon_config->currency)
                                       : json_null();
        http_reply_json(req, 200,
                        json_pack("{s:s, s:b, s:o}", "user_id", v.user_id, "email_verified", 1, "credit", credit));
    }
}

void api_verify_email_resend(struct http_request *req)
{
    static const struct json_field fields[] = {
        {NULL, 0, 0, 0},
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    json_decref(body);
    char key[64];
    snprintf(key, sizeof key, "resend:%s", req->user_id);
    int64_t now = clock_now(), wait = throttle_wait(key, now);
    if (wait > 0) {
        char retry[24];
        snprintf(retry, sizeof retry, "%lld", (long long)wait);
        http_add_header(req, "Retry-After", retry);
        http_error(req, ERR_TOO_MANY_REQUESTS, NULL, "a verification mail was sent less than %d seconds ago; retry in %lld seconds",
                   RESEND_INTERVAL_S, (long long)wait);
        return;
    }
    struct store *s = store_thread();
    int rc = s ? account_resend_verification(s, req->user_id) : STORE_ERROR;
    if (rc == ACCOUNT_ALREADY_VERIFIED)
        http_error(req, ERR_CONFLICT, NULL, "this account's e-mail address is verified already");
    else if (rc == STORE_BUSY)
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else {
        throttle_fail(key, now, 1, RESEND_INTERVAL_S);
        mailer_wake();
        http_reply_json(req, 202, json_pack("{s:s, s:I}", "status", "queued", "expires_in_s",
                                            (json_int_t)daemon_config->email_verify_ttl_s));
    }
}

/* 0 when the caller's address is verified; else replies 403 and -1. */
static int require_verified(struct http_request *req)
{
    struct store *s = store_thread();
    struct user u;
    if (!s || store_user_get(s, req->user_id, &u) != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return -1;
    }
    if (!u.email_verified_at) {
        http_error(req, ERR_EMAIL_NOT_VERIFIED, NULL, NULL);
        return -1;
    }
    return 0;
}

void api_instances_create_verified(struct http_request *req)
{
    if (require_verified(req) == 0)
        api_instances_create(req);
}

void api_instances_start_verified(struct http_request *req)
{
    if (require_verified(req) == 0)
        api_instances_start(req);
}

/* A volume is billed per GB-month from its creation, so it waits for the
 * verified address as a launch does: no storage owed by an address nobody
 * answers at. */
void api_volumes_create_verified(struct http_request *req)
{
    if (require_verified(req) == 0)
        api_volumes_create(req);
}

/* An app's replicas are the publisher's instances, started by the scaler
 * (which checks again, domain/apps.c): publishing waits for the verified
 * address as a launch does. */
void api_apps_create_verified(struct http_request *req)
{
    if (require_verified(req) == 0)
        api_apps_create(req);
}

/* ---------------------------------------------------------------- admin */

json_t *admin_user_json(const struct user *u)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:o, s:b, s:o, s:o, s:o, s:o}", "id", u->id, "email", u->email,
                     "email_display", u->email_display[0] ? u->email_display : u->email, "role",
                     u->role == ROLE_ADMIN ? "admin" : "user", "status", u->active ? "active" : "disabled",
                     "invite_code", u->invite_code[0] ? json_string(u->invite_code) : json_null(), "email_verified",
                     u->email_verified_at != 0, "email_verified_at", json_time(u->email_verified_at, 1), "trial_at",
                     json_time(u->trial_at, 1), "signup_address",
                     u->signup_address[0] ? json_string(u->signup_address) : json_null(), "created_at",
                     json_time(u->created_at, 0));
}

void api_admin_users_find(struct http_request *req)
{
    static const char *const allowed[] = {"email", NULL};
    if (http_query_allow(req, allowed) < 0)
        return;
    const char *email = http_query(req, "email");
    char lower[256], key[256];
    const char *why = "email is required, e.g. ?email=name@example.com";
    if (!email || account_email_normalize(email, lower, sizeof lower, &why) < 0) {
        http_error(req, ERR_INVALID_QUERY, "email", "%s", why);
        return;
    }
    account_email_key(lower, key, sizeof key);
    struct store *s = store_thread();
    struct user u;
    int rc = s ? store_user_get_by_login(s, key, lower, &u) : STORE_ERROR;
    if (rc != STORE_OK && rc != STORE_NOT_FOUND) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    json_t *data = json_array();
    if (rc == STORE_OK)
        json_array_append_new(data, admin_user_json(&u));
    http_reply_json(req, 200, json_pack("{s:o}", "data", data));
}

struct status_ctx {
    const struct http_request *req;
    const char *user_id;
    const char *reason;
    int active;
    int64_t stopped; /* out */
    struct user u;   /* out */
};

#define SELF_SUSPEND (-130)

static int status_txn(struct store *s, void *vctx)
{
    struct status_ctx *ctx = vctx;
    int rc = store_user_get(s, ctx->user_id, &ctx->u);
    if (rc != STORE_OK)
        return rc;
    if (!ctx->active && strcmp(ctx->user_id, ctx->req->user_id) == 0)
        return SELF_SUSPEND;
    if ((rc = account_set_active(s, ctx->user_id, ctx->active, &ctx->stopped)) != STORE_OK)
        return rc;
    ctx->u.active = ctx->active;
    json_t *detail = json_pack("{s:s, s:I}", "status", ctx->active ? "active" : "disabled", "instances_stopped",
                               (json_int_t)ctx->stopped);
    rc = audit_record(s, ctx->req, ctx->active ? "reinstate" : "suspend", ctx->user_id, -1, detail, ctx->reason);
    json_decref(detail);
    return rc;
}

static void set_status(struct http_request *req, int active)
{
    static const struct json_field fields[] = {
        {"reason", JSON_KIND_STRING, 1, 4 * AUDIT_REASON_MAX},
        {NULL,     0,                0, 0                   },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    struct status_ctx ctx = {.req = req, .user_id = req->params[0], .active = active};
    if (audit_reason(req, body, AUDIT_REASON_MAX, &ctx.reason) < 0) {
        json_decref(body);
        return;
    }
    struct store *s = store_thread();
    int rc = !s ? STORE_ERROR : id_valid("usr", ctx.user_id) ? store_txn(s, status_txn, &ctx) : STORE_NOT_FOUND;
    json_decref(body);
    if (rc == STORE_NOT_FOUND)
        http_error(req, ERR_NOT_FOUND, NULL, "no user %.32s", req->params[0]);
    else if (rc == SELF_SUSPEND)
        http_error(req, ERR_CONFLICT, NULL, "an admin cannot suspend their own account");
    else if (rc == STORE_BUSY)
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else {
        if (ctx.stopped)
            reconciler_wake();
        http_reply_json(req, 200,
                        json_pack("{s:o, s:I}", "user", admin_user_json(&ctx.u), "instances_stopped",
                                  (json_int_t)ctx.stopped));
    }
}

void api_admin_users_suspend(struct http_request *req)
{
    set_status(req, 0);
}

void api_admin_users_reinstate(struct http_request *req)
{
    set_status(req, 1);
}

void api_admin_signups(struct http_request *req)
{
    static const char *const allowed[] = {"address", "limit", NULL};
    if (http_query_allow(req, allowed) < 0)
        return;
    int64_t limit;
    if (http_query_int(req, "limit", 1, 1000, 100, &limit) < 0)
        return;
    const char *address = http_query(req, "address");
    unsigned char buf[sizeof(struct in6_addr)];
    if (address && inet_pton(AF_INET, address, buf) != 1 && inet_pton(AF_INET6, address, buf) != 1) {
        http_error(req, ERR_INVALID_QUERY, "address", "address must be an IPv4 or IPv6 address like 203.0.113.7");
        return;
    }
    struct store *s = store_thread();
    struct user *rows = NULL;
    size_t n = 0;
    if (!s || store_signups_list(s, address, (size_t)limit, &rows, &n) != STORE_OK) {
        free(rows);
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    json_t *data = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(data, admin_user_json(&rows[i]));
    free(rows);
    http_reply_json(req, 200, json_pack("{s:o}", "data", data));
}
