/* domain.h: the domain layer (src/gpurentd/domain): the rules of the
 * business that the handlers, the loops and the commands share, written
 * once. It sits on the store (store.h) and the common library, and knows
 * nothing of HTTP handlers, loops or commands: make check-layers refuses an
 * include of a layer above.
 *
 *   accounts.c   accounts and API keys, shared by the API and the CLI
 *   password_reset.c  a forgotten password: the mailed code, its checks,
 *                the new password and the sessions it ends
 *   instances.c  create, start, stop, terminate as transaction callbacks,
 *                and the JSON shape of an instance
 *   placement.c  best-fit card placement (placement.h; pure)
 *   volumes.c    new volumes and each user's default "shared" one
 *   gang.c       multi-node instances: rendezvous bound, shared /shared,
 *                the internal SSH key pair, nodes' data-plane addresses
 *   funds.c      the price book (what an interval owes, for billing, the
 *                balance and refunds) and the funds a start needs
 *   ledger.c     money movements on the double-entry ledger (ledger.h):
 *                grants, top-ups, charges, refunds, expiry, funds
 *   facts.c      whether a node's facts put it in service (facts.h; pure)
 *   ssh_keys.c   OpenSSH public key lines parsed and fingerprinted
 *                (ssh_keys.h; pure)
 *   runspec.c    what an instance runs (command, env, working_dir) and
 *                image references, checked (pure)
 *   instance_run.c  storing those at create, PATCH while stopped (the
 *                field table), the image policy
 *   notices.c    mail a renter gets without asking (funds running low,
 *                instances stopped when they ran out) */
#ifndef GPURENT_DOMAIN_H
#define GPURENT_DOMAIN_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "gpurent/api_error.h"
#include "gpurent/conf.h"
#include "gpurent/ids.h"
#include "gpurent/json_body.h"
#include "gpurent/log.h"
#include "domain/ledger.h"

struct store;
struct user;
struct instance_run;

