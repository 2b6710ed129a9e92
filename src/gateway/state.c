/* state.c: the gateway's copy of the control plane and its counters (see
 * gateway.h). The copy is replaced whole at every good sync and kept as
 * it was when gpurentd cannot be reached, so calls go on being served
 * from it; usage records are journaled on disk (journal.c) and wait in a
 * bounded queue, each with its id, and are resent until gpurentd has
 * answered for them (it settles an id once), or until a copy shows that a
 * report that carried them was committed. */
#include "gateway.h"
#include "gpurent/clock.h"
#include "gpurent/ids.h"
#include "gpurent/log.h"
#include "gpurent/secrets.h"
#include "gpurent/sign.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GW_MAX_REPLICAS 1024
#define GW_WINDOWS_FIRST 4096  /* rate-limit windows to start with; the table doubles when full */
#define GW_WINDOWS_MAX (1 << 22) /* beyond which a call is refused 429 rather than go uncounted */
#define GW_REPORT_BATCH 500

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static json_t *copy;    /* the last state document, or NULL */
static json_t *pending; /* usage records not yet answered for */

/* Calls outstanding per replica. */
static struct replica_count {
    char instance_id[ID_MAX];
    char app_id[ID_MAX]; /* whose replica, for the busy list */
    int outstanding;
    int64_t refused_until_ms; /* it failed a call unanswered: passed over until then */
} replicas[GW_MAX_REPLICAS];
static int n_replicas;

/* Demand per app, reported to the scaler. */
static struct app_count {
    char app_id[ID_MAX];
    int in_flight, queued;
} apps_count[GW_MAX_REPLICAS];
static int n_apps_count;

/* Calls in flight per consumer (admitted, not yet ended) and what they
 * hold of the consumer's funds: the copy's funds are what they were at
 * the last sync and nothing is drawn until a call's record is settled, so
 * concurrent calls, each checked against the same funds, would otherwise
 * all pass, and a stream costs more the longer it goes. At most one call
 * per connection, so GW_MAX_CONSUMERS slots always hold them. */
#define GW_MAX_CONSUMERS GW_MAX_CONNECTIONS
static struct consumer_count {
    char user_id[ID_MAX];
    int in_flight;
    int64_t held; /* the sum of their calls' holds (micro-yuan) */
} consumers[GW_MAX_CONSUMERS];
/* A hold that must grow takes this much answer more (output tokens and
 * upstream time) when the funds allow, so that a stream comes back for
 * more once per step, not per chunk. */
#define GW_HOLD_STEP_TOKENS 4096
#define GW_HOLD_STEP_MS 2000

static struct consumer_count *consumer_slot(const char *user_id, int create)
{
    struct consumer_count *free_slot = NULL;
    for (int i = 0; i < GW_MAX_CONSUMERS; i++) {
        if (consumers[i].in_flight > 0 && strcmp(consumers[i].user_id, user_id) == 0)
            return &consumers[i];
        if (!free_slot && consumers[i].in_flight == 0)
            free_slot = &consumers[i];
    }
    if (!create || !free_slot)
        return NULL;
    snprintf(free_slot->user_id, sizeof free_slot->user_id, "%s", user_id);
    free_slot->held = 0;
    return free_slot;
}

/* Under lock: the slot of an admitted call's consumer, which stays theirs
 * while the call is in flight (a call finds it without a search, which
 * would cost a pass over the table for every chunk of a stream). */
static struct consumer_count *call_consumer(const struct gw_call_app *a)
{
    struct consumer_count *u = &consumers[a->consumer];
    return u->in_flight > 0 && strcmp(u->user_id, a->user_id) == 0 ? u : NULL;
}

/* Under lock: the call leaves its consumer's calls in flight and gives
 * back what it held. */
static void consumer_leave(struct gw_call_app *a)
{
    struct consumer_count *u = call_consumer(a);
    if (u) {
        u->held -= a->held;
        u->in_flight--;
    }
    a->held = 0;
}

void gw_consumer_release(struct gw_call_app *a)
{
    pthread_mutex_lock(&lock);
    consumer_leave(a);
    pthread_mutex_unlock(&lock);
}

int64_t gw_call_cost(const struct gw_call_app *a, int64_t input_tokens, int64_t output_tokens, int64_t duration_ms)
{
    /* As gpurentd prices a call: the tokens' cost floored once, over both. */
    __int128 tokens = (__int128)input_tokens * a->price_input_1k + (__int128)output_tokens * a->price_output_1k;
    __int128 cost = tokens / 1000 + a->price_request + (__int128)duration_ms * a->price_second / 1000;
    return cost < 0 ? 0 : cost > INT64_MAX / 4 ? INT64_MAX / 4 : (int64_t)cost;
}

int64_t gw_input_estimate(int64_t body_bytes)
{
    return body_bytes <= 0 ? 0 : (body_bytes - 1) / GW_INPUT_BYTES_PER_TOKEN + 1;
}

