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

/* Storage. A month is TARIFF_MONTH_SECONDS (30 days) whatever the calendar
 * says, so a GB-month costs the same in February as in March. A volume's
 * schedule is a price_point list whose card_hour holds micro-yuan per
 * GB-month. Each piece between price changes costs
 * floor(price × size_gb × seconds / 2 592 000), recomputed from the
 * volume's creation like card time. */
#define TARIFF_MONTH_SECONDS INT64_C(2592000)
/* Cost of a volume of size_gb over [start, end) under pp[0..n), sorted by
 * effective_at; time before the first point is free. MONEY_OK, or a
 * negative money_status (overflow, bad input) with *out = 0. */
int tariff_storage_due(const struct price_point *pp, size_t n, int64_t size_gb, int64_t start, int64_t end,
                       int64_t *out);
/* A region's storage schedule: the global one until the region's own first
 * price, then the region's. out must hold ng + nr points; returns how many
 * it wrote. Both inputs sorted by effective_at. */
size_t tariff_storage_schedule(const struct price_point *global, size_t ng, const struct price_point *region,
                               size_t nr, struct price_point *out);

#endif
