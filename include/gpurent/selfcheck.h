/* selfcheck.h: a program asking its own HTTP server whether it answers, as
 * the systemd watchdog loops of gpurentd and gpurent-agent do before they
 * feed the watchdog. */
#ifndef GPURENT_SELFCHECK_H
#define GPURENT_SELFCHECK_H

#include <stddef.h>

/* The /healthz URL of a server listening on host:port (a wildcard address
 * becomes loopback; IPv6 gets brackets). */
void selfcheck_url(const char *host, int port, int tls, char *out, size_t outlen);
/* 0 when GET url answers 200 within 5 s; else -1, with what went wrong in
 * why. The server's own certificate is not verified: reaching the port on
 * loopback is what counts. */
int selfcheck_get(const char *url, char *why, size_t whylen);

#endif
