/* cli.c: the subcommands that work on the database directly, for operators
 * and scripts: `gpurentd migrate` and `gpurentd admin create-user`. */
#include "domain/ledger.h"
#include "gpurent/clock.h"
#include "gpurent/money.h"
#include "gpurentd.h"
#include "store/store.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct store *cli_open_readonly(const struct daemon_conf *conf)
{
    char err[1024];
    struct store *s = store_open_readonly(conf->database, err, sizeof err);
    if (!s)
        fprintf(stderr, "gpurentd: %s\n", err);
    return s;
}

/* Opens the configured database and brings it to target (0 = latest). */
static struct store *open_migrated(const struct daemon_conf *conf, int target)
{
    char err[1024];
    struct store *s = store_open(conf->database, err, sizeof err);
    if (!s) {
        fprintf(stderr, "gpurentd: %s\n", err);
        return NULL;
    }
    if (store_migrate(s, target, err, sizeof err) < 0) {
        fprintf(stderr, "gpurentd: %s\n", err);
        store_close(s);
        return NULL;
    }
    return s;
}

int cmd_migrate(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"db",     required_argument, NULL, 'D'},
        {"to",     required_argument, NULL, 't'},
        {"help",   no_argument,       NULL, 'h'},
        {NULL,     0,                 NULL, 0  },
    };
    const char *file = NULL, *db = NULL;
    int target = 0, opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            file = optarg;
            break;
        case 'D':
            db = optarg;
            break;
        case 't': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v < 1 || v > 9999) {
                fprintf(stderr, "gpurentd migrate: --to takes a version from 1 to 9999\n");
                return 2;
            }
            target = (int)v;
            break;
        }
        case 'h':
            printf("usage: gpurentd migrate [-c FILE] [--db PATH] [--to VERSION]\n"
                   "Creates the database if needed and applies the migrations this binary carries\n"
                   "(all of them, or up to VERSION), each in its own transaction.\n");
            return 0;
        default:
            return 2;
        }
    }
    struct daemon_conf conf;
    if (optind < argc) {
        fprintf(stderr, "gpurentd migrate: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (daemon_load_db_config(&conf, file, db) < 0)
        return 1;
    struct store *s = open_migrated(&conf, target);
    if (!s)
        return 1;
    printf("database %s is at schema version %d (this binary knows up to %d)\n", conf.database, store_schema_version(s),
           store_latest_version());
    store_close(s);
    return 0;
}

static int read_password_stdin(char *out, size_t n)
{
    if (!fgets(out, (int)n, stdin))
        return -1;
    out[strcspn(out, "\r\n")] = '\0';
    return strlen(out) >= 10 ? 0 : -1;
}

static int admin_create_user(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config",         required_argument, NULL, 'c'},
        {"db",             required_argument, NULL, 'D'},
        {"email",          required_argument, NULL, 'e'},
        {"admin",          no_argument,       NULL, 'a'},
        {"password-stdin", no_argument,       NULL, 'p'},
        {"help",           no_argument,       NULL, 'h'},
        {NULL,             0,                 NULL, 0  },
    };
    const char *file = NULL, *db = NULL, *email = NULL;
    int admin = 0, with_password = 0, opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            file = optarg;
            break;
        case 'D':
            db = optarg;
            break;
        case 'e':
            email = optarg;
            break;
        case 'a':
            admin = 1;
            break;
        case 'p':
            with_password = 1;
            break;
        case 'h':
            printf(
                "usage: gpurentd admin create-user [-c FILE] [--db PATH] --email EMAIL [--admin] [--password-stdin]\n"
                "Creates an account and prints a new API key for it alone on the last line.\n"
                "With --password-stdin the first line of standard input becomes its password\n"
                "(10 characters or more); otherwise it can only use API keys.\n");
            return 0;
        default:
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "gpurentd admin create-user: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    if (!email) {
        fprintf(stderr, "gpurentd admin create-user: --email is required (see --help)\n");
        return 2;
    }
    struct daemon_conf conf;
    if (daemon_load_db_config(&conf, file, db) < 0)
        return 1;
    daemon_config = &conf;
    struct user u = {.role = admin ? ROLE_ADMIN : ROLE_USER, .active = 1};
    const char *why;
    if (account_email_normalize(email, u.email, sizeof u.email, &why) < 0) {
        fprintf(stderr, "gpurentd: --email: %s\n", why);
        return 2;
    }
    if (with_password) {
        char pw[257];
        if (read_password_stdin(pw, sizeof pw) < 0) {
            fprintf(stderr, "gpurentd: the password on standard input must be 10 to 256 characters\n");
            return 2;
        }
        if (password_hash(pw, conf.password_iterations, u.password_hash) < 0)
            return 1;
    }
    struct store *s = open_migrated(&conf, 0);
    if (!s)
        return 1;
    char key_id[ID_MAX], token[API_TOKEN_LEN + 1];
    int rc = account_create(s, &u, "admin-cli", key_id, token);
    if (rc == STORE_CONFLICT) {
        store_close(s);
        fprintf(stderr, "gpurentd: an account with email %s already exists\n", u.email);
        return 1;
    }
    if (rc != STORE_OK) {
        store_close(s);
        fprintf(stderr, "gpurentd: cannot create the account\n");
        return 1;
    }
    printf("created %s %s (%s) with API key %s; the key follows, shown once:\n%s\n", admin ? "admin" : "user", u.id,
           u.email, key_id, token);
    secret_wipe(token, sizeof token);
    /* A key nobody saw must not stay valid: one that could not be written
     * out (a full disk, a closed pipe) is revoked. */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        int revoked = store_api_key_revoke(s, u.id, key_id, clock_now()) == STORE_OK;
        fprintf(stderr,
                "gpurentd: the new key could not be written to standard output, so it %s; the account %s exists"
                "%s\n",
                revoked ? "was revoked" : "could NOT be revoked (revoke it from another admin's key)", u.email,
                with_password ? ": log in with its password for a key" : " without a key: create another account");
        store_close(s);
        return 1;
    }
    store_close(s);
    return 0;
}

