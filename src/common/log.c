/* log.c: the logger behind log.h. Each event is formatted into one buffer and
 * written with a single write(2), so lines from different threads never mix;
 * newlines and control characters in a message are neutralised, so a value
 * from outside can neither split a line nor forge one. */
#include "gpurent/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Atomic int current_level = LOG_LVL_INFO;

void log_set_level(enum log_level level) { atomic_store(&current_level, (int)level); }
enum log_level log_get_level(void) { return (enum log_level)atomic_load(&current_level); }

static const struct { const char *name; enum log_level level; } level_names[] = {
    {"error", LOG_LVL_ERROR}, {"warn", LOG_LVL_WARN}, {"info", LOG_LVL_INFO}, {"debug", LOG_LVL_DEBUG},
};

int log_level_parse(const char *name, enum log_level *out)
{
    for (size_t i = 0; i < sizeof level_names / sizeof level_names[0]; i++) {
        if (strcmp(name, level_names[i].name) == 0) {
            *out = level_names[i].level;
            return 0;
        }
    }
    return -1;
}

const char *log_level_name(enum log_level level)
{
    for (size_t i = 0; i < sizeof level_names / sizeof level_names[0]; i++)
        if (level_names[i].level == level)
            return level_names[i].name;
    return "?";
}

static void log_vmsg(enum log_level level, const char *fmt, va_list ap)
{
    if ((int)level > atomic_load(&current_level))
        return;
    char line[2048];
    /* Wall-clock time on purpose: log lines tell operators when, even when the
     * daemon runs on the testing clock. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "<%d>%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s: ", (int)level,
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, log_level_name(level));
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    size_t len = (size_t)n + (m < 0 ? 0 : ((size_t)m < sizeof line - (size_t)n - 1 ? (size_t)m : sizeof line - (size_t)n - 2));
    /* Messages carry values from outside (request paths, names, library
     * errors). A message never spans lines: journald would split it into two
     * events, the second with whatever priority prefix its text begins with,
     * so newlines become spaces. Other control characters are written as
     * \xNN: an escape sequence would repaint an operator's terminal, and
     * journalctl shows a message holding one only as "[N blob data]", which
     * would hide the request that sent it. */
    char out[sizeof line * 4 + 2];
    memcpy(out, line, (size_t)n);
    size_t k = (size_t)n;
    for (size_t i = (size_t)n; i < len; i++) {
        unsigned char c = (unsigned char)line[i];
        if (c == '\n' || c == '\r')
            out[k++] = ' ';
        else if ((c < 0x20 && c != '\t') || c == 0x7f)
            k += (size_t)snprintf(out + k, 5, "\\x%02x", c);
        else
            out[k++] = (char)c;
    }
    out[k++] = '\n';
    ssize_t w = write(STDERR_FILENO, out, k);
    (void)w;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vmsg(level, fmt, ap);
    va_end(ap);
}

void log_level_change(enum log_level level, const char *fmt, ...)
{
    /* Said under the more verbose of the old and new levels, so a reload
     * that quietens the log (info to warn) still reports that it happened. */
    if (level > log_get_level())
        log_set_level(level);
    va_list ap;
    va_start(ap, fmt);
    log_vmsg(LOG_LVL_INFO, fmt, ap);
    va_end(ap);
    log_set_level(level);
}