/* What this gateway's finished calls cost that the copy's funds may not
 * show yet, per consumer: records in pending, and records answered for
 * whose report no copy has shown committed yet (answered below).
 * Admission takes both off the copy's funds, so quick calls one after
 * another within a sync period cannot each spend the same funds; and no
 * more, since a copy that shows a record's charge no longer counts it here
 * (copy_taken), so a consumer near the end of their funds is not refused
 * for calls counted twice. A chained hash table; an entry goes when both
 * are 0. */
#define UNSETTLED_BUCKETS 1024
static struct unsettled {
    char user_id[ID_MAX];
    int64_t pending, answered;
    struct unsettled *next;
} *unsettled[UNSETTLED_BUCKETS];

/* Each report names this run (random, new at every start) and its number
 * in it, from 1; gpurentd keeps the highest it committed of the run, in the
 * report's transaction, and the state lists it, read with the funds. A
 * record is sent in the first GW_REPORT_BATCH of pending, and stays in
 * them until it leaves pending (records only join at the end), so it goes
 * in every report from the first that carried it (first_sent) on: a copy
 * that lists report n of this run committed shows, in its funds, every
 * record first sent in report n or before, and no other. */
static char report_run[33];
static int64_t report_seq;   /* the last report sent */
static int64_t answered_seq; /* the last report answered */
static json_t *first_sent;   /* id of a pending record sent -> the first report that carried it */

/* Records answered for that a copy may not show yet: until one lists a
 * report from first_sent on committed, or one whose request went out after
 * the answer came (gpurentd settles a record before it answers for it; all
 * a copy tells that lists no report of this run, as when a report of the
 * last run, slow to commit, replaced this run's in gpurentd's row). */
static struct answered_cost {
    char user_id[ID_MAX];
    int64_t cost;
    int64_t first_sent;  /* the first report that carried it; 0: none of this run */
    int64_t answered_in; /* the report whose answer said so */
} *answered;
static size_t n_answered, answered_cap;

static struct unsettled **unsettled_link(const char *user_id)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *p = user_id; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    struct unsettled **link = &unsettled[h % UNSETTLED_BUCKETS];
    while (*link && strcmp((*link)->user_id, user_id) != 0)
        link = &(*link)->next;
    return link;
}

/* The most a usage record can cost: gpurentd's price (apps.c,
 * app_call_price) at the prices the call was admitted with, which
 * gpurentd charges no more than; 0 for an error answer. */
static int64_t record_cost(const json_t *r)
{
    json_int_t status = json_integer_value(json_object_get(r, "status"));
    if (status <= 0 || status >= 400)
        return 0;
    const json_t *p = json_object_get(r, "prices");
    struct gw_call_app prices = {.price_request = json_integer_value(json_object_get(p, "request")),
                                 .price_input_1k = json_integer_value(json_object_get(p, "input_1k")),
                                 .price_output_1k = json_integer_value(json_object_get(p, "output_1k")),
                                 .price_second = json_integer_value(json_object_get(p, "second"))};
    return gw_call_cost(&prices, json_integer_value(json_object_get(r, "input_tokens")),
                        json_integer_value(json_object_get(r, "output_tokens")),
                        json_integer_value(json_object_get(r, "duration_ms")));
}

/* Under lock: a record joins pending. */
static void pending_join(const json_t *r)
{
    const char *user = json_string_value(json_object_get(r, "user_id"));
    int64_t cost = record_cost(r);
    if (!user || cost == 0)
        return;
    struct unsettled **link = unsettled_link(user);
    if (!*link) {
        if (!(*link = calloc(1, sizeof **link)))
            return;
        snprintf((*link)->user_id, sizeof (*link)->user_id, "%s", user);
    }
    (*link)->pending += cost;
}

/* Under lock: pending record k leaves pending, answered for in report
 * answered_in (its cost then waits for a copy that shows it), or shown by
 * the copy being taken (answered_in 0). */
static void pending_leave(size_t k, int64_t answered_in)
{
    const json_t *r = json_array_get(pending, k);
    const char *id = json_string_value(json_object_get(r, "id"));
    const char *user = json_string_value(json_object_get(r, "user_id"));
    int64_t cost = record_cost(r);
    int64_t first = id ? json_integer_value(json_object_get(first_sent, id)) : 0;
    struct unsettled *u = user && cost ? *unsettled_link(user) : NULL;
    if (u) {
        u->pending -= cost;
        if (answered_in && n_answered == answered_cap) {
            size_t cap = answered_cap ? 2 * answered_cap : 256;
            struct answered_cost *grown = realloc(answered, cap * sizeof *grown);
            if (grown)
                answered = grown, answered_cap = cap;
        }
        /* Out of memory, it is forgotten at once: counted once too few
         * until the next copy, rather than for ever. */
        if (answered_in && n_answered < answered_cap) {
            struct answered_cost *a = &answered[n_answered++];
            snprintf(a->user_id, sizeof a->user_id, "%s", user);
            a->cost = cost;
            a->first_sent = first;
            a->answered_in = answered_in;
            u->answered += cost;
        }
    }
    if (id)
        json_object_del(first_sent, id);
    json_array_remove(pending, k);
}

