/* discovery/private.h: what the files of src/agent/discovery share and the
 * rest of the agent does not see (it includes discovery.h): the text and
 * JSON helpers the parsers read tool output with, and the building of a
 * struct gpu_facts, grouped by the file that implements them.
 *
 * Everything read from a tool is treated as hostile: JSON goes through
 * jansson, text is only ever read through (pointer, length) spans, numbers
 * are parsed digit by digit with overflow checks, and every string lands in
 * a fixed buffer through text_copy(), which truncates and replaces anything
 * that is not printable ASCII (the strings end up in JSON replies and logs). */
#ifndef GPURENT_DISCOVERY_PRIVATE_H
#define GPURENT_DISCOVERY_PRIVATE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "discovery/discovery.h"

/* GPU indices above this are not something a tool prints. */
#define DISCOVERY_MAX_GPU_INDEX 9999

/* text.c: spans, numbers, sizes, safe copies and error messages. */
/* A piece of the tool's output: not NUL-terminated. */
struct span {
    const char *p; /* first byte */
    size_t n;      /* length in bytes */
};
/* printf into err (errlen bytes); err NULL or errlen 0 is a no-op. */
void text_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Copies at most n bytes of src (stopping at a NUL) into dst of cap bytes,
 * always terminated, bytes outside printable ASCII as '?'. */
void text_copy(char *dst, size_t cap, const char *src, size_t n);
/* text_copy of a NUL-terminated string. */
void text_copy_str(char *dst, size_t cap, const char *src);
/* s without leading and trailing white space. */
struct span text_trim(struct span s);
/* Whether s is lit, ignoring case. */
int text_eq(struct span s, const char *lit);
/* The whole of s as a decimal number (digits only, no overflow). 0 or -1. */
int text_u64(struct span s, uint64_t *out);
/* Whether s is "N/A" or "NA", ignoring case. */
int text_is_na(const char *s);
/* Bytes in a size unit as the tools print it (B, KB/KiB, MB/MiB, GB/GiB,
 * all binary); 0 for an unknown unit. */
uint64_t text_unit_bytes(struct span u);
/* value units of unit bytes in GiB, rounded to nearest, into *gb; -1 on
 * overflow or more than any card holds. */
int text_to_gb(uint64_t value, uint64_t unit, int *gb);

/* text.c: JSON documents, as amd-smi and rocm-smi print them. */
/* The position of the next JSON array or object at or after pos, skipping
 * white space and lines of anything else (warnings); len if none. */
size_t text_skip_noise(const char *text, size_t len, size_t pos);
/* Loads the JSON document starting at *pos (duplicate keys refused) and
 * moves *pos past it; NULL with err naming tool and line when it is not
 * valid JSON. New reference. */
json_t *text_json_load(const char *tool, const char *text, size_t len, size_t *pos, char *err, size_t errlen);
/* A non-negative JSON integer or a string of digits. 0 or -1. */
int text_json_u64(const json_t *v, uint64_t *out);
/* obj's string member key, or NULL when obj is not an object or the member
 * is absent, not a string, empty or N/A. Borrowed. */
const char *text_json_opt(const json_t *obj, const char *key);
/* obj's member key, matched without regard to case if not exactly. Borrowed. */
json_t *text_json_get_ci(json_t *obj, const char *key);

/* cards.c: building a struct gpu_facts. */
/* Zeroes f and sets its vendor and stack. */
void cards_reset(struct gpu_facts *f, const char *vendor, const char *stack);
/* A new healthy card with this index at the end of f; NULL when f is full. */
struct gpu_card *cards_add(struct gpu_facts *f, int index);
/* The card with this index, or NULL. */
struct gpu_card *cards_find(struct gpu_facts *f, int index);
/* Sorts f's cards by index, -1 (a card the tool could not number) last. */
void cards_sort(struct gpu_facts *f);
/* Sets the card's name (n bytes of name) and its catalog model from it. */
void cards_set_name(struct gpu_card *c, const char *name, size_t n);
/* Marks the card unhealthy, adding the reason to any earlier ones. */
void cards_fail(struct gpu_card *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
