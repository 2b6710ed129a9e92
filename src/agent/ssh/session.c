/* ssh/session.c: SSH session channels: a command, a shell (with a PTY when
 * asked: window changes, signals) or the sftp subsystem, each a child
 * process the runtime describes (inside the workload's container), its
 * stdin fed from the channel and its stdout and stderr written back, its
 * end sent as exit-status or exit-signal (see ssh.h). */
#define GPURENT_SSH_INTERNAL
#include "ssh/ssh.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "gpurent/clock.h"

extern char **environ;

static const struct {
    const char *name; /* as SSH names it: no "SIG" */
    int sig;
} signals[] = {
    {"ABRT", SIGABRT},
    {"ALRM", SIGALRM},
    {"FPE",  SIGFPE },
    {"HUP",  SIGHUP },
    {"ILL",  SIGILL },
    {"INT",  SIGINT },
    {"KILL", SIGKILL},
    {"PIPE", SIGPIPE},
    {"QUIT", SIGQUIT},
    {"SEGV", SIGSEGV},
    {"TERM", SIGTERM},
    {"USR1", SIGUSR1},
    {"USR2", SIGUSR2},
};

/* RFC 4254 6.10's names; another signal as "NAME@gpurent" (the RFC's
 * form for names beyond its list), e.g. "BUS@gpurent" for the SIGBUS of a
 * GPU mapping's fault, rather than passing it off as KILL. */
static const char *signal_name(int sig)
{
    for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++)
        if (signals[i].sig == sig)
            return signals[i].name;
    static _Thread_local char other[32];
    const char *abbrev = sigabbrev_np(sig);
    if (abbrev)
        snprintf(other, sizeof other, "%s@gpurent", abbrev);
    else
        snprintf(other, sizeof other, "%d@gpurent", sig);
    return other;
}

struct ssh_chan *ssh_chan_new(struct ssh_conn *c, enum ssh_chan_kind kind)
{
    if (c->n_chans >= SSH_CHANNELS_MAX)
        return NULL;
    struct ssh_chan *ch = calloc(1, sizeof *ch);
    if (!ch)
        return NULL;
    ch->conn = c;
    ch->kind = kind;
    ch->in_fd = ch->out_fd = ch->err_fd = -1;
    ch->out_ref.chan = ch;
    ch->err_ref.chan = ch;
    ch->err_ref.is_stderr = 1;
    c->chans[c->n_chans++] = ch;
    return ch;
}

static int output_ready(socket_t fd, int revents, void *userdata);

/* Sends what of ref's unsent bytes the client's window takes now, never
 * more: a write past the window would wait for the client on this, the
 * connection's only thread (every other channel stalled meanwhile), and
 * libssh gives up on such a wait after the session's timeout having sent
 * only part. While bytes are left the fd is out of the event, so nothing
 * more is read from it; the client's window adjust lets the pump send the
 * rest and put it back. The window is the back-pressure, as RFC 4254 5.2
 * has it: nothing is dropped. */
static void send_unsent(struct ssh_chan_fd *ref)
{
    struct ssh_chan *ch = ref->chan;
    while (ref->off < ref->len) {
        uint32_t room = ssh_channel_window_size(ch->channel);
        if (room == 0)
            break;
        uint32_t n = ref->len - ref->off < room ? (uint32_t)(ref->len - ref->off) : room;
        int rc = ref->is_stderr ? ssh_channel_write_stderr(ch->channel, ref->buf + ref->off, n)
                                : ssh_channel_write(ch->channel, ref->buf + ref->off, n);
        if (rc == SSH_ERROR) {
            ref->off = ref->len = 0;
            ref->eof = 1;
            break;
        }
        if (rc <= 0)
            break;
        ref->off += (size_t)rc;
    }
    if (ref->off == ref->len) {
        ref->off = ref->len = 0;
        if (ref->paused && !ref->eof &&
            ssh_event_add_fd(ch->conn->event, ref->fd, POLLIN, output_ready, ref) != SSH_OK)
            ref->eof = 1;
        ref->paused = 0;
    } else if (!ref->paused) {
        ssh_event_remove_fd(ch->conn->event, ref->fd);
        ref->paused = 1;
    }
}

