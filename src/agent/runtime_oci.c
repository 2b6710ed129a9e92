/* runtime_oci.c: the real runtime: podman or docker driven by their command
 * lines. The builders are pure so unit tests can assert every word; the
 * steps run them through exec_run (no shell) and mount volumes with the
 * configured template, checking the result is a mount point before any
 * container may use it. The check of a running container reads its status,
 * exit code and finish time in one inspect, so an exit is reported at the
 * second it happened rather than when it was noticed. */
#include "agent.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "gpurent/clock.h"

void oci_container_name(const char *id, char *out, size_t outlen)
{
    snprintf(out, outlen, "gpurent-%s", id);
}

static int finish(struct argv_buf *a)
{
    return a->overflow ? -1 : 0;
}

/* The image as the runtime is given it. A short name ("rocm/pytorch:2.3",
 * "busybox") is Docker Hub's to docker, and to gpurentd, whose registry
 * allow-list reads it so (image_ref_parse). podman resolves one through
 * registries.conf instead: with no unqualified-search registries (Debian's
 * and Ubuntu's default) the pull fails, with several and no terminal it
 * refuses to choose, and a search list or alias naming another registry
 * would fetch someone else's image past the allow-list. So podman gets the
 * name docker would use: docker.io/ before a first part that is not a
 * registry host (no '.' or ':', not localhost), library/ too for a bare
 * name. */
static void image_arg(const struct oci_cmd *c, const char *image, char *out, size_t outlen)
{
    const char *slash = strchr(image, '/');
    size_t first = slash ? (size_t)(slash - image) : strlen(image);
    int has_registry = slash && (memchr(image, '.', first) || memchr(image, ':', first) ||
                                 (first == 9 && strncmp(image, "localhost", 9) == 0));
    if (c->docker || has_registry)
        snprintf(out, outlen, "%s", image);
    else
        snprintf(out, outlen, "docker.io/%s%s", slash ? "" : "library/", image);
}

int oci_argv_pull(const struct oci_cmd *c, const char *image, struct argv_buf *a)
{
    char ref[SPEC_IMAGE_MAX + 32];
    image_arg(c, image, ref, sizeof ref);
    argv_add(a, c->exe);
    argv_add(a, "pull");
    argv_add(a, ref);
    return finish(a);
}

/* "2,3" from the card list. */
static void gpu_list(const struct wl_spec *s, char *out, size_t outlen)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < s->n_gpus && used < outlen; i++) {
        int n = snprintf(out + used, outlen - used, "%s%d", i ? "," : "", s->gpus[i]);
        if (n < 0)
            break;
        used += (size_t)n;
    }
}

/* Whether the operator's run_args put the container in an IPC namespace not
 * its own (--ipc=host, none, container:NAME, ns:PATH; the last --ipc counts,
 * as the runtimes read it): its /dev/shm is then not the container's to
 * size, and podman refuses to start a container given --shm-size beside it
 * ("cannot set shmsize when running in the host IPC Namespace"). */
static int run_args_set_ipc(const char *run_args)
{
    struct argv_buf a = {0};
    const char *mode = NULL;
    if (run_args && run_args[0] && argv_from_template(&a, run_args, NULL, NULL) == 0) {
        for (int i = 0; i < a.n; i++) {
            if (strncmp(a.v[i], "--ipc=", 6) == 0)
                mode = a.v[i] + 6;
            else if (strcmp(a.v[i], "--ipc") == 0 && i + 1 < a.n)
                mode = a.v[++i];
        }
    }
    int shared = mode && strcmp(mode, "private") != 0 && strcmp(mode, "shareable") != 0;
    argv_free(&a);
    return shared;
}

void oci_argv_cluster(const struct oci_cmd *c, const struct wl_spec *s, struct argv_buf *a)
{
    if (cluster_multi_node(s)) {
        /* Ranks reach each other on any port (NCCL/RCCL, torchrun's store,
         * sshd), and RDMA verbs need the host's interfaces and devices and
         * pinned memory. */
        argv_add(a, "--network");
        argv_add(a, "host");
        for (int i = 0; c->host && i < c->host->n_rdma; i++) {
            argv_add(a, "--device");
            argv_add(a, c->host->rdma[i]);
        }
        argv_add(a, "--cap-add");
        argv_add(a, "IPC_LOCK");
        argv_add(a, "--ulimit");
        argv_add(a, "memlock=-1:-1");
        /* The hostfile names resolve in /etc/hosts; --add-host takes only an
         * IP, so a rank known by host name is left to DNS (ssh's config
         * names its HostName anyway). */
        for (int i = 0; i < s->cluster.n_hosts; i++) {
            if (!cluster_address_is_ip(s->cluster.hosts[i].address))
                continue;
            argv_add(a, "--add-host");
            argv_addf(a, "%s:%s", s->cluster.hosts[i].name, s->cluster.hosts[i].address);
        }
    }
    /* Z: on an SELinux host the files keep the state directory's label,
     * which a container may not read (its ssh finds no config or key, the
     * launchers no hostfile) until the runtime relabels them for it; they
     * are this container's alone. Without SELinux the runtimes ignore it. */
    if (s->cluster.present && c->host && c->host->cluster_dir) {
        argv_add(a, "--volume");
        argv_addf(a, "%s/hostfile:/etc/gpurent/hostfile:ro,Z", c->host->cluster_dir);
        argv_add(a, "--volume");
        argv_addf(a, "%s/hostfile.mpi:/etc/gpurent/hostfile.mpi:ro,Z", c->host->cluster_dir);
        argv_add(a, "--volume");
        argv_addf(a, "%s/ssh:/root/.ssh:ro,Z", c->host->cluster_dir);
    }
}

