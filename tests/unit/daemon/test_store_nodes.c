/* test_store_nodes.c: the SQL of nodes and their cards (store_nodes.c),
 * the capacity history (store_capacity.c), placement candidates and free
 * cards (store_instances.c) and the node metrics: registration, listing
 * with filters and cursors, heartbeats that succeed and fail (the
 * unreachable stage: SQL_NODE_QUIET's miss_limit and lost_after_s, and a
 * good beat that clears it), admin states and removal. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_fixtures.h"

#define MISS_LIMIT 3
#define LOST_AFTER 600

static char alice[ID_MAX];

static void setup_rows(void)
{
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
    fx_tst_type(fx.s);
}

static struct node get(const char *id)
{
    struct node n;
    assert_int_equal(store_node_get(fx.s, id, &n), STORE_OK);
    return n;
}

static int missed(const char *id, int64_t now, int64_t lost_after)
{
    return store_node_beat_missed(fx.s, id, now, MISS_LIMIT, lost_after, "no answer");
}

/* The health the heartbeat loop sees for a node ('unreachable' for an up
 * node missing beats). */
static void target_health(const char *id, char *out, size_t n)
{
    struct node_target *t;
    size_t count;
    assert_int_equal(store_node_targets(fx.s, &t, &count), STORE_OK);
    out[0] = '\0';
    for (size_t i = 0; i < count; i++)
        if (strcmp(t[i].id, id) == 0)
            snprintf(out, n, "%s", t[i].health);
    free(t);
}

/* ---------------------------------------------------------------- registration */

static void test_node_insert_and_get_round_trip_as_pending(void **state)
{
    setup_rows();
    struct node n;
    fx_node_init(&n, "gpu-01", FX_TST, 8, "ib-east", 1000);
    snprintf(n.labels, sizeof n.labels, "{\"rack\":\"r7\"}");
    assert_int_equal(store_node_insert(fx.s, &n), STORE_OK);
    struct node got = get(n.id);
    assert_string_equal(got.name, "gpu-01");
    assert_string_equal(got.agent_url, n.agent_url);
    assert_string_equal(got.secret, n.secret);
    assert_string_equal(got.gpu_model, FX_TST);
    assert_int_equal(got.card_count, 8);
    assert_string_equal(got.fabric, "ib-east");
    assert_string_equal(got.region, "test-1");
    assert_string_equal(got.labels, "{\"rack\":\"r7\"}");
    assert_string_equal(got.admin_state, "active");
    assert_string_equal(got.health, "unknown");
    assert_string_equal(got.state, "pending");
    assert_int_equal(got.missed_beats, 0);
    assert_int_equal(got.last_seen_at, 0);
    assert_int_equal(got.cards_total, 0);
    assert_int_equal(got.created_at, 1000);
    assert_int_equal(got.updated_at, 1000);
    assert_int_equal(store_node_get(fx.s, "node_nosuch", &got), STORE_NOT_FOUND);
}

static void test_node_insert_refuses_an_unknown_model_and_a_taken_name(void **state)
{
    setup_rows();
    char first[ID_MAX];
    fx_node(fx.s, "gpu-01", FX_TST, 8, "f1", 1000, first);
    struct node n;
    fx_node_init(&n, "gpu-02", "NOSUCH", 8, "f1", 1000);
    assert_int_equal(store_node_insert(fx.s, &n), STORE_NOT_FOUND);
    fx_node_init(&n, "gpu-01", FX_TST, 8, "f1", 1000);
    assert_int_equal(store_node_insert(fx.s, &n), STORE_CONFLICT);
    /* A removed node's name can be used again. */
    assert_int_equal(store_node_remove(fx.s, first, 2000), STORE_OK);
    assert_int_equal(store_node_insert(fx.s, &n), STORE_OK);
}

