/* apps.h: the app marketplace's rules (issue 17): what a published app may
 * say, what one call costs and how it is settled on the ledger, and the
 * scaler's decision for an app's replicas. */
#ifndef GPURENT_APPS_H
#define GPURENT_APPS_H

#include <jansson.h>
#include <stdint.h>

#include "domain/domain.h"

struct store;
struct app;
struct app_call;

#define APP_MAX_ALLOWED 100      /* accounts a private app may list */
#define APP_MAX_TOKENS 100000000 /* tokens one call may report, each way */
#define APP_MAX_DURATION_MS 86400000
/* How often a replica's agent checks GET health_path on the app's port
 * (the spec's health.interval_s): with reconcile_sweep_ms and a gateway's
 * --sync-ms, the bound on how long a replica gone unwell keeps traffic. */
#define APP_HEALTH_INTERVAL_S 2

/* Fills a from a publish (is_patch 0: required fields, defaults) or a PATCH
 * body (only what it names), checked and bounded: 0, or -1 with o set
 * (ERR_INVALID_FIELD naming the field). *allowed gets the body's
 * allowed_users (borrowed) or NULL. Pure: the store checks (GPU type, image,
 * the listed accounts) are app_check_refs'. */
int app_from_body(const json_t *body, int is_patch, struct app *a, const json_t **allowed, struct op_outcome *o);
/* In a transaction: the GPU type exists, the image resolves for it, every
 * allowed user id names an account. */
int app_check_refs(struct store *s, const struct app *a, const json_t *allowed, struct op_outcome *o);
/* The app as the API shows it (new reference); full adds what only its
 * publisher sees (command, env, scaling state, allowed users, events). */
json_t *app_json(struct store *s, const struct app *a, int full);
/* What call c costs, before the consumer's funds: nothing for a call the
 * consumer got no answer for (status 400 or above); otherwise
 * floor((in * p_in + out * p_out) / 1000) + p_request + floor(ms * p_s / 1000),
 * tokens as the gateway recorded them delivered, each price the lower of
 * a's now and the one stamped on c at admission (when c has them). */
int64_t app_call_price(const struct app *a, const struct app_call *c);
/* Settles one usage record in the caller's transaction: a record whose id
 * is known already is STORE_OK with *duplicate 1 and nothing posted;
 * otherwise the price (at most the consumer's funds; the rest is `unpaid`)
 * is one app_call transaction: consumer -charge, publisher +earning,
 * revenue +fee, fee = floor(charge * app_platform_fee_ppm / 10^6). */
int app_call_settle(struct store *s, struct app_call *c, int64_t now, int *duplicate);
/* The replicas demand asks for: ceil(demand / target) within [min, max],
 * min after idle_seconds without demand; a decrease only once demand has
 * fit fewer replicas for `window_s` (a->below_since). Pure. */
int64_t app_scale_target(const struct app *a, int64_t demand, int64_t current, int64_t now, int64_t window_s);
/* In a transaction: brings a's live replicas to its target (creating
 * instances of its publisher, or terminating the newest), writing an event
 * for each decision. *changed says whether anything was asked of agents. */
int app_scale(struct store *s, struct app *a, int64_t now, int *changed);

#endif