/* Output of a child (or a forwarded socket) into the channel. */
static int output_ready(socket_t fd, int revents, void *userdata)
{
    struct ssh_chan_fd *ref = userdata;
    struct ssh_chan *ch = ref->chan;
    if (ref->eof || ref->len > 0)
        return 0;
    ssize_t n = read(fd, ref->buf, sizeof ref->buf);
    if (n > 0) {
        ch->conn->last_activity_ms = clock_mono_ms();
        ref->off = 0;
        ref->len = (size_t)n;
        send_unsent(ref);
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        ref->eof = 1; /* EIO on a PTY master: the other side is closed */
    }
    return 0;
}

int ssh_chan_watch(struct ssh_chan *ch, int fd, int is_stderr)
{
    struct ssh_chan_fd *ref = is_stderr ? &ch->err_ref : &ch->out_ref;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    ref->fd = fd;
    return ssh_event_add_fd(ch->conn->event, fd, POLLIN, output_ready, ref) == SSH_OK ? 0 : -1;
}

/* Writes what it can of the held input; 0, or -1 when in_fd is gone. */
static int flush_pending(struct ssh_chan *ch)
{
    while (ch->pending_len > 0 && ch->in_fd >= 0) {
        ssize_t n = write(ch->in_fd, ch->pending, ch->pending_len);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return 0;
            return -1;
        }
        memmove(ch->pending, ch->pending + n, ch->pending_len - (size_t)n);
        ch->pending_len -= (size_t)n;
    }
    return 0;
}

static int chan_data(ssh_session session, ssh_channel channel, void *data, uint32_t len, int is_stderr, void *userdata)
{
    struct ssh_chan *ch = userdata;
    ch->conn->last_activity_ms = clock_mono_ms();
    if (ch->in_fd < 0 || is_stderr)
        return (int)len; /* nobody reads it: dropped, as sshd does */
    flush_pending(ch);
    size_t taken = 0;
    if (ch->pending_len == 0) {
        ssize_t n = write(ch->in_fd, data, len);
        if (n > 0)
            taken = (size_t)n;
    }
    /* The rest is held here up to a bound; beyond it libssh keeps it in
     * the channel's buffer (its window then stops the client), and the
     * pump reads it from there as the child takes what is held. */
    size_t room = SSH_PENDING_MAX - ch->pending_len, keep = len - taken < room ? len - taken : room;
    if (keep > 0) {
        char *p = realloc(ch->pending, ch->pending_len + keep);
        if (!p)
            return (int)taken;
        ch->pending = p;
        memcpy(ch->pending + ch->pending_len, (char *)data + taken, keep);
        ch->pending_len += keep;
        taken += keep;
    }
    return (int)taken;
}

/* Moves what libssh holds for the channel (what chan_data had no room
 * for) into pending as it empties: libssh offers it again only with the
 * client's next packet, and the client sends none once its window is
 * used up, so without this an upload into a slow reader hung for ever.
 * Reading it also reopens the window. */
static void take_buffered(struct ssh_chan *ch)
{
    while (ch->in_fd >= 0 && ch->pending_len < SSH_PENDING_MAX && ssh_channel_poll(ch->channel, 0) > 0) {
        char buf[16384];
        size_t room = SSH_PENDING_MAX - ch->pending_len, want = room < sizeof buf ? room : sizeof buf;
        int n = ssh_channel_read_nonblocking(ch->channel, buf, (uint32_t)want, 0);
        if (n <= 0)
            break;
        char *p = realloc(ch->pending, ch->pending_len + (size_t)n);
        if (!p)
            break; /* what was read is lost with the memory: the child's input ends short */
        ch->pending = p;
        memcpy(ch->pending + ch->pending_len, buf, (size_t)n);
        ch->pending_len += (size_t)n;
        if (flush_pending(ch) < 0)
            break;
    }
}

