/* placement.c: best-fit card placement (see placement.h). */
#include "domain/placement.h"

#include <string.h>

int placement_count_valid(int cards)
{
    if (cards >= 1 && cards <= PLACEMENT_NODE_CARDS)
        return 1;
    return cards > PLACEMENT_NODE_CARDS && cards <= PLACEMENT_NODE_CARDS * PLACEMENT_MAX_NODES &&
           cards % PLACEMENT_NODE_CARDS == 0;
}

static int popcount(uint64_t m)
{
    return __builtin_popcountll(m);
}

static int whole(const struct placement_node *nd)
{
    return nd->card_count == PLACEMENT_NODE_CARDS && popcount(nd->free_mask) == PLACEMENT_NODE_CARDS;
}

/* The lowest `count` set bits of mask. */
static uint64_t lowest_bits(uint64_t mask, int count)
{
    uint64_t out = 0;
    while (count-- > 0 && mask) {
        uint64_t bit = mask & (~mask + 1);
        out |= bit;
        mask &= ~bit;
    }
    return out;
}

int placement_choose(const struct placement_node *nodes, size_t n, int cards, struct placement *out)
{
    memset(out, 0, sizeof *out);
    if (!placement_count_valid(cards))
        return -1;
    if (cards <= PLACEMENT_NODE_CARDS) {
        size_t best = n;
        int best_free = 65;
        for (size_t i = 0; i < n; i++) {
            int f = popcount(nodes[i].free_mask);
            if (f >= cards && f < best_free) {
                best = i;
                best_free = f;
            }
        }
        if (best == n)
            return -1;
        out->n_nodes = 1;
        out->node[0] = best;
        out->cards[0] = lowest_bits(nodes[best].free_mask, cards);
        return 0;
    }
    size_t need = (size_t)(cards / PLACEMENT_NODE_CARDS);
    /* Nodes come grouped by fabric, so each fabric is one run of the
     * input. Best fit over fabrics: the run with the fewest whole nodes that
     * is still enough (ties: the first). */
    size_t best_start = n, best_count = (size_t)-1;
    for (size_t start = 0; start < n;) {
        size_t end = start, count = 0;
        while (end < n && strcmp(nodes[end].fabric, nodes[start].fabric) == 0)
            count += whole(&nodes[end++]);
        if (count >= need && count < best_count) {
            best_count = count;
            best_start = start;
        }
        start = end;
    }
    if (best_start == n)
        return -1;
    for (size_t i = best_start; i < n && out->n_nodes < need; i++) {
        if (whole(&nodes[i])) {
            out->node[out->n_nodes] = i;
            out->cards[out->n_nodes] = nodes[i].free_mask;
            out->n_nodes++;
        }
    }
    return 0;
}
