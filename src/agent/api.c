/* api.c: the agent's REST API (docs/AGENT_PROTOCOL.md): the route tables
 * for one node and for a sim fleet under /nodes/{name}, the signature check
 * every route but /healthz passes first (with replay.c's rule for requests
 * from before a restart), and the handlers. Handlers change
 * what is wanted (a record on disk, a workload in the list) and schedule
 * the driver; they never run a command. */
#include "agent.h"
#include "gpurent/clock.h"
#include "gpurent/sign.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct agent *app(struct http_request *req)
{
    return http_server_app(req->server);
}

/* The node a request is for: the only one, or the {node} of the prefix. */
static struct agent_node *req_node(struct http_request *req)
{
    struct agent *a = app(req);
    if (!a->fleet)
        return &a->nodes[0];
    return req->params[0] ? agent_node_find(a, req->params[0]) : NULL;
}

static const char *req_id(struct http_request *req)
{
    return req->params[app(req)->fleet ? 1 : 0];
}

/* The workload id a write or a terminal names, or NULL once a malformed
 * one was answered 400. */
static const char *req_workload_id(struct http_request *req)
{
    const char *id = req_id(req);
    if (agent_name_valid(id))
        return id;
    http_error(req, ERR_INVALID_FIELD, "id", "workload ids are 1 to 63 of a-z, 0-9, '_' and '-'");
    return NULL;
}

/* The logs route's query arguments, in the order they are signed. */
static const char *const logs_query[] = {"tail", "since", "after", NULL};
/* The terminal route's, likewise. */
static const char *const terminal_query[] = {"cols", "rows", NULL};

static int path_ends(const struct http_request *req, const char *tail)
{
    size_t n = strlen(req->path), t = strlen(tail);
    return strcmp(req->method, "GET") == 0 && n > t && strcmp(req->path + n - t, tail) == 0;
}

/* The query arguments the request's route takes (signed in this order):
 * GET .../v1/workloads/{id}/logs and .../terminal; NULL for every other. */
static const char *const *route_query(const struct http_request *req)
{
    return path_ends(req, "/logs") ? logs_query : path_ends(req, "/terminal") ? terminal_query : NULL;
}

/* The path the signature covers: the decoded path, and for the logs route
 * its query in canonical form, "?name=value&..." in logs_query's order with
 * the arguments given. Their values are refused unless plain (digits,
 * letters, '-'), so the decoded and the sent form are the same text and
 * nothing outside the signature changes the reply. -1 (replied) if not. */
static int signed_path(struct http_request *req, char *out, size_t outlen)
{
    static const char *const no_query[] = {NULL};
    const char *const *query = route_query(req);
    if (!query) {
        if (http_query_allow(req, no_query) < 0)
            return -1;
        snprintf(out, outlen, "%s", req->path);
        return 0;
    }
    if (http_query_allow(req, query) < 0)
        return -1;
    size_t o = (size_t)snprintf(out, outlen, "%s", req->path);
    char sep = '?';
    for (const char *const *q = query; *q; q++) {
        const char *v = http_query(req, *q);
        if (!v)
            continue;
        size_t len = strlen(v);
        int plain = len > 0 && len < WL_LOG_CURSOR_MAX;
        for (size_t i = 0; i < len && plain; i++)
            plain = (v[i] >= '0' && v[i] <= '9') || (v[i] >= 'a' && v[i] <= 'z') || v[i] == '-';
        if (!plain) {
            http_error(req, ERR_INVALID_QUERY, *q, "%s must be 1 to %d of 0-9, a-z and '-'", *q,
                       WL_LOG_CURSOR_MAX - 1);
            return -1;
        }
        int n = snprintf(out + o, outlen - o, "%c%s=%s", sep, *q, v);
        if (n < 0 || (size_t)n >= outlen - o) {
            http_error(req, ERR_INVALID_FIELD, NULL, "the path is too long");
            return -1;
        }
        o += (size_t)n;
        sep = '&';
    }
    return 0;
}

