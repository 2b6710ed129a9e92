/* agent.h: gpurent-agent's own modules, grouped by the file that implements
 * them, so this header is also a map of the node agent (see
 * docs/AGENT_PROTOCOL.md for the API it serves). Three parts have headers
 * of their own, included here: GPU discovery (discovery/discovery.h, the
 * folder src/agent/discovery) and the process runner (exec.h, exec.c),
 * which discovery uses too, because they need nothing of the rest; and the
 * SSH server (ssh/ssh.h, the folder src/agent/ssh), whose internals only
 * its own files see.
 *
 *   main.c, serve.c  subcommands; the serving life cycle shared by `serve`
 *                    and `sim-fleet`: configuration, the state directory
 *                    lock, GPU inventory, reloading workload records, the
 *                    signed API, sd_notify, signals
 *   fleet.c          sim-fleet: many simulated nodes under /nodes/{name} in
 *                    one process, each registered with gpurentd, secrets
 *                    saved so a re-run keeps working
 *   api.c            the REST API (facts, workloads), the signature check
 *                    every route but /healthz passes first
 *   node.c           the nodes a process serves, their secrets and facts
 *   terminal.c       the web terminal's stream: a signed request switched
 *                    to frames carrying the SSH server's shell on a PTY,
 *                    one relay thread for every open terminal
 *   spec.c           the workload spec, checked against everything that
 *                    could change a command line built from it
 *   cluster.c        the spec's cluster member (the ranks of a multi-node
 *                    instance) and the files made from it: hostfiles and
 *                    an ssh directory (config, key, known_hosts)
 *   fabric.c         what the host offers multi-node training: RDMA
 *                    devices, video/render gids, the data-plane address
 *   driver.c         worker threads that move workloads through pulling,
 *                    mounting, starting, running, and remove them; each exit
 *                    or failure recorded with its second and status and
 *                    counted per node (facts' workload_exits)
 *   health.c         a workload's HTTP health check (spec.health): one
 *                    bounded GET inside the workload, made by the driver
 *                    at a running workload's state check
 *   listening.c      whether a workload's process listens on a port, and
 *                    the address its socket is bound to (what ssh -L, the
 *                    sim's published ports and health checks connect to)
 *   runtime.c        the runtime interface and `sim` (phases with delays,
 *                    failures injected by image name)
 *   runtime_oci.c    podman/docker by their command lines (--device
 *                    /dev/kfd and the cards' own render nodes, and the
 *                    video/render groups for ROCm, the NVIDIA equivalents, /shared bind
 *                    mounted, host networking, RDMA and the cluster files
 *                    for multi-node; an exit's status and finish time read
 *                    by the same inspect)
 *   mount.c, argv.c  volume mounts with a configurable command and a
 *                    mountinfo check; argument vectors from templates (no
 *                    shell ever)
 *   exec.c           the one process runner (exec.h): no shell, the program
 *                    found before the fork, its own process group, killed at
 *                    a deadline, on DELETE or shutdown, its output capped
 *   ssh/             the SSH server (ssh/ssh.h): libssh listeners per node,
 *                    public-key logins against the workload specs, commands,
 *                    PTY shells and the sftp subsystem run through the
 *                    runtime, `ssh -L` only to the workload's own ports
 *   discovery/       amd_smi.c, rocm_smi.c, nvidia_smi.c (one tool each),
 *                    models.c (catalog models), text.c and cards.c (what the
 *                    parsers share), discovery.c (runs a tool through exec.c
 *                    under one deadline and cap); tested on recorded output
 *   state.c          workload records and fleet registrations on disk,
 *                    written atomically (temporary file, fsync, rename)
 *   config.c         the option table
 *   logs.c           each workload's output lines on disk (logs/ID.log and
 *                    one rotation, .log.1), read back by tail, time and
 *                    cursor for GET /v1/workloads/{id}/logs
 *   replay.c         the floor below which signed requests are refused after
 *                    a restart
 *   watchdog.c       systemd's watchdog, fed only after /healthz answers and
 *                    every driver worker and the discovery refresher made
 *                    progress
 *   sftp.c           `sftp-server --root DIR` (sftp.h): the SFTP server the
 *                    SSH server runs for the sftp subsystem, every path
 *                    resolved inside DIR with openat2(RESOLVE_IN_ROOT)
 *
 * Threading, in one place:
 *   - HTTP handlers run on libmicrohttpd's pool; they never run a command.
 *   - Each node has a mutex (agent_node.lock) guarding its secret and its
 *     workload list, and every field of its workloads marked "node lock".
 *     Workload records are written to disk under that lock, so a phase
 *     update can never overwrite a newer DELETE tombstone.
 *   - The driver has one mutex guarding its timer heap and the fields of
 *     each workload marked "driver lock".
 *   - Lock order: a node lock, then the driver lock; never the reverse.
 *   - Only the driver frees a workload, after taking it out of its node's
 *     list under the node lock; so anything found in the list under the
 *     node lock stays valid while that lock is held. */
#ifndef GPURENT_AGENT_H
#define GPURENT_AGENT_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "discovery/discovery.h"
#include "exec.h"
#include "sftp.h"
#include "ssh/ssh.h"
#include "gpurent/conf.h"
#include "gpurent/http.h"
#include "gpurent/log.h"

#define AGENT_VERSION "0.1.0"

/* Node names and workload ids: 1 to 63 of [a-z0-9_-] (see the protocol). */
#define AGENT_NAME_MAX 64
#define INET_ADDRSTRLEN_MAX 16 /* "255.255.255.255" and its NUL */