static void close_input_if_done(struct ssh_chan *ch)
{
    if (!ch->client_eof || ch->pending_len > 0 || ch->in_fd < 0 || ssh_channel_poll(ch->channel, 0) > 0)
        return;
    if (ch->kind == CHAN_FORWARD) {
        shutdown(ch->in_fd, SHUT_WR); /* in_fd is out_fd: the socket */
        ch->client_eof = 2;
    } else if (!ch->tty) {
        close(ch->in_fd);
        ch->in_fd = -1;
    } else {
        /* A PTY has no half-close: EOF is the terminal's ^D. */
        char eot = 4;
        if (write(ch->in_fd, &eot, 1) < 0)
            log_debug("ssh: cannot pass EOF to a pty: %s", strerror(errno));
        ch->client_eof = 2;
    }
}

static void chan_eof(ssh_session session, ssh_channel channel, void *userdata)
{
    struct ssh_chan *ch = userdata;
    if (!ch->client_eof)
        ch->client_eof = 1;
}

static void chan_close(ssh_session session, ssh_channel channel, void *userdata)
{
    struct ssh_chan *ch = userdata;
    ch->client_closed = 1;
    /* The client left: the session's processes get the hang-up a terminal
     * gives (sshd does the same). */
    if (ch->pid > 0 && !ch->reaped)
        kill(-ch->pid, SIGHUP);
}

static int chan_pty_request(ssh_session session, ssh_channel channel, const char *term, int width, int height,
                            int pxwidth, int pxheight, void *userdata)
{
    struct ssh_chan *ch = userdata;
    if (ch->started || ch->tty)
        return -1;
    ch->tty = 1;
    snprintf(ch->term, sizeof ch->term, "%s", term && strlen(term) < sizeof ch->term ? term : "xterm");
    for (char *p = ch->term; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
              *p == '_' || *p == '.' || *p == '+'))
            *p = '_';
    ch->ws.ws_col = (unsigned short)(width > 0 && width < 10000 ? width : 80);
    ch->ws.ws_row = (unsigned short)(height > 0 && height < 10000 ? height : 24);
    ch->ws.ws_xpixel = (unsigned short)(pxwidth > 0 && pxwidth < 65536 ? pxwidth : 0);
    ch->ws.ws_ypixel = (unsigned short)(pxheight > 0 && pxheight < 65536 ? pxheight : 0);
    return 0;
}

static int chan_window_change(ssh_session session, ssh_channel channel, int width, int height, int pxwidth,
                              int pxheight, void *userdata)
{
    struct ssh_chan *ch = userdata;
    if (!ch->tty)
        return -1;
    ch->ws.ws_col = (unsigned short)(width > 0 && width < 10000 ? width : ch->ws.ws_col);
    ch->ws.ws_row = (unsigned short)(height > 0 && height < 10000 ? height : ch->ws.ws_row);
    if (ch->in_fd >= 0)
        ioctl(ch->in_fd, TIOCSWINSZ, &ch->ws);
    return 0;
}

static void chan_signal(ssh_session session, ssh_channel channel, const char *name, void *userdata)
{
    struct ssh_chan *ch = userdata;
    if (ch->pid <= 0 || ch->reaped || !name)
        return;
    for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++)
        if (strcmp(signals[i].name, name) == 0)
            kill(-ch->pid, signals[i].sig);
}

/* argv[0] as execve wants it: looked up in PATH before the fork. */
static int find_program(const char *name, char *out, size_t outlen)
{
    if (strchr(name, '/'))
        return snprintf(out, outlen, "%s", name) < (int)outlen ? 0 : -1;
    const char *path = getenv("PATH");
    if (!path)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        size_t n = strcspn(path, ":");
        if (n > 0 && snprintf(out, outlen, "%.*s/%s", (int)n, path, name) < (int)outlen && access(out, X_OK) == 0)
            return 0;
        path += n + (path[n] == ':');
    }
    return -1;
}

/* Forks argv: with tty, its own session whose controlling terminal is a
 * new PTY of size ws (fds[0] = fds[1] = the master, fds[2] = -1);
 * otherwise its own process group on three pipes (fds: its stdin, stdout,
 * stderr, the parent's ends). Either way signals to -*pid reach what it
 * started. Only async-signal-safe calls between fork and exec. 0, or -1
 * with msg. */