int agent_authenticate(struct http_request *req, enum http_auth level)
{
    /* Freshness is judged on the wall clock, as gpurentd signs with it even
     * when it runs on a testing clock.
     *
     * The path is verified as libmicrohttpd decoded it. The protocol's
     * paths need no encoding and take no query, but for the logs route's
     * arguments, signed in a canonical form (signed_path); any other query
     * is refused here rather than verified in part. */
    char path[1024];
    if (signed_path(req, path, sizeof path) < 0)
        return -1;
    struct agent *a = app(req);
    struct agent_node *n = req_node(req);
    char secret[65] = "";
    int have = n && agent_node_secret(a, n, secret) == 0;
    int64_t now = clock_wall();
    enum sign_result r =
        sign_verify(have ? secret : NULL, req->method, path, http_header(req, SIGN_HDR_TIMESTAMP),
                    http_header(req, SIGN_HDR_NONCE), http_header(req, SIGN_HDR_SIGNATURE), req->body, req->body_len,
                    now, (int)a->conf->max_clock_skew_s, a->replay);
    memset(secret, 0, sizeof secret);
    const char *why = sign_result_message(r);
    if (r == SIGN_OK) {
        /* Authentic and fresh; the nonce cache does not outlive a restart,
         * so the timestamp must also be one this run can vouch for. */
        enum replay_verdict v = agent_replay_check(a, http_header(req, SIGN_HDR_TIMESTAMP), now);
        if (v == REPLAY_OK)
            return 0;
        if (v == REPLAY_UNAVAILABLE) {
            http_add_header(req, "Retry-After", "1");
            http_error(req, ERR_UNAVAILABLE, NULL, "the agent cannot record a timestamp ahead of its clock");
            return -1;
        }
        why = "request is dated before this agent's start, so it may be a replay; sign a new one";
        r = SIGN_STALE;
    }
    if (r == SIGN_UNAVAILABLE) {
        log_warn("signature: replay cache full or out of memory; refusing %s %s (raise replay_cache_entries)",
                 req->method, req->path);
        http_add_header(req, "Retry-After", "1");
        http_error(req, ERR_UNAVAILABLE, NULL, "%s", sign_result_message(r));
        return -1;
    }
    if (r == SIGN_BAD_SIGNATURE && n && !have)
        why = "this node has no secret yet (not registered, or its secret file is missing or was refused;"
              " the agent's log says why)";
    log_info("signature: refused %s %s from %s: %s", req->method, req->path, req->client_ip, why);
    http_add_header(req, "WWW-Authenticate", "Gpurent-HMAC-SHA256");
    http_error(req, ERR_BAD_SIGNATURE, NULL, "%s", why);
    return -1;
}

static void api_healthz(struct http_request *req)
{
    req->routine = 1;
    struct agent *a = app(req);
    http_reply_json(req, 200, json_pack("{s:s, s:s, s:I, s:s}", "status", "ok", "runtime", a->conf->runtime, "nodes",
                                        (json_int_t)a->n_nodes, "version", AGENT_VERSION));
}

/* The heartbeat sends back the ETag of the reply it recorded: when the facts
 * are still those, 304 without a body, which spares both ends the bytes and
 * the control plane their digest. */
static void api_facts(struct http_request *req)
{
    req->routine = 1; /* the heartbeat's */
    char err[512], etag[AGENT_ETAG_MAX];
    size_t len = 0;
    char *text = agent_facts_reply(app(req), req_node(req), &len, etag, err, sizeof err);
    if (!text) {
        http_add_header(req, "Retry-After", "5");
        http_error(req, ERR_UNAVAILABLE, NULL, "%s", err);
        return;
    }
    http_add_header(req, "ETag", etag);
    if (http_etag_matches(http_header(req, "If-None-Match"), etag))
        http_reply_not_modified(req, len);
    else
        http_reply_raw(req, 200, "application/json", text, len);
    free(text);
}

