/* loops.h: the loops layer (src/gpurentd/loops): the background threads,
 * the plumbing they share, the agent client they call nodes with and what
 * they count. They act on the domain and the store; handlers above wake
 * them and read their counters.
 *
 *   loop.c          thread, sleep, wake and stop, shared by every loop;
 *                   when a loop's open streams read their API keys again
 *   heartbeat.c     polls every agent's facts; up, unreachable, offline
 *   reconciler.c    drives agents towards what instances want
 *   billing.c       the billing loop: each user billed in a savepoint of
 *                   their own, failures isolated and counted
 *   watchdog.c      systemd's watchdog, fed after real checks
 *   agent_client.c  signed libcurl calls with timeouts and a reply cap
 *                   (agent_client.h: the only libcurl of the daemon)
 *   counters.c      agent errors and billing passes, for /metrics
 *   logs_proxy.c    reads workload logs from agents for deferred HTTP
 *                   requests, on its own thread
 *   mailer.c        sends the outbox's mail (SMTP via common/smtp.c) with
 *                   retries, or logs it when no smtp_url is set
 *   app_scaler.c    apps' replicas to the gateways' demand (issue 17)

 *   terminal_relay.c  the web terminal: one thread relaying every browser
 *                   WebSocket (wslay) to its agent's terminal stream */
#ifndef GPURENT_LOOPS_H
#define GPURENT_LOOPS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "domain/domain.h"
#include "gpurent/http.h"

struct agent_call;

/* loop.c: the thread plumbing every background loop shares. */
struct bg_loop {
    const char *name;     /* for log lines */
    pthread_t thread;     /* the loop's thread */
    int running;          /* started and not yet joined */
    pthread_mutex_t lock; /* guards the two requests and any state the loop shares */
    pthread_cond_t cond;  /* signalled on wake and stop */
    int stop_requested;   /* loop_stop() was called */
    int wake_requested;   /* loop_wake() was called since the last sleep */
};
#define BG_LOOP_INIT(n)                                                                  \
    {                                                                                    \
        .name = (n), .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER \
    }
/* Takes and gives back the loop's lock, counted for the lock order (see
 * gpurent/assert.h): no store transaction inside. */
void loop_lock(struct bg_loop *l);
void loop_unlock(struct bg_loop *l);
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
/* For a loop holding streams opened with API keys (terminals, followed
 * logs), which end with their key's authority (account_key_standing):
 * whether to read those keys again now, after a change this process
 * committed to keys (store_auth_generation moved) or once a second (an
 * expiry, a change made by another process). Zero-initialised. */
struct key_watch {
    uint64_t gen_seen;
    int64_t checked_ms;
};
int key_watch_due(struct key_watch *w);

/* heartbeat.c: polls every agent for its facts on its own thread. */
int heartbeat_start(void);
/* Asks for a pass now (a node was registered) instead of at the next period. */
void heartbeat_wake(void);
/* Stops the thread and waits for it; safe if never started. */
void heartbeat_stop(void);

