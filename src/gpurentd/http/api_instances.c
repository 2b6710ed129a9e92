/* api_instances.c: /v1/instances — rent cards (create), list, show, change
 * what a stopped one runs (PATCH), start, stop, terminate, and read an
 * instance's events. Each change is one transaction (instances.c), queued
 * for the committer while the connection waits without a thread; the
 * reconciler is woken to drive the agents. */
#include "domain/placement.h"
#include "gpurent/clock.h"
#include "gpurent/jsonx.h"
#include "http/api.h"
#include "store/store.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INSTANCES_PAGE_MAX 100
#define EVENTS_PAGE_MAX 500

/* Replies with the refusal an operation decided. */
static void reply_outcome(struct http_request *req, struct op_outcome *o)
{
    json_t *extra = o->extra;
    o->extra = NULL;
    http_error_ext(req, o->error, o->field[0] ? o->field : NULL, extra, "%s", o->message);
}

/* Replies after a transaction: the refusal, or a generic failure. */
static void reply_failure(struct http_request *req, int rc, struct op_outcome *o)
{
    if (o->failed)
        reply_outcome(req, o);
    else if (rc == STORE_CONFLICT)
        http_error(req, ERR_CONFLICT, NULL, "a concurrent request changed this; retry");
    else
        http_error(req, ERR_INTERNAL, NULL, NULL);
}

struct create_ctx {
    struct instance_create in;      /* the request */
    const struct http_request *req; /* for idempotency records */
    struct idempotency *idem;       /* the key */
    struct op_outcome o;            /* refusal, if any */
    char id[ID_MAX];                /* the new instance */
    struct funds_seen funds;        /* the owner's, as its funds check read them */
    struct instance_view *view;     /* the new instance as the reply shows it, read in its transaction */
    char *body;                     /* the answer (malloc'd): a twin's, or made in the transaction for a retry */
    int replayed;                   /* 0, or the status of a twin's stored answer in body */
};

/* A twin request with the same key may have committed between
 * idempotency_begin and this transaction (a client retrying while its first
 * try is in flight). Writers are serialised, so looking again here sees it:
 * replay its answer rather than create a second instance or, worse, report
 * that the twin took the last cards. Returns 1 when answered. */
static int twin_answered(struct store *s, struct create_ctx *ctx, int *rc)
{
    int status = 0;
    int twin = idempotency_twin(s, ctx->req, ctx->idem, &status, &ctx->body);
    *rc = twin < 0 ? twin : STORE_OK;
    if (twin == IDEM_REUSED) {
        ctx->o.failed = 1;
        ctx->o.error = ERR_IDEMPOTENCY_KEY_REUSED;
        snprintf(ctx->o.field, sizeof ctx->o.field, "Idempotency-Key");
        snprintf(ctx->o.message, sizeof ctx->o.message, "this Idempotency-Key was used for another request");
        *rc = REFUSED;
    }
    if (twin == IDEM_REPLAY)
        ctx->replayed = status;
    return twin != IDEM_NONE;
}

/* The reply's text from the instance's view (malloc'd), or NULL. */
static char *view_text(const struct instance_view *v)
{
    json_t *j = instance_view_json(v);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return text;
}

static int create_txn(struct store *s, void *vctx)
{
    struct create_ctx *ctx = vctx;
    instance_view_free(ctx->view);
    ctx->view = NULL;
    free(ctx->body);
    ctx->body = NULL;
    ctx->replayed = 0;
    json_decref(ctx->o.extra);
    memset(&ctx->o, 0, sizeof ctx->o);
    int rc;
    if (twin_answered(s, ctx, &rc))
        return rc;
    rc = instance_create(s, &ctx->in, ctx->id, &ctx->funds, &ctx->o);
    if (rc != STORE_OK)
        return rc;
    struct instance created;
    if ((rc = store_instance_get(s, NULL, ctx->id, &created)) != STORE_OK)
        return rc;
    /* The reply reads what the create just wrote (its nodes, keys, ports)
     * and the owner's burn: here, on the writer's warm cache, that costs a
     * fraction of what it does on an HTTP thread after the commit, whose
     * reader's cache every commit empties (BENCHMARKS.md, "A create's reply
     * read in its transaction"). The JSON is made after the commit, off the
     * writers' turn, unless it must be kept for a retry with the same key. */
    if ((rc = instance_view_read(s, &created, &ctx->funds, &ctx->view)) != STORE_OK)
        return rc;
    if (!ctx->idem->key[0])
        return STORE_OK;
    if (!(ctx->body = view_text(ctx->view)))
        return STORE_ERROR;
    snprintf(ctx->idem->location, sizeof ctx->idem->location, "/v1/instances/%s", ctx->id);
    return idempotency_record(s, ctx->req, ctx->idem, 201, ctx->body);
}

