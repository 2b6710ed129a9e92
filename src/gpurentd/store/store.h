/* store.h: the store layer's public face. The store is the only module
 * that speaks SQL: the domain, the loops, the handlers and the commands call
 * the store_* functions declared here, grouped by the file that implements
 * them, and see neither SQLite nor SQL (store_sql.h is the store's own).
 * store.c holds the connections, the statement cache and the transaction
 * runner (group commit), store_rows.c the table through which one statement
 * reads an array held in C, migrate.c the migrations, and one store_*.c per
 * table or concern the SQL: users, API keys, GPU types, nodes, capacity
 * history, images, volumes, instances, idempotency, money, money reports,
 * audit, metrics, reports, verify, SSH keys, what an instance runs, storage
 * billing, multi-node jobs (store_gang.c), password reset codes and account
 * events (store_resets.c).
 *
 * Threading: a struct store is one SQLite connection and its cache of
 * prepared statements, used by one thread only. store_thread() gives each
 * thread its own, opened on first use. Writes go through store_txn(), which
 * runs a callback inside BEGIN IMMEDIATE and retries it when SQLite reports
 * busy, so a callback may run more than once: it must not reply to HTTP or
 * touch anything outside the database until store_txn() returns. */
#ifndef GPURENT_STORE_H
#define GPURENT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "gpurent/ids.h"
#include "gpurent/secrets.h"

/* Results shared by every store function. */
enum store_rc {
    STORE_OK = 0,
    STORE_ERROR = -1,     /* unexpected failure, logged */
    STORE_BUSY = -2,      /* the database is locked; the runner retries */
    STORE_NOT_FOUND = -3, /* no such row */
    STORE_CONFLICT = -4,  /* a uniqueness or state rule refused the change */
};

struct store;

/* store.c */
/* Opens (creating if needed) the database at path with WAL, synchronous=FULL,
 * foreign keys and a busy timeout. NULL with err on failure. */
struct store *store_open(const char *path, char *err, size_t errlen);
/* Opens read-only, for reports and checks next to a running daemon. */
struct store *store_open_readonly(const char *path, char *err, size_t errlen);
void store_close(struct store *s);
/* Sets the database every thread's store_thread() connection opens. */
void store_set_path(const char *path);
/* This thread's connection, opened on first use; NULL if it cannot open. */
struct store *store_thread(void);
/* Process-wide SQLite settings, before any connection opens: memory
 * statistics off, since keeping them takes a mutex every thread shares on
 * every allocation (the read path's main lock, issue 15). */
void store_global_init(void);
/* The catalog generation: moves after every committed transaction of this
 * process that changed what GET /v1/gpu-types shows (migration 0026). */
uint64_t store_catalog_generation(void);
/* Moves after every committed transaction of this process that changed
 * whether a key authenticates (migration 0042's auth_generation row): the
 * HTTP key cache (auth.c) drops what it read before. */
uint64_t store_auth_generation(void);
/* That row as the database holds it (changes by other processes too). */
int store_auth_generation_db(struct store *s, int64_t *gen);
/* Moves after every committed write transaction of this process, from the
 * WAL hook, before the committing call returns: a reply rendered after
 * reading it is stale once it moves (the instance reply cache,
 * api_instances.c). Other processes' writes do not move it. */
uint64_t store_commit_generation(void);
/* That row as the database holds it (changes by other processes too). */
int store_catalog_generation_db(struct store *s, int64_t *gen);
/* Closes every connection store_thread() opened; call after all threads
 * that used them have stopped. */
void store_close_threads(void);

typedef int (*store_txn_fn)(struct store *s, void *ctx);
/* Runs fn(s2, ctx) in a write transaction, one writer of the process at a
 * time (never call store_txn from inside a callback). Writers that queue
 * while a transaction runs are committed together (group commit, see
 * store.c), and every batch on the store_thread() database runs on one
 * writer connection that keeps its page cache warm, so s2 is usually not s:
 * fn must use only the store it is given and ctx. A negative result rolls
 * back fn's own work;
 * STORE_BUSY from fn, BEGIN or COMMIT retries the whole callback (with a
 * short backoff, for up to a few seconds). Returns fn's result, or
 * STORE_BUSY / STORE_ERROR if the transaction itself could not complete. */
int store_txn(struct store *s, store_txn_fn fn, void *ctx);
/* Called with a store_txn_async request's result: fn's, or STORE_BUSY /
 * STORE_ERROR as store_txn would return. It runs on whichever thread led
 * the batch, once the next batch may start: it must be quick, and must not
 * call store_txn or wait for another request. */
typedef void (*store_done_fn)(void *ctx, int result);
/* store_txn without waiting: queues fn to run in a batch that the committer
 * thread (or a waiting writer) leads and returns, and answer(ctx, result)
 * is called once the batch committed or failed, possibly before this
 * returns. An HTTP create (or an instance's start, stop, terminate, PATCH)
 * so waits for its commit without holding a thread, and batches grow past
 * the thread count. Without the committer, or on a connection that is not
 * store_thread()'s, it runs store_txn and answers before returning. */
void store_txn_async(struct store *s, store_txn_fn fn, void *ctx, store_done_fn answer);
/* Starts the committer thread, on the store_thread() database; 0 or -1.
 * Stop answers every queued request first; after it, store_txn_async
 * waits as store_txn does. Stop before store_close_threads. */
int store_committer_start(void);
void store_committer_stop(void);
/* One read snapshot for several statements outside store_txn (a GET that
 * runs eight of them): they see one state, and SQLite takes its WAL read
 * lock once instead of once a statement. Always paired, never around
 * store_txn. */
int store_read_begin(struct store *s);
void store_read_end(struct store *s);
/* Inside a store_txn callback: runs fn(s, ctx) in a savepoint of its own, so
 * that a negative result (in *result) undoes fn's work only and the caller
 * can go on with the rest (billing skips one user and bills the others).
 * Returns 0, or -1 when the savepoint itself failed: then the whole
 * transaction must give up. */
int store_part(struct store *s, store_txn_fn fn, void *ctx, int *result);
/* What store_txn has done since the process started. */
struct store_txn_stats {
    int64_t commits;      /* durable commits (one fsync each) */
    int64_t transactions; /* callbacks committed: transactions / commits is the batching */
    int64_t waiting;      /* callbacks queued now for the next batch */
};
void store_txn_stats(struct store_txn_stats *out);

/* migrate.c */
/* Applies embedded migrations above the database's version, each in its own
 * transaction, up to target (0 = all). Refuses a database whose version is
 * newer than this binary knows. Returns 0 or -1 with err. */
int store_migrate(struct store *s, int target, char *err, size_t errlen);
/* The database's applied version (0 for a new one), or -1. */
int store_schema_version(struct store *s);
/* Whether writes are failing because the database's file system is full:
 * set by the write that failed, cleared by a commit a few seconds after the
 * last such failure or once the file system has 1 MiB free again (looked
 * at on each call while set). */
int store_disk_full(void);
/* store_disk_full, or a write failed for space in the last few seconds: a
 * request that failed so is answered 503 even when a smaller commit that
 * still found room has cleared the flag meanwhile. */
int store_disk_full_lately(void);
/* The newest version this binary carries. */
int store_latest_version(void);

/* store_users.c */
enum user_role { ROLE_USER = 0, ROLE_ADMIN = 1 };
struct user {
    char id[ID_MAX];                       /* usr_… */
    char email[256];                       /* lowercase */
    char password_hash[PASSWORD_HASH_MAX]; /* "" when the account has none */
    enum user_role role;                   /* user or admin */
    int active;                            /* 0 when disabled */
    char invite_code[64];                  /* code given at sign-up, "" if none */
    int64_t created_at;                    /* epoch seconds */
    char email_key[256];                   /* normalised form, unique ("" at insert: the email) */
    char email_display[256];               /* as typed at sign-up ("" at insert: the email) */
    int64_t email_verified_at;             /* 0 until the address is verified */
    int64_t trial_at;                      /* when it got its trial credit; 0 never */
    char signup_address[64];               /* client address of the sign-up, "" otherwise */
};
/* Inserts u (id and created_at filled by the caller); STORE_CONFLICT if the
 * email is taken. */
int store_user_insert(struct store *s, const struct user *u);
int store_user_get(struct store *s, const char *id, struct user *out);
/* By the normalised form (email_key). */
int store_user_get_by_email(struct store *s, const char *email_key, struct user *out);
/* By email_key, else by the lower-cased email: accounts made before
 * migration 0021 keep their lower-cased address as key, which the
 * normalised form of a spelling may not match. */
int store_user_get_by_login(struct store *s, const char *email_key, const char *lower, struct user *out);
/* Number of admin accounts, or a negative store_rc. */
int64_t store_user_count_admins(struct store *s);
/* Whether user_id was mailed a low-balance notice since money last came in
 * (migration 0049); set it at `at`, or clear it with 0. */
int store_user_low_balance_noticed(struct store *s, const char *user_id, int *noticed);
int store_user_set_low_balance_noticed(struct store *s, const char *user_id, int64_t at);

/* store_api_keys.c */
struct api_key {
    char id[ID_MAX];                                /* key_… */
    char user_id[ID_MAX];                           /* owner */
    char name[129];                                 /* the owner's label, up to 128 bytes */
    unsigned char secret_hash[API_SECRET_HASH_LEN]; /* SHA-256 of the secret */
    int64_t created_at;                             /* epoch seconds */
    int64_t revoked_at;                             /* 0 while valid */
    int64_t expires_at;                             /* 0: never (keys made by logging in expire) */
    int64_t last_used_at;                           /* 0: never used; written at most once a minute */
};
int store_api_key_insert(struct store *s, const struct api_key *k);
int store_api_key_get(struct store *s, const char *id, struct api_key *out);
/* A key with what authenticating a request needs of its owner. */
struct key_auth {
    struct api_key key;  /* the key row */
    int owned;           /* its owner's row was found */
    enum user_role role; /* the owner's role */
    int active;          /* the owner is not suspended */
};
/* Reads key id with its owner in one statement; STORE_NOT_FOUND without
 * the key, STORE_ERROR for a key whose owner is missing. */
int store_api_key_auth(struct store *s, const char *id, struct key_auth *out);
/* Notes a use at now unless one was noted in the minute before: a write at
 * most once a minute per key, not one per request. */
int store_api_key_touch(struct store *s, const char *id, int64_t now);
/* Revokes every live key of user_id but except_id (NULL: all), only those
 * made by logging in when logins_only; *n gets how many. */
