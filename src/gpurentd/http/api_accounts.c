/* api_accounts.c: POST /v1/signup, POST /v1/login and GET /v1/me. A
 * sign-up is rate-limited and creates an unverified account whose credit
 * waits for the e-mail address to be verified (api_signup.c). */
#include "domain/ledger.h"
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "gpurent/utf8.h"
#include "http/api.h"
#include "loops/loops.h"
#include "store/store.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#define PASSWORD_MIN 10
#define PASSWORD_MAX API_PASSWORD_MAX
#define PASSWORD_BYTES API_PASSWORD_MAX_BYTES

static json_t *user_json(const struct user *u)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:b}", "id", u->id, "email", u->email, "role",
                     u->role == ROLE_ADMIN ? "admin" : "user", "status", u->active ? "active" : "disabled",
                     "invite_code", u->invite_code[0] ? json_string(u->invite_code) : json_null(), "created_at",
                     json_time(u->created_at, 0), "email_verified", u->email_verified_at != 0);
}

static json_t *new_key_json(const char *id, const char *name, const char *token, int64_t created_at)
{
    return json_pack("{s:s, s:s, s:s, s:o}", "id", id, "name", name, "token", token, "created_at",
                     json_time(created_at, 0));
}

int api_password_check(struct http_request *req, const char *field, const char *pw)
{
    size_t n = utf8_chars(pw, strlen(pw));
    if (n < PASSWORD_MIN || n > PASSWORD_MAX) {
        http_error(req, ERR_INVALID_FIELD, field, "%s must be %d to %d characters", field, PASSWORD_MIN, PASSWORD_MAX);
        return -1;
    }
    return 0;
}

int api_password_given_check(struct http_request *req, const char *field, const char *pw)
{
    if (utf8_chars(pw, strlen(pw)) > PASSWORD_MAX) {
        http_error(req, ERR_INVALID_FIELD, field, "%s is longer than %d characters", field, PASSWORD_MAX);
        return -1;
    }
    return 0;
}

static int check_password(struct http_request *req, const char *pw)
{
    return api_password_check(req, "password", pw);
}

/* Invite codes are letters, digits and '-', compared in upper case. */
static int normalize_invite(const char *in, char *out, size_t outlen)
{
    size_t n = strlen(in);
    if (n == 0 || n >= outlen || n > 32)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)in[i];
        if (!isalnum(c) && c != '-')
            return -1;
        out[i] = (char)toupper(c);
    }
    out[n] = '\0';
    return 0;
}

void api_signup(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"email",       JSON_KIND_STRING, 1, 254           },
        {"password",    JSON_KIND_STRING, 1, PASSWORD_BYTES},
        {"invite_code", JSON_KIND_STRING, 0, 32            },
        {NULL,          0,                0, 0             },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    if (signup_rate_check(req) < 0) {
        json_decref(body);
        return;
    }
    struct user u = {.role = ROLE_USER, .active = 1};
    const char *why;
    const char *invite = json_string_value(json_object_get(body, "invite_code"));
    const char *typed = json_string_value(json_object_get(body, "email"));
    snprintf(u.email_display, sizeof u.email_display, "%s", typed);
    snprintf(u.signup_address, sizeof u.signup_address, "%s", req->client_ip);
    if (account_email_normalize(typed, u.email, sizeof u.email, &why) < 0) {
        http_error(req, ERR_INVALID_FIELD, "email", "%s", why);
    } else if (check_password(req, json_string_value(json_object_get(body, "password"))) < 0) {
        /* replied */
    } else if (invite && normalize_invite(invite, u.invite_code, sizeof u.invite_code) < 0) {
        http_error(req, ERR_INVALID_FIELD, "invite_code", "invite_code must be 1 to 32 letters, digits or '-'");
    } else if (password_hash(json_string_value(json_object_get(body, "password")), daemon_config->password_iterations,
                             u.password_hash) < 0) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
    } else {
        struct store *s = store_thread();
        char key_id[ID_MAX], token[API_TOKEN_LEN + 1];
        account_email_key(u.email, u.email_key, sizeof u.email_key);
        int rc = s ? account_signup(s, &u, key_id, token) : STORE_ERROR;
        if (rc == STORE_CONFLICT || rc == STORE_NOT_FOUND || rc == ACCOUNT_CODE_DAY_FULL)
            signup_count_refused(rc == STORE_CONFLICT ? "email_taken" : "invite_code");
        if (rc == STORE_CONFLICT)
            http_error(req, ERR_EMAIL_TAKEN, "email",
                       "an account with this e-mail address, or one that reaches the same mailbox, exists");
        else if (rc == STORE_NOT_FOUND)
            api_invite_refused(req, "invite_code", u.invite_code);
        else if (rc == ACCOUNT_CODE_DAY_FULL)
            http_error(req, ERR_INVALID_INVITE_CODE, "invite_code",
                       "invite code %s has been used as often as it may be today (UTC); try again tomorrow",
                       u.invite_code);
        /* A new account holds nothing, so only a code worth more than
         * max_balance on its own is refused this way. */
        else if (rc == LEDGER_OVER_BALANCE)
            http_error(req, ERR_INVALID_FIELD, "invite_code", "invite code %s grants more than max_balance %s %s",
                       u.invite_code, daemon_config->max_balance, daemon_config->currency);
        else if (rc != STORE_OK)
            http_error(req, ERR_INTERNAL, NULL, NULL);
        else {
            signup_rate_count(req);
            signup_count_ok();
            mailer_wake();
            http_add_header(req, "Location", "/v1/me");
            http_reply_json(req, 201,
                            json_pack("{s:o, s:o, s:{s:s, s:s, s:I}}", "user", user_json(&u), "api_key",
                                      new_key_json(key_id, "signup", token, u.created_at), "email_verification",
                                      "status", "sent", "sent_to", u.email_display, "expires_in_s",
                                      (json_int_t)daemon_config->email_verify_ttl_s));
        }
    }
    json_decref(body);
}

