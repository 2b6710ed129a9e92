/* ssh/ssh.h: the agent's SSH server, built on libssh's server API, so a
 * renter reaches every node of an instance with their key and no sshd in
 * the image:
 *
 *   server.c   one listener per node (its own port and ed25519 host key,
 *              kept in the node's directory), one accept thread for all,
 *              one thread per connection driving an ssh_event; public-key login
 *              only, as the workload spec's ssh.user with one of its
 *              ssh.authorized_keys while the workload runs and holds
 *              that key (PUT .../ssh-keys replaces them); failed
 *              attempts of a connection counted as sshd counts them for
 *              MaxAuthTries, failed logins rate-limited per client
 *              address; every login and refusal logged
 *   session.c  session channels: a command, a shell with a PTY (window
 *              changes, signals), or the sftp subsystem, each a child
 *              process whose output goes to the channel and whose end
 *              becomes exit-status or exit-signal
 *   forward.c  direct-tcpip (`ssh -L`): only to a port a process of that
 *              workload listens on (in its container's namespaces with
 *              podman/docker), everything else refused
 *
 * agent.h includes this header for the first four functions (the fourth,
 * ssh_shell_start, is the web terminal's way to the same shell); the rest is
 * shared by the three files alone. Threading: a connection's session, its
 * channels and children are touched only by its own thread; the server's
 * counters and the failed-login table are guarded by ssh_server.lock. */
#ifndef GPURENT_AGENT_SSH_H
#define GPURENT_AGENT_SSH_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

struct agent;
struct ssh_server;

/* Starts a listener for every node of a (sim-fleet: node i binds port+i,
 * or an ephemeral port of its own for port 0), fills each node's ssh_port,
 * ssh_host_key and ssh_fingerprint, and returns 0 with *out; with
 * ssh_listen "" there is no server: 0 and *out NULL. -1 (logged) when a
 * host key or a port cannot be had. */
int ssh_server_start(struct agent *a, struct ssh_server **out);
/* Closes the listeners, ends every connection (their children get SIGHUP)
 * and frees the server; NULL is a no-op. */
void ssh_server_stop(struct ssh_server *s);
/* The shell an SSH session with a PTY of cols x rows and TERM term gets
 * in workload wl_id of node n (running, not being removed), started the
 * same way: the web terminal's (terminal.c). 0 with *pid (its own session
 * and process group) and *master (the PTY's master, close-on-exec), or -1
 * with msg. Takes n->lock itself. */
struct agent_node;
int ssh_shell_start(struct agent *a, struct agent_node *n, const char *wl_id, const char *term, unsigned cols,
                    unsigned rows, pid_t *pid, int *master, char *msg, size_t msglen);

#ifdef GPURENT_SSH_INTERNAL
#include <libssh/callbacks.h>
#include <libssh/libssh.h>
#include <libssh/server.h>
#include <pthread.h>
#include <sys/ioctl.h>

#include "agent.h"

#define SSH_CHANNELS_MAX 16        /* channels one connection may have open at once */
#define SSH_PENDING_MAX (1 << 20)  /* client bytes held for a child that is not reading */
#define SSH_FAIL_TABLE 256         /* client addresses whose failed logins are counted */

struct ssh_listener;

struct ssh_fail_entry {
    char addr[64];                 /* client address, numeric */
    int64_t window_ms;             /* monotonic start of its one-minute window */
    int64_t failures;              /* failed logins in that window */
};

/* Connections from one address to one node that have not logged in yet. */
struct ssh_startup {
    const struct ssh_listener *listener; /* the node's */
    char addr[64];                 /* client address, numeric (the entry is free at count 0) */
    int64_t count;
};

struct ssh_server {
    struct agent *agent;
    struct ssh_listener *listeners; /* one per node, in a->nodes order */
    size_t n_listeners;
    atomic_int stopping;           /* ssh_server_stop: every thread ends */
    pthread_t accept_thread;       /* accepts for every listener */
    int accept_started;
    pthread_mutex_t lock;          /* guards what follows */
    pthread_cond_t idle;           /* signalled when a connection ends */
    int64_t connections;           /* connection threads alive, all nodes */
    struct ssh_fail_entry fails[SSH_FAIL_TABLE];
    struct ssh_startup startups[SSH_FAIL_TABLE];
    struct ssh_conn *conns;        /* live connections, for stop to cut them off */
};

struct ssh_listener {
    struct ssh_server *srv;
    struct agent_node *node;
    int fd;                        /* listening socket, -1 if none */
    ssh_bind bind;                 /* holds the host key */
    int64_t active;                /* srv->lock: this node's connections */
    int64_t starting;              /* srv->lock: of them, those not logged in yet */
};

enum ssh_chan_kind { CHAN_SESSION, CHAN_FORWARD };

