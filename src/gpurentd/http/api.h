/* api.h: the HTTP layer (src/gpurentd/http): the route table, what every
 * request passes and one handler file per API resource. A handler checks
 * its input, changes the domain through the store in one transaction, wakes
 * the loop concerned and answers once (ASSERTed in src/common/http.c).
 *
 *   routes.c       every route, in one table (docs/openapi.json follows it)
 *   auth.c         bearer API keys (expiry, last use) and roles
 *   throttle.c     failed-login lockouts and the sign-up and reset limits
 *   idempotency.c  Idempotency-Key: the replay before a change and the
 *                  record in its transaction
 *   paging.c       limit and cursor
 *   limits.c       the money maxima's 400s, in one wording
 *   metrics.c      GET /metrics
 *   api_*.c        one file per resource: health, accounts, keys, GPU
 *                  types, nodes, images, volumes, instances, users, balance,
 *                  prices, storage prices, credits, payments, billing,
 *                  audit, SSH keys, the password (api_password.c) and its
 *                  reset (api_password_reset.c), sign-ups and admins
 *                  acting on accounts (api_signup.c)
 *   api_logs.c     instance logs, read from agents by the logs proxy
 *   api_apps.c     the app marketplace and gpurent-gateway's signed
 *                  internal API (issue 17)
 *   api_console.c  the web console's static files (/console) and /

 *   api_terminal.c the web terminal: its tokens and its WebSocket */
#ifndef GPURENT_API_H
#define GPURENT_API_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "domain/domain.h"
#include "gpurent/http.h"
#include "loops/loops.h"
#include "store/store.h" /* IDEM_LOCATION_MAX */

/* routes.c */
extern const struct http_route daemon_routes[];
/* The routes of the separate metrics listener (metrics_listen). */
extern const struct http_route metrics_routes[];

/* auth.c */
int auth_authenticate(struct http_request *req, enum http_auth level);
/* The API's http_config.on_done: counts the request (metrics_http_done)
 * and, after a success, notes its key's last use when one is due. */
void auth_request_done(const struct http_request *req, int64_t duration_us);

/* thread_slots.c: the first of the ways slots where id may be (a hash of
 * id picks the set) in this thread's array of n slots of size bytes, made
 * zeroed on the thread's first call and handed to key's destructor when the
 * thread exits; NULL without memory. */
void *thread_slot(pthread_key_t key, size_t n, size_t ways, size_t size, const char *id);
/* The hash thread_slot places id by (FNV-1a), for other tables keyed by ids. */
uint32_t id_hash(const char *id);

/* throttle.c: failed-login limiting per account and per client address. */
/* Seconds the key must still wait (0 if it may try now). */
int64_t throttle_wait(const char *key, int64_t now);
/* Records a failure; after max failures within the lockout window the key
 * must wait lockout_s. */
void throttle_fail(const char *key, int64_t now, int64_t max, int64_t lockout_s);
/* Forgets a key's failures (after a successful login). */
void throttle_clear(const char *key);
/* Replies 429 with Retry-After when the account's key or the client's
 * ip_key must still wait ("too many <what>"); 1 if it did. */
int throttle_refused(struct http_request *req, const char *key, const char *ip_key, int64_t now, const char *what);
/* A failure of both: the account is locked after login_max_failures, the
 * client address after four times that, for login_lockout_s. */
void throttle_fail_both(const char *key, const char *ip_key, int64_t now);
/* The network a client address counts against as text: its /24
 * (v4_bits 24) or the address itself (32) for IPv4, IPv4-mapped IPv6
 * included, and its /64 for IPv6, which one host is given whole. */
void throttle_network(const char *ip, int v4_bits, char *out, size_t outlen);

/* paging.c: limit and cursor for list endpoints. Handlers fetch limit + 1
 * rows: the extra one says whether another page follows. */
struct page {
    int64_t limit;         /* rows to show */
    int64_t after_t;       /* cursor: sort key of the last row seen (-1: first page) */
    char after_id[40];     /* cursor: that row's id or other unique key, such as an invite code of
                            * up to 32 bytes ("" on the first page) */
};
/* Reads limit (1..max, default def) and cursor; replies 400 and returns -1
 * if either is bad. */
int page_begin(struct http_request *req, int64_t max, int64_t def, struct page *p);
/* How many of the fetched rows to show. */
size_t page_shown(const struct page *p, size_t fetched);
/* The next_cursor naming the last row shown (new reference). */
json_t *page_cursor(int64_t last_t, const char *last_id);

/* limits.c: the money maxima as every route enforces them. */
/* Replies 400 invalid_field for an amount (the value of field) over limit,
 * naming both and the option: "amount 2000000.00 is over max_topup
 * 1000000.00 CNY". */
void limit_refuse(struct http_request *req, const char *field, int64_t amount, const char *option, int64_t limit);
/* A new price's body: the amount field (within option's max) and an
 * optional effective_at, not before now. 0, or -1 after a 400 naming the
 * field. */
int limit_price_body(struct http_request *req, const json_t *body, const char *field, const char *example,
                     const char *option, int64_t max, int64_t now, int64_t *amount, int64_t *effective_at);
