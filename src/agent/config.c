/* config.c: gpurent-agent's option table: every option's type, bounds and
 * default in one place, read by conf.c from conf/gpurent-agent.conf and
 * flags, plus the few rules that span options. */
#include "agent.h"
#include "gpurent/secrets.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int validate_nonempty(const void *field, char *err, size_t errlen)
{
    if (!((const char *)field)[0]) {
        snprintf(err, errlen, "value must not be empty");
        return -1;
    }
    return 0;
}

static int one_of(const char *opt, const char *v, const char *const *names, char *err, size_t errlen)
{
    for (const char *const *n = names; *n; n++)
        if (strcmp(v, *n) == 0)
            return 0;
    snprintf(err, errlen, "%s: '%s' is not one of:", opt, v);
    for (const char *const *n = names; *n; n++) {
        size_t len = strlen(err);
        snprintf(err + len, errlen - len, " %s", *n);
    }
    return -1;
}

static int validate_runtime(const void *field, char *err, size_t errlen)
{
    static const char *const names[] = {"sim", "podman", "docker", NULL};
    return one_of("runtime", field, names, err, errlen);
}

static int validate_discovery(const void *field, char *err, size_t errlen)
{
    static const char *const names[] = {"amd-smi", "rocm-smi", "nvidia-smi", "config", NULL};
    return one_of("discovery", field, names, err, errlen);
}

static int validate_node_name(const void *field, char *err, size_t errlen)
{
    const char *s = field;
    if (s[0] && !agent_name_valid(s)) {
        snprintf(err, errlen, "node_name: '%s' must be 1 to 63 of a-z, 0-9, '_' and '-'", s);
        return -1;
    }
    return 0;
}

static int validate_template(const char *opt, const void *field, int want_source, char *err, size_t errlen)
{
    char why[512];
    if (argv_template_check(field, want_source, why, sizeof why) == 0)
        return 0;
    snprintf(err, errlen, "%s: %s", opt, why);
    return -1;
}

static int validate_mount_command(const void *field, char *err, size_t errlen)
{
    return validate_template("mount_command", field, 1, err, errlen);
}

static int validate_umount_command(const void *field, char *err, size_t errlen)
{
    return validate_template("umount_command", field, 0, err, errlen);
}

/* "0,3" style list of card indices. */
static int validate_card_list(const void *field, char *err, size_t errlen)
{
    const char *p = field;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= DISCOVERY_MAX_CARDS || (*end && *end != ',')) {
            snprintf(err, errlen, "inventory_failed_cards: '%s' is not a comma-separated list of card indices 0..%d",
                     (const char *)field,
                     DISCOVERY_MAX_CARDS - 1);
            return -1;
        }
        p = *end ? end + 1 : end;
    }
    return 0;
}

/* A version as tools print them ("6.8.5", "550.54.15", "12.4",
 * "6.8.0-45-generic"): it lands in facts and in gpurentd's node record. */
static int validate_version(const char *opt, const char *s, char *err, size_t errlen)
{
    for (const char *p = s; *p; p++) {
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '.' ||
              *p == '-' || *p == '_' || *p == '+')) {
            snprintf(err, errlen, "%s: '%s' may hold only letters, digits and . - _ +", opt, s);
            return -1;
        }
    }
    return 0;
}

static int validate_driver_version(const void *field, char *err, size_t errlen)
{
    return validate_version("inventory_driver_version", field, err, errlen);
}

static int validate_stack_version(const void *field, char *err, size_t errlen)
{
    return validate_version("inventory_stack_version", field, err, errlen);
}

static int validate_words(const void *field, char *err, size_t errlen)
{
    struct argv_buf a = {0};
    int rc = 0;
    const char *s = field;
    if (s[0]) {
        /* Checked as a template with no placeholders, which also bounds the word count. */
        if (argv_from_template(&a, s, NULL, NULL) < 0 || a.overflow) {
            snprintf(err, errlen, "run_args: must be plain words without {placeholders}");
            rc = -1;
        }
    }
    argv_free(&a);
    return rc;
}

/* ssh_listen: host:port, or "" for no SSH server. */
static int validate_ssh_listen(const void *field, char *err, size_t errlen)
{
    char host[128];
    int port;
    const char *s = field;
    if (s[0] && conf_parse_hostport(s, host, sizeof host, &port) < 0) {
        snprintf(err, errlen, "ssh_listen: '%s' is not HOST:PORT (e.g. 0.0.0.0:2222) or \"\" (no SSH server)", s);
        return -1;
    }
    return 0;
}