/* The highest report of this run that fresh lists committed; 0 if none. */
static int64_t committed_in(const json_t *fresh)
{
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(fresh, "reported"), i, r)
    {
        const char *gateway = json_string_value(json_object_get(r, "gateway_id"));
        const char *run = json_string_value(json_object_get(r, "run"));
        if (gateway && run && strcmp(gateway, gw_opts.gateway_id) == 0 && strcmp(run, report_run) == 0)
            return json_integer_value(json_object_get(r, "seq"));
    }
    return 0;
}

/* Under lock: a copy came, whose request went out when report asked was
 * the last answered. What its funds show leaves the counts: the records of
 * the reports it lists committed (first sent in report `committed` or
 * before), which also leave pending, their ids added to shown for the
 * journal; and the records answered before its request went out. */
static void copy_taken(const json_t *fresh, int64_t asked, json_t *shown)
{
    int64_t committed = committed_in(fresh);
    if (committed > 0) {
        /* Only the first GW_REPORT_BATCH were ever sent (see first_sent). */
        for (size_t k = json_array_size(pending) < GW_REPORT_BATCH ? json_array_size(pending) : GW_REPORT_BATCH;
             k-- > 0;) {
            json_t *id = json_object_get(json_array_get(pending, k), "id");
            json_int_t first =
                json_is_string(id) ? json_integer_value(json_object_get(first_sent, json_string_value(id))) : 0;
            if (first > 0 && first <= committed) {
                json_array_append(shown, id);
                pending_leave(k, 0);
            }
        }
    }
    size_t kept = 0;
    for (size_t i = 0; i < n_answered; i++) {
        struct answered_cost *a = &answered[i];
        if (a->answered_in <= asked || (a->first_sent > 0 && a->first_sent <= committed)) {
            struct unsettled *u = *unsettled_link(a->user_id);
            if (u)
                u->answered -= a->cost;
        } else {
            answered[kept++] = *a;
        }
    }
    n_answered = kept;
    for (int b = 0; b < UNSETTLED_BUCKETS; b++)
        for (struct unsettled **link = &unsettled[b]; *link;) {
            struct unsettled *u = *link;
            if (u->pending <= 0 && u->answered <= 0) {
                *link = u->next;
                free(u);
            } else {
                link = &u->next;
            }
        }
}

/* Under lock: what user's calls cost that the copy does not show yet. */
static int64_t unsettled_cost(const char *user)
{
    struct unsettled *u = *unsettled_link(user);
    return u ? u->pending + u->answered : 0;
}

/* Under lock: what of user's funds is free for another hold: the copy's,
 * less what their finished calls cost that it cannot show yet and what
 * their calls in flight (u, NULL: none) hold. */
static int64_t funds_free(const char *user, const struct consumer_count *u)
{
    json_int_t have = copy ? json_integer_value(json_object_get(json_object_get(copy, "funds"), user)) : 0;
    return have - unsettled_cost(user) - (u ? u->held : 0);
}

int64_t gw_hold(struct gw_call_app *a, int64_t need)
{
    pthread_mutex_lock(&lock);
    struct consumer_count *u = call_consumer(a);
    int64_t more = need - a->held;
    int64_t free_now = u && more > 0 ? funds_free(a->user_id, u) : 0;
    if (u && more > 0 && free_now >= more) {
        int64_t step = gw_call_cost(a, 0, GW_HOLD_STEP_TOKENS, GW_HOLD_STEP_MS) - a->price_request;
        /* The step only when the funds have room for it: else just what
         * is needed, so the consumer's other calls keep their share. */
        if (free_now - more >= step)
            more += step;
        a->held += more;
        u->held += more;
    }
    int64_t held = a->held;
    pthread_mutex_unlock(&lock);
    return held;
}

/* Fixed one-minute windows per (key, app) and per app, for the current
 * minute only (window_take). */
static struct window {
    char key[2 * ID_MAX + 2]; /* "" for an empty slot */
    int64_t count;            /* calls in windows_minute */
} *windows;
static int n_windows, windows_used; /* slots (a power of two), and those in use */
static int64_t windows_minute = -1; /* the minute every window counts */

/* When the copy was taken, on this machine's monotonic clock: with the
 * copy's `at` it gives gpurentd's time, which keys' expiries and calls'
 * minutes are counted in (control_now). */
static int64_t copy_mono_ms;
static int64_t syncs; /* good syncs since the start */