/* The 400 invalid_field (naming field) for money a transaction refused with
 * LEDGER_OVER_BALANCE: amount would take user_id's balance over max_balance.
 * label words the money in the message (NULL: the field's name). */
void limit_refuse_balance(struct http_request *req, const char *field, const char *label, const char *user_id,
                          int64_t amount);

/* idempotency.c: Idempotency-Key handling for POSTs that create or move
 * capacity or money. */
struct idempotency {
    char key[256]; /* the header, "" when absent */
    char hash[65]; /* SHA-256 of method, path and body */
    char location[IDEM_LOCATION_MAX]; /* the answer's Location: set before
                                       * recording it, read by a replay */
};
/* Reads the header. Returns 1 if the request was answered (a replay, a
 * reused key or a bad header), 0 to go on. */
int idempotency_begin(struct http_request *req, struct idempotency *idem);
/* The in-transaction replay, before the operation acts: a retry sent while
 * the first try was in flight finds the twin's record here (writers are
 * serialised). IDEM_NONE: go on; IDEM_REPLAY: *status, *body (malloc'd,
 * caller frees) and idem->location are the twin's answer; IDEM_REUSED: the
 * key came with another request. A negative store_rc on failure. */
enum { IDEM_NONE = 0, IDEM_REPLAY = 1, IDEM_REUSED = 2 };
int idempotency_twin(struct store *s, const struct http_request *req, struct idempotency *idem, int *status,
                     char **body);
/* Records the answer, with idem->location, inside the operation's
 * transaction. */
int idempotency_record(struct store *s, const struct http_request *req, const struct idempotency *idem, int status,
                       const char *body);
/* Replies with a recorded answer: its status, Location and body, marked
 * Idempotent-Replayed. */
void idempotency_replay(struct http_request *req, const struct idempotency *idem, int status, const char *body);

/* api_health.c */
void api_healthz(struct http_request *req);
void api_readyz(struct http_request *req);
/* http_config.unavailable_cause: 1 with a reason while the database's disk
 * is full, so internal errors are answered 503 with it. */
int api_unavailable_cause(char *why, size_t whylen);
void api_openapi(struct http_request *req);

/* api_console.c: GET / (302 to /console), the console's index and its
 * files up to three folders deep. */
void api_console_root(struct http_request *req);
void api_console_index(struct http_request *req);
void api_console_file(struct http_request *req);

/* api_accounts.c */
void api_signup(struct http_request *req);
void api_login(struct http_request *req);
void api_me(struct http_request *req);

/* api_keys.c */
void api_keys_create(struct http_request *req);
void api_keys_list(struct http_request *req);
void api_keys_get(struct http_request *req);
void api_keys_revoke(struct http_request *req);
void api_keys_revoke_all(struct http_request *req);
/* api_password.c */
void api_me_password(struct http_request *req);
/* api_password_reset.c: a forgotten password. */
void api_password_reset(struct http_request *req);
void api_password_reset_confirm(struct http_request *req);
/* The password rules (api_accounts.c): replies 400 naming field and returns
 * -1 when pw breaks one. A password is 10 to API_PASSWORD_MAX characters,
 * counted as code points, as a person and the API document count them; a
 * body may carry up to API_PASSWORD_MAX_BYTES, four bytes a character. */
#define API_PASSWORD_MAX       256
#define API_PASSWORD_MAX_BYTES (4 * API_PASSWORD_MAX)
int api_password_check(struct http_request *req, const char *field, const char *pw);
/* The same for a password given to be compared (a login, the current one):
 * only its longest. */
int api_password_given_check(struct http_request *req, const char *field, const char *pw);

/* api_instances.c */
void api_instances_create(struct http_request *req);
void api_instances_list(struct http_request *req);
void api_instances_get(struct http_request *req);
void api_instances_patch(struct http_request *req);
void api_instances_start(struct http_request *req);
void api_instances_stop(struct http_request *req);
void api_instances_terminate(struct http_request *req);
void api_instances_events(struct http_request *req);
void api_instances_ssh_config(struct http_request *req);

/* api_logs.c */
void api_instances_logs(struct http_request *req);
/* api_terminal.c */
void api_terminal_tokens_create(struct http_request *req);
void api_instances_terminal(struct http_request *req);

/* api_ssh_keys.c */
void api_ssh_keys_create(struct http_request *req);
void api_ssh_keys_list(struct http_request *req);
void api_ssh_keys_get(struct http_request *req);
void api_ssh_keys_delete(struct http_request *req);

/* api_volumes.c */
void api_volumes_create(struct http_request *req);
void api_volumes_list(struct http_request *req);
void api_volumes_get(struct http_request *req);
void api_volumes_delete(struct http_request *req);

/* api_reservations.c */
void api_reservations_create(struct http_request *req);
void api_reservations_list(struct http_request *req);
void api_reservations_get(struct http_request *req);
void api_reservations_cancel(struct http_request *req);
void api_reservations_availability(struct http_request *req);

/* api_images.c */
void api_images_list(struct http_request *req);
void api_images_create(struct http_request *req);
void api_images_delete(struct http_request *req);

