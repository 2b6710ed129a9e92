/* state.c: the agent's files under state_dir (see agent.h): workload
 * records, fleet registrations and the lock file, each written whole to a
 * temporary name, fsynced, renamed and the directory fsynced, so that what
 * the agent acknowledged survives a crash or a power cut. */
#include "agent.h"
#include "gpurent/fileio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

int state_mkdirs(const char *dir)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0700) < 0 && errno != EEXIST)
                return -1;
            *p = c;
            if (!c)
                break;
        }
    }
    struct stat st;
    if (stat(dir, &st) < 0)
        return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

int state_write_atomic(const char *dir, const char *name, const void *data, size_t len, unsigned mode)
{
    char path[PATH_MAX], tmp[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path ||
        snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name) >= (int)sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0)
        return -1;
    /* umask may have narrowed the mode; a secret must be exactly 0600. */
    if (fchmod(fd, mode) < 0)
        goto fail;
    if (fd_write_all(fd, data, len) < 0)
        goto fail;
    if (fsync(fd) < 0)
        goto fail;
    if (close(fd) < 0) {
        fd = -1;
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) < 0)
        goto fail;
    return dir_fsync(dir);
fail:;
    int saved = errno;
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    errno = saved;
    return -1;
}

char *state_read_file(const char *path, size_t max, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return NULL;
    struct stat st;
    int bad = 0;
    if (fstat(fd, &st) < 0)
        bad = errno;
    else if (!S_ISREG(st.st_mode))
        bad = EINVAL;
    else if ((size_t)st.st_size > max)
        bad = EFBIG;
    if (bad) {
        close(fd);
        errno = bad;
        return NULL;
    }
    char *buf = malloc((size_t)st.st_size + 1);
    size_t used = 0;
    while (buf && used <= max) {
        ssize_t n = read(fd, buf + used, (size_t)st.st_size + 1 - used);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            free(buf);
            buf = NULL;
            break;
        }
        if (n == 0)
            break;
        used += (size_t)n;
        if (used > (size_t)st.st_size) { /* the file grew while we read it */
            free(buf);
            buf = NULL;
            errno = EFBIG;
            break;
        }
    }
    close(fd);
    if (!buf)
        return NULL;
    buf[used] = '\0';
    if (len)
        *len = used;
    return buf;
}

/* ---------------------------------------------------------------- records */

/* An integer member, or null when the value is unknown (0 for the times,
 * exit_known unset for the code). */
static json_t *int_or_null(int known, int64_t v)
{
    return known ? json_integer((json_int_t)v) : json_null();
}

json_t *record_to_json(const struct workload *w)
{
    return json_pack("{s:i, s:s, s:o, s:s, s:s, s:I, s:I, s:b, s:o, s:o, s:o}", "version", 1, "id", w->id, "spec",
                     spec_to_json(&w->spec), "phase", wl_phase_name(w->phase), "message", w->message, "created_at",
                     (json_int_t)w->created_at, "updated_at", (json_int_t)w->updated_at, "removing", w->removing,
                     "running_at_ms", int_or_null(w->running_at_ms > 0, w->running_at_ms), "exited_at",
                     int_or_null(w->exited_at > 0, w->exited_at), "exit_code",
                     int_or_null(w->exit_known, w->exit_code));
}

/* Reads an optional member that is null or an integer in [lo, hi]: *known
 * says which; -1 for anything else. */
static int opt_int(const json_t *v, int64_t lo, int64_t hi, int *known, int64_t *out)
{
    *known = 0;
    *out = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return -1;
    *known = 1;
    *out = json_integer_value(v);
    return 0;
}

