/* conf.h: table-driven configuration. Each program describes its options in
 * one table (name, type, bounds, default, where the value lives in its config
 * struct, an optional validator); the same code reads defaults, INI-style
 * files (through inih) and command-line overrides, so every source of a value
 * is checked by the same rules. */
#ifndef GPURENT_CONF_H
#define GPURENT_CONF_H

#include <stddef.h>
#include <stdint.h>

enum conf_type {
    CONF_INT,    /* int64_t, decimal, within [min, max] */
    CONF_BOOL,   /* int, "true"/"false"/"yes"/"no"/"on"/"off"/"1"/"0" */
    CONF_STRING, /* char[size], at most size-1 bytes */
};

struct conf_option {
    const char *name;    /* key as written in the file, e.g. "listen" */
    enum conf_type type; /* how the value is parsed */
    int64_t min, max;    /* bounds for CONF_INT */
    const char *def;     /* default, parsed by the same rules as the file */
    size_t offset;       /* offsetof the field in the program's config struct */
    size_t size;         /* sizeof the field (the buffer size for strings) */
    /* Extra check after parsing; writes a reason into err and returns -1 to
     * refuse. May be NULL. */
    int (*validate)(const void *field, char *err, size_t errlen);
    const char *help; /* one line shown by --help-config */
};

/* Sets every option to its default. Returns -1 (with err) only if a default
 * itself is invalid, which is a programming error. */
int conf_set_defaults(const struct conf_option *table, void *conf, char *err, size_t errlen);
/* Parses value for option name into conf. -1 with err on an unknown name or
 * a bad value; conf is unchanged then. */
int conf_set(const struct conf_option *table, void *conf, const char *name, const char *value, char *err,
             size_t errlen);
/* Reads a file of "key = value" lines ('#' and ';' comments), each key at the
 * start of its line and at most once: no [sections], no indented
 * continuation lines, no key set twice. -1 with
 * err as "FILE:LINE: reason" on the first bad line or if the file cannot be
 * read. */
int conf_load_file(const struct conf_option *table, void *conf, const char *path, char *err, size_t errlen);
/* Applies a "key=value" override from the command line. */
int conf_set_override(const struct conf_option *table, void *conf, const char *assignment, char *err, size_t errlen);
/* Prints every option with its default and help line. */
void conf_print_help(const struct conf_option *table, void *stream);

/* Validators both programs use for their "listen" and "log_level" options. */
int conf_validate_listen(const void *field, char *err, size_t errlen);
int conf_validate_log_level(const void *field, char *err, size_t errlen);

/* Validators for lists of words separated by spaces or commas, the way
 * http.c reads cors_origins and trusted_proxies; name is the option named in
 * the message. Each word of an address list must be an IPv4 or IPv6 address
 * written as inet_ntop writes it (http.c compares the client's address as
 * text, so "0:0::1" would never match "::1"); CIDR ranges and host names are
 * refused. Each word of an origin list must be "*" or an origin as browsers
 * send it: http or https, "://", a lower-case host name, IPv4 address or
 * [IPv6] address, an optional port other than the scheme's default, and
 * nothing after (no path, no trailing slash). Empty lists are accepted. */
int conf_check_address_list(const char *name, const char *list, char *err, size_t errlen);
int conf_check_origin_list(const char *name, const char *list, char *err, size_t errlen);

/* Splits "host:port" ("[::1]:8080" for IPv6) into host and port; -1 if bad. */
int conf_parse_hostport(const char *s, char *host, size_t hostlen, int *port);

#endif