static void test_node_list_filters_by_state_model_and_fabric(void **state)
{
    setup_rows();
    char n1[ID_MAX], n2[ID_MAX], n3[ID_MAX], n4[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 100, n1);
    fx_node(fx.s, "n2", FX_TST, 8, "f2", 200, n2);
    fx_ready_node(fx.s, "n3", "MI450", 8, "f1", 300, n3);
    fx_ready_node(fx.s, "n4", FX_TST, 8, "f1", 400, n4);
    assert_int_equal(store_node_set_admin_state(fx.s, n4, "cordoned", "bad fan", 500), STORE_OK);
    struct node out[8];
    size_t n;
    struct node_filter ready = {.state = "ready", .after_created = -1};
    assert_int_equal(store_node_list(fx.s, &ready, out, 8, &n), STORE_OK);
    assert_int_equal(n, 2);
    assert_string_equal(out[0].id, n1);
    assert_string_equal(out[1].id, n3);
    assert_int_equal(out[0].cards_free, 8);
    struct node_filter tst = {.gpu_model = FX_TST, .after_created = -1};
    assert_int_equal(store_node_list(fx.s, &tst, out, 8, &n), STORE_OK);
    assert_int_equal(n, 3);
    struct node_filter f1 = {.fabric = "f1", .after_created = -1};
    assert_int_equal(store_node_list(fx.s, &f1, out, 8, &n), STORE_OK);
    assert_int_equal(n, 3);
    struct node_filter both = {.state = "cordoned", .gpu_model = FX_TST, .fabric = "f1", .after_created = -1};
    assert_int_equal(store_node_list(fx.s, &both, out, 8, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_string_equal(out[0].id, n4);
    assert_string_equal(out[0].state_reason, "bad fan");
    assert_int_equal(out[0].cards_free, 0); /* only a ready node offers free cards */
    struct node_filter pending = {.state = "pending", .after_created = -1};
    assert_int_equal(store_node_list(fx.s, &pending, out, 8, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_string_equal(out[0].id, n2);
}

static void test_node_list_pages_by_creation_with_a_cursor(void **state)
{
    setup_rows();
    char ids[5][ID_MAX];
    for (int i = 0; i < 5; i++) {
        char name[16];
        snprintf(name, sizeof name, "n%d", i);
        fx_node(fx.s, name, FX_TST, 8, "f1", 100 * (5 - i), ids[i]); /* newest first */
    }
    struct node_filter f = {.after_created = -1};
    struct node page[2];
    size_t n, seen = 0;
    char last[ID_MAX] = "";
    for (;;) {
        assert_int_equal(store_node_list(fx.s, &f, page, 2, &n), STORE_OK);
        if (n == 0)
            break;
        for (size_t i = 0; i < n; i++, seen++)
            assert_string_equal(page[i].id, ids[4 - seen]); /* oldest first */
        f.after_created = page[n - 1].created_at;
        snprintf(last, sizeof last, "%s", page[n - 1].id);
        f.after_id = last;
    }
    assert_int_equal(seen, 5);
}

static void test_node_cards_are_listed_by_index_with_their_holder(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_node(fx.s, "n1", FX_TST, 4, "f1", 100, node);
    assert_int_equal(fx_beat(fx.s, node, 100, FX_TST, 4, 0x4), STORE_OK);
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, 1, "running", 100, &in);
    assert_int_equal(fx_claim(fx.s, in.id, 0, node, 0x2), STORE_OK);
    struct node_card c[8];
    size_t n;
    assert_int_equal(store_node_cards(fx.s, node, c, 8, &n), STORE_OK);
    assert_int_equal(n, 4);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(c[i].idx, (int64_t)i);
    assert_string_equal(c[1].instance_id, in.id);
    assert_string_equal(c[0].instance_id, "");
    assert_int_equal(c[2].healthy, 0);
    assert_string_equal(c[2].health_reason, "ECC errors");
    assert_string_equal(c[3].model, FX_TST);
    struct node got = get(node);
    assert_int_equal(got.cards_total, 4);
    assert_int_equal(got.cards_free, 2);
    assert_int_equal(got.cards_in_use, 1);
    assert_string_equal(got.driver_version, "drv-1");
    assert_string_equal(got.stack_version, "stack-1");
}

/* ---------------------------------------------------------------- good beats */

static void test_beat_ok_replaces_card_facts_but_keeps_cards_in_use(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 100, node);
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, 2, "running", 100, &in);
    assert_int_equal(fx_claim(fx.s, in.id, 0, node, 0x21), STORE_OK); /* cards 0 and 5 */
    assert_int_equal(fx_beat(fx.s, node, 200, FX_TST, 4, 0), STORE_OK);
    struct node_card c[8];
    size_t n;
    assert_int_equal(store_node_cards(fx.s, node, c, 8, &n), STORE_OK);
    /* 0..3 reported, 4, 6 and 7 gone, 5 kept while its instance holds it. */
    assert_int_equal(n, 5);
    assert_int_equal(c[4].idx, 5);
    assert_string_equal(c[4].instance_id, in.id);
    assert_string_equal(c[0].instance_id, in.id);
    assert_int_equal(get(node).last_seen_at, 200);
}

static void test_beat_ok_rejected_keeps_its_reason_and_offers_no_cards(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 100, node);
    assert_int_equal(store_node_beat_ok(fx.s, node, 200, "{\"model\":\"MI300X\"}", 0, "reports MI300X, declared TST",
                                        "", "", NULL, 0, 3),
                     STORE_OK);
    struct node got = get(node);
    assert_string_equal(got.health, "rejected");
    assert_string_equal(got.state, "rejected");
    assert_string_equal(got.state_reason, "reports MI300X, declared TST");
    assert_int_equal(got.cards_total, 8); /* card rows stay */
    assert_int_equal(got.cards_free, 0);
    struct gpu_type t;
    assert_int_equal(store_gpu_type_get(fx.s, FX_TST, &t), STORE_OK);
    assert_int_equal(t.cards_total, 0);
    assert_int_equal(t.cards_free, 0);
}