int record_from_json(const json_t *j, struct workload *w, char *err, size_t errlen)
{
    json_t *spec = NULL, *running_at = NULL, *exited_at = NULL, *exit_code = NULL;
    const char *id = NULL, *phase = NULL, *message = NULL;
    json_int_t version = 0, created = 0, updated = 0;
    int removing = 0;
    json_error_t jerr;
    /* The last three came with exit reporting: absent in an older agent's records. */
    if (json_unpack_ex((json_t *)(uintptr_t)j, &jerr, JSON_STRICT,
                       "{s:I, s:s, s:o, s:s, s:s, s:I, s:I, s:b, s?o, s?o, s?o}", "version", &version, "id", &id,
                       "spec", &spec, "phase", &phase, "message", &message, "created_at", &created, "updated_at",
                       &updated, "removing", &removing, "running_at_ms", &running_at, "exited_at", &exited_at,
                       "exit_code", &exit_code) < 0) {
        snprintf(err, errlen, "%s", jerr.text);
        return -1;
    }
    if (version != 1) {
        snprintf(err, errlen, "record version %lld is not 1", (long long)version);
        return -1;
    }
    if (!agent_name_valid(id)) {
        snprintf(err, errlen, "bad workload id");
        return -1;
    }
    if (wl_phase_parse(phase, &w->phase) < 0) {
        snprintf(err, errlen, "unknown phase '%.32s'", phase);
        return -1;
    }
    int known, code_known;
    int64_t running_ms, exited, code;
    if (opt_int(running_at, 1, INT64_MAX, &known, &running_ms) < 0) {
        snprintf(err, errlen, "running_at_ms is not a positive integer or null");
        return -1;
    }
    if (opt_int(exited_at, 1, INT64_MAX, &known, &exited) < 0) {
        snprintf(err, errlen, "exited_at is not a positive integer or null");
        return -1;
    }
    if (opt_int(exit_code, INT_MIN, INT_MAX, &code_known, &code) < 0) {
        snprintf(err, errlen, "exit_code is not an integer or null");
        return -1;
    }
    char field[64], why[256];
    if (spec_parse(spec, &w->spec, field, sizeof field, why, sizeof why) < 0) {
        snprintf(err, errlen, "spec: %s", why);
        return -1;
    }
    snprintf(w->id, sizeof w->id, "%s", id);
    /* Cut between characters: a message cut inside one would make the
     * record unwritable (record_to_json needs UTF-8). */
    workload_message_set(w, message);
    w->created_at = created;
    w->updated_at = updated;
    w->removing = removing;
    w->running_at_ms = running_ms;
    w->exited_at = exited;
    w->exit_known = code_known;
    w->exit_code = (int)code;
    return 0;
}

int record_save(const char *node_dir, const struct workload *w)
{
    char dir[PATH_MAX], name[AGENT_NAME_MAX + 8];
    snprintf(dir, sizeof dir, "%s/workloads", node_dir);
    snprintf(name, sizeof name, "%s.json", w->id);
    json_t *j = record_to_json(w);
    /* jansson keeps an object's keys in the order they were set, so the
     * text is the same for the same record without sorting them. */
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    int rc = -1;
    if (!text)
        log_error("workload %s: cannot serialise its record", w->id);
    /* A record is written at each phase change that matters: the
     * directories are made only when the first write finds them missing,
     * not checked each time. */
    else if (state_write_atomic(dir, name, text, strlen(text), 0600) < 0 &&
             (errno != ENOENT || state_mkdirs(dir) < 0 || state_write_atomic(dir, name, text, strlen(text), 0600) < 0))
        log_error("workload %s: cannot write its record in %s: %s", w->id, dir, strerror(errno));
    else
        rc = 0;
    free(text);
    return rc;
}

int record_delete(const char *node_dir, const char *id)
{
    char dir[PATH_MAX], path[PATH_MAX + AGENT_NAME_MAX + 8];
    snprintf(dir, sizeof dir, "%s/workloads", node_dir);
    snprintf(path, sizeof path, "%s/%s.json", dir, id);
    if (unlink(path) < 0 && errno != ENOENT) {
        log_error("workload %s: cannot delete its record %s: %s", id, path, strerror(errno));
        return -1;
    }
    dir_fsync(dir);
    return 0;
}