/* cmd/config.c loads it (defaults, file, command line); every layer reads it. */
struct daemon_conf {
    char listen[128];                   /* host:port of the API */
    char database[1024];                /* SQLite file */
    char log_level[16];                 /* error, warn, info, debug */
    int64_t threads;                    /* HTTP worker threads */
    int64_t max_connections;            /* all clients together */
    int64_t max_connections_per_client; /* per client address */
    int64_t connection_timeout_s;       /* idle connections closed after this */
    int64_t default_max_volumes;        /* live volumes a user may hold unless an admin set another bound */
    int64_t default_max_volume_gb;      /* GB of a user's live volumes together, the same way */
    int64_t header_timeout_s;           /* a request's headers must arrive within this */
    int64_t body_min_rate;              /* bytes/s a body must average; 0 = no bound */
    int64_t max_body_bytes;             /* larger request bodies get 413 */
    int64_t max_json_depth;             /* deeper JSON gets 400 */
    char cors_origins[1024];            /* console origins allowed by CORS */
    char console_dir[1024];             /* the web console's files, served under /console/ */
    char trusted_proxies[512];          /* reverse proxies whose X-Forwarded-For names the client */
    char tls_cert[1024];                /* PEM certificate; "" serves plain HTTP */
    char tls_key[1024];                 /* PEM private key */
    int64_t password_iterations;        /* PBKDF2 rounds for new password hashes */
    int64_t login_key_ttl_s;            /* keys made by POST /v1/login expire after this; 0: never */
    /* The login limits change on SIGHUP while the HTTP pool reads them:
     * _Atomic makes every read of daemon_config->login_* an atomic load and
     * the reload's writes atomic stores, so no reader needs a lock. The
     * two change one after the other; a login between them sees either
     * value of each, both valid. */
    _Atomic int64_t login_max_failures; /* failed logins per account before a lockout (4x per client) */
    _Atomic int64_t login_lockout_s;    /* how long a lockout lasts */
    char bootstrap_admin_email[256];    /* first admin, created on an empty database */
    int64_t drain_timeout_s;            /* SIGTERM waits this long for requests */
    char clock_file[1024];              /* testing clock; "" uses the system clock */
    int64_t heartbeat_interval_ms;      /* how often every agent is polled */
    int64_t heartbeat_miss_limit;       /* failed polls in a row before a node is unreachable */
    int64_t node_lost_after_s;          /* silence after which an unreachable node is offline, its instances lost */
    int64_t agent_connect_timeout_ms;   /* connecting to an agent */
    int64_t agent_timeout_ms;           /* a whole call to an agent */
    int64_t agent_max_response_bytes;   /* larger agent replies fail the call */
    int64_t agent_put_wait_ms;          /* Gpurent-Wait-Ms sent with a workload PUT; 0: none */
    int64_t agent_max_parallel;         /* agent connections open at once */
    char agent_ca_file[1024];           /* CA bundle to verify https agents; "" for the system's */
    int64_t default_max_cards;          /* card quota of users without an admin-set one */
    int64_t volume_default_size_gb;     /* quota of a volume created without a size */
    char volume_source_template[512];   /* what agents mount: {volume_id} and {user_id} are replaced */
    int64_t reconcile_interval_ms;      /* reconciler period when nothing wakes it */
    int64_t reconcile_sweep_ms;         /* how often every agent's workload list is checked for orphans */
    int64_t provision_timeout_s;        /* a provisioning attempt that takes longer fails */
    int64_t provision_max_attempts;     /* failed attempts before an instance fails */
    int64_t master_port;                /* MASTER_PORT given to multi-node jobs */
    int64_t max_runtime_warning_minutes; /* max_runtime_warning this long before the end of a bounded run */
    int64_t rendezvous_timeout_s;       /* default bound from a multi-node instance's first rank running to its last */
    int volume_source_shared;           /* a volume source that is a local path ("/…") is shared by every node */
    char currency[8];                   /* platform currency code shown with amounts */
    int64_t billing_interval_ms;        /* milliseconds between billing passes */
    int64_t billing_post_interval_s;    /* a user's running usage is posted to the ledger at least this often */
    int64_t min_run_minutes;            /* funds needed to start: this many minutes of the instance */
    int64_t low_balance_minutes;        /* warn when funds last less than this at the current burn */
    char signup_credit[24];             /* trial credit of a new account, e.g. "10.00" */
    int64_t signup_credit_days;         /* days until the trial credit expires; 0 never */
    char max_price_per_card_hour[24];   /* highest price per card-hour an admin may set, e.g. "10000.00" */
    char max_topup[24];                 /* largest single top-up (admin or webhook) */
    char max_grant[24];                 /* largest single grant (admin, invite code, trial credit) */
    char max_balance[24];               /* most a user may hold: cash and credit not voided, together */
    /* The four limits above in micro-units, set by daemon_read_config. */
    int64_t max_price_micro;          /* max_price_per_card_hour */
    int64_t max_topup_micro;          /* max_topup */
    int64_t max_grant_micro;          /* max_grant */
    int64_t max_balance_micro;        /* max_balance */
    char payment_webhook_secret[129]; /* HMAC key of the payment provider's webhook; "" turns it off */
    char payment_webhook_secret_file[1024]; /* where to read it instead; "" none */
    char metrics_listen[128];         /* host:port serving /metrics without a key; "" keeps it admin-only on the API */
    int64_t max_ssh_keys_per_user;    /* SSH public keys one account may hold */
    int64_t max_api_keys_per_user;    /* live API keys one account may hold */
    int64_t max_apps_per_user;        /* live apps one account may publish */
    char image_policy[16];            /* "catalog": catalog images only; "registries": also any of image_registries */
    char image_registries[1024];      /* registries (host[:port], comma-separated) users' own images may come from */
    int64_t max_volume_size_gb;       /* largest volume a user may create, GB */
    char max_price_per_gb_month[24];  /* highest storage price per GB-month an admin may set, e.g. "1000.00" */
    int64_t max_storage_price_micro;  /* max_price_per_gb_month, set by daemon_read_config */
    /* Sign-ups (issue 13): verification mail and its SMTP server. */
    int64_t email_verify_ttl_s;       /* a verification code works this long */
    char smtp_url[512];               /* smtp:// or smtps:// server; "" logs the mail instead */
    char smtp_from[256];              /* envelope and From: address */
    char smtp_tls[16];                /* none, starttls or required (CURLOPT_USE_SSL) */
    char smtp_credentials_file[1024]; /* "user:password", mode 0600; "" for no AUTH */
    char public_url[256];             /* the API's address as users reach it, for mail text */
    int64_t email_strip_plus_tags;    /* 1: a+tag@x is a@x for uniqueness */
    char email_dotless_domains[512];  /* domains whose local part ignores dots, comma-separated */
    char email_domain_aliases[512];   /* "alias=domain, ...": domains that are one mailbox's */
    int64_t terminal_token_ttl_s;     /* seconds a web terminal token works */
    int64_t max_terminals;            /* web terminals open at once, everyone's */
    int64_t max_terminals_per_user;   /* the same, one user's */
    int64_t terminal_ping_s;          /* a browser silent this long is pinged; 3x this, closed */
    /* Sign-ups per hour per client address and per /24 (IPv6 /64); 0 no
     * limit. Changed on SIGHUP like the login limits (atomic). */
    _Atomic int64_t signup_rate_per_address;
    _Atomic int64_t signup_rate_per_subnet;
    /* Password resets: how long a code works, wrong tries before it is
     * dead, and requests per hour per e-mail address and per client
     * address (0 no limit; the two rates change on SIGHUP, atomic). */
    int64_t password_reset_ttl_s;
    int64_t password_reset_max_tries;
    _Atomic int64_t password_reset_rate_per_email;
    _Atomic int64_t password_reset_rate_per_address;
    /* Reservations (issue 16). */
    int64_t reservation_horizon_hours;       /* a reservation ends at most this many hours ahead */
    int64_t reservation_max_hours;           /* longest reservation */
    int64_t reservation_cancel_notice_hours; /* cancelling this long before the start refunds in full */
    int64_t reservation_late_refund_percent; /* refunded of a later cancellation before the start */
    int64_t reservation_warning_minutes;     /* reservation_warning this long before the end */
    /* The app marketplace (issue 17). */
    int64_t app_platform_fee_ppm;    /* platform's share of a call's charge, millionths */
    char max_app_price[24];          /* highest per-call, per-1k-token or per-second price */
    int64_t max_app_price_micro;     /* max_app_price, set by daemon_read_config */
    char gateway_secret_file[1024];  /* the gateways' signing key's file; "" none */
    char gateway_secret[129];        /* read from it */
    char gateway_public_url[256];    /* consumers' base URL of the gateways, for gateway_url; "" none */
    int64_t app_scale_interval_ms;   /* between scaler passes */
    int64_t app_scale_down_window_s; /* stabilisation before scaling down */
    int64_t app_demand_stale_s;      /* a demand report counts this long */
};
/* The configuration in force; set once at start-up. SIGHUP changes only
 * login_max_failures and login_lockout_s in it (atomic fields); the other
 * reloadable options live in the HTTP server and the log module. */
