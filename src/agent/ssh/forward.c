/* ssh/forward.c: `ssh -L` (direct-tcpip channels), allowed only to a port
 * that a process of the logged-in workload listens on, so a renter reaches
 * Jupyter or TensorBoard in their container and nothing on the host or in
 * another container. The sim runtime tells its processes apart by
 * GPURENT_WORKLOAD in their environment (see runtime.c) and they share the
 * host's network; with podman and docker the listening sockets are read
 * from the container's network namespace (/proc/PID/net/tcp of its main
 * process), their owners must be in its pid namespace, and the connection
 * is made from a thread that entered its network namespace. */
#define GPURENT_SSH_INTERNAL
#include "ssh/ssh.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_INODES 64

/* Inodes of the listening TCP sockets on port in one /proc/net/tcp{,6}. */
static void listening_inodes(const char *file, int port, unsigned long *inodes, int *n)
{
    FILE *f = fopen(file, "r");
    if (!f)
        return;
    char line[512];
    if (!fgets(line, sizeof line, f)) { /* the header */
        fclose(f);
        return;
    }
    while (fgets(line, sizeof line, f) && *n < MAX_INODES) {
        char local[64], remote[64];
        unsigned state, uid;
        unsigned long inode;
        int lport = 0;
        /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
        if (sscanf(line, " %*s %63s %63s %x %*s %*s %*s %u %*s %lu", local, remote, &state, &uid, &inode) != 5)
            continue;
        const char *colon = strrchr(local, ':');
        if (!colon || sscanf(colon + 1, "%x", (unsigned *)&lport) != 1)
            continue;
        if (state == 0x0A && lport == port && inode != 0)
            inodes[(*n)++] = inode;
    }
    fclose(f);
}

static int holds_socket(const char *pid, const unsigned long *inodes, int n)
{
    char dir[320];
    snprintf(dir, sizeof dir, "/proc/%s/fd", pid);
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d))) {
        char path[640], target[64];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ssize_t len = readlink(path, target, sizeof target - 1);
        if (len <= 0)
            continue;
        target[len] = '\0';
        unsigned long inode;
        if (sscanf(target, "socket:[%lu]", &inode) != 1)
            continue;
        for (int i = 0; i < n && !found; i++)
            found = inodes[i] == inode;
    }
    closedir(d);
    return found;
}

/* Whether /proc/PID/ns/pid is want (the container's pid namespace). */
static int in_pid_ns(const char *pid, const char *want)
{
    char path[320], ns[64];
    snprintf(path, sizeof path, "/proc/%s/ns/pid", pid);
    ssize_t len = readlink(path, ns, sizeof ns - 1);
    if (len <= 0)
        return 0;
    ns[len] = '\0';
    return strcmp(ns, want) == 0;
}

int ssh_forward_port_owned(const char *wl_id, long container_pid, int port)
{
    unsigned long inodes[MAX_INODES];
    int n = 0;
    char tcp[64], tcp6[64], want[AGENT_NAME_MAX + 32];
    if (container_pid > 0) {
        snprintf(tcp, sizeof tcp, "/proc/%ld/net/tcp", container_pid);
        snprintf(tcp6, sizeof tcp6, "/proc/%ld/net/tcp6", container_pid);
        char path[64];
        snprintf(path, sizeof path, "/proc/%ld/ns/pid", container_pid);
        ssize_t len = readlink(path, want, sizeof want - 1);
        if (len <= 0)
            return 0;
        want[len] = '\0';
    } else {
        snprintf(tcp, sizeof tcp, "/proc/net/tcp");
        snprintf(tcp6, sizeof tcp6, "/proc/net/tcp6");
        snprintf(want, sizeof want, "GPURENT_WORKLOAD=%s", wl_id);
    }
    listening_inodes(tcp, port, inodes, &n);
    listening_inodes(tcp6, port, inodes, &n);
    if (n == 0)
        return 0;
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    struct dirent *e;
    int owned = 0;
    while (!owned && (e = readdir(d))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        owned = holds_socket(e->d_name, inodes, n) &&
                (container_pid > 0 ? in_pid_ns(e->d_name, want) : sim_process_environ_has(e->d_name, want));
    }
    closedir(d);
    return owned;
}

struct netns_connect {
    long pid;  /* whose network namespace; 0: the agent's own */
    int port;  /* on 127.0.0.1 there */
    int fd;    /* the connected socket, or -1 */
    int error; /* errno when fd is -1 */
};

static void *netns_connect_main(void *arg)
{
    struct netns_connect *nc = arg;
    nc->fd = -1;
    if (nc->pid > 0) {
        /* setns changes this thread alone, which ends right after; the
         * socket keeps the namespace it was made in. */
        char path[64];
        snprintf(path, sizeof path, "/proc/%ld/ns/net", nc->pid);
        int ns = open(path, O_RDONLY | O_CLOEXEC);
        if (ns < 0 || setns(ns, CLONE_NEWNET) < 0) {
            nc->error = errno;
            if (ns >= 0)
                close(ns);
            return NULL;
        }
        close(ns);
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)nc->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        nc->error = errno;
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    nc->fd = fd;
    return NULL;
}

/* A socket connected to 127.0.0.1:port in pid's network namespace (the
 * agent's own for 0), or -1 with errno. */
static int connect_in_netns(long pid, int port)
{
    struct netns_connect nc = {.pid = pid, .port = port, .fd = -1, .error = 0};
    if (pid == 0) {
        netns_connect_main(&nc);
    } else {
        pthread_t t;
        int rc = pthread_create(&t, NULL, netns_connect_main, &nc);
        if (rc != 0) {
            errno = rc;
            return -1;
        }
        pthread_join(t, NULL);
    }
    if (nc.fd < 0)
        errno = nc.error;
    return nc.fd;
}

static int loopback_name(const char *host)
{
    return strcmp(host, "localhost") == 0 || strcmp(host, "127.0.0.1") == 0;
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
    if (!why && !ssh_forward_port_owned(wl_id, pid, port))
        why = "no process of the workload listens on that port";
    int fd = -1;
    if (!why && (fd = connect_in_netns(pid, port)) < 0)
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
