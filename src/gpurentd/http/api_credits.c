/* api_credits.c: credit grants: POST /v1/invite-codes/redeem (a user
 * redeems a code, once per account), and the admin's
 * POST /v1/admin/invite-codes and POST /v1/admin/users/{id}/grants. The
 * redemption and the grant honour Idempotency-Key: a retry gets the first
 * answer, and the credit is granted once. Amounts are
 * bounded by max_grant and, as they land, by max_balance; the admin's
 * routes are recorded in admin_actions. */
#include "domain/ledger.h"
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "gpurent/money.h"
#include "http/api.h"
#include "store/store.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALREADY (-102)    /* redemption refused: this account already has it */
#define KEY_REUSED (-103) /* the Idempotency-Key came with another request */

/* Upper-cases an invite code; -1 unless 1 to 32 letters, digits or '-'. */
static int code_normalize(const char *in, char out[33])
{
    size_t n = strlen(in);
    if (n == 0 || n > 32)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (!isalnum((unsigned char)in[i]) && in[i] != '-')
            return -1;
        out[i] = (char)toupper((unsigned char)in[i]);
    }
    out[n] = '\0';
    return 0;
}

/* Why a code cannot be redeemed, so that the error says so. */
enum refusal { CODE_UNKNOWN, CODE_EXPIRED, CODE_USED_UP };

/* At the start of a money transaction with an Idempotency-Key: a twin
 * request with the same key may have committed since idempotency_begin
 * (writers are serialised, so looking again here sees it). Returns 1 when
 * the transaction ends here with *rc: STORE_OK and *answer the twin's to
 * replay, KEY_REUSED, or a store error; 0 to go on. Clears what an earlier
 * try of the transaction left. */
static int twin_answered(struct store *s, const struct http_request *req, struct idempotency *idem, char **answer,
                         int *replayed, int *rc)
{
    free(*answer);
    *answer = NULL;
    int status;
    int twin = idempotency_twin(s, req, idem, &status, answer);
    *replayed = twin == IDEM_REPLAY;
    *rc = twin < 0 ? twin : twin == IDEM_REPLAY ? STORE_OK : KEY_REUSED;
    return twin != IDEM_NONE;
}

struct redeem_ctx {
    const struct http_request *req; /* for the idempotency record */
    struct idempotency *idem;       /* its key */
    const char *user_id;            /* who */
    char code[33];                  /* what */
    char grant[ID_MAX];             /* out */
    int64_t amount;                 /* out */
    enum refusal why;               /* out, on STORE_NOT_FOUND */
    int64_t expired_at;             /* out, when why is CODE_EXPIRED */
    char *answer;                   /* out: the 201 body, or the replayed one (malloc'd) */
    int replayed;                   /* out: answer is the first answer to the key */
};

/* The 201 of a redemption, kept with its Idempotency-Key. */
static int redeem_answer(struct store *s, struct redeem_ctx *ctx)
{
    json_t *j = json_pack("{s:s, s:s, s:o, s:s}", "grant_id", ctx->grant, "code", ctx->code, "amount",
                          json_money(ctx->amount), "currency", daemon_config->currency);
    ctx->answer = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!ctx->answer)
        return STORE_ERROR;
    snprintf(ctx->idem->location, sizeof ctx->idem->location, "/v1/balance"); /* where the new grant shows */
    return idempotency_record(s, ctx->req, ctx->idem, 201, ctx->answer);
}

static int redeem_txn(struct store *s, void *vctx)
{
    struct redeem_ctx *ctx = vctx;
    int rc;
    if (twin_answered(s, ctx->req, ctx->idem, &ctx->answer, &ctx->replayed, &rc))
        return rc;
    struct invite_code c;
    int64_t now = clock_now();
    ctx->why = CODE_UNKNOWN;
    rc = store_invite_get(s, ctx->code, &c);
    if (rc != STORE_OK)
        return rc;
    ctx->amount = c.amount;
    /* One trial per account, for verified addresses only (issue 13). */
    if ((rc = account_redeem_check(s, ctx->user_id, ctx->code, now)) != STORE_OK)
        return rc == ACCOUNT_CODE_REDEEMED ? ALREADY : rc;
    rc = ledger_redeem_invite(s, ctx->user_id, ctx->code, now, ctx->grant);
    if (rc == STORE_OK) {
        rc = account_redeem_done(s, ctx->user_id, now);
        return rc == STORE_OK ? redeem_answer(s, ctx) : rc;
    }
    if (rc == STORE_NOT_FOUND) {
        /* Known code: refused for its expiry, or else for its use limit
         * (which a concurrent redemption may have just reached). */
        ctx->why = c.expires_at && c.expires_at <= now ? CODE_EXPIRED : CODE_USED_UP;
        ctx->expired_at = c.expires_at;
    }
    return rc == STORE_CONFLICT ? ALREADY : rc;
}