extern struct daemon_conf *daemon_config;
/* What `gpurentd --version` and /metrics' gpurent_build_info say. */
#define GPURENTD_VERSION "0.1.0"

/* accounts.c: account creation shared by the API and the command line. */
struct user;
/* Validates and lowercases an email into out; -1 with a reason. */
int account_email_normalize(const char *in, char *out, size_t outlen, const char **why);
/* The form of a valid lower-cased email that uniqueness is checked on:
 * +tags stripped (email_strip_plus_tags) and dots dropped from the local
 * part for email_dotless_domains. */
void account_email_key(const char *email, char *out, size_t outlen);
/* Sign-up outcomes beyond store_rc (account_verify, account_redeem). */
#define ACCOUNT_TOKEN_UNKNOWN (-120)  /* no such verification code */
#define ACCOUNT_TOKEN_USED (-121)     /* the code was used already */
#define ACCOUNT_TOKEN_EXPIRED (-122)  /* the code expired */
#define ACCOUNT_NOT_VERIFIED (-123)   /* the address is not verified yet */
#define ACCOUNT_TRIAL_HAD (-124)      /* the account already had its trial credit */
#define ACCOUNT_CODE_DAY_FULL (-125)  /* the invite code reached its cap for today */
#define ACCOUNT_ALREADY_VERIFIED (-126)
/* What verifying an address granted. */
struct account_verified {
    char user_id[ID_MAX];
    char grant_id[ID_MAX]; /* "" when nothing was granted */
    char source[48];       /* "signup" or "invite:CODE", "" for nothing */
    int64_t amount;        /* micro-yuan granted */
};
/* Verifies the address the code was sent to and, if the account has not
 * had its trial, grants it (the sign-up's invite code, or the trial
 * credit when there was none or it no longer redeems), in one
 * transaction. */
int account_verify(struct store *s, const char *token, struct account_verified *out);
/* Marks u's address verified and, if it has not had its trial, grants it
 * as account_verify does; in the caller's transaction. For a proof of the
 * mailbox other than the verification code (a password reset's). */
int account_mark_verified(struct store *s, const struct user *u, int64_t now, struct account_verified *out);
/* Queues a new verification mail for user_id (the old codes keep working
 * until they expire); ACCOUNT_ALREADY_VERIFIED when there is nothing to do. */
int account_resend_verification(struct store *s, const char *user_id);
/* Whether code may be redeemed once more today (its per-day cap, UTC days
 * of the daemon's clock): STORE_OK or ACCOUNT_CODE_DAY_FULL. In the
 * caller's transaction. */
