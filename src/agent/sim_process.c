/* sim_process.c: the sim runtime's real process for a spec with a command:
 * started in the simulated container's directory with the spec's env, its
 * stdout and stderr appended line by line to the workload's log by one
 * thread per process, which also reaps it and keeps its exit status and
 * second for the state check. The child is in its own process group (DELETE
 * kills the group) and dies with the driver thread that forked it
 * (PR_SET_PDEATHSIG), so an agent that exits leaves no orphan; a restarted
 * agent finds no process for such a workload and reports it exited with an
 * unknown status. */
#include "agent.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpurent/clock.h"
#include "gpurent/utf8.h"

#define SIM_LINE_MAX 4096 /* longer output lines are cut into pieces of this */

struct sim_proc {
    char key[PATH_MAX];      /* the container directory: unique per node and workload */
    char node_dir[PATH_MAX]; /* where its log is */
    char id[AGENT_NAME_MAX]; /* the workload */
    int64_t log_max;         /* log_max_bytes */
    pid_t pid;               /* the child, its process group too */
    int fds[2];              /* stdout, stderr read ends */
    pthread_t thread;        /* reads, then reaps */
    int done;                /* lock: reaped */
    int64_t exit_at;         /* lock: wall-clock second it was reaped */
    int code;                /* lock: exit status, or 128 + the signal that ended it */
    struct sim_proc *next;   /* lock */
};

static pthread_mutex_t procs_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t procs_cond = PTHREAD_COND_INITIALIZER;
static struct sim_proc *procs;

static struct sim_proc *find_locked(const char *key)
{
    for (struct sim_proc *p = procs; p; p = p->next)
        if (strcmp(p->key, key) == 0)
            return p;
    return NULL;
}

/* Appends one line (without its newline) to the workload's log. */
static void emit(struct sim_proc *p, char stream, const char *text, size_t n)
{
    if (n > 0 && text[n - 1] == '\r')
        n--;
    wl_log_append(p->node_dir, p->id, p->log_max, clock_wall_ms(), stream, text, n);
}

/* Splits what arrived into lines; buf keeps an unfinished one. */
static void take(struct sim_proc *p, char stream, char *buf, size_t *used, const char *data, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (data[i] == '\n') {
            emit(p, stream, buf, *used);
            *used = 0;
            continue;
        }
        if (*used == SIM_LINE_MAX) {
            /* A character the cut would split goes whole into the next
             * piece: split, each half was stored as '?'. */
            size_t keep = utf8_cut_tail((const unsigned char *)buf, *used);
            emit(p, stream, buf, *used - keep);
            memmove(buf, buf + *used - keep, keep);
            *used = keep;
        }
        buf[(*used)++] = data[i];
    }
}

static void *reader_main(void *arg)
{
    struct sim_proc *p = arg;
    static const char streams[2] = {'o', 'e'};
    char *bufs[2] = {malloc(SIM_LINE_MAX), malloc(SIM_LINE_MAX)};
    size_t used[2] = {0, 0};
    char chunk[4096];
    int status = 0, reaped = 0;
    int64_t drain_until = 0;
    while (p->fds[0] >= 0 || p->fds[1] >= 0) {
        struct pollfd pf[2];
        nfds_t n = 0;
        int which[2];
        for (int i = 0; i < 2; i++)
            if (p->fds[i] >= 0) {
                pf[n] = (struct pollfd){.fd = p->fds[i], .events = POLLIN};
                which[n++] = i;
            }
        int rc = poll(pf, n, 100);
        for (nfds_t k = 0; rc > 0 && k < n; k++) {
            if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            int i = which[k];
            ssize_t got = read(p->fds[i], chunk, sizeof chunk);
            if (got > 0 && bufs[i]) {
                take(p, streams[i], bufs[i], &used[i], chunk, (size_t)got);
            } else if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) {
                close(p->fds[i]);
                p->fds[i] = -1;
            }
        }
        /* The main process may leave children holding the pipes: once it
         * is reaped, what is left is read for a moment, then dropped. */
        if (!reaped && waitpid(p->pid, &status, WNOHANG) == p->pid) {
            reaped = 1;
            drain_until = clock_mono_ms() + 200;
        }
        if (reaped && clock_mono_ms() >= drain_until)
            break;
    }
    for (int i = 0; i < 2; i++) {
        if (bufs[i] && used[i])
            emit(p, streams[i], bufs[i], used[i]);
        free(bufs[i]);
        if (p->fds[i] >= 0)
            close(p->fds[i]);
        p->fds[i] = -1;
    }
    while (!reaped) {
        if (waitpid(p->pid, &status, 0) == p->pid || errno != EINTR)
            reaped = 1;
    }
    pthread_mutex_lock(&procs_lock);
    p->code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 255;
    p->exit_at = clock_wall();
    p->done = 1;
    pthread_cond_broadcast(&procs_cond);
    pthread_mutex_unlock(&procs_lock);
    return NULL;
}

