/* test_secrets.c: unit tests for password hashes and API key tokens
 * (secrets.c): known answers computed outside this program, round trips,
 * wrong passwords, stored strings spoiled one way at a time, the iteration
 * count travelling with the hash, the token format and its parser, and the
 * SSH key pairs of multi-node instances (OpenSSH's formats, checked by
 * decoding them here and, where it is installed, by ssh-keygen itself). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpurent/secrets.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Few rounds keep the tests fast; the count is the caller's choice. */
#define ITER 1000

/* Expected values computed with the openssl CLI:
 *   openssl kdf -keylen 32 -kdfopt digest:SHA256 -kdfopt pass:PASSWORD \
 *     -kdfopt hexsalt:SALT -kdfopt iter:N PBKDF2 */
#define KAT_SALT "000102030405060708090a0b0c0d0e0f"
#define KAT_STORED "pbkdf2-sha256$1000$" KAT_SALT "$a69b179e3add3c1e0aaf227a0eb3aa2aa8645ab86fecf6ca00c17512697c719e"
#define KAT_PASSWORD "correct horse battery staple"
#define KAT_EMPTY "pbkdf2-sha256$1000$" KAT_SALT "$c5b301b1fd61bced63f00642a2304ec674519fbd7cd83c4bc83dafe1743f9855"
/* One round, a non-ASCII password (UTF-8 bytes), another salt. */
#define KAT_UTF8 "pbkdf2-sha256$1$f0e1d2c3b4a5968778695a4b3c2d1e0f$4c1819233095c468e8bcd5347ddd5233991f0cae618fa5d5ec08a9629b88fa57"

static int is_lower_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

static void test_password_known_answers(void **state)
{
    (void)state;
    assert_int_equal(password_verify(KAT_PASSWORD, KAT_STORED), 1);
    assert_int_equal(password_verify("", KAT_EMPTY), 1);
    assert_int_equal(password_verify("p\xC3\xA4ssw\xC3\xB6rd", KAT_UTF8), 1);
    /* Each hash belongs to its own password only. */
    assert_int_equal(password_verify("", KAT_STORED), 0);
    assert_int_equal(password_verify(KAT_PASSWORD, KAT_EMPTY), 0);
    assert_int_equal(password_verify("passw\xC3\xB6rd", KAT_UTF8), 0);
}

static void test_password_wrong(void **state)
{
    (void)state;
    static const char *wrong[] = {
        "correct horse battery stapl",
        "correct horse battery staple ",
        " correct horse battery staple",
        "Correct horse battery staple",
        "correct horse battery staplf",
        "correct horse battery staple\n",
        "correct",
        "",
    };
    for (size_t i = 0; i < ARRAY_LEN(wrong); i++)
        if (password_verify(wrong[i], KAT_STORED) != 0)
            fail_msg("'%s' accepted", wrong[i]);
}

static void test_password_round_trip(void **state)
{
    (void)state;
    char long_pw[1001];
    memset(long_pw, 'p', sizeof long_pw - 1);
    long_pw[sizeof long_pw - 1] = '\0';
    const char *passwords[] = {"hunter2", "", "p\xC3\xA4ssw\xC3\xB6rd", "$dollar$signs$", long_pw};
    for (size_t i = 0; i < ARRAY_LEN(passwords); i++) {
        char stored[PASSWORD_HASH_MAX], again[PASSWORD_HASH_MAX];
        assert_int_equal(password_hash(passwords[i], ITER, stored), 0);
        assert_int_equal(password_verify(passwords[i], stored), 1);
        /* Format: scheme, the count, 16 bytes of salt and 32 of hash in hex. */
        static const char prefix[] = "pbkdf2-sha256$1000$";
        assert_int_equal(strlen(stored), strlen(prefix) + 32 + 1 + 64);
        assert_memory_equal(stored, prefix, strlen(prefix));
        const char *salt = stored + strlen(prefix);
        assert_true(is_lower_hex(salt, 32));
        assert_int_equal(salt[32], '$');
        assert_true(is_lower_hex(salt + 33, 64));
        /* A fresh salt each time: the same password hashes differently. */
        assert_int_equal(password_hash(passwords[i], ITER, again), 0);
        assert_string_not_equal(stored, again);
        assert_memory_not_equal(salt, again + strlen(prefix), 32);
        assert_int_equal(password_verify(passwords[i], again), 1);
    }
    char stored[PASSWORD_HASH_MAX];
    assert_int_equal(password_hash("hunter2", ITER, stored), 0);
    assert_int_equal(password_verify("hunter3", stored), 0);
    assert_int_equal(password_verify("hunter", stored), 0);
    /* The long password is not cut short anywhere. */
    assert_int_equal(password_hash(long_pw, ITER, stored), 0);
    long_pw[999] = 'q';
    assert_int_equal(password_verify(long_pw, stored), 0);
}