/* The 400 for a code that could not be redeemed, saying why. */
static void reply_refusal(struct http_request *req, const char *field, const char *code, enum refusal why,
                          int64_t expired_at)
{
    if (why == CODE_EXPIRED) {
        json_t *when = json_time(expired_at, 0);
        http_error(req, ERR_INVALID_INVITE_CODE, field, "invite code %s expired at %s", code,
                   when ? json_string_value(when) : "?");
        json_decref(when);
    } else if (why == CODE_USED_UP) {
        http_error(req, ERR_INVALID_INVITE_CODE, field, "invite code %s has been used up", code);
    } else {
        http_error(req, ERR_INVALID_INVITE_CODE, field, "no invite code %s", code);
    }
}

void api_invite_refused(struct http_request *req, const char *field, const char *code)
{
    struct store *s = store_thread();
    struct invite_code c;
    int64_t now = clock_now();
    if (!s || store_invite_get(s, code, &c) != STORE_OK)
        reply_refusal(req, field, code, CODE_UNKNOWN, 0);
    else
        reply_refusal(req, field, code, c.expires_at && c.expires_at <= now ? CODE_EXPIRED : CODE_USED_UP,
                      c.expires_at);
}

void api_invite_redeem(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"code", JSON_KIND_STRING, 1, 32},
        {NULL,   0,                0, 0 },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    struct idempotency idem;
    if (idempotency_begin(req, &idem)) {
        json_decref(body);
        return;
    }
    struct redeem_ctx ctx = {.req = req, .idem = &idem, .user_id = req->user_id, .why = CODE_UNKNOWN};
    int bad = code_normalize(json_string_value(json_object_get(body, "code")), ctx.code) < 0;
    json_decref(body);
    struct store *s = store_thread();
    int rc = bad ? STORE_NOT_FOUND : s ? store_txn(s, redeem_txn, &ctx) : STORE_ERROR;
    if (rc == STORE_NOT_FOUND && bad)
        http_error(req, ERR_INVALID_INVITE_CODE, "code", "an invite code is 1 to 32 letters, digits or '-'");
    else if (rc == KEY_REUSED)
        http_error(req, ERR_IDEMPOTENCY_KEY_REUSED, "Idempotency-Key", NULL);
    else if (ctx.replayed)
        idempotency_replay(req, &idem, 201, ctx.answer);
    else if (rc == STORE_NOT_FOUND)
        reply_refusal(req, "code", ctx.code, ctx.why, ctx.expired_at);
    else if (rc == ALREADY)
        http_error(req, ERR_CONFLICT, "code", "this account has already redeemed %s", ctx.code);
    else if (rc == ACCOUNT_NOT_VERIFIED)
        http_error(req, ERR_EMAIL_NOT_VERIFIED, NULL, NULL);
    else if (rc == ACCOUNT_TRIAL_HAD)
        http_error(req, ERR_CONFLICT, "code",
                   "this account has had its trial credit already; an account gets one trial, from sign-up or one "
                   "invite code");
    else if (rc == ACCOUNT_CODE_DAY_FULL)
        http_error(req, ERR_INVALID_INVITE_CODE, "code",
                   "invite code %s has been used as often as it may be today (UTC); try again tomorrow", ctx.code);
    else if (rc == LEDGER_OVER_BALANCE) {
        char label[64];
        snprintf(label, sizeof label, "invite code %s's credit of", ctx.code);
        limit_refuse_balance(req, "code", label, ctx.user_id, ctx.amount);
    } else if (rc == STORE_BUSY)
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else {
        http_add_header(req, "Location", idem.location);
        http_reply_raw(req, 201, "application/json", ctx.answer, strlen(ctx.answer));
    }
    free(ctx.answer);
}

/* An invite code as the API shows it, and as its admin_actions detail. */
static json_t *invite_json(const struct invite_code *c)
{
    return json_pack("{s:s, s:o, s:o, s:o, s:o, s:s}", "code", c->code, "amount", json_money(c->amount), "expires_at",
                     json_time(c->expires_at, 1), "max_uses", c->max_uses ? json_integer(c->max_uses) : json_null(),
                     "credit_days", c->credit_days ? json_integer(c->credit_days) : json_null(), "currency",
                     daemon_config->currency);
}

