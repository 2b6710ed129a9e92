/* ssh/server.c: the SSH listeners (one per node), the host keys, public-key
 * login against the workload specs, the failed-login rate limit and the
 * per-connection event loop (see ssh.h). */
#define GPURENT_SSH_INTERNAL
#include "gpurent/secrets.h"
#include "ssh/ssh.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpurent/clock.h"
#include "gpurent/conf.h"


#define HOST_KEY_FILE "ssh_host_ed25519_key"

/* Loads the node's host key, or makes one at first start and keeps it
 * (0600, written atomically) so clients that pinned it keep trusting the
 * node across restarts. Returns the private key in base64 (PEM-like
 * OpenSSH format) for the caller to free, or NULL (logged). */
static char *host_key_load(const char *dir, const char *node)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, HOST_KEY_FILE) >= (int)sizeof path)
        return NULL;
    size_t len = 0;
    char *text = state_read_file(path, 64 * 1024, &len);
    if (text) {
        ssh_key key = NULL;
        if (ssh_pki_import_privkey_base64(text, NULL, NULL, NULL, &key) == SSH_OK &&
            ssh_key_type(key) == SSH_KEYTYPE_ED25519) {
            ssh_key_free(key);
            return text;
        }
        ssh_key_free(key);
        log_error("node %s: %s is not an ed25519 private key; move it away to make a new one", node, path);
        free(text);
        return NULL;
    }
    if (errno != ENOENT) {
        log_error("node %s: cannot read %s: %s", node, path, strerror(errno));
        return NULL;
    }
    ssh_key key = NULL;
    char *b64 = NULL;
    if (ssh_pki_generate(SSH_KEYTYPE_ED25519, 0, &key) != SSH_OK ||
        ssh_pki_export_privkey_base64(key, NULL, NULL, NULL, &b64) != SSH_OK) {
        log_error("node %s: cannot generate an ed25519 host key", node);
        ssh_key_free(key);
        return NULL;
    }
    ssh_key_free(key);
    if (state_mkdirs(dir) < 0 || state_write_atomic(dir, HOST_KEY_FILE, b64, strlen(b64), 0600) < 0) {
        log_error("node %s: cannot save the host key in %s: %s", node, dir, strerror(errno));
        ssh_string_free_char(b64);
        return NULL;
    }
    log_info("node %s: made a new SSH host key %s", node, path);
    char *copy = strdup(b64);
    ssh_string_free_char(b64);
    return copy;
}

/* "SHA256:..." exactly as ssh-keygen -l prints it. */
static int key_fingerprint(const ssh_key key, char *out, size_t outlen)
{
    unsigned char *hash = NULL;
    size_t hlen = 0;
    out[0] = '\0';
    if (ssh_get_publickey_hash(key, SSH_PUBLICKEY_HASH_SHA256, &hash, &hlen) != 0)
        return -1;
    char *fp = ssh_get_fingerprint_hash(SSH_PUBLICKEY_HASH_SHA256, hash, hlen);
    ssh_clean_pubkey_hash(&hash);
    if (!fp)
        return -1;
    snprintf(out, outlen, "%s", fp);
    ssh_string_free_char(fp);
    return 0;
}

