/* notices.c: the mail a renter gets about their account without asking
 * (their instances stopped because the funds ran out), queued in the
 * outbox in the transaction that made the change, so that it is sent
 * exactly when the change commits; and the base URL mail links name. */
#include "domain/domain.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void public_base_url(char *out, size_t n)
{
    if (daemon_config->public_url[0])
        snprintf(out, n, "%s", daemon_config->public_url);
    else
        snprintf(out, n, "%s://%s", daemon_config->tls_cert[0] ? "https" : "http", daemon_config->listen);
    size_t len = strlen(out);
    while (len > 0 && out[len - 1] == '/')
        out[--len] = '\0';
}

/* At most this many instances are named one per line; the rest are
 * counted, so a renter with hundreds stopped gets a mail of bounded size. */
#define NOTICE_LISTED 50

void notice_stopped_init(struct notice_stopped *n)
{
    memset(n, 0, sizeof *n);
}

int notice_stopped_add(struct notice_stopped *n, const char *id, const char *name)
{
    n->count++;
    if (n->count > NOTICE_LISTED)
        return 0;
    char line[ID_MAX + 80];
    int len = name[0] ? snprintf(line, sizeof line, "  %s (%s)\n", id, name) : snprintf(line, sizeof line, "  %s\n", id);
    if (len < 0)
        return -1;
    char *grown = realloc(n->lines, n->len + (size_t)len + 1);
    if (!grown)
        return -1;
    memcpy(grown + n->len, line, (size_t)len + 1);
    n->lines = grown;
    n->len += (size_t)len;
    return 0;
}

void notice_stopped_free(struct notice_stopped *n)
{
    free(n->lines);
    notice_stopped_init(n);
}

int notice_stopped_for_funds(struct store *s, const char *user_id, const struct notice_stopped *n, const char *ran_out_at,
                             int64_t now)
{
    if (n->count == 0)
        return STORE_OK;
    struct user u;
    int rc = store_user_get(s, user_id, &u);
    if (rc != STORE_OK)
        return rc;
    char base[300], more[64] = "";
    public_base_url(base, sizeof base);
    if (n->count > NOTICE_LISTED)
        snprintf(more, sizeof more, "  and %zu more\n", n->count - NOTICE_LISTED);
    char *body = NULL;
    if (asprintf(&body,
                 "Your gpurent funds ran out at %s, so your instances were stopped\n"
                 "then; nothing is charged for them after it. Their volumes are kept.\n"
                 "\n"
                 "%s%s"
                 "\n"
                 "To run them again, add funds (a top-up or an invite code) and start\n"
                 "each one, in the console or with:\n"
                 "\n"
                 "  curl -X POST %s/v1/instances/INSTANCE_ID/start -H \"Authorization: Bearer $KEY\"\n"
                 "\n"
                 "Your balance and what your running instances cost an hour:\n"
                 "\n"
                 "  curl %s/v1/balance -H \"Authorization: Bearer $KEY\"\n",
                 ran_out_at, n->lines ? n->lines : "", more, base, base) < 0)
        return STORE_ERROR;
    const char *to = u.email_display[0] ? u.email_display : u.email;
    char subject[96];
    snprintf(subject, sizeof subject, "Funds ran out: %zu gpurent instance%s stopped", n->count, n->count == 1 ? "" : "s");
    rc = store_outbox_insert(s, u.id, to, subject, body, now);
    free(body);
    return rc;
}