int store_api_keys_revoke_all(struct store *s, const char *user_id, const char *except_id, int logins_only,
                              int64_t now, int64_t *n);
/* Sets a user's password hash. */
int store_user_set_password(struct store *s, const char *user_id, const char *password_hash);
/* Keys of user_id created after the cursor (created_at, id), oldest first,
 * at most max; *n gets the count. Revoked keys are listed too. */
int store_api_key_list(struct store *s, const char *user_id, int64_t after_created, const char *after_id,
                       struct api_key *out, size_t max, size_t *n);
/* How many keys of user_id still authenticate at now (not revoked, not
 * expired); negative store_rc on failure. */
int64_t store_api_key_live_count(struct store *s, const char *user_id, int64_t now);
/* Revokes the n oldest live keys of user_id that expire (made by logging
 * in); *revoked gets how many there were to revoke. */
int store_api_keys_revoke_oldest_logins(struct store *s, const char *user_id, int64_t n, int64_t now,
                                        int64_t *revoked);
/* Revokes key id of user_id at now; STORE_NOT_FOUND if it is not theirs.
 * Revoking an already revoked key is STORE_OK and keeps the first time. */
int store_api_key_revoke(struct store *s, const char *user_id, const char *id, int64_t now);

/* store_gpu_types.c */
struct gpu_type {
    char code[33];                  /* catalog code, e.g. "MI450" */
    char vendor[8];                 /* "AMD" or "NVIDIA" */
    int64_t memory_gb;              /* memory per card */
    char memory_type[33];           /* e.g. "HBM3e" */
    char stack[8];                  /* "ROCm" or "CUDA" */
    int reservation_required;       /* rentable only through a reservation */
    char features[512];             /* JSON array text, e.g. ["FP8"] */
    char description[513];          /* for the console */
    int64_t cards_total;            /* cards on nodes whose facts were accepted */
    int64_t cards_free;             /* healthy, unallocated cards on ready nodes */
    int64_t cards_in_use;           /* cards held by instances */
    int64_t created_at, updated_at; /* epoch seconds */
    int64_t cards_reservable;       /* healthy cards of the reserved pool on ready nodes (0024) */
    int64_t cards_reserved_idle;    /* of those, the ones no instance holds */
};
/* Every type with its card counts, by code, in a malloc'd array (*out,
 * caller frees; *n types): the catalog has no bound to cut it at. */
int store_gpu_type_list(struct store *s, struct gpu_type **out, size_t *n);
/* The first price start after now, INT64_MAX when none is scheduled. */
int store_next_price_change(struct store *s, int64_t now, int64_t *at);
int store_gpu_type_get(struct store *s, const char *code, struct gpu_type *out);
/* The most cards one on-demand create of type code can be placed with now
 * (up to PLACEMENT_NODE_CARDS on one node, or whole free nodes of one
 * fabric), or a negative store_rc. */
int64_t store_gpu_type_launchable(struct store *s, const char *code);
/* The same without the card counts (left 0): no scan of the cards. */
int store_gpu_type_row(struct store *s, const char *code, struct gpu_type *out);
/* Creates or replaces the type's description (not its counts); *created
 * tells which. */
int store_gpu_type_put(struct store *s, const struct gpu_type *t, int64_t now, int *created);
/* What still names a GPU type, so it cannot be deleted: nodes (removed ones
 * too), prices (their history is the ledger's) and instances. */
struct gpu_type_users {
    int64_t nodes, prices, instances;
};
/* STORE_CONFLICT, with *users filled, while anything names the type. */
int store_gpu_type_delete(struct store *s, const char *code, struct gpu_type_users *users);

/* store_nodes.c */
struct node {
    char id[ID_MAX];         /* node_… */
    char name[64];           /* admin's name */
    char agent_url[513];     /* base URL of the agent */
    char secret[65];         /* HMAC key for the agent (hex) */
    char gpu_model[33];      /* declared model */
    int64_t card_count;      /* declared cards */
    char fabric[64];         /* RDMA fabric */
    char region[64];         /* where */
    char labels[2048];       /* JSON object text */
    char admin_state[16];    /* active, cordoned, draining, maintenance */
    char health[16];         /* unknown, up, offline, rejected */
    char state[16];          /* derived: pending, ready, cordoned, draining, maintenance, offline, rejected */
    char state_reason[256];  /* why it is in its state: the admin's reason when set aside, else the heartbeats' */
    char admin_reason[256];  /* why an admin set admin_state ("" when active) */
    int64_t missed_beats;    /* failed heartbeats in a row */
    int64_t last_seen_at;    /* last good heartbeat, 0 if never */
    char driver_version[64]; /* from facts */
    char stack_version[64];  /* from facts */
    char public_host[254];   /* where users connect; "" for the host of agent_url */
    int64_t ssh_port;        /* the agent's SSH server from facts, 0 when it reports none */
    char ssh_host_key[1025]; /* its host key "type base64", "" when none */
    char ssh_host_fp[64];    /* SHA256:… fingerprint of that key, computed here */
    int64_t cards_total;     /* card rows (accepted facts) */
    int64_t cards_free;      /* healthy and unallocated, if the node is ready */
    int64_t cards_in_use;    /* held by instances */
    int64_t created_at, updated_at; /* epoch seconds */
    char data_host[254];     /* the admin's data-plane host (0019), "" when unset */
    char data_address[254];  /* the data-plane address the agent's facts report, "" when none */
    int64_t publish_first, publish_last; /* host ports it publishes instances' ports on (facts), 0 when none */
};
struct node_card {
    int64_t idx;              /* index on the node */
    char model[33];           /* reported model */
    int64_t memory_gb;        /* reported memory */
    int healthy;              /* 0: failed */
    char health_reason[128];  /* why it failed */
    char instance_id[ID_MAX]; /* holder, "" when free */
    int64_t failed_at;        /* a failed card: since when (epoch s); 0 while healthy or not known */
};
/* Inserts a node (admin registration); STORE_CONFLICT if the name is taken,
 * STORE_NOT_FOUND if its GPU model is not in the catalog. */
int store_node_insert(struct store *s, const struct node *n);
int store_node_get(struct store *s, const char *id, struct node *out);
struct node_filter {
    const char *state;     /* derived state, or NULL */
    const char *gpu_model; /* or NULL */
    const char *fabric;    /* or NULL */
    int64_t after_created; /* cursor: created_at of the last row seen (-1: start) */
    const char *after_id;  /* cursor: id of the last row seen */
};
int store_node_list(struct store *s, const struct node_filter *f, struct node *out, size_t max, size_t *n);
/* The node's cards by index; *n gets the count. */
int store_node_cards(struct store *s, const char *node_id, struct node_card *out, size_t max, size_t *n);
/* Sets the admin state and its reason. */
int store_node_set_admin_state(struct store *s, const char *id, const char *admin_state, const char *reason,
                               int64_t now);
/* Marks the node removed; STORE_CONFLICT while any of its cards is in use. */
int store_node_remove(struct store *s, const char *id, int64_t now);

/* What the heartbeat loop needs to call one agent. */
struct node_target {
    char id[ID_MAX];        /* node */
    char agent_url[513];    /* where */
    char secret[65];        /* signing key */
    char gpu_model[33];     /* declared model */
    int64_t card_count;     /* declared cards */
    char health[16];        /* current health; 'unreachable' for an up node missing beats */
    int64_t missed_beats;   /* failed beats so far */
    int64_t last_seen_at;   /* last good heartbeat, 0 if never */
    int64_t workload_exits; /* the agent's last reported count of ended workloads, -1 if none */
    char facts_digest[65];  /* of the last facts reply recorded (0033), "" before any */
    char facts_etag[65];    /* that reply's ETag (0038), "" when it had none */
};
/* Every registered node; *out is malloc'd (caller frees), *n its length. */
int store_node_targets(struct store *s, struct node_target **out, size_t *n);
/* The same for the nodes among ids (n_ids of them) that are registered. */
int store_node_targets_of(struct store *s, const char (*ids)[ID_MAX], size_t n_ids, struct node_target **out,
                          size_t *n);
/* The same for the nodes never reached yet (health unknown): its cost
 * follows them, not the fleet. */
int store_node_targets_new(struct store *s, struct node_target **out, size_t *n);
/* Records a good heartbeat whose facts are those last recorded: only the
 * time moves, and a node the caller read as unreachable (node_target's
 * health) is reachable again. Only the heartbeat makes a node unreachable,
 * so the nodes row of one it read otherwise is not looked at. */
int store_node_seen(struct store *s, const char *id, int64_t now, int64_t workload_exits, int unreachable);
/* Sets the digest of the facts reply just recorded (0033; in the narrow
 * node_liveness row since 0036) and its ETag ("" for none, 0038), in the
 * same transaction as its verdict. */
int store_node_set_facts_digest(struct store *s, const char *id, const char *digest, const char *etag);
/* Records a good heartbeat: facts accepted (cards replace the node's card
 * facts, keeping allocations) or rejected with reason. */
int store_node_beat_ok(struct store *s, const char *id, int64_t now, const char *facts_json, int accepted,
                       const char *reason, const char *driver_version, const char *stack_version,
                       const struct node_card *cards, size_t n_cards, int64_t workload_exits);
/* Records what the node's facts say of its SSH server (port 0: none, then
 * host_key and fingerprint are ignored and stored as NULL). Writes only
 * when something changed. STORE_NOT_FOUND for a removed node. */
int store_node_set_ssh(struct store *s, const char *id, int64_t port, const char *host_key, const char *fingerprint);
/* Records a failed heartbeat. After miss_limit in a row an up node is
 * unreachable (it keeps its cards; nothing new is placed on it), and once
 * it has not answered for lost_after_s it is offline; a node never reached
 * goes offline after miss_limit. */
int store_node_beat_missed(struct store *s, const char *id, int64_t now, int64_t miss_limit, int64_t lost_after_s,
                           const char *reason);

/* store_capacity.c */
/* Brings the node's capacity history (node_capacity) in step with what it
 * offers now: closes its open interval at now if its model or card count
 * changed or it is no longer accepted, and opens one from now if it offers
 * cards. Call in the transaction that changed the node; the store_node_*
 * writers above already do. STORE_NOT_FOUND for an unknown node. */
int store_capacity_sync(struct store *s, const char *node_id, int64_t now);

