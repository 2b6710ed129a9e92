/* fabric.c: what this host offers multi-node training, found when asked:
 * its RDMA device nodes (rdma_device_dir, /dev/infiniband), the numeric
 * gids of its `video` and `render` groups (ROCm containers need them to
 * open /dev/kfd and /dev/dri as a non-root user), the render node of each
 * AMD card (its KFD topology), and its data-plane
 * address for facts (the data_address option, or the first non-loopback
 * IPv4 address, one on an interface backing an RDMA device first). */
#include "agent.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void fabric_free_devices(char **devs, int n)
{
    for (int i = 0; i < n; i++)
        free(devs[i]);
    free(devs);
}

/* A device path goes into "--device PATH": no ':' or ',' (podman reads
 * HOST:CONTAINER:PERMS) and nothing a shell-free word could not hold. */
static int device_name_ok(const char *s)
{
    if (!s[0] || s[0] == '.')
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == '-' || *s == '.'))
            return 0;
    return 1;
}

int fabric_rdma_devices(const char *dir, char ***out, int *n_out)
{
    *out = NULL;
    *n_out = 0;
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT || errno == ENOTDIR ? 0 : -1; /* a host without RDMA */
    char **devs = NULL;
    int n = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char path[PATH_MAX];
        struct stat st;
        if (!device_name_ok(e->d_name))
            continue;
        int len = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        /* Sub-directories (by-path/, by-ibdev/) hold links to the same nodes. */
        if (len < 0 || (size_t)len >= sizeof path || lstat(path, &st) < 0 || S_ISDIR(st.st_mode) ||
            S_ISLNK(st.st_mode))
            continue;
        if (n >= FABRIC_MAX_RDMA_DEVICES) {
            log_warn("%s: more than %d RDMA devices; the rest are not passed to containers", dir,
                     FABRIC_MAX_RDMA_DEVICES);
            break;
        }
        char **g = realloc(devs, (size_t)(n + 1) * sizeof *g);
        if (!g || !(g[n] = strdup(path))) {
            if (g)
                devs = g;
            rc = -1;
            break;
        }
        devs = g;
        n++;
    }
    closedir(d);
    if (rc < 0) {
        fabric_free_devices(devs, n);
        return -1;
    }
    if (n > 1)
        qsort(devs, (size_t)n, sizeof *devs, name_cmp);
    *out = devs;
    *n_out = n;
    return 0;
}

int fabric_group_gid(const char *group_file, const char *name, long *gid)
{
    *gid = -1;
    if (!group_file[0]) {
        /* The host's own groups, through NSS like every other tool. */
        struct group gr, *res = NULL;
        int err = ERANGE;
        /* A group with many members needs a larger buffer: grown to 1 MiB. */
        for (size_t size = 16384; err == ERANGE && size <= 1024 * 1024; size *= 4) {
            char *buf = malloc(size);
            if (!buf)
                return -1;
            err = getgrnam_r(name, &gr, buf, size, &res);
            if (!err && res)
                *gid = (long)res->gr_gid;
            free(buf);
        }
        if (err) {
            errno = err;
            return -1;
        }
        return res ? 0 : 1;
    }
    /* A group file in /etc/group's syntax "name:password:gid:members". */
    FILE *f = fopen(group_file, "re");
    if (!f)
        return -1;
    char line[4096];
    int rc = 1;
    size_t nlen = strlen(name);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, name, nlen) != 0 || line[nlen] != ':')
            continue;
        char *p = strchr(line + nlen + 1, ':');
        if (!p)
            continue;
        char *end;
        long v = strtol(p + 1, &end, 10);
        if (end == p + 1 || *end != ':' || v < 0 || v > 0x7fffffffL)
            continue;
        *gid = v;
        rc = 0;
        break;
    }
    fclose(f);
    return rc;
}

int fabric_shm_size_valid(const char *s)
{
    size_t i = 0;
    while (s[i] >= '0' && s[i] <= '9')
        i++;
    if (i == 0 || i > 12 || s[0] == '0')
        return 0;
    return !s[i] || (strchr("bkmgBKMG", s[i]) != NULL && s[i + 1] == '\0');
}

int fabric_pick_address(const struct fabric_iface *ifs, int n, char *out, size_t outlen)
{
    /* An interface of the RDMA fabric first: that is where the ranks'
     * collective traffic should go, not the management network. */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n; i++) {
            if (ifs[i].loopback || !ifs[i].up || (pass == 0 && !ifs[i].rdma))
                continue;
            snprintf(out, outlen, "%s", ifs[i].address);
            return 0;
        }
    }
    out[0] = '\0';
    return -1;
}

