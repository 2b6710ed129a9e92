/* journal.c: the gateway's usage journal (STATE_DIR/usage.journal): every
 * usage record is on disk before the call it describes completes, and
 * leaves the file only after gpurentd has answered for its id, so a gateway
 * killed at any moment (SIGKILL, a power cut) resends on its next start
 * what it served and had not yet reported; gpurentd settles an id once, so
 * the resend never charges twice.
 *
 * The file is JSON lines, appended only: a usage record as reported,
 * {"answered": [ids]} once gpurentd has answered for those ids, or
 * {"progress": record} for a call still being answered: what it has
 * delivered so far, written as it goes (proxy.c). The live records are the
 * records whose id no later line answered; a call's last progress line
 * stands for it until its record comes. It is compacted (the live records
 * and the last progress of each call without a record written to a
 * temporary file, fsynced, renamed over it, the directory fsynced) at start
 * and whenever most of it is answered, so it holds about one report period
 * of calls in normal running. At start, a call that has progress but no
 * record was cut short by the gateway's end: its last progress becomes its
 * record (completed 0), so what it delivered is charged.
 *
 * Durability is a group commit: each writer appends its line under the
 * lock, then waits until some fdatasync that began after its write has
 * returned; one writer syncs for all that wrote before it, so calls in
 * parallel share a sync instead of queueing for one each. Answered and
 * progress lines are not synced: losing an answered line only resends
 * records gpurentd answers as duplicates, and a progress line is on disk
 * for any end of the process (a kill), and for a power cut once the next
 * record's sync has flushed it.
 *
 * Threads: jlock guards the descriptor, the counters and the sync state.
 * A compaction replaces the file under the same descriptor number (dup2),
 * so a sync running outside the lock meanwhile is harmless: what it wanted
 * on disk is in the new file, which the compaction synced itself. */
#include "gateway.h"
#include "gpurent/fileio.h"
#include "gpurent/log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define JOURNAL_NAME "usage.journal"
#define JOURNAL_LINE_MAX (64u << 10)     /* a record is a few hundred bytes */
#define JOURNAL_COMPACT_BYTES (1u << 20) /* past this, compact once half is answered */

static pthread_mutex_t jlock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t synced_cond = PTHREAD_COND_INITIALIZER;
static int fd = -1;                       /* the journal, O_APPEND; -1: no journal */
static int lock_fd = -1;                  /* dir_path/gateway.lock, flocked while open */
static char dir_path[PATH_MAX];           /* the state directory */
static char file_path[PATH_MAX];          /* dir_path/usage.journal */
static off_t file_size;                   /* bytes in the file, all whole lines */
static int64_t records_in_file;           /* record lines since the last compaction */
static int64_t progress_in_file;          /* progress lines since then */
static int64_t answered_in_file;          /* ids on answered lines since then */
static uint64_t written_seq, synced_seq;  /* lines written; lines known to be on disk */
static int syncing;                       /* a writer is in fdatasync */

/* Appends one line (text + '\n') under jlock. A failed or short write is
 * cut off again, so the next line never follows half a line. */
static int append_line(const char *text)
{
    size_t n = strlen(text);
    char *line = malloc(n + 2);
    if (!line)
        return -1;
    memcpy(line, text, n);
    line[n] = '\n';
    line[n + 1] = '\0';
    int rc = fd_write_all(fd, line, n + 1);
    if (rc < 0) {
        int saved = errno;
        if (ftruncate(fd, file_size) < 0)
            log_error("gateway: cannot cut a failed write off %s: %s", file_path, strerror(errno));
        errno = saved;
    } else {
        file_size += (off_t)(n + 1);
    }
    free(line);
    return rc;
}

/* Whether r can be a usage record: an object with a string id and neither
 * of the keys that make a line an answered or a progress line. */
static int record_shaped(const json_t *r)
{
    return json_is_object(r) && json_is_string(json_object_get(r, "id")) && !json_object_get(r, "answered") &&
           !json_object_get(r, "progress");
}

