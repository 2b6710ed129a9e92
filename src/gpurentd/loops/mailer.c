/* mailer.c: sends the mail the outbox holds (verification codes, queued in
 * the sign-up's own transaction) on its own thread, so no request waits on
 * an SMTP server and a crash loses nothing: a mail stays in the outbox
 * until the server took it, and a failed try is retried with a growing
 * backoff. Without smtp_url the mail is written to the log instead, clearly
 * marked, so a development set-up works without a mail server. */
#include "gpurent/clock.h"
#include "gpurent/secrets.h"
#include "gpurent/smtp.h"
#include "loops/loops.h"
#include "store/store.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAILER_POLL_MS 1000
#define MAILER_MAX_ATTEMPTS 12   /* about 17 hours of tries at the backoff below */
#define MAILER_BACKOFF_S 30      /* after the first failure; doubles each time */
#define MAILER_BACKOFF_MAX_S 3600
#define SMTP_TIMEOUT_MS 30000

static struct bg_loop loop = BG_LOOP_INIT("mailer");
static char smtp_user[256], smtp_password[256];
static enum smtp_tls smtp_tls_mode;
static atomic_llong mail_sent, mail_failures, mail_given_up;

void mailer_counters(int64_t *sent, int64_t *failures, int64_t *given_up)
{
    *sent = atomic_load(&mail_sent);
    *failures = atomic_load(&mail_failures);
    *given_up = atomic_load(&mail_given_up);
}

/* Reads "user:password" from path, refusing a file others may read, as
 * every secret file is (secret_file_read; the configuration's check, for
 * -n, is the same). */
static int read_credentials(const char *path)
{
    char line[600] = "", err[512];
    if (secret_file_read(path, line, sizeof line, err, sizeof err) < 0) {
        log_error("smtp_credentials_file: %s", err);
        return -1;
    }
    char *colon = strchr(line, ':');
    int ok = colon && colon > line && strlen(line) < sizeof smtp_user && strlen(colon + 1) < sizeof smtp_password;
    if (ok) {
        *colon = '\0';
        memcpy(smtp_user, line, strlen(line) + 1); /* lengths checked above */
        memcpy(smtp_password, colon + 1, strlen(colon + 1) + 1);
    } else {
        log_error("smtp_credentials_file %s: must hold one line user:password", path);
    }
    memset(line, 0, sizeof line);
    return ok ? 0 : -1;
}

/* The mail without a server: the code line (what a person needs) on one
 * log line anyone can find, the whole text after it. */
static void log_unsent(const struct outbox_mail *m)
{
    const char *code = strstr(m->body, "verification code: ");
    if (code) {
        code += strlen("verification code: ");
        int n = (int)strcspn(code, "\n ");
        log_warn("E-MAIL NOT SENT (no smtp_url): verify %s with code %.*s "
                 "(POST /v1/verify-email {\"token\": \"%.*s\"})",
                 m->to, n, code, n, code);
    } else {
        log_warn("E-MAIL NOT SENT (no smtp_url): to %s, subject \"%s\"", m->to, m->subject);
    }
}

struct outcome_ctx {
    int64_t id, next_at, at;
    int sent, failed;
    const char *error;
};

static int outcome_txn(struct store *s, void *vctx)
{
    struct outcome_ctx *c = vctx;
    return c->sent ? store_outbox_sent(s, c->id, c->at)
                   : store_outbox_retry(s, c->id, c->next_at, c->failed, c->at, c->error);
}

/* Sends or logs one mail and records what happened. */
static int deliver(struct store *s, const struct outbox_mail *m, int64_t now)
{
    char err[512] = "";
    int ok;
    if (!daemon_config->smtp_url[0]) {
        log_unsent(m);
        ok = 1;
    } else {
        struct smtp_server srv = {.url = daemon_config->smtp_url,
                                  .from = daemon_config->smtp_from,
                                  .user = smtp_user,
                                  .password = smtp_password,
                                  .tls = smtp_tls_mode,
                                  .timeout_ms = SMTP_TIMEOUT_MS};
        ok = smtp_send(&srv, m->to, m->subject, m->body, err, sizeof err) == 0;
    }
    struct outcome_ctx c = {.id = m->id, .at = now, .sent = ok, .error = err};
    if (ok) {
        atomic_fetch_add(&mail_sent, 1);
        log_info("mailer: mail %lld to %s %s", (long long)m->id, m->to, daemon_config->smtp_url[0] ? "sent" : "logged");
    } else {
        atomic_fetch_add(&mail_failures, 1);
        int64_t tries = m->attempts + 1, backoff = MAILER_BACKOFF_S;
        for (int64_t i = 1; i < tries && backoff < MAILER_BACKOFF_MAX_S; i++)
            backoff *= 2;
        if (backoff > MAILER_BACKOFF_MAX_S)
            backoff = MAILER_BACKOFF_MAX_S;
        c.failed = tries >= MAILER_MAX_ATTEMPTS;
        c.next_at = now + backoff;
        if (c.failed) {
            atomic_fetch_add(&mail_given_up, 1);
            log_error("mailer: giving up on mail %lld to %s after %lld tries: %s", (long long)m->id, m->to,
                      (long long)tries, err);
        } else {
            log_warn("mailer: mail %lld to %s failed (try %lld; next in %llds): %s", (long long)m->id, m->to,
                     (long long)tries, (long long)backoff, err);
        }
    }
    return store_txn(s, outcome_txn, &c);
}

static void *mailer_main(void *arg)
{
    (void)arg;
    struct store *s = store_thread();
    for (;;) {
        int64_t now = clock_now();
        struct outbox_mail m;
        /* Each mail due now, oldest first; a failing server moves each
         * mail's next try later, so the pass ends. */
        while (s && !loop_stopping(&loop) && store_outbox_next(s, now, &m) == STORE_OK) {
            int rc = deliver(s, &m, now);
            free(m.body);
            if (rc != STORE_OK)
                break;
        }
        if (loop_sleep(&loop, MAILER_POLL_MS))
            return NULL;
    }
}

int mailer_start(void)
{
    smtp_tls_parse(daemon_config->smtp_tls, &smtp_tls_mode);
    if (daemon_config->smtp_credentials_file[0] && read_credentials(daemon_config->smtp_credentials_file) < 0)
        return -1;
    if (daemon_config->smtp_url[0])
        log_info("mailer: sending mail through %s (TLS %s)%s", daemon_config->smtp_url, daemon_config->smtp_tls,
                 smtp_user[0] ? " with AUTH" : "");
    else
        log_warn("mailer: no smtp_url: verification mail is written to this log (look for 'E-MAIL NOT SENT')");
    return loop_start(&loop, mailer_main);
}

void mailer_wake(void)
{
    loop_wake(&loop);
}

void mailer_stop(void)
{
    loop_stop(&loop);
    memset(smtp_password, 0, sizeof smtp_password);
}