/* A create waiting for its commit (store_txn_async) while its connection
 * is suspended: what the request and its transaction need until the reply. */
struct create_job {
    struct create_ctx ctx; /* first: the job is create_txn's context too */
    struct http_request *req;
    struct idempotency idem;
    json_t *body, *env; /* ctx.in points into them */
    int rc;             /* the transaction's result */
};

static void create_job_free(struct create_job *job)
{
    json_decref(job->ctx.o.extra);
    instance_view_free(job->ctx.view);
    free(job->ctx.body);
    json_decref(job->env);
    json_decref(job->body);
    free(job);
}

/* Replies on a pool thread once the create committed or failed; connected
 * is 0 if the client left meanwhile (the instance stands all the same). */
static void create_reply(struct http_request *req, void *vjob, int connected)
{
    struct create_job *job = vjob;
    struct create_ctx *ctx = &job->ctx;
    if (job->rc == STORE_OK && !ctx->replayed) {
        log_info("instances: %s created %s: %lld x %s", req->user_id, ctx->id, (long long)ctx->in.card_count,
                 ctx->in.gpu_type);
        reconciler_wake();
    }
    if (!connected) {
        create_job_free(job);
        return;
    }
    if (job->rc == STORE_OK && ctx->replayed) {
        idempotency_replay(req, ctx->idem, ctx->replayed, ctx->body);
    } else if (job->rc == STORE_OK) {
        if (!ctx->body)
            ctx->body = view_text(ctx->view);
        char location[64];
        snprintf(location, sizeof location, "/v1/instances/%s", ctx->id);
        http_add_header(req, "Location", location);
        if (ctx->body)
            http_reply_raw(req, 201, "application/json", ctx->body, strlen(ctx->body));
        else /* created all the same: the client finds it in the list */
            http_error(req, ERR_INTERNAL, NULL, NULL);
    } else {
        reply_failure(req, job->rc, &ctx->o);
    }
    create_job_free(job);
}

/* The transaction's answer, on the thread that led its batch. */
static void create_committed(void *vjob, int rc)
{
    struct create_job *job = vjob;
    job->rc = rc;
    http_resume(job->req, create_reply, job);
}

