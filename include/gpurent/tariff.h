/* tariff.h: what a running interval costs. Pure. A GPU type's price per
 * card-hour changes only at set times; an interval is split at each change
 * and each piece costs floor(price × cards × seconds / 3600), computed from
 * the piece's start, so recomputing at any later time gives the same answer
 * and a pass posts only the difference. */
#ifndef GPURENT_TARIFF_H
#define GPURENT_TARIFF_H

#include <stddef.h>
#include <stdint.h>

struct price_point {
    int64_t effective_at; /* epoch seconds from which it applies */
    int64_t card_hour;    /* micro-yuan per card-hour */
};

/* Cost of `cards` cards over [start, end) under the schedule pp[0..n),
 * sorted by effective_at; time before the first point is free (no price
 * set). 0 or a negative money_status on overflow or bad input. */
int tariff_due(const struct price_point *pp, size_t n, int64_t cards, int64_t start, int64_t end, int64_t *out);
/* The price in force at t, or -1 if none. */
int64_t tariff_price_at(const struct price_point *pp, size_t n, int64_t t);

#endif
