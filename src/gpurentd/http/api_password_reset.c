/* api_password_reset.c: POST /v1/password-reset and POST
 * /v1/password-reset/confirm, the way back into an account whose password
 * is forgotten (domain/password_reset.c). The request answers the same
 * whether or not the address has an account, and is limited per e-mail
 * address and per client address as sign-ups are (the throttle table);
 * the confirm answers one error for every code that does not work, and
 * counts wrong ones as failed logins from that client. */
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "gpurent/secrets.h"
#include "http/api.h"
#include "loops/loops.h"
#include "store/store.h"

#include <stdio.h>
#include <string.h>

#define RESET_WINDOW_S 3600 /* the rate options are per hour */

struct reset_keys {
    char lower[256];     /* the address lower-cased, as stored */
    char email_key[256]; /* its normalised form (account_email_key) */
    char by_email[300];  /* throttle key of the address */
    char by_client[128]; /* throttle key of the client (its /64 for IPv6) */
};

/* Validates the email field into k; replies 400 and -1 when it is bad. */
static int address(struct http_request *req, json_t *body, struct reset_keys *k)
{
    const char *why;
    if (account_email_normalize(json_string_value(json_object_get(body, "email")), k->lower, sizeof k->lower, &why) <
        0) {
        http_error(req, ERR_INVALID_FIELD, "email", "%s", why);
        return -1;
    }
    /* Every spelling that reaches the mailbox shares the address's limit. */
    account_email_key(k->lower, k->email_key, sizeof k->email_key);
    snprintf(k->by_email, sizeof k->by_email, "reset-email:%s", k->email_key);
    /* An IPv6 host has a /64 to pick addresses from: it counts as one. */
    char net[80];
    throttle_network(req->client_ip, 32, net, sizeof net);
    snprintf(k->by_client, sizeof k->by_client, "reset-addr:%s", net);
    return 0;
}

/* 429 with Retry-After when the address or the client has had its hour's
 * requests: the same for addresses with and without an account. */
static int rate_refused(struct http_request *req, const struct reset_keys *k, int64_t now)
{
    int64_t we = daemon_config->password_reset_rate_per_email ? throttle_wait(k->by_email, now) : 0;
    int64_t wc = daemon_config->password_reset_rate_per_address ? throttle_wait(k->by_client, now) : 0;
    if (we <= 0 && wc <= 0)
        return 0;
    int64_t wait = we > wc ? we : wc;
    char retry[24];
    snprintf(retry, sizeof retry, "%lld", (long long)wait);
    http_add_header(req, "Retry-After", retry);
    http_error(req, ERR_TOO_MANY_REQUESTS, NULL, "too many password reset requests %s; retry in %lld seconds",
               wc > 0 ? "from this client address" : "for this e-mail address", (long long)wait);
    return 1;
}

void api_password_reset(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"email", JSON_KIND_STRING, 1, 254},
        {NULL,    0,                0, 0  },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    struct reset_keys k;
    int64_t now = clock_now();
    if (address(req, body, &k) < 0 || rate_refused(req, &k, now)) {
        json_decref(body);
        return;
    }
    json_decref(body);
    struct store *s = store_thread();
    int queued = 0;
    int rc = s ? account_reset_request(s, k.email_key, k.lower, req->client_ip, &queued) : STORE_ERROR;
    if (rc == STORE_BUSY) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return;
    }
    if (rc != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    /* The limit-th request of an hour starts an hour's wait, as for
     * sign-ups; counted whether or not the address has an account. */
    int64_t per_email = daemon_config->password_reset_rate_per_email,
            per_client = daemon_config->password_reset_rate_per_address;
    if (per_email)
        throttle_fail(k.by_email, now, per_email, RESET_WINDOW_S);
    if (per_client)
        throttle_fail(k.by_client, now, per_client, RESET_WINDOW_S);
    if (queued)
        mailer_wake();
    http_reply_json(
        req, 202,
        json_pack("{s:s, s:I}", "status", "accepted", "expires_in_s", (json_int_t)daemon_config->password_reset_ttl_s));
}

void api_password_reset_confirm(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"email",        JSON_KIND_STRING, 1, 254                   },
        {"code",         JSON_KIND_STRING, 1, 64                    },
        {"new_password", JSON_KIND_STRING, 1, API_PASSWORD_MAX_BYTES},
        {NULL,           0,                0, 0                     },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    struct reset_keys k;
    const char *code = json_string_value(json_object_get(body, "code"));
    const char *next = json_string_value(json_object_get(body, "new_password"));
    char ip_key[80], login_key[300], hash[PASSWORD_HASH_MAX] = "";
    int64_t now = clock_now();
    /* Wrong codes count as failed logins from the client (login_max_failures
     * x 4, login_lockout_s), not against the account: a stranger's guesses
     * must not lock its owner out of the reset. Each code also dies after
     * password_reset_max_tries wrong ones. */
    snprintf(ip_key, sizeof ip_key, "ip:%s", req->client_ip);
    if (address(req, body, &k) < 0 || throttle_refused(req, ip_key, ip_key, now, "wrong codes or passwords") ||
        api_password_check(req, "new_password", next) < 0)
        goto done;
    if (!id_valid("prc", code)) {
        http_error(req, ERR_INVALID_RESET_CODE, "code",
                   "a password reset code looks like prc_ and 20 letters or digits, as the mail gives it");
        goto done;
    }
    if (password_hash(next, daemon_config->password_iterations, hash) < 0) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        goto done;
    }
    struct store *s = store_thread();
    struct reset_done out;
    int rc = s ? account_reset_confirm(s, k.email_key, k.lower, code, hash, req->client_ip, &out) : STORE_ERROR;
    if (rc == STORE_BUSY) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
    } else if (rc != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
    } else if (out.refused) {
        throttle_fail(ip_key, now, daemon_config->login_max_failures * 4, daemon_config->login_lockout_s);
        http_error(req, ERR_INVALID_RESET_CODE, "code", NULL);
    } else {
        /* The owner is back: a lockout of its logins ends with the reset. */
        snprintf(login_key, sizeof login_key, "email:%s", k.email_key);
        throttle_clear(login_key);
        log_info("accounts: %s reset its password; %lld login keys revoked, %lld API keys kept", out.verified.user_id,
                 (long long)out.login_keys_revoked, (long long)out.api_keys_kept);
        const struct account_verified *v = &out.verified;
        json_t *credit = v->grant_id[0]
                             ? json_pack("{s:s, s:s, s:o, s:s}", "grant_id", v->grant_id, "source", v->source, "amount",
                                         json_money(v->amount), "currency", daemon_config->currency)
                             : json_null();
        http_reply_json(req, 200,
                        json_pack("{s:b, s:I, s:I, s:b, s:o}", "changed", 1, "login_keys_revoked",
                                  (json_int_t)out.login_keys_revoked, "api_keys_kept", (json_int_t)out.api_keys_kept,
                                  "email_verified", 1, "credit", credit));
    }
done:
    secret_wipe(hash, sizeof hash);
    json_decref(body);
}
