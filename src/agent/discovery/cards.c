/* cards.c: builds the struct gpu_facts a parser fills: reset for a vendor,
 * add and find cards by index, name them (which sets their catalog model),
 * mark them failed with a reason, and sort them. */
#include "discovery/private.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cards_reset(struct gpu_facts *f, const char *vendor, const char *stack)
{
    memset(f, 0, sizeof *f);
    text_copy_str(f->vendor, sizeof f->vendor, vendor);
    text_copy_str(f->stack, sizeof f->stack, stack);
}

/* Marks the card failed and adds the reason, once, after any earlier one. */
void cards_fail(struct gpu_card *c, const char *fmt, ...)
{
    char why[96];
    size_t used;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    c->healthy = 0;
    if (strstr(c->health_reason, why) != NULL)
        return;
    used = strlen(c->health_reason);
    if (used == 0) {
        text_copy_str(c->health_reason, sizeof c->health_reason, why);
    } else if (used + 3 < sizeof c->health_reason) {
        memcpy(c->health_reason + used, "; ", 2);
        text_copy_str(c->health_reason + used + 2, sizeof c->health_reason - used - 2, why);
    }
}

void cards_set_name(struct gpu_card *c, const char *name, size_t n)
{
    const char *code;

    text_copy(c->name, sizeof c->name, name, n);
    code = discovery_model_code(c->name);
    text_copy_str(c->model, sizeof c->model, code ? code : "");
}

/* Index -1 (a card the tool could not number) goes last. */
static int card_cmp(const void *a, const void *b)
{
    const struct gpu_card *x = a, *y = b;
    unsigned ux = (unsigned)x->index, uy = (unsigned)y->index;

    return ux < uy ? -1 : ux > uy;
}

void cards_sort(struct gpu_facts *f)
{
    qsort(f->cards, f->n_cards, sizeof f->cards[0], card_cmp);
}

struct gpu_card *cards_find(struct gpu_facts *f, int index)
{
    for (size_t i = 0; i < f->n_cards; i++)
        if (f->cards[i].index == index)
            return &f->cards[i];
    return NULL;
}

struct gpu_card *cards_add(struct gpu_facts *f, int index)
{
    struct gpu_card *c;

    if (f->n_cards >= DISCOVERY_MAX_CARDS)
        return NULL;
    c = &f->cards[f->n_cards++];
    memset(c, 0, sizeof *c);
    c->index = index;
    c->healthy = 1;
    return c;
}