static void test_beat_ok_with_unchanged_facts_moves_only_the_time(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 100, node);
    struct node_card cards[8];
    memset(cards, 0, sizeof cards);
    char facts[256];
    fx_facts(facts, sizeof facts, FX_TST, 8, 0);
    /* Same facts; versions given differently are not read again. */
    assert_int_equal(store_node_beat_ok(fx.s, node, 500, facts, 1, "", "drv-2", "stack-2", cards, 8, 9), STORE_OK);
    struct node got = get(node);
    assert_int_equal(got.last_seen_at, 500);
    assert_int_equal(got.updated_at, 100);
    assert_string_equal(got.driver_version, "drv-1");
    struct node_card c[8];
    size_t n;
    assert_int_equal(store_node_cards(fx.s, node, c, 8, &n), STORE_OK);
    assert_string_equal(c[0].model, FX_TST);
    struct node_target *t;
    assert_int_equal(store_node_targets(fx.s, &t, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_int_equal(t[0].workload_exits, 9);
    free(t);
}

/* The ids of targets, comma-separated, into out. */
static void target_ids(const struct node_target *t, size_t n, char *out, size_t cap)
{
    out[0] = '\0';
    for (size_t i = 0; i < n; i++)
        snprintf(out + strlen(out), cap - strlen(out), "%s%s", i ? "," : "", t[i].id);
}

static void test_targets_of_some_nodes_and_of_those_never_reached(void **state)
{
    setup_rows();
    char a[ID_MAX], b[ID_MAX], c[ID_MAX], gone[ID_MAX];
    fx_ready_node(fx.s, "n-a", FX_TST, 8, "f1", 100, a);
    fx_node(fx.s, "n-b", FX_TST, 8, "f1", 100, b); /* registered, never reached */
    fx_node(fx.s, "n-c", FX_TST, 8, "f1", 100, c);
    fx_node(fx.s, "n-gone", FX_TST, 8, "f1", 100, gone);
    assert_int_equal(store_node_remove(fx.s, gone, 150), STORE_OK);
    char want[4 * ID_MAX], got[4 * ID_MAX];
    struct node_target *t;
    size_t n;
    /* Never reached: b and c, in id order, not the ready or the removed one. */
    assert_int_equal(store_node_targets_new(fx.s, &t, &n), STORE_OK);
    target_ids(t, n, got, sizeof got);
    snprintf(want, sizeof want, "%s,%s", strcmp(b, c) < 0 ? b : c, strcmp(b, c) < 0 ? c : b);
    assert_string_equal(got, want);
    assert_string_equal(t[0].health, "unknown");
    free(t);
    /* The first beat takes a node off that list. */
    assert_int_equal(fx_beat(fx.s, b, 200, FX_TST, 8, 0), STORE_OK);
    assert_int_equal(store_node_targets_new(fx.s, &t, &n), STORE_OK);
    target_ids(t, n, got, sizeof got);
    assert_string_equal(got, c);
    free(t);
    /* Some nodes by id: those registered, as store_node_targets reads them. */
    char ids[3][ID_MAX] = {"nod_not_registered"};
    memcpy(ids[1], a, ID_MAX);
    memcpy(ids[2], gone, ID_MAX);
    assert_int_equal(store_node_targets_of(fx.s, ids, 3, &t, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_string_equal(t[0].id, a);
    assert_string_equal(t[0].health, "up");
    assert_int_equal(t[0].last_seen_at, 100);
    assert_string_equal(t[0].agent_url, get(a).agent_url);
    free(t);
    assert_int_equal(store_node_targets_of(fx.s, ids, 0, &t, &n), STORE_OK);
    assert_int_equal(n, 0);
    free(t);
}

static void test_the_facts_digest_is_kept_and_a_seen_beat_moves_only_the_time(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 100, node);
    struct node_target *t;
    size_t n;
    assert_int_equal(store_node_targets(fx.s, &t, &n), STORE_OK);
    assert_string_equal(t[0].facts_digest, ""); /* none recorded yet */
    assert_string_equal(t[0].facts_etag, "");
    free(t);
    char digest[65];
    memset(digest, 'a', 64);
    digest[64] = '\0';
    /* The reply's ETag is kept with its digest, "" as NULL (0038). */
    assert_int_equal(store_node_set_facts_digest(fx.s, node, digest, "\"e1\""), STORE_OK);
    assert_int_equal(store_node_targets(fx.s, &t, &n), STORE_OK);
    assert_string_equal(t[0].facts_etag, "\"e1\"");
    free(t);
    assert_int_equal(store_node_set_facts_digest(fx.s, node, digest, ""), STORE_OK);
    assert_int_equal(store_node_targets(fx.s, &t, &n), STORE_OK);
    assert_string_equal(t[0].facts_etag, "");
    free(t);
    /* An ETag that could not go back in a header: the CHECK refuses it. */
    assert_int_not_equal(store_node_set_facts_digest(fx.s, node, digest, "\"e1\"\r\nX-Injected: 1"), STORE_OK);
    memset(digest, 'b', 32); /* not a digest: the CHECK refuses it */
    digest[32] = '\0';
    assert_int_not_equal(store_node_set_facts_digest(fx.s, node, digest, ""), STORE_OK);
    /* Unreachable (missed beats), then seen: reachable again, the time moved,
     * nothing else. */
    for (int i = 0; i < MISS_LIMIT; i++)
        assert_int_equal(missed(node, 200 + i, 3600), STORE_OK);
    assert_int_equal(store_node_targets(fx.s, &t, &n), STORE_OK);
    assert_string_equal(t[0].health, "unreachable");
    free(t);
    assert_int_equal(store_node_seen(fx.s, node, 500, 4, 1), STORE_OK);
    struct node got = get(node);
    assert_int_equal(got.last_seen_at, 500);
    assert_string_equal(got.driver_version, "drv-1");
    assert_int_equal(store_node_targets(fx.s, &t, &n), STORE_OK);
    assert_string_equal(t[0].health, "up");
    assert_int_equal(t[0].missed_beats, 0);
    assert_int_equal(t[0].workload_exits, 4);
    assert_string_equal(t[0].facts_digest, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    free(t);
    /* Removed meanwhile (during a heartbeat pass): not found, not seen. */
    assert_int_equal(store_node_remove(fx.s, node, 600), STORE_OK);
    assert_int_equal(store_node_seen(fx.s, node, 700, 4, 0), STORE_NOT_FOUND);
}

static void test_beat_ok_for_a_removed_node_is_not_found(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 100, node);
    assert_int_equal(store_node_remove(fx.s, node, 200), STORE_OK);
    assert_int_equal(fx_beat(fx.s, node, 300, FX_TST, 8, 0), STORE_NOT_FOUND);
    assert_int_equal(fx_beat(fx.s, "node_nosuch", 300, FX_TST, 8, 0), STORE_NOT_FOUND);
}

/* ---------------------------------------------------------------- missed beats */

static void test_beats_missed_below_the_limit_only_count(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    assert_int_equal(missed(node, 1005, LOST_AFTER), STORE_OK);
    assert_int_equal(missed(node, 1010, LOST_AFTER), STORE_OK);
    struct node got = get(node);
    assert_int_equal(got.missed_beats, 2);
    assert_string_equal(got.state, "ready");
    assert_string_equal(got.state_reason, "");
    assert_int_equal(got.updated_at, 1000);
    assert_int_equal(got.cards_free, 8);
}

static void test_miss_limit_beats_make_an_up_node_unreachable_keeping_its_cards(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, 2, "running", 1000, &in);
    assert_int_equal(fx_claim(fx.s, in.id, 0, node, 0x3), STORE_OK);
    for (int i = 1; i <= MISS_LIMIT; i++)
        assert_int_equal(missed(node, 1000 + 5 * i, LOST_AFTER), STORE_OK);
    struct node got = get(node);
    assert_string_equal(got.health, "up");
    assert_string_equal(got.state, "unreachable");
    assert_string_equal(got.state_reason, "no answer");
    assert_int_equal(got.missed_beats, MISS_LIMIT);
    assert_int_equal(got.updated_at, 1015);
    assert_int_equal(got.cards_in_use, 2);
    assert_int_equal(got.cards_free, 0);
    char health[16];
    target_health(node, health, sizeof health);
    assert_string_equal(health, "unreachable");
    /* Nothing new is placed on it. */
    assert_int_equal(store_free_cards(fx.s, FX_TST), 0);
    struct placement_node *p;
    size_t n;
    assert_int_equal(store_placement_candidates(fx.s, FX_TST, 1, &p, &n), STORE_OK);
    assert_int_equal(n, 0);
    free(p);
    /* Further misses before lost_after_s change nothing but the count. */
    assert_int_equal(missed(node, 1599, LOST_AFTER), STORE_OK);
    got = get(node);
    assert_string_equal(got.state, "unreachable");
    assert_int_equal(got.updated_at, 1015);
}

static void test_an_unreachable_node_goes_offline_lost_after_s_after_its_last_good_beat(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    for (int i = 1; i <= MISS_LIMIT; i++)
        assert_int_equal(missed(node, 1000 + 5 * i, LOST_AFTER), STORE_OK);
    assert_int_equal(missed(node, 1000 + LOST_AFTER - 1, LOST_AFTER), STORE_OK);
    assert_string_equal(get(node).state, "unreachable");
    assert_int_equal(store_node_beat_missed(fx.s, node, 1000 + LOST_AFTER, MISS_LIMIT, LOST_AFTER, "gone quiet"),
                     STORE_OK);
    struct node got = get(node);
    assert_string_equal(got.health, "offline");
    assert_string_equal(got.state, "offline");
    assert_string_equal(got.state_reason, "gone quiet");
    assert_int_equal(got.updated_at, 1000 + LOST_AFTER);
    char health[16];
    target_health(node, health, sizeof health);
    assert_string_equal(health, "offline");
}

static void test_a_good_beat_brings_an_unreachable_node_back(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    for (int i = 1; i <= MISS_LIMIT; i++)
        assert_int_equal(missed(node, 1000 + 5 * i, LOST_AFTER), STORE_OK);
    assert_string_equal(get(node).state, "unreachable");
    assert_int_equal(fx_beat(fx.s, node, 1100, FX_TST, 8, 0), STORE_OK); /* the same facts */
    struct node got = get(node);
    assert_string_equal(got.state, "ready");
    assert_string_equal(got.state_reason, "");
    assert_int_equal(got.missed_beats, 0);
    assert_int_equal(got.last_seen_at, 1100);
    assert_int_equal(got.updated_at, 1100);
    assert_int_equal(store_free_cards(fx.s, FX_TST), 8);
    /* And it takes miss_limit new misses to lose it again. */
    assert_int_equal(missed(node, 1105, LOST_AFTER), STORE_OK);
    assert_string_equal(get(node).state, "ready");
}

/* Counts, through a temporary trigger (this connection only), the updates
 * of rows of the nodes table from now on. */
static void count_node_row_writes(void)
{
    fx_sql_exec(fx.s, "CREATE TEMP TABLE node_row_writes (n INTEGER NOT NULL);"
                      " INSERT INTO node_row_writes VALUES (0);"
                      " CREATE TEMP TRIGGER node_row_written AFTER UPDATE ON main.nodes"
                      " BEGIN UPDATE node_row_writes SET n = n + 1; END;");
}

static int64_t node_row_writes(void)
{
    return fx_sql_int(fx.s, "SELECT n FROM node_row_writes", NULL);
}

static void test_a_repeated_beat_and_a_miss_below_the_limit_leave_the_nodes_row_alone(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 100, node);
    count_node_row_writes();
    struct node_card cards[8];
    memset(cards, 0, sizeof cards);
    char facts[256];
    fx_facts(facts, sizeof facts, FX_TST, 8, 0);
    assert_int_equal(store_node_beat_ok(fx.s, node, 200, facts, 1, "", "drv-1", "stack-1", cards, 8, 3), STORE_OK);
    assert_int_equal(store_node_seen(fx.s, node, 205, 4, 0), STORE_OK);
    assert_int_equal(missed(node, 210, LOST_AFTER), STORE_OK);
    /* A reply whose bytes changed (an older agent's workload count) but whose
     * recorded facts did not: its digest is noted in the narrow row (0036). */
    char digest[65];
    memset(digest, 'c', 64);
    digest[64] = '\0';
    assert_int_equal(store_node_set_facts_digest(fx.s, node, digest, ""), STORE_OK);
    assert_int_equal(node_row_writes(), 0);
    struct node got = get(node);
    assert_int_equal(got.last_seen_at, 205);
    assert_int_equal(got.missed_beats, 1);
    assert_int_equal(got.updated_at, 100);
    /* What changes what the node is writes its row: unreachable, then back. */
    for (int i = 2; i <= MISS_LIMIT; i++)
        assert_int_equal(missed(node, 210 + i, LOST_AFTER), STORE_OK);
    assert_int_equal(node_row_writes(), 1);
    assert_string_equal(get(node).state, "unreachable");
    assert_int_equal(store_node_seen(fx.s, node, 300, 4, 1), STORE_OK);
    assert_int_equal(node_row_writes(), 2);
    got = get(node);
    assert_string_equal(got.state, "ready");
    assert_int_equal(got.updated_at, 300);
    assert_int_equal(got.missed_beats, 0);
}

