/* money.h: the money type. Every amount in gpurent is an int64_t count of
 * micro-yuan (1 yuan = MONEY_UNIT micro); this module is the only place that
 * turns decimal strings into amounts and back, and the only place that does
 * arithmetic on them that could overflow. No floating point touches money.
 *
 * Every function returns MONEY_OK or a negative enum money_status, and on any
 * failure sets its output to 0, so a value that failed to parse or overflowed
 * cannot be used by accident. */
#ifndef GPURENT_MONEY_H
#define GPURENT_MONEY_H

#include <stddef.h>
#include <stdint.h>

#define MONEY_UNIT INT64_C(1000000) /* micro-units per currency unit */
#define MONEY_FRAC_DIGITS 6         /* decimal places a micro-unit allows */
#define MONEY_FMT_LEN 32            /* fits "-9223372036854.775808" and NUL */

enum money_status {
    MONEY_OK = 0,
    MONEY_ERR_SYNTAX = -1,    /* not a plain non-negative decimal */
    MONEY_ERR_PRECISION = -2, /* more than MONEY_FRAC_DIGITS fraction digits */
    MONEY_ERR_OVERFLOW = -3,  /* result does not fit in int64_t micro-units */
    MONEY_ERR_NEGATIVE = -4,  /* an input that must be >= 0 was not */
};

/* Parses a non-negative decimal amount: one or more digits, optionally a dot
 * and one to six more digits ("10", "9.60", "0.000001"). Refused as
 * MONEY_ERR_SYNTAX: NULL, the empty string, signs, exponents, white space
 * anywhere, a dot without digits on both sides ("1.", ".5"), thousands
 * separators, hex, and leading zeros ("007", "00.5"; "0" and "0.5" are fine)
 * so that one amount has one spelling. Seven or more fraction digits are
 * MONEY_ERR_PRECISION even when they are zeros: silently dropping digits would
 * be rounding. More than INT64_MAX micro-units is MONEY_ERR_OVERFLOW. Syntax is
 * checked before precision, and precision before overflow. */
int money_parse(const char *s, int64_t *out);
/* The same for a string of known length that may hold a NUL (a JSON string
 * does: use json_string_length); a NUL inside is MONEY_ERR_SYNTAX. */
int money_parse_n(const char *s, size_t len, int64_t *out);

/* Writes micro as a decimal with at least 2 and at most 6 fraction digits,
 * trimming zeros beyond the second ("9.60", "0.000001", "-9.60"), and returns
 * buf. Every int64_t value formats, negative ones included, because ledger
 * postings are signed; money_parse reads back every non-negative result. */
char *money_format(int64_t micro, char buf[MONEY_FMT_LEN]);

/* Checked signed arithmetic: MONEY_OK, or MONEY_ERR_OVERFLOW with *out = 0.
 * Results may be negative: the ledger needs signed postings. */
int money_add(int64_t a, int64_t b, int64_t *out);
int money_sub(int64_t a, int64_t b, int64_t *out);

/* The billing formula: floor(price_per_card_hour * cards * seconds / 3600),
 * exact for all inputs (128-bit intermediates). Inputs below 0 are
 * MONEY_ERR_NEGATIVE; a result above INT64_MAX is MONEY_ERR_OVERFLOW.
 * Callers recompute it from a segment's start and post the difference from
 * what was already posted; summing accruals of separate sub-intervals instead
 * would lose up to one micro per split to flooring. */
int money_accrue(int64_t price_per_card_hour, int64_t cards, int64_t seconds, int64_t *out);

/* The number of seconds funds pay for: the largest s >= 0 with
 * money_accrue(price_per_card_hour, cards, s) <= funds, so an instance can be
 * stopped at the exact second its funds run out. A rate of 0 (either factor 0)
 * and any answer beyond INT64_MAX give INT64_MAX. Inputs below 0 are
 * MONEY_ERR_NEGATIVE. */
int money_seconds_affordable(int64_t price_per_card_hour, int64_t cards, int64_t funds, int64_t *out_seconds);

#endif
