/* SPDX-License-Identifier: MIT */
/* Sub-commands of the ckfs binary (each returns the process exit status),
 * with their option tables (src/cli/options.h), and what they share. */
#ifndef CKFS_CLI_H
#define CKFS_CLI_H

#include "ckfs/dtype.h"
#include "ckfs/err.h"
#include "ckfs/units.h"

int ckfs_cmd_inspect(int argc, char **argv);
int ckfs_cmd_export(int argc, char **argv);
int ckfs_cmd_verify(int argc, char **argv);
int ckfs_cmd_mount(int argc, char **argv);
int ckfs_cmd_umount(int argc, char **argv);
int ckfs_cmd_stats(int argc, char **argv);
int ckfs_cmd_diff(int argc, char **argv);
/* ckfs help COMMAND (its --help); hidden: --man prints ckfs(1), and
 * --bash-completion the completion script, both made from the tables. */
int ckfs_cmd_help(int argc, char **argv);

struct cli_command;
extern const struct cli_command ckfs_cmd_inspect_def, ckfs_cmd_export_def,
	ckfs_cmd_verify_def, ckfs_cmd_mount_def, ckfs_cmd_umount_def, ckfs_cmd_stats_def, ckfs_cmd_diff_def;

/* The mount's -o keys that are not ckfs's (mount.c, NULL-terminated):
 * mount(8)'s and systemd's, ignored; libfuse's flags and valued keys,
 * passed on. */
extern const char *const ckfs_mount_ignored_keys[], *const ckfs_mount_fuse_flags[],
	*const ckfs_mount_fuse_keys[];


/* Print "ckfs: <msg>" to stderr and return exit status 1 (2 for usage). */
int ckfs_cli_report(const struct ckfs_error *err);
int ckfs_cli_usage_error(const char *cmd, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Print "ckfs: <message>" to stderr, the message escaped as every message
 * is (include/ckfs/text.h). */
void ckfs_cli_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* s escaped for printing (one of four rotating static buffers). */
const char *ckfs_cli_shown(const char *s);

#endif