static void test_migrations_0034_and_0036_keep_what_each_node_last_said(void **state)
{
    char path[200], err[256];
    snprintf(path, sizeof path, "%s/before-0034.db", fx.dir);
    struct store *s = store_open(path, err, sizeof err);
    assert_non_null(s);
    assert_int_equal(store_migrate(s, 33, err, sizeof err), 0);
    fx_gpu_type(s, FX_TST, "AMD", "ROCm");
    fx_sql_exec(s, "INSERT INTO nodes (id, name, agent_url, secret, gpu_model, card_count, fabric, region, health,"
                   " missed_beats, last_seen_at, workload_exits, facts_digest, created_at, updated_at) VALUES"
                   " ('node_aaaaaaaaaaaaaaaaaaaa', 'quiet', 'http://10.0.0.1:8081', printf('%064d', 0), 'TST', 8,"
                   "  'f1', 'r1', 'up', 2, 500, 7, printf('%064d', 7), 100, 100),"
                   " ('node_bbbbbbbbbbbbbbbbbbbb', 'never', 'http://10.0.0.2:8081', printf('%064d', 0), 'TST', 8,"
                   "  'f1', 'r1', 'unknown', 0, NULL, -1, NULL, 100, 100)");
    assert_int_equal(store_migrate(s, 0, err, sizeof err), 0);
    struct node n;
    assert_int_equal(store_node_get(s, "node_aaaaaaaaaaaaaaaaaaaa", &n), STORE_OK);
    assert_int_equal(n.missed_beats, 2);
    assert_int_equal(n.last_seen_at, 500);
    assert_int_equal(fx_sql_int(s, "SELECT workload_exits FROM node_liveness WHERE node_id = ?",
                                "node_aaaaaaaaaaaaaaaaaaaa"),
                     7);
    assert_int_equal(store_node_get(s, "node_bbbbbbbbbbbbbbbbbbbb", &n), STORE_OK);
    assert_int_equal(n.last_seen_at, 0);
    assert_int_equal(fx_sql_int(s, "SELECT last_seen_at IS NULL AND workload_exits = -1 FROM node_liveness"
                                   " WHERE node_id = ?",
                                "node_bbbbbbbbbbbbbbbbbbbb"),
                     1);
    struct node_target *t;
    size_t count;
    assert_int_equal(store_node_targets(s, &t, &count), STORE_OK);
    assert_int_equal(count, 2);
    assert_string_equal(t[0].facts_digest, "0000000000000000000000000000000000000000000000000000000000000007");
    assert_string_equal(t[1].facts_digest, "");
    free(t);
    /* The columns left the wide row: a report cannot read a stale copy. */
    assert_int_equal(fx_sql_int(s, "SELECT count(*) FROM pragma_table_info('nodes') WHERE name IN"
                                   " ('missed_beats', 'last_seen_at', 'workload_exits', 'facts_digest')",
                                NULL),
                     0);
    store_close(s);
    fx_unlink_db(path);
}

