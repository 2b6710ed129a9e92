/* logs.c: each workload's output lines on disk under <node dir>/logs/, read
 * back by GET /v1/workloads/{id}/logs. One file per workload, ID.log, is
 * rotated once to ID.log.1 when it would pass log_max_bytes, so a workload
 * holds at most twice that. Lines are "<epoch ms> <o|e> <escaped text>\n"
 * (see agent.h), appended with O_APPEND in one write each, so a reader sees
 * whole lines plus at most a partial last one, which it leaves for later.
 * Each file begins with a header line "#gpurent-log <generation>", one more
 * than the file it replaced, and a cursor is "<generation>-<offset>": the
 * header moves with the file through the rename, so a reader holding a
 * cursor into ID.log finds it again in ID.log.1 after a rotation, and
 * across agent restarts. (Inode numbers would do the same but are reused
 * as soon as a file is deleted, so an old cursor could name a new file.) */
#include "agent.h"
#include "gpurent/utf8.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Appends and rotations of every workload are serialised: they are rare
 * (a sim tick, a line of output) and short, and a reader takes the lock
 * only to open the pair of files consistently. */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

/* A live workload's files are in logs/, a removed one's in logs/ended/. */
static int log_paths_in(const char *node_dir, int ended, const char *id, char cur[PATH_MAX], char old[PATH_MAX])
{
    if (!agent_name_valid(id))
        return -1;
    const char *sub = ended ? "logs/ended" : "logs";
    int n = snprintf(cur, PATH_MAX, "%s/%s/%s.log", node_dir, sub, id);
    int m = snprintf(old, PATH_MAX, "%s/%s/%s.log.1", node_dir, sub, id);
    return n < 0 || n >= PATH_MAX || m < 0 || m >= PATH_MAX ? -1 : 0;
}

static int log_paths(const char *node_dir, const char *id, char cur[PATH_MAX], char old[PATH_MAX])
{
    return log_paths_in(node_dir, 0, id, cur, old);
}

/* The stored form of one line into out (room for 2 * WL_LOG_TEXT_MAX + 64):
 * the text cut at WL_LOG_TEXT_MAX bytes (before a character the cut would
 * split), bytes that are not UTF-8 replaced by '?' (the reply is JSON), and
 * the escapes. Returns its length. */
static size_t format_line(char *out, int64_t t_ms, char stream, const char *text, size_t len)
{
    size_t o = (size_t)sprintf(out, "%" PRId64 " %c ", t_ms, stream);
    const unsigned char *s = (const unsigned char *)text;
    if (len > WL_LOG_TEXT_MAX)
        len = WL_LOG_TEXT_MAX - utf8_cut_tail(s, WL_LOG_TEXT_MAX);
    for (size_t i = 0; i < len;) {
        size_t k = utf8_sequence(s + i, len - i);
        if (k == 0 || s[i] == '\0') {
            /* Not UTF-8, or a NUL: JSON readers (jansson by default, so
             * gpurentd) refuse a string holding \u0000, and one printf
             * of it would break the workload's logs for as long as the
             * line is in view. */
            out[o++] = '?';
            i++;
        } else if (s[i] == '\\' || s[i] == '\n' || s[i] == '\r') {
            out[o++] = '\\';
            out[o++] = s[i] == '\\' ? '\\' : s[i] == '\n' ? 'n' : 'r';
            i++;
        } else {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
        }
    }
    out[o++] = '\n';
    return o;
}

#define LOG_HEADER "#gpurent-log "

/* The generation in the header of the open file fd, or 0 if it has none. */
static uint64_t file_generation(int fd)
{
    char head[48];
    ssize_t n = pread(fd, head, sizeof head - 1, 0);
    if (n <= 0)
        return 0;
    head[n] = 0;
    size_t hl = strlen(LOG_HEADER);
    if (strncmp(head, LOG_HEADER, hl) != 0 || head[hl] < '0' || head[hl] > '9')
        return 0;
    char *end;
    unsigned long long g = strtoull(head + hl, &end, 10);
    return *end == '\n' ? g : 0;
}

/* Opens the current file for appending; a new (empty) one gets the header
 * of generation gen. -1 (errno) on failure. */
static int open_current(const char *path, uint64_t gen)
{
    int fd = open(path, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0600); /* read too: the header */
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size == 0) {
        char head[48];
        int n = snprintf(head, sizeof head, LOG_HEADER "%llu\n", (unsigned long long)gen);
        if (write(fd, head, (size_t)n) != n) {
            close(fd);
            return -1;
        }
    }
    return fd;
}

