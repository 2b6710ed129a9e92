/* test_store_instances.c: the SQL of instances (store_instances.c): rows,
 * lists and the reconciler's unsettled set, state changes and their events,
 * desired state and attempts, claiming and releasing cards, the agents'
 * phases, running intervals (open, close, the open one), placed workloads,
 * card quotas, the instance metrics, what keeps a placement from new
 * workloads, and one node as a placement candidate. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_fixtures.h"

static char alice[ID_MAX], bob[ID_MAX];

static void setup_rows(void)
{
    fx_user(fx.s, "alice@example.com", ROLE_USER, alice);
    fx_user(fx.s, "bob@example.com", ROLE_USER, bob);
    fx_tst_type(fx.s);
}

static struct instance get(const char *id)
{
    struct instance in;
    assert_int_equal(store_instance_get(fx.s, NULL, id, &in), STORE_OK);
    return in;
}

static int64_t events(const char *id)
{
    return fx_sql_int(fx.s, "SELECT count(*) FROM instance_events WHERE instance_id = ?1", id);
}

/* ---------------------------------------------------------------- rows */

static void test_instance_round_trips_and_is_only_its_owner_s(void **state)
{
    setup_rows();
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, 4, "pending", 1000, &in);
    struct instance got;
    assert_int_equal(store_instance_get(fx.s, alice, in.id, &got), STORE_OK);
    assert_string_equal(got.user_id, alice);
    assert_string_equal(got.name, "job");
    assert_string_equal(got.gpu_model, FX_TST);
    assert_int_equal(got.card_count, 4);
    assert_string_equal(got.image, "rocm/pytorch:2.3-rocm6.2");
    assert_string_equal(got.volume_id, in.volume_id);
    assert_string_equal(got.desired, "running");
    assert_string_equal(got.state, "pending");
    assert_string_equal(got.phase, "");
    assert_int_equal(got.attempts, 0);
    assert_int_equal(got.state_since, 1000);
    assert_int_equal(got.created_at, 1000);
    assert_int_equal(store_instance_get(fx.s, bob, in.id, &got), STORE_NOT_FOUND);
    assert_int_equal(store_instance_get(fx.s, NULL, in.id, &got), STORE_OK);
    assert_int_equal(store_instance_get(fx.s, NULL, "ins_nosuch", &got), STORE_NOT_FOUND);
    /* The table's CHECKs hold: no instance of no cards. */
    struct instance bad = in;
    assert_int_equal(id_new("ins", bad.id), 0);
    bad.card_count = 0;
    assert_int_equal(store_instance_insert(fx.s, &bad), STORE_ERROR);
    assert_int_equal(store_instance_insert(fx.s, &in), STORE_CONFLICT);
}

static void test_instance_list_filters_by_owner_and_state_with_a_cursor(void **state)
{
    setup_rows();
    struct instance a1, a2, a3, b1;
    fx_instance(fx.s, alice, FX_TST, 1, "running", 100, &a1);
    fx_instance(fx.s, alice, FX_TST, 1, "stopped", 200, &a2);
    fx_instance(fx.s, alice, FX_TST, 1, "running", 300, &a3);
    fx_instance(fx.s, bob, FX_TST, 1, "running", 150, &b1);
    struct instance out[8];
    size_t n;
    struct instance_filter hers = {.user_id = alice, .after_created = -1};
    assert_int_equal(store_instance_list(fx.s, &hers, out, 8, &n), STORE_OK);
    assert_int_equal(n, 3);
    assert_string_equal(out[0].id, a1.id);
    assert_string_equal(out[2].id, a3.id);
    struct instance_filter running = {.user_id = alice, .state = "running", .after_created = -1};
    assert_int_equal(store_instance_list(fx.s, &running, out, 8, &n), STORE_OK);
    assert_int_equal(n, 2);
    struct instance_filter all_running = {.state = "running", .after_created = -1};
    assert_int_equal(store_instance_list(fx.s, &all_running, out, 8, &n), STORE_OK);
    assert_int_equal(n, 3);
    assert_string_equal(out[1].id, b1.id);
    struct instance_filter page = {.user_id = alice, .after_created = -1};
    assert_int_equal(store_instance_list(fx.s, &page, out, 1, &n), STORE_OK);
    assert_int_equal(n, 1);
    page.after_created = out[0].created_at;
    page.after_id = a1.id;
    assert_int_equal(store_instance_list(fx.s, &page, out, 1, &n), STORE_OK);
    assert_string_equal(out[0].id, a2.id);
}