void api_instances_create(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"gpu_type",            JSON_KIND_STRING,  1, 32 },
        {"card_count",          JSON_KIND_INTEGER, 1, 0  },
        {"image",               JSON_KIND_STRING,  1, 255},
        {"volume_id",           JSON_KIND_STRING,  0, 64 },
        {"name",                JSON_KIND_STRING,  0, 63 },
        {"ssh_key_ids",         JSON_KIND_ARRAY,   0, 0  },
        {"ports",               JSON_KIND_ARRAY,   0, 0  },
        {"command",             JSON_KIND_ARRAY,   0, 0  },
        {"env",                 JSON_KIND_ARRAY,   0, 0  },
        {"working_dir",         JSON_KIND_STRING,  0, 4096},
        {"restart_policy",      JSON_KIND_STRING,  0, 16 },
        {"max_runtime_minutes", JSON_KIND_INTEGER, 0, 0  },
        {"rendezvous_timeout_s", JSON_KIND_INTEGER, 0, 0 },
        {"reservation_id",      JSON_KIND_STRING,  0, 64 },
        {NULL,                  0,                 0, 0  },
    };
    struct idempotency idem;
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    if (idempotency_begin(req, &idem)) {
        json_decref(body);
        return;
    }
    json_int_t cards = json_integer_value(json_object_get(body, "card_count"));
    if (cards < 1 || cards > 256 || !placement_count_valid((int)cards)) {
        http_error(req, ERR_INVALID_FIELD, "card_count",
                   "card_count must be 1 to 8, or a multiple of 8 up to 256 (more than 8 cards take whole nodes)");
        json_decref(body);
        return;
    }
    json_t *ssh_ids = json_object_get(body, "ssh_key_ids");
    if (ssh_ids && json_array_size(ssh_ids) > INSTANCE_MAX_SSH_KEYS) {
        http_error(req, ERR_INVALID_FIELD, "ssh_key_ids", "ssh_key_ids may name at most %d keys",
                   INSTANCE_MAX_SSH_KEYS);
        json_decref(body);
        return;
    }
    for (size_t i = 0; ssh_ids && i < json_array_size(ssh_ids); i++) {
        json_t *v = json_array_get(ssh_ids, i);
        if (!json_is_string(v) || json_string_length(v) >= ID_MAX) {
            http_error(req, ERR_INVALID_FIELD, "ssh_key_ids", "ssh_key_ids must be an array of SSH key ids");
            json_decref(body);
            return;
        }
    }
    /* Published ports: a few distinct container TCP ports (placement gives
     * each a host port of every node, so they are capped like cards). */
    json_t *ports = json_object_get(body, "ports");
    if (ports && json_array_size(ports) > STORE_MAX_PORTS) {
        http_error(req, ERR_INVALID_FIELD, "ports", "ports may name at most %d container ports", STORE_MAX_PORTS);
        json_decref(body);
        return;
    }
    for (size_t i = 0; ports && i < json_array_size(ports); i++) {
        json_t *v = json_array_get(ports, i);
        json_int_t port = json_is_integer(v) ? json_integer_value(v) : 0;
        if (port < 1 || port > 65535) {
            http_error(req, ERR_INVALID_FIELD, "ports", "ports must be an array of TCP port numbers 1..65535");
            json_decref(body);
            return;
        }
        for (size_t j = 0; j < i; j++)
            if (json_integer_value(json_array_get(ports, j)) == port) {
                http_error(req, ERR_INVALID_FIELD, "ports", "ports names %lld twice", (long long)port);
                json_decref(body);
                return;
            }
    }
    const char *policy = json_string_value(json_object_get(body, "restart_policy"));
    if (policy && !instance_restart_policy_valid(policy)) {
        http_error(req, ERR_INVALID_FIELD, "restart_policy", "restart_policy must be never, on_failure or always");
        json_decref(body);
        return;
    }
    json_t *max_rt = json_object_get(body, "max_runtime_minutes");
    json_int_t max_minutes = max_rt ? json_integer_value(max_rt) : 0;
    if (max_rt && (max_minutes < 1 || max_minutes > INSTANCE_MAX_RUNTIME_MINUTES)) {
        http_error(req, ERR_INVALID_FIELD, "max_runtime_minutes",
                   "max_runtime_minutes must be an integer from 1 to %d (30 days), or null for no bound",
                   INSTANCE_MAX_RUNTIME_MINUTES);
        json_decref(body);
        return;
    }
    json_t *rendezvous = json_object_get(body, "rendezvous_timeout_s");
    if (rendezvous && (json_integer_value(rendezvous) < 30 || json_integer_value(rendezvous) > 3600)) {
        http_error(req, ERR_INVALID_FIELD, "rendezvous_timeout_s",
                   "rendezvous_timeout_s must be an integer number of seconds from 30 to 3600");
        json_decref(body);
        return;
    }
    /* What runs: checked here, before any transaction, each refusal
     * naming its field. */
    struct op_outcome run_o = {0};
    json_t *env = NULL;
    const char *working_dir = json_string_value(json_object_get(body, "working_dir"));
    if (run_command_check(json_object_get(body, "command"), &run_o) < 0 ||
        run_env_check(json_object_get(body, "env"), &env, &run_o) < 0 || run_working_dir_check(working_dir, &run_o) < 0) {
        reply_outcome(req, &run_o);
        json_decref(env); /* made by run_env_check before working_dir failed */
        json_decref(body);
        return;
    }
    struct create_job *job = calloc(1, sizeof *job);
    struct store *s = store_thread();
    if (!job || !s) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        free(job);
        json_decref(env);
        json_decref(body);
        return;
    }
    *job = (struct create_job){.req = req, .idem = idem, .body = body, .env = env};
    job->ctx = (struct create_ctx){
        .in = {.user_id = req->user_id,
               .command = json_object_get(body, "command"),
               .env = env,
               .working_dir = working_dir,
               .restart_policy = policy,
               .max_runtime_minutes = max_minutes,
               .rendezvous_timeout_s = rendezvous ? json_integer_value(rendezvous) : 0,
               .ssh_key_ids = ssh_ids,
               .ports = ports,
               .name = json_string_value(json_object_get(body, "name")),
               .gpu_type = json_string_value(json_object_get(body, "gpu_type")),
               .card_count = cards,
               .image = json_string_value(json_object_get(body, "image")),
               .volume_id = json_string_value(json_object_get(body, "volume_id")),
               .reservation_id = json_string_value(json_object_get(body, "reservation_id"))},
        .req = req,
        .idem = &job->idem,
    };
    /* The thread goes on to other connections while the claim waits for
     * its batch's commit, so more creates share a commit (issue 15). */
    http_defer(req);
    store_txn_async(s, create_txn, job, create_committed);
}

