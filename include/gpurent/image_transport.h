/* image_transport.h: whether an image reference would be read by podman as
 * one of its other transports (containers-transports(5)): "oci-archive:x"
 * is a valid reference to docker.io/library/oci-archive:x, and podman,
 * running as root, would load an image from the host path x instead. Both
 * the daemon and the agent refuse such references. */
#ifndef GPURENT_IMAGE_TRANSPORT_H
#define GPURENT_IMAGE_TRANSPORT_H

#include <stddef.h>

/* 1 when the len bytes of ref start with a transport's name and ':' (or
 * hold "://"), else 0. */
int image_names_transport(const char *ref, size_t len);

#endif