int wl_log_append(const char *node_dir, const char *id, int64_t max_bytes, int64_t t_ms, char stream, const char *text,
                  size_t len)
{
    char cur[PATH_MAX], old[PATH_MAX], dir[PATH_MAX];
    if (log_paths(node_dir, id, cur, old) < 0 || snprintf(dir, sizeof dir, "%s/logs", node_dir) >= (int)sizeof dir) {
        log_error("workload %.64s: log path too long or bad id", id);
        return -1;
    }
    char *line = malloc(2 * WL_LOG_TEXT_MAX + 64);
    if (!line)
        return -1;
    size_t n = format_line(line, t_ms, stream == 'e' ? 'e' : 'o', text, len);
    int rc = -1;
    pthread_mutex_lock(&log_lock);
    /* A line is appended for every line a container prints: the directory
     * is made only when opening finds it missing, not checked each time. */
    int fd = open_current(cur, 1);
    if (fd < 0 && errno == ENOENT) {
        if (state_mkdirs(dir) < 0) {
            log_error("workload %s: cannot create %s: %s", id, dir, strerror(errno));
            goto out;
        }
        fd = open_current(cur, 1);
    }
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size > 48 && (int64_t)(st.st_size + (off_t)n) > max_bytes) {
        /* One old file is kept: an earlier ID.log.1 goes with the rename. */
        uint64_t gen = file_generation(fd);
        close(fd);
        fd = -1;
        if (rename(cur, old) < 0)
            log_warn("workload %s: cannot rotate %s: %s", id, cur, strerror(errno));
        fd = open_current(cur, gen + 1);
    }
    if (fd < 0) {
        log_error("workload %s: cannot open %s: %s", id, cur, strerror(errno));
        goto out;
    }
    ssize_t w = write(fd, line, n);
    if (w != (ssize_t)n)
        log_error("workload %s: cannot write %s: %s", id, cur, w < 0 ? strerror(errno) : "short write");
    else
        rc = 0;
out:
    if (fd >= 0)
        close(fd);
    pthread_mutex_unlock(&log_lock);
    free(line);
    return rc;
}

/* One kept log of logs/ended/, by when it was kept. */
struct kept_log {
    char id[NAME_MAX + 1];
    int64_t kept_ns; /* its ctime, in ns */
};

static int kept_newest_first(const void *a, const void *b)
{
    const struct kept_log *x = a, *y = b;
    return x->kept_ns < y->kept_ns ? 1 : x->kept_ns > y->kept_ns ? -1 : strcmp(x->id, y->id);
}

/* Removes from dir (logs/ended) the logs kept longer than keep_s, and the
 * oldest beyond the newest max_kept. A log's ctime is when it was moved
 * there: nothing writes to it after. Called with log_lock held. */
static void sweep_kept(const char *dir, int64_t keep_s, int64_t max_kept, int64_t now_s)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct kept_log *logs = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        struct stat st;
        if (len < 5 || strcmp(e->d_name + len - 4, ".log") != 0 || fstatat(dirfd(d), e->d_name, &st, 0) < 0)
            continue;
        if (n == cap) {
            struct kept_log *more = realloc(logs, (cap = cap ? 2 * cap : 64) * sizeof *logs);
            if (!more)
                break;
            logs = more;
        }
        snprintf(logs[n].id, sizeof logs[n].id, "%.*s", (int)(len - 4), e->d_name);
        logs[n++].kept_ns = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
    }
    closedir(d);
    qsort(logs, n, sizeof *logs, kept_newest_first);
    for (size_t i = 0; i < n; i++) {
        if ((int64_t)i < max_kept && logs[i].kept_ns / 1000000000 > now_s - keep_s)
            continue;
        char cur[PATH_MAX], old[PATH_MAX];
        if (snprintf(cur, sizeof cur, "%s/%s.log", dir, logs[i].id) < (int)sizeof cur &&
            snprintf(old, sizeof old, "%s/%s.log.1", dir, logs[i].id) < (int)sizeof old) {
            unlink(old);
            unlink(cur);
        }
    }
    free(logs);
}

void wl_log_sweep(const char *node_dir, int64_t keep_s, int64_t max_kept)
{
    char dir[PATH_MAX];
    if (snprintf(dir, sizeof dir, "%s/logs/ended", node_dir) >= (int)sizeof dir)
        return;
    pthread_mutex_lock(&log_lock);
    sweep_kept(dir, keep_s, max_kept, (int64_t)time(NULL));
    pthread_mutex_unlock(&log_lock);
}