static void api_workloads_list(struct http_request *req)
{
    req->routine = 1; /* the reconciler's sweeps */
    struct agent_node *n = req_node(req);
    json_t *list = json_array();
    pthread_mutex_lock(&n->lock);
    for (size_t i = 0; i < n->n_wl; i++)
        if (!n->wl[i]->removing)
            json_array_append_new(list, workload_json_ended(app(req), n, n->wl[i]));
    /* Read after the workloads and under the same lock, so no exited_at in
     * the list is later than now: the control plane places each on its own
     * clock as its now - (now - exited_at), whatever the skew. */
    int64_t now = clock_wall();
    pthread_mutex_unlock(&n->lock);
    http_reply_json(req, 200, json_pack("{s:o, s:I}", "workloads", list, "now", (json_int_t)now));
}

static void api_workload_get(struct http_request *req)
{
    struct agent_node *n = req_node(req);
    const char *id = req_id(req);
    json_t *body = NULL;
    if (agent_name_valid(id)) {
        pthread_mutex_lock(&n->lock);
        struct workload *w = agent_node_workload(n, id);
        if (w && !w->removing)
            body = workload_json_ended(app(req), n, w);
        pthread_mutex_unlock(&n->lock);
    }
    if (!body) {
        http_error(req, ERR_NOT_FOUND, NULL, "no workload %.64s on this node", id);
        return;
    }
    http_reply_json(req, 200, body);
}

/* GET .../v1/workloads/{id}/logs?tail=N&since=EPOCH_S&after=CURSOR: lines
 * from the workload's log file (logs.c). Reading a file is no command: it
 * is done here, bounded by logs.c's reply limits. */
static void api_workload_logs(struct http_request *req)
{
    struct agent *a = app(req);
    struct agent_node *n = req_node(req);
    const char *id = req_id(req);
    int64_t tail, since;
    if (http_query_int(req, "tail", 0, WL_LOG_REPLY_LINES, 0, &tail) < 0 ||
        http_query_int(req, "since", 0, 253402300799, 0, &since) < 0)
        return;
    const char *after = http_query(req, "after");
    if (after && !wl_log_cursor_valid(after)) {
        http_error(req, ERR_INVALID_QUERY, "after", "after is not a cursor this agent gave");
        return;
    }
    if (after && tail) {
        http_error(req, ERR_INVALID_QUERY, "tail", "tail and after cannot be used together");
        return;
    }
    int found = 0, ended = 0;
    if (agent_name_valid(id)) {
        pthread_mutex_lock(&n->lock);
        struct workload *w = agent_node_workload(n, id);
        if (w && !w->removing) {
            found = 1;
            /* Read before the file: the sim writes a container's last line
             * before its phase turns exited, so the file then holds all. */
            ended = w->phase == WL_EXITED || w->phase == WL_FAILED;
        }
        pthread_mutex_unlock(&n->lock);
    }
    char dir[PATH_MAX], cursor[WL_LOG_CURSOR_MAX], err[256];
    agent_node_dir(a, n, dir, sizeof dir);
    /* A removed workload's output is read from where it is kept
     * (wl_log_retire), whole: nothing more will come. */
    struct wl_log_query q = {.ended = !found, .tail = tail, .since_ms = since * 1000, .after = after};
    if (!found && !wl_log_kept(dir, id)) {
        http_error(req, ERR_NOT_FOUND, NULL, "no workload %.64s on this node, nor its output", id);
        return;
    }
    ended |= !found;
    int at_end = 0;
    json_t *lines = wl_log_read(dir, id, &q, cursor, &at_end, err, sizeof err);
    if (!lines) {
        http_error(req, ERR_INVALID_QUERY, "after", "%s", err);
        return;
    }
    http_reply_json(req, 200, json_pack("{s:o, s:s, s:b}", "lines", lines, "cursor", cursor, "done", ended && at_end));
}

