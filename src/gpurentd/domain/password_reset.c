/* password_reset.c: the way back into an account whose password is
 * forgotten. A request mails a single-use code to the account's address
 * (only its hash is kept, one live code per account); the confirm checks
 * it, sets the new password, verifies the address (the code proves the
 * mailbox) and ends every session made by logging in, all in one
 * transaction with its account_events row. */
#include "domain/domain.h"
#include "gpurent/clock.h"
#include "gpurent/secrets.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int account_event(struct store *s, const char *user_id, const char *event, const char *from, json_t *detail,
                  int64_t now)
{
    char *text = detail ? json_dumps(detail, JSON_COMPACT | JSON_SORT_KEYS) : strdup("{}");
    if (!text)
        return STORE_ERROR;
    int rc = store_account_event_insert(s, now, user_id, event, from, text);
    free(text);
    return rc;
}

/* The account a reset names, or STORE_NOT_FOUND. */
static int find(struct store *s, const char *email_key, const char *lower, struct user *u)
{
    return store_user_get_by_login(s, email_key, lower, u);
}

struct request_ctx {
    const char *email_key, *lower, *from;
    int64_t now;
    int queued; /* out */
};

/* addr for the inside of a single-quoted shell word: an address may hold
 * a ' (o'brien@...), which closes the word; each becomes '\'' (close,
 * a quoted ', open again). out holds 4 bytes an input byte. */
