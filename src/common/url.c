/* url.c: hosts of URLs through libcurl's parser, and whether a host is this
 * machine (see url.h). */
#include "gpurent/url.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

int url_host(const char *url, char *out, size_t n)
{
    out[0] = '\0';
    CURLU *u = curl_url();
    char *host = NULL;
    if (u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK)
        curl_url_get(u, CURLUPART_HOST, &host, 0);
    int rc = -1;
    if (host) {
        const char *h = host;
        size_t len = strlen(h);
        if (len > 2 && h[0] == '[' && h[len - 1] == ']') { /* an IPv6 address */
            h++;
            len -= 2;
        }
        if (len < n) {
            memcpy(out, h, len);
            out[len] = '\0';
            rc = 0;
        }
    }
    curl_free(host);
    curl_url_cleanup(u);
    return rc;
}

int host_is_loopback(const char *host)
{
    unsigned char a[16];
    if (inet_pton(AF_INET, host, a) == 1)
        return a[0] == 127;
    if (inet_pton(AF_INET6, host, a) == 1) {
        static const unsigned char one[16] = {[15] = 1};
        static const unsigned char mapped[12] = {[10] = 0xff, [11] = 0xff};
        return memcmp(a, one, 16) == 0 || (memcmp(a, mapped, 12) == 0 && a[12] == 127);
    }
    return strcasecmp(host, "localhost") == 0 || strcasecmp(host, "localhost.") == 0;
}