static const char *const instance_states[] = {"pending",     "provisioning", "running",    "stopping",
                                              "unreachable", "stopped",      "terminated", "failed",
                                              "lost",        "succeeded",    NULL};

void api_instances_list(struct http_request *req)
{
    static const char *const allowed[] = {"state", "limit", "cursor", NULL};
    struct page pg;
    if (http_query_allow(req, allowed) < 0 || page_begin(req, INSTANCES_PAGE_MAX, 50, &pg) < 0)
        return;
    struct instance_filter f = {.user_id = req->user_id,
                                .state = http_query(req, "state"),
                                .after_created = pg.after_t,
                                .after_id = pg.after_id};
    int state_ok = !f.state;
    for (size_t i = 0; f.state && instance_states[i]; i++)
        state_ok |= strcmp(f.state, instance_states[i]) == 0;
    if (!state_ok) {
        http_error(req, ERR_INVALID_QUERY, "state", "unknown state '%.32s'", f.state);
        return;
    }
    struct instance *list = malloc(sizeof *list * (size_t)(pg.limit + 1));
    size_t n = 0;
    struct store *s = store_thread();
    if (!list || !s || store_instance_list(s, &f, list, (size_t)pg.limit + 1, &n) != STORE_OK) {
        free(list);
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    size_t shown = page_shown(&pg, n);
    json_t *data = json_array();
    for (size_t i = 0; i < shown; i++) {
        json_t *j = instance_json(s, &list[i], NULL);
        if (j)
            json_array_append_new(data, j);
    }
    json_t *next = n > shown ? page_cursor(list[shown - 1].created_at, list[shown - 1].id) : json_null();
    free(list);
    http_reply_json(req, 200, json_pack("{s:o, s:o}", "data", data, "next_cursor", next));
}

/* Loads the caller's instance named by the path, replying 404 for a missing
 * one and for anyone else's. */
static int load_own(struct http_request *req, struct store *s, struct instance *in)
{
    int rc =
        id_valid("ins", req->params[0]) ? store_instance_get(s, req->user_id, req->params[0], in) : STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND)
        http_error(req, ERR_NOT_FOUND, NULL, "no instance %.32s", req->params[0]);
    else if (rc != STORE_OK)
        http_error(req, ERR_INTERNAL, NULL, NULL);
    return rc;
}

/* Rendered instance replies, a few per HTTP thread so that serving one
 * takes no lock and no SQL (issue 15): a reply is served again only to the
 * same user, while no write transaction of this process has committed since
 * it was read (store_commit_generation(), moved by the committing call
 * itself, so a client that saw its stop succeed never gets the reply from
 * before), within the same second of the daemon's clock (low_balance moves
 * with time, and the testing clock jumps) and for at most a second (writes
 * by another process, an operator's sqlite3, move no generation). */
#define REPLY_SLOTS 64
struct instance_reply {
    char user_id[ID_MAX]; /* who asked */
    char id[ID_MAX];      /* the instance */
    uint64_t gen;         /* store_commit_generation() read before the snapshot */
    int64_t at;           /* clock_now() when rendered */
    int64_t mono_ms;      /* clock_mono_ms() when rendered */
    char *body;           /* the JSON reply, malloc'd; NULL: empty slot */
    size_t len;
};
static pthread_key_t replies_key;
static pthread_once_t replies_once = PTHREAD_ONCE_INIT;

static void replies_free(void *v)
{
    struct instance_reply *r = v;
    for (size_t i = 0; i < REPLY_SLOTS; i++)
        free(r[i].body);
    free(r);
}

static void replies_key_init(void)
{
    pthread_key_create(&replies_key, replies_free);
}

/* This thread's slot for id (direct-mapped by a hash of the id), or NULL
 * without memory. */
static struct instance_reply *reply_slot(const char *id)
{
    pthread_once(&replies_once, replies_key_init);
    return thread_slot(replies_key, REPLY_SLOTS, 1, sizeof(struct instance_reply), id);
}

