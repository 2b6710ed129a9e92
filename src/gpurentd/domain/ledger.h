/* ledger.h: money operations on the double-entry ledger. Each runs inside
 * the caller's store transaction, posts one balanced ledger transaction and
 * keeps grants and balances in step with it. Amounts are micro-yuan.
 *
 * Accounts: 'cash:USER' (a user's paid money), 'grant:GRANT' (one credit
 * grant), 'revenue' (usage earned), 'promotion' (credit given away, negative)
 * and 'payments' (cash received from payment providers, negative). */
#ifndef GPURENT_LEDGER_H
#define GPURENT_LEDGER_H

#include <stddef.h>
#include <stdint.h>

#include "gpurent/ids.h"

struct store;
struct billable;

/* What a user can spend at time at: cash and unexpired credit. */
struct funds {
    int64_t cash;      /* paid money */
    int64_t credit;    /* sum of unexpired grants' remaining */
    int64_t unbilled;  /* usage accrued up to `at` but not yet posted (ledger_funds_now only) */
    int64_t available; /* cash + credit, less unbilled (never below 0) */
};
/* The ledger's funds as posted: grants valid at `at` (expiring after it). */
int ledger_funds(struct store *s, const char *user_id, int64_t at, struct funds *out);
/* Usage of the user's running intervals and storage of their volumes
 * accrued up to `at` beyond what was posted for them. */
int ledger_unbilled(struct store *s, const char *user_id, int64_t at, int64_t *out);
/* What the user can really spend at `at`: ledger_funds less the unbilled
 * usage (billing posts it at least every few minutes, not every pass).
 * Conservative: credit that expired since the last posting is not counted,
 * even for the usage it will pay for. */
int ledger_funds_now(struct store *s, const char *user_id, int64_t at, struct funds *out);

/* How long the user's funds last at their current burn: *runway_minutes is
 * -1 when nothing burns; *low says whether that is under
 * low_balance_minutes. f and burn (micro per hour) may be NULL. */
int ledger_runway(struct store *s, const char *user_id, int64_t at, struct funds *f, int64_t *burn,
                  int64_t *runway_minutes, int *low);
/* ledger_runway's *low alone, with the funds already read at `at` when
 * known is not NULL; nothing burning is never low, and then no funds are
 * read at all. */
int ledger_low_balance(struct store *s, const char *user_id, int64_t at, const struct funds *known, int *low);

/* ledger_grant and ledger_topup refuse with this (nothing written; the
 * caller's transaction rolls back) when the money would take what the user
 * holds, cash and credit not voided, over max_balance. */
#define LEDGER_OVER_BALANCE (-110)

/* Grants credit: source 'signup', 'invite:CODE' or 'admin'; expires_at 0
 * for never. id_out gets the grant id. LEDGER_OVER_BALANCE past max_balance. */
int ledger_grant(struct store *s, const char *user_id, const char *source, int64_t amount, int64_t expires_at,
                 int64_t at, const char *reason, char id_out[ID_MAX]);
/* Adds cash from a payment, once per payment_id: a repeat is STORE_OK with
 * *duplicate set and nothing posted; the same payment id for another user or
 * amount is STORE_CONFLICT, and nothing else is. LEDGER_OVER_BALANCE past
 * max_balance. */
int ledger_topup(struct store *s, const char *user_id, const char *payment_id, int64_t amount, const char *source,
                 int64_t at, char id_out[ID_MAX], int *duplicate);
/* Charges usage: grants first (soonest expiry first, as valid in the second
 * before `at`), then cash, all to revenue, each leg naming its grant.
 * STORE_CONFLICT if the funds do not cover amount (roll back). */
int ledger_charge(struct store *s, const char *user_id, int64_t amount, int64_t at, const char *instance_id,
                  int64_t interval_id, const char *reason);
/* Charges one app call (issue 17) the same way, from the consumer's grants
 * then cash, to the publisher's cash (charge - fee) and revenue (fee), as
 * an 'app_call' transaction naming the call. */
