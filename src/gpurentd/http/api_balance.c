/* api_balance.c: what a user reads about their money: GET /v1/balance
 * (cash and credit as posted, the usage accrued since and not yet posted,
 * and what is left to spend), GET /v1/transactions, GET /v1/usage and
 * GET /v1/statements/{month} (JSON or CSV). Amounts are decimal strings
 * with the currency. */
#include "domain/ledger.h"
#include "gpurent/clock.h"
#include "gpurent/csv.h"
#include "gpurent/jsonx.h"
#include "gpurent/money.h"
#include "http/api.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TXN_PAGE_MAX 200
#define USAGE_MAX 500
#define GRANTS_SHOWN 100

/* Reads an optional RFC 3339 query time; replies 400 and returns -1 if bad. */
static int query_time(struct http_request *req, const char *name, int64_t def, int64_t *out)
{
    const char *v = http_query(req, name);
    if (!v) {
        *out = def;
        return 0;
    }
    if (json_time_parse(v, out) < 0) {
        http_error(req, ERR_INVALID_QUERY, name, "%s must be a UTC time like 2026-11-01T00:00:00Z", name);
        return -1;
    }
    return 0;
}

void api_balance_get(struct http_request *req)
{
    struct store *s = store_thread();
    int64_t now = clock_now();
    struct funds f;
    static _Thread_local struct grant grants[GRANTS_SHOWN];
    size_t n;
    int64_t burn, minutes, storage_burn, storage_owed;
    int low;
    if (!s || ledger_runway(s, req->user_id, now, &f, &burn, &minutes, &low) != STORE_OK ||
        ledger_storage_burn(s, req->user_id, now, &storage_burn) != STORE_OK ||
        ledger_storage_owed(s, req->user_id, now, &storage_owed) != STORE_OK ||
        store_grants_of(s, req->user_id, grants, GRANTS_SHOWN, &n) != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    json_t *list = json_array();
    for (size_t i = 0; i < n; i++) {
        const struct grant *g = &grants[i];
        int expired = g->expires_at && g->expires_at <= now;
        json_array_append_new(list, json_pack("{s:s, s:s, s:o, s:o, s:o, s:o, s:b}", "id", g->id, "source", g->source,
                                              "amount", json_money(g->amount), "remaining",
                                              json_money(expired ? 0 : g->remaining), "expires_at",
                                              json_time(g->expires_at, 1), "created_at", json_time(g->created_at, 0),
                                              "expired", expired));
    }
    json_t *runway = minutes >= 0 ? json_integer(minutes) : json_null();
    /* burn_rate_per_hour is card time and storage together; the storage
     * part and the storage not yet charged (owed when funds ran short) are
     * shown on their own too. */
    http_reply_json(req, 200,
                    json_pack("{s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:b}", "currency",
                              daemon_config->currency, "cash", json_money(f.cash), "credit", json_money(f.credit),
                              "unbilled", json_money(f.unbilled), "storage_unbilled", json_money(storage_owed),
                              "available", json_money(f.available), "grants", list, "burn_rate_per_hour",
                              json_money(burn), "storage_burn_rate_per_hour", json_money(storage_burn),
                              "runway_minutes", runway, "low_balance", low));
}

void api_transactions_list(struct http_request *req)
{
    static const char *const allowed[] = {"kind", "from", "to", "limit", "cursor", NULL};
    struct page pg;
    struct ledger_txn_filter f = {.user_id = req->user_id, .kind = http_query(req, "kind")};
    if (http_query_allow(req, allowed) < 0 || page_begin(req, TXN_PAGE_MAX, 50, &pg) < 0 ||
        query_time(req, "from", 0, &f.from) < 0 || query_time(req, "to", INT64_MAX, &f.to) < 0)
        return;
    f.after_id = pg.after_t; /* transaction ids are the sort key */
    static const char *const kinds[] = {"usage",   "refund",      "grant",       "expiry",            "topup",
                                        "storage", "app_call", "reservation", "reservation_refund"};
    int kind_ok = !f.kind;
    for (size_t i = 0; f.kind && i < sizeof kinds / sizeof kinds[0]; i++)
        kind_ok |= strcmp(f.kind, kinds[i]) == 0;
    if (!kind_ok) {
        http_error(req, ERR_INVALID_QUERY, "kind",
                   "kind must be usage, refund, grant, expiry, topup, storage, app_call, reservation or"
                   " reservation_refund");
        return;
    }
    struct ledger_txn_row *rows = malloc(sizeof *rows * (size_t)(pg.limit + 1));
    size_t n = 0;
    struct store *s = store_thread();
    if (!rows || !s || store_ledger_transactions(s, &f, rows, (size_t)pg.limit + 1, &n) != STORE_OK) {
        free(rows);
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    size_t shown = page_shown(&pg, n);
    json_t *data = json_array();
    for (size_t i = 0; i < shown; i++)
        json_array_append_new(
            data, json_pack("{s:I, s:o, s:s, s:s, s:o, s:o, s:o, s:o, s:o, s:s}", "id", (json_int_t)rows[i].id, "at",
                            json_time(rows[i].at, 0), "kind", rows[i].kind, "reason", rows[i].reason, "instance_id",
                            rows[i].instance_id[0] ? json_string(rows[i].instance_id) : json_null(), "volume_id",
                            rows[i].volume_id[0] ? json_string(rows[i].volume_id) : json_null(), "amount",
                            json_money(rows[i].user_delta), "credit", json_money(rows[i].credit_delta), "cash",
                            json_money(rows[i].cash_delta), "currency", daemon_config->currency));
    json_t *next = n > shown ? page_cursor(rows[shown - 1].id, "t") : json_null();
    free(rows);
    http_reply_json(req, 200, json_pack("{s:o, s:o}", "data", data, "next_cursor", next));
}

/* Card-seconds as card-hours with up to 6 decimals (exact: 1/3600 of a
 * card-hour is never finer than a micro-unit's rounding here). */
static json_t *card_hours(int64_t card_seconds)
{
    return json_money((int64_t)((__int128)card_seconds * MONEY_UNIT / 3600));
}

static json_t *usage_rows(struct store *s, const char *user_id, int64_t from, int64_t to, int by_type)
{
    static _Thread_local struct usage_row rows[USAGE_MAX];
    size_t n;
    if (store_usage(s, user_id, from, to, clock_now(), by_type, rows, USAGE_MAX, &n) != STORE_OK)
        return NULL;
    json_t *data = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(data, json_pack("{s:s, s:s, s:o, s:o, s:o, s:o}", by_type ? "gpu_type" : "instance_id",
                                              rows[i].key, "gpu_type", rows[i].gpu_model, "card_hours",
                                              card_hours(rows[i].card_seconds), "cost", json_money(rows[i].cost),
                                              "paid_by_credit", json_money(rows[i].from_credit), "paid_by_cash",
                                              json_money(rows[i].from_cash)));
    return data;
}

/* Storage charged per volume in [from, to): the statement's storage lines. */
static json_t *storage_rows(struct store *s, const char *user_id, int64_t from, int64_t to)
{
    static _Thread_local struct storage_line rows[USAGE_MAX];
    size_t n;
    if (store_storage_lines(s, user_id, from, to, rows, USAGE_MAX, &n) != STORE_OK)
        return NULL;
    json_t *data = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(data, json_pack("{s:s, s:s, s:s, s:I, s:o, s:o, s:o}", "volume_id", rows[i].volume_id,
                                              "name", rows[i].name, "region",
                                              rows[i].region[0] ? rows[i].region : "global", "size_gb",
                                              (json_int_t)rows[i].size_gb, "cost", json_money(rows[i].cost),
                                              "paid_by_credit", json_money(rows[i].from_credit), "paid_by_cash",
                                              json_money(rows[i].from_cash)));
    return data;
}

/* The caller's marketplace calls in [from, to) per app (issue 17): calls,
 * tokens and what they were charged; [] when there are none. */
static json_t *app_usage_rows(struct store *s, const char *user_id, int64_t from, int64_t to)
{
    char *text = NULL;
    json_t *rows = store_app_usage_json(s, user_id, from, to, &text) == STORE_OK ? json_loads(text, 0, NULL) : NULL;
    free(text);
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r)
        json_object_set_new(r, "charged", json_money(json_integer_value(json_object_get(r, "charged_micro"))));
    return rows ? rows : json_array();
}

void api_usage_get(struct http_request *req)
{
    static const char *const allowed[] = {"from", "to", "group_by", NULL};
    int64_t from, to, now = clock_now();
    if (http_query_allow(req, allowed) < 0 || query_time(req, "from", now - 30 * 86400, &from) < 0 ||
        query_time(req, "to", now + 1, &to) < 0)
        return;
    const char *group = http_query(req, "group_by");
    if (group && strcmp(group, "instance") != 0 && strcmp(group, "gpu_type") != 0) {
        http_error(req, ERR_INVALID_QUERY, "group_by", "group_by must be instance or gpu_type");
        return;
    }
    if (to <= from) {
        http_error(req, ERR_INVALID_QUERY, "to", "to must be after from");
        return;
    }
    struct store *s = store_thread();
    json_t *data = s ? usage_rows(s, req->user_id, from, to, group && strcmp(group, "gpu_type") == 0) : NULL;
    if (!data) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    json_t *reply = json_pack("{s:o, s:o, s:s, s:o}", "from", json_time(from, 0), "to", json_time(to, 0), "currency",
                              daemon_config->currency, "data", data);
    json_object_set_new(reply, "apps", app_usage_rows(s, req->user_id, from, to));
    http_reply_json(req, 200, reply);
}

/* "2026-11" → [first second of the month, first second of the next). */
static int month_range(const char *m, int64_t *from, int64_t *to)
{
    char start[32], end[32];
    if (strlen(m) != 7 || m[4] != '-' || strspn(m, "0123456789") != 4 || strspn(m + 5, "0123456789") != 2)
        return -1;
    int year = atoi(m), month = atoi(m + 5);
    if (year < 1970 || year > 9998 || month < 1 || month > 12)
        return -1;
    snprintf(start, sizeof start, "%04d-%02d-01T00:00:00Z", year, month);
    snprintf(end, sizeof end, "%04d-%02d-01T00:00:00Z", month == 12 ? year + 1 : year, month == 12 ? 1 : month + 1);
    return json_time_parse(start, from) < 0 || json_time_parse(end, to) < 0 ? -1 : 0;
}

void api_statements_get(struct http_request *req)
{
    static const char *const allowed[] = {"format", NULL};
    if (http_query_allow(req, allowed) < 0)
        return;
    const char *format = http_query(req, "format");
    int csv = format && strcmp(format, "csv") == 0;
    if (format && !csv && strcmp(format, "json") != 0) {
        http_error(req, ERR_INVALID_QUERY, "format", "format must be json or csv");
        return;
    }
    int64_t from, to;
    if (month_range(req->params[0], &from, &to) < 0) {
        http_error(req, ERR_NOT_FOUND, NULL, "statements are named by month, like 2026-11");
        return;
    }
    struct store *s = store_thread();
    int64_t opening = s ? store_user_funds_before(s, req->user_id, from) : STORE_ERROR;
    int64_t closing = s ? store_user_funds_before(s, req->user_id, to) : STORE_ERROR;
    struct ledger_txn_filter f = {.user_id = req->user_id, .from = from, .to = to};
    json_t *lines = json_array(), *usage = s ? usage_rows(s, req->user_id, from, to, 0) : NULL;
    json_t *storage = s ? storage_rows(s, req->user_id, from, to) : NULL;
    char *csv_text = NULL;
    size_t csv_len = 0;
    FILE *out = csv ? open_memstream(&csv_text, &csv_len) : NULL;
    if (out)
        fprintf(out, "id,at,kind,reason,instance_id,amount,credit,cash,currency\r\n");
    int ok = opening >= 0 && closing >= 0 && usage && storage && (!csv || out);
    static _Thread_local struct ledger_txn_row rows[TXN_PAGE_MAX];
    size_t n = TXN_PAGE_MAX;
    while (ok && n == TXN_PAGE_MAX) {
        if (store_ledger_transactions(s, &f, rows, TXN_PAGE_MAX, &n) != STORE_OK) {
            ok = 0;
            break;
        }
        for (size_t i = 0; i < n; i++) {
            json_t *when = json_time(rows[i].at, 0);
            char amount[MONEY_FMT_LEN], credit[MONEY_FMT_LEN], cash[MONEY_FMT_LEN];
            money_format(rows[i].user_delta, amount);
            money_format(rows[i].credit_delta, credit);
            money_format(rows[i].cash_delta, cash);
            if (out) {
                fprintf(out, "%lld,%s,%s,", (long long)rows[i].id, json_string_value(when), rows[i].kind);
                csv_field(out, rows[i].reason);
                /* The columns stay as they were: a storage line's reason
                 * names its volume. */
                fprintf(out, ",%s,%s,%s,%s,%s\r\n", rows[i].instance_id, amount, credit, cash, daemon_config->currency);
            } else {
                json_array_append_new(lines, json_pack("{s:I, s:O, s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "id",
                                                       (json_int_t)rows[i].id, "at", when, "kind", rows[i].kind,
                                                       "reason", rows[i].reason, "instance_id", rows[i].instance_id,
                                                       "volume_id", rows[i].volume_id, "amount", amount, "credit",
                                                       credit, "cash", cash));
            }
            json_decref(when);
        }
        if (n)
            f.after_id = rows[n - 1].id;
    }
    if (out)
        fclose(out);
    if (!ok)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    else if (csv) {
        char disposition[96];
        snprintf(disposition, sizeof disposition, "attachment; filename=\"gpurent-%s.csv\"", req->params[0]);
        http_add_header(req, "Content-Disposition", disposition);
        http_reply_raw(req, 200, "text/csv; charset=utf-8", csv_text, csv_len);
    } else {
        json_t *reply = json_pack("{s:s, s:s, s:o, s:o, s:o, s:o, s:O, s:O, s:O}", "month", req->params[0], "currency",
                                  daemon_config->currency, "from", json_time(from, 0), "to", json_time(to, 0),
                                  "opening_balance", json_money(opening), "closing_balance", json_money(closing),
                                  "transactions", lines, "usage", usage, "storage", storage);
        json_object_set_new(reply, "apps", app_usage_rows(s, req->user_id, from, to));
        http_reply_json(req, 200, reply);
    }
    free(csv_text);
    json_decref(lines);
    json_decref(usage);
    json_decref(storage);
}
