/* api_logs.c: GET /v1/instances/{id}/logs, what a rank's container printed,
 * as JSON or (follow=true) streamed as text lines.
 * The handler only checks the query and the instance and hands the agent
 * call to the logs proxy (loops/logs_proxy.c) with its request deferred:
 * handlers never wait on an agent, so a slow or dead node holds no pool
 * thread. The reply is built back on a pool thread from the agent's. */
#include "gpurent/jsonx.h"
#include "gpurent/log.h"
#include "http/api.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Lines one reply may ask the agent for (its own cap). */
#define LOGS_MAX_TAIL 1000
/* Lines shown when tail is not given. */
#define LOGS_DEFAULT_TAIL 100

/* "2026-11-29T18:22:00.123Z" for epoch milliseconds. */
static json_t *time_ms(int64_t ms)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    char buf[40];
    if (ms < 0 || !gmtime_r(&t, &tm) || !strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm))
        return json_null();
    size_t n = strlen(buf);
    snprintf(buf + n, sizeof buf - n, ".%03dZ", (int)(ms % 1000));
    return json_string(buf);
}

/* The agent's {"lines":[{"t","stream","text"}],"done"} as our
 * {"data":[{"time","stream","text"}],"rank","done"}; NULL if it is not that. */
static json_t *convert(const char *body, int64_t rank)
{
    json_t *in = body ? json_loads(body, JSON_ALLOW_NUL, NULL) /* an agent before it kept NULs */ : NULL;
    json_t *lines = json_object_get(in, "lines");
    json_t *done = json_object_get(in, "done");
    if (!json_is_array(lines) || !json_is_boolean(done)) {
        json_decref(in);
        return NULL;
    }
    json_t *data = json_array();
    size_t i;
    json_t *l;
    json_array_foreach(lines, i, l)
    {
        json_t *t = json_object_get(l, "t"), *stream = json_object_get(l, "stream"), *text = json_object_get(l, "text");
        if (!json_is_integer(t) || !json_is_string(stream) || !json_is_string(text))
            continue; /* not a line: left out rather than failing the read */
        json_array_append_new(
            data, json_pack("{s:o, s:O, s:O}", "time", time_ms(json_integer_value(t)), "stream", stream, "text", text));
    }
    json_t *out = json_pack("{s:o, s:I, s:b}", "data", data, "rank", (json_int_t)rank, "done", json_is_true(done));
    json_decref(in);
    return out;
}

/* On a pool thread, after the proxy resumed the request. */
static void reply(struct http_request *req, void *ctx, int connected)
{
    struct logs_job *job = ctx;
    if (!connected)
        goto out;
    if (job->status == 200) {
        json_t *j = convert(job->body, job->rank);
        if (j)
            http_reply_json(req, 200, j);
        else
            http_error(req, ERR_UNAVAILABLE, NULL, "node %s sent a logs reply that is not one", job->node_name);
    } else if (job->status == 404) {
        /* The placement names the workload but the node does not have it:
         * not yet (the instance was just placed) or no longer (it was
         * stopped or removed since). */
        int starting = strcmp(job->state, "pending") == 0 || strcmp(job->state, "provisioning") == 0;
        http_error_ext(req, ERR_INVALID_STATE, "rank", json_pack("{s:s}", "state", job->state),
                       starting     ? "instance is %s: rank %lld's workload has not reached node %s yet"
                       : job->ended ? "instance is %s: rank %lld's output is no longer kept on node %s"
                                    : "instance is %s: rank %lld has no workload on node %s now",
                       job->state, (long long)job->rank, job->node_name);
    } else if (job->status != 0) {
        log_warn("logs: node %s answered %ld to %s", job->node_name, job->status, job->path);
        http_error(req, ERR_UNAVAILABLE, NULL, "node %s could not read the logs (HTTP %ld)", job->node_name,
                   job->status);
    } else {
        http_error(req, ERR_UNAVAILABLE, NULL, "%s", job->error);
    }
out:
    free(job->body);
    free(job);
}

/* since: epoch seconds or an RFC 3339 UTC time; 0 when absent. */
static int query_since(struct http_request *req, int64_t *since)
{
    const char *v = http_query(req, "since");
    *since = 0;
    if (!v)
        return 0;
    if (json_time_parse(v, since) == 0)
        return 0;
    return http_query_int(req, "since", 0, 253402300799LL, 0, since); /* replies 400 for anything else */
}