/* invite_json with the per-day cap (migration 0021) added. */
static json_t *invite_day_json(json_t *j, int64_t per_day)
{
    json_object_set_new(j, "max_uses_per_day", per_day ? json_integer(per_day) : json_null());
    return j;
}

struct invite_ctx {
    struct invite_code c;           /* the code */
    int64_t max_uses_per_day;       /* 0: no daily cap */
    const struct http_request *req; /* the admin's, for admin_actions */
    const char *reason;             /* the admin's reason, "" for none */
};

static int invite_txn(struct store *s, void *vctx)
{
    struct invite_ctx *ctx = vctx;
    int rc = store_invite_insert(s, &ctx->c);
    if (rc == STORE_OK && ctx->max_uses_per_day)
        rc = store_invite_set_day_cap(s, ctx->c.code, ctx->max_uses_per_day);
    if (rc != STORE_OK)
        return rc;
    json_t *detail = invite_day_json(invite_json(&ctx->c), ctx->max_uses_per_day);
    rc = audit_record(s, ctx->req, "invite_code", ctx->c.code, ctx->c.amount, detail, ctx->reason);
    json_decref(detail);
    return rc;
}

void api_invite_codes_create(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"code",        JSON_KIND_STRING,  1, 32                  },
        {"amount",      JSON_KIND_STRING,  1, 32                  },
        {"expires_at",  JSON_KIND_STRING,  0, 32                  },
        {"max_uses",    JSON_KIND_INTEGER, 0, 0                   },
        {"credit_days", JSON_KIND_INTEGER, 0, 0                   },
        {"max_uses_per_day", JSON_KIND_INTEGER, 0, 0              },
        {"reason",      JSON_KIND_STRING,  0, 4 * AUDIT_REASON_MAX},
        {NULL,          0,                 0, 0                   },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    struct invite_ctx ctx = {.c = {.created_at = clock_now()}, .req = req};
    if (audit_reason(req, body, AUDIT_REASON_MAX, &ctx.reason) < 0) {
        json_decref(body);
        return;
    }
    struct invite_code *c = &ctx.c;
    const char *expires = json_string_value(json_object_get(body, "expires_at"));
    json_t *max_uses = json_object_get(body, "max_uses"), *days = json_object_get(body, "credit_days");
    c->max_uses = max_uses ? json_integer_value(max_uses) : 0;
    c->credit_days = days ? json_integer_value(days) : 0;
    json_t *per_day = json_object_get(body, "max_uses_per_day");
    ctx.max_uses_per_day = per_day ? json_integer_value(per_day) : 0;
    if (code_normalize(json_string_value(json_object_get(body, "code")), c->code) < 0)
        http_error(req, ERR_INVALID_FIELD, "code", "code must be 1 to 32 letters, digits or '-'");
    else if (json_money_value(json_object_get(body, "amount"), &c->amount) < 0 || c->amount <= 0)
        http_error(req, ERR_INVALID_FIELD, "amount", "amount must be a positive amount like \"10.00\"");
    /* Each redemption is a grant, so the code's amount meets max_grant. */
    else if (c->amount > daemon_config->max_grant_micro)
        limit_refuse(req, "amount", c->amount, "max_grant", daemon_config->max_grant_micro);
    else if (expires && (json_time_parse(expires, &c->expires_at) < 0 || c->expires_at <= c->created_at))
        http_error(req, ERR_INVALID_FIELD, "expires_at",
                   "expires_at must be a future UTC time like 2027-01-01T00:00:00Z");
    else if (max_uses && (c->max_uses < 1 || c->max_uses > 100000000))
        http_error(req, ERR_INVALID_FIELD, "max_uses", "max_uses must be from 1 to 100000000");
    else if (days && (c->credit_days < 1 || c->credit_days > 3650))
        http_error(req, ERR_INVALID_FIELD, "credit_days", "credit_days must be from 1 to 3650");
    else if (per_day && (ctx.max_uses_per_day < 1 || ctx.max_uses_per_day > 100000000))
        http_error(req, ERR_INVALID_FIELD, "max_uses_per_day", "max_uses_per_day must be from 1 to 100000000");
    else {
        struct store *s = store_thread();
        int rc = s ? store_txn(s, invite_txn, &ctx) : STORE_ERROR;
        if (rc == STORE_CONFLICT)
            http_error(req, ERR_NAME_TAKEN, "code", "invite code %s exists", c->code);
        else if (rc == STORE_BUSY)
            http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        else if (rc != STORE_OK)
            http_error(req, ERR_INTERNAL, NULL, NULL);
        else {
            char location[96];
            snprintf(location, sizeof location, "/v1/admin/invite-codes/%s", c->code);
            http_add_header(req, "Location", location);
            http_reply_json(req, 201, invite_day_json(invite_json(c), ctx.max_uses_per_day));
        }
    }
    json_decref(body);
}