/* store_images.c */
struct image {
    char id[ID_MAX];       /* img_… */
    char ref[256];         /* what runtimes pull */
    char stack[8];         /* ROCm or CUDA */
    char description[513]; /* for the console */
    int64_t created_at;    /* epoch seconds */
};
int store_image_list(struct store *s, struct image *out, size_t max, size_t *n);
/* Finds an image by id or by ref. */
int store_image_find(struct store *s, const char *id_or_ref, struct image *out);
/* STORE_CONFLICT if the ref exists. */
int store_image_insert(struct store *s, const struct image *img);
int store_image_delete(struct store *s, const char *id);

/* store_volumes.c */
struct volume {
    char id[ID_MAX];      /* vol_… */
    char user_id[ID_MAX]; /* owner */
    char name[64];        /* unique per owner */
    int64_t size_gb;      /* quota */
    char source[513];     /* what agents mount */
    int64_t created_at;   /* epoch seconds */
    int64_t instances;    /* instances not terminated that use it */
    int64_t mounted;      /* of those, how many hold cards now */
    char region[64];      /* whose storage price applies; "" the global one (0020) */
};
/* STORE_CONFLICT if the owner has a live volume of that name. */
int store_volume_insert(struct store *s, const struct volume *v);
/* A live volume of user_id (NULL: of anyone) by id. */
int store_volume_get(struct store *s, const char *user_id, const char *id, struct volume *out);
/* Of a live volume by id, only what agents mount (source and size_gb), the
 * rest of out zeroed: cheaper than store_volume_get, which counts the
 * instances using it. */
int store_volume_mount(struct store *s, const char *id, struct volume *out);
/* The id of user_id's live volume called name. */
int store_volume_id_by_name(struct store *s, const char *user_id, const char *name, char id_out[ID_MAX]);
int store_volume_list(struct store *s, const char *user_id, int64_t after_created, const char *after_id,
                      struct volume *out, size_t max, size_t *n);
/* STORE_CONFLICT while an instance that is not terminated uses it. */
int store_volume_delete(struct store *s, const char *user_id, const char *id, int64_t now);

/* store_instances.c */
struct instance {
    char id[ID_MAX];                /* ins_… */
    char user_id[ID_MAX];           /* owner */
    char name[64];                  /* owner's label */
    char gpu_model[33];             /* card model */
    int64_t card_count;             /* cards */
    char image[256];                /* image ref */
    char volume_id[ID_MAX];         /* mounted at /shared */
    char desired[16];               /* running, stopped, terminated */
    char state[16];                 /* pending … lost */
    char phase[16];                 /* provisioning phase of the slowest node */
    char state_reason[1024];        /* why the last change (a job's end names its last log lines) */
    int64_t attempts;               /* failed provisioning attempts */
    int64_t next_attempt_at;        /* retry not before */
    int64_t state_since;            /* last state change */
    int64_t created_at, updated_at; /* epoch seconds */
    /* jobs (0018, store_jobs.c) */
    char restart_policy[16];     /* never, on_failure, always */
    int64_t max_runtime_minutes; /* a run is stopped after this long; 0: never */
    int64_t restart_count;       /* restarts since the last create or start */
    int64_t restart_backoff_s;   /* what the last restart waited; 0 none */
    int exit_known;              /* exit_code holds the status the job last exited with */
    int64_t exit_code;           /* that status */
    int64_t run_started_at;      /* the current run began (max runtime counts from it); 0 not yet */
    int64_t runtime_warned_at;   /* max_runtime_warning written for this run; 0 not yet */
    int64_t ranks_exited_at;     /* latest status-0 exit of a rank while others ran; 0 none */
};
struct instance_node {
    int64_t rank;             /* 0 = master */
    char node_id[ID_MAX];     /* the node */
    char node_name[64];       /* its name */
    char agent_url[513];      /* its agent */
    char secret[65];          /* its signing key */
    char node_health[16];     /* up, unreachable (up but missing beats), offline … */
    int64_t node_last_seen;   /* last good heartbeat (a rejected node's: since it was refused) */
    char workload_id[ID_MAX]; /* id at the agent */
    char cards[256];          /* JSON array of card indexes */
    char phase[16];           /* last reported phase */
    char message[256];        /* with the phase */
    int put_done;             /* the agent accepted the workload */
    char public_host[254];    /* the node's host for users; "" for the host of agent_url */
    int64_t ssh_port;         /* its SSH server's port, 0 when it reports none */
    char ssh_host_key[1025];  /* its host key "type base64", "" when none */
    char ssh_host_fp[64];     /* SHA256:… fingerprint of it */
    char ports[512];          /* JSON [{"container": c, "host": h}] it publishes (0016) */
    char data_host[254];      /* the node's admin-set data-plane host (0019), "" when unset */
    char data_address[254];   /* the one its facts report, "" when none */
    char health[16];          /* its agent's health verdict (0027): starting, healthy, unhealthy; "" none */
    int health_check;         /* its instance is an app replica, whose agent checks its health (0027) */
};
struct instance_filter {
    const char *user_id;   /* owner, or NULL for all (reconciler) */
    const char *state;     /* or NULL */
    int64_t after_created; /* cursor */
    const char *after_id;  /* cursor */
};
int store_instance_insert(struct store *s, const struct instance *in);
/* By id; with user_id set, someone else's instance is STORE_NOT_FOUND. */
int store_instance_get(struct store *s, const char *user_id, const char *id, struct instance *out);
int store_instance_list(struct store *s, const struct instance_filter *f, struct instance *out, size_t max, size_t *n);
/* Instances the reconciler must look at: any with cards or not yet settled.
 * *out is malloc'd (caller frees). */
int store_instance_unsettled(struct store *s, struct instance **out, size_t *n);
/* The part of those a pass between sweeps must look at (0032): on their
 * way up or down, unreachable, running with a decision due every pass, or
 * on a node that is not answering or is one of nodes[n_nodes]. */
int store_instance_attention(struct store *s, const char (*nodes)[ID_MAX], size_t n_nodes, struct instance **out,
                             size_t *n);
/* Changes state (and phase and reason), logging an event when state or
 * phase changes; writes nothing when all three are as given already. */
int store_instance_set_state(struct store *s, const char *id, const char *state, const char *phase, const char *reason,
                             int64_t now);
int store_instance_set_desired(struct store *s, const char *id, const char *desired, int64_t now);
int store_instance_set_attempts(struct store *s, const char *id, int64_t attempts, int64_t next_attempt_at);
int store_instance_event(struct store *s, const char *id, int64_t at, const char *state, const char *reason);
struct instance_event {
    int64_t seq;       /* order */
    int64_t at;        /* epoch seconds */
    char state[32];    /* state or phase entered, or max_runtime_warning */
    char reason[1024]; /* why */
};
int store_instance_events(struct store *s, const char *id, int64_t after_seq, struct instance_event *out, size_t max,
                          size_t *n);
int store_instance_nodes(struct store *s, const char *id, struct instance_node *out, size_t max, size_t *n);
/* A node placement may choose, as the store reads it. */
#define PLACEMENT_NODE_CARDS 8 /* cards on a whole node */
#define PLACEMENT_MAX_NODES 32 /* 256 cards / 8 */
struct placement_node {
    char id[ID_MAX];    /* node id */
    char fabric[64];    /* RDMA fabric */
    int card_count;     /* cards the node has */
    uint64_t free_mask; /* bit i: card i is healthy and free */
};
/* The ready nodes of model that can take `cards` cards, with their free
 * cards: for up to a node's worth, the best fit alone; for more, every whole
 * free node, by fabric then name. *out is malloc'd (caller frees). */
int store_placement_candidates(struct store *s, const char *gpu_model, int64_t cards, struct placement_node **out,
                               size_t *n);
/* The same, counting only nodes with at least `ports` free host ports to
 * publish on (0 for any node). */
int store_placement_candidates_ports(struct store *s, const char *gpu_model, int64_t cards, int64_t ports,
                                     struct placement_node **out, size_t *n);
/* Free cards of model on ready nodes, for "only N are free" messages. */
int64_t store_free_cards(struct store *s, const char *gpu_model);
/* Gives cards (bit mask) of node_id to the instance at rank; STORE_CONFLICT
 * if any is no longer free. */
int store_instance_claim(struct store *s, const char *instance_id, int64_t rank, const char *node_id,
                         const char *workload_id, uint64_t cards);
/* Frees every card of the instance and forgets its placement, keeping
 * where each accepted rank ran (store_instance_past_rank). */
int store_instance_release(struct store *s, const char *instance_id);
/* What keeps an instance's placement from taking new workloads (a restart,
 * or a put after a backoff; reconciler.c): the first card it holds that its
 * agent reports failed, and the first of its nodes that takes no new work
 * (set aside by an admin, not answering, refused or removed). */
struct placement_unfit {
    char failed_node[64]; /* that card's node's name; "" when no held card failed */
    int64_t failed_card;  /* its index, -1 when none */
    char aside_node[64];  /* that node's name; "" when every node takes new work */
    char aside_state[16]; /* its state as the admin API names it: cordoned, draining, maintenance, unreachable … */
};
int store_instance_unfit(struct store *s, const char *instance_id, struct placement_unfit *out);
/* Only the failed card of out (the aside node left ""): a put's check, on
 * the path of every create, needs no more. */
int store_instance_failed_card(struct store *s, const char *instance_id, struct placement_unfit *out);
/* Where rank last ran once its placement went: rank, node_id, node_name,
 * agent_url, secret and workload_id of out; STORE_NOT_FOUND if nowhere (or
 * the node was removed since). */
int store_instance_past_rank(struct store *s, const char *instance_id, int64_t rank, struct instance_node *out);
/* Records what a rank's agent said; STORE_NOT_FOUND when the rank is gone
 * or already says exactly that (then nothing is written). */
int store_instance_node_update(struct store *s, const char *instance_id, int64_t rank, const char *phase,
                               const char *message, int put_done);
/* Stores the health a rank's agent reported (0027), at epoch second at. */
int store_instance_node_health(struct store *s, const char *instance_id, int64_t rank, const char *health,
                               int64_t at);
/* Opens a running interval at started_at (no-op if one is open). */
int store_interval_open(struct store *s, const struct instance *in, int64_t started_at);
/* Closes the open interval at ended_at (never before its start); no-op if
 * none is open. Billing code closes through ledger_close_interval, which
 * also gives back what was charged past the new end. */