/* billing.c: the billing loop and spend control. */
struct billing_summary {
    int64_t users;       /* users billed (usage posted or settled) */
    int64_t checked;     /* users whose funds were checked */
    int64_t at;          /* the time billed up to */
    int64_t duration_ms; /* how long the pass took */
    int64_t failed;      /* users skipped because their billing failed (logged) */
};
/* Users whose billing failed, for /metrics and /readyz. */
struct billing_failures {
    int64_t total;          /* user billings that failed, all time */
    int64_t users;          /* users whose last billing failed */
    int64_t users_repeated; /* of them, failed in more than one pass in a row */
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
/* Asks the next pass to send user_id's SSH keys (as its instances now hold
 * them, store_user_ssh_resnapshot) to the agents of its live instances,
 * and wakes the reconciler. Any thread. */
void reconciler_push_ssh_keys(const char *user_id);
void reconciler_stop(void);

/* watchdog.c: systemd's watchdog, fed after real checks. */
enum loop_kind { LOOP_HEARTBEAT, LOOP_RECONCILER, LOOP_BILLING, LOOP_COUNT };
/* Each background loop calls this after every pass. */
void watchdog_loop_alive(enum loop_kind loop);
/* Starts feeding when systemd asked for a watchdog (WATCHDOG_USEC). */
int watchdog_start(const char *host, int port, int tls);
void watchdog_stop(void);

/* mailer.c: the outbox's sender, on its own thread. mailer_start reads
 * smtp_credentials_file (refused if others may read it); -1 stops start-up. */
int mailer_start(void);
/* Asks for a pass now (mail was queued) instead of within a second. */
void mailer_wake(void);
void mailer_stop(void);
/* Mail handed to the server (or logged), failed tries, mail given up on. */
void mailer_counters(int64_t *sent, int64_t *failures, int64_t *given_up);

/* app_scaler.c: the app marketplace's auto-scaler, on its own thread. */
int app_scaler_start(void);
/* Asks for a pass now (a gateway reported demand, an app changed). */
void app_scaler_wake(void);
void app_scaler_stop(void);

/* agent_client.c (the calls themselves are in agent_client.h): libcurl's
 * process-wide set-up, before any thread starts, and its tear-down. 0 or -1. */
int agent_client_global_init(void);
void agent_client_global_cleanup(void);

/* counters.c: what the loops count for /metrics (http/metrics.c prints it). */
/* A good facts reply to the heartbeat: parsed and judged, the same bytes as
 * the reply last recorded, or 304 for the ETag of that reply. */
enum heartbeat_reply { HEARTBEAT_JUDGED, HEARTBEAT_REPEATED, HEARTBEAT_NOT_MODIFIED, HEARTBEAT_REPLY_KINDS };
struct loop_counters {
    int64_t agent_errors;     /* agent calls without a usable reply */
    int64_t billing_passes;   /* billing passes run */
    int64_t billing_last_us;  /* how long the last one took */
    int64_t billing_total_us; /* time spent in all of them */
    /* Reconciler passes and the instances they read, [0] sweeps, [1] the
     * passes between them (which read only instances needing attention). */
    int64_t reconcile_passes[2];
    int64_t reconcile_instances_read[2];
    /* The reconciler's calls about one workload: [0] PUT, [1] GET, [2] DELETE. */
    int64_t reconcile_calls[3];
    int64_t reconcile_connections; /* connections to agents its calls opened (the others reused one) */
    int64_t heartbeat_replies[HEARTBEAT_REPLY_KINDS]; /* good facts replies, by enum heartbeat_reply */
    int64_t heartbeat_connections; /* connections to agents its polls opened (the others reused one) */
};
void metrics_agent_error(void);
void metrics_billing_pass(int64_t duration_us);
void metrics_reconcile_pass(int sweep, int64_t instances_read);
void metrics_reconcile_call(int method); /* 0 PUT, 1 GET, 2 DELETE */
void metrics_reconcile_connections(int64_t opened);
void metrics_heartbeat_reply(enum heartbeat_reply kind);
void metrics_heartbeat_connections(int64_t opened);
void loop_counters(struct loop_counters *out);

/* logs_proxy.c: the agent calls behind GET /v1/instances/{id}/logs. The
 * handler fills a job and submits it; the proxy thread calls the agent and
 * then resumes the request, and job->reply (on a pool thread) answers it
 * from status, body and error, then frees body and job. */
struct logs_job {
    /* Filled by the handler. */
    struct http_request *req; /* the request, deferred by logs_proxy_submit */
    char agent_url[513];      /* the node's agent */
    char secret[65];          /* its signing key */
    char node_name[64];       /* for messages */
    char path[384];           /* "/v1/workloads/<id>/logs?…", signed as it is */
    int64_t rank;             /* the instance rank read */
    char state[16];           /* the instance's state when asked, for messages */
    int ended;                /* read where it last ran: its output may be gone */
    http_resume_fn reply;     /* answers the request with this job as ctx */
    /* Filled by the proxy. */
    long status;             /* the agent's HTTP status, 0 when no reply came */
    char *body;              /* its body (malloc'd) or NULL */
    char error[512];         /* why no reply came */
    struct agent_call *call; /* the call in flight */
    struct logs_job *next;   /* queue link */
};
int logs_proxy_start(void);
/* Defers job->req and queues the read: 0, and the proxy owns the job until
 * job->reply runs; -1 (stopping or too many waiting), and the caller still
 * owns both the job and the reply. */
int logs_proxy_submit(struct logs_job *job);
/* Answers every read still waiting with "shutting down" and stops the
 * thread; call it before the HTTP server stops. Safe if never started. */
void logs_proxy_stop(void);
/* Reads submitted and not yet handed back, for /metrics. */
int64_t logs_proxy_pending(void);
/* follow=true: the proxy reads target->path first, then polls the agent
 * with after=cursor every LOGS_FOLLOW_POLL_MS, and keeps the lines as text
 * ("<RFC 3339 time> <stream> <text>\n") for the stream's pull, until the
 * workload ends, the client leaves, a call fails or the daemon stops. */
struct logs_follow;
/* Followed logs one user may have at once (LOGS_MAX_FOLLOWS are everyone's). */
#define LOGS_MAX_FOLLOWS_PER_USER 16
/* A follow by user_id of target's node and workload (workload_id names
 * it), opened with API key key_id: it ends when that key's authority does
 * (account_key_standing), as a terminal does. NULL with *busy set when that user has LOGS_MAX_FOLLOWS_PER_USER
 * already, NULL alone when out of memory. */
struct logs_follow *logs_follow_new(const struct logs_job *target, const char *workload_id, const char *user_id,
                                    const char *key_id, int *busy);
/* The stream's pull and done (see http_reply_stream). */
long logs_follow_pull(void *f, char *buf, size_t max);
void logs_follow_done(void *f);
/* Hands f, whose reply streams on st, to the proxy thread. */
void logs_follow_start(struct logs_follow *f, struct http_stream *st);
/* Frees a follow that never started (http_reply_stream failed). */
void logs_follow_free(struct logs_follow *f);

/* terminal_relay.c: the web terminal's relay (one thread, one poll loop).
 * The handler reserves a slot, then switches the browser's connection with
 * terminal_relay_upgraded as the callback and a malloc'd target as ctx. */
struct terminal_target {
    char user_id[ID_MAX];     /* whose terminal (the token's user) */
    char key_id[ID_MAX];      /* the API key that asked for the token: the terminal ends with its authority */
    char instance_id[ID_MAX];
    int64_t rank;
    char agent_url[513];      /* the rank's node */
    char secret[65];          /* its signing key: stays in the daemon */
    char node_name[64];
    char workload_id[ID_MAX]; /* the rank's workload at the agent */
    unsigned cols, rows;      /* the first size of the PTY */
};
int terminal_relay_start(void);
/* A terminal for user_id may open: 0 (reserved until it ends); -1 when
 * max_terminals are open (or the relay is stopping), -2 when the user has
 * max_terminals_per_user. */
int terminal_relay_reserve(const char *user_id);
/* Gives back a reservation whose terminal never opened. */
void terminal_relay_release(const char *user_id);
/* The http_upgraded_fn of the switch: takes ctx (a struct terminal_target)
 * and the reservation. */
void terminal_relay_upgraded(void *ctx, int fd, const char *extra, size_t extra_len, struct http_upgraded *up);
/* Terminals reserved or open. */
int64_t terminal_relay_open_count(void);
/* Closes every terminal (1001 to the browser, the agent connection shut)
 * and stops the thread: before the HTTP server stops, which cannot with
 * upgraded connections. Safe if never started. */
void terminal_relay_stop(void);
/* After the HTTP server stopped: frees what is left. */
void terminal_relay_free(void);

#endif
