/* health.c: a workload's HTTP health check (spec.health): one GET to its
 * port inside the workload, bounded in time, and the verdict it leads to.
 * The driver's worker makes it during a running workload's state check
 * (driver.c), never an API thread. For podman/docker it is 127.0.0.1 in
 * the container's network namespace, the socket made there as ssh -L's
 * forwards are (listening.c); the sim's processes share the host's
 * network, so there it is the address the workload's own socket is bound
 * to. */
#include "agent.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gpurent/clock.h"

static const char *const health_names[] = {"starting", "healthy", "unhealthy"};

const char *wl_health_name(enum wl_health h)
{
    return (unsigned)h < sizeof health_names / sizeof health_names[0] ? health_names[h] : "unknown";
}

enum wl_health health_next(enum wl_health cur, int answered, int status)
{
    if (answered && status >= 200 && status < 400)
        return WL_HEALTH_HEALTHY;
    /* Nothing listening yet is a server still starting; a bad answer, or
     * silence after it once passed, is a server that is unwell. */
    if (!answered && cur == WL_HEALTH_STARTING)
        return WL_HEALTH_STARTING;
    return WL_HEALTH_UNHEALTHY;
}

struct probe {
    long pid;                     /* whose network namespace; 0 the agent's */
    const struct listen_addr *at; /* where */
    int port;                     /* at's, for the Host header */
    const char *path;
    int timeout_ms;
    int status;        /* out: the answer's status */
    int rc;            /* out: 0 answered, -1 not */
    char msg[160];     /* out: why not */
};

/* Waits for fd to be ready for events until deadline (monotonic ms). */
static int wait_fd(int fd, short events, int64_t deadline)
{
    int64_t left = deadline - clock_mono_ms();
    if (left <= 0)
        return 0;
    struct pollfd p = {.fd = fd, .events = events};
    int rc;
    do
        rc = poll(&p, 1, (int)left);
    while (rc < 0 && errno == EINTR);
    return rc > 0;
}

static void probe_run(struct probe *pr)
{
    int64_t deadline = clock_mono_ms() + pr->timeout_ms;
    pr->rc = -1;
    int err = 0;
    socklen_t errlen = sizeof err;
    int fd = listen_addr_connect(pr->pid, pr->at, 1);
    if (fd < 0) {
        snprintf(pr->msg, sizeof pr->msg, "connect to port %d: %s", pr->port, strerror(errno));
        return;
    }
    if (!wait_fd(fd, POLLOUT, deadline) || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &errlen) < 0 || err) {
        snprintf(pr->msg, sizeof pr->msg, "connect to port %d: %s", pr->port, err ? strerror(err) : "timed out");
        goto out;
    }
    char req[SPEC_HEALTH_PATH_MAX + 96];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n", pr->path,
                     pr->port);
    for (int sent = 0; sent < n;) {
        ssize_t w = send(fd, req + sent, (size_t)(n - sent), MSG_NOSIGNAL);
        if (w < 0 && (errno == EAGAIN || errno == EINTR) && wait_fd(fd, POLLOUT, deadline))
            continue;
        if (w <= 0) {
            snprintf(pr->msg, sizeof pr->msg, "sending the request: %s", w < 0 ? strerror(errno) : "closed");
            goto out;
        }
        sent += (int)w;
    }
    /* The status line is all that is read: "HTTP/1.x NNN ...". */
    char line[64];
    size_t got = 0;
    while (got < sizeof line - 1 && !memchr(line, '\n', got)) {
        ssize_t r = recv(fd, line + got, sizeof line - 1 - got, 0);
        if (r < 0 && (errno == EAGAIN || errno == EINTR) && wait_fd(fd, POLLIN, deadline))
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    line[got] = '\0';
    int status = 0;
    if (sscanf(line, "HTTP/1.%*1[01] %3d", &status) != 1 || status < 100 || status > 599) {
        snprintf(pr->msg, sizeof pr->msg, "%s", got ? "the answer is not HTTP" : "no answer in time");
        goto out;
    }
    pr->status = status;
    pr->rc = 0;
out:
    close(fd);
}

int health_probe(long netns_pid, const struct listen_addr *at, const char *path, int timeout_ms, int *status,
                 char *msg, size_t msglen)
{
    const struct sockaddr *sa = (const struct sockaddr *)&at->sa;
    int port = ntohs(sa->sa_family == AF_INET6 ? ((const struct sockaddr_in6 *)sa)->sin6_port
                                               : ((const struct sockaddr_in *)sa)->sin_port);
    struct probe pr = {.pid = netns_pid, .at = at, .port = port, .path = path, .timeout_ms = timeout_ms, .rc = -1};
    probe_run(&pr);
    if (pr.rc < 0) {
        snprintf(msg, msglen, "%s", pr.msg);
        return -1;
    }
    *status = pr.status;
    msg[0] = '\0';
    return 0;
}