static pthread_t sync_thread, report_thread;
static int stopping;
static pthread_cond_t stop_cond = PTHREAD_COND_INITIALIZER;

static json_t *find_by(json_t *arr, const char *field, const char *value)
{
    size_t i;
    json_t *x;
    json_array_foreach(arr, i, x)
    {
        const char *v = json_string_value(json_object_get(x, field));
        if (v && strcmp(v, value) == 0)
            return x;
    }
    return NULL;
}

static struct replica_count *replica_slot(const char *id, int create)
{
    for (int i = 0; i < n_replicas; i++)
        if (strcmp(replicas[i].instance_id, id) == 0)
            return &replicas[i];
    if (!create || n_replicas >= GW_MAX_REPLICAS)
        return NULL;
    struct replica_count *r = &replicas[n_replicas++];
    memset(r, 0, sizeof *r);
    snprintf(r->instance_id, sizeof r->instance_id, "%s", id);
    return r;
}

static struct app_count *app_slot(const char *id)
{
    for (int i = 0; i < n_apps_count; i++)
        if (strcmp(apps_count[i].app_id, id) == 0)
            return &apps_count[i];
    if (n_apps_count >= GW_MAX_REPLICAS)
        return NULL;
    struct app_count *a = &apps_count[n_apps_count++];
    memset(a, 0, sizeof *a);
    snprintf(a->app_id, sizeof a->app_id, "%s", id);
    return a;
}

/* gpurentd's time now, from the copy's `at` and the time since it came;
 * this machine's clock before any copy. Called with the lock held. */
static int64_t control_now(void)
{
    json_int_t at = copy ? json_integer_value(json_object_get(copy, "at")) : 0;
    return at > 0 ? at + (clock_mono_ms() - copy_mono_ms) / 1000 : clock_wall();
}

/* Calls that other gateways served in the minute for app_id (for key_id
 * alone, unless NULL), as the copy's recent_calls lists them: so a limit
 * holds across every gateway, give or take the calls served elsewhere
 * since their last report reached gpurentd and this gateway's last sync. */
static int64_t calls_elsewhere(const char *app_id, const char *key_id, int64_t minute)
{
    int64_t sum = 0;
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(copy, "recent_calls"), i, r)
    {
        const char *gateway = json_string_value(json_object_get(r, "gateway_id"));
        const char *app = json_string_value(json_object_get(r, "app_id"));
        const char *key = json_string_value(json_object_get(r, "key_id"));
        if (json_integer_value(json_object_get(r, "minute")) != minute || !gateway || !app ||
            strcmp(gateway, gw_opts.gateway_id) == 0 || strcmp(app, app_id) != 0 ||
            (key_id && (!key || strcmp(key, key_id) != 0)))
            continue;
        sum += json_integer_value(json_object_get(r, "calls"));
    }
    return sum;
}