static int spawn_process(int tty, const struct winsize *ws, struct argv_buf *argv, struct argv_buf *env,
                         const char *cwd, pid_t *pid_out, int fds[3], char *msg, size_t msglen)
{
    char prog[PATH_MAX];
    if (find_program(argv->v[0], prog, sizeof prog) < 0) {
        snprintf(msg, msglen, "%s: not found", argv->v[0]);
        return -1;
    }
    char *const *envp = env->n > 0 ? env->v : environ;
    int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1}, master = -1, slave = -1;
    if (tty) {
        struct winsize size = *ws;
        if (openpty(&master, &slave, NULL, NULL, &size) < 0) {
            snprintf(msg, msglen, "openpty: %s", strerror(errno));
            return -1;
        }
        fcntl(master, F_SETFD, FD_CLOEXEC);
        fcntl(slave, F_SETFD, FD_CLOEXEC);
    } else if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0) {
        snprintf(msg, msglen, "pipe: %s", strerror(errno));
        for (int i = 0; i < 2; i++) {
            if (in[i] >= 0)
                close(in[i]);
            if (out[i] >= 0)
                close(out[i]);
            if (err[i] >= 0)
                close(err[i]);
        }
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(msg, msglen, "fork: %s", strerror(errno));
        if (tty) {
            close(master);
            close(slave);
        } else {
            close(in[0]), close(in[1]), close(out[0]), close(out[1]), close(err[0]), close(err[1]);
        }
        return -1;
    }
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        static const int reset[] = {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD};
        for (size_t i = 0; i < sizeof reset / sizeof reset[0]; i++)
            signal(reset[i], SIG_DFL);
        if (tty) {
            setsid();
            ioctl(slave, TIOCSCTTY, 0);
            dup2(slave, 0), dup2(slave, 1), dup2(slave, 2);
        } else {
            setpgid(0, 0);
            dup2(in[0], 0), dup2(out[1], 1), dup2(err[1], 2);
        }
        syscall(SYS_close_range, 3U, ~0U, 0U);
        if (cwd[0] && chdir(cwd) < 0)
            _exit(127);
        execve(prog, argv->v, envp);
        _exit(127);
    }
    *pid_out = pid;
    if (tty) {
        close(slave);
        fds[0] = fds[1] = master;
        fds[2] = -1;
        return 0;
    }
    close(in[0]), close(out[1]), close(err[1]);
    fds[0] = in[1];
    fds[1] = out[0];
    fds[2] = err[0];
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    return 0;
}

/* The channel's child, its output watched. */
static int spawn(struct ssh_chan *ch, struct argv_buf *argv, struct argv_buf *env, const char *cwd, char *msg,
                 size_t msglen)
{
    int fds[3];
    if (spawn_process(ch->tty, &ch->ws, argv, env, cwd, &ch->pid, fds, msg, msglen) < 0)
        return -1;
    ch->in_fd = fds[0];
    ch->out_fd = fds[1];
    ch->err_fd = fds[2];
    if (ch->tty)
        return ssh_chan_watch(ch, ch->out_fd, 0) < 0 ? -1 : 0;
    return ssh_chan_watch(ch, ch->out_fd, 0) < 0 || ssh_chan_watch(ch, ch->err_fd, 1) < 0 ? -1 : 0;
}

/* The workload's interactive shell as an SSH shell channel with a PTY
 * runs it (the runtime's shell: podman/docker exec into the container, or
 * the sim's shell), for the web terminal (terminal.c). */
int ssh_shell_start(struct agent *a, struct agent_node *n, const char *wl_id, const char *term, unsigned cols,
                    unsigned rows, pid_t *pid, int *master, char *msg, size_t msglen)
{
    struct argv_buf argv = {0}, env = {0};
    char cwd[PATH_MAX] = "", term_var[96];
    snprintf(term_var, sizeof term_var, "TERM=%s", term && term[0] && strlen(term) < 64 ? term : "xterm");
    const char *vars[] = {term_var, NULL};
    struct winsize ws = {.ws_col = (unsigned short)cols, .ws_row = (unsigned short)rows};
    int rc = -1;
    pthread_mutex_lock(&n->lock);
    struct workload *w = agent_node_workload(n, wl_id);
    if (!w || w->removing || w->phase != WL_RUNNING)
        snprintf(msg, msglen, "the workload is no longer running");
    else
        rc = a->rt->ops->shell(a->rt, w, NULL, 1, vars, &argv, &env, cwd, sizeof cwd, msg, msglen) == STEP_OK ? 0
                                                                                                              : -1;
    pthread_mutex_unlock(&n->lock);
    int fds[3];
    if (rc == 0)
        rc = spawn_process(1, &ws, &argv, &env, cwd, pid, fds, msg, msglen);
    if (rc == 0)
        *master = fds[0];
    argv_free(&argv);
    argv_free(&env);
    return rc;
}

