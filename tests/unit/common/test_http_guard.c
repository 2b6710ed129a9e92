/* test_http_guard.c: the request guard's parser (http_guard_scan) follows
 * pipelined requests through heads, Content-Length bodies, chunks,
 * extensions and trailers, whatever the reads' sizes; it refuses a NUL
 * byte in a head, a malformed chunk size, a chunk longer than its size and
 * a head over HTTP_GUARD_HEAD_MAX or with more than HTTP_GUARD_FIELDS_MAX
 * header (or trailer) fields, a request line over that cap or with more
 * than HTTP_GUARD_PARAMS_MAX query parameters (414), a malformed request
 * line as soon as it ends, a malformed header line, a Content-Length that
 * is not one number and an HTTP version but 1.0 and 1.1, passing on only
 * the requests before the refused one; and it checks nothing after an
 * upgrade or a framing the HTTP layer refuses itself. Over TLS (a GnuTLS
 * session pair on a socketpair) the guard reads the plaintext of the
 * session registered with the socket, answers through it, and leaves any
 * other session, and the socket's ciphertext, alone. */
#include "gpurent/http_guard.h"

#include <gnutls/gnutls.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

struct outcome {
    size_t passed; /* bytes handed on in all */
    int refused, status;
    const char *code;
};

/* Feeds len bytes in reads of at most step bytes, as recv() would. */
static struct outcome feed(const char *p, size_t len, size_t step)
{
    struct http_guard g = {0};
    struct outcome o = {0};
    for (size_t off = 0; off < len && !g.refused; off += step) {
        size_t n = len - off < step ? len - off : step;
        o.passed += http_guard_scan(&g, p + off, n);
    }
    o.refused = g.refused;
    o.status = g.status;
    o.code = g.code;
    http_guard_release(&g);
    return o;
}

static const size_t steps[] = {1, 2, 3, 7, 64, 1 << 20};
#define FOR_EACH_STEP for (size_t si = 0, step; si < sizeof steps / sizeof steps[0] && (step = steps[si], 1); si++)

static void assert_passes(const char *p, size_t len)
{
    FOR_EACH_STEP {
        struct outcome o = feed(p, len, step);
        assert_int_equal(o.refused, 0);
        assert_int_equal(o.passed, len);
    }
}

/* Refused with status and code, however it is read; in one read, what
 * passes ends where the refused request began (read piecemeal, the start
 * of the request may have gone on before the fault came). */
static void assert_refused(const char *p, size_t len, int status, const char *code, size_t begins)
{
    FOR_EACH_STEP {
        struct outcome o = feed(p, len, step);
        assert_int_equal(o.refused, 1);
        assert_int_equal(o.status, status);
        assert_string_equal(o.code, code);
    }
    assert_int_equal(feed(p, len, len).passed, begins);
}

#define S(lit) lit, sizeof lit - 1

static void test_pipelined_requests_and_bodies_pass(void **state)
{
    (void)state;
    assert_passes(S("GET / HTTP/1.1\r\nHost: x\r\n\r\n"
                    "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhe\0lo"
                    "\r\n\r\nGET /b HTTP/1.1\nHost: x\n\n"));
    assert_passes(S("POST /c HTTP/1.1\r\nHost: x\r\ntransfer-encoding:  Chunked \r\n\r\n"
                    "5;name=value\r\nhel\0o\r\nA \r\n0123456789\r\n0\r\nX-Trailer: 1\r\n\r\n"
                    "GET /d HTTP/1.0\r\n\r\n"));
}

static void test_a_nul_in_a_head_is_refused(void **state)
{
    (void)state;
    assert_refused(S("GET /v1/me\0admin HTTP/1.1\r\nHost: x\r\n\r\n"), 400, "bad_request", 0);
    assert_refused(S("GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /x HTTP/1.1\r\nX-A: a\0b\r\n\r\n"), 400, "bad_request", 27);
    assert_refused(S("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T: \0\r\n\r\n"), 400,
                   "bad_request", 0);
}

static void test_malformed_chunks_are_refused(void **state)
{
    (void)state;
    const char *bad[] = {"zz\r\n", "\r\n", "5 x\r\n", "-1\r\n", "0x5\r\n", "1000000000000000000\r\n", "5\0\r\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char req[256];
        static const char head[] = "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
        size_t hl = sizeof head - 1, bl = strlen(bad[i]) + (i == 6 ? 3 : 0);
        memcpy(req, head, hl);
        memcpy(req + hl, bad[i], bl);
        assert_refused(req, hl + bl, 400, "bad_request", 0);
    }
    assert_refused(S("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n"), 400,
                   "bad_request", 0);
    char line[300] = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;";
    size_t n = strlen(line);
    memset(line + n, 'e', 200);
    assert_refused(line, n + 200, 400, "bad_request", 0);
}