static int listen_socket(const char *host, int port, int *bound_port)
{
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    int rc = getaddrinfo(host[0] ? host : NULL, portstr, &hints, &res);
    if (rc != 0) {
        log_error("ssh_listen %s:%d: %s", host, port, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0)
            break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        log_error("ssh_listen %s:%d: cannot listen: %s", host, port, strerror(errno));
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    char ignored[8], serv[16];
    getnameinfo((struct sockaddr *)&ss, sl, ignored, 0, serv, sizeof serv, NI_NUMERICSERV);
    *bound_port = atoi(serv);
    return fd;
}

/* The failed-login table: one-minute windows per client address. */
static struct ssh_fail_entry *fail_entry(struct ssh_server *s, const char *addr, int create, int64_t now)
{
    struct ssh_fail_entry *oldest = &s->fails[0];
    for (size_t i = 0; i < SSH_FAIL_TABLE; i++) {
        struct ssh_fail_entry *e = &s->fails[i];
        if (e->addr[0] && strcmp(e->addr, addr) == 0) {
            if (now - e->window_ms >= 60000) {
                e->window_ms = now;
                e->failures = 0;
            }
            return e;
        }
        if (!e->addr[0] || e->window_ms < oldest->window_ms)
            oldest = e;
    }
    if (!create)
        return NULL;
    snprintf(oldest->addr, sizeof oldest->addr, "%s", addr);
    oldest->window_ms = now;
    oldest->failures = 0;
    return oldest;
}

static int over_rate(struct ssh_server *s, const char *addr)
{
    pthread_mutex_lock(&s->lock);
    struct ssh_fail_entry *e = fail_entry(s, addr, 0, clock_mono_ms());
    int over = e && e->failures >= s->agent->conf->ssh_login_rate;
    pthread_mutex_unlock(&s->lock);
    return over;
}

/* The startup entry of addr at listener l, made if need be; NULL when the
 * table is full of others' connections. Per node: pdsh on rank 0 opens
 * one connection to every node at once, from one address (in a sim fleet,
 * to one agent). Called with s->lock held. */
static struct ssh_startup *startup_entry(struct ssh_server *s, const struct ssh_listener *l, const char *addr)
{
    struct ssh_startup *free_one = NULL;
    for (size_t i = 0; i < SSH_FAIL_TABLE; i++) {
        struct ssh_startup *e = &s->startups[i];
        if (e->count > 0 && e->listener == l && strcmp(e->addr, addr) == 0)
            return e;
        if (e->count == 0 && !free_one)
            free_one = e;
    }
    if (free_one) {
        free_one->listener = l;
        snprintf(free_one->addr, sizeof free_one->addr, "%s", addr);
    }
    return free_one;
}

/* A connection counted as starting has logged in or ended. */
static void startup_done(struct ssh_conn *c)
{
    pthread_mutex_lock(&c->srv->lock);
    if (c->startup) {
        struct ssh_startup *e = startup_entry(c->srv, c->listener, c->addr);
        if (e && e->count > 0)
            e->count--;
        c->listener->starting--;
        c->startup = 0;
    }
    pthread_mutex_unlock(&c->srv->lock);
}

static void count_failure(struct ssh_server *s, const char *addr)
{
    pthread_mutex_lock(&s->lock);
    fail_entry(s, addr, 1, clock_mono_ms())->failures++;
    pthread_mutex_unlock(&s->lock);
}

/* The workload whose ssh.user is user, not being removed; node lock held. */
static struct workload *workload_of_user(struct agent_node *n, const char *user)
{
    for (size_t i = 0; i < n->n_wl; i++) {
        struct workload *w = n->wl[i];
        if (!w->removing && w->spec.ssh.present && strcmp(w->spec.ssh.user, user) == 0)
            return w;
    }
    return NULL;
}

struct workload *ssh_conn_workload(struct ssh_conn *c)
{
    struct workload *w = agent_node_workload(c->listener->node, c->wl_id);
    if (!w || w->removing || w->phase != WL_RUNNING || !w->spec.ssh.present || strcmp(w->spec.ssh.user, c->user))
        return NULL;
    /* The keys were replaced since it last looked (the owner removed a key
     * from the account): a connection whose key went with them is over. */
    if (w->ssh_keys_gen != c->keys_gen) {
        int held = 0;
        for (int i = 0; i < w->spec.ssh.n_keys && !held && c->key_line; i++)
            held = strcmp(w->spec.ssh.keys[i], c->key_line) == 0;
        if (!held) {
            c->key_removed = 1;
            return NULL;
        }
        c->keys_gen = w->ssh_keys_gen;
    }
    return w;
}

/* Whether a renter's key is of a kind the control plane takes
 * (domain/ssh_keys.c): ed25519, ECDSA, or RSA of RSA_MIN_BITS or more;
 * a spec written by hand, or before that rule, may list DSA or a short RSA
 * key, which must not log in all the same. NULL, or why not. */
#define RSA_MIN_BITS 2048
static const char *key_refused(const ssh_key key)
{
    enum ssh_keytypes_e t = ssh_key_type(key);
    if (t == SSH_KEYTYPE_ED25519 || t == SSH_KEYTYPE_ECDSA_P256 || t == SSH_KEYTYPE_ECDSA_P384 ||
        t == SSH_KEYTYPE_ECDSA_P521)
        return NULL;
    if (t != SSH_KEYTYPE_RSA)
        return "the key's type is not taken (ed25519, ECDSA or RSA only)";
    /* The blob is string "ssh-rsa", mpint e, mpint n: n's bits. */
    char *b64 = NULL;
    if (ssh_pki_export_pubkey_base64(key, &b64) != SSH_OK)
        return "the key cannot be read";
    size_t len = strlen(b64);
    unsigned char *blob = malloc(len);
    int n = blob ? base64_decode(b64, len, blob) : -1;
    ssh_string_free_char(b64);
    int64_t bits = 0;
    size_t at = 0;
    for (int field = 0; n > 0 && field < 3; field++) {
        if ((size_t)n - at < 4)
            break;
        uint32_t flen = (uint32_t)blob[at] << 24 | (uint32_t)blob[at + 1] << 16 | (uint32_t)blob[at + 2] << 8 |
                        blob[at + 3];
        at += 4;
        if (flen > (size_t)n - at)
            break;
        if (field == 2) {
            size_t i = at, end = at + flen;
            while (i < end && blob[i] == 0)
                i++;
            if (i < end) {
                bits = (int64_t)(end - i) * 8;
                for (unsigned char top = blob[i]; !(top & 0x80); top <<= 1)
                    bits--;
            }
        }
        at += flen;
    }
    free(blob);
    return bits >= RSA_MIN_BITS ? NULL : "the RSA key is shorter than 2048 bits";
}

/* Failed login attempts count toward ssh_max_auth_tries as OpenSSH's
 * sshd counts them toward MaxAuthTries: every attempt that fails, by any
 * method, but for a first "none" (a client sends it to learn the methods).
 * A key offered counts once, its probe and its signature together, and
 * also when it may be used (a client holding many keys, or a public key
 * without its private half, gets ssh_max_auth_tries in all). The failure
 * that reaches the limit ends the connection: conn_run closes it with
 * sshd's "Too many authentication failures", and it counts against its
 * address as a refused login does (ssh_login_rate). Before, only keys
 * counted, and a client could try "none", passwords or requests libssh
 * drops for as long as the login timeout let it. */
static void tries_spent(struct ssh_conn *c)
{
    c->refused = 1;
    if (c->too_many || c->tries < c->srv->agent->conf->ssh_max_auth_tries)
        return;
    c->too_many = 1;
    /* libssh answers every key its callback refuses; without the callback
     * public-key requests reach conn_message, which leaves them unanswered
     * (else a client's next key, read before the close, was refused and
     * the client gave up without reading why). */
    c->server_cb.auth_pubkey_function = NULL;
    log_warn("ssh refused: node %s user %.80s from %s:%d: too many authentication failures (%lld,"
             " ssh_max_auth_tries)",
             c->listener->node->name, c->user[0] ? c->user : "-", c->addr, c->port,
             (long long)c->srv->agent->conf->ssh_max_auth_tries);
}

/* libssh drops some login requests with neither an answer nor a
 * callback: a key of a type it cannot read, a signature that does not
 * verify or is of an algorithm not offered. They are failed attempts all
 * the same (each a signature checked), seen only in libssh's counts of
 * packets: before login libssh takes nothing but service and login
 * requests, which it answers, and messages that want no answer (ignore,
 * debug, unimplemented, ext-info; a key re-exchange or a global request
 * is a protocol error). So each client packet left unanswered counts as a
 * failed attempt, past SSH_UNANSWERED_FREE of them for those messages.
 * answering: 1 from a callback whose request libssh answers once it
 * returns. */
#define SSH_UNANSWERED_FREE 8
static void count_unanswered(struct ssh_conn *c, int answering)
{
    int64_t unanswered = (int64_t)c->packets.in_packets - (int64_t)c->packets.out_packets - answering -
                         SSH_UNANSWERED_FREE;
    if (c->authenticated || unanswered <= c->unanswered_counted)
        return;
    c->tries += unanswered - c->unanswered_counted;
    c->unanswered_counted = unanswered;
    tries_spent(c);
}

/* The name of a login method, as the client sent it (RFC 4252). */
static const char *method_name(int method)
{
    switch (method) {
    case SSH_AUTH_METHOD_NONE:
        return "none";
    case SSH_AUTH_METHOD_PASSWORD:
        return "password";
    case SSH_AUTH_METHOD_HOSTBASED:
        return "hostbased";
    case SSH_AUTH_METHOD_INTERACTIVE:
        return "keyboard-interactive";
    case SSH_AUTH_METHOD_GSSAPI_MIC:
        return "gssapi-with-mic";
    default:
        return "an unknown method";
    }
}

/* Every message the other callbacks do not take: a login request by
 * another method than a public key, refused (libssh answers with the
 * methods there are: publickey) and counted; the rest is forward.c's.
 * Once the tries are spent nothing more is answered. */
static int conn_message(ssh_session session, ssh_message msg, void *userdata)
{
    struct ssh_conn *c = userdata;
    if (c->too_many)
        return 0;
    if (ssh_message_type(msg) != SSH_REQUEST_AUTH)
        return ssh_forward_message(session, msg, userdata);
    if (c->authenticated)
        return 1;
    count_unanswered(c, 1);
    if (c->too_many)
        return 0;
    int method = ssh_message_subtype(msg), first = c->requests++ == 0;
    if (method == SSH_AUTH_METHOD_NONE && first)
        return 1;
    const char *user = ssh_message_auth_user(msg);
    snprintf(c->user, sizeof c->user, "%s", user ? user : "");
    log_warn("ssh refused: node %s user %.80s from %s:%d: %s login (public keys only)", c->listener->node->name,
             c->user, c->addr, c->port, method_name(method));
    c->tries++;
    tries_spent(c);
    return c->too_many ? 0 : 1; /* the attempt that spends them gets no answer but the close, as from sshd */
}

/* Public-key login: libssh calls this once without a signature (may this
 * key be used?) and once with a verified one. Every refusal looks the same
 * to the client; the log says why. */
static int auth_pubkey(ssh_session session, const char *user, struct ssh_key_struct *pubkey, char signature_state,
                       void *userdata)
{
    struct ssh_conn *c = userdata;
    struct agent_node *n = c->listener->node;
    c->requests++;
    count_unanswered(c, 1);
    if (c->too_many)
        return SSH_AUTH_DENIED;
    snprintf(c->user, sizeof c->user, "%s", user);
    key_fingerprint(pubkey, c->fingerprint, sizeof c->fingerprint);
    int answers_probe = signature_state != SSH_PUBLICKEY_STATE_NONE && strcmp(c->fingerprint, c->probed) == 0;
    if (!answers_probe)
        c->tries++;
    snprintf(c->probed, sizeof c->probed, "%s", signature_state == SSH_PUBLICKEY_STATE_NONE ? c->fingerprint : "");
    if (c->tries > c->srv->agent->conf->ssh_max_auth_tries) {
        /* Another key after one that might have been used at the limit. */
        tries_spent(c);
        return SSH_AUTH_DENIED;
    }
    if (signature_state != SSH_PUBLICKEY_STATE_NONE && signature_state != SSH_PUBLICKEY_STATE_VALID) {
        log_warn("ssh refused: node %s user %.80s key %s from %s: bad signature", n->name, user, c->fingerprint,
                 c->addr);
        tries_spent(c);
        return SSH_AUTH_DENIED;
    }
    const char *why = NULL;
    char wl_id[AGENT_NAME_MAX] = "";
    char *key_line = NULL; /* the workload's line of the key, kept by a connection that logs in */
    int64_t keys_gen = 0;
    pthread_mutex_lock(&n->lock);
    struct workload *w = workload_of_user(n, user);
    if (!w) {
        why = "no workload has this user";
    } else if (w->phase != WL_RUNNING) {
        why = "the workload is not running";
    } else if (!(why = key_refused(pubkey))) {
        why = "the key is not one of the workload's";
        for (int i = 0; i < w->spec.ssh.n_keys && why; i++) {
            ssh_key k = NULL;
            if (spec_ssh_key_import(w->spec.ssh.keys[i], &k) == 0 && ssh_key_cmp(k, pubkey, SSH_KEY_CMP_PUBLIC) == 0) {
                why = NULL;
                if (signature_state != SSH_PUBLICKEY_STATE_NONE && !(key_line = strdup(w->spec.ssh.keys[i])))
                    why = "out of memory";
            }
            ssh_key_free(k);
        }
        keys_gen = w->ssh_keys_gen;
        snprintf(wl_id, sizeof wl_id, "%s", w->id);
    }
    pthread_mutex_unlock(&n->lock);
    if (why) {
        free(key_line);
        log_warn("ssh refused: node %s user %.80s key %s from %s:%d: %s", n->name, user, c->fingerprint, c->addr,
                 c->port, why);
        tries_spent(c);
        return SSH_AUTH_DENIED;
    }
    if (signature_state == SSH_PUBLICKEY_STATE_NONE)
        return SSH_AUTH_SUCCESS; /* the key may be used: the client signs next */
    /* One renter's connections may not take every slot of a node that
     * others rent too. */
    int64_t cap = c->srv->agent->conf->ssh_max_sessions_per_workload, held = 0;
    pthread_mutex_lock(&c->srv->lock);
    for (const struct ssh_conn *o = c->srv->conns; o; o = o->next)
        held += o->listener == c->listener && o->authenticated && strcmp(o->wl_id, wl_id) == 0;
    if (held < cap) {
        snprintf(c->wl_id, sizeof c->wl_id, "%s", wl_id);
        free(c->key_line);
        c->key_line = key_line;
        key_line = NULL;
        c->keys_gen = keys_gen;
        c->authenticated = 1;
    }
    pthread_mutex_unlock(&c->srv->lock);
    free(key_line);
    if (!c->authenticated) {
        log_warn("ssh refused: node %s workload %s user %.80s from %s:%d: %lld connections to it already"
                 " (ssh_max_sessions_per_workload)",
                 n->name, wl_id, user, c->addr, c->port, (long long)held);
        ssh_disconnect(session);
        return SSH_AUTH_DENIED;
    }
    startup_done(c);
    log_info("ssh login: node %s workload %s user %s key %s from %s:%d", n->name, wl_id, user, c->fingerprint, c->addr,
             c->port);
    return SSH_AUTH_SUCCESS;
}

/* Whether the client's socket takes more bytes, waiting up to 200 ms for
 * it to. What the kernel cannot take waits in libssh's memory, with no
 * bound, and libssh answers many requests whether or not the client reads
 * the answers (a login by "none" or a key type it does not know, a global
 * request, an unknown message): a client that sent them and read nothing,
 * not even logged in, grew the agent by its own upload rate (250 MB in
 * 20 s from one connection). The connection's input is read only while
 * the socket takes its output, so such a client stalls in the kernel's
 * buffers, as TCP would stall it against a server that reads no more. A
 * client that reads, however slowly, is read as it does; one that went
 * away is found by keepalive or its reset (POLLERR, POLLHUP). */
static int client_takes_bytes(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    return poll(&p, 1, 200) != 0;
}

/* Closes a connection whose tries are spent, with the reason. libssh
 * writes a packet at once only when its last poll found the socket
 * writable and it wrote nothing since; else it queues the packet, and
 * ssh_disconnect closes the socket with it unsent (a client just answered
 * never saw why). So it polls first, while the client takes bytes, until
 * a poll finds nothing to do: what was queued is written and the socket
 * seen writable. A few polls at most; input read meanwhile is not
 * answered. A client that reads nothing misses the reason, which is of no
 * matter. */
static void close_too_many(struct ssh_conn *c)
{
    ssh_session_set_disconnect_message(c->session, "Too many authentication failures");
    for (int i = 0; i < 8 && client_takes_bytes(c->fd); i++)
        if (ssh_event_dopoll(c->event, 0) == SSH_AGAIN)
            break;
    ssh_disconnect(c->session);
}

static void conn_run(struct ssh_conn *c)
{
    const struct agent_conf *conf = c->srv->agent->conf;
    long timeout = (long)conf->ssh_auth_timeout_s;
    ssh_options_set(c->session, SSH_OPTIONS_TIMEOUT, &timeout);
    c->server_cb.userdata = c;
    c->server_cb.auth_pubkey_function = auth_pubkey;
    c->server_cb.channel_open_request_session_function = ssh_session_open;
    ssh_callbacks_init(&c->server_cb);
    ssh_set_server_callbacks(c->session, &c->server_cb);
    ssh_set_message_callback(c->session, conn_message, c);
    ssh_set_auth_methods(c->session, SSH_AUTH_METHOD_PUBLICKEY);
    if (ssh_handle_key_exchange(c->session) != SSH_OK) {
        log_info("ssh: node %s from %s:%d: key exchange failed: %s", c->listener->node->name, c->addr, c->port,
                 ssh_get_error(c->session));
        c->refused = 1; /* a connection that never speaks counts against its address too */
        return;
    }
    /* Non-blocking from here on: in a blocking session every channel
     * write, EOF and close waits (up to the session's timeout) for libssh
     * to pass all it holds to the kernel, and reads and answers the
     * client's requests while it waits, so a client with a channel's
     * output pending that read nothing was still read, its answers kept,
     * whatever client_takes_bytes said. What libssh cannot pass to the
     * kernel now it sends as the socket takes it (its poll in
     * ssh_event_dopoll). */
    ssh_set_blocking(c->session, 0);
    ssh_set_counters(c->session, NULL, &c->packets);
    c->event = ssh_event_new();
    if (!c->event || ssh_event_add_session(c->event, c->session) != SSH_OK)
        return;
    int64_t auth_deadline = clock_mono_ms() + conf->ssh_auth_timeout_s * 1000, next_workload_check = 0;
    c->last_activity_ms = clock_mono_ms();
    while (!atomic_load(&c->srv->stopping)) {
        int takes = client_takes_bytes(c->fd);
        if (takes && ssh_event_dopoll(c->event, 200) == SSH_ERROR && !ssh_is_connected(c->session))
            break;
        /* A packet libssh could not take (a bad MAC, a length out of
         * bounds) leaves the session in its error state but connected, and
         * its socket read on: every byte the client sent after it was kept
         * in libssh's input buffer, unprocessed, until the login timeout,
         * or for ever once logged in. Such a session is over. */
        if (ssh_get_status(c->session) & SSH_CLOSED_ERROR) {
            log_warn("ssh: node %s workload %s user %.80s from %s:%d: protocol error, closed: %s",
                     c->listener->node->name, c->wl_id[0] ? c->wl_id : "-", c->user[0] ? c->user : "-", c->addr,
                     c->port, ssh_get_error(c->session));
            c->refused = !c->authenticated;
            break;
        }
        count_unanswered(c, 0);
        if (c->too_many) {
            close_too_many(c);
            break;
        }
        /* The pumps too: libssh reads the socket when asked whether a
         * channel holds data (ssh_channel_poll), a few KiB per channel and
         * pass, so they wait with the rest for the client to read. */
        for (int i = 0; takes && i < c->n_chans; i++)
            ssh_chan_pump(c->chans[i]);
        ssh_conn_drop_finished(c);
        if (!ssh_is_connected(c->session))
            break;
        int64_t now = clock_mono_ms();
        if (!c->authenticated && now >= auth_deadline) {
            log_warn("ssh refused: node %s user %.80s from %s:%d: no login within %lld s", c->listener->node->name,
                     c->user, c->addr, c->port, (long long)conf->ssh_auth_timeout_s);
            c->refused = 1;
            break;
        }
        /* A logged-in connection lasts as long as its workload runs: once
         * the instance stops (and its renter stops paying), its cards and
         * this node's slots are someone else's. */
        if (c->authenticated && now >= next_workload_check) {
            next_workload_check = now + 1000;
            struct agent_node *n = c->listener->node;
            pthread_mutex_lock(&n->lock);
            int running = ssh_conn_workload(c) != NULL;
            pthread_mutex_unlock(&n->lock);
            if (!running && c->key_removed) {
                log_info("ssh: node %s workload %s user %s from %s:%d: key %s was removed from the workload's keys,"
                         " closed",
                         n->name, c->wl_id, c->user, c->addr, c->port, c->fingerprint);
                break;
            }
            if (!running) {
                log_info("ssh: node %s workload %s user %s from %s:%d: the workload no longer runs, closed", n->name,
                         c->wl_id, c->user, c->addr, c->port);
                break;
            }
        }
        if (conf->ssh_idle_timeout_s > 0 && now - c->last_activity_ms >= conf->ssh_idle_timeout_s * 1000) {
            log_info("ssh: node %s workload %s from %s:%d: idle for %lld s, closed", c->listener->node->name, c->wl_id,
                     c->addr, c->port, (long long)conf->ssh_idle_timeout_s);
            break;
        }
    }
    /* Each finished channel has sent its status; let it reach the client. */
    if (ssh_is_connected(c->session))
        ssh_event_dopoll(c->event, 0);
}

static void *conn_main(void *arg)
{
    struct ssh_conn *c = arg;
    struct ssh_server *s = c->srv;
    conn_run(c);
    pthread_mutex_lock(&s->lock); /* before its socket closes: stop may no longer touch it */
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    int evicted = c->evicted;
    pthread_mutex_unlock(&s->lock);
    startup_done(c);
    if (!c->authenticated && (c->refused || evicted))
        count_failure(s, c->addr);
    for (int i = 0; i < c->n_chans; i++)
        ssh_chan_free(c->chans[i]);
    if (c->authenticated)
        log_info("ssh: node %s workload %s user %s from %s:%d: disconnected", c->listener->node->name, c->wl_id,
                 c->user, c->addr, c->port);
    if (c->event) {
        ssh_event_remove_session(c->event, c->session);
        ssh_event_free(c->event);
    }
    ssh_disconnect(c->session);
    ssh_free(c->session);
    free(c->key_line);
    pthread_mutex_lock(&s->lock);
    c->listener->active--;
    s->connections--;
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->lock);
    free(c);
    return NULL;
}

