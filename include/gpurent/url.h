/* url.h: host names and addresses in URLs and listen options, read the way
 * libcurl will connect to them (user info, IPv6 brackets and ports
 * included), for every caller: the reconciler's MASTER_ADDR, the clear-text
 * warnings of nodes and listeners. */
#ifndef GPURENT_URL_H
#define GPURENT_URL_H

#include <stddef.h>

/* The host of url as libcurl parses it, IPv6 brackets removed, into out (n
 * bytes). 0, or -1 (out "") when url has no host or it does not fit. */
int url_host(const char *url, char *out, size_t n);
/* 1 when host (an IP address as written in a listen option or a URL, or a
 * name) can only be reached from this machine: 127.0.0.0/8, ::1, the IPv4
 * loopback mapped into IPv6, "localhost". Decides the clear-text warnings. */
int host_is_loopback(const char *host);

#endif
