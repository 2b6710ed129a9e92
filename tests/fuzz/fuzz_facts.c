/* fuzz_facts.c: fuzz target for the facts document an agent sends back in
 * its heartbeat (facts_check, after json_loadb as heartbeat.c reads it): an
 * agent's reply is not trusted. A malformed document is refused with a
 * reason; an accepted one has exactly the declared cards, indexed 0..n-1;
 * every reason is UTF-8 (it is shown in JSON replies), and the canonical
 * text is JSON that, read back as facts, gives the same verdict and the
 * same canonical text. */
#include "domain/facts.h"
#include "gpurent/utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define DECLARED_MODEL "MI450"

static void check(json_t *facts, int64_t declared_cards)
{
    struct facts_verdict v;
    int rc = facts_check(DECLARED_MODEL, declared_cards, facts, &v);
    if (!utf8_valid(v.reason, strlen(v.reason)) || !utf8_valid(v.driver_version, strlen(v.driver_version)) ||
        !utf8_valid(v.stack_version, strlen(v.stack_version)))
        abort();
    if (rc < 0) {
        if (strncmp(v.reason, "agent sent malformed facts: ", 28) != 0 || v.canonical)
            abort();
        return;
    }
    if (rc != 0 || !v.canonical || v.n_cards > FACTS_MAX_CARDS)
        abort();
    if (v.accepted) {
        if (v.reason[0] || (int64_t)v.n_cards != declared_cards)
            abort();
        for (size_t k = 0; k < v.n_cards; k++)
            if (v.cards[k].idx != (int64_t)k || strcmp(v.cards[k].model, DECLARED_MODEL) != 0)
                abort();
    } else if (!v.reason[0]) {
        abort();
    }
    for (size_t k = 0; k < v.n_cards; k++)
        if (!utf8_valid(v.cards[k].model, strlen(v.cards[k].model)) ||
            !utf8_valid(v.cards[k].health_reason, strlen(v.cards[k].health_reason)) ||
            (!v.cards[k].healthy && !v.cards[k].health_reason[0]))
            abort();
    if (v.ssh_port && (v.ssh_port > 65535 || strncmp(v.ssh_fingerprint, "SHA256:", 7) != 0))
        abort();

    /* The canonical text is facts too: the same verdict, the same text. */
    json_t *again = json_loads(v.canonical, 0, NULL);
    if (!again)
        abort();
    struct facts_verdict w;
    if (facts_check(DECLARED_MODEL, declared_cards, again, &w) != 0 || w.accepted != v.accepted ||
        strcmp(w.reason, v.reason) != 0 || !w.canonical || strcmp(w.canonical, v.canonical) != 0)
        abort();
    json_decref(again);
    free(w.canonical);
    free(v.canonical);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *facts = json_loadb((const char *)data, size, 0, NULL);
    if (!facts)
        return 0;
    json_t *cards = json_object_get(facts, "cards");
    check(facts, 8);
    if (json_is_array(cards))
        check(facts, (int64_t)json_array_size(cards));
    json_decref(facts);
    return 0;
}
