/* sftp.c: `gpurent-agent sftp-server --root DIR`, an SFTP version 3 server
 * on stdin/stdout (sftp.h). Confinement is its point: DIR is opened once,
 * and every client path is resolved from that descriptor with openat2 and
 * RESOLVE_IN_ROOT, so `..` stops at DIR and a symlink, absolute or relative,
 * is followed as if DIR were "/"; the kernel checks this on every lookup,
 * also against directories renamed under it. Operations on a final
 * component (remove, rename, mkdir, symlink, readlink) run with *at() calls
 * on a plain name below a parent resolved the same way, and never follow
 * that name; attributes are changed through the /proc/self/fd link of a
 * descriptor so resolved, never by path. */
#include "agent.h"
#include "gpurent/fileio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <linux/openat2.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- packet coding (pure) ---- */

static const unsigned char *take(struct sftp_in *in, size_t n)
{
    if (in->bad || in->len - in->off < n) {
        in->bad = 1;
        return NULL;
    }
    const unsigned char *p = in->p + in->off;
    in->off += n;
    return p;
}

uint8_t sftp_get_u8(struct sftp_in *in)
{
    const unsigned char *p = take(in, 1);
    return p ? p[0] : 0;
}

uint32_t sftp_get_u32(struct sftp_in *in)
{
    const unsigned char *p = take(in, 4);
    return p ? (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3] : 0;
}

uint64_t sftp_get_u64(struct sftp_in *in)
{
    uint64_t hi = sftp_get_u32(in);
    return hi << 32 | sftp_get_u32(in);
}

const unsigned char *sftp_get_string(struct sftp_in *in, uint32_t *len)
{
    uint32_t n = sftp_get_u32(in);
    const unsigned char *p = take(in, n);
    *len = p ? n : 0;
    return p;
}

void sftp_get_cstring(struct sftp_in *in, char *out, size_t outlen)
{
    uint32_t n;
    const unsigned char *p = sftp_get_string(in, &n);
    if (outlen)
        out[0] = '\0';
    if (!p)
        return;
    if (n >= outlen || memchr(p, '\0', n)) {
        in->bad = 1;
        return;
    }
    memcpy(out, p, n);
    out[n] = '\0';
}

void sftp_get_attrs(struct sftp_in *in, struct sftp_attrs *a)
{
    memset(a, 0, sizeof *a);
    a->flags = sftp_get_u32(in);
    if (a->flags & SFTP_ATTR_SIZE)
        a->size = sftp_get_u64(in);
    if (a->flags & SFTP_ATTR_UIDGID) {
        a->uid = sftp_get_u32(in);
        a->gid = sftp_get_u32(in);
    }
    if (a->flags & SFTP_ATTR_PERMISSIONS)
        a->perm = sftp_get_u32(in);
    if (a->flags & SFTP_ATTR_ACMODTIME) {
        a->atime = sftp_get_u32(in);
        a->mtime = sftp_get_u32(in);
    }
    if (a->flags & SFTP_ATTR_EXTENDED) {
        uint32_t count = sftp_get_u32(in), n;
        /* Each pair is two strings of at least 4 bytes: a count the packet
         * cannot hold fails on the first string past its end. */
        for (uint32_t i = 0; i < count && !in->bad; i++) {
            sftp_get_string(in, &n);
            sftp_get_string(in, &n);
        }
    }
}

/* Room for n more bytes, or NULL (out->bad set). */
static unsigned char *reserve(struct sftp_out *out, size_t n)
{
    if (out->bad)
        return NULL;
    if (n > SFTP_PACKET_MAX + 4 - out->len) {
        out->bad = 1;
        return NULL;
    }
    if (out->len + n > out->cap) {
        size_t cap = out->cap ? out->cap : 4096;
        while (cap < out->len + n)
            cap *= 2;
        unsigned char *p = realloc(out->p, cap);
        if (!p) {
            out->bad = 1;
            return NULL;
        }
        out->p = p;
        out->cap = cap;
    }
    unsigned char *p = out->p + out->len;
    out->len += n;
    return p;
}

void sftp_out_begin(struct sftp_out *out, uint8_t type)
{
    out->len = 0;
    out->bad = 0;
    reserve(out, 4);
    sftp_put_u8(out, type);
}

void sftp_put_u8(struct sftp_out *out, uint8_t v)
{
    unsigned char *p = reserve(out, 1);
    if (p)
        p[0] = v;
}

static void store_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

void sftp_put_u32(struct sftp_out *out, uint32_t v)
{
    unsigned char *p = reserve(out, 4);
    if (p)
        store_u32(p, v);
}

void sftp_put_u64(struct sftp_out *out, uint64_t v)
{
    sftp_put_u32(out, (uint32_t)(v >> 32));
    sftp_put_u32(out, (uint32_t)v);
}

void sftp_put_string(struct sftp_out *out, const void *s, size_t len)
{
    if (len > UINT32_MAX) {
        out->bad = 1;
        return;
    }
    sftp_put_u32(out, (uint32_t)len);
    unsigned char *p = reserve(out, len);
    if (p && len)
        memcpy(p, s, len);
}

void sftp_put_cstring(struct sftp_out *out, const char *s)
{
    sftp_put_string(out, s, strlen(s));
}

void sftp_put_attrs(struct sftp_out *out, const struct sftp_attrs *a)
{
    uint32_t flags = a->flags & ~SFTP_ATTR_EXTENDED;
    sftp_put_u32(out, flags);
    if (flags & SFTP_ATTR_SIZE)
        sftp_put_u64(out, a->size);
    if (flags & SFTP_ATTR_UIDGID) {
        sftp_put_u32(out, a->uid);
        sftp_put_u32(out, a->gid);
    }
    if (flags & SFTP_ATTR_PERMISSIONS)
        sftp_put_u32(out, a->perm);
    if (flags & SFTP_ATTR_ACMODTIME) {
        sftp_put_u32(out, a->atime);
        sftp_put_u32(out, a->mtime);
    }
}