/* argv[0] as execv needs it: a path as given, or found in PATH. */
static int resolve(const char *name, const char *path_list, char *out, size_t outlen)
{
    if (strchr(name, '/')) {
        snprintf(out, outlen, "%s", name);
        return access(out, X_OK);
    }
    for (const char *p = path_list; *p;) {
        size_t len = strcspn(p, ":");
        if (len > 0 && snprintf(out, outlen, "%.*s/%s", (int)len, p, name) < (int)outlen && access(out, X_OK) == 0)
            return 0;
        p += len;
        if (*p == ':')
            p++;
    }
    return -1;
}

int sim_process_start(const struct runtime *rt, struct workload *w, const char *container_dir, const char *cwd,
                      char *const envp[], char *msg, size_t msglen)
{
    pthread_mutex_lock(&procs_lock);
    struct sim_proc *old = find_locked(container_dir);
    int running = old && !old->done;
    pthread_mutex_unlock(&procs_lock);
    if (running)
        return STEP_OK; /* started before: a retried step */
    if (old)
        sim_process_stop(container_dir);
    const char *path_list = "/usr/local/bin:/usr/bin:/bin";
    for (char *const *e = envp; *e; e++)
        if (strncmp(*e, "PATH=", 5) == 0)
            path_list = *e + 5;
    char prog[PATH_MAX];
    if (resolve(w->spec.command[0], path_list, prog, sizeof prog) < 0) {
        snprintf(msg, msglen, "run: %.200s: executable file not found in $PATH", w->spec.command[0]);
        return STEP_FAIL;
    }
    struct sim_proc *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(msg, msglen, "run: out of memory");
        return STEP_FAIL;
    }
    snprintf(p->key, sizeof p->key, "%s", container_dir);
    snprintf(p->id, sizeof p->id, "%s", w->id);
    p->log_max = rt->conf->log_max_bytes;
    if (agent_node_dir(rt->agent, w->node, p->node_dir, sizeof p->node_dir) < 0) {
        free(p);
        snprintf(msg, msglen, "run: the node directory is too long");
        return STEP_FAIL;
    }
    /* argv is the spec's words; built before the fork (no allocation after). */
    char **argv = calloc((size_t)w->spec.n_command + 1, sizeof *argv);
    int out[2] = {-1, -1}, err[2] = {-1, -1}, status_pipe[2] = {-1, -1};
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (!argv || devnull < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 ||
        pipe2(status_pipe, O_CLOEXEC) < 0) {
        snprintf(msg, msglen, "run: cannot start: %s", strerror(errno));
        for (int i = 0; i < 2; i++) {
            if (out[i] >= 0)
                close(out[i]);
            if (err[i] >= 0)
                close(err[i]);
            if (status_pipe[i] >= 0)
                close(status_pipe[i]);
        }
        if (devnull >= 0)
            close(devnull);
        free(argv);
        free(p);
        return STEP_FAIL;
    }
    for (int i = 0; i < w->spec.n_command; i++)
        argv[i] = w->spec.command[i];
    sigset_t none;
    sigemptyset(&none);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        /* Child: async-signal-safe calls only, as in exec.c. */
        static const int defaults[] = {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT};
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
            signal(defaults[i], SIG_DFL);
        sigprocmask(SIG_SETMASK, &none, NULL);
        dup2(devnull, STDIN_FILENO);
        dup2(out[1], STDOUT_FILENO);
        dup2(err[1], STDERR_FILENO);
        int keep = status_pipe[1];
        if (keep != 3) {
            dup2(keep, 3);
            keep = 3;
        }
        fcntl(keep, F_SETFD, FD_CLOEXEC);
        close_range(4, ~0U, 0);
        int e = 0;
        if (chdir(cwd) < 0) {
            e = errno;
        } else {
            execve(prog, argv, envp);
            e = errno;
        }
        ssize_t ignored = write(keep, &e, sizeof e);
        (void)ignored;
        _exit(127);
    }
    int saved = errno;
    close(devnull);
    close(out[1]);
    close(err[1]);
    close(status_pipe[1]);
    free(argv);
    if (pid < 0) {
        close(out[0]);
        close(err[0]);
        close(status_pipe[0]);
        free(p);
        snprintf(msg, msglen, "run: cannot start: fork: %s", strerror(saved));
        return STEP_FAIL;
    }
    setpgid(pid, pid);
    /* The exec closes the status pipe: nothing read means it ran. */
    int child_err = 0;
    ssize_t got;
    while ((got = read(status_pipe[0], &child_err, sizeof child_err)) < 0 && errno == EINTR)
        ;
    close(status_pipe[0]);
    if (got > 0) {
        close(out[0]);
        close(err[0]);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        free(p);
        snprintf(msg, msglen, "run: cannot run %.200s in %.200s: %s", w->spec.command[0], cwd, strerror(child_err));
        return STEP_FAIL;
    }
    p->pid = pid;
    p->fds[0] = out[0];
    p->fds[1] = err[0];
    pthread_mutex_lock(&procs_lock);
    p->next = procs;
    procs = p;
    pthread_mutex_unlock(&procs_lock);
    if (pthread_create(&p->thread, NULL, reader_main, p) != 0) {
        /* No reader: the process cannot be followed, so it goes. */
        kill(-pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        close(out[0]);
        close(err[0]);
        pthread_mutex_lock(&procs_lock);
        for (struct sim_proc **pp = &procs; *pp; pp = &(*pp)->next)
            if (*pp == p) {
                *pp = p->next;
                break;
            }
        pthread_mutex_unlock(&procs_lock);
        free(p);
        snprintf(msg, msglen, "run: cannot start the output reader");
        return STEP_FAIL;
    }
    return STEP_OK;
}