/* publish_port_range: FIRST-LAST, or "" for no published ports. */
static int validate_publish_range(const void *field, char *err, size_t errlen)
{
    int first, last;
    if (publish_parse_range(field, &first, &last) < 0) {
        snprintf(err, errlen, "publish_port_range: '%s' is not FIRST-LAST (e.g. 30000-30999, 1..65535) or \"\" (none)",
                 (const char *)field);
        return -1;
    }
    return 0;
}

/* data_address: "" (found at each facts reply), or what the ranks of a
 * multi-node instance use to reach this node. */
static int validate_data_address(const void *field, char *err, size_t errlen)
{
    const char *s = field;
    if (s[0] && !cluster_address_valid(s)) {
        snprintf(err, errlen, "data_address: '%s' is not an IPv4 address, an IPv6 address or a host name", s);
        return -1;
    }
    return 0;
}

static int validate_shm_size(const void *field, char *err, size_t errlen)
{
    if (!fabric_shm_size_valid(field)) {
        snprintf(err, errlen, "shm_size: '%s' is not a size like 64g (digits, then b, k, m or g)",
                 (const char *)field);
        return -1;
    }
    return 0;
}

static int validate_abs_path(const char *opt, const char *s, int empty_ok, char *err, size_t errlen)
{
    if ((s[0] || !empty_ok) && s[0] != '/') {
        snprintf(err, errlen, "%s: '%s' must be an absolute path%s", opt, s, empty_ok ? " or \"\"" : "");
        return -1;
    }
    return 0;
}

static int validate_rdma_device_dir(const void *field, char *err, size_t errlen)
{
    return validate_abs_path("rdma_device_dir", field, 0, err, errlen);
}

static int validate_kfd_topology_dir(const void *field, char *err, size_t errlen)
{
    return validate_abs_path("kfd_topology_dir", field, 0, err, errlen);
}

static int validate_group_file(const void *field, char *err, size_t errlen)
{
    return validate_abs_path("group_file", field, 1, err, errlen);
}

#define OPT_INT(n, lo, hi, d, h) {#n, CONF_INT, lo, hi, #d, offsetof(struct agent_conf, n), sizeof(int64_t), NULL, h}
#define OPT_STR(n, d, v, h) {#n, CONF_STRING, 0, 0, d, offsetof(struct agent_conf, n), sizeof(((struct agent_conf *)0)->n), v, h}