int oci_argv_run(const struct oci_cmd *c, const char *id, const struct wl_spec *s, char *const host_dirs[],
                 struct argv_buf *a)
{
    char name[AGENT_NAME_MAX + 16], gpus[SPEC_MAX_GPUS * 4];
    oci_container_name(id, name, sizeof name);
    gpu_list(s, gpus, sizeof gpus);

    argv_add(a, c->exe);
    argv_add(a, "run");
    argv_add(a, "--detach");
    argv_add(a, "--name");
    argv_add(a, name);
    argv_add(a, "--label");
    argv_addf(a, "gpurent.workload=%s", id);
    /* The image was pulled in its own phase; never pull again here. */
    argv_add(a, "--pull");
    argv_add(a, "never");
    /* Its share of the host, so that one renter's runaway (memory, a fork
     * bomb, every core) does not take the node from the others on it. */
    if (c->host && c->host->millicpus > 0) {
        argv_add(a, "--cpus");
        argv_addf(a, "%lld.%03lld", (long long)(c->host->millicpus / 1000), (long long)(c->host->millicpus % 1000));
    }
    if (c->host && c->host->memory_mb > 0) {
        argv_add(a, "--memory");
        argv_addf(a, "%lldm", (long long)c->host->memory_mb);
    }
    if (c->host && c->host->pids_limit > 0) {
        argv_add(a, "--pids-limit");
        argv_addf(a, "%lld", (long long)c->host->pids_limit);
    }
    /* A log file of bounded size: a workload printing without end would
     * otherwise fill the node's disk. podman takes json-file as its
     * k8s-file driver; both truncate at max-size (podman's default,
     * journald, ignores it). */
    if (c->host && c->host->log_max_mb > 0) {
        argv_add(a, "--log-driver");
        argv_add(a, "json-file");
        argv_add(a, "--log-opt");
        argv_addf(a, "max-size=%lldm", (long long)c->host->log_max_mb);
    }
    if (s->n_gpus > 0) {
        if (strcmp(s->stack, "CUDA") == 0) {
            if (c->docker) {
                /* docker splits --gpus on commas unless the value is quoted,
                 * so the quotes are part of the word. */
                argv_add(a, "--gpus");
                argv_addf(a, "\"device=%s\"", gpus);
            } else {
                /* podman uses CDI names generated by nvidia-ctk. */
                for (int i = 0; i < s->n_gpus; i++) {
                    argv_add(a, "--device");
                    argv_addf(a, "nvidia.com/gpu=%d", s->gpus[i]);
                }
            }
        } else {
            /* ROCm: the compute interface and the render node of each of
             * its cards, no other (fabric_render_nodes). ROCr inside sees
             * these cards alone, numbered from 0, so no
             * ROCR_VISIBLE_DEVICES: host indices would pick the wrong ones. */
            if (!c->host || !c->host->render_nodes)
                return -1;
            argv_add(a, "--device");
            argv_add(a, "/dev/kfd");
            for (int i = 0; i < s->n_gpus; i++) {
                argv_add(a, "--device");
                argv_add(a, c->host->render_nodes[i]);
            }
            /* The device nodes belong to these groups; a container user
             * other than root opens them only as a member. By number: the
             * image's /etc/group need not have them, or not the host's ids. */
            if (c->host && c->host->video_gid >= 0) {
                argv_add(a, "--group-add");
                argv_addf(a, "%ld", c->host->video_gid);
            }
            if (c->host && c->host->render_gid >= 0 && c->host->render_gid != c->host->video_gid) {
                argv_add(a, "--group-add");
                argv_addf(a, "%ld", c->host->render_gid);
            }
        }
    }
    /* NVIDIA's images set NVIDIA_VISIBLE_DEVICES=all, which the toolkit's
     * legacy hook (installed for podman with the full toolkit) and the
     * nvidia runtime (docker's default on many GPU hosts) obey by handing
     * the container every card of the host, its neighbours' too. "void"
     * makes them do nothing: podman's cards come by CDI, docker's by
     * --gpus, which sets the variable to its own cards. */
    if (strcmp(s->stack, "CUDA") == 0 && !(c->docker && s->n_gpus > 0)) {
        argv_add(a, "--env");
        argv_add(a, "NVIDIA_VISIBLE_DEVICES=void");
    }
    /* NCCL and RCCL move data between a node's cards through /dev/shm, and
     * PyTorch's DataLoader workers hand batches over in it: the runtimes'
     * 64 MB default fails an 8-card job at its first collective. Pages
     * used there count against the container's --memory like any other. */
    if ((s->n_gpus > 0 || cluster_multi_node(s)) && !run_args_set_ipc(c->run_args)) {
        argv_add(a, "--shm-size");
        argv_add(a, c->host && c->host->shm_size ? c->host->shm_size : "64g");
    }
    for (int i = 0; i < s->n_volumes; i++) {
        argv_add(a, "--volume");
        argv_addf(a, "%s:%s", host_dirs[i], s->volumes[i].target);
    }
    /* With an env file no value is a word of the command line, which is
     * logged and which every user of the host can read in /proc. */
    if (c->env_file && s->n_env > 0) {
        argv_add(a, "--env-file");
        argv_add(a, c->env_file);
    }
    for (int i = 0; i < s->n_env; i++) {
        if (c->env_file && !strpbrk(s->env[i].value, "\r\n"))
            continue;
        argv_add(a, "--env");
        argv_addf(a, "%s=%s", s->env[i].name, s->env[i].value);
    }
    if (s->working_dir[0]) {
        argv_add(a, "--workdir");
        argv_add(a, s->working_dir);
    }
    /* Published ports: the runtime's own port forwarding, TCP only; with
     * host networking (multi-node) the container's ports are the host's. */
    for (int i = 0; i < s->n_ports && !cluster_multi_node(s); i++) {
        argv_add(a, "-p");
        argv_addf(a, "%d:%d/tcp", s->ports[i].host, s->ports[i].container);
    }
    oci_argv_cluster(c, s, a);
    if (c->run_args && c->run_args[0] && argv_from_template(a, c->run_args, NULL, NULL) < 0)
        return -1;
    char ref[SPEC_IMAGE_MAX + 32];
    image_arg(c, s->image, ref, sizeof ref);
    argv_add(a, ref);
    /* The command replaces the image's CMD; its ENTRYPOINT stays. */
    for (int i = 0; i < s->n_command; i++)
        argv_add(a, s->command[i]);
    return finish(a);
}