static void test_a_never_reached_node_goes_offline_at_the_limit(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    assert_int_equal(missed(node, 1005, 100000), STORE_OK);
    assert_int_equal(missed(node, 1010, 100000), STORE_OK);
    assert_string_equal(get(node).state, "pending");
    assert_int_equal(missed(node, 1015, 100000), STORE_OK);
    struct node got = get(node);
    assert_string_equal(got.state, "offline");
    assert_string_equal(got.state_reason, "no answer");
}

static void test_lost_after_zero_takes_an_up_node_offline_at_the_limit(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    assert_int_equal(missed(node, 1005, 0), STORE_OK);
    assert_int_equal(missed(node, 1010, 0), STORE_OK);
    assert_string_equal(get(node).state, "ready");
    assert_int_equal(missed(node, 1015, 0), STORE_OK);
    assert_string_equal(get(node).state, "offline");
}

static void test_rejected_and_offline_nodes_stay_as_they_are_when_missing_beats(void **state)
{
    setup_rows();
    char rejected[ID_MAX], offline[ID_MAX];
    fx_ready_node(fx.s, "rej", FX_TST, 8, "f1", 1000, rejected);
    assert_int_equal(store_node_beat_ok(fx.s, rejected, 1000, "{\"bad\":1}", 0, "wrong model", "", "", NULL, 0, 0),
                     STORE_OK);
    fx_ready_node(fx.s, "off", FX_TST, 8, "f1", 1000, offline);
    for (int i = 1; i <= MISS_LIMIT; i++)
        assert_int_equal(missed(offline, 1000 + 5 * i, 0), STORE_OK);
    assert_string_equal(get(offline).state, "offline");
    for (int i = 1; i <= 2 * MISS_LIMIT; i++) {
        assert_int_equal(store_node_beat_missed(fx.s, rejected, 2000 + i, MISS_LIMIT, 0, "later"), STORE_OK);
        assert_int_equal(store_node_beat_missed(fx.s, offline, 2000 + i, MISS_LIMIT, 0, "later"), STORE_OK);
    }
    struct node r = get(rejected), o = get(offline);
    assert_string_equal(r.state, "rejected");
    assert_string_equal(r.state_reason, "wrong model");
    assert_string_equal(o.state, "offline");
    assert_string_equal(o.state_reason, "no answer");
    assert_int_equal(o.updated_at, 1015);
}

static void test_an_offline_node_that_answers_is_ready_again(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    for (int i = 1; i <= MISS_LIMIT; i++)
        assert_int_equal(missed(node, 1000 + 5 * i, 0), STORE_OK);
    assert_string_equal(get(node).state, "offline");
    assert_int_equal(fx_beat(fx.s, node, 2000, FX_TST, 8, 0), STORE_OK);
    struct node got = get(node);
    assert_string_equal(got.state, "ready");
    assert_int_equal(got.missed_beats, 0);
    assert_int_equal(store_free_cards(fx.s, FX_TST), 8);
}

static void test_beat_missed_of_a_removed_or_unknown_node_is_not_found(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    assert_int_equal(store_node_remove(fx.s, node, 1100), STORE_OK);
    assert_int_equal(missed(node, 1200, LOST_AFTER), STORE_NOT_FOUND);
    assert_int_equal(missed("node_nosuch", 1200, LOST_AFTER), STORE_NOT_FOUND);
}

/* ---------------------------------------------------------------- admin state and removal */

static void test_admin_state_sets_a_node_aside_with_its_reason(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    assert_int_equal(store_node_set_admin_state(fx.s, node, "maintenance", "firmware", 1100), STORE_OK);
    struct node got = get(node);
    assert_string_equal(got.admin_state, "maintenance");
    assert_string_equal(got.state, "maintenance");
    assert_string_equal(got.state_reason, "firmware");
    assert_string_equal(got.admin_reason, "firmware");
    assert_int_equal(got.updated_at, 1100);
    assert_int_equal(store_free_cards(fx.s, FX_TST), 0);
    assert_int_equal(store_node_set_admin_state(fx.s, node, "active", "", 1200), STORE_OK);
    assert_string_equal(get(node).state, "ready");
    assert_int_equal(store_free_cards(fx.s, FX_TST), 8);
    assert_int_equal(store_node_set_admin_state(fx.s, node, "asleep", "", 1300), STORE_ERROR);
    assert_int_equal(store_node_set_admin_state(fx.s, "node_nosuch", "cordoned", "", 1300), STORE_NOT_FOUND);
    assert_int_equal(store_node_remove(fx.s, node, 1400), STORE_OK);
    assert_int_equal(store_node_set_admin_state(fx.s, node, "cordoned", "", 1500), STORE_NOT_FOUND);
}

