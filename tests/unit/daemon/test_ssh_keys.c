/* test_ssh_keys.c: OpenSSH public key lines parsed, refused and
 * fingerprinted. The accepted keys were made with ssh-keygen and their
 * fingerprints recorded from `ssh-keygen -l -f` (OpenSSH 9); the refused
 * blobs are built here field by field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "domain/ssh_keys.h"

struct vector {
    const char *line;        /* as ssh-keygen wrote the .pub file */
    const char *type;        /* expected type */
    int64_t bits;            /* what ssh-keygen -l printed first */
    const char *fingerprint; /* what ssh-keygen -l printed second */
    const char *comment;     /* the comment */
};

static const struct vector VECTORS[] = {
    {"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILbBhWGcV/wiZDYS5aJ2boLc2M1Dnq3rZcvNrrRWX43r ued25519@test", "ssh-ed25519",
     256, "SHA256:/mDBwP+YfBGaKLRcMikIibUhe17WSenOLLqbMlkaqnY", "ued25519@test"},
    {"ecdsa-sha2-nistp256 "
     "AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBFBI9lCDgGR7j22WehHOyxgb5Zdy2w+imLNPyroDdJIfwayTz/"
     "NqvewadOOWF/1wNKKcxSgFLoyGue4ZxzEFaYk= uecdsab256@test",
     "ecdsa-sha2-nistp256", 256, "SHA256:anwDZM5sullUmVCnuG4IpQ9zxtVizVMJYEiFiGrDK04", "uecdsab256@test"},
    {"ecdsa-sha2-nistp384 "
     "AAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlzdHAzODQAAABhBNXC6+ykXpKARdEQF3Vuc4Ep4rosmFSaFexAkvfzedAIYvd+"
     "E6xT7QY1b0MYfxYnKxd1Eo8VBnHsmYgVaNnVwAB2N3hHgIcIYMwTFyxxvMNQN3yLvc9jRkZ9YxVitoWzow== uecdsab384@test",
     "ecdsa-sha2-nistp384", 384, "SHA256:CmM33vSsWz3mw0dI6efaYynNbeqsw9tASDP+aOatMCE", "uecdsab384@test"},
    {"ecdsa-sha2-nistp521 "
     "AAAAE2VjZHNhLXNoYTItbmlzdHA1MjEAAAAIbmlzdHA1MjEAAACFBABNY+X0kYzOIrkbCb2RlY5JNC1d0nlb2sr47HQnWkInAD8XYAhEBQRxmU+"
     "a4oVIpu3XeQCfJfCGLBdwBegH9gAXlQAgmVK0hydsTMRHu0khOqIQrD2EEa4wAb9j3SNMXpLAcHokNmUW3XrqKjhOl9QTVsTiOaGqFgfl/"
     "YSNZlzAt1STGw== uecdsab521@test",
     "ecdsa-sha2-nistp521", 521, "SHA256:KIxoiOl5RGFtTorYdNWee4nZa8RJgflhsEbfEN7yTdk", "uecdsab521@test"},
    {"ssh-rsa "
     "AAAAB3NzaC1yc2EAAAADAQABAAABAQCj4DaKQties4H4UCxn8rYOO4DObTA8ChG3k7Sslx8KmSZ80g65q+y5FrZqYAuuMV541fAHHr3zTJBOG86rHdQQ"
     "yMo5zAxc7ZjI3JQlmKHnvqlP05yoFEfCyrBtGPbmB/Kfe2RUxfXOpSdiburX3Zd31zjIbhYBewVzeResU4w13E2ukSejiZmEKKjU4CSHDcQlF5a46H4"
     "8CJf4He/Sp8uQWcomg1vtfJFi/fEKLZWC3/AohYK76G882vT14mXS/R2SJaU3Rx2phci2nWTYb3LDw6VMje4rvdTlakDtdC0LiHjvEfg27CPbEIfGCS"
     "FDixck5d6zLcFWRzZKBDcoBEdJ ursab2048@test",
     "ssh-rsa", 2048, "SHA256:6kEmAnfuPRqKUO1lPbcbS+x/NgyXdxEE+JftGFt4L4Q", "ursab2048@test"},
    {"ssh-rsa "
     "AAAAB3NzaC1yc2EAAAADAQABAAABgQC4NVdrFzsRMCH5QAFDDIpyQ2AVP/P2PzFUowvnXuaa/7WSRLBb+i2hBFKCRTD2+XsO7AsxLGJV4j3UFYwBJHm9"
     "Bj0EjdKo2j5cDl53uquj61hKlZW3SwCDZvTEjtQGg9kt6ixFd1UKmcJMT1dU0tpy5MxEf5F9JgEGdJqEkjaiYC7LNTIGjrPoX7QysslES4PNI5nCVQb"
     "hpZ5PQlJ3t37wTdxhShrxxWOijnReAhE8kH8B5iXgp4LnwtZ69XE6ngWMp248s+F5uYksnBIOcNkfeiAQGxfVjcvr32jsYgx6TzqvIs3iA7RLeu7CX"
     "DKchiNUQyTtwlKgCcKikCxpsOCKOnD8WTYt0qpAel5hpuio6EZ0U1kEq4vTdS5g9+li/ytwmIz66zXwtrSO1nFy5oUBvfeXsizPY7IwX5sFXXo82Z+y"
     "ositngdwrYaaPCOtWM2k3Alxu/LlA0j5RECyLs08syccTUTf6GjhyR5cy5RIzOJDQVMgW1CvnL9znFyoEb8= ursab3072@test",
     "ssh-rsa", 3072, "SHA256:Zv0QzbCmdEKVu1WX2aVdrtZe+bLzpPSB+txrkEDCS2o", "ursab3072@test"},
};

