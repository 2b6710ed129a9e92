/* daemon.h: gpurentd's own modules, grouped by the file that implements
 * them, so this header is also a map of the daemon. */
#ifndef GPURENT_DAEMON_H
#define GPURENT_DAEMON_H

#include <stddef.h>
#include <stdint.h>

#include "conf.h"
#include "http.h"
#include "log.h"

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
    char tls_cert[1024];          /* PEM certificate; "" serves plain HTTP */
    char tls_key[1024];           /* PEM private key */
    int64_t password_iterations;  /* PBKDF2 rounds for new password hashes */
    int64_t login_max_failures;   /* failed logins before a lockout */
    int64_t login_lockout_s;      /* how long a lockout lasts */
    char bootstrap_admin_email[256]; /* first admin, created on an empty database */
    int64_t drain_timeout_s;      /* SIGTERM waits this long for requests */
    char clock_file[1024];        /* testing clock; "" uses the system clock */
    int64_t heartbeat_interval_ms;/* how often every agent is polled */
    int64_t heartbeat_miss_limit; /* failed polls in a row before a node is offline */
    int64_t agent_connect_timeout_ms; /* connecting to an agent */
    int64_t agent_timeout_ms;     /* a whole call to an agent */
    int64_t agent_max_response_bytes; /* larger agent replies fail the call */
    int64_t agent_max_parallel;   /* agent connections open at once */
    char agent_ca_file[1024];     /* CA bundle to verify https agents; "" for the system's */
};
extern const struct conf_option daemon_options[];
/* The configuration in force; set once at start-up. */
extern struct daemon_conf *daemon_config;

/* routes.c */
extern const struct http_route daemon_routes[];

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

/* accounts.c: account creation shared by the API and the command line. */
struct store;
struct user;
/* Validates and lowercases an email into out; -1 with a reason. */
int account_email_normalize(const char *in, char *out, size_t outlen, const char **why);
/* Creates user u (filling id and created_at) with one API key named
 * key_name, in one transaction. token gets the key's token, shown once.
 * Returns a store_rc (STORE_CONFLICT if the email is taken). */
int account_create(struct store *s, struct user *u, const char *key_name, char *key_id, char *token);
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

/* heartbeat.c: polls every agent for its facts on its own thread. */
int heartbeat_start(void);
/* Asks for a pass now (a node was registered) instead of at the next period. */
void heartbeat_wake(void);
/* Stops the thread and waits for it; safe if never started. */
void heartbeat_stop(void);

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
/* cli.c */
int cmd_migrate(int argc, char **argv);
int cmd_admin(int argc, char **argv);
/* Loads configuration: defaults, then file (if any), then overrides. */
int daemon_load_config(struct daemon_conf *conf, const char *file, char **overrides, int n_overrides);

#endif