/* FNV-1a of a window's key: its slot in the table. */
static uint64_t window_hash(const char *key)
{
    uint64_t h = 1469598103934665603u;
    for (const char *c = key; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211u;
    return h;
}

/* The slot of key in a table of n (a power of two): its own, or the empty
 * one where it goes (linear probing; the table is never over half full). */
static struct window *window_slot(struct window *table, int n, const char *key)
{
    for (uint64_t i = window_hash(key) & (uint64_t)(n - 1);; i = (i + 1) & (uint64_t)(n - 1))
        if (!table[i].key[0] || strcmp(table[i].key, key) == 0)
            return &table[i];
}

/* Doubles the table, moving every window over (under the lock): -1 at
 * GW_WINDOWS_MAX or out of memory. */
static int windows_grow(void)
{
    int n = n_windows ? 2 * n_windows : GW_WINDOWS_FIRST;
    struct window *grown = n <= GW_WINDOWS_MAX ? calloc((size_t)n, sizeof *grown) : NULL;
    if (!grown)
        return -1;
    for (int i = 0; i < n_windows; i++)
        if (windows[i].key[0])
            *window_slot(grown, n, windows[i].key) = windows[i];
    free(windows);
    windows = grown;
    n_windows = n;
    return 0;
}

/* Counts one call in key's window; 0, or the seconds until the window
 * ends when limit calls were made in it already, here and (elsewhere)
 * through other gateways, or when no window could be kept for it (a call
 * is never let through uncounted). The table holds the current minute's
 * windows only, in a hash table: it is emptied when the minute turns, so
 * its size is the keys and apps called in one minute, and a call costs
 * the same however many there were. */
static int64_t window_take(const char *key, int64_t limit, int64_t elsewhere, int64_t now)
{
    if (limit <= 0)
        return 0;
    int64_t minute = now / 60;
    if (elsewhere >= limit)
        return (minute + 1) * 60 - now;
    if (minute != windows_minute) {
        /* A table a burst grew is given back once the calls fit a smaller. */
        if (n_windows > GW_WINDOWS_FIRST && 8 * windows_used < n_windows) {
            free(windows);
            windows = NULL;
            n_windows = 0;
        } else if (windows) {
            memset(windows, 0, (size_t)n_windows * sizeof *windows);
        }
        windows_minute = minute;
        windows_used = 0;
    }
    if ((!windows || 2 * (windows_used + 1) > n_windows) && windows_grow() < 0) {
        log_error("gateway: no room for another rate-limit window; refusing %s until the minute ends", key);
        return (minute + 1) * 60 - now;
    }
    struct window *w = window_slot(windows, n_windows, key);
    if (!w->key[0]) {
        snprintf(w->key, sizeof w->key, "%s", key);
        windows_used++;
    }
    if (w->count + elsewhere >= limit)
        return (minute + 1) * 60 - now;
    w->count++;
    return 0;
}

static int key_matches(json_t *key, const unsigned char *presented)
{
    const char *hex = json_string_value(json_object_get(key, "hash"));
    unsigned char want[API_SECRET_HASH_LEN];
    if (!hex || strlen(hex) != 2 * API_SECRET_HASH_LEN)
        return 0;
    for (int i = 0; i < API_SECRET_HASH_LEN; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return 0;
        want[i] = (unsigned char)v;
    }
    return api_key_hash_equal(want, presented);
}

static int may_call(json_t *app, const char *user_id)
{
    const char *vis = json_string_value(json_object_get(app, "visibility"));
    const char *pub = json_string_value(json_object_get(app, "publisher_id"));
    if ((vis && strcmp(vis, "public") == 0) || (pub && strcmp(pub, user_id) == 0))
        return 1;
    size_t i;
    json_t *u;
    json_array_foreach(json_object_get(app, "allowed"), i, u) if (json_string_value(u) &&
                                                                  strcmp(json_string_value(u), user_id) == 0) return 1;
    return 0;
}

int gw_admit(const char *token, const char *slug, int64_t body_len, struct gw_call_app *out, int64_t *retry_after,
             char *msg, size_t msglen)
{
    char key_id[ID_MAX];
    unsigned char presented[API_SECRET_HASH_LEN];
    memset(out, 0, sizeof *out);
    *retry_after = 0;
    if (!token || !token[0])
        return snprintf(msg, msglen, "an API key is required: Authorization: Bearer <key>"), 401;
    if (api_key_parse(token, key_id, presented) < 0)
        return snprintf(msg, msglen, "the bearer token is not a gpurent API key (gpk_...)"), 401;
    int status = 0;
    pthread_mutex_lock(&lock);
    int64_t now = control_now();
    json_t *key = copy ? find_by(json_object_get(copy, "keys"), "id", key_id) : NULL;
    json_t *app = copy ? find_by(json_object_get(copy, "apps"), "slug", slug) : NULL;
    const char *user = key ? json_string_value(json_object_get(key, "user_id")) : NULL;
    json_int_t expires = key ? json_integer_value(json_object_get(key, "expires_at")) : 0;
    if (!copy) {
        status = 503, snprintf(msg, msglen, "the gateway has no copy of the marketplace yet");
        *retry_after = 1;
    } else if (!key || !user || !key_matches(key, presented) || (expires && now >= expires)) {
        status = 401, snprintf(msg, msglen, "the API key is unknown, revoked or expired");
    } else if (!app || !may_call(app, user)) {
        status = 404, snprintf(msg, msglen, "no app %.40s", slug);
    } else {
        const char *app_id = json_string_value(json_object_get(app, "id"));
        char wkey[2 * ID_MAX + 2];
        snprintf(wkey, sizeof wkey, "%s/%s", key_id, app_id);
        int64_t minute = now / 60;
        int64_t wait = window_take(wkey, json_integer_value(json_object_get(app, "rate_per_key")),
                                   calls_elsewhere(app_id, key_id, minute), now);
        if (!wait)
            wait = window_take(app_id, json_integer_value(json_object_get(app, "rate_per_app")),
                               calls_elsewhere(app_id, NULL, minute), now);
        out->price_request = json_integer_value(json_object_get(app, "price_request"));
        out->price_input_1k = json_integer_value(json_object_get(app, "price_input_1k"));
        out->price_output_1k = json_integer_value(json_object_get(app, "price_output_1k"));
        out->price_second = json_integer_value(json_object_get(app, "price_second"));
        /* The call's first hold: its price, the input its body announces
         * (a token a byte, the most a record may claim; when the funds do
         * not hold that, the estimate: gateway.h) and a first grain of
         * answer (its output is held as it comes: proxy.c, held_output). */
        int64_t input = body_len > 0 ? body_len : 0;
        struct consumer_count *u = consumer_slot(user, 1);
        int64_t have = funds_free(user, u);
        int64_t need = gw_call_cost(out, input, GW_HOLD_GRAIN_TOKENS, GW_HOLD_GRAIN_MS);
        if (have < need) {
            input = gw_input_estimate(input);
            need = gw_call_cost(out, input, GW_HOLD_GRAIN_TOKENS, GW_HOLD_GRAIN_MS);
        }
        if (wait) {
            status = 429, *retry_after = wait;
            snprintf(msg, msglen, "rate limit of %.40s reached; retry in %lld s", slug, (long long)wait);
        } else if (!u) {
            status = 503, *retry_after = 1;
            snprintf(msg, msglen, "the gateway is at its limit of calls; retry");
        } else if (have <= 0 || have < need) {
            status = 402, snprintf(msg, msglen, "your funds do not cover %s call of %.40s; top up first",
                                   u->in_flight ? "another concurrent" : "a", slug);
        } else {
            u->in_flight++;
            u->held += need;
            out->held = need;
            out->input_held = input;
            out->consumer = (int)(u - consumers);
            snprintf(out->app_id, sizeof out->app_id, "%s", app_id);
            snprintf(out->user_id, sizeof out->user_id, "%s", user);
            snprintf(out->key_id, sizeof out->key_id, "%s", key_id);
        }
    }
    pthread_mutex_unlock(&lock);
    return status;
}

static int avoided(const char *id, const char (*avoid)[ID_MAX], size_t n_avoid)
{
    for (size_t i = 0; i < n_avoid; i++)
        if (strcmp(avoid[i], id) == 0)
            return 1;
    return 0;
}

int gw_replica_take(const char *app_id, const char (*avoid)[ID_MAX], size_t n_avoid, char *url, size_t urllen,
                    char *instance_id)
{
    int rc = -1;
    int64_t now = clock_mono_ms();
    pthread_mutex_lock(&lock);
    json_t *app = copy ? find_by(json_object_get(copy, "apps"), "id", app_id) : NULL;
    struct replica_count *best = NULL;
    const char *best_url = NULL;
    int best_refused = 0;
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(app, "replicas"), i, r)
    {
        const char *id = json_string_value(json_object_get(r, "instance_id"));
        struct replica_count *c = id && !avoided(id, avoid, n_avoid) ? replica_slot(id, 1) : NULL;
        if (!c)
            continue;
        /* One that failed a call unanswered lately only if no other is left:
         * its agent's health check takes it out of the copy soon. */
        int refused = c->refused_until_ms > now;
        if (!best || refused < best_refused || (refused == best_refused && c->outstanding < best->outstanding)) {
            best = c;
            best_url = json_string_value(json_object_get(r, "url"));
            best_refused = refused;
        }
    }
    if (best && best_url) {
        best->outstanding++;
        snprintf(best->app_id, sizeof best->app_id, "%s", app_id);
        snprintf(url, urllen, "%s", best_url);
        memcpy(instance_id, best->instance_id, ID_MAX);
        rc = 0;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

void gw_replica_refused(const char *instance_id)
{
    pthread_mutex_lock(&lock);
    struct replica_count *c = replica_slot(instance_id, 0);
    if (c)
        c->refused_until_ms = clock_mono_ms() + GW_REFUSED_MS;
    pthread_mutex_unlock(&lock);
}

void gw_replica_release(const char *instance_id)
{
    pthread_mutex_lock(&lock);
    struct replica_count *c = replica_slot(instance_id, 0);
    if (c && c->outstanding > 0)
        c->outstanding--;
    pthread_mutex_unlock(&lock);
}

void gw_app_count(const char *app_id, int in_flight_delta, int queued_delta)
{
    pthread_mutex_lock(&lock);
    struct app_count *a = app_slot(app_id);
    if (a) {
        a->in_flight += in_flight_delta;
        a->queued += queued_delta;
    }
    pthread_mutex_unlock(&lock);
}

void gw_usage_add(json_t *record, struct gw_call_app *release)
{
    /* On disk first, then queued: a record is never reported (and so never
     * answered and compacted away) before its own journal line exists. */
    int journaled = gw_journal_append(record) == 0;
    pthread_mutex_lock(&lock);
    if (release)
        consumer_leave(release);
    if ((json_int_t)json_array_size(pending) < gw_opts.max_pending) {
        pending_join(record);
        json_array_append_new(pending, record);
    } else {
        /* Beyond the memory bound a journaled record stays on disk alone:
         * the next start reads it back and sends it. */
        log_error("gateway: %zu usage records wait for gpurentd; %s %s", json_array_size(pending),
                  journaled ? "keeping on disk only, until the next start," : "dropping",
                  json_string_value(json_object_get(record, "id")));
        json_decref(record);
    }
    pthread_mutex_unlock(&lock);
}

/* --- talking to gpurentd --- */

struct buf {
    char *data;
    size_t len;
};

static size_t collect(char *p, size_t size, size_t n, void *vb)
{
    struct buf *b = vb;
    size_t add = size * n;
    if (b->len + add > (64u << 20))
        return 0;
    char *grown = realloc(b->data, b->len + add + 1);
    if (!grown)
        return 0;
    memcpy(grown + b->len, p, add);
    b->data = grown;
    b->len += add;
    b->data[b->len] = '\0';
    return add;
}

/* One signed call; the answer's JSON (new reference) or NULL. */
static json_t *signed_call(const char *method, const char *path, const char *body)
{
    struct sign_headers sh;
    size_t blen = body ? strlen(body) : 0;
    if (sign_request(gw_opts.secret, method, path, clock_wall(), body, blen, &sh) < 0)
        return NULL;
    CURL *c = curl_easy_init();
    if (!c)
        return NULL;
    char url[1024], h[3][128];
    snprintf(url, sizeof url, "%s%s", gw_opts.control_url, path);
    snprintf(h[0], sizeof h[0], SIGN_HDR_TIMESTAMP ": %s", sh.timestamp);
    snprintf(h[1], sizeof h[1], SIGN_HDR_NONCE ": %s", sh.nonce);
    snprintf(h[2], sizeof h[2], SIGN_HDR_SIGNATURE ": %s", sh.signature);
    struct curl_slist *hl = NULL;
    for (int i = 0; i < 3; i++)
        hl = curl_slist_append(hl, h[i]);
    hl = curl_slist_append(hl, "Content-Type: application/json");
    struct buf b = {0};
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 1000L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)blen);
    }
    long status = 0;
    CURLcode rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    json_t *j = rc == CURLE_OK && status == 200 && b.data ? json_loads(b.data, 0, NULL) : NULL;
    if (!j)
        log_warn("gateway: %s %s: %s (status %ld); serving from the last copy", method, path,
                 rc == CURLE_OK ? "refused" : curl_easy_strerror(rc), status);
    free(b.data);
    return j;
}

