/* selfcheck.c: a program asking its own HTTP server whether it answers (see
 * selfcheck.h), with libcurl, from a watchdog thread. */
#include "gpurent/selfcheck.h"

#include <curl/curl.h>
#include <stdio.h>
#include <string.h>

void selfcheck_url(const char *host, int port, int tls, char *out, size_t outlen)
{
    const char *h = strcmp(host, "0.0.0.0") == 0 ? "127.0.0.1" : strcmp(host, "::") == 0 ? "::1" : host;
    snprintf(out, outlen, strchr(h, ':') ? "%s://[%s]:%d/healthz" : "%s://%s:%d/healthz", tls ? "https" : "http",
             h, port);
}

static size_t discard(char *data, size_t size, size_t nmemb, void *userp)
{
    (void)data, (void)userp;
    return size * nmemb;
}

int selfcheck_get(const char *url, char *why, size_t whylen)
{
    CURL *c = curl_easy_init();
    if (!c) {
        snprintf(why, whylen, "cannot make an HTTP client");
        return -1;
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
    long status = 0;
    CURLcode rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    if (rc == CURLE_OK && status == 200)
        return 0;
    if (rc != CURLE_OK)
        snprintf(why, whylen, "the API does not answer %s: %s", url, curl_easy_strerror(rc));
    else
        snprintf(why, whylen, "the API answers %s with %ld, not 200", url, status);
    return -1;
}
