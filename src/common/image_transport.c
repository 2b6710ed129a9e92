/* image_transport.c: image references podman would not read as a registry
 * image (see image_transport.h). */
#include "gpurent/image_transport.h"

#include <string.h>

int image_names_transport(const char *ref, size_t len)
{
    /* Every transport but docker, whose references start "//" (caught
     * below): "docker:24-dind" is Docker Hub's own image and stays. */
    static const char *const transports[] = {"containers-storage", "dir",    "docker-archive", "docker-daemon",
                                             "oci",                "oci-archive", "ostree",    "sif",
                                             "tarball",            NULL};
    const char *colon = memchr(ref, ':', len);
    if (!colon)
        return 0;
    size_t n = (size_t)(colon - ref);
    for (int i = 0; transports[i]; i++)
        if (strlen(transports[i]) == n && strncmp(ref, transports[i], n) == 0)
            return 1;
    for (size_t i = 0; i + 2 < len; i++)
        if (ref[i] == ':' && ref[i + 1] == '/' && ref[i + 2] == '/')
            return 1;
    return 0;
}