/* The variables sshd gives a session: its TERM when it asked for one, and
 * where the connection comes from and goes to (SSH_CLIENT "addr port
 * port", SSH_CONNECTION "addr port addr port"), which scripts and editors'
 * remote modes read. vars gets the list, NULL-terminated, in text. */
static void session_vars(const struct ssh_chan *ch, char text[3][256], const char *vars[4])
{
    const struct ssh_conn *c = ch->conn;
    char here[64] = "0.0.0.0", port[16] = "0";
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(c->fd, (struct sockaddr *)&ss, &len) == 0)
        getnameinfo((struct sockaddr *)&ss, len, here, sizeof here, port, sizeof port, NI_NUMERICHOST | NI_NUMERICSERV);
    size_t n = 0;
    snprintf(text[0], 256, "SSH_CLIENT=%s %d %s", c->addr, c->port, port);
    snprintf(text[1], 256, "SSH_CONNECTION=%s %d %s %s", c->addr, c->port, here, port);
    vars[n++] = text[0];
    vars[n++] = text[1];
    if (ch->term[0]) {
        snprintf(text[2], 256, "TERM=%s", ch->term);
        vars[n++] = text[2];
    }
    vars[n] = NULL;
}

/* Starts what the channel asked for: command (NULL for a shell) or, with
 * sftp set, the agent's own SFTP server on the workload's /shared volume.
 * 0, or 1 (refused, logged). */
static int chan_start(struct ssh_chan *ch, const char *command, int sftp)
{
    struct ssh_conn *c = ch->conn;
    struct agent *a = c->srv->agent;
    struct agent_node *n = c->listener->node;
    if (ch->started)
        return 1; /* refused, but what runs goes on */
    struct argv_buf argv = {0}, env = {0};
    char cwd[PATH_MAX] = "", msg[512] = "", shared[PATH_MAX];
    int rc = -1;
    pthread_mutex_lock(&n->lock);
    struct workload *w = ssh_conn_workload(c);
    if (!w) {
        snprintf(msg, sizeof msg, "the workload is no longer running");
    } else if (sftp) {
        if (runtime_shared_dir(a->rt, w, shared, sizeof shared) < 0) {
            snprintf(msg, sizeof msg, "the workload mounts no volume at /shared");
        } else {
            argv_add(&argv, "/proc/self/exe");
            argv_add(&argv, "sftp-server");
            argv_add(&argv, "--root");
            argv_add(&argv, shared);
            rc = argv.overflow ? -1 : 0;
        }
    } else {
        char text[3][256];
        const char *vars[4];
        session_vars(ch, text, vars);
        rc = a->rt->ops->shell(a->rt, w, command, ch->tty, vars, &argv, &env, cwd, sizeof cwd, msg, sizeof msg) ==
                     STEP_OK
                 ? 0
                 : -1;
    }
    pthread_mutex_unlock(&n->lock);
    if (rc == 0)
        rc = spawn(ch, &argv, &env, cwd, msg, sizeof msg);
    if (rc == 0) {
        ch->started = 1;
        log_info("ssh: node %s workload %s user %s from %s:%d: %s%s", n->name, c->wl_id, c->user, c->addr, c->port,
                 sftp      ? "sftp"
                 : command ? "command"
                           : "shell",
                 ch->tty ? " with a pty" : "");
    } else {
        log_warn("ssh: node %s workload %s user %s from %s:%d: cannot start %s: %s", n->name, c->wl_id, c->user,
                 c->addr, c->port,
                 sftp      ? "sftp"
                 : command ? "the command"
                           : "a shell",
                 msg);
        ch->refused = 1;
    }
    argv_free(&argv);
    argv_free(&env);
    return rc == 0 ? 0 : 1;
}