static void test_remove_is_refused_while_cards_are_in_use(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, 1, "running", 1000, &in);
    assert_int_equal(fx_claim(fx.s, in.id, 0, node, 0x1), STORE_OK);
    assert_int_equal(store_node_remove(fx.s, node, 1100), STORE_CONFLICT);
    assert_string_equal(get(node).state, "ready");
    assert_int_equal(store_instance_release(fx.s, in.id), STORE_OK);
    assert_int_equal(store_node_remove(fx.s, node, 1200), STORE_OK);
    struct node n;
    assert_int_equal(store_node_get(fx.s, node, &n), STORE_NOT_FOUND);
    struct node_filter f = {.after_created = -1};
    struct node out[4];
    size_t count;
    assert_int_equal(store_node_list(fx.s, &f, out, 4, &count), STORE_OK);
    assert_int_equal(count, 0);
    struct node_target *t;
    assert_int_equal(store_node_targets(fx.s, &t, &count), STORE_OK);
    assert_int_equal(count, 0);
    free(t);
    assert_int_equal(store_node_remove(fx.s, node, 1300), STORE_NOT_FOUND);
}

static void test_targets_name_every_registered_node_with_what_a_beat_needs(void **state)
{
    setup_rows();
    char a[ID_MAX], b[ID_MAX];
    fx_node(fx.s, "a", FX_TST, 8, "f1", 1000, a);
    fx_ready_node(fx.s, "b", FX_TST, 4, "f1", 1000, b);
    assert_int_equal(missed(b, 1005, LOST_AFTER), STORE_OK);
    struct node_target *t;
    size_t n;
    assert_int_equal(store_node_targets(fx.s, &t, &n), STORE_OK);
    assert_int_equal(n, 2);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(t[i].id, a) == 0) {
            assert_string_equal(t[i].health, "unknown");
            assert_int_equal(t[i].last_seen_at, 0);
            assert_int_equal(t[i].workload_exits, -1);
            assert_int_equal(t[i].card_count, 8);
        } else {
            assert_string_equal(t[i].id, b);
            assert_string_equal(t[i].health, "up");
            assert_int_equal(t[i].missed_beats, 1);
            assert_int_equal(t[i].last_seen_at, 1000);
            assert_int_equal(t[i].workload_exits, 0);
            assert_string_equal(t[i].gpu_model, FX_TST);
            assert_int_equal(strlen(t[i].secret), 64);
        }
    }
    free(t);
}

/* ---------------------------------------------------------------- capacity history */

static int64_t capacity_rows(const char *node)
{
    return fx_sql_int(fx.s, "SELECT count(*) FROM node_capacity WHERE node_id = ?1", node);
}

/* "cards from to" of the node's i-th capacity interval ("" past the last). */
static void capacity_row(const char *node, int i, char *out, size_t n)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT cards || ' ' || from_at || ' ' || coalesce(to_at, 'open') FROM node_capacity"
             " WHERE node_id = ?1 ORDER BY from_at LIMIT 1 OFFSET %d",
             i);
    fx_sql_text(fx.s, sql, node, out, n);
}

static void test_capacity_follows_what_the_node_offers(void **state)
{
    setup_rows();
    char node[ID_MAX], row[64];
    fx_node(fx.s, "n1", FX_TST, 8, "f1", 500, node);
    assert_int_equal(capacity_rows(node), 0); /* pending offers nothing */
    assert_int_equal(fx_beat(fx.s, node, 1000, FX_TST, 8, 0), STORE_OK);
    capacity_row(node, 0, row, sizeof row);
    assert_string_equal(row, "8 1000 open");
    assert_int_equal(fx_beat(fx.s, node, 2000, FX_TST, 6, 0), STORE_OK);
    capacity_row(node, 0, row, sizeof row);
    assert_string_equal(row, "8 1000 2000");
    capacity_row(node, 1, row, sizeof row);
    assert_string_equal(row, "6 2000 open");
    assert_int_equal(store_node_beat_ok(fx.s, node, 3000, "{\"x\":1}", 0, "wrong", "", "", NULL, 0, 0), STORE_OK);
    capacity_row(node, 1, row, sizeof row);
    assert_string_equal(row, "6 2000 3000");
    assert_int_equal(fx_beat(fx.s, node, 4000, FX_TST, 6, 0), STORE_OK);
    capacity_row(node, 2, row, sizeof row);
    assert_string_equal(row, "6 4000 open");
    /* An offline node still counts as capacity; a removed one does not. */
    for (int i = 1; i <= MISS_LIMIT; i++)
        assert_int_equal(missed(node, 4000 + i, 0), STORE_OK);
    capacity_row(node, 2, row, sizeof row);
    assert_string_equal(row, "6 4000 open");
    assert_int_equal(store_node_remove(fx.s, node, 5000), STORE_OK);
    capacity_row(node, 2, row, sizeof row);
    assert_string_equal(row, "6 4000 5000");
    assert_int_equal(capacity_rows(node), 3);
}

static void test_capacity_sync_repeats_change_nothing_and_an_unknown_node_is_not_found(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    assert_int_equal(store_capacity_sync(fx.s, node, 1500), STORE_OK);
    assert_int_equal(store_capacity_sync(fx.s, node, 1600), STORE_OK);
    assert_int_equal(capacity_rows(node), 1);
    assert_int_equal(store_capacity_sync(fx.s, "node_nosuch", 1600), STORE_NOT_FOUND);
}

static void test_capacity_changes_within_one_second_leave_no_empty_interval(void **state)
{
    setup_rows();
    char node[ID_MAX], row[64];
    fx_node(fx.s, "n1", FX_TST, 8, "f1", 500, node);
    assert_int_equal(fx_beat(fx.s, node, 1000, FX_TST, 8, 0), STORE_OK);
    assert_int_equal(fx_beat(fx.s, node, 1000, FX_TST, 6, 0), STORE_OK);
    assert_int_equal(capacity_rows(node), 1);
    capacity_row(node, 0, row, sizeof row);
    assert_string_equal(row, "6 1000 open");
}