char *oci_env_file_text(const struct wl_spec *s)
{
    size_t cap = 1, len = 0;
    for (int i = 0; i < s->n_env; i++)
        cap += strlen(s->env[i].name) + strlen(s->env[i].value) + 2;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    for (int i = 0; i < s->n_env; i++) {
        if (strpbrk(s->env[i].value, "\r\n"))
            continue;
        len += (size_t)snprintf(out + len, cap - len, "%s=%s\n", s->env[i].name, s->env[i].value);
    }
    out[len] = '\0';
    return out;
}

/* Where w's env file is written: run/ID.env under its node's directory.
 * 0, or -1 when the path does not fit. */
static int env_file_path(const struct runtime *rt, const struct workload *w, char *path, size_t pathlen)
{
    char dir[PATH_MAX];
    if (agent_node_dir(rt->agent, w->node, dir, sizeof dir) < 0)
        return -1;
    int n = snprintf(path, pathlen, "%s/run/%s.env", dir, w->id);
    return n < 0 || (size_t)n >= pathlen ? -1 : 0;
}

/* Removes an env file a run left behind: one the agent died in the middle
 * of (between writing it and run returning) stays on disk with the
 * workload's secrets, and neither a restart that finds the container
 * running nor the removal would write or unlink it again. */
static void env_file_forget(const struct runtime *rt, const struct workload *w)
{
    char path[PATH_MAX];
    if (env_file_path(rt, w, path, sizeof path) == 0 && unlink(path) < 0 && errno != ENOENT)
        log_warn("workload %s: cannot remove its env file: %s", w->id, strerror(errno));
}

/* Writes the env file of w under its node's directory (run/ID.env, 0600,
 * the directory 0700) into path. 0 or -1 with msg. */
static int env_file_write(const struct runtime *rt, struct workload *w, char *path, size_t pathlen, char *msg,
                          size_t msglen)
{
    char dir[PATH_MAX];
    if (agent_node_dir(rt->agent, w->node, dir, sizeof dir) < 0 || env_file_path(rt, w, path, pathlen) < 0) {
        snprintf(msg, msglen, "run: the env file path is too long");
        return -1;
    }
    char *text = oci_env_file_text(&w->spec);
    char rundir[PATH_MAX + 8];
    snprintf(rundir, sizeof rundir, "%s/run", dir);
    if (!text || state_mkdirs(rundir) < 0 || state_write_atomic(rundir, strrchr(path, '/') + 1, text, strlen(text),
                                                                 0600) < 0) {
        snprintf(msg, msglen, "run: cannot write the env file: %s", strerror(errno));
        free(text);
        return -1;
    }
    free(text);
    return 0;
}

int oci_argv_inspect(const struct oci_cmd *c, const char *id, struct argv_buf *a)
{
    char name[AGENT_NAME_MAX + 16];
    oci_container_name(id, name, sizeof name);
    argv_add(a, c->exe);
    argv_add(a, "container");
    argv_add(a, "inspect");
    argv_add(a, "--format");
    /* The finish time last: it has spaces in podman's spelling. */
    argv_add(a, "{{.State.Status}} {{.State.ExitCode}} {{.State.FinishedAt}}");
    argv_add(a, name);
    return finish(a);
}

int oci_argv_logs(const struct oci_cmd *c, const char *id, int64_t since_s, struct argv_buf *a)
{
    char name[AGENT_NAME_MAX + 16];
    oci_container_name(id, name, sizeof name);
    argv_add(a, c->exe);
    argv_add(a, "logs");
    argv_add(a, "--timestamps");
    argv_add(a, "--since");
    argv_addf(a, "%lld", (long long)since_s);
    argv_add(a, name);
    return finish(a);
}

int oci_argv_stop(const struct oci_cmd *c, const char *id, struct argv_buf *a)
{
    char name[AGENT_NAME_MAX + 16];
    oci_container_name(id, name, sizeof name);
    argv_add(a, c->exe);
    argv_add(a, "stop");
    argv_add(a, "-t");
    argv_addf(a, "%lld", (long long)c->stop_timeout_s);
    argv_add(a, name);
    return finish(a);
}

int oci_argv_rm(const struct oci_cmd *c, const char *id, struct argv_buf *a)
{
    char name[AGENT_NAME_MAX + 16];
    oci_container_name(id, name, sizeof name);
    argv_add(a, c->exe);
    argv_add(a, "rm");
    argv_add(a, "--force");
    argv_add(a, name);
    return finish(a);
}

