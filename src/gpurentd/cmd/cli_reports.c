/* cli_reports.c: `gpurentd report NAME` (the billing team's views as a
 * table, CSV or JSON) and `gpurentd backup FILE` (an online copy). Both read
 * the live database next to a running daemon without blocking it: WAL
 * readers see a consistent snapshot and never hold up writers. */
#include "gpurent/csv.h"
#include "gpurent/jsonx.h"
#include "gpurent/money.h"
#include "gpurentd.h"
#include "store/store.h"

#include <getopt.h>
#include <limits.h>
#include <sys/stat.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum report_format { FORMAT_TABLE, FORMAT_CSV, FORMAT_JSON };

/* Rows kept for the table format, which must know column widths first. */
struct report_out {
    enum report_format format; /* how to print */
    int n;                     /* columns */
    char **cells;              /* table: every cell, row-major */
    size_t n_cells, cap;       /* used, allocated */
    json_t *json;              /* json: the array */
    int failed;                /* out of memory */
};

/* Columns named *_micro hold money: shown as decimal amounts. */
static int is_money(const char *name)
{
    size_t n = strlen(name);
    return n > 6 && strcmp(name + n - 6, "_micro") == 0;
}

/* A column's name as printed: money columns lose their _micro suffix, since
 * the values are printed as amounts, not micro-units. */
static char *display_name(const char *name)
{
    return is_money(name) ? strndup(name, strlen(name) - 6) : strdup(name);
}

static char *cell_text(const char *name, const char *value)
{
    if (!value)
        return strdup("");
    if (is_money(name)) {
        char buf[MONEY_FMT_LEN];
        return strdup(money_format(strtoll(value, NULL, 10), buf));
    }
    return strdup(value);
}

static void on_row(void *vctx, int n, const char *const *names, const char *const *values, const int *is_int)
{
    struct report_out *o = vctx;
    if (!values) {
        o->n = n;
        if (o->format == FORMAT_CSV)
            for (int c = 0; c < n; c++) {
                char *d = display_name(names[c]);
                csv_field(stdout, d ? d : "");
                free(d);
                fputs(c + 1 < n ? "," : "\r\n", stdout);
            }
        if (o->format != FORMAT_TABLE)
            return;
        values = names; /* the header is the table's first row */
        is_int = NULL;
    }
    if (o->format == FORMAT_JSON) {
        json_t *obj = json_object();
        for (int c = 0; c < n; c++) {
            json_t *v;
            if (!values[c])
                v = json_null();
            else if (is_money(names[c])) {
                char buf[MONEY_FMT_LEN];
                v = json_string(money_format(strtoll(values[c], NULL, 10), buf));
            } else if (is_int && is_int[c])
                v = json_integer(strtoll(values[c], NULL, 10));
            else
                v = json_string(values[c]);
            char *d = display_name(names[c]);
            json_object_set_new(obj, d ? d : names[c], v);
            free(d);
        }
        json_array_append_new(o->json, obj);
        return;
    }
    if (o->format == FORMAT_CSV) {
        for (int c = 0; c < n; c++) {
            char *t = cell_text(names[c], values[c]);
            csv_field(stdout, t ? t : "");
            free(t);
            fputs(c + 1 < n ? "," : "\r\n", stdout);
        }
        return;
    }
    if (o->n_cells + (size_t)n > o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        while (cap < o->n_cells + (size_t)n)
            cap *= 2;
        char **grown = realloc(o->cells, cap * sizeof *grown);
        if (!grown) {
            o->failed = 1;
            return;
        }
        o->cells = grown;
        o->cap = cap;
    }
    for (int c = 0; c < n; c++)
        o->cells[o->n_cells++] = values == names ? display_name(names[c]) : cell_text(names[c], values[c]);
}