/* TCP keepalive on a client's connection, as sshd's TCPKeepAlive: a
 * client that vanished without a FIN (a laptop shut, a NAT that forgot the
 * flow, a cable pulled) sends nothing more, and an idle shell sends
 * nothing either, so without probes its connection, its processes and its
 * slot of ssh_max_sessions_per_workload stayed for ever, and a renter
 * whose network dropped that many times was locked out of the workload.
 * Probes after a minute of silence, every 15 s, four unanswered: gone in
 * two minutes. Only silence counts: a client that is there but reads
 * slowly still answers them. */
static void keep_alive(int fd)
{
    int on = 1, idle = 60, interval = 15, count = 4;
    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) < 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) < 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval) < 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count) < 0)
        log_warn("ssh: cannot turn TCP keepalive on: %s", strerror(errno));
}

static void accept_one(struct ssh_listener *l)
{
    struct ssh_server *s = l->srv;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(l->fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
    if (fd < 0)
        return;
    keep_alive(fd);
    char addr[64] = "?", serv[16] = "0";
    getnameinfo((struct sockaddr *)&ss, sl, addr, sizeof addr, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV);
    if (over_rate(s, addr)) {
        log_warn("ssh refused: node %s from %s:%s: more than %lld failed logins in a minute", l->node->name, addr, serv,
                 (long long)s->agent->conf->ssh_login_rate);
        close(fd);
        return;
    }
    /* Connections not logged in yet are capped per address, and per node
     * below the node's cap: silent ones (from one address, or from a few)
     * took every slot and locked the renters out until they timed out. At
     * the node's cap the oldest of them is cut off for the new one, rather
     * than the new one refused: a renter logs in within moments, so silent
     * connections can no longer hold the door, and each cut counts against
     * its address as a failed login does (ssh_login_rate). The same at
     * ssh_max_sessions while any of them holds a slot: logged-in
     * connections and silent ones together filled a busy node (33 logins
     * and 31 silent, under ssh_max_startups, of 64) and the next renter
     * was refused. A connection cut off holds its slot until its thread
     * ends, so the count may pass the cap by those for a moment. */
    const struct agent_conf *conf = s->agent->conf;
    char evicted[64] = "";
    const char *cut_why = NULL; /* the cap at which the oldest was cut off */
    int64_t cut_cap = 0;
    pthread_mutex_lock(&s->lock);
    struct ssh_conn *oldest = NULL; /* not logged in, not cut off yet; new connections go first in the list */
    for (struct ssh_conn *c = s->conns; c; c = c->next)
        if (c->listener == l && c->startup && !c->evicted)
            oldest = c;
    int full = l->active >= conf->ssh_max_sessions && !oldest;
    struct ssh_startup *st = full ? NULL : startup_entry(s, l, addr);
    int starting = !full && (!st || st->count >= conf->ssh_max_startups_per_client);
    if (!full && !starting) {
        if (l->active >= conf->ssh_max_sessions) {
            cut_why = "connections (ssh_max_sessions): cut off the oldest not logged in";
            cut_cap = conf->ssh_max_sessions;
        } else if (l->starting >= conf->ssh_max_startups && oldest) {
            cut_why = "connections not logged in yet (ssh_max_startups): cut off the oldest";
            cut_cap = conf->ssh_max_startups;
        }
        if (cut_why) {
            oldest->evicted = 1;
            shutdown(oldest->fd, SHUT_RDWR);
            snprintf(evicted, sizeof evicted, "%s", oldest->addr);
        }
        l->active++;
        l->starting++;
        s->connections++;
        st->count++;
    }
    pthread_mutex_unlock(&s->lock);
    if (cut_why)
        log_warn("ssh: node %s: %lld %s, from %s, for one from %s:%s", l->node->name, (long long)cut_cap, cut_why,
                 evicted, addr, serv);
    if (full || starting) {
        if (full)
            log_warn("ssh refused: node %s from %s:%s: %lld connections already (ssh_max_sessions)", l->node->name,
                     addr, serv, (long long)conf->ssh_max_sessions);
        else
            log_warn("ssh refused: node %s from %s:%s: %lld connections not logged in yet"
                     " (ssh_max_startups_per_client)",
                     l->node->name, addr, serv, (long long)conf->ssh_max_startups_per_client);
        close(fd);
        return;
    }
    struct ssh_conn *c = calloc(1, sizeof *c);
    ssh_session session = c ? ssh_new() : NULL;
    if (session && ssh_bind_accept_fd(l->bind, session, fd) == SSH_OK) {
        c->startup = 1;
        c->fd = fd;
        c->srv = s;
        c->listener = l;
        c->session = session;
        c->port = atoi(serv);
        snprintf(c->addr, sizeof c->addr, "%s", addr);
        pthread_attr_t attr;
        pthread_t t;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_mutex_lock(&s->lock);
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        pthread_mutex_unlock(&s->lock);
        int rc = pthread_create(&t, &attr, conn_main, c);
        pthread_attr_destroy(&attr);
        if (rc == 0)
            return;
        pthread_mutex_lock(&s->lock);
        s->conns = c->next;
        if (c->next)
            c->next->prev = NULL;
        pthread_mutex_unlock(&s->lock);
        log_error("ssh: cannot start a connection thread: %s", strerror(rc));
        ssh_free(session); /* closes fd */
    } else {
        log_warn("ssh: node %s from %s:%s: cannot accept: %s", l->node->name, addr, serv,
                 session ? ssh_get_error(l->bind) : "out of memory");
        if (session)
            ssh_free(session);
        close(fd);
    }
    free(c);
    pthread_mutex_lock(&s->lock);
    if ((st = startup_entry(s, l, addr)) && st->count > 0)
        st->count--;
    l->starting--;
    l->active--;
    s->connections--;
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->lock);
}