int oci_argv_exec(const struct oci_cmd *c, const char *id, const char *command, int tty, const char *const *vars,
                  struct argv_buf *a)
{
    char name[AGENT_NAME_MAX + 16];
    oci_container_name(id, name, sizeof name);
    argv_add(a, c->exe);
    argv_add(a, "exec");
    argv_add(a, "-i");
    if (tty)
        argv_add(a, "-t");
    for (size_t i = 0; vars && vars[i]; i++) {
        argv_add(a, "-e");
        argv_add(a, vars[i]);
    }
    argv_add(a, name);
    argv_add(a, "/bin/sh");
    if (command) {
        argv_add(a, "-c");
        argv_add(a, command);
    }
    return finish(a);
}

int oci_argv_inspect_pid(const struct oci_cmd *c, const char *id, struct argv_buf *a)
{
    char name[AGENT_NAME_MAX + 16];
    oci_container_name(id, name, sizeof name);
    argv_add(a, c->exe);
    argv_add(a, "container");
    argv_add(a, "inspect");
    argv_add(a, "--format");
    argv_add(a, "{{.State.Pid}}");
    argv_add(a, name);
    return finish(a);
}

/* Reads exactly n digits at *p into *out and moves past them; -1 if not. */
static int digits(const char **p, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        char c = (*p)[i];
        if (c < '0' || c > '9')
            return -1;
        v = v * 10 + (c - '0');
    }
    *p += n;
    *out = v;
    return 0;
}

static int days_in_month(int year, int month)
{
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    return days[month - 1] + (month == 2 && leap);
}

int oci_parse_time(const char *text, int64_t *out)
{
    const char *p = text;
    int y, mo, d, h, mi, sec, oh = 0, om = 0, sign = 0;
    while (*p == ' ')
        p++;
    if (digits(&p, 4, &y) < 0 || *p++ != '-' || digits(&p, 2, &mo) < 0 || *p++ != '-' || digits(&p, 2, &d) < 0)
        return -1;
    if (*p != 'T' && *p != 't' && *p != ' ')
        return -1;
    p++;
    if (digits(&p, 2, &h) < 0 || *p++ != ':' || digits(&p, 2, &mi) < 0 || *p++ != ':' || digits(&p, 2, &sec) < 0)
        return -1;
    /* The fraction is dropped: the second is what the protocol reports. */
    if (*p == '.' || *p == ',') {
        p++;
        if (*p < '0' || *p > '9')
            return -1;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    /* RFC 3339 puts the zone right after the time, Go's format a space
     * before it and its offset without a colon. */
    if (*p == ' ')
        p++;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        sign = *p++ == '-' ? -1 : 1;
        if (digits(&p, 2, &oh) < 0)
            return -1;
        if (*p == ':')
            p++;
        if (digits(&p, 2, &om) < 0)
            return -1;
    } else {
        return -1; /* no zone: local to a machine we cannot name */
    }
    /* After the offset Go names the zone (" CEST"), which the offset already
     * settles; anything glued to the offset is not a time. */
    if (*p && *p != ' ' && *p != '\n' && *p != '\r')
        return -1;
    if (mo < 1 || mo > 12 || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || sec > 60 || oh > 23 ||
        om > 59)
        return -1;
    struct tm tm = {.tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h, .tm_min = mi,
                    .tm_sec = sec};
    /* timegm reads a leap second's :60 as the next minute's :00. */
    int64_t t = (int64_t)timegm(&tm);
    *out = t - sign * (oh * 3600 + om * 60);
    return 0;
}

/* Statuses of a container that was made but never ran: no exit status. */
static int never_ran(const char *status)
{
    return strcmp(status, "created") == 0 || strcmp(status, "configured") == 0 ||
           strcmp(status, "initialized") == 0;
}

enum rt_state oci_parse_state(const char *output, struct rt_exit *ex)
{
    memset(ex, 0, sizeof *ex);
    /* The answer is the last non-empty line; warnings may come before it. */
    const char *end = output + strlen(output);
    while (end > output && (end[-1] == '\n' || end[-1] == '\r' || end[-1] == ' '))
        end--;
    const char *start = end;
    while (start > output && start[-1] != '\n')
        start--;
    char status[32];
    int ec = 0, used = 0;
    char line[256];
    snprintf(line, sizeof line, "%.*s", (int)(end - start), start);
    int n = sscanf(line, "%31s %d %n", status, &ec, &used);
    if (n < 1)
        return RT_UNKNOWN;
    if (strcmp(status, "running") == 0 || strcmp(status, "paused") == 0 || strcmp(status, "restarting") == 0)
        return RT_RUNNING;
    if (!(strcmp(status, "exited") == 0 || strcmp(status, "stopped") == 0 || strcmp(status, "dead") == 0 ||
          never_ran(status) || strcmp(status, "removing") == 0))
        return RT_UNKNOWN;
    if (n == 2 && !never_ran(status)) {
        ex->has_code = 1;
        ex->code = ec;
    }
    /* A finish time that does not parse, or the zero time of a container
     * that never finished (year 1), is left unknown: the driver then uses
     * the time it noticed the exit, the latest the end can have been. */
    int64_t at;
    if (n == 2 && used > 0 && oci_parse_time(line + used, &at) == 0 && at > 0)
        ex->at = at;
    return RT_EXITED;
}

/* ------------------------------------------------------------------ steps */

static struct oci_cmd cmd_of(const struct runtime *rt)
{
    struct oci_cmd c = {.exe = rt->exe, .docker = rt->docker, .stop_timeout_s = rt->conf->stop_timeout_s,
                        .run_args = rt->conf->run_args};
    return c;
}

