/* fileio.c: whole writes and directory fsyncs (see gpurent/fileio.h). */
#include "gpurent/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

int fd_write_all(int fd, const void *p, size_t n)
{
    const char *at = p;
    errno = 0;
    while (n > 0) {
        ssize_t w = write(fd, at, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        at += w;
        n -= (size_t)w;
    }
    return 0;
}

int dir_fsync(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}
