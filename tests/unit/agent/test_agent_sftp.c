/* test_agent_sftp.c: unit tests for the pure parts of the SFTP server
 * (sftp.c): reading packet fields with every bound (short packets, strings
 * past the end, NULs in paths, attributes with extended pairs), building
 * replies up to the packet bound and no further, path normalisation (.., ".",
 * the /shared prefix, the root), the relative form openat2 gets, `ls -l`
 * lines and the status codes of errno values. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "agent.h"

static void test_get_fields(void **state)
{
    const unsigned char pkt[] = {7, 0, 0, 0, 42, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 'a', 'b', 'c'};
    struct sftp_in in = {.p = pkt, .len = sizeof pkt};
    assert_int_equal(sftp_get_u8(&in), 7);
    assert_int_equal(sftp_get_u32(&in), 42);
    assert_true(sftp_get_u64(&in) == ((uint64_t)1 << 32 | 2));
    char s[8];
    sftp_get_cstring(&in, s, sizeof s);
    assert_string_equal(s, "abc");
    assert_int_equal(in.bad, 0);
    assert_int_equal(in.off, in.len);
    /* Past the end: zero, and bad stays set. */
    assert_int_equal(sftp_get_u32(&in), 0);
    assert_int_equal(in.bad, 1);
    assert_int_equal(sftp_get_u8(&in), 0);
}

static void test_get_string_bounds(void **state)
{
    /* A length beyond the packet. */
    const unsigned char longer[] = {0, 0, 0, 9, 'a', 'b'};
    struct sftp_in in = {.p = longer, .len = sizeof longer};
    uint32_t n = 77;
    assert_null(sftp_get_string(&in, &n));
    assert_int_equal(n, 0);
    assert_int_equal(in.bad, 1);
    /* A length near 2^32 must not wrap the offset. */
    const unsigned char huge[] = {0xff, 0xff, 0xff, 0xff, 'a'};
    in = (struct sftp_in){.p = huge, .len = sizeof huge};
    assert_null(sftp_get_string(&in, &n));
    assert_int_equal(in.bad, 1);
    /* A NUL inside a path, and a path longer than the buffer. */
    const unsigned char nul[] = {0, 0, 0, 3, 'a', 0, 'b'};
    char s[4];
    in = (struct sftp_in){.p = nul, .len = sizeof nul};
    sftp_get_cstring(&in, s, sizeof s);
    assert_int_equal(in.bad, 1);
    assert_string_equal(s, "");
    const unsigned char four[] = {0, 0, 0, 4, 'a', 'b', 'c', 'd'};
    in = (struct sftp_in){.p = four, .len = sizeof four};
    sftp_get_cstring(&in, s, sizeof s);
    assert_int_equal(in.bad, 1);
    in = (struct sftp_in){.p = four, .len = sizeof four};
    char s5[5];
    sftp_get_cstring(&in, s5, sizeof s5);
    assert_int_equal(in.bad, 0);
    assert_string_equal(s5, "abcd");
    /* An empty string is a string. */
    const unsigned char empty[] = {0, 0, 0, 0};
    in = (struct sftp_in){.p = empty, .len = sizeof empty};
    sftp_get_cstring(&in, s, sizeof s);
    assert_int_equal(in.bad, 0);
    assert_string_equal(s, "");
}

