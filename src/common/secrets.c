/* secrets.c: password hashing, API key tokens and the instance-internal SSH
 * key pairs (see secrets.h). */
#include "gpurent/secrets.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/obj_mac.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SALT_LEN 16
#define DERIVED_LEN 32

static int hex_decode(const char *hex, size_t n, unsigned char *out)
{
    for (size_t i = 0; i < n; i++) {
        int v = 0;
        for (int k = 0; k < 2; k++) {
            char c = hex[2 * i + (size_t)k];
            int d;
            if (c >= '0' && c <= '9') d = c - '0';
            else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
            else return -1;
            v = v * 16 + d;
        }
        out[i] = (unsigned char)v;
    }
    return 0;
}

static int pbkdf2(const char *password, const unsigned char *salt, int64_t iterations, unsigned char out[DERIVED_LEN])
{
    if (iterations < 1 || iterations > INT32_MAX)
        return -1;
    return PKCS5_PBKDF2_HMAC(password, (int)strlen(password), salt, SALT_LEN, (int)iterations, EVP_sha256(),
                             DERIVED_LEN, out) == 1 ? 0 : -1;
}

int password_hash(const char *password, int64_t iterations, char out[PASSWORD_HASH_MAX])
{
    unsigned char salt[SALT_LEN], derived[DERIVED_LEN];
    char salt_hex[2 * SALT_LEN + 1], derived_hex[2 * DERIVED_LEN + 1];
    if (random_bytes(salt, sizeof salt) < 0 || pbkdf2(password, salt, iterations, derived) < 0)
        return -1;
    hex_encode(salt, sizeof salt, salt_hex);
    hex_encode(derived, sizeof derived, derived_hex);
    snprintf(out, PASSWORD_HASH_MAX, "pbkdf2-sha256$%" PRId64 "$%s$%s", iterations, salt_hex, derived_hex);
    OPENSSL_cleanse(derived, sizeof derived);
    return 0;
}

int password_verify(const char *password, const char *stored)
{
    static const char scheme[] = "pbkdf2-sha256$";
    if (strncmp(stored, scheme, sizeof scheme - 1) != 0)
        return 0;
    const char *p = stored + sizeof scheme - 1;
    if (*p < '0' || *p > '9') /* strtoll would also take blanks and a sign */
        return 0;
    errno = 0;
    char *end;
    long long iterations = strtoll(p, &end, 10);
    if (errno || end == p || *end != '$' || iterations < 1)
        return 0;
    const char *salt_hex = end + 1;
    const char *derived_hex = salt_hex + 2 * SALT_LEN + 1;
    if (strlen(salt_hex) != 2 * SALT_LEN + 1 + 2 * DERIVED_LEN || salt_hex[2 * SALT_LEN] != '$')
        return 0;
    unsigned char salt[SALT_LEN], want[DERIVED_LEN], got[DERIVED_LEN];
    if (hex_decode(salt_hex, SALT_LEN, salt) < 0 || hex_decode(derived_hex, DERIVED_LEN, want) < 0)
        return 0;
    if (pbkdf2(password, salt, iterations, got) < 0)
        return 0;
    int ok = CRYPTO_memcmp(got, want, DERIVED_LEN) == 0;
    OPENSSL_cleanse(got, sizeof got);
    return ok;
}

/* SHA-256 looked up once: OpenSSL 3 looks an algorithm up by name on every
 * SHA256() or EVP_sha256() call, which cost as much again as hashing an API
 * key's secret on every authenticated request. */
static EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void fetch_sha256(void)
{
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
}

static const EVP_MD *sha256_algorithm(void)
{
    pthread_once(&sha256_once, fetch_sha256);
    return sha256_md ? sha256_md : EVP_sha256();
}

void sha256(const void *data, size_t len, unsigned char out[32])
{
    if (EVP_Digest(len ? data : "", len, out, NULL, sha256_algorithm(), NULL) != 1)
        SHA256(data, len, out); /* it fails only without memory for its context: once more, the old way */
}

void sha256_hex(const void *data, size_t len, char out[65])
{
    unsigned char d[SHA256_DIGEST_LENGTH];
    sha256(data, len, d);
    hex_encode(d, sizeof d, out);
}