/* config.c: the agent's options, their table and the rules across them. */
struct agent_conf {
    char listen[128];              /* host:port of the agent API */
    char advertise_url[256];       /* sim-fleet: base URL registered with the control plane */
    char state_dir[1024];          /* workload records, fleet secrets, the lock file */
    char runtime[16];              /* sim, podman or docker */
    char runtime_path[1024];       /* podman/docker executable; "" looks the runtime name up in PATH */
    char node_name[AGENT_NAME_MAX];/* this node's name; "" uses the host name */
    char secret_file[1024];        /* 64 hex digits given by POST /v1/admin/nodes */
    char discovery[16];            /* amd-smi, rocm-smi, nvidia-smi or config */
    int64_t discovery_interval_s;  /* how often GPU health is read again */
    int64_t discovery_timeout_s;   /* bound on one discovery run */
    char inventory_model[32];      /* discovery = config: catalog model code */
    int64_t inventory_cards;       /* discovery = config: number of cards */
    int64_t inventory_memory_gb;   /* discovery = config: per card; 0 uses the model's */
    char inventory_failed_cards[256]; /* discovery = config: indices reported unhealthy */
    char inventory_driver_version[48]; /* discovery = config: reported driver; "" = the vendor's default */
    char inventory_stack_version[48]; /* discovery = config: reported ROCm/CUDA version; "" = the vendor's default */
    char mount_root[1024];         /* host directories where /shared sources are mounted */
    char mount_command[1024];      /* template: {source} {target}, optionally {size_gb} */
    char umount_command[1024];     /* template: {target} */
    char mountinfo_file[1024];     /* where mount points are checked */
    char run_args[1024];           /* extra words for podman/docker run, space-separated */
    int64_t pull_timeout_s;        /* bound on one image pull */
    int64_t command_timeout_s;     /* bound on mount, run, inspect, stop, rm */
    int64_t stop_timeout_s;        /* grace given to a container on stop */
    int64_t container_millicpus_per_card;  /* a container's CPU share per card, 0 = the host's CPUs / its cards */
    int64_t container_memory_mb_per_card;  /* its memory per card, 0 = the host's memory / its cards */
    int64_t container_pids_limit;          /* processes in one container, 0 = no limit */
    int64_t container_log_max_mb;          /* the runtime's log of one container, 0 = its own setting */
    int64_t check_interval_s;      /* how often running containers are inspected */
    int64_t retry_interval_s;      /* wait before retrying a failed removal */
    int64_t sim_pull_ms;           /* sim: time spent pulling */
    int64_t sim_mount_ms;          /* sim: time spent mounting */
    int64_t sim_start_ms;          /* sim: time spent starting */
    int64_t sim_exit_ms;           /* sim: run time of an "exit-after" image without a number */
    int64_t max_clock_skew_s;      /* signed timestamps further off are refused */
    int64_t replay_cache_entries;  /* nonces remembered; 0 sizes it from the node count */
    int64_t workers;               /* driver threads */
    int64_t max_workloads;         /* per node */
    int64_t threads;               /* HTTP worker threads */
    int64_t max_connections;       /* all clients together */
    int64_t max_connections_per_client; /* per client address; 0 = no limit */
    int64_t connection_timeout_s;  /* idle connections closed after this */
    int64_t header_timeout_s;      /* a request's headers must arrive within this of its start */
    int64_t max_body_bytes;        /* larger request bodies get 413 */
    int64_t max_json_depth;        /* deeper JSON gets 400 */
    char tls_cert[1024];           /* PEM certificate; "" serves plain HTTP */
    char tls_key[1024];            /* PEM private key */
    int64_t drain_timeout_s;       /* SIGTERM waits this long for requests */
    char log_level[16];            /* error, warn, info, debug */
    char ssh_listen[128];          /* host:port of the SSH server; "" = none */
    int64_t ssh_max_sessions;      /* concurrent SSH connections per node */
    int64_t ssh_max_startups_per_client; /* connections of one address not logged in yet */
    int64_t ssh_max_startups;            /* connections to one node not logged in yet */
    int64_t ssh_max_sessions_per_workload; /* logged-in connections to one workload */
    int64_t ssh_auth_timeout_s;    /* bound on key exchange and login */
    int64_t ssh_max_auth_tries;    /* failed login attempts per connection */
    int64_t ssh_login_rate;        /* failed logins per client address per minute before refusal */
    int64_t ssh_idle_timeout_s;    /* silent connections closed after this; 0 = never */
    int64_t log_max_bytes;         /* a workload's log file is rotated (once) past this */
    int64_t ended_log_keep_s;      /* a removed workload's output is kept this long */
    int64_t ended_logs_max;        /* and at most this many workloads' on a node */
    char publish_port_range[16];   /* "FIRST-LAST" host ports for published ports; "" = none */
    int64_t sim_publish_ports_per_node; /* sim-fleet: node i publishes on FIRST+i*this .. (its own slice) */
    char data_address[256];        /* facts' data_address; "" = found (fabric.c), the sim's 127.0.0.1 */
    char rdma_device_dir[1024];    /* RDMA device nodes passed to multi-node containers */
    char kfd_topology_dir[1024];   /* the KFD topology: which render node is each AMD card */
    char shm_size[16];             /* --shm-size of containers with cards ("64g") */
    char group_file[1024];         /* where video/render gids are read; "" = the host's groups (NSS) */
};
extern const struct conf_option agent_options[];
/* Loads defaults, then the file (if any), then "key=value" overrides, then
 * checks the rules that span options; what is wrong goes to err (naming file
 * and line, or the command line). 0 or -1. */
int agent_read_config(struct agent_conf *conf, const char *file, char **overrides, int n_overrides, char *err,
                      size_t errlen);
/* The same, printing what is wrong on stderr (start-up). */
int agent_load_config(struct agent_conf *conf, const char *file, char **overrides, int n_overrides);
/* Cross-option rules only (also run by sim-fleet after its own flags). */
int agent_check_config(const struct agent_conf *conf);

/* spec.c: the workload spec of PUT /v1/workloads/{id}: parsing with every
 * bound checked, canonical form, equality. Pure. */
#define SPEC_IMAGE_MAX 256        /* bytes, NUL included */
#define SPEC_MAX_GPUS 64
#define SPEC_MAX_VOLUMES 8
#define SPEC_SOURCE_MAX 1024
#define SPEC_TARGET_MAX 256
#define SPEC_MAX_ENV 160          /* the user's 64 and the control plane's own */
#define SPEC_ENV_NAME_MAX 128
#define SPEC_ENV_VALUE_MAX 4097   /* bytes, NUL included: gpurentd takes values of 4096 */
#define SPEC_SIZE_GB_MAX 1048576  /* gpurentd's bound on a volume's size_gb */
#define SPEC_SSH_USER_MAX 81      /* bytes of ssh.user, NUL included */
#define SPEC_SSH_MAX_KEYS 64      /* entries of ssh.authorized_keys */
#define SPEC_SSH_KEY_MAX 16384    /* bytes of one authorized key line */
#define SPEC_MAX_PORTS 8          /* entries of ports (gpurentd's bound on an instance's) */
#define SPEC_COMMAND_MAX_WORDS 64 /* words of command (gpurentd's bounds) */
#define SPEC_COMMAND_WORD_MAX 4096 /* bytes of one word */
#define SPEC_COMMAND_MAX_BYTES 32768 /* bytes of all words */
#define SPEC_WORKING_DIR_MAX 256  /* bytes of working_dir, NUL included */

struct spec_volume {
    char *source;                 /* "nfs.example:/export/vol_x"; owned */
    char *target;                 /* path inside the container, "/shared"; owned */
    int64_t size_gb;              /* the volume's quota, 1..SPEC_SIZE_GB_MAX; 0 when the spec gave none
                                     (an older control plane), which {size_gb} in mount_command refuses */
};
struct spec_env {
    char *name;                   /* owned */
    char *value;                  /* owned */
    int secret;                   /* named by secret_env: never echoed, logged or on a command line */
};
/* Who may log in to the workload over SSH ("ssh" in the spec). */
struct spec_ssh {
    int present;                  /* the spec had an ssh object; without one every login is refused */
    char user[SPEC_SSH_USER_MAX]; /* the login name, 1..80 of [a-z0-9_-] */
    char **keys;                  /* "<type> <base64>" lines, in the order given; owned */
    int n_keys;                   /* entries of keys */
};
/* One published port ("ports" in the spec): host port `host` of the node
 * leads to TCP port `container` of the workload. */
