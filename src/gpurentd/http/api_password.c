/* api_password.c: POST /v1/me/password — change the account's password,
 * proving the current one, end the sessions other logins opened, and
 * record it in account_events. */
#include "gpurent/clock.h"
#include "gpurent/secrets.h"
#include "http/api.h"
#include "store/store.h"

#include <string.h>

struct password_ctx {
    const char *user_id;
    const char *key_id;  /* the calling key: kept */
    const char *current; /* as typed */
    char hash[PASSWORD_HASH_MAX];
    int wrong;           /* out: current did not match */
    int64_t now;
    int64_t revoked;     /* out: other login keys revoked */
    const char *from;    /* the client, for account_events */
};

/* The check and the change in one transaction, so two changes racing with
 * the same current password cannot both pass. */
static int password_txn(struct store *s, void *vctx)
{
    struct password_ctx *ctx = vctx;
    struct user u;
    int rc = store_user_get(s, ctx->user_id, &u);
    if (rc != STORE_OK)
        return rc;
    ctx->wrong = !u.password_hash[0] || !password_verify(ctx->current, u.password_hash);
    if (ctx->wrong)
        return REFUSED;
    if ((rc = store_user_set_password(s, ctx->user_id, ctx->hash)) != STORE_OK)
        return rc;
    if ((rc = store_api_keys_revoke_all(s, ctx->user_id, ctx->key_id, 1, ctx->now, &ctx->revoked)) != STORE_OK)
        return rc;
    json_t *detail = json_pack("{s:I, s:s}", "login_keys_revoked", (json_int_t)ctx->revoked, "api_key_id", ctx->key_id);
    rc = account_event(s, ctx->user_id, "password_change", ctx->from, detail, ctx->now);
    json_decref(detail);
    return rc;
}

void api_me_password(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"current_password", JSON_KIND_STRING, 1, API_PASSWORD_MAX_BYTES},
        {"new_password",     JSON_KIND_STRING, 1, API_PASSWORD_MAX_BYTES},
        {NULL,               0,                0, 0                     },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    const char *current = json_string_value(json_object_get(body, "current_password"));
    const char *next = json_string_value(json_object_get(body, "new_password"));
    struct password_ctx ctx = {.user_id = req->user_id, .key_id = req->key_id, .current = current,
                               .now = clock_now(), .from = req->client_ip};
    /* Guesses at the current password are limited as logins are (per
     * account and per client, login_max_failures and login_lockout_s): an
     * API key that leaked must not be a way to find the password. */
    char user_key[80], ip_key[80];
    snprintf(user_key, sizeof user_key, "password:%s", req->user_id);
    snprintf(ip_key, sizeof ip_key, "ip:%s", req->client_ip);
    if (throttle_refused(req, user_key, ip_key, ctx.now, "wrong current passwords")) {
        json_decref(body);
        return;
    }
    if (api_password_given_check(req, "current_password", current) < 0 ||
        api_password_check(req, "new_password", next) < 0) {
        json_decref(body);
        return;
    }
    if (password_hash(next, daemon_config->password_iterations, ctx.hash) < 0) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        json_decref(body);
        return;
    }
    struct store *s = store_thread();
    int rc = s ? store_txn(s, password_txn, &ctx) : STORE_ERROR;
    if (rc == REFUSED && ctx.wrong) {
        throttle_fail_both(user_key, ip_key, ctx.now);
        /* 403, not 401: the API key is fine, the proof of the password is not. */
        http_error(req, ERR_FORBIDDEN, "current_password", "current_password is not the account's password");
    } else if (rc != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
    } else {
        throttle_clear(user_key);
        log_info("accounts: %s changed its password; %lld login keys revoked", req->user_id, (long long)ctx.revoked);
        http_reply_json(req, 200, json_pack("{s:b, s:I}", "changed", 1, "login_keys_revoked", (json_int_t)ctx.revoked));
    }
    explicit_bzero(ctx.hash, sizeof ctx.hash);
    json_decref(body);
}