/* Runs a built command; on failure writes "what: why" into msg. */
static int run_cmd(const struct runtime *rt, struct workload *w, struct argv_buf *a, int timeout_s, const char *what,
                   struct exec_result *r, char *msg, size_t msglen)
{
    if (a->overflow) {
        snprintf(msg, msglen, "%s: command line too long", what);
        argv_free(a);
        return STEP_FAIL;
    }
    char line[1024];
    argv_join(a, line, sizeof line);
    log_debug("workload %s: running %s", w->id, line);
    struct exec_opts o = {
        .deadline_ms = clock_mono_ms() + (int64_t)timeout_s * 1000, .cancel = &w->cancel, .stop = &rt->agent->stopping};
    int rc = exec_run(a->v, &o, r);
    argv_free(a);
    if (rc == 0)
        return STEP_OK;
    if (r->interrupted)
        return STEP_INTERRUPTED;
    char why[512];
    exec_describe(r, why, sizeof why);
    snprintf(msg, msglen, "%s: %s", what, why);
    return STEP_FAIL;
}

int oci_parse_log_line(const char *line, size_t n, int64_t *t_ms, size_t *text_at)
{
    /* --timestamps puts RFC 3339 with nanoseconds and one space first. */
    const char *sp = memchr(line, ' ', n);
    char when[64];
    if (!sp || (size_t)(sp - line) >= sizeof when)
        return -1;
    memcpy(when, line, (size_t)(sp - line));
    when[sp - line] = 0;
    int64_t s;
    if (oci_parse_time(when, &s) < 0)
        return -1;
    int64_t ms = 0;
    const char *f = strchr(when, '.');
    if (f)
        for (int i = 1; i <= 3; i++)
            ms = ms * 10 + (f[i] >= '0' && f[i] <= '9' ? f[i] - '0' : 0);
    *t_ms = s * 1000 + ms;
    *text_at = (size_t)(sp - line) + 1;
    return 0;
}

/* Most output one poll of `logs` may bring per stream; a container printing
 * more than this between two checks loses the excess of that interval
 * (see logs_move_on). */
#define OCI_LOG_POLL_MAX (1024 * 1024)

/* Appends the complete lines of one stream's output that are newer than its
 * mark (the tool's --since has whole seconds, so lines already taken, up to
 * mark->ms and mark->same lines dated exactly then, come again). */
static void append_new_lines(const char *dir, const struct runtime *rt, struct workload *w, char stream,
                             const struct exec_capture *got, struct oci_log_mark *mark)
{
    int64_t same = 0;
    for (size_t i = 0; i < got->len;) {
        const char *line = got->buf + i;
        const char *nl = memchr(line, '\n', got->len - i);
        if (!nl)
            break; /* cut short: the next poll reads it whole */
        size_t n = (size_t)(nl - line), text_at;
        i += n + 1;
        int64_t t;
        if (oci_parse_log_line(line, n, &t, &text_at) < 0 || t < mark->ms)
            continue;
        if (t == mark->ms && ++same <= mark->same)
            continue;
        wl_log_append(dir, w->id, rt->conf->log_max_bytes, t, stream, line + text_at, n - text_at);
        if (t != mark->ms) {
            mark->ms = t;
            mark->same = 0;
            same = 1;
        }
        mark->same++;
    }
}

/* Moves a stream's mark up to at least ms (none of its lines before ms is
 * still to be collected). */
static void mark_at_least(struct oci_log_mark *mark, int64_t ms)
{
    if (mark->ms < ms) {
        mark->ms = ms;
        mark->same = 0;
    }
}

/* Where the next poll starts: the two streams are read from the older
 * mark, so each poll must move both on, or the log stops for good (every
 * poll reading the same first OCI_LOG_POLL_MAX again).
 *   A poll read whole: every line dated before it began was collected, so
 *   a stream that printed nothing since (its mark left behind) moves up to
 *   a second before then.
 *   A poll cut short: the other stream is taken to be read as far as the
 *   full one got (the tool writes both in time order), and if the full one
 *   got no further than the second asked from, that second alone holds
 *   more than a poll keeps (--since has whole seconds): the rest of it is
 *   given up and both move to the next. */
static void logs_move_on(const struct exec_result *r, const struct exec_capture *got, struct oci_log_mark *marks,
                         int64_t since_s, int64_t polled_ms)
{
    if (!r->overflowed) {
        for (int i = 0; i < 2; i++)
            mark_at_least(&marks[i], polled_ms - 1000);
        return;
    }
    int64_t reached = 0;
    for (int i = 0; i < 2; i++)
        if (got[i].full && marks[i].ms > reached)
            reached = marks[i].ms;
    int64_t floor_ms = reached / 1000 <= since_s ? (since_s + 1) * 1000 : reached / 1000 * 1000;
    for (int i = 0; i < 2; i++)
        mark_at_least(&marks[i], floor_ms);
}

/* Appends what the container printed on stdout and stderr since the last
 * poll to its log: `logs` replays each stream of the container on its own. */
