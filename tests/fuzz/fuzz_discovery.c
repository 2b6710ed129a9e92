/* fuzz_discovery.c: fuzz target for the parsers of what the GPU tools print
 * (amd-smi, rocm-smi, nvidia-smi, ROCm's version file): the first byte
 * picks the parser, the rest is the tool's output. A parse either fails
 * with a message and *out zeroed, or gives 1 to DISCOVERY_MAX_CARDS cards,
 * sorted by index (-1 last), every string terminated in its field and
 * printable ASCII (messages too), the catalog model the one its name maps
 * to, and a reason exactly when a card is unhealthy; and the verdict reads
 * only the len bytes given: the same text followed by other bytes parses
 * the same. */
#include "discovery/discovery.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define TERMINATED(field) (memchr((field), '\0', sizeof(field)) != NULL)

/* Whether s is printable ASCII: what the tools print reaches the facts
 * JSON and the logs only so (text.c's text_copy). */
static int printable(const char *s)
{
    for (; *s; s++)
        if (*s < 0x20 || *s > 0x7e)
            return 0;
    return 1;
}

struct verdict {
    int rc;
    struct gpu_facts facts;
    char err[256];
};

static void parse(int which, const char *text, size_t len, struct verdict *v)
{
    memset(v, 0, sizeof *v);
    switch (which) {
    case 0:
        v->rc = discovery_parse_amd_smi(text, len, &v->facts, v->err, sizeof v->err);
        break;
    case 1:
        v->rc = discovery_parse_rocm_smi(text, len, &v->facts, v->err, sizeof v->err);
        break;
    case 2:
        v->rc = discovery_parse_nvidia_smi_csv(text, len, &v->facts, v->err, sizeof v->err);
        break;
    default:
        /* The version's out is a C string either way. */
        v->rc = discovery_parse_rocm_version(text, len, v->facts.stack_version, sizeof v->facts.stack_version);
        if (!TERMINATED(v->facts.stack_version) || (v->rc < 0 && v->facts.stack_version[0]))
            abort();
        break;
    }
}

static void check(int which, const struct verdict *v)
{
    static const struct gpu_facts zero;
    if (which > 2)
        return;
    if (v->rc < 0) {
        if (!v->err[0] || !TERMINATED(v->err) || !printable(v->err) || memcmp(&v->facts, &zero, sizeof zero) != 0)
            abort(); /* a failure says why and leaves nothing half filled */
        return;
    }
    const struct gpu_facts *f = &v->facts;
    if (v->rc != 0 || f->n_cards < 1 || f->n_cards > DISCOVERY_MAX_CARDS)
        abort();
    if (!TERMINATED(f->vendor) || !TERMINATED(f->stack) || !TERMINATED(f->driver_version) ||
        !TERMINATED(f->stack_version) || !f->vendor[0] || !f->stack[0])
        abort();
    if (!printable(f->driver_version) || !printable(f->stack_version))
        abort();
    for (size_t i = 0; i < f->n_cards; i++) {
        const struct gpu_card *c = &f->cards[i];
        if (!TERMINATED(c->model) || !TERMINATED(c->name) || !TERMINATED(c->health_reason) ||
            !TERMINATED(c->bus_id) || !TERMINATED(c->serial))
            abort();
        if (!printable(c->model) || !printable(c->name) || !printable(c->health_reason) || !printable(c->bus_id) ||
            !printable(c->serial))
            abort();
        /* The catalog model is the one the name maps to. */
        const char *code = discovery_model_code(c->name);
        if (strcmp(c->model, code ? code : "") != 0)
            abort();
        if (c->index < -1 || c->memory_gb < 0 || (c->healthy != 0 && c->healthy != 1))
            abort();
        if (c->healthy == !!c->health_reason[0])
            abort(); /* unhealthy exactly when there is a reason */
        if (i > 0) {
            int prev = f->cards[i - 1].index;
            /* Sorted by index, the unnumbered (-1) last. */
            if (prev == -1 ? c->index != -1 : (c->index != -1 && c->index < prev))
                abort();
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size - 1 > DISCOVERY_MAX_OUTPUT)
        return 0;
    int which = data[0] % 4;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    struct verdict *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    /* The same text with more after it, where the len bytes end. */
    char *longer = malloc(len + 16);
    if (!a || !b || !longer)
        abort();
    memcpy(longer, text, len);
    memcpy(longer + len, "1, x\n]}\"9 GB\0\n", 15);
    parse(which, text, len, a);
    check(which, a);
    parse(which, longer, len, b);
    if (a->rc != b->rc || memcmp(&a->facts, &b->facts, sizeof a->facts) != 0 || strcmp(a->err, b->err) != 0)
        abort(); /* the verdict depended on bytes past len */
    free(a);
    free(b);
    free(longer);
    return 0;
}
