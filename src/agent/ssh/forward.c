/* ssh/forward.c: `ssh -L` (direct-tcpip channels), allowed only to a port
 * that a process of the logged-in workload listens on, so a renter reaches
 * Jupyter or TensorBoard in their container and nothing on the host or in
 * another container. Which socket is the workload's, and the connection to
 * it from inside its network namespace, are listening.c's. */
#define GPURENT_SSH_INTERNAL
#include "ssh/ssh.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The workload's own loopback, by name or address; IPv6's too: a server
 * bound to ::1 alone was reached as localhost but refused as [::1]. */
static int loopback_name(const char *host)
{
    return strcmp(host, "localhost") == 0 || strcmp(host, "127.0.0.1") == 0 || strcmp(host, "::1") == 0;
}

int ssh_forward_message(ssh_session session, ssh_message msg, void *userdata)
{
    struct ssh_conn *c = userdata;
    if (ssh_message_type(msg) != SSH_REQUEST_CHANNEL_OPEN || ssh_message_subtype(msg) != SSH_CHANNEL_DIRECT_TCPIP)
        return 1;
    struct agent_node *n = c->listener->node;
    const char *host = ssh_message_channel_request_open_destination(msg);
    int port = ssh_message_channel_request_open_destination_port(msg);
    const char *why = NULL;
    char wl_id[AGENT_NAME_MAX] = "";
    if (!c->authenticated) {
        why = "not logged in";
    } else if (!host || !loopback_name(host)) {
        why = "only localhost inside the workload can be reached";
    } else if (port < 1 || port > 65535) {
        why = "bad port";
    } else {
        pthread_mutex_lock(&n->lock);
        struct workload *w = ssh_conn_workload(c);
        if (!w)
            why = "the workload is no longer running";
        else
            snprintf(wl_id, sizeof wl_id, "%s", w->id);
        pthread_mutex_unlock(&n->lock);
    }
    long pid = 0;
    char pid_err[512] = "";
    const struct runtime *rt = c->srv->agent->rt;
    if (!why && rt->ops->main_pid(rt, wl_id, &pid, pid_err, sizeof pid_err) != STEP_OK) {
        log_warn("ssh forward: workload %s: %s", wl_id, pid_err);
        why = "the workload's container cannot be found";
    }
    struct listen_addr at;
    if (!why && !workload_listener(wl_id, pid, port, &at))
        why = "no process of the workload listens on that port";
    int fd = -1;
    if (!why && (fd = listen_addr_connect(pid, &at, 0)) < 0)
        why = "the connection was refused";
    struct ssh_chan *ch = NULL;
    if (!why && !(ch = ssh_chan_new(c, CHAN_FORWARD)))
        why = "too many channels";
    if (why) {
        log_warn("ssh forward refused: node %s workload %s user %s from %s:%d to %.64s:%d: %s", n->name, c->wl_id,
                 c->user, c->addr, c->port, host ? host : "?", port, why);
        if (fd >= 0)
            close(fd);
        ssh_message_reply_default(msg);
        return 0;
    }
    ch->channel = ssh_message_channel_request_open_reply_accept(msg);
    if (!ch->channel) {
        close(fd);
        ch->finished = 1;
        return 0;
    }
    ch->in_fd = ch->out_fd = fd;
    ch->started = 1;
    ssh_chan_set_callbacks(ch);
    if (ssh_chan_watch(ch, fd, 0) < 0)
        ch->out_ref.eof = 1;
    log_info("ssh forward: node %s workload %s user %s from %s:%d to port %d", n->name, c->wl_id, c->user, c->addr,
             c->port, port);
    return 0;
}
