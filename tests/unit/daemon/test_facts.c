/* test_facts.c: the rules that put a node in service or keep it out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "domain/facts.h"

/* Builds a facts document of n cards; card k gets models[k] if given. */
static json_t *facts_doc(int n, const char *model, const char *odd_model, int odd_index, int failed_index)
{
    json_t *cards = json_array();
    for (int k = 0; k < n; k++)
        json_array_append_new(cards, json_pack("{s:i, s:s, s:i, s:b, s:s}", "index", k, "model",
                                               k == odd_index ? odd_model : model, "memory_gb", 192, "healthy",
                                               k != failed_index, "health_reason",
                                               k == failed_index ? "uncorrectable ECC errors" : ""));
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:i}", "vendor", "AMD", "stack", "ROCm", "driver_version", "6.8.5",
                     "stack_version", "6.2.0", "cards", cards, "workloads", 3);
}

static void check(const char *model, int64_t declared, json_t *doc, int want_rc, int want_accepted,
                  const char *reason_part)
{
    struct facts_verdict v;
    int rc = facts_check(model, declared, doc, &v);
    assert_int_equal(rc, want_rc);
    if (rc == 0)
        assert_int_equal(v.accepted, want_accepted);
    if (reason_part) {
        if (!strstr(v.reason, reason_part))
            fail_msg("reason '%s' lacks '%s'", v.reason, reason_part);
    } else {
        assert_string_equal(v.reason, "");
    }
    free(v.canonical);
    json_decref(doc);
}

static void test_matching_node_is_accepted(void **state)
{
    (void)state;
    struct facts_verdict v;
    json_t *doc = facts_doc(8, "MI450", NULL, -1, -1);
    assert_int_equal(facts_check("MI450", 8, doc, &v), 0);
    assert_true(v.accepted);
    assert_int_equal(v.n_cards, 8);
    assert_string_equal(v.driver_version, "6.8.5");
    assert_string_equal(v.stack_version, "6.2.0");
    for (size_t k = 0; k < 8; k++) {
        assert_int_equal(v.cards[k].idx, (int64_t)k);
        assert_true(v.cards[k].healthy);
    }
    /* Volatile fields (an older agent's workload count) stay out of the canonical
     * text, so a busy node does not rewrite its row on every beat. */
    assert_null(strstr(v.canonical, "workloads"));
    assert_non_null(strstr(v.canonical, "\"driver_version\":\"6.8.5\""));
    free(v.canonical);
    json_decref(doc);
}

static void test_failed_card_keeps_node_in_service(void **state)
{
    (void)state;
    struct facts_verdict v;
    json_t *doc = facts_doc(8, "MI450", NULL, -1, 3);
    assert_int_equal(facts_check("MI450", 8, doc, &v), 0);
    assert_true(v.accepted);
    assert_false(v.cards[3].healthy);
    assert_string_equal(v.cards[3].health_reason, "uncorrectable ECC errors");
    assert_true(v.cards[2].healthy);
    free(v.canonical);
    json_decref(doc);
}

static void test_rejections(void **state)
{
    (void)state;
    check("MI450", 8, facts_doc(8, "MI450", "MI300X", 5, -1), 0, 0, "mixed GPU models (7 MI450, 1 MI300X)");
    check("MI450", 8, facts_doc(8, "MI300X", NULL, -1, -1), 0, 0, "reports MI300X cards but was registered as MI450");
    check("MI450", 8, facts_doc(7, "MI450", NULL, -1, -1), 0, 0, "reports 7 cards but was registered with 8");
    check("MI450", 4, facts_doc(8, "MI450", NULL, -1, -1), 0, 0, "reports 8 cards but was registered with 4");
    check("MI450", 8, facts_doc(8, "MI450", "", 0, -1), 0, 0, "mixed GPU models");
}