void sha256_hex_parts(const void *const *parts, const size_t *lens, size_t n, char out[65])
{
    unsigned char d[SHA256_DIGEST_LENGTH];
    unsigned len = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    out[0] = '\0';
    if (!ctx)
        return;
    int ok = EVP_DigestInit_ex(ctx, sha256_algorithm(), NULL) == 1;
    for (size_t i = 0; ok && i < n; i++)
        ok = lens[i] == 0 || EVP_DigestUpdate(ctx, parts[i], lens[i]) == 1;
    ok = ok && EVP_DigestFinal_ex(ctx, d, &len) == 1;
    EVP_MD_CTX_free(ctx);
    if (ok)
        hex_encode(d, len, out);
}

int hmac_sha256_hex(const char *key, const void *data, size_t len, char out[65])
{
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    out[0] = '\0';
    if (!HMAC(EVP_sha256(), key, (int)strlen(key), data, len, mac, &n) || n != SHA256_DIGEST_LENGTH)
        return -1;
    hex_encode(mac, n, out);
    return 0;
}

int secret_equal(const void *a, const void *b, size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

int api_key_new(char id[ID_MAX], char token[API_TOKEN_LEN + 1], unsigned char hash[API_SECRET_HASH_LEN])
{
    unsigned char secret[32];
    char secret_hex[65];
    if (id_new("key", id) < 0 || random_bytes(secret, sizeof secret) < 0)
        return -1;
    hex_encode(secret, sizeof secret, secret_hex);
    snprintf(token, API_TOKEN_LEN + 1, "gpk_%s_%s", id + 4, secret_hex);
    sha256(secret_hex, 64, hash);
    OPENSSL_cleanse(secret, sizeof secret);
    OPENSSL_cleanse(secret_hex, sizeof secret_hex);
    return 0;
}

int api_key_parse(const char *token, char id[ID_MAX], unsigned char hash[API_SECRET_HASH_LEN])
{
    if (strlen(token) != API_TOKEN_LEN || strncmp(token, "gpk_", 4) != 0 || token[4 + ID_RANDOM_CHARS] != '_')
        return -1;
    snprintf(id, ID_MAX, "key_%.*s", ID_RANDOM_CHARS, token + 4);
    if (!id_valid("key", id))
        return -1;
    const char *secret_hex = token + 4 + ID_RANDOM_CHARS + 1;
    for (size_t i = 0; i < 64; i++) {
        char c = secret_hex[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return -1;
    }
    sha256(secret_hex, 64, hash);
    return 0;
}

int api_key_hash_equal(const unsigned char *a, const unsigned char *b)
{
    return CRYPTO_memcmp(a, b, API_SECRET_HASH_LEN) == 0;
}

int ec_point_on_curve(const char *curve, const unsigned char *point, size_t len)
{
    int nid = strcmp(curve, "nistp256") == 0   ? NID_X9_62_prime256v1
              : strcmp(curve, "nistp384") == 0 ? NID_secp384r1
              : strcmp(curve, "nistp521") == 0 ? NID_secp521r1
                                               : NID_undef;
    if (nid == NID_undef)
        return 0;
    EC_GROUP *group = EC_GROUP_new_by_curve_name(nid);
    EC_POINT *p = group ? EC_POINT_new(group) : NULL;
    /* oct2point refuses coordinates outside the field; is_on_curve then
     * checks the equation. The point at infinity is no public key. */
    int ok = p && EC_POINT_oct2point(group, p, point, len, NULL) == 1 && !EC_POINT_is_at_infinity(group, p) &&
             EC_POINT_is_on_curve(group, p, NULL) == 1;
    EC_POINT_free(p);
    EC_GROUP_free(group);
    return ok;
}

int file_world_readable(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return -1;
    return (st.st_mode & S_IROTH) != 0;
}

int secret_file_read(const char *path, char *out, size_t outlen, char *err, size_t errlen)
{
    out[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode) || (st.st_mode & (S_IROTH | S_IWOTH | S_IWGRP))) {
        snprintf(err, errlen, "%s holds a secret but %s (mode %04o): chmod 0600 (or 0640 for the daemon's group)",
                 path, S_ISREG(st.st_mode) ? "others may read or change it" : "is not a regular file",
                 (unsigned)(st.st_mode & 07777));
        close(fd);
        return -1;
    }
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0) {
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    buf[n] = '\0';
    size_t len = strcspn(buf, "\r\n");
    if (len == 0 || len >= outlen) {
        snprintf(err, errlen, "%s: the secret must be one line of 1 to %zu bytes", path, outlen - 1);
        return -1;
    }
    memcpy(out, buf, len);
    out[len] = '\0';
    explicit_bzero(buf, sizeof buf);
    return 0;
}

/* ------------------------------------------------------------ SSH key pairs */

/* A growing byte buffer in SSH wire encoding (RFC 4251): uint32 big-endian
 * lengths before strings. */
struct wire {
    unsigned char buf[1024]; /* the bytes; a key pair needs about 250 */
    size_t len;              /* used */
    int over;                /* something did not fit */
};

static void wire_u32(struct wire *w, uint32_t v)
{
    if (w->len + 4 > sizeof w->buf) {
        w->over = 1;
        return;
    }
    w->buf[w->len++] = (unsigned char)(v >> 24);
    w->buf[w->len++] = (unsigned char)(v >> 16);
    w->buf[w->len++] = (unsigned char)(v >> 8);
    w->buf[w->len++] = (unsigned char)v;
}

static void wire_raw(struct wire *w, const void *p, size_t n)
{
    if (w->len + n > sizeof w->buf) {
        w->over = 1;
        return;
    }
    memcpy(w->buf + w->len, p, n);
    w->len += n;
}

static void wire_string(struct wire *w, const void *p, size_t n)
{
    wire_u32(w, (uint32_t)n);
    wire_raw(w, p, n);
}

static void wire_cstring(struct wire *w, const char *s)
{
    wire_string(w, s, strlen(s));
}

/* Base64 of n bytes into out (cap bytes, NUL-terminated); -1 if it does not fit. */
int base64_decode(const char *in, size_t len, unsigned char *out)
{
    return len > INT_MAX || len % 4 ? -1 : EVP_DecodeBlock(out, (const unsigned char *)in, (int)len);
}

static int base64(const unsigned char *in, size_t n, char *out, size_t cap)
{
    if (cap < 4 * ((n + 2) / 3) + 1)
        return -1;
    EVP_EncodeBlock((unsigned char *)out, in, (int)n);
    return 0;
}

void secret_wipe(void *p, size_t n)
{
    OPENSSL_cleanse(p, n);
}

int ssh_ed25519_keypair(const char *comment, char *pub, size_t pub_n, char *priv, size_t priv_n)
{
    static const char type[] = "ssh-ed25519";
    unsigned char pk[32], sk[64];
    size_t pk_len = sizeof pk, seed_len = 32;
    int rc = -1;
    EVP_PKEY *key = NULL;
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, NULL);
    if (!ctx || EVP_PKEY_keygen_init(ctx) != 1 || EVP_PKEY_keygen(ctx, &key) != 1 ||
        EVP_PKEY_get_raw_public_key(key, pk, &pk_len) != 1 || pk_len != 32 ||
        EVP_PKEY_get_raw_private_key(key, sk, &seed_len) != 1 || seed_len != 32)
        goto out;
    /* OpenSSH keeps the 32-byte seed followed by the public key. */
    memcpy(sk + 32, pk, 32);

    struct wire blob = {.len = 0};
    wire_cstring(&blob, type);
    wire_string(&blob, pk, 32);
    char b64[128];
    if (blob.over || base64(blob.buf, blob.len, b64, sizeof b64) < 0)
        goto out;
    if (snprintf(pub, pub_n, "%s %s%s%s", type, b64, comment[0] ? " " : "", comment) >= (int)pub_n)
        goto out;

    /* PROTOCOL.key: "openssh-key-v1\0", cipher and KDF "none", one key, its
     * public blob, then the private section: two equal check words, the
     * key, its comment, and padding 1, 2, 3 … to the cipher's block size
     * (8 for "none"). */
    struct wire w = {.len = 0}, secret = {.len = 0};
    uint32_t check;
    if (random_bytes(&check, sizeof check) < 0)
        goto out;
    wire_u32(&secret, check);
    wire_u32(&secret, check);
    wire_cstring(&secret, type);
    wire_string(&secret, pk, 32);
    wire_string(&secret, sk, 64);
    wire_cstring(&secret, comment);
    for (unsigned char pad = 1; secret.len % 8; pad++)
        wire_raw(&secret, &pad, 1);
    wire_raw(&w, "openssh-key-v1", 15);
    wire_cstring(&w, "none");
    wire_cstring(&w, "none");
    wire_cstring(&w, "");
    wire_u32(&w, 1);
    wire_string(&w, blob.buf, blob.len);
    wire_string(&w, secret.buf, secret.len);
    static char body[1500];
    if (w.over || secret.over || base64(w.buf, w.len, body, sizeof body) < 0)
        goto wipe;
    /* PEM-style armour with 70-column lines, as ssh-keygen writes it. */
    static const char begin[] = "-----BEGIN OPENSSH PRIVATE KEY-----\n", end[] = "-----END OPENSSH PRIVATE KEY-----\n";
    size_t blen = strlen(body), o = 0;
    if (priv_n < sizeof begin + sizeof end + blen + blen / 70 + 2)
        goto wipe;
    memcpy(priv, begin, sizeof begin - 1);
    o = sizeof begin - 1;
    for (size_t i = 0; i < blen; i += 70) {
        size_t k = blen - i < 70 ? blen - i : 70;
        memcpy(priv + o, body + i, k);
        o += k;
        priv[o++] = '\n';
    }
    memcpy(priv + o, end, sizeof end);
    rc = 0;
wipe:
    OPENSSL_cleanse(&w, sizeof w);
    OPENSSL_cleanse(&secret, sizeof secret);
    OPENSSL_cleanse(body, sizeof body);
out:
    OPENSSL_cleanse(sk, sizeof sk);
    EVP_PKEY_free(key);
    EVP_PKEY_CTX_free(ctx);
    if (rc < 0) {
        if (pub_n)
            pub[0] = '\0';
        if (priv_n)
            priv[0] = '\0';
    }
    return rc;
}

