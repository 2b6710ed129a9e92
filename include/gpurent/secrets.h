/* secrets.h: password hashing, API key tokens and SSH key pairs. Passwords use
 * PBKDF2-HMAC-SHA256 with a per-password salt and a configurable iteration
 * count kept in the stored string, so raising the count later does not break
 * old hashes. API keys are 256 random bits shown once; only their SHA-256 is
 * stored, and checks compare in constant time. */
#ifndef GPURENT_SECRETS_H
#define GPURENT_SECRETS_H

#include <stddef.h>
#include <stdint.h>

#include "gpurent/ids.h"

#define PASSWORD_HASH_MAX 160
/* Hashes password into out ("pbkdf2-sha256$ITER$SALT$HASH"); 0 or -1. */
int password_hash(const char *password, int64_t iterations, char out[PASSWORD_HASH_MAX]);
/* 1 if password matches stored, 0 if not or if stored is malformed. */
int password_verify(const char *password, const char *stored);

/* An API key token is "gpk_" + the 20 random characters of its key id + "_"
 * + 64 hex characters of secret. The key id ("key_" + the same 20) finds the
 * row; the secret's SHA-256 is compared with what the row holds. */
#define API_TOKEN_LEN (4 + ID_RANDOM_CHARS + 1 + 64)
#define API_SECRET_HASH_LEN 32
/* Makes a new key: its id, the token to show once, and the hash to store. */
int api_key_new(char id[ID_MAX], char token[API_TOKEN_LEN + 1], unsigned char hash[API_SECRET_HASH_LEN]);
/* Splits a token into its key id and secret hash; -1 if malformed. */
int api_key_parse(const char *token, char id[ID_MAX], unsigned char hash[API_SECRET_HASH_LEN]);
/* Constant-time equality of two secret hashes: 1 if equal. */
int api_key_hash_equal(const unsigned char *a, const unsigned char *b);

/* Reads a secret kept in a file (a webhook key, an SMTP password): its
 * first line, without the line end, into out. Refused with a reason when
 * others may read it or anyone but its owner may write it (whatever the
 * umask was when it was made), when it is not a regular file, or when the
 * line does not fit. 0 or -1. */
int secret_file_read(const char *path, char *out, size_t outlen, char *err, size_t errlen);
/* Whether cert_file and key_file are a TLS pair a server can start with:
 * both readable PEM, the key not encrypted, and the key the certificate's.
 * 0, or -1 with a reason naming the file. */
int tls_pair_check(const char *cert_file, const char *key_file, char *err, size_t errlen);
/* Whether a file exists and others may read it: 1, 0, or -1 (cannot stat). */
int file_world_readable(const char *path);

/* SHA-256 of data into out (32 bytes). */
void sha256(const void *data, size_t len, unsigned char out[32]);
/* SHA-256 of data as 64 lowercase hex characters plus NUL. */
void sha256_hex(const void *data, size_t len, char out[65]);
/* SHA-256 of the n pieces parts[i] (lens[i] bytes each) one after the
 * other, as sha256_hex: for hashing a request without copying it. */
void sha256_hex_parts(const void *const *parts, const size_t *lens, size_t n, char out[65]);
/* HMAC-SHA256 of data keyed with key, as 64 lowercase hex characters plus
 * NUL; -1 (out "") on failure. */
int hmac_sha256_hex(const char *key, const void *data, size_t len, char out[65]);
/* 1 when point (len bytes, SEC 1 encoding) is a point of the NIST curve
 * named as OpenSSH names it ("nistp256", "nistp384", "nistp521"), not the
 * point at infinity; 0 otherwise. For SSH public keys (the daemon's
 * ssh_keys.c), so no ECDSA key that cannot exist is taken. */
int ec_point_on_curve(const char *curve, const unsigned char *point, size_t len);
/* Constant-time equality of two n-byte strings (signatures): 1 if equal. */
int secret_equal(const void *a, const void *b, size_t n);

/* The longest key pair ssh_ed25519_keypair writes, NUL included: the public
 * key line (with a comment of up to 64 bytes) and the private key. */
#define SSH_PUBKEY_MAX 192
#define SSH_PRIVKEY_MAX 640
/* Makes a fresh Ed25519 key pair for ssh: pub gets the OpenSSH public key
 * line "ssh-ed25519 AAAA... comment", priv the private key in OpenSSH's own
 * unencrypted format ("-----BEGIN OPENSSH PRIVATE KEY-----", openssh-key-v1,
 * PROTOCOL.key), which ssh and ssh-keygen read. comment: up to 64 bytes, no
 * line break. 0, or -1 with both "". The caller wipes priv when done. */
int ssh_ed25519_keypair(const char *comment, char *pub, size_t pub_n, char *priv, size_t priv_n);
/* Decodes len bytes of padded base64 into out (room for len / 4 * 3);
 * the decoded length (its padding counted as zero bytes), or -1. */
int base64_decode(const char *in, size_t len, unsigned char *out);
/* Overwrites n bytes at p with zeros in a way the compiler keeps. */
void secret_wipe(void *p, size_t n);

/* Sec-WebSocket-Accept for a WebSocket handshake's Sec-WebSocket-Key (RFC
 * 6455 4.2.2): 0 with out, or -1 when key is not the base64 of 16 bytes. */
int websocket_accept(const char *key, char out[64]);

#endif