static void test_unsettled_are_those_holding_cards_or_still_to_be_removed(void **state)
{
    setup_rows();
    static const char *const holding[] = {"pending", "provisioning", "running", "stopping", "unreachable"};
    static const char *const settled[] = {"stopped", "terminated", "failed", "lost"};
    struct instance in;
    for (size_t i = 0; i < 5; i++)
        fx_instance(fx.s, alice, FX_TST, 1, holding[i], 100 + (int64_t)i, &in);
    for (size_t i = 0; i < 4; i++)
        fx_instance(fx.s, alice, FX_TST, 1, settled[i], 200 + (int64_t)i, &in);
    struct instance doomed;
    fx_instance(fx.s, alice, FX_TST, 1, "stopped", 300, &doomed);
    assert_int_equal(store_instance_set_desired(fx.s, doomed.id, "terminated", 301), STORE_OK);
    struct instance *u;
    size_t n;
    assert_int_equal(store_instance_unsettled(fx.s, &u, &n), STORE_OK);
    assert_int_equal(n, 6);
    for (size_t i = 0; i < 5; i++)
        assert_string_equal(u[i].state, holding[i]);
    assert_string_equal(u[5].id, doomed.id);
    free(u);
}

/* ---------------------------------------------------------------- state, events, desired, attempts */

static void test_set_state_logs_an_event_when_state_or_phase_changes(void **state)
{
    setup_rows();
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, 1, "pending", 100, &in);
    assert_int_equal(store_instance_set_state(fx.s, in.id, "provisioning", "pulling", "placed", 110), STORE_OK);
    assert_int_equal(events(in.id), 1);
    assert_int_equal(store_instance_set_state(fx.s, in.id, "provisioning", "mounting", "", 120), STORE_OK);
    assert_int_equal(events(in.id), 2);
    /* Nothing new: nothing is written, not even the time. */
    int before = sqlite3_total_changes(store_db(fx.s));
    assert_int_equal(store_instance_set_state(fx.s, in.id, "provisioning", "mounting", "", 130), STORE_OK);
    assert_int_equal(sqlite3_total_changes(store_db(fx.s)), before);
    assert_int_equal(events(in.id), 2);
    struct instance got = get(in.id);
    assert_string_equal(got.phase, "mounting");
    assert_int_equal(got.state_since, 110); /* the phase is not a state change */
    assert_int_equal(got.updated_at, 120);
    /* A new reason alone is kept, without an event. */
    assert_int_equal(store_instance_set_state(fx.s, in.id, "provisioning", "mounting", "slow mirror", 135), STORE_OK);
    assert_int_equal(events(in.id), 2);
    got = get(in.id);
    assert_string_equal(got.state, "provisioning");
    assert_string_equal(got.state_reason, "slow mirror");
    assert_int_equal(got.state_since, 110);
    assert_int_equal(got.updated_at, 135);
    assert_int_equal(store_instance_set_state(fx.s, in.id, "running", "", NULL, 140), STORE_OK);
    got = get(in.id);
    assert_int_equal(got.state_since, 140);
    assert_string_equal(got.state_reason, "");
    struct instance_event e[8];
    size_t n;
    assert_int_equal(store_instance_events(fx.s, in.id, 0, e, 8, &n), STORE_OK);
    assert_int_equal(n, 3);
    assert_string_equal(e[0].state, "provisioning");
    assert_string_equal(e[0].reason, "placed");
    assert_int_equal(e[0].at, 110);
    assert_string_equal(e[1].state, "mounting");
    assert_string_equal(e[1].reason, "the slowest node reached this phase");
    assert_string_equal(e[2].state, "running");
    assert_int_equal(store_instance_set_state(fx.s, "ins_nosuch", "running", "", "", 150), STORE_NOT_FOUND);
}

/* A create sets the job fields and the rendezvous timeout a new row already
 * has: such a call writes nothing; any change is written. */
static void test_job_and_rendezvous_timeout_are_written_only_when_they_change(void **state)
{
    setup_rows();
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, 1, "pending", 100, &in);
    sqlite3 *db = store_db(fx.s);
    int before = sqlite3_total_changes(db);
    assert_int_equal(store_instance_set_job(fx.s, in.id, "never", 0), STORE_OK);
    assert_int_equal(store_instance_set_rendezvous_timeout(fx.s, in.id, 600), STORE_OK);
    assert_int_equal(sqlite3_total_changes(db), before);
    assert_int_equal(store_instance_set_job(fx.s, in.id, "on_failure", 0), STORE_OK);
    assert_int_equal(store_instance_set_job(fx.s, in.id, "on_failure", 90), STORE_OK);
    assert_int_equal(store_instance_set_rendezvous_timeout(fx.s, in.id, 120), STORE_OK);
    assert_int_equal(sqlite3_total_changes(db), before + 3);
    struct instance got = get(in.id);
    assert_string_equal(got.restart_policy, "on_failure");
    assert_int_equal(got.max_runtime_minutes, 90);
    assert_int_equal(fx_sql_int(fx.s, "SELECT rendezvous_timeout_s FROM instances WHERE id = ?1", in.id), 120);
    assert_int_equal(store_instance_set_job(fx.s, in.id, "on_failure", 0), STORE_OK); /* the bound taken away */
    assert_int_equal(get(in.id).max_runtime_minutes, 0);
    assert_int_equal(sqlite3_total_changes(db), before + 4);
}