static void test_a_head_over_the_cap_is_431(void **state)
{
    (void)state;
    size_t len = HTTP_GUARD_HEAD_MAX + 100;
    char *req = malloc(len);
    memcpy(req, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: ", 32);
    memset(req + 32, 'a', len - 32);
    assert_refused(req, len, 431, "headers_too_large", 0);
    /* Just under the cap, and whole, it passes. */
    size_t ok = HTTP_GUARD_HEAD_MAX - 4;
    memcpy(req + ok, "\r\n\r\n", 4);
    assert_passes(req, ok + 4);
    free(req);
}

static void test_a_request_line_over_the_cap_is_414(void **state)
{
    (void)state;
    size_t len = HTTP_GUARD_HEAD_MAX + 100;
    char *req = malloc(len);
    memcpy(req, "GET /", 5);
    memset(req + 5, 'a', len - 5);
    assert_refused(req, len, 414, "uri_too_long", 0);
    free(req);
}

/* A GET of the given number of query parameters (p0=1&p1=1 …), in buf. */
static size_t with_params(char *buf, int params)
{
    size_t n = (size_t)sprintf(buf, "GET /v1/instances");
    for (int i = 0; i < params; i++)
        n += (size_t)sprintf(buf + n, "%cp%d=1", i ? '&' : '?', i);
    return n + (size_t)sprintf(buf + n, " HTTP/1.1\r\nHost: x\r\n\r\n");
}

static void test_more_than_the_cap_of_query_parameters_is_414(void **state)
{
    (void)state;
    char *req = malloc(64 * 1024);
    assert_passes(req, with_params(req, 0));
    assert_passes(req, with_params(req, HTTP_GUARD_PARAMS_MAX));
    assert_refused(req, with_params(req, HTTP_GUARD_PARAMS_MAX + 1), 414, "uri_too_long", 0);
    assert_refused(req, with_params(req, 3000), 414, "uri_too_long", 0);
    /* Ampersands in the path are not parameters. */
    assert_passes(S("GET /a&b&c HTTP/1.1\r\nHost: x\r\n\r\n"));
    free(req);
}

/* A request of the given header fields (X-F0: b …) and, chunked, trailer
 * fields, in buf; its length. */
static size_t with_fields(char *buf, int fields, int trailers)
{
    size_t n = (size_t)sprintf(buf, "POST / HTTP/1.1\r\nHost: x\r\n"); /* the first field */
    for (int i = 1; i < fields; i++)
        n += (size_t)sprintf(buf + n, "X-F%d: b\r\n", i);
    n += (size_t)sprintf(buf + n, trailers ? "Transfer-Encoding: chunked\r\n\r\n0\r\n" : "\r\n");
    for (int i = 0; i < trailers; i++)
        n += (size_t)sprintf(buf + n, "X-T%d: b\r\n", i);
    if (trailers)
        n += (size_t)sprintf(buf + n, "\r\n");
    return n;
}

static void test_more_than_the_cap_of_fields_is_431(void **state)
{
    (void)state;
    char *req = malloc(64 * 1024);
    assert_passes(req, with_fields(req, HTTP_GUARD_FIELDS_MAX, 0));
    assert_refused(req, with_fields(req, HTTP_GUARD_FIELDS_MAX + 1, 0), 431, "headers_too_large", 0);
    assert_refused(req, with_fields(req, 3000, 0), 431, "headers_too_large", 0);
    /* Trailer fields are counted apart; the chunked header is one field. */
    assert_passes(req, with_fields(req, HTTP_GUARD_FIELDS_MAX - 1, HTTP_GUARD_FIELDS_MAX));
    assert_refused(req, with_fields(req, 1, HTTP_GUARD_FIELDS_MAX + 1), 431, "headers_too_large", 0);
    free(req);
}

/* A request asking for an upgrade is framed as any other: until the
 * server says it switched (http_guard_upgraded), what follows is the next
 * request, checked as ever, so an Upgrade header the server refuses opens
 * no way past the guard; once switched, the socket's bytes pass as they
 * are (a WebSocket's frames). */
static void test_an_upgrade_passes_only_once_the_server_switched(void **state)
{
    (void)state;
    static const char ask[] = "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
    static const char frame[] = "\x81\x85\0\0\0\0zz\r\n\0";
    char both[sizeof ask + sizeof frame];
    memcpy(both, ask, sizeof ask - 1);
    memcpy(both + sizeof ask - 1, frame, sizeof frame - 1);
    assert_refused(both, sizeof ask - 1 + sizeof frame - 1, 400, "bad_request", sizeof ask - 1);
    assert_refused(S("GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n"
                     "GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n"),
                   400, "bad_request", 49);
    for (int switched = 0; switched < 2; switched++) {
        int fd[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fd), 0);
        http_guard_open(fd[0]);
        char buf[256];
        assert_int_equal(write(fd[1], ask, sizeof ask - 1), (ssize_t)(sizeof ask - 1));
        assert_int_equal(recv(fd[0], buf, sizeof buf, 0), (ssize_t)(sizeof ask - 1));
        if (switched)
            http_guard_upgraded(fd[0]);
        assert_int_equal(write(fd[1], frame, sizeof frame - 1), (ssize_t)(sizeof frame - 1));
        ssize_t n = recv(fd[0], buf, sizeof buf, 0);
        if (switched) {
            assert_int_equal(n, (ssize_t)(sizeof frame - 1));
            assert_memory_equal(buf, frame, sizeof frame - 1);
        } else {
            assert_int_equal(n, 0); /* refused: the library sees the client end */
            ssize_t answer = read(fd[1], buf, sizeof buf - 1);
            assert_true(answer > 12);
            buf[answer] = '\0';
            assert_non_null(strstr(buf, "HTTP/1.1 400 "));
        }
        http_guard_close(fd[0]);
        close(fd[0]);
        close(fd[1]);
    }
}

