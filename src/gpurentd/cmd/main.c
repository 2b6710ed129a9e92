/* main.c: gpurentd's entry point: picks the subcommand. */
#include "gpurentd.h"
#include "store/store.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: gpurentd [COMMAND] [OPTIONS]\n"
               "\n"
               "commands:\n"
               "  serve          run the control plane (the default)\n"
               "  migrate        create or upgrade the database\n"
               "  admin          operator tasks: create-user\n"
               "  ledger verify  check every invariant of the money ledger\n"
               "  report NAME    billing reports: daily-revenue, usage, utilisation, credit-liability, topups,\n"
               "                 admin-actions\n"
               "  backup FILE    consistent online copy of the live database\n"
               "\n"
               "Each command takes --help.\n");
}

/* A command's status once what it printed is out: a report redirected to a
 * full disk, or an admin's key shown once, that never reached its file is
 * a failure, not an empty success. */
static int written(int rc)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "gpurentd: cannot write standard output: %s\n", strerror(errno));
        return rc ? rc : 1;
    }
    return rc;
}

int main(int argc, char **argv)
{
    store_global_init(); /* before SQLite's first use: it fixes process-wide settings */
    if (argc < 2 || argv[1][0] == '-') {
        if (argc >= 2 && strcmp(argv[1], "--version") == 0) {
            printf("gpurentd %s\n", GPURENTD_VERSION);
            return 0;
        }
        if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
            /* The commands first; then serve's own options, the default. */
            usage(stdout);
            putchar('\n');
        }
        return cmd_serve(argc, argv);
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "serve") == 0)
        return cmd_serve(argc - 1, argv + 1);
    if (strcmp(cmd, "migrate") == 0)
        return written(cmd_migrate(argc - 1, argv + 1));
    if (strcmp(cmd, "admin") == 0)
        return written(cmd_admin(argc - 1, argv + 1));
    if (strcmp(cmd, "ledger") == 0)
        return written(cmd_ledger(argc - 1, argv + 1));
    if (strcmp(cmd, "report") == 0)
        return written(cmd_report(argc - 1, argv + 1));
    if (strcmp(cmd, "backup") == 0)
        return written(cmd_backup(argc - 1, argv + 1));
    if (strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "gpurentd: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
