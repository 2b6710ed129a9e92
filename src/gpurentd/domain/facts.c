/* facts.c: the rules that put a node in service or keep it out (facts.h). */
#include "domain/facts.h"
#include "domain/ssh_keys.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int malformed(struct facts_verdict *v, const char *what)
{
    snprintf(v->reason, sizeof v->reason, "agent sent malformed facts: %s", what);
    return -1;
}

/* Copies src (valid UTF-8, as jansson hands out) into out, cutting a string
 * that does not fit at a character boundary: a cut inside a multi-byte
 * character would leave text no JSON reply can carry. */
static void copy_utf8(char *out, size_t n, const char *src)
{
    size_t len = strlen(src);
    if (len >= n) {
        len = n - 1;
        while (len > 0 && ((unsigned char)src[len] & 0xC0) == 0x80)
            len--;
    }
    memcpy(out, src, len);
    out[len] = '\0';
}

/* Copies an optional string member; -1 if present but not a string. */
static int opt_string(json_t *obj, const char *key, char *out, size_t n)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        out[0] = '\0';
        return 0;
    }
    if (!json_is_string(v))
        return -1;
    copy_utf8(out, n, json_string_value(v));
    return 0;
}

/* Reads the facts' ssh member into v; -1 (malformed) when it is wrong. */
static int ssh_facts(json_t *facts, struct facts_verdict *v)
{
    json_t *ssh = json_object_get(facts, "ssh");
    if (!ssh || json_is_null(ssh))
        return 0;
    json_t *port = json_object_get(ssh, "port"), *key = json_object_get(ssh, "host_key"),
           *fp = json_object_get(ssh, "fingerprint");
    if (!json_is_object(ssh) || !json_is_integer(port) || json_integer_value(port) < 1 ||
        json_integer_value(port) > 65535 || !json_is_string(key) || (fp && !json_is_null(fp) && !json_is_string(fp)))
        return malformed(v, "ssh must be null or {port 1..65535, host_key, fingerprint}");
    if (json_string_length(key) >= sizeof v->ssh_host_key)
        return malformed(v, "ssh.host_key longer than 1024 bytes");
    struct ssh_pubkey k;
    char why[200];
    if (ssh_key_parse(json_string_value(key), &k, why, sizeof why) < 0) {
        snprintf(v->reason, sizeof v->reason, "agent sent malformed facts: ssh.host_key: %s", why);
        return -1;
    }
    if (json_is_string(fp) && strcmp(json_string_value(fp), k.fingerprint) != 0)
        return malformed(v, "ssh.fingerprint is not the fingerprint of ssh.host_key");
    if (ssh_key_format(&k, 0, v->ssh_host_key, sizeof v->ssh_host_key) < 0)
        return malformed(v, "ssh.host_key longer than 1024 bytes");
    snprintf(v->ssh_fingerprint, sizeof v->ssh_fingerprint, "%s", k.fingerprint);
    v->ssh_port = json_integer_value(port);
    return 0;
}

/* Reads the facts' publish_ports member (null or absent: publishing off). */
static int publish_facts(json_t *facts, struct facts_verdict *v)
{
    json_t *pp = json_object_get(facts, "publish_ports");
    if (!pp || json_is_null(pp))
        return 0;
    json_t *first = json_object_get(pp, "first"), *last = json_object_get(pp, "last");
    if (!json_is_object(pp) || !json_is_integer(first) || !json_is_integer(last) || json_integer_value(first) < 1 ||
        json_integer_value(last) > 65535 || json_integer_value(first) > json_integer_value(last))
        return malformed(v, "publish_ports must be null or {first, last} with 1 <= first <= last <= 65535");
    v->publish_first = json_integer_value(first);
    v->publish_last = json_integer_value(last);
    return 0;
}

int data_host_valid(const char *h)
{
    unsigned char addr[16];
    size_t n = strlen(h);
    if (n == 0 || n > 253)
        return 0;
    if (inet_pton(AF_INET, h, addr) == 1 || inet_pton(AF_INET6, h, addr) == 1)
        return 1;
    /* A DNS name: dot-separated labels of 1..63 letters, digits and '-',
     * neither starting nor ending with '-'; not all digits and dots, which
     * would be a malformed IPv4 address rather than a name. */
    size_t label = 0;
    int letters = 0;
    for (size_t i = 0; i <= n; i++) {
        unsigned char c = (unsigned char)h[i];
        if (c == '.' || c == '\0') {
            if (label == 0 || h[i - 1] == '-')
                return 0;
            label = 0;
            continue;
        }
        if (!isalnum(c) && c != '-')
            return 0;
        if (label == 0 && c == '-')
            return 0;
        if (++label > 63)
            return 0;
        letters |= !isdigit(c);
    }
    return letters;
}

/* Reads the facts' data_address (absent, null or "": none reported). */
static int data_address_facts(json_t *facts, struct facts_verdict *v)
{
    json_t *a = json_object_get(facts, "data_address");
    if (!a || json_is_null(a) || (json_is_string(a) && json_string_length(a) == 0))
        return 0;
    if (!json_is_string(a) || !data_host_valid(json_string_value(a)))
        return malformed(v, "data_address must be null or an IP address or host name of up to 253 bytes");
    snprintf(v->data_address, sizeof v->data_address, "%s", json_string_value(a));
    return 0;
}