static const char RSA1024[] =
    "ssh-rsa "
    "AAAAB3NzaC1yc2EAAAADAQABAAAAgQC7kcxpPvzuxLYqjNIAZ38gcFutGoj4X/Zr5kGhQ5s2D1Dc70isMfeY1JwMmxNtc6m2gE5A3cWZdXM88ICaBT"
    "wY1H923fSd+NZodrGxScsrXWhKofJScZDSO6dXv5KeolzM911KqIoH36owl6vURxDjXZApKx9WRdzIuov/kpnoJQ== ursab1024@test";

static void expect_refused(const char *line, const char *why_part)
{
    struct ssh_pubkey k;
    char why[256] = "";
    if (ssh_key_parse(line, &k, why, sizeof why) == 0)
        fail_msg("accepted: %.80s", line);
    if (!strstr(why, why_part))
        fail_msg("reason '%s' lacks '%s'", why, why_part);
}

/* Blob building for the refusals: wire strings and base64. */
struct blob {
    unsigned char b[1024]; /* bytes */
    size_t n;              /* used */
};

static void put_string(struct blob *bl, const void *s, size_t len)
{
    assert_true(bl->n + 4 + len <= sizeof bl->b);
    bl->b[bl->n++] = (unsigned char)(len >> 24);
    bl->b[bl->n++] = (unsigned char)(len >> 16);
    bl->b[bl->n++] = (unsigned char)(len >> 8);
    bl->b[bl->n++] = (unsigned char)len;
    memcpy(bl->b + bl->n, s, len);
    bl->n += len;
}

static void put_cstring(struct blob *bl, const char *s)
{
    put_string(bl, s, strlen(s));
}

static void to_line(const char *type, const struct blob *bl, const char *comment, char *out, size_t n)
{
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = (size_t)snprintf(out, n, "%s ", type);
    for (size_t i = 0; i < bl->n; i += 3) {
        uint32_t g = (uint32_t)bl->b[i] << 16 | (i + 1 < bl->n ? (uint32_t)bl->b[i + 1] << 8 : 0) |
                     (i + 2 < bl->n ? bl->b[i + 2] : 0);
        out[o++] = A[g >> 18 & 63];
        out[o++] = A[g >> 12 & 63];
        out[o++] = i + 1 < bl->n ? A[g >> 6 & 63] : '=';
        out[o++] = i + 2 < bl->n ? A[g & 63] : '=';
    }
    snprintf(out + o, n - o, "%s%s", comment ? " " : "", comment ? comment : "");
}