int store_interval_close(struct store *s, const char *instance_id, int64_t ended_at, const char *reason);
/* Every workload id placed on a node, or with nodes only on those n_nodes
 * nodes, sorted (for orphan checks). *out is malloc'd: n entries of ID_MAX
 * bytes. */
int store_placed_workloads(struct store *s, const char (*nodes)[ID_MAX], size_t n_nodes, char (**out)[ID_MAX],
                           size_t *n);
/* Whether some instance's placement names workload_id: 1, 0, or
 * STORE_ERROR. */
int store_workload_placed(struct store *s, const char *workload_id);
/* Cards the user's instances hold, not counting except_instance (NULL: none). */
int64_t store_user_cards_in_use(struct store *s, const char *user_id, const char *except_instance);
struct model_cards {
    char gpu_model[33]; /* type */
    int64_t cards;      /* cards of it held */
};
/* Cards the user's instances hold, per GPU type. */
int store_user_cards_by_model(struct store *s, const char *user_id, struct model_cards **out, size_t *n);
/* The user's card quota, or def when no admin set one. */
int64_t store_user_max_cards(struct store *s, const char *user_id, int64_t def);
int store_user_set_max_cards(struct store *s, const char *user_id, int64_t max_cards);
/* The user's volume bounds (0023): how many live volumes, how many GB in
 * all; each the default given when no admin set one. */
int store_user_volume_limits(struct store *s, const char *user_id, int64_t def_count, int64_t def_gb,
                             int64_t *max_volumes, int64_t *max_gb);
/* Sets them; -1 leaves one as it is (or the default when never set). */
int store_user_set_volume_limits(struct store *s, const char *user_id, int64_t max_volumes, int64_t max_gb);
/* The user's live volumes and their GB together. */
int store_user_volume_usage(struct store *s, const char *user_id, int64_t *count, int64_t *gb);

/* store_ssh_keys.c: users' OpenSSH public keys and instances' snapshots of them. */
struct ssh_key {
    char id[ID_MAX];      /* sshk_… */
    char user_id[ID_MAX]; /* owner */
    char name[65];        /* the owner's label, 1..64 bytes */
    char type[24];        /* ssh-ed25519, ecdsa-sha2-nistp256/384/521, ssh-rsa */
    int64_t bits;         /* as ssh-keygen -l shows */
    char blob[4096];      /* the key's base64 (RSA-16384, the largest taken, needs 2764) */
    char comment[257];    /* the line's comment, "" if none */
    char fingerprint[64]; /* SHA256:… */
    int64_t created_at;   /* epoch seconds */
};
/* STORE_CONFLICT if the owner has a key of that fingerprint. */
int store_ssh_key_insert(struct store *s, const struct ssh_key *k);
/* user_id's key id; STORE_NOT_FOUND for anyone else's. */
int store_ssh_key_get(struct store *s, const char *user_id, const char *id, struct ssh_key *out);
int store_ssh_key_by_fingerprint(struct store *s, const char *user_id, const char *fingerprint, struct ssh_key *out);
/* Keys of user_id after the cursor, oldest first, at most max; *out is
 * malloc'd (caller frees), *n its length. */
int store_ssh_key_list(struct store *s, const char *user_id, int64_t after_created, const char *after_id, size_t max,
                       struct ssh_key **out, size_t *n);
/* How many keys user_id has, or a negative store_rc. */
int64_t store_ssh_key_count(struct store *s, const char *user_id);
/* STORE_NOT_FOUND if it is not user_id's. */
int store_ssh_key_delete(struct store *s, const char *user_id, const char *id);
/* The keys the instance names (a JSON array of ids), or NULL for all its owner's. */
int store_instance_set_ssh_key_ids(struct store *s, const char *instance_id, const char *ids_json);
/* Takes the instance's snapshot of its keys now (at create and at start). */
int store_instance_ssh_snapshot(struct store *s, const char *instance_id);
/* The snapshot (JSON array of "type base64") and, when ids_json is not NULL,
 * the ids it names (NULL for all); both malloc'd, caller frees. */
int store_instance_ssh(struct store *s, const char *instance_id, char **keys_json, char **ids_json);
/* Every live instance of user_id (pending to stopping) takes its snapshot
 * again: the user's keys changed, and running instances follow them. */
int store_user_ssh_resnapshot(struct store *s, const char *user_id);
/* The ids of user_id's instances whose workloads may be on their nodes
 * now (provisioning, running or unreachable, desired running): where a
 * change of the keys is sent. *ids malloc'd, caller frees. */
int store_user_ssh_push_instances(struct store *s, const char *user_id, char (**ids)[ID_MAX], size_t *n);

/* store_ports.c: published ports (0016): what an instance asks for, the
 * range each node publishes on, and host ports given to instance nodes. */
#define STORE_MAX_PORTS 8 /* container ports one instance may publish */
/* The instance's container ports, a JSON array of integers (stored as given). */
int store_instance_set_ports(struct store *s, const char *instance_id, const char *ports_json);
/* Reads them into ports[0..*n) (at most STORE_MAX_PORTS). */
int store_instance_ports(struct store *s, const char *instance_id, int64_t ports[STORE_MAX_PORTS], size_t *n);
/* Records the node's publish range from its facts (first 0: none). Writes
 * only when something changed; STORE_NOT_FOUND for a removed node. */
int store_node_set_publish(struct store *s, const char *id, int64_t first, int64_t last);
/* Gives rank `rank` of the instance on node_id one free host port of the
 * node's range for each container port, the lowest free ones, and records
 * them on its instance_nodes row; STORE_CONFLICT when the range has too few. */
int store_instance_claim_ports(struct store *s, const char *instance_id, int64_t rank, const char *node_id,
                               const int64_t *container, size_t n);

/* store_run.c: what an instance runs (0017), and its image. */
struct instance_run {
    char *command;         /* JSON array of strings, or NULL: the image's (malloc'd) */
    char *env;             /* JSON array of {"name", "value", "secret"}, secret values included (malloc'd) */
    char working_dir[256]; /* "" : the image's */
};
/* command_json NULL stores NULL; env_json NULL stores "[]". */
int store_instance_set_command(struct store *s, const char *instance_id, const char *command_json);
int store_instance_set_env(struct store *s, const char *instance_id, const char *env_json);
int store_instance_set_working_dir(struct store *s, const char *instance_id, const char *dir);
int store_instance_set_image(struct store *s, const char *instance_id, const char *ref);
int store_instance_set_name(struct store *s, const char *instance_id, const char *name);
/* Reads them; free with store_instance_run_free (also after a failure). */
int store_instance_run(struct store *s, const char *instance_id, struct instance_run *out);
void store_instance_run_free(struct instance_run *r);
/* store_jobs.c: jobs and services (0018): an instance's restart policy and
 * run time bound, its exit status, restarts and the clock of its run. */
/* Sets what create asked for (policy never, on_failure or always; minutes
 * 0: none); writes nothing when both are so already. */
int store_instance_set_job(struct store *s, const char *id, const char *restart_policy, int64_t max_runtime_minutes);
/* Records the status the job exited with (known 0: unknown, NULL). */
int store_instance_set_exit(struct store *s, const char *id, int known, int64_t code);
/* Records a restart: the count and the backoff it waits. */
int store_instance_set_restarts(struct store *s, const char *id, int64_t restart_count, int64_t backoff_s);
/* The run's start and its warning mark (0 each: NULL). */
int store_instance_set_run_clock(struct store *s, const char *id, int64_t run_started_at, int64_t warned_at);
/* The latest status-0 exit of a rank of a job whose other ranks run (0: NULL). */
int store_instance_set_ranks_exited(struct store *s, const char *id, int64_t at);
/* Gives rank `rank` a fresh workload id and forgets what its agent reported,
 * so the next pass puts the workload again on the same cards. */
int store_instance_node_renew(struct store *s, const char *id, int64_t rank, const char *workload_id);
/* store_gang.c: multi-node jobs (0019): node data-plane addresses, an
 * instance's rendezvous bound and internal SSH key pair. */
/* Records the data-plane address the node's facts report ("" for none);
 * writes only when it changed. */
int store_node_set_data_address(struct store *s, const char *id, const char *address);
/* The admin changes where users (public_host) and other ranks (data_host)
 * reach a node; NULL leaves that one as it is. STORE_NOT_FOUND: no node. */
int store_node_set_hosts(struct store *s, const char *id, const char *public_host, const char *data_host, int64_t now);
struct instance_gang {
    int64_t rendezvous_timeout_s; /* first rank running to last, at most */
    int64_t rendezvous_since;     /* this attempt's first rank seen running, 0 none yet */
    int has_key;                  /* it has an internal key pair */
};
int store_instance_gang(struct store *s, const char *id, struct instance_gang *out);
/* Writes nothing when the timeout is so already. */
int store_instance_set_rendezvous_timeout(struct store *s, const char *id, int64_t seconds);
/* Marks when the first rank of this attempt was seen running (0: none). */
int store_instance_set_rendezvous(struct store *s, const char *id, int64_t since);
/* The instance-internal key pair: a public key line and an OpenSSH private
 * key. Only the reconciler reads it, for the agents' specs. */
struct instance_key {
    char pub[SSH_PUBKEY_MAX];   /* "ssh-ed25519 AAAA… comment", "" when none */
    char priv[SSH_PRIVKEY_MAX]; /* "-----BEGIN OPENSSH PRIVATE KEY-----…", "" when none */
};
int store_instance_set_internal_key(struct store *s, const char *id, const char *pub, const char *priv);
int store_instance_internal_key(struct store *s, const char *id, struct instance_key *out);

/* store_idempotency.c */
/* The first answer recorded for (user_id, key): STORE_NOT_FOUND if none;
 * *response is malloc'd; location is its Location header, "" if none. */
#define IDEM_LOCATION_MAX 201
int store_idempotency_get(struct store *s, const char *user_id, const char *key, char hash[65], int *status,
                          char location[IDEM_LOCATION_MAX], char **response);
int store_idempotency_put(struct store *s, const char *user_id, const char *key, const char *hash, int status,
                          const char *location, const char *response, int64_t now);

/* store_money.c: prices, the ledger, credit grants, invite codes, top-ups
 * and billing state of running intervals. */
struct price_point;
/* The price history of a GPU type, oldest first; *out malloc'd. */
int store_prices(struct store *s, const char *gpu_model, struct price_point **out, size_t *n);
int store_price_insert(struct store *s, const char *gpu_model, int64_t effective_at, int64_t card_hour, int64_t now);
/* The latest second usage of gpu_model was charged to or a settled interval
 * of it ended at (0 if none): a new price may not start before it, or it
 * would reprice what was billed. A negative store_rc on failure. */