static void print_table(struct report_out *o)
{
    size_t width[32] = {0};
    for (size_t i = 0; i < o->n_cells; i++) {
        size_t w = o->cells[i] ? strlen(o->cells[i]) : 0;
        if (w > width[i % (size_t)o->n])
            width[i % (size_t)o->n] = w;
    }
    for (size_t i = 0; i < o->n_cells; i++) {
        size_t c = i % (size_t)o->n;
        /* Numbers right-aligned, text left-aligned. */
        const char *t = o->cells[i] ? o->cells[i] : "";
        int numeric = i >= (size_t)o->n && t[0] && strspn(t, "-0123456789.") == strlen(t);
        printf(numeric ? "%*s" : "%-*s", (int)width[c], t);
        fputs(c + 1 < (size_t)o->n ? "  " : "\n", stdout);
        if (i + 1 == (size_t)o->n)
            for (size_t k = 0; k < (size_t)o->n; k++) {
                for (size_t d = 0; d < width[k]; d++)
                    putchar('-');
                fputs(k + 1 < (size_t)o->n ? "  " : "\n", stdout);
            }
    }
}

/* YYYY-MM-DD, a day the calendar has (not 2027-02-30). */
static int day_valid(const char *d)
{
    char t[32];
    int64_t ignored;
    return strlen(d) == 10 && snprintf(t, sizeof t, "%sT00:00:00Z", d) > 0 && json_time_parse(t, &ignored) == 0;
}

static void report_usage(FILE *f)
{
    fprintf(f, "usage: gpurentd report NAME [--from DAY] [--to DAY] [--format table|csv|json] [--db PATH] [-c FILE]\n"
               "Prints a billing report for days in [--from, --to) (UTC, YYYY-MM-DD). Reports:\n");
    for (size_t i = 0; store_report_name(i); i++)
        fprintf(f, "  %s\n", store_report_name(i));
    fprintf(f, "Each is a SQL view documented in docs/REPORTS.md; amounts are in the platform currency.\n");
}

int cmd_report(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"db",     required_argument, NULL, 'D'},
        {"from",   required_argument, NULL, 'f'},
        {"to",     required_argument, NULL, 't'},
        {"format", required_argument, NULL, 'F'},
        {"help",   no_argument,       NULL, 'h'},
        {NULL,     0,                 NULL, 0  },
    };
    const char *file = NULL, *db = NULL, *from = NULL, *to = NULL;
    struct report_out o = {.format = FORMAT_TABLE};
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            file = optarg;
            break;
        case 'D':
            db = optarg;
            break;
        case 'f':
            from = optarg;
            break;
        case 't':
            to = optarg;
            break;
        case 'F':
            if (strcmp(optarg, "table") == 0)
                o.format = FORMAT_TABLE;
            else if (strcmp(optarg, "csv") == 0)
                o.format = FORMAT_CSV;
            else if (strcmp(optarg, "json") == 0)
                o.format = FORMAT_JSON;
            else {
                fprintf(stderr, "gpurentd report: --format takes table, csv or json\n");
                return 2;
            }
            break;
        case 'h':
            report_usage(stdout);
            return 0;
        default: /* getopt named the option */
            fputs("Try 'gpurentd report --help'.\n", stderr);
            return 2;
        }
    }
    if (optind + 1 != argc) {
        report_usage(stderr);
        return 2;
    }
    if ((from && !day_valid(from)) || (to && !day_valid(to))) {
        fprintf(stderr, "gpurentd report: --from and --to take days of the calendar like 2026-11-01\n");
        return 2;
    }
    if (from && to && strcmp(from, to) > 0) {
        fprintf(stderr, "gpurentd report: --from %s is after --to %s\n", from, to);
        return 2;
    }
    struct daemon_conf conf;
    if (daemon_load_db_config(&conf, file, db) < 0)
        return 1;
    struct store *s = cli_open_readonly(&conf);
    if (!s)
        return 1;
    o.json = json_array();
    int rc = store_report(s, argv[optind], from, to, on_row, &o);
    store_close(s);
    if (rc == STORE_NOT_FOUND) {
        fprintf(stderr, "gpurentd report: no report named '%s'\n", argv[optind]);
        report_usage(stderr);
    } else if (rc == STORE_OK && !o.failed) {
        if (o.format == FORMAT_TABLE)
            print_table(&o);
        else if (o.format == FORMAT_JSON) {
            json_dumpf(o.json, stdout, JSON_INDENT(2));
            putchar('\n');
        }
    }
    for (size_t i = 0; i < o.n_cells; i++)
        free(o.cells[i]);
    free(o.cells);
    json_decref(o.json);
    return rc == STORE_OK && !o.failed ? 0 : rc == STORE_NOT_FOUND ? 2 : 1;
}

/* Where path is or would be made: its directory resolved, then its name;
 * 0, or -1 when the directory does not resolve. */