static void test_events_page_after_a_sequence_number(void **state)
{
    setup_rows();
    struct instance in, other;
    fx_instance(fx.s, alice, FX_TST, 1, "pending", 100, &in);
    fx_instance(fx.s, alice, FX_TST, 1, "pending", 100, &other);
    for (int i = 0; i < 5; i++) {
        char reason[16];
        snprintf(reason, sizeof reason, "r%d", i);
        assert_int_equal(store_instance_event(fx.s, in.id, 100 + i, "note", reason), STORE_OK);
        assert_int_equal(store_instance_event(fx.s, other.id, 100 + i, "note", NULL), STORE_OK);
    }
    struct instance_event e[2];
    size_t n;
    assert_int_equal(store_instance_events(fx.s, in.id, 0, e, 2, &n), STORE_OK);
    assert_int_equal(n, 2);
    assert_string_equal(e[1].reason, "r1");
    assert_int_equal(store_instance_events(fx.s, in.id, e[1].seq, e, 2, &n), STORE_OK);
    assert_int_equal(n, 2);
    assert_string_equal(e[0].reason, "r2");
    assert_true(e[0].seq < e[1].seq);
    assert_int_equal(store_instance_events(fx.s, in.id, e[1].seq, e, 2, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_string_equal(e[0].reason, "r4");
}

static void test_desired_state_and_attempts_are_recorded(void **state)
{
    setup_rows();
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, 1, "running", 100, &in);
    assert_int_equal(store_instance_set_desired(fx.s, in.id, "stopped", 200), STORE_OK);
    assert_int_equal(store_instance_set_attempts(fx.s, in.id, 2, 260), STORE_OK);
    struct instance got = get(in.id);
    assert_string_equal(got.desired, "stopped");
    assert_int_equal(got.updated_at, 200);
    assert_int_equal(got.attempts, 2);
    assert_int_equal(got.next_attempt_at, 260);
    assert_int_equal(events(in.id), 0);
    assert_int_equal(store_instance_set_desired(fx.s, in.id, "paused", 300), STORE_ERROR);
    assert_int_equal(store_instance_set_desired(fx.s, "ins_nosuch", "stopped", 300), STORE_NOT_FOUND);
    assert_int_equal(store_instance_set_attempts(fx.s, "ins_nosuch", 1, 0), STORE_NOT_FOUND);
}

/* ---------------------------------------------------------------- placement on cards */

static void test_claim_gives_the_cards_and_records_the_placement(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, 2, "pending", 1000, &in);
    assert_int_equal(store_instance_claim(fx.s, in.id, 0, node, "wl_one", 0x0a), STORE_OK);
    struct instance_node p[4];
    size_t n;
    assert_int_equal(store_instance_nodes(fx.s, in.id, p, 4, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_int_equal(p[0].rank, 0);
    assert_string_equal(p[0].node_id, node);
    assert_string_equal(p[0].node_name, "n1");
    assert_string_equal(p[0].agent_url, "http://10.0.0.1:8081/n1");
    assert_string_equal(p[0].node_health, "up");
    assert_int_equal(p[0].node_last_seen, 1000);
    assert_string_equal(p[0].workload_id, "wl_one");
    assert_string_equal(p[0].cards, "[1,3]");
    assert_string_equal(p[0].phase, "");
    assert_int_equal(p[0].put_done, 0);
    struct node_card c[8];
    assert_int_equal(store_node_cards(fx.s, node, c, 8, &n), STORE_OK);
    assert_string_equal(c[1].instance_id, in.id);
    assert_string_equal(c[3].instance_id, in.id);
    assert_string_equal(c[2].instance_id, "");
    assert_int_equal(store_free_cards(fx.s, FX_TST), 6);
}

struct claim_ctx {
    const char *instance, *node;
    uint64_t mask;
};

static int claim_txn(struct store *s, void *vctx)
{
    struct claim_ctx *c = vctx;
    char wl[ID_MAX];
    id_new("wl", wl);
    return store_instance_claim(s, c->instance, 0, c->node, wl, c->mask);
}

static void test_claim_of_a_taken_or_failed_card_is_a_conflict_and_leaves_nothing(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    assert_int_equal(fx_beat(fx.s, node, 1000, FX_TST, 8, 0x80), STORE_OK); /* card 7 failed */
    struct instance a, b;
    fx_instance(fx.s, alice, FX_TST, 1, "pending", 1000, &a);
    fx_instance(fx.s, bob, FX_TST, 2, "pending", 1000, &b);
    assert_int_equal(fx_claim(fx.s, a.id, 0, node, 0x08), STORE_OK); /* card 3 */
    struct claim_ctx taken = {b.id, node, 0x0c};                      /* cards 2 and 3 */
    assert_int_equal(store_txn(fx.s, claim_txn, &taken), STORE_CONFLICT);
    struct claim_ctx failed = {b.id, node, 0x81};                     /* cards 0 and 7 */
    assert_int_equal(store_txn(fx.s, claim_txn, &failed), STORE_CONFLICT);
    struct node_card c[8];
    size_t n;
    assert_int_equal(store_node_cards(fx.s, node, c, 8, &n), STORE_OK);
    assert_string_equal(c[0].instance_id, "");
    assert_string_equal(c[2].instance_id, "");
    assert_string_equal(c[3].instance_id, a.id);
    struct instance_node p[2];
    assert_int_equal(store_instance_nodes(fx.s, b.id, p, 2, &n), STORE_OK);
    assert_int_equal(n, 0);
}

static void test_release_frees_every_card_and_forgets_the_placement(void **state)
{
    setup_rows();
    char n1[ID_MAX], n2[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, n1);
    fx_ready_node(fx.s, "n2", FX_TST, 8, "f1", 1000, n2);
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, 16, "pending", 1000, &in);
    assert_int_equal(fx_claim(fx.s, in.id, 0, n1, 0xff), STORE_OK);
    assert_int_equal(fx_claim(fx.s, in.id, 1, n2, 0xff), STORE_OK);
    assert_int_equal(store_free_cards(fx.s, FX_TST), 0);
    struct instance_node p[4];
    size_t n;
    assert_int_equal(store_instance_nodes(fx.s, in.id, p, 4, &n), STORE_OK);
    assert_int_equal(n, 2);
    assert_int_equal(p[1].rank, 1);
    assert_string_equal(p[1].node_id, n2);
    assert_int_equal(store_instance_release(fx.s, in.id), STORE_OK);
    assert_int_equal(store_free_cards(fx.s, FX_TST), 16);
    assert_int_equal(store_instance_nodes(fx.s, in.id, p, 4, &n), STORE_OK);
    assert_int_equal(n, 0);
    assert_int_equal(store_instance_release(fx.s, in.id), STORE_OK); /* nothing left: still fine */
}

/* What keeps a placement from new workloads: a card it holds that failed
 * (the first by rank and index; another's failed card is not its concern),
 * and a node of it set aside, silent or removed, as the admin API names it. */
static void test_unfit_names_a_failed_held_card_and_a_node_set_aside(void **state)
{
    setup_rows();
    char n1[ID_MAX], n2[ID_MAX], n3[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, n1);
    fx_ready_node(fx.s, "n2", FX_TST, 8, "f1", 1000, n2);
    fx_ready_node(fx.s, "n3", FX_TST, 8, "f1", 1000, n3);
    struct instance gang, one;
    fx_instance(fx.s, alice, FX_TST, 16, "pending", 1000, &gang);
    assert_int_equal(fx_claim(fx.s, gang.id, 0, n1, 0xff), STORE_OK);
    assert_int_equal(fx_claim(fx.s, gang.id, 1, n2, 0xff), STORE_OK);
    fx_instance(fx.s, bob, FX_TST, 2, "pending", 1000, &one);
    assert_int_equal(fx_claim(fx.s, one.id, 0, n3, 0x03), STORE_OK);
    struct placement_unfit u;
    assert_int_equal(store_instance_unfit(fx.s, gang.id, &u), STORE_OK);
    assert_int_equal(u.failed_card, -1);
    assert_string_equal(u.failed_node, "");
    assert_string_equal(u.aside_node, "");
    /* Cards 2 and 5 of rank 1's node fail; card 7 of n3, which one does not hold. */
    assert_int_equal(fx_beat(fx.s, n2, 1001, FX_TST, 8, 0x24), STORE_OK);
    assert_int_equal(fx_beat(fx.s, n3, 1001, FX_TST, 8, 0x80), STORE_OK);
    assert_int_equal(store_instance_unfit(fx.s, gang.id, &u), STORE_OK);
    assert_string_equal(u.failed_node, "n2");
    assert_int_equal(u.failed_card, 2);
    assert_string_equal(u.aside_node, "");
    assert_int_equal(store_instance_unfit(fx.s, one.id, &u), STORE_OK);
    assert_int_equal(u.failed_card, -1);
    assert_string_equal(u.aside_node, "");
    /* Rank 0's node set aside, then silent: named by rank. */
    assert_int_equal(store_node_set_admin_state(fx.s, n1, "draining", "PSU", 1002), STORE_OK);
    assert_int_equal(store_instance_unfit(fx.s, gang.id, &u), STORE_OK);
    assert_string_equal(u.aside_node, "n1");
    assert_string_equal(u.aside_state, "draining");
    assert_int_equal(u.failed_card, 2);
    for (int i = 1; i <= 3; i++)
        assert_int_equal(store_node_beat_missed(fx.s, n1, 1002 + i, 3, 600, "timeout"), STORE_OK);
    assert_int_equal(store_instance_unfit(fx.s, gang.id, &u), STORE_OK);
    assert_string_equal(u.aside_state, "unreachable");
    assert_int_equal(store_instance_unfit(fx.s, "ins_none", &u), STORE_OK);
    assert_int_equal(u.failed_card, -1);
    assert_string_equal(u.aside_node, "");
}

/* The one node asked for, when it is a candidate with the cards free. */
static void test_candidate_node_is_that_node_only_while_it_has_room(void **state)
{
    setup_rows();
    char n1[ID_MAX], n2[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, n1);
    fx_ready_node(fx.s, "n2", FX_TST, 8, "f1", 1000, n2);
    struct placement_node *c;
    size_t n;
    assert_int_equal(store_placement_candidate_node(fx.s, FX_TST, 4, 0, "on_demand", n1, &c, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_string_equal(c[0].id, n1);
    assert_int_equal(c[0].free_mask, 0xff);
    free(c);
    struct instance in;
    fx_instance(fx.s, bob, FX_TST, 6, "running", 1000, &in);
    assert_int_equal(fx_claim(fx.s, in.id, 0, n1, 0x3f), STORE_OK);
    assert_int_equal(fx_beat(fx.s, n1, 1001, FX_TST, 8, 0x80), STORE_OK); /* card 7 failed */
    assert_int_equal(store_placement_candidate_node(fx.s, FX_TST, 2, 0, "on_demand", n1, &c, &n), STORE_OK);
    assert_int_equal(n, 0);
    free(c);
    assert_int_equal(store_placement_candidate_node(fx.s, FX_TST, 1, 0, "on_demand", n1, &c, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_int_equal(c[0].free_mask, 0x40);
    free(c);
    assert_int_equal(store_placement_candidate_node(fx.s, FX_TST, 1, 0, "reserved", n1, &c, &n), STORE_OK);
    assert_int_equal(n, 0);
    free(c);
    assert_int_equal(store_node_set_admin_state(fx.s, n2, "cordoned", "test", 1002), STORE_OK);
    assert_int_equal(store_placement_candidate_node(fx.s, FX_TST, 1, 0, "on_demand", n2, &c, &n), STORE_OK);
    assert_int_equal(n, 0);
    free(c);
}

/* Host ports: the lowest free ones of the node's range, never one port to
 * two instances, too few is a conflict, released with the cards; nodes
 * without a range or without enough free ports are no candidates. */
static void test_host_ports_are_claimed_like_cards(void **state)
{
    setup_rows();
    char node[ID_MAX], bare[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    fx_ready_node(fx.s, "n2", FX_TST, 8, "f1", 1000, bare);
    assert_int_equal(store_node_set_publish(fx.s, node, 30000, 30003), STORE_OK);
    assert_int_equal(store_node_set_publish(fx.s, node, 30000, 30003), STORE_OK); /* unchanged: still fine */
    assert_int_equal(store_node_set_publish(fx.s, "node_nosuchnode000000000", 1, 2), STORE_NOT_FOUND);
    struct instance a, b, c;
    fx_instance(fx.s, alice, FX_TST, 1, "pending", 1000, &a);
    fx_instance(fx.s, alice, FX_TST, 1, "pending", 1000, &b);
    fx_instance(fx.s, alice, FX_TST, 1, "pending", 1000, &c);
    assert_int_equal(store_instance_set_ports(fx.s, a.id, "[8888,6006,22]"), STORE_OK);
    int64_t ports[STORE_MAX_PORTS];
    size_t n_ports;
    assert_int_equal(store_instance_ports(fx.s, a.id, ports, &n_ports), STORE_OK);
    assert_int_equal(n_ports, 3);
    assert_int_equal(ports[0], 8888);
    assert_int_equal(ports[2], 22);
    assert_int_equal(store_instance_ports(fx.s, b.id, ports, &n_ports), STORE_OK);
    assert_int_equal(n_ports, 0);

    /* Only the node with a range and 3 free ports is a candidate. */
    struct placement_node *cand;
    size_t n;
    assert_int_equal(store_placement_candidates_ports(fx.s, FX_TST, 1, 3, &cand, &n), STORE_OK);
    assert_int_equal(n, 1);
    assert_string_equal(cand[0].id, node);
    free(cand);
    assert_int_equal(store_placement_candidates_ports(fx.s, FX_TST, 1, 5, &cand, &n), STORE_OK);
    assert_int_equal(n, 0);
    free(cand);

    const int64_t three[] = {8888, 6006, 22}, one[] = {80};
    assert_int_equal(fx_claim(fx.s, a.id, 0, node, 0x01), STORE_OK);
    assert_int_equal(store_instance_claim_ports(fx.s, a.id, 0, node, three, 3), STORE_OK);
    struct instance_node p[2];
    assert_int_equal(store_instance_nodes(fx.s, a.id, p, 2, &n), STORE_OK);
    assert_string_equal(p[0].ports,
                        "[{\"container\":8888,\"host\":30000},{\"container\":6006,\"host\":30001},"
                        "{\"container\":22,\"host\":30002}]");
    /* One port left: b takes it, c finds none; the bare node has no range. */
    assert_int_equal(fx_claim(fx.s, b.id, 0, node, 0x02), STORE_OK);
    assert_int_equal(store_instance_claim_ports(fx.s, b.id, 0, node, one, 1), STORE_OK);
    assert_int_equal(store_instance_nodes(fx.s, b.id, p, 2, &n), STORE_OK);
    assert_string_equal(p[0].ports, "[{\"container\":80,\"host\":30003}]");
    assert_int_equal(fx_claim(fx.s, c.id, 0, node, 0x04), STORE_OK);
    assert_int_equal(store_instance_claim_ports(fx.s, c.id, 0, node, one, 1), STORE_CONFLICT);
    assert_int_equal(store_instance_claim_ports(fx.s, c.id, 0, bare, one, 1), STORE_CONFLICT);
    /* The primary key holds even against a direct write. */
    fx_sql_exec(fx.s, "SAVEPOINT dup");
    char sql[256];
    snprintf(sql, sizeof sql,
             "INSERT INTO node_ports (node_id, host_port, instance_id, container_port) VALUES ('%s', 30003, '%s', 1)",
             node, c.id);
    assert_int_not_equal(sqlite3_exec(store_db(fx.s), sql, NULL, NULL, NULL), SQLITE_OK);
    fx_sql_exec(fx.s, "RELEASE dup");
    /* Released with the cards: the lowest ports come free again. */
    assert_int_equal(store_instance_release(fx.s, a.id), STORE_OK);
    assert_int_equal(fx_sql_int(fx.s, "SELECT count(*) FROM node_ports WHERE instance_id = ?", a.id), 0);
    assert_int_equal(store_instance_claim_ports(fx.s, c.id, 0, node, three, 2), STORE_OK);
    assert_int_equal(store_instance_nodes(fx.s, c.id, p, 2, &n), STORE_OK);
    assert_string_equal(p[0].ports, "[{\"container\":8888,\"host\":30000},{\"container\":6006,\"host\":30001}]");
    /* A node that stops publishing is no candidate for ports any more. */
    assert_int_equal(store_node_set_publish(fx.s, node, 0, 0), STORE_OK);
    assert_int_equal(store_placement_candidates_ports(fx.s, FX_TST, 1, 1, &cand, &n), STORE_OK);
    assert_int_equal(n, 0);
    free(cand);
}

static void test_node_update_records_the_agent_s_phase(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, 1, "provisioning", 1000, &in);
    assert_int_equal(fx_claim(fx.s, in.id, 0, node, 0x1), STORE_OK);
    assert_int_equal(store_instance_node_update(fx.s, in.id, 0, "pulling", "layer 3 of 9", 1), STORE_OK);
    struct instance_node p[2];
    size_t n;
    assert_int_equal(store_instance_nodes(fx.s, in.id, p, 2, &n), STORE_OK);
    assert_string_equal(p[0].phase, "pulling");
    assert_string_equal(p[0].message, "layer 3 of 9");
    assert_int_equal(p[0].put_done, 1);
    assert_int_equal(store_instance_node_update(fx.s, in.id, 1, "pulling", "", 1), STORE_NOT_FOUND);
    /* The same report again writes nothing; any change is written. */
    int before = sqlite3_total_changes(store_db(fx.s));
    assert_int_equal(store_instance_node_update(fx.s, in.id, 0, "pulling", "layer 3 of 9", 1), STORE_NOT_FOUND);
    assert_int_equal(sqlite3_total_changes(store_db(fx.s)), before);
    assert_int_equal(store_instance_node_update(fx.s, in.id, 0, "pulling", "layer 4 of 9", 1), STORE_OK);
    assert_int_equal(store_instance_node_update(fx.s, in.id, 0, "pulling", "layer 4 of 9", 0), STORE_OK);
    assert_int_equal(store_instance_node_update(fx.s, in.id, 0, "running", "layer 4 of 9", 0), STORE_OK);
    assert_int_equal(store_instance_nodes(fx.s, in.id, p, 2, &n), STORE_OK);
    assert_string_equal(p[0].phase, "running");
    assert_string_equal(p[0].message, "layer 4 of 9");
    assert_int_equal(p[0].put_done, 0);
}

static void test_instance_nodes_show_a_quiet_node_as_unreachable(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, 1, "running", 1000, &in);
    assert_int_equal(fx_claim(fx.s, in.id, 0, node, 0x1), STORE_OK);
    for (int i = 1; i <= 3; i++)
        assert_int_equal(store_node_beat_missed(fx.s, node, 1000 + i, 3, 600, "timeout"), STORE_OK);
    struct instance_node p[2];
    size_t n;
    assert_int_equal(store_instance_nodes(fx.s, in.id, p, 2, &n), STORE_OK);
    assert_string_equal(p[0].node_health, "unreachable");
    assert_int_equal(p[0].node_last_seen, 1000);
}

static void test_placed_workloads_are_every_workload_id_sorted_or_those_of_some_nodes(void **state)
{
    setup_rows();
    char node[ID_MAX];
    fx_ready_node(fx.s, "n1", FX_TST, 8, "f1", 1000, node);
    struct instance a, b;
    fx_instance(fx.s, alice, FX_TST, 1, "running", 1000, &a);
    fx_instance(fx.s, bob, FX_TST, 1, "running", 1000, &b);
    assert_int_equal(store_instance_claim(fx.s, a.id, 0, node, "wl_zz", 0x1), STORE_OK);
    assert_int_equal(store_instance_claim(fx.s, b.id, 0, node, "wl_aa", 0x2), STORE_OK);
    char other[ID_MAX];
    fx_ready_node(fx.s, "n2", FX_TST, 8, "f1", 1000, other);
    struct instance c;
    fx_instance(fx.s, alice, FX_TST, 1, "running", 1000, &c);
    assert_int_equal(store_instance_claim(fx.s, c.id, 0, other, "wl_mm", 0x1), STORE_OK);
    char(*w)[ID_MAX];
    size_t n;
    assert_int_equal(store_placed_workloads(fx.s, NULL, 0, &w, &n), STORE_OK);
    assert_int_equal(n, 3);
    assert_string_equal(w[0], "wl_aa");
    assert_string_equal(w[1], "wl_mm");
    assert_string_equal(w[2], "wl_zz");
    free(w);
    /* Only those on some nodes: what the reconciler reads between sweeps. */
    char on[1][ID_MAX];
    memcpy(on[0], node, ID_MAX);
    assert_int_equal(store_placed_workloads(fx.s, on, 1, &w, &n), STORE_OK);
    assert_int_equal(n, 2);
    assert_string_equal(w[0], "wl_aa");
    assert_string_equal(w[1], "wl_zz");
    free(w);
    assert_int_equal(store_placed_workloads(fx.s, on, 0, &w, &n), STORE_OK);
    assert_int_equal(n, 0);
    free(w);
    /* A workload id is the agent's key: it is never given twice. */
    assert_int_equal(store_instance_claim(fx.s, b.id, 1, node, "wl_zz", 0x4), STORE_CONFLICT);
}

/* ---------------------------------------------------------------- running intervals */

static void test_interval_open_is_a_no_op_while_one_is_open(void **state)
{
    setup_rows();
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, 3, "running", 100, &in);
    assert_int_equal(store_interval_open(fx.s, &in, 100), STORE_OK);
    assert_int_equal(store_interval_open(fx.s, &in, 200), STORE_OK);
    assert_int_equal(fx_sql_int(fx.s, "SELECT count(*) FROM running_intervals WHERE instance_id = ?1", in.id), 1);
    struct billable b;
    assert_int_equal(store_interval_get_open(fx.s, in.id, &b), STORE_OK);
    assert_true(b.id > 0);
    assert_string_equal(b.instance_id, in.id);
    assert_string_equal(b.user_id, alice);
    assert_string_equal(b.gpu_model, FX_TST);
    assert_int_equal(b.card_count, 3);
    assert_int_equal(b.started_at, 100);
    assert_int_equal(b.ended_at, 0);
    assert_int_equal(b.billed, 0);
    assert_int_equal(b.confirmed_until, -1);
}

static void test_interval_close_never_ends_before_its_start(void **state)
{
    setup_rows();
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, 1, "running", 100, &in);
    assert_int_equal(store_interval_open(fx.s, &in, 100), STORE_OK);
    assert_int_equal(store_interval_close(fx.s, in.id, 50, "stopped"), STORE_OK);
    struct billable b;
    assert_int_equal(store_interval_get_open(fx.s, in.id, &b), STORE_NOT_FOUND);
    assert_int_equal(fx_sql_int(fx.s, "SELECT ended_at FROM running_intervals WHERE instance_id = ?1", in.id), 100);
    char reason[32];
    fx_sql_text(fx.s, "SELECT end_reason FROM running_intervals WHERE instance_id = ?1", in.id, reason,
                sizeof reason);
    assert_string_equal(reason, "stopped");
    /* Closing with none open changes nothing; a new one can open. */
    assert_int_equal(store_interval_close(fx.s, in.id, 400, "again"), STORE_OK);
    assert_int_equal(store_interval_open(fx.s, &in, 300), STORE_OK);
    assert_int_equal(store_interval_get_open(fx.s, in.id, &b), STORE_OK);
    assert_int_equal(b.started_at, 300);
    assert_int_equal(fx_sql_int(fx.s, "SELECT count(*) FROM running_intervals WHERE instance_id = ?1", in.id), 2);
}

/* ---------------------------------------------------------------- quotas */

static void test_user_cards_count_holding_instances_only(void **state)
{
    setup_rows();
    struct instance running, quiet, pending, stopped, lost, theirs;
    fx_instance(fx.s, alice, FX_TST, 2, "running", 100, &running);
    fx_instance(fx.s, alice, "MI450", 3, "unreachable", 100, &quiet);
    fx_instance(fx.s, alice, FX_TST, 1, "pending", 100, &pending);
    fx_instance(fx.s, alice, FX_TST, 4, "stopped", 100, &stopped);
    fx_instance(fx.s, alice, FX_TST, 8, "lost", 100, &lost);
    fx_instance(fx.s, bob, FX_TST, 5, "running", 100, &theirs);
    assert_int_equal(store_user_cards_in_use(fx.s, alice, NULL), 6);
    assert_int_equal(store_user_cards_in_use(fx.s, alice, running.id), 4);
    assert_int_equal(store_user_cards_in_use(fx.s, bob, NULL), 5);
    struct model_cards *m;
    size_t n;
    assert_int_equal(store_user_cards_by_model(fx.s, alice, &m, &n), STORE_OK);
    assert_int_equal(n, 2);
    assert_string_equal(m[0].gpu_model, "MI450");
    assert_int_equal(m[0].cards, 3);
    assert_string_equal(m[1].gpu_model, FX_TST);
    assert_int_equal(m[1].cards, 3);
    free(m);
    char carol[ID_MAX];
    fx_user(fx.s, "carol@example.com", ROLE_USER, carol);
    assert_int_equal(store_user_cards_in_use(fx.s, carol, NULL), 0);
    assert_int_equal(store_user_cards_by_model(fx.s, carol, &m, &n), STORE_OK);
    assert_int_equal(n, 0);
    free(m);
}

static void test_user_max_cards_is_the_default_until_an_admin_sets_it(void **state)
{
    setup_rows();
    assert_int_equal(store_user_max_cards(fx.s, alice, 32), 32);
    assert_int_equal(store_user_set_max_cards(fx.s, alice, 5), STORE_OK);
    assert_int_equal(store_user_max_cards(fx.s, alice, 32), 5);
    assert_int_equal(store_user_set_max_cards(fx.s, alice, 0), STORE_OK);
    assert_int_equal(store_user_max_cards(fx.s, alice, 32), 0);
    assert_int_equal(store_user_max_cards(fx.s, bob, 32), 32);
    assert_int_equal(store_user_set_max_cards(fx.s, alice, 100001), STORE_ERROR);
    assert_int_equal(store_user_max_cards(fx.s, alice, 32), 0);
}

/* ---------------------------------------------------------------- metrics */

static void test_metrics_count_instances_by_state_and_model(void **state)
{
    setup_rows();
    struct instance in;
    fx_instance(fx.s, alice, FX_TST, 1, "running", 100, &in);
    fx_instance(fx.s, bob, FX_TST, 1, "running", 100, &in);
    fx_instance(fx.s, alice, "MI450", 1, "running", 100, &in);
    fx_instance(fx.s, alice, FX_TST, 1, "failed", 100, &in);
    struct metric_row *m;
    size_t n;
    assert_int_equal(store_metrics_instances(fx.s, &m, &n), STORE_OK);
    assert_int_equal(n, 3);
    assert_string_equal(m[0].a, "failed");
    assert_int_equal(m[0].value, 1);
    assert_string_equal(m[1].a, "running");
    assert_string_equal(m[1].b, "MI450");
    assert_string_equal(m[2].b, FX_TST);
    assert_int_equal(m[2].value, 2);
    free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        fx_test(test_instance_round_trips_and_is_only_its_owner_s),
        fx_test(test_instance_list_filters_by_owner_and_state_with_a_cursor),
        fx_test(test_unsettled_are_those_holding_cards_or_still_to_be_removed),
        fx_test(test_set_state_logs_an_event_when_state_or_phase_changes),
        fx_test(test_job_and_rendezvous_timeout_are_written_only_when_they_change),
        fx_test(test_events_page_after_a_sequence_number),
        fx_test(test_desired_state_and_attempts_are_recorded),
        fx_test(test_claim_gives_the_cards_and_records_the_placement),
        fx_test(test_claim_of_a_taken_or_failed_card_is_a_conflict_and_leaves_nothing),
        fx_test(test_release_frees_every_card_and_forgets_the_placement),
        fx_test(test_node_update_records_the_agent_s_phase),
        fx_test(test_instance_nodes_show_a_quiet_node_as_unreachable),
        fx_test(test_placed_workloads_are_every_workload_id_sorted_or_those_of_some_nodes),
        fx_test(test_interval_open_is_a_no_op_while_one_is_open),
        fx_test(test_interval_close_never_ends_before_its_start),
        fx_test(test_user_cards_count_holding_instances_only),
        fx_test(test_user_max_cards_is_the_default_until_an_admin_sets_it),
        fx_test(test_metrics_count_instances_by_state_and_model),
        fx_test(test_host_ports_are_claimed_like_cards),
        fx_test(test_unfit_names_a_failed_held_card_and_a_node_set_aside),
        fx_test(test_candidate_node_is_that_node_only_while_it_has_room),
    };
    return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}