/* The count is read back from the string, so hashes made under an old
 * setting still verify after it changes; a changed count is a wrong hash. */
static void test_password_iterations_kept(void **state)
{
    (void)state;
    static const int64_t counts[] = {1, 2, 999, 1000, 4321};
    for (size_t i = 0; i < ARRAY_LEN(counts); i++) {
        char stored[PASSWORD_HASH_MAX], want[32];
        assert_int_equal(password_hash("s3cret", counts[i], stored), 0);
        snprintf(want, sizeof want, "pbkdf2-sha256$%lld$", (long long)counts[i]);
        assert_memory_equal(stored, want, strlen(want));
        assert_int_equal(password_verify("s3cret", stored), 1);
    }
    /* Same salt and hash, another count: refused. */
    char stored[PASSWORD_HASH_MAX];
    snprintf(stored, sizeof stored, "%s", KAT_STORED);
    memcpy(stored + strlen("pbkdf2-sha256$"), "1001", 4);
    assert_int_equal(password_verify(KAT_PASSWORD, stored), 0);
    memcpy(stored + strlen("pbkdf2-sha256$"), "0999", 4);
    assert_int_equal(password_verify(KAT_PASSWORD, stored), 0);
}

static void test_password_hash_bad_iterations(void **state)
{
    (void)state;
    static const int64_t bad[] = {0, -1, INT64_MIN, (int64_t)INT32_MAX + 1, INT64_MAX};
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        char stored[PASSWORD_HASH_MAX];
        if (password_hash("x", bad[i], stored) != -1)
            fail_msg("%lld iterations accepted", (long long)bad[i]);
    }
}