const struct conf_option agent_options[] = {
    OPT_STR(listen, "127.0.0.1:9090", conf_validate_listen, "address and port of the agent API (the node's management address)"),
    OPT_STR(advertise_url, "", NULL, "sim-fleet: base URL given to the control plane; \"\" derives it from listen"),
    OPT_STR(state_dir, "/var/lib/gpurent-agent", validate_nonempty, "workload records, fleet secrets and the lock file"),
    OPT_STR(runtime, "podman", validate_runtime, "sim, podman or docker"),
    OPT_STR(runtime_path, "", NULL, "podman/docker executable; \"\" looks the runtime's name up in PATH"),
    OPT_STR(node_name, "", validate_node_name, "this node's name in facts; \"\" uses the host name"),
    OPT_STR(secret_file, "/etc/gpurent/agent.secret", NULL, "the node secret from POST /v1/admin/nodes (mode 0600)"),
    OPT_STR(discovery, "amd-smi", validate_discovery, "amd-smi, rocm-smi, nvidia-smi, or config (the inventory_* options)"),
    OPT_INT(discovery_interval_s, 1, 86400, 60, "seconds between GPU health reads"),
    OPT_INT(discovery_timeout_s, 1, 600, 30, "bound on one run of the discovery tool"),
    OPT_STR(inventory_model, "MI450", NULL, "discovery = config: catalog model (MI450, MI300X, MI250, H100-SXM, RTX4090)"),
    OPT_INT(inventory_cards, 1, DISCOVERY_MAX_CARDS, 8, "discovery = config: number of cards"),
    OPT_INT(inventory_memory_gb, 0, 4096, 0, "discovery = config: memory per card; 0 uses the model's"),
    OPT_STR(inventory_failed_cards, "", validate_card_list, "discovery = config: card indices reported unhealthy, e.g. 3,5"),
    OPT_STR(inventory_driver_version, "", validate_driver_version,
            "discovery = config: driver version reported; \"\" = 6.8.5 (AMD) or 550.54.15 (NVIDIA)"),
    OPT_STR(inventory_stack_version, "", validate_stack_version,
            "discovery = config: ROCm or CUDA version reported; \"\" = 6.2.0 (AMD) or 12.4 (NVIDIA)"),
    OPT_STR(mount_root, "/run/gpurent-agent/mounts", validate_nonempty, "host directories where volume sources are mounted"),
    OPT_STR(mount_command, "mount -t nfs4 -o hard,noatime {source} {target}", validate_mount_command,
            "mount template, split on spaces, no shell; {source}, {target}, {size_gb} (quota, GB) are substituted"),
    OPT_STR(umount_command, "umount {target}", validate_umount_command, "unmount template; {target} is substituted"),
    OPT_STR(mountinfo_file, "/proc/self/mountinfo", validate_nonempty,
            "where a volume target is checked to be a mount point (a stand-in file in tests)"),
    OPT_STR(run_args, "", validate_words, "extra words for podman/docker run, e.g. --ulimit stack=67108864 (podman refuses --shm-size beside --ipc=host)"),
    OPT_INT(pull_timeout_s, 10, 86400, 3600, "bound on one image pull"),
    OPT_INT(command_timeout_s, 1, 3600, 120, "bound on mount, run, inspect, stop and rm"),
    OPT_INT(stop_timeout_s, 0, 3600, 30, "seconds a container gets to exit on stop before it is killed"),
    OPT_INT(container_millicpus_per_card, 0, 10000000, 0,
            "CPU a container may use per card it has, in thousandths of a CPU (--cpus); 0 = the host's CPUs "
            "divided by its cards"),
    OPT_INT(container_memory_mb_per_card, 0, 1073741824, 0,
            "memory a container may use per card it has, in MiB (--memory); 0 = the host's memory divided by its cards"),
    OPT_INT(container_pids_limit, 0, 4194304, 32768, "processes one container may run (--pids-limit); 0 = no limit"),
    OPT_INT(container_log_max_mb, 0, 1048576, 100,
            "megabytes of output the runtime keeps of one container (--log-opt max-size); 0 = the runtime's own setting"),
    OPT_INT(check_interval_s, 1, 3600, 10, "seconds between checks that running containers still run"),
    OPT_INT(retry_interval_s, 1, 3600, 10, "seconds before a failed stop or unmount is tried again"),
    OPT_INT(sim_pull_ms, 0, 3600000, 2000, "sim: milliseconds spent pulling"),
    OPT_INT(sim_mount_ms, 0, 3600000, 500, "sim: milliseconds spent mounting"),
    OPT_INT(sim_start_ms, 0, 3600000, 1000, "sim: milliseconds spent starting"),
    OPT_INT(sim_exit_ms, 0, 86400000, 5000, "sim: run time of an image named exit-after (exit-after-N runs N ms)"),
    OPT_INT(max_clock_skew_s, 1, 3600, 300, "signed requests further from this clock are refused"),
    OPT_INT(replay_cache_entries, 0, 100000000, 0, "nonces remembered; 0 = max(65536, 96 per node)"),
    OPT_INT(workers, 1, 64, 4, "driver threads (each runs one slow command at a time)"),
    OPT_INT(max_workloads, 1, 4096, 64, "workloads one node may hold"),
    OPT_INT(threads, 1, 256, 4, "HTTP worker threads"),
    OPT_INT(max_connections, 1, 100000, 1024, "open connections, all clients together"),
    OPT_INT(max_connections_per_client, 0, 100000, 0, "open connections from one address; 0 = no limit (gpurentd is one client)"),
    OPT_INT(connection_timeout_s, 1, 3600, 30, "seconds before an idle or slow connection is closed"),
    OPT_INT(header_timeout_s, 1, 3600, 30,
            "seconds a request's headers may take to arrive, trickled or not (idle keep-alive included)"),
    OPT_INT(max_body_bytes, 1024, 16777216, 1048576, "largest request body accepted (a spec with a long command and env is some 300 KB, a 256-rank cluster some 60 KiB)"),
    OPT_INT(max_json_depth, 3, 64, 8, "deepest JSON nesting accepted"),
    OPT_STR(tls_cert, "", NULL, "PEM certificate file; empty serves plain HTTP"),
    OPT_STR(tls_key, "", NULL, "PEM private key file for tls_cert"),
    OPT_INT(drain_timeout_s, 1, 600, 10, "seconds SIGTERM waits for requests in flight"),
    OPT_STR(log_level, "info", conf_validate_log_level, "error, warn, info or debug"),
    OPT_STR(ssh_listen, "0.0.0.0:2222", validate_ssh_listen,
            "SSH server address (sim-fleet: node i binds port+i, or its own ephemeral port for 0); \"\" = no SSH server"),
    OPT_INT(ssh_max_sessions, 1, 100000, 64, "concurrent SSH connections per node"),
    OPT_INT(ssh_max_startups_per_client, 1, 100000, 10,
            "SSH connections from one address to one node that have not logged in yet"),
    OPT_INT(ssh_max_startups, 1, 100000, 32, "SSH connections to one node that have not logged in yet"),
    OPT_INT(ssh_max_sessions_per_workload, 1, 100000, 16, "logged-in SSH connections to one workload"),
    OPT_INT(ssh_auth_timeout_s, 1, 600, 30, "seconds a connection has to log in"),
    OPT_INT(ssh_max_auth_tries, 1, 100, 6, "failed login attempts one connection may make"),
    OPT_INT(ssh_login_rate, 1, 100000, 20, "failed SSH logins per client address per minute before it is refused"),
    OPT_INT(ssh_idle_timeout_s, 0, 604800, 0, "seconds an SSH connection may stay silent; 0 = no limit"),
    OPT_INT(log_max_bytes, 4096, 1073741824, 8388608,
            "a workload's output file is rotated past this (one old file kept: twice this on disk)"),
    OPT_INT(ended_log_keep_s, 0, 31536000, 604800,
            "seconds a removed workload's output stays readable (GET logs of an ended job); 0 = removed with it"),
    OPT_INT(ended_logs_max, 0, 100000, 200, "removed workloads whose output one node keeps, the newest"),
    OPT_STR(publish_port_range, "30000-30999", validate_publish_range,
            "host ports published ports are given from (FIRST-LAST); \"\" = no published ports"),
    OPT_INT(sim_publish_ports_per_node, 1, 65535, 100,
            "sim-fleet: host ports of each node: node i gets FIRST+i*N .. FIRST+i*N+N-1 of publish_port_range"),
    OPT_STR(data_address, "", validate_data_address,
            "address the other nodes of a multi-node instance reach this one at (MASTER_ADDR); \"\" = the first "
            "non-loopback IPv4 address, an RDMA interface's first (runtime sim: 127.0.0.1)"),
    OPT_STR(rdma_device_dir, "/dev/infiniband", validate_rdma_device_dir,
            "RDMA device nodes given to multi-node containers (each entry, sorted, as --device)"),
    OPT_STR(kfd_topology_dir, "/sys/class/kfd/kfd/topology/nodes", validate_kfd_topology_dir,
            "the KFD topology, where each AMD card's render node is found (a ROCm container gets only its own "
            "cards')"),
    OPT_STR(shm_size, "64g", validate_shm_size, "--shm-size of containers with cards (digits then b, k, m or g)"),
    OPT_STR(group_file, "", validate_group_file,
            "where the video and render gids for ROCm containers are read; \"\" = the host's groups (getgrnam)"),
    {NULL, 0, 0, 0, NULL, 0, 0, NULL, NULL},
};

