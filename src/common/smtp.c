/* smtp.c: one e-mail through SMTP with libcurl: the message is built here
 * (headers, dot-safe CRLF body) and streamed to curl's upload callback. */
#include "gpurent/smtp.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int smtp_tls_parse(const char *s, enum smtp_tls *out)
{
    if (strcmp(s, "none") == 0)
        *out = SMTP_TLS_NONE;
    else if (strcmp(s, "starttls") == 0)
        *out = SMTP_TLS_STARTTLS;
    else if (strcmp(s, "required") == 0)
        *out = SMTP_TLS_REQUIRED;
    else
        return -1;
    return 0;
}

struct upload {
    const char *data;
    size_t len, off;
};

static size_t read_cb(char *buf, size_t size, size_t n, void *vctx)
{
    struct upload *u = vctx;
    size_t want = size * n, left = u->len - u->off;
    if (want > left)
        want = left;
    memcpy(buf, u->data + u->off, want);
    u->off += want;
    return want;
}

/* A header value must not carry a line break (header injection). */
static int one_line(const char *s)
{
    return !strpbrk(s, "\r\n");
}

/* libcurl escapes leading dots itself (since 7.x, CURLOPT_MAIL_* uploads). */
char *smtp_message(const char *from, const char *to, const char *subject, const char *body, size_t *len)
{
    char date[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S +0000", &tm);
    char *msg = NULL;
    size_t mlen = 0;
    FILE *f = open_memstream(&msg, &mlen);
    if (!f)
        return NULL;
    fprintf(f,
            "Date: %s\r\nFrom: <%s>\r\nTo: <%s>\r\nSubject: %s\r\nMIME-Version: 1.0\r\n"
            "Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n",
            date, from, to, subject);
    for (const char *p = body; *p; p++) {
        if (*p == '\r' && p[1] == '\n')
            continue; /* written with the \n */
        if (*p == '\r' || *p == '\n')
            fputs("\r\n", f);
        else
            fputc(*p, f);
    }
    fclose(f);
    *len = mlen;
    return msg;
}

int smtp_send(const struct smtp_server *srv, const char *to, const char *subject, const char *body, char *err,
              size_t errlen)
{
    if (!one_line(to) || !one_line(subject) || !one_line(srv->from)) {
        snprintf(err, errlen, "a header has a line break");
        return -1;
    }
    size_t len;
    char *msg = smtp_message(srv->from, to, subject, body, &len);
    CURL *c = curl_easy_init();
    if (!msg || !c) {
        free(msg);
        if (c)
            curl_easy_cleanup(c);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    char from[300], rcpt_addr[300], curl_err[CURL_ERROR_SIZE] = "";
    snprintf(from, sizeof from, "<%s>", srv->from);
    snprintf(rcpt_addr, sizeof rcpt_addr, "<%s>", to);
    struct curl_slist *rcpt = curl_slist_append(NULL, rcpt_addr);
    struct upload up = {.data = msg, .len = len};
    curl_easy_setopt(c, CURLOPT_URL, srv->url);
    curl_easy_setopt(c, CURLOPT_MAIL_FROM, from);
    curl_easy_setopt(c, CURLOPT_MAIL_RCPT, rcpt);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, read_cb);
    curl_easy_setopt(c, CURLOPT_READDATA, &up);
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, srv->timeout_ms);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, curl_err);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "smtp,smtps");
    curl_easy_setopt(c, CURLOPT_USE_SSL, srv->tls == SMTP_TLS_REQUIRED   ? (long)CURLUSESSL_ALL
                                         : srv->tls == SMTP_TLS_STARTTLS ? (long)CURLUSESSL_TRY
                                                                         : (long)CURLUSESSL_NONE);
    if (srv->user && srv->user[0]) {
        curl_easy_setopt(c, CURLOPT_USERNAME, srv->user);
        curl_easy_setopt(c, CURLOPT_PASSWORD, srv->password ? srv->password : "");
    }
    CURLcode rc = rcpt ? curl_easy_perform(c) : CURLE_OUT_OF_MEMORY;
    if (rc != CURLE_OK)
        snprintf(err, errlen, "%s", curl_err[0] ? curl_err : curl_easy_strerror(rc));
    curl_slist_free_all(rcpt);
    curl_easy_cleanup(c);
    free(msg);
    return rc == CURLE_OK ? 0 : -1;
}