static void ed25519_blob(struct blob *bl, const char *type, size_t key_len)
{
    unsigned char key[64];
    memset(key, 0x5a, sizeof key);
    bl->n = 0;
    put_cstring(bl, type);
    put_string(bl, key, key_len);
}

static void accepts_ssh_keygen_keys_with_their_fingerprints(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof VECTORS / sizeof VECTORS[0]; i++) {
        const struct vector *v = &VECTORS[i];
        struct ssh_pubkey k;
        char why[256] = "";
        if (ssh_key_parse(v->line, &k, why, sizeof why) != 0)
            fail_msg("refused %s: %s", v->type, why);
        assert_string_equal(k.type, v->type);
        assert_int_equal(k.bits, v->bits);
        assert_string_equal(k.fingerprint, v->fingerprint);
        assert_int_equal(k.comment_len, strlen(v->comment));
        assert_memory_equal(k.comment, v->comment, k.comment_len);
        char normal[SSH_KEY_LINE_MAX];
        assert_int_equal(ssh_key_format(&k, 1, normal, sizeof normal), 0);
        assert_string_equal(normal, v->line);
        assert_int_equal(ssh_key_format(&k, 0, normal, sizeof normal), 0);
        assert_int_equal(strlen(normal), strlen(v->type) + 1 + k.base64_len);
    }
}

static void comments_are_optional_trimmed_and_may_hold_spaces(void **state)
{
    (void)state;
    const char *bare = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILbBhWGcV/wiZDYS5aJ2boLc2M1Dnq3rZcvNrrRWX43r";
    struct ssh_pubkey k;
    char why[256], line[512];
    assert_int_equal(ssh_key_parse(bare, &k, why, sizeof why), 0);
    assert_int_equal(k.comment_len, 0);
    assert_string_equal(k.fingerprint, VECTORS[0].fingerprint);
    snprintf(line, sizeof line, "  \t%s   my laptop  key \t ", bare);
    assert_int_equal(ssh_key_parse(line, &k, why, sizeof why), 0);
    assert_int_equal(k.comment_len, strlen("my laptop  key"));
    assert_memory_equal(k.comment, "my laptop  key", k.comment_len);
    char normal[512];
    assert_int_equal(ssh_key_format(&k, 1, normal, sizeof normal), 0);
    snprintf(line, sizeof line, "%s my laptop  key", bare);
    assert_string_equal(normal, line);
    /* A comment too long, and one with a line break. */
    char longc[400];
    memset(longc, 'c', sizeof longc - 1);
    longc[sizeof longc - 1] = '\0';
    snprintf(line, sizeof line, "%s %s", bare, longc);
    expect_refused(line, "comment may be at most");
    snprintf(line, sizeof line, "%s two\nlines", bare);
    expect_refused(line, "line breaks");
    snprintf(line, sizeof line, "%s\n\n", bare);
    expect_refused(line, "line breaks");
    /* The one line end a .pub file ends with is taken, with or without a comment. */
    snprintf(line, sizeof line, "%s\n", bare);
    assert_int_equal(ssh_key_parse(line, &k, why, sizeof why), 0);
    assert_int_equal(k.base64_len, strlen(bare) - strlen("ssh-ed25519 "));
    assert_int_equal(k.comment_len, 0);
    snprintf(line, sizeof line, "%s me@laptop\r\n", bare);
    assert_int_equal(ssh_key_parse(line, &k, why, sizeof why), 0);
    assert_int_equal(k.comment_len, strlen("me@laptop"));
}

static void refuses_rsa_under_2048_bits(void **state)
{
    (void)state;
    expect_refused(RSA1024, "at least 2048 bits; this one has 1024");
}

static void refuses_unknown_types_and_options(void **state)
{
    (void)state;
    expect_refused("", "empty");
    expect_refused("   ", "empty");
    expect_refused("ssh-dss AAAAB3NzaC1kc3MAAACBAP8", "unsupported key type ssh-dss");
    expect_refused("sk-ssh-ed25519@openssh.com AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29t", "unsupported key type");
    expect_refused("from=\"10.0.0.1\" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILbBhWGcV/wiZDYS5aJ2boLc2M1Dnq3rZcvNrrRWX43r",
                   "unsupported key type");
    expect_refused("ssh-ed25519", "no key after it");
}