static int chan_exec(ssh_session session, ssh_channel channel, const char *command, void *userdata)
{
    return chan_start(userdata, command, 0);
}

static int chan_shell(ssh_session session, ssh_channel channel, void *userdata)
{
    return chan_start(userdata, NULL, 0);
}

static int chan_subsystem(ssh_session session, ssh_channel channel, const char *subsystem, void *userdata)
{
    struct ssh_chan *ch = userdata;
    if (strcmp(subsystem, "sftp") != 0) {
        ch->refused = 1;
        return 1;
    }
    return chan_start(ch, NULL, 1);
}

void ssh_chan_set_callbacks(struct ssh_chan *ch)
{
    memset(&ch->cb, 0, sizeof ch->cb);
    ch->cb.userdata = ch;
    ch->cb.channel_data_function = chan_data;
    ch->cb.channel_eof_function = chan_eof;
    ch->cb.channel_close_function = chan_close;
    if (ch->kind == CHAN_SESSION) {
        ch->cb.channel_pty_request_function = chan_pty_request;
        ch->cb.channel_pty_window_change_function = chan_window_change;
        ch->cb.channel_signal_function = chan_signal;
        ch->cb.channel_exec_request_function = chan_exec;
        ch->cb.channel_shell_request_function = chan_shell;
        ch->cb.channel_subsystem_request_function = chan_subsystem;
    }
    ssh_callbacks_init(&ch->cb);
    ssh_set_channel_callbacks(ch->channel, &ch->cb);
}

ssh_channel ssh_session_open(ssh_session session, void *userdata)
{
    struct ssh_conn *c = userdata;
    if (!c->authenticated)
        return NULL;
    struct ssh_chan *ch = ssh_chan_new(c, CHAN_SESSION);
    if (!ch)
        return NULL;
    ch->channel = ssh_channel_new(session);
    if (!ch->channel)
        return NULL;
    ssh_chan_set_callbacks(ch);
    return ch->channel;
}

static void unwatch(struct ssh_chan *ch, int *fd, struct ssh_chan_fd *ref)
{
    if (*fd < 0)
        return;
    ssh_event_remove_fd(ch->conn->event, *fd);
    if (*fd == ch->in_fd)
        ch->in_fd = -1;
    close(*fd);
    *fd = -1;
    ref->eof = 1;
}