static void test_capacity_never_runs_backwards_when_the_clock_steps_back(void **state)
{
    setup_rows();
    char node[ID_MAX], row[64];
    fx_node(fx.s, "n1", FX_TST, 8, "f1", 500, node);
    assert_int_equal(fx_beat(fx.s, node, 2000, FX_TST, 8, 0), STORE_OK);
    assert_int_equal(fx_beat(fx.s, node, 3000, FX_TST, 6, 0), STORE_OK);
    assert_int_equal(fx_beat(fx.s, node, 1500, FX_TST, 4, 0), STORE_OK); /* the clock went back */
    capacity_row(node, 0, row, sizeof row);
    assert_string_equal(row, "8 2000 3000");
    capacity_row(node, 1, row, sizeof row);
    assert_string_equal(row, "4 3000 open");
    assert_int_equal(capacity_rows(node), 2);
}

/* ---------------------------------------------------------------- placement */

/* Nodes of 8 cards with `used` of them taken by an instance of alice. */
static void node_with_used(const char *name, const char *fabric, uint64_t used, char id[ID_MAX])
{
    fx_ready_node(fx.s, name, FX_TST, 8, fabric, 1000, id);
    if (!used)
        return;
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, __builtin_popcountll(used), "running", 1000, &in);
    assert_int_equal(fx_claim(fx.s, in.id, 0, id, used), STORE_OK);
}

static void best_fit(int64_t cards, char id[ID_MAX], uint64_t *mask)
{
    struct placement_node *p;
    size_t n;
    assert_int_equal(store_placement_candidates(fx.s, FX_TST, cards, &p, &n), STORE_OK);
    id[0] = '\0';
    if (n == 1) {
        memcpy(id, p[0].id, ID_MAX);
        *mask = p[0].free_mask;
        assert_int_equal(p[0].card_count, 8);
    }
    assert_true(n <= 1);
    free(p);
}

static void test_placement_best_fit_is_the_node_with_the_fewest_free_cards_that_fit(void **state)
{
    setup_rows();
    char a[ID_MAX], b[ID_MAX], c[ID_MAX], got[ID_MAX];
    uint64_t mask = 0;
    node_with_used("a", "f1", 0, a);     /* 8 free */
    node_with_used("b", "f1", 0x1f, b);  /* 3 free: 5, 6, 7 */
    node_with_used("c", "f1", 0x07, c);  /* 5 free: 3..7 */
    best_fit(3, got, &mask);
    assert_string_equal(got, b);
    assert_int_equal(mask, 0xe0);
    best_fit(4, got, &mask);
    assert_string_equal(got, c);
    assert_int_equal(mask, 0xf8);
    best_fit(6, got, &mask);
    assert_string_equal(got, a);
    assert_int_equal(mask, 0xff);
    best_fit(1, got, &mask);
    assert_string_equal(got, b);
    assert_int_equal(store_free_cards(fx.s, FX_TST), 16);
}

static void test_placement_skips_nodes_that_cannot_take_work(void **state)
{
    setup_rows();
    char ready[ID_MAX], cordoned[ID_MAX], quiet[ID_MAX], pending[ID_MAX], other[ID_MAX], broken[ID_MAX], got[ID_MAX];
    uint64_t mask = 0;
    node_with_used("ready", "f1", 0x3f, ready); /* 2 free */
    node_with_used("cordoned", "f1", 0, cordoned);
    assert_int_equal(store_node_set_admin_state(fx.s, cordoned, "cordoned", "", 1001), STORE_OK);
    node_with_used("quiet", "f1", 0, quiet);
    for (int i = 1; i <= MISS_LIMIT; i++)
        assert_int_equal(missed(quiet, 1000 + i, LOST_AFTER), STORE_OK);
    fx_node(fx.s, "pending", FX_TST, 8, "f1", 1000, pending);
    fx_ready_node(fx.s, "other", "MI450", 8, "f1", 1000, other);
    fx_node(fx.s, "broken", FX_TST, 8, "f1", 1000, broken);
    assert_int_equal(fx_beat(fx.s, broken, 1000, FX_TST, 8, 0xff), STORE_OK); /* every card failed */
    best_fit(2, got, &mask);
    assert_string_equal(got, ready);
    best_fit(3, got, &mask);
    assert_string_equal(got, "");
    assert_int_equal(store_free_cards(fx.s, FX_TST), 2);
    assert_int_equal(store_free_cards(fx.s, "MI450"), 8);
}

static void test_placement_of_more_than_a_node_offers_whole_free_nodes_by_fabric_then_name(void **state)
{
    setup_rows();
    char w1[ID_MAX], w2[ID_MAX], w3[ID_MAX], part[ID_MAX], small[ID_MAX];
    node_with_used("w-a", "f2", 0, w1);
    node_with_used("w-c", "f1", 0, w3);
    node_with_used("w-b", "f1", 0, w2);
    node_with_used("part", "f1", 0x1, part);
    fx_ready_node(fx.s, "small", FX_TST, 4, "f1", 1000, small);
    struct placement_node *p;
    size_t n;
    assert_int_equal(store_placement_candidates(fx.s, FX_TST, 16, &p, &n), STORE_OK);
    assert_int_equal(n, 3);
    assert_string_equal(p[0].id, w2);
    assert_string_equal(p[1].id, w3);
    assert_string_equal(p[2].id, w1);
    assert_string_equal(p[2].fabric, "f2");
    for (size_t i = 0; i < n; i++)
        assert_int_equal(p[i].free_mask, 0xff);
    free(p);
    assert_int_equal(store_placement_candidates(fx.s, "MI450", 16, &p, &n), STORE_OK);
    assert_int_equal(n, 0);
    free(p);
}

/* ---------------------------------------------------------------- metrics */