int records_load(const char *node_dir, struct agent_node *node,
                 void (*add)(struct agent_node *node, struct workload *w, void *ctx), void *ctx)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/workloads", node_dir);
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int loaded = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        size_t len = strlen(n);
        char path[PATH_MAX + 256];
        snprintf(path, sizeof path, "%s/%s", dir, n);
        if (n[0] == '.' && len > 4 && strcmp(n + len - 4, ".tmp") == 0) {
            /* A write that a crash interrupted; the record it was replacing is intact. */
            unlink(path);
            continue;
        }
        if (n[0] == '.' || len < 6 || strcmp(n + len - 5, ".json") != 0)
            continue;
        char err[256] = "";
        size_t tlen = 0;
        char *text = state_read_file(path, STATE_RECORD_MAX, &tlen);
        json_error_t jerr;
        json_t *j = text ? json_loadb(text, tlen, JSON_REJECT_DUPLICATES, &jerr) : NULL;
        struct workload *w = calloc(1, sizeof *w);
        int ok = 0;
        if (!text)
            snprintf(err, sizeof err, "%s", strerror(errno));
        else if (!j)
            snprintf(err, sizeof err, "not JSON: %s", jerr.text);
        else if (w && record_from_json(j, w, err, sizeof err) == 0) {
            if (strlen(w->id) + 5 != len || strncmp(n, w->id, len - 5) != 0)
                snprintf(err, sizeof err, "the record is for workload %s", w->id);
            else
                ok = 1;
        }
        free(text);
        json_decref(j);
        if (!ok) {
            char aside[PATH_MAX + 300];
            snprintf(aside, sizeof aside, "%s.corrupt", path);
            log_error("workload record %s is unusable (%s); moved aside to %s", path, err, aside);
            rename(path, aside);
            workload_free(w);
            continue;
        }
        w->node = node;
        add(node, w, ctx);
        loaded++;
    }
    closedir(d);
    return loaded;
}

/* ---------------------------------------------------------------- secrets */

int secret_valid(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++)
        if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f')))
            return 0;
    return n == 64;
}

int secret_read(const char *path, char out[65], char *err, size_t errlen)
{
    out[0] = '\0';
    struct stat st;
    if (stat(path, &st) < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (st.st_mode & 077) {
        snprintf(err, errlen, "%s: other users may read it (mode %03o); chmod 600 it", path, st.st_mode & 0777);
        return -1;
    }
    size_t len = 0;
    char *text = state_read_file(path, 256, &len);
    if (!text) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' '))
        text[--len] = '\0';
    int ok = secret_valid(text);
    if (ok)
        memcpy(out, text, 65);
    else
        snprintf(err, errlen, "%s: not 64 lowercase hex digits", path);
    memset(text, 0, len);
    free(text);
    return ok ? 0 : -1;
}

int registration_save(const char *node_dir, const char *node_id, const char *secret)
{
    json_t *j = json_pack("{s:s, s:s}", "id", node_id, "secret", secret);
    char *text = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    int rc = -1;
    if (text && state_mkdirs(node_dir) == 0 &&
        state_write_atomic(node_dir, "registration.json", text, strlen(text), 0600) == 0)
        rc = 0;
    if (text) {
        memset(text, 0, strlen(text));
        free(text);
    }
    return rc;
}

int registration_load(const char *node_dir, char node_id[ID_MAX], char secret[65])
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/registration.json", node_dir);
    size_t len = 0;
    char *text = state_read_file(path, 4096, &len);
    if (!text)
        return -1;
    json_t *j = json_loadb(text, len, 0, NULL);
    memset(text, 0, len);
    free(text);
    const char *id = NULL, *s = NULL;
    int rc = -1;
    if (j && json_unpack(j, "{s:s, s:s}", "id", &id, "secret", &s) == 0 && strlen(id) < ID_MAX && secret_valid(s)) {
        snprintf(node_id, ID_MAX, "%s", id);
        memcpy(secret, s, 65);
        rc = 0;
    }
    json_decref(j);
    return rc;
}

int state_lock(const char *state_dir)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/agent.lock", state_dir);
    /* Left open on purpose: the lock lives as long as the process. */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        log_error("cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        log_error("another gpurent-agent is using %s (%s is locked)", state_dir, path);
        close(fd);
        return -1;
    }
    return fd;
}