void api_instances_logs(struct http_request *req)
{
    static const char *const allowed[] = {"rank", "tail", "since", "follow", NULL};
    if (http_query_allow(req, allowed) < 0)
        return;
    int64_t rank, tail, since;
    if (http_query_int(req, "rank", 0, PLACEMENT_MAX_NODES - 1, 0, &rank) < 0 ||
        http_query_int(req, "tail", 0, LOGS_MAX_TAIL, LOGS_DEFAULT_TAIL, &tail) < 0 || query_since(req, &since) < 0)
        return;
    const char *follow_arg = http_query(req, "follow");
    if (follow_arg && strcmp(follow_arg, "false") != 0 && strcmp(follow_arg, "true") != 0) {
        http_error(req, ERR_INVALID_QUERY, "follow", "follow must be true or false");
        return;
    }
    int follow = follow_arg && strcmp(follow_arg, "true") == 0;
    struct store *s = store_thread();
    if (!s) {
        http_error(req, ERR_UNAVAILABLE, NULL, NULL);
        return;
    }
    struct instance in;
    int rc =
        id_valid("ins", req->params[0]) ? store_instance_get(s, req->user_id, req->params[0], &in) : STORE_NOT_FOUND;
    if (rc == STORE_NOT_FOUND) {
        http_error(req, ERR_NOT_FOUND, NULL, "no instance %.32s", req->params[0]);
        return;
    }
    if (rc != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    int64_t ranks = (in.card_count + PLACEMENT_NODE_CARDS - 1) / PLACEMENT_NODE_CARDS;
    if (rank >= (ranks > 0 ? ranks : 1)) {
        http_error(req, ERR_INVALID_QUERY, "rank", "rank must be from 0 to %lld for this instance",
                   (long long)(ranks > 0 ? ranks - 1 : 0));
        return;
    }
    struct instance_node nodes[PLACEMENT_MAX_NODES];
    size_t n = 0;
    if (store_instance_nodes(s, in.id, nodes, PLACEMENT_MAX_NODES, &n) != STORE_OK) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    const struct instance_node *node = NULL;
    for (size_t i = 0; i < n; i++)
        if (nodes[i].rank == rank && nodes[i].workload_id[0])
            node = &nodes[i];
    /* Ended: the node it last ran on keeps its output for a while. */
    struct instance_node past;
    if (!node && n == 0 && (rc = store_instance_past_rank(s, in.id, rank, &past)) == STORE_OK)
        node = &past;
    else if (!node && n == 0 && rc != STORE_NOT_FOUND) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    if (!node) {
        http_error_ext(req, ERR_INVALID_STATE, "rank", json_pack("{s:s}", "state", in.state),
                       "instance %s is %s; rank %lld has no workload on a node to read logs from", in.id, in.state,
                       (long long)rank);
        return;
    }
    struct logs_job *job = calloc(1, sizeof *job);
    if (!job) {
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    job->req = req;
    job->rank = rank;
    job->ended = node == &past;
    snprintf(job->state, sizeof job->state, "%s", in.state);
    job->reply = reply;
    snprintf(job->agent_url, sizeof job->agent_url, "%s", node->agent_url);
    snprintf(job->secret, sizeof job->secret, "%s", node->secret);
    snprintf(job->node_name, sizeof job->node_name, "%s", node->node_name);
    /* The agent signs the path with its query in this order: tail, since. */
    int len =
        snprintf(job->path, sizeof job->path, "/v1/workloads/%s/logs?tail=%lld", node->workload_id, (long long)tail);
    if (since > 0 && len > 0 && (size_t)len < sizeof job->path)
        len += snprintf(job->path + len, sizeof job->path - (size_t)len, "&since=%lld", (long long)since);
    if (len < 0 || (size_t)len >= sizeof job->path) {
        free(job);
        http_error(req, ERR_INTERNAL, NULL, NULL);
        return;
    }
    if (follow) {
        /* Streamed as text lines; the proxy polls the agent, the stream's
         * connection is suspended whenever nothing is new. A reverse proxy
         * must pass each line on as it comes: nginx, as OPERATIONS.md sets
         * it up, keeps a proxied reply in its buffers unless told not to. */
        int busy;
        struct logs_follow *f = logs_follow_new(job, node->workload_id, req->user_id, req->key_id, &busy);
        free(job);
        if (busy) {
            http_add_header(req, "Retry-After", "5");
            http_error(req, ERR_TOO_MANY_REQUESTS, NULL, "you follow %d logs already; end one first",
                       LOGS_MAX_FOLLOWS_PER_USER);
            return;
        }
        http_add_header(req, "X-Accel-Buffering", "no");
        struct http_stream *st =
            f ? http_reply_stream(req, "text/plain; charset=utf-8", logs_follow_pull, logs_follow_done, f) : NULL;
        if (!st) {
            logs_follow_free(f);
            if (!req->replied)
                http_error(req, ERR_INTERNAL, NULL, NULL);
            return;
        }
        logs_follow_start(f, st);
        return;
    }
    if (logs_proxy_submit(job) < 0) {
        free(job);
        http_add_header(req, "Retry-After", "1");
        http_error(req, ERR_UNAVAILABLE, NULL, "too many log reads are waiting for nodes; try again");
    }
}