static const struct json_field spec_fields[] = {
    {"image", JSON_KIND_STRING, 1, SPEC_IMAGE_MAX - 1},
    {"gpus", JSON_KIND_ARRAY, 0, 0},
    {"stack", JSON_KIND_STRING, 0, 8},
    {"volumes", JSON_KIND_ARRAY, 0, 0},
    {"env", JSON_KIND_OBJECT, 0, 0},
    {"ssh", JSON_KIND_OBJECT, 0, 0},
    {"ports", JSON_KIND_ARRAY, 0, 0},
    {"command", JSON_KIND_ARRAY, 0, 0},
    {"working_dir", JSON_KIND_STRING, 0, 4096},
    {"secret_env", JSON_KIND_ARRAY, 0, 0},
    {"cluster", JSON_KIND_OBJECT, 0, 0},
    {"health", JSON_KIND_OBJECT, 0, 0},
    {NULL, 0, 0, 0},
};

/* Checks the spec against this node's cards and fills in its stack; the
 * first of its cards that discovery reports failed goes into failed (its
 * index and why; "" when none). */
static int check_against_node(struct http_request *req, struct wl_spec *spec, char *failed, size_t failed_len)
{
    struct agent *a = app(req);
    char stack[8] = "";
    failed[0] = '\0';
    for (int i = 0; i < spec->n_gpus; i++) {
        char why[96] = "";
        int card = agent_inventory_card(a, spec->gpus[i], stack, why, sizeof why);
        if (card == 0) {
            if (!stack[0]) {
                http_add_header(req, "Retry-After", "5");
                http_error(req, ERR_UNAVAILABLE, NULL, "GPU discovery has not succeeded yet");
            } else {
                http_error(req, ERR_INVALID_FIELD, "gpus", "card %d does not exist on this node", spec->gpus[i]);
            }
            return -1;
        }
        if (card < 0 && !failed[0])
            snprintf(failed, failed_len, "card %d is reported failed: %s", spec->gpus[i], why);
    }
    /* Host ports are the node's to give: only from its range (set before
     * the API served, never changed: no lock). */
    struct agent_node *n = req_node(req);
    for (int i = 0; i < spec->n_ports; i++) {
        if (spec->ports[i].host < n->publish_first || spec->ports[i].host > n->publish_last) {
            char f[32];
            snprintf(f, sizeof f, "ports[%d].host", i);
            if (n->publish_first == 0)
                http_error(req, ERR_INVALID_FIELD, f, "this node publishes no ports (publish_port_range is \"\")");
            else
                http_error(req, ERR_INVALID_FIELD, f, "host port %d is outside this node's range %d-%d",
                           spec->ports[i].host, n->publish_first, n->publish_last);
            return -1;
        }
    }
    if (!stack[0])
        agent_inventory_card(a, -1, stack, NULL, 0);
    if (!spec->stack[0])
        snprintf(spec->stack, sizeof spec->stack, "%s", stack[0] ? stack : "ROCm");
    else if (stack[0] && strcmp(spec->stack, stack) != 0) {
        http_error(req, ERR_INVALID_FIELD, "stack", "this node runs %s, not %s", stack, spec->stack);
        return -1;
    }
    return 0;
}

/* The longest a PUT may be held for its workload to start, or a DELETE for
 * its workload to be gone (AGENT_PROTOCOL.md, Gpurent-Wait-Ms). */
#define WAIT_MAX_MS 1000

/* The caller's Gpurent-Wait-Ms, capped at WAIT_MAX_MS; 0 when absent or not a
 * positive whole number. */
static int64_t wait_asked(struct http_request *req)
{
    const char *wait = http_header(req, "Gpurent-Wait-Ms");
    if (!wait)
        return 0;
    char *end;
    long long ms = strtoll(wait, &end, 10);
    if (end == wait || *end != '\0' || ms <= 0)
        return 0;
    return ms < WAIT_MAX_MS ? ms : WAIT_MAX_MS;
}

/* What a PUT answers when its caller would rather wait than poll: the
 * workload as it is once it runs, ends or is being deleted, or as it is
 * when wait_ms have passed, whichever comes first. The driver's set_phase
 * wakes the wait; the workload is looked up again by id under the node's
 * lock at each look, so one deleted and freed meanwhile is never touched.
 * Takes reply (the answer so far). */