/* The funds in a fresh copy less what the other gateways' calls in flight
 * hold of them (the state's holds), so that a consumer's calls through two
 * gateways cannot each spend the same funds. */
static void other_holds(json_t *fresh)
{
    json_t *funds = json_object_get(fresh, "funds");
    size_t i;
    json_t *h;
    json_array_foreach(json_object_get(fresh, "holds"), i, h)
    {
        const char *gateway = json_string_value(json_object_get(h, "gateway_id"));
        const char *user = json_string_value(json_object_get(h, "user_id"));
        json_t *have = user ? json_object_get(funds, user) : NULL;
        if (gateway && strcmp(gateway, gw_opts.gateway_id) != 0 && json_is_integer(have))
            json_integer_set(have, json_integer_value(have) - json_integer_value(json_object_get(h, "held")));
    }
}

static void sync_once(void)
{
    pthread_mutex_lock(&lock);
    int64_t asked = answered_seq;
    pthread_mutex_unlock(&lock);
    json_t *fresh = signed_call("GET", "/internal/gateway/state", NULL);
    if (!fresh)
        return;
    other_holds(fresh);
    json_t *shown = json_array();
    pthread_mutex_lock(&lock);
    copy_taken(fresh, asked, shown);
    json_decref(copy);
    copy = fresh;
    copy_mono_ms = clock_mono_ms();
    syncs++;
    pthread_mutex_unlock(&lock);
    /* Settled, as the copy shows: out of the journal as an answer takes
     * them (a resend would only be answered as duplicates). */
    gw_journal_answered(shown);
    json_decref(shown);
}

