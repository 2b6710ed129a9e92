/* test_ws_frames.c: unit tests for following a WebSocket client's frames
 * (ws_frames.c): well-formed frames pass whole or a byte at a time, and each
 * header RFC 6455 forbids is found where it starts, even when its bytes come
 * split over calls. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "gpurent/ws_frames.h"

/* A masked client frame of len payload bytes (all 'x'), into out; its size. */
static size_t frame(uint8_t *out, uint8_t b0, uint64_t len, int ext)
{
    size_t k = 0;
    out[k++] = b0;
    if (ext == 0) {
        out[k++] = 0x80 | (uint8_t)len;
    } else if (ext == 2) {
        out[k++] = 0x80 | 126;
        out[k++] = (uint8_t)(len >> 8), out[k++] = (uint8_t)len;
    } else {
        out[k++] = 0x80 | 127;
        for (int s = 56; s >= 0; s -= 8)
            out[k++] = (uint8_t)(len >> s);
    }
    memcpy(out + k, "\x01\x02\x03\x04", 4);
    k += 4;
    memset(out + k, 'x', (size_t)len);
    return k + (size_t)len;
}

static void test_well_formed_frames_pass_whole_and_byte_by_byte(void **state)
{
    (void)state;
    static uint8_t buf[200000];
    size_t n = 0;
    n += frame(buf + n, 0x82, 5, 0);          /* binary */
    n += frame(buf + n, 0x89, 125, 0);        /* the largest ping */
    n += frame(buf + n, 0x01, 126, 2);        /* text, first fragment, 16-bit length */
    n += frame(buf + n, 0x80, 70000, 8);      /* its last, 64-bit length */
    n += frame(buf + n, 0x88, 0, 0);          /* close, no status */
    n += frame(buf + n, 0x88, 2, 0);          /* close with a status */
    struct ws_frames f = {0};
    const char *why = NULL;
    assert_int_equal(ws_frames_follow(&f, buf, n, &why), n);
    assert_null(why);
    memset(&f, 0, sizeof f);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ws_frames_follow(&f, buf + i, 1, &why), 1);
    assert_null(why);
    assert_int_equal(f.head_len, 0);
    assert_int_equal(f.payload_left, 0);
}

static void test_forbidden_headers_are_found_where_they_start(void **state)
{
    (void)state;
    static const struct { uint8_t b0; uint64_t len; int ext; const char *why; } cases[] = {
        {0x09, 1, 0, "a fragmented control frame"},
        {0x89, 126, 2, "a control frame over 125 bytes"},
        {0x88, 1, 0, "a close frame with half a status code"},
        {0x82, 3, 2, "a length not in its shortest form"},
        {0x82, 65535, 8, "a length not in its shortest form"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint8_t buf[70000];
        size_t good = frame(buf, 0x82, 10, 0);
        size_t n = good + frame(buf + good, cases[c].b0, cases[c].len, cases[c].ext);
        struct ws_frames f = {0};
        const char *why = NULL;
        assert_int_equal(ws_frames_follow(&f, buf, n, &why), good);
        assert_string_equal(why, cases[c].why);
        /* Split inside the bad header: the first part passes, the rest is refused at 0. */
        memset(&f, 0, sizeof f);
        why = NULL;
        assert_int_equal(ws_frames_follow(&f, buf, good + 1, &why), good + 1);
        assert_null(why);
        assert_int_equal(ws_frames_follow(&f, buf + good + 1, n - good - 1, &why), 0);
        assert_string_equal(why, cases[c].why);
    }
    /* The top bit of a 64-bit length. */
    uint8_t top[14] = {0x82, 0x80 | 127, 0x80, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4};
    struct ws_frames f = {0};
    const char *why = NULL;
    assert_int_equal(ws_frames_follow(&f, top, sizeof top, &why), 0);
    assert_string_equal(why, "a length with its top bit set");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_well_formed_frames_pass_whole_and_byte_by_byte),
        cmocka_unit_test(test_forbidden_headers_are_found_where_they_start),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
