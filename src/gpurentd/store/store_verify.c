/* store_verify.c: the SQL side of `gpurentd ledger verify`: every money
 * invariant that can be said as a query over the ledger's raw rows, and the
 * settled intervals read as they are stored, for the auditor in
 * audit/ledger_verify.c to recompute. Read-only. */
#include "store/store_sql.h"

#include <stdio.h>
#include <string.h>

struct check {
    const char *what; /* the invariant, said as a breach */
    const char *sql;  /* rows that break it: an id and a detail */
};

static const struct check checks[] = {
    {"transaction does not balance",
     "SELECT transaction_id, 'postings sum to ' || sum(amount) FROM ledger_postings GROUP BY transaction_id"
     " HAVING sum(amount) <> 0"                                                                              },
    {"transaction has fewer than two postings",
     "SELECT t.id, count(p.id) || ' postings' FROM ledger_transactions t LEFT JOIN ledger_postings p"
     " ON p.transaction_id = t.id GROUP BY t.id HAVING count(p.id) < 2"                                      },
    {"cached balance differs from the sum of postings",
     "SELECT a.id, 'balance ' || a.balance || ', postings ' || coalesce(sum(p.amount), 0) FROM ledger_accounts a"
     " LEFT JOIN ledger_postings p ON p.account_id = a.id GROUP BY a.id HAVING a.balance <> coalesce(sum(p.amount), "
     "0)"                                                                                                    },
    {"user account went below zero",
     "SELECT account_id, 'lowest running balance ' || min(running) FROM (SELECT p.account_id,"
     " sum(p.amount) OVER (PARTITION BY p.account_id ORDER BY p.id) AS running FROM ledger_postings p"
     " JOIN ledger_accounts a ON a.id = p.account_id WHERE a.kind IN ('cash', 'grant'))"
     " GROUP BY account_id HAVING min(running) < 0"                                                          },
    {"grant's remaining differs from its account",
     "SELECT g.id, 'remaining ' || g.remaining || ', account ' || coalesce(a.balance, 0) FROM credit_grants g"
     " LEFT JOIN ledger_accounts a ON a.id = 'grant:' || g.id WHERE coalesce(a.balance, 0) <> g.remaining"   },
 /* Funded once, by its grant transaction; drawn, net of refunds, never
     * more than that (refunds give usage back, so the gross draws may). */
    {"grant overspent or never funded",
     "SELECT g.id, 'amount ' || g.amount || ', funded ' || coalesce(sum(p.amount) FILTER (WHERE t.kind = 'grant'), 0)"
     " || ', drawn ' || coalesce(-sum(p.amount) FILTER (WHERE t.kind <> 'grant'), 0) FROM credit_grants g"
     " LEFT JOIN ledger_postings p ON p.account_id = 'grant:' || g.id"
     " LEFT JOIN ledger_transactions t ON t.id = p.transaction_id GROUP BY g.id"
     " HAVING coalesce(sum(p.amount) FILTER (WHERE t.kind = 'grant'), 0) <> g.amount"
     " OR coalesce(-sum(p.amount) FILTER (WHERE t.kind <> 'grant'), 0) > g.amount"                           },
    {"voided grant still has money",
     "SELECT id, 'remaining ' || remaining FROM credit_grants WHERE voided_at IS NOT NULL AND remaining <> 0"},
    {"grant leg does not name its grant",
     "SELECT p.id, p.account_id FROM ledger_postings p WHERE p.account_id LIKE 'grant:%'"
     " AND (p.grant_id IS NULL OR p.account_id <> 'grant:' || p.grant_id)"                                   },
    {"interval's revenue differs from what it says was billed",
     "SELECT r.id, 'billed ' || r.billed || ', revenue ' || coalesce(x.s, 0) FROM running_intervals r LEFT JOIN"
     " (SELECT t.interval_id AS id, sum(p.amount) AS s FROM ledger_postings p JOIN ledger_transactions t"
     " ON t.id = p.transaction_id WHERE p.account_id = 'revenue' GROUP BY t.interval_id) x ON x.id = r.id"
     " WHERE coalesce(x.s, 0) <> r.billed"                                                                   },
 /* A refund gives an interval's payers back part of what they paid it,
     * from its revenue, and nothing else. */
    {"refund names no interval or moves other than revenue back to its payers",
     "SELECT t.id, 'interval ' || coalesce(t.interval_id, 'none') FROM ledger_transactions t"
     " WHERE t.kind = 'refund' AND (t.interval_id IS NULL OR EXISTS (SELECT 1 FROM ledger_postings p"
     " JOIN ledger_accounts a ON a.id = p.account_id WHERE p.transaction_id = t.id AND NOT"
     " ((a.kind = 'revenue' AND p.amount < 0) OR (a.kind IN ('cash', 'grant') AND p.amount > 0"
     "  AND a.user_id = t.user_id))))"                                                                       },
    {"account refunded more than it paid for an interval",
     "SELECT t.interval_id || ' ' || p.account_id, 'paid ' || -sum(p.amount) FILTER (WHERE t.kind = 'usage')"
     " || ', refunded ' || coalesce(sum(p.amount) FILTER (WHERE t.kind = 'refund'), 0)"
     " FROM ledger_transactions t JOIN ledger_postings p ON p.transaction_id = t.id"
     " JOIN ledger_accounts a ON a.id = p.account_id WHERE t.kind IN ('usage', 'refund') AND a.kind IN ('cash', "
     "'grant')"
     " GROUP BY t.interval_id, p.account_id HAVING sum(p.amount) > 0"                                        },
    {"interval settled while still open",
     "SELECT id, 'billed ' || billed FROM running_intervals WHERE settled = 1 AND ended_at IS NULL"          },
    {"top-up differs from the cash it added",
     "SELECT u.id, 'amount ' || u.amount || ', cash ' || coalesce(sum(p.amount), 0) FROM topups u"
     " LEFT JOIN ledger_transactions t ON t.topup_id = u.id LEFT JOIN ledger_postings p ON p.transaction_id = t.id"
     " AND p.account_id LIKE 'cash:%' GROUP BY u.id HAVING coalesce(sum(p.amount), 0) <> u.amount"           },
    /* Storage (0020): each volume's revenue is what it says was billed,
     * and a storage transaction moves only its user's funds to revenue
     * for a volume of that user. */
    {"volume's storage revenue differs from what it says was billed",
     "SELECT v.id, 'billed ' || v.storage_billed || ', revenue ' || coalesce(x.s, 0) FROM volumes v LEFT JOIN"
     " (SELECT t.volume_id AS id, sum(p.amount) AS s FROM ledger_postings p JOIN ledger_transactions t"
     " ON t.id = p.transaction_id WHERE p.account_id = 'revenue' AND t.kind = 'storage' GROUP BY t.volume_id) x"
     " ON x.id = v.id WHERE coalesce(x.s, 0) <> v.storage_billed"                                           },
    {"storage transaction names no volume of its user or moves other than its funds to revenue",
     "SELECT t.id, 'volume ' || coalesce(t.volume_id, 'none') FROM ledger_transactions t"
     " WHERE t.kind = 'storage' AND (t.volume_id IS NULL OR t.interval_id IS NOT NULL"
     " OR NOT EXISTS (SELECT 1 FROM volumes v WHERE v.id = t.volume_id AND v.user_id = t.user_id)"
     " OR EXISTS (SELECT 1 FROM ledger_postings p JOIN ledger_accounts a ON a.id = p.account_id"
     " WHERE p.transaction_id = t.id AND NOT ((a.kind = 'revenue' AND p.amount > 0)"
     "  OR (a.kind IN ('cash', 'grant') AND p.amount < 0 AND a.user_id = t.user_id))))"                   },
    {"volume's storage settled while it exists",
     "SELECT id, 'billed ' || storage_billed FROM volumes WHERE storage_settled = 1 AND deleted_at IS NULL"  },
    /* Reservations (0024): a block's revenue is what it was paid less what
     * was refunded; its payment is its tariff; a 'reservation' moves only
     * its holder's funds to revenue and a 'reservation_refund' only revenue
     * back to them, never more to an account than it paid; its credits
     * are grants of its holder. */
    {"reservation's revenue differs from what it was paid less refunds",
     "SELECT r.id, 'paid ' || r.amount || ', refunded ' || r.refunded || ', revenue ' || coalesce(x.s, 0)"
     " FROM reservations r LEFT JOIN (SELECT t.reservation_id AS id, sum(p.amount) AS s FROM ledger_postings p"
     " JOIN ledger_transactions t ON t.id = p.transaction_id WHERE p.account_id = 'revenue'"
     " AND t.kind IN ('reservation', 'reservation_refund') GROUP BY t.reservation_id) x ON x.id = r.id"
     " WHERE coalesce(x.s, 0) <> r.amount - r.refunded"                                                   },
    {"reservation paid other than its tariff",
     "SELECT id, 'paid ' || amount || ', tariff ' || (card_hour * card_count * ((ends_at - starts_at) / 3600))"
     " FROM reservations WHERE amount <> card_hour * card_count * ((ends_at - starts_at) / 3600)"
     " OR starts_at % 3600 <> 0 OR ends_at % 3600 <> 0 OR ends_at <= starts_at"                           },
    {"reservation refunded though not cancelled, or cancelled after its start",
     "SELECT id, 'refunded ' || refunded || ', state ' || state FROM reservations"
     " WHERE (state <> 'cancelled' AND refunded <> 0) OR (state = 'cancelled' AND (cancelled_at IS NULL"
     " OR (cancelled_at >= starts_at AND refunded <> 0)))"                                                 },
    {"reservation transaction names no reservation of its user or moves money the wrong way",
     "SELECT t.id, 'reservation ' || coalesce(t.reservation_id, 'none') FROM ledger_transactions t"
     " WHERE t.kind IN ('reservation', 'reservation_refund') AND (t.reservation_id IS NULL"
     " OR t.interval_id IS NOT NULL OR t.volume_id IS NOT NULL"
     " OR NOT EXISTS (SELECT 1 FROM reservations r WHERE r.id = t.reservation_id AND r.user_id = t.user_id)"
     " OR EXISTS (SELECT 1 FROM ledger_postings p JOIN ledger_accounts a ON a.id = p.account_id"
     " WHERE p.transaction_id = t.id AND NOT CASE t.kind WHEN 'reservation' THEN"
     "  (a.kind = 'revenue' AND p.amount > 0) OR (a.kind IN ('cash', 'grant') AND p.amount < 0 AND a.user_id = t.user_id)"
     " ELSE (a.kind = 'revenue' AND p.amount < 0) OR (a.kind IN ('cash', 'grant') AND p.amount > 0"
     "  AND a.user_id = t.user_id) END))"                                                                  },
    {"account refunded more than it paid for a reservation",
     "SELECT t.reservation_id || ' ' || p.account_id, 'net ' || sum(p.amount) FROM ledger_transactions t"
     " JOIN ledger_postings p ON p.transaction_id = t.id JOIN ledger_accounts a ON a.id = p.account_id"
     " WHERE t.kind IN ('reservation', 'reservation_refund') AND a.kind IN ('cash', 'grant')"
     " GROUP BY t.reservation_id, p.account_id HAVING sum(p.amount) > 0"                                   },
    {"reservation's credits differ from the grants recorded for its lost hours",
     "SELECT r.id, 'credited ' || r.credited || ', hours ' || coalesce(c.s, 0) FROM reservations r"
     " LEFT JOIN (SELECT reservation_id AS id, sum(amount) AS s FROM reservation_credits GROUP BY reservation_id) c"
     " ON c.id = r.id WHERE coalesce(c.s, 0) <> r.credited"                                                },
    {"reservation credited for more card-hours than it holds, or outside its window",
     "SELECT c.reservation_id || ' ' || c.hour, 'cards ' || c.cards || ' of ' || r.card_count"
     " FROM reservation_credits c JOIN reservations r ON r.id = c.reservation_id"
     " WHERE c.cards > r.card_count OR c.hour < r.starts_at OR c.hour >= r.ends_at"
     " OR c.amount > (c.cards * r.card_hour)"                                                                },
    {"reservation credit names no grant of the holder",
     "SELECT c.reservation_id || ' ' || c.hour, 'grant ' || coalesce(c.grant_id, 'none') FROM reservation_credits c"
     " JOIN reservations r ON r.id = c.reservation_id WHERE c.amount > 0 AND NOT EXISTS (SELECT 1 FROM credit_grants g"
     " WHERE g.id = c.grant_id AND g.user_id = r.user_id AND g.source = 'reservation')"                    },
    /* App calls (0025): each charged call is one app_call transaction
     * that draws exactly its charge from its consumer, credits its
     * earning to a cash account and its fee to revenue, and charge =
     * earning + fee; every such transaction names a recorded call. */
    {"app call's charge, earning and fee differ from its ledger transaction",
     "SELECT c.id, 'charge ' || c.charge || ', earning ' || c.earning || ', fee ' || c.fee || '; drawn '"
     " || coalesce(x.drawn, 0) || ', credited ' || coalesce(x.earned, 0) || ', revenue ' || coalesce(x.fee, 0)"
     " FROM app_calls c LEFT JOIN (SELECT t.app_call_id AS id,"
     " -sum(p.amount) FILTER (WHERE a.user_id = t.user_id AND p.amount < 0) AS drawn,"
     " sum(p.amount) FILTER (WHERE a.kind = 'cash' AND p.amount > 0) AS earned,"
     " sum(p.amount) FILTER (WHERE a.kind = 'revenue') AS fee FROM ledger_transactions t"
     " JOIN ledger_postings p ON p.transaction_id = t.id JOIN ledger_accounts a ON a.id = p.account_id"
     " WHERE t.kind = 'app_call' GROUP BY t.app_call_id) x ON x.id = c.id"
     " WHERE c.charge <> c.earning + c.fee OR coalesce(x.drawn, 0) <> c.charge"
     " OR coalesce(x.earned, 0) <> c.earning OR coalesce(x.fee, 0) <> c.fee"                                 },
    {"app_call transaction names no recorded call of its consumer",
     "SELECT t.id, 'call ' || coalesce(t.app_call_id, 'none') FROM ledger_transactions t WHERE t.kind = 'app_call'"
     " AND NOT EXISTS (SELECT 1 FROM app_calls c WHERE c.id = t.app_call_id AND c.consumer_id = t.user_id)"},
    {"app_call transaction's payee is not the publisher its earning went to",
     "SELECT t.id, 'payee ' || coalesce(t.payee_id, 'none') || ', earning ' || c.earning || ' to '"
     " || a.publisher_id FROM ledger_transactions t JOIN app_calls c ON c.id = t.app_call_id"
     " JOIN apps a ON a.id = c.app_id WHERE t.kind = 'app_call'"
     " AND t.payee_id IS NOT (CASE WHEN c.earning > 0 THEN a.publisher_id END)"                            },
    {"transaction other than an app call names a payee",
     "SELECT t.id, 'kind ' || t.kind || ', payee ' || t.payee_id FROM ledger_transactions t"
     " WHERE t.payee_id IS NOT NULL AND t.kind <> 'app_call'"                                                },
    {"money exists outside the ledger",
     "SELECT 'all accounts', 'sum ' || sum(balance) FROM ledger_accounts HAVING sum(balance) <> 0"           },
};

