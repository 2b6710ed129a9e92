/* amd_smi.c: reads what amd-smi prints (static, metric --ecc and version,
 * as JSON documents one after the other) into cards, their names, VRAM,
 * serials, driver and ROCm versions, and health from ECC and RAS counts. */
#include "discovery/private.h"

#include <string.h>
#include <strings.h>

#define AMD_MSG "amd-smi output"

/* Reads the "size" of the vram section: {"value": 196592, "unit": "MB"}
 * (ROCm 6.1+), "196592 MB" (older), or a bare number of MB. Sets *na when
 * the tool printed N/A. */
static int amd_vram_size(const json_t *size, int idx, int *gb, int *na, char *err, size_t errlen)
{
    uint64_t value, unit;
    char shown[24];

    *na = 0;
    if (json_is_object(size)) {
        const json_t *v = json_object_get(size, "value");
        const json_t *u = json_object_get(size, "unit");

        if (v == NULL) {
            text_err(err, errlen, AMD_MSG ": card %d has no vram size", idx);
            return -1;
        }
        if (json_is_string(v) && text_is_na(json_string_value(v))) {
            *na = 1;
            return 0;
        }
        if (text_json_u64(v, &value) != 0) {
            text_err(err, errlen, AMD_MSG ": card %d: vram size value is not a number", idx);
            return -1;
        }
        if (!json_is_string(u)) {
            text_err(err, errlen, AMD_MSG ": card %d: vram size has no unit", idx);
            return -1;
        }
        unit = text_unit_bytes((struct span){json_string_value(u), json_string_length(u)});
        if (unit == 0) {
            text_copy_str(shown, sizeof shown, json_string_value(u));
            text_err(err, errlen, AMD_MSG ": card %d: unknown vram unit \"%s\"", idx, shown);
            return -1;
        }
    } else if (json_is_string(size)) {
        struct span s = text_trim((struct span){json_string_value(size), json_string_length(size)});
        size_t d = 0;

        if (text_eq(s, "N/A")) {
            *na = 1;
            return 0;
        }
        while (d < s.n && s.p[d] >= '0' && s.p[d] <= '9')
            d++;
        if (text_u64((struct span){s.p, d}, &value) != 0) {
            text_err(err, errlen, AMD_MSG ": card %d: vram size is not a number", idx);
            return -1;
        }
        s = text_trim((struct span){s.p + d, s.n - d});
        unit = s.n == 0 ? UINT64_C(1) << 20 : text_unit_bytes(s);
        if (unit == 0) {
            text_copy(shown, sizeof shown, s.p, s.n);
            text_err(err, errlen, AMD_MSG ": card %d: unknown vram unit \"%s\"", idx, shown);
            return -1;
        }
    } else if (json_is_integer(size)) {
        if (text_json_u64(size, &value) != 0) {
            text_err(err, errlen, AMD_MSG ": card %d: vram size is negative", idx);
            return -1;
        }
        unit = UINT64_C(1) << 20;
    } else {
        text_err(err, errlen, AMD_MSG ": card %d: vram size has the wrong type", idx);
        return -1;
    }
    if (text_to_gb(value, unit, gb) != 0) {
        text_err(err, errlen, AMD_MSG ": card %d: vram size is implausibly large", idx);
        return -1;
    }
    return 0;
}