/* One thread accepts for every node (a sim fleet has hundreds): it polls
 * all the listening sockets together. */
static void *accept_main(void *arg)
{
    struct ssh_server *s = arg;
    struct pollfd *p = calloc(s->n_listeners, sizeof *p);
    if (!p) {
        log_error("ssh: out of memory: no SSH logins are accepted");
        return NULL;
    }
    for (size_t i = 0; i < s->n_listeners; i++)
        p[i] = (struct pollfd){.fd = s->listeners[i].fd, .events = POLLIN};
    while (!atomic_load(&s->stopping)) {
        if (poll(p, (nfds_t)s->n_listeners, 250) <= 0)
            continue;
        for (size_t i = 0; i < s->n_listeners; i++)
            if (p[i].revents & POLLIN)
                accept_one(&s->listeners[i]);
    }
    free(p);
    return NULL;
}

/* The algorithms every connection may use, named rather than left to
 * libssh's defaults: libssh 0.10 sends its default cipher list with a
 * trailing comma (an empty name, which RFC 4251 5 forbids and strict
 * clients refuse), and by default it verifies ssh-dss and SHA-1 ssh-rsa
 * signatures, which OpenSSH's sshd has refused since 8.8. (Short RSA keys
 * are key_refused's: libssh's own RSA_MIN_SIZE fails the signed request
 * without an answer, and the client waited for the login timeout.) Key
 * exchange is by Curve25519 or a fixed MODP group of 2048 bits or more, not
 * the NIST curves nor a group the client may ask to be small; MACs only
 * encrypt-then-MAC. Every OpenSSH since 6.5 has one of each. libssh adds the
 * strict key exchange marker (kex-strict-s-v00, against Terrapin) itself.
 * The version line names gpurent-agent rather than the library's version,
 * which only tells a scanner what to try (and ssh-audit misreads 0.10 as
 * older than 0.7, flagging a CVE fixed in 0.7.3). */