static json_t *reply_after_wait(struct agent *a, struct agent_node *n, const char *id, int64_t wait_ms, json_t *reply)
{
    struct timespec until;
    clock_mono_deadline(wait_ms, &until);
    int over = 0; /* the wait is over */
    pthread_mutex_lock(&n->lock);
    for (;;) {
        struct workload *w = agent_node_workload(n, id);
        if (!w || w->removing)
            break;
        if (over || w->phase >= WL_RUNNING) {
            json_t *now = workload_json_ended(a, n, w);
            if (now) {
                json_decref(reply);
                reply = now;
            }
            break;
        }
        over = pthread_cond_timedwait(&n->phase_moved, &n->lock, &until) != 0;
    }
    pthread_mutex_unlock(&n->lock);
    return reply;
}

/* Gives w the keys in keys (whose old ones keys then holds, for the caller
 * to free), under the node's lock: logins are checked against them from
 * now on, and each logged-in connection checks its own key again within
 * a second (ssh/server.c), closed if it is no longer there. Kept on disk
 * so a restart keeps them. 0, or -1 when the record could not be written
 * (logged; the new keys apply all the same until a restart). */
static int replace_ssh_keys(const char *dir, struct workload *w, struct spec_ssh *keys)
{
    char **old_keys = w->spec.ssh.keys;
    int n_old = w->spec.ssh.n_keys;
    w->spec.ssh.keys = keys->keys;
    w->spec.ssh.n_keys = keys->n_keys;
    keys->keys = old_keys;
    keys->n_keys = n_old;
    w->ssh_keys_gen++;
    log_info("workload %s on %s: SSH keys replaced: %d before, %d now", w->id, w->node->name, n_old,
             w->spec.ssh.n_keys);
    return record_save(dir, w);
}