int sftp_out_finish(struct sftp_out *out)
{
    if (out->bad || out->len < 5)
        return -1;
    store_u32(out->p, (uint32_t)(out->len - 4));
    return 0;
}

void sftp_out_free(struct sftp_out *out)
{
    if (!out)
        return;
    free(out->p);
    memset(out, 0, sizeof *out);
}

/* ---- paths, names, statuses (pure) ---- */

/* Appends the components of in to out[0..*len), resolving "." and ".."
 * (which stops at the root); -1 when it does not fit. */
static int path_append(const char *in, char *out, size_t outlen, size_t *len)
{
    for (const char *p = in; *p;) {
        while (*p == '/')
            p++;
        const char *start = p;
        while (*p && *p != '/')
            p++;
        size_t n = (size_t)(p - start);
        if (n == 0 || (n == 1 && start[0] == '.'))
            continue;
        if (n == 2 && start[0] == '.' && start[1] == '.') {
            /* Back to the '/' that began the last component (out[0] when
             * it was the first, leaving len 0: the root). */
            while (*len > 0 && out[--*len] != '/')
                ;
            continue;
        }
        if (*len + 1 + n + 1 > outlen)
            return -1;
        out[*len] = '/';
        memcpy(out + *len + 1, start, n);
        *len += 1 + n;
    }
    return 0;
}

int sftp_path_normalize(const char *in, char *out, size_t outlen)
{
    size_t len = 0;
    if (outlen < 2)
        return -1;
    /* A relative path starts at the session's directory, /shared (what
     * REALPATH of "." answers): "shared/x" is the volume's own shared/x. */
    if (in[0] != '/' && path_append("/shared", out, outlen, &len) < 0)
        return -1;
    if (path_append(in, out, outlen, &len) < 0)
        return -1;
    out[len] = '\0';
    /* The volume is mounted at /shared in the container: /shared/x is its
     * x; other absolute paths name the volume's too (scp f host:/f). */
    if (len >= 7 && memcmp(out, "/shared", 7) == 0 && (len == 7 || out[7] == '/')) {
        memmove(out, out + 7, len - 7 + 1);
        len -= 7;
    }
    if (len == 0) {
        out[0] = '/';
        out[1] = '\0';
    }
    return 0;
}

const char *sftp_path_relative(const char *normalized)
{
    return normalized[0] == '/' && normalized[1] == '\0' ? "." : normalized + (normalized[0] == '/');
}

void sftp_longname(char *out, size_t outlen, const char *name, uint32_t mode, uint64_t nlink, uint32_t uid,
                   uint32_t gid, uint64_t size, int64_t mtime_s, int64_t now_s)
{
    char m[11];
    switch (mode & S_IFMT) {
    case S_IFDIR:
        m[0] = 'd';
        break;
    case S_IFLNK:
        m[0] = 'l';
        break;
    case S_IFCHR:
        m[0] = 'c';
        break;
    case S_IFBLK:
        m[0] = 'b';
        break;
    case S_IFIFO:
        m[0] = 'p';
        break;
    case S_IFSOCK:
        m[0] = 's';
        break;
    default:
        m[0] = '-';
        break;
    }
    const char *rwx = "rwxrwxrwx";
    for (int i = 0; i < 9; i++)
        m[1 + i] = (mode & (0400u >> i)) ? rwx[i] : '-';
    if (mode & S_ISUID)
        m[3] = (mode & S_IXUSR) ? 's' : 'S';
    if (mode & S_ISGID)
        m[6] = (mode & S_IXGRP) ? 's' : 'S';
    if (mode & S_ISVTX)
        m[9] = (mode & S_IXOTH) ? 't' : 'T';
    m[10] = '\0';
    /* ls shows the year instead of the time for files over six months
     * old or in the future. */
    const int64_t half_year = 182 * 24 * 3600;
    time_t t = (time_t)mtime_s;
    struct tm tm;
    char when[32] = "?";
    if (gmtime_r(&t, &tm))
        strftime(when, sizeof when, (mtime_s > now_s - half_year && mtime_s <= now_s) ? "%b %e %H:%M" : "%b %e  %Y",
                 &tm);
    snprintf(out, outlen, "%s %4llu %-8u %-8u %8llu %s %s", m, (unsigned long long)nlink, uid, gid,
             (unsigned long long)size, when, name);
}

uint32_t sftp_status_of_errno(int err)
{
    switch (err) {
    case 0:
        return SFTP_FX_OK;
    case ENOENT:
    case ENOTDIR:
    case EBADF:
    case ELOOP:
        return SFTP_FX_NO_SUCH_FILE;
    case EPERM:
    case EACCES:
    case EFAULT:
    case EXDEV:
        return SFTP_FX_PERMISSION_DENIED;
    case ENAMETOOLONG:
    case EINVAL:
        return SFTP_FX_BAD_MESSAGE;
    case ENOSYS:
    case EOPNOTSUPP:
        return SFTP_FX_OP_UNSUPPORTED;
    default:
        return SFTP_FX_FAILURE;
    }
}

/* ---- the server ---- */

/* The permission bits a client may set: no set-user-ID or set-group-ID,
 * since files are made as the agent's user (often root), and a program
 * that ran as it from the volume would be a way up. A mode given at
 * create time loses them silently, like bits a umask takes away; an
 * explicit chmod asking for them is refused. */
#define SFTP_MODE_BITS 01777u

struct sftp_handle {
    int used;        /* slot holds an open file or directory */
    uint32_t gen;    /* bumped on every close, so a stale handle string finds nothing */
    int fd;          /* the file, or the directory dir reads */
    DIR *dir;        /* OPENDIR handles; owns fd then */
    int dir_is_root; /* the directory is the root: its ".." is shown as itself */
};

struct sftp_server {
    int root_fd;         /* DIR, the client's "/" */
    int out_fd;          /* replies go here */
    int inited;          /* INIT seen */
    struct sftp_out out; /* the reply being built */
    struct stat root_st; /* DIR's identity, to recognise it when listed */
    struct sftp_handle handles[SFTP_HANDLES_MAX];
};