int64_t store_price_billed_until(struct store *s, const char *gpu_model);
struct price_row {
    char gpu_model[33];   /* type */
    int64_t effective_at; /* from */
    int64_t card_hour;    /* micro-yuan per card-hour */
    int64_t created_at;   /* when set */
};
int store_price_history(struct store *s, const char *gpu_model, struct price_row *out, size_t max, size_t *n);

/* One leg of a ledger transaction. */
struct ledger_leg {
    char account_id[48];   /* 'cash:usr_…', 'grant:grt_…', 'revenue', 'promotion', 'payments' */
    int64_t amount;        /* signed micro-yuan */
    char grant_id[ID_MAX]; /* on grant legs */
};
/* What a ledger transaction is about. */
struct ledger_entry {
    int64_t at;              /* the time the movement is for */
    const char *kind;        /* usage, refund, grant, expiry, topup */
    const char *user_id;     /* whose money */
    const char *reason;      /* for statements */
    const char *instance_id; /* usage and refund, or NULL */
    int64_t interval_id;     /* usage and refund, or 0 */
    const char *grant_id;    /* grant/expiry, or NULL */
    const char *topup_id;    /* topup, or NULL */
    const char *volume_id;   /* storage, or NULL */
    const char *reservation_id; /* reservation and reservation_refund, or NULL */
    const char *app_call_id; /* app_call, or NULL (0025) */
    const char *payee_id;    /* app_call: the publisher its earning goes to, NULL if none (0039) */
};
/* Posts a balanced transaction (legs must sum to zero) and moves the cached
 * balances; STORE_CONFLICT if a user account would go below zero, and
 * STORE_ERROR (logged, naming the account) if a cached balance would
 * overflow 64 bits. */
int store_ledger_post(struct store *s, const struct ledger_entry *e, const struct ledger_leg *legs, size_t n,
                      int64_t now);
/* A ledger account's cached balance (0 if it has none yet). */
int64_t store_account_balance(struct store *s, const char *account_id);

struct grant {
    char id[ID_MAX];      /* grt_… */
    char user_id[ID_MAX]; /* whose */
    char source[48];      /* signup, invite:CODE, admin */
    int64_t amount;       /* granted */
    int64_t remaining;    /* left */
    int64_t expires_at;   /* 0: never */
    int64_t voided_at;    /* 0: not voided */
    int64_t created_at;   /* when */
};
int store_grant_insert(struct store *s, const struct grant *g);
/* Grants with money left, not expired at `at`, soonest expiry first (never
 * expiring last), at most max. */
int store_grants_spendable(struct store *s, const char *user_id, int64_t at, struct grant *out, size_t max, size_t *n);
/* One of the user's grants; STORE_NOT_FOUND if it is no grant of theirs. */
int store_grant_get(struct store *s, const char *user_id, const char *id, struct grant *out);
/* All the user's grants, newest first. */
int store_grants_of(struct store *s, const char *user_id, struct grant *out, size_t max, size_t *n);
/* Grants with money left that expired at or before `at`: the user's, or
 * (user_id NULL) those of every user with no running time left to bill. */
int store_grants_expired(struct store *s, const char *user_id, int64_t at, struct grant *out, size_t max, size_t *n);
/* Expiry times after `after` and at or before `until` of the user's grants with money left. */
int store_grant_expiries(struct store *s, const char *user_id, int64_t after, int64_t until, int64_t *out, size_t max,
                         size_t *n);
int store_grant_spend(struct store *s, const char *id, int64_t amount);
/* Gives amount back to a grant not voided (a refund of usage it paid). */
int store_grant_restore(struct store *s, const char *id, int64_t amount);
int store_grant_void(struct store *s, const char *id, int64_t at);
/* Grants voided at an expiry after `at` (a clock that ran ahead voided
 * them), at most max, each with remaining set to what the voids took. */
int store_grants_voided_early(struct store *s, int64_t at, struct grant *out, size_t max, size_t *n);
/* Makes a voided grant live again with remaining left. */
int store_grant_unvoid(struct store *s, const char *id, int64_t remaining);

struct invite_code {
    char code[33];       /* e.g. AMD6GW */
    int64_t amount;      /* credit per redemption */
    int64_t credit_days; /* 0: the credit never expires */
    int64_t expires_at;  /* 0: the code never expires */
    int64_t max_uses;    /* 0: unlimited */
    int64_t uses;        /* so far */
    int64_t created_at;  /* when */
    int64_t max_uses_per_day; /* 0: no daily cap (0021) */
};
int store_invite_get(struct store *s, const char *code, struct invite_code *out);
/* Codes made after (after_created, after_code), oldest first, at most max;
 * free *out. */
int store_invite_list(struct store *s, int64_t after_created, const char *after_code, size_t max,
                      struct invite_code **out, size_t *n);
int store_invite_insert(struct store *s, const struct invite_code *c);
/* Records a redemption and counts the use; STORE_CONFLICT if this user
 * already redeemed the code. */
int store_invite_redeem(struct store *s, const char *code, const char *user_id, const char *grant_id, int64_t at);

struct topup {
    char id[ID_MAX];      /* top_… */
    char user_id[ID_MAX]; /* whose */
    char payment_id[129]; /* the payment's own id */
    int64_t amount;       /* micro-yuan */
    char source[16];      /* admin, webhook */
    int64_t created_at;   /* when */
};
/* STORE_CONFLICT if the payment id was seen before. */
int store_topup_insert(struct store *s, const struct topup *t);
int store_topup_by_payment(struct store *s, const char *payment_id, struct topup *out);
/* One of the user's top-ups; STORE_NOT_FOUND if it is no top-up of theirs. */
int store_topup_get(struct store *s, const char *user_id, const char *id, struct topup *out);

/* A running interval as billing sees it. */
struct billable {
    int64_t id;               /* interval */
    char instance_id[ID_MAX]; /* whose */
    char user_id[ID_MAX];     /* who pays */
    char gpu_model[33];       /* at which price */
    int64_t card_count;       /* how many cards */
    int64_t started_at;       /* from */
    int64_t ended_at;         /* to; 0 while running */
    int64_t billed;           /* posted so far */
    int64_t confirmed_until;  /* open, on a node that has missed a beat: known to have run only until its
                                * last good one; -1 when nothing caps it */
};
/* The user's open interval of instance_id; STORE_NOT_FOUND if none is open. */
int store_interval_get_open(struct store *s, const char *instance_id, struct billable *out);
/* The latest interval of instance_id that funds running out ended after
 * `after`; STORE_NOT_FOUND if none did. */
int store_interval_get_cut_after(struct store *s, const char *instance_id, int64_t after, struct billable *out);
/* Who paid for an interval: each user account that its usage (less its
 * refunds) drew from, with what it still has to give back, the account drawn
 * last first. */
/* An account that paid for an interval (or a reservation) and how much,
 * net of refunds: what a refund gives back to. */
struct interval_payer {
    char account_id[48];     /* 'cash:usr_…' or 'grant:grt_…' */
    char grant_id[ID_MAX];   /* on grant accounts, else "" */
    int64_t paid;            /* net micro-yuan it paid, > 0 */
    int64_t grant_voided_at; /* grant accounts: when the grant was voided, 0 if not */
};
int store_interval_payers(struct store *s, int64_t interval_id, struct interval_payer **out, size_t *n);
/* Users with intervals not yet billed in full; *out malloc'd (n entries). */
int store_users_to_bill(struct store *s, char (**out)[ID_MAX], size_t *n);
/* Every interval of the user not yet billed in full, by id, however many:
 * a user's every unsettled interval must count, or usage goes uncharged and
 * funds look larger than they are. *out malloc'd (n entries; NULL if none). */
int store_billables(struct store *s, const char *user_id, struct billable **out, size_t *n);
/* Every unsettled interval, by user then id; *out malloc'd (n entries). */
int store_billables_all(struct store *s, struct billable **out, size_t *n);
/* What each user with unsettled intervals could spend in the second before
 * `at`, by user id; *out malloc'd (n entries). */
struct user_funds {
    char user_id[ID_MAX]; /* whose */
    int64_t cash;         /* cash balance */
    int64_t credit;       /* grants' remainders valid in the second before `at` */
    int expired_grants;   /* 1: a grant with money left expired at or before `at` */
};
int store_funds_to_bill(struct store *s, int64_t at, struct user_funds **out, size_t *n);
/* The user's cash balance and the sum of their grants with money left that
 * are valid at `at` (expiring after it). */
int store_user_funds(struct store *s, const char *user_id, int64_t at, int64_t *cash, int64_t *credit);
/* What max_balance bounds: the user's cash balance, and the sum of what is
 * left of their grants not yet voided (expired or not). */
int store_user_holdings(struct store *s, const char *user_id, int64_t *cash, int64_t *credit);
/* Records what has been posted for an interval; settled once ended and paid.
 * exhausted_at >= 0: funds ran out then, so an interval still open or ended
 * later ends there (never before its start); -1 otherwise. */
int store_interval_billed(struct store *s, int64_t id, int64_t billed, int settled, int64_t exhausted_at);

/* store_batch.c: a batch of users billed together, read and posted in a few
 * set-based statements each rather than a dozen per user (issue 15). */
struct billing_batch {
    struct billable *intervals;         /* unsettled, by user then id */
    size_t n_intervals;
    struct storage_billable *volumes;   /* unsettled, by user then age (none while storage is free) */
    size_t n_volumes;
    struct user_funds *funds;           /* one per user, by user, as store_funds_to_bill but with credit 0:
                                         * grants below hold it */
    size_t n_funds;
    struct grant *grants;               /* spendable in the second before `at`: by user, then in the
                                         * order charges draw them (store_grants_spendable) */
    size_t n_grants;
};
/* Reads what the users (sorted, distinct) owe and hold at `at`. */
int store_billing_batch_read(struct store *s, char (*users)[ID_MAX], size_t n, int64_t at, struct billing_batch *out);
void store_billing_batch_free(struct billing_batch *b);
/* A batch of charges: each entry's legs (legs[first_leg[i] .. first_leg[i + 1]))
 * draw on the user's grants and cash and pay the platform, and each grant leg
 * spends that much of its grant; with what each interval and volume has now
 * been billed. */