/* KAT_STORED spoiled one way at a time: each must be refused, not crash. */
static void test_password_malformed(void **state)
{
    (void)state;
#define H "a69b179e3add3c1e0aaf227a0eb3aa2aa8645ab86fecf6ca00c17512697c719e"
#define S KAT_SALT
    static const char *bad[] = {
        "",
        "pbkdf2-sha256",
        "pbkdf2-sha256$",
        "pbkdf2-sha256$1000",
        "pbkdf2-sha256$1000$",
        "pbkdf2-sha256$1000$" S,
        "pbkdf2-sha256$1000$" S "$",
        /* scheme */
        "pbkdf2-sha1$1000$" S "$" H,
        "PBKDF2-SHA256$1000$" S "$" H,
        "pbkdf2_sha256$1000$" S "$" H,
        "$1000$" S "$" H,
        " pbkdf2-sha256$1000$" S "$" H,
        "bcrypt$2b$12$abcdefghijklmnopqrstuv",
        /* iteration count */
        "pbkdf2-sha256$$" S "$" H,
        "pbkdf2-sha256$0$" S "$" H,
        "pbkdf2-sha256$-1000$" S "$" H,
        "pbkdf2-sha256$+1000$" S "$" H,
        "pbkdf2-sha256$ 1000$" S "$" H,
        "pbkdf2-sha256$1000 $" S "$" H,
        "pbkdf2-sha256$1e3$" S "$" H,
        "pbkdf2-sha256$0x3e8$" S "$" H,
        "pbkdf2-sha256$abc$" S "$" H,
        "pbkdf2-sha256$2147483648$" S "$" H,
        "pbkdf2-sha256$99999999999999999999$" S "$" H,
        "pbkdf2-sha256$1000" S "$" H,
        /* salt */
        "pbkdf2-sha256$1000$" "00010203040506070809" "0a0b0c0d0e0f0" "$" H,
        "pbkdf2-sha256$1000$" S "0" "$" H,
        "pbkdf2-sha256$1000$" S "00" "$" H,
        "pbkdf2-sha256$1000$" "000102030405060708090A0B0C0D0E0F" "$" H,
        "pbkdf2-sha256$1000$" "000102030405060708090a0b0c0d0e0g" "$" H,
        "pbkdf2-sha256$1000$" "00010203040506070809 a0b0c0d0e0f" "$" H,
        "pbkdf2-sha256$1000$$" S H,
        "pbkdf2-sha256$1000$" S H "$",
        "pbkdf2-sha256$1000$" S "-" H,
        /* hash */
        "pbkdf2-sha256$1000$" S "$" "a69b179e3add3c1e0aaf227a0eb3aa2aa8645ab86fecf6ca00c17512697c719",
        "pbkdf2-sha256$1000$" S "$" H "e",
        "pbkdf2-sha256$1000$" S "$" H "$",
        "pbkdf2-sha256$1000$" S "$" H "\n",
        "pbkdf2-sha256$1000$" S "$" "A69B179E3ADD3C1E0AAF227A0EB3AA2AA8645AB86FECF6CA00C17512697C719E",
        "pbkdf2-sha256$1000$" S "$" "a69b179e3add3c1e0aaf227a0eb3aa2aa8645ab86fecf6ca00c17512697c719x",
        "pbkdf2-sha256$1000$" S "$" "b69b179e3add3c1e0aaf227a0eb3aa2aa8645ab86fecf6ca00c17512697c719e",
        "pbkdf2-sha256$1000$" "100102030405060708090a0b0c0d0e0f" "$" H,
    };
#undef H
#undef S
    assert_int_equal(password_verify(KAT_PASSWORD, KAT_STORED), 1);
    for (size_t i = 0; i < ARRAY_LEN(bad); i++)
        if (password_verify(KAT_PASSWORD, bad[i]) != 0)
            fail_msg("'%s' verified", bad[i]);
}

static void test_api_key_new(void **state)
{
    (void)state;
    char id[ID_MAX], token[API_TOKEN_LEN + 1];
    unsigned char hash[API_SECRET_HASH_LEN];
    assert_int_equal(API_TOKEN_LEN, 89);
    for (int round = 0; round < 50; round++) {
        assert_int_equal(api_key_new(id, token, hash), 0);
        assert_true(id_valid("key", id));
        assert_int_equal(strlen(token), API_TOKEN_LEN);
        assert_memory_equal(token, "gpk_", 4);
        /* The token carries the id's random part, then '_' and the secret. */
        assert_memory_equal(token + 4, id + 4, ID_RANDOM_CHARS);
        assert_int_equal(token[4 + ID_RANDOM_CHARS], '_');
        assert_true(is_lower_hex(token + 4 + ID_RANDOM_CHARS + 1, 64));
        /* The stored hash is SHA-256 of the secret's 64 hex characters. */
        char want[65], got[65];
        sha256_hex(token + 4 + ID_RANDOM_CHARS + 1, 64, want);
        hex_encode(hash, sizeof hash, got);
        assert_string_equal(got, want);

        /* Parsing the token gives back the id and the same hash. */
        char pid[ID_MAX];
        unsigned char phash[API_SECRET_HASH_LEN];
        assert_int_equal(api_key_parse(token, pid, phash), 0);
        assert_string_equal(pid, id);
        assert_int_equal(api_key_hash_equal(hash, phash), 1);
    }
}

static void test_api_key_unique(void **state)
{
    (void)state;
    char id1[ID_MAX], id2[ID_MAX], t1[API_TOKEN_LEN + 1], t2[API_TOKEN_LEN + 1];
    unsigned char h1[API_SECRET_HASH_LEN], h2[API_SECRET_HASH_LEN];
    assert_int_equal(api_key_new(id1, t1, h1), 0);
    assert_int_equal(api_key_new(id2, t2, h2), 0);
    assert_string_not_equal(id1, id2);
    assert_memory_not_equal(t1 + 25, t2 + 25, 64);
    assert_int_equal(api_key_hash_equal(h1, h2), 0);
}