static void shell_quoted(const char *addr, char *out, size_t n)
{
    size_t o = 0;
    for (const char *p = addr; *p && o + 5 <= n; p++) {
        if (*p == '\'') {
            memcpy(out + o, "'\\''", 4);
            o += 4;
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
}

static int queue_reset_mail(struct store *s, const struct user *u, const char *code, int64_t now)
{
    char base[300], quoted[4 * sizeof u->email_display];
    public_base_url(base, sizeof base);
    const char *to = u->email_display[0] ? u->email_display : u->email;
    shell_quoted(to, quoted, sizeof quoted);
    int64_t minutes = (daemon_config->password_reset_ttl_s + 59) / 60;
    char *body = NULL;
    if (asprintf(&body,
                 "Someone (we hope you) asked to reset the password of the gpurent account\n"
                 "of this address.\n"
                 "\n"
                 "Your password reset code: %s\n"
                 "\n"
                 "It works once, for %lld minutes. Enter it with a new password in the web\n"
                 "console (Log in, then \"Forgot password?\"), or:\n"
                 "\n"
                 "  curl -X POST %s/v1/password-reset/confirm -H 'Content-Type: application/json' \\\n"
                 "    -d '{\"email\":\"%s\",\"code\":\"%s\",\"new_password\":\"...\"}'\n"
                 "\n"
                 "Setting the new password logs out every browser session of the account.\n"
                 "If this was not you, ignore this mail: the password stays as it is.\n",
                 code, (long long)minutes, base, quoted, code) < 0)
        return STORE_ERROR;
    int rc = store_outbox_insert(s, u->id, to, "Reset your gpurent password", body, now);
    secret_wipe(body, strlen(body));
    free(body);
    return rc;
}

static int request_txn(struct store *s, void *vctx)
{
    struct request_ctx *ctx = vctx;
    struct user u;
    ctx->queued = 0;
    int rc = find(s, ctx->email_key, ctx->lower, &u);
    if (rc == STORE_NOT_FOUND || (rc == STORE_OK && !u.active))
        return STORE_OK; /* the same answer, and no mail */
    if (rc != STORE_OK)
        return rc;
    char code[ID_MAX], hash[65];
    if (id_new("prc", code) < 0)
        return STORE_ERROR;
    sha256_hex(code, strlen(code), hash);
    int64_t expires_at = ctx->now + daemon_config->password_reset_ttl_s;
    if ((rc = store_reset_put(s, u.id, hash, ctx->now, expires_at, ctx->from)) == STORE_OK &&
        (rc = queue_reset_mail(s, &u, code, ctx->now)) == STORE_OK) {
        json_t *detail = json_pack("{s:I}", "expires_at", (json_int_t)expires_at);
        rc = account_event(s, u.id, "password_reset_requested", ctx->from, detail, ctx->now);
        json_decref(detail);
    }
    secret_wipe(code, sizeof code);
    if (rc == STORE_OK)
        ctx->queued = 1;
    return rc;
}

int account_reset_request(struct store *s, const char *email_key, const char *lower, const char *from, int *queued)
{
    struct request_ctx ctx = {.email_key = email_key, .lower = lower, .from = from, .now = clock_now()};
    int rc = store_txn(s, request_txn, &ctx);
    *queued = rc == STORE_OK && ctx.queued;
    return rc;
}

struct confirm_ctx {
    const char *email_key, *lower, *from, *password_hash;
    char code_hash[65];
    int64_t now;
    struct reset_done *out;
};

/* A wrong try: counted, and the code deleted when it has had its tries.
 * STORE_OK with out->refused, so the count is committed. */
static int wrong(struct store *s, struct confirm_ctx *ctx, const char *user_id, int64_t failures)
{
    ctx->out->refused = 1;
    if (failures + 1 >= daemon_config->password_reset_max_tries)
        return store_reset_delete(s, user_id);
    return store_reset_fail(s, user_id);
}

static int confirm_txn(struct store *s, void *vctx)
{
    struct confirm_ctx *ctx = vctx;
    struct reset_done *out = ctx->out;
    memset(out, 0, sizeof *out);
    struct user u;
    struct password_reset r;
    int rc = find(s, ctx->email_key, ctx->lower, &u);
    if (rc == STORE_OK)
        rc = store_reset_get(s, u.id, &r);
    if (rc == STORE_NOT_FOUND) {
        out->refused = 1;
        return STORE_OK;
    }
    if (rc != STORE_OK)
        return rc;
    /* An expired code, or one that had its tries under a larger
     * password_reset_max_tries, is gone for good. */
    if (r.expires_at <= ctx->now || r.failures >= daemon_config->password_reset_max_tries) {
        out->refused = 1;
        return store_reset_delete(s, u.id);
    }
    if (!secret_equal(r.code_hash, ctx->code_hash, 64))
        return wrong(s, ctx, u.id, r.failures);
    /* A suspended account gets no new password; its code stays for when
     * it is reinstated, and the answer says no more than a wrong code's. */
    if (!u.active) {
        out->refused = 1;
        return STORE_OK;
    }
    if ((rc = store_reset_delete(s, u.id)) != STORE_OK ||
        (rc = store_user_set_password(s, u.id, ctx->password_hash)) != STORE_OK ||
        (rc = store_api_keys_revoke_all(s, u.id, NULL, 1, ctx->now, &out->login_keys_revoked)) != STORE_OK)
        return rc;
    int64_t kept = store_api_key_live_count(s, u.id, ctx->now);
    if (kept < 0)
        return (int)kept;
    out->api_keys_kept = kept;
    if (!u.email_verified_at) {
        if ((rc = account_mark_verified(s, &u, ctx->now, &out->verified)) != STORE_OK)
            return rc;
        out->verified_now = 1;
    }
    memcpy(out->verified.user_id, u.id, ID_MAX);
    json_t *detail =
        json_pack("{s:I, s:I, s:b}", "login_keys_revoked", (json_int_t)out->login_keys_revoked, "api_keys_kept",
                  (json_int_t)out->api_keys_kept, "email_verified_now", out->verified_now);
    rc = account_event(s, u.id, "password_reset", ctx->from, detail, ctx->now);
    json_decref(detail);
    return rc;
}

int account_reset_confirm(struct store *s, const char *email_key, const char *lower, const char *code,
                          const char *password_hash, const char *from, struct reset_done *out)
{
    struct confirm_ctx ctx = {.email_key = email_key,
                              .lower = lower,
                              .from = from,
                              .password_hash = password_hash,
                              .now = clock_now(),
                              .out = out};
    sha256_hex(code, strlen(code), ctx.code_hash);
    int rc = store_txn(s, confirm_txn, &ctx);
    secret_wipe(ctx.code_hash, sizeof ctx.code_hash);
    return rc;
}