static void test_gap_in_indexes_is_rejected(void **state)
{
    (void)state;
    json_t *doc = facts_doc(2, "MI450", NULL, -1, -1);
    json_object_set_new(json_array_get(json_object_get(doc, "cards"), 1), "index", json_integer(5));
    check("MI450", 2, doc, 0, 0, "card indexes are not 0..1");
}

static void test_malformed_documents(void **state)
{
    (void)state;
    check("MI450", 8, json_array(), -1, 0, "not a JSON object");
    check("MI450", 8, json_pack("{s:s}", "cards", "eight"), -1, 0, "no cards array");
    check("MI450", 1, json_pack("{s:[{s:s}]}", "cards", "index", "zero"), -1, 0, "each card needs");
    check("MI450", 2, json_pack("{s:[{s:i,s:s,s:i,s:b},{s:i,s:s,s:i,s:b}]}", "cards", "index", 0, "model", "MI450",
                                "memory_gb", 192, "healthy", 1, "index", 0, "model", "MI450", "memory_gb", 192,
                                "healthy", 1),
          -1, 0, "distinct");
    check("MI450", 1, json_pack("{s:[{s:i,s:s,s:i,s:b}]}", "cards", "index", 64, "model", "MI450", "memory_gb", 1,
                                "healthy", 1),
          -1, 0, "0..63");
    check("MI450", 1, json_pack("{s:[{s:i,s:s,s:i,s:b}]}", "cards", "index", 0, "model", "MI450", "memory_gb", -1,
                                "healthy", 1),
          -1, 0, "memory_gb");
    check("MI450", 1, json_pack("{s:i, s:[]}", "driver_version", 5, "cards"), -1, 0, "versions must be strings");
    json_t *many = json_pack("{s:[]}", "cards");
    for (int k = 0; k < 65; k++)
        json_array_append_new(json_object_get(many, "cards"), json_pack("{s:i}", "index", k));
    check("MI450", 8, many, -1, 0, "more than 64 cards");
}

static void test_canonical_is_order_independent(void **state)
{
    (void)state;
    json_t *a = facts_doc(3, "MI450", NULL, -1, -1);
    json_t *b = facts_doc(3, "MI450", NULL, -1, -1);
    json_t *cards = json_object_get(b, "cards");
    json_t *first = json_incref(json_array_get(cards, 0));
    json_array_remove(cards, 0);
    json_array_append_new(cards, first);
    struct facts_verdict va, vb;
    assert_int_equal(facts_check("MI450", 3, a, &va), 0);
    assert_int_equal(facts_check("MI450", 3, b, &vb), 0);
    assert_string_equal(va.canonical, vb.canonical);
    free(va.canonical);
    free(vb.canonical);
    json_decref(a);
    json_decref(b);
}

/* workload_exits: read when present, -1 when not, refused when not a
 * count, and never part of the canonical text (it changes on every exit). */
static void test_workload_exits(void **state)
{
    (void)state;
    struct facts_verdict v;
    json_t *doc = facts_doc(8, "MI450", NULL, -1, -1);
    assert_int_equal(facts_check("MI450", 8, doc, &v), 0);
    assert_int_equal(v.workload_exits, -1);
    char *before = v.canonical;

    json_object_set_new(doc, "workload_exits", json_integer(0));
    assert_int_equal(facts_check("MI450", 8, doc, &v), 0);
    assert_int_equal(v.workload_exits, 0);
    assert_string_equal(v.canonical, before);
    free(v.canonical);

    json_object_set_new(doc, "workload_exits", json_integer(17));
    assert_int_equal(facts_check("MI450", 8, doc, &v), 0);
    assert_true(v.accepted);
    assert_int_equal(v.workload_exits, 17);
    assert_string_equal(v.canonical, before);
    assert_null(strstr(v.canonical, "workload_exits"));
    free(v.canonical);

    json_object_set_new(doc, "workload_exits", json_null());
    assert_int_equal(facts_check("MI450", 8, doc, &v), 0);
    assert_int_equal(v.workload_exits, -1);
    free(v.canonical);
    free(before);
    json_decref(doc);

    /* Not a count: malformed, as a wrong type in any other field is. */
    json_t *bad[] = {json_integer(-1), json_string("3"), json_real(1.5), json_true(), json_array()};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        doc = facts_doc(8, "MI450", NULL, -1, -1);
        json_object_set_new(doc, "workload_exits", bad[i]);
        check("MI450", 8, doc, -1, 0, "workload_exits must be a non-negative integer");
    }
}

