/* api_payments.c: cash top-ups, idempotent by the payment's id and bounded
 * by max_topup and max_balance: the admin's POST /v1/admin/users/{id}/topups
 * (recorded in admin_actions; an Idempotency-Key replays its first answer,
 * 201 and all, where a repeated payment id alone answers 200 duplicate),
 * and POST /v1/payments/webhook for a payment
 * provider, authenticated by an HMAC-SHA256 signature of "TIMESTAMP.BODY"
 * with payment_webhook_secret (X-Gpurent-Webhook-Timestamp,
 * X-Gpurent-Webhook-Signature, lowercase hex), refused when stale. */
#include "domain/ledger.h"
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "gpurent/money.h"
#include "gpurent/secrets.h"
#include "http/api.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WEBHOOK_SKEW_S 300
#define KEY_REUSED (-103) /* the Idempotency-Key came with another request */

struct topup_ctx {
    const char *user_id;              /* whose cash */
    const char *payment_id;           /* the payment */
    int64_t amount;                   /* how much */
    const char *source;               /* admin or webhook */
    const struct http_request *admin; /* the admin's request, recorded in admin_actions; NULL for the webhook */
    const char *reason;               /* the admin's reason, "" for none */
    struct idempotency *idem;         /* the admin's Idempotency-Key; NULL for the webhook */
    char id[ID_MAX];                  /* out */
    int duplicate;                    /* out: seen before */
    int status;                       /* out: 201, or 200 for a duplicate */
    char *answer;                     /* out: the reply's body, or the replayed one (malloc'd) */
    int replayed;                     /* out: answer is the first answer to the Idempotency-Key */
};

/* The reply to a top-up, kept with its Idempotency-Key when it has one. */
static int topup_answer(struct store *s, struct topup_ctx *ctx)
{
    json_t *j = json_pack("{s:s, s:s, s:s, s:o, s:s, s:b}", "topup_id", ctx->id, "user_id", ctx->user_id,
                          "payment_id", ctx->payment_id, "amount", json_money(ctx->amount), "currency",
                          daemon_config->currency, "duplicate", ctx->duplicate);
    ctx->answer = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!ctx->answer)
        return STORE_ERROR;
    ctx->status = ctx->duplicate ? 200 : 201;
    if (!ctx->idem)
        return STORE_OK;
    if (!ctx->duplicate)
        snprintf(ctx->idem->location, sizeof ctx->idem->location, "/v1/admin/users/%s/topups/%s", ctx->user_id,
                 ctx->id);
    return idempotency_record(s, ctx->admin, ctx->idem, ctx->status, ctx->answer);
}

static int topup_txn(struct store *s, void *vctx)
{
    struct topup_ctx *ctx = vctx;
    free(ctx->answer);
    ctx->answer = NULL;
    ctx->replayed = 0;
    if (ctx->idem) {
        int twin = idempotency_twin(s, ctx->admin, ctx->idem, &ctx->status, &ctx->answer);
        if (twin != IDEM_NONE) {
            ctx->replayed = twin == IDEM_REPLAY;
            return twin < 0 ? twin : twin == IDEM_REPLAY ? STORE_OK : KEY_REUSED;
        }
        ctx->idem->location[0] = '\0';
    }
    struct user u;
    int rc = store_user_get(s, ctx->user_id, &u);
    if (rc != STORE_OK)
        return rc;
    rc =
        ledger_topup(s, ctx->user_id, ctx->payment_id, ctx->amount, ctx->source, clock_now(), ctx->id, &ctx->duplicate);
    /* A repeated payment adds nothing, so there is no action to record. */
    if (rc == STORE_OK && !ctx->duplicate && ctx->admin) {
        json_t *detail = json_pack("{s:s, s:s, s:o, s:s}", "topup_id", ctx->id, "payment_id", ctx->payment_id,
                                   "amount", json_money(ctx->amount), "currency", daemon_config->currency);
        rc = audit_record(s, ctx->admin, "topup", ctx->user_id, ctx->amount, detail, ctx->reason);
        json_decref(detail);
    }
    return rc == STORE_OK ? topup_answer(s, ctx) : rc;
}

static int payment_id_valid(const char *p)
{
    size_t n = strlen(p);
    if (n == 0 || n > 128)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (p[i] <= ' ' || p[i] >= 0x7f)
            return 0;
    return 1;
}

