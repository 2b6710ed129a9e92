/* exec.c: the agent's one process runner: runs a command without a shell
 * for the runtimes, the mounts and GPU discovery. The program is found in
 * PATH before the fork (the child only calls async-signal-safe functions),
 * its output is captured and bounded, and it is killed with its whole
 * process group at a deadline, on DELETE, on shutdown, or when the stdout a
 * caller keeps whole outgrows its buffer. */
#include "exec.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpurent/clock.h"

#define KILL_GRACE_MS 2000 /* SIGTERM first, SIGKILL this much later */
#define DRAIN_MS 200       /* output still read after the child exited */
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* The first executable regular file dir/name for dir in the ':'-separated
 * dirs (an empty entry is the current directory, as in PATH). */
static int search_dirs(const char *dirs, const char *name, char *out, size_t outlen)
{
    struct stat st;
    for (const char *p = dirs; *p;) {
        size_t n = strcspn(p, ":");
        int w = snprintf(out, outlen, "%.*s/%s", (int)n, n ? p : ".", name);
        if (w > 0 && (size_t)w < outlen && stat(out, &st) == 0 && S_ISREG(st.st_mode) && access(out, X_OK) == 0)
            return 0;
        p += n;
        if (*p == ':')
            p++;
    }
    return -1;
}

/* Finds name as a shell would, then in also; on failure says why in msg. */
static int find_program(const char *name, const char *also, char *out, size_t outlen, char *msg, size_t msglen)
{
    struct stat st;
    if (strchr(name, '/')) {
        if (stat(name, &st) == 0 && S_ISREG(st.st_mode) && access(name, X_OK) == 0) {
            snprintf(out, outlen, "%s", name);
            return 0;
        }
        snprintf(msg, msglen, "%.1024s: not found or not executable", name);
        return -1;
    }
    const char *path = getenv("PATH");
    if (name[0] && search_dirs(path && *path ? path : DEFAULT_PATH, name, out, outlen) == 0)
        return 0;
    if (name[0] && also && search_dirs(also, name, out, outlen) == 0)
        return 0;
    snprintf(msg, msglen, "%.1024s: not found in PATH%s%.1024s", name, also ? " or " : "", also ? also : "");
    return -1;
}

/* Keeps the last bytes: errors are printed at the end. */
static void keep_tail(struct exec_result *r, size_t *used, const char *data, size_t n)
{
    const size_t cap = EXEC_OUTPUT_MAX - 1;
    if (n >= cap) {
        memcpy(r->output, data + n - cap, cap);
        *used = cap;
    } else {
        if (*used + n > cap) {
            size_t drop = *used + n - cap;
            memmove(r->output, r->output + drop, *used - drop);
            *used -= drop;
        }
        memcpy(r->output + *used, data, n);
        *used += n;
    }
    r->output[*used] = '\0';
}

/* Appends to the caller's buffer; once it overflows, the rest is dropped. */
static void keep_all(struct exec_capture *c, struct exec_result *r, const char *data, size_t n)
{
    if (r->overflowed)
        return;
    if (n > c->cap - c->len) {
        r->overflowed = 1;
        c->full = 1;
        return;
    }
    memcpy(c->buf + c->len, data, n);
    c->len += n;
}

static void close_pair(int p[2])
{
    for (int i = 0; i < 2; i++) {
        if (p[i] >= 0)
            close(p[i]);
        p[i] = -1;
    }
}