struct billed_interval {
    int64_t id;     /* interval */
    int64_t billed; /* posted for it in all */
    int settled;    /* ended and paid */
};
struct billed_volume {
    const char *volume_id;
    int64_t billed;    /* posted for it in all */
    int64_t billed_to; /* second of this charge, 0 if none */
    int settled;       /* deleted and paid */
};
struct charge_batch {
    const struct ledger_entry *entries;
    const size_t *first_leg; /* n_entries + 1 offsets into legs */
    size_t n_entries;
    const struct ledger_leg *legs;
    const struct billed_interval *intervals;
    size_t n_intervals;
    const struct billed_volume *volumes;
    size_t n_volumes;
};
/* Posts the batch at `now`: STORE_OK, or an error (nothing of the batch may
 * be kept: the caller's transaction must roll back) when any row is not as
 * the batch expects, a user account would go below zero or a balance would
 * overflow. */
int store_charge_batch_post(struct store *s, const struct charge_batch *b, int64_t now);

/* store_money_reports.c: what users read about their money. */
struct ledger_txn_row {
    int64_t id;               /* transaction */
    int64_t at;               /* for when */
    char kind[24];            /* usage, grant, expiry, topup, ..., reservation_refund (18) */
    char reason[256];         /* sentence */
    char instance_id[ID_MAX]; /* usage: instance, else "" */
    char volume_id[ID_MAX];   /* storage: volume, else "" */
    int64_t user_delta;       /* net change of the user's funds */
    int64_t credit_delta;     /* of which grants */
    int64_t cash_delta;       /* of which cash */
};
struct ledger_txn_filter {
    const char *user_id; /* whose */
    const char *kind;    /* or NULL */
    int64_t from, to;    /* at in [from, to) */
    int64_t after_id;    /* cursor: last id seen (0: start) */
};
int store_ledger_transactions(struct store *s, const struct ledger_txn_filter *f, struct ledger_txn_row *out,
                              size_t max, size_t *n);
struct usage_row {
    char key[ID_MAX];     /* instance id or GPU type */
    char gpu_model[33];   /* type */
    int64_t card_seconds; /* cards × seconds run within the period */
    int64_t cost;         /* usage charged within the period */
    int64_t from_credit;  /* of which paid by grants */
    int64_t from_cash;    /* of which paid by cash */
};
/* Usage of user_id in [from, to) grouped by instance (by_type 0) or GPU
 * type (1); open intervals count up to now. */
int store_usage(struct store *s, const char *user_id, int64_t from, int64_t to, int64_t now, int by_type,
                struct usage_row *out, size_t max, size_t *n);
/* The user's funds (cash + unvoided grant remainders) as the ledger stood
 * just before `at`. */
int64_t store_user_funds_before(struct store *s, const char *user_id, int64_t at);
/* Burn per hour of the user's running instances at the given time: the sum
 * of price × cards of open intervals (micro-yuan per hour). */
int64_t store_user_burn_rate(struct store *s, const char *user_id, int64_t at);

/* store_metrics.c: counts for /metrics and the ledger's totals. */
struct metric_row {
    char a[33];    /* first label (a state) */
    char b[33];    /* second label (a GPU type) */
    int64_t value; /* count */
};
int store_metrics_nodes(struct store *s, struct metric_row **out, size_t *n);
int store_metrics_instances(struct store *s, struct metric_row **out, size_t *n);
struct money_totals {
    int64_t revenue;            /* usage charged, all time (before refunds) */
    int64_t refunds;            /* usage charged and given back: time that turned out not to have run */
    int64_t credits_refunded;   /* of which went back to grants (credit spent less this is credit used) */
    int64_t credits_granted;    /* credit granted, all time */
    int64_t credits_spent;      /* credit spent on usage */
    int64_t credits_expired;    /* credit voided at expiry */
    int64_t topups;             /* cash added */
    int64_t credit_outstanding; /* credit not yet spent or voided */
    int64_t cash_held;          /* users' cash not yet spent */
    int64_t storage_revenue;    /* storage charged, all time (0020; not in revenue) */
    int64_t storage_credits_spent; /* credit spent on storage (not in credits_spent) */
    int64_t reservation_revenue;          /* reservations paid, all time (0024; not in revenue) */
    int64_t reservation_refunds;          /* of which given back on cancelling */
    int64_t reservation_credits_spent;    /* credit spent on reservations */
    int64_t reservation_credits_refunded; /* of which went back to grants */
};
int store_metrics_money(struct store *s, struct money_totals *out);

/* store_audit.c: what admins did with money (admin_actions). */
#define AUDIT_REASON_MAX 500 /* characters in an admin's reason */
struct admin_action {
    int64_t id;                 /* order; set by the store */
    int64_t at;                 /* epoch seconds on the daemon's clock */
    char admin_user_id[ID_MAX]; /* the admin who made the request */
    char api_key_id[ID_MAX];    /* the API key it came with */
    char action[16];            /* grant, topup, invite_code, price, limits, billing_run */
    char target[64];            /* the user id, GPU type or invite code acted on; "" for none */
    int64_t amount;             /* micro-yuan granted, topped up, per redemption or per card-hour; -1 for none */
    char detail[1024];          /* the request's effective values, a JSON object */
    char reason[4 * AUDIT_REASON_MAX + 1]; /* the admin's reason (UTF-8), "" when none was given */
};
/* Adds a row (a->id is ignored) in the caller's transaction. */
int store_admin_action_insert(struct store *s, const struct admin_action *a);
struct admin_action_filter {
    const char *action;        /* or NULL for any */
    const char *target;        /* or NULL for any */
    const char *admin_user_id; /* or NULL for any */
    int64_t before_id;         /* cursor: only rows older (smaller id) than this */
};
/* Rows matching f, newest first, at most max. */
int store_admin_actions(struct store *s, const struct admin_action_filter *f, struct admin_action *out, size_t max,
                        size_t *n);

/* store_storage.c: storage billing (0020): prices per GB-month, global
 * (region "") or per region, each volume's billing state, statement lines. */
/* The storage price history of region ("" global), oldest first; *out
 * malloc'd; card_hour holds micro-yuan per GB-month. */
int store_storage_prices(struct store *s, const char *region, struct price_point **out, size_t *n);
int store_storage_price_insert(struct store *s, const char *region, int64_t effective_at, int64_t gb_month,
                               int64_t now);
struct storage_price_row {
    char region[64];      /* "" global */
    int64_t effective_at; /* from */
    int64_t gb_month;     /* micro-yuan per GB-month */
    int64_t created_at;   /* when set */
};
/* region NULL: every region's. */
int store_storage_price_history(struct store *s, const char *region, struct storage_price_row *out, size_t max,
                                size_t *n);
/* The latest second storage was charged to, of the region's volumes (of
 * every volume for region ""): a new price may not start before it. */
int64_t store_storage_billed_until(struct store *s, const char *region);
/* A volume whose storage is not yet charged in full. */
struct storage_billable {
    char volume_id[ID_MAX]; /* vol_… */
    char user_id[ID_MAX];   /* who pays */
    char name[64];          /* for ledger reasons */
    char region[64];        /* whose price; "" global */
    int64_t size_gb;        /* GB billed */
    int64_t created_at;     /* from */
    int64_t deleted_at;     /* to; 0 while it exists */
    int64_t billed;         /* posted so far */
    int64_t billed_to;      /* second of the last charge */
};
/* The user's volumes not yet settled (none while no storage price above 0
 * exists), oldest first; *out malloc'd. */
int store_storage_billables(struct store *s, const char *user_id, struct storage_billable **out, size_t *n);
/* Every user's, by user then age. */
int store_storage_billables_all(struct store *s, struct storage_billable **out, size_t *n);
/* Records what was charged (billed), up to when (billed_to, kept as the
 * latest), and whether it is settled. */
int store_storage_billed(struct store *s, const char *volume_id, int64_t billed, int64_t billed_to, int settled);
/* 1 if region is a live node's region or has a storage price, 0 if not,
 * a negative store_rc on failure. */
int store_region_known(struct store *s, const char *region);
/* A statement's storage line: what a volume was charged in a period. */
struct storage_line {
    char volume_id[ID_MAX];
    char name[64];
    char region[64];
    int64_t size_gb;
    int64_t cost, from_credit, from_cash; /* micro-yuan */
};
int store_storage_lines(struct store *s, const char *user_id, int64_t from, int64_t to, struct storage_line *out,
                        size_t max, size_t *n);

/* store_verify.c: the ledger's invariants as queries over the raw rows, for
 * the auditor (audit/ledger_verify.c). */
/* Called once per breach of a rule (what): id and detail name the row (id
 * "" for a breach of the whole ledger). With id NULL, detail says why the
 * rule could not be checked. */
typedef void (*store_breach_fn)(void *ctx, const char *what, const char *id, const char *detail);
/* Runs every rule; the number of breaches, or -1 if a rule could not run. */
int store_verify_rules(struct store *s, store_breach_fn fn, void *ctx);
/* A billed or settled interval as stored. */
struct charged_interval {
    int64_t id;          /* interval */
    char gpu_model[33];  /* at which prices */
    int64_t card_count;  /* cards */
    int64_t started_at;  /* from */
    int64_t ended_at;    /* to; 0 while open */
    int64_t billed;      /* what was charged, net of refunds */
    int settled;         /* billed in full */
    int64_t last_charge; /* the latest `at` of its usage transactions, 0 if none */
};
/* Calls fn for every interval that is settled (and ended) or has anything
 * billed, by GPU type then id; a non-zero return stops with STORE_ERROR. */
int store_charged_intervals(struct store *s, int (*fn)(void *ctx, const struct charged_interval *iv), void *ctx);
/* A volume's storage billing as stored (0020). */
struct volume_charge {
    char volume_id[ID_MAX];
    char region[64];
    int64_t size_gb;
    int64_t created_at;
    int64_t deleted_at;  /* 0 while it exists */
    int64_t billed;      /* storage_billed */
    int64_t last_charge; /* the latest `at` of its storage transactions, 0 if none */
    int settled;         /* storage_settled */
};
/* Calls fn for every volume that has storage charged or is settled, by
 * region then id; a non-zero return stops with STORE_ERROR. */
int store_volume_charges(struct store *s, int (*fn)(void *ctx, const struct volume_charge *vc), void *ctx);

/* store_resets.c: password reset codes, one live per account, and the
 * account's security record (migration 0050). */