static void collect_logs(const struct runtime *rt, struct workload *w)
{
    char dir[PATH_MAX], msg[256];
    if (agent_node_dir(rt->agent, w->node, dir, sizeof dir) < 0)
        return;
    struct oci_cmd c = cmd_of(rt);
    struct argv_buf a = {0};
    struct exec_result r;
    int64_t since_ms = w->running_at_ms;
    if (w->oci_log[0].ms || w->oci_log[1].ms) {
        int64_t o = w->oci_log[0].ms, e = w->oci_log[1].ms;
        since_ms = !o ? e : !e ? o : o < e ? o : e;
    }
    int64_t since_s = since_ms > 0 ? since_ms / 1000 : 0;
    oci_argv_logs(&c, w->id, since_s, &a);
    struct exec_capture out = {.buf = malloc(OCI_LOG_POLL_MAX), .cap = OCI_LOG_POLL_MAX};
    struct exec_capture err = {.buf = malloc(OCI_LOG_POLL_MAX), .cap = OCI_LOG_POLL_MAX};
    if (!out.buf || !err.buf || a.overflow) {
        argv_free(&a);
        free(out.buf);
        free(err.buf);
        return;
    }
    struct exec_opts o = {.deadline_ms = clock_mono_ms() + rt->conf->command_timeout_s * 1000,
                          .cancel = &w->cancel, .stop = &rt->agent->stopping, .out = &out, .err = &err};
    int64_t polled_ms = clock_wall_ms();
    int rc = exec_run(a.v, &o, &r);
    argv_free(&a);
    if (rc != 0 && !r.overflowed) {
        exec_describe(&r, msg, sizeof msg);
        log_debug("workload %s: logs: %s", w->id, msg);
    }
    append_new_lines(dir, rt, w, 'o', &out, &w->oci_log[0]);
    append_new_lines(dir, rt, w, 'e', &err, &w->oci_log[1]);
    if (rc == 0 || r.overflowed) {
        struct exec_capture got[2] = {out, err};
        logs_move_on(&r, got, w->oci_log, since_s, polled_ms);
    }
    free(out.buf);
    free(err.buf);
}

static int no_such_container(const char *output)
{
    /* podman: "no such container"; docker: "No such container" / "No such object". */
    return strcasestr(output, "no such container") || strcasestr(output, "no such object");
}

static int64_t oci_delay_ms(const struct runtime *rt, struct workload *w, enum wl_phase p)
{
    return p == WL_RUNNING ? rt->conf->check_interval_s * 1000 : 0;
}

static int oci_pull(const struct runtime *rt, struct workload *w, char *msg, size_t msglen)
{
    struct oci_cmd c = cmd_of(rt);
    struct argv_buf a = {0};
    struct exec_result r;
    oci_argv_pull(&c, w->spec.image, &a);
    return run_cmd(rt, w, &a, (int)rt->conf->pull_timeout_s, "pull", &r, msg, msglen);
}

static int oci_mount(const struct runtime *rt, struct workload *w, const struct spec_volume *v, const char *host_dir,
                     char *msg, size_t msglen)
{
    const char *mi = rt->conf->mountinfo_file;
    int is = mount_is_mount_point(mi, host_dir);
    if (is < 0) {
        snprintf(msg, msglen, "mount %s: cannot read %s", v->source, mi);
        return STEP_FAIL;
    }
    if (is == 1)
        return STEP_OK; /* already mounted: another workload uses the same source, or the agent restarted */
    if (state_mkdirs(host_dir) < 0) {
        snprintf(msg, msglen, "mount %s: cannot create %s: %s", v->source, host_dir, strerror(errno));
        return STEP_FAIL;
    }
    struct argv_buf a = {0};
    struct exec_result r;
    if (mount_argv(&a, rt->conf->mount_command, v, host_dir, msg, msglen) < 0) {
        argv_free(&a);
        return STEP_FAIL;
    }
    char what[SPEC_SOURCE_MAX + 16];
    snprintf(what, sizeof what, "mount %s", v->source);
    int rc = run_cmd(rt, w, &a, (int)rt->conf->command_timeout_s, what, &r, msg, msglen);
    if (rc != STEP_OK)
        return rc;
    /* A mount command can exit 0 without mounting (a wrapper, an fstab
     * "noauto" slip); a container must never write to the bare directory. */
    if (mount_is_mount_point(mi, host_dir) != 1) {
        snprintf(msg, msglen, "mount %s: the command succeeded but %s is not a mount point", v->source, host_dir);
        return STEP_FAIL;
    }
    return STEP_OK;
}

static enum rt_state oci_state(const struct runtime *rt, struct workload *w, struct rt_exit *ex, char *msg,
                               size_t msglen)
{
    struct oci_cmd c = cmd_of(rt);
    struct argv_buf a = {0};
    struct exec_result r;
    memset(ex, 0, sizeof *ex);
    oci_argv_inspect(&c, w->id, &a);
    int rc = run_cmd(rt, w, &a, (int)rt->conf->command_timeout_s, "inspect", &r, msg, msglen);
    if (rc == STEP_INTERRUPTED)
        return RT_UNKNOWN;
    if (rc != STEP_OK)
        return r.started && r.exited && no_such_container(r.output) ? RT_ABSENT : RT_UNKNOWN;
    enum rt_state st = oci_parse_state(r.output, ex);
    /* After the inspect: an exited container's last lines are in the log
     * before its phase says exited. */
    if (st == RT_RUNNING || st == RT_EXITED)
        collect_logs(rt, w);
    if (st == RT_EXITED && ex->has_code)
        snprintf(msg, msglen, "the container exited with status %d", ex->code);
    else if (st == RT_EXITED)
        snprintf(msg, msglen, "the container exited with an unknown status");
    else if (st == RT_UNKNOWN)
        snprintf(msg, msglen, "inspect: unexpected output '%.100s'", r.output);
    return st;
}