/* health: the HTTP check the agent makes on a running workload (health.c). */
#define SPEC_HEALTH_PATH_MAX 256      /* bytes of path, NUL included */
#define SPEC_HEALTH_INTERVAL_MAX 3600 /* seconds between checks */
struct spec_health {
    int present;                  /* the spec has one */
    int port;                     /* 1..65535, inside the workload (127.0.0.1 there) */
    char path[SPEC_HEALTH_PATH_MAX]; /* "/..." printable ASCII without blanks */
    int interval_s;               /* 1..SPEC_HEALTH_INTERVAL_MAX */
};
struct spec_port {
    int container;                /* 1..65535 */
    int host;                     /* 1..65535, within the node's publish_port_range (checked by the API) */
};
/* One rank of a multi-node instance ("cluster.hosts[i]" in the spec). */
#define SPEC_CLUSTER_MAX_HOSTS 256
#define SPEC_CLUSTER_ADDRESS_MAX 254      /* bytes of an address, NUL included (a DNS name's 253) */
#define SPEC_CLUSTER_IDENTITY_MAX 16384   /* bytes of the private key text, NUL included */
#define SPEC_CLUSTER_SLOTS_MAX DISCOVERY_MAX_CARDS
struct spec_cluster_host {
    char name[AGENT_NAME_MAX];    /* its hostfile name, 1..63 of [a-z0-9-], unique */
    char address[SPEC_CLUSTER_ADDRESS_MAX]; /* data-plane address: IPv4, IPv6 or a host name */
    int ssh_port;                 /* its agent's SSH server, 1..65535 */
    char user[SPEC_SSH_USER_MAX]; /* the login of its workload there */
    int slots;                    /* its GPUs, 1..SPEC_CLUSTER_SLOTS_MAX */
    char *host_key;               /* "<type> <base64>" of that SSH server; owned */
};
/* "cluster" in the spec: present only for instances of more than one node. */
struct spec_cluster {
    int present;                  /* the spec had one */
    int rank;                     /* this node's entry of hosts */
    struct spec_cluster_host *hosts; /* in rank order; owned */
    int n_hosts;                  /* entries of hosts, 1..SPEC_CLUSTER_MAX_HOSTS */
    char *identity;               /* OpenSSH ed25519 private key text; a secret; owned */
};
struct wl_spec {
    char *image;                  /* owned */
    int gpus[SPEC_MAX_GPUS];      /* card indices, in the order given */
    int n_gpus;                   /* used entries of gpus */
    char stack[8];                /* "ROCm" or "CUDA"; "" when the body had none */
    struct spec_volume volumes[SPEC_MAX_VOLUMES]; /* in the order given */
    int n_volumes;                /* used entries of volumes */
    struct spec_env *env;         /* sorted by name; owned */
    int n_env;                    /* entries of env */
    struct spec_ssh ssh;          /* SSH logins to it */
    struct spec_port ports[SPEC_MAX_PORTS]; /* published ports, in the order given */
    int n_ports;                  /* used entries of ports */
    char **command;               /* replaces the image's command (words after the image); NULL none; owned */
    int n_command;                /* words of command */
    char working_dir[SPEC_WORKING_DIR_MAX]; /* --workdir; "" the image's */
    struct spec_cluster cluster;  /* the other ranks of a multi-node instance (cluster.c) */
    struct spec_health health;    /* the agent's HTTP check of it; present 0 when none */
};
/* Whether s is 1..63 of [a-z0-9_-]. */
int agent_name_valid(const char *s);
/* Parses a spec object. On failure returns -1 with the offending field
 * ("gpus", "volumes[1].target" ...) and a sentence; *out is then empty. */
int spec_parse(const json_t *obj, struct wl_spec *out, char *field, size_t fieldlen, char *err, size_t errlen);
/* Frees what spec owns and zeroes it; NULL is a no-op. */
void spec_free(struct wl_spec *spec);
/* The canonical JSON of a spec (env as an object, keys sorted when dumped).
 * New reference. */
json_t *spec_to_json(const struct wl_spec *spec);
/* 1 when two specs ask for the same thing: same image, stack, gpus in the
 * same order, volumes (source, target, size) in the same order, same env
 * whatever its order, same ssh user and keys in the same order, same ports
 * in the same order, same cluster (cluster_equal). */
int spec_equal(const struct wl_spec *a, const struct wl_spec *b);
/* spec_equal leaving ssh.authorized_keys out: a PUT of the same workload
 * with other keys replaces its keys (the account's keys changed while the
 * control plane's first PUT was in flight). */
int spec_equal_but_ssh_keys(const struct wl_spec *a, const struct wl_spec *b);
/* Parses an array of authorized key lines (name: the field it is, for the
 * messages) into out->keys and out->n_keys, each "<type> <base64>" checked
 * with libssh. 0, or -1 with field and err; out's keys are then the
 * caller's to free all the same (spec_ssh_keys_free). */
int spec_ssh_keys_parse(const json_t *keys, const char *name, struct spec_ssh *out, char *field, size_t fieldlen,
                        char *err, size_t errlen);
/* Frees n_keys lines and the array; NULL is a no-op. */
void spec_ssh_keys_free(char **keys, int n_keys);
/* "ssh_keys_digest" of GET /v1/workloads: lowercase hex SHA-256 of the
 * keys, each line followed by "\n", in order (that of "" for none), which
 * gpurentd compares with what it sent to find a workload that missed a
 * change of its keys. */
void spec_ssh_keys_digest(const struct spec_ssh *ssh, char out[65]);
/* Parses one ssh.authorized_keys line "<type> <base64>" with libssh; the
 * blob must be of the named type. 0 with *out (libssh's ssh_key, which the
 * caller frees with ssh_key_free), or -1. */
struct ssh_key_struct;
int spec_ssh_key_import(const char *line, struct ssh_key_struct **out);
/* The spec as GET /v1/workloads shows it: command, working_dir and env,
 * a secret_env value as "***". Adds them to j. */
void spec_public_json(const struct wl_spec *spec, json_t *j);
/* For the parsers of spec members (spec.c, cluster.c): fills field and err
 * and returns -1. */