int ledger_charge_app_call(struct store *s, const char *consumer_id, const char *publisher_id, int64_t charge,
                           int64_t fee, int64_t at, const char *call_id, const char *reason);
/* Charges storage of a volume the same way, as a 'storage' transaction
 * naming the volume. */
int ledger_charge_storage(struct store *s, const char *user_id, int64_t amount, int64_t at, const char *volume_id,
                          const char *reason);
/* Storage of the user's volumes accrued up to `at` beyond what was posted
 * (what was not covered stays owed: it is charged first when money
 * arrives). Part of ledger_unbilled. */
int ledger_storage_owed(struct store *s, const char *user_id, int64_t at, int64_t *out);
/* What an hour of the user's live volumes costs at the prices in force at
 * `at`: floor(sum(price x size_gb) x 3600 / 2 592 000). Part of the
 * balance's burn rate. */
int ledger_storage_burn(struct store *s, const char *user_id, int64_t at, int64_t *per_hour);
/* Voids what is left of the user's grants that expired at or before at.
 * With user_id NULL: of every user with no running time left to bill (those
 * with some spend each grant up to its expiry first, in their billing). */
int ledger_expire_grants(struct store *s, const char *user_id, int64_t at);
/* Gives back the credit of grants voided at an expiry still after at: a
 * clock that ran ahead voided them, and has stepped back since. Each gets
 * what the voids took from it, as an 'expiry' transaction the other way. */
int ledger_unexpire_early_grants(struct store *s, int64_t at);
/* Redeems an invite code for the user at `at`: STORE_NOT_FOUND for an
 * unknown, expired or used-up code, STORE_CONFLICT if already redeemed,
 * LEDGER_OVER_BALANCE (from ledger_grant) past max_balance. */
int ledger_redeem_invite(struct store *s, const char *user_id, const char *code, int64_t at, char grant_out[ID_MAX]);

/* The end of the time interval b may be charged for at t: its end, or t
 * while it runs, but never past the last good heartbeat of a node of it that
 * has missed one since (b->confirmed_until). Billing, the funds check and
 * the balance all charge [b->started_at, this). */
int64_t ledger_billable_end(const struct billable *b, int64_t t);
/* Gives back amount of what interval b was charged (it turned out not to
 * have run that long), as one 'refund' transaction at `at` naming the
 * interval and why: to the accounts that paid, the last drawn first. What
 * goes back to a grant since voided is voided again at once (an 'expiry'
 * transaction), as it would have been. STORE_ERROR if the interval was not
 * charged that much. */
int ledger_refund(struct store *s, const struct billable *b, int64_t amount, int64_t at, const char *why);
/* Ends the instance's open running interval at ended_at (never before its
 * start) and, if billing had charged it past that, refunds the difference
 * in the same transaction. When none is open, an interval that funds
 * running out ended after ended_at (a clock that was ahead, stepped back)
 * is pulled back to it the same way; otherwise a no-op. */
int ledger_close_interval(struct store *s, const char *instance_id, int64_t ended_at, const char *reason, int64_t now);

/* The price of a GPU type's card-hour at t (micro-yuan), or -1 if none. */
int64_t ledger_price_at(struct store *s, const char *gpu_model, int64_t t);

/* Reservations (0024). Charges a block's price when it is booked, drawn
 * as usage is (grants first, then cash) into revenue, as one
 * 'reservation' transaction naming it; STORE_CONFLICT if funds do not
 * cover it. */
int ledger_charge_reservation(struct store *s, const char *user_id, int64_t amount, int64_t at,
                              const char *reservation_id, const char *reason);
/* Gives amount of a block's payment back to the accounts that paid it, the
 * last drawn first, as one 'reservation_refund' transaction (what goes back
 * to a grant since voided is voided again). STORE_ERROR if it was not paid
 * that much. */
int ledger_refund_reservation(struct store *s, const char *user_id, const char *reservation_id, int64_t amount,
                              int64_t at, const char *reason);

#endif
