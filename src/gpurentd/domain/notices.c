/* notices.c: the mail a renter gets about their account without asking
 * (their funds running low, their instances stopped because the funds ran
 * out), queued in the outbox in the transaction that made the change, so
 * that it is sent exactly when the change commits; and the base URL mail
 * links name. */
#include "domain/domain.h"
#include "domain/ledger.h"
#include "gpurent/money.h"
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
    /* A label is the renter's own text: a control character in it could
     * forge lines of the mail (or, a bare CR, upset its transport). The
     * label and the id are clipped to what the API takes, so the length
     * snprintf returns is what it wrote. */
    char label[64];
    size_t k = 0;
    for (const unsigned char *c = (const unsigned char *)name; *c && k + 1 < sizeof label; c++)
        label[k++] = *c < 0x20 || *c == 0x7f ? '?' : (char)*c;
    label[k] = '\0';
    char line[ID_MAX + 80];
    int len = label[0] ? snprintf(line, sizeof line, "  %.31s (%s)\n", id, label)
                       : snprintf(line, sizeof line, "  %.31s\n", id);
    if (len < 0 || (size_t)len >= sizeof line)
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

int notice_low_balance(struct store *s, const char *user_id, int64_t now)
{
    int noticed, low;
    int64_t burn, minutes;
    struct funds f;
    int rc = store_user_low_balance_noticed(s, user_id, &noticed);
    if (rc != STORE_OK || noticed)
        return rc;
    /* Only running cards stop when the funds run out: storage alone is
     * owed and kept, and whoever's instances just stopped for want of funds
     * has had the mail that says so. */
    int64_t cards = store_user_burn_rate(s, user_id, now);
    if (cards <= 0)
        return cards < 0 ? (int)cards : STORE_OK;
    if ((rc = ledger_runway(s, user_id, now, &f, &burn, &minutes, &low)) != STORE_OK || !low)
        return rc;
    struct user u;
    if ((rc = store_user_get(s, user_id, &u)) != STORE_OK)
        return rc;
    char base[300], left[MONEY_FMT_LEN], rate[MONEY_FMT_LEN];
    public_base_url(base, sizeof base);
    char *body = NULL;
    if (asprintf(&body,
                 "At what your instances and volumes cost now (%s %s an hour), your gpurent\n"
                 "funds (%s %s) last about %lld more minutes.\n"
                 "\n"
                 "When they run out, your running instances are stopped and billing ends;\n"
                 "their volumes are kept. To keep them running, add funds (a top-up or an\n"
                 "invite code) before then.\n"
                 "\n"
                 "Your balance, burn rate and runway:\n"
                 "\n"
                 "  curl %s/v1/balance -H \"Authorization: Bearer $KEY\"\n"
                 "\n"
                 "This is the only such mail until money comes in again.\n",
                 money_format(burn, rate), daemon_config->currency, money_format(f.available, left),
                 daemon_config->currency, (long long)minutes, base) < 0)
        return STORE_ERROR;
    const char *to = u.email_display[0] ? u.email_display : u.email;
    char subject[96];
    snprintf(subject, sizeof subject, "Low balance: your gpurent funds last about %lld minutes", (long long)minutes);
    rc = store_outbox_insert(s, u.id, to, subject, body, now);
    free(body);
    return rc == STORE_OK ? store_user_set_low_balance_noticed(s, user_id, now) : rc;
}
