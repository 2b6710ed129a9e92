/* runtime.c: picks the runtime named in the configuration, and the sim
 * runtime: the same phases as podman with configured delays and failures
 * injected by name (an image containing fail-pull, fail-start or
 * exit-after[-MS], with exit-code-N for the status it exits with, 0..255,
 * 0 when absent, and only-rank-R to exit only the workload whose NODE_RANK
 * is R, the others running on; a volume source containing fail-mount), so
 * tests, demos
 * and fleet benchmarks exercise every path without containers. The sim
 * never sleeps: its delays are driver timers. Its run time is counted on
 * the wall clock from the instant the workload entered running, kept in
 * the record, so an exit lands on the second it was due, across restarts
 * too. Its "output" goes to the workload's log (logs.c): a line when the
 * container starts, "tick K" every N ms for an image containing
 * log-every-N (written by the state checks, which the driver's timers wake
 * at each tick: no thread per workload), and a line when it exits. A spec
 * with a command is different: the command really runs (sim_process.c),
 * its output is the log, its exit status and second what is reported. */
#include "agent.h"

#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpurent/clock.h"

#include <limits.h>
#include <stdarg.h>

/* Whether an only-rank-R image names another rank than this workload's. */
static int sim_other_rank(const struct wl_spec *spec)
{
    const char *p = strstr(spec->image, "only-rank-");
    if (!p)
        return 0;
    p += strlen("only-rank-");
    const char *rank = "";
    for (int i = 0; i < spec->n_env; i++)
        if (strcmp(spec->env[i].name, "NODE_RANK") == 0)
            rank = spec->env[i].value;
    size_t n = strspn(p, "0123456789");
    return n == 0 || strlen(rank) != n || strncmp(p, rank, n) != 0;
}

int64_t sim_exit_after_ms(const struct wl_spec *spec, int64_t def_ms)
{
    const char *p = spec->image ? strstr(spec->image, "exit-after") : NULL;
    if (!p || sim_other_rank(spec))
        return -1;
    p += strlen("exit-after");
    if (p[0] != '-' || p[1] < '0' || p[1] > '9')
        return def_ms;
    int64_t v = 0;
    for (p++; *p >= '0' && *p <= '9'; p++)
        if ((v = v * 10 + (*p - '0')) > 86400000)
            return 86400000;
    return v;
}

/* The status an exit-after image exits with: exit-code-N in its name
 * (N cut to 0..255 as a process's status is), else 0. */
static int sim_exit_code(const struct wl_spec *spec)
{
    const char *p = spec->image ? strstr(spec->image, "exit-code-") : NULL;
    if (!p)
        return 0;
    int v = 0;
    for (p += strlen("exit-code-"); *p >= '0' && *p <= '9' && v < 1000; p++)
        v = v * 10 + (*p - '0');
    return v & 0xff;
}

/* ms between "tick" lines of a log-every-N image, or -1 for none; N is
 * kept within 10 ms .. a day so a typo cannot flood the disk. */
static int64_t sim_log_every_ms(const struct wl_spec *spec)
{
    const char *p = spec->image ? strstr(spec->image, "log-every-") : NULL;
    if (!p)
        return -1;
    p += strlen("log-every-");
    if (*p < '0' || *p > '9')
        return -1;
    int64_t v = 0;
    for (; *p >= '0' && *p <= '9'; p++)
        if ((v = v * 10 + (*p - '0')) > 86400000)
            return 86400000;
    return v < 10 ? 10 : v;
}