/* Burns the same time as a real password check, so that an unknown email
 * cannot be told from a wrong password by timing. */
static void dummy_password_check(const char *pw)
{
    static char dummy[PASSWORD_HASH_MAX];
    static int64_t dummy_iterations;
    /* Racy initialisation is harmless: any thread's hash is as good. */
    if (dummy_iterations != daemon_config->password_iterations) {
        char h[PASSWORD_HASH_MAX];
        if (password_hash("not-a-password", daemon_config->password_iterations, h) == 0) {
            memcpy(dummy, h, sizeof dummy);
            dummy_iterations = daemon_config->password_iterations;
        }
    }
    (void)password_verify(pw, dummy);
}

void api_login(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"email",    JSON_KIND_STRING, 1, 254           },
        {"password", JSON_KIND_STRING, 1, PASSWORD_BYTES},
        {"key_name", JSON_KIND_STRING, 0, 128           },
        {NULL,       0,                0, 0             },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    const char *password = json_string_value(json_object_get(body, "password"));
    const char *key_name = json_string_value(json_object_get(body, "key_name"));
    if (api_password_given_check(req, "password", password) < 0) {
        json_decref(body);
        return;
    }
    char email[256], email_key[300], ip_key[80];
    const char *why;
    char lower[256];
    if (account_email_normalize(json_string_value(json_object_get(body, "email")), lower, sizeof lower, &why) < 0) {
        http_error(req, ERR_INVALID_FIELD, "email", "%s", why);
        json_decref(body);
        return;
    }
    /* Any spelling that reaches the mailbox logs in (and shares its lockout). */
    account_email_key(lower, email, sizeof email);
    snprintf(email_key, sizeof email_key, "email:%s", email);
    snprintf(ip_key, sizeof ip_key, "ip:%s", req->client_ip);
    int64_t now = clock_now();
    if (throttle_refused(req, email_key, ip_key, now, "failed logins")) {
        json_decref(body);
        return;
    }
    struct store *s = store_thread();
    struct user u;
    int rc = s ? store_user_get_by_login(s, email, lower, &u) : STORE_ERROR;
    if (rc != STORE_OK && rc != STORE_NOT_FOUND) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
    } else if (rc == STORE_NOT_FOUND || !u.password_hash[0] || !password_verify(password, u.password_hash)) {
        if (rc == STORE_NOT_FOUND || !u.password_hash[0])
            dummy_password_check(password);
        throttle_fail_both(email_key, ip_key, now);
        http_error(req, ERR_INVALID_CREDENTIALS, NULL, NULL);
    } else if (!u.active) {
        http_error(req, ERR_ACCOUNT_DISABLED, NULL, NULL);
    } else {
        throttle_clear(email_key);
        char key_id[ID_MAX], token[API_TOKEN_LEN + 1];
        int64_t created_at;
        const char *name = key_name ? key_name : "login";
        int64_t ttl = daemon_config->login_key_ttl_s;
        rc = account_login_key(s, u.id, name, ttl, key_id, token, &created_at);
        if (rc == ACCOUNT_KEY_LIMIT) {
            http_error_ext(req, ERR_QUOTA_EXCEEDED, NULL,
                           json_pack("{s:I}", "limit", (json_int_t)daemon_config->max_api_keys_per_user),
                           "this account holds %lld live API keys (max_api_keys_per_user), none made by logging in;"
                           " revoke one with one of them first",
                           (long long)daemon_config->max_api_keys_per_user);
        } else if (rc != STORE_OK) {
            http_error(req, ERR_INTERNAL, NULL, NULL);
        } else {
            json_t *key = new_key_json(key_id, name, token, created_at);
            json_object_set_new(key, "expires_at", json_time(ttl > 0 ? created_at + ttl : 0, 1));
            http_reply_json(req, 200, json_pack("{s:o, s:o}", "user", user_json(&u), "api_key", key));
        }
    }
    json_decref(body);
}

void api_me(struct http_request *req)
{
    struct store *s = store_thread();
    struct user u;
    if (!s || store_user_get(s, req->user_id, &u) != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    json_t *j = user_json(&u);
    json_object_set_new(j, "api_key_id", json_string(req->key_id));
    http_reply_json(req, 200, j);
}