int account_invite_day_check(struct store *s, const char *code, int64_t now);
/* The checks a later redemption of an invite code meets, in this order
 * (verified, ACCOUNT_CODE_REDEEMED when this account has this code, no
 * trial yet, per-day cap) and, after ledger_redeem_invite, the trial mark:
 * in the caller's transaction. */
#define ACCOUNT_CODE_REDEEMED (-127)
int account_redeem_check(struct store *s, const char *user_id, const char *code, int64_t now);
int account_redeem_done(struct store *s, const char *user_id, int64_t now);
/* password_reset.c: POST /v1/password-reset and its confirm. The account
 * is found by the e-mail address (email_key, then the lower-cased form, as
 * logging in finds it). */
/* Queues a reset code mail for the account at that address when there is
 * one and it is active, replacing its earlier code, and records the
 * request; nothing at all otherwise (*queued 0). from: the client. */
int account_reset_request(struct store *s, const char *email_key, const char *lower, const char *from, int *queued);
/* What a confirm did. */
struct reset_done {
    int refused;                    /* the code was wrong, expired, used or worn out, or no such account */
    int64_t login_keys_revoked;     /* keys made by logging in, all revoked */
    int64_t api_keys_kept;          /* the account's other live keys, kept */
    struct account_verified verified; /* the address verified by this reset: its trial, if granted */
    int verified_now;               /* 1 when the reset verified the address */
};
/* Checks code against the account's live code (constant time) and, when it
 * matches, sets password_hash, deletes the code, verifies the address,
 * revokes every key made by logging in and records it, in one transaction.
 * A wrong code is counted (password_reset_max_tries wrong ones delete it)
 * and gives out->refused with STORE_OK, so the count is kept. */
int account_reset_confirm(struct store *s, const char *email_key, const char *lower, const char *code,
                          const char *password_hash, const char *from, struct reset_done *out);
/* Adds an account_events row (event as the table's CHECK lists it;
 * detail borrowed, NULL for {}) in the caller's transaction. */
int account_event(struct store *s, const char *user_id, const char *event, const char *from, json_t *detail,
                  int64_t now);
/* Suspends (active 0: keys refused, instances stopped) or reinstates an
 * account, in the caller's transaction; *stopped gets how many instances
 * were told to stop. */
int account_set_active(struct store *s, const char *user_id, int active, int64_t *stopped);
/* Creates user u (filling id and created_at) with one API key named
 * key_name, in one transaction. token gets the key's token, shown once.
 * Returns a store_rc (STORE_CONFLICT if the email is taken). */
int account_create(struct store *s, struct user *u, const char *key_name, char *key_id, char *token);
/* account_create for a sign-up: also grants the trial credit or, when
 * u->invite_code is set, what that code grants instead, in one transaction; STORE_NOT_FOUND (nothing
 * created) if the invite code is unknown, expired or used up. */
int account_signup(struct store *s, struct user *u, char *key_id, char *token);
/* Since issue 13 a sign-up grants nothing at once: account_signup creates
 * the account unverified, with a verification code queued for mail in the
 * same transaction; the credit comes with account_verify. */
/* Creates an API key for user_id; same token rules. ACCOUNT_KEY_LIMIT when
 * the user holds max_api_keys_per_user live keys. */
#define ACCOUNT_KEY_LIMIT (-128)
int account_key_create(struct store *s, const char *user_id, const char *name, char *key_id, char *token,
                       int64_t *created_at);
/* The same for a key made by logging in: it expires ttl_s after its
 * creation (0: never). At the limit, the user's oldest keys made by logging
 * in are revoked to make room, as a browser's oldest session ends;
 * ACCOUNT_KEY_LIMIT only when there are none to revoke. */
int account_login_key(struct store *s, const char *user_id, const char *name, int64_t ttl_s, char *key_id,
                      char *token, int64_t *created_at);
/* What an API key's authority is now, for what it opened that outlives its
 * request (a terminal token, an open terminal, a followed log): a revoked,
 * expired or unknown key's ends, as does a suspended owner's. */
enum key_standing {
    KEY_IN_FORCE,
    KEY_GONE,           /* unknown, revoked or expired */
    KEY_OWNER_DISABLED, /* the owner is suspended */
    KEY_UNREADABLE      /* the store failed: nothing is known */
};
enum key_standing account_key_standing(struct store *s, const char *key_id, int64_t now);

/* notices.c: mail a renter gets without asking, queued in the outbox in
 * the transaction of the change it tells of. */