static void test_attrs_round_trip(void **state)
{
    struct sftp_attrs a = {.flags = SFTP_ATTR_SIZE | SFTP_ATTR_UIDGID | SFTP_ATTR_PERMISSIONS | SFTP_ATTR_ACMODTIME,
                           .size = 1ull << 40,
                           .uid = 1000,
                           .gid = 100,
                           .perm = 0100644,
                           .atime = 1700000000,
                           .mtime = 1700000001};
    struct sftp_out out = {0};
    sftp_out_begin(&out, SFTP_ATTRS);
    sftp_put_attrs(&out, &a);
    assert_int_equal(sftp_out_finish(&out), 0);
    assert_int_equal(out.len, 4 + 1 + 4 + 8 + 8 + 4 + 8);
    assert_int_equal(out.p[3], out.len - 4);
    struct sftp_in in = {.p = out.p + 5, .len = out.len - 5};
    struct sftp_attrs b;
    sftp_get_attrs(&in, &b);
    assert_int_equal(in.bad, 0);
    assert_int_equal(b.flags, a.flags);
    assert_true(b.size == a.size);
    assert_int_equal(b.uid, a.uid);
    assert_int_equal(b.gid, a.gid);
    assert_int_equal(b.perm, a.perm);
    assert_int_equal(b.atime, a.atime);
    assert_int_equal(b.mtime, a.mtime);
    sftp_out_free(&out);
    sftp_out_free(NULL);

    /* Only the flagged fields; extended pairs are skipped. */
    const unsigned char ext[] = {0x80, 0, 0, 0x04, 0, 0, 0x01, 0xa4, 0, 0, 0, 1, 0, 0, 0, 1, 'k', 0, 0, 0, 1, 'v'};
    in = (struct sftp_in){.p = ext, .len = sizeof ext};
    sftp_get_attrs(&in, &b);
    assert_int_equal(in.bad, 0);
    assert_int_equal(b.perm, 0644);
    assert_int_equal(in.off, sizeof ext);
    /* A count of pairs the packet cannot hold. */
    const unsigned char many[] = {0x80, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0};
    in = (struct sftp_in){.p = many, .len = sizeof many};
    sftp_get_attrs(&in, &b);
    assert_int_equal(in.bad, 1);
    /* Flags promising a size that is not there. */
    const unsigned char cut[] = {0, 0, 0, 1, 0, 0};
    in = (struct sftp_in){.p = cut, .len = sizeof cut};
    sftp_get_attrs(&in, &b);
    assert_int_equal(in.bad, 1);
}

static void test_out_bound(void **state)
{
    struct sftp_out out = {0};
    char *big = calloc(1, SFTP_PACKET_MAX);
    assert_non_null(big);
    sftp_out_begin(&out, SFTP_DATA);
    sftp_put_u32(&out, 1);
    sftp_put_string(&out, big, SFTP_DATA_MAX);
    assert_int_equal(sftp_out_finish(&out), 0);
    assert_int_equal(out.len, 4 + 1 + 4 + 4 + SFTP_DATA_MAX);
    /* One byte over the packet bound makes the reply bad... */
    sftp_out_begin(&out, SFTP_DATA);
    sftp_put_string(&out, big, SFTP_PACKET_MAX - 1 - 4 + 1);
    assert_int_equal(sftp_out_finish(&out), -1);
    /* ...and the next reply starts clean. */
    sftp_out_begin(&out, SFTP_STATUS);
    sftp_put_cstring(&out, "ok");
    assert_int_equal(sftp_out_finish(&out), 0);
    assert_int_equal(out.len, 4 + 1 + 4 + 2);
    sftp_out_free(&out);
    free(big);
    /* Nothing begun: nothing to send. */
    struct sftp_out none = {0};
    assert_int_equal(sftp_out_finish(&none), -1);
}

static void assert_normal(const char *in, const char *want, const char *want_rel)
{
    char out[SFTP_PATH_MAX];
    assert_int_equal(sftp_path_normalize(in, out, sizeof out), 0);
    assert_string_equal(out, want);
    assert_string_equal(sftp_path_relative(out), want_rel);
}

