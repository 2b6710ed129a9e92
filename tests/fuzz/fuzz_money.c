/* fuzz_money.c: fuzz target for the money type (money.h). The bytes are
 * read two ways: as an amount string, whose verdict and value must match a
 * plain reference reading of the documented grammar and whose value must
 * format and parse back to itself; and as integers, on which the checked
 * arithmetic and the billing formula must agree with 128-bit arithmetic. */
#include "gpurent/money.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

__extension__ typedef __int128 i128;

/* money_parse_n's contract, read plainly: digits without a leading zero,
 * then optionally a dot and digits; syntax before precision before
 * overflow. */
static int reference_parse(const char *s, size_t len, int64_t *out)
{
    *out = 0;
    size_t i = 0;
    while (i < len && s[i] >= '0' && s[i] <= '9')
        i++;
    size_t whole_digits = i, frac_digits = 0;
    if (whole_digits == 0 || (whole_digits > 1 && s[0] == '0'))
        return MONEY_ERR_SYNTAX;
    if (i < len && s[i] == '.') {
        size_t frac_start = ++i;
        while (i < len && s[i] >= '0' && s[i] <= '9')
            i++;
        frac_digits = i - frac_start;
        if (frac_digits == 0)
            return MONEY_ERR_SYNTAX;
    }
    if (i != len)
        return MONEY_ERR_SYNTAX;
    if (frac_digits > MONEY_FRAC_DIGITS)
        return MONEY_ERR_PRECISION;
    i128 value = 0;
    for (size_t j = 0; j < len; j++) {
        if (s[j] == '.')
            continue;
        value = value * 10 + (s[j] - '0');
        if (value > (i128)INT64_MAX * 10)
            return MONEY_ERR_OVERFLOW; /* no need to read further */
    }
    for (size_t k = frac_digits; k < MONEY_FRAC_DIGITS; k++)
        value *= 10;
    if (value > INT64_MAX)
        return MONEY_ERR_OVERFLOW;
    *out = (int64_t)value;
    return MONEY_OK;
}

static int64_t read_i64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int k = 0; k < 8; k++)
        v = v << 8 | p[k];
    return (int64_t)v;
}

/* Formats v and checks the text: at most MONEY_FMT_LEN bytes with its NUL,
 * 2 to 6 fraction digits, and parsed back (without a minus) the same value. */
static void check_format(int64_t v)
{
    char buf[MONEY_FMT_LEN + 8];
    memset(buf, 'Z', sizeof buf);
    money_format(v, buf);
    if (memchr(buf, '\0', MONEY_FMT_LEN) == NULL || buf[MONEY_FMT_LEN] != 'Z')
        abort();
    const char *dot = strchr(buf, '.');
    size_t frac = dot ? strlen(dot + 1) : 0;
    if (!dot || frac < 2 || frac > MONEY_FRAC_DIGITS)
        abort();
    if (v < 0) {
        if (buf[0] != '-')
            abort();
        if (v != INT64_MIN) {
            int64_t back;
            if (money_parse(buf + 1, &back) != MONEY_OK || back != -v)
                abort();
        }
        return;
    }
    int64_t back;
    if (money_parse(buf, &back) != MONEY_OK || back != v)
        abort();
}

static void check_arithmetic(int64_t a, int64_t b, int64_t c)
{
    int64_t r, expect;
    int over = __builtin_add_overflow(a, b, &expect);
    if (money_add(a, b, &r) != (over ? MONEY_ERR_OVERFLOW : MONEY_OK) || r != (over ? 0 : expect))
        abort();
    over = __builtin_sub_overflow(a, b, &expect);
    if (money_sub(a, b, &r) != (over ? MONEY_ERR_OVERFLOW : MONEY_OK) || r != (over ? 0 : expect))
        abort();

    /* Billing inputs of realistic size, so that the product fits 128 bits
     * in the reference (the module itself is exact for any int64_t). */
    int64_t price = a % (INT64_C(1) << 40), cards = b % 1024, seconds = c % (INT64_C(1) << 40);
    int rc = money_accrue(price, cards, seconds, &r);
    if (price < 0 || cards < 0 || seconds < 0) {
        if (rc != MONEY_ERR_NEGATIVE || r != 0)
            abort();
    } else {
        i128 due = (i128)price * cards * seconds / 3600;
        if (due > INT64_MAX ? rc != MONEY_ERR_OVERFLOW || r != 0 : rc != MONEY_OK || r != (int64_t)due)
            abort();
    }

    /* The seconds funds pay for: the last whole second they cover. */
    int64_t funds = c;
    int64_t s;
    rc = money_seconds_affordable(price, cards, funds, &s);
    if (price < 0 || cards < 0 || funds < 0) {
        if (rc != MONEY_ERR_NEGATIVE)
            abort();
        return;
    }
    if (rc != MONEY_OK || s < 0)
        abort();
    if (price == 0 || cards == 0) {
        if (s != INT64_MAX)
            abort();
        return;
    }
    if ((i128)price * cards * s / 3600 > funds)
        abort();
    if (s != INT64_MAX && (i128)price * cards * (s + 1) / 3600 <= funds)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int64_t got, want;
    int rc = money_parse_n((const char *)data, size, &got);
    int ref = reference_parse((const char *)data, size, &want);
    if (rc != ref || got != want)
        abort();
    if (rc == MONEY_OK)
        check_format(got);
    if (size >= 24) {
        int64_t a = read_i64(data), b = read_i64(data + 8), c = read_i64(data + 16);
        check_format(a);
        check_arithmetic(a, b, c);
    }
    return 0;
}