#define HOST_KEY "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILbBhWGcV/wiZDYS5aJ2boLc2M1Dnq3rZcvNrrRWX43r"
#define HOST_FP "SHA256:/mDBwP+YfBGaKLRcMikIibUhe17WSenOLLqbMlkaqnY"

static void test_ssh(void **state)
{
    (void)state;
    struct facts_verdict v;
    /* Absent and null: no SSH server. */
    json_t *doc = facts_doc(8, "MI450", NULL, -1, -1);
    assert_int_equal(facts_check("MI450", 8, doc, &v), 0);
    assert_int_equal(v.ssh_port, 0);
    free(v.canonical);
    json_object_set_new(doc, "ssh", json_null());
    assert_int_equal(facts_check("MI450", 8, doc, &v), 0);
    assert_int_equal(v.ssh_port, 0);
    free(v.canonical);
    /* A server: the fingerprint is computed here; the comment is dropped. */
    json_object_set_new(doc, "ssh", json_pack("{s:i, s:s, s:s}", "port", 2222, "host_key", HOST_KEY " root@n7",
                                              "fingerprint", HOST_FP));
    assert_int_equal(facts_check("MI450", 8, doc, &v), 0);
    assert_true(v.accepted);
    assert_int_equal(v.ssh_port, 2222);
    assert_string_equal(v.ssh_host_key, HOST_KEY);
    assert_string_equal(v.ssh_fingerprint, HOST_FP);
    assert_null(strstr(v.canonical, "ssh")); /* like the counters, not hardware */
    free(v.canonical);
    json_decref(doc);
    /* Each wrong shape is malformed. */
    json_t *bad[] = {
        json_string("on"),
        json_pack("{s:s}", "host_key", HOST_KEY),
        json_pack("{s:i, s:s}", "port", 0, "host_key", HOST_KEY),
        json_pack("{s:i, s:s}", "port", 65536, "host_key", HOST_KEY),
        json_pack("{s:s, s:s}", "port", "22", "host_key", HOST_KEY),
        json_pack("{s:i, s:i}", "port", 22, "host_key", 1),
        json_pack("{s:i, s:s}", "port", 22, "host_key", "ssh-ed25519 AAAA"),
        json_pack("{s:i, s:s, s:s}", "port", 22, "host_key", HOST_KEY, "fingerprint", "SHA256:other"),
        json_pack("{s:i, s:s, s:i}", "port", 22, "host_key", HOST_KEY, "fingerprint", 5),
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        doc = facts_doc(8, "MI450", NULL, -1, -1);
        json_object_set_new(doc, "ssh", bad[i]);
        if (facts_check("MI450", 8, doc, &v) != -1)
            fail_msg("bad ssh member %zu accepted", i);
        assert_non_null(strstr(v.reason, "ssh"));
        free(v.canonical);
        json_decref(doc);
    }
}