static void test_path_normalize(void **state)
{
    assert_normal("", "/", ".");
    assert_normal(".", "/", ".");
    assert_normal("/", "/", ".");
    assert_normal("//./", "/", ".");
    assert_normal("..", "/", ".");
    assert_normal("/../../..", "/", ".");
    assert_normal("../../etc/passwd", "/etc/passwd", "etc/passwd");
    assert_normal("a/b/../c/./d/", "/a/c/d", "a/c/d");
    assert_normal("a/..", "/", ".");
    assert_normal("/shared", "/", ".");
    assert_normal("/shared/", "/", ".");
    assert_normal("/shared/x", "/x", "x");
    assert_normal("shared/x", "/shared/x", "shared/x"); /* relative: under /shared, the volume's own shared/ */
    assert_normal("x", "/x", "x");
    assert_normal("/shared/../shared/x", "/x", "x");
    assert_normal("/shared/shared/x", "/shared/x", "shared/x");
    assert_normal("/sharedx/y", "/sharedx/y", "sharedx/y");
    assert_normal("/a/shared", "/a/shared", "a/shared");
    assert_normal("...", "/...", "...");
    assert_normal("/.hidden/..x", "/.hidden/..x", ".hidden/..x");

    char small[6];
    assert_int_equal(sftp_path_normalize("/abcd", small, sizeof small), 0);
    assert_string_equal(small, "/abcd");
    assert_int_equal(sftp_path_normalize("/abcde", small, sizeof small), -1);
    assert_int_equal(sftp_path_normalize("/", small, 1), -1);
}

static void test_longname(void **state)
{
    char line[256];
    int64_t now = 1764547200; /* 2025-12-01 00:00 UTC */
    sftp_longname(line, sizeof line, "model.bin", S_IFREG | 0644, 1, 1000, 100, 12345, now - 3600, now);
    assert_string_equal(line, "-rw-r--r--    1 1000     100         12345 Nov 30 23:00 model.bin");
    sftp_longname(line, sizeof line, "d", S_IFDIR | 0755, 3, 0, 0, 4096, now - 400 * 86400, now);
    assert_string_equal(line, "drwxr-xr-x    3 0        0            4096 Oct 27  2024 d");
    sftp_longname(line, sizeof line, "l", S_IFLNK | 0777, 1, 0, 0, 3, now + 86400, now);
    assert_string_equal(line, "lrwxrwxrwx    1 0        0               3 Dec  2  2025 l");
    sftp_longname(line, sizeof line, "s", S_IFREG | S_ISUID | S_ISGID | S_ISVTX | 0644, 1, 0, 0, 0, now, now);
    assert_string_equal(line, "-rwSr-Sr-T    1 0        0               0 Dec  1 00:00 s");
    sftp_longname(line, sizeof line, "x", S_IFDIR | S_ISVTX | 01777, 1, 0, 0, 0, now, now);
    assert_true(strncmp(line, "drwxrwxrwt", 10) == 0);
    /* A short buffer is cut, never overrun. */
    char tiny[8];
    sftp_longname(tiny, sizeof tiny, "name", S_IFREG | 0600, 1, 0, 0, 0, now, now);
    assert_string_equal(tiny, "-rw----");
}

static void test_status_of_errno(void **state)
{
    assert_int_equal(sftp_status_of_errno(0), SFTP_FX_OK);
    assert_int_equal(sftp_status_of_errno(ENOENT), SFTP_FX_NO_SUCH_FILE);
    assert_int_equal(sftp_status_of_errno(ENOTDIR), SFTP_FX_NO_SUCH_FILE);
    assert_int_equal(sftp_status_of_errno(ELOOP), SFTP_FX_NO_SUCH_FILE);
    assert_int_equal(sftp_status_of_errno(EACCES), SFTP_FX_PERMISSION_DENIED);
    assert_int_equal(sftp_status_of_errno(EPERM), SFTP_FX_PERMISSION_DENIED);
    assert_int_equal(sftp_status_of_errno(EXDEV), SFTP_FX_PERMISSION_DENIED);
    assert_int_equal(sftp_status_of_errno(EINVAL), SFTP_FX_BAD_MESSAGE);
    assert_int_equal(sftp_status_of_errno(ENOSYS), SFTP_FX_OP_UNSUPPORTED);
    assert_int_equal(sftp_status_of_errno(EEXIST), SFTP_FX_FAILURE);
    assert_int_equal(sftp_status_of_errno(ENOSPC), SFTP_FX_FAILURE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_fields),      cmocka_unit_test(test_get_string_bounds),
        cmocka_unit_test(test_attrs_round_trip), cmocka_unit_test(test_out_bound),
        cmocka_unit_test(test_path_normalize),  cmocka_unit_test(test_longname),
        cmocka_unit_test(test_status_of_errno),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
