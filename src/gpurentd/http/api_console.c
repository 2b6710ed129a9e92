/* api_console.c: the web console's static files, served under /console/
 * from the directory console_dir names (make install puts console/ there),
 * and GET / sending a browser to /console/. Only plain files of known types
 * inside that directory are served: no segment may start with a dot, and a
 * path that resolves (through a symbolic link) outside the directory is not
 * found. Every page goes out with a strict Content-Security-Policy (no
 * inline script or style, nothing from another origin, no framing), and a
 * validator (ETag) so a browser revalidates instead of downloading again. */
#include "http/api.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The largest file served; the console's biggest (xterm.js) is ~400 KB. */
#define CONSOLE_MAX_FILE (8 * 1024 * 1024)

static const struct {
    const char *ext;
    const char *type;
} console_types[] = {
    {".html", "text/html; charset=utf-8"},
    {".js", "text/javascript; charset=utf-8"},
    {".mjs", "text/javascript; charset=utf-8"},
    {".css", "text/css; charset=utf-8"},
    {".json", "application/json"},
    {".svg", "image/svg+xml"},
    {".png", "image/png"},
    {".ico", "image/x-icon"},
    {".txt", "text/plain; charset=utf-8"},
    {".map", "application/json"},
    {".woff2", "font/woff2"},
};

static const char *content_type_of(const char *name)
{
    const char *dot = strrchr(name, '.');
    if (!dot)
        return NULL;
    for (size_t i = 0; i < sizeof console_types / sizeof console_types[0]; i++)
        if (strcmp(dot, console_types[i].ext) == 0)
            return console_types[i].type;
    return NULL;
}

/* A segment the console may name: no "." or ".." (nor any hidden file), no
 * backslash or control byte. libmicrohttpd has already decoded %2e, so an
 * encoded ".." is refused here too (and %2F never reaches a route). */
static int segment_ok(const char *s)
{
    if (!s || !*s || *s == '.')
        return 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f || *p == '\\' || *p == '/')
            return 0;
    return 1;
}

/* Host as the browser sent it, if it is only host-name and port bytes:
 * it goes into the CSP's connect-src for the terminal's WebSocket. */
static int host_ok(const char *h)
{
    if (!h || !*h || strlen(h) > 64)
        return 0;
    for (const char *p = h; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
              *p == '-' || *p == ':' || *p == '[' || *p == ']'))
            return 0;
    return 1;
}

#define CSP_FORMAT                                                                                             \
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'%s; "      \
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'"

static void add_security_headers(struct http_request *req)
{
    /* 'self' alone covers same-origin WebSockets in CSP 3, but older
     * browsers need ws:/wss: of this host named. A reply header holds 255
     * bytes (http_add_header): a host too long for that gets 'self' only. */
    char csp[512], ws[160] = "";
    const char *host = http_header(req, "Host");
    if (host_ok(host))
        snprintf(ws, sizeof ws, " ws://%s wss://%s", host, host);
    if (snprintf(csp, sizeof csp, CSP_FORMAT, ws) >= (int)sizeof req->extra[0].value)
        snprintf(csp, sizeof csp, CSP_FORMAT, "");
    http_add_header(req, "Content-Security-Policy", csp);
    http_add_header(req, "X-Frame-Options", "DENY");
    http_add_header(req, "Referrer-Policy", "no-referrer");
    /* Revalidated every time (the ETag makes that cheap), so a new
     * console is seen as soon as it is installed. */
    http_add_header(req, "Cache-Control", "no-cache");
}

static void not_found(struct http_request *req)
{
    http_error(req, ERR_NOT_FOUND, NULL, "no console file at %.200s", req->path);
}

/* Serves rel (segments already checked, joined by '/') from console_dir. */
static void serve_file(struct http_request *req, const char *rel)
{
    const char *type = content_type_of(rel);
    char root[PATH_MAX], want[PATH_MAX + 256], real[PATH_MAX];
    if (!type || !realpath(daemon_config->console_dir, root)) {
        not_found(req);
        return;
    }
    snprintf(want, sizeof want, "%s/%s", root, rel);
    size_t rlen = strlen(root);
    /* The resolved file must still lie under the resolved root: a link
     * inside the console to /etc/passwd is not served. */
    if (!realpath(want, real) || strncmp(real, root, rlen) != 0 || real[rlen] != '/') {
        not_found(req);
        return;
    }
    int fd = open(real, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > CONSOLE_MAX_FILE) {
        if (fd >= 0)
            close(fd);
        not_found(req);
        return;
    }
    char etag[80];
    snprintf(etag, sizeof etag, "\"%llx-%llx-%lx\"", (unsigned long long)st.st_size,
             (unsigned long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
    add_security_headers(req);
    http_add_header(req, "ETag", etag);
    if (http_etag_matches(http_header(req, "If-None-Match"), etag)) {
        close(fd);
        http_reply_not_modified(req, (size_t)st.st_size);
        return;
    }
    size_t len = (size_t)st.st_size, got = 0;
    char *buf = malloc(len ? len : 1);
    while (buf && got < len) {
        ssize_t r = read(fd, buf + got, len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (!buf || got != len) {
        free(buf);
        http_error(req, ERR_INTERNAL, NULL, "cannot read console file %.200s", rel);
        return;
    }
    http_reply_raw(req, 200, type, buf, len);
    free(buf);
}

void api_console_root(struct http_request *req)
{
    http_add_header(req, "Location", "/console");
    http_reply_raw(req, 302, "text/plain; charset=utf-8", "see /console\n", 13);
}

void api_console_index(struct http_request *req)
{
    serve_file(req, "index.html");
}

/* /console/{a}, /console/{a}/{b}, /console/{a}/{b}/{c}: the params are the
 * path's segments, in order. */
void api_console_file(struct http_request *req)
{
    char rel[PATH_MAX] = "";
    size_t used = 0;
    for (int i = 0; i < HTTP_MAX_PARAMS && req->params[i]; i++) {
        if (!segment_ok(req->params[i]) || used + strlen(req->params[i]) + 2 > sizeof rel) {
            not_found(req);
            return;
        }
        used += (size_t)snprintf(rel + used, sizeof rel - used, "%s%s", used ? "/" : "", req->params[i]);
    }
    serve_file(req, rel);
}
