/* ssh_keys.c: parsing OpenSSH public key lines into type, size and
 * fingerprint (ssh_keys.h). The blob is decoded and its SSH wire format
 * (RFC 4251 strings and mpints) walked to its last byte, so a line whose
 * type and blob disagree, a truncated blob or one with bytes left over is
 * refused, as sshd would refuse it at login. */
#include "domain/ssh_keys.h"
#include "gpurent/secrets.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int fail(char *why, size_t whylen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(char *why, size_t whylen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, whylen, fmt, ap);
    va_end(ap);
    return -1;
}

static int b64_value(char c)
{
    const char *p = c ? strchr(B64, c) : NULL;
    return p ? (int)(p - B64) : -1;
}

/* Strict base64 (RFC 4648, with padding, as ssh-keygen writes it): len a
 * multiple of 4, '=' only at the end, the unused bits of the last group
 * zero. Returns the decoded length, or -1. out holds len / 4 * 3 bytes. */
static long b64_decode(const char *in, size_t len, unsigned char *out)
{
    if (len == 0 || len % 4 != 0)
        return -1;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        int last = i + 4 == len;
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            if (in[i + k] == '=' && last && k >= 2) {
                v[k] = 0;
                pad++;
            } else if (pad || (v[k] = b64_value(in[i + k])) < 0) {
                return -1; /* a character after '=' or outside the alphabet */
            }
        }
        uint32_t g = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        if ((pad == 1 && (v[2] & 0x3)) || (pad == 2 && (v[1] & 0xf)))
            return -1; /* non-zero bits ssh-keygen would never write */
        out[o++] = (unsigned char)(g >> 16);
        if (pad < 2)
            out[o++] = (unsigned char)(g >> 8);
        if (pad < 1)
            out[o++] = (unsigned char)g;
    }
    return (long)o;
}

/* Unpadded base64 of n bytes into out (4 * ceil(n / 3) + 1 bytes). */
static void b64_encode_unpadded(const unsigned char *in, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t g = (uint32_t)in[i] << 16;
        if (i + 1 < n)
            g |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < n)
            g |= in[i + 2];
        out[o++] = B64[g >> 18 & 63];
        out[o++] = B64[g >> 12 & 63];
        if (i + 1 < n)
            out[o++] = B64[g >> 6 & 63];
        if (i + 2 < n)
            out[o++] = B64[g & 63];
    }
    out[o] = '\0';
}

/* A cursor over the decoded blob. */
struct wire {
    const unsigned char *p; /* next byte */
    size_t left;            /* bytes after it */
};

/* Reads an RFC 4251 string: a 32-bit big-endian length and that many bytes. */
static int wire_string(struct wire *w, const unsigned char **s, size_t *len)
{
    if (w->left < 4)
        return -1;
    uint32_t n = (uint32_t)w->p[0] << 24 | (uint32_t)w->p[1] << 16 | (uint32_t)w->p[2] << 8 | w->p[3];
    if (n > w->left - 4)
        return -1;
    *s = w->p + 4;
    *len = n;
    w->p += 4 + n;
    w->left -= 4 + n;
    return 0;
}

static int wire_string_is(const unsigned char *s, size_t len, const char *want)
{
    return len == strlen(want) && memcmp(s, want, len) == 0;
}

/* Reads a positive mpint (RFC 4251: two's complement, big-endian, no
 * needless leading zero byte) and gives its size in bits; -1 for a
 * malformed, negative or zero one. */
static int wire_mpint_bits(struct wire *w, int64_t *bits)
{
    const unsigned char *s;
    size_t len;
    if (wire_string(w, &s, &len) < 0 || len == 0 || (s[0] & 0x80))
        return -1;
    if (s[0] == 0) {
        if (len == 1 || !(s[1] & 0x80))
            return -1; /* a leading zero only where the top bit needs it */
        s++;
        len--;
    }
    int top = 0;
    for (int b = 7; b >= 0; b--)
        if (s[0] >> b & 1) {
            top = b + 1;
            break;
        }
    *bits = (int64_t)(len - 1) * 8 + top;
    return 0;
}

