/* discovery.c: GPU discovery as the agent calls it: picks the commands and
 * the parser for the configured tool, runs the commands with one time
 * limit and an output cap, parses what they printed, and fills in the ROCm
 * version from $ROCM_PATH/.info/version when the tools did not print it. */
#include "discovery/private.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpurent/log.h"

/* ---- the ROCm version file ------------------------------------------------- */

int discovery_parse_rocm_version(const char *text, size_t len, char *out, size_t cap)
{
    struct span v = {text, 0};
    size_t n = 0;

    if (cap > 0)
        out[0] = '\0';
    if (text == NULL || cap == 0)
        return -1;
    /* "6.0.2-115": the release, then the build number, which amd-smi leaves
     * out of its rocm_version, so it is left out here too. */
    while (v.n < len && isspace((unsigned char)text[v.n]) && text[v.n] != '\n')
        v.n++;
    v.p += v.n;
    v.n = 0;
    while (v.p + v.n < text + len && ((v.p[v.n] >= '0' && v.p[v.n] <= '9') || v.p[v.n] == '.'))
        v.n++;
    for (size_t i = 0; i < v.n; i++)
        n += v.p[i] >= '0' && v.p[i] <= '9';
    if (n == 0 || v.p[0] == '.' || v.n >= cap)
        return -1;
    text_copy(out, cap, v.p, v.n);
    return 0;
}

/* The ROCm version from $ROCM_PATH/.info/version (ROCm's install prefix,
 * /opt/rocm by default), for tools that do not print it. Best effort: ""
 * stays when the file is missing or odd. */
