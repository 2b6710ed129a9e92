/* fileio.h: the two steps of a durable write that the agent's state files,
 * its SFTP server and the gateway's usage journal all take: writing a whole
 * buffer to a descriptor, and fsyncing a directory so a rename or a new
 * file in it survives a crash. */
#ifndef GPURENT_FILEIO_H
#define GPURENT_FILEIO_H

#include <stddef.h>

/* Writes all n bytes of p to fd, retrying after EINTR and short writes.
 * 0, or -1 with errno set, or with errno 0 when write() returned 0 (the
 * other end stopped taking bytes). */
int fd_write_all(int fd, const void *p, size_t n);
/* fsync() of the directory dir: 0, or -1 with errno set. */
int dir_fsync(const char *dir);

#endif