/* A grant's reason is also the line on the user's statement, which holds
 * this many bytes (and characters: more characters than bytes there are not). */
#define GRANT_REASON_MAX 200

struct grant_ctx {
    const char *user_id;            /* whom */
    int64_t amount;                 /* how much */
    int64_t expires_at;             /* 0: never */
    const char *reason;             /* why, as the admin wrote it ("" for none) */
    const char *statement;          /* what the user's statement says: the reason or a default */
    const struct http_request *req; /* for the idempotency record */
    struct idempotency *idem;       /* its key */
    char grant[ID_MAX];             /* out */
    char *answer;                   /* out: the 201 body, or the replayed one (malloc'd) */
    int replayed;                   /* out: answer is a twin request's */
};

static int grant_txn(struct store *s, void *vctx)
{
    struct grant_ctx *ctx = vctx;
    int rc;
    if (twin_answered(s, ctx->req, ctx->idem, &ctx->answer, &ctx->replayed, &rc))
        return rc;
    struct user u;
    rc = store_user_get(s, ctx->user_id, &u);
    if (rc == STORE_OK)
        rc = ledger_grant(s, ctx->user_id, "admin", ctx->amount, ctx->expires_at, clock_now(), ctx->statement,
                          ctx->grant);
    if (rc != STORE_OK)
        return rc;
    json_t *j = json_pack("{s:s, s:s, s:o, s:o, s:s}", "grant_id", ctx->grant, "user_id", ctx->user_id, "amount",
                          json_money(ctx->amount), "expires_at", json_time(ctx->expires_at, 1), "currency",
                          daemon_config->currency);
    ctx->answer = j ? json_dumps(j, JSON_COMPACT) : NULL;
    /* The answer is also the action's detail: what was granted, and the id. */
    rc = ctx->answer ? audit_record(s, ctx->req, "grant", ctx->user_id, ctx->amount, j, ctx->reason) : STORE_ERROR;
    json_decref(j);
    if (rc != STORE_OK)
        return rc;
    snprintf(ctx->idem->location, sizeof ctx->idem->location, "/v1/admin/users/%s/grants/%s", ctx->user_id,
             ctx->grant);
    return idempotency_record(s, ctx->req, ctx->idem, 201, ctx->answer);
}

void api_grants_create(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"amount",     JSON_KIND_STRING, 1, 32              },
        {"expires_at", JSON_KIND_STRING, 0, 32              },
        {"reason",     JSON_KIND_STRING, 0, GRANT_REASON_MAX},
        {NULL,         0,                0, 0               },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    struct idempotency idem;
    if (idempotency_begin(req, &idem)) {
        json_decref(body);
        return;
    }
    struct grant_ctx ctx = {.user_id = req->params[0], .req = req, .idem = &idem};
    /* The reason is also the statement's text, so it keeps the length a
     * statement line holds rather than the 500 characters of other routes. */
    if (audit_reason(req, body, GRANT_REASON_MAX, &ctx.reason) < 0) {
        json_decref(body);
        return;
    }
    const char *expires = json_string_value(json_object_get(body, "expires_at"));
    if (json_money_value(json_object_get(body, "amount"), &ctx.amount) < 0 || ctx.amount <= 0)
        http_error(req, ERR_INVALID_FIELD, "amount", "amount must be a positive amount like \"10.00\"");
    else if (ctx.amount > daemon_config->max_grant_micro)
        limit_refuse(req, "amount", ctx.amount, "max_grant", daemon_config->max_grant_micro);
    else if (expires && (json_time_parse(expires, &ctx.expires_at) < 0 || ctx.expires_at <= clock_now()))
        http_error(req, ERR_INVALID_FIELD, "expires_at",
                   "expires_at must be a future UTC time like 2027-01-01T00:00:00Z");
    else {
        ctx.statement = ctx.reason[0] ? ctx.reason : "credit from an administrator";
        struct store *s = store_thread();
        int rc = !s ? STORE_ERROR : id_valid("usr", ctx.user_id) ? store_txn(s, grant_txn, &ctx) : STORE_NOT_FOUND;
        if (rc == STORE_NOT_FOUND)
            http_error(req, ERR_NOT_FOUND, NULL, "no user %.32s", req->params[0]);
        else if (rc == KEY_REUSED)
            http_error(req, ERR_IDEMPOTENCY_KEY_REUSED, "Idempotency-Key", NULL);
        else if (rc == LEDGER_OVER_BALANCE)
            limit_refuse_balance(req, "amount", NULL, ctx.user_id, ctx.amount);
        else if (rc == STORE_BUSY)
            http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        else if (rc != STORE_OK)
            http_error(req, ERR_INTERNAL, NULL, NULL);
        else if (ctx.replayed)
            idempotency_replay(req, &idem, 201, ctx.answer);
        else {
            char location[96];
            snprintf(location, sizeof location, "/v1/admin/users/%s/grants/%s", ctx.user_id, ctx.grant);
            http_add_header(req, "Location", location);
            http_reply_raw(req, 201, "application/json", ctx.answer, strlen(ctx.answer));
        }
        free(ctx.answer);
    }
    json_decref(body);
}