void api_instances_get(struct http_request *req)
{
    struct store *s = store_thread();
    struct instance in;
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return;
    }
    uint64_t gen = store_commit_generation(); /* before the snapshot: a commit after it moves it */
    int64_t now = clock_now(), mono = clock_mono_ms();
    struct instance_reply *slot = reply_slot(req->params[0]);
    if (slot && slot->body && slot->gen == gen && slot->at == now && mono - slot->mono_ms < 1000 &&
        strcmp(slot->id, req->params[0]) == 0 && strcmp(slot->user_id, req->user_id) == 0) {
        http_reply_raw(req, 200, "application/json", slot->body, slot->len);
        return;
    }
    /* One snapshot for the instance and everything its reply shows. */
    if (store_read_begin(s) != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    json_t *j = load_own(req, s, &in) == STORE_OK ? instance_json(s, &in, NULL) : NULL;
    store_read_end(s);
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!body) {
        if (!req->replied)
            http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    size_t len = strlen(body);
    http_reply_raw(req, 200, "application/json", body, len);
    if (slot && strlen(req->params[0]) < ID_MAX && strlen(req->user_id) < ID_MAX) {
        free(slot->body);
        *slot = (struct instance_reply){.gen = gen, .at = now, .mono_ms = mono, .body = body, .len = len};
        strcpy(slot->id, req->params[0]);
        strcpy(slot->user_id, req->user_id);
    } else {
        free(body);
    }
}

/* GET /v1/instances/{id}/ssh-config: the OpenSSH client config of every
 * rank, text/plain, for `ssh -F` or ~/.ssh/config. Only a running instance
 * has connect details. */
void api_instances_ssh_config(struct http_request *req)
{
    struct store *s = store_thread();
    struct instance in;
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return;
    }
    if (load_own(req, s, &in) != STORE_OK)
        return;
    if (strcmp(in.state, "running") != 0) {
        http_error_ext(req, ERR_INVALID_STATE, NULL, json_pack("{s:s}", "state", in.state),
                       "instance %s is %s; its SSH config exists while it runs", in.id, in.state);
        return;
    }
    char *text = instance_ssh_config(s, &in);
    if (text)
        http_reply_raw(req, 200, "text/plain; charset=utf-8", text, strlen(text));
    else
        http_error(req, ERR_INTERNAL, NULL, NULL);
    free(text);
}

/* start, stop, terminate or PATCH waiting for its commit (store_txn_async)
 * while its connection is suspended, as a create does: the thread serves
 * others meanwhile. Each replies with the instance as it then is. */
struct change_job {
    struct http_request *req;
    int (*op)(struct store *, const char *, const char *, struct op_outcome *); /* start, stop, terminate */
    json_t *patch;       /* or, for PATCH, the checked fields */
    const char *verb;    /* for the log */
    struct op_outcome o; /* refusal */
    int rc;              /* the transaction's result */
};

static int change_txn(struct store *s, void *vjob)
{
    struct change_job *job = vjob;
    json_decref(job->o.extra);
    memset(&job->o, 0, sizeof job->o);
    if (job->patch)
        return instance_patch(s, job->req->user_id, job->req->params[0], job->patch, &job->o);
    return job->op(s, job->req->user_id, job->req->params[0], &job->o);
}

static void change_job_free(struct change_job *job)
{
    json_decref(job->o.extra);
    json_decref(job->patch);
    free(job);
}

/* Replies on a pool thread once the change committed or failed; connected
 * is 0 if the client left meanwhile (the change stands all the same). */
static void change_reply(struct http_request *req, void *vjob, int connected)
{
    struct change_job *job = vjob;
    struct store *s = store_thread();
    struct instance in;
    int rc = job->rc;
    if (rc == STORE_OK)
        rc = s ? store_instance_get(s, req->user_id, req->params[0], &in) : STORE_ERROR;
    if (rc == STORE_OK) {
        log_info("instances: %s %s %s (now %s)", req->user_id, job->verb, in.id, in.state);
        if (job->op)
            reconciler_wake();
    }
    if (!connected) {
        change_job_free(job);
        return;
    }
    if (rc == STORE_OK) {
        json_t *j = instance_json(s, &in, NULL);
        if (j)
            http_reply_json(req, 200, j);
        else
            http_error(req, ERR_INTERNAL, NULL, NULL);
    } else {
        reply_failure(req, job->rc == STORE_OK ? STORE_ERROR : job->rc, &job->o);
    }
    change_job_free(job);
}