static void api_workload_put(struct http_request *req)
{
    struct agent *a = app(req);
    struct agent_node *n = req_node(req);
    const char *id = req_workload_id(req);
    if (!id)
        return;
    json_t *body = http_json_body(req, spec_fields);
    if (!body)
        return;
    struct wl_spec spec;
    char field[64], err[256];
    int rc = spec_parse(body, &spec, field, sizeof field, err, sizeof err);
    json_decref(body);
    if (rc < 0) {
        http_error(req, ERR_INVALID_FIELD, field[0] ? field : NULL, "%s", err);
        return;
    }
    char failed[160];
    if (check_against_node(req, &spec, failed, sizeof failed) < 0) {
        spec_free(&spec);
        return;
    }

    char dir[PATH_MAX];
    agent_node_dir(a, n, dir, sizeof dir);
    err[0] = '\0';
    char holder[AGENT_NAME_MAX] = ""; /* the workload holding a card asked for */
    const char *err_field = NULL;     /* the field a refusal names */
    unsigned status = 0;
    enum api_error e = ERR_CONFLICT;
    json_t *reply = NULL;
    struct workload *w = NULL;
    pthread_mutex_lock(&n->lock);
    struct workload *old = agent_node_workload(n, id);
    if (old && old->removing) {
        http_add_header(req, "Retry-After", "1");
        snprintf(err, sizeof err, "workload %s is still being removed; retry shortly", id);
    } else if (old && spec_equal(&old->spec, &spec)) {
        status = 200;
        reply = workload_json_ended(a, n, old);
    } else if (old && spec_equal_but_ssh_keys(&old->spec, &spec)) {
        /* The account's keys changed while the control plane put it: the
         * newer PUT's keys are the ones to hold, as PUT .../ssh-keys would
         * make them. */
        if (replace_ssh_keys(dir, old, &spec.ssh) < 0) {
            e = ERR_INTERNAL;
            snprintf(err, sizeof err, "cannot record workload %s's new SSH keys on disk", id);
        } else {
            status = 200;
            reply = workload_json_ended(a, n, old);
        }
    } else if (old) {
        snprintf(err, sizeof err, "workload %s exists with another spec; delete it first", id);
    } else if (n->n_wl >= (size_t)a->conf->max_workloads) {
        snprintf(err, sizeof err, "this node already holds %zu workloads, its maximum", n->n_wl);
    } else if (failed[0]) {
        /* A card this node reports failed takes no new workload, whatever
         * the control plane last heard (it hears of the failure at its next
         * heartbeat, and places a refused workload again); one it holds
         * already is answered as it is (above). */
        snprintf(err, sizeof err, "%s", failed);
        err_field = "gpus";
    } else {
        /* A card runs one workload: refuse a spec that shares one with any
         * workload still on the node (until that one is deleted). Held only
         * by workloads being removed, the cards free up shortly: say when
         * to try again, so the caller waits rather than counts a failure.
         * The holder named is one that is not being removed, if any. */
        int held = 0, held_live = 0, card = -1;
        for (size_t i = 0; i < n->n_wl; i++) {
            int shared = -1;
            for (int k = 0; k < n->wl[i]->spec.n_gpus; k++)
                for (int g = 0; g < spec.n_gpus; g++)
                    if (n->wl[i]->spec.gpus[k] == spec.gpus[g] && shared < 0)
                        shared = spec.gpus[g];
            if (shared < 0 || (held && (held_live || n->wl[i]->removing)))
                continue;
            held = 1;
            held_live = !n->wl[i]->removing;
            card = shared;
            snprintf(holder, sizeof holder, "%s", n->wl[i]->id);
        }
        if (held) {
            snprintf(err, sizeof err, "card %d is in use by workload %s%s", card, holder,
                     held_live ? "" : ", which is being removed; retry shortly");
            if (!held_live)
                http_add_header(req, "Retry-After", "1");
        }
        /* A login name picks the workload a connection enters: it is the
         * node's to one workload (AGENT_PROTOCOL.md), or the second could
         * never be logged in to. One being removed (an instance started
         * again on the same node) gives it up shortly. */
        for (size_t i = 0; !err[0] && spec.ssh.present && i < n->n_wl; i++) {
            const struct workload *o = n->wl[i];
            if (!o->spec.ssh.present || strcmp(o->spec.ssh.user, spec.ssh.user) != 0)
                continue;
            snprintf(err, sizeof err, "ssh user %s is workload %s's on this node%s", spec.ssh.user, o->id,
                     o->removing ? ", which is being removed; retry shortly" : "");
            if (o->removing)
                http_add_header(req, "Retry-After", "1");
        }
        if (!err[0]) {
            w = calloc(1, sizeof *w);
            if (!w) {
                e = ERR_INTERNAL;
            } else {
                snprintf(w->id, sizeof w->id, "%s", id);
                w->node = n;
                w->spec = spec;
                memset(&spec, 0, sizeof spec);
                w->phase = WL_PULLING;
                w->created_at = w->updated_at = clock_now();
                if (record_save(dir, w) < 0 || agent_node_add(n, w) < 0) {
                    record_delete(dir, w->id);
                    workload_free(w);
                    e = ERR_INTERNAL;
                    snprintf(err, sizeof err, "cannot record the workload on disk");
                } else {
                    status = 201;
                    reply = workload_json(w);
                    log_info("workload %s on %s: accepted (%s)", w->id, n->name, w->spec.image);
                    driver_schedule(a->driver, w, a->rt->ops->delay_ms(a->rt, w, WL_PULLING));
                }
            }
        }
    }
    pthread_mutex_unlock(&n->lock);
    spec_free(&spec);
    int64_t wait_ms = wait_asked(req);
    if (status == 201 && wait_ms > 0)
        reply = reply_after_wait(a, n, id, wait_ms, reply);
    if (status == 201)
        http_add_header(req, "Location", req->path); /* PUT made it here */
    if (status)
        http_reply_json(req, status, reply);
    else if (holder[0]) /* named, so that a control plane can tell one it forgot from one it knows */
        http_error_ext(req, e, "gpus", json_pack("{s:s}", "holder", holder), "%s", err);
    else
        http_error(req, e, err_field, "%s", err[0] ? err : "cannot accept the workload");
}