/* Appends one line of the simulated container's output. */
static void sim_log(const struct runtime *rt, struct workload *w, char stream, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void sim_log(const struct runtime *rt, struct workload *w, char stream, const char *fmt, ...)
{
    char dir[PATH_MAX], text[512];
    if (agent_node_dir(rt->agent, w->node, dir, sizeof dir) < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    wl_log_append(dir, w->id, rt->conf->log_max_bytes, clock_wall_ms(), stream, text,
                  (size_t)n < sizeof text ? (size_t)n : sizeof text - 1);
}

/* At most this many missed ticks are written at once (a late worker, a
 * restart): the log says what a container would have printed, not a flood. */
#define SIM_TICK_BURST 100

/* Writes the tick lines due by now (or by the exit, if earlier). */
static void sim_ticks(const struct runtime *rt, struct workload *w, int64_t now_ms, int64_t exit_due_ms)
{
    int64_t every = sim_log_every_ms(&w->spec);
    if (every < 0 || w->running_at_ms <= 0)
        return;
    int64_t until = exit_due_ms >= 0 && exit_due_ms < now_ms ? exit_due_ms : now_ms;
    int64_t k = (until - w->running_at_ms) / every;
    if (k - w->sim_tick > SIM_TICK_BURST)
        w->sim_tick = k - SIM_TICK_BURST;
    while (w->sim_tick < k)
        sim_log(rt, w, 'o', "tick %lld", (long long)++w->sim_tick);
}

static int64_t sim_delay_ms(const struct runtime *rt, struct workload *w, enum wl_phase p)
{
    const struct agent_conf *c = rt->conf;
    switch (p) {
    case WL_PULLING: return c->sim_pull_ms;
    case WL_MOUNTING: return c->sim_mount_ms;
    case WL_STARTING: return c->sim_start_ms;
    case WL_RUNNING: {
        if (w->spec.n_command > 0)
            return SIM_PROCESS_POLL_MS; /* the process's exit is noticed at the next check */
        int64_t run = sim_exit_after_ms(&w->spec, c->sim_exit_ms);
        int64_t every = sim_log_every_ms(&w->spec);
        int64_t now = clock_wall_ms(), left = -1;
        if (run >= 0)
            left = w->running_at_ms + run - now;
        if (every > 0) {
            /* wake at the next tick, or the exit if that comes first */
            int64_t tick = w->running_at_ms + (w->sim_tick + 1) * every - now;
            if (left < 0 || tick < left)
                left = tick;
        } else if (run < 0) {
            return -1;
        }
        return left > 0 ? left : 0;
    }
    default: return -1;
    }
}

static int sim_pull(const struct runtime *rt, struct workload *w, char *msg, size_t msglen)
{
    if (spec_image_has(&w->spec, "fail-pull")) {
        snprintf(msg, msglen, "pull: image %s not found (sim: injected fail-pull)", w->spec.image);
        return STEP_FAIL;
    }
    return STEP_OK;
}

static int sim_mount(const struct runtime *rt, struct workload *w, const struct spec_volume *v, const char *host_dir,
                     char *msg, size_t msglen)
{
    if (strstr(v->source, "fail-mount")) {
        snprintf(msg, msglen, "mount %s: connection refused (sim: injected fail-mount)", v->source);
        return STEP_FAIL;
    }
    /* mount_root stands for the network store: every sim node given the
     * same mount_root sees one directory per source, as every real node
     * sees the one NFS export. The "mount" makes it appear. */
    if (v->source[0] != '/' && state_mkdirs(host_dir) < 0) {
        snprintf(msg, msglen, "sim: cannot create %s: %s", host_dir, strerror(errno));
        return STEP_FAIL;
    }
    return STEP_OK;
}

static int sim_start_command(const struct runtime *rt, struct workload *w, char *msg, size_t msglen);
static enum rt_state sim_command_state(const struct runtime *rt, struct workload *w, struct rt_exit *ex, char *msg,
                                       size_t msglen);
/* The cluster files where a container has them, under the container
 * directory: etc/gpurent/hostfile{,.mpi} and .ssh/ (HOME's). Its ssh config
 * names the key and known_hosts by absolute path: OpenSSH expands ~ to the
 * passwd home, which a sim container's HOME is not. */
static int sim_cluster_files(const struct runtime *rt, struct workload *w, char *msg, size_t msglen)
{
    char dir[PATH_MAX], etc[PATH_MAX + 16], ssh[PATH_MAX + 8];
    if (sim_container_dir(rt, w, dir, sizeof dir) < 0 || snprintf(etc, sizeof etc, "%s/etc/gpurent", dir) < 0 ||
        snprintf(ssh, sizeof ssh, "%s/.ssh", dir) < 0) {
        snprintf(msg, msglen, "cluster files: state_dir is too long");
        return -1;
    }
    return cluster_write_files(&w->spec.cluster, etc, ssh, ssh, msg, msglen);
}

void sim_add_env(const struct workload *w, const char *dir, struct argv_buf *env)
{
    for (int i = 0; i < w->spec.n_env; i++) {
        /* The control plane names the container's path; the sim's file is
         * elsewhere. */
        if (w->spec.cluster.present && strcmp(w->spec.env[i].name, "GPURENT_HOSTFILE") == 0)
            continue;
        argv_addf(env, "%s=%s", w->spec.env[i].name, w->spec.env[i].value);
    }
    if (w->spec.cluster.present)
        argv_addf(env, "GPURENT_HOSTFILE=%s/etc/gpurent/hostfile", dir);
}

static int sim_start(const struct runtime *rt, struct workload *w, char *const host_dirs[], char *msg, size_t msglen)
{
    if (spec_image_has(&w->spec, "fail-start")) {
        snprintf(msg, msglen, "run: the container did not start (sim: injected fail-start)");
        sim_log(rt, w, 'e', "sim: %s", msg);
        return STEP_FAIL;
    }
    if (w->spec.cluster.present && sim_cluster_files(rt, w, msg, msglen) < 0) {
        sim_log(rt, w, 'e', "sim: %s", msg);
        return STEP_FAIL;
    }
    sim_log(rt, w, 'o', "sim: container started, image %s", w->spec.image);
    if (w->spec.n_command > 0)
        return sim_start_command(rt, w, msg, msglen);
    return STEP_OK;
}

static enum rt_state sim_state(const struct runtime *rt, struct workload *w, struct rt_exit *ex, char *msg,
                               size_t msglen)
{
    if (w->spec.n_command > 0)
        return sim_command_state(rt, w, ex, msg, msglen);
    int64_t run = sim_exit_after_ms(&w->spec, rt->conf->sim_exit_ms);
    int64_t due_ms = run >= 0 ? w->running_at_ms + run : -1;
    int64_t now = clock_wall_ms();
    sim_ticks(rt, w, now, due_ms);
    if (run >= 0 && now >= due_ms) {
        /* It ended in the second it was due, however late a worker (or a
         * restarted agent) gets here: that is what a real runtime's finish
         * time says too. */
        ex->at = due_ms / 1000;
        ex->has_code = 1;
        ex->code = sim_exit_code(&w->spec);
        snprintf(msg, msglen, "the container exited with status %d", ex->code);
        sim_log(rt, w, ex->code ? 'e' : 'o', "sim: container exited with status %d", ex->code);
        return RT_EXITED;
    }
    return RT_RUNNING;
}

int sim_container_dir(const struct runtime *rt, const struct workload *w, char *out, size_t outlen)
{
    char node_dir[PATH_MAX];
    if (agent_node_dir(rt->agent, w->node, node_dir, sizeof node_dir) < 0)
        return -1;
    int n = snprintf(out, outlen, "%s/containers/%s", node_dir, w->id);
    return n < 0 || (size_t)n >= outlen ? -1 : 0;
}

int runtime_shared_dir(const struct runtime *rt, const struct workload *w, char *out, size_t outlen)
{
    for (int i = 0; i < w->spec.n_volumes; i++) {
        const struct spec_volume *v = &w->spec.volumes[i];
        if (strcmp(v->target, "/shared") != 0)
            continue;
        if (rt->ops == &sim_runtime_ops && v->source[0] == '/') {
            int n = snprintf(out, outlen, "%s", v->source);
            if (n < 0 || (size_t)n >= outlen || state_mkdirs(out) < 0)
                return -1;
            return 0;
        }
        return mount_host_dir(rt->conf->mount_root, v->source, out, outlen);
    }
    return -1;
}

/* The simulated container: a directory with a `shared` link to the volume,
 * and /bin/sh run there with HOME pointing at it and GPURENT_WORKLOAD
 * telling its processes apart (the port forwarding check reads it). For
 * tests only: it isolates nothing. */
/* Makes the container directory dir and its `shared` link. */
static int sim_prepare(const struct runtime *rt, struct workload *w, char dir[PATH_MAX], char *msg, size_t msglen)
{
    char shared[PATH_MAX], link_path[PATH_MAX + 16];
    if (sim_container_dir(rt, w, dir, PATH_MAX) < 0 || state_mkdirs(dir) < 0) {
        snprintf(msg, msglen, "sim: cannot create the container directory: %s", strerror(errno));
        return STEP_FAIL;
    }
    if (runtime_shared_dir(rt, w, shared, sizeof shared) == 0) {
        snprintf(link_path, sizeof link_path, "%s/shared", dir);
        char old[PATH_MAX];
        ssize_t n = readlink(link_path, old, sizeof old - 1);
        if (n < 0 || (size_t)n != strlen(shared) || memcmp(old, shared, (size_t)n) != 0) {
            unlink(link_path);
            if (symlink(shared, link_path) < 0)
                log_warn("sim: cannot link %s to %s: %s", link_path, shared, strerror(errno));
        }
    }
    return STEP_OK;
}

static int sim_shell(const struct runtime *rt, struct workload *w, const char *command, int tty,
                     const char *const *vars, struct argv_buf *argv, struct argv_buf *env, char *cwd, size_t cwdlen,
                     char *msg, size_t msglen)
{
    char dir[PATH_MAX];
    if (sim_prepare(rt, w, dir, msg, msglen) != STEP_OK)
        return STEP_FAIL;
    argv_add(argv, "/bin/sh");
    if (command) {
        argv_add(argv, "-c");
        argv_add(argv, command);
    }
    argv_addf(env, "HOME=%s", dir);
    argv_addf(env, "GPURENT_WORKLOAD=%s", w->id);
    argv_add(env, "PATH=/usr/local/bin:/usr/bin:/bin");
    for (size_t i = 0; vars && vars[i]; i++)
        argv_add(env, vars[i]);
    sim_add_env(w, dir, env);
    snprintf(cwd, cwdlen, "%s", dir);
    if (argv->overflow || env->overflow) {
        snprintf(msg, msglen, "sim: the command line does not fit");
        return STEP_FAIL;
    }
    return STEP_OK;
}

/* The directory a commanded sim workload starts in: working_dir under
 * /shared is the volume's directory, any other under the container
 * directory, none the container directory itself. */
static int sim_cwd(const struct runtime *rt, struct workload *w, const char *dir, char *out, size_t outlen)
{
    const char *wd = w->spec.working_dir;
    char shared[PATH_MAX];
    int n;
    if ((strcmp(wd, "/shared") == 0 || strncmp(wd, "/shared/", 8) == 0) &&
        runtime_shared_dir(rt, w, shared, sizeof shared) == 0)
        n = snprintf(out, outlen, "%s%s", shared, wd + 7);
    else
        n = snprintf(out, outlen, "%s%s", dir, wd);
    if (n < 0 || (size_t)n >= outlen)
        return -1;
    return state_mkdirs(out);
}

/* A spec with a command runs it for real (sim_process.c): env is the
 * spec's (sim_add_env), then HOME (the container directory), PATH and GPURENT_WORKLOAD
 * where the spec has none. */
static int sim_start_command(const struct runtime *rt, struct workload *w, char *msg, size_t msglen)
{
    char dir[PATH_MAX], cwd[PATH_MAX];
    if (sim_prepare(rt, w, dir, msg, msglen) != STEP_OK)
        return STEP_FAIL;
    if (sim_cwd(rt, w, dir, cwd, sizeof cwd) < 0) {
        snprintf(msg, msglen, "run: cannot create the working directory %.200s", w->spec.working_dir);
        return STEP_FAIL;
    }
    struct argv_buf env = {0};
    int has_home = 0, has_path = 0, has_wl = 0;
    sim_add_env(w, dir, &env); /* the spec's, with the sim's own GPURENT_HOSTFILE */
    for (int i = 0; i < w->spec.n_env; i++) {
        has_home |= strcmp(w->spec.env[i].name, "HOME") == 0;
        has_path |= strcmp(w->spec.env[i].name, "PATH") == 0;
        has_wl |= strcmp(w->spec.env[i].name, "GPURENT_WORKLOAD") == 0;
    }
    if (!has_home)
        argv_addf(&env, "HOME=%s", dir);
    if (!has_path)
        argv_add(&env, "PATH=/usr/local/bin:/usr/bin:/bin");
    if (!has_wl)
        argv_addf(&env, "GPURENT_WORKLOAD=%s", w->id);
    if (env.overflow) {
        argv_free(&env);
        snprintf(msg, msglen, "run: the environment does not fit");
        return STEP_FAIL;
    }
    int rc = sim_process_start(rt, w, dir, cwd, env.v, msg, msglen);
    argv_free(&env);
    if (rc != STEP_OK)
        sim_log(rt, w, 'e', "sim: %s", msg);
    return rc;
}

static enum rt_state sim_command_state(const struct runtime *rt, struct workload *w, struct rt_exit *ex, char *msg,
                                       size_t msglen)
{
    char dir[PATH_MAX];
    int64_t at = 0;
    int code = 0;
    int st = sim_container_dir(rt, w, dir, sizeof dir) == 0 ? sim_process_state(dir, &at, &code) : -1;
    if (st == 0)
        return RT_RUNNING;
    if (st < 0) {
        /* Not this agent's child: it went with the agent that started it. */
        snprintf(msg, msglen, "the command's process is gone (the agent restarted); its exit status is unknown");
        return RT_EXITED;
    }
    ex->at = at;
    ex->has_code = 1;
    ex->code = code;
    snprintf(msg, msglen, "the command exited with status %d", code);
    return RT_EXITED;
}

static int sim_main_pid(const struct runtime *rt, const char *id, long *pid, char *msg, size_t msglen)
{
    *pid = 0;
    return STEP_OK;
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    if (remove(path) < 0 && errno != ENOENT)
        log_warn("sim: cannot remove %s: %s", path, strerror(errno));
    return 0;
}

/* The container directory goes with the workload; FTW_PHYS so the `shared`
 * link is removed, never followed into the volume. */
static int sim_remove(const struct runtime *rt, struct workload *w, char *msg, size_t msglen)
{
    char dir[PATH_MAX];
    if (sim_container_dir(rt, w, dir, sizeof dir) < 0)
        return STEP_OK;
    sim_process_stop(dir); /* its command's process group, if it has one */
    sim_process_kill_workload(w->id);
    if (access(dir, F_OK) == 0)
        nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return STEP_OK;
}

static int sim_unmount(const struct runtime *rt, struct workload *w, const char *host_dir, char *msg, size_t msglen)
{
    return STEP_OK;
}

const struct runtime_ops sim_runtime_ops = {
    .name = "sim",
    .delay_ms = sim_delay_ms,
    .pull = sim_pull,
    .mount = sim_mount,
    .start = sim_start,
    .state = sim_state,
    .remove = sim_remove,
    .unmount = sim_unmount,
    .shell = sim_shell,
    .main_pid = sim_main_pid,
};

struct runtime *runtime_new(struct agent *a)
{
    struct runtime *rt = calloc(1, sizeof *rt);
    if (!rt)
        return NULL;
    rt->conf = a->conf;
    rt->agent = a;
    const char *name = a->conf->runtime;
    if (strcmp(name, "sim") == 0) {
        rt->ops = &sim_runtime_ops;
    } else if (strcmp(name, "podman") == 0 || strcmp(name, "docker") == 0) {
        rt->ops = &oci_runtime_ops;
        rt->docker = strcmp(name, "docker") == 0;
        snprintf(rt->exe, sizeof rt->exe, "%s", a->conf->runtime_path[0] ? a->conf->runtime_path : name);
    } else {
        log_error("runtime '%s' is not sim, podman or docker", name);
        free(rt);
        return NULL;
    }
    return rt;
}

void runtime_free(struct runtime *rt)
{
    free(rt);
}