/* Reads path's live records, in order, into records, and the last progress
 * of each call with no record into progress (new references appended). A
 * last line without its newline is a write a crash cut short: skipped and
 * logged, as is any line that is not a record, answered or progress line.
 * 0, or -1 when the file cannot be read (a missing one is empty). */
static int read_live(const char *path, json_t *records, json_t *progress)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return errno == ENOENT ? 0 : -1;
    json_t *answered = json_object(), *all = json_array(), *last = json_object(), *order = json_array();
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        lineno++;
        if (line[n - 1] != '\n') {
            log_warn("gateway: %s line %ld has no end (%zd bytes): a write cut short by a crash; skipped", path,
                     lineno, n);
            break; /* only the last line can lack its newline */
        }
        json_t *j = (size_t)n <= JOURNAL_LINE_MAX ? json_loadb(line, (size_t)n - 1, 0, NULL) : NULL;
        /* Only the three shapes the gateway writes; a line of another (a
         * disk's corruption) is skipped rather than read as one of them.
         * A progress line's record that carried "answered" too, say, would
         * be rewritten by this start as a record, and read by the next as
         * ids gpurentd answered for: two calls never charged. */
        int one_key = json_object_size(j) == 1;
        json_t *ids = one_key ? json_object_get(j, "answered") : NULL;
        json_t *p = one_key ? json_object_get(j, "progress") : NULL;
        const char *pid = json_string_value(json_object_get(p, "id"));
        if (json_is_array(ids)) {
            size_t i;
            json_t *v;
            json_array_foreach(ids, i, v) if (json_is_string(v)) json_object_set(answered, json_string_value(v),
                                                                                  json_true());
        } else if (record_shaped(p)) {
            if (!json_object_get(last, pid))
                json_array_append_new(order, json_string(pid));
            json_object_set(last, pid, p);
        } else if (record_shaped(j)) {
            json_array_append(all, j);
        } else {
            log_warn("gateway: %s line %ld is neither a usage record nor an answered or progress line; skipped",
                     path, lineno);
        }
        json_decref(j);
    }
    int rc = ferror(f) ? -1 : 0;
    free(line);
    fclose(f);
    json_t *seen = json_object();
    size_t i;
    json_t *r;
    json_array_foreach(all, i, r)
    {
        const char *id = json_string_value(json_object_get(r, "id"));
        /* A record twice (journaled, then recovered into a compaction that
         * a crash left half done) is one record. */
        if (!json_object_get(answered, id) && !json_object_get(seen, id)) {
            json_object_set(seen, id, json_true());
            json_array_append(records, r);
        }
    }
    json_array_foreach(order, i, r)
    {
        const char *id = json_string_value(r);
        if (!json_object_get(answered, id) && !json_object_get(seen, id))
            json_array_append(progress, json_object_get(last, id));
    }
    json_decref(seen);
    json_decref(all);
    json_decref(answered);
    json_decref(last);
    json_decref(order);
    return rc;
}

/* One line of the file: a record, or (as_progress) a progress line. */
static int write_line(int nfd, json_t *record, int as_progress, off_t *size)
{
    json_t *wrapped = as_progress ? json_pack("{s:O}", "progress", record) : json_incref(record);
    char *text = wrapped ? json_dumps(wrapped, JSON_COMPACT) : NULL;
    json_decref(wrapped);
    size_t n = text ? strlen(text) : 0;
    int rc = text ? fd_write_all(nfd, text, n) : -1;
    if (rc == 0)
        rc = fd_write_all(nfd, "\n", 1);
    free(text);
    if (rc == 0)
        *size += (off_t)(n + 1);
    return rc;
}

/* Writes records and progress lines as the whole journal (temporary file,
 * fdatasync, rename, directory fsync) and makes fd its descriptor. Under
 * jlock, or before any thread uses the journal. */
