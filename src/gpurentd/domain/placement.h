/* placement.h: choosing cards for an instance. Pure: given the ready nodes
 * of a GPU model and their free cards, pick where N cards go.
 *
 *  - Up to PLACEMENT_NODE_CARDS cards go on one node, best fit: the node
 *    with the fewest free cards that still has room, so whole nodes stay
 *    free for large jobs; the lowest free indexes are taken.
 *  - More takes whole nodes (every card healthy and free), all in one RDMA
 *    fabric: the fabric with the fewest whole nodes that still has enough,
 *    nodes in the order given, which is also their rank order.
 *
 * The caller passes nodes sorted by fabric, then name (the store may pass
 * only the best fit, or only whole free nodes: the choice is the same). */
#ifndef GPURENT_PLACEMENT_H
#define GPURENT_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#include "store/store.h" /* struct placement_node, the limits */

struct placement {
    size_t n_nodes;                      /* nodes used, in rank order */
    size_t node[PLACEMENT_MAX_NODES];    /* indexes into the input */
    uint64_t cards[PLACEMENT_MAX_NODES]; /* card indexes taken on each */
};

/* Whether cards is a count an instance may ask for: 1..8, or a multiple of
 * 8 up to 256. */
int placement_count_valid(int cards);
/* Chooses cards on nodes[0..n); 0 on success, -1 when they do not fit. */
int placement_choose(const struct placement_node *nodes, size_t n, int cards, struct placement *out);

#endif