static int oci_remove_container(const struct runtime *rt, struct workload *w, char *msg, size_t msglen)
{
    struct oci_cmd c = cmd_of(rt);
    struct argv_buf a = {0};
    struct exec_result r;
    oci_argv_stop(&c, w->id, &a);
    int rc = run_cmd(rt, w, &a, (int)(rt->conf->command_timeout_s + rt->conf->stop_timeout_s), "stop", &r, msg,
                     msglen);
    if (rc == STEP_INTERRUPTED)
        return rc;
    /* A failed stop is not final: rm --force kills what is left. */
    oci_argv_rm(&c, w->id, &a);
    rc = run_cmd(rt, w, &a, (int)rt->conf->command_timeout_s, "rm", &r, msg, msglen);
    if (rc == STEP_FAIL && r.exited && no_such_container(r.output))
        rc = STEP_OK;
    return rc;
}

int oci_cluster_dir(const struct runtime *rt, const struct workload *w, char *out, size_t outlen)
{
    char node_dir[PATH_MAX];
    if (agent_node_dir(rt->agent, w->node, node_dir, sizeof node_dir) < 0)
        return -1;
    int n = snprintf(out, outlen, "%s/cluster/%s", node_dir, w->id);
    return n < 0 || (size_t)n >= outlen ? -1 : 0;
}

/* A container's limits: its cards' share of the host's CPUs and memory
 * (or what the configuration gives per card), and the process cap. A
 * workload without cards counts as one. */
static void oci_limits(const struct runtime *rt, const struct wl_spec *s, struct oci_host *host)
{
    const struct agent_conf *conf = rt->conf;
    int64_t cards = s->n_gpus > 0 ? s->n_gpus : 1;
    pthread_mutex_lock(&rt->agent->inv.lock);
    int64_t node_cards = (int64_t)rt->agent->inv.facts.n_cards;
    pthread_mutex_unlock(&rt->agent->inv.lock);
    if (node_cards < cards)
        node_cards = cards;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN), pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    host->millicpus = conf->container_millicpus_per_card > 0 ? conf->container_millicpus_per_card * cards
                      : cpus > 0                            ? (int64_t)cpus * 1000 * cards / node_cards
                                                            : 0;
    host->memory_mb = conf->container_memory_mb_per_card > 0 ? conf->container_memory_mb_per_card * cards
                      : pages > 0 && page > 0 ? (int64_t)((__int128)pages * page / (1024 * 1024) * cards / node_cards)
                                              : 0;
    /* No container can use more than the host's CPUs, and docker refuses
     * to start one asked for more ("Range of CPUs is from 0.01 to N.00"):
     * a per-card setting times 8 cards can pass a small host. */
    if (cpus > 0 && host->millicpus > (int64_t)cpus * 1000)
        host->millicpus = (int64_t)cpus * 1000;
    host->pids_limit = conf->container_pids_limit;
    host->log_max_mb = conf->container_log_max_mb;
}

/* What w's run line needs of this host: its limits, its cluster files
 * written (before every start, so a restarted container sees them whole),
 * RDMA devices for a multi-node workload, and for ROCm its cards' render
 * nodes and the video and render gids. */
static int oci_host_for(const struct runtime *rt, const struct workload *w, struct oci_host *host, char *dir,
                        size_t dirlen, char *msg, size_t msglen)
{
    const struct wl_spec *s = &w->spec;
    oci_limits(rt, s, host);
    if (s->cluster.present) {
        char ssh_dir[PATH_MAX + 8];
        if (oci_cluster_dir(rt, w, dir, dirlen) < 0 || snprintf(ssh_dir, sizeof ssh_dir, "%s/ssh", dir) < 0) {
            snprintf(msg, msglen, "cluster files: state_dir is too long");
            return -1;
        }
        if (cluster_write_files(&s->cluster, dir, ssh_dir, "~/.ssh", msg, msglen) < 0)
            return -1;
        host->cluster_dir = dir;
    }
    if (cluster_multi_node(s) && fabric_rdma_devices(rt->conf->rdma_device_dir, &host->rdma, &host->n_rdma) < 0)
        log_warn("workload %s: cannot list %s: %s; no RDMA devices given", w->id, rt->conf->rdma_device_dir,
                 strerror(errno));
    if (s->n_gpus > 0 && strcmp(s->stack, "CUDA") != 0) {
        if (fabric_render_nodes(rt->conf->kfd_topology_dir, s->gpus, s->n_gpus, host->render_nodes, msg, msglen) < 0)
            return -1;
        const char *gf = rt->conf->group_file;
        if (fabric_group_gid(gf, "video", &host->video_gid) < 0 ||
            fabric_group_gid(gf, "render", &host->render_gid) < 0)
            log_warn("workload %s: cannot read the groups%s%s: %s", w->id, gf[0] ? " in " : "", gf, strerror(errno));
    }
    return 0;
}