/* api_users.c: admin user limits */
void api_users_set_limits(struct http_request *req);

/* api_balance.c */
void api_balance_get(struct http_request *req);
void api_transactions_list(struct http_request *req);
void api_usage_get(struct http_request *req);
void api_statements_get(struct http_request *req);

/* api_prices.c */
void api_prices_list(struct http_request *req);
void api_estimate_get(struct http_request *req);
void api_prices_put(struct http_request *req);
/* api_storage_prices.c */
void api_storage_prices_list(struct http_request *req);
void api_storage_prices_put(struct http_request *req);
/* Whether region may name a storage region: letters, digits, '.', '_'
 * or '-', 1 to 63, starting with a letter or digit, and not "global"
 * (the API's name of the global price). */
int storage_region_valid(const char *region);

/* api_credits.c */
void api_invite_redeem(struct http_request *req);
/* The 400 for an invite code that could not be redeemed (field names it in
 * the request), saying whether it is unknown, expired or used up. */
void api_invite_refused(struct http_request *req, const char *field, const char *code);
void api_invite_codes_list(struct http_request *req);
void api_invite_codes_get(struct http_request *req);
void api_invite_codes_create(struct http_request *req);
void api_grants_create(struct http_request *req);
void api_grants_get(struct http_request *req);

/* api_payments.c */
void api_topups_create(struct http_request *req);
void api_topups_get(struct http_request *req);
void api_payments_webhook(struct http_request *req);

/* api_billing.c */
void api_billing_run(struct http_request *req);

/* api_audit.c: the record of admin money actions. */
/* Reads the optional "reason" of an admin route's body (declared among its
 * fields as a string; 4 * max_chars bytes hold any max_chars characters):
 * 1 to max_chars characters. *out is "" when absent (borrowed from body
 * otherwise). Replies 400 and returns -1 when bad. */
int audit_reason(struct http_request *req, json_t *body, size_t max_chars, const char **out);
/* Writes the admin_actions row for an action req's admin did, in the
 * caller's transaction (s inside store_txn): action is grant, topup,
 * invite_code, price, limits, billing_run, storage_price, suspend or
 * reinstate; target the user id, GPU type, code or storage region (NULL for
 * none); amount in micro-yuan (-1 for none); detail the
 * request's effective values (borrowed; written with sorted keys). */
int audit_record(struct store *s, const struct http_request *req, const char *action, const char *target,
                 int64_t amount, json_t *detail, const char *reason);
void api_audit_list(struct http_request *req);

/* api_gpu_types.c */
void api_gpu_types_list(struct http_request *req);
void api_gpu_types_put(struct http_request *req);
void api_gpu_types_delete(struct http_request *req);

/* api_nodes.c */
void api_nodes_create(struct http_request *req);
void api_nodes_list(struct http_request *req);
void api_nodes_get(struct http_request *req);
void api_nodes_set_state(struct http_request *req);
void api_nodes_delete(struct http_request *req);
void api_nodes_patch(struct http_request *req);

/* api_signup.c: sign-up limits, e-mail verification, the launch gate for
 * unverified accounts, admins' look-up, suspension and sign-up list. */
/* Replies 429 with Retry-After and returns -1 when the client's address or
 * subnet has had its hour's sign-ups (signup_rate_per_*). */
int signup_rate_check(struct http_request *req);
/* Counts a sign-up against the client's address and subnet. */
void signup_rate_count(struct http_request *req);
void signup_count_ok(void);
/* reason: rate_address, rate_subnet, email_taken or invite_code. */
void signup_count_refused(const char *reason);
/* The sign-up and mail counters, in the text format /metrics serves. */
void signup_metrics_write(FILE *f);
/* A user as admins see it (verification, trial, sign-up address). */
json_t *admin_user_json(const struct user *u);
void api_verify_email(struct http_request *req);
void api_verify_email_resend(struct http_request *req);
/* POST /v1/instances and /start, refused with 403 email_not_verified until
 * the caller's address is verified. */
void api_instances_create_verified(struct http_request *req);
void api_instances_start_verified(struct http_request *req);
/* POST /v1/volumes, refused the same way: storage is billed from creation. */
void api_volumes_create_verified(struct http_request *req);
/* POST /v1/apps, refused the same way: its replicas are the publisher's. */
void api_apps_create_verified(struct http_request *req);
void api_admin_users_find(struct http_request *req);
void api_admin_users_suspend(struct http_request *req);
void api_admin_users_reinstate(struct http_request *req);
void api_admin_signups(struct http_request *req);

/* api_apps.c: the app marketplace and the gateways' internal API. */
void api_apps_create(struct http_request *req);
void api_apps_list(struct http_request *req);
void api_apps_get(struct http_request *req);
void api_apps_patch(struct http_request *req);
void api_apps_delete(struct http_request *req);
void api_apps_stats(struct http_request *req);
void api_gateway_state(struct http_request *req);
void api_gateway_reports(struct http_request *req);

/* metrics.c: GET /metrics, and the HTTP requests it counts. */
void metrics_http_done(const struct http_request *req, int64_t duration_us);
void api_metrics(struct http_request *req);

#endif
