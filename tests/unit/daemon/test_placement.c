/* test_placement.c: best-fit placement of cards on nodes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "domain/placement.h"

#define ALL8 0xffu

static struct placement_node node(const char *id, const char *fabric, uint64_t free_mask)
{
    struct placement_node n = {.card_count = 8, .free_mask = free_mask};
    snprintf(n.id, sizeof n.id, "%s", id);
    snprintf(n.fabric, sizeof n.fabric, "%s", fabric);
    return n;
}

static void test_counts(void **state)
{
    (void)state;
    for (int c = 1; c <= 8; c++)
        assert_true(placement_count_valid(c));
    assert_true(placement_count_valid(16));
    assert_true(placement_count_valid(256));
    assert_false(placement_count_valid(0));
    assert_false(placement_count_valid(-8));
    assert_false(placement_count_valid(12));
    assert_false(placement_count_valid(264));
}

static void test_best_fit_prefers_fullest_node(void **state)
{
    (void)state;
    struct placement_node nodes[] = {
        node("n-empty", "f1", ALL8),   /* 8 free */
        node("n-half", "f1", 0xf0),    /* 4 free: cards 4..7 */
        node("n-two", "f1", 0x03),     /* 2 free */
    };
    struct placement p;
    assert_int_equal(placement_choose(nodes, 3, 2, &p), 0);
    assert_int_equal(p.n_nodes, 1);
    assert_int_equal(p.node[0], 2);
    assert_int_equal(p.cards[0], 0x03);
    assert_int_equal(placement_choose(nodes, 3, 3, &p), 0);
    assert_int_equal(p.node[0], 1);
    assert_int_equal(p.cards[0], 0x70); /* the lowest free indexes: 4, 5, 6 */
    assert_int_equal(placement_choose(nodes, 3, 8, &p), 0);
    assert_int_equal(p.node[0], 0);
    assert_int_equal(p.cards[0], ALL8);
}

static void test_single_node_does_not_fit(void **state)
{
    (void)state;
    struct placement_node nodes[] = {node("a", "f1", 0x0f), node("b", "f1", 0xf0)};
    struct placement p;
    /* 8 cards are free in all, but not on one node. */
    assert_int_equal(placement_choose(nodes, 2, 5, &p), -1);
    assert_int_equal(p.n_nodes, 0);
}

static void test_multi_node_takes_whole_nodes_in_one_fabric(void **state)
{
    (void)state;
    /* Sorted by fabric then name, as the store returns them. */
    struct placement_node nodes[] = {
        node("a1", "fa", ALL8), node("a2", "fa", 0x7f), node("a3", "fa", ALL8), node("a4", "fa", ALL8),
        node("b1", "fb", ALL8), node("b2", "fb", ALL8),
    };
    struct placement p;
    /* 16 cards: fabric fb has exactly two whole nodes, the best fit. */
    assert_int_equal(placement_choose(nodes, 6, 16, &p), 0);
    assert_int_equal(p.n_nodes, 2);
    assert_int_equal(p.node[0], 4);
    assert_int_equal(p.node[1], 5);
    /* 24 cards: only fa has three whole nodes (a2 is not whole). */
    assert_int_equal(placement_choose(nodes, 6, 24, &p), 0);
    assert_int_equal(p.n_nodes, 3);
    assert_int_equal(p.node[0], 0);
    assert_int_equal(p.node[1], 2);
    assert_int_equal(p.node[2], 3);
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(p.cards[i], ALL8);
    /* 32 cards would need four whole nodes in one fabric: none has them,
     * though five whole nodes exist across fabrics. */
    assert_int_equal(placement_choose(nodes, 6, 32, &p), -1);
}

static void test_256_cards(void **state)
{
    (void)state;
    struct placement_node nodes[40];
    for (int i = 0; i < 40; i++) {
        char id[16];
        snprintf(id, sizeof id, "n%02d", i);
        nodes[i] = node(id, i < 32 ? "big" : "small", ALL8);
    }
    struct placement p;
    assert_int_equal(placement_choose(nodes, 40, 256, &p), 0);
    assert_int_equal(p.n_nodes, 32);
    for (size_t r = 0; r < 32; r++)
        assert_int_equal(p.node[r], r);
}

static void test_failed_card_breaks_whole_node(void **state)
{
    (void)state;
    struct placement_node nodes[] = {node("a", "f", ALL8 & ~0x08u), node("b", "f", ALL8)};
    struct placement p;
    assert_int_equal(placement_choose(nodes, 2, 16, &p), -1);
    assert_int_equal(placement_choose(nodes, 2, 7, &p), 0);
    assert_int_equal(p.node[0], 0);
    assert_int_equal(p.cards[0] & 0x08u, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts),
        cmocka_unit_test(test_best_fit_prefers_fullest_node),
        cmocka_unit_test(test_single_node_does_not_fit),
        cmocka_unit_test(test_multi_node_takes_whole_nodes_in_one_fabric),
        cmocka_unit_test(test_256_cards),
        cmocka_unit_test(test_failed_card_breaks_whole_node),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