/* The code as made and its uses so far. */
static json_t *invite_full_json(const struct invite_code *c)
{
    json_t *j = invite_day_json(invite_json(c), c->max_uses_per_day);
    json_object_set_new(j, "uses", json_integer(c->uses));
    json_object_set_new(j, "created_at", json_time(c->created_at, 0));
    return j;
}

#define INVITE_PAGE_MAX 200

/* GET /v1/admin/invite-codes: every code, oldest first, a page at a time. */
void api_invite_codes_list(struct http_request *req)
{
    static const char *const allowed[] = {"limit", "cursor", NULL};
    struct page pg;
    if (http_query_allow(req, allowed) < 0 || page_begin(req, INVITE_PAGE_MAX, 50, &pg) < 0)
        return;
    struct invite_code *codes;
    size_t n;
    struct store *s = store_thread();
    /* One extra row tells whether another page follows. */
    if (!s || store_invite_list(s, pg.after_t, pg.after_id, (size_t)pg.limit + 1, &codes, &n) != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    json_t *data = json_array();
    size_t shown = page_shown(&pg, n);
    for (size_t i = 0; i < shown; i++)
        json_array_append_new(data, invite_full_json(&codes[i]));
    json_t *next = n > shown ? page_cursor(codes[shown - 1].created_at, codes[shown - 1].code) : json_null();
    free(codes);
    http_reply_json(req, 200, json_pack("{s:o, s:o}", "data", data, "next_cursor", next));
}

/* GET /v1/admin/invite-codes/{code}: the code as made, with its uses so far
 * (where POST's 201 Location points). */
void api_invite_codes_get(struct http_request *req)
{
    char code[33];
    struct invite_code c;
    struct store *s = store_thread();
    int rc = !s ? STORE_ERROR : code_normalize(req->params[0], code) < 0 ? STORE_NOT_FOUND : store_invite_get(s, code, &c);
    if (rc == STORE_NOT_FOUND) {
        http_error(req, ERR_NOT_FOUND, NULL, "no invite code %.32s", req->params[0]);
        return;
    }
    if (rc != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    http_reply_json(req, 200, invite_full_json(&c));
}

/* GET /v1/admin/users/{id}/grants/{grant_id}: one credit grant as it stands
 * now, what is left of it and whether it expired or was voided (where the
 * grant's 201 Location points). */
void api_grants_get(struct http_request *req)
{
    struct grant g;
    struct store *s = store_thread();
    int rc = !s ? STORE_ERROR
             : id_valid("usr", req->params[0]) && id_valid("grt", req->params[1])
                 ? store_grant_get(s, req->params[0], req->params[1], &g)
                 : STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND) {
        http_error(req, ERR_NOT_FOUND, NULL, "user %.32s has no grant %.32s", req->params[0], req->params[1]);
        return;
    }
    if (rc != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    int64_t now = clock_now();
    http_reply_json(req, 200,
                    json_pack("{s:s, s:s, s:s, s:o, s:o, s:o, s:o, s:o, s:b, s:s}", "grant_id", g.id, "user_id",
                              g.user_id, "source", g.source, "amount", json_money(g.amount), "remaining",
                              json_money(g.remaining), "expires_at", json_time(g.expires_at, 1), "voided_at",
                              json_time(g.voided_at, 1), "created_at", json_time(g.created_at, 0), "expired",
                              g.expires_at && g.expires_at <= now, "currency", daemon_config->currency));
}