struct curve {
    const char *type; /* key type */
    const char *name; /* curve identifier inside the blob */
    size_t point_len; /* uncompressed point: 0x04, X, Y */
    int64_t bits;     /* as ssh-keygen shows */
};

static const struct curve CURVES[] = {
    {"ecdsa-sha2-nistp256", "nistp256", 65,  256},
    {"ecdsa-sha2-nistp384", "nistp384", 97,  384},
    {"ecdsa-sha2-nistp521", "nistp521", 133, 521},
};

/* The RSA sizes taken: below 2048 bits is breakable (OpenSSH itself refuses
 * under 1024 and warns under 2048); above 16384 is what OpenSSH's own cap is. */
#define RSA_MIN_BITS 2048
#define RSA_MAX_BITS 16384

/* Checks the key material after the type string; sets bits. */
static int check_material(const char *type, struct wire *w, int64_t *bits, char *why, size_t whylen)
{
    const unsigned char *s;
    size_t len;
    if (strcmp(type, "ssh-ed25519") == 0) {
        if (wire_string(w, &s, &len) < 0)
            return fail(why, whylen, "the ssh-ed25519 key is truncated");
        if (len != 32)
            return fail(why, whylen, "an ssh-ed25519 key is 32 bytes; this one is %zu", len);
        *bits = 256;
        return 0;
    }
    if (strcmp(type, "ssh-rsa") == 0) {
        int64_t e_bits, n_bits;
        if (wire_mpint_bits(w, &e_bits) < 0 || wire_mpint_bits(w, &n_bits) < 0)
            return fail(why, whylen, "the ssh-rsa key is truncated or its numbers are malformed");
        if (e_bits < 2 || e_bits > 64)
            return fail(why, whylen, "the ssh-rsa key's public exponent is implausible (%lld bits)", (long long)e_bits);
        if (n_bits < RSA_MIN_BITS)
            return fail(why, whylen, "RSA keys must have at least %d bits; this one has %lld", RSA_MIN_BITS,
                        (long long)n_bits);
        if (n_bits > RSA_MAX_BITS)
            return fail(why, whylen, "RSA keys may have at most %d bits; this one has %lld", RSA_MAX_BITS,
                        (long long)n_bits);
        *bits = n_bits;
        return 0;
    }
    for (size_t i = 0; i < sizeof CURVES / sizeof CURVES[0]; i++) {
        const struct curve *c = &CURVES[i];
        if (strcmp(type, c->type) != 0)
            continue;
        if (wire_string(w, &s, &len) < 0)
            return fail(why, whylen, "the %s key is truncated", type);
        if (!wire_string_is(s, len, c->name))
            return fail(why, whylen, "the %s key names another curve inside its blob", type);
        if (wire_string(w, &s, &len) < 0)
            return fail(why, whylen, "the %s key is truncated", type);
        if (len != c->point_len || s[0] != 0x04)
            return fail(why, whylen, "the %s key's point is not an uncompressed %s point (%zu bytes, want %zu)", type,
                        c->name, len, c->point_len);
        if (!ec_point_on_curve(c->name, s, len))
            return fail(why, whylen, "the %s key's point is not on the %s curve", type, c->name);
        *bits = c->bits;
        return 0;
    }
    return fail(why, whylen, "unsupported key type %.40s", type);
}

/* Blanks between the fields; a line end counts as one, since only the one
 * that may end the line gets past ssh_key_parse's first check. */
static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

static int type_supported(const char *type)
{
    if (strcmp(type, "ssh-ed25519") == 0 || strcmp(type, "ssh-rsa") == 0)
        return 1;
    for (size_t i = 0; i < sizeof CURVES / sizeof CURVES[0]; i++)
        if (strcmp(type, CURVES[i].type) == 0)
            return 1;
    return 0;
}

