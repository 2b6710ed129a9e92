/* smtp.h: sending one plain-text e-mail through an SMTP server with
 * libcurl (the daemon's mailer loop uses it; libcurl stays in common). */
#ifndef GPURENT_SMTP_H
#define GPURENT_SMTP_H
#include <stddef.h>

/* How TLS is used, as libcurl's CURLOPT_USE_SSL: "none" never, "starttls"
 * when the server offers it (CURLUSESSL_TRY), "required" or fail
 * (CURLUSESSL_ALL). smtps:// URLs are TLS from the first byte anyway. */
enum smtp_tls { SMTP_TLS_NONE, SMTP_TLS_STARTTLS, SMTP_TLS_REQUIRED };
/* Parses "none", "starttls" or "required"; -1 otherwise. */
int smtp_tls_parse(const char *s, enum smtp_tls *out);

struct smtp_server {
    const char *url;      /* smtp://host:port or smtps://host:port */
    const char *from;     /* envelope and From: address */
    const char *user;     /* "" or NULL: no AUTH */
    const char *password; /* with user */
    enum smtp_tls tls;    /* CURLOPT_USE_SSL */
    long timeout_ms;      /* the whole exchange */
};
/* The message smtp_send uploads, malloc'd (*len its length): the headers,
 * then the body with every bare \n or \r made \r\n, so that no line ends
 * other than as SMTP ends lines (a lone CR or LF beside a dot is how a
 * message smuggles another past a relay). NULL without memory. */
char *smtp_message(const char *from, const char *to, const char *subject, const char *body, size_t *len);
/* Sends subject and body (plain text, UTF-8, lines ending in \n) to to.
 * 0, or -1 with the reason in err. */
int smtp_send(const struct smtp_server *srv, const char *to, const char *subject, const char *body, char *err,
              size_t errlen);
#endif
