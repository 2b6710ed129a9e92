/* ssh_keys.h: OpenSSH public keys read the way sshd reads them, not
 * pattern-matched: a line "type base64 [comment]" is decoded, the SSH wire
 * format inside the blob is walked field by field, and the key is accepted
 * only when the blob's own type equals the line's and its key material has
 * the size its type demands (ed25519, ECDSA on P-256/384/521, RSA of 2048
 * bits or more). The fingerprint is ssh-keygen's: "SHA256:" and the
 * unpadded base64 of the blob's SHA-256. Pure (no I/O), so every rule is
 * unit-tested (tests/unit/daemon/test_ssh_keys.c). */
#ifndef GPURENT_SSH_KEYS_H
#define GPURENT_SSH_KEYS_H

#include <stddef.h>
#include <stdint.h>

/* The longest public key line taken (contract 1 of issue 11 caps each
 * authorized key at 16 KiB; an RSA-16384 line is under 3 KiB). */
#define SSH_KEY_LINE_MAX 16384
/* Room for "SHA256:" + 43 base64 characters + NUL. */
#define SSH_FINGERPRINT_MAX 64
/* The longest comment kept; ssh-keygen's defaults ("user@host") are far shorter. */
#define SSH_KEY_COMMENT_MAX 256

struct ssh_pubkey {
    char type[24];                         /* "ssh-ed25519", "ecdsa-sha2-nistp256", …, "ssh-rsa" */
    int64_t bits;                          /* as ssh-keygen -l shows: 256, 384, 521, or the RSA modulus size */
    char fingerprint[SSH_FINGERPRINT_MAX]; /* "SHA256:…" as ssh-keygen -l prints it */
    const char *base64;                    /* the blob's base64 in the parsed line (borrowed) */
    size_t base64_len;                     /* its length */
    const char *comment;                   /* the comment in the parsed line, trimmed (borrowed; "" if none) */
    size_t comment_len;                    /* its length */
};

/* Parses one public key line: optional surrounding blanks, the type, blanks,
 * the base64 blob (padding as written by ssh-keygen), and an optional
 * comment (printable, up to SSH_KEY_COMMENT_MAX bytes). Returns 0 with out
 * filled (pointing into line), or -1 with why (a sentence for the client:
 * "RSA keys must have at least 2048 bits; this one has 1024"). */
int ssh_key_parse(const char *line, struct ssh_pubkey *out, char *why, size_t whylen);

/* "type base64" of a parsed key, with " comment" when it has one, into out
 * (n bytes): the normalised form shown and stored. -1 if it does not fit. */
int ssh_key_format(const struct ssh_pubkey *k, int with_comment, char *out, size_t n);

#endif