int sim_process_state(const char *container_dir, int64_t *exit_at, int *code)
{
    pthread_mutex_lock(&procs_lock);
    struct sim_proc *p = find_locked(container_dir);
    int rc = !p ? -1 : p->done ? 1 : 0;
    if (p && p->done) {
        *exit_at = p->exit_at;
        *code = p->code;
    }
    pthread_mutex_unlock(&procs_lock);
    return rc;
}

void sim_process_stop(const char *container_dir)
{
    pthread_mutex_lock(&procs_lock);
    struct sim_proc *p = find_locked(container_dir);
    if (!p) {
        pthread_mutex_unlock(&procs_lock);
        return;
    }
    /* SIGTERM to the group, SIGKILL two seconds later, as for commands. */
    if (!p->done) {
        kill(-p->pid, SIGTERM);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 2;
        while (!p->done && pthread_cond_timedwait(&procs_cond, &procs_lock, &until) == 0)
            ;
    }
    /* Whatever of its group is left (a child it put in the background). */
    kill(-p->pid, SIGKILL);
    for (struct sim_proc **pp = &procs; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    pthread_mutex_unlock(&procs_lock);
    pthread_join(p->thread, NULL);
    free(p);
}

int sim_process_environ_has(const char *pid, const char *want)
{
    char path[320];
    snprintf(path, sizeof path, "/proc/%s/environ", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    /* Streamed through a small buffer, matched one NUL-ended element at a
     * time: a workload's removal looks at every process of the machine, so
     * this stays a few syscalls each, with no allocation. */
    char buf[4096];
    size_t wl = strlen(want), at = 0;
    int same = 1, found = 0;
    ssize_t r;
    while (!found && (r = read(fd, buf, sizeof buf)) > 0)
        for (ssize_t i = 0; i < r && !found; i++) {
            if (buf[i] == '\0') {
                found = same && at == wl;
                at = 0;
                same = 1;
            } else if (same && at < wl && buf[i] == want[at]) {
                at++;
            } else {
                same = 0;
            }
        }
    close(fd);
    return found || (same && at == wl);
}

/* Every process whose environment names the workload: the background
 * servers a user's ssh session left (`setsid nohup …`) as well as the
 * command's group. A real container's processes all end with it; the sim's
 * would outlive it, so they are looked up by GPURENT_WORKLOAD and killed,
 * again until none is left: one may fork while the list is read, and one
 * killed is still listed until it has exited (the container directory is
 * removed after this, and a dying process could still write into it). */
void sim_process_kill_workload(const char *wl_id)
{
    char want[128];
    snprintf(want, sizeof want, "GPURENT_WORKLOAD=%s", wl_id);
    pid_t self = getpid();
    for (int round = 0; round < 500; round++) { /* 5 s at most */
        DIR *d = opendir("/proc");
        if (!d)
            return;
        int killed = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] < '1' || e->d_name[0] > '9')
                continue;
            pid_t pid = (pid_t)strtol(e->d_name, NULL, 10);
            if (pid != self && sim_process_environ_has(e->d_name, want) && kill(pid, SIGKILL) == 0)
                killed++;
        }
        closedir(d);
        if (!killed)
            return;
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
    }
}