void wl_log_retire(const char *node_dir, const char *id, int64_t keep_s, int64_t max_kept)
{
    char cur[PATH_MAX], old[PATH_MAX], kept_cur[PATH_MAX], kept_old[PATH_MAX], dir[PATH_MAX];
    if (log_paths(node_dir, id, cur, old) < 0 || log_paths_in(node_dir, 1, id, kept_cur, kept_old) < 0 ||
        snprintf(dir, sizeof dir, "%s/logs/ended", node_dir) >= (int)sizeof dir)
        return;
    pthread_mutex_lock(&log_lock);
    int keep = keep_s > 0 && max_kept > 0 && access(cur, F_OK) == 0;
    if (keep && state_mkdirs(dir) < 0) {
        log_warn("workload %s: cannot create %s: %s; its output is not kept", id, dir, strerror(errno));
        keep = 0;
    }
    /* The older file first: a reader opening the kept pair then finds the
     * current one, which names the newer generation, with it. */
    if (keep && ((rename(old, kept_old) < 0 && errno != ENOENT) || rename(cur, kept_cur) < 0)) {
        log_warn("workload %s: cannot keep its output in %s: %s", id, dir, strerror(errno));
        keep = 0;
    }
    if (!keep) {
        if (unlink(cur) < 0 && errno != ENOENT)
            log_warn("workload %s: cannot remove %s: %s", id, cur, strerror(errno));
        if (unlink(old) < 0 && errno != ENOENT)
            log_warn("workload %s: cannot remove %s: %s", id, old, strerror(errno));
        unlink(kept_old); /* half moved */
    }
    sweep_kept(dir, keep_s, max_kept, (int64_t)time(NULL)); /* ctimes are the file system's real time */
    pthread_mutex_unlock(&log_lock);
}

int wl_log_kept(const char *node_dir, const char *id)
{
    char cur[PATH_MAX], old[PATH_MAX];
    return log_paths_in(node_dir, 1, id, cur, old) == 0 && access(cur, F_OK) == 0;
}

static int parse_cursor(const char *s, uint64_t *gen, uint64_t *off)
{
    if (!s || strlen(s) >= WL_LOG_CURSOR_MAX)
        return -1;
    char *end;
    if (s[0] < '0' || s[0] > '9')
        return -1;
    errno = 0;
    unsigned long long a = strtoull(s, &end, 10);
    if (errno || *end != '-' || end[1] < '0' || end[1] > '9')
        return -1;
    unsigned long long b = strtoull(end + 1, &end, 10);
    if (errno || *end || b > INT64_MAX) /* an offset in a file (off_t) */
        return -1;
    *gen = a;
    *off = b;
    return 0;
}

int wl_log_cursor_valid(const char *s)
{
    uint64_t a, b;
    return parse_cursor(s, &a, &b) == 0;
}

/* One parsed line. */
struct log_line {
    int64_t t;   /* epoch ms */
    char stream; /* 'o' or 'e' */
    char *text;  /* unescaped; owned */
    size_t len;  /* bytes of text */
};

/* Parses a stored line (without its newline) into l; -1 for a line this
 * module did not write (skipped). */
static int parse_line(char *s, size_t n, struct log_line *l)
{
    char *end;
    errno = 0;
    long long t = strtoll(s, &end, 10);
    if (errno || end == s || (size_t)(end - s) + 3 > n || end[0] != ' ' || (end[1] != 'o' && end[1] != 'e') ||
        end[2] != ' ')
        return -1;
    l->t = t;
    l->stream = end[1];
    const char *p = end + 3, *e = s + n;
    l->text = malloc((size_t)(e - p) + 1);
    if (!l->text)
        return -1;
    size_t o = 0;
    for (; p < e; p++) {
        if (*p == '\\' && p + 1 < e) {
            p++;
            l->text[o++] = *p == 'n' ? '\n' : *p == 'r' ? '\r' : *p;
        } else {
            l->text[o++] = *p;
        }
    }
    l->text[o] = 0;
    l->len = o;
    return 0;
}

static json_t *line_json(const struct log_line *l)
{
    return json_pack("{s:I, s:s, s:s%}", "t", (json_int_t)l->t, "stream", l->stream == 'e' ? "stderr" : "stdout",
                     "text", l->text, l->len);
}