int spec_bad(char *field, size_t fieldlen, const char *f, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* A JSON string that holds no NUL byte (jansson allows "\u0000"), so C sees
 * the whole value; NULL otherwise. */
const char *spec_plain_string(const json_t *v, size_t *len);
/* Whether the image name contains word: the sim runtime's failure switches. */
int spec_image_has(const struct wl_spec *spec, const char *word);

/* cluster.c: the spec's cluster member and the files made from it: the
 * hostfiles (DeepSpeed "NAME slots=N", MPI "NAME:N", in rank order) and an
 * ssh directory (config, id_ed25519, known_hosts). */
/* Parses a cluster object (called by spec_parse). -1 with field and err;
 * *out then owns nothing. The identity is never quoted in err. */
int cluster_parse(const json_t *obj, struct spec_cluster *out, char *field, size_t fieldlen, char *err,
                  size_t errlen);
/* Frees what c owns (wiping the identity) and zeroes it; NULL is a no-op. */
void cluster_free(struct spec_cluster *c);
/* Its canonical JSON, identity included (for the record only). New reference. */
json_t *cluster_to_json(const struct spec_cluster *c);
/* 1 when both are absent, or both ask for the same ranks and identity. */
int cluster_equal(const struct spec_cluster *a, const struct spec_cluster *b);
/* Whether s is an IPv4 address, an IPv6 address (no brackets) or a DNS host
 * name; and whether it is one of the first two. */
int cluster_address_valid(const char *s);
int cluster_address_is_ip(const char *s);
/* Whether s has a cluster of more than one host: the multi-node flags. */
int cluster_multi_node(const struct wl_spec *s);
/* The files' texts, malloc'd (NULL when out of memory): a hostfile (mpi 0
 * DeepSpeed's, 1 MPI's), the ssh config whose IdentityFile and
 * UserKnownHostsFile lie in ssh_home ("~/.ssh" in a container; NULL for a
 * home ssh cannot name), and known_hosts ("[address]:port key" lines). */
char *cluster_hostfile(const struct spec_cluster *c, int mpi);
char *cluster_ssh_config(const struct spec_cluster *c, const char *ssh_home);
char *cluster_known_hosts(const struct spec_cluster *c);
/* Writes etc_dir/{hostfile,hostfile.mpi} and ssh_dir/{config,known_hosts,
 * id_ed25519} (the key and config 0600, the directories 0700), config naming
 * ssh_home. 0, or -1 with msg. */
int cluster_write_files(const struct spec_cluster *c, const char *etc_dir, const char *ssh_dir, const char *ssh_home,
                        char *msg, size_t msglen);
/* Removes a directory of such files; a missing one is fine. */
void cluster_remove_dir(const char *dir);

/* spec.c, continued: the workload a spec describes, and its phases as the
 * protocol names them. */
enum wl_phase { WL_PULLING, WL_MOUNTING, WL_STARTING, WL_RUNNING, WL_EXITED, WL_FAILED };
const char *wl_phase_name(enum wl_phase p);
/* -1 for a name that is not a phase. */
int wl_phase_parse(const char *name, enum wl_phase *out);

struct agent_node;

/* One workload on one node. */
/* What a workload's health check says (only with spec.health): starting
 * until a check first passes, unless a server answers badly first;
 * then healthy or unhealthy after each check. Not kept across restarts. */
enum wl_health { WL_HEALTH_STARTING, WL_HEALTH_HEALTHY, WL_HEALTH_UNHEALTHY };
const char *wl_health_name(enum wl_health h);
/* listening.c: where a workload's listening socket is reached. */
struct listen_addr {
    struct sockaddr_storage sa;
    socklen_t len;
};
/* Whether a process of workload wl_id listens on TCP port: with
 * container_pid 0 (sim) a process whose environment has
 * GPURENT_WORKLOAD=wl_id holds a listening socket on it in the host's
 * network; otherwise a process in container_pid's pid namespace holds one
 * in its network namespace. 1 with *at (may be NULL) the address that
 * socket is bound to (a wildcard: loopback), 0 if none. ssh -L, the sim's
 * published ports and its health checks connect there, so a connection
 * reaches this workload's process even when another sim workload listens
 * on the same port at another loopback address. */
int workload_listener(const char *wl_id, long container_pid, int port, struct listen_addr *at);
/* 127.0.0.1:port. */
void listen_addr_loopback(int port, struct listen_addr *at);
/* A TCP socket (close-on-exec; non-blocking, its connect maybe still in
 * progress, with nonblock) connecting to *at from netns_pid's network
 * namespace (0: the agent's own), or -1 with errno. */
int listen_addr_connect(long netns_pid, const struct listen_addr *at, int nonblock);

/* health.c: one check: HTTP GET path on *at in the network namespace of
 * process netns_pid (0: the agent's own, the sim's), within timeout_ms in
 * all. 0 with the answer's status in *status, or -1 (no connection, no
 * answer in time, not HTTP) with why in msg. */
int health_probe(long netns_pid, const struct listen_addr *at, const char *path, int timeout_ms, int *status,
                 char *msg, size_t msglen);
/* The next verdict from the current one and a check's outcome (answered:
 * got an HTTP status, status: which). Pure. */
enum wl_health health_next(enum wl_health cur, int answered, int status);
#define HEALTH_PROBE_TIMEOUT_MS 2000 /* one check's bound (a driver worker waits for it) */

struct workload {
    char id[AGENT_NAME_MAX];      /* chosen by the control plane */
    struct agent_node *node;      /* owner; immutable */
    struct wl_spec spec;          /* immutable once in the node's list, but for spec.ssh.keys and
                                     n_keys, which PUT .../ssh-keys replaces under the node lock */
    int64_t ssh_keys_gen;         /* node lock: bumped each time spec.ssh.keys is replaced, so a
                                     logged-in connection checks its key again (ssh/server.c) */
    enum wl_phase phase;          /* node lock */
    char message[256];            /* node lock: why failed or exited */
    int64_t created_at;           /* node lock: epoch seconds */
    int64_t updated_at;           /* node lock: epoch seconds of the last phase change */
    int removing;                 /* node lock: DELETE accepted, clean-up pending */
    atomic_int cancel;            /* set by DELETE: interrupt the command in flight */
    enum wl_health health;        /* node lock: the last verdict of spec.health's check (health.c) */
    int64_t health_checked_at_ms; /* node lock: wall-clock ms of the last check; 0 none yet */
    char health_message[160];     /* node lock: why the last check failed; "" when it passed */
    int64_t health_due_ms;        /* the driver's worker only: monotonic ms of the next check (0 now) */
    int64_t running_at_ms;        /* node lock to write (the driver, its only writer, reads it without):
                                     wall-clock ms it entered running; 0 unknown */
    int64_t exited_at;            /* node lock: wall-clock epoch second it reached exited or failed;
                                     0 (null) in every other phase */
    int exit_known;               /* node lock: exit_code holds the status its container ended with */
    int exit_code;                /* node lock: that status, when exit_known */
    size_t heap_idx;              /* driver lock: position in the timer heap */
    int in_heap;                  /* driver lock: scheduled */
    int64_t due_ms;               /* driver lock: monotonic time of its next step */
    int busy;                     /* driver lock: a worker is stepping it */
    int wake;                     /* driver lock: asked to step again while busy */
    int64_t sim_tick;             /* the driver's worker only: the last "tick" line a log-every-N sim
                                     image wrote (0 none yet; not kept across restarts) */
    struct oci_log_mark {         /* the driver's worker only: podman/docker, per stream (stdout, stderr): */
        int64_t ms;               /*   ms of the last output line collected (0 none yet) */
        int64_t same;             /*   lines collected dated ms */
    } oci_log[2];
};
/* Frees a workload and its spec; NULL is a no-op. */
void workload_free(struct workload *w);
/* Sets w->message to msg, cut to fit between two characters and any byte
 * that is not UTF-8 made '?': the message goes into JSON (the record,
 * GET /v1/workloads), which takes only UTF-8, and a runtime's error text
 * may be longer than the field or hold any bytes. */
void workload_message_set(struct workload *w, const char *msg);

/* state.c: what the agent keeps on disk under state_dir:
 *   nodes/NAME/registration.json   sim-fleet: node id and secret (0600)
 *   [nodes/NAME/]workloads/ID.json one record per workload
 *   agent.lock                     held while an agent uses the directory
 *   replay-mark                    the latest future timestamp accepted (replay.c)
 * Every file is written to a temporary name, fsynced and renamed, and the
 * directory fsynced, so a crash leaves the old or the new file, never half. */
#define STATE_RECORD_MAX (1024 * 1024) /* larger record files are refused */
/* Writes len bytes as dir/name atomically with the given mode. 0 or -1 (errno). */
int state_write_atomic(const char *dir, const char *name, const void *data, size_t len, unsigned mode);
/* Reads at most max bytes of a file into a NUL-terminated buffer the caller
 * frees; -1 (errno) on failure or when the file is larger. */
char *state_read_file(const char *path, size_t max, size_t *len);
/* Creates dir and its parents with mode 0700. 0 or -1. */
int state_mkdirs(const char *dir);
/* A workload as its record file holds it. New reference. */
json_t *record_to_json(const struct workload *w);
/* Fills w (id, spec, phase, message, times, removing, how it ended) from a
 * record; a record an older agent wrote, without running_at_ms, exited_at
 * and exit_code, reads as if they were null. -1 with a reason. w must be
 * zeroed; on failure it owns nothing. */
int record_from_json(const json_t *j, struct workload *w, char *err, size_t errlen);
/* Saves w's record under node_dir/workloads/. 0 or -1 (logged). */
int record_save(const char *node_dir, const struct workload *w);
/* Deletes w's record; a missing one is fine. 0 or -1 (logged). */
int record_delete(const char *node_dir, const char *id);
/* Loads every record under node_dir/workloads/, calling add for each (add
 * takes ownership of w). Unreadable records are renamed *.corrupt and
 * logged; stale temporary files are removed. Returns the number loaded. */
int records_load(const char *node_dir, struct agent_node *node,
                 void (*add)(struct agent_node *node, struct workload *w, void *ctx), void *ctx);
/* Reads a node secret file: 64 lowercase hex digits, optional newline.
 * Refuses a file others may read. 0, or -1 with a reason. */
int secret_read(const char *path, char out[65], char *err, size_t errlen);
/* Whether s is 64 lowercase hex digits. */
int secret_valid(const char *s);
/* Saves/loads node_dir/registration.json ({"id", "secret"}, mode 0600). */
int registration_save(const char *node_dir, const char *node_id, const char *secret);
int registration_load(const char *node_dir, char node_id[ID_MAX], char secret[65]);
/* Takes an exclusive lock on state_dir/agent.lock (held until exit); -1 if
 * another agent holds it. */
int state_lock(const char *state_dir);

/* node.c: the nodes this process serves and what each reports. */
struct agent_inventory {
    pthread_mutex_t lock;         /* guards everything below */
    int ok;                       /* facts were read at least once */
    char error[256];              /* the last discovery error, "" if the last run worked */
    struct gpu_facts facts;       /* the last good facts */
    uint64_t generation;          /* moved by every discovery run: what a cached facts reply was made from */
};
#define AGENT_ETAG_MAX 40 /* a facts reply's ETag, quotes and NUL included */
/* A node's last facts reply and what it was made from (agent_facts_reply). */
struct facts_cache {
    char *text;                   /* the reply's JSON, or NULL before the first */
    size_t len;                   /* its bytes */
    char etag[AGENT_ETAG_MAX];    /* "\"<32 hex of its SHA-256>\"" */
    uint64_t inv_generation;      /* the inventory's generation it shows */
    int64_t workload_exits;       /* the count it shows */
    char data_address[SPEC_CLUSTER_ADDRESS_MAX]; /* the address it shows, "" for null */
};
struct agent_node {
    char name[AGENT_NAME_MAX];    /* immutable */
    pthread_mutex_t lock;         /* guards secret, the workload list and its workloads */
    char secret[65];              /* "" until known */
    int64_t secret_tried_ms;      /* single node: last read of secret_file while it had none */
    struct workload **wl;         /* the workload list */
    size_t n_wl, cap_wl;          /* used and allocated entries of wl */
    int64_t workload_exits;       /* node lock: workloads that reached exited or failed since the process
                                     started (facts' workload_exits) */
    pthread_cond_t phase_moved;   /* node lock: broadcast when a workload's phase changes, for a PUT that
                                     waits for its workload to run (Gpurent-Wait-Ms); CLOCK_MONOTONIC */
    int ssh_port;                 /* the SSH port bound for it, 0 when none; set before the API serves */
    char ssh_host_key[128];       /* "ssh-ed25519 <base64>", its public host key; the same */
    char ssh_fingerprint[96];     /* "SHA256:..." of it; the same */
    int publish_first, publish_last; /* host ports it publishes on, 0 when none; set before the API serves */
    struct facts_cache facts;     /* node lock */
};
struct driver;
struct runtime;
struct agent {
    struct agent_conf *conf;      /* configuration in force */
    int fleet;                    /* nodes live under /nodes/{name} */
    struct agent_node *nodes;     /* sorted by name; the array never changes after start */
    size_t n_nodes;               /* entries of nodes */
    struct agent_inventory inv;   /* shared by every node of this process */
    struct replay_cache *replay;  /* nonces seen, shared by every node */
    struct driver *driver;        /* workload driver threads */
    const struct runtime *rt;     /* sim, podman or docker */
    struct http_server *http;     /* the API */
    struct ssh_server *ssh;       /* the SSH server, NULL when off */
    struct agent_terminals *terminals; /* the web terminal's relay (terminal.c) */
    atomic_int stopping;          /* SIGTERM: interrupt commands in flight */
    const char *conf_file;        /* -c FILE or NULL: read again on SIGHUP */
    char **conf_overrides;        /* "key=value" as first applied, again on SIGHUP */
    int n_conf_overrides;         /* entries of conf_overrides */
    _Atomic int64_t refresher_alive_ms; /* monotonic ms the discovery refresher last woke; 0 = not running */
    int64_t started_wall;         /* wall-clock second this run took the state directory */
    int64_t signed_floor;         /* signed requests dated earlier are refused (replay.c); set before serving */
    pthread_mutex_t mark_lock;    /* guards future_mark and its file */
    int64_t future_mark;          /* the latest future timestamp accepted, kept on disk */
};
/* Allocates n nodes with the given names (sorted here); -1 on a bad or
 * duplicate name. */
int agent_nodes_init(struct agent *a, char **names, size_t n);
void agent_nodes_free(struct agent *a);
/* The node called name, or NULL. Lock-free: the array is immutable. */
struct agent_node *agent_node_find(struct agent *a, const char *name);
/* Where a node's files live: state_dir itself for a single node, else
 * state_dir/nodes/NAME. -1 if it does not fit. */
int agent_node_dir(const struct agent *a, const struct agent_node *n, char *out, size_t outlen);
/* Copies the node's secret into out (under its lock); for a single node
 * whose secret is missing, re-reads secret_file at most once a second, so
 * writing the file is enough to bring the node in. 0, or -1 if none. */
int agent_node_secret(struct agent *a, struct agent_node *n, char out[65]);
void agent_node_set_secret(struct agent_node *n, const char *secret);
/* The workload list, under the node lock: append (-1 if out of memory),
 * take out, and find by id (removing ones included). */
int agent_node_add(struct agent_node *n, struct workload *w);
void agent_node_remove(struct agent_node *n, struct workload *w);
struct workload *agent_node_workload(struct agent_node *n, const char *id);
/* Fills facts from the configured inventory (model, cards, memory, failed
 * cards; defaults from discovery_model_defaults). -1 with a reason for an
 * unknown model. */
int agent_inventory_from_config(const struct agent_conf *c, struct gpu_facts *facts, char *err, size_t errlen);
/* Runs discovery once into a->inv (config or the GPU tool). 0 or -1 (logged). */
int agent_inventory_refresh(struct agent *a);
/* The facts reply for node n (GET /v1/facts) as a malloc'd copy of its JSON
 * text, its length in *len and its ETag; made again only when what it shows
 * may have changed (a discovery run, an exit, the data address), so the
 * heartbeat's every poll does not build a JSON document. NULL with a reason
 * when no facts were ever read, or without memory. */
char *agent_facts_reply(struct agent *a, struct agent_node *n, size_t *len, char etag[AGENT_ETAG_MAX], char *err,
                        size_t errlen);
/* Card index of this node as discovery last saw it: 1 healthy, -1 reported
 * failed (why, whylen bytes, gets the reason; why may be NULL), 0 no such
 * card or no discovery yet; fills the node's stack ("ROCm"/"CUDA", "" while
 * discovery has not succeeded). */
int agent_inventory_card(struct agent *a, int index, char stack[8], char *why, size_t whylen);
/* A workload as the API shows it. New reference; call under the node lock. */
json_t *workload_json(const struct workload *w);
/* workload_json, plus "last_lines" (the log's last lines) when the
 * workload exited or failed: what GET /v1/workloads answers. */
json_t *workload_json_ended(const struct agent *a, const struct agent_node *n, const struct workload *w);

/* replay.c: signed requests are accepted once, across restarts too. */
enum replay_verdict {
    REPLAY_OK,                    /* accept */
    REPLAY_BEFORE_START,          /* dated before signed_floor: 401 */
    REPLAY_UNAVAILABLE,           /* dated ahead and the mark cannot be saved: 503 */
};
/* Takes the start time and the previous run's mark (state_dir/replay-mark)
 * into a->signed_floor and logs it. Call once the state directory is
 * locked. 0. */
int agent_replay_init(struct agent *a);
/* Sleeps until the wall clock has left the start second (at most 1 s). */
void agent_replay_wait(struct agent *a);
void agent_replay_free(struct agent *a);
/* Judges an authentic, fresh request's timestamp header at now (wall
 * seconds); a future one is put on disk before it is accepted. */
enum replay_verdict agent_replay_check(struct agent *a, const char *timestamp, int64_t now);

/* api.c: routes, the signature check and the handlers. */
extern const struct http_route agent_routes_single[];
extern const struct http_route agent_routes_fleet[];
int agent_authenticate(struct http_request *req, enum http_auth level);

/* logs.c: workload output on disk, one file per workload under
 * node_dir/logs/: ID.log, and ID.log.1 after one rotation. Each line is
 * "<epoch ms> <o|e> <text>\n", the text with backslash, newline and
 * carriage return escaped as \\, \n and \r, so a line is one line.
 * Each file starts with a line "#gpurent-log <generation>"; a cursor names
 * a position as "<generation>-<offset>" of the file holding it, so it
 * survives a rotation (a rename) and an agent restart, and a cursor into
 * the rotated file still reads on into the new one. */
#define WL_LOG_TEXT_MAX 16384       /* longer output lines are cut */
#define WL_LOG_REPLY_LINES 1000     /* most lines one read returns (and the largest tail) */
#define WL_LOG_REPLY_BYTES (1024 * 1024) /* most text bytes one read returns */
#define WL_LOG_CURSOR_MAX 48
/* Appends one line (stream 'o' stdout or 'e' stderr) dated t_ms, rotating
 * first when the file would grow past max_bytes. Serialised internally.
 * 0 or -1 (logged). */
int wl_log_append(const char *node_dir, const char *id, int64_t max_bytes, int64_t t_ms, char stream,
                  const char *text, size_t len);
/* Moves a removed workload's files to logs/ended/, where wl_log_read with
 * .ended reads them, so a job's output outlives it; then removes the kept
 * logs older than keep_s and the oldest beyond max_kept. Neither > 0: the
 * files are removed. Missing ones are fine. */
void wl_log_retire(const char *node_dir, const char *id, int64_t keep_s, int64_t max_kept);
/* Removes the kept logs of removed workloads that wl_log_retire's limits
 * no longer keep (at start: the limits may have changed, and time passed). */
void wl_log_sweep(const char *node_dir, int64_t keep_s, int64_t max_kept);
/* Whether a removed workload's output is kept. */
int wl_log_kept(const char *node_dir, const char *id);
struct wl_log_query {
    int ended;                    /* read a removed workload's kept files */
    int64_t tail;                 /* 0: from the start (or after); else only the last tail lines */
    int64_t since_ms;             /* lines dated before are skipped; 0 none */
    const char *after;            /* a cursor: only lines after it; NULL none */
};
/* Reads lines as q asks into a new array of {"t","stream","text"}, at most
 * WL_LOG_REPLY_LINES and WL_LOG_REPLY_BYTES; cursor gets the position after
 * the last line returned (or the end), *at_end whether nothing follows it.
 * -1 with a reason for a malformed cursor. */
json_t *wl_log_read(const char *node_dir, const char *id, const struct wl_log_query *q,
                    char cursor[WL_LOG_CURSOR_MAX], int *at_end, char *err, size_t errlen);
/* Whether s is a cursor as wl_log_read writes them. */
int wl_log_cursor_valid(const char *s);
#define WL_LAST_LINES_MAX 10         /* last_lines of an ended workload (AGENT_PROTOCOL.md) */
#define WL_LAST_LINE_MAX 200         /* bytes of each, cut on a character boundary */
#define WL_LAST_READ_BYTES 65536     /* read from the end of each log file for them, at most */
/* The texts of the last max (<= WL_LAST_LINES_MAX) lines of the workload's
 * log, oldest first, each one line of at most WL_LAST_LINE_MAX bytes; an
 * empty array when it has none. Reads at most WL_LAST_READ_BYTES of each
 * of its two files, so it costs the same however large the log is. */
json_t *wl_log_last_lines(const char *node_dir, const char *id, size_t max);

/* exec.c: running a command without a shell: see exec.h, included above. */

/* argv.c: building argument vectors safely. */
#define ARGV_MAX 2048 /* a 256-rank run line has an --add-host per rank */
struct argv_buf {
    char *v[ARGV_MAX + 1];        /* NULL-terminated; each entry owned */
    int n;                        /* used entries */
    int overflow;                 /* an add failed: too many words or no memory */
};
void argv_add(struct argv_buf *a, const char *word);
void argv_addf(struct argv_buf *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Frees the words; NULL is a no-op. */
void argv_free(struct argv_buf *a);
/* One line, words separated by spaces, for logs and tests. */
void argv_join(const struct argv_buf *a, char *out, size_t outlen);
/* Splits a template on spaces and substitutes {source}, {target} and
 * {size_gb} inside words (no quoting: a word is never split or re-joined).
 * -1 if the template has no words, names an unknown {placeholder}, or a
 * value is NULL where its placeholder appears. */
int argv_from_template_sized(struct argv_buf *a, const char *tmpl, const char *source, const char *target,
                             const char *size_gb);
/* The same with no {size_gb} value: for umount_command, run_args, and
 * mount templates that do not use it. */
int argv_from_template(struct argv_buf *a, const char *tmpl, const char *source, const char *target);
/* Whether a template uses {size_gb}. */
int argv_template_uses_size(const char *tmpl);
/* Checks a template when the configuration is read: words and placeholders
 * known, the first word plain, and {target} present. want_source is 1 for
 * mount_command ({source} required, {size_gb} allowed), 0 for
 * umount_command (only {target}). */
int argv_template_check(const char *tmpl, int want_source, char *err, size_t errlen);

/* mount.c: host directories for volumes, mounting and the mount-point check. */
/* The host directory for a volume source: mount_root/v-<16 hex of SHA-256>,
 * so workloads using the same source share one mount. */
int mount_host_dir(const char *mount_root, const char *source, char *out, size_t outlen);
/* Whether path is a mount point according to a mountinfo file (the path
 * itself and its realpath are both tried). 1, 0, or -1 if the file cannot
 * be read. */
int mount_is_mount_point(const char *mountinfo_file, const char *path);
/* Decodes mountinfo's octal escapes (\040 ...) of one field in place. */
void mount_unescape(char *s);
/* The mount command for volume v at host_dir from the mount_command
 * template, {size_gb} being v's quota in decimal. -1 with msg ("mount
 * SOURCE: ...") when the template uses {size_gb} and the spec gave v no
 * size, or the template cannot be expanded; the caller frees a either way. */
int mount_argv(struct argv_buf *a, const char *tmpl, const struct spec_volume *v, const char *host_dir, char *msg,
               size_t msglen);

/* runtime.c: the runtimes behind one interface. Each step returns a
 * step_rc; on STEP_FAIL msg says why. A step is called by one driver worker
 * at a time per workload, with no lock held. */
enum step_rc { STEP_OK = 0, STEP_FAIL = -1, STEP_INTERRUPTED = -2 };
enum rt_state { RT_RUNNING, RT_EXITED, RT_ABSENT, RT_UNKNOWN };
/* How a container ended, as far as its runtime can tell. */
struct rt_exit {
    int64_t at;                   /* wall-clock epoch second it ended; 0 when unknown */
    int has_code;                 /* code is known */
    int code;                     /* its exit status */
};
struct runtime_ops {
    const char *name;
    /* Milliseconds the driver waits in phase p before calling its step:
     * the sim's configured delays (0 for real runtimes). For WL_RUNNING it
     * is the time until the next state check, or -1 for none. */
    int64_t (*delay_ms)(const struct runtime *rt, struct workload *w, enum wl_phase p);
    int (*pull)(const struct runtime *rt, struct workload *w, char *msg, size_t msglen);
    /* Mounts one volume source at host_dir and checks it is a mount point. */
    int (*mount)(const struct runtime *rt, struct workload *w, const struct spec_volume *v,
                 const char *host_dir, char *msg, size_t msglen);
    /* Starts the container; host_dirs[i] backs spec.volumes[i]. */
    int (*start)(const struct runtime *rt, struct workload *w, char *const host_dirs[], char *msg, size_t msglen);
    /* What the container is doing now; on RT_EXITED ex says when and with
     * what status it ended (zeroed first: unknown) and msg gives the status. */
    enum rt_state (*state)(const struct runtime *rt, struct workload *w, struct rt_exit *ex, char *msg,
                           size_t msglen);
    /* Stops and removes the container; an absent one is fine. */
    int (*remove)(const struct runtime *rt, struct workload *w, char *msg, size_t msglen);
    /* Unmounts a host directory no workload uses any more. */
    int (*unmount)(const struct runtime *rt, struct workload *w, const char *host_dir, char *msg, size_t msglen);
    /* SSH: the program that runs command (NULL: an interactive shell)
     * inside the workload, tty when a PTY was asked for, with the session's
     * variables vars (NULL-terminated "NAME=VALUE": TERM, SSH_CONNECTION
     * …). Fills argv, env (NAME=VALUE words; none: the agent's own
     * environment) and cwd ("" = the agent's). Called from an SSH
     * connection thread with no lock held. STEP_OK or STEP_FAIL with msg. */
    int (*shell)(const struct runtime *rt, struct workload *w, const char *command, int tty, const char *const *vars,
                 struct argv_buf *argv, struct argv_buf *env, char *cwd, size_t cwdlen, char *msg, size_t msglen);
    /* SSH forwards: the host pid of workload id's main process, whose
     * namespaces are the container's; 0 for the sim, whose processes share
     * the host's. Takes the id, not the workload, as it runs a command with
     * no lock held. STEP_OK or STEP_FAIL with msg. */
    int (*main_pid)(const struct runtime *rt, const char *id, long *pid, char *msg, size_t msglen);
};
struct runtime {
    const struct runtime_ops *ops; /* what this runtime does */
    const struct agent_conf *conf; /* delays, templates, timeouts */
    struct agent *agent;           /* for the stop flag */
    int docker;                    /* oci: docker's flags rather than podman's */
    char exe[1024];                /* oci: the podman/docker executable */
};
/* Creates the runtime named by conf->runtime; NULL (logged) if unknown. */
struct runtime *runtime_new(struct agent *a);
void runtime_free(struct runtime *rt);
/* sim: ms an "exit-after[-N]" image runs, or -1 if it does not exit. */
int64_t sim_exit_after_ms(const struct wl_spec *spec, int64_t def_ms);
/* The host directory holding the volume a workload mounts at /shared: in
 * sim an absolute source itself (created 0700: every sim node of a machine
 * shares it), otherwise mount_host_dir's. -1 when it mounts none there. */
int runtime_shared_dir(const struct runtime *rt, const struct workload *w, char *out, size_t outlen);
/* sim: <node dir>/containers/<workload id>, the simulated container. */
int sim_container_dir(const struct runtime *rt, const struct workload *w, char *out, size_t outlen);
/* sim: the environment of a process in w's container directory dir: the
 * spec's env, and for a cluster GPURENT_HOSTFILE naming the sim's own
 * hostfile (dir/etc/gpurent/hostfile) in place of the spec's. */
void sim_add_env(const struct workload *w, const char *dir, struct argv_buf *env);
/* The simulated runtime (phases with configured delays). */
extern const struct runtime_ops sim_runtime_ops;

/* sim_process.c: a commanded sim workload's real process, keyed by its
 * container directory. */
#define SIM_PROCESS_POLL_MS 200 /* how often a running one's exit is looked for */
/* Starts spec.command in cwd with envp (NAME=VALUE, NULL-terminated); its
 * output lines go to the workload's log. STEP_OK, or STEP_FAIL with msg
 * (not found, cannot chdir or exec). */
int sim_process_start(const struct runtime *rt, struct workload *w, const char *container_dir, const char *cwd,
                      char *const envp[], char *msg, size_t msglen);
/* 0 running, 1 exited (*exit_at, wall-clock second, and *code: its status
 * or 128 + the signal), -1 no such process (another agent's). */
int sim_process_state(const char *container_dir, int64_t *exit_at, int *code);
/* Kills its process group (SIGTERM, SIGKILL after 2 s) and forgets it. */
void sim_process_stop(const char *container_dir);
/* Whether /proc/PID/environ holds want ("GPURENT_WORKLOAD=id"): how the sim
 * tells a workload's processes apart (it isolates nothing). */
int sim_process_environ_has(const char *pid, const char *want);
/* SIGKILLs every process whose environment names workload wl_id, as a
 * container's teardown would (sessions' background processes included). */
void sim_process_kill_workload(const char *wl_id);

/* publish.c: published ports the runtime cannot publish itself: the sim's,
 * and a podman/docker multi-node rank's (host network). One thread listens
 * on 0.0.0.0:<host port> for every such port of every running workload (it
 * looks at the workload lists every PUBLISH_RESCAN_MS), and relays each
 * connection to the <container port> socket of a process of that workload
 * (workload_listener), else closes it. The listeners, relays and their
 * buffers are bounded; podman and docker publish any other with -p. */
#define PUBLISH_RESCAN_MS 200
#define PUBLISH_MAX_LISTENERS 1024 /* host ports listened on at once, all nodes */
#define PUBLISH_MAX_RELAYS 256     /* connections relayed at once, all nodes */
struct publisher;
/* Gives every node its range from publish_port_range (sim-fleet: node i
 * the slice FIRST+i*sim_publish_ports_per_node, that many ports; nodes
 * whose slice would pass LAST publish none, logged). -1 (logged) on a bad
 * range. */
int publish_assign_ranges(struct agent *a);
/* Parses "FIRST-LAST" (1 <= FIRST <= LAST <= 65535); "" gives 0, 0. -1 if bad. */
int publish_parse_range(const char *s, int *first, int *last);
/* Starts the thread (no node with a range: *out NULL). */
int publish_start(struct agent *a, struct publisher **out);
/* Closes every listener and relay and ends the thread; NULL is a no-op. */
void publish_stop(struct publisher *p);

/* fabric.c: what the host offers multi-node training, looked up when
 * asked (a container's start, a facts reply). */
#define FABRIC_MAX_RDMA_DEVICES 64
/* The entries of dir that are device nodes (not directories or links),
 * sorted, as dir/NAME in a new array (fabric_free_devices). A missing dir
 * is a host without RDMA: 0 with none. -1 on another error. */
int fabric_rdma_devices(const char *dir, char ***out, int *n);
void fabric_free_devices(char **devs, int n);
/* The gid of group name: from group_file (/etc/group's syntax) or, when it
 * is "", getgrnam_r. 0 found, 1 no such group, -1 unreadable. */
int fabric_group_gid(const char *group_file, const char *name, long *gid);
#define FABRIC_RENDER_NODE_MAX 40 /* "/dev/dri/renderD" and a minor */
/* The render node of each of the n AMD cards in gpus (ROCr's numbering:
 * the GPU nodes of the KFD topology in topology_dir, in node order), as
 * "/dev/dri/renderD<drm_render_minor>" into out[i]. -1 with why when a
 * card has none or the topology cannot be read. */
int fabric_render_nodes(const char *topology_dir, const int *gpus, int n, char (*out)[FABRIC_RENDER_NODE_MAX],
                        char *why, size_t whylen);
/* Whether s is a size podman and docker take for --shm-size: digits and
 * an optional unit b, k, m or g, not zero. */
int fabric_shm_size_valid(const char *s);
/* One IPv4 interface address, as fabric_pick_address weighs it. */
struct fabric_iface {
    char address[INET_ADDRSTRLEN_MAX];
    int loopback, up, rdma;       /* rdma: the interface backs an RDMA device */
};
/* The first up, non-loopback address of an RDMA interface, else of any
 * interface; -1 (out "") when none. Pure. */
int fabric_pick_address(const struct fabric_iface *ifs, int n, char *out, size_t outlen);
/* Facts' data_address: the option, else 127.0.0.1 for the sim runtime
 * (sim-fleet or not), else
 * fabric_pick_address over getifaddrs and /sys/class/infiniband. -1 (out
 * "") when none is found. */
int fabric_data_address(const struct agent *a, char *out, size_t outlen);

/* runtime_oci.c: podman and docker command lines (pure, unit-tested) and
 * the runtime that runs them. */
/* What a run line needs to know about the host, found at start. */
struct oci_host {
    char **rdma;                  /* RDMA device paths, sorted (multi-node only) */
    int n_rdma;                   /* entries of rdma */
    long video_gid, render_gid;   /* --group-add for ROCm; -1 when the host has no such group */
    char (*render_nodes)[FABRIC_RENDER_NODE_MAX]; /* ROCm: the render node of each card of the spec, in its order */
    int64_t millicpus, memory_mb, pids_limit;     /* the container's limits; 0 = none given */
    int64_t log_max_mb;                           /* its log file's bound; 0 = the runtime's */
    const char *shm_size;         /* --shm-size for containers with cards */
    const char *cluster_dir;      /* the cluster files to mount (hostfile, hostfile.mpi, ssh/); NULL none */
};
struct oci_cmd {
    const char *exe;              /* podman or docker executable */
    int docker;                   /* docker's spelling of GPU flags */
    int64_t stop_timeout_s;       /* grace for stop */
    const char *run_args;         /* extra words for run, or NULL */
    const char *env_file;         /* run: the spec's env is in this file (--env-file), or NULL: --env words */
    const struct oci_host *host;  /* NULL: none of its additions */
};
/* The env file of a spec for --env-file: NAME=VALUE lines of every env
 * entry without a line break in its value (those stay --env words, and
 * secret ones are refused by spec_parse). malloc'd, or NULL. */
char *oci_env_file_text(const struct wl_spec *s);
/* The container name for a workload: "gpurent-" + id. */
void oci_container_name(const char *id, char *out, size_t outlen);
int oci_argv_pull(const struct oci_cmd *c, const char *image, struct argv_buf *a);
int oci_argv_run(const struct oci_cmd *c, const char *id, const struct wl_spec *s, char *const host_dirs[],
                 struct argv_buf *a);
/* The multi-node additions of a run line (host network, RDMA devices from
 * c->host, IPC_LOCK, memlock, --add-host per rank with an IP), only
 * for a cluster of more than one host, and the read-only mounts of the
 * cluster files (c->host->cluster_dir) whenever s has a cluster. */
void oci_argv_cluster(const struct oci_cmd *c, const struct wl_spec *s, struct argv_buf *a);
/* Where a podman/docker workload's cluster files live: node_dir/cluster/ID
 * (0700, removed with the workload). */
int oci_cluster_dir(const struct runtime *rt, const struct workload *w, char *out, size_t outlen);
int oci_argv_inspect(const struct oci_cmd *c, const char *id, struct argv_buf *a);
int oci_argv_stop(const struct oci_cmd *c, const char *id, struct argv_buf *a);
int oci_argv_rm(const struct oci_cmd *c, const char *id, struct argv_buf *a);
/* `exec -i [-t] [-e NAME=VALUE]... <container> /bin/sh [-c command]`: SSH
 * sessions; command NULL for a shell, vars the session's variables
 * (NULL-terminated, or NULL for none). */
int oci_argv_exec(const struct oci_cmd *c, const char *id, const char *command, int tty, const char *const *vars,
                  struct argv_buf *a);
/* `container inspect --format {{.State.Pid}} <container>`: SSH forwards. */
int oci_argv_inspect_pid(const struct oci_cmd *c, const char *id, struct argv_buf *a);
/* "<exe> logs --timestamps --since SINCE_S gpurent-ID": the container's
 * stdout and stderr since a second (each on its own stream), each line
 * after a timestamp, polled at every state check and appended to the
 * workload's log (logs.c). */
int oci_argv_logs(const struct oci_cmd *c, const char *id, int64_t since_s, struct argv_buf *a);
/* Parses one line of that output, "<RFC 3339 time> <text>": its time in
 * epoch ms into *t_ms and where the text starts. 0, or -1 for a line
 * without a time. */
int oci_parse_log_line(const char *line, size_t n, int64_t *t_ms, size_t *text_at);
/* Parses inspect output "STATUS EXITCODE FINISHEDAT"; for exited ones fills
 * ex (zeroed first) with what the line tells: the code, and the finish time
 * when it parses and is after 1970. */
enum rt_state oci_parse_state(const char *output, struct rt_exit *ex);
/* Epoch seconds (rounded down) of a time as docker prints it (RFC 3339,
 * "2024-05-01T12:34:56.123456789+02:00") or podman does (Go's default,
 * "2024-05-01 12:34:56.123456789 +0200 CEST"): fractional seconds optional,
 * a zone (Z or an offset) required. 0, or -1 for anything else. */
int oci_parse_time(const char *text, int64_t *out);
/* The podman/docker runtime. */
extern const struct runtime_ops oci_runtime_ops;

/* driver.c: the threads that move workloads through their phases. */
struct driver *driver_start(struct agent *a, int threads);
/* Stops the threads (a command in flight is interrupted through
 * a->stopping) and frees the driver; NULL is a no-op. */
void driver_stop(struct driver *d);
/* Asks for w's next step at now + delay_ms. Call with w's node lock held. */
void driver_schedule(struct driver *d, struct workload *w, int64_t delay_ms);
/* Whether every worker made progress recently: an idle one goes round its
 * loop every few seconds, a busy one must finish its step within its
 * commands' timeouts. 0, or -1 with why (for the watchdog). */
int driver_check(struct driver *d, int64_t now_ms, char *why, size_t whylen);
/* Takes a loaded workload into its node's list and schedules it (restart). */
void driver_adopt(struct agent_node *node, struct workload *w, void *agent);

/* watchdog.c: systemd's watchdog, fed only after real checks. */
struct agent_watchdog;
/* Starts the checking thread when systemd asked for a watchdog
 * (WATCHDOG_USEC, and WATCHDOG_PID if set, naming this process); NULL when
 * it did not, or when the thread cannot start (logged). host and port are
 * where the API listens. */
struct agent_watchdog *agent_watchdog_start(struct agent *a, const char *host, int port, int tls);
/* Stops and frees it; NULL is a no-op. */
void agent_watchdog_stop(struct agent_watchdog *w);

/* serve.c: the serving process: single node or fleet. */
/* Starts everything for a->nodes, then waits for SIGTERM/SIGINT. SIGHUP
 * re-reads a single node's secret file and, from a->conf_file and
 * a->conf_overrides, the options that can change while running (log_level,
 * max_body_bytes, max_json_depth). on_ready, if not NULL, runs once
 * the API listens (sim-fleet registers its nodes there); a non-zero return
 * stops the agent with status 1. Returns the exit status. */
int agent_serve(struct agent *a, int (*on_ready)(struct agent *a, void *ctx), void *ctx);
/* `gpurent-agent [serve]`. */
int agent_cmd_serve(int argc, char **argv);

/* model_server.c: `gpurent-agent sim-model-server` (issue 17). */
int agent_cmd_model_server(int argc, char **argv);
/* fleet.c: `gpurent-agent sim-fleet`. */
int agent_cmd_fleet(int argc, char **argv);

/* terminal.c: the web terminal's stream (docs/AGENT_PROTOCOL.md). */
#define AGENT_TERMINAL_PROTOCOL "gpurent-terminal"
struct agent_terminals;
/* Starts the relay thread; 0 or -1. */
int agent_terminals_start(struct agent *a);
/* Before the API stops: every terminal's shell is hung up and reaped, its
 * connection closed; a terminal opened after this ends at once. */
void agent_terminals_stop(struct agent *a);
/* After the API stopped (stops first if need be); NULL-safe. */
void agent_terminals_free(struct agent *a);
/* GET .../v1/workloads/{id}/terminal for workload wl_id of node n: checks
 * the query (cols, rows) and the workload, then switches the connection. */
void agent_terminal_open(struct http_request *req, struct agent_node *n, const char *wl_id);

#endif
