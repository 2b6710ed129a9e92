/* accounts.c: creating accounts and API keys, shared by the sign-up
 * endpoint, the key endpoints and `gpurentd admin create-user`. */
#include "domain/domain.h"
#include "domain/ledger.h"
#include "gpurent/clock.h"
#include "gpurent/money.h"
#include "store/store.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

int account_email_normalize(const char *in, char *out, size_t outlen, const char **why)
{
    size_t n = strlen(in);
    const char *at = strchr(in, '@');
    if (n < 3 || n > 254 || n >= outlen) {
        *why = "email must be 3 to 254 characters";
        return -1;
    }
    if (!at || at == in || strchr(at + 1, '@') || !at[1]) {
        *why = "email must look like name@domain";
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)in[i];
        if (c <= ' ' || c == 0x7f || c == '"' || c == '<' || c == '>' || c == '(' || c == ')' || c == ',' || c == ';' ||
            c == '\\') {
            *why = "email has a character that is not allowed";
            return -1;
        }
        out[i] = (char)tolower(c);
    }
    out[n] = '\0';
    return 0;
}

struct create_ctx {
    struct user *user;  /* in: email, hash, role; out: id, created_at */
    struct api_key key; /* the first key */
    int signup;         /* grant the trial credit and redeem the invite code */
};

/* A bad invite code at sign-up: the whole sign-up rolls back. */
#define BAD_INVITE (-101)

static int create_txn(struct store *s, void *vctx)
{
    struct create_ctx *ctx = vctx;
    int rc = store_user_insert(s, ctx->user);
    if (rc != STORE_OK || (rc = store_api_key_insert(s, &ctx->key)) != STORE_OK || !ctx->signup)
        return rc;
    /* A new account gets the trial credit, or instead what its invite code
     * grants. */
    int64_t credit = 0, now = ctx->user->created_at;
    if (ctx->user->invite_code[0]) {
        char grant[ID_MAX];
        rc = ledger_redeem_invite(s, ctx->user->id, ctx->user->invite_code, now, grant);
        return rc == STORE_NOT_FOUND || rc == STORE_CONFLICT ? BAD_INVITE : rc;
    }
    money_parse(daemon_config->signup_credit, &credit);
    if (credit > 0)
        rc = ledger_grant(s, ctx->user->id, "signup", credit,
                          daemon_config->signup_credit_days ? now + daemon_config->signup_credit_days * 86400 : 0, now,
                          "trial credit for a new account", NULL);
    return rc;
}

static int new_key(struct api_key *k, const char *user_id, const char *name, char *token, int64_t now)
{
    memset(k, 0, sizeof *k);
    if (api_key_new(k->id, token, k->secret_hash) < 0)
        return -1;
    snprintf(k->user_id, sizeof k->user_id, "%s", user_id);
    snprintf(k->name, sizeof k->name, "%s", name);
    k->created_at = now;
    return 0;
}

static int create(struct store *s, struct user *u, const char *key_name, char *key_id, char *token, int signup)
{
    struct create_ctx ctx = {.user = u, .signup = signup};
    u->created_at = clock_now();
    if (id_new("usr", u->id) < 0 || new_key(&ctx.key, u->id, key_name, token, u->created_at) < 0)
        return STORE_ERROR;
    int rc = store_txn(s, create_txn, &ctx);
    if (rc == STORE_OK)
        memcpy(key_id, ctx.key.id, ID_MAX);
    return rc == BAD_INVITE ? STORE_NOT_FOUND : rc;
}

int account_create(struct store *s, struct user *u, const char *key_name, char *key_id, char *token)
{
    return create(s, u, key_name, key_id, token, 0);
}

int account_signup(struct store *s, struct user *u, char *key_id, char *token)
{
    return create(s, u, "signup", key_id, token, 1);
}

static int key_txn(struct store *s, void *vctx)
{
    return store_api_key_insert(s, vctx);
}

int account_key_create(struct store *s, const char *user_id, const char *name, char *key_id, char *token,
                       int64_t *created_at)
{
    return account_login_key(s, user_id, name, 0, key_id, token, created_at);
}

int account_login_key(struct store *s, const char *user_id, const char *name, int64_t ttl_s, char *key_id,
                      char *token, int64_t *created_at)
{
    struct api_key k;
    if (new_key(&k, user_id, name, token, clock_now()) < 0)
        return STORE_ERROR;
    k.expires_at = ttl_s > 0 ? k.created_at + ttl_s : 0;
    int rc = store_txn(s, key_txn, &k);
    if (rc == STORE_OK) {
        memcpy(key_id, k.id, ID_MAX);
        *created_at = k.created_at;
    }
    return rc;
}
