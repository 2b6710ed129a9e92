/* sftp.h: `gpurent-agent sftp-server --root DIR` (sftp.c), the SFTP version 3
 * server (draft-ietf-secsh-filexfer-02 and the OpenSSH extensions) that the
 * agent's SSH server runs for the `sftp` subsystem, and OpenSSH's sftp and
 * scp (which speaks SFTP since OpenSSH 9) talk to. Every client path is
 * resolved inside DIR with openat2(RESOLVE_IN_ROOT), so neither `..` nor a
 * symlink leaves it. The packet coding and the path normalisation are pure
 * and declared here for the unit tests. agent.h includes this header. */
#ifndef GPURENT_AGENT_SFTP_H
#define GPURENT_AGENT_SFTP_H

#include <stddef.h>
#include <stdint.h>

/* Bounds. A packet is its 4-byte length and at most SFTP_PACKET_MAX bytes
 * after it, OpenSSH's own limit: its client refuses longer replies, so READ
 * data stops 1 KiB short of it, which also leaves a WRITE of as much data
 * room for its handle and header. limits@openssh.com tells clients these. */
#define SFTP_PACKET_MAX (256 * 1024)           /* bytes after the length word */
#define SFTP_DATA_MAX (SFTP_PACKET_MAX - 1024) /* data of one READ reply or WRITE request */
#define SFTP_PATH_MAX 4096                     /* a path as the client sends it, NUL included */
#define SFTP_HANDLES_MAX 64                    /* files and directories open at once */
#define SFTP_READDIR_BATCH 128                 /* names in one READDIR reply */

/* Packet types and status codes of the draft. */
enum {
    SFTP_INIT = 1,
    SFTP_VERSION = 2,
    SFTP_OPEN = 3,
    SFTP_CLOSE = 4,
    SFTP_READ = 5,
    SFTP_WRITE = 6,
    SFTP_LSTAT = 7,
    SFTP_FSTAT = 8,
    SFTP_SETSTAT = 9,
    SFTP_FSETSTAT = 10,
    SFTP_OPENDIR = 11,
    SFTP_READDIR = 12,
    SFTP_REMOVE = 13,
    SFTP_MKDIR = 14,
    SFTP_RMDIR = 15,
    SFTP_REALPATH = 16,
    SFTP_STAT = 17,
    SFTP_RENAME = 18,
    SFTP_READLINK = 19,
    SFTP_SYMLINK = 20,
    SFTP_STATUS = 101,
    SFTP_HANDLE = 102,
    SFTP_DATA = 103,
    SFTP_NAME = 104,
    SFTP_ATTRS = 105,
    SFTP_EXTENDED = 200,
    SFTP_EXTENDED_REPLY = 201,
};
enum {
    SFTP_FX_OK = 0,
    SFTP_FX_EOF = 1,
    SFTP_FX_NO_SUCH_FILE = 2,
    SFTP_FX_PERMISSION_DENIED = 3,
    SFTP_FX_FAILURE = 4,
    SFTP_FX_BAD_MESSAGE = 5,
    SFTP_FX_OP_UNSUPPORTED = 8,
};
/* Attribute flags and OPEN's pflags. */
#define SFTP_ATTR_SIZE 0x1u
#define SFTP_ATTR_UIDGID 0x2u
#define SFTP_ATTR_PERMISSIONS 0x4u
#define SFTP_ATTR_ACMODTIME 0x8u
#define SFTP_ATTR_EXTENDED 0x80000000u
#define SFTP_OPEN_READ 0x1u
#define SFTP_OPEN_WRITE 0x2u
#define SFTP_OPEN_APPEND 0x4u
#define SFTP_OPEN_CREAT 0x8u
#define SFTP_OPEN_TRUNC 0x10u
#define SFTP_OPEN_EXCL 0x20u

/* A received packet being read: each getter sets bad (and returns zero or
 * NULL) once the packet is too short, so a handler checks bad once at the
 * end instead of after every field. */
