/* counters.c: what the loops count for /metrics, as atomics any thread may
 * bump or read: agent calls that failed, billing passes and their time,
 * reconciler passes, the instances they read, the workload calls they
 * made and the connections to agents those opened, and the heartbeat's
 * good replies, judged or repeated, and the connections its polls opened. The
 * handler that prints them is http/metrics.c. */
#include "loops/loops.h"

#include <stdatomic.h>

static atomic_llong agent_errors;
static atomic_llong billing_passes;
static atomic_llong billing_last_us;
static atomic_llong billing_total_us;
static atomic_llong reconcile_passes[2], reconcile_instances_read[2];
static atomic_llong reconcile_calls[3];
static atomic_llong reconcile_connections;
static atomic_llong heartbeat_replies[HEARTBEAT_REPLY_KINDS];
static atomic_llong heartbeat_connections;

void metrics_agent_error(void)
{
    atomic_fetch_add(&agent_errors, 1);
}

void metrics_billing_pass(int64_t duration_us)
{
    atomic_fetch_add(&billing_passes, 1);
    atomic_store(&billing_last_us, duration_us);
    atomic_fetch_add(&billing_total_us, duration_us);
}

void metrics_reconcile_pass(int sweep, int64_t instances_read)
{
    atomic_fetch_add(&reconcile_passes[!sweep], 1);
    atomic_fetch_add(&reconcile_instances_read[!sweep], instances_read);
}

void metrics_reconcile_call(int method)
{
    if (method >= 0 && method < 3)
        atomic_fetch_add(&reconcile_calls[method], 1);
}

void metrics_reconcile_connections(int64_t opened)
{
    atomic_fetch_add(&reconcile_connections, opened);
}

void metrics_heartbeat_reply(enum heartbeat_reply kind)
{
    atomic_fetch_add(&heartbeat_replies[kind], 1);
}

void metrics_heartbeat_connections(int64_t opened)
{
    atomic_fetch_add(&heartbeat_connections, opened);
}

void loop_counters(struct loop_counters *out)
{
    for (int i = 0; i < HEARTBEAT_REPLY_KINDS; i++)
        out->heartbeat_replies[i] = atomic_load(&heartbeat_replies[i]);
    out->heartbeat_connections = atomic_load(&heartbeat_connections);
    out->reconcile_connections = atomic_load(&reconcile_connections);
    for (int i = 0; i < 3; i++)
        out->reconcile_calls[i] = atomic_load(&reconcile_calls[i]);
    for (int i = 0; i < 2; i++) {
        out->reconcile_passes[i] = atomic_load(&reconcile_passes[i]);
        out->reconcile_instances_read[i] = atomic_load(&reconcile_instances_read[i]);
    }
    out->agent_errors = atomic_load(&agent_errors);
    out->billing_passes = atomic_load(&billing_passes);
    out->billing_last_us = atomic_load(&billing_last_us);
    out->billing_total_us = atomic_load(&billing_total_us);
}