/* What is wrong with a loaded configuration as a whole, in err; -1 if any. */
static int check_config(const struct agent_conf *conf, char *err, size_t errlen)
{
    if ((conf->tls_cert[0] != 0) != (conf->tls_key[0] != 0)) {
        snprintf(err, errlen, "tls_cert and tls_key must be set together");
        return -1;
    }
    /* Read here, so that -n finds a pair the server could not start with. */
    if (conf->tls_cert[0] && tls_pair_check(conf->tls_cert, conf->tls_key, err, errlen) < 0)
        return -1;
    if (strcmp(conf->discovery, "config") == 0) {
        struct gpu_facts *f = malloc(sizeof *f);
        if (!f) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        int rc = agent_inventory_from_config(conf, f, err, errlen);
        free(f);
        if (rc < 0)
            return -1;
    }
    if (strcmp(conf->runtime, "sim") != 0 && conf->mount_root[0] != '/') {
        snprintf(err, errlen, "mount_root must be an absolute path");
        return -1;
    }
    return 0;
}

int agent_check_config(const struct agent_conf *conf)
{
    char err[1024];
    if (check_config(conf, err, sizeof err) < 0) {
        fprintf(stderr, "gpurent-agent: %s\n", err);
        return -1;
    }
    return 0;
}

int agent_read_config(struct agent_conf *conf, const char *file, char **overrides, int n_overrides, char *err,
                      size_t errlen)
{
    memset(conf, 0, sizeof *conf);
    if (conf_set_defaults(agent_options, conf, err, errlen) < 0 ||
        (file && conf_load_file(agent_options, conf, file, err, errlen) < 0))
        return -1;
    for (int i = 0; i < n_overrides; i++) {
        char why[896];
        if (conf_set_override(agent_options, conf, overrides[i], why, sizeof why) < 0) {
            snprintf(err, errlen, "command line: %s", why);
            return -1;
        }
    }
    return check_config(conf, err, errlen);
}

int agent_load_config(struct agent_conf *conf, const char *file, char **overrides, int n_overrides)
{
    char err[1024];
    if (agent_read_config(conf, file, overrides, n_overrides, err, sizeof err) < 0) {
        fprintf(stderr, "gpurent-agent: %s\n", err);
        return -1;
    }
    return 0;
}