static void read_rocm_version(struct gpu_facts *f)
{
    const char *root = getenv("ROCM_PATH");
    char path[PATH_MAX], buf[256];
    struct stat st;
    ssize_t got;
    int fd;

    if (root == NULL || root[0] != '/')
        root = "/opt/rocm";
    if (snprintf(path, sizeof path, "%s/.info/version", root) >= (int)sizeof path)
        return;
    /* O_NONBLOCK: a FIFO planted there must not hang discovery. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        do
            got = read(fd, buf, sizeof buf);
        while (got < 0 && errno == EINTR);
        if (got > 0 && discovery_parse_rocm_version(buf, (size_t)got, f->stack_version, sizeof f->stack_version) != 0)
            log_warn("discovery: %s does not start with a version; no ROCm version reported", path);
    }
    close(fd);
}

/* ---- running the tools --------------------------------------------------- */

typedef int (*parser_fn)(const char *, size_t, struct gpu_facts *, char *, size_t);

/* Stdout of one or more commands, appended. */
struct capture {
    char *buf;  /* owned; freed by discovery_run */
    size_t len; /* bytes captured */
    size_t cap; /* bytes allocated */
};

static int timespec_ms_left(const struct timespec *deadline)
{
    struct timespec now;
    long long ms;

    clock_gettime(CLOCK_MONOTONIC, &now);
    ms = (long long)(deadline->tv_sec - now.tv_sec) * 1000 + (deadline->tv_nsec - now.tv_nsec) / 1000000;
    if (ms <= 0)
        return 0;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* Finds argv[0] the way a shell would, adding /opt/rocm/bin, where ROCm
 * installs amd-smi and rocm-smi without putting them in PATH. */
static int find_program(const char *name, char *path, size_t cap)
{
    const char *dirs = getenv("PATH");
    char list[4096];
    char *save = NULL;

    if (name[0] == '\0')
        return -1;
    if (strchr(name, '/') != NULL) {
        snprintf(path, cap, "%s", name);
        return access(path, X_OK);
    }
    snprintf(list, sizeof list, "%s:/opt/rocm/bin", dirs && dirs[0] ? dirs : "/usr/local/bin:/usr/bin:/bin");
    for (char *d = strtok_r(list, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        struct stat st;
        int n = snprintf(path, cap, "%s/%s", d, name);

        if (n < 0 || (size_t)n >= cap)
            continue;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0)
            return 0;
    }
    return -1;
}

static void kill_and_reap(pid_t pid)
{
    /* The child leads its own process group, so this also stops whatever it
     * started (a shell wrapper's sleep, amd-smi's Python helpers). */
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
}

/* First line of what the command said, for the error message. */
static void first_line(const char *s, size_t n, char *dst, size_t cap)
{
    size_t i = 0;

    while (i < n && isspace((unsigned char)s[i]))
        i++;
    s += i;
    n -= i;
    for (i = 0; i < n && s[i] != '\n'; i++)
        ;
    text_copy(dst, cap, s, i);
}

static int spawn_piped(const char *path, char *const argv[], int *out_fd, int *err_fd, pid_t *pid)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    sigset_t none, dflt;
    int outp[2], errp[2], rc;

    if (pipe2(outp, O_CLOEXEC) != 0)
        return errno;
    if (pipe2(errp, O_CLOEXEC) != 0) {
        rc = errno;
        close(outp[0]);
        close(outp[1]);
        return rc;
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, outp[1], 1);
    posix_spawn_file_actions_adddup2(&fa, errp[1], 2);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    /* The agent's sockets and database must not leak into the tool. */
    posix_spawn_file_actions_addclosefrom_np(&fa, 3);
#endif
    posix_spawnattr_init(&attr);
    sigemptyset(&none);
    sigemptyset(&dflt);
    /* The agent ignores SIGPIPE and may block signals in its threads; the
     * tool should start with the ordinary defaults. */
    sigaddset(&dflt, SIGPIPE);
    sigaddset(&dflt, SIGINT);
    sigaddset(&dflt, SIGTERM);
    sigaddset(&dflt, SIGHUP);
    sigaddset(&dflt, SIGQUIT);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &dflt);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    rc = posix_spawn(pid, path, &fa, &attr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(outp[1]);
    close(errp[1]);
    if (rc != 0) {
        close(outp[0]);
        close(errp[0]);
        return rc;
    }
    *out_fd = outp[0];
    *err_fd = errp[0];
    return 0;
}

/* Runs argv until it exits or the deadline passes, appending its stdout to
 * cap. Returns 0 when it exited with status 0. */
static int run_one(char *const argv[], const struct timespec *deadline, struct capture *cap, char *err, size_t errlen)
{
    char path[PATH_MAX], prog[64], said[128];
    char errbuf[512];
    size_t errlen_got = 0, start = cap->len;
    int fds[2] = {-1, -1}, rc, status;
    pid_t pid;

    text_copy_str(prog, sizeof prog, argv[0]);
    if (find_program(argv[0], path, sizeof path) != 0) {
        text_err(err, errlen, "%s: not found in PATH or /opt/rocm/bin", prog);
        return -1;
    }
    if ((rc = spawn_piped(path, argv, &fds[0], &fds[1], &pid)) != 0) {
        text_err(err, errlen, "%s: cannot start: %s", prog, strerror(rc));
        return -1;
    }
    while (fds[0] >= 0 || fds[1] >= 0) {
        struct pollfd p[2];
        nfds_t np = 0;
        int left = timespec_ms_left(deadline), n;

        if (left == 0) {
            text_err(err, errlen, "%s: no answer in time, killed", prog);
            goto kill;
        }
        for (int i = 0; i < 2; i++) {
            if (fds[i] >= 0)
                p[np++] = (struct pollfd){.fd = fds[i], .events = POLLIN};
        }
        n = poll(p, np, left);
        if (n < 0 && errno != EINTR) {
            text_err(err, errlen, "%s: poll: %s", prog, strerror(errno));
            goto kill;
        }
        for (nfds_t i = 0; n > 0 && i < np; i++) {
            int which = p[i].fd == fds[0] ? 0 : 1;
            char chunk[8192];
            ssize_t got;

            if (p[i].revents == 0)
                continue;
            got = read(p[i].fd, chunk, sizeof chunk);
            if (got < 0 && (errno == EINTR || errno == EAGAIN))
                continue;
            if (got <= 0) {
                close(fds[which]);
                fds[which] = -1;
                continue;
            }
            if (which == 1) {
                /* Keep the start of stderr for the message; drain the rest. */
                size_t take = sizeof errbuf - errlen_got;

                if ((size_t)got < take)
                    take = (size_t)got;
                memcpy(errbuf + errlen_got, chunk, take);
                errlen_got += take;
                continue;
            }
            if (cap->len + (size_t)got > DISCOVERY_MAX_OUTPUT) {
                text_err(err, errlen, "%s: more than %u bytes of output, killed", prog, DISCOVERY_MAX_OUTPUT);
                goto kill;
            }
            if (cap->len + (size_t)got > cap->cap) {
                size_t want = cap->cap ? cap->cap : 65536;
                char *nb;

                while (want < cap->len + (size_t)got)
                    want *= 2;
                if ((nb = realloc(cap->buf, want)) == NULL) {
                    text_err(err, errlen, "%s: out of memory", prog);
                    goto kill;
                }
                cap->buf = nb;
                cap->cap = want;
            }
            memcpy(cap->buf + cap->len, chunk, (size_t)got);
            cap->len += (size_t)got;
        }
    }
    /* Both pipes are closed; the tool is exiting or already gone. */
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);

        if (w == pid)
            break;
        if (w < 0 && errno != EINTR) {
            text_err(err, errlen, "%s: waitpid: %s", prog, strerror(errno));
            return -1;
        }
        if (timespec_ms_left(deadline) == 0) {
            text_err(err, errlen, "%s: did not exit in time, killed", prog);
            kill_and_reap(pid);
            return -1;
        }
        nanosleep(&(struct timespec){.tv_nsec = 5 * 1000 * 1000}, NULL);
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    if (errlen_got > 0)
        first_line(errbuf, errlen_got, said, sizeof said);
    else
        first_line(cap->buf ? cap->buf + start : "", cap->len - start, said, sizeof said);
    if (WIFEXITED(status))
        text_err(err, errlen, "%s exited with status %d%s%s", prog, WEXITSTATUS(status), said[0] ? ": " : "", said);
    else
        text_err(err, errlen, "%s killed by signal %d", prog, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    cap->len = start; /* a failed command's output is not parsed */
    return -1;
kill:
    kill_and_reap(pid);
    cap->len = start;
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    return -1;
}

/* The commands discovery_run uses when the caller gives none; words are
 * split on spaces into a private buffer so no string literal is ever passed
 * as a mutable argv. */
struct default_cmd {
    const char *words; /* argv, separated by single spaces */
    int optional;      /* failure is logged and discovery goes on */
};

static const struct default_cmd amd_cmds[] = {
    {"amd-smi version --json",                                           1},
    {"amd-smi static --asic --bus --vram --driver --board --ras --json", 0},
    {"amd-smi metric --ecc --json",                                      1},
    {NULL,                                                               0},
};
static const struct default_cmd rocm_cmds[] = {
    {"rocm-smi --showproductname --showmeminfo vram --showdriverversion --showserial "
     "--showbus --json", 0},
    {NULL,                    0},
};
static const struct default_cmd nvidia_cmds[] = {
    {"nvidia-smi --query-gpu=" DISCOVERY_NVIDIA_SMI_FIELDS " --format=csv,noheader,nounits", 0},
 /* No --query-gpu field gives the CUDA version; -q's header does. */
    {"nvidia-smi -q -d COMPUTE",                                                             1},
    {NULL,                                                                                   0},
};

#define MAX_ARGS 16

static void split_words(const char *words, char *store, size_t cap, char *av[MAX_ARGS])
{
    size_t n = 0;
    char *save = NULL;

    snprintf(store, cap, "%s", words);
    for (char *w = strtok_r(store, " ", &save); w && n + 1 < MAX_ARGS; w = strtok_r(NULL, " ", &save))
        av[n++] = w;
    av[n] = NULL;
}

int discovery_run(const char *tool, char *const argv[], int timeout_s, struct gpu_facts *out, char *err, size_t errlen)
{
    const struct default_cmd *cmds;
    struct capture cap = {NULL, 0, 0};
    struct timespec deadline;
    parser_fn parse;
    int rc = -1;

    memset(out, 0, sizeof *out);
    if (tool == NULL) {
        text_err(err, errlen, "discovery: no tool named");
        return -1;
    }
    if (strcmp(tool, "amd-smi") == 0) {
        parse = discovery_parse_amd_smi;
        cmds = amd_cmds;
    } else if (strcmp(tool, "rocm-smi") == 0) {
        parse = discovery_parse_rocm_smi;
        cmds = rocm_cmds;
    } else if (strcmp(tool, "nvidia-smi") == 0) {
        parse = discovery_parse_nvidia_smi_csv;
        cmds = nvidia_cmds;
    } else {
        char shown[32];

        text_copy_str(shown, sizeof shown, tool);
        text_err(err, errlen, "discovery: unknown tool \"%s\"", shown);
        return -1;
    }
    if (timeout_s <= 0 || timeout_s > 3600) {
        text_err(err, errlen, "discovery: timeout must be 1 to 3600 seconds");
        return -1;
    }
    if (argv != NULL && (argv[0] == NULL || argv[0][0] == '\0')) {
        text_err(err, errlen, "discovery: empty command");
        return -1;
    }
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeout_s;

    if (argv != NULL) {
        if (run_one(argv, &deadline, &cap, err, errlen) != 0)
            goto done;
    } else {
        for (const struct default_cmd *c = cmds; c->words != NULL; c++) {
            char store[512], *av[MAX_ARGS];
            char why[256];

            split_words(c->words, store, sizeof store, av);
            if (run_one(av, &deadline, &cap, why, sizeof why) == 0)
                continue;
            if (!c->optional) {
                text_err(err, errlen, "%s", why);
                goto done;
            }
            log_warn("discovery: skipping `%s`: %s", c->words, why);
        }
    }
    rc = parse(cap.buf ? cap.buf : "", cap.len, out, err, errlen);
    /* rocm-smi never prints the ROCm version, and amd-smi's version command
     * is optional. */
    if (rc == 0 && strcmp(out->stack, "ROCm") == 0 && out->stack_version[0] == '\0')
        read_rocm_version(out);
done:
    free(cap.buf);
    return rc;
}