static int bind_algorithms(ssh_bind bind)
{
    static const char kex[] = "curve25519-sha256,curve25519-sha256@libssh.org,diffie-hellman-group16-sha512,"
                              "diffie-hellman-group18-sha512,diffie-hellman-group14-sha256";
    static const char ciphers[] = "chacha20-poly1305@openssh.com,aes256-gcm@openssh.com,aes128-gcm@openssh.com,"
                                  "aes256-ctr,aes192-ctr,aes128-ctr";
    static const char macs[] = "hmac-sha2-256-etm@openssh.com,hmac-sha2-512-etm@openssh.com";
    static const char pubkeys[] = "ssh-ed25519,ecdsa-sha2-nistp256,ecdsa-sha2-nistp384,ecdsa-sha2-nistp521,"
                                  "rsa-sha2-512,rsa-sha2-256";
    return ssh_bind_options_set(bind, SSH_BIND_OPTIONS_BANNER, "gpurent-agent") == SSH_OK &&
                   ssh_bind_options_set(bind, SSH_BIND_OPTIONS_KEY_EXCHANGE, kex) == SSH_OK &&
                   ssh_bind_options_set(bind, SSH_BIND_OPTIONS_CIPHERS_C_S, ciphers) == SSH_OK &&
                   ssh_bind_options_set(bind, SSH_BIND_OPTIONS_CIPHERS_S_C, ciphers) == SSH_OK &&
                   ssh_bind_options_set(bind, SSH_BIND_OPTIONS_HMAC_C_S, macs) == SSH_OK &&
                   ssh_bind_options_set(bind, SSH_BIND_OPTIONS_HMAC_S_C, macs) == SSH_OK &&
                   ssh_bind_options_set(bind, SSH_BIND_OPTIONS_HOSTKEY_ALGORITHMS, "ssh-ed25519") == SSH_OK &&
                   ssh_bind_options_set(bind, SSH_BIND_OPTIONS_PUBKEY_ACCEPTED_KEY_TYPES, pubkeys) == SSH_OK
               ? 0
               : -1;
}