/* The part of a card that `amd-smi static` prints. */
static int amd_static(json_t *e, struct gpu_card *c, struct gpu_facts *f, char *err, size_t errlen)
{
    json_t *asic = json_object_get(e, "asic");
    json_t *vram = json_object_get(e, "vram");
    json_t *board = json_object_get(e, "board");
    json_t *ras = json_object_get(e, "ras");
    json_t *name, *size, *exceeded;
    const char *s;
    int na;

    /* A card amd-smi cannot talk to may get "N/A" for a whole section. */
    if (json_is_string(asic) && text_is_na(json_string_value(asic))) {
        text_copy_str(c->name, sizeof c->name, "N/A");
        cards_fail(c, "amd-smi cannot read the model name");
        asic = NULL;
    } else if (!json_is_object(asic)) {
        text_err(err, errlen, AMD_MSG ": card %d has no asic section", c->index);
        return -1;
    }
    if (asic != NULL) {
        name = json_object_get(asic, "market_name");
        if (name == NULL) {
            text_err(err, errlen, AMD_MSG ": card %d has no market_name", c->index);
            return -1;
        }
        if (!json_is_string(name)) {
            text_err(err, errlen, AMD_MSG ": card %d: market_name is not a string", c->index);
            return -1;
        }
        cards_set_name(c, json_string_value(name), json_string_length(name));
        if (c->name[0] == '\0' || text_is_na(c->name))
            cards_fail(c, "amd-smi cannot read the model name");
    }

    size = json_is_object(vram) ? json_object_get(vram, "size") : NULL;
    if (json_is_string(vram) && text_is_na(json_string_value(vram))) {
        cards_fail(c, "amd-smi cannot read the VRAM size");
    } else if (vram != NULL && !json_is_object(vram)) {
        text_err(err, errlen, AMD_MSG ": card %d: vram is not an object", c->index);
        return -1;
    } else if (size == NULL) {
        text_err(err, errlen, AMD_MSG ": card %d has no vram size", c->index);
        return -1;
    } else {
        if (amd_vram_size(size, c->index, &c->memory_gb, &na, err, errlen) != 0)
            return -1;
        if (na)
            cards_fail(c, "amd-smi cannot read the VRAM size");
        else if (c->memory_gb == 0)
            cards_fail(c, "amd-smi reports no VRAM");
    }

    if ((s = text_json_opt(json_object_get(e, "bus"), "bdf")) != NULL)
        text_copy_str(c->bus_id, sizeof c->bus_id, s);
    /* The board serial is what is printed on the card; the ASIC serial is a
     * fallback for boards without FRU data. */
    if ((s = text_json_opt(board, "product_serial")) != NULL || (s = text_json_opt(asic, "asic_serial")) != NULL)
        text_copy_str(c->serial, sizeof c->serial, s);
    if (f->driver_version[0] == '\0' && (s = text_json_opt(json_object_get(e, "driver"), "version")) != NULL)
        text_copy_str(f->driver_version, sizeof f->driver_version, s);

    /* amdgpu retires VRAM pages with uncorrectable errors; past the
     * threshold the card is due for replacement. */
    exceeded = json_is_object(ras) ? json_object_get(ras, "bad_page_threshold_exceeded") : NULL;
    if (json_is_true(exceeded) || (json_is_string(exceeded) && (strcasecmp(json_string_value(exceeded), "true") == 0 ||
                                                                strcasecmp(json_string_value(exceeded), "yes") == 0)))
        cards_fail(c, "bad page threshold exceeded");
    return 0;
}

/* The part of a card that `amd-smi metric --ecc` prints. */
static int amd_ecc(json_t *ecc, struct gpu_card *c, char *err, size_t errlen)
{
    json_t *v = json_object_get(ecc, "total_uncorrectable_count");
    uint64_t n;

    if (v == NULL || (json_is_string(v) && text_is_na(json_string_value(v))))
        return 0;
    if (text_json_u64(v, &n) != 0) {
        text_err(err, errlen, AMD_MSG ": card %d: total_uncorrectable_count is not a number", c->index);
        return -1;
    }
    if (n > 0)
        cards_fail(c, "%llu uncorrectable ECC errors", (unsigned long long)n);
    return 0;
}

