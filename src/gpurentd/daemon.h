/* daemon.h: gpurentd's own modules, grouped by the file that implements
 * them, so this header is also a map of the daemon. */
#ifndef GPURENT_DAEMON_H
#define GPURENT_DAEMON_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "conf.h"
#include "http.h"
#include "log.h"

struct store;

/* config.c */
struct daemon_conf {
    char listen[128];             /* host:port of the API */
    char database[1024];          /* SQLite file */
    char log_level[16];           /* error, warn, info, debug */
    int64_t threads;              /* HTTP worker threads */
    int64_t max_connections;      /* all clients together */
    int64_t max_connections_per_client; /* per client address */
    int64_t connection_timeout_s; /* idle connections closed after this */
    int64_t max_body_bytes;       /* larger request bodies get 413 */
    int64_t max_json_depth;       /* deeper JSON gets 400 */
    char cors_origins[1024];      /* console origins allowed by CORS */
    char trusted_proxies[512];    /* reverse proxies whose X-Forwarded-For names the client */
    char tls_cert[1024];          /* PEM certificate; "" serves plain HTTP */
    char tls_key[1024];           /* PEM private key */
    int64_t password_iterations;  /* PBKDF2 rounds for new password hashes */
    /* The login limits change on SIGHUP while the HTTP pool reads them:
     * _Atomic makes every read of daemon_config->login_* an atomic load and
     * the reload's writes atomic stores, so no reader needs a lock. The
     * two change one after the other; a login between them sees either
     * value of each, both valid. */
    _Atomic int64_t login_max_failures; /* failed logins per account before a lockout (4x per client) */
    _Atomic int64_t login_lockout_s;    /* how long a lockout lasts */
    char bootstrap_admin_email[256]; /* first admin, created on an empty database */
    int64_t drain_timeout_s;      /* SIGTERM waits this long for requests */
    char clock_file[1024];        /* testing clock; "" uses the system clock */
    int64_t heartbeat_interval_ms;/* how often every agent is polled */
    int64_t heartbeat_miss_limit; /* failed polls in a row before a node is unreachable */
    int64_t node_lost_after_s;    /* silence after which an unreachable node is offline, its instances lost */
    int64_t agent_connect_timeout_ms; /* connecting to an agent */
    int64_t agent_timeout_ms;     /* a whole call to an agent */
    int64_t agent_max_response_bytes; /* larger agent replies fail the call */
    int64_t agent_max_parallel;   /* agent connections open at once */
    char agent_ca_file[1024];     /* CA bundle to verify https agents; "" for the system's */
    int64_t default_max_cards;    /* card quota of users without an admin-set one */
    int64_t volume_default_size_gb; /* quota of a volume created without a size */
    char volume_source_template[512]; /* what agents mount: {volume_id} and {user_id} are replaced */
    int64_t reconcile_interval_ms;/* reconciler period when nothing wakes it */
    int64_t reconcile_sweep_ms;   /* how often every agent's workload list is checked for orphans */
    int64_t provision_timeout_s;  /* a provisioning attempt that takes longer fails */
    int64_t provision_max_attempts; /* failed attempts before an instance fails */
    int64_t master_port;          /* MASTER_PORT given to multi-node jobs */
    char currency[8];             /* platform currency code shown with amounts */
    int64_t billing_interval_ms;  /* milliseconds between billing passes */
    int64_t billing_post_interval_s; /* a user's running usage is posted to the ledger at least this often */
    int64_t min_run_minutes;      /* funds needed to start: this many minutes of the instance */
    int64_t low_balance_minutes;  /* warn when funds last less than this at the current burn */
    char signup_credit[24];       /* trial credit of a new account, e.g. "10.00" */
    int64_t signup_credit_days;   /* days until the trial credit expires; 0 never */
    char max_price_per_card_hour[24]; /* highest price per card-hour an admin may set, e.g. "10000.00" */
    char max_topup[24];           /* largest single top-up (admin or webhook) */
    char max_grant[24];           /* largest single grant (admin, invite code, trial credit) */
    char max_balance[24];         /* most a user may hold: cash and credit not voided, together */
    /* The four limits above in micro-units, set by daemon_read_config. */
    int64_t max_price_micro;      /* max_price_per_card_hour */
    int64_t max_topup_micro;      /* max_topup */
    int64_t max_grant_micro;      /* max_grant */
    int64_t max_balance_micro;    /* max_balance */
    char payment_webhook_secret[129]; /* HMAC key of the payment provider's webhook; "" turns it off */
    char metrics_listen[128];     /* host:port serving /metrics without a key; "" keeps it admin-only on the API */
};
extern const struct conf_option daemon_options[];
/* The configuration in force; set once at start-up. SIGHUP changes only
 * login_max_failures and login_lockout_s in it (atomic fields); the other
 * reloadable options live in the HTTP server and the log module. */