void gw_copy_info(int64_t *good_syncs, int64_t *age_ms)
{
    pthread_mutex_lock(&lock);
    *good_syncs = syncs;
    *age_ms = copy ? clock_mono_ms() - copy_mono_ms : -1;
    pthread_mutex_unlock(&lock);
}

void gw_usage_pending(int64_t *records)
{
    pthread_mutex_lock(&lock);
    *records = (int64_t)json_array_size(pending);
    pthread_mutex_unlock(&lock);
}

/* Drops from pending every record gpurentd answered for in report seq. */
static void forget_answered(json_t *answer, int64_t seq)
{
    json_t *done = json_object(), *ids = json_array();
    const char *lists[] = {"accepted", "duplicates"};
    for (int l = 0; l < 2; l++) {
        size_t i;
        json_t *id;
        json_array_foreach(json_object_get(answer, lists[l]), i, id) if (json_is_string(id))
        {
            json_object_set(done, json_string_value(id), json_true());
        }
    }
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(answer, "rejected"), i, r)
    {
        const char *id = json_string_value(json_object_get(r, "id"));
        if (id) {
            log_error("gateway: usage record %s rejected: %s", id, json_string_value(json_object_get(r, "why")));
            json_object_set(done, id, json_true());
        }
    }
    pthread_mutex_lock(&lock);
    answered_seq = seq;
    for (size_t k = json_array_size(pending); k-- > 0;) {
        json_t *id = json_object_get(json_array_get(pending, k), "id");
        if (json_object_get(done, json_string_value(id))) {
            json_array_append(ids, id);
            pending_leave(k, seq);
        }
    }
    pthread_mutex_unlock(&lock);
    /* Out of the journal only now that gpurentd has them settled (those a
     * copy showed settled meanwhile are out already). */
    gw_journal_answered(ids);
    json_decref(ids);
    json_decref(done);
}