static const char SQL_CHARGED_INTERVALS[] =
    "SELECT r.id, r.gpu_model, r.card_count, r.started_at, coalesce(r.ended_at, 0), r.billed, r.settled,"
    " coalesce((SELECT max(t.at) FROM ledger_transactions t WHERE t.interval_id = r.id AND t.kind = 'usage'), 0)"
    " FROM running_intervals r WHERE (r.settled = 1 AND r.ended_at IS NOT NULL) OR r.billed <> 0"
    " ORDER BY r.gpu_model, r.id";

int store_verify_rules(struct store *s, store_breach_fn fn, void *ctx)
{
    int breaches = 0;
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(store_db(s), checks[i].sql, -1, &st, NULL) != SQLITE_OK) {
            fn(ctx, checks[i].what, NULL, sqlite3_errmsg(store_db(s)));
            return -1;
        }
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            fn(ctx, checks[i].what, (const char *)sqlite3_column_text(st, 0), (const char *)sqlite3_column_text(st, 1));
            breaches++;
        }
        /* sum() raises "integer overflow" (SQLite gives it no code of its
         * own) rather than return a wrong total. Amounts that big are a
         * breach in themselves: it is reported as one and the other checks
         * go on, instead of the whole verification stopping. */
        int overflow = rc != SQLITE_DONE && strcmp(sqlite3_errmsg(store_db(s)), "integer overflow") == 0;
        if (rc != SQLITE_DONE && !overflow)
            fn(ctx, checks[i].what, NULL, sqlite3_errmsg(store_db(s)));
        sqlite3_finalize(st);
        if (overflow) {
            fn(ctx, checks[i].what, "", "sum overflows 64-bit integers");
            breaches++;
        } else if (rc != SQLITE_DONE) {
            return -1;
        }
    }
    return breaches;
}