static int amd_entry(json_t *e, size_t pos, struct gpu_facts *f, unsigned char *has_static, int *seen, size_t *n_seen,
                     char *err, size_t errlen)
{
    json_t *gpu = json_object_get(e, "gpu");
    json_t *ecc = json_object_get(e, "ecc");
    struct gpu_card *c;
    uint64_t idx;
    int index;

    if (!json_is_object(e)) {
        text_err(err, errlen, AMD_MSG ": entry %zu is not an object", pos);
        return -1;
    }
    if (gpu == NULL) {
        const char *rocm = text_json_opt(e, "rocm_version");

        /* `amd-smi version --json` has no GPU index, only versions. */
        if (json_object_get(e, "rocm_version") == NULL && json_object_get(e, "amdsmi_library_version") == NULL) {
            text_err(err, errlen, AMD_MSG ": entry %zu has no \"gpu\" index", pos);
            return -1;
        }
        if (rocm != NULL)
            text_copy_str(f->stack_version, sizeof f->stack_version, rocm);
        return 0;
    }
    if (text_json_u64(gpu, &idx) != 0 || idx > DISCOVERY_MAX_GPU_INDEX) {
        text_err(err, errlen, AMD_MSG ": entry %zu: \"gpu\" is not a GPU index", pos);
        return -1;
    }
    index = (int)idx;
    for (size_t i = 0; i < *n_seen; i++) {
        if (seen[i] == index) {
            text_err(err, errlen, AMD_MSG ": card %d is listed twice", index);
            return -1;
        }
    }
    c = cards_find(f, index);
    if (c == NULL && (c = cards_add(f, index)) == NULL) {
        text_err(err, errlen, AMD_MSG ": more than %d cards", DISCOVERY_MAX_CARDS);
        return -1;
    }
    /* A document lists each card once, so n_seen stays within the cards. */
    seen[(*n_seen)++] = index;

    if (json_object_get(e, "asic") != NULL || json_object_get(e, "vram") != NULL) {
        size_t slot = (size_t)(c - f->cards);

        if (has_static[slot]) {
            text_err(err, errlen, AMD_MSG ": card %d has two static descriptions", index);
            return -1;
        }
        has_static[slot] = 1;
        if (amd_static(e, c, f, err, errlen) != 0)
            return -1;
    }
    if (json_is_object(ecc) && amd_ecc(ecc, c, err, errlen) != 0)
        return -1;
    return 0;
}

/* One document: [ {...}, ... ] (ROCm 6), {"gpu_data": [...]} (ROCm 7), or a
 * single object such as the one `amd-smi version --json` may print. */
static int amd_doc(json_t *doc, struct gpu_facts *f, unsigned char *has_static, char *err, size_t errlen)
{
    int seen[DISCOVERY_MAX_CARDS];
    size_t n_seen = 0, i;
    json_t *list = doc, *e;

    if (json_is_object(doc)) {
        list = json_object_get(doc, "gpu_data");
        if (list == NULL)
            return amd_entry(doc, 0, f, has_static, seen, &n_seen, err, errlen);
        if (!json_is_array(list)) {
            text_err(err, errlen, AMD_MSG ": gpu_data is not a list");
            return -1;
        }
    }
    json_array_foreach(list, i, e)
    {
        if (n_seen >= DISCOVERY_MAX_CARDS && json_object_get(e, "gpu") != NULL) {
            text_err(err, errlen, AMD_MSG ": more than %d cards", DISCOVERY_MAX_CARDS);
            return -1;
        }
        if (amd_entry(e, i, f, has_static, seen, &n_seen, err, errlen) != 0)
            return -1;
    }
    return 0;
}

int discovery_parse_amd_smi(const char *text, size_t len, struct gpu_facts *out, char *err, size_t errlen)
{
    unsigned char has_static[DISCOVERY_MAX_CARDS] = {0};
    size_t pos = 0, n_static = 0;
    int docs = 0;

    cards_reset(out, "AMD", "ROCm");
    if (text == NULL || len == 0) {
        text_err(err, errlen, AMD_MSG ": empty");
        goto fail;
    }
    if (len > DISCOVERY_MAX_OUTPUT) {
        text_err(err, errlen, AMD_MSG ": larger than %u bytes", DISCOVERY_MAX_OUTPUT);
        goto fail;
    }
    for (;;) {
        json_t *doc;
        int rc;

        pos = text_skip_noise(text, len, pos);
        if (pos >= len)
            break;
        if ((doc = text_json_load("amd-smi", text, len, &pos, err, errlen)) == NULL)
            goto fail;
        rc = amd_doc(doc, out, has_static, err, errlen);
        json_decref(doc);
        if (rc != 0)
            goto fail;
        docs++;
    }
    if (docs == 0) {
        text_err(err, errlen, AMD_MSG ": no JSON found");
        goto fail;
    }
    for (size_t i = 0; i < out->n_cards; i++) {
        if (!has_static[i]) {
            text_err(err, errlen, AMD_MSG ": card %d has no static data (asic, vram)", out->cards[i].index);
            goto fail;
        }
        n_static++;
    }
    if (n_static == 0) {
        text_err(err, errlen, AMD_MSG ": no GPUs listed");
        goto fail;
    }
    cards_sort(out);
    return 0;
fail:
    memset(out, 0, sizeof *out);
    return -1;
}