extern struct daemon_conf *daemon_config;

/* routes.c */
extern const struct http_route daemon_routes[];
/* The routes of the separate metrics listener (metrics_listen). */
extern const struct http_route metrics_routes[];

/* auth.c */
int auth_authenticate(struct http_request *req, enum http_auth level);

/* throttle.c: failed-login limiting per account and per client address. */
/* Seconds the key must still wait (0 if it may try now). */
int64_t throttle_wait(const char *key, int64_t now);
/* Records a failure; after max failures within the lockout window the key
 * must wait lockout_s. */
void throttle_fail(const char *key, int64_t now, int64_t max, int64_t lockout_s);
/* Forgets a key's failures (after a successful login). */
void throttle_clear(const char *key);

/* paging.c: limit and cursor for list endpoints. Handlers fetch limit + 1
 * rows: the extra one says whether another page follows. */
struct page {
    int64_t limit;            /* rows to show */
    int64_t after_t;          /* cursor: sort key of the last row seen (-1: first page) */
    char after_id[ID_MAX];    /* cursor: that row's id ("" on the first page) */
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
/* The 400 invalid_field (naming field) for money a transaction refused with
 * LEDGER_OVER_BALANCE: amount would take user_id's balance over max_balance.
 * label words the money in the message (NULL: the field's name). */
void limit_refuse_balance(struct http_request *req, const char *field, const char *label, const char *user_id,
                          int64_t amount);

/* accounts.c: account creation shared by the API and the command line. */
struct store;
struct user;
/* Validates and lowercases an email into out; -1 with a reason. */
int account_email_normalize(const char *in, char *out, size_t outlen, const char **why);
/* Creates user u (filling id and created_at) with one API key named
 * key_name, in one transaction. token gets the key's token, shown once.
 * Returns a store_rc (STORE_CONFLICT if the email is taken). */
int account_create(struct store *s, struct user *u, const char *key_name, char *key_id, char *token);
/* account_create for a sign-up: also grants the trial credit or, when
 * u->invite_code is set, what that code grants instead, in one transaction; STORE_NOT_FOUND (nothing
 * created) if the invite code is unknown, expired or used up. */
int account_signup(struct store *s, struct user *u, char *key_id, char *token);
/* Creates an API key for user_id; same token rules. */
int account_key_create(struct store *s, const char *user_id, const char *name, char *key_id, char *token,
                       int64_t *created_at);

/* api_health.c */
void api_healthz(struct http_request *req);
void api_readyz(struct http_request *req);
void api_openapi(struct http_request *req);

/* api_accounts.c */
void api_signup(struct http_request *req);
void api_login(struct http_request *req);
void api_me(struct http_request *req);

/* api_keys.c */
void api_keys_create(struct http_request *req);
void api_keys_list(struct http_request *req);
void api_keys_get(struct http_request *req);
void api_keys_revoke(struct http_request *req);

/* loop.c: the thread plumbing every background loop shares. */
struct bg_loop {
    const char *name;          /* for log lines */
    pthread_t thread;          /* the loop's thread */
    int running;               /* started and not yet joined */
    pthread_mutex_t lock;      /* guards the two requests and any state the loop shares */
    pthread_cond_t cond;       /* signalled on wake and stop */
    int stop_requested;        /* loop_stop() was called */
    int wake_requested;        /* loop_wake() was called since the last sleep */
};
#define BG_LOOP_INIT(n) {.name = (n), .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER}
/* Starts main_fn(l) on a new thread. */
int loop_start(struct bg_loop *l, void *(*main_fn)(void *));
/* Cuts the loop's current or next sleep short. */
void loop_wake(struct bg_loop *l);
/* Asks the loop to stop and waits for its thread; safe if never started. */
void loop_stop(struct bg_loop *l);
/* Sleeps up to ms, or until woken or stopped; returns 1 when stopping.
 * The _locked form is called with l->lock held. */
int loop_sleep(struct bg_loop *l, int64_t ms);
int loop_sleep_locked(struct bg_loop *l, int64_t ms);
/* Whether loop_stop() was called (for checks inside a long pass). */
int loop_stopping(struct bg_loop *l);
/* The CLOCK_REALTIME instant us microseconds from now, for timed waits. */
void loop_deadline_us(int64_t us, struct timespec *ts);

/* heartbeat.c: polls every agent for its facts on its own thread. */
int heartbeat_start(void);
/* Asks for a pass now (a node was registered) instead of at the next period. */
void heartbeat_wake(void);
/* Stops the thread and waits for it; safe if never started. */
void heartbeat_stop(void);

/* instances.c: the instance operations the API performs in one
 * transaction each, and the JSON shape of an instance. */
struct instance;
struct instance_create {
    const char *user_id;      /* owner */
    const char *name;         /* label, may be "" */
    const char *gpu_type;     /* catalog code */
    int64_t card_count;       /* cards */
    const char *image;        /* image id or ref */
    const char *volume_id;    /* or NULL: the user's "shared" volume */
};
/* What an operation decided: ok, or an error for the client. */
struct op_outcome {
    enum api_error error;     /* meaningful when failed */
    int failed;               /* 1: refused, nothing changed */
    char field[32];           /* field at fault, or "" */
    char message[256];        /* for the client */
    json_t *extra;            /* extra members of the error object (owned) */
};
/* A transaction callback's result when an operation is refused: roll back,
 * do not retry; the op_outcome says why. */
#define REFUSED (-100)
/* Checks the owner's quota and claims cards for the instance (best fit),
 * in the caller's transaction. */
int instance_place(struct store *s, const struct instance *in, struct op_outcome *o);
/* Runs in a store transaction: creates the instance and claims its cards. */
int instance_create(struct store *s, const struct instance_create *req, char id_out[ID_MAX], struct op_outcome *o);
/* start, stop and terminate; each runs in a store transaction. */
int instance_start(struct store *s, const char *user_id, const char *id, struct op_outcome *o);
int instance_stop(struct store *s, const char *user_id, const char *id, struct op_outcome *o);
int instance_terminate(struct store *s, const char *user_id, const char *id, struct op_outcome *o);
/* The instance as the API shows it (new reference), or NULL. */
json_t *instance_json(struct store *s, const struct instance *in);

/* idempotency.c: Idempotency-Key handling for POSTs that create or move
 * capacity or money. */
struct idempotency {
    char key[256];            /* the header, "" when absent */
    char hash[65];            /* SHA-256 of method, path and body */
};
/* Reads the header. Returns 1 if the request was answered (a replay, a
 * reused key or a bad header), 0 to go on. */
int idempotency_begin(struct http_request *req, struct idempotency *idem);
/* Records the answer inside the operation's transaction. */
int idempotency_record(struct store *s, const struct http_request *req, const struct idempotency *idem, int status,
                       const char *body);

/* billing.c: the billing loop and spend control. */
struct billing_summary {
    int64_t users;            /* users billed (usage posted or settled) */
    int64_t checked;          /* users whose funds were checked */
    int64_t at;               /* the time billed up to */
    int64_t duration_ms;      /* how long the pass took */
    int64_t failed;           /* users skipped because their billing failed (logged) */
};
/* Users whose billing failed, for /metrics and /readyz. */
struct billing_failures {
    int64_t total;            /* user billings that failed, all time */
    int64_t users;            /* users whose last billing failed */
    int64_t users_repeated;   /* of them, failed in more than one pass in a row */
};
void billing_failures(struct billing_failures *out);
/* A full pass: posts all usage due up to now for every user with unbilled
 * running time (the thread at start-up and when asked; tests and
 * benchmarks may call it too). */
int billing_pass(struct store *s, struct billing_summary *out);
/* The thread's periodic pass: checks every such user's funds against what
 * is due and posts only where funds ran out, an interval ended, credit
 * expired, or the user's regular posting (every few minutes) falls due. */
int billing_check(struct store *s, struct billing_summary *out);
/* In a transaction: refuses (REFUSED, 402 insufficient_funds) unless the
 * user's funds cover a minimum run of `cards` more cards of gpu_model. */
int billing_check_funds(struct store *s, const char *user_id, const char *gpu_model, int64_t cards, int64_t at,
                        struct op_outcome *o);
int billing_start(void);
/* Wakes the billing thread and waits (up to timeout_ms) for a full pass
 * that started after the call; 0 if it ran and succeeded. */
int billing_run_now(struct billing_summary *out, int timeout_ms);
void billing_stop(void);

/* reconciler.c: drives agents towards what instances want, on its own thread. */
int reconciler_start(void);
/* Asks for a pass now (an instance changed) instead of at the next period. */
void reconciler_wake(void);
/* Asks the next pass to list node_id's workloads (its agent reported an
 * exit) and wakes the reconciler. Any thread. */
void reconciler_list_node(const char *node_id);
void reconciler_stop(void);

/* api_instances.c */
void api_instances_create(struct http_request *req);
void api_instances_list(struct http_request *req);
void api_instances_get(struct http_request *req);
void api_instances_start(struct http_request *req);
void api_instances_stop(struct http_request *req);
void api_instances_terminate(struct http_request *req);
void api_instances_events(struct http_request *req);

/* api_volumes.c */
void api_volumes_create(struct http_request *req);
void api_volumes_list(struct http_request *req);
void api_volumes_get(struct http_request *req);
void api_volumes_delete(struct http_request *req);
/* Finds or creates (inside a transaction) the user's default "shared" volume. */
int volume_default(struct store *s, const char *user_id, char id_out[ID_MAX]);

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

/* api_credits.c */
void api_invite_redeem(struct http_request *req);
/* The 400 for an invite code that could not be redeemed (field names it in
 * the request), saying whether it is unknown, expired or used up. */
void api_invite_refused(struct http_request *req, const char *field, const char *code);
void api_invite_codes_create(struct http_request *req);
void api_grants_create(struct http_request *req);

/* api_payments.c */
void api_topups_create(struct http_request *req);
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
 * invite_code, price, limits or billing_run; target the user id, GPU type
 * or code (NULL for none); amount in micro-yuan (-1 for none); detail the
 * request's effective values (borrowed; written with sorted keys). */
int audit_record(struct store *s, const struct http_request *req, const char *action, const char *target,
                 int64_t amount, json_t *detail, const char *reason);
void api_audit_list(struct http_request *req);

/* watchdog.c: systemd's watchdog, fed after real checks. */
enum loop_kind { LOOP_HEARTBEAT, LOOP_RECONCILER, LOOP_BILLING, LOOP_COUNT };
/* Each background loop calls this after every pass. */
void watchdog_loop_alive(enum loop_kind loop);
/* Starts feeding when systemd asked for a watchdog (WATCHDOG_USEC). */
int watchdog_start(const char *host, int port, int tls);
void watchdog_stop(void);

/* metrics.c: Prometheus metrics. */
void metrics_http_done(const struct http_request *req, int64_t duration_us);
void metrics_agent_error(void);
void metrics_billing_pass(int64_t duration_us);
void api_metrics(struct http_request *req);

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

/* serve.c */
int cmd_serve(int argc, char **argv);
/* 1 when host (an IP address as written in a listen option or a URL, or a
 * name) can only be reached from this machine: 127.0.0.0/8, ::1, the IPv4
 * loopback mapped into IPv6, "localhost". Decides the clear-text warnings. */
int host_is_loopback(const char *host);
/* cli.c */
int cmd_migrate(int argc, char **argv);
int cmd_admin(int argc, char **argv);
int cmd_ledger(int argc, char **argv);
/* Loads configuration: defaults, then file (if any), then overrides; what is
 * wrong goes to err (naming file and line, or the command line). */
int daemon_read_config(struct daemon_conf *conf, const char *file, char **overrides, int n_overrides, char *err,
                       size_t errlen);
/* The same, printing what is wrong on stderr (start-up, command line). */
int daemon_load_config(struct daemon_conf *conf, const char *file, char **overrides, int n_overrides);
/* The same for a database subcommand: -c FILE and --db PATH. */
int daemon_load_db_config(struct daemon_conf *conf, const char *file, const char *db);
/* cli_reports.c */
int cmd_report(int argc, char **argv);
int cmd_backup(int argc, char **argv);

#endif