/* Sends the reply built in s->out; -1 when it cannot (the client is gone,
 * or the reply broke a bound, which would be a bug here). */
static int send_reply(struct sftp_server *s)
{
    if (sftp_out_finish(&s->out) != 0) {
        log_error("sftp-server: a reply could not be built (out of memory or over %d bytes)", SFTP_PACKET_MAX);
        return -1;
    }
    if (fd_write_all(s->out_fd, s->out.p, s->out.len) != 0) {
        log_error("sftp-server: writing a reply: %s", errno ? strerror(errno) : "the client stopped reading");
        return -1;
    }
    return 0;
}

static int send_status(struct sftp_server *s, uint32_t id, uint32_t code, const char *msg)
{
    sftp_out_begin(&s->out, SFTP_STATUS);
    sftp_put_u32(&s->out, id);
    sftp_put_u32(&s->out, code);
    sftp_put_cstring(&s->out, msg);
    sftp_put_cstring(&s->out, "en");
    return send_reply(s);
}

static int send_errno(struct sftp_server *s, uint32_t id, int err)
{
    return send_status(s, id, sftp_status_of_errno(err), strerror(err));
}

static int send_ok(struct sftp_server *s, uint32_t id)
{
    return send_status(s, id, SFTP_FX_OK, "Success");
}

static int send_bad_message(struct sftp_server *s, uint32_t id)
{
    return send_status(s, id, SFTP_FX_BAD_MESSAGE, "malformed request (a field is missing, too long or holds a NUL)");
}

static void attrs_of_stat(const struct stat *st, struct sftp_attrs *a)
{
    a->flags = SFTP_ATTR_SIZE | SFTP_ATTR_UIDGID | SFTP_ATTR_PERMISSIONS | SFTP_ATTR_ACMODTIME;
    a->size = (uint64_t)st->st_size;
    a->uid = st->st_uid;
    a->gid = st->st_gid;
    a->perm = st->st_mode;
    a->atime = (uint32_t)st->st_atime;
    a->mtime = (uint32_t)st->st_mtime;
}

/* Resolves a normalised path below the root with openat2; flags as for
 * open (O_CLOEXEC added), mode only with O_CREAT. The kernel answers
 * EAGAIN when a rename raced the lookup; it is tried again a few times. */