int cmd_admin(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "create-user") == 0)
        return admin_create_user(argc - 1, argv + 1);
    FILE *f = argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) ? stdout : stderr;
    fprintf(f, "usage: gpurentd admin create-user --email EMAIL [--admin] [--db PATH] [-c FILE]\n");
    return f == stdout ? 0 : 2;
}

static void ledger_usage(FILE *f)
{
    fprintf(f, "usage: gpurentd ledger verify [-c FILE] [--db PATH]\n"
               "Checks every ledger invariant: each transaction balances, cached balances equal\n"
               "the sums of postings, no user account ever below zero, grants never overspent,\n"
               "intervals charged exactly their tariff. Exits 1 on any breach.\n");
}

int cmd_ledger(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "verify") != 0) {
        int help = argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0);
        ledger_usage(help ? stdout : stderr);
        return help ? 0 : 2;
    }
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"db",     required_argument, NULL, 'D'},
        {"help",   no_argument,       NULL, 'h'},
        {NULL,     0,                 NULL, 0  },
    };
    const char *file = NULL, *db = NULL;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc - 1, argv + 1, "c:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            file = optarg;
            break;
        case 'D':
            db = optarg;
            break;
        case 'h':
            ledger_usage(stdout);
            return 0;
        default:
            return 2;
        }
    }
    struct daemon_conf conf;
    if (daemon_load_db_config(&conf, file, db) < 0)
        return 1;
    struct store *s = cli_open_readonly(&conf);
    if (!s)
        return 1;
    /* The checks read this binary's schema: an older backup fails them with
     * "no such column", which says nothing of why. */
    int version = store_schema_version(s), latest = store_latest_version();
    if (version != latest) {
        fprintf(stderr,
                "gpurentd ledger verify: %s is at schema %d, this gpurentd's is %d: %s\n", conf.database, version,
                latest,
                version < latest ? "migrate a copy first (gpurentd migrate --db COPY) and verify that"
                                 : "use the gpurentd that wrote it");
        store_close(s);
        return 1;
    }
    int breaches = ledger_verify(s, stdout);
    struct money_totals m;
    int totals = breaches == 0 ? store_metrics_money(s, &m) : STORE_OK;
    if (breaches == 0 && totals != STORE_OK) {
        /* Every check passed, yet the totals' sums failed (overflowed):
         * not a ledger to call OK. */
        printf("breach: the totals cannot be computed: a sum overflows 64-bit integers or the read failed\n");
        breaches = 1;
    } else if (breaches == 0) {
        /* The sums the reports must agree with, for people and for tests. */
        char a[MONEY_FMT_LEN], b[MONEY_FMT_LEN], c[MONEY_FMT_LEN], d[MONEY_FMT_LEN], e[MONEY_FMT_LEN], f[MONEY_FMT_LEN],
            g[MONEY_FMT_LEN], h[MONEY_FMT_LEN], k[MONEY_FMT_LEN];
        printf("totals: revenue %s, credits granted %s, credits spent %s, credits expired %s, credit outstanding %s,"
               " top-ups %s, cash held %s, refunds %s, credits refunded %s\n",
               money_format(m.revenue, a), money_format(m.credits_granted, b), money_format(m.credits_spent, c),
               money_format(m.credits_expired, d), money_format(m.credit_outstanding, e), money_format(m.topups, f),
               money_format(m.cash_held, g), money_format(m.refunds, h), money_format(m.credits_refunded, k));
        /* A line of its own, so that the one above keeps its form. */
        printf("storage totals: revenue %s, credits spent %s\n", money_format(m.storage_revenue, a),
               money_format(m.storage_credits_spent, b));
        printf("reservation totals: paid %s, refunded %s, credits spent %s, credits refunded %s\n",
               money_format(m.reservation_revenue, a), money_format(m.reservation_refunds, b),
               money_format(m.reservation_credits_spent, c), money_format(m.reservation_credits_refunded, d));
    }
    store_close(s);
    if (breaches < 0) {
        fprintf(stderr, "gpurentd: the ledger could not be checked\n");
        return 1;
    }
    if (breaches > 0) {
        printf("ledger verify: %d breaches\n", breaches);
        return 1;
    }
    printf("ledger OK\n");
    return 0;
}
