/* facts.h: judging a node agent's facts document against what the admin
 * declared. Pure (no I/O), so every rule is unit-tested. */
#ifndef GPURENT_FACTS_H
#define GPURENT_FACTS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

#define FACTS_MAX_CARDS 64

struct facts_verdict {
    int accepted;                            /* 1: put the node in service */
    char reason[256];                        /* why not, "" when accepted */
    char driver_version[64];                 /* reported driver */
    char stack_version[64];                  /* reported ROCm or CUDA version */
    struct node_card cards[FACTS_MAX_CARDS]; /* reported cards by index */
    size_t n_cards;                          /* entries in cards */
    char *canonical;                         /* the facts that matter, as sorted compact JSON (caller frees) */
    int64_t workload_exits;                  /* the agent's count of workload exits (it changes when one ends,
                                               and restarts at 0 with the agent); -1 when the facts have none */
    int64_t ssh_port;                        /* the agent's SSH server (facts "ssh"), 0 when it has none */
    char ssh_host_key[1025];                 /* its host key, "type base64" (comment dropped) */
    char ssh_fingerprint[64];                /* SHA256:… computed here from the host key */
    int64_t publish_first, publish_last;     /* host ports it publishes on (facts "publish_ports"), 0 when none */
    char data_address[254];                  /* its data-plane address (facts "data_address"), "" when none */
};

/* Checks facts against the declared model and card count. Returns -1 (with
 * v->reason) if the document is malformed — the agent is misbehaving, which
 * counts as a failed heartbeat — or 0 with v->accepted saying whether the
 * node may serve: only the declared model, on exactly the declared number
 * of cards with indexes 0..n-1. Failed cards do not reject a node; they
 * only leave the free pool. workload_exits, optional, must be an integer
 * >= 0 (null counts as absent); being a counter, it stays out of
 * v->canonical, which changes only when the node's hardware does. So does
 * ssh (AGENT_PROTOCOL.md): null or absent when the agent's SSH server is
 * off, else {port 1..65535, host_key (a public key line that must parse),
 * fingerprint (optional; must be the host key's)}; anything else is
 * malformed. publish_ports, likewise null or absent when the agent
 * publishes no ports, is {first, last} with 1 <= first <= last <= 65535. */
int facts_check(const char *declared_model, int64_t declared_cards, json_t *facts, struct facts_verdict *v);
/* data_address (issue 12), null, absent or "" when the agent reports none,
 * is else an address other ranks reach the node at: an IPv4 or IPv6
 * address or a DNS host name (data_host_valid), or the facts are
 * malformed. Like ssh it stays out of v->canonical. */

/* 1 when h is an IPv4 or IPv6 address or a DNS host name of at most 253
 * bytes: what a node's data_address or data_host may be. */
int data_host_valid(const char *h);

#endif