int ssh_key_parse(const char *line, struct ssh_pubkey *out, char *why, size_t whylen)
{
    memset(out, 0, sizeof *out);
    out->comment = "";
    size_t total = strnlen(line, SSH_KEY_LINE_MAX + 1);
    if (total > SSH_KEY_LINE_MAX)
        return fail(why, whylen, "a public key line may be at most %d bytes", SSH_KEY_LINE_MAX);
    /* One line end after the key is what a .pub file holds, so a pasted or
     * uploaded file is taken; a line break anywhere else is refused. */
    size_t body = total;
    if (body > 0 && line[body - 1] == '\n')
        body--;
    if (body > 0 && line[body - 1] == '\r')
        body--;
    for (size_t i = 0; i < body; i++)
        if (((unsigned char)line[i] < 0x20 && line[i] != '\t') || line[i] == 0x7f)
            return fail(why, whylen, "give one public key line, without line breaks or control characters");
    const char *p = line;
    while (is_blank(*p))
        p++;
    const char *type = p;
    while (*p && !is_blank(*p))
        p++;
    size_t type_len = (size_t)(p - type);
    if (type_len == 0)
        return fail(why, whylen, "the public key is empty; give a line like \"ssh-ed25519 AAAA... you@host\"");
    if (type_len >= sizeof out->type) {
        return fail(why, whylen,
                    "unsupported key type; use ssh-ed25519, ecdsa-sha2-nistp256/384/521 or ssh-rsa "
                    "(options before the key are not taken)");
    }
    memcpy(out->type, type, type_len);
    out->type[type_len] = '\0';
    if (!type_supported(out->type))
        return fail(why, whylen,
                    "unsupported key type %s; use ssh-ed25519, ecdsa-sha2-nistp256/384/521 or ssh-rsa (options "
                    "before the key are not taken)",
                    out->type);
    while (is_blank(*p))
        p++;
    const char *b64 = p;
    while (*p && !is_blank(*p))
        p++;
    size_t b64_len = (size_t)(p - b64);
    if (b64_len == 0)
        return fail(why, whylen, "the line has a type but no key after it");
    while (is_blank(*p))
        p++;
    const char *comment = p, *end = line + total;
    while (end > comment && is_blank(end[-1]))
        end--;
    size_t comment_len = (size_t)(end - comment);
    if (comment_len > SSH_KEY_COMMENT_MAX)
        return fail(why, whylen, "the key's comment may be at most %d bytes", SSH_KEY_COMMENT_MAX);

    static _Thread_local unsigned char blob[SSH_KEY_LINE_MAX / 4 * 3 + 3];
    long blob_len = b64_decode(b64, b64_len, blob);
    if (blob_len < 0)
        return fail(why, whylen, "the key is not valid base64");
    struct wire w = {blob, (size_t)blob_len};
    const unsigned char *inner;
    size_t inner_len;
    if (wire_string(&w, &inner, &inner_len) < 0)
        return fail(why, whylen, "the key's blob is truncated");
    if (!wire_string_is(inner, inner_len, out->type))
        return fail(why, whylen, "the line says %s but the key inside is of another type", out->type);
    if (check_material(out->type, &w, &out->bits, why, whylen) < 0)
        return -1;
    if (w.left != 0)
        return fail(why, whylen, "the key's blob has %zu bytes of trailing garbage", w.left);

    char hex[65];
    unsigned char digest[32];
    sha256_hex(blob, (size_t)blob_len, hex);
    for (int i = 0; i < 32; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        digest[i] = (unsigned char)v;
    }
    char enc[45];
    b64_encode_unpadded(digest, sizeof digest, enc);
    snprintf(out->fingerprint, sizeof out->fingerprint, "SHA256:%s", enc);
    out->base64 = b64;
    out->base64_len = b64_len;
    out->comment = comment;
    out->comment_len = comment_len;
    return 0;
}

int ssh_key_format(const struct ssh_pubkey *k, int with_comment, char *out, size_t n)
{
    int len;
    if (with_comment && k->comment_len)
        len = snprintf(out, n, "%s %.*s %.*s", k->type, (int)k->base64_len, k->base64, (int)k->comment_len, k->comment);
    else
        len = snprintf(out, n, "%s %.*s", k->type, (int)k->base64_len, k->base64);
    return len < 0 || (size_t)len >= n ? -1 : 0;
}