static int resolve(struct sftp_server *s, const char *normalized, uint64_t flags, uint64_t mode)
{
    struct open_how how = {.flags = flags | O_CLOEXEC,
                           .mode = (flags & O_CREAT) ? mode : 0,
                           .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
    const char *rel = sftp_path_relative(normalized);
    for (int tries = 0;; tries++) {
        long fd = syscall(SYS_openat2, s->root_fd, rel, &how, sizeof how);
        if (fd >= 0)
            return (int)fd;
        if (errno != EAGAIN || tries >= 8)
            return -1;
    }
}

/* A client path read from the packet and normalised. */
static void get_path(struct sftp_in *in, char *norm, size_t normlen)
{
    char raw[SFTP_PATH_MAX];
    sftp_get_cstring(in, raw, sizeof raw);
    if (!in->bad && sftp_path_normalize(raw, norm, normlen) != 0)
        in->bad = 1;
}

/* Opens the parent of a normalised path as an O_PATH directory and points
 * *name at the last component. -1 with errno; EPERM for the root itself,
 * which has no name to remove, rename or create. */
static int resolve_parent(struct sftp_server *s, char *normalized, const char **name)
{
    char *slash = strrchr(normalized, '/');
    if (!slash || slash[1] == '\0') {
        errno = EPERM;
        return -1;
    }
    *name = slash + 1;
    char parent[SFTP_PATH_MAX];
    size_t plen = (size_t)(slash - normalized);
    memcpy(parent, normalized, plen);
    strcpy(parent + plen, plen ? "" : "/");
    return resolve(s, parent, O_PATH | O_DIRECTORY, 0);
}

/* ---- handles ---- */

static void put_handle(struct sftp_out *out, int idx, uint32_t gen)
{
    unsigned char h[8];
    store_u32(h, (uint32_t)idx);
    store_u32(h + 4, gen);
    sftp_put_string(out, h, sizeof h);
}

static int new_handle(struct sftp_server *s, int fd, DIR *dir, int dir_is_root)
{
    for (int i = 0; i < SFTP_HANDLES_MAX; i++) {
        struct sftp_handle *h = &s->handles[i];
        if (!h->used) {
            h->used = 1;
            h->fd = fd;
            h->dir = dir;
            h->dir_is_root = dir_is_root;
            return i;
        }
    }
    return -1;
}

/* The handle a request names, or NULL (in->bad set when the field is
 * missing; a well-formed handle of nothing open just returns NULL). */
static struct sftp_handle *get_handle(struct sftp_server *s, struct sftp_in *in)
{
    uint32_t n;
    const unsigned char *p = sftp_get_string(in, &n);
    if (!p || n != 8)
        return NULL;
    struct sftp_in h = {.p = p, .len = n};
    uint32_t idx = sftp_get_u32(&h), gen = sftp_get_u32(&h);
    if (idx >= SFTP_HANDLES_MAX || !s->handles[idx].used || s->handles[idx].gen != gen)
        return NULL;
    return &s->handles[idx];
}

static void close_handle(struct sftp_handle *h)
{
    if (h->dir)
        closedir(h->dir);
    else
        close(h->fd);
    h->used = 0;
    h->dir = NULL;
    h->fd = -1;
    h->gen++;
}

static int send_handle(struct sftp_server *s, uint32_t id, int idx)
{
    sftp_out_begin(&s->out, SFTP_HANDLE);
    sftp_put_u32(&s->out, id);
    put_handle(&s->out, idx, s->handles[idx].gen);
    return send_reply(s);
}

static int send_no_handle(struct sftp_server *s, uint32_t id)
{
    return send_status(s, id, SFTP_FX_FAILURE, "invalid handle (not open, or already closed)");
}

/* ---- requests ---- */

static int do_open(struct sftp_server *s, uint32_t id, struct sftp_in *in)
{
    char path[SFTP_PATH_MAX];
    struct sftp_attrs a;
    get_path(in, path, sizeof path);
    uint32_t pflags = sftp_get_u32(in);
    sftp_get_attrs(in, &a);
    if (in->bad)
        return send_bad_message(s, id);
    uint64_t flags;
    if ((pflags & SFTP_OPEN_READ) && (pflags & SFTP_OPEN_WRITE))
        flags = O_RDWR;
    else if (pflags & SFTP_OPEN_WRITE)
        flags = O_WRONLY;
    else if (pflags & SFTP_OPEN_READ)
        flags = O_RDONLY;
    else
        return send_status(s, id, SFTP_FX_BAD_MESSAGE, "open needs read or write access");
    if (pflags & SFTP_OPEN_APPEND)
        flags |= O_APPEND;
    if (pflags & SFTP_OPEN_CREAT)
        flags |= O_CREAT;
    if (pflags & SFTP_OPEN_TRUNC)
        flags |= O_TRUNC;
    if (pflags & SFTP_OPEN_EXCL)
        flags |= O_EXCL;
    flags |= O_NOCTTY;
    unsigned mode = (a.flags & SFTP_ATTR_PERMISSIONS) ? (a.perm & SFTP_MODE_BITS) : 0666;
    /* Only regular files, and nothing else is opened even for a moment:
     * a device node in the volume (a container's root may make one) must
     * not be opened, read-write and as this server's user, before being
     * refused. What the path names is looked at through an O_PATH
     * descriptor, and only a regular file is then opened, through that
     * very descriptor (no other file can take its name in between). */
    int fd = -1, pfd = resolve(s, path, O_PATH, 0);
    struct stat st;
    if (pfd < 0 && errno == ENOENT && (flags & O_CREAT)) {
        fd = resolve(s, path, flags | O_EXCL, mode); /* made here: a regular file */
    } else if (pfd >= 0 && fstat(pfd, &st) == 0 && !S_ISREG(st.st_mode)) {
        close(pfd);
        return send_status(s, id, SFTP_FX_FAILURE, S_ISDIR(st.st_mode) ? "is a directory" : "not a regular file");
    } else if (pfd >= 0 && (flags & O_EXCL)) {
        errno = EEXIST;
    } else if (pfd >= 0) {
        char self[64];
        snprintf(self, sizeof self, "/proc/self/fd/%d", pfd);
        fd = open(self, (flags & ~O_CREAT) | O_CLOEXEC);
    }
    int err = errno;
    if (pfd >= 0)
        close(pfd);
    if (fd < 0)
        return send_errno(s, id, err);
    int idx = new_handle(s, fd, NULL, 0);
    if (idx < 0) {
        close(fd);
        return send_status(s, id, SFTP_FX_FAILURE, "too many open handles (the limit is 64)");
    }
    return send_handle(s, id, idx);
}

static int do_close(struct sftp_server *s, uint32_t id, struct sftp_in *in)
{
    struct sftp_handle *h = get_handle(s, in);
    if (in->bad)
        return send_bad_message(s, id);
    if (!h)
        return send_no_handle(s, id);
    /* A file's close can report a write error the file system deferred. */
    int err = 0;
    if (h->dir)
        closedir(h->dir);
    else if (close(h->fd) != 0)
        err = errno;
    h->used = 0;
    h->dir = NULL;
    h->fd = -1;
    h->gen++;
    return err ? send_errno(s, id, err) : send_ok(s, id);
}

static int do_read(struct sftp_server *s, uint32_t id, struct sftp_in *in)
{
    struct sftp_handle *h = get_handle(s, in);
    uint64_t off = sftp_get_u64(in);
    uint32_t want = sftp_get_u32(in);
    if (in->bad)
        return send_bad_message(s, id);
    if (!h || h->dir)
        return send_no_handle(s, id);
    if (off > INT64_MAX)
        return send_status(s, id, SFTP_FX_BAD_MESSAGE, "offset out of range");
    /* A longer read is answered with less data, which the protocol allows
     * and clients continue from. */
    if (want > SFTP_DATA_MAX)
        want = SFTP_DATA_MAX;
    sftp_out_begin(&s->out, SFTP_DATA);
    sftp_put_u32(&s->out, id);
    size_t len_at = s->out.len;
    sftp_put_u32(&s->out, 0);
    unsigned char *buf = reserve(&s->out, want);
    if (!buf)
        return send_status(s, id, SFTP_FX_FAILURE, "out of memory");
    ssize_t n;
    do
        n = pread(h->fd, buf, want, (off_t)off);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return send_errno(s, id, errno);
    if (n == 0 && want > 0)
        return send_status(s, id, SFTP_FX_EOF, "End of file");
    s->out.len = len_at + 4 + (size_t)n;
    store_u32(s->out.p + len_at, (uint32_t)n);
    return send_reply(s);
}

static int do_write(struct sftp_server *s, uint32_t id, struct sftp_in *in)
{
    struct sftp_handle *h = get_handle(s, in);
    uint64_t off = sftp_get_u64(in);
    uint32_t n;
    const unsigned char *data = sftp_get_string(in, &n);
    if (in->bad)
        return send_bad_message(s, id);
    if (!h || h->dir)
        return send_no_handle(s, id);
    if (off > INT64_MAX || n > INT64_MAX - off)
        return send_status(s, id, SFTP_FX_BAD_MESSAGE, "offset out of range");
    while (n > 0) {
        ssize_t w = pwrite(h->fd, data, n, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return send_errno(s, id, errno);
        if (w == 0)
            return send_status(s, id, SFTP_FX_FAILURE, "write made no progress (disk full?)");
        data += w;
        n -= (uint32_t)w;
        off += (uint64_t)w;
    }
    return send_ok(s, id);
}

static int send_attrs_of(struct sftp_server *s, uint32_t id, const struct stat *st)
{
    struct sftp_attrs a;
    attrs_of_stat(st, &a);
    sftp_out_begin(&s->out, SFTP_ATTRS);
    sftp_put_u32(&s->out, id);
    sftp_put_attrs(&s->out, &a);
    return send_reply(s);
}

/* STAT follows a final symlink (inside the root), LSTAT does not. */
static int do_stat(struct sftp_server *s, uint32_t id, struct sftp_in *in, int follow)
{
    char path[SFTP_PATH_MAX];
    get_path(in, path, sizeof path);
    if (in->bad)
        return send_bad_message(s, id);
    int fd = resolve(s, path, O_PATH | (follow ? 0 : O_NOFOLLOW), 0);
    if (fd < 0)
        return send_errno(s, id, errno);
    struct stat st;
    int rc = fstat(fd, &st), err = errno;
    close(fd);
    return rc == 0 ? send_attrs_of(s, id, &st) : send_errno(s, id, err);
}

static int do_fstat(struct sftp_server *s, uint32_t id, struct sftp_in *in)
{
    struct sftp_handle *h = get_handle(s, in);
    if (in->bad)
        return send_bad_message(s, id);
    if (!h)
        return send_no_handle(s, id);
    struct stat st;
    if (fstat(h->fd, &st) != 0)
        return send_errno(s, id, errno);
    return send_attrs_of(s, id, &st);
}

/* Applies size, permissions and times to the file fd refers to. An O_PATH
 * descriptor (SETSTAT) allows no f*() call, so its /proc/self/fd link is
 * used: the kernel resolves that to the very file, not to a path that
 * could have changed. Owner and group are not changed: the server runs as
 * one user, so only values equal to the file's own pass. */
static int apply_attrs(struct sftp_server *s, uint32_t id, int fd, int is_opath, const struct sftp_attrs *a)
{
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    struct stat st;
    if (fstat(fd, &st) != 0)
        return send_errno(s, id, errno);
    if ((a->flags & SFTP_ATTR_UIDGID) && (a->uid != st.st_uid || a->gid != st.st_gid))
        return send_status(s, id, SFTP_FX_PERMISSION_DENIED, "changing a file's owner or group is not supported");
    if (a->flags & SFTP_ATTR_SIZE) {
        if (a->size > INT64_MAX)
            return send_status(s, id, SFTP_FX_BAD_MESSAGE, "size out of range");
        if ((is_opath ? truncate(link, (off_t)a->size) : ftruncate(fd, (off_t)a->size)) != 0)
            return send_errno(s, id, errno);
    }
    if (a->flags & SFTP_ATTR_PERMISSIONS) {
        if (a->perm & (S_ISUID | S_ISGID))
            return send_status(s, id, SFTP_FX_PERMISSION_DENIED, "set-user-ID and set-group-ID bits are not allowed");
        mode_t mode = a->perm & SFTP_MODE_BITS;
        if ((is_opath ? chmod(link, mode) : fchmod(fd, mode)) != 0)
            return send_errno(s, id, errno);
    }
    if (a->flags & SFTP_ATTR_ACMODTIME) {
        struct timespec ts[2] = {{.tv_sec = a->atime}, {.tv_sec = a->mtime}};
        if ((is_opath ? utimensat(AT_FDCWD, link, ts, 0) : futimens(fd, ts)) != 0)
            return send_errno(s, id, errno);
    }
    return send_ok(s, id);
}

static int do_setstat(struct sftp_server *s, uint32_t id, struct sftp_in *in)
{
    char path[SFTP_PATH_MAX];
    struct sftp_attrs a;
    get_path(in, path, sizeof path);
    sftp_get_attrs(in, &a);
    if (in->bad)
        return send_bad_message(s, id);
    int fd = resolve(s, path, O_PATH, 0);
    if (fd < 0)
        return send_errno(s, id, errno);
    int rc = apply_attrs(s, id, fd, 1, &a);
    close(fd);
    return rc;
}

static int do_fsetstat(struct sftp_server *s, uint32_t id, struct sftp_in *in)
{
    struct sftp_attrs a;
    struct sftp_handle *h = get_handle(s, in);
    sftp_get_attrs(in, &a);
    if (in->bad)
        return send_bad_message(s, id);
    if (!h)
        return send_no_handle(s, id);
    /* A directory handle's descriptor is read-only; chmod and times on it
     * work through fchmod/futimens, size does not apply. */
    return apply_attrs(s, id, h->fd, 0, &a);
}

static int do_opendir(struct sftp_server *s, uint32_t id, struct sftp_in *in)
{
    char path[SFTP_PATH_MAX];
    get_path(in, path, sizeof path);
    if (in->bad)
        return send_bad_message(s, id);
    int fd = resolve(s, path, O_RDONLY | O_DIRECTORY, 0);
    if (fd < 0)
        return send_errno(s, id, errno);
    struct stat st;
    int is_root = fstat(fd, &st) == 0 && st.st_dev == s->root_st.st_dev && st.st_ino == s->root_st.st_ino;
    DIR *dir = fdopendir(fd);
    if (!dir) {
        int err = errno;
        close(fd);
        return send_errno(s, id, err);
    }
    int idx = new_handle(s, fd, dir, is_root);
    if (idx < 0) {
        closedir(dir);
        return send_status(s, id, SFTP_FX_FAILURE, "too many open handles (the limit is 64)");
    }
    return send_handle(s, id, idx);
}

static int do_readdir(struct sftp_server *s, uint32_t id, struct sftp_in *in)
{
    struct sftp_handle *h = get_handle(s, in);
    if (in->bad)
        return send_bad_message(s, id);
    if (!h || !h->dir)
        return send_no_handle(s, id);
    sftp_out_begin(&s->out, SFTP_NAME);
    sftp_put_u32(&s->out, id);
    size_t count_at = s->out.len;
    sftp_put_u32(&s->out, 0);
    uint32_t count = 0;
    int64_t now = (int64_t)time(NULL);
    while (count < SFTP_READDIR_BATCH) {
        errno = 0;
        struct dirent *e = readdir(h->dir);
        if (!e) {
            if (errno)
                return send_errno(s, id, errno);
            break;
        }
        struct stat st;
        /* The root's ".." would show the host directory above it: it is
         * shown as the root itself, the way "/.." is "/". */
        const char *stat_name = (h->dir_is_root && strcmp(e->d_name, "..") == 0) ? "." : e->d_name;
        if (fstatat(h->fd, stat_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue; /* removed since it was listed */
        struct sftp_attrs a;
        attrs_of_stat(&st, &a);
        char longname[512];
        sftp_longname(longname, sizeof longname, e->d_name, st.st_mode, st.st_nlink, st.st_uid, st.st_gid,
                      (uint64_t)st.st_size, (int64_t)st.st_mtime, now);
        sftp_put_cstring(&s->out, e->d_name);
        sftp_put_cstring(&s->out, longname);
        sftp_put_attrs(&s->out, &a);
        count++;
    }
    if (count == 0)
        return send_status(s, id, SFTP_FX_EOF, "End of directory");
    if (s->out.bad)
        return send_status(s, id, SFTP_FX_FAILURE, "out of memory");
    store_u32(s->out.p + count_at, count);
    return send_reply(s);
}

/* REMOVE and RMDIR: the last component itself, never what it points to. */
static int do_unlink(struct sftp_server *s, uint32_t id, struct sftp_in *in, int flags)
{
    char path[SFTP_PATH_MAX];
    const char *name;
    get_path(in, path, sizeof path);
    if (in->bad)
        return send_bad_message(s, id);
    int pfd = resolve_parent(s, path, &name);
    if (pfd < 0)
        return send_errno(s, id, errno);
    int rc = unlinkat(pfd, name, flags), err = errno;
    close(pfd);
    return rc == 0 ? send_ok(s, id) : send_errno(s, id, err);
}

static int do_mkdir(struct sftp_server *s, uint32_t id, struct sftp_in *in)
{
    char path[SFTP_PATH_MAX];
    struct sftp_attrs a;
    const char *name;
    get_path(in, path, sizeof path);
    sftp_get_attrs(in, &a);
    if (in->bad)
        return send_bad_message(s, id);
    int pfd = resolve_parent(s, path, &name);
    if (pfd < 0)
        return send_errno(s, id, errno == EPERM ? EEXIST : errno);
    mode_t mode = (a.flags & SFTP_ATTR_PERMISSIONS) ? (a.perm & SFTP_MODE_BITS) : 0777;
    int rc = mkdirat(pfd, name, mode), err = errno;
    close(pfd);
    return rc == 0 ? send_ok(s, id) : send_errno(s, id, err);
}

static int send_one_name(struct sftp_server *s, uint32_t id, const char *name)
{
    struct sftp_attrs none = {0};
    sftp_out_begin(&s->out, SFTP_NAME);
    sftp_put_u32(&s->out, id);
    sftp_put_u32(&s->out, 1);
    sftp_put_cstring(&s->out, name);
    sftp_put_cstring(&s->out, name);
    sftp_put_attrs(&s->out, &none);
    return send_reply(s);
}

/* Answers the path as the container names it, under /shared: clients
 * build the paths they send next from it. */
static int do_realpath(struct sftp_server *s, uint32_t id, struct sftp_in *in)
{
    char path[SFTP_PATH_MAX], shown[SFTP_PATH_MAX + 8];
    get_path(in, path, sizeof path);
    if (in->bad)
        return send_bad_message(s, id);
    snprintf(shown, sizeof shown, "/shared%s", strcmp(path, "/") == 0 ? "" : path);
    return send_one_name(s, id, shown);
}

/* RENAME refuses to replace an existing target (version 3's rule);
 * posix-rename@openssh.com replaces it. */
static int do_rename(struct sftp_server *s, uint32_t id, struct sftp_in *in, int replace)
{
    char from[SFTP_PATH_MAX], to[SFTP_PATH_MAX];
    const char *from_name, *to_name;
    get_path(in, from, sizeof from);
    get_path(in, to, sizeof to);
    if (in->bad)
        return send_bad_message(s, id);
    int from_fd = resolve_parent(s, from, &from_name);
    if (from_fd < 0)
        return send_errno(s, id, errno);
    int to_fd = resolve_parent(s, to, &to_name);
    if (to_fd < 0) {
        int err = errno;
        close(from_fd);
        return send_errno(s, id, err);
    }
    int rc = renameat2(from_fd, from_name, to_fd, to_name, replace ? 0 : RENAME_NOREPLACE);
    if (rc != 0 && !replace && errno == EINVAL) {
        /* A file system without RENAME_NOREPLACE: check, then rename (a
         * race with another writer can still replace, as on OpenSSH). */
        struct stat st;
        if (fstatat(to_fd, to_name, &st, AT_SYMLINK_NOFOLLOW) == 0)
            errno = EEXIST;
        else
            rc = renameat(from_fd, from_name, to_fd, to_name);
    }
    int err = errno;
    close(from_fd);
    close(to_fd);
    return rc == 0 ? send_ok(s, id) : send_errno(s, id, err);
}

static int do_readlink(struct sftp_server *s, uint32_t id, struct sftp_in *in)
{
    char path[SFTP_PATH_MAX], target[SFTP_PATH_MAX];
    const char *name;
    get_path(in, path, sizeof path);
    if (in->bad)
        return send_bad_message(s, id);
    int pfd = resolve_parent(s, path, &name);
    if (pfd < 0)
        return send_errno(s, id, errno == EPERM ? EINVAL : errno);
    ssize_t n = readlinkat(pfd, name, target, sizeof target - 1);
    int err = errno;
    close(pfd);
    if (n < 0)
        return send_errno(s, id, err);
    target[n] = '\0';
    return send_one_name(s, id, target);
}

/* OpenSSH sends SYMLINK's target first and the link's path second, the
 * reverse of the draft; every client in use follows OpenSSH. The target is
 * stored as given: whoever follows it through this server does so inside
 * the root. */
static int do_symlink(struct sftp_server *s, uint32_t id, struct sftp_in *in)
{
    char target[SFTP_PATH_MAX], link[SFTP_PATH_MAX];
    const char *name;
    sftp_get_cstring(in, target, sizeof target);
    get_path(in, link, sizeof link);
    if (in->bad || target[0] == '\0')
        return send_bad_message(s, id);
    int pfd = resolve_parent(s, link, &name);
    if (pfd < 0)
        return send_errno(s, id, errno == EPERM ? EEXIST : errno);
    int rc = symlinkat(target, pfd, name), err = errno;
    close(pfd);
    return rc == 0 ? send_ok(s, id) : send_errno(s, id, err);
}

static int do_hardlink(struct sftp_server *s, uint32_t id, struct sftp_in *in)
{
    char from[SFTP_PATH_MAX], to[SFTP_PATH_MAX];
    const char *from_name, *to_name;
    get_path(in, from, sizeof from);
    get_path(in, to, sizeof to);
    if (in->bad)
        return send_bad_message(s, id);
    int from_fd = resolve_parent(s, from, &from_name);
    if (from_fd < 0)
        return send_errno(s, id, errno);
    int to_fd = resolve_parent(s, to, &to_name);
    if (to_fd < 0) {
        int err = errno;
        close(from_fd);
        return send_errno(s, id, err);
    }
    /* Without AT_SYMLINK_FOLLOW a symlink is linked itself, not its target. */
    int rc = linkat(from_fd, from_name, to_fd, to_name, 0), err = errno;
    close(from_fd);
    close(to_fd);
    return rc == 0 ? send_ok(s, id) : send_errno(s, id, err);
}

static int send_statvfs(struct sftp_server *s, uint32_t id, const struct statvfs *v)
{
    sftp_out_begin(&s->out, SFTP_EXTENDED_REPLY);
    sftp_put_u32(&s->out, id);
    sftp_put_u64(&s->out, v->f_bsize);
    sftp_put_u64(&s->out, v->f_frsize);
    sftp_put_u64(&s->out, v->f_blocks);
    sftp_put_u64(&s->out, v->f_bfree);
    sftp_put_u64(&s->out, v->f_bavail);
    sftp_put_u64(&s->out, v->f_files);
    sftp_put_u64(&s->out, v->f_ffree);
    sftp_put_u64(&s->out, v->f_favail);
    sftp_put_u64(&s->out, v->f_fsid);
    /* OpenSSH's flag bits: 1 read-only, 2 nosuid. */
    sftp_put_u64(&s->out, ((v->f_flag & ST_RDONLY) ? 1u : 0u) | ((v->f_flag & ST_NOSUID) ? 2u : 0u));
    sftp_put_u64(&s->out, v->f_namemax);
    return send_reply(s);
}

static int do_extended(struct sftp_server *s, uint32_t id, struct sftp_in *in)
{
    char name[64];
    sftp_get_cstring(in, name, sizeof name);
    if (in->bad)
        return send_status(s, id, SFTP_FX_OP_UNSUPPORTED, "unknown extension");
    if (strcmp(name, "posix-rename@openssh.com") == 0)
        return do_rename(s, id, in, 1);
    if (strcmp(name, "hardlink@openssh.com") == 0)
        return do_hardlink(s, id, in);
    if (strcmp(name, "statvfs@openssh.com") == 0 || strcmp(name, "fstatvfs@openssh.com") == 0) {
        int fd, own = name[0] == 's';
        if (own) {
            char path[SFTP_PATH_MAX];
            get_path(in, path, sizeof path);
            if (in->bad)
                return send_bad_message(s, id);
            if ((fd = resolve(s, path, O_PATH, 0)) < 0)
                return send_errno(s, id, errno);
        } else {
            struct sftp_handle *h = get_handle(s, in);
            if (in->bad)
                return send_bad_message(s, id);
            if (!h)
                return send_no_handle(s, id);
            fd = h->fd;
        }
        struct statvfs v;
        int rc = fstatvfs(fd, &v), err = errno;
        if (own)
            close(fd);
        return rc == 0 ? send_statvfs(s, id, &v) : send_errno(s, id, err);
    }
    if (strcmp(name, "fsync@openssh.com") == 0) {
        struct sftp_handle *h = get_handle(s, in);
        if (in->bad)
            return send_bad_message(s, id);
        if (!h)
            return send_no_handle(s, id);
        return fsync(h->fd) == 0 ? send_ok(s, id) : send_errno(s, id, errno);
    }
    if (strcmp(name, "limits@openssh.com") == 0) {
        sftp_out_begin(&s->out, SFTP_EXTENDED_REPLY);
        sftp_put_u32(&s->out, id);
        sftp_put_u64(&s->out, SFTP_PACKET_MAX);
        sftp_put_u64(&s->out, SFTP_DATA_MAX);
        sftp_put_u64(&s->out, SFTP_DATA_MAX);
        sftp_put_u64(&s->out, SFTP_HANDLES_MAX);
        return send_reply(s);
    }
    return send_status(s, id, SFTP_FX_OP_UNSUPPORTED, "unknown extension");
}

static int send_version(struct sftp_server *s)
{
    static const char *const ext[][2] = {
        {"posix-rename@openssh.com", "1"},
        {"statvfs@openssh.com",      "2"},
        {"fstatvfs@openssh.com",     "2"},
        {"hardlink@openssh.com",     "1"},
        {"fsync@openssh.com",        "1"},
        {"limits@openssh.com",       "1"},
    };
    sftp_out_begin(&s->out, SFTP_VERSION);
    sftp_put_u32(&s->out, 3);
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        sftp_put_cstring(&s->out, ext[i][0]);
        sftp_put_cstring(&s->out, ext[i][1]);
    }
    return send_reply(s);
}

/* One request; -1 ends the session (the client is gone or broke the
 * protocol in a way no status can answer). */
static int handle_packet(struct sftp_server *s, const unsigned char *p, size_t len)
{
    struct sftp_in in = {.p = p, .len = len};
    uint8_t type = sftp_get_u8(&in);
    if (type == SFTP_INIT) {
        if (s->inited) {
            log_error("sftp-server: a second INIT");
            return -1;
        }
        s->inited = 1;
        sftp_get_u32(&in); /* the client's version: we speak 3 whatever it is */
        return send_version(s);
    }
    if (!s->inited) {
        log_error("sftp-server: request of type %u before INIT", type);
        return -1;
    }
    uint32_t id = sftp_get_u32(&in);
    if (in.bad) {
        log_error("sftp-server: a request too short to hold its id");
        return -1;
    }
    switch (type) {
    case SFTP_OPEN:
        return do_open(s, id, &in);
    case SFTP_CLOSE:
        return do_close(s, id, &in);
    case SFTP_READ:
        return do_read(s, id, &in);
    case SFTP_WRITE:
        return do_write(s, id, &in);
    case SFTP_LSTAT:
        return do_stat(s, id, &in, 0);
    case SFTP_STAT:
        return do_stat(s, id, &in, 1);
    case SFTP_FSTAT:
        return do_fstat(s, id, &in);
    case SFTP_SETSTAT:
        return do_setstat(s, id, &in);
    case SFTP_FSETSTAT:
        return do_fsetstat(s, id, &in);
    case SFTP_OPENDIR:
        return do_opendir(s, id, &in);
    case SFTP_READDIR:
        return do_readdir(s, id, &in);
    case SFTP_REMOVE:
        return do_unlink(s, id, &in, 0);
    case SFTP_RMDIR:
        return do_unlink(s, id, &in, AT_REMOVEDIR);
    case SFTP_MKDIR:
        return do_mkdir(s, id, &in);
    case SFTP_REALPATH:
        return do_realpath(s, id, &in);
    case SFTP_RENAME:
        return do_rename(s, id, &in, 0);
    case SFTP_READLINK:
        return do_readlink(s, id, &in);
    case SFTP_SYMLINK:
        return do_symlink(s, id, &in);
    case SFTP_EXTENDED:
        return do_extended(s, id, &in);
    default:
        return send_status(s, id, SFTP_FX_OP_UNSUPPORTED, "unsupported request type");
    }
}

/* Reads exactly n bytes: 1, 0 at end of input before the first byte, -1
 * on an error or end of input in the middle. */
static int read_exact(int fd, unsigned char *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, p + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            return got == 0 ? 0 : -1;
        got += (size_t)r;
    }
    return 1;
}

int sftp_serve(int root_fd, int in_fd, int out_fd)
{
    struct sftp_server *s = calloc(1, sizeof *s);
    unsigned char *pkt = malloc(SFTP_PACKET_MAX);
    int status = 1;
    if (!s || !pkt) {
        log_error("sftp-server: out of memory");
        goto out;
    }
    s->root_fd = root_fd;
    s->out_fd = out_fd;
    if (fstat(root_fd, &s->root_st) != 0) {
        log_error("sftp-server: cannot stat the root: %s", strerror(errno));
        goto out;
    }
    for (;;) {
        unsigned char lenbuf[4];
        int r = read_exact(in_fd, lenbuf, 4);
        if (r == 0) {
            status = 0;
            break;
        }
        if (r < 0) {
            log_error("sftp-server: reading a request: %s", errno ? strerror(errno) : "input ended mid-packet");
            break;
        }
        uint32_t len = (uint32_t)lenbuf[0] << 24 | (uint32_t)lenbuf[1] << 16 | (uint32_t)lenbuf[2] << 8 | lenbuf[3];
        /* Nothing after a bad length can be framed again, so it ends the
         * session, as in OpenSSH. */
        if (len < 1 || len > SFTP_PACKET_MAX) {
            log_error("sftp-server: a packet of %u bytes (at most %d are accepted)", len, SFTP_PACKET_MAX);
            break;
        }
        errno = 0;
        if (read_exact(in_fd, pkt, len) != 1) {
            log_error("sftp-server: reading a request: %s", errno ? strerror(errno) : "input ended mid-packet");
            break;
        }
        if (handle_packet(s, pkt, len) != 0)
            break;
    }
out:
    if (s) {
        for (int i = 0; i < SFTP_HANDLES_MAX; i++)
            if (s->handles[i].used)
                close_handle(&s->handles[i]);
        sftp_out_free(&s->out);
    }
    free(s);
    free(pkt);
    return status;
}

static void sftp_usage(FILE *f)
{
    fprintf(f, "usage: gpurent-agent sftp-server --root DIR\n"
               "\n"
               "Serves SFTP version 3 on stdin and stdout with DIR as \"/\" (\"/shared\" names it too);\n"
               "no path leaves DIR, through \"..\" or a symlink. The agent's SSH server runs it for\n"
               "the sftp subsystem; `sftp -D` and `scp -D` can run it directly.\n"
               "\n"
               "  --root DIR    the directory served\n"
               "  -h, --help    this help\n");
}

int agent_cmd_sftp_server(int argc, char **argv)
{
    static const struct option long_opts[] = {
        {"root", required_argument, NULL, 'r'},
        {"help", no_argument,       NULL, 'h'},
        {NULL,   0,                 NULL, 0  },
    };
    const char *root = NULL;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        switch (opt) {
        case 'r':
            root = optarg;
            break;
        case 'h':
            sftp_usage(stdout);
            return 0;
        default:
            sftp_usage(stderr);
            return 2;
        }
    }
    if (!root || optind != argc) {
        sftp_usage(stderr);
        return 2;
    }
    int root_fd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root_fd < 0) {
        log_error("sftp-server: cannot open %s: %s", root, strerror(errno));
        return 1;
    }
    /* A client that goes away must end us with an error from write, not a
     * signal. */
    signal(SIGPIPE, SIG_IGN);
    int status = sftp_serve(root_fd, STDIN_FILENO, STDOUT_FILENO);
    close(root_fd);
    return status;
}