int exec_run(char *const argv[], const struct exec_opts *o, struct exec_result *r)
{
    memset(r, 0, sizeof *r);
    char path[PATH_MAX];
    if (!argv[0]) {
        snprintf(r->output, sizeof r->output, "no program to run");
        return -1;
    }
    if (find_program(argv[0], o->also_path, path, sizeof path, r->output, sizeof r->output) < 0)
        return -1;
    if (clock_mono_ms() >= o->deadline_ms) {
        r->timed_out = 1;
        snprintf(r->output, sizeof r->output, "%.1024s: not started, its time is up", argv[0]);
        return -1;
    }
    /* tail: stderr, and stdout when the caller does not keep it apart. */
    int tail[2] = {-1, -1}, out[2] = {-1, -1};
    if (pipe2(tail, O_CLOEXEC) < 0 || (o->out && pipe2(out, O_CLOEXEC) < 0)) {
        snprintf(r->output, sizeof r->output, "%.1024s: cannot start: pipe: %s", argv[0], strerror(errno));
        close_pair(tail);
        close_pair(out);
        return -1;
    }
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0) {
        snprintf(r->output, sizeof r->output, "%.1024s: cannot start: /dev/null: %s", argv[0], strerror(errno));
        close_pair(tail);
        close_pair(out);
        return -1;
    }
    sigset_t none;
    sigemptyset(&none);
    pid_t pid = fork();
    if (pid == 0) {
        /* Child: only async-signal-safe calls from here to exec. The agent
         * blocks its shutdown signals and ignores SIGPIPE; neither must
         * leak into the command. */
        static const int defaults[] = {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT};
        setpgid(0, 0);
        for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
            signal(defaults[i], SIG_DFL);
        sigprocmask(SIG_SETMASK, &none, NULL);
        dup2(devnull, STDIN_FILENO);
        dup2(o->out ? out[1] : tail[1], STDOUT_FILENO);
        dup2(tail[1], STDERR_FILENO);
        close_range(3, ~0U, 0);
        execv(path, argv);
        _exit(127);
    }
    int saved = errno;
    close(devnull);
    close(tail[1]);
    tail[1] = -1;
    if (out[1] >= 0) {
        close(out[1]);
        out[1] = -1;
    }
    if (pid < 0) {
        close_pair(tail);
        close_pair(out);
        snprintf(r->output, sizeof r->output, "%.1024s: cannot start: fork: %s", argv[0], strerror(saved));
        return -1;
    }
    setpgid(pid, pid); /* also in the parent, so the group exists before any kill */
    r->started = 1;

    /* fds[0] feeds the tail, fds[1] the caller's capture; -1 once at EOF. */
    int fds[2] = {tail[0], out[0]};
    int64_t killed_at = 0, exited_at = 0;
    size_t used = 0;
    int status = 0, reaped = 0;
    char buf[16384];
    while (!reaped || ((fds[0] >= 0 || fds[1] >= 0) && clock_mono_ms() - exited_at < DRAIN_MS)) {
        struct pollfd p[2];
        nfds_t np = 0;
        for (int i = 0; i < 2; i++)
            if (fds[i] >= 0)
                p[np++] = (struct pollfd){.fd = fds[i], .events = POLLIN};
        if (np > 0 && poll(p, np, 50) > 0) {
            for (nfds_t i = 0; i < np; i++) {
                if (!p[i].revents)
                    continue;
                int which = p[i].fd == fds[0] ? 0 : 1;
                ssize_t n = read(p[i].fd, buf, sizeof buf);
                if (n > 0 && which == 0) {
                    keep_tail(r, &used, buf, (size_t)n);
                    if (o->out && o->err)
                        keep_all(o->err, r, buf, (size_t)n);
                } else if (n > 0) {
                    keep_all(o->out, r, buf, (size_t)n);
                } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
                    close(fds[which]);
                    fds[which] = -1;
                }
            }
        } else if (np == 0 && !reaped) {
            usleep(20 * 1000);
        }
        if (!reaped) {
            pid_t w = waitpid(pid, &status, WNOHANG);
            if (w == pid) {
                reaped = 1;
                exited_at = clock_mono_ms();
                continue;
            }
        }
        if (reaped)
            continue;
        int64_t now = clock_mono_ms();
        if (!killed_at && !r->overflowed) {
            if (now >= o->deadline_ms)
                r->timed_out = 1;
            else if ((o->cancel && atomic_load(o->cancel)) || (o->stop && atomic_load(o->stop)))
                r->interrupted = 1;
        }
        if (!killed_at && (r->overflowed || r->timed_out || r->interrupted)) {
            kill(-pid, SIGTERM);
            killed_at = now;
        } else if (killed_at && now - killed_at >= KILL_GRACE_MS) {
            kill(-pid, SIGKILL);
            killed_at = now - KILL_GRACE_MS + 60 * 1000; /* no more than one SIGKILL a minute */
        }
    }
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    if (WIFEXITED(status)) {
        r->exited = 1;
        r->status = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
        r->signal = WTERMSIG(status);
    }
    if (r->exited && r->status == 127 && used == 0)
        snprintf(r->output, sizeof r->output, "%.1024s could not be executed", path);
    return r->exited && r->status == 0 && !r->timed_out && !r->interrupted && !r->overflowed ? 0 : -1;
}

void exec_last_line(const char *text, size_t n, char *out, size_t outlen)
{
    const char *end = text + n;
    while (end > text && (end[-1] == '\n' || end[-1] == '\r' || end[-1] == ' '))
        end--;
    const char *start = end;
    while (start > text && start[-1] != '\n')
        start--;
    if (outlen == 0)
        return;
    snprintf(out, outlen, "%.*s", (int)(end - start), start);
    for (char *p = out; *p; p++)
        if ((unsigned char)*p < ' ' || *p == 0x7f)
            *p = ' ';
}

void exec_describe(const struct exec_result *r, char *out, size_t outlen)
{
    /* The last non-empty line says most: podman and mount end with the error. */
    char last[512];
    exec_last_line(r->output, strlen(r->output), last, sizeof last);
    if (!r->started)
        snprintf(out, outlen, "%s", last[0] ? last : "could not start the command");
    else if (r->timed_out)
        snprintf(out, outlen, "timed out%s%s", last[0] ? ": " : "", last);
    else if (r->interrupted)
        snprintf(out, outlen, "interrupted");
    else if (r->overflowed)
        snprintf(out, outlen, "killed: more output than could be kept");
    else if (r->exited)
        snprintf(out, outlen, "exit status %d%s%s", r->status, last[0] ? ": " : "", last);
    else
        snprintf(out, outlen, "killed by a signal%s%s", last[0] ? ": " : "", last);
}