/* A fixed, hand-made token whose hash is known. */
#define TOK_ID "0123456789abcdefghjk"
#define TOK_SECRET "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
#define TOK "gpk_" TOK_ID "_" TOK_SECRET

static void test_api_key_parse_known(void **state)
{
    (void)state;
    char id[ID_MAX];
    unsigned char hash[API_SECRET_HASH_LEN];
    assert_int_equal(api_key_parse(TOK, id, hash), 0);
    assert_string_equal(id, "key_" TOK_ID);
    char hex[65], want[65];
    hex_encode(hash, sizeof hash, hex);
    /* printf '%s' TOK_SECRET | sha256sum */
    sha256_hex(TOK_SECRET, 64, want);
    assert_string_equal(hex, want);
    assert_string_equal(hex, "2a8abfa8cb9906290437854193ca6bca41d4d4e26d1d454bd66a35158095e737");
}

static void test_api_key_parse_malformed(void **state)
{
    (void)state;
    static const char *bad[] = {
        "",
        "gpk_",
        "gpk_" TOK_ID,
        "gpk_" TOK_ID "_",
        /* one short, one long */
        "gpk_" TOK_ID "_" "00112233445566778899aabbccddeeff00112233445566778899aabbccddeef",
        TOK "0",
        TOK "\n",
        " " TOK,
        /* prefix and separator */
        "GPK_" TOK_ID "_" TOK_SECRET,
        "gpk-" TOK_ID "_" TOK_SECRET,
        "key_" TOK_ID "_" TOK_SECRET,
        "gpk_" TOK_ID "-" TOK_SECRET,
        "gpk_" TOK_ID "0" TOK_SECRET,
        "gpk_0123456789abcdefghj_k" TOK_SECRET,
        "gpk__123456789abcdefghjk_" TOK_SECRET,
        /* id characters outside the alphabet */
        "gpk_0123456789ABCDEFGHJK_" TOK_SECRET,
        "gpk_i123456789abcdefghjk_" TOK_SECRET,
        "gpk_0l23456789abcdefghjk_" TOK_SECRET,
        "gpk_01o3456789abcdefghjk_" TOK_SECRET,
        "gpk_012u456789abcdefghjk_" TOK_SECRET,
        "gpk_0123456789abcdefgh.k_" TOK_SECRET,
        /* secret characters */
        "gpk_" TOK_ID "_" "00112233445566778899AABBCCDDEEFF00112233445566778899aabbccddeeff",
        "gpk_" TOK_ID "_" "00112233445566778899aabbccddeeff00112233445566778899aabbccddeefg",
        "gpk_" TOK_ID "_" "_0112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
        "gpk_" TOK_ID "_" "00112233445566778899aabbccddeeff 0112233445566778899aabbccddeeff",
        "gpk_" TOK_ID "_" "0x112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        char id[ID_MAX];
        unsigned char hash[API_SECRET_HASH_LEN];
        if (api_key_parse(bad[i], id, hash) != -1)
            fail_msg("'%s' parsed", bad[i]);
    }
    /* A NUL inside: the C string ends early, so the length is wrong. */
    char tok[API_TOKEN_LEN + 1];
    memcpy(tok, TOK, sizeof tok);
    tok[50] = '\0';
    char id[ID_MAX];
    unsigned char hash[API_SECRET_HASH_LEN];
    assert_int_equal(api_key_parse(tok, id, hash), -1);
}

static void test_api_key_hash_equal(void **state)
{
    (void)state;
    unsigned char a[API_SECRET_HASH_LEN], b[API_SECRET_HASH_LEN];
    for (size_t i = 0; i < sizeof a; i++)
        a[i] = (unsigned char)(i * 7 + 3);
    memcpy(b, a, sizeof b);
    assert_int_equal(api_key_hash_equal(a, b), 1);
    assert_int_equal(api_key_hash_equal(a, a), 1);
    static const size_t flip[] = {0, 1, 15, 16, 30, 31};
    for (size_t i = 0; i < ARRAY_LEN(flip); i++) {
        memcpy(b, a, sizeof b);
        b[flip[i]] ^= 0x80;
        assert_int_equal(api_key_hash_equal(a, b), 0);
        b[flip[i]] ^= 0x81;
        assert_int_equal(api_key_hash_equal(a, b), 0);
    }
}

