/* nvidia_smi.c: reads nvidia-smi's --query-gpu CSV rows, and the header of
 * the `nvidia-smi -q` output after them, into cards, names, memory,
 * serials, driver and CUDA versions, and health from bracketed errors, ECC
 * counts, pages pending retirement and cards that fell off the bus. */
#include "discovery/private.h"

#include <string.h>

#define NV_MSG "nvidia-smi output"

enum nv_field { NV_INDEX, NV_NAME, NV_MEMORY, NV_DRIVER, NV_SERIAL, NV_UUID, NV_BUS, NV_ECC, NV_RETIRED, NV_NFIELDS };

static const char *const nv_field_names[NV_NFIELDS] = {
    "index",
    "name",
    "memory.total",
    "driver_version",
    "serial",
    "uuid",
    "pci.bus_id",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
};

enum nv_kind {
    NV_PLAIN,  /* a real value */
    NV_ABSENT, /* the card or driver does not offer this field */
    NV_FAILED, /* the driver could not read the card */
};

/* nvidia-smi puts anything that is not a value in brackets. "[N/A]" and
 * "[Not Supported]" are normal (a GeForce has no ECC); anything else, like
 * "[GPU requires reset]" or "[Unknown Error]", means the card is in trouble. */
static enum nv_kind nv_kind(struct span v)
{
    struct span in;

    if (text_eq(v, "N/A") || v.n == 0)
        return NV_ABSENT;
    if (v.n < 2 || v.p[0] != '[' || v.p[v.n - 1] != ']')
        return NV_PLAIN;
    in = (struct span){v.p + 1, v.n - 2};
    if (text_eq(in, "N/A") || text_eq(in, "Not Supported") || text_eq(in, "Insufficient Permissions") ||
        text_eq(in, "Not Available"))
        return NV_ABSENT;
    return NV_FAILED;
}

#define LOST_PREFIX "Unable to determine the device handle for GPU"

/* A card that fell off the bus is not a row but a message:
 * "Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error". */
static int nv_lost_card(struct span line, struct gpu_facts *f, int lineno, char *err, size_t errlen)
{
    struct span rest = text_trim((struct span){line.p + strlen(LOST_PREFIX), line.n - strlen(LOST_PREFIX)});
    struct span bus = rest, why = {"", 0};
    struct gpu_card *c;
    char reason[64];

    for (size_t i = rest.n; i >= 2; i--) {
        if (rest.p[i - 2] == ':' && rest.p[i - 1] == ' ') {
            bus = (struct span){rest.p, i - 2};
            why = text_trim((struct span){rest.p + i, rest.n - i});
            break;
        }
    }
    if ((c = cards_add(f, -1)) == NULL) {
        text_err(err, errlen, NV_MSG ": more than %d cards (line %d)", DISCOVERY_MAX_CARDS, lineno);
        return -1;
    }
    text_copy(c->bus_id, sizeof c->bus_id, bus.p, bus.n);
    text_copy(reason, sizeof reason, why.p, why.n);
    cards_fail(c, "nvidia-smi cannot reach it: %s", reason[0] ? reason : "no reason given");
    return 0;
}