/* public_url, else the scheme and listen address, without a final '/'. */
void public_base_url(char *out, size_t n);
/* The instances one change stopped, listed for a notice. */
struct notice_stopped {
    char *lines;  /* "  id (name)\n" each, the first NOTICE_LISTED; malloc'd */
    size_t len;   /* of lines */
    size_t count; /* every one added */
};
void notice_stopped_init(struct notice_stopped *n);
int notice_stopped_add(struct notice_stopped *n, const char *id, const char *name); /* -1: out of memory */
void notice_stopped_free(struct notice_stopped *n);
/* Queues "funds ran out at ran_out_at" naming the instances in n for
 * user_id's address; nothing when n is empty. */
int notice_stopped_for_funds(struct store *s, const char *user_id, const struct notice_stopped *n, const char *ran_out_at,
                             int64_t now);
/* When user_id has cards running, their funds last less than
 * low_balance_minutes at what they burn now (GET /v1/balance's
 * low_balance) and no such notice went out since money last came in,
 * queues one and marks it sent. */
int notice_low_balance(struct store *s, const char *user_id, int64_t now);

/* instances.c: the instance operations the API performs in one
 * transaction each, and the JSON shape of an instance. */
struct instance;
struct instance_create {
    const char *user_id;   /* owner */
    const char *name;      /* label, may be "" */
    const char *gpu_type;  /* catalog code */
    int64_t card_count;    /* cards */
    const char *image;     /* image id or ref */
    const char *volume_id; /* or NULL: the user's "shared" volume */
    json_t *ssh_key_ids;   /* JSON array of the user's SSH key ids (strings, checked by the handler), or NULL: all */
    json_t *ports;         /* JSON array of distinct container ports to publish (checked by the handler), or NULL */
    json_t *command;       /* JSON array of strings (run_command_check passed), or NULL: the image's */
    json_t *env;           /* normalised by run_env_check, or NULL */
    const char *working_dir; /* run_working_dir_check passed, or NULL */
    const char *restart_policy;  /* never, on_failure or always (checked by the handler), or NULL: never */
    int64_t max_runtime_minutes; /* 1..43200 (checked by the handler), or 0: no bound */
    int64_t rendezvous_timeout_s; /* 30..3600 (checked by the handler), or 0: the option's default */
    const char *reservation_id;   /* run inside this reservation of the user's, or NULL: on-demand */
};
/* The most SSH keys an instance may name (contract 1 of issue 11 caps a
 * spec's authorized_keys at 64). */
#define INSTANCE_MAX_SSH_KEYS 64
/* The longest max_runtime_minutes: 30 days (issue 12's contract). */
#define INSTANCE_MAX_RUNTIME_MINUTES 43200
/* Whether p names a restart policy: never, on_failure or always (instances.c). */
int instance_restart_policy_valid(const char *p);
/* What an operation decided: ok, or an error for the client. */
struct op_outcome {
    enum api_error error; /* meaningful when failed */
    int failed;           /* 1: refused, nothing changed */
    char field[32];       /* field at fault, or "" */
    char message[256];    /* for the client */
    json_t *extra;        /* extra members of the error object (owned) */
};
/* A transaction callback's result when an operation is refused: roll back,
 * do not retry; the op_outcome says why. */
#define REFUSED (-100)
/* Fills o with a refusal (error, field or NULL, extra members of the error
 * object or NULL, taken; a sentence) and returns REFUSED. */
