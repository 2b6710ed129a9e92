/* listening.c: whether a process of a workload listens on a TCP port, and
 * at which address to reach that very socket (see agent.h). ssh -L, the
 * sim's published ports and the sim's health checks all ask. The sim
 * runtime tells its processes apart by GPURENT_WORKLOAD in their
 * environment (see runtime.c) and they share the host's network, so two
 * replicas of one app may listen on the same port, each on an address of
 * its own (sim-model-server binds one derived from its workload): the
 * connection goes to the address the workload's own socket is bound to,
 * never to whichever process 127.0.0.1 would reach. With podman and docker
 * the sockets are read from the container's network namespace
 * (/proc/PID/net/tcp of its main process) and their owners must be in its
 * pid namespace. */
#include "agent.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_SOCKETS 64

struct listening {
    unsigned long inode;
    struct listen_addr at;
};

/* /proc/net/tcp prints each 32-bit word of an address as the hex of its
 * value in host order: read back, the word is the bytes as they were. */
static int parse_addr(const char *hex, int v6, int port, struct listen_addr *at)
{
    memset(at, 0, sizeof *at);
    if (!v6) {
        struct sockaddr_in *sa = (struct sockaddr_in *)&at->sa;
        uint32_t w;
        if (strlen(hex) != 8 || sscanf(hex, "%8x", &w) != 1)
            return -1;
        sa->sin_family = AF_INET;
        sa->sin_port = htons((uint16_t)port);
        sa->sin_addr.s_addr = w == INADDR_ANY ? htonl(INADDR_LOOPBACK) : w;
        at->len = sizeof *sa;
        return 0;
    }
    struct sockaddr_in6 *sa = (struct sockaddr_in6 *)&at->sa;
    if (strlen(hex) != 32)
        return -1;
    for (int i = 0; i < 4; i++) {
        char word[9];
        uint32_t w;
        memcpy(word, hex + 8 * i, 8);
        word[8] = '\0';
        if (sscanf(word, "%8x", &w) != 1)
            return -1;
        memcpy(sa->sin6_addr.s6_addr + 4 * i, &w, 4);
    }
    sa->sin6_family = AF_INET6;
    sa->sin6_port = htons((uint16_t)port);
    if (IN6_IS_ADDR_UNSPECIFIED(&sa->sin6_addr))
        sa->sin6_addr = in6addr_loopback;
    at->len = sizeof *sa;
    return 0;
}

/* The listening TCP sockets on port in one /proc/net/tcp{,6}. */
static void listening_sockets(const char *file, int v6, int port, struct listening *out, int *n)
{
    FILE *f = fopen(file, "r");
    if (!f)
        return;
    char line[512];
    if (!fgets(line, sizeof line, f)) { /* the header */
        fclose(f);
        return;
    }
    while (fgets(line, sizeof line, f) && *n < MAX_SOCKETS) {
        char local[64], remote[64];
        unsigned state, uid;
        unsigned long inode;
        unsigned lport = 0;
        /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
        if (sscanf(line, " %*s %63s %63s %x %*s %*s %*s %u %*s %lu", local, remote, &state, &uid, &inode) != 5)
            continue;
        char *colon = strrchr(local, ':');
        if (!colon || sscanf(colon + 1, "%x", &lport) != 1)
            continue;
        *colon = '\0';
        if (state == 0x0A && (int)lport == port && inode != 0 && parse_addr(local, v6, port, &out[*n].at) == 0)
            out[(*n)++].inode = inode;
    }
    fclose(f);
}

/* The socket of s[] that process pid holds, or -1. */
static int held_socket(const char *pid, const struct listening *s, int n)
{
    char dir[320];
    snprintf(dir, sizeof dir, "/proc/%s/fd", pid);
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    struct dirent *e;
    int found = -1;
    while (found < 0 && (e = readdir(d))) {
        char path[640], target[64];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ssize_t len = readlink(path, target, sizeof target - 1);
        if (len <= 0)
            continue;
        target[len] = '\0';
        unsigned long inode;
        if (sscanf(target, "socket:[%lu]", &inode) != 1)
            continue;
        for (int i = 0; i < n && found < 0; i++)
            if (s[i].inode == inode)
                found = i;
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

int workload_listener(const char *wl_id, long container_pid, int port, struct listen_addr *at)
{
    struct listening s[MAX_SOCKETS];
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
    listening_sockets(tcp, 0, port, s, &n);
    listening_sockets(tcp6, 1, port, s, &n);
    if (n == 0)
        return 0;
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    struct dirent *e;
    int found = -1;
    while (found < 0 && (e = readdir(d))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        int i = held_socket(e->d_name, s, n);
        if (i >= 0 && (container_pid > 0 ? in_pid_ns(e->d_name, want) : sim_process_environ_has(e->d_name, want)))
            found = i;
    }
    closedir(d);
    if (found >= 0 && at)
        *at = s[found].at;
    return found >= 0;
}

void listen_addr_loopback(int port, struct listen_addr *at)
{
    memset(at, 0, sizeof *at);
    struct sockaddr_in *sa = (struct sockaddr_in *)&at->sa;
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    at->len = sizeof *sa;
}

struct netns_connect {
    long pid;                     /* whose network namespace; 0: the agent's own */
    const struct listen_addr *at; /* where, there */
    int flags;                    /* SOCK_NONBLOCK or 0 */
    int fd;                       /* the socket, or -1 */
    int error;                    /* errno when fd is -1 */
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
    int fd = socket(nc->at->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | nc->flags, 0);
    if (fd < 0 || (connect(fd, (const struct sockaddr *)&nc->at->sa, nc->at->len) < 0 && errno != EINPROGRESS)) {
        nc->error = errno;
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    nc->fd = fd;
    return NULL;
}

int listen_addr_connect(long netns_pid, const struct listen_addr *at, int nonblock)
{
    struct netns_connect nc = {.pid = netns_pid, .at = at, .flags = nonblock ? SOCK_NONBLOCK : 0, .fd = -1};
    if (netns_pid == 0) {
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