struct password_reset {
    char code_hash[65];  /* sha256_hex of the code */
    int64_t created_at;  /* epoch seconds it was asked for */
    int64_t expires_at;  /* epoch seconds; refused from then on */
    int64_t failures;    /* wrong codes tried since */
};
/* Puts user_id's code, replacing any earlier one (and its failures). */
int store_reset_put(struct store *s, const char *user_id, const char *code_hash, int64_t at, int64_t expires_at,
                    const char *from);
/* STORE_NOT_FOUND when the account has no code. */
int store_reset_get(struct store *s, const char *user_id, struct password_reset *out);
/* Counts a wrong try at user_id's code. */
int store_reset_fail(struct store *s, const char *user_id);
/* Deletes user_id's code (used or worn out); STORE_NOT_FOUND when none. */
int store_reset_delete(struct store *s, const char *user_id);
/* Adds one account_events row; detail is a JSON object's text. */
int store_account_event_insert(struct store *s, int64_t at, const char *user_id, const char *event, const char *from,
                               const char *detail);

/* store_signup.c: e-mail verification codes, the outbox, sign-up lists,
 * suspension and invite codes' per-day caps (migration 0021). */
struct email_verification {
    char user_id[ID_MAX]; /* whose */
    int64_t expires_at;   /* epoch seconds */
    int64_t used_at;      /* 0 while unused */
};
/* token_hash is sha256_hex of the code. */
int store_verification_insert(struct store *s, const char *token_hash, const char *user_id, int64_t at,
                              int64_t expires_at);
int store_verification_get(struct store *s, const char *token_hash, struct email_verification *out);
int store_verification_use(struct store *s, const char *token_hash, int64_t at);
int store_user_set_verified(struct store *s, const char *user_id, int64_t at);
/* Marks the trial had; STORE_CONFLICT when the account already had it. */
int store_user_set_trial(struct store *s, const char *user_id, int64_t at);
int store_user_set_active(struct store *s, const char *user_id, int active);
/* Ids of user_id's instances whose desired state is running (malloc'd
 * ID_MAX-byte rows, *n of them). */
int store_user_running_instances(struct store *s, const char *user_id, char (**ids)[ID_MAX], size_t *n);
/* Recent sign-ups (users with a signup_address), newest first; address
 * NULL for all. *out malloc'd. */
int store_signups_list(struct store *s, const char *address, size_t limit, struct user **out, size_t *n);
struct outbox_mail {
    int64_t id;
    char to[256];
    char subject[201];
    char *body; /* malloc'd */
    int64_t attempts;
};
int store_outbox_insert(struct store *s, const char *user_id, const char *to, const char *subject, const char *body,
                        int64_t at);
/* The oldest mail due at now; STORE_NOT_FOUND when none. */
int store_outbox_next(struct store *s, int64_t now, struct outbox_mail *out);
int store_outbox_sent(struct store *s, int64_t id, int64_t at);
/* Counts a failed try: next try at next_at, or given up (failed) when 1. */
int store_outbox_retry(struct store *s, int64_t id, int64_t next_at, int failed, int64_t at, const char *error);
/* Mail not yet sent nor given up, for /metrics; negative store_rc on error. */
int64_t store_outbox_pending(struct store *s);
/* An invite code's per-day cap (0: none). */
int store_invite_day_cap(struct store *s, const char *code, int64_t *cap);
int store_invite_set_day_cap(struct store *s, const char *code, int64_t cap);
/* Whether user_id redeemed code: *n 1 or 0. */
int store_invite_redeemed(struct store *s, const char *code, const char *user_id, int64_t *n);
/* Redemptions of code at or after since. */
int store_invite_uses_since(struct store *s, const char *code, int64_t since, int64_t *n);

/* store_apps.c: the app marketplace (migration 0025): apps, who may call a
 * private one, replicas (instances with app_id), calls reported by the
 * gateways, their demand and the apps' events. Lists and documents are
 * handed up as JSON text (malloc'd) built by SQLite's JSON functions. */
struct app {
    char id[ID_MAX];           /* app_… */
    char slug[41];             /* in URLs */
    char name[81];             /* label */
    char description[2001];    /* marketplace text */
    char publisher_id[ID_MAX]; /* owner */
    char image[256];           /* image id or ref */
    char *command;             /* JSON array text (malloc'd by reads; store_app_free) */
    char *env;                 /* JSON array text, secrets included (malloc'd) */
    int64_t port;              /* replica's HTTP port */
    char gpu_type[33];         /* card model */
    int64_t cards_per_replica, min_replicas, max_replicas, concurrency_target, idle_seconds;
    char visibility[8];        /* public, private */
    int64_t price_request, price_input_1k, price_output_1k, price_second; /* micro-yuan */
    int64_t rate_per_key, rate_per_app; /* calls a minute; 0 none */
    int64_t desired_replicas, last_call_at, below_since;
    int64_t created_at, updated_at, deleted_at; /* deleted_at 0: live */
    char health_path[256];     /* GET by the agent on port to check a replica (0027); "" reads as "/health" */
};
void store_app_free(struct app *a);
int store_app_insert(struct store *s, const struct app *a);
/* How many live (not deleted) apps user_id publishes; negative store_rc on
 * failure. */
int64_t store_app_count_by_publisher(struct store *s, const char *user_id);
/* Writes every changeable column of a (by id). */
int store_app_update(struct store *s, const struct app *a);
/* A live app by slug; STORE_NOT_FOUND for none or a deleted one. */
int store_app_get(struct store *s, const char *slug, struct app *out);
/* Any app by id, a deleted one too (its late calls are still settled). */
int store_app_get_by_id(struct store *s, const char *id, struct app *out);
/* Live apps: public ones (publisher_id NULL) or one publisher's, by
 * (created_at, id) after the cursor; *out malloc'd (store_app_free each). */
int store_app_list(struct store *s, const char *publisher_id, int64_t after_t, const char *after_id, size_t max,
                   struct app **out, size_t *n);
/* Every live app, for the scaler. */
int store_app_all(struct store *s, struct app **out, size_t *n);
int store_app_delete(struct store *s, const char *id, int64_t at);
/* Replaces who may call a private app (user ids; checked by the caller). */
int store_app_access_clear(struct store *s, const char *app_id);
int store_app_access_add(struct store *s, const char *app_id, const char *user_id);
/* The user ids as a JSON array (malloc'd text). */
int store_app_access_json(struct store *s, const char *app_id, char **json);
int store_app_event(struct store *s, const char *app_id, int64_t at, const char *kind, const char *detail);
/* Whether the app's latest event is of kind and at or after since: 1, 0,
 * or a negative store_rc. */
int store_app_last_event_is(struct store *s, const char *app_id, const char *kind, int64_t since);
/* The app's latest events, newest last, as a JSON array (malloc'd). */
int store_app_events_json(struct store *s, const char *app_id, size_t max, char **json);
/* The app's replicas that are not terminated (instance ids and states). */
struct app_replica {
    char instance_id[ID_MAX];
    char state[16];   /* pending … */
    char desired[16]; /* running, stopped, terminated */
    int64_t created_at;
    char health[16];  /* rank 0's health check as its agent last reported it (0027); "" none yet */
};
int store_app_replicas(struct store *s, const char *app_id, struct app_replica **out, size_t *n);
int store_instance_set_app(struct store *s, const char *instance_id, const char *app_id);
/* What a gateway needs, as JSON text (malloc'd): {"apps": [...], "keys":
 * [...]} (see api_apps.c for the shape). Replica addresses are given as the
 * node's public_host, agent_url and published host port; the caller
 * resolves them. */
int store_gateway_apps_json(struct store *s, char **json);
int store_gateway_keys_json(struct store *s, int64_t now, char **json);
/* Calls of rate-limited apps that started at or after since, as JSON text:
 * [{"app_id", "key_id", "gateway_id", "minute" (at / 60), "calls"}]. */
int store_gateway_recent_calls_json(struct store *s, int64_t since, char **json);
/* Users holding a live API key, for their funds in the gateway state. */
int store_gateway_key_users(struct store *s, char (**ids)[ID_MAX], size_t *n);
/* A gateway's report numbered seq of its run was committed (0047), in the
 * report's transaction: the row keeps the run's highest (a slow report may
 * commit after a later one), and rows older than `forget_before` go. */
int store_gateway_report_put(struct store *s, const char *gateway_id, const char *run, int64_t seq, int64_t at,
                             int64_t forget_before);
/* The gateways' last committed reports since `since`, as JSON text:
 * [{"gateway_id", "run", "seq"}]. */
int store_gateway_reported_json(struct store *s, int64_t since, char **json);
/* A usage record. */
struct app_call {
    char id[65];
    char app_id[ID_MAX];
    char consumer_id[ID_MAX];
    char key_id[ID_MAX];
    char gateway_id[65];
    int64_t at, status, input_tokens, output_tokens, duration_ms, cold_start, completed;
    int has_prices; /* the gateway stamped the prices it admitted the call at: */
    int64_t price_request, price_input_1k, price_output_1k, price_second; /* micro-yuan */
    int64_t charge, earning, fee, unpaid, transaction_id;
};
/* STORE_CONFLICT when a call with that id is recorded already; its
 * transaction_id is found by the app_call_id the ledger posting named. */
int store_app_call_insert(struct store *s, const struct app_call *c, int64_t now);
int store_app_call_exists(struct store *s, const char *id);
int store_app_demand_put(struct store *s, const char *app_id, const char *gateway_id, int64_t in_flight,
                         int64_t queued, const char *busy, int64_t at);
/* Whether a gateway reported since `since` that instance_id has calls in
 * flight (the scaler then removes another replica, or waits): 1, 0 or a
 * negative store_rc. */
int store_app_replica_busy(struct store *s, const char *app_id, const char *instance_id, int64_t since);
/* The health check of an app replica (0027): its app's id, port and
 * health_path. STORE_NOT_FOUND for an instance of no app. */
int store_instance_app_check(struct store *s, const char *instance_id, char *app_id, size_t app_id_len,
                             int64_t *port, char *path, size_t path_len);
/* In flight plus queued over the gateways that reported since `since`. */
int64_t store_app_demand(struct store *s, const char *app_id, int64_t since);
/* Per-day stats of an app for its publisher, as a JSON array (malloc'd). */
int store_app_stats_json(struct store *s, const char *app_id, int64_t from, int64_t to, char **json);
/* A consumer's app calls per app in [from, to), as a JSON array (malloc'd). */
int store_app_usage_json(struct store *s, const char *consumer_id, int64_t from, int64_t to, char **json);