static void test_sha256_hex(void **state)
{
    (void)state;
    static const struct { const char *data, *hex; } cases[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char out[65];
        memset(out, 'X', sizeof out);
        sha256_hex(cases[i].data, strlen(cases[i].data), out);
        assert_string_equal(out, cases[i].hex);
    }
}

/* Decodes standard base64 (no line breaks); the length or -1. */
static int unbase64(const char *in, size_t n, unsigned char *out)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    int len = 0, bits = 0;
    unsigned acc = 0;
    for (size_t i = 0; i < n && in[i] != '='; i++) {
        const char *p = strchr(abc, in[i]);
        if (!p || !in[i])
            return -1;
        acc = (acc << 6) | (unsigned)(p - abc);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[len++] = (unsigned char)(acc >> bits);
        }
    }
    return len;
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void test_ssh_keypair_format(void **state)
{
    (void)state;
    char pub[SSH_PUBKEY_MAX], priv[SSH_PRIVKEY_MAX];
    assert_int_equal(ssh_ed25519_keypair("gpurent-ins_test", pub, sizeof pub, priv, sizeof priv), 0);
    /* "ssh-ed25519 <base64 of string type, string 32-byte key> comment" */
    assert_memory_equal(pub, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI", 37);
    const char *b64 = pub + 12, *sp = strchr(b64, ' ');
    assert_non_null(sp);
    assert_string_equal(sp + 1, "gpurent-ins_test");
    unsigned char blob[128];
    assert_int_equal(unbase64(b64, (size_t)(sp - b64), blob), 51);
    assert_int_equal(be32(blob), 11);
    assert_memory_equal(blob + 4, "ssh-ed25519", 11);
    assert_int_equal(be32(blob + 15), 32);

    /* The armour, 70-column lines, and openssh-key-v1 inside. */
    static const char begin[] = "-----BEGIN OPENSSH PRIVATE KEY-----\n", end[] = "-----END OPENSSH PRIVATE KEY-----\n";
    assert_memory_equal(priv, begin, sizeof begin - 1);
    size_t plen = strlen(priv);
    assert_true(plen > sizeof end);
    assert_string_equal(priv + plen - (sizeof end - 1), end);
    char body[1024] = "";
    size_t blen = 0;
    for (const char *line = priv + sizeof begin - 1; strncmp(line, "-----END", 8) != 0;) {
        const char *nl = strchr(line, '\n');
        assert_non_null(nl);
        assert_true(nl - line <= 70);
        memcpy(body + blen, line, (size_t)(nl - line));
        blen += (size_t)(nl - line);
        line = nl + 1;
    }
    unsigned char bin[768];
    int n = unbase64(body, blen, bin);
    assert_true(n > 200);
    const unsigned char *p = bin;
    assert_memory_equal(p, "openssh-key-v1", 15);
    p += 15;
    assert_int_equal(be32(p), 4);
    assert_memory_equal(p + 4, "none", 4); /* cipher */
    p += 8;
    assert_int_equal(be32(p), 4);
    assert_memory_equal(p + 4, "none", 4); /* KDF */
    p += 8;
    assert_int_equal(be32(p), 0); /* KDF options */
    p += 4;
    assert_int_equal(be32(p), 1); /* keys */
    p += 4;
    assert_int_equal(be32(p), 51);
    assert_memory_equal(p + 4, blob, 51); /* the same public key */
    p += 4 + 51;
    uint32_t slen = be32(p);
    p += 4;
    assert_int_equal(slen % 8, 0);
    assert_int_equal((size_t)(p - bin) + slen, (size_t)n);
    assert_int_equal(be32(p), be32(p + 4)); /* the check words */
    assert_int_equal(be32(p + 8), 11);
    assert_memory_equal(p + 12, "ssh-ed25519", 11);
    assert_int_equal(be32(p + 23), 32);
    assert_memory_equal(p + 27, blob + 19, 32);
    assert_int_equal(be32(p + 59), 64);
    assert_memory_equal(p + 63 + 32, blob + 19, 32); /* seed, then the public key again */

    /* Two pairs are never the same. */
    char pub2[SSH_PUBKEY_MAX], priv2[SSH_PRIVKEY_MAX];
    assert_int_equal(ssh_ed25519_keypair("", pub2, sizeof pub2, priv2, sizeof priv2), 0);
    assert_memory_not_equal(pub, pub2, 80);
    assert_null(strchr(pub2 + 12, ' ')); /* no comment: no trailing blank */
    /* Too small a buffer fails whole, leaving nothing half-written. */
    char small[100];
    assert_int_equal(ssh_ed25519_keypair("", pub2, sizeof pub2, small, sizeof small), -1);
    assert_string_equal(small, "");
    assert_string_equal(pub2, "");
}

/* OpenSSH itself reads the private key and derives the same public key. */
static void test_ssh_keypair_ssh_keygen(void **state)
{
    (void)state;
    if (access("/usr/bin/ssh-keygen", X_OK) != 0)
        skip();
    char pub[SSH_PUBKEY_MAX], priv[SSH_PRIVKEY_MAX];
    assert_int_equal(ssh_ed25519_keypair("c", pub, sizeof pub, priv, sizeof priv), 0);
    char path[] = "/tmp/gpurent-test-key-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, priv, strlen(priv)), (ssize_t)strlen(priv));
    close(fd);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "/usr/bin/ssh-keygen -y -f %s 2>&1", path);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    char line[512] = "";
    char *got = fgets(line, sizeof line, f);
    int status = pclose(f);
    unlink(path);
    assert_non_null(got);
    assert_int_equal(status, 0);
    line[strcspn(line, "\n")] = '\0';
    /* ssh-keygen prints "type base64 comment" as the file holds it. */
    assert_string_equal(line, pub);
}

