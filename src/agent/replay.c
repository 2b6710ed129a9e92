/* replay.c: keeps a signed request from being accepted twice across an
 * agent restart. The nonce cache (sign.c) lives in memory and a timestamp is
 * fresh for max_clock_skew_s either way, so a request captured just before a
 * restart could otherwise be replayed once after it. Two rules close that:
 *
 *   - a request dated at or before the second this run took the state
 *     directory is refused: the previous run, which held the directory until
 *     it exited, can only have accepted requests dated up to its own clock,
 *     unless they were dated in the future, hence
 *   - a request dated after the agent's clock (the control plane's clock is
 *     ahead) is accepted only once its timestamp is on disk
 *     (state_dir/replay-mark, fsynced); the next run refuses everything dated
 *     up to that mark.
 *
 * The cost: after a restart, a control plane whose clock lags the agent's is
 * refused for at most that lag; one dated in the future holds the floor at
 * its timestamp; and the agent waits up to a second before listening, so
 * that no request dated in its start second can be refused. A clock that
 * steps back across a restart reopens the gap by the size of the step. */
#include "agent.h"
#include "gpurent/clock.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MARK_FILE "replay-mark"

/* Reads the mark: 1 with *mark, 0 when there is none, -1 when the file
 * exists but cannot be read or holds no number. */
static int mark_load(const char *state_dir, int64_t *mark)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", state_dir, MARK_FILE);
    size_t len = 0;
    char *text = state_read_file(path, 64, &len);
    if (!text)
        return errno == ENOENT ? 0 : -1;
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    int ok = end != text && (*end == '\0' || *end == '\n') && errno == 0 && v >= 0;
    free(text);
    if (!ok)
        return -1;
    *mark = v;
    return 1;
}

int agent_replay_init(struct agent *a)
{
    const struct agent_conf *c = a->conf;
    int64_t mark = 0;
    pthread_mutex_init(&a->mark_lock, NULL);
    a->started_wall = clock_wall();
    a->signed_floor = a->started_wall + 1;
    int rc = mark_load(c->state_dir, &mark);
    if (rc < 0) {
        /* Fail closed: nothing the previous run could have accepted. */
        a->signed_floor = a->started_wall + c->max_clock_skew_s + 1;
        log_warn("cannot read %s/%s; refusing signed requests dated before %" PRId64
                 " (max_clock_skew_s from now) in case the previous run accepted them",
                 c->state_dir, MARK_FILE, a->signed_floor);
    } else if (rc > 0) {
        a->future_mark = mark;
        if (mark + 1 > a->signed_floor) {
            a->signed_floor = mark + 1;
            log_warn("the previous run accepted a request dated %" PRId64 ", %" PRId64
                     "s ahead of this clock; refusing signed requests dated before %" PRId64,
                     mark, mark - a->started_wall, a->signed_floor);
        }
    }
    log_info("signed requests dated before %" PRId64 " are refused: they may predate this start", a->signed_floor);
    return 0;
}

void agent_replay_wait(struct agent *a)
{
    /* Requests dated in the start second are refused; wait it out before
     * listening so that a control plane with the same clock never sees it. */
    while (clock_wall() <= a->started_wall) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        /* To the next second, or a millisecond at a time once there:
         * time(2) may trail CLOCK_REALTIME by a tick. */
        struct timespec left = {.tv_sec = 0, .tv_nsec = 1000000};
        if ((int64_t)now.tv_sec <= a->started_wall)
            left.tv_nsec = 1000000000L - now.tv_nsec;
        nanosleep(&left, NULL);
    }
}

void agent_replay_free(struct agent *a)
{
    pthread_mutex_destroy(&a->mark_lock);
}

enum replay_verdict agent_replay_check(struct agent *a, const char *timestamp, int64_t now)
{
    char *end;
    errno = 0;
    long long ts = timestamp ? strtoll(timestamp, &end, 10) : -1;
    /* sign_verify accepted the header, so this cannot fail; still fail closed. */
    if (!timestamp || end == timestamp || *end || errno)
        return REPLAY_BEFORE_START;
    if (ts < a->signed_floor)
        return REPLAY_BEFORE_START;
    if (ts <= now)
        return REPLAY_OK;
    enum replay_verdict v = REPLAY_OK;
    pthread_mutex_lock(&a->mark_lock);
    if (ts > a->future_mark) {
        char text[32];
        int n = snprintf(text, sizeof text, "%lld\n", ts);
        if (state_write_atomic(a->conf->state_dir, MARK_FILE, text, (size_t)n, 0600) == 0) {
            a->future_mark = ts;
        } else {
            log_error("cannot write %s/%s: %s; refusing requests dated ahead of this clock", a->conf->state_dir,
                      MARK_FILE, strerror(errno));
            v = REPLAY_UNAVAILABLE;
        }
    }
    pthread_mutex_unlock(&a->mark_lock);
    return v;
}
