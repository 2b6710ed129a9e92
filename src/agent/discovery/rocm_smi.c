/* rocm_smi.c: reads the one JSON document the deprecated rocm-smi prints
 * (product name, VRAM, driver version, serial, bus) into cards. */
#include "discovery/private.h"

#include <string.h>

#define ROCM_MSG "rocm-smi output"

static int rocm_card(json_t *v, int index, struct gpu_facts *f, char *err, size_t errlen)
{
    struct gpu_card *c;
    json_t *series, *vram;
    const char *s;
    uint64_t bytes;

    if (cards_find(f, index) != NULL) {
        text_err(err, errlen, ROCM_MSG ": card %d is listed twice", index);
        return -1;
    }
    if ((c = cards_add(f, index)) == NULL) {
        text_err(err, errlen, ROCM_MSG ": more than %d cards", DISCOVERY_MAX_CARDS);
        return -1;
    }
    if (!json_is_object(v)) {
        text_err(err, errlen, ROCM_MSG ": card %d is not an object", index);
        return -1;
    }
    series = text_json_get_ci(v, "Card Series");
    if (series == NULL) {
        text_err(err, errlen, ROCM_MSG ": card %d has no Card Series (run with --showproductname)", index);
        return -1;
    }
    if (!json_is_string(series)) {
        text_err(err, errlen, ROCM_MSG ": card %d: Card Series is not a string", index);
        return -1;
    }
    cards_set_name(c, json_string_value(series), json_string_length(series));
    if (c->name[0] == '\0' || text_is_na(c->name))
        cards_fail(c, "rocm-smi cannot read the model name");

    vram = text_json_get_ci(v, "VRAM Total Memory (B)");
    if (vram == NULL) {
        text_err(err, errlen, ROCM_MSG ": card %d has no vram size", index);
        return -1;
    }
    if (json_is_string(vram) && text_is_na(json_string_value(vram))) {
        cards_fail(c, "rocm-smi cannot read the VRAM size");
    } else if (text_json_u64(vram, &bytes) != 0) {
        text_err(err, errlen, ROCM_MSG ": card %d: VRAM Total Memory (B) is not a number", index);
        return -1;
    } else if (text_to_gb(bytes, 1, &c->memory_gb) != 0) {
        text_err(err, errlen, ROCM_MSG ": card %d: vram size is implausibly large", index);
        return -1;
    } else if (c->memory_gb == 0) {
        cards_fail(c, "rocm-smi reports no VRAM");
    }

    if ((s = text_json_opt(v, "PCI Bus")) != NULL)
        text_copy_str(c->bus_id, sizeof c->bus_id, s);
    if ((s = text_json_opt(v, "Serial Number")) != NULL)
        text_copy_str(c->serial, sizeof c->serial, s);
    return 0;
}

int discovery_parse_rocm_smi(const char *text, size_t len, struct gpu_facts *out, char *err, size_t errlen)
{
    json_t *doc = NULL, *v;
    const char *key;
    size_t pos = 0;

    cards_reset(out, "AMD", "ROCm");
    if (text == NULL || len == 0) {
        text_err(err, errlen, ROCM_MSG ": empty");
        goto fail;
    }
    if (len > DISCOVERY_MAX_OUTPUT) {
        text_err(err, errlen, ROCM_MSG ": larger than %u bytes", DISCOVERY_MAX_OUTPUT);
        goto fail;
    }
    pos = text_skip_noise(text, len, pos);
    if (pos >= len) {
        text_err(err, errlen, ROCM_MSG ": no JSON found");
        goto fail;
    }
    if ((doc = text_json_load("rocm-smi", text, len, &pos, err, errlen)) == NULL)
        goto fail;
    if (text_skip_noise(text, len, pos) < len) {
        text_err(err, errlen, ROCM_MSG ": more than one JSON document");
        goto fail;
    }
    if (!json_is_object(doc)) {
        text_err(err, errlen, ROCM_MSG ": top level is not an object");
        goto fail;
    }
    json_object_foreach(doc, key, v)
    {
        if (strcmp(key, "system") == 0) {
            const char *s = json_is_object(v) ? text_json_opt(v, "Driver version") : NULL;

            if (s != NULL)
                text_copy_str(out->driver_version, sizeof out->driver_version, s);
        } else if (strncmp(key, "card", 4) == 0) {
            struct span num = {key + 4, strlen(key + 4)};
            uint64_t idx;

            if (text_u64(num, &idx) != 0 || idx > DISCOVERY_MAX_GPU_INDEX) {
                char shown[24];

                text_copy_str(shown, sizeof shown, key);
                text_err(err, errlen, ROCM_MSG ": \"%s\" is not a card name", shown);
                goto fail;
            }
            if (rocm_card(v, (int)idx, out, err, errlen) != 0)
                goto fail;
        }
        /* Other keys are sections this command does not ask for. */
    }
    if (out->n_cards == 0) {
        text_err(err, errlen, ROCM_MSG ": no GPUs listed");
        goto fail;
    }
    json_decref(doc);
    cards_sort(out);
    return 0;
fail:
    json_decref(doc);
    memset(out, 0, sizeof *out);
    return -1;
}