static int rewrite(const json_t *records, const json_t *progress)
{
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", file_path);
    int nfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (nfd < 0)
        return -1;
    off_t size = 0;
    size_t i;
    json_t *r;
    json_array_foreach(records, i, r) if (write_line(nfd, r, 0, &size) < 0) goto fail;
    json_array_foreach(progress, i, r) if (write_line(nfd, r, 1, &size) < 0) goto fail;
    if (fdatasync(nfd) < 0 || rename(tmp, file_path) < 0)
        goto fail;
    if (dir_fsync(dir_path) < 0)
        log_warn("gateway: cannot fsync %s: %s", dir_path, strerror(errno));
    if (fd < 0) {
        fd = nfd;
    } else {
        if (dup2(nfd, fd) < 0) /* the old file goes with its last descriptor */
            goto fail;
        close(nfd);
    }
    file_size = size;
    records_in_file = (int64_t)json_array_size(records);
    progress_in_file = (int64_t)json_array_size(progress);
    answered_in_file = 0;
    synced_seq = written_seq; /* every line written so far is live in the new file, or answered */
    pthread_cond_broadcast(&synced_cond);
    return 0;
fail:;
    int saved = errno;
    close(nfd);
    unlink(tmp);
    errno = saved;
    return -1;
}

/* Keeps only what is still owed and the calls' last progress. Under jlock.
 * The live records are read back from the file itself, so none written
 * meanwhile by a call can be missed. */
static void compact(void)
{
    json_t *live = json_array(), *progress = json_array();
    if (read_live(file_path, live, progress) < 0 || rewrite(live, progress) < 0)
        log_warn("gateway: cannot compact %s: %s; it is tried again later", file_path, strerror(errno));
    json_decref(live);
    json_decref(progress);
}

int gw_journal_open(const char *dir, json_t *recovered)
{
    if (snprintf(dir_path, sizeof dir_path, "%s", dir) >= (int)sizeof dir_path ||
        snprintf(file_path, sizeof file_path, "%s/" JOURNAL_NAME, dir) >= (int)sizeof file_path) {
        fprintf(stderr, "gpurent-gateway: --state-dir is too long\n");
        return -1;
    }
    if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
        fprintf(stderr, "gpurent-gateway: cannot create --state-dir %s: %s\n", dir, strerror(errno));
        return -1;
    }
    /* Two gateways appending to one journal would each compact away the
     * other's records: the second is refused. Held until exit. */
    char lock_path[PATH_MAX + 16];
    snprintf(lock_path, sizeof lock_path, "%s/gateway.lock", dir);
    int lfd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lfd < 0 || flock(lfd, LOCK_EX | LOCK_NB) < 0) {
        fprintf(stderr, "gpurent-gateway: cannot lock %s: %s (another gateway uses this --state-dir?)\n", lock_path,
                strerror(errno));
        if (lfd >= 0)
            close(lfd);
        return -1;
    }
    json_t *live = json_array(), *cut = json_array();
    if (read_live(file_path, live, cut) < 0) {
        fprintf(stderr, "gpurent-gateway: cannot read %s: %s\n", file_path, strerror(errno));
        json_decref(live);
        json_decref(cut);
        close(lfd);
        return -1;
    }
    /* Calls the last gateway was answering when it ended: charged for what
     * their last progress line says was delivered. */
    size_t i;
    json_t *r;
    json_array_foreach(cut, i, r) json_object_set_new(r, "completed", json_integer(0));
    if (json_array_size(cut))
        log_info("gateway: %zu calls were cut short by the last gateway's end; recording what they delivered",
                 json_array_size(cut));
    json_array_extend(live, cut);
    json_decref(cut);
    /* Rewritten at once: the file then ends on a whole line, and holds only
     * what is still owed. */
    if (rewrite(live, NULL) < 0) {
        fprintf(stderr, "gpurent-gateway: cannot write %s: %s\n", file_path, strerror(errno));
        json_decref(live);
        close(lfd);
        return -1;
    }
    lock_fd = lfd;
    if (json_array_size(live))
        log_info("gateway: %zu usage records from %s not yet answered by gpurentd; resending them",
                 json_array_size(live), file_path);
    json_array_extend(recovered, live);
    json_decref(live);
    return 0;
}