static int resolved(const char *path, char out[PATH_MAX])
{
    char dir[PATH_MAX], dir_real[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    const char *base = slash ? path + (slash - dir) + 1 : path;
    if (slash == dir)
        slash[1] = '\0'; /* "/name": the root */
    else if (slash)
        *slash = '\0';
    if (!realpath(slash ? dir : ".", dir_real))
        return -1;
    return snprintf(out, PATH_MAX, "%s/%s", dir_real, base) < PATH_MAX ? 0 : -1;
}

/* Whether dest names the database or one of the files beside it that it
 * lives by (its WAL, shared memory, journal, the daemon's lock): what it
 * is, or NULL. A copy renamed over one of them replaces it under the
 * running daemon. The same file where dest exists, else the same name (a
 * WAL comes and goes). */
static const char *database_file(const char *database, const char *dest)
{
    static const struct {
        const char *suffix, *what;
    } files[] = {{"", "the database itself"}, {"-wal", "the database's WAL"}, {"-shm", "the database's shared memory"},
                 {"-journal", "the database's journal"}, {".serve-lock", "the daemon's lock"}};
    char dest_at[PATH_MAX], path[PATH_MAX], path_at[PATH_MAX];
    struct stat ds, ps;
    int dest_exists = stat(dest, &ds) == 0, dest_named = resolved(dest, dest_at) == 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        if (snprintf(path, sizeof path, "%s%s", database, files[i].suffix) >= (int)sizeof path)
            continue;
        if ((dest_exists && stat(path, &ps) == 0 && ps.st_dev == ds.st_dev && ps.st_ino == ds.st_ino) ||
            (dest_named && resolved(path, path_at) == 0 && strcmp(path_at, dest_at) == 0))
            return files[i].what;
    }
    return NULL;
}

/* Why dest cannot take the copy although it is not the database's, or
 * NULL. The copy is written beside dest and renamed over it, which would
 * put a regular file in place of a device (as root, `gpurentd backup
 * /dev/null` would replace /dev/null), of a FIFO or socket another
 * program reads, or of a symbolic link (the link replaced, not the file it
 * names); only a new name or an existing regular file is taken. */
static const char *backup_target_refused(const char *dest)
{
    struct stat st;
    if (lstat(dest, &st) < 0 || S_ISREG(st.st_mode))
        return NULL;
    if (S_ISDIR(st.st_mode))
        return "a directory; name the file to write, e.g. DIR/gpurent-backup.db";
    if (S_ISLNK(st.st_mode))
        return "a symbolic link, which the copy would replace; give the path of the file itself";
    return "not a regular file (a device, FIFO or socket), which the copy would replace";
}

int cmd_backup(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"db",     required_argument, NULL, 'D'},
        {"help",   no_argument,       NULL, 'h'},
        {NULL,     0,                 NULL, 0  },
    };
    const char *file = NULL, *db = NULL;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            file = optarg;
            break;
        case 'D':
            db = optarg;
            break;
        case 'h':
            printf("usage: gpurentd backup FILE [--db PATH] [-c FILE]\n"
                   "Copies the live database to FILE with SQLite's online backup: a consistent\n"
                   "snapshot while the daemon keeps serving. FILE appears only once complete.\n");
            return 0;
        default:
            return 2;
        }
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "usage: gpurentd backup FILE [--db PATH] [-c FILE]\n");
        return 2;
    }
    struct daemon_conf conf;
    if (daemon_load_db_config(&conf, file, db) < 0)
        return 1;
    const char *own = database_file(conf.database, argv[optind]);
    if (own) {
        fprintf(stderr, "gpurentd backup: %s is %s; give another file for the copy\n", argv[optind], own);
        return 2;
    }
    const char *refused = backup_target_refused(argv[optind]);
    if (refused) {
        fprintf(stderr, "gpurentd backup: %s is %s\n", argv[optind], refused);
        return 2;
    }
    struct store *s = cli_open_readonly(&conf);
    if (!s)
        return 1;
    char err[1024];
    int rc = store_backup(s, argv[optind], err, sizeof err);
    store_close(s);
    if (rc < 0) {
        fprintf(stderr, "gpurentd: %s\n", err);
        return 1;
    }
    printf("backed up %s to %s\n", conf.database, argv[optind]);
    return 0;
}
