/* config.c: gpurentd's option table: every option's type, bounds and default
 * in one place, read by conf.c from conf/gpurentd.conf and flags. */
#include "gpurent/money.h"
#include "gpurent/secrets.h"
#include "gpurent/smtp.h"
#include "gpurentd.h"

#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct daemon_conf *daemon_config;

/* Validators see only the value, so each names its option in the message:
 * a command-line override has no FILE:LINE to point at it. */
static int require_nonempty(const char *name, const void *field, char *err, size_t errlen)
{
    if (!((const char *)field)[0]) {
        snprintf(err, errlen, "%s: value must not be empty", name);
        return -1;
    }
    return 0;
}

static int validate_database(const void *field, char *err, size_t errlen)
{
    return require_nonempty("database", field, err, errlen);
}

/* Checked here, not only when the first admin is made, so that -n finds it. */
static int validate_admin_email(const void *field, char *err, size_t errlen)
{
    char email[sizeof ((struct user *)0)->email];
    const char *why;
    if (account_email_normalize(field, email, sizeof email, &why) < 0) {
        snprintf(err, errlen, "bootstrap_admin_email: %s", why);
        return -1;
    }
    return 0;
}

/* "alias=domain" pairs, comma-separated: each side a domain's characters. */
static int validate_domain_aliases(const void *field, char *err, size_t errlen)
{
    for (const char *p = field; *p;) {
        while (*p == ',' || *p == ' ')
            p++;
        size_t n = strcspn(p, ", "), eq = strcspn(p, "=");
        int ok = n > 0 && eq > 0 && eq + 1 < n;
        for (size_t i = 0; ok && i < n; i++)
            ok = i == eq || isalnum((unsigned char)p[i]) || p[i] == '.' || p[i] == '-';
        if (n && !ok) {
            snprintf(err, errlen, "email_domain_aliases: '%.*s' is not alias=domain", (int)n, p);
            return -1;
        }
        p += n;
    }
    return 0;
}

/* Every volume needs its own source, so the template must name the volume. */
static int validate_volume_source(const void *field, char *err, size_t errlen)
{
    if (!strstr(field, "{volume_id}")) {
        snprintf(err, errlen, "volume_source_template: must contain {volume_id}");
        return -1;
    }
    return 0;
}

static int validate_metrics_listen(const void *field, char *err, size_t errlen)
{
    char host[128];
    int port;
    if (((const char *)field)[0] && conf_parse_hostport(field, host, sizeof host, &port) < 0) {
        snprintf(err, errlen, "metrics_listen: '%s' is not HOST:PORT", (const char *)field);
        return -1;
    }
    return 0;
}

static int validate_image_policy(const void *field, char *err, size_t errlen)
{
    if (strcmp(field, "catalog") != 0 && strcmp(field, "registries") != 0) {
        snprintf(err, errlen, "image_policy: '%s' is not catalog or registries", (const char *)field);
        return -1;
    }
    return 0;
}

static int validate_image_registries(const void *field, char *err, size_t errlen)
{
    char bad[256];
    if (!image_registries_valid(field, bad, sizeof bad)) {
        snprintf(err, errlen, "image_registries: '%s' is not a registry host[:port]", bad);
        return -1;
    }
    return 0;
}

