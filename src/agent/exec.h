/* exec.h: the agent's one process runner (exec.c), used by the runtimes,
 * the volume mounts and GPU discovery alike. agent.h includes it; the
 * discovery folder includes it alone, since it needs nothing else of the
 * agent. */
#ifndef GPURENT_AGENT_EXEC_H
#define GPURENT_AGENT_EXEC_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define EXEC_OUTPUT_MAX 4096 /* bytes of output kept (the tail) */

/* Where stdout goes when the caller keeps it apart from stderr and wants
 * all of it: appended to buf, which the caller owns. */
struct exec_capture {
    char *buf;  /* cap bytes; not NUL-terminated */
    size_t cap; /* more stdout than fits in buf kills the command */
    size_t len; /* bytes of buf in use; exec_run appends from here */
    int full;   /* some of this stream did not fit and was dropped */
};

struct exec_opts {
    int64_t deadline_ms;      /* clock_mono_ms() at which the command is killed */
    atomic_int *cancel;       /* kill it as soon as this is non-zero (DELETE); may be NULL */
    atomic_int *stop;         /* the same for shutdown; may be NULL */
    const char *also_path;    /* ':'-separated directories searched after PATH for argv[0]; may be NULL */
    struct exec_capture *out; /* stdout apart and whole; NULL: with stderr into the result's tail */
    struct exec_capture *err; /* with out only: stderr whole too (it still feeds the tail); may be NULL */
};

struct exec_result {
    int started;                  /* the program could be started */
    int exited;                   /* it exited (rather than was killed) */
    int status;                   /* its exit status when exited */
    int signal;                   /* the signal that ended it when not exited */
    int timed_out;                /* killed at the deadline (or not started, the deadline being past) */
    int interrupted;              /* killed because cancel or stop was set */
    int overflowed;               /* killed because its stdout did not fit in out->buf */
    char output[EXEC_OUTPUT_MAX]; /* stderr, and stdout unless captured apart: the last bytes, NUL-terminated;
                                     when not started, why not */
};

/* Runs argv[0] (looked up in PATH, then in also_path, before the fork) with
 * argv, no shell, stdin from /dev/null, in its own process group, with the
 * signal mask and the dispositions of SIGPIPE, SIGINT, SIGTERM, SIGHUP and
 * SIGQUIT reset to the defaults. Kills the group (SIGTERM, SIGKILL two
 * seconds later) at the deadline, when *cancel or *stop becomes non-zero,
 * or when captured stdout overflows. Returns 0 when it exited with status 0
 * and none of that happened, else -1 (see r). The caller must not set
 * SIGCHLD to SIG_IGN (the child is reaped here). */
int exec_run(char *const argv[], const struct exec_opts *o, struct exec_result *r);
/* "exit status 2: <last output line>" and the like, for messages. */
void exec_describe(const struct exec_result *r, char *out, size_t outlen);
/* The last non-empty line of n bytes of text, control characters as spaces,
 * into out ("" when there is none): what a failing command says last. */
void exec_last_line(const char *text, size_t n, char *out, size_t outlen);

#endif