/* Whether /sys/class/infiniband/<any>/device/net/<ifname> exists. */
static int backs_rdma(const char *ifname)
{
    DIR *d = opendir("/sys/class/infiniband");
    if (!d)
        return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[PATH_MAX];
        int len = snprintf(path, sizeof path, "/sys/class/infiniband/%s/device/net/%s", e->d_name, ifname);
        found = len > 0 && (size_t)len < sizeof path && access(path, F_OK) == 0;
    }
    closedir(d);
    return found;
}

#define FABRIC_MAX_IFACES 64

int fabric_data_address(const struct agent *a, char *out, size_t outlen)
{
    if (a->conf->data_address[0]) {
        snprintf(out, outlen, "%s", a->conf->data_address);
        return 0;
    }
    /* Simulated nodes all live on this machine (and their SSH servers
     * may listen on loopback only). */
    if (a->fleet || strcmp(a->conf->runtime, "sim") == 0) {
        snprintf(out, outlen, "127.0.0.1");
        return 0;
    }
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) < 0) {
        out[0] = '\0';
        return -1;
    }
    struct fabric_iface ifs[FABRIC_MAX_IFACES];
    int n = 0;
    for (struct ifaddrs *p = list; p && n < FABRIC_MAX_IFACES; p = p->ifa_next) {
        if (!p->ifa_addr || p->ifa_addr->sa_family != AF_INET)
            continue;
        struct fabric_iface *f = &ifs[n];
        const struct sockaddr_in *sin = (const struct sockaddr_in *)(const void *)p->ifa_addr;
        if (!inet_ntop(AF_INET, &sin->sin_addr, f->address, sizeof f->address))
            continue;
        f->loopback = (p->ifa_flags & IFF_LOOPBACK) != 0 || (ntohl(sin->sin_addr.s_addr) >> 24) == 127;
        f->up = (p->ifa_flags & IFF_UP) != 0;
        f->rdma = !f->loopback && backs_rdma(p->ifa_name);
        n++;
    }
    freeifaddrs(list);
    return fabric_pick_address(ifs, n, out, outlen);
}

static int node_number_cmp(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* A topology node's gpu_id and drm_render_minor: 0 read, -1 not. */
static int read_node(const char *dir, long node, long *gpu_id, long *minor)
{
    char path[PATH_MAX], line[256];
    snprintf(path, sizeof path, "%s/%ld/properties", dir, node);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    *gpu_id = -1;
    *minor = -1;
    while (fgets(line, sizeof line, f)) {
        long v;
        if (sscanf(line, "gpu_id %ld", &v) == 1)
            *gpu_id = v;
        else if (sscanf(line, "drm_render_minor %ld", &v) == 1)
            *minor = v;
    }
    fclose(f);
    return 0;
}

/* ROCr numbers the GPU nodes of the KFD topology (gpu_id not 0; CPU nodes
 * have 0) in node order: that number is the card index the daemon
 * assigns, and ROCR_VISIBLE_DEVICES used to pick them. Giving a container
 * /dev/dri whole would let it open every card's render node, its
 * neighbours' too, whatever that variable says; the render nodes of its own
 * cards are all it gets (ROCr inside then sees those cards alone). */
int fabric_render_nodes(const char *topology_dir, const int *gpus, int n, char (*out)[FABRIC_RENDER_NODE_MAX],
                        char *why, size_t whylen)
{
    DIR *d = opendir(topology_dir);
    if (!d) {
        snprintf(why, whylen, "cannot read the KFD topology %s: %s", topology_dir, strerror(errno));
        return -1;
    }
    long nodes[256];
    size_t n_nodes = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n_nodes < sizeof nodes / sizeof nodes[0]) {
        char *end;
        long v = strtol(e->d_name, &end, 10);
        if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && !*end)
            nodes[n_nodes++] = v;
    }
    closedir(d);
    qsort(nodes, n_nodes, sizeof nodes[0], node_number_cmp);
    long minors[256];
    int n_gpus = 0;
    for (size_t i = 0; i < n_nodes; i++) {
        long gpu_id, minor;
        if (read_node(topology_dir, nodes[i], &gpu_id, &minor) < 0) {
            snprintf(why, whylen, "cannot read %s/%ld/properties: %s", topology_dir, nodes[i], strerror(errno));
            return -1;
        }
        if (gpu_id > 0)
            minors[n_gpus++] = minor;
    }
    for (int i = 0; i < n; i++) {
        if (gpus[i] < 0 || gpus[i] >= n_gpus || minors[gpus[i]] < 0) {
            snprintf(why, whylen, "card %d has no render node in the KFD topology %s (%d GPU nodes)", gpus[i],
                     topology_dir, n_gpus);
            return -1;
        }
        snprintf(out[i], FABRIC_RENDER_NODE_MAX, "/dev/dri/renderD%ld", minors[gpus[i]]);
    }
    return 0;
}
