/* test_agent_client.c: agent_calls_stream against a small HTTP server on
 * loopback. However many calls a stream has, at most max_parallel of them
 * exist at once (made and not yet handed to done), which is what bounds the
 * heartbeat's and the reconciler's sweep memory at 10 000 nodes; every call
 * is made once and handed to done once, a call that cannot be made is
 * handed over as NULL, and a stop hands back the calls in flight unfinished
 * and makes no more. A reply is parsed once and kept with its call. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loops/agent_client.h"
#include "loops/loops.h"

#define CALLS 40

static int listen_fd = -1;
static char base_url[64];
static pthread_t server;

/* Answers each connection with a small JSON reply, then closes it. */
static void *serve(void *arg)
{
    (void)arg;
    for (;;) {
        int c = accept(listen_fd, NULL, NULL);
        if (c < 0)
            return NULL; /* the listening socket was shut down */
        char buf[4096];
        size_t got = 0;
        ssize_t n;
        while (got < sizeof buf - 1 && (n = read(c, buf + got, sizeof buf - 1 - got)) > 0) {
            got += (size_t)n;
            buf[got] = '\0';
            if (strstr(buf, "\r\n\r\n"))
                break;
        }
        static const char reply[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n"
                                    "Connection: close\r\n\r\n{\"ok\":true}";
        if (write(c, reply, sizeof reply - 1) < 0)
            perror("write");
        close(c);
    }
}

static int setup(void **state)
{
    (void)state;
    if (agent_client_global_init() < 0)
        return -1;
    listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(listen_fd, 64) < 0 ||
        getsockname(listen_fd, (struct sockaddr *)&a, &len) < 0)
        return -1;
    snprintf(base_url, sizeof base_url, "http://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    return pthread_create(&server, NULL, serve, NULL) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    shutdown(listen_fd, SHUT_RDWR);
    pthread_join(server, NULL);
    close(listen_fd);
    agent_client_global_cleanup();
    return 0;
}

/* What a stream did with its calls. */
struct tally {
    int made[CALLS];     /* times make was asked for call i */
    int done[CALLS];     /* times done was handed call i */
    int finished[CALLS]; /* done's finished flag for call i */
    int ok[CALLS];       /* call i came back 200 with the reply */
    int null_at;         /* make returns NULL for this call (-1: none) */
    int live, max_live;  /* calls made and not yet handed back */
    int stop_after;      /* stop once this many calls are done (0: never) */
    int n_done;
    struct agent_client_opts opts;
};

static struct tally *current;

static struct agent_call *make(void *ctx, size_t i)
{
    struct tally *t = ctx;
    t->made[i]++;
    if ((int)i == t->null_at)
        return NULL;
    struct agent_call *c = agent_call_new(base_url, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                                          "GET", "/v1/workloads", NULL, &t->opts);
    if (c && ++t->live > t->max_live)
        t->max_live = t->live;
    return c;
}

static void done(void *ctx, size_t i, struct agent_call *c, int finished)
{
    struct tally *t = ctx;
    t->done[i]++;
    t->finished[i] = finished;
    t->n_done++;
    if (c) {
        t->live--;
        t->ok[i] = finished && !c->error[0] && c->status == 200 && c->response_len == 11 &&
                   strcmp(c->response, "{\"ok\":true}") == 0 &&
                   json_is_true(json_object_get(agent_call_json(c), "ok")) &&
                   agent_call_json(c) == agent_call_json(c); /* parsed once, kept with the call */
    }
    agent_call_free(c);
}

static int stop_now(void)
{
    return current->stop_after && current->n_done >= current->stop_after;
}

static struct tally *tally_new(void)
{
    struct tally *t = calloc(1, sizeof *t);
    assert_non_null(t);
    t->null_at = -1;
    t->opts = (struct agent_client_opts){.connect_timeout_ms = 2000, .total_timeout_ms = 5000,
                                         .max_response_bytes = 1 << 16};
    current = t;
    return t;
}

static void test_a_stream_holds_at_most_max_parallel_calls(void **state)
{
    (void)state;
    struct tally *t = tally_new();
    t->null_at = 7;
    const struct agent_call_stream st = {make, done, t};
    assert_int_equal(agent_calls_stream(NULL, CALLS, 3, stop_now, &st), 0);
    assert_true(t->max_live >= 1 && t->max_live <= 3);
    assert_int_equal(t->live, 0);
    for (int i = 0; i < CALLS; i++) {
        assert_int_equal(t->made[i], 1);
        assert_int_equal(t->done[i], 1);
        assert_int_equal(t->finished[i], 1);
        assert_int_equal(t->ok[i], i != 7); /* the call make could not build is handed over as NULL */
    }
    free(t);
}

static void test_a_pool_keeps_the_same_bound(void **state)
{
    (void)state;
    struct agent_multi *pool = agent_multi_new();
    assert_non_null(pool);
    for (int round = 0; round < 2; round++) {
        struct tally *t = tally_new();
        const struct agent_call_stream st = {make, done, t};
        assert_int_equal(agent_calls_stream(pool, CALLS, 2, stop_now, &st), 0);
        assert_true(t->max_live <= 2);
        for (int i = 0; i < CALLS; i++)
            assert_true(t->done[i] == 1 && t->ok[i]);
        free(t);
    }
    assert_true(agent_multi_connects(pool) >= 1);
    agent_multi_free(pool);
}

static void test_a_stop_hands_back_what_is_in_flight_and_makes_no_more(void **state)
{
    (void)state;
    struct tally *t = tally_new();
    t->stop_after = 5;
    const struct agent_call_stream st = {make, done, t};
    assert_int_equal(agent_calls_stream(NULL, CALLS, 4, stop_now, &st), -1);
    assert_int_equal(t->live, 0);
    int made = 0, unfinished = 0;
    for (int i = 0; i < CALLS; i++) {
        assert_int_equal(t->done[i], t->made[i]); /* each made call came back once, none that was not made */
        made += t->made[i];
        unfinished += t->done[i] && !t->finished[i];
    }
    assert_true(made >= 5 && made < CALLS);
    assert_true(unfinished <= 4);
    free(t);
}

/* A reply that is not JSON parses to NULL, once; the call frees what it
 * parsed (the sanitizer's leak check sees the rest). */
static void test_a_reply_that_is_not_json_parses_to_null(void **state)
{
    (void)state;
    struct agent_client_opts opts = {.connect_timeout_ms = 2000, .total_timeout_ms = 5000, .max_response_bytes = 1 << 16};
    struct agent_call *c = agent_call_new(base_url, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                                          "GET", "/v1/workloads", NULL, &opts);
    assert_non_null(c);
    assert_null(c->response);
    assert_null(agent_call_json(c)); /* no reply: no document */
    agent_call_free(c);
    c = agent_call_new(base_url, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "GET",
                       "/v1/workloads", NULL, &opts);
    assert_non_null(c);
    c->response = strdup("{\"phase\": \"running\"");
    c->response_len = strlen(c->response);
    assert_null(agent_call_json(c));
    assert_int_equal(c->doc_read, 1);
    assert_null(agent_call_json(c));
    agent_call_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_stream_holds_at_most_max_parallel_calls),
        cmocka_unit_test(test_a_pool_keeps_the_same_bound),
        cmocka_unit_test(test_a_stop_hands_back_what_is_in_flight_and_makes_no_more),
        cmocka_unit_test(test_a_reply_that_is_not_json_parses_to_null),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