int store_charged_intervals(struct store *s, int (*fn)(void *ctx, const struct charged_interval *iv), void *ctx)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(store_db(s), SQL_CHARGED_INTERVALS, -1, &st, NULL) != SQLITE_OK)
        return STORE_ERROR;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct charged_interval iv = {.id = sqlite3_column_int64(st, 0),
                                     .card_count = sqlite3_column_int64(st, 2),
                                     .started_at = sqlite3_column_int64(st, 3),
                                     .ended_at = sqlite3_column_int64(st, 4),
                                     .billed = sqlite3_column_int64(st, 5),
                                     .settled = sqlite3_column_int(st, 6),
                                     .last_charge = sqlite3_column_int64(st, 7)};
        store_column_text(iv.gpu_model, sizeof iv.gpu_model, st, 1);
        if (fn(ctx, &iv) != 0) {
            rc = SQLITE_DONE;
            sqlite3_finalize(st);
            return STORE_ERROR;
        }
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? STORE_OK : store_rc_from_sqlite(s, rc, "charged intervals");
}

static const char SQL_VOLUME_CHARGES[] =
    "SELECT v.id, v.region, v.size_gb, v.created_at, coalesce(v.deleted_at, 0), v.storage_billed,"
    " coalesce((SELECT max(t.at) FROM ledger_transactions t WHERE t.volume_id = v.id AND t.kind = 'storage'), 0),"
    " v.storage_settled FROM volumes v WHERE v.storage_billed <> 0 OR v.storage_settled = 1"
    " OR EXISTS (SELECT 1 FROM ledger_transactions t WHERE t.volume_id = v.id) ORDER BY v.region, v.id";

int store_volume_charges(struct store *s, int (*fn)(void *ctx, const struct volume_charge *vc), void *ctx)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(store_db(s), SQL_VOLUME_CHARGES, -1, &st, NULL) != SQLITE_OK)
        return STORE_ERROR;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        struct volume_charge vc = {.size_gb = sqlite3_column_int64(st, 2),
                                   .created_at = sqlite3_column_int64(st, 3),
                                   .deleted_at = sqlite3_column_int64(st, 4),
                                   .billed = sqlite3_column_int64(st, 5),
                                   .last_charge = sqlite3_column_int64(st, 6),
                                   .settled = sqlite3_column_int(st, 7)};
        store_column_text(vc.volume_id, sizeof vc.volume_id, st, 0);
        store_column_text(vc.region, sizeof vc.region, st, 1);
        if (fn(ctx, &vc) != 0) {
            sqlite3_finalize(st);
            return STORE_ERROR;
        }
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? STORE_OK : store_rc_from_sqlite(s, rc, "volume charges");
}