static int nv_row(struct span line, struct gpu_facts *f, int lineno, char *err, size_t errlen)
{
    struct span v[NV_NFIELDS];
    size_t nf = 0, start = 0;
    struct gpu_card *c;
    uint64_t num;
    int index, gb;

    for (size_t i = 0; i <= line.n; i++) {
        if (i < line.n && line.p[i] != ',')
            continue;
        if (nf < NV_NFIELDS)
            v[nf] = text_trim((struct span){line.p + start, i - start});
        nf++;
        start = i + 1;
    }
    if (nf == 1) {
        /* Not CSV at all: nvidia-smi telling why it failed, e.g. "NVIDIA-SMI
         * has failed because it couldn't communicate with the NVIDIA driver". */
        char shown[100];

        text_copy(shown, sizeof shown, line.p, line.n);
        text_err(err, errlen, NV_MSG " line %d: %s", lineno, shown);
        return -1;
    }
    if (nf != NV_NFIELDS) {
        text_err(err, errlen, NV_MSG " line %d: expected %d fields, got %zu", lineno, NV_NFIELDS, nf);
        return -1;
    }
    if (text_u64(v[NV_INDEX], &num) != 0 || num > DISCOVERY_MAX_GPU_INDEX) {
        text_err(err, errlen, NV_MSG " line %d: index is not a number", lineno);
        return -1;
    }
    index = (int)num;
    if (cards_find(f, index) != NULL) {
        text_err(err, errlen, NV_MSG " line %d: card %d is listed twice", lineno, index);
        return -1;
    }
    if ((c = cards_add(f, index)) == NULL) {
        text_err(err, errlen, NV_MSG ": more than %d cards (line %d)", DISCOVERY_MAX_CARDS, lineno);
        return -1;
    }
    for (int i = 0; i < NV_NFIELDS; i++) {
        if (nv_kind(v[i]) == NV_FAILED) {
            char what[48];

            text_copy(what, sizeof what, v[i].p + 1, v[i].n - 2);
            cards_fail(c, "nvidia-smi: %s", what);
        }
    }

    if (nv_kind(v[NV_NAME]) == NV_PLAIN)
        cards_set_name(c, v[NV_NAME].p, v[NV_NAME].n);
    else
        text_copy(c->name, sizeof c->name, v[NV_NAME].p, v[NV_NAME].n);

    switch (nv_kind(v[NV_MEMORY])) {
    case NV_PLAIN: {
        /* "81559", or "81559 MiB" if someone dropped nounits. */
        struct span m = v[NV_MEMORY];
        size_t d = 0;

        while (d < m.n && m.p[d] >= '0' && m.p[d] <= '9')
            d++;
        if (text_u64((struct span){m.p, d}, &num) != 0 ||
            !(d == m.n || text_eq(text_trim((struct span){m.p + d, m.n - d}), "MiB"))) {
            text_err(err, errlen, NV_MSG " line %d: memory.total is not a number of MiB", lineno);
            return -1;
        }
        if (text_to_gb(num, UINT64_C(1) << 20, &gb) != 0) {
            text_err(err, errlen, NV_MSG " line %d: memory.total is implausibly large", lineno);
            return -1;
        }
        c->memory_gb = gb;
        if (gb == 0)
            cards_fail(c, "nvidia-smi reports no memory");
        break;
    }
    case NV_ABSENT:
        cards_fail(c, "nvidia-smi reports no memory size");
        break;
    case NV_FAILED:
        break;
    }

    if (nv_kind(v[NV_DRIVER]) == NV_PLAIN && f->driver_version[0] == '\0')
        text_copy(f->driver_version, sizeof f->driver_version, v[NV_DRIVER].p, v[NV_DRIVER].n);
    /* GeForce boards have no serial; the UUID still tells cards apart. */
    if (nv_kind(v[NV_SERIAL]) == NV_PLAIN)
        text_copy(c->serial, sizeof c->serial, v[NV_SERIAL].p, v[NV_SERIAL].n);
    else if (nv_kind(v[NV_UUID]) == NV_PLAIN)
        text_copy(c->serial, sizeof c->serial, v[NV_UUID].p, v[NV_UUID].n);
    if (nv_kind(v[NV_BUS]) == NV_PLAIN)
        text_copy(c->bus_id, sizeof c->bus_id, v[NV_BUS].p, v[NV_BUS].n);

    if (nv_kind(v[NV_ECC]) == NV_PLAIN) {
        if (text_u64(v[NV_ECC], &num) != 0) {
            text_err(err, errlen, NV_MSG " line %d: %s is not a number", lineno, nv_field_names[NV_ECC]);
            return -1;
        }
        /* Uncorrected errors since the driver loaded: the card needs a reset
         * before anyone can trust its memory again. */
        if (num > 0)
            cards_fail(c, "%llu uncorrected ECC errors", (unsigned long long)num);
    }
    if (nv_kind(v[NV_RETIRED]) == NV_PLAIN) {
        if (text_eq(v[NV_RETIRED], "Yes")) {
            cards_fail(c, "memory pages pending retirement");
        } else if (!text_eq(v[NV_RETIRED], "No")) {
            text_err(err, errlen, NV_MSG " line %d: %s is neither Yes nor No", lineno, nv_field_names[NV_RETIRED]);
            return -1;
        }
    }
    return 0;
}