static void refuses_a_type_that_disagrees_with_the_blob(void **state)
{
    (void)state;
    /* An ed25519 blob under the rsa label, and the reverse. */
    expect_refused("ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAILbBhWGcV/wiZDYS5aJ2boLc2M1Dnq3rZcvNrrRWX43r",
                   "the line says ssh-rsa but the key inside is of another type");
    char line[2048];
    snprintf(line, sizeof line, "ssh-ed25519 %s", strchr(VECTORS[4].line, ' ') + 1);
    expect_refused(line, "the line says ssh-ed25519");
    /* One ECDSA curve's label on another curve's blob. */
    snprintf(line, sizeof line, "ecdsa-sha2-nistp384 %s", strchr(VECTORS[1].line, ' ') + 1);
    expect_refused(line, "the line says ecdsa-sha2-nistp384");
    /* The right type string but another curve's name inside. */
    struct blob bl = {.n = 0};
    unsigned char point[65] = {0x04};
    put_cstring(&bl, "ecdsa-sha2-nistp256");
    put_cstring(&bl, "nistp384");
    put_string(&bl, point, sizeof point);
    to_line("ecdsa-sha2-nistp256", &bl, NULL, line, sizeof line);
    expect_refused(line, "names another curve");
}

static void refuses_wrong_sizes_for_each_curve(void **state)
{
    (void)state;
    static const struct {
        const char *type, *curve;
        size_t good;
    } curves[] = {
        {"ecdsa-sha2-nistp256", "nistp256", 65 },
        {"ecdsa-sha2-nistp384", "nistp384", 97 },
        {"ecdsa-sha2-nistp521", "nistp521", 133},
    };
    for (size_t i = 0; i < 3; i++) {
        unsigned char point[200];
        memset(point, 0x11, sizeof point);
        point[0] = 0x04;
        char line[2048];
        struct blob bl = {.n = 0};
        put_cstring(&bl, curves[i].type);
        put_cstring(&bl, curves[i].curve);
        put_string(&bl, point, curves[i].good);
        to_line(curves[i].type, &bl, "ok", line, sizeof line);
        /* The right size and form, but no point of the curve. */
        expect_refused(line, "not on the");
        bl.n = 0;
        put_cstring(&bl, curves[i].type);
        put_cstring(&bl, curves[i].curve);
        put_string(&bl, point, curves[i].good - 1);
        to_line(curves[i].type, &bl, NULL, line, sizeof line);
        expect_refused(line, "not an uncompressed");
        point[0] = 0x02; /* compressed form: OpenSSH never writes it */
        bl.n = 0;
        put_cstring(&bl, curves[i].type);
        put_cstring(&bl, curves[i].curve);
        put_string(&bl, point, curves[i].good);
        to_line(curves[i].type, &bl, NULL, line, sizeof line);
        expect_refused(line, "not an uncompressed");
    }
}

static void refuses_a_real_point_moved_off_its_curve(void **state)
{
    (void)state;
    for (size_t v = 1; v <= 3; v++) {
        char line[1024];
        snprintf(line, sizeof line, "%s", VECTORS[v].line);
        /* The last base64 characters before the padding and comment hold
         * the low bits of the point's y. */
        char *end = strchr(strchr(line, ' ') + 1, ' ');
        char *c = end - 1;
        while (*c == '=')
            c--;
        c--;
        *c = *c == 'A' ? 'B' : 'A';
        expect_refused(line, "not on the");
    }
}