/* The transaction's answer, on the thread that led its batch. */
static void change_committed(void *vjob, int rc)
{
    struct change_job *job = vjob;
    job->rc = rc;
    http_resume(job->req, change_reply, job);
}

/* Queues the change; takes patch (NULL for start, stop, terminate). */
static void change_queue(struct http_request *req,
                         int (*op)(struct store *, const char *, const char *, struct op_outcome *), json_t *patch,
                         const char *verb)
{
    struct store *s = store_thread();
    struct change_job *job = s ? calloc(1, sizeof *job) : NULL;
    if (!job) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        json_decref(patch);
        return;
    }
    *job = (struct change_job){.req = req, .op = op, .patch = patch, .verb = verb};
    http_defer(req);
    store_txn_async(s, change_txn, job, change_committed);
}

/* start, stop and terminate share everything but the operation. */
static void change(struct http_request *req, int (*op)(struct store *, const char *, const char *, struct op_outcome *),
                   const char *verb)
{
    /* These take no body; anything sent is refused like any unknown field. */
    static const struct json_field none[] = {
        {NULL, 0, 0, 0}
    };
    json_t *body = http_json_body(req, none);
    if (!body)
        return;
    json_decref(body);
    change_queue(req, op, NULL, verb);
}

void api_instances_start(struct http_request *req)
{
    change(req, instance_start, "started");
}
void api_instances_stop(struct http_request *req)
{
    change(req, instance_stop, "stopped");
}
void api_instances_terminate(struct http_request *req)
{
    change(req, instance_terminate, "terminated");
}

void api_instances_events(struct http_request *req)
{
    static const char *const allowed[] = {"limit", "cursor", NULL};
    struct page pg;
    if (http_query_allow(req, allowed) < 0 || page_begin(req, EVENTS_PAGE_MAX, 100, &pg) < 0)
        return;
    struct store *s = store_thread();
    struct instance in;
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return;
    }
    if (load_own(req, s, &in) != STORE_OK)
        return;
    struct instance_event *ev = malloc(sizeof *ev * (size_t)(pg.limit + 1));
    size_t n = 0;
    if (!ev || store_instance_events(s, in.id, pg.after_t, ev, (size_t)pg.limit + 1, &n) != STORE_OK) {
        free(ev);
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    size_t shown = page_shown(&pg, n);
    json_t *data = json_array();
    for (size_t i = 0; i < shown; i++)
        json_array_append_new(data, json_pack("{s:I, s:o, s:s, s:s}", "seq", (json_int_t)ev[i].seq, "at",
                                              json_time(ev[i].at, 0), "state", ev[i].state, "reason", ev[i].reason));
    json_t *next = n > shown ? page_cursor(ev[shown - 1].seq, in.id) : json_null();
    free(ev);
    http_reply_json(req, 200, json_pack("{s:o, s:o}", "data", data, "next_cursor", next));
}

/* The body's declaration, made once from the domain's field table. */
#define PATCH_FIELDS_MAX 32
static struct json_field patch_fields[PATCH_FIELDS_MAX + 1];

static void patch_fields_init(void)
{
    size_t n = 0;
    for (const struct instance_patch_field *f = instance_patch_fields; f->name && n < PATCH_FIELDS_MAX; f++, n++)
        patch_fields[n] = (struct json_field){f->name, f->kind, 0, f->max_len};
    patch_fields[n] = (struct json_field){NULL, 0, 0, 0};
}

/* PATCH /v1/instances/{id}: the fields of instance_patch_fields, each
 * checked before the transaction; the instance must be stopped. */
void api_instances_patch(struct http_request *req)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, patch_fields_init);
    json_t *body = http_json_body(req, patch_fields);
    if (!body)
        return;
    struct op_outcome o = {0};
    if (json_object_size(body) == 0) {
        http_error(req, ERR_MISSING_FIELD, NULL, "the body names no field to change");
        json_decref(body);
        return;
    }
    for (const struct instance_patch_field *f = instance_patch_fields; f->name; f++) {
        json_t *v = json_object_get(body, f->name);
        if (v && f->check(v, &o) < 0) {
            reply_outcome(req, &o);
            json_decref(body);
            return;
        }
    }
    change_queue(req, NULL, body, "changed");
}