/* Copies a version as a tool printed it ("12.4", "550.90.07", "6.0.2")
 * into dst; 0, or -1 (dst untouched) for "N/A", an empty value or one that
 * does not start with a digit. */
static int copy_version(char *dst, size_t cap, struct span v)
{
    v = text_trim(v);
    if (v.n == 0 || v.p[0] < '0' || v.p[0] > '9')
        return -1;
    text_copy(dst, cap, v.p, v.n);
    return 0;
}

/* One line of `nvidia-smi -q`: only the header's "Driver Version : X" and
 * "CUDA Version : Y" matter; per-GPU sections and anything else are skipped,
 * since -q's layout changes between driver releases. */
static void nv_query_line(struct span line, struct gpu_facts *f)
{
    const char *colon = memchr(line.p, ':', line.n);
    struct span key, value;

    if (colon == NULL)
        return;
    key = text_trim((struct span){line.p, (size_t)(colon - line.p)});
    value = (struct span){colon + 1, line.n - (size_t)(colon - line.p) - 1};
    if (text_eq(key, "CUDA Version"))
        copy_version(f->stack_version, sizeof f->stack_version, value);
    else if (text_eq(key, "Driver Version") && f->driver_version[0] == '\0')
        copy_version(f->driver_version, sizeof f->driver_version, value);
}

int discovery_parse_nvidia_smi_csv(const char *text, size_t len, struct gpu_facts *out, char *err, size_t errlen)
{
    size_t pos = 0;
    int lineno = 0, query = 0;

    cards_reset(out, "NVIDIA", "CUDA");
    if (text == NULL || len == 0) {
        text_err(err, errlen, NV_MSG ": empty");
        goto fail;
    }
    if (len > DISCOVERY_MAX_OUTPUT) {
        text_err(err, errlen, NV_MSG ": larger than %u bytes", DISCOVERY_MAX_OUTPUT);
        goto fail;
    }
    if (memchr(text, '\0', len) != NULL) {
        text_err(err, errlen, NV_MSG ": contains NUL bytes, not text");
        goto fail;
    }
    while (pos < len) {
        struct span line = {text + pos, 0};

        while (pos < len && text[pos] != '\n') {
            pos++;
            line.n++;
        }
        pos++; /* the newline */
        lineno++;
        line = text_trim(line);
        if (line.n == 0)
            continue;
        /* `nvidia-smi -q` output follows the CSV rows (discovery_run runs
         * it second); from its banner on, lines are read as -q output. */
        if (!query && line.p[0] == '=' && memmem(line.p, line.n, "NVSMI LOG", 9) != NULL) {
            query = 1;
            continue;
        }
        if (query) {
            nv_query_line(line, out);
            continue;
        }
        if (line.n >= strlen(LOST_PREFIX) && strncmp(line.p, LOST_PREFIX, strlen(LOST_PREFIX)) == 0) {
            if (nv_lost_card(line, out, lineno, err, errlen) != 0)
                goto fail;
        } else if (nv_row(line, out, lineno, err, errlen) != 0) {
            goto fail;
        }
    }
    if (out->n_cards == 0) {
        text_err(err, errlen, NV_MSG ": no GPU rows");
        goto fail;
    }
    cards_sort(out);
    return 0;
fail:
    memset(out, 0, sizeof *out);
    return -1;
}
