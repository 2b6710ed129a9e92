/* cmd.h: the commands layer (src/gpurentd/cmd): main's subcommands and the
 * configuration loader. It may use every layer below (gpurentd.h).
 *
 *   main.c         picks the subcommand
 *   serve.c        `serve`: configuration, migration, the bootstrap admin,
 *                  the HTTP servers, the loops, sd_notify, signals
 *   config.c       the option table (daemon_options) and the loader
 *   cli.c          `migrate`, `admin create-user`, `ledger verify`
 *   cli_reports.c  `report` and `backup` */
#ifndef GPURENT_CMD_H
#define GPURENT_CMD_H

#include <stddef.h>

#include "domain/domain.h"

/* config.c: the option table and the loader. */
extern const struct conf_option daemon_options[];
/* Loads configuration: defaults, then file (if any), then overrides; what is
 * wrong goes to err (naming file and line, or the command line). */
int daemon_read_config(struct daemon_conf *conf, const char *file, char **overrides, int n_overrides, char *err,
                       size_t errlen);
/* The same, printing what is wrong on stderr (start-up, command line). */
int daemon_load_config(struct daemon_conf *conf, const char *file, char **overrides, int n_overrides);
/* The same for a database subcommand: -c FILE and --db PATH. */
int daemon_load_db_config(struct daemon_conf *conf, const char *file, const char *db);
/* serve.c */
int cmd_serve(int argc, char **argv);
/* cli.c */
/* The configured database, read-only; NULL when it cannot be opened (said on stderr). */
struct store *cli_open_readonly(const struct daemon_conf *conf);
int cmd_migrate(int argc, char **argv);
int cmd_admin(int argc, char **argv);
int cmd_ledger(int argc, char **argv);
/* cli_reports.c */
int cmd_report(int argc, char **argv);
int cmd_backup(int argc, char **argv);

#endif