struct segment {
    FILE *f;      /* NULL when the file does not exist */
    uint64_t gen; /* from its header; 0 none */
};

json_t *wl_log_read(const char *node_dir, const char *id, const struct wl_log_query *q, char cursor[WL_LOG_CURSOR_MAX],
                    int *at_end, char *err, size_t errlen)
{
    char paths[2][PATH_MAX];
    uint64_t want_gen = 0, want_off = 0;
    if (q->after && parse_cursor(q->after, &want_gen, &want_off) < 0) {
        snprintf(err, errlen, "after is not a cursor this agent gave");
        return NULL;
    }
    if (log_paths_in(node_dir, q->ended, id, paths[1], paths[0]) < 0) {
        snprintf(err, errlen, "bad workload id or log path too long");
        return NULL;
    }
    /* seg[0] is the older file, seg[1] the current one; opened together
     * under the lock so no rotation falls between them. */
    struct segment seg[2] = {{0}, {0}};
    pthread_mutex_lock(&log_lock);
    for (int i = 0; i < 2; i++) {
        seg[i].f = fopen(paths[i], "re");
        if (seg[i].f)
            seg[i].gen = file_generation(fileno(seg[i].f));
    }
    pthread_mutex_unlock(&log_lock);

    /* Where to start: at the cursor when its file is still here; from the
     * oldest line otherwise (no cursor, or its file rotated away). */
    int si = 0;
    off_t start = 0;
    if (q->after && want_gen) {
        for (int i = 0; i < 2; i++)
            if (seg[i].f && seg[i].gen == want_gen)
                si = i, start = (off_t)want_off;
    }

    int64_t cap = q->tail > 0 ? (q->tail < WL_LOG_REPLY_LINES ? q->tail : WL_LOG_REPLY_LINES) : WL_LOG_REPLY_LINES;
    struct log_line *ring = calloc((size_t)cap, sizeof *ring);
    size_t n_ring = 0, head = 0, bytes = 0;
    int full = 0;
    int end_seg = 1;
    off_t end_off = 0;
    char *buf = NULL;
    size_t bufcap = 0;
    for (int i = si; i < 2 && ring && !full; i++) {
        end_seg = i;
        end_off = i == si ? start : 0;
        if (!seg[i].f)
            continue;
        if (fseeko(seg[i].f, end_off, SEEK_SET) < 0)
            continue;
        ssize_t got;
        while ((got = getline(&buf, &bufcap, seg[i].f)) > 0) {
            if (buf[got - 1] != '\n')
                break; /* being written: the next read gets it whole */
            off_t next = end_off + got;
            struct log_line l;
            if (parse_line(buf, (size_t)got - 1, &l) < 0) {
                end_off = next; /* not a line this module wrote: skipped */
                continue;
            }
            if (l.t < q->since_ms) {
                free(l.text);
                end_off = next;
                continue;
            }
            if (q->tail <= 0 && (n_ring == (size_t)cap || bytes + l.len > WL_LOG_REPLY_BYTES)) {
                free(l.text);
                full = 1; /* the cursor stays before this line */
                break;
            }
            end_off = next;
            if (n_ring == (size_t)cap) {
                /* tail: the oldest kept line makes room */
                bytes -= ring[head].len;
                free(ring[head].text);
                ring[head] = l;
                head = (head + 1) % (size_t)cap;
            } else {
                ring[(head + n_ring++) % (size_t)cap] = l;
            }
            bytes += l.len;
        }
    }
    free(buf);
    /* At the end of the older file is the start of the current one. */
    if (end_seg == 0 && !full && seg[1].f)
        end_seg = 1, end_off = 0;
    *at_end = !full;
    uint64_t gen = seg[end_seg].f ? seg[end_seg].gen : 0;
    snprintf(cursor, WL_LOG_CURSOR_MAX, "%" PRIu64 "-%lld", gen, (long long)(gen ? end_off : 0));
    for (int i = 0; i < 2; i++)
        if (seg[i].f)
            fclose(seg[i].f);
    if (!ring) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    /* A tail too large for one reply keeps its newest lines. */
    size_t skip = 0;
    while (bytes > WL_LOG_REPLY_BYTES && skip < n_ring)
        bytes -= ring[(head + skip++) % (size_t)cap].len;
    json_t *lines = json_array();
    for (size_t k = 0; k < n_ring; k++) {
        struct log_line *l = &ring[(head + k) % (size_t)cap];
        if (k >= skip)
            json_array_append_new(lines, line_json(l));
        free(l->text);
    }
    free(ring);
    return lines;
}

