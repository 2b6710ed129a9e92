/* fuzz_conf.c: fuzz target for configuration values read from memory
 * (conf_set_override, as `-o key=value` and each line of a file reach the
 * option table): a value taken is within its option's bounds and passes its
 * validator; a value refused says why and leaves the configuration exactly
 * as it was; and a HOST:PORT the listen validator takes splits into a host
 * and a port in range. */
#include "gpurent/conf.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct fuzz_conf {
    int64_t workers;
    int64_t offset_s;
    int tls;
    char listen[64];
    char log_level[16];
    char name[8];
};

static const struct conf_option table[] = {
    {"workers", CONF_INT, 1, 256, "4", offsetof(struct fuzz_conf, workers), sizeof(int64_t), NULL, "threads"},
    {"offset_s", CONF_INT, INT64_MIN, INT64_MAX, "0", offsetof(struct fuzz_conf, offset_s), sizeof(int64_t), NULL,
     "any integer"},
    {"tls", CONF_BOOL, 0, 0, "false", offsetof(struct fuzz_conf, tls), sizeof(int), NULL, "TLS on"},
    {"listen", CONF_STRING, 0, 0, "127.0.0.1:8080", offsetof(struct fuzz_conf, listen), 64, conf_validate_listen,
     "address"},
    {"log_level", CONF_STRING, 0, 0, "info", offsetof(struct fuzz_conf, log_level), 16, conf_validate_log_level,
     "level"},
    {"name", CONF_STRING, 0, 0, "", offsetof(struct fuzz_conf, name), 8, NULL, "short text"},
    {NULL, 0, 0, 0, NULL, 0, 0, NULL, NULL},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *assignment = malloc(size + 1);
    if (!assignment)
        return 0;
    memcpy(assignment, data, size);
    assignment[size] = '\0';

    struct fuzz_conf conf, before;
    char err[256] = "";
    memset(&conf, 0, sizeof conf);
    if (conf_set_defaults(table, &conf, err, sizeof err) < 0)
        abort();
    before = conf;
    err[0] = '\0';
    if (conf_set_override(table, &conf, assignment, err, sizeof err) < 0) {
        if (!err[0] || memcmp(&conf, &before, sizeof conf) != 0)
            abort(); /* refused: says why, changes nothing */
    } else {
        if (conf.workers < 1 || conf.workers > 256 || (conf.tls != 0 && conf.tls != 1) ||
            !memchr(conf.listen, '\0', sizeof conf.listen) || !memchr(conf.name, '\0', sizeof conf.name) ||
            !memchr(conf.log_level, '\0', sizeof conf.log_level))
            abort();
        char host[128];
        int port = -1;
        if (conf_parse_hostport(conf.listen, host, sizeof host, &port) < 0 || port < 0 || port > 65535 || !host[0])
            abort();
        char again[256] = "";
        if (conf_validate_listen(conf.listen, again, sizeof again) < 0 ||
            conf_validate_log_level(conf.log_level, again, sizeof again) < 0)
            abort();
    }
    /* The same bytes as a HOST:PORT. */
    char host[16];
    int port = -1;
    if (conf_parse_hostport(assignment, host, sizeof host, &port) == 0 &&
        (port < 0 || port > 65535 || !host[0] || strlen(host) >= sizeof host || !strstr(assignment, host)))
        abort();
    free(assignment);
    return 0;
}