void ssh_chan_pump(struct ssh_chan *ch)
{
    if (ch->finished)
        return;
    if (!ch->started) {
        /* What it asked to run was refused, or its client closed it before
         * asking: it is closed and its slot freed, as sshd does, or a
         * client multiplexing one connection would wait on it for ever. */
        if (ch->kind == CHAN_SESSION && (ch->refused || ch->client_closed)) {
            if (!ch->client_closed)
                ssh_channel_send_eof(ch->channel);
            ssh_channel_close(ch->channel);
            ch->finished = 1;
        }
        return;
    }
    if (flush_pending(ch) < 0) {
        ch->pending_len = 0;
        if (ch->in_fd >= 0 && ch->in_fd != ch->out_fd)
            close(ch->in_fd);
        ch->in_fd = ch->in_fd == ch->out_fd ? ch->in_fd : -1;
    } else {
        take_buffered(ch);
    }
    /* Output the client's window held back goes on as it opens; once the
     * client has closed the channel there is nobody to send it to. */
    struct ssh_chan_fd *refs[] = {&ch->out_ref, &ch->err_ref};
    for (int i = 0; i < 2; i++) {
        if (refs[i]->len > 0 && ch->client_closed) {
            refs[i]->off = refs[i]->len = 0;
            refs[i]->eof = 1;
        } else if (refs[i]->len > 0) {
            send_unsent(refs[i]);
        }
    }
    if (ch->client_eof == 1)
        close_input_if_done(ch);
    if (ch->pid > 0 && !ch->reaped) {
        int st;
        if (waitpid(ch->pid, &st, WNOHANG) == ch->pid) {
            ch->reaped = 1;
            ch->wait_status = st;
        }
    }
    /* A PTY stays open while anything the shell left behind holds it; the
     * session ends with the shell, after what it wrote has been read. */
    if (ch->tty && ch->reaped && !ch->out_ref.eof) {
        struct ssh_chan_fd *ref = &ch->out_ref;
        while (ref->len == 0 && !ref->eof) {
            ssize_t n = read(ch->out_fd, ref->buf, sizeof ref->buf);
            if (n <= 0) {
                ref->eof = 1;
                break;
            }
            ref->off = 0;
            ref->len = (size_t)n;
            send_unsent(ref);
        }
        if (ref->len > 0)
            return; /* the rest once the client's window opens */
    }
    if (ch->out_ref.eof)
        unwatch(ch, &ch->out_fd, &ch->out_ref);
    if (ch->err_ref.eof)
        unwatch(ch, &ch->err_fd, &ch->err_ref);
    if (ch->kind == CHAN_FORWARD) {
        if (ch->out_fd < 0 || ch->client_closed) {
            if (ch->out_fd >= 0)
                unwatch(ch, &ch->out_fd, &ch->out_ref);
            if (!ch->client_closed)
                ssh_channel_send_eof(ch->channel);
            ssh_channel_close(ch->channel);
            ch->finished = 1;
        }
        return;
    }
    if (!ch->reaped || ch->out_fd >= 0 || ch->err_fd >= 0)
        return;
    if (ch->in_fd >= 0) {
        close(ch->in_fd);
        ch->in_fd = -1;
    }
    struct ssh_conn *c = ch->conn;
    if (WIFEXITED(ch->wait_status))
        log_info("ssh: node %s workload %s user %s from %s:%d: ended with status %d", c->listener->node->name, c->wl_id,
                 c->user, c->addr, c->port, WEXITSTATUS(ch->wait_status));
    else
        log_info("ssh: node %s workload %s user %s from %s:%d: ended by signal %s", c->listener->node->name, c->wl_id,
                 c->user, c->addr, c->port, signal_name(WTERMSIG(ch->wait_status)));
    if (!ch->client_closed) {
        if (WIFEXITED(ch->wait_status))
            ssh_channel_request_send_exit_status(ch->channel, WEXITSTATUS(ch->wait_status));
        else if (WIFSIGNALED(ch->wait_status))
            ssh_channel_request_send_exit_signal(ch->channel, signal_name(WTERMSIG(ch->wait_status)),
                                                 WCOREDUMP(ch->wait_status), "", "");
        ssh_channel_send_eof(ch->channel);
        ssh_channel_close(ch->channel);
    }
    ch->finished = 1;
}

void ssh_conn_drop_finished(struct ssh_conn *c)
{
    int kept = 0;
    for (int i = 0; i < c->n_chans; i++) {
        struct ssh_chan *ch = c->chans[i];
        if (!ch->finished) {
            c->chans[kept++] = ch;
            continue;
        }
        /* Its close is queued on the session; libssh must not call back
         * into ch once it is freed, whatever the client sends for it. */
        if (ch->channel) {
            ssh_remove_channel_callbacks(ch->channel, &ch->cb);
            ssh_channel_free(ch->channel);
            ch->channel = NULL;
        }
        ssh_chan_free(ch);
    }
    c->n_chans = kept;
}

void ssh_chan_free(struct ssh_chan *ch)
{
    if (!ch)
        return;
    if (ch->pid > 0 && !ch->reaped) {
        kill(-ch->pid, SIGHUP);
        int st;
        for (int i = 0; i < 20 && waitpid(ch->pid, &st, WNOHANG) == 0; i++)
            usleep(50000);
        if (waitpid(ch->pid, &st, WNOHANG) == 0) {
            kill(-ch->pid, SIGKILL);
            waitpid(ch->pid, &st, 0);
        }
    }
    if (ch->out_fd >= 0)
        unwatch(ch, &ch->out_fd, &ch->out_ref);
    if (ch->err_fd >= 0)
        unwatch(ch, &ch->err_fd, &ch->err_ref);
    if (ch->in_fd >= 0)
        close(ch->in_fd);
    free(ch->pending);
    free(ch);
}