/* Shared by both routes once the caller is trusted. */
static void topup(struct http_request *req, struct topup_ctx *ctx, json_t *amount)
{
    if (!payment_id_valid(ctx->payment_id)) {
        http_error(req, ERR_INVALID_FIELD, "payment_id", "payment_id must be 1 to 128 printable characters");
        return;
    }
    if (json_money_value(amount, &ctx->amount) < 0 || ctx->amount <= 0) {
        http_error(req, ERR_INVALID_FIELD, "amount", "amount must be a positive amount like \"100.00\"");
        return;
    }
    if (ctx->amount > daemon_config->max_topup_micro) {
        limit_refuse(req, "amount", ctx->amount, "max_topup", daemon_config->max_topup_micro);
        return;
    }
    struct store *s = store_thread();
    int rc = !s ? STORE_ERROR : id_valid("usr", ctx->user_id) ? store_txn(s, topup_txn, ctx) : STORE_NOT_FOUND;
    /* Only ledger_topup's own finding of the payment id under another user
     * or amount is STORE_CONFLICT; every other failure rolled back too and
     * left nothing behind, so the same payment may be sent again. */
    if (rc == STORE_NOT_FOUND)
        http_error(req, ERR_NOT_FOUND, NULL, "no user %.32s", ctx->user_id);
    else if (rc == KEY_REUSED)
        http_error(req, ERR_IDEMPOTENCY_KEY_REUSED, "Idempotency-Key", NULL);
    else if (rc == STORE_CONFLICT)
        http_error(req, ERR_CONFLICT, "payment_id", "payment %s was already recorded with another user or amount",
                   ctx->payment_id);
    else if (rc == LEDGER_OVER_BALANCE)
        limit_refuse_balance(req, "amount", NULL, ctx->user_id, ctx->amount);
    else if (rc == STORE_BUSY)
        http_error(req, ERR_UNAVAILABLE, NULL, "the database is busy; the top-up was not recorded, send it again");
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else if (ctx->replayed)
        idempotency_replay(req, ctx->idem, ctx->status, ctx->answer);
    else {
        if (!ctx->duplicate) {
            log_info("payments: %s added %lld micro to %s (payment %s)", ctx->source, (long long)ctx->amount,
                     ctx->user_id, ctx->payment_id);
            char location[96];
            snprintf(location, sizeof location, "/v1/admin/users/%s/topups/%s", ctx->user_id, ctx->id);
            http_add_header(req, "Location", location);
        }
        http_reply_raw(req, (unsigned)ctx->status, "application/json", ctx->answer, strlen(ctx->answer));
    }
    free(ctx->answer);
    ctx->answer = NULL;
}

void api_topups_create(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"amount",     JSON_KIND_STRING, 1, 32                  },
        {"payment_id", JSON_KIND_STRING, 1, 128                 },
        {"reason",     JSON_KIND_STRING, 0, 4 * AUDIT_REASON_MAX},
        {NULL,         0,                0, 0                   },
    };
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    struct idempotency idem;
    if (idempotency_begin(req, &idem)) {
        json_decref(body);
        return;
    }
    struct topup_ctx ctx = {.user_id = req->params[0],
                            .payment_id = json_string_value(json_object_get(body, "payment_id")),
                            .source = "admin",
                            .admin = req,
                            .idem = &idem};
    if (audit_reason(req, body, AUDIT_REASON_MAX, &ctx.reason) == 0)
        topup(req, &ctx, json_object_get(body, "amount"));
    json_decref(body);
}

/* Checks the webhook's signature in constant time; 0 if good. */
static int webhook_signature_ok(struct http_request *req)
{
    const char *secret = daemon_config->payment_webhook_secret;
    const char *ts = http_header(req, "X-Gpurent-Webhook-Timestamp");
    const char *sig = http_header(req, "X-Gpurent-Webhook-Signature");
    if (!secret[0] || !ts || !sig || strlen(sig) != 64 || strlen(ts) > 19 || strspn(ts, "0123456789") != strlen(ts) ||
        !ts[0])
        return -1;
    int64_t when = strtoll(ts, NULL, 10), now = clock_wall();
    if (when < now - WEBHOOK_SKEW_S || when > now + WEBHOOK_SKEW_S)
        return -1;
    /* The signed text is "TIMESTAMP.BODY". */
    size_t tlen = strlen(ts), n = tlen + 1 + req->body_len;
    unsigned char *text = malloc(n + 1);
    if (!text)
        return -1;
    memcpy(text, ts, tlen);
    text[tlen] = '.';
    if (req->body_len)
        memcpy(text + tlen + 1, req->body, req->body_len);
    char hex[65];
    int ok = hmac_sha256_hex(secret, text, n, hex) == 0;
    free(text);
    return ok && secret_equal(hex, sig, 64) ? 0 : -1;
}

void api_payments_webhook(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"payment_id", JSON_KIND_STRING, 1, 128},
        {"user_id",    JSON_KIND_STRING, 1, 64 },
        {"amount",     JSON_KIND_STRING, 1, 32 },
        {"currency",   JSON_KIND_STRING, 1, 8  },
        {NULL,         0,                0, 0  },
    };
    /* Authenticate before reading: an unsigned body is not even parsed. */
    if (webhook_signature_ok(req) < 0) {
        http_error(req, ERR_BAD_SIGNATURE, NULL, "the webhook signature is missing, wrong or stale");
        return;
    }
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    if (strcmp(json_string_value(json_object_get(body, "currency")), daemon_config->currency) != 0) {
        http_error(req, ERR_INVALID_FIELD, "currency", "this platform takes %s only", daemon_config->currency);
    } else {
        struct topup_ctx ctx = {.user_id = json_string_value(json_object_get(body, "user_id")),
                                .payment_id = json_string_value(json_object_get(body, "payment_id")),
                                .source = "webhook"};
        topup(req, &ctx, json_object_get(body, "amount"));
    }
    json_decref(body);
}

/* GET /v1/admin/users/{id}/topups/{topup_id}: one recorded payment (where a
 * top-up's 201 Location points). */
void api_topups_get(struct http_request *req)
{
    struct topup t;
    struct store *s = store_thread();
    int rc = !s ? STORE_ERROR
             : id_valid("usr", req->params[0]) && id_valid("top", req->params[1])
                 ? store_topup_get(s, req->params[0], req->params[1], &t)
                 : STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND) {
        http_error(req, ERR_NOT_FOUND, NULL, "user %.32s has no top-up %.32s", req->params[0], req->params[1]);
        return;
    }
    if (rc != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    http_reply_json(req, 200,
                    json_pack("{s:s, s:s, s:s, s:o, s:s, s:s, s:o}", "topup_id", t.id, "user_id", t.user_id,
                              "payment_id", t.payment_id, "amount", json_money(t.amount), "currency",
                              daemon_config->currency, "source", t.source, "created_at", json_time(t.created_at, 0)));
}