static void refuses_truncated_blobs_and_trailing_garbage(void **state)
{
    (void)state;
    char line[2048];
    struct blob bl;
    ed25519_blob(&bl, "ssh-ed25519", 31);
    to_line("ssh-ed25519", &bl, NULL, line, sizeof line);
    expect_refused(line, "32 bytes; this one is 31");
    ed25519_blob(&bl, "ssh-ed25519", 32);
    bl.n -= 5; /* the key's string runs past the end */
    to_line("ssh-ed25519", &bl, NULL, line, sizeof line);
    expect_refused(line, "truncated");
    ed25519_blob(&bl, "ssh-ed25519", 32);
    bl.b[bl.n++] = 0;
    to_line("ssh-ed25519", &bl, NULL, line, sizeof line);
    expect_refused(line, "1 bytes of trailing garbage");
    /* Only a type string, nothing after it. */
    bl.n = 0;
    put_cstring(&bl, "ssh-rsa");
    to_line("ssh-rsa", &bl, NULL, line, sizeof line);
    expect_refused(line, "truncated");
    /* A blob too short for the type's own length. */
    expect_refused("ssh-ed25519 AAAA", "truncated");
}

static void refuses_bad_base64(void **state)
{
    (void)state;
    expect_refused("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILbBhWGcV/wiZDYS5aJ2boLc2M1Dnq3rZcvNrrRWX43", "base64");
    expect_refused("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILbBhWGcV/wiZDYS5aJ2boLc2M1Dnq3rZcvNrrRWX4*r", "base64");
    expect_refused("ssh-ed25519 AAAA=AAA", "base64");
    /* Padding with non-zero spare bits. */
    expect_refused("ssh-ed25519 AAB=", "base64");
}

static void refuses_rsa_numbers_that_are_malformed(void **state)
{
    (void)state;
    char line[2048];
    unsigned char e[] = {0x01, 0x00, 0x01}, n[257];
    memset(n, 0xab, sizeof n);
    n[0] = 0x00; /* positive: leading zero before a high bit */
    struct blob bl = {.n = 0};
    put_cstring(&bl, "ssh-rsa");
    put_string(&bl, e, sizeof e);
    put_string(&bl, n, sizeof n);
    to_line("ssh-rsa", &bl, NULL, line, sizeof line);
    struct ssh_pubkey k;
    char why[256];
    if (ssh_key_parse(line, &k, why, sizeof why) != 0)
        fail_msg("built 2048-bit key refused: %s", why);
    assert_int_equal(k.bits, 2048);
    /* Negative modulus (high bit without the zero byte). */
    bl.n = 0;
    put_cstring(&bl, "ssh-rsa");
    put_string(&bl, e, sizeof e);
    put_string(&bl, n + 1, sizeof n - 1);
    to_line("ssh-rsa", &bl, NULL, line, sizeof line);
    expect_refused(line, "malformed");
    /* A needless leading zero. */
    unsigned char n2[258];
    n2[0] = 0;
    memcpy(n2 + 1, n, sizeof n);
    bl.n = 0;
    put_cstring(&bl, "ssh-rsa");
    put_string(&bl, e, sizeof e);
    put_string(&bl, n2, sizeof n2);
    to_line("ssh-rsa", &bl, NULL, line, sizeof line);
    expect_refused(line, "malformed");
}

static void refuses_an_oversize_line(void **state)
{
    (void)state;
    size_t n = SSH_KEY_LINE_MAX + 10;
    char *line = malloc(n + 1);
    assert_non_null(line);
    memcpy(line, "ssh-rsa ", 8);
    memset(line + 8, 'A', n - 8);
    line[n] = '\0';
    expect_refused(line, "at most 16384 bytes");
    free(line);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(accepts_ssh_keygen_keys_with_their_fingerprints),
        cmocka_unit_test(comments_are_optional_trimmed_and_may_hold_spaces),
        cmocka_unit_test(refuses_rsa_under_2048_bits),
        cmocka_unit_test(refuses_unknown_types_and_options),
        cmocka_unit_test(refuses_a_type_that_disagrees_with_the_blob),
        cmocka_unit_test(refuses_wrong_sizes_for_each_curve),
        cmocka_unit_test(refuses_a_real_point_moved_off_its_curve),
        cmocka_unit_test(refuses_truncated_blobs_and_trailing_garbage),
        cmocka_unit_test(refuses_bad_base64),
        cmocka_unit_test(refuses_rsa_numbers_that_are_malformed),
        cmocka_unit_test(refuses_an_oversize_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