static int validate_currency(const void *field, char *err, size_t errlen)
{
    const char *c = field;
    if (strlen(c) != 3 || strspn(c, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != 3) {
        snprintf(err, errlen, "currency: '%s' is not a three-letter code such as CNY", c);
        return -1;
    }
    return 0;
}

/* No money option may be set above 10^12 yuan (10^18 micro-units): INT64_MAX
 * is about 9.22 x 10^18 micro, so a balance at max_balance plus a top-up or
 * grant at its maximum, or even nine balances at the cap added up, still fit
 * in int64_t, and every check made on them is exact. Prices stop lower, at
 * 10^6 yuan per card-hour, because billing multiplies a price by up to 256
 * cards and by seconds: at that cap one instance of 256 cards runs for more
 * than four years before its charge could pass INT64_MAX. */
#define MONEY_OPTION_CAP (INT64_C(1000000000000) * MONEY_UNIT)
#define PRICE_OPTION_CAP (INT64_C(1000000) * MONEY_UNIT)

/* A money option: an amount in the platform currency, at most cap. */
static int check_amount(const char *name, const void *field, int64_t cap, char *err, size_t errlen)
{
    int64_t v;
    char a[MONEY_FMT_LEN];
    if (money_parse(field, &v) != MONEY_OK) {
        snprintf(err, errlen, "%s: '%s' is not an amount such as 10.00 (up to 6 decimals, no sign)", name,
                 (const char *)field);
        return -1;
    }
    if (v > cap) {
        snprintf(err, errlen, "%s: %s is over %s, the most this option may be (so that sums of amounts stay exact)",
                 name, (const char *)field, money_format(cap, a));
        return -1;
    }
    return 0;
}

static int validate_signup_credit(const void *field, char *err, size_t errlen)
{
    return check_amount("signup_credit", field, MONEY_OPTION_CAP, err, errlen);
}

static int validate_max_price(const void *field, char *err, size_t errlen)
{
    return check_amount("max_price_per_card_hour", field, PRICE_OPTION_CAP, err, errlen);
}

static int validate_max_storage_price(const void *field, char *err, size_t errlen)
{
    return check_amount("max_price_per_gb_month", field, PRICE_OPTION_CAP, err, errlen);
}

static int validate_max_app_price(const void *field, char *err, size_t errlen)
{
    return check_amount("max_app_price", field, PRICE_OPTION_CAP, err, errlen);
}

static int validate_max_topup(const void *field, char *err, size_t errlen)
{
    return check_amount("max_topup", field, MONEY_OPTION_CAP, err, errlen);
}

static int validate_max_grant(const void *field, char *err, size_t errlen)
{
    return check_amount("max_grant", field, MONEY_OPTION_CAP, err, errlen);
}

static int validate_max_balance(const void *field, char *err, size_t errlen)
{
    return check_amount("max_balance", field, MONEY_OPTION_CAP, err, errlen);
}

/* Both lists are matched as text by http.c, so a word that could never match
 * is refused here rather than found out when a browser or a proxy fails. */
static int validate_cors_origins(const void *field, char *err, size_t errlen)
{
    return conf_check_origin_list("cors_origins", field, err, errlen);
}

static int validate_trusted_proxies(const void *field, char *err, size_t errlen)
{
    return conf_check_address_list("trusted_proxies", field, err, errlen);
}

static int validate_smtp_url(const void *field, char *err, size_t errlen)
{
    const char *u = field;
    if (u[0] && strncmp(u, "smtp://", 7) != 0 && strncmp(u, "smtps://", 8) != 0) {
        snprintf(err, errlen, "smtp_url: '%s' must start with smtp:// or smtps://", u);
        return -1;
    }
    return 0;
}

/* An http(s) base URL users are shown or a browser's Origin is compared
 * with (public_url, gateway_public_url): nothing that would break the URLs
 * built from it. Empty is allowed (the option is off). */
static int check_base_url(const char *name, const char *u, char *err, size_t errlen)
{
    const char *host = strncmp(u, "https://", 8) == 0 ? u + 8 : strncmp(u, "http://", 7) == 0 ? u + 7 : NULL;
    if (!u[0])
        return 0;
    int bad_char = 0;
    for (const char *p = u; *p; p++)
        bad_char |= (unsigned char)*p <= ' ' || *p == 0x7f || strchr("\"<>\\^`{|}?#", *p) != NULL;
    if (!host || !host[0] || host[0] == '/' || bad_char || strlen(u) > 200) {
        snprintf(err, errlen,
                 "%s: '%s' is not an http:// or https:// base URL such as https://gpu.example.com "
                 "(no query, fragment or spaces; at most 200 characters)",
                 name, u);
        return -1;
    }
    return 0;
}

static int validate_public_url(const void *field, char *err, size_t errlen)
{
    return check_base_url("public_url", field, err, errlen);
}

static int validate_gateway_public_url(const void *field, char *err, size_t errlen)
{
    return check_base_url("gateway_public_url", field, err, errlen);
}

static int validate_smtp_from(const void *field, char *err, size_t errlen)
{
    const char *f = field;
    if (!strchr(f, '@') || strpbrk(f, " <>\r\n\t")) {
        snprintf(err, errlen, "smtp_from: '%s' is not a bare address like gpurent@example.com", f);
        return -1;
    }
    return 0;
}

static int validate_smtp_tls(const void *field, char *err, size_t errlen)
{
    enum smtp_tls t;
    if (smtp_tls_parse(field, &t) < 0) {
        snprintf(err, errlen, "smtp_tls: '%s' must be none, starttls or required", (const char *)field);
        return -1;
    }
    return 0;
}

#define OPT_INT(n, lo, hi, d, h)                                                            \
    {                                                                                       \
#n, CONF_INT, lo, hi, #d, offsetof(struct daemon_conf, n), sizeof(int64_t), NULL, h \
    }
#define OPT_STR(n, d, v, h)                                                                                   \
    {                                                                                                         \
#n, CONF_STRING, 0, 0, d, offsetof(struct daemon_conf, n), sizeof(((struct daemon_conf *)0)->n), v, h \
    }

#define OPT_BOOL(n, d, h)                                                                 \
    {                                                                                     \
#n, CONF_BOOL, 0, 1, d, offsetof(struct daemon_conf, n), sizeof(int), NULL, h \
    }

const struct conf_option daemon_options[] = {
    OPT_STR(listen, "127.0.0.1:8080", conf_validate_listen, "address and port of the REST API"),
    OPT_STR(database, "/var/lib/gpurent/gpurent.db", validate_database, "SQLite database file"),
    OPT_STR(log_level, "info", conf_validate_log_level, "error, warn, info or debug"),
    OPT_INT(threads, 1, 256, 4, "HTTP worker threads"),
    OPT_INT(max_connections, 1, 100000, 1024, "open connections, all clients together"),
    OPT_INT(max_connections_per_client, 1, 100000, 64,
            "connections from one client address still sending a request's headers"),
    OPT_INT(connection_timeout_s, 1, 3600, 30, "seconds before an idle or slow connection is closed"),
    OPT_INT(header_timeout_s, 1, 3600, 10, "seconds a request's headers may take to arrive, trickled or not"),
    OPT_INT(body_min_rate, 0, 1073741824, 16384,
            "bytes per second a body must average: it may take header_timeout_s + max_body_bytes / this; 0 = no bound"),
    OPT_INT(max_body_bytes, 1024, 67108864, 1048576, "largest request body accepted"),
    OPT_INT(max_json_depth, 2, 64, 16, "deepest JSON nesting accepted"),
    OPT_STR(cors_origins, "", validate_cors_origins,
            "web console origins allowed by CORS, space-separated ('*' for any)"),
    OPT_STR(console_dir, "/usr/local/share/gpurent/console", NULL,
            "directory of the web console's files, served under /console/ (make install puts them there)"),
    OPT_STR(trusted_proxies, "", validate_trusted_proxies,
            "reverse proxies (IP addresses, space-separated) whose X-Forwarded-For names the client for login limits "
            "and logs"),
    OPT_STR(tls_cert, "", NULL, "PEM certificate file; empty serves plain HTTP"),
    OPT_STR(tls_key, "", NULL, "PEM private key file for tls_cert"),
    OPT_INT(password_iterations, 1000, 100000000, 600000, "PBKDF2-SHA256 rounds for new password hashes"),
    OPT_INT(login_max_failures, 1, 1000, 5, "failed logins per account or client before a lockout"),
    OPT_INT(login_lockout_s, 1, 86400, 900, "seconds a lockout lasts"),
    OPT_STR(bootstrap_admin_email, "admin@localhost", validate_admin_email,
            "first admin, created when the database has none"),
    OPT_INT(drain_timeout_s, 1, 600, 15, "seconds SIGTERM waits for requests in flight"),
    OPT_STR(clock_file, "", NULL, "TESTING ONLY: file holding the current time in epoch seconds"),
    OPT_INT(heartbeat_interval_ms, 100, 600000, 5000, "milliseconds between polls of every node agent"),
    OPT_INT(heartbeat_miss_limit, 1, 100, 3, "failed polls in a row before a node is unreachable"),
    OPT_INT(node_lost_after_s, 0, 604800, 600,
            "seconds an unreachable node may stay silent before it is offline and its instances are lost;"
            " 0: offline at once"),
    OPT_INT(agent_connect_timeout_ms, 50, 60000, 2000, "milliseconds to connect to an agent"),
    OPT_INT(agent_timeout_ms, 100, 600000, 5000, "milliseconds for a whole call to an agent"),
    OPT_INT(agent_max_response_bytes, 4096, 16777216, 1048576, "largest agent reply accepted"),
    OPT_INT(agent_put_wait_ms, 0, 1000, 50,
            "milliseconds an agent may hold a workload PUT's answer until it runs, a DELETE's until it is gone; 0: at once"),
    OPT_INT(agent_max_parallel, 1, 10000, 256, "agent connections open at once"),
    OPT_STR(agent_ca_file, "", NULL, "CA bundle that https agents' certificates must chain to; empty: system CAs"),
    OPT_INT(default_max_cards, 0, 100000, 64, "cards a user may hold at once unless an admin set a limit"),
    OPT_INT(default_max_volumes, 0, 100000, 10, "live volumes a user may hold unless an admin set another bound"),
    OPT_INT(default_max_volume_gb, 0, 1000000000, 20000,
            "GB a user's live volumes may hold together unless an admin set another bound"),
    OPT_INT(volume_default_size_gb, 1, 1048576, 100, "quota of a volume created without a size, GB"),
    OPT_STR(volume_source_template, "nfs-server:/export/gpurent/{volume_id}", validate_volume_source,
            "what agents mount for a volume; {volume_id} and {user_id} are replaced (e.g. "
            "nfs.example:/export/{volume_id})"),
    OPT_BOOL(volume_source_shared, "false",
             "a volume source that is a local path is the same shared directory on every node (else multi-node "
             "instances refuse it)"),
    OPT_INT(reconcile_interval_ms, 50, 600000, 2000, "milliseconds between reconciler passes when nothing wakes it"),
    OPT_INT(reconcile_sweep_ms, 100, 3600000, 30000,
            "milliseconds between checks of every agent for orphaned workloads"),
    OPT_INT(provision_timeout_s, 1, 86400, 900, "seconds a provisioning attempt may take before it fails"),
    OPT_INT(provision_max_attempts, 1, 100, 3, "failed provisioning attempts before an instance fails"),
    OPT_INT(master_port, 1, 65535, 29500, "MASTER_PORT given to multi-node jobs"),
    OPT_INT(max_runtime_warning_minutes, 1, 1440, 10,
            "minutes before max_runtime_minutes runs out that the max_runtime_warning event is written"),
    OPT_INT(rendezvous_timeout_s, 30, 3600, 600,
            "seconds a multi-node instance may take from its first rank running to its last, unless it sets its own"),
    /* Reservations (issue 16). */
    OPT_INT(reservation_horizon_hours, 1, 8784, 1344,
            "hours ahead a reservation may end at most (default 8 weeks)"),
    OPT_INT(reservation_max_hours, 1, 8784, 336, "longest reservation, hours"),
    OPT_INT(reservation_cancel_notice_hours, 0, 8784, 48,
            "cancelling at least this many hours before the start refunds in full"),
    OPT_INT(reservation_late_refund_percent, 0, 100, 50,
            "percent refunded when a reservation is cancelled later than that but before its start"),
    OPT_INT(reservation_warning_minutes, 1, 1440, 15,
            "minutes before a reservation ends that its instances get the reservation_warning event"),
    OPT_STR(currency, "CNY", validate_currency, "platform currency code shown with every amount"),
    OPT_INT(billing_interval_ms, 100, 3600000, 10000, "milliseconds between billing passes"),
    OPT_INT(billing_post_interval_s, 1, 86400, 300,
            "seconds between ledger postings of a user's running usage (funds are checked every pass)"),
    OPT_INT(min_run_minutes, 0, 1440, 10, "funds needed to start an instance: this many minutes of it"),
    OPT_INT(low_balance_minutes, 0, 100000, 60, "warn (low_balance, and one mail) when funds last less than this many minutes at the current burn"),
    OPT_STR(signup_credit, "10.00", validate_signup_credit,
            "trial credit of a new account, in the platform currency (at most max_grant and max_balance)"),
    OPT_INT(signup_credit_days, 0, 3650, 0, "days until the trial credit expires; 0 never"),
    OPT_STR(max_price_per_card_hour, "10000.00", validate_max_price,
            "highest price per card-hour an admin may set (at most 1000000.00)"),
    OPT_STR(max_topup, "1000000.00", validate_max_topup, "largest single top-up, by an admin or the payment webhook"),
    OPT_STR(max_grant, "100000.00", validate_max_grant, "largest single credit grant: an admin's, or an invite code's"),
    OPT_STR(max_balance, "10000000.00", validate_max_balance,
            "most a user may hold, cash and credit together; a top-up or grant beyond it is refused"),
    OPT_STR(payment_webhook_secret, "", NULL, "HMAC-SHA256 key of the payment provider's webhook; empty turns it off"),
    OPT_STR(payment_webhook_secret_file, "", NULL,
            "file holding payment_webhook_secret instead (mode 0600 or 0640; others may not read it)"),
    OPT_STR(metrics_listen, "", validate_metrics_listen,
            "host:port serving /metrics without an API key; empty: /metrics is admin-only on the API"),
    OPT_INT(login_key_ttl_s, 0, 31622400, 2592000,
            "seconds after which a key made by logging in stops working (0: never; default 30 days)"),
    OPT_INT(max_ssh_keys_per_user, 1, 64, 20, "SSH public keys one account may hold (an instance takes at most 64)"),
    OPT_INT(max_api_keys_per_user, 2, 10000, 100,
            "live API keys one account may hold; logging in at the limit revokes the oldest key made by logging in"),
    OPT_INT(max_apps_per_user, 1, 10000, 20, "apps one account may publish (deleted ones do not count)"),
    OPT_STR(image_policy, "catalog", validate_image_policy,
            "catalog: instances run catalog images only; registries: also any image of image_registries"),
    OPT_STR(image_registries, "", validate_image_registries,
            "registries (host[:port], comma-separated, e.g. docker.io,ghcr.io) users' own images may come from"),
    OPT_INT(max_volume_size_gb, 1, 1048576, 1048576, "largest volume a user may create, GB (volume_default_size_gb at most)"),
    OPT_STR(max_price_per_gb_month, "1000.00", validate_max_storage_price,
            "highest storage price per GB-month (30 days) an admin may set (at most 1000000.00)"),
    OPT_INT(email_verify_ttl_s, 60, 2592000, 86400, "seconds a sign-up's e-mail verification code works"),
    OPT_STR(smtp_url, "", validate_smtp_url,
            "smtp://host:port or smtps://host:port sending verification mail; empty: the mail is logged instead"),
    OPT_STR(smtp_from, "gpurent@localhost", validate_smtp_from, "From: address of the daemon's mail"),
    OPT_STR(smtp_tls, "required", validate_smtp_tls,
            "none, starttls (when offered) or required (as libcurl's CURLOPT_USE_SSL); smtps:// is always TLS"),
    OPT_STR(smtp_credentials_file, "", NULL,
            "file holding user:password for SMTP AUTH, readable only by the daemon (mode 0600); empty: no AUTH"),
    OPT_STR(public_url, "", validate_public_url,
            "the API's address as users reach it, for the text of mail and the web terminal's Origin check; "
            "empty: the listen address"),
    OPT_INT(email_strip_plus_tags, 0, 1, 1, "1: name+tag@domain counts as name@domain when checking e-mails are unique"),
    OPT_STR(email_dotless_domains, "gmail.com,googlemail.com", NULL,
            "comma-separated domains whose mailboxes ignore dots in the name (a.b@ is ab@)"),
    OPT_STR(email_domain_aliases, "googlemail.com=gmail.com", validate_domain_aliases,
            "comma-separated alias=domain pairs whose addresses reach the same mailboxes (x@alias is x@domain)"),
    OPT_INT(terminal_token_ttl_s, 5, 3600, 60, "seconds a web terminal token works (single use)"),
    OPT_INT(max_terminals, 1, 100000, 256,
            "web terminals open at once, all users together (each holds a connection, not a thread)"),
    OPT_INT(max_terminals_per_user, 1, 100000, 16, "web terminals one user may have open at once"),
    OPT_INT(terminal_ping_s, 1, 3600, 30,
            "seconds a web terminal's browser may be silent before it is pinged; silent three times that, it is closed"),
    OPT_INT(signup_rate_per_address, 0, 1000000, 10,
            "sign-ups per hour from one client address; 0 no limit (SIGHUP applies a change)"),
    OPT_INT(signup_rate_per_subnet, 0, 1000000, 50,
            "sign-ups per hour from one /24 (IPv6: /64); 0 no limit (SIGHUP applies a change)"),
    OPT_INT(password_reset_ttl_s, 60, 86400, 1800, "seconds a password reset code works"),
    OPT_INT(password_reset_max_tries, 1, 100, 5, "wrong codes tried before an account's password reset code is dead"),
    OPT_INT(password_reset_rate_per_email, 0, 1000000, 5,
            "password reset requests per hour for one e-mail address; 0 no limit (SIGHUP applies a change)"),
    OPT_INT(password_reset_rate_per_address, 0, 1000000, 20,
            "password reset requests per hour from one client address (an IPv6 /64); 0 no limit (SIGHUP applies a change)"),
    /* The app marketplace (issue 17). */
    OPT_INT(app_platform_fee_ppm, 0, 1000000, 100000,
            "the platform's share of every app call, in millionths of its charge (100000: 10%)"),
    OPT_STR(max_app_price, "1000.00", validate_max_app_price,
            "highest price an app may ask per call, per 1000 tokens or per second (at most 1000000.00)"),
    OPT_STR(gateway_secret_file, "", NULL,
            "file holding the key gateways sign the internal API with (mode 0600); empty: no gateway may connect"),
    OPT_STR(gateway_public_url, "", validate_gateway_public_url,
            "the gateways' address as consumers reach it (e.g. https://gw.example.com), shown as each app's "
            "gateway_url; empty: gateway_url is null"),
    OPT_INT(app_scale_interval_ms, 100, 600000, 2000, "milliseconds between the app scaler's passes"),
    OPT_INT(app_scale_down_window_s, 0, 86400, 60,
            "seconds demand must fit fewer replicas before an app scales down (not to zero: idle_seconds)"),
    OPT_INT(app_demand_stale_s, 1, 3600, 10, "seconds a gateway's demand report counts for the scaler"),
    {NULL, 0, 0, 0, NULL, 0, 0, NULL, NULL},
};

int daemon_read_config(struct daemon_conf *conf, const char *file, char **overrides, int n_overrides, char *err,
                       size_t errlen)
{
    memset(conf, 0, sizeof *conf);
    if (conf_set_defaults(daemon_options, conf, err, errlen) < 0 ||
        (file && conf_load_file(daemon_options, conf, file, err, errlen) < 0))
        return -1;
    for (int i = 0; i < n_overrides; i++) {
        char why[896];
        if (conf_set_override(daemon_options, conf, overrides[i], why, sizeof why) < 0) {
            snprintf(err, errlen, "command line: %s", why);
            return -1;
        }
    }
    /* Secrets are never read from where others can read them. */
    if (conf->payment_webhook_secret_file[0]) {
        if (conf->payment_webhook_secret[0]) {
            snprintf(err, errlen, "payment_webhook_secret and payment_webhook_secret_file are both set; keep one");
            return -1;
        }
        if (secret_file_read(conf->payment_webhook_secret_file, conf->payment_webhook_secret,
                             sizeof conf->payment_webhook_secret, err, errlen) < 0)
            return -1;
    } else if (conf->payment_webhook_secret[0] && file && file_world_readable(file) == 1) {
        snprintf(err, errlen, "%s holds payment_webhook_secret but others may read it: chmod o-r %s (make install "
                 "makes it 0640), or move the secret to payment_webhook_secret_file", file, file);
        return -1;
    }
    if (conf->gateway_secret_file[0] &&
        secret_file_read(conf->gateway_secret_file, conf->gateway_secret, sizeof conf->gateway_secret, err, errlen) < 0)
        return -1;
    /* Read here as well as by the mailer (which keeps what it read), so
     * that -n finds a file serve would refuse. */
    if (conf->smtp_credentials_file[0]) {
        char line[600];
        if (secret_file_read(conf->smtp_credentials_file, line, sizeof line, err, errlen) < 0)
            return -1;
        const char *colon = strchr(line, ':');
        int ok = colon && colon > line;
        secret_wipe(line, sizeof line);
        if (!ok) {
            snprintf(err, errlen, "smtp_credentials_file %s: must hold one line user:password",
                     conf->smtp_credentials_file);
            return -1;
        }
    }
    money_parse(conf->max_app_price, &conf->max_app_price_micro);
    if (strcmp(conf->image_policy, "registries") == 0 && !conf->image_registries[0]) {
        snprintf(err, errlen, "image_policy = registries needs image_registries");
        return -1;
    }
    /* The held answer is part of the call: a PUT must not time out for
     * having been asked to wait. */
    if (conf->agent_put_wait_ms >= conf->agent_timeout_ms) {
        snprintf(err, errlen, "agent_put_wait_ms %lld must be under agent_timeout_ms %lld",
                 (long long)conf->agent_put_wait_ms, (long long)conf->agent_timeout_ms);
        return -1;
    }
    if ((conf->tls_cert[0] != 0) != (conf->tls_key[0] != 0)) {
        snprintf(err, errlen, "tls_cert and tls_key must be set together");
        return -1;
    }
    /* Read here, so that -n finds a pair the server could not start with. */
    if (conf->tls_cert[0] && tls_pair_check(conf->tls_cert, conf->tls_key, err, errlen) < 0)
        return -1;
    /* The validators have parsed each amount already; the handlers compare
     * with integers. */
    int64_t credit;
    money_parse(conf->signup_credit, &credit);
    money_parse(conf->max_price_per_card_hour, &conf->max_price_micro);
    money_parse(conf->max_topup, &conf->max_topup_micro);
    money_parse(conf->max_grant, &conf->max_grant_micro);
    money_parse(conf->max_balance, &conf->max_balance_micro);
    money_parse(conf->max_price_per_gb_month, &conf->max_storage_price_micro);
    if (conf->volume_default_size_gb > conf->max_volume_size_gb) {
        snprintf(err, errlen, "volume_default_size_gb %lld is over max_volume_size_gb %lld",
                 (long long)conf->volume_default_size_gb, (long long)conf->max_volume_size_gb);
        return -1;
    }
    /* The trial credit is a grant to an empty account, so it must pass both
     * limits a grant meets, or every sign-up would be refused. */
    if (credit > conf->max_grant_micro || credit > conf->max_balance_micro) {
        int over_grant = credit > conf->max_grant_micro;
        snprintf(err, errlen, "signup_credit %s is over %s %s: the trial credit is a grant", conf->signup_credit,
                 over_grant ? "max_grant" : "max_balance", over_grant ? conf->max_grant : conf->max_balance);
        return -1;
    }
    return 0;
}

int daemon_load_config(struct daemon_conf *conf, const char *file, char **overrides, int n_overrides)
{
    char err[1024];
    if (daemon_read_config(conf, file, overrides, n_overrides, err, sizeof err) < 0) {
        fprintf(stderr, "gpurentd: %s\n", err);
        return -1;
    }
    return 0;
}

/* Loads the configuration for a database subcommand: -c FILE and --db PATH. */
int daemon_load_db_config(struct daemon_conf *conf, const char *file, const char *db)
{
    char *override = NULL;
    if (db && asprintf(&override, "database=%s", db) < 0)
        return -1;
    int rc = daemon_load_config(conf, file, override ? &override : NULL, override ? 1 : 0);
    free(override);
    return rc;
}