static int listener_open(struct ssh_server *s, struct ssh_listener *l, struct agent_node *n, const char *host, int port)
{
    struct agent *a = s->agent;
    char dir[PATH_MAX];
    l->srv = s;
    l->node = n;
    l->fd = -1;
    if (agent_node_dir(a, n, dir, sizeof dir) < 0)
        return -1;
    char *priv = host_key_load(dir, n->name);
    if (!priv)
        return -1;
    ssh_key key = NULL, bind_key = NULL;
    char *pub = NULL;
    int rc = -1;
    if (ssh_pki_import_privkey_base64(priv, NULL, NULL, NULL, &key) != SSH_OK ||
        ssh_pki_import_privkey_base64(priv, NULL, NULL, NULL, &bind_key) != SSH_OK ||
        ssh_pki_export_pubkey_base64(key, &pub) != SSH_OK) {
        log_error("node %s: cannot use its SSH host key", n->name);
        goto out;
    }
    snprintf(n->ssh_host_key, sizeof n->ssh_host_key, "ssh-ed25519 %s", pub);
    key_fingerprint(key, n->ssh_fingerprint, sizeof n->ssh_fingerprint);
    l->bind = ssh_bind_new();
    /* The bind owns bind_key from here on. */
    if (!l->bind || ssh_bind_options_set(l->bind, SSH_BIND_OPTIONS_IMPORT_KEY, bind_key) != SSH_OK) {
        ssh_key_free(bind_key);
        log_error("node %s: cannot set up libssh", n->name);
        goto out;
    }
    if (bind_algorithms(l->bind) < 0) {
        log_error("node %s: cannot set libssh's algorithms", n->name);
        goto out;
    }
    int bound = 0;
    if ((l->fd = listen_socket(host, port, &bound)) < 0)
        goto out;
    n->ssh_port = bound;
    log_info("node %s: SSH on %s:%d, host key %s", n->name, host, bound, n->ssh_fingerprint);
    rc = 0;
out:
    ssh_key_free(key);
    ssh_string_free_char(pub);
    memset(priv, 0, strlen(priv));
    free(priv);
    return rc;
}