/* PUT .../v1/workloads/{id}/ssh-keys {"authorized_keys": [...]}: the keys
 * that log in to a workload from now on, sent by the control plane when
 * its owner's account keys change (AGENT_PROTOCOL.md). A connection logged
 * in with a key no longer there is closed. */
static void api_workload_ssh_keys(struct http_request *req)
{
    static const struct json_field fields[] = {
        {"authorized_keys", JSON_KIND_ARRAY, 1, 0},
        {NULL,              0,               0, 0},
    };
    struct agent *a = app(req);
    struct agent_node *n = req_node(req);
    const char *id = req_workload_id(req);
    if (!id)
        return;
    json_t *body = http_json_body(req, fields);
    if (!body)
        return;
    struct spec_ssh keys = {0};
    char field[96], err[256];
    int rc = spec_ssh_keys_parse(json_object_get(body, "authorized_keys"), "authorized_keys", &keys, field,
                                 sizeof field, err, sizeof err);
    json_decref(body);
    if (rc < 0) {
        spec_ssh_keys_free(keys.keys, keys.n_keys);
        http_error(req, ERR_INVALID_FIELD, field[0] ? field : NULL, "%s", err);
        return;
    }
    char dir[PATH_MAX];
    agent_node_dir(a, n, dir, sizeof dir);
    enum api_error e = ERR_NOT_FOUND;
    json_t *reply = NULL;
    err[0] = '\0';
    pthread_mutex_lock(&n->lock);
    struct workload *w = agent_node_workload(n, id);
    if (!w || w->removing) {
        snprintf(err, sizeof err, "no workload %.64s on this node", id);
    } else if (!w->spec.ssh.present) {
        e = ERR_CONFLICT;
        snprintf(err, sizeof err, "workload %s was put without ssh: nobody logs in to it, with any key", id);
    } else if (replace_ssh_keys(dir, w, &keys) < 0) {
        e = ERR_INTERNAL;
        snprintf(err, sizeof err, "cannot record workload %s's new SSH keys on disk", id);
    } else {
        char digest[65];
        spec_ssh_keys_digest(&w->spec.ssh, digest);
        reply = json_pack("{s:s, s:i, s:s}", "id", w->id, "keys", w->spec.ssh.n_keys, "ssh_keys_digest", digest);
    }
    pthread_mutex_unlock(&n->lock);
    spec_ssh_keys_free(keys.keys, keys.n_keys); /* the old ones, or those refused */
    if (reply)
        http_reply_json(req, 200, reply);
    else
        http_error(req, e, NULL, "%s", err);
}

/* Whether node n no longer holds workload id, waiting up to wait_ms for its
 * removal to finish (the driver wakes phase_moved when it does). */
static int wait_until_removed(struct agent_node *n, const char *id, int64_t wait_ms)
{
    struct timespec until;
    clock_mono_deadline(wait_ms, &until);
    pthread_mutex_lock(&n->lock);
    int gone;
    while (!(gone = agent_node_workload(n, id) == NULL) && wait_ms > 0 &&
           pthread_cond_timedwait(&n->phase_moved, &n->lock, &until) == 0)
        ;
    pthread_mutex_unlock(&n->lock);
    return gone;
}