static int oci_start(const struct runtime *rt, struct workload *w, char *const host_dirs[], char *msg, size_t msglen)
{
    char why[256];
    struct rt_exit ex;
    /* After a crash between run and the phase update, the container may
     * already run: keep it. A leftover that does not run is replaced. */
    enum rt_state st = oci_state(rt, w, &ex, why, sizeof why);
    if (st == RT_RUNNING) {
        env_file_forget(rt, w);
        return STEP_OK;
    }
    if (st != RT_ABSENT) {
        int rc = oci_remove_container(rt, w, msg, msglen);
        if (rc != STEP_OK)
            return rc;
    }
    struct oci_cmd c = cmd_of(rt);
    char render_nodes[SPEC_MAX_GPUS][FABRIC_RENDER_NODE_MAX];
    struct oci_host host = {.video_gid = -1, .render_gid = -1, .shm_size = rt->conf->shm_size,
                            .render_nodes = render_nodes};
    char cluster_dir[PATH_MAX];
    if (oci_host_for(rt, w, &host, cluster_dir, sizeof cluster_dir, msg, msglen) < 0) {
        fabric_free_devices(host.rdma, host.n_rdma);
        return STEP_FAIL;
    }
    c.host = &host;
    struct argv_buf a = {0};
    struct exec_result r;
    char env_file[PATH_MAX];
    if (w->spec.n_env > 0) {
        if (env_file_write(rt, w, env_file, sizeof env_file, msg, msglen) < 0) {
            fabric_free_devices(host.rdma, host.n_rdma);
            return STEP_FAIL;
        }
        c.env_file = env_file;
    }
    int built = oci_argv_run(&c, w->id, &w->spec, host_dirs, &a);
    fabric_free_devices(host.rdma, host.n_rdma);
    if (built < 0) {
        argv_free(&a);
        if (c.env_file)
            unlink(env_file);
        snprintf(msg, msglen, "run: command line too long");
        return STEP_FAIL;
    }
    int rc = run_cmd(rt, w, &a, (int)rt->conf->command_timeout_s, "run", &r, msg, msglen);
    /* The runtime has read it once run returns: the container keeps its
     * own copy of the environment, and no file of secrets stays behind. */
    if (c.env_file && unlink(env_file) < 0 && errno != ENOENT)
        log_warn("workload %s: cannot remove its env file: %s", w->id, strerror(errno));
    return rc;
}

static int oci_remove(const struct runtime *rt, struct workload *w, char *msg, size_t msglen)
{
    char why[256], dir[PATH_MAX];
    struct rt_exit ex;
    enum rt_state st = oci_state(rt, w, &ex, why, sizeof why);
    int rc = st == RT_ABSENT ? STEP_OK : oci_remove_container(rt, w, msg, msglen);
    /* The cluster files (its private key among them) go with the container,
     * and so does an env file a run was cut short in. */
    if (rc == STEP_OK && w->spec.cluster.present && oci_cluster_dir(rt, w, dir, sizeof dir) == 0)
        cluster_remove_dir(dir);
    if (rc == STEP_OK)
        env_file_forget(rt, w);
    return rc;
}

static int oci_unmount(const struct runtime *rt, struct workload *w, const char *host_dir, char *msg, size_t msglen)
{
    const char *mi = rt->conf->mountinfo_file;
    if (mount_is_mount_point(mi, host_dir) == 1) {
        struct argv_buf a = {0};
        struct exec_result r;
        if (argv_from_template(&a, rt->conf->umount_command, NULL, host_dir) < 0) {
            argv_free(&a);
            snprintf(msg, msglen, "umount %s: bad umount_command template", host_dir);
            return STEP_FAIL;
        }
        int rc = run_cmd(rt, w, &a, (int)rt->conf->command_timeout_s, "umount", &r, msg, msglen);
        if (rc != STEP_OK)
            return rc;
        if (mount_is_mount_point(mi, host_dir) == 1) {
            snprintf(msg, msglen, "umount %s: still a mount point", host_dir);
            return STEP_FAIL;
        }
    }
    /* Only an empty directory goes; never anything below a mount. */
    if (rmdir(host_dir) < 0 && errno != ENOENT)
        log_warn("workload %s: cannot remove %s: %s", w->id, host_dir, strerror(errno));
    return STEP_OK;
}

static int oci_shell(const struct runtime *rt, struct workload *w, const char *command, int tty,
                     const char *const *vars, struct argv_buf *argv, struct argv_buf *env, char *cwd, size_t cwdlen,
                     char *msg, size_t msglen)
{
    struct oci_cmd c = cmd_of(rt);
    cwd[0] = '\0';
    if (oci_argv_exec(&c, w->id, command, tty, vars, argv) < 0) {
        snprintf(msg, msglen, "exec: the command line does not fit");
        return STEP_FAIL;
    }
    return STEP_OK;
}

static int oci_main_pid(const struct runtime *rt, const char *id, long *pid, char *msg, size_t msglen)
{
    struct oci_cmd c = cmd_of(rt);
    struct argv_buf a = {0};
    char out[64];
    struct exec_capture cap = {.buf = out, .cap = sizeof out - 1};
    struct exec_opts o = {.deadline_ms = clock_mono_ms() + rt->conf->command_timeout_s * 1000,
                          .stop = &rt->agent->stopping,
                          .out = &cap};
    struct exec_result r;
    *pid = 0;
    if (oci_argv_inspect_pid(&c, id, &a) < 0) {
        argv_free(&a);
        snprintf(msg, msglen, "inspect: command line too long");
        return STEP_FAIL;
    }
    int rc = exec_run(a.v, &o, &r);
    argv_free(&a);
    out[cap.len] = '\0';
    char *end = NULL;
    long v = strtol(out, &end, 10);
    if (rc != 0 || v <= 0 || !end || (*end && *end != '\n')) {
        char why[512];
        exec_describe(&r, why, sizeof why);
        snprintf(msg, msglen, "inspect: %s", rc != 0 ? why : "the container has no running process");
        return STEP_FAIL;
    }
    *pid = v;
    return STEP_OK;
}

const struct runtime_ops oci_runtime_ops = {
    .name = "oci",
    .delay_ms = oci_delay_ms,
    .pull = oci_pull,
    .mount = oci_mount,
    .start = oci_start,
    .state = oci_state,
    .remove = oci_remove,
    .unmount = oci_unmount,
    .shell = oci_shell,
    .main_pid = oci_main_pid,
};