int websocket_accept(const char *key, char out[64])
{
    unsigned char raw[32];
    size_t kl = strlen(key);
    /* 22 characters of the alphabet, then "==": 18 bytes of which 16 are
     * the key. The alphabet is checked here, as OpenSSL's decoder takes an
     * '=' inside (and blanks around) what base64 has only at the end. */
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (kl != 24 || strspn(key, alphabet) != 22 || key[22] != '=' || key[23] != '=' ||
        EVP_DecodeBlock(raw, (const unsigned char *)key, (int)kl) != 18)
        return -1;
    char joined[64];
    snprintf(joined, sizeof joined, "%s258EAFA5-E914-47DA-95CA-C5AB0DC85B11", key);
    unsigned char sha[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    if (EVP_Digest(joined, strlen(joined), sha, &len, EVP_sha1(), NULL) != 1 || len != 20)
        return -1;
    EVP_EncodeBlock((unsigned char *)out, sha, 20);
    return 0;
}

/* No passphrase prompt: a server started by systemd has nobody to ask. */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    (void)buf, (void)size, (void)rwflag, (void)u;
    return -1;
}

int tls_pair_check(const char *cert_file, const char *key_file, char *err, size_t errlen)
{
    X509 *cert = NULL;
    EVP_PKEY *key = NULL;
    int rc = -1;
    FILE *f = fopen(cert_file, "r");
    if (!f) {
        snprintf(err, errlen, "tls_cert %s: %s", cert_file, strerror(errno));
        goto out;
    }
    cert = PEM_read_X509(f, NULL, no_passphrase, NULL);
    fclose(f);
    if (!cert) {
        snprintf(err, errlen, "tls_cert %s: not a PEM certificate", cert_file);
        goto out;
    }
    if (!(f = fopen(key_file, "r"))) {
        snprintf(err, errlen, "tls_key %s: %s", key_file, strerror(errno));
        goto out;
    }
    key = PEM_read_PrivateKey(f, NULL, no_passphrase, NULL);
    fclose(f);
    if (!key) {
        snprintf(err, errlen, "tls_key %s: not a PEM private key, or one that needs a passphrase", key_file);
        goto out;
    }
    if (X509_check_private_key(cert, key) != 1) {
        snprintf(err, errlen, "tls_key %s is not the key of tls_cert %s", key_file, cert_file);
        goto out;
    }
    rc = 0;
out:
    ERR_clear_error(); /* what was refused is said above; nothing left for the next caller */
    X509_free(cert);
    EVP_PKEY_free(key);
    return rc;
}
