/* fuzz_sftp.c: fuzz target for the agent's SFTP server (sftp_serve), fed
 * the bytes a renter's client sends, over a fresh directory each run:
 * every reply is a well-framed packet of a reply type, the first is
 * VERSION, each request after INIT is answered once and in order with its
 * own id, a STATUS other than OK carries a message, nothing outside the
 * served directory changes, and the session closes every descriptor it
 * opened. */
#include "sftp.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Written outside the served directory: it must read back unchanged. */
static const char sentinel_text[] = "outside the root\n";

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        abort();
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the one opendir holds */
}

/* Removes what is below dirfd (the run's files), whatever modes a client
 * set on them; symlinks are removed, never followed. */
static void empty_dir(int dirfd)
{
    fchmod(dirfd, 0700);
    int dup_fd = dup(dirfd);
    DIR *d = fdopendir(dup_fd);
    if (!d)
        abort();
    rewinddir(d); /* a dup shares the offset that an earlier listing left at the end */
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        struct stat st;
        if (fstatat(dirfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
            int sub = openat(dirfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0) {
                empty_dir(sub);
                close(sub);
            }
            unlinkat(dirfd, e->d_name, AT_REMOVEDIR);
        } else {
            unlinkat(dirfd, e->d_name, 0);
        }
    }
    closedir(d);
}

/* A base directory holding root/ (served) and outside/sentinel, made once
 * per process; root/ is emptied after each run. */
static char base[64];
static int base_fd = -1, root_fd = -1;

/* At exit: the base goes, so replays leave nothing in /tmp. */
static void remove_base(void)
{
    empty_dir(base_fd);
    rmdir(base);
}

static void setup(void)
{
    if (base_fd >= 0)
        return;
    snprintf(base, sizeof base, "%s", "/tmp/fuzz-sftp-XXXXXX");
    if (!mkdtemp(base))
        abort();
    base_fd = open(base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (base_fd < 0 || mkdirat(base_fd, "root", 0700) != 0 || mkdirat(base_fd, "outside", 0700) != 0)
        abort();
    int s = openat(base_fd, "outside/sentinel", O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (s < 0 || write(s, sentinel_text, sizeof sentinel_text - 1) != (ssize_t)(sizeof sentinel_text - 1))
        abort();
    close(s);
    root_fd = openat(base_fd, "root", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root_fd < 0)
        abort();
    atexit(remove_base);
}

/* Nothing but root/ and outside/ in the base, and the sentinel alone and
 * unchanged in outside/. */
static void check_outside_untouched(void)
{
    DIR *d = fdopendir(dup(base_fd));
    if (!d)
        abort();
    rewinddir(d); /* as in empty_dir */
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, "root") &&
            strcmp(e->d_name, "outside"))
            abort(); /* a client made a file beside the root */
    closedir(d);
    struct stat st;
    if (fstatat(base_fd, "outside", &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) ||
        (st.st_mode & 07777) != 0700 || st.st_nlink != 2)
        abort();
    int s = openat(base_fd, "outside/sentinel", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    char buf[64];
    if (s < 0 || fstat(s, &st) != 0 || (st.st_mode & 07777) != 0600 || st.st_nlink != 1)
        abort();
    ssize_t n = read(s, buf, sizeof buf);
    close(s);
    if (n != (ssize_t)(sizeof sentinel_text - 1) || memcmp(buf, sentinel_text, (size_t)n) != 0)
        abort();
}

/* The ids of the requests the server must answer, in order: those of the
 * whole packets after an INIT, up to the first one that ends the session
 * (a bad length, a second INIT, a packet too short for its id). */
static size_t expected_ids(const uint8_t *data, size_t size, uint32_t *ids, size_t max, int *saw_init)
{
    size_t off = 0, n = 0;
    *saw_init = 0;
    while (size - off >= 4) {
        uint32_t len = be32(data + off);
        if (len < 1 || len > SFTP_PACKET_MAX || size - off - 4 < len)
            break;
        const uint8_t *p = data + off + 4;
        off += 4 + len;
        if (p[0] == SFTP_INIT) {
            if (*saw_init)
                break;
            *saw_init = 1;
            continue;
        }
        if (!*saw_init || len < 5)
            break;
        if (n == max)
            break;
        ids[n++] = be32(p + 1);
    }
    return n;
}

static int reply_type_known(uint8_t t)
{
    return t == SFTP_STATUS || t == SFTP_HANDLE || t == SFTP_DATA || t == SFTP_NAME || t == SFTP_ATTRS ||
           t == SFTP_EXTENDED_REPLY;
}

/* Checks the replies in out against the requests' ids. */
static void check_replies(const unsigned char *out, size_t out_len, int saw_init, const uint32_t *ids, size_t n_ids)
{
    size_t off = 0, replies = 0;
    int version_seen = 0;
    while (off < out_len) {
        if (out_len - off < 4)
            abort(); /* a torn length word */
        uint32_t len = be32(out + off);
        if (len < 1 || len > SFTP_PACKET_MAX || out_len - off - 4 < len)
            abort(); /* a reply the client could not frame */
        const unsigned char *p = out + off + 4;
        off += 4 + len;
        if (!version_seen) {
            if (p[0] != SFTP_VERSION || len < 5 || be32(p + 1) != 3)
                abort();
            version_seen = 1;
            continue;
        }
        if (!reply_type_known(p[0]) || len < 5)
            abort();
        if (replies >= n_ids || be32(p + 1) != ids[replies])
            abort(); /* a reply to no request, or out of order */
        replies++;
        if (p[0] == SFTP_STATUS) {
            struct sftp_in in = {.p = p + 5, .len = len - 5};
            uint32_t code = sftp_get_u32(&in), msg_len;
            sftp_get_string(&in, &msg_len);
            uint32_t lang_len;
            sftp_get_string(&in, &lang_len);
            if (in.bad || in.off != in.len)
                abort();
            if (code != SFTP_FX_OK && code != SFTP_FX_EOF && msg_len == 0)
                abort(); /* a refusal without a reason */
        }
    }
    if (version_seen != saw_init)
        abort();
    /* Every request answered: the server stops early only at the framing
     * errors expected_ids stops at too, or when it cannot write. */
    if (replies != n_ids)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    int fds_before = open_fds();
    int in_fd = memfd_create("sftp-in", MFD_CLOEXEC), out_fd = memfd_create("sftp-out", MFD_CLOEXEC);
    if (in_fd < 0 || out_fd < 0)
        abort();
    if (size && write(in_fd, data, size) != (ssize_t)size)
        abort();
    lseek(in_fd, 0, SEEK_SET);
    int saw_init;
    uint32_t ids[4096];
    size_t n_ids = expected_ids(data, size, ids, sizeof ids / sizeof ids[0], &saw_init);

    sftp_serve(root_fd, in_fd, out_fd);

    off_t out_len = lseek(out_fd, 0, SEEK_END);
    unsigned char *out = NULL;
    if (out_len > 0) {
        out = mmap(NULL, (size_t)out_len, PROT_READ, MAP_PRIVATE, out_fd, 0);
        if (out == MAP_FAILED)
            abort();
    }
    if (n_ids < sizeof ids / sizeof ids[0])
        check_replies(out, (size_t)out_len, saw_init, ids, n_ids);
    if (out)
        munmap(out, (size_t)out_len);
    close(in_fd);
    close(out_fd);
    if (open_fds() != fds_before)
        abort(); /* a handle the session left open */
    check_outside_untouched();
    int dir = openat(base_fd, "root", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir < 0)
        abort();
    empty_dir(dir);
    close(dir);
    return 0;
}