int op_refuse(struct op_outcome *o, enum api_error e, const char *field, json_t *extra, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Checks the owner's quota and claims cards for the instance (best fit),
 * in the caller's transaction. */
int instance_place(struct store *s, const struct instance *in, struct op_outcome *o);
/* The same, trying the node prefer_node first (for up to a node's worth of
 * cards, while it takes new work and has room): where the reconciler places
 * an instance again (a restart off a failed card). */
int instance_place_near(struct store *s, const struct instance *in, const char *prefer_node, struct op_outcome *o);
/* The owner's funds as a create's minimum-run check read them, so that its
 * reply need not read them again; known is 0 for a create inside a
 * reservation, which checks none. */
struct funds_seen {
    int known;
    struct funds f;
};
/* Runs in a store transaction: creates the instance and claims its cards.
 * seen may be NULL. */
int instance_create(struct store *s, const struct instance_create *req, char id_out[ID_MAX], struct funds_seen *seen,
                    struct op_outcome *o);
/* start, stop and terminate; each runs in a store transaction. */
int instance_start(struct store *s, const char *user_id, const char *id, struct op_outcome *o);
/* What a start resets of a job (instances.c): restarts, exit status and the
 * run's clock. */
int instance_job_reset(struct store *s, const char *id);
int instance_stop(struct store *s, const char *user_id, const char *id, struct op_outcome *o);
int instance_terminate(struct store *s, const char *user_id, const char *id, struct op_outcome *o);
/* The instance as the API shows it (new reference), or NULL. Each rank of
 * a running instance carries its connect details ("ssh"), null where its
 * node reports no SSH server. Its low_balance uses the owner's funds in
 * seen when known (a create's reply), or reads them. */
json_t *instance_json(struct store *s, const struct instance *in, const struct funds_seen *seen);
/* instance_json in two steps: what it shows beyond the instance's row, read
 * in the caller's snapshot (into *out, malloc'd; STORE_OK or the error),
 * then made JSON without the store. A create reads in its transaction, on
 * the writer's warm cache, and builds its reply after the commit, off the
 * writers' turn. */
struct instance_view;
int instance_view_read(struct store *s, const struct instance *in, const struct funds_seen *seen,
                       struct instance_view **out);
json_t *instance_view_json(const struct instance_view *v);
void instance_view_free(struct instance_view *v);
/* The host users connect to on a node: its public_host, or when that is ""
 * the host of its agent URL, into out (n bytes). */
void node_connect_host(const char *public_host, const char *agent_url, char *out, size_t n);
/* The OpenSSH client config of every rank of a running instance (one Host
 * block per rank with a node reporting SSH; malloc'd, caller frees), or
 * NULL on a store error. */
char *instance_ssh_config(struct store *s, const struct instance *in);

/* terminal_tokens.c: the web terminal's single-use tokens, kept hashed in
 * memory (a restart drops those not yet used). */
#define TERMINAL_TOKEN_MAX 69 /* "trm_" + 64 hex digits + NUL */
enum terminal_token_result { TOKEN_OK, TOKEN_UNKNOWN, TOKEN_EXPIRED, TOKEN_OTHER_INSTANCE };
/* A new token for user_id's terminal on rank of instance_id, asked for
 * with API key key_id, valid ttl_s seconds of clock_now(): 0 with token
 * and *expires_at; -1 when too many are outstanding (the user's or
 * everyone's), -2 when no randomness. */
int terminal_token_issue(const char *user_id, const char *key_id, const char *instance_id, int64_t rank,
                         int64_t ttl_s, char token[TERMINAL_TOKEN_MAX], int64_t *expires_at);
/* Takes token (it never works again) for instance_id: TOKEN_OK with the
 * user, the key that asked for it and the rank it was issued for, or why
 * not. */
enum terminal_token_result terminal_token_take(const char *token, const char *instance_id, char user_id[ID_MAX],
                                               char key_id[ID_MAX], int64_t *rank);

/* runspec.c: the bounds of what an instance runs (contract of issue 12). */
#define RUN_COMMAND_MAX_WORDS 64
#define RUN_WORD_MAX 4096
#define RUN_COMMAND_MAX_BYTES 32768
#define RUN_ENV_MAX 64
#define RUN_ENV_NAME_MAX 127
#define RUN_ENV_VALUE_MAX 4096
#define RUN_WORKING_DIR_MAX 255
/* Each returns 0, or -1 with o filled (ERR_INVALID_FIELD naming the field).
 * NULL (absent) passes. command: an array of at most 64 strings ([] is "the
 * image's own"). */
int run_command_check(const json_t *cmd, struct op_outcome *o);
/* env: [{"name", "value", "secret"}]; *norm gets the entries with secret
 * always a boolean (new reference), or NULL when env is NULL or refused. */
int run_env_check(const json_t *env, json_t **norm, struct op_outcome *o);
/* Whether an env name is well formed and not reserved (the agent's card
 * variables, the rendezvous ones, GPURENT_*); *why says which when not. */
int run_env_name_valid(const char *s, size_t len, const char **why);
/* working_dir: "" or an absolute path of at most 255 bytes, no "..". */
int run_working_dir_check(const char *dir, struct op_outcome *o);
/* The env as the API shows it: secret entries {"name", "secret": true} with
 * no value. New reference. */
json_t *run_env_public(const json_t *env);
/* Parses an image reference [host[:port]/]path[:tag][@sha256:<64 hex>]
 * (path components lowercase). 0 with its registry in registry (lowercase;
 * "docker.io" when it names none), or -1 with *why ending "the image ...". */
int image_ref_parse(const char *ref, char *registry, size_t reglen, const char **why);
/* Whether registry is one of the comma- or space-separated list. */
int image_registry_listed(const char *registry, const char *list);
/* Whether every entry of such a list is host[:port]; else the first bad one in bad. */
int image_registries_valid(const char *list, char *bad, size_t badlen);

/* instance_run.c: what an instance runs, stored at create and changed by
 * PATCH while it is stopped. */
struct gpu_type;
/* The image to run: a catalog image (by id or ref), or with image_policy =
 * registries any valid reference of an image_registries registry, which
 * takes the GPU type's stack. ref_out gets what the agents pull. */
int instance_image_resolve(struct store *s, const char *image, const struct gpu_type *t, char ref_out[256],
                           struct op_outcome *o);
/* Stores command, env and working_dir (create's, already checked). */
int instance_run_store(struct store *s, const char *instance_id, const json_t *command, const json_t *env,
                       const char *working_dir);
/* Adds "command", "env" (public view) and "working_dir" of r (NULL: none
 * read) to an instance's JSON. */
void instance_run_json(const struct instance_run *r, json_t *j);
/* One field PATCH /v1/instances/{id} may change. check runs before the
 * transaction (pure: 0 or -1 with o); apply runs inside it, with the
 * stopped instance loaded. Other fields are added as rows. */
struct instance;
struct instance_patch_field {
    const char *name;       /* body key */
    enum json_kind kind;    /* its JSON type */
    size_t max_len;         /* strings: the longest the body parser takes */
    int (*check)(const json_t *value, struct op_outcome *o);
    int (*apply)(struct store *s, const struct instance *in, const json_t *value, struct op_outcome *o);
    int any_state;          /* 1: a label, changed in any state but terminated; 0: only while nothing runs */
};
extern const struct instance_patch_field instance_patch_fields[]; /* ends with a NULL name */
/* Runs in a store transaction: the caller's instance id gets every field
 * of body that a row names (checked already); a field other than a label
 * only while the instance is stopped, succeeded, failed or lost. */
int instance_patch(struct store *s, const char *user_id, const char *id, const json_t *body, struct op_outcome *o);

/* gang.c: multi-node instances (issue 12). */
/* 1 when an instance of card_count cards spans more than one node. */
int instance_multi_node(int64_t card_count);
/* In the create or start transaction, after placement: records the
 * rendezvous bound (rendezvous_timeout_s > 0; 0 keeps the stored one) and
 * forgets the last attempt's rendezvous; for a multi-node instance refuses
 * (409 conflict, field volume_id) a volume whose source is a node-local
 * path unless volume_source_shared, refuses more than 63 SSH keys, and
 * makes the instance-internal key pair if it has none. */
int instance_gang_prepare(struct store *s, const struct instance *in, int64_t rendezvous_timeout_s,
                          struct op_outcome *o);
/* Where other ranks reach a node (MASTER_ADDR, the hostfile): the admin's
 * data_host, else the data_address its facts report, else its public host
 * (node_connect_host). */
void node_data_address(const char *data_host, const char *data_address, const char *public_host,
                       const char *agent_url, char *out, size_t n);

/* funds.c: the price book, the one computation of what an interval owes
 * (billing, the balance and refunds use it), and what a start needs. */
struct billable;
struct price_book_entry;
/* The price schedules of the GPU types met, each read once from the store.
 * Zero-initialise; free with price_book_free. */
struct price_book {
    struct price_book_entry *entries; /* by type, as met */
    size_t n, cap;                    /* entries, allocated */
};
void price_book_free(struct price_book *book);
/* A price_book_due result: the cost overflows 64-bit micro-units. */
#define PRICE_OVERFLOW (-50)
/* What interval b costs from its start to ledger_billable_end(b, t) under
 * its type's schedule: STORE_OK, a store error, or PRICE_OVERFLOW. */
int price_book_due(struct store *s, struct price_book *book, const struct billable *b, int64_t t, int64_t *out);
/* Storage schedules by region (the region's own prices after the global
 * ones, tariff_storage_schedule), each read once. Zero-initialise; free
 * with storage_book_free. */
struct storage_book_entry;
struct storage_book {
    struct storage_book_entry *entries; /* by region, as met */
    size_t n, cap;                      /* entries, allocated */
};
void storage_book_free(struct storage_book *book);
struct storage_billable;
/* What volume v's storage costs from its creation to t (or its deletion,
 * if sooner): STORE_OK, a store error, or PRICE_OVERFLOW. */
int storage_book_due(struct store *s, struct storage_book *book, const struct storage_billable *v, int64_t t,
                     int64_t *out);
/* The storage price per GB-month in force at t for region ("" global):
 * 0 when none is set. Negative store_rc on failure. */
int64_t storage_book_price_at(struct store *s, struct storage_book *book, const char *region, int64_t t);
/* In a transaction: refuses (REFUSED, 402 insufficient_funds) unless the
 * user's funds cover a minimum run of `cards` more cards of gpu_model.
 * seen, when not NULL, gets the funds the check read. */
int funds_check_minimum_run(struct store *s, const char *user_id, const char *gpu_model, int64_t cards, int64_t at,
                            struct funds *seen, struct op_outcome *o);

/* volumes.c */
struct volume;
/* Creates volume v (filling it) of user_id in the caller's transaction. */
int volume_create(struct store *s, const char *user_id, const char *name, int64_t size_gb, struct volume *v);
/* The same in a storage region ("" for the global storage price). */
int volume_create_in(struct store *s, const char *user_id, const char *name, int64_t size_gb, const char *region,
                     struct volume *v);
/* Whether a new volume of size_gb stays within the user's bounds (admin-set,
 * else default_max_volumes and default_max_volume_gb): STORE_OK, or
 * VOLUME_OVER_LIMIT with a sentence in why (when not NULL). The creates
 * above check it themselves. */
#define VOLUME_OVER_LIMIT (-101)
int volume_limit_check(struct store *s, const char *user_id, int64_t size_gb, char *why, size_t whylen);
/* Finds or creates (inside a transaction) the user's default "shared" volume. */
int volume_default(struct store *s, const char *user_id, char id_out[ID_MAX]);

/* reservations.c: capacity blocks (issue 16). */
struct reservation;
/* Checks a window and card count against the rules (pure): whole hours,
 * start not before now, end after start, within reservation_horizon_hours
 * and reservation_max_hours, a placeable card count. REFUSED with o. */
int reservation_window_check(int64_t cards, int64_t starts_at, int64_t ends_at, int64_t now, struct op_outcome *o);
/* Books (in a transaction): the exact calendar check, the price, the funds
 * and the payment. REFUSED with o, else *out is the new reservation. */
int reservation_book(struct store *s, const char *user_id, const char *gpu_type, int64_t cards, int64_t starts_at,
                     int64_t ends_at, int64_t now, struct reservation *out, struct op_outcome *o);
/* Cancels the user's reservation with its refund (in a transaction). */
int reservation_cancel(struct store *s, const char *user_id, const char *id, int64_t now, struct reservation *out,
                       struct op_outcome *o);
/* Cards of gpu_model free to book in each hour of [from, to) (whole hours):
 * free[(h - from) / 3600], summed over the reserved nodes; and largest[]
 * (may be NULL): the most cards one block of that single hour could still
 * get (one node's free cards, or 8 x the whole free nodes of one fabric). */
int reservation_free_hours(struct store *s, const char *gpu_model, int64_t from, int64_t to, int64_t *free_cards,
                           int64_t *largest);
/* Whether the block is bound to nodes (0028; blocks booked before are
 * bound by the pass). */
int reservation_bound(struct store *s, const char *reservation_id, int *bound);
/* What the refund of cancelling r at now would be (the documented rule). */
int64_t reservation_refund_due(const struct reservation *r, int64_t now);
/* The reservation as the API shows it at now. */
json_t *reservation_json(const struct reservation *r, int64_t now);
/* In a transaction: whether instance in (card_count, gpu_model) may run in
 * reservation_id now; REFUSED with o otherwise. */
int reservation_admit(struct store *s, const char *user_id, const char *reservation_id, const char *gpu_model,
                      int64_t cards, const char *instance_id, int64_t now, struct op_outcome *o);
/* In a transaction, before node_id leaves the reserved pool (moved to
 * on_demand, or removed when removing is set): every block bound to it for
 * this or a later hour is re-homed onto another reserved node with room for
 * the rest of its window; STORE_CONFLICT, with *hour the first hour of the
 * first block that cannot be, while the node is up and active (a node
 * already lost leaves, and its blocks are credited). */
int reservation_pool_shrink_check(struct store *s, const char *node_id, int64_t now, int removing, int64_t *hour);
/* In a placement's transaction, before an instance inside bound block
 * reservation_id is placed: each node the block is bound to that is lost,
 * set aside or short of healthy cards has its blocks moved onto spares now,
 * by the pass's own rule (the newest first, never one whose instances hold
 * cards there; their earlier hours credited first, this hour left to the
 * pass), so a start or a job's restart need not wait for the next pass.
 * Where no spare has room nothing moves. */
int reservation_rehome_now(struct store *s, const char *reservation_id, int64_t now);
/* Why the block's placement found no room, into why (n bytes): the first
 * node it is bound to that takes no new work, with why the block is still
 * there ("node a-01 is draining, and no other reserved node has room ...");
 * "" when every one takes new work. */
int reservation_stuck_why(struct store *s, const char *reservation_id, char *why, size_t n);
/* One pass over reservations (in a transaction): the warning before the
 * end, stopping instances at the end, and credits for hours lost to failed
 * reserved hardware. *stopped says whether any instance was stopped. */
int reservation_pass(struct store *s, int64_t now, int *stopped);

#endif