struct sftp_in {
    const unsigned char *p; /* the packet after its length word; borrowed */
    size_t len;             /* bytes at p */
    size_t off;             /* next byte to read */
    int bad;                /* a read ran past the end or found a malformed field */
};
/* A reply being built; grows as needed up to SFTP_PACKET_MAX + 4 bytes. */
struct sftp_out {
    unsigned char *p; /* owned */
    size_t len;       /* bytes used, the length word included */
    size_t cap;       /* bytes allocated */
    int bad;          /* out of memory or over the bound: the reply is not sent */
};
/* File attributes as the protocol carries them; flags says which are set. */
struct sftp_attrs {
    uint32_t flags;
    uint64_t size;
    uint32_t uid, gid;
    uint32_t perm;
    uint32_t atime, mtime;
};

uint8_t sftp_get_u8(struct sftp_in *in);
uint32_t sftp_get_u32(struct sftp_in *in);
uint64_t sftp_get_u64(struct sftp_in *in);
/* A string: a pointer into the packet and its length (not NUL-terminated). */
const unsigned char *sftp_get_string(struct sftp_in *in, uint32_t *len);
/* A string copied into out as a C string; bad when it is longer than
 * outlen - 1 or holds a NUL byte (a path that C would cut short). */
void sftp_get_cstring(struct sftp_in *in, char *out, size_t outlen);
/* ATTRS; extended pairs are read and ignored. */
void sftp_get_attrs(struct sftp_in *in, struct sftp_attrs *a);

/* Starts a reply of the given type (the length word is filled by
 * sftp_out_finish). The buffer is kept between replies. */
void sftp_out_begin(struct sftp_out *out, uint8_t type);
void sftp_put_u8(struct sftp_out *out, uint8_t v);
void sftp_put_u32(struct sftp_out *out, uint32_t v);
void sftp_put_u64(struct sftp_out *out, uint64_t v);
void sftp_put_string(struct sftp_out *out, const void *s, size_t len);
void sftp_put_cstring(struct sftp_out *out, const char *s);
void sftp_put_attrs(struct sftp_out *out, const struct sftp_attrs *a);
/* Writes the length word; -1 when the reply is bad. */
int sftp_out_finish(struct sftp_out *out);
void sftp_out_free(struct sftp_out *out);

/* Normalises a client path to a path in the volume: relative paths start
 * at the session's directory, /shared (the volume's mount point in the
 * container); ".", empty and repeated components go, ".." removes the
 * component before it and stops at "/"; then a leading "/shared" is the
 * volume's root, so "/shared/x", "x" and "/x" name the same file and
 * "shared/x" the volume's own shared/x. out receives the absolute form in
 * the volume ("/", "/a/b"; REALPATH replies it under /shared). -1 when it
 * does not fit. */
int sftp_path_normalize(const char *in, char *out, size_t outlen);
/* The form of a normalised path that openat2 resolves inside the root:
 * "." for "/", else the path without its leading slash. */
const char *sftp_path_relative(const char *normalized);
/* An `ls -l` line for a directory entry (what READDIR's longname carries):
 * mode letters, links, numeric owner and group, size, time (the year for
 * ones more than six months from now_s), name. */
void sftp_longname(char *out, size_t outlen, const char *name, uint32_t mode, uint64_t nlink, uint32_t uid,
                   uint32_t gid, uint64_t size, int64_t mtime_s, int64_t now_s);
/* The status code for an errno. */
uint32_t sftp_status_of_errno(int err);

/* Serves one client on in_fd/out_fd with root_fd (a directory) as "/",
 * until the client closes its end or breaks the protocol. 0 at a clean end
 * of input, 1 otherwise (logged on stderr). */
int sftp_serve(int root_fd, int in_fd, int out_fd);
/* `gpurent-agent sftp-server --root DIR`. */
int agent_cmd_sftp_server(int argc, char **argv);

#endif