/* publish_ports: absent or null is none; {first, last} in 1..65535, in order. */
static void test_publish_ports(void **state)
{
    (void)state;
    struct facts_verdict v;
    json_t *doc = facts_doc(8, "MI450", NULL, -1, -1);
    assert_int_equal(facts_check("MI450", 8, doc, &v), 0);
    assert_int_equal(v.publish_first, 0);
    free(v.canonical);
    json_object_set_new(doc, "publish_ports", json_null());
    assert_int_equal(facts_check("MI450", 8, doc, &v), 0);
    assert_int_equal(v.publish_first, 0);
    free(v.canonical);
    json_object_set_new(doc, "publish_ports", json_pack("{s:i, s:i}", "first", 30000, "last", 30999));
    assert_int_equal(facts_check("MI450", 8, doc, &v), 0);
    assert_true(v.accepted);
    assert_int_equal(v.publish_first, 30000);
    assert_int_equal(v.publish_last, 30999);
    assert_null(strstr(v.canonical, "publish")); /* configuration, not hardware */
    free(v.canonical);
    json_decref(doc);
    json_t *bad[] = {
        json_string("30000-30999"),
        json_pack("{s:i}", "first", 30000),
        json_pack("{s:i, s:i}", "first", 0, "last", 10),
        json_pack("{s:i, s:i}", "first", 10, "last", 65536),
        json_pack("{s:i, s:i}", "first", 20, "last", 10),
        json_pack("{s:s, s:i}", "first", "1", "last", 10),
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        doc = facts_doc(8, "MI450", NULL, -1, -1);
        json_object_set_new(doc, "publish_ports", bad[i]);
        if (facts_check("MI450", 8, doc, &v) != -1)
            fail_msg("bad publish_ports member %zu accepted", i);
        assert_non_null(strstr(v.reason, "publish_ports"));
        free(v.canonical);
        json_decref(doc);
    }
}

/* data_address: absent, null or "" is none; else an IP address or a host
 * name, kept out of the canonical facts. */
static void test_data_address(void **state)
{
    (void)state;
    struct facts_verdict v;
    const char *good[] = {"10.0.0.5", "fe80::1", "2001:db8::7", "node-3.ib.example", "gpu07", "127.0.0.1"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        json_t *doc = facts_doc(8, "MI450", NULL, -1, -1);
        json_object_set_new(doc, "data_address", json_string(good[i]));
        if (facts_check("MI450", 8, doc, &v) != 0)
            fail_msg("good data_address %s refused: %s", good[i], v.reason);
        assert_true(v.accepted);
        assert_string_equal(v.data_address, good[i]);
        assert_null(strstr(v.canonical, "data_address"));
        free(v.canonical);
        json_decref(doc);
    }
    json_t *none[] = {json_null(), json_string("")};
    for (size_t i = 0; i < 2; i++) {
        json_t *doc = facts_doc(8, "MI450", NULL, -1, -1);
        json_object_set_new(doc, "data_address", none[i]);
        assert_int_equal(facts_check("MI450", 8, doc, &v), 0);
        assert_string_equal(v.data_address, "");
        free(v.canonical);
        json_decref(doc);
    }
    char long_name[300];
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    for (size_t k = 63; k < sizeof long_name - 1; k += 64)
        long_name[k] = '.';
    json_t *bad[] = {json_integer(10), json_string("10.0.0.5:22"), json_string("-x.example"),
                     json_string("a..b"),  json_string("a b"),        json_string("1.2.3.999"),
                     json_string("host_x"), json_string(long_name),   json_pack("[s]", "10.0.0.5")};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *doc = facts_doc(8, "MI450", NULL, -1, -1);
        json_object_set_new(doc, "data_address", bad[i]);
        if (facts_check("MI450", 8, doc, &v) != -1)
            fail_msg("bad data_address member %zu accepted", i);
        assert_non_null(strstr(v.reason, "data_address"));
        json_decref(doc);
    }
    assert_false(data_host_valid(""));
    assert_true(data_host_valid("a-1.b"));
    assert_false(data_host_valid("a-.b"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matching_node_is_accepted),
        cmocka_unit_test(test_failed_card_keeps_node_in_service),
        cmocka_unit_test(test_rejections),
        cmocka_unit_test(test_gap_in_indexes_is_rejected),
        cmocka_unit_test(test_malformed_documents),
        cmocka_unit_test(test_canonical_is_order_independent),
        cmocka_unit_test(test_workload_exits),
        cmocka_unit_test(test_publish_ports),
        cmocka_unit_test(test_data_address),
        cmocka_unit_test(test_ssh),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