static void test_metrics_count_nodes_by_state_and_model(void **state)
{
    setup_rows();
    char a[ID_MAX], b[ID_MAX], c[ID_MAX], d[ID_MAX];
    fx_ready_node(fx.s, "a", FX_TST, 8, "f1", 1000, a);
    fx_ready_node(fx.s, "b", FX_TST, 8, "f1", 1000, b);
    fx_node(fx.s, "c", FX_TST, 8, "f1", 1000, c);
    fx_ready_node(fx.s, "d", "MI450", 8, "f1", 1000, d);
    struct metric_row *m;
    size_t n;
    assert_int_equal(store_metrics_nodes(fx.s, &m, &n), STORE_OK);
    assert_int_equal(n, 3);
    assert_string_equal(m[0].a, "pending");
    assert_string_equal(m[0].b, FX_TST);
    assert_int_equal(m[0].value, 1);
    assert_string_equal(m[1].a, "ready");
    assert_string_equal(m[1].b, "MI450");
    assert_int_equal(m[1].value, 1);
    assert_string_equal(m[2].a, "ready");
    assert_string_equal(m[2].b, FX_TST);
    assert_int_equal(m[2].value, 2);
    free(m);
}

/* ---------------------------------------------------------------- data-plane address (0019) */

static void test_data_address_from_facts_and_hosts_from_the_admin(void **state)
{
    setup_rows();
    char id[ID_MAX];
    fx_node(fx.s, "dp-1", FX_TST, 8, "f", 100, id);
    struct node n = get(id);
    assert_string_equal(n.data_host, "");
    assert_string_equal(n.data_address, "");
    assert_int_equal(store_node_set_data_address(fx.s, id, "10.0.0.5"), STORE_OK);
    assert_string_equal(get(id).data_address, "10.0.0.5");
    /* The same report again writes nothing. */
    int64_t before = sqlite3_total_changes(store_db(fx.s));
    assert_int_equal(store_node_set_data_address(fx.s, id, "10.0.0.5"), STORE_OK);
    assert_int_equal(sqlite3_total_changes(store_db(fx.s)), before);
    assert_int_equal(store_node_set_data_address(fx.s, id, ""), STORE_OK);
    assert_int_equal(fx_sql_int(fx.s, "SELECT data_address IS NULL FROM nodes WHERE id = ?", id), 1);
    /* NULL leaves a host as it is; "" clears it. */
    assert_int_equal(store_node_set_hosts(fx.s, id, NULL, "ib0.example", 200), STORE_OK);
    n = get(id);
    assert_string_equal(n.data_host, "ib0.example");
    assert_int_equal(n.updated_at, 200);
    assert_int_equal(store_node_set_hosts(fx.s, id, "pub.example", NULL, 201), STORE_OK);
    n = get(id);
    assert_string_equal(n.public_host, "pub.example");
    assert_string_equal(n.data_host, "ib0.example");
    assert_int_equal(store_node_set_hosts(fx.s, id, NULL, "", 202), STORE_OK);
    assert_string_equal(get(id).data_host, "");
    assert_int_equal(store_node_set_hosts(fx.s, "node_00000000000000000000", NULL, "x", 203), STORE_NOT_FOUND);
    assert_int_equal(store_node_remove(fx.s, id, 300), STORE_OK);
    assert_int_equal(store_node_set_hosts(fx.s, id, "a", "b", 301), STORE_NOT_FOUND);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        fx_test(test_node_insert_and_get_round_trip_as_pending),
        fx_test(test_node_insert_refuses_an_unknown_model_and_a_taken_name),
        fx_test(test_node_list_filters_by_state_model_and_fabric),
        fx_test(test_node_list_pages_by_creation_with_a_cursor),
        fx_test(test_node_cards_are_listed_by_index_with_their_holder),
        fx_test(test_beat_ok_replaces_card_facts_but_keeps_cards_in_use),
        fx_test(test_beat_ok_rejected_keeps_its_reason_and_offers_no_cards),
        fx_test(test_beat_ok_with_unchanged_facts_moves_only_the_time),
        fx_test(test_targets_of_some_nodes_and_of_those_never_reached),
        fx_test(test_the_facts_digest_is_kept_and_a_seen_beat_moves_only_the_time),
        fx_test(test_beat_ok_for_a_removed_node_is_not_found),
        fx_test(test_beats_missed_below_the_limit_only_count),
        fx_test(test_miss_limit_beats_make_an_up_node_unreachable_keeping_its_cards),
        fx_test(test_an_unreachable_node_goes_offline_lost_after_s_after_its_last_good_beat),
        fx_test(test_a_good_beat_brings_an_unreachable_node_back),
        fx_test(test_a_repeated_beat_and_a_miss_below_the_limit_leave_the_nodes_row_alone),
        fx_test(test_migrations_0034_and_0036_keep_what_each_node_last_said),
        fx_test(test_a_never_reached_node_goes_offline_at_the_limit),
        fx_test(test_lost_after_zero_takes_an_up_node_offline_at_the_limit),
        fx_test(test_rejected_and_offline_nodes_stay_as_they_are_when_missing_beats),
        fx_test(test_an_offline_node_that_answers_is_ready_again),
        fx_test(test_beat_missed_of_a_removed_or_unknown_node_is_not_found),
        fx_test(test_admin_state_sets_a_node_aside_with_its_reason),
        fx_test(test_remove_is_refused_while_cards_are_in_use),
        fx_test(test_targets_name_every_registered_node_with_what_a_beat_needs),
        fx_test(test_capacity_follows_what_the_node_offers),
        fx_test(test_capacity_sync_repeats_change_nothing_and_an_unknown_node_is_not_found),
        fx_test(test_data_address_from_facts_and_hosts_from_the_admin),
        fx_test(test_capacity_changes_within_one_second_leave_no_empty_interval),
        fx_test(test_capacity_never_runs_backwards_when_the_clock_steps_back),
        fx_test(test_placement_best_fit_is_the_node_with_the_fewest_free_cards_that_fit),
        fx_test(test_placement_skips_nodes_that_cannot_take_work),
        fx_test(test_placement_of_more_than_a_node_offers_whole_free_nodes_by_fabric_then_name),
        fx_test(test_metrics_count_nodes_by_state_and_model),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