struct ssh_conn;
struct ssh_chan;
/* What an event-loop callback for one of a channel's descriptors needs. */
struct ssh_chan_fd {
    struct ssh_chan *chan;
    int is_stderr;                 /* output goes to the channel's stderr */
    int eof;                       /* read saw the end; the pump closes it */
    int fd;                        /* the fd read, while watched or paused */
    int paused;                    /* out of the event while unsent holds bytes */
    size_t off, len;               /* unsent: buf[off..len), bytes the client's window did not take yet */
    char buf[16384];
};

struct ssh_chan {
    struct ssh_conn *conn;
    ssh_channel channel;
    struct ssh_channel_callbacks_struct cb;
    enum ssh_chan_kind kind;
    int tty;                       /* a PTY was asked for */
    char term[64];                 /* its TERM */
    struct winsize ws;             /* its size */
    int started;                   /* a command, shell or subsystem runs (or a forward is connected) */
    pid_t pid;                     /* the child; 0 when none or reaped */
    int wait_status;               /* the child's status once reaped */
    int reaped;                    /* the child was waited for */
    int in_fd;                     /* child stdin, the PTY master or the socket; -1 when closed */
    int out_fd;                    /* child stdout, the PTY master or the socket; -1 when closed */
    int err_fd;                    /* child stderr; -1 */
    struct ssh_chan_fd out_ref, err_ref; /* event userdata */
    char *pending;                 /* client data not yet taken by in_fd */
    size_t pending_len;
    int client_eof;                /* the client sent EOF */
    int client_closed;             /* the client closed the channel */
    int refused;                   /* what it asked to run was refused: it is closed */
    int finished;                  /* exit status sent and the channel closed */
};

struct ssh_conn {
    struct ssh_server *srv;
    struct ssh_listener *listener;
    ssh_session session;
    ssh_event event;
    struct ssh_server_callbacks_struct server_cb;
    char addr[64];                 /* client address */
    int port;                      /* client port */
    char user[96];                 /* the last user name tried */
    char fingerprint[96];          /* SHA256 fingerprint of the last key tried */
    char wl_id[AGENT_NAME_MAX];    /* the workload logged in to */
    char *key_line;                /* the workload's ssh.authorized_keys line it logged in with (owned) */
    int64_t keys_gen;              /* the workload's ssh_keys_gen when key_line was last found there */
    int key_removed;               /* ssh_conn_workload found key_line gone from the workload's keys */
    int authenticated;
    int startup;                   /* counted in srv->startups until it logs in or ends */
    int fd;                        /* its socket, while it is in srv->conns */
    struct ssh_conn *prev, *next;  /* srv->conns, under srv->lock */
    int64_t tries;                 /* failed login attempts, every key offered counted (server.c) */
    int64_t requests;              /* login requests the callbacks saw */
    int64_t unanswered_counted;    /* client packets left unanswered before login, counted in tries */
    struct ssh_counter_struct packets; /* libssh's count of packets either way since the key exchange */
    int too_many;                  /* ssh_max_auth_tries failed: to be closed with the reason */
    char probed[96];               /* the key just probed (offered unsigned), "" once answered */
    int refused;                   /* a login was refused (counted against addr) */
    int evicted;                   /* srv->lock: cut off, not logged in, to make room for a newer connection */
    struct ssh_chan *chans[SSH_CHANNELS_MAX];
    int n_chans;
    int64_t last_activity_ms;      /* monotonic ms of the last byte either way */
};

/* server.c: the workload a logged-in connection may use, under its node's
 * lock: running, not being removed, still with this ssh.user and still
 * holding the key the connection logged in with. NULL if not. */
struct workload *ssh_conn_workload(struct ssh_conn *c);

/* session.c */
/* The channel-open callback of a session channel. */
ssh_channel ssh_session_open(ssh_session session, void *userdata);
/* Moves pending input, closes ended descriptors, reaps children and
 * finishes channels whose child ended and whose output is drained. */
void ssh_chan_pump(struct ssh_chan *ch);
/* At the end of a connection: children get SIGHUP, then SIGKILL, and are
 * reaped; descriptors closed; ch freed. */
void ssh_chan_free(struct ssh_chan *ch);
/* Frees the connection's finished channels, so that SSH_CHANNELS_MAX bounds
 * the channels open at once, not those a connection ever opened (a
 * multiplexed client runs every command on one connection). */
void ssh_conn_drop_finished(struct ssh_conn *c);
/* Shared by forward.c: a new channel struct registered with the
 * connection, or NULL when it has SSH_CHANNELS_MAX. */
struct ssh_chan *ssh_chan_new(struct ssh_conn *c, enum ssh_chan_kind kind);
/* Watches fd for output of ch into the channel. 0 or -1. */
int ssh_chan_watch(struct ssh_chan *ch, int fd, int is_stderr);
/* The channel data/eof/close callbacks (also for forwards). */
void ssh_chan_set_callbacks(struct ssh_chan *ch);

/* forward.c */
/* What server.c's message callback passes on: direct-tcpip channel opens;
 * returns 1 for every other message, which libssh then answers by default
 * (refusal). */
int ssh_forward_message(ssh_session session, ssh_message msg, void *userdata);
#endif

#endif