/* store_reports.c: the report views and online backups. */
/* The i-th report's name ("daily-revenue" …), or NULL past the last. */
const char *store_report_name(size_t i);
/* Called first with values NULL (the header), then once per row; values[c]
 * may be NULL; is_int[c] says whether the value is an integer. */
typedef void (*store_report_row_fn)(void *ctx, int n, const char *const *names, const char *const *values,
                                    const int *is_int);
/* Runs report name for days in [from_day, to_day) (either may be NULL).
 * STORE_NOT_FOUND for an unknown report. */
int store_report(struct store *s, const char *name, const char *from_day, const char *to_day, store_report_row_fn row,
                 void *ctx);
/* Copies the database to dest with SQLite's online backup: a consistent
 * snapshot while the daemon keeps writing; dest appears only when complete. */
int store_backup(struct store *s, const char *dest, char *err, size_t errlen);

/* store_reservations.c: capacity blocks (migration 0024). */
struct reservation {
    char id[ID_MAX];       /* rsv_… */
    char user_id[ID_MAX];  /* holder */
    char gpu_model[33];    /* which cards */
    char fabric[64];       /* multi-node blocks: the fabric of its whole nodes; "" otherwise */
    int64_t card_count;    /* cards every hour */
    int64_t starts_at;     /* whole hour */
    int64_t ends_at;       /* whole hour, exclusive */
    char state[16];        /* booked or cancelled */
    int64_t card_hour;     /* price it was sold at */
    int64_t amount;        /* paid */
    int64_t refunded;      /* given back on cancelling */
    int64_t credited;      /* granted back for lost hours */
    int64_t cancelled_at;  /* 0: not cancelled */
    int64_t warned_at;     /* 0: not warned */
    int64_t closed_at;     /* 0: its end not processed yet */
    int64_t created_at;    /* booking time */
};
int store_reservation_insert(struct store *s, const struct reservation *r);
/* user_id NULL: anyone's. STORE_NOT_FOUND when there is none (or not theirs). */
int store_reservation_get(struct store *s, const char *user_id, const char *id, struct reservation *out);
/* Which of a user's reservations a list shows. */
struct reservation_filter {
    const char *user_id;   /* whose */
    const char *gpu_model; /* only this type; NULL: any */
    const char *state;     /* only those showing this state at now; NULL: any */
    int64_t now;           /* when states are judged */
    int64_t after_created; /* the cursor: after (after_created, after_id) when >= 0 */
    const char *after_id;
};
/* The user's reservations the filter picks, newest first; up to max. */
int store_reservation_list(struct store *s, const struct reservation_filter *f, struct reservation *out, size_t max,
                           size_t *n);
/* Booked reservations of gpu_model overlapping [from, to) (malloc'd). */
int store_reservations_overlapping(struct store *s, const char *gpu_model, int64_t from, int64_t to,
                                   struct reservation **out, size_t *n);
/* The user's booked reservations of any type overlapping [from, to)
 * (malloc'd). */
int store_user_reservations_overlapping(struct store *s, const char *user_id, int64_t from, int64_t to,
                                        struct reservation **out, size_t *n);
/* Booked reservations not yet closed that have something due at now: the
 * end passed, or the warning (warn_s before the end) not yet given. */
int store_reservations_due(struct store *s, int64_t now, int64_t warn_s, struct reservation **out, size_t *n);
/* Booked reservations in their window at now (malloc'd), by type then
 * booking time, newest last. */
int store_reservations_active(struct store *s, int64_t now, struct reservation **out, size_t *n);
int store_reservation_cancel(struct store *s, const char *id, int64_t refunded, int64_t at);
int store_reservation_set_warned(struct store *s, const char *id, int64_t at);
int store_reservation_set_closed(struct store *s, const char *id, int64_t at);
/* The reserved pool of gpu_model that can be sold: healthy cards on nodes
 * that are up and active, and per fabric its whole 8-card nodes. */
struct reserved_fabric {
    char fabric[64];
    int64_t whole_nodes;
};
#define RESERVED_FABRICS_MAX 64
int store_reserved_capacity(struct store *s, const char *gpu_model, int64_t *cards, struct reserved_fabric *fabrics,
                            size_t *n_fabrics);
/* The reserved pool's cards usable now (healthy, on nodes that are up) and
 * a node whose failure takes cards away ("" if none). */
int store_reserved_usable(struct store *s, const char *gpu_model, int64_t *cards, char failed_node[ID_MAX]);
/* The optional reservation price of a type: STORE_NOT_FOUND when none is set. */
int store_reservation_price(struct store *s, const char *gpu_model, int64_t *card_hour);
int store_reservation_price_set(struct store *s, const char *gpu_model, int64_t card_hour, int64_t at);
/* Cards held now by the reservation's instances, except instance except_id. */
int64_t store_reservation_cards_held(struct store *s, const char *reservation_id, const char *except_id);
/* Cards of node_id the reservation's instances hold now: *held all of
 * them, *healthy those not reported failed. */
int store_reservation_cards_on_node(struct store *s, const char *reservation_id, const char *node_id, int64_t *held,
                                    int64_t *healthy);
/* Ids of the reservation's instances that want to run or hold cards (malloc'd). */
int store_reservation_instances(struct store *s, const char *reservation_id, char (**ids)[ID_MAX], size_t *n);
/* The instance's reservation ("" for on-demand). */
int store_instance_reservation(struct store *s, const char *instance_id, char out[ID_MAX]);
int store_instance_set_reservation(struct store *s, const char *instance_id, const char *reservation_id);
/* The user legs of the reservation's payment, the last drawn first, net of
 * what was given back already: account, grant and what remains paid (>0),
 * and whether that grant was voided since. */
/* Who paid for the block, as for an interval (struct interval_payer). */
int store_reservation_payers(struct store *s, const char *reservation_id, struct interval_payer **out, size_t *n);
/* The credit recorded for the reservation's hour (0, 0 when none). */
int store_reservation_credit_get(struct store *s, const char *reservation_id, int64_t hour, int64_t *cards,
                                 int64_t *amount);
int store_reservation_credit_put(struct store *s, const char *reservation_id, int64_t hour, int64_t cards,
                                 const char *node_id, int64_t amount, const char *grant_id, int64_t at);
int store_reservation_add_credited(struct store *s, const char *id, int64_t amount);
/* Calls fn for every reservation, by id (ledger verify); a non-zero
 * return stops with STORE_ERROR. */
int store_reservation_each(struct store *s, int (*fn)(void *ctx, const struct reservation *r), void *ctx);
/* Blocks bound to nodes (0028). A reserved node a block can be bound to:
 * up, active, in the reserved pool; by fabric then name. */
struct reserved_node {
    char id[ID_MAX];
    char fabric[64];
    int64_t card_count; /* cards the node has */
    int64_t healthy;    /* of which healthy */
};
int store_reserved_nodes(struct store *s, const char *gpu_model, struct reserved_node **out, size_t *n);
/* One row of reservation_nodes with its block's window. */
struct reservation_binding {
    char reservation_id[ID_MAX];
    char node_id[ID_MAX];
    int64_t cards;      /* cards of the node it holds every hour */
    int64_t starts_at;  /* the block's window */
    int64_t ends_at;
    int64_t created_at; /* the block's booking time */
    int64_t bound_at;   /* when it was bound to this node (booking or re-homing) */
};
/* Bindings of booked blocks of gpu_model overlapping [from, to), by node (malloc'd). */
int store_reservation_bindings_overlapping(struct store *s, const char *gpu_model, int64_t from, int64_t to,
                                           struct reservation_binding **out, size_t *n);
/* One block's bindings (none: booked before 0028 and not bound yet). */
int store_reservation_bindings(struct store *s, const char *reservation_id, struct reservation_binding **out,
                               size_t *n);
/* The bindings on node_id of booked blocks that end after `after`, newest booking first (malloc'd). */
int store_node_bindings(struct store *s, const char *node_id, int64_t after, struct reservation_binding **out,
                        size_t *n);
int store_reservation_bind(struct store *s, const char *reservation_id, const char *node_id, int64_t cards,
                           int64_t at);
/* Moves the block's binding from old_node to new_node (re-homing). */
int store_reservation_rebind(struct store *s, const char *reservation_id, const char *old_node, const char *new_node,
                             int64_t at);
/* Booked blocks bound to node_id that end after `after`, newest booking first (malloc'd). */
int store_node_reservations(struct store *s, const char *node_id, int64_t after, struct reservation **out, size_t *n);
/* Booked blocks without nodes that end after `after`, oldest first (booked before 0028). */
int store_reservations_unbound(struct store *s, int64_t after, struct reservation **out, size_t *n);
/* Cards a bound node can give now: its healthy cards while up and not
 * removed, else 0 (a negative store_rc on failure); *active whether it is
 * still in service (not removed, admin state active), *up whether it
 * answers (not removed, health up: an unreachable one still counts). */
int64_t store_node_usable_cards(struct store *s, const char *node_id, int *active, int *up);
/* Placement candidates of an instance inside a bound block: only its
 * nodes, each offering at most the block's cards there less what its other
 * instances hold on it; otherwise as store_placement_candidates_pool. */
int store_placement_candidates_bound(struct store *s, const char *gpu_model, int64_t ports,
                                     const char *reservation_id, const char *instance_id,
                                     struct placement_node **out, size_t *n);
/* Sets a node's pool; STORE_CONFLICT while it has cards in use. */
int store_node_set_pool(struct store *s, const char *id, const char *pool, int64_t now);
/* A node's healthy cards (a negative store_rc on failure). */
int64_t store_node_healthy_cards(struct store *s, const char *id);
/* A node's pool ("on_demand" or "reserved"). */
int store_node_pool(struct store *s, const char *id, char out[16]);
/* node_id alone, when it is a candidate of pool with `cards` free cards
 * (and `ports` free host ports): *n is 1 or 0; *out is malloc'd (caller
 * frees). */
int store_placement_candidate_node(struct store *s, const char *gpu_model, int64_t cards, int64_t ports,
                                   const char *pool, const char *node_id, struct placement_node **out, size_t *n);
/* Placement candidates of one pool ("on_demand" or "reserved"); otherwise
 * as store_placement_candidates_ports. */
int store_placement_candidates_pool(struct store *s, const char *gpu_model, int64_t cards, int64_t ports,
                                    const char *pool, struct placement_node **out, size_t *n);

#endif