static void api_workload_delete(struct http_request *req)
{
    struct agent *a = app(req);
    struct agent_node *n = req_node(req);
    const char *id = req_workload_id(req);
    if (!id)
        return;
    char dir[PATH_MAX];
    agent_node_dir(a, n, dir, sizeof dir);
    int failed = 0, started = 0;
    pthread_mutex_lock(&n->lock);
    struct workload *w = agent_node_workload(n, id);
    if (w && !w->removing) {
        started = 1;
        /* The tombstone is on disk before the answer, so a restart goes on
         * removing rather than bring the workload back. */
        w->removing = 1;
        if (record_save(dir, w) < 0) {
            w->removing = 0;
            failed = 1;
        } else {
            atomic_store(&w->cancel, 1); /* stop a pull or mount in flight */
            driver_schedule(a->driver, w, 0);
            pthread_cond_broadcast(&n->phase_moved); /* a PUT waiting for it to run answers now */
            log_info("workload %s on %s: delete accepted", w->id, n->name);
        }
    }
    pthread_mutex_unlock(&n->lock);
    if (failed) {
        http_error(req, ERR_INTERNAL, NULL, "cannot record the deletion on disk");
        return;
    }
    /* Its cards are free only once it is gone: until then the caller must
     * not give them to anyone else, and is told to ask again. Only the
     * DELETE that starts the removal waits (a quick one answers 200 at
     * once): one asking after it answers at once, holding no HTTP thread
     * while a container takes its stop_timeout_s. */
    if (wait_until_removed(n, id, started ? wait_asked(req) : 0)) {
        http_reply_json(req, 200, json_pack("{s:s, s:s}", "id", id, "phase", "removed"));
    } else {
        http_add_header(req, "Retry-After", "1");
        http_reply_json(req, 202, json_pack("{s:s, s:s}", "id", id, "phase", "removing"));
    }
}

/* The web terminal (terminal.c); the node and id are checked here as for
 * every workload route. */
static void api_workload_terminal(struct http_request *req)
{
    struct agent_node *n = req_node(req);
    if (!n) {
        http_error(req, ERR_NOT_FOUND, NULL, "no such node");
        return;
    }
    const char *id = req_workload_id(req);
    if (!id)
        return;
    agent_terminal_open(req, n, id);
}

const struct http_route agent_routes_single[] = {
    {"GET", "/healthz", api_healthz, AUTH_NONE, NULL},
    {"GET", "/v1/facts", api_facts, AUTH_SIGNED, NULL},
    {"GET", "/v1/workloads", api_workloads_list, AUTH_SIGNED, NULL},
    {"GET", "/v1/workloads/{id}", api_workload_get, AUTH_SIGNED, NULL},
    {"PUT", "/v1/workloads/{id}", api_workload_put, AUTH_SIGNED, NULL},
    {"DELETE", "/v1/workloads/{id}", api_workload_delete, AUTH_SIGNED, NULL},
    {"PUT", "/v1/workloads/{id}/ssh-keys", api_workload_ssh_keys, AUTH_SIGNED, NULL},
    {"GET", "/v1/workloads/{id}/logs", api_workload_logs, AUTH_SIGNED, NULL},
    {"GET", "/v1/workloads/{id}/terminal", api_workload_terminal, AUTH_SIGNED, NULL},
    {NULL, NULL, NULL, AUTH_NONE, NULL},
};

const struct http_route agent_routes_fleet[] = {
    {"GET", "/healthz", api_healthz, AUTH_NONE, NULL},
    {"GET", "/nodes/{node}/v1/facts", api_facts, AUTH_SIGNED, NULL},
    {"GET", "/nodes/{node}/v1/workloads", api_workloads_list, AUTH_SIGNED, NULL},
    {"GET", "/nodes/{node}/v1/workloads/{id}", api_workload_get, AUTH_SIGNED, NULL},
    {"PUT", "/nodes/{node}/v1/workloads/{id}", api_workload_put, AUTH_SIGNED, NULL},
    {"DELETE", "/nodes/{node}/v1/workloads/{id}", api_workload_delete, AUTH_SIGNED, NULL},
    {"PUT", "/nodes/{node}/v1/workloads/{id}/ssh-keys", api_workload_ssh_keys, AUTH_SIGNED, NULL},
    {"GET", "/nodes/{node}/v1/workloads/{id}/logs", api_workload_logs, AUTH_SIGNED, NULL},
    {"GET", "/nodes/{node}/v1/workloads/{id}/terminal", api_workload_terminal, AUTH_SIGNED, NULL},
    {NULL, NULL, NULL, AUTH_NONE, NULL},
};
