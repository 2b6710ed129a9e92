/* money.c: parsing, formatting and checked arithmetic for int64_t micro-unit
 * amounts, and the billing formula. Integers only: a double cannot hold every
 * micro-yuan amount above 2^53 micro and rounds where the ledger must not. */
#include "gpurent/money.h"

#include <stdbool.h>
#include <string.h>

/* Seconds per hour: prices are per card-hour, billing is per second. */
#define SECONDS_PER_HOUR 3600

/* __extension__ keeps -pedantic quiet about the GCC/Clang 128-bit type. */
__extension__ typedef unsigned __int128 u128;

/* Not isdigit(): that one depends on the locale. */
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

int money_parse(const char *s, int64_t *out)
{
    if (s == NULL) {
        *out = 0;
        return MONEY_ERR_SYNTAX;
    }
    return money_parse_n(s, strlen(s), out);
}

int money_parse_n(const char *s, size_t len, int64_t *out)
{
    *out = 0;
    if (s == NULL)
        return MONEY_ERR_SYNTAX;

    /* First the shape, digits[.digits] and nothing else, so that every
     * malformed string is a syntax error whatever its length or size. */
    size_t i = 0;
    while (i < len && is_digit(s[i]))
        i++;
    size_t int_digits = i;
    if (int_digits == 0)
        return MONEY_ERR_SYNTAX;
    if (int_digits > 1 && s[0] == '0')
        return MONEY_ERR_SYNTAX;
    size_t frac_start = len, frac_digits = 0;
    if (i < len && s[i] == '.') {
        frac_start = ++i;
        while (i < len && is_digit(s[i]))
            i++;
        frac_digits = i - frac_start;
        if (frac_digits == 0)
            return MONEY_ERR_SYNTAX;
    }
    if (i != len)
        return MONEY_ERR_SYNTAX;
    if (frac_digits > MONEY_FRAC_DIGITS)
        return MONEY_ERR_PRECISION;

    /* Whole units, stopping before whole * MONEY_UNIT could overflow. */
    const int64_t max_whole = INT64_MAX / MONEY_UNIT;
    int64_t whole = 0;
    for (size_t j = 0; j < int_digits; j++) {
        int d = s[j] - '0';
        if (whole > (max_whole - d) / 10)
            return MONEY_ERR_OVERFLOW;
        whole = whole * 10 + d;
    }
    int64_t frac = 0;
    for (size_t j = 0; j < MONEY_FRAC_DIGITS; j++)
        frac = frac * 10 + (j < frac_digits ? s[frac_start + j] - '0' : 0);

    int64_t micro = whole * MONEY_UNIT;
    if (frac > INT64_MAX - micro)
        return MONEY_ERR_OVERFLOW;
    *out = micro + frac;
    return MONEY_OK;
}

char *money_format(int64_t micro, char buf[MONEY_FMT_LEN])
{
    /* The magnitude as unsigned, because -INT64_MIN does not fit in int64_t. */
    uint64_t mag = micro < 0 ? 0 - (uint64_t)micro : (uint64_t)micro;
    /* Written right to left from the end of buf, then moved to its start:
     * digit by digit, so no width or precision needs reasoning about. */
    char *end = buf + MONEY_FMT_LEN - 1, *p = end;
    *p = '\0';
    for (int i = 0; i < MONEY_FRAC_DIGITS; i++) {
        *--p = (char)('0' + mag % 10);
        mag /= 10;
    }
    *--p = '.';
    do {
        *--p = (char)('0' + mag % 10);
        mag /= 10;
    } while (mag != 0);
    if (micro < 0)
        *--p = '-';
    /* Keep two fraction digits, as people write prices; drop zeros beyond. */
    size_t len = (size_t)(end - p);
    for (int frac = MONEY_FRAC_DIGITS; frac > 2 && p[len - 1] == '0'; frac--)
        len--;
    memmove(buf, p, len);
    buf[len] = '\0';
    return buf;
}

int money_add(int64_t a, int64_t b, int64_t *out)
{
    if (__builtin_add_overflow(a, b, out)) {
        *out = 0;
        return MONEY_ERR_OVERFLOW;
    }
    return MONEY_OK;
}

int money_sub(int64_t a, int64_t b, int64_t *out)
{
    if (__builtin_sub_overflow(a, b, out)) {
        *out = 0;
        return MONEY_ERR_OVERFLOW;
    }
    return MONEY_OK;
}

int money_accrue(int64_t price_per_card_hour, int64_t cards, int64_t seconds, int64_t *out)
{
    *out = 0;
    if (price_per_card_hour < 0 || cards < 0 || seconds < 0)
        return MONEY_ERR_NEGATIVE;
    /* Both factors are below 2^63, so the hourly rate fits in 126 bits. */
    u128 rate = (u128)price_per_card_hour * (u128)cards;
    if (rate == 0 || seconds == 0)
        return MONEY_OK;
    /* rate * seconds can exceed 128 bits; when it would, the result is at
     * least 2^128 / 3600, far beyond INT64_MAX, so it is an overflow anyway. */
    if ((u128)seconds > ~(u128)0 / rate)
        return MONEY_ERR_OVERFLOW;
    u128 micro = rate * (u128)seconds / SECONDS_PER_HOUR;
    if (micro > (u128)INT64_MAX)
        return MONEY_ERR_OVERFLOW;
    *out = (int64_t)micro;
    return MONEY_OK;
}

int money_seconds_affordable(int64_t price_per_card_hour, int64_t cards, int64_t funds,
                             int64_t *out_seconds)
{
    *out_seconds = 0;
    if (price_per_card_hour < 0 || cards < 0 || funds < 0)
        return MONEY_ERR_NEGATIVE;
    u128 rate = (u128)price_per_card_hour * (u128)cards;
    if (rate == 0) {
        *out_seconds = INT64_MAX;
        return MONEY_OK;
    }
    /* floor(rate * s / 3600) <= funds  <=>  rate * s < 3600 * (funds + 1)
     * <=>  s <= (3600 * (funds + 1) - 1) / rate. The numerator is below 2^75. */
    u128 s = ((u128)SECONDS_PER_HOUR * ((u128)funds + 1) - 1) / rate;
    *out_seconds = s > (u128)INT64_MAX ? INT64_MAX : (int64_t)s;
    return MONEY_OK;
}