static void report_once(void)
{
    json_t *demand = json_array(), *usage = json_array();
    pthread_mutex_lock(&lock);
    /* With each app, its replicas that have calls in flight: the scaler
     * removes an idle one rather than cut them. */
    for (int i = 0; i < n_apps_count; i++) {
        json_t *busy = json_array();
        for (int k = 0; k < n_replicas && json_array_size(busy) < 64; k++)
            if (replicas[k].outstanding > 0 && strcmp(replicas[k].app_id, apps_count[i].app_id) == 0)
                json_array_append_new(busy, json_string(replicas[k].instance_id));
        json_array_append_new(demand, json_pack("{s:s, s:i, s:i, s:o}", "app_id", apps_count[i].app_id, "in_flight",
                                                apps_count[i].in_flight, "queued", apps_count[i].queued, "busy", busy));
    }
    int64_t seq = ++report_seq;
    for (size_t i = 0; i < json_array_size(pending) && i < GW_REPORT_BATCH; i++) {
        json_t *r = json_array_get(pending, i);
        const char *id = json_string_value(json_object_get(r, "id"));
        if (id && !json_object_get(first_sent, id))
            json_object_set_new(first_sent, id, json_integer(seq));
        json_array_append(usage, r);
    }
    /* What this gateway's calls in flight hold: the other gateways take it
     * off the funds in their copies (other_holds). */
    json_t *holds = json_array();
    for (int i = 0; i < GW_MAX_CONSUMERS; i++)
        if (consumers[i].in_flight > 0 && consumers[i].held > 0)
            json_array_append_new(holds, json_pack("{s:s, s:I}", "user_id", consumers[i].user_id, "held",
                                                   (json_int_t)consumers[i].held));
    pthread_mutex_unlock(&lock);
    json_t *body = json_pack("{s:s, s:s, s:I, s:o, s:o, s:o}", "gateway_id", gw_opts.gateway_id, "run", report_run,
                             "seq", (json_int_t)seq, "demand", demand, "usage", usage, "holds", holds);
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    json_t *answer = text ? signed_call("POST", "/internal/gateway/reports", text) : NULL;
    free(text);
    if (answer)
        forget_answered(answer, seq);
    json_decref(answer);
}

/* Sleeps ms unless stopping; 1 when stopping. */
static int nap(int64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&lock);
    if (!stopping)
        pthread_cond_timedwait(&stop_cond, &lock, &ts);
    int s = stopping;
    pthread_mutex_unlock(&lock);
    return s;
}

static void *sync_main(void *arg)
{
    (void)arg;
    do
        sync_once();
    while (!nap(gw_opts.sync_ms));
    return NULL;
}

static void *report_main(void *arg)
{
    (void)arg;
    while (!nap(gw_opts.report_ms))
        report_once();
    report_once(); /* what is left, once more, before stopping */
    return NULL;
}

int gw_state_start(void)
{
    pending = json_array();
    first_sent = json_object();
    unsigned char run[16];
    if (random_bytes(run, sizeof run) < 0) {
        fprintf(stderr, "gpurent-gateway: no randomness for the run's name\n");
        return -1;
    }
    hex_encode(run, sizeof run, report_run);
    /* What a killed run served and had not reported goes out first. */
    if (gw_journal_open(gw_opts.state_dir, pending) < 0)
        return -1;
    size_t i;
    json_t *r;
    json_array_foreach(pending, i, r) pending_join(r);
    if (pthread_create(&sync_thread, NULL, sync_main, NULL) != 0)
        return -1;
    if (pthread_create(&report_thread, NULL, report_main, NULL) != 0)
        return -1;
    return 0;
}

void gw_state_stop(void)
{
    pthread_mutex_lock(&lock);
    stopping = 1;
    pthread_cond_broadcast(&stop_cond);
    pthread_mutex_unlock(&lock);
    pthread_join(sync_thread, NULL);
    pthread_join(report_thread, NULL);
    json_decref(copy);
    json_decref(pending);
    json_decref(first_sent);
    copy = pending = first_sent = NULL;
    free(answered);
    answered = NULL;
    n_answered = answered_cap = 0;
    for (int b = 0; b < UNSETTLED_BUCKETS; b++)
        while (unsettled[b]) {
            struct unsettled *u = unsettled[b];
            unsettled[b] = u->next;
            free(u);
        }
    free(windows);
    windows = NULL;
    n_windows = 0;
}