/* The text of a last line: control characters become spaces (it goes into
 * an instance's reason, one line) and it is cut at WL_LAST_LINE_MAX bytes on
 * a character boundary (the stored text is UTF-8 already). */
static json_t *last_line_json(const struct log_line *l)
{
    char out[WL_LAST_LINE_MAX + 1];
    size_t o = 0;
    const unsigned char *s = (const unsigned char *)l->text;
    for (size_t i = 0; i < l->len;) {
        size_t k = utf8_sequence(s + i, l->len - i);
        if (k == 0)
            k = 1; /* not written by format_line: '?' below */
        if (o + k > WL_LAST_LINE_MAX)
            break;
        if (k == 1)
            out[o++] = s[i] < 0x20 || s[i] == 0x7f ? ' ' : s[i] < 0x80 ? (char)s[i] : '?';
        else
            memcpy(out + o, s + i, k), o += k;
        i += k;
    }
    out[o] = 0;
    return json_stringn(out, o);
}

/* Parses the whole lines of buf[0..n) (the first one only if whole is set:
 * a read from the middle of a file starts inside a line) into ring, which
 * keeps the last max of them. */
static void tail_lines(char *buf, size_t n, int whole, struct log_line *ring, size_t max, size_t *count)
{
    size_t i = 0;
    if (!whole) {
        while (i < n && buf[i] != '\n')
            i++;
        i++;
    }
    while (i < n) {
        char *nl = memchr(buf + i, '\n', n - i);
        if (!nl)
            break; /* being written */
        struct log_line l;
        if (parse_line(buf + i, (size_t)(nl - (buf + i)), &l) == 0) {
            if (*count == max) {
                free(ring[0].text);
                memmove(ring, ring + 1, (max - 1) * sizeof *ring);
                (*count)--;
            }
            ring[(*count)++] = l;
        }
        i = (size_t)(nl - buf) + 1;
    }
}

/* Reads the last bytes of path, at most WL_LAST_READ_BYTES; *whole says
 * whether the read began at the start of the file. NULL when absent. */
static char *read_tail(const char *path, size_t *n, int *whole)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    char *buf = NULL;
    if (fstat(fd, &st) == 0) {
        off_t from = st.st_size > WL_LAST_READ_BYTES ? st.st_size - WL_LAST_READ_BYTES : 0;
        size_t want = (size_t)(st.st_size - from);
        buf = malloc(want + 1);
        ssize_t got = buf ? pread(fd, buf, want, from) : -1;
        if (got < 0) {
            free(buf);
            buf = NULL;
        } else {
            *n = (size_t)got;
            *whole = from == 0;
        }
    }
    close(fd);
    return buf;
}

json_t *wl_log_last_lines(const char *node_dir, const char *id, size_t max)
{
    char paths[2][PATH_MAX];
    if (max == 0 || max > WL_LAST_LINES_MAX || log_paths(node_dir, id, paths[1], paths[0]) < 0)
        return json_array();
    struct log_line ring[WL_LAST_LINES_MAX];
    size_t count = 0, n = 0;
    int whole = 0;
    /* The current file's end; the older file only when the current one
     * holds fewer lines (it was just rotated). Under the lock, so no
     * rotation falls between the two reads. */
    pthread_mutex_lock(&log_lock);
    char *cur = read_tail(paths[1], &n, &whole);
    if (cur)
        tail_lines(cur, n, whole, ring, max, &count);
    if (count < max && (!cur || whole)) {
        struct log_line later[WL_LAST_LINES_MAX];
        size_t n_later = count;
        memcpy(later, ring, count * sizeof *ring);
        count = 0;
        size_t m = 0;
        char *old = read_tail(paths[0], &m, &whole);
        if (old)
            tail_lines(old, m, whole, ring, max, &count);
        free(old);
        /* Older lines first, then the current file's, keeping the last max. */
        for (size_t i = 0; i < n_later; i++) {
            if (count == max) {
                free(ring[0].text);
                memmove(ring, ring + 1, (max - 1) * sizeof *ring);
                count--;
            }
            ring[count++] = later[i];
        }
    }
    pthread_mutex_unlock(&log_lock);
    free(cur);
    json_t *lines = json_array();
    for (size_t i = 0; i < count; i++) {
        json_array_append_new(lines, last_line_json(&ring[i]));
        free(ring[i].text);
    }
    return lines;
}