int gw_journal_append(const json_t *record)
{
    char *text = json_dumps(record, JSON_COMPACT);
    if (!text)
        return -1;
    int rc = 0;
    pthread_mutex_lock(&jlock);
    if (fd < 0 || append_line(text) < 0) {
        log_error("gateway: cannot append usage record %s to %s: %s; it is kept in memory only",
                  json_string_value(json_object_get(record, "id")), file_path, fd < 0 ? "not open" : strerror(errno));
        pthread_mutex_unlock(&jlock);
        free(text);
        return -1;
    }
    records_in_file++;
    uint64_t mine = ++written_seq;
    while (synced_seq < mine) {
        if (syncing) {
            pthread_cond_wait(&synced_cond, &jlock);
            continue;
        }
        /* This writer syncs for every line written so far. */
        syncing = 1;
        uint64_t upto = written_seq;
        int sfd = fd;
        pthread_mutex_unlock(&jlock);
        int sync_rc = fdatasync(sfd);
        int sync_errno = errno;
        pthread_mutex_lock(&jlock);
        syncing = 0;
        if (sync_rc < 0) {
            log_error("gateway: fdatasync %s: %s; usage records since the last sync may not survive a crash",
                      file_path, strerror(sync_errno));
            rc = -1;
        }
        /* Marked done even after a failure: the records are still in memory
         * and sent; waiting would only hang the calls. */
        if (upto > synced_seq)
            synced_seq = upto;
        pthread_cond_broadcast(&synced_cond);
    }
    pthread_mutex_unlock(&jlock);
    free(text);
    return rc;
}

void gw_journal_answered(const json_t *ids)
{
    if (!json_array_size(ids))
        return;
    json_t *line = json_pack("{s:O}", "answered", ids);
    char *text = line ? json_dumps(line, JSON_COMPACT) : NULL;
    json_decref(line);
    if (!text)
        return;
    pthread_mutex_lock(&jlock);
    if (fd >= 0) {
        if (append_line(text) < 0)
            log_warn("gateway: cannot note answered usage records in %s: %s (they would be resent, as duplicates)",
                     file_path, strerror(errno));
        else
            answered_in_file += (int64_t)json_array_size(ids);
        /* Everything answered (the usual case between two reports), or a
         * large file mostly answered: keep only what is still owed. */
        if (answered_in_file >= records_in_file ||
            (file_size > JOURNAL_COMPACT_BYTES && 2 * answered_in_file >= records_in_file))
            compact();
    }
    pthread_mutex_unlock(&jlock);
    free(text);
}

int gw_journal_progress(const json_t *record)
{
    json_t *line = json_pack("{s:O}", "progress", record);
    char *text = line ? json_dumps(line, JSON_COMPACT) : NULL;
    json_decref(line);
    if (!text)
        return -1;
    pthread_mutex_lock(&jlock);
    int rc = fd >= 0 ? append_line(text) : -1;
    if (rc == 0)
        progress_in_file++;
    /* A long answer with no call ending meanwhile (so no report to compact
     * after): its older progress lines go once they are most of the file. */
    if (rc == 0 && file_size > JOURNAL_COMPACT_BYTES && progress_in_file > 2 * records_in_file)
        compact();
    pthread_mutex_unlock(&jlock);
    if (rc < 0)
        log_warn("gateway: cannot note the progress of call %s in %s", json_string_value(json_object_get(record, "id")),
                 file_path);
    free(text);
    return rc;
}

void gw_journal_close(void)
{
    pthread_mutex_lock(&jlock);
    if (fd >= 0)
        close(fd);
    if (lock_fd >= 0)
        close(lock_fd); /* the lock goes with its last descriptor */
    fd = lock_fd = -1;
    file_size = 0;
    records_in_file = progress_in_file = answered_in_file = 0;
    pthread_mutex_unlock(&jlock);
}
