/* accounts.c: creating accounts and API keys, shared by the sign-up
 * endpoint, the key endpoints and `gpurentd admin create-user`; e-mail
 * normalisation, verification and the one trial per account (issue 13). */
#include "domain/domain.h"
#include "domain/ledger.h"
#include "gpurent/clock.h"
#include "gpurent/money.h"
#include "gpurent/secrets.h"
#include "store/store.h"

#include <ctype.h>
#include <stdlib.h>
#include <strings.h>
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
    /* RFC 5321's domain is labels joined by dots: none empty. "x@gmail.com."
     * reaches x@gmail.com's mailbox by DNS, yet would be another account. */
    const char *domain = at + 1;
    if (domain[0] == '.' || domain[strlen(domain) - 1] == '.' || strstr(domain, "..")) {
        *why = "email's domain must not begin or end with a dot, or hold two in a row";
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

/* Whether domain is in the comma-separated list (spaces allowed). */
static int domain_listed(const char *list, const char *domain)
{
    size_t dn = strlen(domain);
    for (const char *p = list; *p;) {
        while (*p == ',' || *p == ' ')
            p++;
        size_t n = strcspn(p, ", ");
        if (n == dn && n && strncasecmp(p, domain, n) == 0)
            return 1;
        p += n;
    }
    return 0;
}

/* The domain alias names in email_domain_aliases ("alias=domain, ..."),
 * or domain itself. */
static const char *domain_canonical(const char *domain, char *buf, size_t buflen)
{
    size_t dn = strlen(domain);
    for (const char *p = daemon_config->email_domain_aliases; *p;) {
        while (*p == ',' || *p == ' ')
            p++;
        size_t n = strcspn(p, ", ");
        const char *eq = memchr(p, '=', n);
        if (eq && (size_t)(eq - p) == dn && strncasecmp(p, domain, dn) == 0) {
            snprintf(buf, buflen, "%.*s", (int)(n - (size_t)(eq + 1 - p)), eq + 1);
            return buf;
        }
        p += n;
    }
    return domain;
}

void account_email_key(const char *email, char *out, size_t outlen)
{
    const char *at = strrchr(email, '@');
    size_t o = 0;
    if (!at || outlen == 0) {
        snprintf(out, outlen, "%s", email);
        return;
    }
    char alias_buf[256];
    const char *domain = domain_canonical(at + 1, alias_buf, sizeof alias_buf);
    int dotless = domain_listed(daemon_config->email_dotless_domains, domain);
    for (const char *p = email; p < at && o + 1 < outlen; p++) {
        /* A local part that starts with '+' keeps it: "+@x" would be empty. */
        if (*p == '+' && daemon_config->email_strip_plus_tags && p > email)
            break;
        if (*p == '.' && dotless)
            continue;
        out[o++] = *p;
    }
    if (o == 0 && o + 1 < outlen) /* all dots: keep the address as it is */
        return (void)snprintf(out, outlen, "%s", email);
    snprintf(out + o, outlen - o, "@%s", domain);
}

/* The verification mail for u with code token, queued in the caller's
 * transaction. */
static int queue_verification(struct store *s, const struct user *u, int64_t now)
{
    char token[ID_MAX], hash[65];
    if (id_new("evc", token) < 0)
        return STORE_ERROR;
    sha256_hex(token, strlen(token), hash);
    int rc = store_verification_insert(s, hash, u->id, now, now + daemon_config->email_verify_ttl_s);
    if (rc != STORE_OK)
        return rc;
    char base[300];
    public_base_url(base, sizeof base);
    const char *to = u->email_display[0] ? u->email_display : u->email;
    char *body = NULL;
    if (asprintf(&body,
                 "Someone (we hope you) signed up for gpurent with this address.\n"
                 "\n"
                 "Your verification code: %s\n"
                 "\n"
                 "Verify the address with it within %lld hours:\n"
                 "\n"
                 "  curl -X POST %s/v1/verify-email -H 'Content-Type: application/json' -d '{\"token\":\"%s\"}'\n"
                 "\n"
                 "Your trial credit is granted when the address is verified; until then the\n"
                 "account can look around but not launch instances. If this was not you,\n"
                 "ignore this mail: nothing happens without the code.\n",
                 token, (long long)((daemon_config->email_verify_ttl_s + 3599) / 3600), base, token) < 0)
        return STORE_ERROR;
    rc = store_outbox_insert(s, u->id, to, "Verify your gpurent e-mail address", body, now);
    free(body);
    return rc;
}

struct create_ctx {
    struct user *user;  /* in: email, hash, role; out: id, created_at */
    struct api_key key; /* the first key */
    int signup;         /* unverified, with a verification mail queued */
};

/* A bad invite code at sign-up: the whole sign-up rolls back. */
#define BAD_INVITE (-101)

static int create_txn(struct store *s, void *vctx)
{
    struct create_ctx *ctx = vctx;
    int64_t now = ctx->user->created_at;
    /* A code given at sign-up is checked now (so the person hears of a bad
     * one at once) and redeemed at verification. */
    if (ctx->signup && ctx->user->invite_code[0]) {
        struct invite_code c;
        int rc = store_invite_get(s, ctx->user->invite_code, &c);
        if (rc == STORE_NOT_FOUND || (rc == STORE_OK && ((c.expires_at && c.expires_at <= now) ||
                                                         (c.max_uses && c.uses >= c.max_uses))))
            return BAD_INVITE;
        if (rc != STORE_OK)
            return rc;
        if ((rc = account_invite_day_check(s, c.code, now)) != STORE_OK)
            return rc;
        if (c.amount > daemon_config->max_balance_micro)
            return LEDGER_OVER_BALANCE;
    }
    int rc = store_user_insert(s, ctx->user);
    if (rc != STORE_OK || (rc = store_api_key_insert(s, &ctx->key)) != STORE_OK || !ctx->signup)
        return rc;
    return queue_verification(s, ctx->user, now);
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
    if (!u->email_key[0])
        account_email_key(u->email, u->email_key, sizeof u->email_key);
    /* Accounts an admin makes count as verified; sign-ups must prove it. */
    u->email_verified_at = signup ? 0 : u->created_at;
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

/* Every key a user holds is sent to every gateway each second and tried
 * by every request that presents it: the count is bounded
 * (max_api_keys_per_user). */
static int key_txn(struct store *s, void *vctx)
{
    struct api_key *k = vctx;
    int64_t live = store_api_key_live_count(s, k->user_id, k->created_at);
    if (live < 0)
        return (int)live;
    int64_t over = live + 1 - daemon_config->max_api_keys_per_user, revoked = 0;
    if (over > 0 && k->expires_at) {
        int rc = store_api_keys_revoke_oldest_logins(s, k->user_id, over, k->created_at, &revoked);
        if (rc != STORE_OK)
            return rc;
    }
    if (over > revoked)
        return ACCOUNT_KEY_LIMIT;
    return store_api_key_insert(s, k);
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

enum key_standing account_key_standing(struct store *s, const char *key_id, int64_t now)
{
    struct key_auth k;
    int rc = store_api_key_auth(s, key_id, &k);
    if (rc == STORE_NOT_FOUND)
        return KEY_GONE;
    if (rc != STORE_OK)
        return KEY_UNREADABLE;
    if (k.key.revoked_at || (k.key.expires_at && now >= k.key.expires_at))
        return KEY_GONE;
    return k.active ? KEY_IN_FORCE : KEY_OWNER_DISABLED;
}

/* ---------------------------------------------------------------- verification */

/* The trial: the sign-up's invite code if it still redeems, else the
 * sign-up credit. In its own savepoint, so a code that fails half-way
 * leaves nothing behind. */
struct trial_ctx {
    const struct user *u;
    int64_t now;
    struct account_verified *out;
};

static int invite_part(struct store *s, void *vctx)
{
    struct trial_ctx *ctx = vctx;
    struct invite_code c;
    int rc = account_invite_day_check(s, ctx->u->invite_code, ctx->now);
    if (rc == STORE_OK)
        rc = store_invite_get(s, ctx->u->invite_code, &c);
    if (rc == STORE_OK)
        rc = ledger_redeem_invite(s, ctx->u->id, ctx->u->invite_code, ctx->now, ctx->out->grant_id);
    if (rc == STORE_OK) {
        snprintf(ctx->out->source, sizeof ctx->out->source, "invite:%s", c.code);
        ctx->out->amount = c.amount;
    }
    return rc; /* any refusal rolls the savepoint back */
}

static int grant_trial(struct store *s, const struct user *u, int64_t now, struct account_verified *out)
{
    if (u->invite_code[0]) {
        struct trial_ctx ctx = {.u = u, .now = now, .out = out};
        int result;
        if (store_part(s, invite_part, &ctx, &result) < 0)
            return STORE_ERROR;
        if (result == STORE_OK)
            return store_user_set_trial(s, u->id, now);
        if (result == STORE_BUSY)
            return result;
        /* The code no longer redeems (expired, used up, at its daily
         * cap): the person still gets the trial credit. */
        out->grant_id[0] = out->source[0] = '\0';
    }
    int64_t credit = 0;
    money_parse(daemon_config->signup_credit, &credit);
    if (credit <= 0)
        return STORE_OK; /* no trial on offer: a code may still be redeemed later */
    int rc = ledger_grant(s, u->id, "signup", credit,
                          daemon_config->signup_credit_days ? now + daemon_config->signup_credit_days * 86400 : 0, now,
                          "trial credit for a new account", out->grant_id);
    if (rc != STORE_OK)
        return rc;
    snprintf(out->source, sizeof out->source, "signup");
    out->amount = credit;
    return store_user_set_trial(s, u->id, now);
}

struct verify_ctx {
    char hash[65];
    struct account_verified *out;
};

static int verify_txn(struct store *s, void *vctx)
{
    struct verify_ctx *ctx = vctx;
    struct email_verification v;
    struct user u;
    int64_t now = clock_now();
    memset(ctx->out, 0, sizeof *ctx->out);
    int rc = store_verification_get(s, ctx->hash, &v);
    if (rc == STORE_NOT_FOUND)
        return ACCOUNT_TOKEN_UNKNOWN;
    if (rc != STORE_OK)
        return rc;
    memcpy(ctx->out->user_id, v.user_id, ID_MAX);
    if (v.used_at)
        return ACCOUNT_TOKEN_USED;
    if (v.expires_at <= now)
        return ACCOUNT_TOKEN_EXPIRED;
    if ((rc = store_user_get(s, v.user_id, &u)) != STORE_OK)
        return rc;
    if ((rc = store_verification_use(s, ctx->hash, now)) != STORE_OK)
        return rc == STORE_NOT_FOUND ? ACCOUNT_TOKEN_USED : rc;
    /* A second code of an account already verified (a resend) does nothing
     * more than use itself up. */
    return u.email_verified_at ? STORE_OK : account_mark_verified(s, &u, now, ctx->out);
}

int account_mark_verified(struct store *s, const struct user *u, int64_t now, struct account_verified *out)
{
    int rc = store_user_set_verified(s, u->id, now);
    if (rc != STORE_OK)
        return rc;
    return u->trial_at ? STORE_OK : grant_trial(s, u, now, out);
}

int account_verify(struct store *s, const char *token, struct account_verified *out)
{
    struct verify_ctx ctx = {.out = out};
    memset(out, 0, sizeof *out);
    sha256_hex(token, strlen(token), ctx.hash);
    return store_txn(s, verify_txn, &ctx);
}

static int resend_txn(struct store *s, void *vctx)
{
    struct user u;
    int rc = store_user_get(s, vctx, &u);
    if (rc != STORE_OK)
        return rc;
    if (u.email_verified_at)
        return ACCOUNT_ALREADY_VERIFIED;
    return queue_verification(s, &u, clock_now());
}

int account_resend_verification(struct store *s, const char *user_id)
{
    char id[ID_MAX];
    snprintf(id, sizeof id, "%s", user_id);
    return store_txn(s, resend_txn, id);
}

int account_invite_day_check(struct store *s, const char *code, int64_t now)
{
    int64_t cap = 0, used = 0;
    int rc = store_invite_day_cap(s, code, &cap);
    if (rc == STORE_NOT_FOUND || (rc == STORE_OK && cap == 0))
        return STORE_OK; /* unknown codes are refused by the redemption itself */
    if (rc == STORE_OK)
        rc = store_invite_uses_since(s, code, now - now % 86400, &used);
    if (rc != STORE_OK)
        return rc;
    return used >= cap ? ACCOUNT_CODE_DAY_FULL : STORE_OK;
}

int account_redeem_check(struct store *s, const char *user_id, const char *code, int64_t now)
{
    struct user u;
    int rc = store_user_get(s, user_id, &u);
    if (rc != STORE_OK)
        return rc;
    if (!u.email_verified_at)
        return ACCOUNT_NOT_VERIFIED;
    int64_t had = 0;
    if ((rc = store_invite_redeemed(s, code, user_id, &had)) != STORE_OK)
        return rc;
    if (had)
        return ACCOUNT_CODE_REDEEMED;
    if (u.trial_at)
        return ACCOUNT_TRIAL_HAD;
    return account_invite_day_check(s, code, now);
}

int account_redeem_done(struct store *s, const char *user_id, int64_t now)
{
    int rc = store_user_set_trial(s, user_id, now);
    return rc == STORE_CONFLICT ? ACCOUNT_TRIAL_HAD : rc;
}

/* ---------------------------------------------------------------- suspension */

int account_set_active(struct store *s, const char *user_id, int active, int64_t *stopped)
{
    *stopped = 0;
    int rc = store_user_set_active(s, user_id, active);
    if (rc != STORE_OK || active)
        return rc;
    /* Stopped, not terminated: volumes and instances stay for a reinstated
     * account to start again. */
    char(*ids)[ID_MAX] = NULL;
    size_t n = 0;
    rc = store_user_running_instances(s, user_id, &ids, &n);
    for (size_t i = 0; rc == STORE_OK && i < n; i++) {
        struct op_outcome o = {0};
        rc = instance_stop(s, user_id, ids[i], &o);
        json_decref(o.extra);
        if (rc == REFUSED) /* a terminal state: nothing to stop */
            rc = STORE_OK;
        else if (rc == STORE_OK)
            (*stopped)++;
    }
    free(ids);
    return rc;
}