static void test_unsure_framings_are_refused(void **state)
{
    (void)state;
    /* Framings a proxy may read otherwise: refused on every server, the
     * gateway's too, not only where the API's handler checks them. */
    assert_refused(S("POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\0"), 400,
                   "bad_request", 0);
    assert_refused(S("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\nzz\r\n\0"), 501, "not_implemented", 0);
    assert_refused(S("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
                   501, "not_implemented", 0);
    /* HTTP/1.0 knows no transfer coding (RFC 9112 6.1): a proxy of 1.0
     * reads the chunks as the next request. */
    assert_refused(S("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), 400, "bad_request", 0);
    assert_refused(S("POST / HTTP/1.0\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), 400,
                   "bad_request", 0);
}

static void test_malformed_lines_are_refused(void **state)
{
    (void)state;
    const char *bad[] = {
        "GARBAGE\r\n\r\n",
        "GET\r\n\r\n",
        "GET /\r\n\r\n",
        "GET /a b HTTP/1.1\r\n\r\n",
        "GET  / HTTP/1.1\r\n\r\n",
        "G@T / HTTP/1.1\r\n\r\n",
        "GET / HTTP/1.1 \r\n\r\n",
        "GET / HTTP/1.1\r\nNoColon\r\n\r\n",
        "GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
        "GET / HTTP/1.1\r\nName : x\r\n\r\n",
        "GET / HTTP/1.1\r\n: x\r\n\r\n",
        "GET / HTTP/1.1\r\nA: x\r\n folded\r\n\r\n",
        "GET / HTTP/1.1\rHost: x\r\n\r\n",
        "GET / HTTP/1.1\r\nA: x\x01y\r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 3x\r\n\r\nabc",
        "POST / HTTP/1.1\r\nContent-Length: \r\n\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_refused(bad[i], strlen(bad[i]), 400, "bad_request", 0);
    assert_refused(S("GET / HTTP/2.0\r\n\r\n"), 505, "http_version_not_supported", 0);
    /* A malformed request line is refused when it ends, not when the head
     * does (which garbage may never send): the library parses it then. */
    assert_refused(S("\x8f\x01 random bytes\r\nand more, never a blank line"), 400, "bad_request", 0);
    assert_refused(S("GET / HTTP/1.1\r\nHost: x\r\n\r\nG@T / HTTP/1.1\r\nHost"), 400, "bad_request", 27);
    assert_refused(S("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n"), 413, "body_too_large", 0);
    /* A field of one value given twice: the library reads the first, a
     * proxy may have read the other. */
    assert_refused(S("GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n"), 400, "bad_request", 0);
    assert_refused(S("GET / HTTP/1.1\r\nAuthorization: Bearer a\r\nAUTHORIZATION: Bearer b\r\n\r\n"), 400,
                   "bad_request", 0);
    assert_refused(S("PUT /w HTTP/1.1\r\nX-Gpurent-Signature: a\r\nX-Gpurent-Signature: b\r\n\r\n"), 400,
                   "bad_request", 0);
    assert_refused(S("GET /t HTTP/1.1\r\nOrigin: http://a\r\nOrigin: http://evil\r\n\r\n"), 400, "bad_request", 0);
    assert_passes(S("GET / HTTP/1.1\r\nHost: a\r\nAccept: a\r\nAccept: b\r\n\r\n")); /* a list field */
    /* The same length twice is one length (RFC 9112 6.3); HTTP/1.0 is served. */
    assert_passes(S("POST / HTTP/1.0\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\nab"));
    /* HTTP/1.1 needs a Host (RFC 9112 3.2), a host name or address and an
     * optional port, never user information or a path. */
    assert_refused(S("GET / HTTP/1.1\r\nAccept: a\r\n\r\n"), 400, "bad_request", 0);
    static const char *const hosts_bad[] = {"u@a", "a/b", "a b", "a:8x", "[::1", "[::1]x", "a?b", "a#b", "[]"};
    for (size_t i = 0; i < sizeof hosts_bad / sizeof hosts_bad[0]; i++) {
        char req[128];
        int n = snprintf(req, sizeof req, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", hosts_bad[i]);
        assert_refused(req, (size_t)n, 400, "bad_request", 0);
    }
    static const char *const hosts_good[] = {"", "a", "example.com:443", "127.0.0.1:8080", "[::1]:8080", "[fe80::1]",
                                             "xn--bcher-kva.example", "a_b-c~d"};
    for (size_t i = 0; i < sizeof hosts_good / sizeof hosts_good[0]; i++) {
        char req[128];
        int n = snprintf(req, sizeof req, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", hosts_good[i]);
        assert_passes(req, (size_t)n);
    }
}

static void test_empty_lines_before_a_request_are_ignored(void **state)
{
    (void)state;
    assert_passes(S("\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n\nGET / HTTP/1.0\r\n\r\n"));
    assert_refused(S("\r\n\r\nGET /\0 HTTP/1.1\r\n\r\n"), 400, "bad_request", 4);
    /* A few: libmicrohttpd keeps every one, and a flood of them got its
     * HTML 414. */
    char *req = malloc(64 * 1024);
    size_t n = 0;
    for (int i = 0; i < HTTP_GUARD_BLANK_LINES_MAX; i++)
        n += (size_t)sprintf(req + n, "\r\n");
    size_t request_at = n;
    n += (size_t)sprintf(req + n, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_passes(req, n);
    memmove(req + 2, req, n);
    memcpy(req, "\r\n", 2);
    assert_refused(req, request_at + 2, 400, "bad_request", 0);
    free(req);
}

/* ---------------------------------------------------------------- over TLS */

/* An anonymous TLS 1.2 session pair over a socketpair: no certificate to
 * make, the same record layer. */
struct tls_pair {
    int fd[2]; /* server's, client's */
    gnutls_session_t server, client;
    gnutls_anon_server_credentials_t server_cred;
    gnutls_anon_client_credentials_t client_cred;
};

static void *client_handshake(void *arg)
{
    struct tls_pair *t = arg;
    int ret;
    do
        ret = gnutls_handshake(t->client);
    while (ret < 0 && !gnutls_error_is_fatal(ret));
    return (void *)(intptr_t)ret;
}

/* Opens the pair; the server's socket is registered with the guard before
 * the handshake (whose ciphertext goes through the guard's recv(), which
 * must pass it on untouched), with the server's own session or, when
 * register_own is 0, another one. */
static void tls_pair_open(struct tls_pair *t, int register_own)
{
    static const char *const priority = "NORMAL:-VERS-TLS1.3:+ANON-ECDH:+ANON-DH";
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, t->fd), 0);
    assert_int_equal(gnutls_anon_allocate_server_credentials(&t->server_cred), 0);
    assert_int_equal(gnutls_anon_allocate_client_credentials(&t->client_cred), 0);
    assert_int_equal(gnutls_init(&t->server, GNUTLS_SERVER), 0);
    assert_int_equal(gnutls_init(&t->client, GNUTLS_CLIENT), 0);
    assert_int_equal(gnutls_priority_set_direct(t->server, priority, NULL), 0);
    assert_int_equal(gnutls_priority_set_direct(t->client, priority, NULL), 0);
    assert_int_equal(gnutls_credentials_set(t->server, GNUTLS_CRD_ANON, t->server_cred), 0);
    assert_int_equal(gnutls_credentials_set(t->client, GNUTLS_CRD_ANON, t->client_cred), 0);
    gnutls_transport_set_int(t->server, t->fd[0]);
    gnutls_transport_set_int(t->client, t->fd[1]);
    /* Another session on the same socket number: the client's will do. */
    http_guard_open_tls(t->fd[0], register_own ? (void *)t->server : (void *)t->client);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, client_handshake, t), 0);
    int ret;
    do
        ret = gnutls_handshake(t->server);
    while (ret < 0 && !gnutls_error_is_fatal(ret));
    void *client_ret;
    pthread_join(th, &client_ret);
    assert_int_equal(ret, 0);
    assert_int_equal((intptr_t)client_ret, 0);
}

static void tls_pair_close(struct tls_pair *t)
{
    http_guard_close(t->fd[0]);
    gnutls_deinit(t->server);
    gnutls_deinit(t->client);
    gnutls_anon_free_server_credentials(t->server_cred);
    gnutls_anon_free_client_credentials(t->client_cred);
    close(t->fd[0]);
    close(t->fd[1]);
}

static const char repeated_host[] = "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n";

static void test_over_tls_the_registered_session_is_read_and_answered(void **state)
{
    struct tls_pair t;
    tls_pair_open(&t, 1);
    int64_t refusals = http_guard_refusals();
    /* A good request, then a refused one: the first passes alone. */
    static const char good[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    char sent[sizeof good - 1 + sizeof repeated_host - 1];
    memcpy(sent, good, sizeof good - 1);
    memcpy(sent + sizeof good - 1, repeated_host, sizeof repeated_host - 1);
    assert_int_equal(gnutls_record_send(t.client, sent, sizeof sent), (ssize_t)sizeof sent);
    char buf[4096];
    assert_int_equal(gnutls_record_recv(t.server, buf, sizeof buf), (ssize_t)(sizeof good - 1));
    assert_memory_equal(buf, good, sizeof good - 1);
    /* The next read is the refusal: the client reads it in the clear,
     * then the session's end (close_notify, not a cut). */
    assert_int_equal(gnutls_record_recv(t.server, buf, sizeof buf), 0);
    assert_int_equal(http_guard_refusals(), refusals + 1);
    char reply[4096];
    size_t got = 0;
    ssize_t n;
    while ((n = gnutls_record_recv(t.client, reply + got, sizeof reply - 1 - got)) > 0)
        got += (size_t)n;
    assert_int_equal(n, 0);
    reply[got] = 0;
    assert_non_null(strstr(reply, "HTTP/1.1 400 "));
    assert_non_null(strstr(reply, "\"code\":\"bad_request\""));
    assert_non_null(strstr(reply, "the request repeats its host header"));
    tls_pair_close(&t);
}

static void test_over_tls_another_session_on_the_socket_is_not_read(void **state)
{
    struct tls_pair t;
    tls_pair_open(&t, 0);
    int64_t refusals = http_guard_refusals();
    assert_int_equal(gnutls_record_send(t.client, S(repeated_host)), (ssize_t)sizeof repeated_host - 1);
    char buf[4096];
    assert_int_equal(gnutls_record_recv(t.server, buf, sizeof buf), (ssize_t)sizeof repeated_host - 1);
    assert_memory_equal(buf, repeated_host, sizeof repeated_host - 1);
    assert_int_equal(http_guard_refusals(), refusals);
    tls_pair_close(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipelined_requests_and_bodies_pass),
        cmocka_unit_test(test_a_nul_in_a_head_is_refused),
        cmocka_unit_test(test_malformed_chunks_are_refused),
        cmocka_unit_test(test_a_head_over_the_cap_is_431),
        cmocka_unit_test(test_more_than_the_cap_of_fields_is_431),
        cmocka_unit_test(test_a_request_line_over_the_cap_is_414),
        cmocka_unit_test(test_more_than_the_cap_of_query_parameters_is_414),
        cmocka_unit_test(test_an_upgrade_passes_only_once_the_server_switched),
        cmocka_unit_test(test_unsure_framings_are_refused),
        cmocka_unit_test(test_malformed_lines_are_refused),
        cmocka_unit_test(test_empty_lines_before_a_request_are_ignored),
        cmocka_unit_test(test_over_tls_the_registered_session_is_read_and_answered),
        cmocka_unit_test(test_over_tls_another_session_on_the_socket_is_not_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