int facts_check(const char *declared_model, int64_t declared_cards, json_t *facts, struct facts_verdict *v)
{
    memset(v, 0, sizeof *v);
    v->workload_exits = -1;
    if (!json_is_object(facts))
        return malformed(v, "not a JSON object");
    json_t *cards = json_object_get(facts, "cards");
    if (!json_is_array(cards))
        return malformed(v, "no cards array");
    if (json_array_size(cards) > FACTS_MAX_CARDS)
        return malformed(v, "more than 64 cards");
    if (opt_string(facts, "driver_version", v->driver_version, sizeof v->driver_version) < 0 ||
        opt_string(facts, "stack_version", v->stack_version, sizeof v->stack_version) < 0)
        return malformed(v, "versions must be strings");
    /* Typed like every other field: an agent that sends something else
     * here is as broken as one that sends a number for a version. */
    json_t *exits = json_object_get(facts, "workload_exits");
    if (exits && !json_is_null(exits)) {
        if (!json_is_integer(exits) || json_integer_value(exits) < 0)
            return malformed(v, "workload_exits must be a non-negative integer");
        v->workload_exits = json_integer_value(exits);
    }
    if (ssh_facts(facts, v) < 0 || publish_facts(facts, v) < 0 || data_address_facts(facts, v) < 0)
        return -1;

    int seen[FACTS_MAX_CARDS] = {0};
    size_t i;
    json_t *card;
    json_array_foreach(cards, i, card)
    {
        json_t *idx = json_object_get(card, "index"), *model = json_object_get(card, "model"),
               *mem = json_object_get(card, "memory_gb"), *healthy = json_object_get(card, "healthy");
        if (!json_is_object(card) || !json_is_integer(idx) || !json_is_string(model) || !json_is_integer(mem) ||
            !json_is_boolean(healthy))
            return malformed(v, "each card needs index, model, memory_gb and healthy");
        json_int_t k = json_integer_value(idx);
        if (k < 0 || k >= FACTS_MAX_CARDS || seen[k]++)
            return malformed(v, "card indexes must be distinct and 0..63");
        if (json_integer_value(mem) < 0 || json_integer_value(mem) > 1 << 20)
            return malformed(v, "memory_gb out of range");
        /* A longer model is no catalog code; cut short, it could pass for one. */
        if (json_string_length(model) >= sizeof v->cards[0].model)
            return malformed(v, "card model longer than 32 bytes");
        struct node_card *c = &v->cards[v->n_cards++];
        c->idx = k;
        copy_utf8(c->model, sizeof c->model, json_string_value(model));
        c->memory_gb = json_integer_value(mem);
        c->healthy = json_is_true(healthy);
        if (opt_string(card, "health_reason", c->health_reason, sizeof c->health_reason) < 0)
            return malformed(v, "health_reason must be a string");
        if (!c->healthy && !c->health_reason[0])
            snprintf(c->health_reason, sizeof c->health_reason, "reported failed by the agent");
    }
    /* Sort by index so the stored card rows and the canonical text are stable. */
    for (size_t a = 1; a < v->n_cards; a++)
        for (size_t b = a; b > 0 && v->cards[b - 1].idx > v->cards[b].idx; b--) {
            struct node_card t = v->cards[b];
            v->cards[b] = v->cards[b - 1];
            v->cards[b - 1] = t;
        }

    /* Models: all the same, and the declared one. */
    const char *other = NULL;
    size_t n_declared = 0, n_other = 0;
    for (size_t k = 0; k < v->n_cards; k++) {
        if (strcmp(v->cards[k].model, declared_model) == 0) {
            n_declared++;
        } else {
            n_other++;
            if (!other)
                other = v->cards[k].model;
        }
    }
    v->accepted = 0;
    if (n_declared && n_other)
        snprintf(v->reason, sizeof v->reason, "node reports mixed GPU models (%zu %s, %zu %s)", n_declared,
                 declared_model, n_other, other[0] ? other : "unknown");
    else if (n_other)
        snprintf(v->reason, sizeof v->reason, "node reports %s cards but was registered as %s",
                 other[0] ? other : "unrecognised", declared_model);
    else if ((int64_t)v->n_cards != declared_cards)
        snprintf(v->reason, sizeof v->reason, "node reports %zu cards but was registered with %lld", v->n_cards,
                 (long long)declared_cards);
    else if (v->n_cards && v->cards[v->n_cards - 1].idx != (int64_t)v->n_cards - 1)
        snprintf(v->reason, sizeof v->reason, "card indexes are not 0..%zu", v->n_cards - 1);
    else
        v->accepted = 1;

    json_t *canon =
        json_pack("{s:s, s:s, s:[]}", "driver_version", v->driver_version, "stack_version", v->stack_version, "cards");
    json_t *arr = json_object_get(canon, "cards");
    for (size_t k = 0; k < v->n_cards; k++)
        json_array_append_new(arr,
                              json_pack("{s:I, s:s, s:I, s:b, s:s}", "index", (json_int_t)v->cards[k].idx, "model",
                                        v->cards[k].model, "memory_gb", (json_int_t)v->cards[k].memory_gb, "healthy",
                                        v->cards[k].healthy, "health_reason", v->cards[k].health_reason));
    json_t *keep;
    const char *keys[] = {"vendor", "stack", "agent_version", "runtime"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        if (json_is_string(keep = json_object_get(facts, keys[k])))
            json_object_set(canon, keys[k], keep);
    v->canonical = json_dumps(canon, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(canon);
    if (!v->canonical)
        return malformed(v, "cannot serialise");
    return 0;
}
