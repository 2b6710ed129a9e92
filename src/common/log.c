/* log.c: the logger behind log.h. Each event is formatted into one buffer and
 * written with a single write(2), so lines from different threads never mix;
 * newlines and control characters in a message are neutralised, so a value
 * from outside can neither split a line nor forge one.
 *
 * log_buffered (the access log: a line per HTTP request) collects lines in
 * a buffer per thread instead, written when it would pass PIPE_BUF bytes,
 * when a line from the same thread goes out unbuffered (so a thread's lines
 * keep their order), by a flusher thread every second, and by log_flush()
 * (shutdown, SIGHUP). It is safe because each write(2) still carries only
 * whole lines and at most PIPE_BUF bytes, which a pipe or journald's stream
 * writes atomically, so lines never mix; every line keeps the time of its
 * event; and at most a second of access lines is lost in a crash, which
 * records nothing the database does not (errors and warnings are never
 * buffered). The buffer's mutex is its thread's own: HTTP threads share no
 * lock to log, only the flusher takes each one once a second. */
#include "gpurent/log.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
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

struct log_buffer {
    pthread_mutex_t lock;     /* its thread and the flusher */
    size_t len;               /* bytes in text */
    char text[PIPE_BUF];      /* whole lines */
    struct log_buffer *next;  /* registry */
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct log_buffer *registry;
static pthread_key_t buffer_key;
static pthread_once_t buffer_once = PTHREAD_ONCE_INIT;
static _Thread_local struct log_buffer *this_buffer;

static void buffer_write(struct log_buffer *b)
{
    if (b->len) {
        ssize_t w = write(STDERR_FILENO, b->text, b->len);
        (void)w;
        b->len = 0;
    }
}

/* A thread that ends writes what it holds and leaves the registry. */
static void buffer_free(void *v)
{
    struct log_buffer *b = v;
    pthread_mutex_lock(&registry_lock);
    for (struct log_buffer **p = &registry; *p; p = &(*p)->next)
        if (*p == b) {
            *p = b->next;
            break;
        }
    pthread_mutex_unlock(&registry_lock);
    pthread_mutex_lock(&b->lock);
    buffer_write(b);
    pthread_mutex_unlock(&b->lock);
    pthread_mutex_destroy(&b->lock);
    free(b);
}

static void *flusher(void *unused)
{
    (void)unused;
    for (;;) {
        struct timespec second = {1, 0};
        nanosleep(&second, NULL);
        log_flush();
    }
    return NULL;
}

static void buffers_init(void)
{
    pthread_key_create(&buffer_key, buffer_free);
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, flusher, NULL) != 0)
        abort(); /* buffered lines would wait for a full buffer: better not start */
    pthread_attr_destroy(&attr);
}

static struct log_buffer *thread_buffer(void)
{
    if (this_buffer)
        return this_buffer;
    pthread_once(&buffer_once, buffers_init);
    struct log_buffer *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    pthread_mutex_init(&b->lock, NULL);
    pthread_setspecific(buffer_key, b);
    pthread_mutex_lock(&registry_lock);
    b->next = registry;
    registry = b;
    pthread_mutex_unlock(&registry_lock);
    this_buffer = b;
    return b;
}

void log_flush(void)
{
    pthread_mutex_lock(&registry_lock);
    for (struct log_buffer *b = registry; b; b = b->next) {
        pthread_mutex_lock(&b->lock);
        buffer_write(b);
        pthread_mutex_unlock(&b->lock);
    }
    pthread_mutex_unlock(&registry_lock);
}

/* Writes one formatted line, through this thread's buffer when buffered. */
static void emit(const char *out, size_t k, int buffered)
{
    struct log_buffer *b = this_buffer;
    if (buffered && !b)
        b = thread_buffer();
    if (!b) {
        ssize_t w = write(STDERR_FILENO, out, k);
        (void)w;
        return;
    }
    pthread_mutex_lock(&b->lock);
    if (!buffered || b->len + k > sizeof b->text)
        buffer_write(b);
    if (buffered && k <= sizeof b->text) {
        memcpy(b->text + b->len, out, k);
        b->len += k;
    } else {
        ssize_t w = write(STDERR_FILENO, out, k);
        (void)w;
    }
    pthread_mutex_unlock(&b->lock);
}

static void log_vmsg_to(enum log_level level, int buffered, const char *fmt, va_list ap)
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
    emit(out, k, buffered);
}

static void log_vmsg(enum log_level level, const char *fmt, va_list ap)
{
    log_vmsg_to(level, 0, fmt, ap);
}

void log_buffered(enum log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vmsg_to(level, 1, fmt, ap);
    va_end(ap);
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