int ssh_server_start(struct agent *a, struct ssh_server **out)
{
    *out = NULL;
    const struct agent_conf *conf = a->conf;
    if (!conf->ssh_listen[0]) {
        log_info("ssh_listen is empty: no SSH server");
        return 0;
    }
    char host[128];
    int port = 0;
    conf_parse_hostport(conf->ssh_listen, host, sizeof host, &port);
    if (port > 0 && (size_t)port + a->n_nodes - 1 > 65535) {
        log_error("ssh_listen port %d + %zu nodes goes past 65535", port, a->n_nodes);
        return -1;
    }
    struct ssh_server *s = calloc(1, sizeof *s);
    if (!s || !(s->listeners = calloc(a->n_nodes, sizeof *s->listeners))) {
        free(s);
        return -1;
    }
    s->agent = a;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->idle, NULL);
    for (size_t i = 0; i < a->n_nodes; i++) {
        s->n_listeners++;
        if (listener_open(s, &s->listeners[i], &a->nodes[i], host, port > 0 ? port + (int)i : 0) < 0) {
            ssh_server_stop(s);
            return -1;
        }
    }
    int rc = pthread_create(&s->accept_thread, NULL, accept_main, s);
    if (rc != 0) {
        log_error("ssh: cannot start the accept thread: %s", strerror(rc));
        ssh_server_stop(s);
        return -1;
    }
    s->accept_started = 1;
    *out = s;
    return 0;
}

void ssh_server_stop(struct ssh_server *s)
{
    if (!s)
        return;
    atomic_store(&s->stopping, 1);
    if (s->accept_started)
        pthread_join(s->accept_thread, NULL);
    /* Connection threads see stopping within one poll and end. One
     * blocked writing to a client that stopped reading (libssh waits for
     * its window up to ssh_auth_timeout_s) is cut off: its write fails. */
    pthread_mutex_lock(&s->lock);
    for (struct ssh_conn *c = s->conns; c; c = c->next)
        shutdown(c->fd, SHUT_RDWR);
    while (s->connections > 0)
        pthread_cond_wait(&s->idle, &s->lock);
    pthread_mutex_unlock(&s->lock);
    for (size_t i = 0; i < s->n_listeners; i++) {
        struct ssh_listener *l = &s->listeners[i];
        if (l->fd >= 0)
            close(l->fd);
        if (l->bind)
            ssh_bind_free(l->bind);
        l->node->ssh_port = 0;
    }
    pthread_cond_destroy(&s->idle);
    pthread_mutex_destroy(&s->lock);
    free(s->listeners);
    free(s);
}