/* FIPS 180-2's examples, through every SHA-256 entry point. */
static void test_sha256_known_answers(void **state)
{
    (void)state;
    static const struct {
        const char *in, *hex;
    } kat[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        char hex[65];
        sha256_hex(kat[i].in, strlen(kat[i].in), hex);
        assert_string_equal(hex, kat[i].hex);
        unsigned char raw[32];
        sha256(kat[i].in, strlen(kat[i].in), raw);
        hex_encode(raw, sizeof raw, hex);
        assert_string_equal(hex, kat[i].hex);
        size_t half = strlen(kat[i].in) / 2, lens[2] = {half, strlen(kat[i].in) - half};
        const void *parts[2] = {kat[i].in, kat[i].in + half};
        sha256_hex_parts(parts, lens, 2, hex);
        assert_string_equal(hex, kat[i].hex);
    }
}

/* RFC 6455 4.2.2's example, and keys that are not the padded base64 of 16
 * bytes: OpenSSL's decoder takes an '=' inside, which base64 has only at
 * the end. */
static void test_websocket_accept(void **state)
{
    (void)state;
    char accept[64];
    assert_int_equal(websocket_accept("dGhlIHNhbXBsZSBub25jZQ==", accept), 0);
    assert_string_equal(accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    static const char *const refused[] = {
        "dGhlIHNhbXBsZSBub25j=Q==", "=GhlIHNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZSBub25jZQ=",
        " dGhlIHNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZSBub25jZQ==\n", "dGhlIHNhbXBsZSBub25jZQ-_",
        "dGhlIHNhbXBsZSBub25jZ===", "",
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (websocket_accept(refused[i], accept) != -1)
            fail_msg("websocket_accept took '%s'", refused[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_password_known_answers),
        cmocka_unit_test(test_sha256_known_answers),
        cmocka_unit_test(test_password_wrong),
        cmocka_unit_test(test_password_round_trip),
        cmocka_unit_test(test_password_iterations_kept),
        cmocka_unit_test(test_password_hash_bad_iterations),
        cmocka_unit_test(test_password_malformed),
        cmocka_unit_test(test_api_key_new),
        cmocka_unit_test(test_api_key_unique),
        cmocka_unit_test(test_api_key_parse_known),
        cmocka_unit_test(test_api_key_parse_malformed),
        cmocka_unit_test(test_api_key_hash_equal),
        cmocka_unit_test(test_sha256_hex),
        cmocka_unit_test(test_ssh_keypair_format),
        cmocka_unit_test(test_ssh_keypair_ssh_keygen),
        cmocka_unit_test(test_websocket_accept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
