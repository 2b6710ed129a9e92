/* log.h: one line per event on stderr, prefixed with the syslog priority
 * (<3> error … <7> debug) so journald keeps the level. Never log a secret. */
#ifndef GPURENT_LOG_H
#define GPURENT_LOG_H

enum log_level { LOG_LVL_ERROR = 3, LOG_LVL_WARN = 4, LOG_LVL_INFO = 6, LOG_LVL_DEBUG = 7 };

/* Sets the most verbose level written; safe to call while other threads log. */
void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* Parses "error", "warn", "info" or "debug"; returns -1 for anything else. */
int log_level_parse(const char *name, enum log_level *out);
const char *log_level_name(enum log_level level);

void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Like log_msg, but the line may wait in this thread's buffer for up to a
 * second (log.c says why that is safe); for the access log. */
void log_buffered(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Writes every thread's buffered lines now (shutdown, SIGHUP). */
void log_flush(void);

/* Sets the level and says fmt at info under the more verbose of the old and
 * new levels, so that a reload that quietens the log still says it happened. */
void log_level_change(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(LOG_LVL_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_LVL_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_LVL_DEBUG, __VA_ARGS__)

#endif
