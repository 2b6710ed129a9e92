/* exec.c: runs one command for the agent without a shell: the program is
 * found in PATH before the fork (the child only calls async-signal-safe
 * functions), its output is captured and bounded, and it is killed with its
 * whole process group at a deadline, on DELETE or on shutdown. */
#include "agent.h"

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

static int find_program(const char *name, char *out, size_t outlen)
{
    struct stat st;
    if (strchr(name, '/')) {
        if (stat(name, &st) < 0 || !S_ISREG(st.st_mode) || access(name, X_OK) < 0)
            return -1;
        snprintf(out, outlen, "%s", name);
        return 0;
    }
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    for (const char *p = path; *p;) {
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

int agent_exec(char *const argv[], int timeout_s, atomic_int *cancel, atomic_int *stop, struct exec_result *r)
{
    memset(r, 0, sizeof *r);
    char path[PATH_MAX];
    if (!argv[0] || find_program(argv[0], path, sizeof path) < 0) {
        snprintf(r->output, sizeof r->output, "%s: program not found or not executable", argv[0] ? argv[0] : "?");
        return -1;
    }
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0) {
        snprintf(r->output, sizeof r->output, "pipe: %s", strerror(errno));
        return -1;
    }
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    sigset_t none;
    sigemptyset(&none);
    pid_t pid = devnull < 0 ? -1 : fork();
    if (pid == 0) {
        /* Child: only async-signal-safe calls from here to exec. The agent
         * blocks its shutdown signals and ignores SIGPIPE; neither must
         * leak into the command. */
        setpgid(0, 0);
        signal(SIGPIPE, SIG_DFL);
        sigprocmask(SIG_SETMASK, &none, NULL);
        dup2(devnull, STDIN_FILENO);
        dup2(pfd[1], STDOUT_FILENO);
        dup2(pfd[1], STDERR_FILENO);
        close_range(3, ~0U, 0);
        execv(path, argv);
        _exit(127);
    }
    int saved = errno;
    close(pfd[1]);
    if (devnull >= 0)
        close(devnull);
    if (pid < 0) {
        close(pfd[0]);
        snprintf(r->output, sizeof r->output, "fork: %s", strerror(saved));
        return -1;
    }
    setpgid(pid, pid); /* also in the parent, so the group exists before any kill */
    r->started = 1;

    int64_t deadline = clock_mono_ms() + (int64_t)timeout_s * 1000;
    int64_t killed_at = 0, exited_at = 0;
    size_t used = 0;
    int status = 0, reaped = 0, eof = 0;
    char buf[4096];
    while (!reaped || (!eof && clock_mono_ms() - exited_at < DRAIN_MS)) {
        if (!eof) {
            struct pollfd p = {.fd = pfd[0], .events = POLLIN};
            int pr = poll(&p, 1, 50);
            if (pr > 0) {
                ssize_t n = read(pfd[0], buf, sizeof buf);
                if (n > 0)
                    keep_tail(r, &used, buf, (size_t)n);
                else if (n == 0 || (errno != EINTR && errno != EAGAIN))
                    eof = 1;
            }
        } else if (!reaped) {
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
        if (!killed_at) {
            if (now >= deadline)
                r->timed_out = 1;
            else if ((cancel && atomic_load(cancel)) || (stop && atomic_load(stop)))
                r->interrupted = 1;
            if (r->timed_out || r->interrupted) {
                kill(-pid, SIGTERM);
                killed_at = now;
            }
        } else if (now - killed_at >= KILL_GRACE_MS) {
            kill(-pid, SIGKILL);
            killed_at = now - KILL_GRACE_MS + 60 * 1000; /* no more than one SIGKILL a minute */
        }
    }
    close(pfd[0]);
    if (WIFEXITED(status)) {
        r->exited = 1;
        r->status = WEXITSTATUS(status);
    }
    if (r->exited && r->status == 127 && used == 0)
        snprintf(r->output, sizeof r->output, "%.1024s could not be executed", path);
    return r->exited && r->status == 0 && !r->timed_out && !r->interrupted ? 0 : -1;
}

void exec_describe(const struct exec_result *r, char *out, size_t outlen)
{
    /* The last non-empty line says most: podman and mount end with the error. */
    char last[512] = "";
    const char *end = r->output + strlen(r->output);
    while (end > r->output && (end[-1] == '\n' || end[-1] == '\r' || end[-1] == ' '))
        end--;
    const char *start = end;
    while (start > r->output && start[-1] != '\n')
        start--;
    snprintf(last, sizeof last, "%.*s", (int)(end - start), start);
    for (char *p = last; *p; p++)
        if ((unsigned char)*p < ' ' || *p == 0x7f)
            *p = ' ';
    if (!r->started)
        snprintf(out, outlen, "%s", last[0] ? last : "could not start the command");
    else if (r->timed_out)
        snprintf(out, outlen, "timed out%s%s", last[0] ? ": " : "", last);
    else if (r->interrupted)
        snprintf(out, outlen, "interrupted");
    else if (r->exited)
        snprintf(out, outlen, "exit status %d%s%s", r->status, last[0] ? ": " : "", last);
    else
        snprintf(out, outlen, "killed by a signal%s%s", last[0] ? ": " : "", last);
}
